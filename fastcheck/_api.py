"""Public entry points: thin wrappers over plan -> numerical / autodiff -> compare -> report."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from fastcheck import _compare
from fastcheck._autodiff import AutodiffJacobian, forward_probe
from fastcheck._config import MACHINE_EPSILON, CheckConfig
from fastcheck._fast import check_fast
from fastcheck._model import model_loss_function, training_gradients
from fastcheck._numeric import NumericalDifferences, numerical_columns, steps
from fastcheck._paths import choose_route, kernel_plan
from fastcheck._plan import (
    Plan,
    _first_line,
    build_plan,
    describe_nonfinite,
    measure_precision,
    normalize_inputs,
    to_real_view,
)
from fastcheck._report import GradientCheckError, GradientReport, PairReport, _index

# Refinement: failing columns are re-evaluated with the step divided by this.
REFINE_RATIO = 4.0
REFINE_LEVELS = 5
DEEP_LEVELS = 12
EDGE_LEVELS = 20


@contextlib.contextmanager
def preserved_variables(variables):
    """Restore every variable to its exact bytes afterwards, whatever happens inside."""
    saved = [(v, v.numpy().copy()) for v in variables]
    try:
        yield
    finally:
        for variable, value in saved:
            if not np.array_equal(variable.numpy(), value, equal_nan=True) or variable.numpy().tobytes() != value.tobytes():
                variable.assign(value)


def _variables_in(inputs) -> list:
    items = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    return [item for item in items if isinstance(item, tf.Variable)]


@contextlib.contextmanager
def _timed(timings: dict, stage: str):
    """Add the seconds spent inside to ``timings[stage]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[stage] = timings.get(stage, 0.0) + time.perf_counter() - start


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


class _Jacobians:
    """Both Jacobians of a plan, per checked input, with the numerical noise estimate."""

    def __init__(self, plan: Plan, config: CheckConfig, timings: dict | None = None):
        self.plan, self.config, self.timings = plan, config, {} if timings is None else timings
        light = kernel_plan(plan)  # what compiled kernels hold: f by weak reference
        with _timed(self.timings, "route"):
            self.route = choose_route(light, config)
        self.differences = NumericalDifferences(light, config, self.route)
        self.autodiff = AutodiffJacobian(light, config, self.route, forward=config.autodiff == "forward")
        self.eps_eval = MACHINE_EPSILON[plan.eval_dtype]
        self.y0 = plan.eval_output  # f at the point, from planning: no extra call

    def measure(self) -> None:
        """Measure f's noise and the precision it computes in (see ``_precision``)."""
        self.plan = measure_precision(self.plan)

    @property
    def noisy(self) -> bool:
        """Whether f's measured noise is beyond the rounding of its evaluation dtype."""
        return self.plan.noise is not None and self.plan.noise_epsilon > self.eps_eval

    def noise(self, spans: np.ndarray) -> np.ndarray:
        sigma = self.plan.noise.sigma if self.plan.noise is not None else None
        return _compare.rounding_noise(self.y0, spans, self.eps_eval, sigma)

    def numerical(self, position: int, columns=None, divide: float = 1.0):
        """Central differences [m, k] for ``columns`` (default all), their noise [m, k] and spans [k]."""
        size = self.plan.inputs[position].size
        columns = np.arange(size) if columns is None else columns
        if not len(columns):
            return np.zeros((self.plan.m, 0)), np.zeros((self.plan.m, 0)), np.zeros(0)
        delta = steps(self.plan, self.config, position)[columns] / divide
        jacobian, _, _, spans = numerical_columns(self.differences, position, columns, delta)
        return jacobian, self.noise(spans), spans

    def refined(self, position: int, columns: np.ndarray, first: np.ndarray | None, first_noise, levels: int,
                up: int = 0):
        """Re-evaluate ``columns`` at steps h/4 ... h/4**levels in one batch; see ``_compare.refine``.

        ``up`` > 0 gives the ladder h*4**up ... h*4, h instead (``first`` is None): for
        noise-limited columns, whose best step is larger than h.
        """
        count = len(columns)
        base = steps(self.plan, self.config, position)[columns]
        divisors = [REFINE_RATIO**k for k in (range(-up, 1) if up else range(1, levels + 1))]
        idx = np.tile(columns, len(divisors))
        delta = np.concatenate([base / d for d in divisors])
        jacobian, plus, minus, spans = numerical_columns(self.differences, position, idx, delta)
        noise = self.noise(spans)
        stack: list[tuple] = [] if first is None else [(first, first_noise, None, None, None)]
        for k in range(len(divisors)):
            part = slice(k * count, (k + 1) * count)
            stack.append((jacobian[:, part], noise[:, part], plus[:, part], minus[:, part], spans[part]))
        sigma = self.plan.noise.sigma if self.plan.noise is not None else None
        return _compare.refine(stack, self.y0, REFINE_RATIO, sigma)

    def analytical(self) -> list[np.ndarray]:
        if self.plan.n == 0:
            return [np.zeros((self.plan.m, 0)) for _ in self.plan.checked]
        return self.autodiff()


def _compute(jac: _Jacobians, supplied=None, refine: bool = True):
    """Numerical and analytical Jacobians [m, n_k] per checked input, with verdicts; and (atol, rtol).

    ``supplied`` replaces autodiff: a callable returning the analytical blocks.
    f's noise and the precision it computes in are measured only when the first
    sweep finds an element outside its band: a larger noise allowance or a looser
    precision can only turn a failure into a pass, never the reverse, so a check
    that passes without them needs no measurement.
    """
    plan = jac.plan
    if supplied is None and jac.config.autodiff == "forward" and plan.n:
        directions = [np.ones((1, spec.size)) for spec in plan.checked]
        _, why = forward_probe(plan, directions)
        if why is not None:
            raise ValueError(f"autodiff='forward' checks forward-mode (JVP) Jacobians, but TensorFlow cannot compute "
                             f"them for f ({why}); pass autodiff='reverse' (what training uses).")
    with _timed(jac.timings, "analytical"):
        analytical = supplied(plan) if supplied is not None else jac.analytical()

    def sweep():
        with _timed(jac.timings, "numerical"):
            return [jac.numerical(spec.position) for spec in plan.checked]

    first = sweep()
    atol, rtol = jac.config.tolerances(jac.plan.precision)
    verdicts = [_compare.verdicts(a, numerical, noise, atol, rtol) for a, (numerical, noise, _) in zip(analytical, first)]
    if any(np.any(status != _compare.OK) for status, _ in verdicts) and jac.plan.noise is None:
        with _timed(jac.timings, "noise"):
            jac.measure()
        atol, rtol = jac.config.tolerances(jac.plan.precision)
        first = [(n, jac.noise(spans), spans) for n, _, spans in first]
        verdicts = [_compare.verdicts(a, n, noise, atol, rtol) for a, (n, noise, _) in zip(analytical, first)]
    results = []
    for spec, a, (numerical, noise, _), (status, band) in zip(plan.checked, analytical, first, verdicts):
        one_sided: dict = {}
        if refine:
            with _timed(jac.timings, "refine"):
                status, band, one_sided = _refine(jac, spec.position, a, numerical, noise, status, band, (atol, rtol))
        results.append((spec, a, numerical, status, band, one_sided))
    return results, (atol, rtol)


def _refine(jac: _Jacobians, position: int, a, numerical, noise, status, band, tolerances):
    """Re-examine suspicious columns in place; returns the new (status, band, one-sided values).

    Only columns with a mismatch or a non-finite difference are re-evaluated, so
    the first pass stays one batched sweep:

    1. triage at h/4: where the estimate barely moves (by < 1% of the mismatch
       and < 10% of itself)
       and the one-sided derivatives agree, the numbers are conclusive and the
       mismatch stands -- a wrong gradient
       costs one extra evaluation pair per column, not five;
    2. the rest go down to h/4**5 (``_compare.refine``): a step that crossed a
       kink, a domain edge or strong curvature gets a better estimate and an
       error bound instead of a false alarm;
    3. still unsettled ones (features far below the step) go down to h/4**12;
       if even that does not settle, the element is UNRESOLVED (undecidable),
       not a wrong gradient.
    """
    atol, rtol = tolerances
    coarsened = _coarsen(jac, position, a, numerical, noise, status, band, tolerances) if jac.noisy else np.zeros(0, int)
    suspicious = np.flatnonzero(np.any((status == _compare.MISMATCH) | (status == _compare.NUMERICAL_NONFINITE), axis=0))
    suspicious = np.setdiff1d(suspicious, coarsened)
    if not len(suspicious):
        return status, band, {}
    first, first_noise = numerical[:, suspicious], noise[:, suspicious]
    delta = steps(jac.plan, jac.config, position)[suspicious] / REFINE_RATIO
    quarter, plus, minus, spans = numerical_columns(jac.differences, position, suspicious, delta)
    with np.errstate(invalid="ignore", over="ignore"):
        mismatch = np.abs(a[:, suspicious] - first)
        moved = np.abs(quarter - first)
        # One-sided derivatives that disagree mean a possible kink: not conclusive.
        curvature = np.abs(plus + minus - 2 * jac.y0[:, None])
        sides = curvature / (spans[None, :] / 2)
        # The step must be small for f: its second-order term far below the first-order
        # one.  Otherwise (cos at 5e7, where the relative step spans periods) two
        # steps can agree by coincidence, and only smaller steps can tell.
        local = curvature <= 0.1 * np.abs(plus - minus) + 2 * first_noise * spans[None, :]
        conclusive = (np.isfinite(moved) & (moved <= 0.01 * mismatch) & (moved <= 0.1 * np.abs(first) + atol)
                      & (sides <= 0.1 * mismatch) & local)
    # A conclusive mismatch must also hold at an independent step (h/4 times the golden
    # ratio): a step near a multiple of a period of f makes quotients agree by coincidence.
    settled_first = np.any((status[:, suspicious] != _compare.OK) & conclusive, axis=0)
    if settled_first.any():
        columns = suspicious[settled_first]
        other, other_plus, other_minus, other_spans = numerical_columns(jac.differences, position, columns,
                                                                        delta[settled_first] * CONFIRM_RATIO)
        with np.errstate(invalid="ignore"):
            slack = 2 * jac.noise(other_spans) * other_spans[None, :]
            # The second difference scales like h^2 too: at a step near a period of f it
            # is far off (cos h = 1 there, and nowhere near at the other step).
            other_curvature = np.abs(other_plus + other_minus - 2 * jac.y0[:, None])
            expected = CONFIRM_RATIO**2 * curvature[:, settled_first]
            holds = ((np.abs(other - quarter[:, settled_first]) <= 0.1 * np.abs(quarter[:, settled_first])
                      + slack / other_spans)
                     & (np.abs(other_curvature - expected) <= 0.5 * expected + 2 * slack))
        conclusive[:, settled_first] &= holds
    doubtful = np.any((status[:, suspicious] != _compare.OK) & ~conclusive, axis=0)
    suspicious, first, first_noise = suspicious[doubtful], first[:, doubtful], first_noise[:, doubtful]
    if not len(suspicious):
        return status, band, {}

    estimate, error, settled, kink, right, left, jump, chosen = jac.refined(position, suspicious, first, first_noise,
                                                                          REFINE_LEVELS)
    numerical[:, suspicious], noise[:, suspicious] = estimate, error
    status, band = _compare.verdicts(a, numerical, noise, atol, rtol)
    # Deeper where a mismatch is not settled or not confirmed, or where every step so
    # far left f's domain (log at 3e-9: only steps below 3e-9 stay inside).
    mismatch = status[:, suspicious] == _compare.MISMATCH
    confirmed = _confirmed(jac, position, suspicious, a[:, suspicious], estimate, error, chosen, mismatch & settled)
    unsettled = np.any((mismatch & ~(settled & confirmed[None, :] & ~jump))
                       | (status[:, suspicious] == _compare.NUMERICAL_NONFINITE), axis=0)
    if unsettled.any():
        keep = np.flatnonzero(unsettled)
        # A column that left f's domain even at h/4**5 may need steps far below h (log at 1e-12).
        outside = np.any(~np.isfinite(estimate[:, keep]), axis=0).any()
        deeper = jac.refined(position, suspicious[keep], first[:, keep], first_noise[:, keep],
                             EDGE_LEVELS if outside else DEEP_LEVELS)
        for target, value in zip((estimate, error, settled, kink, right, left, jump, chosen), deeper):
            target[:, keep] = value
        numerical[:, suspicious], noise[:, suspicious] = estimate, error
        status, band = _compare.verdicts(a, numerical, noise, atol, rtol)
        mismatch = status[:, suspicious] == _compare.MISMATCH
        again = _confirmed(jac, position, suspicious[keep], a[:, suspicious[keep]], estimate[:, keep], error[:, keep],
                           chosen[:, keep], mismatch[:, keep] & settled[:, keep])
        settled[:, keep] &= again[None, :]  # still unconfirmed after the deep steps: unresolved
    kink &= settled  # a kink shows as settled central differences with unequal sides
    one_sided = {}
    for row, k in zip(*np.nonzero(status[:, suspicious] == _compare.MISMATCH)):
        column = suspicious[k]
        if jump[row, k]:
            status[row, column] = _compare.DISCONTINUOUS
        elif not settled[row, k]:
            status[row, column] = _compare.UNRESOLVED
        elif kink[row, k]:
            # A kink at the point itself: both one-sided derivatives are reported;
            # the analytical value is wrong only if it lies outside their range.
            low, high = sorted((left[row, k], right[row, k]))
            one_sided[(int(row), int(column))] = (float(left[row, k]), float(right[row, k]))
            if low - band[row, column] <= a[row, column] <= high + band[row, column]:
                status[row, column] = _compare.NONDIFFERENTIABLE
    return status, band, one_sided


def _coarsen(jac: _Jacobians, position: int, a, numerical, noise, status, band, tolerances) -> np.ndarray:
    """Re-estimate, in place, the columns whose allowance is mostly f's measured noise; returns them.

    At the default step the noise of a noisy f (a bfloat16 matmul inside, a float32
    cast in a float64 loss) swamps the difference quotient, and a pass there would
    say nothing.  Each such column j is sampled at x + t H_j e_j, t = -4..4, with
    H_j large enough for the noise to fall to a third of the tolerance (at most
    ``COARSE_MAX_STEP * max(1, |x_j|)`` for 4 H_j), and the slope of a least-squares
    cubic through the 9 values is the derivative: the cubic term absorbs the
    third-derivative truncation of a central difference, and 9 points average the
    noise.  Its error is ``MEASURED_NOISE_FACTOR`` standard deviations of that slope.
    The same fit at H_j / 4 (256x less fifth-order truncation) decides whether the
    wide one can stand.  A column whose fit leaves residuals beyond the noise (a kink,
    a domain edge or a period of f within 4 H_j) is left to the shrinking ladder.
    """
    atol, rtol = tolerances
    sigma = jac.plan.noise.sigma if jac.plan.noise is not None else np.zeros(jac.plan.m)
    with np.errstate(invalid="ignore"):
        limited = noise > atol + rtol * np.abs(numerical)
    # Columns that left f's domain are for the shrinking ladder, not this one.
    columns = np.flatnonzero(np.any(limited, axis=0) & np.all(np.isfinite(numerical), axis=0)
                             & np.all(np.isfinite(a), axis=0))
    if not len(columns):
        return columns
    base = steps(jac.plan, jac.config, position)[columns]
    scale = base / jac.config.step(jac.eps_eval)  # max(1, |x_j|)
    spread = _compare.MEASURED_NOISE_FACTOR * COARSE_SLOPE_NOISE
    with np.errstate(divide="ignore", invalid="ignore"):
        needed = np.nanmax(3 * spread * sigma[:, None] / (atol + rtol * np.abs(a[:, columns])), axis=0)
    width = np.clip(needed, 4 * base, COARSE_MAX_STEP * scale / 4)
    wide, wide_error, wide_residual = _cubic_slopes(jac, position, columns, width, sigma)
    narrow, narrow_error, narrow_residual = _cubic_slopes(jac, position, columns, width / 4, sigma)
    # The wide fit has a quarter of the noise; it stands where a cubic fits it (residuals
    # within the noise) and the narrow one (256x less quintic truncation) agrees with it.
    with np.errstate(invalid="ignore"):
        fits = 3 * sigma[:, None] + 64 * jac.eps_eval * np.abs(jac.y0)[:, None]
        agree = (np.abs(wide - narrow) <= narrow_error) & (wide_residual <= fits)
    estimate = np.where(agree, wide, narrow)
    error = np.where(agree, wide_error, narrow_error)
    with np.errstate(invalid="ignore"):
        smooth = np.where(agree, wide_residual, narrow_residual) <= fits
    # Only columns where a cubic fits f within its noise are taken; the others (a kink,
    # a domain edge or a period of f within 4 H) go on to the shrinking ladder.
    taken = np.all(smooth & np.isfinite(estimate), axis=0)
    columns, estimate, error = columns[taken], estimate[:, taken], error[:, taken]
    numerical[:, columns], noise[:, columns] = estimate, error
    status[:, columns], band[:, columns] = _compare.verdicts(a[:, columns], estimate, error, atol, rtol)
    return columns


def _cubic_slopes(jac: _Jacobians, position: int, columns, width, sigma):
    """Slopes [m, k] of least-squares cubics through f at x + t width_j e_j (t = -4..4), their
    error (``MEASURED_NOISE_FACTOR`` standard deviations) and the fits' residuals."""
    count = len(columns)
    idx = np.tile(columns, 4)
    delta = np.concatenate([k * width for k in (1.0, 2.0, 3.0, 4.0)])
    _, plus, minus, spans = numerical_columns(jac.differences, position, idx, delta)
    unit = spans.reshape(4, count)[3] / 8  # the step actually realised: half the span at t = 4, over 4
    plus, minus = plus.reshape(-1, 4, count), minus.reshape(-1, 4, count)
    values = np.concatenate([minus[:, ::-1], np.broadcast_to(jac.y0[:, None, None], (jac.plan.m, 1, count)), plus],
                            axis=1)  # [m, 9, k]
    # One least-squares solve for every row and column: the nodes are t = -4..4 in units
    # of each column's step (rounding moves them by far less than the noise allows).
    with np.errstate(invalid="ignore", over="ignore"):
        coefficients = np.einsum("ct,mtk->mck", _CUBIC_FIT, values)  # [m, 4, k]
        fitted = np.einsum("tc,mck->mtk", _NODES, coefficients)
        residual = np.sqrt(np.mean((values - fitted) ** 2, axis=1))
        estimate = coefficients[:, 1] / unit[None, :]
    outside = ~np.all(np.isfinite(values), axis=1)  # outside f's domain: not for this ladder
    estimate[outside], residual[outside] = np.nan, np.inf
    error = _compare.MEASURED_NOISE_FACTOR * COARSE_SLOPE_NOISE * sigma[:, None] / width[None, :]
    return estimate, error, residual


# Noise-limited columns: 4 H at most this relative step; the standard deviation of the
# cubic-fit slope in units of sigma / H (9 nodes -4..4).
COARSE_MAX_STEP = 0.25
_NODES = np.vander(np.arange(-4.0, 5.0), 4, increasing=True)  # [9, 4]: 1, t, t^2, t^3
_CUBIC_FIT = np.linalg.pinv(_NODES)  # [4, 9]
COARSE_SLOPE_NOISE = float(np.sqrt(np.linalg.inv(_NODES.T @ _NODES)[1, 1]))


def _confirmed(jac: _Jacobians, position: int, columns, a, estimate, error, chosen, mismatch) -> np.ndarray:
    """Per column: whether its settled mismatches hold at an independent pair of steps.

    A geometric ladder of steps can fool the h^2 test: when a step h_k of cos at 5e7
    lies near a multiple of pi, so do all the coarser ones (4x, 16x, ...), and their
    quotients agree like converging ones.  A confident mismatch is therefore
    re-estimated at the chosen pair's steps times 0.618 (the golden ratio, which no
    power of 4 approaches): a real one reappears there, a coincidence does not.
    """
    result = np.ones(len(columns), bool)
    check = np.flatnonzero(np.any(mismatch, axis=0))
    if not len(check):
        return result
    # The coarsest pair chosen in each column decides its confirmation steps.
    level = np.array([chosen[mismatch[:, c], c].min() for c in check]).clip(0)
    coarse = steps(jac.plan, jac.config, position)[columns[check]] / REFINE_RATIO**level * CONFIRM_RATIO
    idx = np.concatenate([columns[check], columns[check]])
    derivative, plus, minus, spans = numerical_columns(jac.differences, position, idx,
                                                       np.concatenate([coarse, coarse / REFINE_RATIO]))
    half = len(check)
    other, other_error = _compare.richardson(derivative[:, :half], derivative[:, half:], REFINE_RATIO)
    other_error = other_error + jac.noise(spans[half:]) * 2
    with np.errstate(invalid="ignore"):
        curvature = np.abs(plus + minus - 2 * jac.y0[:, None])
        slack = 2 * jac.noise(spans) * spans[None, :]
        agree = ((np.abs(other - estimate[:, check]) <= 0.1 * np.abs(estimate[:, check]) + 2 * (
            error[:, check] + other_error))
            & (curvature[:, half:] <= curvature[:, :half] / 4 + slack[:, :half] + slack[:, half:]))
    result[check] = np.all(agree | ~mismatch[:, check], axis=0)
    return result


# Confirmation steps of a refined mismatch, relative to the pair that gave it.
CONFIRM_RATIO = 0.6180339887


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


def _split_rows(plan: Plan, block: np.ndarray) -> list[np.ndarray]:
    return [block[o.offset : o.offset + o.size] for o in plan.outputs]


def _view_shape(spec) -> tuple:
    return tuple(spec.real_view.shape)


def _output_view_shape(output) -> tuple:
    return tuple(output.shape) + ((2,) if output.dtype.is_complex else ())


def _run(f: Callable, inputs, config: CheckConfig, title: str = "gradient check", *, supplied=None,
         names=None, protect=(), output_name=None, kind: str | None = None, extra_notes=()) -> GradientReport:
    start = time.perf_counter()
    timings: dict[str, float] = {}
    with _on_device(config.device), preserved_variables([*_variables_in(inputs), *protect]):
        with _timed(timings, "plan"):
            plan = build_plan(f, inputs, config, names)
        if plan.nondeterministic:
            return GradientReport([], "none", "-", time.perf_counter() - start, plan.notes, [plan.nondeterministic], title,
                                  timings)
        mode, why = choose_mode(plan, config, supplied)
        jac = _Jacobians(plan, config, timings)
        side_notes: list[str] = []
        warnings: list[str] = []
        if mode == "fast":
            with _timed(timings, "noise"):
                jac.measure()  # a few evaluations, next to fast mode's cost
            atol, rtol = config.tolerances(jac.plan.precision)
            with _timed(timings, "fast"):
                pairs: list = check_fast(kernel_plan(jac.plan), config, jac.route, jac.y0, atol, rtol)
            kind = "fast"
        else:
            pairs, side_notes, warnings, (atol, rtol) = _full_pairs(jac, supplied, output_name)
            kind = kind or ("supplied" if supplied is not None else jac.autodiff.mode)
        plan = jac.plan
        notes = [*plan.notes, *extra_notes, *_precision_notes(plan, config, atol, rtol), f"mode: {mode} ({why})",
                 f"path: {jac.route.path} ({jac.route.reason})", *jac.route.fallbacks, *side_notes]
        for spec in plan.checked:
            chunk = jac.route.chunks.get(spec.position, spec.size)
            if mode == "full" and jac.route.path != "eager" and 0 < chunk < spec.size:
                notes.append(f"{spec.name}: chunked to {chunk} perturbations per call "
                             f"({-(-spec.size // chunk)} calls) {jac.route.chunk_reason}")
        problems = [] if np.all(np.isfinite(jac.y0)) else [describe_nonfinite(plan, jac.y0)]
        return GradientReport(pairs, jac.route.path, kind, time.perf_counter() - start, notes, problems, title, timings,
                              warnings)


def _precision_notes(plan: Plan, config: CheckConfig, atol: float, rtol: float) -> list[str]:
    """What the check learnt about the precision f computes in, when it is not what the dtypes say."""
    notes = []
    if plan.precision_reason:
        given = " (as given)" if config.atol is not None or config.rtol is not None else ""
        notes.append(f"{plan.precision_reason}: the analytical side is judged with {plan.precision} tolerances "
                     f"atol={atol:g}, rtol={rtol:g}{given}")
    if plan.noise is not None and plan.noise_epsilon > MACHINE_EPSILON[plan.eval_dtype]:
        notes.append(f"f's evaluations carry relative noise {plan.noise.relative:.2g} (measured; {plan.eval_dtype.name} "
                     f"rounds at {MACHINE_EPSILON[plan.eval_dtype]:.2g}): noise allowances follow it, and columns it "
                     "swamps are re-estimated at larger steps")
    return notes


def _full_pairs(jac: _Jacobians, supplied, output_name) -> tuple[list[PairReport], list[str], list[str], tuple]:
    """Full Jacobians, compared and cut into one PairReport per (output, input); notes, warnings, (atol, rtol)."""
    plan = jac.plan
    try:
        results, (atol, rtol) = _compute(jac, supplied)
    except (TypeError, ValueError, GradientCheckError):
        raise
    except Exception as error:  # f failed inside a batched kernel: say so, keep the cause
        raise ValueError(
            f"f raised {type(error).__name__} while fastcheck evaluated it in a batched tf.function: "
            f"{_first_line(error)}\nf ran eagerly at the inputs; check that it can be traced "
            "(no .numpy() calls or Python side effects on tensors), or pass jit_compile=False."
        ) from error
    side = "forward" if jac.config.autodiff == "forward" else "reverse"
    pairs = _pairs(plan, results, atol, rtol, output_name, side)
    notes: list[str] = []
    warnings: list[str] = []
    if supplied is None and jac.config.autodiff in ("auto", "both") and plan.n:
        with _timed(jac.timings, "forward"):
            forward_pairs, note = _forward_side(jac, results, atol, rtol, output_name)
        notes.append(note)
        if jac.config.autodiff == "both":
            pairs += forward_pairs
        else:
            for pair in forward_pairs:
                e = pair.worst_element
                if not pair.ok and e is not None:
                    warnings.append(
                        f"forward mode (JVP, tf.autodiff.ForwardAccumulator) is wrong for {pair.output_name} / "
                        f"{pair.input_name}: {pair.count(_compare.MISMATCH)} elements differ, worst d "
                        f"{_index(pair.output_name, e.output_index)} / d {_index(pair.input_name, e.input_index)}: "
                        f"JVP={e.analytical:.8g} numerical={e.numerical:.8g}. Reverse mode, which training uses, "
                        "agrees; forward mode differentiates f's forward ops (it ignores tf.custom_gradient) or uses "
                        "a wrong forward-mode rule of an op. Pass autodiff='both' to make it part of the verdict."
                    )
    return pairs, notes, warnings, (atol, rtol)


def _pairs(plan: Plan, results, atol, rtol, output_name, side: str) -> list[PairReport]:
    pairs = []
    for spec, a, numerical, status, band, one_sided in results:
        for output, a_rows, n_rows, s_rows, b_rows in zip(
            plan.outputs, *(_split_rows(plan, x) for x in (a, numerical, status, band))
        ):
            pair = PairReport(output_name or output.name, spec.name, _output_view_shape(output), _view_shape(spec),
                              n_rows, a_rows, s_rows, b_rows, atol, rtol, side=side)
            pair.one_sided = {(r - output.offset, c): v for (r, c), v in one_sided.items()
                              if output.offset <= r < output.offset + output.size}
            pair.hint = _compare.diagnose(a_rows, n_rows, s_rows)
            pairs.append(pair)
    return pairs


# Random directions of the forward-mode (JVP) check in autodiff="auto": one random
# sign vector over every column catches a wrong JVP column with probability ~1.
FORWARD_PROBES = 1


def _forward_side(jac: _Jacobians, results, atol, rtol, output_name) -> tuple[list[PairReport], str]:
    """Forward-mode pairs (autodiff="both", or "auto" after a failing probe) and a note on what was checked.

    autodiff="auto" first compares a few random JVPs ``J v`` (one eager forward
    pass each, all inputs at once) with the numerical ``N v`` under the 2-norm of
    the element bands; only when they disagree is the full forward Jacobian
    computed, to name the elements.
    """
    plan, config = jac.plan, jac.config
    rng = np.random.default_rng(config.seed + 4242)
    # Columns at kinks or unresolved stay out: there the numerical value is not a derivative.
    directions = [rng.choice([-1.0, 1.0], size=(FORWARD_PROBES, spec.size)) * np.all(status == _compare.OK, axis=0)
                  for spec, _, _, status, _, _ in results]
    jvp, why = forward_probe(plan, directions)
    if jvp is None:
        if config.autodiff == "both":
            raise ValueError(f"autodiff='both' asks for forward-mode Jacobians, but TensorFlow cannot compute them for f "
                             f"({why}); pass autodiff='reverse'.")
        return [], f"forward mode (JVP) not checked: {why}"
    if config.autodiff == "auto" and _compare.directions_agree(jvp, directions, [r[2] for r in results],
                                                                [r[4] for r in results]):
        return [], f"forward mode (JVP) agrees along {FORWARD_PROBES} random direction(s)"
    try:
        forward = AutodiffJacobian(plan, config, jac.route, forward=True)()
    except Exception as error:
        if config.autodiff == "both":
            raise ValueError(f"autodiff='both' asks for forward-mode Jacobians, but TensorFlow cannot compute them for f "
                             f"({type(error).__name__}: {_first_line(error)}); pass autodiff='reverse'.") from error
        return [], f"forward mode (JVP) disagreed on a random direction, but its full Jacobian failed ({type(error).__name__})"
    compared = []
    for (spec, _, numerical, status, band, one_sided), block in zip(results, forward):
        forward_status = _compare.verdicts(block, numerical, band, 0.0, 0.0)[0]  # the reverse side's bands
        undecided = status != _compare.OK  # kinks, unresolved and non-finite numerics: as on the reverse side
        forward_status[undecided] = status[undecided]
        compared.append((spec, block, numerical, forward_status, band, one_sided))
    return _pairs(plan, compared, atol, rtol, output_name, "forward"), "forward mode (JVP): full Jacobian compared"


def check_gradients(f: Callable, inputs, *, eps=None, atol=None, rtol=None, jit_compile="auto",
                    memory_budget=None, device=None, precision="auto", mode="auto", probes=4, seed=0,
                    order=1, progress=None, autodiff="auto") -> GradientReport:
    """Compare autodiff Jacobians of ``f`` with batched central differences.

    Every floating or complex input is checked (complex ones as (real, imag)
    pairs); integer and bool inputs are passed through unperturbed.  An element
    passes when ``|analytical - numerical| <= atol + rtol * |numerical| + noise``
    and both are finite, where ``noise`` is the numerical side's own error
    estimate (rounding, and the Richardson estimate for refined columns).

    Args:
      f: callable taking the inputs positionally and returning a tensor or a
        nested list/tuple/dict of tensors.
      inputs: one tensor-like (tf.Tensor, tf.Variable, numpy array, Python
        number; Python floats become float64) or a list/tuple of them.
      eps: relative step; element ``j`` is perturbed by ``eps * max(1, |x_j|)``.
        Default ``machine_epsilon ** (1/3)`` of the evaluation dtype.
      atol, rtol: tolerances; default from the table in ``_config.py`` by the
        analytical dtype (float64: 1e-8, 1e-6; float32: 1e-5, 1e-4).
      jit_compile: "auto" (XLA when the batched work pays for compilation and f
        compiles), True or False.
      memory_budget: bytes the batched evaluations may use (default 1 GiB).
      device: e.g. "/GPU:0" to pin the check to one device.
      precision: "auto" evaluates the numerical side in float64 when f accepts
        float64 inputs, "native" never, "float64" always (error if f cannot).
      mode: "full" (whole Jacobians), "fast" (``probes`` random projections
        u.J.d checked against both a JVP and a VJP, with localisation of a
        defect), or "auto": full when the Jacobian fits ``memory_budget`` and
        inputs have at most 200,000 elements; the report says which ran.
      probes, seed: number of random probe pairs in fast mode, and the seed of
        their private generator (global RNG state is never touched).
      order: 1 checks gradients; 2 checks gradients of gradients (Hessian-vector
        products for scalar f; the gradient of u.f for a fixed seeded u otherwise).
      progress: a progress bar for long sweeps: None shows one on a terminal when
        the sweep will take more than 2 s, True always, False never.

    Returns:
      A ``GradientReport``; ``bool(report)`` tells whether every element passed.

    Raises:
      TypeError / ValueError: for misuse (not callable, no floating inputs, f
        raising, output shapes changing under perturbation, ...).

    Example:
      >>> import tensorflow as tf, fastcheck
      >>> report = fastcheck.check_gradients(tf.sin, tf.constant([0.5, 1.0], tf.float64))
      >>> report.ok
      True
    """
    config = CheckConfig(eps, atol, rtol, jit_compile, memory_budget, device, precision, mode, probes, seed, order,
                         progress, autodiff)
    if order == 2:
        return _run(gradient_function(f, inputs, seed), inputs, config, "second-order check")
    return _run(f, inputs, config)


def _config(options: dict, entry: str) -> CheckConfig:
    """The configuration from keyword options, with a TypeError naming any unknown one."""
    known = {field.name for field in dataclasses.fields(CheckConfig)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"{entry}() got unknown option(s) {', '.join(map(repr, unknown))}; "
                        f"the options are {', '.join(sorted(known))}.")
    return CheckConfig(**options)


def assert_gradients_close(f: Callable, inputs, **options) -> GradientReport:
    """Like ``check_gradients``, but raise ``GradientCheckError`` (its message is the report) on failure.

    Example:
      >>> import tensorflow as tf, fastcheck
      >>> _ = fastcheck.assert_gradients_close(tf.tanh, tf.constant([0.3], tf.float64))
    """
    report = check_gradients(f, inputs, **options)
    if not report.ok:
        raise GradientCheckError(report)
    return report


def _by_output(plan: Plan, blocks: dict) -> list[list]:
    return [
        [blocks[s.position][o.offset : o.offset + o.size] if s.position in blocks else None for s in plan.inputs]
        for o in plan.outputs
    ]


def numerical_jacobian(f: Callable, inputs, **options) -> list[list[np.ndarray | None]]:
    """Batched central-difference Jacobians: ``result[output][input]`` of shape (output_size, input_size).

    Outputs are the floating leaves of ``f``'s result in ``tf.nest.flatten``
    order; non-floating inputs get ``None``.  Options as for ``check_gradients``.
    """
    config = _config(options, "numerical_jacobian")
    f = gradient_function(f, inputs, config.seed) if config.order == 2 else f
    with _on_device(config.device), preserved_variables(_variables_in(inputs)):
        plan = build_plan(f, inputs, config)
        jac = _Jacobians(plan, config)
        return _by_output(plan, {s.position: jac.numerical(s.position)[0] for s in plan.checked})


def autodiff_jacobian(f: Callable, inputs, **options) -> list[list[np.ndarray | None]]:
    """Autodiff Jacobians in the same layout as ``numerical_jacobian``."""
    config = _config(options, "autodiff_jacobian")
    f = gradient_function(f, inputs, config.seed) if config.order == 2 else f
    with _on_device(config.device), preserved_variables(_variables_in(inputs)):
        plan = build_plan(f, inputs, config)
        analytical = _Jacobians(plan, config).analytical()
        return _by_output(plan, {s.position: a for s, a in zip(plan.checked, analytical)})


class GradientChecker:
    """Holds default options; every method accepts overrides of them.

    Example:
      >>> import tensorflow as tf, fastcheck
      >>> checker = fastcheck.GradientChecker(rtol=1e-5)
      >>> checker.check(tf.exp, tf.constant([0.1], tf.float64)).ok
      True
    """

    def __init__(self, **defaults):
        self.config = _config(defaults, "GradientChecker")

    def _options(self, overrides) -> dict:
        return {**self.config.__dict__, **overrides}

    def check(self, f: Callable, inputs, **overrides) -> GradientReport:
        return check_gradients(f, inputs, **self._options(overrides))

    def assert_close(self, f: Callable, inputs, **overrides) -> GradientReport:
        return assert_gradients_close(f, inputs, **self._options(overrides))

    def verify_gradients(self, f: Callable, inputs, grads, **overrides) -> GradientReport:
        return verify_gradients(f, inputs, grads, **self._options(overrides))

    def check_model(self, model, loss_fn: Callable, data, *, variables=None, **overrides) -> GradientReport:
        return check_model(model, loss_fn, data, variables=variables, **self._options(overrides))



def gradient_function(f: Callable, inputs, seed: int = 0) -> Callable:
    """``g(*inputs)`` = the gradient of ``u . f(*inputs)`` w.r.t. every floating input.

    ``u`` is 1 for a scalar ``f`` (so the check of ``g`` is a check of the
    Hessian) and a fixed seeded random cotangent otherwise.  Checking ``g``'s
    Jacobian catches a custom gradient whose own gradient is wrong.
    """
    if not callable(f):
        raise TypeError(f"f must be callable (a function, tf.function or Keras layer); got {type(f).__name__}.")
    values = [spec.value for spec in normalize_inputs(inputs)]  # as the check itself will see them
    leaves = [tf.convert_to_tensor(t) for t in tf.nest.flatten(f(*values))]
    rng = np.random.default_rng(seed)
    weights = [None if not t.dtype.is_floating else (tf.ones_like(t) if t.shape.num_elements() == 1
               else tf.constant(rng.standard_normal(t.shape.as_list()), t.dtype)) for t in leaves]

    def gradient(*args):
        args = list(args)
        floating = [i for i, a in enumerate(args) if tf.as_dtype(a.dtype).is_floating]
        with tf.GradientTape() as tape:
            for i in floating:
                tape.watch(args[i])
            outs = [tf.convert_to_tensor(t) for t in tf.nest.flatten(f(*args))]
            total = tf.add_n([tf.reduce_sum(tf.cast(w, o.dtype) * o) for w, o in zip(weights, outs) if w is not None])
        grads = tape.gradient(total, [args[i] for i in floating], unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return tuple(tf.convert_to_tensor(g) for g in grads)

    return gradient


def _supplied_gradients(inputs, grads):
    """Analytical blocks [1, n_k] from the user's gradients, with errors naming the input."""

    def blocks(plan: Plan):
        given = grads(*[s.value for s in plan.inputs]) if callable(grads) else grads
        several = isinstance(inputs, (list, tuple))
        if several:
            if not isinstance(given, (list, tuple)) or len(given) != len(plan.inputs):
                count = len(given) if isinstance(given, (list, tuple)) else "a single value"
                raise ValueError(f"grads must have one entry per input ({len(plan.inputs)}), got {count}.")
            items = list(given)
        else:
            items = [given[0] if isinstance(given, (list, tuple)) and len(given) == 1 else given]
        result = []
        for spec in plan.checked:
            item = items[spec.position]
            if item is None:
                raise ValueError(f"grads for {spec.name} is None: pass the gradient of the summed output with "
                                 f"respect to {spec.name}, shape {tuple(spec.value.shape)}.")
            try:
                value = tf.convert_to_tensor(item)
            except (TypeError, ValueError):
                raise TypeError(f"grads for {spec.name} is a {type(item).__name__}, not a tensor or array.") from None
            if tuple(value.shape) != tuple(spec.value.shape):
                raise ValueError(f"grads for {spec.name} has shape {tuple(value.shape)} but {spec.name} has shape "
                                 f"{tuple(spec.value.shape)}; pass one gradient entry per input element.")
            if spec.is_complex and not value.dtype.is_complex:
                value = tf.complex(tf.cast(value, spec.dtype.real_dtype), tf.zeros_like(tf.cast(value, spec.dtype.real_dtype)))
            real = to_real_view(value) if spec.is_complex else value
            result.append(real.numpy().astype(np.float64).reshape(1, -1))
        return result

    return blocks


def _summed(f: Callable) -> Callable:
    def scalar(*args):
        out = f(*args)
        if out is None:
            return None
        leaves = [tf.convert_to_tensor(t) for t in tf.nest.flatten(out)]
        floating = [t for t in leaves if t.dtype.is_floating]
        if not floating:
            return out
        dtype = min((t.dtype for t in floating), key=lambda d: MACHINE_EPSILON[d])
        return tf.add_n([tf.reduce_sum(tf.cast(t, dtype)) for t in floating])

    return scalar


def verify_gradients(f: Callable, inputs, grads, **options) -> GradientReport:
    """Check gradients computed by hand against batched central differences.

    ``f`` returns a scalar; if it returns a tensor (or a structure of them), the
    sum of all its elements is the scalar. ``grads`` are the gradients of that
    scalar with respect to each input -- tensors/arrays with the inputs'
    structure and shapes -- or a callable taking the inputs and returning them.
    The rule and report are those of ``check_gradients``.

    Raises:
      ValueError / TypeError: when ``grads`` does not match the inputs (a wrong
        shape, a missing entry, a ``None``), naming the input.

    Example:
      >>> import tensorflow as tf, fastcheck
      >>> x = tf.constant([1.0, 2.0], tf.float64)
      >>> fastcheck.verify_gradients(lambda x: tf.reduce_sum(x ** 2), x, 2 * x).ok
      True
    """
    config = _config(options, "verify_gradients")
    if config.order == 2:
        # Gradients of the supplied gradients: the Jacobian of the user's gradient
        # function (its autodiff, e.g. a custom gradient's own gradient) against
        # central differences of it.
        if not callable(grads):
            raise TypeError("verify_gradients(order=2) checks the derivatives of your gradient function: pass grads "
                            "as a callable taking the inputs, not as arrays.")
        return _run(grads, inputs, config, "verify_gradients (order=2: Jacobian of grads)")
    return _run(_summed(f), inputs, config, "verify_gradients", supplied=_supplied_gradients(inputs, grads),
                output_name="sum(f)")


def check_model(model, loss_fn: Callable, data, *, variables=None, **options) -> GradientReport:
    """Check the gradient of ``loss_fn(y, model(x, training=False))`` w.r.t. the model's variables.

    One report pair per variable (``model.trainable_variables``, or ``variables``),
    named by the variable's path.  Works for Keras 3 models (via
    ``stateless_call``), tf_keras models and ``tf.Module``s; perturbations of
    variable values are batched and no variable is ever assigned: every value is
    bit-for-bit the same afterwards, even when the check raises.

    Args:
      model: the model or module.
      loss_fn: ``loss_fn(y_true, y_pred)`` returning a scalar (or a tensor, summed).
      data: a pair ``(x, y)``.
      variables: the variables to check (default: all trainable ones).
      **options: as for ``check_gradients``.
    """
    config = _config(options, "check_model")
    f, values, names, every = model_loss_function(model, loss_fn, data, variables)
    chosen = list(variables) if variables is not None else None
    if config.order == 2:
        return _run(gradient_function(_summed(f), values, config.seed), values, config,
                    "check_model (order=2: Hessian of the loss)", names=names, protect=every)
    # Called inside the check, after the determinism test, with every variable restored afterwards.
    supplied = _supplied_gradients(values, lambda *_: training_gradients(model, loss_fn, data, chosen, f, values, names))
    return _run(_summed(f), values, config, "check_model", supplied=supplied, names=names, protect=every,
                output_name="loss", kind="reverse",
                extra_notes=["analytical side: tape.gradient of the loss over the model's own variables, as a training "
                             "step computes it (custom gradients with variables= included)"])
