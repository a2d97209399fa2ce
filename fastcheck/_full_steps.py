"""Full mode's evaluator (_Jacobians: columns at given steps through the executor) and the steps that re-judge
a failing column before and after the ladder: the triage at h/4 (_triage: conclusive, golden, finest), the
coarsening of noise-limited columns (_coarsen: ``_wide``'s cubic fits at larger steps); a settled mismatch's confirmation
is ``_refine.confirmation``, over this evaluator's ladder and ``line``.
"""


from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fastcheck import _compare, _wide
from fastcheck._autodiff import AutodiffJacobian
from fastcheck._config import MACHINE_EPSILON
from fastcheck._executor import Executor, measured, numerical_columns, steps
from fastcheck._plan import Plan
from fastcheck._refine import Evaluate, Line, Rungs
from fastcheck._tables import (
    COARSE_TABLES,
    CONFIRM_AGREES,
    CONFIRM_CURVATURE,
    CONFIRM_RATIO,
    DEEP_LEVELS,
    FINEST_HOLDS,
    FINEST_ROUNDING,
    REFINE_RATIO,
    TRIAGE_DRIFT,
    TRIAGE_LOCAL,
    TRIAGE_MOVED,
    TRIAGE_SIDES,
)


class _Jacobians:
    """Both Jacobians of a plan, per checked input, with the numerical noise estimate."""

    def __init__(self, executor: Executor, plan: Plan, timings: dict):
        self.executor, self.plan, self.config, self.timings = executor, plan, executor.config, timings
        self.autodiff = AutodiffJacobian(executor, forward=self.config.autodiff == "forward")
        self.eps_eval = MACHINE_EPSILON[plan.eval_dtype]
        self.y0 = plan.eval_output  # f at the point, from planning: no extra call
        self._quarters: dict = {}  # position -> (columns, their quotients, sides and spans at h/4)

    def measure(self) -> None:
        """Measure f's noise and the precision it computes in (see ``_precision``)."""
        self.plan = measured(self.executor, self.plan)

    @property
    def noisy(self) -> bool:
        """Whether f's measured noise is beyond the rounding of its evaluation dtype."""
        return self.plan.noise is not None and self.plan.noise_epsilon > self.eps_eval

    def noise(self, spans: np.ndarray) -> np.ndarray:
        return self.noise_factors(spans).dense()

    def noise_factors(self, spans: np.ndarray) -> _compare.RankOne:
        """``noise`` as its factors: the first sweep's, made dense only where refinement needs it."""
        sigma = self.plan.noise.sigma if self.plan.noise is not None else None
        return _compare.rounding_noise_factors(self.y0, spans, self.plan.row_epsilon, sigma)

    def numerical(self, position: int, columns=None):
        """Central differences [m, k] for ``columns`` (default all), their noise [m, k] and spans [k]."""
        size = self.plan.inputs[position].size
        columns = np.arange(size) if columns is None else columns
        if not len(columns):
            return np.zeros((self.plan.m, 0)), np.zeros((self.plan.m, 0)), np.zeros(0)
        delta = steps(self.plan, self.config, position)[columns]
        jacobian, spans = self.executor.quotients(position, columns, delta)
        return jacobian, self.noise_factors(spans), spans

    def quarter(self, position: int, columns: np.ndarray):
        """Central differences of ``columns`` (sorted) at h / ``REFINE_RATIO``: (quotient, plus, minus [m, k],
        spans [k]).  The second step before f's noise is measured and the triage after it read the same
        evaluations: they are made once per check."""
        cached = self._quarters.get(position)
        if cached is not None and np.isin(columns, cached[0]).all():
            where = np.searchsorted(cached[0], columns)
            return tuple(value[..., where] for value in cached[1:])
        delta = steps(self.plan, self.config, position)[columns] / REFINE_RATIO
        values = numerical_columns(self.executor, position, columns, delta)
        self._quarters[position] = (columns, *values)
        return values

    def ladder(self, position: int, columns: np.ndarray) -> Evaluate:
        """The evaluation ``descend`` drives for ``columns``: a selection of them at steps h / 4**p, every power in
        one batch (negative powers: the steps larger than h that noise-limited columns need).  Power 0 is the first
        sweep's step h again, with its sides: its one-sided quotients show a kink crossed at h and h/4 both, where
        the finer steps are noise (float32 over a ReLU network's weights); without them the ladder could pass the
        settled test on noise alone."""
        sigma = self.plan.noise.sigma if self.plan.noise is not None else None

        def evaluate(selection: np.ndarray, powers, factors=None) -> Rungs:
            chosen = columns[selection]
            count = len(chosen)
            base = steps(self.plan, self.config, position)[chosen]
            divisors = [REFINE_RATIO**k for k in powers]
            idx = np.tile(chosen, len(divisors))
            delta = np.concatenate([base / d * factor for d, factor in zip(divisors, factors or [1.0] * len(divisors))])
            jacobian, plus, minus, spans = numerical_columns(self.executor, position, idx, delta)
            noise = self.noise(spans)
            levels = []
            for k in range(len(divisors)):
                part = slice(k * count, (k + 1) * count)
                levels.append((jacobian[:, part], noise[:, part], plus[:, part], minus[:, part], spans[part]))
            return Rungs(levels, self.y0, sigma)

        return evaluate

    def line(self, position: int, columns: np.ndarray) -> Line:
        """The ``Line`` of ``columns`` for ``confirmation``: their first steps, the noise over a span."""
        return Line(lambda selection: steps(self.plan, self.config, position)[columns[selection]],
                    lambda selection, spans: self.noise(spans))

    def analytical(self) -> list[np.ndarray]:
        if self.plan.n == 0:
            return [np.zeros((self.plan.m, 0)) for _ in self.plan.checked]
        return self.autodiff()


class _Quarter(NamedTuple):
    """The suspicious columns at step h/4 (``_triage``): the steps [k], quotients, sides, second differences
    [m, k], spans [k], and the first sweep's mismatch |a - n| [m, k]."""

    delta: np.ndarray
    quotient: np.ndarray
    plus: np.ndarray
    minus: np.ndarray
    curvature: np.ndarray
    spans: np.ndarray
    mismatch: np.ndarray


def _triage(jac: _Jacobians, position: int, suspicious, a, first, first_noise, failing, atol: float) -> np.ndarray:
    """[k] whether each suspicious column is doubtful: not settled by the triage at h/4.

    A column is settled there when, at every failing element, the h/4 quotient is ``_conclusive``, it holds at
    h/4 x 0.618 (``_golden_holds``) and at the finest step whose rounding stays below an eighth of the mismatch
    (``_finest_holds``); the others go down the ladder.
    """
    quotient, plus, minus, spans = jac.quarter(position, suspicious)
    delta = steps(jac.plan, jac.config, position)[suspicious] / REFINE_RATIO
    with np.errstate(invalid="ignore", over="ignore"):
        mismatch = np.abs(a - first)
    quarter = _Quarter(delta, quotient, plus, minus, _curvature(plus, minus, jac.y0), spans, mismatch)
    conclusive = _conclusive(quarter, first, first_noise, atol)
    # A conclusive mismatch must also hold at an independent step (h/4 times the golden ratio): a step near a
    # multiple of a period of f makes quotients agree by coincidence.
    decided = np.any(failing & conclusive, axis=0)
    if decided.any():
        conclusive[:, decided] &= _golden_holds(jac, position, suspicious[decided], _at(quarter, decided))
    decided = np.any(failing & conclusive, axis=0)
    if decided.any():
        conclusive[:, decided] &= _finest_holds(jac, position, suspicious[decided], _at(quarter, decided),
                                                conclusive[:, decided])
    return np.any(failing & ~conclusive, axis=0)


def _at(quarter: _Quarter, columns) -> _Quarter:
    """``quarter`` at some of its columns."""
    return _Quarter(*(field[columns] if field.ndim == 1 else field[:, columns] for field in quarter))


def _curvature(plus: np.ndarray, minus: np.ndarray, y0: np.ndarray) -> np.ndarray:
    """Second differences |f(x+h) + f(x-h) - 2 f(x)| [m, k]: ~h^2 f'' where f is smooth on the step."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.abs(plus + minus - 2 * y0[:, None])


def _conclusive(quarter: _Quarter, first, first_noise, atol: float) -> np.ndarray:
    """[m, k] whether the h/4 quotient settles the first sweep's value: it barely moves (by at most ``TRIAGE_MOVED``
    of the mismatch and ``TRIAGE_DRIFT`` of itself, plus atol), its one-sided derivatives agree (within
    ``TRIAGE_SIDES`` of the mismatch: no kink crossed), and the step is small for f (its second-order term within
    ``TRIAGE_LOCAL`` of the first-order one, up to rounding: otherwise, as for cos at 5e7 where the relative step
    spans periods, two steps can agree by coincidence, and only smaller steps can tell)."""
    with np.errstate(invalid="ignore", over="ignore"):
        moved = np.abs(quarter.quotient - first)
        sides = quarter.curvature / (quarter.spans[None, :] / 2)
        local = (quarter.curvature <= TRIAGE_LOCAL * np.abs(quarter.plus - quarter.minus)
                 + 2 * first_noise * quarter.spans[None, :])
        return (np.isfinite(moved) & (moved <= TRIAGE_MOVED * quarter.mismatch)
                & (moved <= TRIAGE_DRIFT * np.abs(first) + atol) & (sides <= TRIAGE_SIDES * quarter.mismatch) & local)


def _golden_holds(jac: _Jacobians, position: int, columns, quarter: _Quarter) -> np.ndarray:
    """[m, k] whether the h/4 quotients of ``columns`` hold at the independent step h/4 x ``CONFIRM_RATIO``: the
    quotient there agrees with the h/4 one within ``CONFIRM_AGREES`` of it (plus rounding), and its second difference
    with the h/4 one's scaled by h^2 within ``CONFIRM_CURVATURE`` (plus rounding): at a step near a period of f the
    second difference is far off (cos h = 1 there, and nowhere near at the other step)."""
    other, plus, minus, spans = numerical_columns(jac.executor, position, columns, quarter.delta * CONFIRM_RATIO)
    other_curvature = _curvature(plus, minus, jac.y0)
    with np.errstate(invalid="ignore"):
        slack = 2 * jac.noise(spans) * spans[None, :]
        expected = CONFIRM_RATIO**2 * quarter.curvature
        return ((np.abs(other - quarter.quotient) <= CONFIRM_AGREES * np.abs(quarter.quotient) + slack / spans)
                & (np.abs(other_curvature - expected) <= CONFIRM_CURVATURE * expected + 2 * slack))


def _finest_holds(jac: _Jacobians, position: int, columns, quarter: _Quarter, conclusive) -> np.ndarray:
    """[m, k] whether the mismatches of ``columns`` hold at the finest step whose rounding stays below
    1/``FINEST_ROUNDING`` of them (``_finest_powers``): a kink within that step of the point (a ReLU input at 1e-8
    in a fresh network) makes the derivative there differ from the one every coarser step agrees on.  Where no step
    qualifies, h/4 itself included, the triage settles nothing: its quotients may agree by chance (float32's are
    multiples of one rounding over the span), and the ladder decides."""
    quarter_noise = jac.noise(quarter.spans)
    powers = _finest_powers(quarter.mismatch, conclusive, quarter_noise)
    finest, *_ = numerical_columns(jac.executor, position, columns, quarter.delta / REFINE_RATIO**powers)
    with np.errstate(invalid="ignore"):
        resolved = FINEST_ROUNDING * quarter_noise <= quarter.mismatch
        # within ``FINEST_HOLDS`` of the mismatch of the h/4 quotient (trivially where the finest step is h/4 itself)
        holds = np.abs(finest - quarter.quotient) <= FINEST_HOLDS * quarter.mismatch
    return (holds | (powers == 0)[None, :]) & resolved


def _finest_powers(mismatch, conclusive, quarter_noise) -> np.ndarray:
    """[k] how many powers of ``REFINE_RATIO`` below h/4 the finest step lies: its rounding (growing by the ratio
    per power) at most 1/``FINEST_ROUNDING`` of the smallest conclusive mismatch, 0 ... DEEP_LEVELS."""
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.nanmin(np.where(conclusive, mismatch, np.inf) / (FINEST_ROUNDING * quarter_noise), axis=0)
    return np.clip(np.floor(np.log(np.maximum(room, 1.0)) / np.log(REFINE_RATIO)), 0, DEEP_LEVELS)


def _coarsen(jac: _Jacobians, position: int, a, numerical, noise, status, band, tolerances) -> np.ndarray:
    """Re-estimate, in place, the columns whose allowance is mostly f's measured noise, at wide steps
    (``_wide``); returns them."""
    atol, rtol = tolerances
    sigma = jac.plan.noise.sigma if jac.plan.noise is not None else np.zeros(jac.plan.m)
    # Columns that left f's domain are for the shrinking ladder, not this one.
    columns = np.flatnonzero(np.any(_wide.limited(noise, numerical, atol, rtol), axis=0)
                             & np.all(np.isfinite(numerical), axis=0) & np.all(np.isfinite(a), axis=0))
    if not len(columns):
        return columns
    # Columns are independent: in chunks whose [m, 9, k] tables (the evaluations' quotients, both sides, the fit's
    # values; twice) stay within memory_budget (all noisy columns of a large conv at once can exhaust memory).
    chunk = max(1, int(jac.config.budget // (COARSE_TABLES * 9 * 8 * max(jac.plan.m, 1))))
    taken = [_coarsen_columns(jac, position, columns[start:start + chunk], a, numerical, noise, status, band,
                              tolerances, sigma) for start in range(0, len(columns), chunk)]
    return np.concatenate(taken)


def _coarsen_columns(jac: _Jacobians, position: int, columns, a, numerical, noise, status, band, tolerances,
                     sigma) -> np.ndarray:
    """``_coarsen`` on the noise-limited ``columns``; returns those taken."""
    atol, rtol = tolerances
    base = steps(jac.plan, jac.config, position)[columns]
    width = _wide.widths(a[:, columns], sigma[:, None], base, base / jac.config.step(jac.eps_eval), atol, rtol)

    def sample(width: np.ndarray):
        count = len(columns)
        delta = np.concatenate([k * width for k in (1.0, 2.0, 3.0, 4.0)])
        _, plus, minus, spans = numerical_columns(jac.executor, position, np.tile(columns, 4), delta)
        # the step actually realised: half the span at t = 4, over 4
        return plus.reshape(-1, 4, count), minus.reshape(-1, 4, count), spans.reshape(4, count)[3] / 8

    taken, estimate, error = _wide.fitted(sample, width, jac.y0[:, None], sigma[:, None], jac.eps_eval)
    columns, estimate, error = columns[taken], estimate[:, taken], error[:, taken]
    numerical[:, columns], noise[:, columns] = estimate, error
    status[:, columns], band[:, columns] = _compare.verdicts(a[:, columns], estimate, error, atol, rtol)
    return columns
