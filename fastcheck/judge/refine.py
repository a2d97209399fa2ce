"""The refinement driver: one step ladder for every mode.

Every strategy refines what its first sweep failed the same way: the failing *directions* (full and coloured mode's
elements, each its column read at its row, ``block._Block.ladder``; fast mode's probes) at steps h / REFINE_RATIO**p, p = 0 ...
REFINE_LEVELS, judged by ``compare.refine``; the directions a strategy still finds open after that (an unsettled
mismatch, a step outside f's domain) again down to a deeper power; the deeper result replaces the first one there.
``descend`` is that driver.  A strategy supplies only how it evaluates a selection of its directions at given
powers (``Evaluate``: the levels, f at the point and f's noise) and what "open" means for it; it reads the
estimates off the ``Refined`` it gets back.  It may also supply a ``Line`` (each direction's first step,
the noise of a quotient over a span): then a settled mismatch stands only where ``confirmation`` finds it again at
independent steps (0.618 x the chosen pair's, and averaged below the pair where its rounding hid a kink).

A module of its own because ``compare`` is the rule on arrays that exist, pure and without callbacks; the driver
calls back into the strategies' evaluations, the one place where the modes meet the rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from fastcheck.engine.tables import (
    BELOW_DEVIATIONS,
    BELOW_HOLDS,
    BELOW_LOW,
    BELOW_NOISY,
    BELOW_POINTS,
    BOUND_DEVIATIONS,
    CONFIRM_AGREES,
    CONFIRM_CURVATURE,
    CONFIRM_ERRORS,
    CONFIRM_RATIO,
    CONFIRM_SHRINK,
    DEEP_LEVELS,
    EDGE_LEVELS,
    FINEST_HOLDS,
    FINEST_ROUNDING,
    FLAT_JUMP_GROWTH,
    JUMP_VISIBLE,
    REFINE_LEVELS,
    REFINE_RATIO,
    RESOLVE_UP,
    SECOND_STEP,
    TRIAGE_DRIFT,
    TRIAGE_LOCAL,
    TRIAGE_MOVED,
    TRIAGE_SIDES,
)
from fastcheck.judge import compare


class Ladder(NamedTuple):
    """The powers p of the steps h / REFINE_RATIO**p that each stage of refinement evaluates, coarsest first: the
    one ladder of every mode (``LADDER``)."""

    first: range  # every failing direction
    deeper: range  # the directions still open after the first ladder; its levels above these are kept
    edge: range  # ... where every step so far left f's domain (log at 3e-9: only steps below 3e-9 stay inside)
    larger: range  # a coarse pass sharpened, a twin's mismatch confirmed: above h, where rounding is smaller


LADDER = Ladder(range(0, REFINE_LEVELS + 1), range(REFINE_LEVELS + 1, DEEP_LEVELS + 1),
                range(REFINE_LEVELS + 1, EDGE_LEVELS + 1), range(-RESOLVE_UP, 1))


class Rungs(NamedTuple):
    """A strategy's evaluation of some directions: ``compare.refine``'s levels (one per power, coarsest first:
    (derivative [m, k], noise [m, k], plus [m, k] or None, minus, span [k])), f at the point as ``refine``
    subtracts it, and f's measured noise (or None) for its quantum test."""

    levels: list
    y0: np.ndarray
    sigma: np.ndarray | None


# (selection: indices of the directions [k'], powers, factors) -> their rungs [m, k'] at the steps h / REFINE_RATIO**p
# * factor (factors: one per power, or None for 1: the ladder's own steps).
Evaluate = Callable[..., Rungs]
# (the Refined of all directions) -> [k] whether each direction still needs deeper steps.
StillOpen = Callable[[compare.Refined], np.ndarray]
# (selection, the Refined of those directions) -> [k'] whether each one's settled estimates stand.
Confirm = Callable[[np.ndarray, compare.Refined], np.ndarray]
# (the first Refined, the open directions) -> the deeper ladder's powers.
Deeper = Callable[[compare.Refined, np.ndarray], Sequence[int]]


def descend(evaluate: Evaluate, count: int, powers: Sequence[int], still_open: StillOpen | None = None,
            deeper: Sequence[int] | Deeper = (), confirm: Confirm | None = None) -> compare.Refined:
    """Refine ``count`` directions on the ladder ``powers``, then the open ones on ``deeper``.

    Args:
        evaluate: the strategy's evaluation of a selection of directions at given powers.
        count: how many directions there are (the selections index them).
        powers: the first ladder's powers, coarsest first (h / REFINE_RATIO**p each).
        still_open: which directions go down the deeper ladder after the first; None: none do.
        deeper: the deeper ladder's powers (or a function of the first result and the open directions giving
            them).  Powers of the first ladder coarser than all of them are taken over from it, not evaluated again.
        confirm: a check of the settled estimates after each ladder (full mode's independent step): a direction
            it rejects keeps its estimates, unsettled.

    Returns:
        The ``Refined`` [m, count] of every direction: the deeper ladder's where a direction went down it, the
        first ladder's elsewhere.
    """
    everything = np.arange(count)
    rungs = evaluate(everything, powers)
    found = _settle(rungs, everything, confirm)
    if still_open is None:
        return found
    selection = np.flatnonzero(still_open(found))
    if not len(selection):
        return found
    steps = list(deeper(found, selection) if callable(deeper) else deeper)
    kept = [_restricted(level, selection) for power, level in zip(powers, rungs.levels) if power < min(steps)]
    fresh = evaluate(selection, steps)
    again = _settle(fresh._replace(levels=[*kept, *fresh.levels]), selection, confirm)
    return merged(found, selection, again)


def merged(found: compare.Refined, selection: np.ndarray, deeper: compare.Refined) -> compare.Refined:
    """``found`` with the directions ``selection`` (its last axis) replaced by ``deeper``'s, in place."""
    for target, value in zip(found, deeper):
        target[..., selection] = value
    return found


def _settle(rungs: Rungs, selection: np.ndarray, confirm: Confirm | None) -> compare.Refined:
    found = compare.refine(rungs.levels, rungs.y0, REFINE_RATIO, rungs.sigma)
    if confirm is None:
        return found
    kept = found.settled & confirm(selection, found)[None, :]
    rejected = found.settled & ~kept & (found.chosen >= 0)
    if not rejected.any():
        return found._replace(settled=kept)
    # A pair its confirmation rejects is not settled: its error is an unsettled pair's (``refine``), the pair's
    # whole gap on top of its rounding, not its Richardson truncation.
    quotients = np.stack([level[0] for level in rungs.levels])  # [levels, m, k]
    k = np.clip(found.chosen, 0, len(quotients) - 2)[None]
    with np.errstate(invalid="ignore"):
        gap = np.abs(np.take_along_axis(quotients, k, 0) - np.take_along_axis(quotients, k + 1, 0))[0]
    return found._replace(settled=kept, error=np.where(rejected & np.isfinite(gap), found.error + gap, found.error))


class Line(NamedTuple):
    """What ``confirmation`` needs of a strategy besides its evaluation: ``steps(selection)`` [k'], each direction's
    first step h, and ``noise(selection, spans [k'])`` [m, k'], the rounding bound of a central quotient over those
    spans (``Rungs``' levels carry it for the steps evaluated)."""

    steps: Callable[[np.ndarray], np.ndarray]
    noise: Callable[[np.ndarray, np.ndarray], np.ndarray]


def confirmation(evaluate: Evaluate, line: Line, analytical: np.ndarray,
                 mismatch: Callable[[np.ndarray, compare.Refined], np.ndarray], first: int = 0) -> Confirm:
    """The ``Confirm`` of ``descend`` for a strategy: per direction, whether its settled mismatches
    (``mismatch(selection, found)`` [m, k'], settled ones kept) hold at independent steps; ``analytical`` [m, count]
    is what the directions' estimates are judged against, ``first`` the power of the ladder's coarsest step
    (``LADDER.larger`` starts above h).

    A geometric ladder of steps can fool the h^2 test: when a step h_k of cos at 5e7 lies near a multiple of pi, so
    do all the coarser ones (4x, 16x, ...), and their quotients agree like converging ones.  A confident mismatch is
    therefore re-estimated at the chosen pair's steps times ``CONFIRM_RATIO`` (0.618, the golden ratio, which no
    power of 4 approaches): a real one reappears there, a coincidence does not.  Then ``_holds_below``."""

    def confirm(selection: np.ndarray, found: compare.Refined) -> np.ndarray:
        wrong = mismatch(selection, found) & found.settled
        result = np.ones(len(selection), bool)
        check = np.flatnonzero(np.any(wrong, axis=0))
        if not len(check):
            return result
        # The coarsest pair chosen in each direction decides its confirmation steps.
        level = np.array([found.chosen[wrong[:, c], c].min() for c in check]).clip(0) + first
        for power in np.unique(level):
            group = check[level == power]
            rungs = evaluate(selection[group], [power, power + 1], [CONFIRM_RATIO, CONFIRM_RATIO])
            (coarse, coarse_noise, coarse_plus, coarse_minus, coarse_spans), (fine, fine_noise, plus, minus, spans) = \
                rungs.levels
            other, other_error = compare.richardson(coarse, fine, REFINE_RATIO)
            other_error = other_error + fine_noise * 2  # the noise bound over the span, as a quotient's
            y0 = np.asarray(rungs.y0)[:, None]
            estimate, error = found.estimate[:, group], found.error[:, group]
            with np.errstate(invalid="ignore"):
                # f(x + h) + f(x - h) - 2 f(x) at each step, and that second difference's rounding
                coarse_curvature, curvature = (np.abs(p + m - 2 * y0) for p, m in ((coarse_plus, coarse_minus),
                                                                                  (plus, minus)))
                slack = 2 * coarse_noise * coarse_spans[None, :] + 2 * fine_noise * spans[None, :]
                agree = ((np.abs(other - estimate) <= CONFIRM_AGREES * np.abs(estimate) + CONFIRM_ERRORS * (
                    error + other_error)) & (curvature <= coarse_curvature / CONFIRM_SHRINK + slack))
            result[group] = np.all(agree | ~wrong[:, group], axis=0)
        return result & _holds_below(evaluate, line, selection, analytical[:, selection], found, level, check,
                                     wrong)

    return confirm


def _holds_below(evaluate: Evaluate, line: Line, selection: np.ndarray, a: np.ndarray, found: compare.Refined,
                 level: np.ndarray, check: np.ndarray, wrong: np.ndarray) -> np.ndarray:
    """Per direction: whether its mismatches hold at the step below the pair, averaged where needed.

    A kink between the pair's fine step and the next one (a ReLU input at 0.5 h/4) moves both of the pair's
    quotients alike, and only the next step shows the derivative at the point.  Where that step's rounding bound
    exceeds ``BELOW_NOISY`` of the mismatch (float32), the ladder could not tell, so ``BELOW_POINTS`` steps in
    [BELOW_LOW, 1] x that step are averaged: the mismatch holds unless their mean departs from the estimate by more
    than ``BELOW_HOLDS`` of it plus ``BELOW_DEVIATIONS`` of its standard deviations (see ``tables``), and only where
    the mean sides with the estimate."""
    result = np.ones(len(selection), bool)
    # The pair is (level, level + 1); the step below it, level + 2.
    below = line.steps(selection[check]) / REFINE_RATIO ** (level + 2)
    estimate = found.estimate
    with np.errstate(invalid="ignore"):
        miss = np.abs(a[:, check] - estimate[:, check])
        noisy = np.any(wrong[:, check] & (line.noise(selection[check], 2 * below) > BELOW_NOISY * miss), axis=0)
    points = list(np.linspace(BELOW_LOW, 1.0, BELOW_POINTS))
    for power in np.unique(level[noisy]):
        group = check[noisy & (level == power)]
        rungs = evaluate(selection[group], [power + 2] * BELOW_POINTS, points)
        mean = np.mean([derivative for derivative, *_ in rungs.levels], axis=0)
        deviation = np.mean([noise for _, noise, *_ in rungs.levels], axis=0) / (
            BOUND_DEVIATIONS * np.sqrt(BELOW_POINTS))
        with np.errstate(invalid="ignore"):
            departs = np.abs(mean - estimate[:, group])
            # ... nearer the estimate than the analytical value (the deviations are slack for the estimate, never a
            # reason to side against the gradient).
            holds = ((departs <= BELOW_HOLDS * np.abs(a[:, group] - estimate[:, group]) + BELOW_DEVIATIONS * deviation)
                     & (departs <= np.abs(mean - a[:, group])))
        result[group] = np.all(holds | ~wrong[:, group] | ~np.isfinite(mean), axis=0)
    return result


def settle(evaluate: Evaluate, line: Line, analytical: np.ndarray, atol: float,
           rtol: float) -> tuple[compare.Refined, np.ndarray, np.ndarray, dict]:
    """The element rule's refinement of failing directions, the one stage of full and coloured mode (fast mode's at
    its localised elements): ``analytical`` [m, count] judged along the first ladder, the directions with a mismatch
    not settled (a jump keeps it open) or a quotient that is not finite again down the deeper powers (the edge's
    where every step so far left f's domain), a settled mismatch standing only where ``confirmation`` finds it again;
    then ``compare.judge_refined``.  Returns the ``Refined`` and its status, band and one-sided values [m, count]."""

    def status(a: np.ndarray, found: compare.Refined) -> np.ndarray:
        return compare.verdicts(a, found.estimate, found.error, atol, rtol, bands=False)[0]

    def mismatch(selection: np.ndarray, found: compare.Refined) -> np.ndarray:
        return status(analytical[:, selection], found) == compare.MISMATCH

    def still_open(found: compare.Refined) -> np.ndarray:
        judged = status(analytical, found)
        return np.any(((judged == compare.MISMATCH) & ~(found.settled & ~found.jump))
                      | (judged == compare.NUMERICAL_NONFINITE), axis=0)

    def deeper(found: compare.Refined, selection: np.ndarray) -> range:
        return LADDER.edge if np.any(~np.isfinite(found.estimate[:, selection])) else LADDER.deeper

    found = descend(evaluate, analytical.shape[1], LADDER.first, still_open, deeper,
                    confirmation(evaluate, line, analytical, mismatch))
    return (found, *compare.judge_refined(analytical, found, atol, rtol))


def examined(evaluate: Evaluate, line: Line, analytical: np.ndarray, first: np.ndarray, first_noise: np.ndarray,
             failing: np.ndarray, atol: float, rtol: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """The stages of failing directions after the first sweep, in every element-wise mode's order: the second step at
    h/4 (``compare.second_step``: a direction passing there takes its estimate), the triage at h/4 of the rest
    (``triage``: a conclusive mismatch keeps its first-sweep estimate), the ladder (``settle``) for the directions it
    leaves doubtful.  ``analytical``, ``first``, ``first_noise``, ``failing`` [m, k]: the analytical values, the first
    sweep's estimates and noise, its failing elements.  Returns the estimate, status and band [m, k] and the
    one-sided values {(row, k): (left, right)} of the elements at kinks."""
    quarter = evaluate(np.arange(analytical.shape[1]), (SECOND_STEP,))
    (second, second_noise, *_), = quarter.levels
    passes, extrapolated, rounding = compare.second_step(analytical, first, first_noise, second, second_noise, atol,
                                                          rtol, REFINE_RATIO)
    estimate, error = np.array(first, np.float64), np.array(first_noise, np.float64)
    estimate[:, passes], error[:, passes] = extrapolated[:, passes], rounding[:, passes]
    rest = np.flatnonzero(~passes)
    doubtful = rest[triage(_within(evaluate, rest), quarter._replace(levels=[_restricted(quarter.levels[0], rest)]),
                           analytical[:, rest], first[:, rest], first_noise[:, rest], failing[:, rest], atol)]
    status, band = compare.verdicts(analytical, estimate, error, atol, rtol)
    if not len(doubtful):
        return estimate, status, band, {}
    within = Line(lambda selection: line.steps(doubtful[selection]),
                  lambda selection, spans: line.noise(doubtful[selection], spans))
    found, status[:, doubtful], band[:, doubtful], sides = settle(_within(evaluate, doubtful), within,
                                                                  analytical[:, doubtful], atol, rtol)
    estimate[:, doubtful] = found.estimate
    return estimate, status, band, {(row, int(doubtful[k])): value for (row, k), value in sides.items()}


def jumps_near(evaluate: Evaluate, count: int, rounding: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([k] whether f jumps within the ladder's widest step of each direction, [k] the distance to the nearest jump
    found, NaN where none): what must be ruled out before any step is evidence against a gradient.

    Dense jumps (a mean over many fixed draws, each switching branch at its own x: jumps 1e-6 apart) are f's shape,
    not noise: between them f is smooth with the analytical slope, and a step across hundreds of them measures the
    slope of their trend instead.  Seen in the second differences |f(x+d) + f(x-d) - 2 f(x)| at d = h 4**RESOLVE_UP
    ... h / 4**DEEP_LEVELS: where f is smooth they shrink 16x per level (f'' d^2) down to a floor, f's rounding; a
    kink d0 away shrinks them ~4x per level (linearly in d - d0); a jump between two steps keeps them: f jumps within
    d where its second difference there exceeds ``JUMP_VISIBLE`` times the floor and the step 4x larger moves it
    less than ``FLAT_JUMP_GROWTH`` times as far.  The floor is the larger of the least of the three finest steps that
    move x (a jump nearer than the finest of them shows in the others) and ``rounding`` [k] (one rounding of f, or of its terms, at f's precision: a bfloat16 staircase inside f is
    rounding, and stays noise)."""
    powers = list(LADDER.larger[:-1]) + list(LADDER.first) + list(LADDER.deeper)
    rungs = evaluate(np.arange(count), powers)
    y0 = np.asarray(rungs.y0)[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        curvature = np.array([np.max(np.abs(plus + minus - 2 * y0), axis=0) for _, _, plus, minus, _ in rungs.levels])
    steps = np.array([np.abs(spans) / 2 for *_, spans in rungs.levels])  # [levels, k]
    moves = (steps > 0) & np.isfinite(curvature)
    floor = np.array(rounding, np.float64)
    for k in range(count):
        finest = curvature[moves[:, k], k][-3:]
        if len(finest):
            floor[k] = max(floor[k], float(np.min(finest)))
    with np.errstate(invalid="ignore"):
        kept = (curvature[1:] > JUMP_VISIBLE * floor[None, :]) & (curvature[:-1] < FLAT_JUMP_GROWTH * curvature[1:])
        jumps = kept & moves[1:] & moves[:-1]
    distance = np.where(jumps, steps[1:], np.inf).min(axis=0)
    return jumps.any(axis=0), np.where(np.isfinite(distance), distance, np.nan)


def _within(evaluate: Evaluate, index: np.ndarray) -> Evaluate:
    """``evaluate`` over the directions ``index`` alone (selections index them)."""
    return lambda selection, powers, factors=None: evaluate(index[selection], powers, factors)


def _restricted(level: tuple, selection: np.ndarray) -> tuple:
    """A level's arrays at the directions ``selection`` (its last axis)."""
    return tuple(None if array is None else array[..., selection] for array in level)


# -- the triage at h/4 ---------------------------------------------------------------------------------------------


def triage(evaluate: Evaluate, quarter: Rungs, a: np.ndarray, first: np.ndarray, first_noise: np.ndarray,
           failing: np.ndarray, atol: float) -> np.ndarray:
    """[k] whether each failing direction is doubtful: not settled as a mismatch by the triage at h/4.

    ``quarter``: the directions at h/4 (power 1, one level; its ``y0`` what its sides are taken from); ``a``, ``first``,
    ``first_noise``, ``failing`` [m, k]: the analytical values, the first sweep's estimates and noise, its failing
    elements.  A direction is settled there when, at every failing element, the h/4 quotient is ``_conclusive``, it
    holds at h/4 x 0.618 (``_golden_holds``) and at the finest step whose rounding stays below an eighth of the
    mismatch (``_finest_holds``): a wrong gradient costs three more evaluations of a direction, not the ladder's five.
    The others go down the ladder.
    """
    (quotient, noise, plus, minus, spans), = quarter.levels
    with np.errstate(invalid="ignore", over="ignore"):
        mismatch = np.abs(a - first)
    curvature = _curvature(plus, minus, quarter.y0)
    conclusive = _conclusive(quotient, plus, minus, curvature, spans, mismatch, first, first_noise, atol)
    # A conclusive mismatch must also hold at an independent step (h/4 times the golden ratio): a step near a
    # multiple of a period of f makes quotients agree by coincidence.
    decided = np.flatnonzero(np.any(failing & conclusive, axis=0))
    if len(decided):
        conclusive[:, decided] &= _golden_holds(evaluate, decided, quotient[:, decided], curvature[:, decided])
    decided = np.flatnonzero(np.any(failing & conclusive, axis=0))
    if len(decided):
        conclusive[:, decided] &= _finest_holds(evaluate, decided, quotient[:, decided], noise[:, decided],
                                                mismatch[:, decided], conclusive[:, decided])
    return np.any(failing & ~conclusive, axis=0)


def _curvature(plus: np.ndarray, minus: np.ndarray, y0: np.ndarray) -> np.ndarray:
    """Second differences |f(x+h) + f(x-h) - 2 f(x)| [m, k]: ~h^2 f'' where f is smooth on the step."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.abs(plus + minus - 2 * np.asarray(y0)[:, None])


def _conclusive(quotient, plus, minus, curvature, spans, mismatch, first, first_noise, atol: float) -> np.ndarray:
    """[m, k] whether the h/4 quotient settles the first sweep's value: it barely moves (by at most ``TRIAGE_MOVED``
    of the mismatch and ``TRIAGE_DRIFT`` of itself, plus atol), its one-sided derivatives agree (within
    ``TRIAGE_SIDES`` of the mismatch: no kink crossed), and the step is small for f (its second-order term within
    ``TRIAGE_LOCAL`` of the first-order one, up to rounding: otherwise, as for cos at 5e7 where the relative step
    spans periods, two steps can agree by coincidence, and only smaller steps can tell)."""
    with np.errstate(invalid="ignore", over="ignore"):
        moved = np.abs(quotient - first)
        sides = curvature / (spans[None, :] / 2)
        local = curvature <= TRIAGE_LOCAL * np.abs(plus - minus) + 2 * first_noise * spans[None, :]
        return (np.isfinite(moved) & (moved <= TRIAGE_MOVED * mismatch)
                & (moved <= TRIAGE_DRIFT * np.abs(first) + atol) & (sides <= TRIAGE_SIDES * mismatch) & local)


def _golden_holds(evaluate: Evaluate, selection: np.ndarray, quotient: np.ndarray, curvature: np.ndarray) -> np.ndarray:
    """[m, k'] whether the h/4 quotients of ``selection`` hold at the independent step h/4 x ``CONFIRM_RATIO``: the
    quotient there agrees with the h/4 one within ``CONFIRM_AGREES`` of it (plus rounding), and its second difference
    with the h/4 one's scaled by h^2 within ``CONFIRM_CURVATURE`` (plus rounding): at a step near a period of f the
    second difference is far off (cos h = 1 there, and nowhere near at the other step)."""
    golden = evaluate(selection, [1], [CONFIRM_RATIO])
    (other, noise, plus, minus, spans), = golden.levels
    other_curvature = _curvature(plus, minus, golden.y0)
    with np.errstate(invalid="ignore"):
        slack = 2 * noise * spans[None, :]
        expected = CONFIRM_RATIO**2 * curvature
        return ((np.abs(other - quotient) <= CONFIRM_AGREES * np.abs(quotient) + slack / spans)
                & (np.abs(other_curvature - expected) <= CONFIRM_CURVATURE * expected + 2 * slack))


def _finest_holds(evaluate: Evaluate, selection: np.ndarray, quotient: np.ndarray, quarter_noise: np.ndarray,
                  mismatch: np.ndarray, conclusive: np.ndarray) -> np.ndarray:
    """[m, k'] whether the mismatches of ``selection`` hold at the finest step whose rounding stays below
    1/``FINEST_ROUNDING`` of them (``_finest_powers``): a kink within that step of the point (a ReLU input at 1e-8
    in a fresh network) makes the derivative there differ from the one every coarser step agrees on.  Where no step
    qualifies, h/4 itself included, the triage settles nothing: its quotients may agree by chance (float32's are
    multiples of one rounding over the span), and the ladder decides."""
    powers = _finest_powers(mismatch, conclusive, quarter_noise)
    finest = quotient.copy()
    for power in np.unique(powers[powers > 0]):
        group = np.flatnonzero(powers == power)
        finest[:, group] = evaluate(selection[group], [1 + int(power)]).levels[0][0]
    with np.errstate(invalid="ignore"):
        resolved = FINEST_ROUNDING * quarter_noise <= mismatch
        # within ``FINEST_HOLDS`` of the mismatch of the h/4 quotient (trivially where the finest step is h/4 itself)
        holds = np.abs(finest - quotient) <= FINEST_HOLDS * mismatch
    return (holds | (powers == 0)[None, :]) & resolved


def _finest_powers(mismatch, conclusive, quarter_noise) -> np.ndarray:
    """[k] how many powers of ``REFINE_RATIO`` below h/4 the finest step lies: its rounding (growing by the ratio
    per power) at most 1/``FINEST_ROUNDING`` of the smallest conclusive mismatch, 0 ... DEEP_LEVELS."""
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.nanmin(np.where(conclusive, mismatch, np.inf) / (FINEST_ROUNDING * quarter_noise), axis=0)
    return np.clip(np.floor(np.log(np.maximum(room, 1.0)) / np.log(REFINE_RATIO)), 0, DEEP_LEVELS)
