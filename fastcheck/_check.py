"""``run_check``: plan -> executor -> strategy (full or fast) -> report, for any problem."""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np
import tensorflow as tf

from fastcheck._config import CheckConfig
from fastcheck._executor import Executor, timed
from fastcheck._fast import check_fast
from fastcheck._full import analytical_blocks, check_full, numerical_blocks
from fastcheck._paths import CALIBRATION, choose_route, kernel_plan
from fastcheck._plan import Plan, build_plan
from fastcheck._problem import Problem, preserved_variables
from fastcheck._report import GradientReport, describe_nonfinite, run_notes

STRATEGIES = {"full": check_full, "fast": check_fast}


def run_check(problem: Problem, config: CheckConfig) -> GradientReport:
    """Check one problem under one configuration."""
    start = time.perf_counter()
    timings: dict[str, float] = {}
    with _on_device(config.device), preserved_variables(problem.variables):
        with timed(timings, "plan"):
            plan = kernel_plan(build_plan(problem.f, problem.inputs, config, problem.names))
        if plan.nondeterministic:
            problems = [plan.nondeterministic, *([problem.if_random] if problem.if_random else [])]
            return GradientReport([], "none", "-", time.perf_counter() - start, [*plan.notes, *problem.notes],
                                  problems, problem.title, timings)
        mode, why = choose_mode(plan, config, problem.supplied)
        executor = _executor(plan, config, timings)
        outcome = STRATEGIES[mode](executor, executor.plan, timings, problem.supplied, problem.output_name)
        if mode == "full":
            # What routing predicted, against what it cost: later checks in this process route by it.
            CALIBRATION.learn_from(executor.chosen, executor.path,
                                   sum(timings.get(stage, 0.0) for stage in ("route", "analytical", "numerical")))
        notes = run_notes(outcome, executor, config, mode, why, problem.notes)
        problems = [] if np.all(np.isfinite(plan.eval_output)) else [describe_nonfinite(plan, plan.eval_output)]
        return GradientReport(outcome.pairs, executor.path, problem.kind or outcome.kind, time.perf_counter() - start,
                              notes, problems, problem.title, timings, outcome.warnings)


def jacobians(problem: Problem, config: CheckConfig, side: str) -> list[list[np.ndarray | None]]:
    """``result[output][input]`` blocks of the numerical or the analytical Jacobian (None for unchecked inputs)."""
    with _on_device(config.device), preserved_variables(problem.variables):
        plan = kernel_plan(build_plan(problem.f, problem.inputs, config, problem.names))
        executor = _executor(plan, config, {})
        blocks = (numerical_blocks if side == "numerical" else analytical_blocks)(executor, executor.plan)
        by_input = {s.position: b for s, b in zip(plan.checked, blocks)}
        return [[by_input[s.position][o.offset : o.offset + o.size] if s.position in by_input else None
                 for s in plan.inputs] for o in plan.outputs]


def _executor(plan: Plan, config: CheckConfig, timings: dict) -> Executor:
    with timed(timings, "route"):
        return Executor(plan, config, choose_route(plan, config))


# mode="auto" runs full Jacobians up to these sizes (elements of one Jacobian
# block, and elements of one input), random projections beyond.
FULL_MAX_ENTRIES_PER_GIB = 25_000_000
FULL_MAX_INPUT = 200_000


def choose_mode(plan: Plan, config: CheckConfig, supplied=None) -> tuple[str, str]:
    """("full" | "fast", why): full Jacobians when they fit the budget and a time estimate."""
    if supplied is not None:
        return "full", "supplied gradients are compared element by element"
    entries = plan.m * plan.n
    if config.mode == "full":
        needed = FULL_BYTES_PER_ENTRY * entries
        limit, what = _memory_limit(config)
        if needed > limit:
            raise ValueError(
                f"mode='full' needs about {needed / 2**30:.3g} GiB for the {plan.m} x {plan.n} numerical and analytical "
                f"Jacobians and their verdicts, more than the {limit / 2**30:.3g} GiB it may hold ({what}). Pass mode='fast' "
                "(random projections: memory linear in the sizes) or mode='auto', or a larger memory_budget if "
                "the machine has the memory."
            )
    if config.mode != "auto":
        return config.mode, "as requested"
    fitting = FULL_MAX_ENTRIES_PER_GIB * config.budget / (1 << 30)
    if entries > fitting:
        return "fast", f"the full Jacobian has {entries:.3g} entries, more than {fitting:.3g} fit memory_budget"
    if max((s.size for s in plan.checked), default=0) > FULL_MAX_INPUT:
        return "fast", f"an input has more than {FULL_MAX_INPUT} elements: 2n evaluations would take too long"
    return "full", f"the full Jacobian ({entries:.3g} entries) fits memory_budget"


# Peak host memory of a full check per Jacobian entry: numerical, analytical, noise and
# band (float64), f(x+h) and f(x-h) of the sweep (float64), the status (int8).
FULL_BYTES_PER_ENTRY = 49


def _memory_limit(config: CheckConfig) -> tuple[int, str]:
    """The bytes a full check may hold: the larger of memory_budget and 4 GiB, but never more
    than the memory this machine has free (the full Jacobians are not the batched
    evaluations memory_budget sizes, so the budget alone would forbid common checks)."""
    limit, what = max(config.budget, 4 << 30), "the larger of memory_budget and 4 GiB"
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not Linux: no reading
        return limit, what
    if free < limit:
        return int(free), "this machine's free memory"
    return limit, what


@contextlib.contextmanager
def _on_device(device):
    """Run the check eagerly (lifted out of a ``tf.Graph`` context) on ``device``, which must exist."""
    with contextlib.ExitStack() as stack:
        if not tf.executing_eagerly():
            # Inside tf.Graph().as_default() (TF1-style tests, e.g. TFP's): the check runs
            # eagerly on the side.  tf.init_scope() only lifts out of tf.function graphs,
            # so this uses TensorFlow's own eager-mode switch.
            from tensorflow.python.eager import context

            stack.enter_context(context.eager_mode())
        if device is not None:
            _require_device(device)
            stack.enter_context(tf.device(device))
        yield


def _require_device(device: str) -> None:
    spec = tf.DeviceSpec.from_string(device)
    if spec.device_type is None:
        return
    available = [d.name for d in tf.config.list_logical_devices()]
    wanted = [d for d in available if tf.DeviceSpec.from_string(d).device_type == spec.device_type.upper()
              and (spec.device_index is None or tf.DeviceSpec.from_string(d).device_index == spec.device_index)]
    if not wanted:
        raise ValueError(f"device={device!r} does not exist on this machine (devices: {', '.join(available)}); "
                         "pass one of those, or device=None to let TensorFlow place the check.")


