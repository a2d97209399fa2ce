"""Element-wise verdicts.

The rule, element by element, for analytical ``a`` and numerical ``n``::

    |a - n| <= atol + rtol * |n| + noise

where ``noise`` is the numerical side's own error estimate: its rounding error ``NOISE_FACTOR * eps_eval *
|f(x)| / span`` plus, for columns refined with a smaller step, the Richardson truncation estimate.  Both sides must
be finite; a NaN/Inf on either side fails, with its own status.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from fastcheck.engine.tables import (
    FACTOR_ELEMENTS,
    FLAT_ROUNDINGS,
    JUMP_VISIBLE,
    KINK_VISIBLE,
    MEASURED_NOISE_FACTOR,
    NOISE_FACTOR,
    QUANTA,
    RESOLUTION_NOISE_SHARE,
    RESOLUTION_RTOLS,
    ROW_BLOCK,
    UNSTEADY_VISIBLE,
    VERDICT_BLOCK,
)
from fastcheck.report.events import Hint

OK, MISMATCH, ANALYTICAL_NONFINITE, NUMERICAL_NONFINITE, NONDIFFERENTIABLE, UNRESOLVED, DISCONTINUOUS = 0, 1, 2, 3, 4, 5, 6
UNRESOLVED_KINK = 7
FLAT = 8
STATUS_NAMES = {
    OK: "ok",
    MISMATCH: "mismatch",
    ANALYTICAL_NONFINITE: "analytical not finite",
    NUMERICAL_NONFINITE: "numerical not finite",
    NONDIFFERENTIABLE: "not differentiable here",
    UNRESOLVED: "numerical derivative unresolved",
    DISCONTINUOUS: "f jumps here",
    UNRESOLVED_KINK: "kinks no step resolves",
    FLAT: "f does not move here",
}
# Statuses that make a check fail.  A kink whose analytical value is one of the one-sided derivatives (or between
# them) is reported but is not a wrong gradient.  Outside sides that settled (f one-sidedly linear at every step) it
# is a MISMATCH: no subgradient.  Outside sides that did not, undecidable (UNRESOLVED_KINK), not wrong: every
# step crossed the kink, and several kinks closer together than any step (ReLUs whose inputs all lie within 1e-11
# of 0, as in a freshly initialised deep network) look like one, with a derivative at the point that need not lie
# between the sides.  FLAT: a mismatch whose quotient is f's output not moving beyond a few of its roundings
# (``flat``): f is piecewise constant there (a quantizer; the analytical value a surrogate such as a straight-through
# estimator), or float32 rounding inside f swallows the change.  Neither shows the gradient wrong: undecidable.
FAILING = (MISMATCH, ANALYTICAL_NONFINITE, NUMERICAL_NONFINITE, UNRESOLVED, DISCONTINUOUS, UNRESOLVED_KINK, FLAT)
# Statuses that say "the numerics cannot decide here", as opposed to "the gradient is wrong".
UNDECIDED = (NUMERICAL_NONFINITE, UNRESOLVED, DISCONTINUOUS, UNRESOLVED_KINK, FLAT)
# Whether a status code is in FAILING, indexed by the code: a lookup, not np.isin (~15 us a call on a small pair).
IS_FAILING = np.isin(np.arange(max(STATUS_NAMES) + 1), FAILING)


def flat(numerical: np.ndarray, spans: np.ndarray, level: np.ndarray) -> np.ndarray:
    """[m, k] whether each quotient is f's output moving by at most ``FLAT_ROUNDINGS`` times
    ``level`` [m] (or [m, k]), the rounding of one evaluation (eps_eval |f(x)|, or f's measured noise)."""
    with np.errstate(invalid="ignore", over="ignore"):
        moved = np.abs(numerical) * np.abs(spans)[None, :]
        return np.isfinite(moved) & (moved <= FLAT_ROUNDINGS * (level if level.ndim == 2 else level[:, None]))


def resolution(scale: np.ndarray, allowed: np.ndarray, tolerated: np.ndarray, usable: np.ndarray) -> tuple[float, float]:
    """(resolution, the tolerance's own) over the ``usable`` entries with a nonzero ``scale``
    (the analytical value); (inf, inf) where there is none: a zero gradient (``zero``, which callers leave out of
    ``usable``) is judged by its absolute bound alone."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        size = np.abs(scale)
        keep = usable & (size > 0) & (size < np.inf) & (np.abs(allowed) < np.inf)
        resolved = float(np.min(np.divide(allowed, size, where=keep, out=np.full(size.shape, np.inf)), initial=np.inf))
        tolerance = float(np.min(np.divide(tolerated, size, where=keep, out=np.full(size.shape, np.inf)),
                                 initial=np.inf))
    return resolved, tolerance


def zero(analytical, numerical, allowed, atol: float, rtol: float) -> np.ndarray:
    """Where a gradient is zero within the numerics: the analytical value within atol of 0 and the numerical one
    within its own error of 0 (what ``allowed`` allows beyond the tolerances ``allowance(numerical, atol, rtol)``).
    No relative error of such a value means anything, so ``resolution`` leaves it out as it does an exact 0: it is
    judged by its absolute bound, ``allowed``.  A small gradient the numerical side resolves as nonzero is not zero."""
    with np.errstate(invalid="ignore", over="ignore"):
        noise = allowed - allowance(numerical, atol, rtol)
        return (np.abs(analytical) <= atol) & (np.abs(numerical) <= noise)


def resolves(analytical, band, usable, rtol: float) -> bool:
    """Whether some usable element's allowance resolves ``RESOLUTION_RTOLS * rtol`` of its gradient: then so does
    the pair's (or block's) resolution, a minimum over its elements, and no pass over the rest is needed (a block read
    a part at a time is read no further)."""
    with np.errstate(invalid="ignore", over="ignore"):
        size = np.abs(np.asarray(analytical, np.float64))
        return bool(np.any(usable & (size > 0) & (size < np.inf) & (band <= RESOLUTION_RTOLS * rtol * size)))


def coarse(resolved: float, tolerance: float, rtol: float) -> bool:
    """Whether a pass at this resolution says too little: see ``RESOLUTION_RTOLS``."""
    return bool(resolved > max(RESOLUTION_RTOLS * rtol, RESOLUTION_NOISE_SHARE * tolerance))


def rounding_level(y0, eps_eval, sigma=None, factor: float = NOISE_FACTOR, measured: float = MEASURED_NOISE_FACTOR):
    """What one evaluation of each output may be off by, the one statement of f's noise (numpy, broadcasting):
    ``factor * eps_eval * |f_i|`` (rounding; ``eps_eval`` per output row, ``Plan.row_epsilon``, or one for all), or
    ``measured * sigma_i`` where f's noise was measured (``sigma``: the standard deviation of its evaluations, see
    ``precision``) and is larger: a band of about 6 standard deviations of a difference quotient, so that a million
    elements of a correct noisy f raise no false alarm.  ``flat`` reads the bare level (both factors 1).  Numpy
    arrays or, without ``sigma``, TF tensors (the XLA screen's)."""
    level = abs(y0) * (factor * eps_eval)
    return level if sigma is None else np.maximum(level, measured * sigma)


def quotient_noise(level, spans) -> np.ndarray | tf.Tensor:
    """The rounding error of central difference quotients (f(x+) - f(x-)) / span of outputs off by ``level``
    (``rounding_level``): ``level / |span|``, 0 where that is not finite (broadcasting: an element's span, or an
    outer product of rows and columns).  Numpy arrays, or TF tensors (fast mode's probes, the XLA screen: by
    division, the same value within an ulp)."""
    if isinstance(level, tf.Tensor) or isinstance(spans, tf.Tensor):
        noise = level / tf.abs(spans)
        return tf.where(tf.math.is_finite(noise), noise, tf.zeros_like(noise))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        noise = np.asarray(level * (1.0 / np.abs(spans)), np.float64)
        noise[~np.isfinite(noise)] = 0.0
        return noise


def verdicts(analytical: np.ndarray, numerical: np.ndarray, noise, atol: float, rtol: float, out=None,
             bands: bool = True, block: int = VERDICT_BLOCK):
    """Status per element (OK / MISMATCH / ...NONFINITE) and the band each element had to meet (None without
    ``bands``).

    ``noise`` is an array of numerical's shape.  ``out``: a (status, band)
    pair of earlier verdicts to overwrite (a new [m, n] float64 array costs its page faults again).  The rule runs
    over blocks of rows that fit in cache (``block`` elements): one trip through memory instead of one per operation.
    """
    columns = numerical.shape[1] if numerical.ndim == 2 else 1
    rows = max(1, block // max(1, columns))
    if out is None and numerical.shape[0] <= rows:  # one block: its arrays are the result
        status, band = _block_verdicts(analytical, numerical, noise[:], atol, rtol)
        return status, band if bands else None
    status, band = out if out is not None else (np.empty(numerical.shape, np.int8),
                                                np.empty(numerical.shape, np.float64) if bands else None)
    for start in range(0, numerical.shape[0], rows):
        part = slice(start, start + rows)
        block_status, block_band = _block_verdicts(analytical[part], numerical[part], noise[part], atol, rtol)
        status[part] = block_status
        if band is not None:
            band[part] = block_band
    return status, band


def allowance(reference, atol, rtol, noise=0.0, norms=1.0):
    """What the rule allows an element: ``atol ||d||_2 + rtol |reference| + noise``, the one statement of the band.

    ``reference`` is the numerical value (a kink's analytical one, a twin's float64 gradient), ``noise`` the
    numerical side's own error estimate, ``norms`` the 2-norm of fast mode's probe d (1 for an element).  One formula
    for numpy arrays, TF tensors (``fast``) and XLA (``coloured``'s screen), in the same order of operations, so
    every side rounds the band as numpy does.
    """
    return abs(reference) * rtol + atol * norms + noise


def same_computation(analytical, twin, atol, rtol) -> np.ndarray:
    """Where the float64 twin is the gradient's own computation (every mode's twin gate): finite, and within the
    gradient's own tolerance of it."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(twin) & (np.abs(analytical - twin) <= allowance(twin, atol, rtol))


def _block_verdicts(analytical, numerical, noise, atol, rtol):
    with np.errstate(invalid="ignore", over="ignore"):
        band = allowance(numerical, atol, rtol, np.where(np.isfinite(noise), noise, 0.0))
        difference = np.subtract(analytical, numerical)
        np.abs(difference, out=difference)
        status = np.greater(difference, band).view(np.int8)  # MISMATCH == 1 (a bool is one byte, 0 or 1)
    if np.isfinite(difference).all():  # both sides finite everywhere (a non-finite side makes its difference so)
        return status, band
    numerical_bad = ~np.isfinite(numerical)
    if numerical_bad.any():
        status[numerical_bad] = NUMERICAL_NONFINITE
    analytical_bad = ~np.isfinite(analytical)
    if analytical_bad.any():
        status[analytical_bad & ~numerical_bad] = ANALYTICAL_NONFINITE
    return status, band


def richardson(coarse: np.ndarray, fine: np.ndarray, ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """Extrapolate two central differences (steps h and h/ratio) and estimate the error left."""
    factor = ratio**2
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite quotients stay non-finite, judged as such
        return (factor * fine - coarse) / (factor - 1), np.abs(fine - coarse) / (factor - 1)


def second_step(analytical, first, first_noise, second, second_noise, atol: float, rtol: float,
                ratio: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which directions a second step passes outright (a first sweep's failures, before any ladder):
    ([k], their estimate [m, k], its error [m, k]).

    A direction passes where, at each of its elements, the quotient at step h/ratio passes the rule on its own -- as
    a first sweep at that step would -- and so does its Richardson extrapolation with the first step's quotient,
    allowed the pair's rounding alone (no truncation estimate: a step that crosses a kink or a jump moves the two
    quotients apart, and their gap excuses nothing).  A correct f whose first step was only truncation-limited
    (float32's h^2 term where f' is near 0) passes here; the rest goes down the ladder.  The estimate is the
    extrapolation.
    """
    estimate, _ = richardson(first, second, ratio)
    factor = ratio**2
    with np.errstate(invalid="ignore", over="ignore"):
        rounding = second_noise * (factor + 1) / (factor - 1) + first_noise / (factor - 1)
    alone, _ = verdicts(analytical, second, second_noise, atol, rtol, bands=False)
    extrapolated, _ = verdicts(analytical, estimate, rounding, atol, rtol, bands=False)
    return np.all((alone == OK) & (extrapolated == OK), axis=0), estimate, rounding


class Refined(NamedTuple):
    """What ``refine`` found, per element [m, k]: the estimate and its error; whether a pair in the h^2
    regime settled it; kinks crossed, with the one-sided derivatives of the steadiest pair (NaN where none
    was steady) and their error; jumps of f; the pair chosen (-1: none); whether the one-sided derivatives settled
    (``_kinks``)."""

    estimate: np.ndarray
    error: np.ndarray
    settled: np.ndarray
    kink: np.ndarray
    right: np.ndarray
    left: np.ndarray
    jump: np.ndarray
    chosen: np.ndarray
    sides_error: np.ndarray
    sides_settled: np.ndarray

    def at(self, index) -> Refined:
        """The same fields at ``index`` (any numpy index into [m, k])."""
        return Refined(*(field[index] for field in self))


def classify(analytical: np.ndarray, refined: Refined, atol: float, rtol: float,
             allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The status of elements that are still mismatches after refinement, and which have both one-sided
    derivatives to report.

    A jump of f: DISCONTINUOUS.  A settled (and confirmed) estimate: MISMATCH, a wrong gradient.  Kinks that no finer
    step resolved: NONDIFFERENTIABLE when the analytical value is one of the one-sided derivatives or between them
    (``between_sides``); outside them MISMATCH where the one-sided derivatives settled (``_kinks``: f is one-sidedly
    linear at every step, so no value outside them is a subgradient), else UNRESOLVED_KINK (see ``FAILING``: kinks
    at several distances within every step).  Nothing settled: UNRESOLVED.  Every mode's refinement ends here.  ``allowed``: the tolerance beside
    a kink's sides where it is not the element rule's ``atol + rtol |analytical|`` (fast mode's probe band).
    """
    low, high = np.fmin(refined.left, refined.right), np.fmax(refined.left, refined.right)
    with np.errstate(invalid="ignore"):
        sides = np.isfinite(refined.left) & np.isfinite(refined.right)
        inside = sides & between_sides(analytical, low, high, refined.sides_error, atol, rtol, allowed)
    kink, settled, jump = refined.kink, refined.settled, refined.jump
    status = np.select([jump, settled, kink & inside, kink & sides & refined.sides_settled, kink],
                       [DISCONTINUOUS, MISMATCH, NONDIFFERENTIABLE, MISMATCH, UNRESOLVED_KINK], UNRESOLVED)
    return status.astype(np.int8), kink & ~jump & ~settled & sides


def judge_refined(analytical: np.ndarray, refined: Refined, atol: float, rtol: float) -> tuple:
    """The element rule on refined estimates [m, k], then ``classify`` where it still finds a mismatch: the
    status [m, k], the band [m, k] and {(row, k): (left, right)} of the elements with one-sided derivatives to
    report.  Element-wise refinement ends here in every mode (fast mode's probes then judge each probe)."""
    status, band = verdicts(analytical, refined.estimate, refined.error, atol, rtol)
    rows, ks = np.nonzero(status == MISMATCH)
    found = refined.at((rows, ks))
    status[rows, ks], reported = classify(analytical[rows, ks], found, atol, rtol)
    sides = {(int(row), int(k)): (float(left), float(right))
             for row, k, left, right in zip(rows[reported], ks[reported], found.left[reported], found.right[reported])}
    return status, band, sides


def refine(levels: list, y0: np.ndarray, ratio: float, sigma: np.ndarray | None = None) -> Refined:
    """Best estimate from central differences at shrinking steps, and a kink test.

    ``levels`` holds, for steps h, h/ratio, h/ratio^2, ..., tuples ``(derivative [m, k], noise [m, k], plus [m, k]
    or None, minus, span [k])``.  Each consecutive pair (D_k, D_k+1) is Richardson-extrapolated.  Its error estimate
    is |D_k - D_k+1| / (ratio^2 - 1) when the next two pairs confirm the h^2 regime (each gap |D_j - D_j+1| at most
    a quarter of the one before, and the second differences shrinking likewise, up to noise), and the whole
    |D_k - D_k+1| otherwise -- so steps that straddle a kink or a domain edge never look precise.  Per element, the
    settled pair with the smallest error (truncation + rounding) wins; an unsettled pair only where none settled.

    Kinks are read off the one-sided quotients of every level (``_kinks``): a step that crosses a kink (a ReLU input
    within h of 0) sees them differ by a gap that stays as h shrinks, while the central difference stays put and
    would look converged.  Where one was crossed, only finer steps that resolve it may give a settled estimate.

    Returns a ``Refined``: ``settled`` says the estimate came from a pair in the h^2 regime, confirmed by every finer
    step within its rounding; an element is a kink when its steps crossed kinks (``_kinks``), a jump when the gap
    grows as h shrinks (the quotients grow like 1/h: f itself is discontinuous at the point).
    """
    if sigma is not None:
        levels = _below_quantum(levels, y0, sigma)
    best = np.full(levels[0][0].shape, np.nan)
    error = np.full(best.shape, np.inf)
    settled_best = np.zeros(best.shape, bool)
    chosen = np.full(best.shape, -1)
    factor = ratio**2
    kink, right, left, sides_error, sides_settled, usable, resolved, resolved_error = _kinks(levels, y0)
    with np.errstate(invalid="ignore", over="ignore"):
        gaps = [np.abs(a[0] - b[0]) for a, b in zip(levels, levels[1:])]
        # Second differences |f(x+h) + f(x-h) - 2 f(x)| and their noise, per level with evaluations (the first
        # level's are not kept): ~h^2 f'' in the h^2 regime.
        unknown = np.full(best.shape, np.nan)
        curvature = [unknown if level[2] is None else np.abs(level[2] + level[3] - 2 * y0[:, None]) for level in levels]
        slack = [unknown if level[2] is None else 2 * level[1] * level[4][None, :] for level in levels]
        # shrinking[j]: the second differences shrink (by 4 or more) at every level from j to the finest.  A step near
        # a multiple of a period of f makes all coarser ones resonate too (h^2-like second differences included); the
        # resonance breaks at some finer level, and every pair above it is then out.
        shrinking: list = [np.ones(best.shape, bool) for _ in levels]
        for j in range(len(levels) - 2, 0, -1):
            step_ok = curvature[j + 1] <= curvature[j] / 4 + slack[j] + slack[j + 1]
            shrinking[j] = shrinking[j + 1] & (step_ok | ~np.isfinite(curvature[j + 1]))
        for k in range(len(levels) - 1):
            (coarse, coarse_noise, *_), (fine, fine_noise, *_) = levels[k], levels[k + 1]
            estimate, truncation = richardson(coarse, fine, ratio)
            rounding = fine_noise * (factor + 1) / (factor - 1) + coarse_noise / (factor - 1)
            # The h^2 regime is confirmed by the next two gaps shrinking in turn: one shrinking gap can be a
            # coincidence of a periodic f.  The second differences must shrink too (by 16 in the h^2 regime) at every
            # finer level: where a step spans periods of f they do not, whatever the gaps do.
            if k + 2 < len(gaps):
                settled = ((gaps[k + 1] <= gaps[k] / 4 + 2 * (fine_noise + levels[k + 2][1]))
                           & (gaps[k + 2] <= gaps[k + 1] / 4 + 2 * (levels[k + 2][1] + levels[k + 3][1]))
                           & shrinking[k + 1] & usable[k] & usable[k + 1] & usable[k + 2] & usable[k + 3]
                           # Past kinks f is piecewise smooth at these steps: the pair itself must agree
                           # within rounding (a drop of its gap may be the last kink left behind).
                           & (~kink | (gaps[k] <= 2 * (coarse_noise + fine_noise))))
            else:
                settled = np.zeros(best.shape, bool)
            # The Richardson error (a 15th of the gap) holds in the h^2 regime; the finer steps confirm it only where
            # their rounding is below the excess they rule out (a next gap of a quarter of this one or more).  Where
            # they are too noisy to tell (float32 over a ReLU network), the pair may still settle, with the whole gap
            # as its error.
            informative = (2 * (fine_noise + levels[k + 2][1]) <= gaps[k] / 4) if k + 2 < len(levels) else False
            # (A gap within the pair's own rounding is that rounding, which ``rounding`` covers: a linear float32 f
            # keeps the Richardson error, and a defect at its tolerance stays visible.)
            claimed = np.where(informative | (gaps[k] <= coarse_noise + fine_noise), truncation, gaps[k])
            # Every finer step must agree with a settled estimate within its error and their rounding: one that
            # departs shows a feature of f below the pair's steps (kinks within 1e-9 of the point, a bump a coarse
            # step steps over), which the pair cannot have converged past.
            for j in range(k + 2, len(levels)):
                finer, finer_noise = levels[j][0], levels[j][1]
                departs = np.abs(finer - estimate) > claimed + rounding + 2 * finer_noise
                settled &= ~(departs & np.isfinite(finer))
            total = np.where(settled, claimed, gaps[k]) + rounding
            # A settled pair beats any unsettled one: two steps that agree without the h^2 regime confirmed may
            # agree by coincidence (aliasing of a periodic f).
            better = np.isfinite(estimate) & np.isfinite(total) & (
                (settled & ~settled_best) | ((settled == settled_best) & (total < error)))
            best[better], error[better], settled_best[better] = estimate[better], total[better], settled[better]
            chosen[better] = k
    # Where a kink was crossed and no pair of resolving steps settled, a single resolving step is the estimate
    # (unsettled: it can pass an element, never fail one).
    single = kink & ~settled_best & np.isfinite(resolved)
    best[single], error[single], chosen[single] = resolved[single], resolved_error[single], -1
    # Where no pair is finite, fall back to the finest finite single estimate.
    for derivative, noise, *_ in reversed(levels):
        missing = ~np.isfinite(best) & np.isfinite(derivative)
        best[missing], error[missing] = derivative[missing], noise[missing]

    right_fine, left_fine, noise_fine = _one_sided(levels[-1], y0)
    right_coarse, left_coarse, _ = _one_sided(levels[-2], y0)
    with np.errstate(invalid="ignore"):
        gap_fine, gap_coarse = np.abs(right_fine - left_fine), np.abs(right_coarse - left_coarse)
        visible = (gap_fine > JUMP_VISIBLE * noise_fine) & np.isfinite(gap_fine)
        # A jump of f itself: one-sided quotients grow like 1/h (4x per level), never settle.
        jump = visible & (gap_fine > 2 * gap_coarse)
    kink &= ~jump
    return Refined(best, error, settled_best, kink, right, left, jump, chosen, sides_error, sides_settled & kink)


def between_sides(analytical, left, right, sides_error, atol: float, rtol: float, allowed=None):
    """Whether the analytical value is one of the one-sided derivatives or between them, within their own
    uncertainty and the tolerances (not the central estimate's error: at a kink that is the whole gap of unsettled
    steps); ``allowed`` replaces ``atol + rtol |analytical|`` where given."""
    low, high = np.minimum(left, right), np.maximum(left, right)
    allowed = (allowance(analytical, atol, rtol) if allowed is None else allowed) + sides_error
    with np.errstate(invalid="ignore"):
        return (low - allowed <= analytical) & (analytical <= high + allowed)


def _one_sided(level, y0: np.ndarray):
    """(right, left, noise) one-sided quotients [m, k] of a level with evaluations."""
    _, noise, plus, minus, span = level
    half = span[None, :] / 2
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return (plus - y0[:, None]) / half, (y0[:, None] - minus) / half, noise


def _kinks(levels: list, y0: np.ndarray):
    """(kink, right, left, their error, whether they settled, usable per level, resolved estimate, its error).

    A smooth f's one-sided quotients differ by h |f''|, a gap that shrinks 4x per level.  A level whose gap is far
    above its noise and did not shrink (at most halved since the coarser level) crosses kinks: *steadily* when its
    sides barely moved (one kink, or a cluster closer together than the step: the one-sided derivatives come from the
    steady pair where they are most certain, the least movement between its two levels plus rounding), or, by a wider
    margin over the noise, unsteadily (kinks at several distances within the step).  Where kinks were crossed, only
    *resolving* levels may give a settled estimate: finer than every crossing one, with sides that agree within their
    rounding although it would show the largest gap crossed (f is then differentiable at the point, the kinks lie
    between the steps).  Levels in between (a step about as long as the distance to a kink, or swamped by rounding)
    agree or disagree by chance, and are never trusted.  The most certain single resolving level gives an estimate
    of the derivative at the point.

    The one-sided derivatives *settled* where the steadiest pair's sides agree within their rounding (not merely
    within a quarter of the gap) and no finer level's sides depart from them beyond their rounding: f is then
    one-sidedly linear from the finest step up, a kink within rounding of the point.  Kinks at several distances
    below the steps move the sides by their offsets over the step (4x per level), and a finer step that resolves
    them departs, so neither settles.
    """
    shape = levels[0][0].shape
    evaluated = [j for j, level in enumerate(levels) if level[2] is not None]
    finest = np.full(shape, -1)
    right, left, gap = np.full(shape, np.nan), np.full(shape, np.nan), np.zeros(shape)
    uncertainty, agreed, rounding = np.full(shape, np.inf), np.zeros(shape, bool), np.zeros(shape)
    chosen = np.full(shape, -1)
    sides = {j: _one_sided(levels[j], y0) for j in evaluated}
    with np.errstate(invalid="ignore"):
        for a, b in zip(evaluated, evaluated[1:]):
            (right_a, left_a, noise_a), (right_b, left_b, noise_b) = sides[a], sides[b]
            gap_a, gap_b = np.abs(right_a - left_a), np.abs(right_b - left_b)
            slack = 0.25 * gap_b + 2 * (noise_a + noise_b)
            moved = np.maximum(np.abs(right_b - right_a), np.abs(left_b - left_a))
            unshrunk = np.isfinite(gap_b) & (gap_b > 0.5 * gap_a)
            steady = unshrunk & (gap_b > KINK_VISIBLE * noise_b) & (gap_b <= 2 * gap_a) & (moved <= slack)
            crossed = steady | (unshrunk & (gap_b > UNSTEADY_VISIBLE * noise_b))
            finest = np.where(crossed, b, finest)
            gap = np.where(crossed, np.maximum(gap, gap_b), gap)
            # A one-sided quotient (f(x+h) - f(x)) / h carries twice the central one's rounding.
            certain = moved + 2 * noise_b
            better = steady & (certain < uncertainty)
            right, left = np.where(better, right_b, right), np.where(better, left_b, left)
            uncertainty = np.where(better, certain, uncertainty)
            agreed = np.where(better, moved <= 2 * (noise_a + noise_b), agreed)
            rounding, chosen = np.where(better, noise_b, rounding), np.where(better, b, chosen)
        for c in evaluated:
            right_c, left_c, noise_c = sides[c]
            departs = np.maximum(np.abs(right_c - right), np.abs(left_c - left)) > 2 * (rounding + noise_c)
            agreed &= ~((c > chosen) & departs & np.isfinite(right_c) & np.isfinite(left_c))
        kink = finest >= 0
        usable = [~kink for _ in levels]
        # The most certain single resolving level: its central difference, with its rounding and the sides'
        # disagreement (curvature within 2h) as the error.
        resolved, resolved_error = np.full(shape, np.nan), np.full(shape, np.inf)
        for b in evaluated:
            right_b, left_b, noise_b = sides[b]
            disagree = np.abs(right_b - left_b)
            # Sides that agree within their rounding, at a step whose rounding would show the gaps crossed.
            resolving = kink & (b > finest) & (disagree <= KINK_VISIBLE * noise_b) & (KINK_VISIBLE * noise_b < gap)
            usable[b] = usable[b] | resolving
            level_error = disagree / 2 + 2 * noise_b
            better = resolving & (level_error < resolved_error)
            resolved, resolved_error = np.where(better, levels[b][0], resolved), np.where(better, level_error, resolved_error)
    return kink, right, left, uncertainty, agreed, usable, resolved, resolved_error


def grid(y0: np.ndarray, terms: np.ndarray, eps: float, sigma: np.ndarray | None) -> np.ndarray:
    """f's grid per element, for the test of steps below what f resolves (``_below_quantum``: sides come back exactly
    f(x) after a coarser step moved f by a few quanta; their zero quotients would otherwise look like a settled
    ladder, or a step that resolves a kink): f's measured noise ``sigma`` at the element's output, where there is
    one, floored by the output's own rounding -- one unit roundoff ``eps`` of the terms f_i sums, ``terms`` =
    sum_j |a_ij x_j| (a float32 convolution's output near 0 moves in steps of its partial sums' roundoff, far above
    |f_i|'s), and of |f_i| (``y0``; the measurement can read 0 on rows it sampled)."""
    floor = eps * np.maximum(np.abs(y0), terms) / np.sqrt(12.0)
    return floor if sigma is None else np.maximum(floor, sigma)


def _below_quantum(levels: list, y0: np.ndarray, sigma: np.ndarray) -> list:
    """The levels with quotients made NaN where the step fell below f's quantum.

    f(x + h) == f(x - h) == f(x) exactly, where a coarser step moved f by only a few of its measured quanta (rounding
    to a grid has standard deviation quantum / sqrt(12)), means f rounds to a grid coarser than h there (a float32 op
    inside a float64 f): the zero quotient says nothing, and a ladder of such zeros would look settled.  (A flat
    region of f, relu below 0, moves by far more than its quanta before it freezes.)
    """
    quantum = np.sqrt(12) * (sigma[:, None] if sigma.ndim == 1 else sigma)  # per output, or [m, k]
    few = np.zeros(levels[0][0].shape, bool)
    result = []
    for derivative, noise, plus, minus, span in levels:
        if plus is None:
            result.append((derivative, noise, plus, minus, span))
            continue
        frozen = (plus == y0[:, None]) & (minus == y0[:, None])
        if (frozen & few).any():
            derivative = np.where(frozen & few, np.nan, derivative)
        with np.errstate(invalid="ignore", over="ignore"):
            moved = np.maximum(np.abs(plus - y0[:, None]), np.abs(minus - y0[:, None]))
        few = np.where(frozen, few, (moved > 0) & (moved <= QUANTA * quantum))
        result.append((derivative, noise, plus, minus, span))
    return result


def diagnose(analytical: np.ndarray, numerical: np.ndarray, status: np.ndarray, size: int | None = None,
             jump: float | None = None, secant: bool = False) -> Hint | None:
    """A guess at the kind of defect, from the pattern of failing elements (its text: ``text.HINTS``).

    ``size``: how many elements the arrays stand for, when they are a sample of the pair's (every failing element
    and a few others: coloured mode's large pairs); default, their own size.  ``jump``: the distance from x to the
    nearest jump of f found within the steps (``refine.jumps_near``), None where none was looked for or found;
    ``secant``: every mismatch looked at matches f's secant over wide steps but not its fine slope
    (``_Block._secants``).
    """
    bad = status == MISMATCH
    if np.any(status == ANALYTICAL_NONFINITE):
        return Hint("analytical not finite")
    for code in (NUMERICAL_NONFINITE, DISCONTINUOUS, UNRESOLVED_KINK, FLAT, UNRESOLVED):
        if np.any(status == code) and not bad.any():
            if code == DISCONTINUOUS and jump is not None:
                return Hint("jumps near the point", distance=jump)
            return Hint(STATUS_NAMES[code])
    if not bad.any():
        return None
    if secant:
        return Hint("secant")
    a, n = analytical[bad], numerical[bad]
    total = int(bad.sum())
    if np.all(np.abs(a) <= 1e-12 * np.maximum(np.abs(n), 1e-300)) or np.all(a == 0):
        return Hint("zero")
    # Least-squares factor between the failing entries: a = c * n explains a sign flip (c = -1) or a lost constant
    # (c != 1) even when a few entries are noisy.
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = float(np.dot(a, n) / np.dot(n, n)) if np.dot(n, n) > 0 else np.nan
        residual = float(np.linalg.norm(a - factor * n) / np.linalg.norm(a)) if np.isfinite(factor) else np.inf
    # Any factor fits one element: a factor (or sign) is a finding only where FACTOR_ELEMENTS failing ones fit it.
    fitted = total >= FACTOR_ELEMENTS
    if fitted and residual < 0.02 and abs(factor + 1) < 0.02:
        return Hint("sign")
    if fitted and residual < 0.02 and abs(factor - 1) > 1e-3:
        return Hint("factor", factor=factor)
    if analytical.shape[0] == analytical.shape[1] and analytical.shape[0] > 1 and _transposed(analytical, numerical, bad):
        return Hint("transposed")
    size = status.size if size is None else size
    if total <= max(1, size // 100):
        return Hint("few", count=total, size=size)
    return None


def _transposed(analytical: np.ndarray, numerical: np.ndarray, bad: np.ndarray) -> bool:
    """``np.allclose(analytical, numerical.T, rtol=1e-4, atol=1e-8)``, tried first on the failing elements alone:
    where they disagree (nearly always) the whole test cannot hold, and is not run."""
    rows, cols = np.nonzero(bad)
    if not np.allclose(analytical[rows, cols], numerical[cols, rows], rtol=1e-4, atol=1e-8):
        return False
    return bool(np.allclose(analytical, numerical.T, rtol=1e-4, atol=1e-8))


def directions_agree(jvp: np.ndarray, directions: list, numerical: list, band: list) -> bool:
    """Whether JVPs ``J v`` [k, m] match the numerical ``N v`` within the element bands.

    Per probe and output row i: ``|JVP_i - (N v)_i| <= ||band_i * v||_2`` (independent element errors add up like
    2-norms, never a multiple of n).
    """
    k, m = jvp.shape
    predicted, allowed = np.zeros((k, m)), np.zeros((k, m))
    for d, n, b in zip(directions, numerical, band):
        for start in range(0, m, ROW_BLOCK):  # a block of rows at a time: [m, n] arrays stay in cache
            rows = slice(start, start + ROW_BLOCK)
            n_rows, b_rows = n[rows], b[rows]
            if not (np.all(np.isfinite(n_rows)) and np.all(np.isfinite(b_rows))):
                # columns left out of the directions may hold NaN
                n_rows, b_rows = np.where(np.isfinite(n_rows), n_rows, 0.0), np.where(np.isfinite(b_rows), b_rows, 0.0)
            predicted[:, rows] += d @ n_rows.T
            allowed[:, rows] += (d * d) @ (b_rows * b_rows).T
    allowed = np.sqrt(allowed)
    with np.errstate(invalid="ignore"):
        return bool(np.all(np.abs(jvp - predicted) <= allowed))
