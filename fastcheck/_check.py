"""``run_check``: plan -> executor -> strategy (full, fast or coloured) -> report, for any problem."""

from __future__ import annotations

import contextlib
import dataclasses
import time

import numpy as np
import tensorflow as tf

from fastcheck.engine.config import MACHINE_EPSILON, CheckConfig, memory_limit
from fastcheck.engine.executor import Executor, timed
from fastcheck.engine.kernels import kernel_held
from fastcheck.engine.paths import EAGER, Route, choose_route, predict
from fastcheck.engine.plan import Float64Refused, Plan, build_plan, first_line
from fastcheck.engine.raised import passes_own
from fastcheck.engine.tables import (
    BATCHED_ELEMENTS,
    BATCHED_FLOPS,
    BATCHED_PER_CALL,
    COLOURED_MAX_COLUMN_SHARE,
    COLOURED_SECONDS_PER_NONZERO,
    FULL_MAX_ENTRIES_PER_GIB,
    FULL_MAX_INPUT,
    FULL_RERUN_MAX_ENTRIES,
    TIME_RULE_MIN_ELEMENTS,
    TIME_RULE_MIN_INPUTS,
    VJP_CALLS,
)
from fastcheck.integrations.observers import OBSERVERS
from fastcheck.modes.coloured import check_coloured, prospect
from fastcheck.modes.fast import check_fast
from fastcheck.modes.full import analytical_blocks, check_full, numerical_blocks
from fastcheck.problem.problem import Problem, preserved_variables
from fastcheck.report import events
from fastcheck.report.diagnosis import describe_nonfinite
from fastcheck.report.notes import native_reason
from fastcheck.report.results import GradientReport, Outcome, PairReport
from fastcheck.report.storage import Dense
from fastcheck.report.text import forward_not_checked, vacuous_warnings

STRATEGIES = {"full": check_full, "fast": check_fast, "coloured": check_coloured}




@passes_own  # the user's own exception, raised by f after planning, leaves as itself
def run_check(problem: Problem, config: CheckConfig) -> GradientReport:
    """Check one problem under one configuration; every observer sees the report."""
    report = _run_check(problem, config)
    for observe in list(OBSERVERS):
        observe(report)
    return report


def _run_check(problem: Problem, config: CheckConfig) -> GradientReport:
    start = time.perf_counter()
    timings: dict[str, float] = {}
    with on_device(config.pinned), preserved_variables(problem.variables):
        with timed(timings, "plan"):
            plan = _planned(problem, config)
        if plan.nondeterministic:
            problems = [plan.nondeterministic, *([problem.if_random] if problem.if_random else [])]
            return GradientReport([], "none", "-", time.perf_counter() - start,
                                  (*plan.notes, *problem.notes),
                                  problems, problem.title, timings)
        if plan.empty:
            return _nothing_to_check(plan, problem, config, time.perf_counter() - start, timings)
        if config.mode == "full":
            _require_memory(plan, config)  # before routing: a refused check traces nothing
        # Routing first (it only routes): the time a full check would take depends on its path.
        executor = _executor(plan, config, timings)

        def sparse() -> dict:  # coloured mode's prospect, probed only when asked (memoised on the executor)
            with timed(timings, "sparsity"):
                return prospect(executor, executor.plan)

        if config.mode == "coloured":
            _require_coloured_memory(sparse, config)
        done: list[tuple[str, tuple, Outcome]] = []
        decision = decide(plan, config, executor, sparse, ())
        while decision is not None:
            mode, why = decision
            done.append((mode, why, STRATEGIES[mode](executor, executor.plan, timings, problem.supplied,
                                                     problem.output_name, problem.twin)))
            decision = decide(plan, config, executor, sparse, tuple(done))
        mode, why, outcome = done[-1]
        rerun = len(done) > 1
        if rerun:  # the escalated check's notes begin with what coloured mode found
            notes_before = [events.Inconsistent(text) for text in done[0][2].inconsistent]
            outcome = dataclasses.replace(outcome, notes=[*notes_before, *outcome.notes])
        inconsistent = list(outcome.inconsistent)
        found = run_events(outcome, executor, config, mode, why, problem.notes) + _empty_parts(plan) + _nonfinite(plan)
        problems = [] if np.all(np.isfinite(plan.eval_output)) else [describe_nonfinite(plan, plan.eval_output)]
        problems += outcome.problems + inconsistent  # coloured mode: a violated sparsity pattern, a VJP off it
        kind = mode if mode in ("fast", "coloured") else problem.kind or outcome.kind
        warnings = [*vacuous_warnings(outcome.pairs), *outcome.warnings]
        if config.autodiff in ("forward", "both") and mode != "full" and problem.supplied is None:
            warnings.append(forward_not_checked(config.autodiff, mode))
        return GradientReport(outcome.pairs, outcome.path or executor.path, kind, time.perf_counter() - start,
                              tuple(found), problems, problem.title, timings, warnings)


def decide(plan: Plan, config: CheckConfig, executor: Executor, sparse, done: tuple) -> tuple[str, tuple] | None:
    """The one decision of a check: the next strategy to run and why (``events``), or None where the last one's
    outcome is the check's.  ``done``: the (mode, why, outcome) of the strategies run so far.

    Nothing run yet: the mode ``config.mode`` asks for, or ``mode="auto"``'s choice (``choose_mode``).  After
    coloured mode found the reverse-mode gradient inconsistent with f's sparsity pattern (its row colours' VJPs
    disagree with a dense cotangent's, so it cannot name the wrong elements): full mode, where the full Jacobians
    fit -- at most ``FULL_RERUN_MAX_ENTRIES`` entries, within the memory limit, and predicted within ``FULL_SECONDS``.
    """
    if not done:
        return choose_mode(plan, config, executor.route, sparse)
    _, why, outcome = done[-1]
    if len(done) > 1 or not outcome.inconsistent or plan.m * plan.n > FULL_RERUN_MAX_ENTRIES:
        return None
    if config.table("FULL_BYTES_PER_ENTRY") * plan.m * plan.n > memory_limit(config)[0]:
        return None
    return ("full", (events.Escalated(why),)) if predict_full_seconds(plan, executor.route)[0] <= config.table("FULL_SECONDS") else None


def jacobians(problem: Problem, config: CheckConfig, side: str) -> list[list[np.ndarray | None]]:
    """``result[output][input]`` blocks of the numerical or the analytical Jacobian (None for unchecked inputs)."""
    return jacobian_blocks(problem, config, (side,))[side]


@passes_own
def jacobian_blocks(problem: Problem, config: CheckConfig, sides: tuple[str, ...]) -> dict:
    """``jacobians`` of each side in ``sides`` ("numerical", "analytical"), from one plan and executor."""
    with on_device(config.pinned), preserved_variables(problem.variables):
        plan = _planned(problem, config)
        if plan.empty:  # the blocks are empty arrays of their shapes
            return {side: [[np.zeros((o.size, s.size)) if s.checked else None for s in plan.inputs]
                           for o in plan.outputs] for side in sides}
        executor = _executor(plan, config, {})
        found = {}
        for side in sides:
            blocks = (numerical_blocks if side == "numerical" else analytical_blocks)(executor, executor.plan)
            by_input = {s.position: b for s, b in zip(plan.checked, blocks)}
            found[side] = [[by_input[s.position][o.offset : o.offset + o.size] if s.position in by_input else None
                            for s in plan.inputs] for o in plan.outputs]
        return found


def _nothing_to_check(plan: Plan, problem: Problem, config: CheckConfig, seconds: float,
                      timings: dict) -> GradientReport:
    """The report of an empty Jacobian (f's outputs, or its checked inputs, have no elements): it passes, with a
    note, as ``tf.test.compute_gradient`` returns empty Jacobians."""
    atol, rtol = config.tolerances(plan.precision)

    def pair(o, s) -> PairReport:
        block = np.zeros((o.size, s.size))
        output_shape = tuple(o.shape) + ((2,) if o.dtype.is_complex else ())
        storage = Dense(block, block.copy(), np.zeros(block.shape, np.int8), block.copy())
        return PairReport(problem.output_name or o.name, s.name, output_shape, tuple(s.real_view.shape), storage,
                          atol, rtol)

    pairs: list[PairReport] = [pair(o, s) for s in plan.checked for o in plan.outputs]
    note = events.NothingToCheck(not plan.m, plan.m, plan.n)
    return GradientReport(pairs, "none", "-", seconds, (*plan.notes, *problem.notes, note), [],
                          problem.title, timings)


def _empty_parts(plan: Plan) -> list:
    """The outputs and checked inputs with no elements, in a check of the others."""
    empty = [o.name for o in plan.outputs if not o.size] + [s.name for s in plan.checked if not s.size]
    return [events.EmptyPart(name) for name in empty]


def _nonfinite(plan: Plan) -> list:
    """The checked inputs holding infinite or NaN elements, each with its first five (as ``describe_nonfinite``
    names f's)."""
    found = []
    for spec in plan.checked:
        x = spec.real_view.numpy()
        bad = np.argwhere(~np.isfinite(x))
        if len(bad):
            first = bad[:5]
            found.append(events.NonfiniteInput(spec.name, len(bad), tuple(tuple(int(i) for i in at) for at in first),
                                               tuple(float(x[tuple(at)]) for at in first)))
    return found


def _planned(problem: Problem, config: CheckConfig) -> Plan:
    """The problem's plan, as compiled kernels hold it; precision='float64' refused is the user's ValueError.  A
    problem with no float64 evaluation is planned in native precision under precision='auto'."""
    if problem.native and config.precision == "auto":
        config = config.replace(precision="native")
    try:
        return build_plan(problem.f, problem.inputs, config, problem.names, problem.computes_in, hold=kernel_held)
    except Float64Refused as refused:
        raise ValueError(f"precision='float64' was requested but {native_reason(refused.reason)}; pass "
                         "precision='native' or 'auto'.") from None


def _executor(plan: Plan, config: CheckConfig, timings: dict) -> Executor:
    with timed(timings, "route"):
        return Executor(plan, config, choose_route(plan, config))


def predict_full_seconds(plan: Plan, route: Route) -> tuple[float, events.Prediction]:
    """(seconds, how) a full check of ``plan`` on ``route`` is predicted to take, from f's counted call cost and the
    route's probe of its graph (never from a clock).

    Eager path: the eager loop (2n + a few calls of f, or the loops by f's pattern where routing priced them,
    ``Route.loops``).  Traced paths: one kernel per checked input (one for all of them where routing batches them
    together, ``Route.joint_chunk``) plus the autodiff kernel, each costing a trace, then 2n batched evaluations
    (plus a few per row of a Jacobian with m > 1 rows).
    """
    eager, traced = predict(plan, route.loops)  # the loops by f's pattern, where routed by them
    if route.path == EAGER:
        return eager, events.Prediction("eager", calls=route.loops[0] if route.loops else 2 * plan.n,
                                        per_call=plan.call_seconds)
    kernels = (1 if route.joint_chunk else len(plan.checked)) + 1  # differences (one for all inputs, or one each), autodiff
    tracing = kernels * traced
    per_eval = _batched_seconds(plan, route)
    evaluations = 2 * plan.n + (VJP_CALLS * plan.m if plan.m > 1 else 0)
    return tracing + evaluations * per_eval, events.Prediction("batched", evaluations, per_eval, kernels, traced)


def _batched_seconds(plan: Plan, route: Route) -> float:
    """One batched evaluation of f: see ``BATCHED_PER_CALL``."""
    return max(BATCHED_PER_CALL * plan.traced_call_seconds,
               route.flops_per_eval / BATCHED_FLOPS + route.elements_per_eval / BATCHED_ELEMENTS)


def choose_mode(plan: Plan, config: CheckConfig, route: Route, sparse=None) -> tuple[str, tuple]:
    """("full" | "coloured" | "fast", why: its reasons, ``fastcheck.report.events``) for ``config.mode``.

    ``mode="auto"``: full Jacobians when they fit memory_budget, every input has at most ``FULL_MAX_INPUT``
    elements, and the full check is predicted to take at most ``FULL_SECONDS`` (``predict_full_seconds``);
    beyond that, coloured mode when f's Jacobian is sparse enough to pay (``_beyond_full``), random projections
    otherwise.  ``sparse()`` gives coloured mode's prospect (``coloured.prospect``).
    """
    if config.mode != "auto":
        return config.mode, (events.Requested(),)
    entries = plan.m * plan.n
    fitting = FULL_MAX_ENTRIES_PER_GIB * config.budget / (1 << 30)
    if entries > fitting:
        return _beyond_full(events.FullTooLarge(entries, fitting), plan, config, route, sparse)
    if max((s.size for s in plan.checked), default=0) > FULL_MAX_INPUT:
        return _beyond_full(events.InputTooLarge(FULL_MAX_INPUT), plan, config, route, sparse)
    if len(plan.checked) <= TIME_RULE_MIN_INPUTS and plan.n <= TIME_RULE_MIN_ELEMENTS:
        return "full", (events.FullFits(entries),)
    seconds, how = predict_full_seconds(plan, route)
    if seconds > config.table("FULL_SECONDS"):
        return _beyond_full(events.FullTooSlow(seconds, how, config.table("FULL_SECONDS")), plan, config, route, sparse)
    return "full", (events.FullFits(entries, seconds, config.table("FULL_SECONDS")),)


def _beyond_full(why, plan: Plan, config: CheckConfig, route: Route, sparse) -> tuple[str, tuple]:
    """("coloured" | "fast", why) where full Jacobians do not fit.

    Coloured when f has more than one output (a scalar f's Jacobian is one dense row), its sparsity pattern is
    known (given, or traced op by op), its column colours are at most ``COLOURED_MAX_COLUMN_SHARE`` of the columns,
    its nonzeros fit the memory a check may hold, and its evaluations (2 per colour and refinement) and VJPs (one per
    row colour) are predicted to fit ``FULL_SECONDS`` at the batched cost of one evaluation; element-wise verdicts are
    then worth their cost over projections.
    """
    if sparse is None or plan.m <= 1:
        return "fast", (why,)
    try:
        found = sparse()
    except ValueError as error:  # pattern.UnknownSparsity: an op without a rule, or f cannot be traced
        return "fast", (why, events.NoPattern(first_line(error, 120)))
    colours, nonzeros = found["colours"], found["nonzeros"]
    limit, _ = memory_limit(config)
    if colours > COLOURED_MAX_COLUMN_SHARE * plan.n:
        return "fast", (why, events.TooDense(nonzeros, colours))
    if found["bytes"] > limit:
        return "fast", (why, events.ColouredTooLarge(found["bytes"], nonzeros, limit))
    per_eval = _batched_seconds(plan, route)
    seconds = (found["evaluations"] + VJP_CALLS * found["vjps"]) * per_eval + COLOURED_SECONDS_PER_NONZERO * nonzeros
    if seconds > config.table("FULL_SECONDS"):
        return "fast", (why, events.ColouredTooSlow(colours, seconds, config.table("FULL_SECONDS")))
    return "coloured", (why, events.Sparse(nonzeros, colours, seconds))


def _require_memory(plan: Plan, config: CheckConfig) -> None:
    """mode='full' refuses a check whose Jacobians would not fit the memory it may hold."""
    entries = plan.m * plan.n
    needed = config.table("FULL_BYTES_PER_ENTRY") * entries
    limit, what = memory_limit(config)
    if needed > limit:
        raise ValueError(
            f"mode='full' needs about {needed / 2**30:.3g} GiB for the {plan.m} x {plan.n} numerical and analytical "
            f"Jacobians and their verdicts, more than the {limit / 2**30:.3g} GiB it may hold ({what}). Pass mode='fast' "
            "(random projections: memory linear in the sizes) or mode='auto', or a larger memory_budget if "
            "the machine has the memory."
        )


def _require_coloured_memory(sparse, config: CheckConfig) -> None:
    """mode='coloured' refuses a check whose arrays (a status per nonzero, the colours' differences, the VJPs) would
    not fit the memory a check may hold."""
    try:
        found = sparse()
    except ValueError:  # no pattern: the check itself says so, naming the op
        return
    limit, what = memory_limit(config)
    if found["bytes"] > limit:
        raise ValueError(
            f"mode='coloured' needs about {found['bytes'] / 2**30:.3g} GiB for the statuses of its "
            f"{found['nonzeros']:,} structural nonzeros, the differences of its {found['colours']} column colours and "
            f"{found['row_colours']} VJPs, more than the {limit / 2**30:.3g} GiB it may hold ({what}). Pass mode='fast' "
            "(random projections: memory linear in the sizes), or a larger memory_budget if the machine has the memory."
        )


@contextlib.contextmanager
def on_device(device):
    """Run the check eagerly (lifted out of a ``tf.Graph`` context) on ``device`` (``CheckConfig.pinned``: a name
    ``validate_device`` found on this machine)."""
    with contextlib.ExitStack() as stack:
        if not tf.executing_eagerly():
            # Inside tf.Graph().as_default() (TF1-style tests, e.g. TFP's): the check runs eagerly on the side.
            # tf.init_scope() only lifts out of tf.function graphs, so this uses TensorFlow's own eager-mode switch.
            from tensorflow.python.eager import context

            stack.enter_context(context.eager_mode())
        if device is not None:
            stack.enter_context(tf.device(device))
        yield


def run_events(outcome: Outcome, executor, config, mode: str, why: tuple, problem_events=()) -> list:
    """The report's events, in the order the check learnt them."""
    plan = outcome.plan
    return [*plan.notes, *problem_events, *_precision_events(plan, config, outcome.atol, outcome.rtol),
            events.ModeChosen(mode, why), *executor.events, *outcome.notes]


def _precision_events(plan, config, atol: float, rtol: float) -> list:
    """What the check learnt about the precision f computes in, when it is not what the dtypes say."""
    found: list = []
    if plan.precision_reason:
        given = config.atol is not None or config.rtol is not None
        found.append(events.PrecisionFound(plan.precision_reason, plan.precision, atol, rtol, given))
    epsilon = MACHINE_EPSILON[plan.eval_dtype]
    if plan.noise is not None and plan.noise_epsilon > epsilon:
        found.append(events.NoiseMeasured(plan.noise.relative, plan.eval_dtype.name, epsilon))
    return found
