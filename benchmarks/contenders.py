"""The contenders: every way of checking the same gradient that the suite times.

=====================  ======================================================
``fastcheck_cold``     ``fastcheck.check_gradients`` on a *fresh* Python
                       function object (``lambda *a: f(*a)``), so nothing is
                       cached: planning, tracing and XLA compilation included.
``fastcheck_warm``     a second check of that same function object and inputs
                       (fastcheck's kernel cache hits).
``hand_batched_cold``  the hand-batched limit (see ``problems.py``) with fresh
                       ``tf.function``s: tracing and compilation included.
``hand_batched_warm``  the same objects called again.
``compute_gradient``   ``tf.test.compute_gradient(f, inputs)``: one backward
                       pass per output element, two eager calls per input
                       element.  No state, so each call costs the same.
``loop``               the loop a user would write: ``tape.jacobian`` for the
                       analytical side, then perturb one element at a time in
                       numpy, evaluate eagerly, restore (central differences).
``reference``          fast-mode problems only: the irreducible work of a
                       k-probe projection check done eagerly by hand -- 2k
                       forward calls, one VJP (``tape.gradient`` with
                       ``output_gradients``), one JVP (``ForwardAccumulator``),
                       k = ``names.PROBES`` (fastcheck's default).
=====================  ======================================================

Each function here does the work of one measurement and returns a dict of
facts about it (never timings: ``run.py`` times around the call).  They use
fastcheck only through its public API.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import threading
import time

import numpy as np
import tensorflow as tf

import fastcheck
from benchmarks.names import BASELINE, CONTENDERS, FASTCHECK, PROBES, TITLES  # noqa: F401 -- re-exported
from benchmarks.problems import EPS


class OverCap(Exception):
    """A contender would exceed (or did exceed) the time cap.

    ``seconds`` is the projected total (``kind="estimate"``) or the time at which
    it was stopped (``kind="lower bound"``).
    """

    def __init__(self, seconds: float, kind: str, how: str):
        super().__init__(f"{kind} {seconds:.3g} s: {how}")
        self.seconds, self.kind, self.how = seconds, kind, how


@contextlib.contextmanager
def hard_stop(seconds: float | None):
    """Interrupt the block with ``OverCap`` after ``seconds`` (main thread, POSIX only).

    A safety net behind the estimates: the interrupt is delivered when control
    returns to Python, so a long C++ call (an XLA compile) finishes first.
    """
    usable = seconds and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return
    start = time.perf_counter()

    def interrupt(signum, frame):
        raise OverCap(time.perf_counter() - start, "lower bound", f"stopped by the hard limit of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def on_device(device: str | None):
    if device is None:
        yield
    else:
        with tf.device(device):
            yield


def over_cap_inside(error: BaseException) -> OverCap | None:
    """The ``OverCap`` that caused ``error``, if any (fastcheck re-raises errors of f as ValueError)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OverCap):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:300] if text else ''}"


# ----------------------------------------------------------------------------- fastcheck


def _report_facts(report) -> dict:
    facts = {
        "path": report.path,
        "mode": report.mode,
        "ok": bool(report.ok),
        "verdict": report.verdict,
        "report_seconds": float(report.seconds),
        "timings": {stage: float(t) for stage, t in report.timings.items()},
        "notes": list(report.notes),
        "problems": list(report.problems),
    }
    # Fast mode: where the defect was localised (each pair's .region, and the report's own line).
    regions = []
    for pair in report.pairs:
        if getattr(pair, "region", None) is None:
            continue
        worst = pair.worst_element
        regions.append({"input": pair.input_name, "first": list(pair.region[0]), "last": list(pair.region[1]),
                        "worst_element": list(worst.input_index) if worst is not None else None})
    if regions:
        facts["regions"] = regions
        facts["region_text"] = [line.strip() for line in str(report).splitlines() if "localised" in line]
    return facts


def _check_cases(instance, functions, ctx) -> dict:
    """fastcheck on every corpus case; fastcheck errors are recorded per case, not raised."""
    paths = collections.Counter()
    disagreements, errors = [], []
    for case, f in zip(instance.cases, functions):
        try:
            report = fastcheck.check_gradients(f, case.inputs, device=ctx.device)
        except Exception as error:  # noqa: BLE001 -- reported, per the suite's rules
            if over_cap_inside(error):
                raise over_cap_inside(error) from None
            errors.append({"case": case.name, "error": _first_line(error)})
            continue
        paths[report.path] += 1
        if bool(report.ok) != case.correct:
            disagreements.append({"case": case.name, "correct": case.correct, "report_ok": bool(report.ok),
                                  "notes": list(report.notes), "problems": list(report.problems)})
    agree = len(instance.cases) - len(disagreements) - len(errors)
    return {
        "path": ", ".join(f"{p}: {c}" for p, c in sorted(paths.items())) or "-",
        "paths": dict(paths),
        "ok": not disagreements and not errors,
        "agreements": agree,
        "cases": len(instance.cases),
        "disagreements": disagreements,
        "errors": errors,
    }


def fastcheck_cold(instance, state, ctx) -> dict:
    if instance.cases is not None:
        state["fresh"] = [(lambda g: lambda *a: g(*a))(case.f) for case in instance.cases]
        return _check_cases(instance, state["fresh"], ctx)
    f = instance.f
    state["fresh"] = fresh = lambda *a: f(*a)  # noqa: E731 -- a new function object: nothing cached
    return _report_facts(fastcheck.check_gradients(fresh, instance.inputs, device=ctx.device, **instance.check_options))


def fastcheck_warm(instance, state, ctx) -> dict:
    if "fresh" not in state:
        raise RuntimeError("no cold call to repeat (the cold check did not complete)")
    if instance.cases is not None:
        return _check_cases(instance, state["fresh"], ctx)
    return _report_facts(fastcheck.check_gradients(state["fresh"], instance.inputs, device=ctx.device,
                                                   **instance.check_options))


# ----------------------------------------------------------------------------- hand-batched


def _max_abs_diff(numerical, analytical) -> float:
    return float(np.max(np.abs(np.asarray(numerical) - np.asarray(analytical)))) if np.size(numerical) else 0.0


def hand_batched_cold(instance, state, ctx) -> dict:
    with on_device(ctx.device):
        state["hand"] = instance.hand_batched()
        numerical, analytical = state["hand"]()
    return {"max_abs_diff": _max_abs_diff(numerical, analytical)}


def hand_batched_warm(instance, state, ctx) -> dict:
    if "hand" not in state:
        raise RuntimeError("no cold hand-batched call to repeat")
    with on_device(ctx.device):
        numerical, analytical = state["hand"]()
    return {"max_abs_diff": _max_abs_diff(numerical, analytical)}


# ----------------------------------------------------------------------------- tf.test.compute_gradient


def _for_compute_gradient(f, inputs):
    """What a user passes to compute_gradient: floating inputs only, one output tensor.

    compute_gradient perturbs and differentiates *every* input, so integer
    inputs are closed over; a structured output is flattened into one vector.
    """
    tensors = [tf.convert_to_tensor(t) for t in inputs]
    floating = [i for i, t in enumerate(tensors) if t.dtype.is_floating or t.dtype.is_complex]
    out = f(*tensors)
    if len(floating) == len(tensors) and isinstance(out, (tf.Tensor, np.ndarray)):
        return f, tensors

    def adapted(*xs):
        args = list(tensors)
        for i, x in zip(floating, xs):
            args[i] = x
        leaves = [tf.reshape(tf.convert_to_tensor(leaf), [-1]) for leaf in tf.nest.flatten(f(*args))]
        return tf.concat(leaves, 0) if len(leaves) > 1 else leaves[0]

    return adapted, [tensors[i] for i in floating]


def predict_compute_gradient(instance, ctx) -> tuple[float, str]:
    """Cost model of compute_gradient: inputs * m * t(backward) + 2 n * t(eager call)."""
    with on_device(ctx.device):
        f, xs = _for_compute_gradient(instance.f, instance.inputs)
        y = f(*xs)
        m = int(np.prod(y.shape)) * (2 if y.dtype.is_complex else 1)
        n = sum(int(np.prod(x.shape)) for x in xs)
        np.asarray(f(*xs))  # first calls pay one-off costs that compute_gradient pays once too
        with tf.GradientTape() as tape:
            tape.watch(xs)
            y = f(*xs)
        tape.gradient(y, xs, output_gradients=tf.ones_like(y))
        calls = []
        for _ in range(3):
            start = time.perf_counter()
            np.asarray(f(*xs))
            calls.append(time.perf_counter() - start)
        backs = []
        for _ in range(3):
            start = time.perf_counter()
            with tf.GradientTape() as tape:
                tape.watch(xs)
                y = f(*xs)
            np.asarray(tape.gradient(y, xs, output_gradients=tf.ones_like(y))[0])
            backs.append(time.perf_counter() - start)
    t_call, t_back = float(np.median(calls)), float(np.median(backs))
    seconds = len(xs) * m * t_back + 2 * n * t_call
    return seconds, (f"cost model: {len(xs)} input(s) x {m} backward passes x {t_back * 1e3:.2g} ms "
                     f"+ 2 x {n} eager calls x {t_call * 1e3:.2g} ms")


def compute_gradient(instance, state, ctx) -> dict:
    with on_device(ctx.device):
        if instance.cases is None:
            f, xs = _for_compute_gradient(instance.f, instance.inputs)
            theoretical, numerical = tf.test.compute_gradient(f, xs)
            return {"max_abs_diff": max(_max_abs_diff(n, t) for n, t in zip(numerical, theoretical))}
        errors = []
        for case in instance.cases:
            try:
                f, xs = _for_compute_gradient(case.f, case.inputs)
                tf.test.compute_gradient(f, xs)
            except Exception as error:  # noqa: BLE001 -- counted: some cases do not fit compute_gradient
                if over_cap_inside(error):
                    raise over_cap_inside(error) from None
                errors.append({"case": case.name, "error": _first_line(error)})
        return {"errors": errors}


# ----------------------------------------------------------------------------- the element loop


def _flat_output(out) -> tf.Tensor:
    tensors = [tf.convert_to_tensor(leaf) for leaf in tf.nest.flatten(out)]
    leaves = [tf.reshape(tf.cast(t, tf.float64), [-1]) for t in tensors if t.dtype.is_floating]
    return tf.concat(leaves, 0) if len(leaves) > 1 else leaves[0]


def element_loop(f, inputs, cap: float | None = None) -> dict:
    """tape.jacobian, then central differences one element at a time (eager, numpy perturbation).

    With ``cap``, stops as soon as the projected total (time so far + time per
    element so far x elements left) exceeds it, by raising ``OverCap``.
    """
    start = time.perf_counter()
    tensors = [tf.convert_to_tensor(t) for t in inputs]
    checked = [i for i, t in enumerate(tensors) if t.dtype.is_floating]
    facts = {}
    with tf.GradientTape(persistent=True) as tape:
        for i in checked:
            tape.watch(tensors[i])
        y = _flat_output(f(*tensors))
    sources = [tensors[i] for i in checked]
    try:
        jacobians = tape.jacobian(y, sources)
    except (ValueError, NotImplementedError, tf.errors.OpError) as error:
        facts["note"] = f"tape.jacobian with pfor failed ({_first_line(error)[:80]}); used experimental_use_pfor=False"
        jacobians = tape.jacobian(y, sources, experimental_use_pfor=False)
    m = int(y.shape[0])
    analytical = [np.zeros((m, int(np.prod(s.shape)))) if j is None else j.numpy().reshape(m, -1)
                  for j, s in zip(jacobians, sources)]

    arrays = [t.numpy().copy() for t in tensors]
    total = sum(arrays[i].size for i in checked)
    loop_start, done, worst = time.perf_counter(), 0, 0.0
    for i, a in zip(checked, analytical):
        flat = arrays[i].reshape(-1)  # a view: writing it perturbs arrays[i]
        for j in range(flat.size):
            original = flat[j]
            h = EPS * max(1.0, abs(float(original)))
            flat[j] = original + h
            y_plus = _flat_output(f(*[tf.constant(x) for x in arrays])).numpy()
            flat[j] = original - h
            y_minus = _flat_output(f(*[tf.constant(x) for x in arrays])).numpy()
            flat[j] = original
            column = (y_plus - y_minus) / (2.0 * h)
            worst = max(worst, float(np.max(np.abs(column - a[:, j]), initial=0.0)))
            done += 1
            if cap is not None and done >= 3:
                elapsed = time.perf_counter() - loop_start
                if elapsed > min(1.0, cap / 20):
                    projected = (loop_start - start) + elapsed / done * total
                    if projected > cap:
                        raise OverCap(projected, "estimate", f"projected from the first {done} of {total} elements")
    facts["max_abs_diff"] = worst
    return facts


def loop(instance, state, ctx) -> dict:
    with on_device(ctx.device):
        if instance.cases is None:
            return element_loop(instance.f, instance.inputs, ctx.cap)
        errors = []
        for case in instance.cases:
            try:
                element_loop(case.f, case.inputs)
            except Exception as error:  # noqa: BLE001 -- counted
                if over_cap_inside(error):
                    raise over_cap_inside(error) from None
                errors.append({"case": case.name, "error": _first_line(error)})
        return {"errors": errors}


# ----------------------------------------------------------------------------- fast-mode reference


def reference(instance, state, ctx) -> dict:
    """2k eager forward calls, one VJP and one JVP of ``f`` at the problem's input (k = PROBES)."""
    if instance.reference is None:
        raise RuntimeError("no reference for this problem")
    u, d = instance.reference
    (x,) = instance.inputs
    f = instance.f
    with on_device(ctx.device):
        for _ in range(2 * PROBES):
            y = f(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = f(x)
        vjp = tape.gradient(y, x, output_gradients=u)
        with tf.autodiff.ForwardAccumulator(x, d) as accumulator:
            y = f(x)
        jvp = accumulator.jvp(y)
        # u.J.d both ways: a scalar that forces both results (eager CPU runs ops synchronously anyway).
        reverse, forward = float(tf.reduce_sum(vjp * d)), float(tf.reduce_sum(jvp * u))
    return {"forward_calls": 2 * PROBES, "probes": PROBES, "u.J.d (VJP, JVP)": [reverse, forward]}


FUNCTIONS = {
    "fastcheck_cold": fastcheck_cold,
    "fastcheck_warm": fastcheck_warm,
    "hand_batched_cold": hand_batched_cold,
    "hand_batched_warm": hand_batched_warm,
    "compute_gradient": compute_gradient,
    "loop": loop,
    "reference": reference,
}
