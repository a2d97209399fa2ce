"""The full check: both Jacobians element by element, refined where they disagree.

One strategy of ``_check.run_check`` (the other is ``_fast``): the numerical
Jacobian by batched central differences through the executor, the analytical one
from reverse mode (or the user's gradients), the element rule of ``_compare``,
then -- only for failing elements -- a second step at h/4 (``_second_step``), and
where that does not pass them, f's noise and precision, larger steps for
noise-limited columns (``_coarsen``), smaller ones for the rest (``_refine``,
``_confirmed``), and the forward-mode side (``_forward_side``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fastcheck import _compare, _flat
from fastcheck._autodiff import AutodiffJacobian, forward_probe
from fastcheck._config import MACHINE_EPSILON
from fastcheck._diagnosis import kernel_failure
from fastcheck._events import ForwardNotChecked, ForwardProbe
from fastcheck._executor import NOISE_TABLES, Executor, measured, numerical_columns, steps, timed
from fastcheck._paths import EAGER
from fastcheck._plan import Plan, first_line
from fastcheck._refine import Evaluate, Rungs, descend
from fastcheck._results import Dense, GradientCheckError, Outcome, PairReport
from fastcheck._tables import (
    BELOW_DEVIATIONS,
    BELOW_HOLDS,
    BELOW_LOW,
    BELOW_NOISY,
    BELOW_POINTS,
    BOUND_DEVIATIONS,
    COARSE_MAX_STEP,
    COARSE_TABLES,
    CONFIRM_AGREES,
    CONFIRM_CURVATURE,
    CONFIRM_ERRORS,
    CONFIRM_RATIO,
    CONFIRM_SHRINK,
    DEEP_LEVELS,
    EDGE_LEVELS,
    FINEST_HOLDS,
    FINEST_ROUNDING,
    FORWARD_MIN_EVALUATIONS,
    FORWARD_PROBES,
    MEASURED_NOISE_FACTOR,
    NOISE_SIDE,
    REFINE_LEVELS,
    REFINE_RATIO,
    RESOLUTION_RTOLS,
    RESOLVE_COLUMNS,
    RESOLVE_UP,
    TRIAGE_DRIFT,
    TRIAGE_LOCAL,
    TRIAGE_MOVED,
    TRIAGE_SIDES,
)
from fastcheck._text import element_name


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

    def numerical(self, position: int, columns=None, divide: float = 1.0):
        """Central differences [m, k] for ``columns`` (default all), their noise [m, k] and spans [k]."""
        size = self.plan.inputs[position].size
        columns = np.arange(size) if columns is None else columns
        if not len(columns):
            return np.zeros((self.plan.m, 0)), np.zeros((self.plan.m, 0)), np.zeros(0)
        delta = steps(self.plan, self.config, position)[columns] / divide
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
        """The evaluation ``descend`` drives for ``columns``: a selection of them at steps
        h / 4**p, every power in one batch (negative powers: the steps larger than h that
        noise-limited columns need).  Power 0 is the first sweep's step h again, with its sides: its
        one-sided quotients are what shows a kink crossed at h and h/4 both, where the finer steps are
        noise (float32 over a ReLU network's weights); without them such a ladder passed the settled
        test on noise alone."""
        sigma = self.plan.noise.sigma if self.plan.noise is not None else None

        def evaluate(selection: np.ndarray, powers) -> Rungs:
            chosen = columns[selection]
            count = len(chosen)
            base = steps(self.plan, self.config, position)[chosen]
            divisors = [REFINE_RATIO**k for k in powers]
            idx = np.tile(chosen, len(divisors))
            delta = np.concatenate([base / d for d in divisors])
            jacobian, plus, minus, spans = numerical_columns(self.executor, position, idx, delta)
            noise = self.noise(spans)
            levels = []
            for k in range(len(divisors)):
                part = slice(k * count, (k + 1) * count)
                levels.append((jacobian[:, part], noise[:, part], plus[:, part], minus[:, part], spans[part]))
            return Rungs(levels, self.y0, sigma)

        return evaluate

    def analytical(self) -> list[np.ndarray]:
        if self.plan.n == 0:
            return [np.zeros((self.plan.m, 0)) for _ in self.plan.checked]
        return self.autodiff()


def _compute(jac: _Jacobians, supplied=None, refine: bool = True, twin: bool = True):
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
    with timed(jac.timings, "analytical"):
        analytical = supplied(plan) if supplied is not None else jac.analytical()

    def sweep():
        with timed(jac.timings, "numerical"):
            return [jac.numerical(spec.position) for spec in plan.checked]

    first = sweep()
    atol, rtol = jac.config.tolerances(jac.plan.precision)
    verdicts = [_compare.verdicts(a, numerical, noise, atol, rtol) for a, (numerical, noise, _) in zip(analytical, first)]
    if refine and jac.plan.noise is None and any(np.any(status != _compare.OK) for status, _ in verdicts):
        with timed(jac.timings, "refine"):
            _second_step(jac, analytical, first, verdicts, (atol, rtol))
    if any(np.any(status != _compare.OK) for status, _ in verdicts) and jac.plan.noise is None:
        with timed(jac.timings, "noise"):
            jac.measure()
        atol, rtol = jac.config.tolerances(jac.plan.precision)
        first = [(n, jac.noise_factors(spans), spans) for n, _, spans in first]
        verdicts = [_compare.verdicts(a, n, noise, atol, rtol, out=earlier)
                    for a, (n, noise, _), earlier in zip(analytical, first, verdicts)]
    results, sweeps = [], []
    for spec, a, (numerical, noise, spans), (status, band) in zip(plan.checked, analytical, first, verdicts):
        sweeps.append(spans)
        # before refinement overwrites the quotients
        mismatched = status == _compare.MISMATCH
        flat = (_flat.candidates(jac.plan, numerical, spans, mismatched) if mismatched.any()
                else (np.zeros(0, int), np.zeros(0, int)))
        one_sided: dict = {}
        if refine:
            with timed(jac.timings, "refine"):
                status, band, one_sided = _refine(jac, spec.position, a, numerical, noise, status, band, (atol, rtol))
        # ... and mismatches whose refined estimate is flat at the first step too: the steps that settled it
        # moved f by a few roundings at most (a latent weight 7e-4 from sign's jump: the first step crosses it,
        # every settling step is below it; a staircase's element whose sides differ by one rounding of f).
        mismatched = status == _compare.MISMATCH
        if mismatched.any():
            refined_rows, refined_cols = _flat.candidates(jac.plan, numerical, spans, mismatched)
            rows, cols = np.unique(np.concatenate([np.stack(flat), np.stack([refined_rows, refined_cols])], axis=1),
                                   axis=1)
            still = status[rows, cols] == _compare.MISMATCH
            rows, cols = rows[still], cols[still]
            status[rows, cols] = _flat.status(jac.executor, jac.plan, jac.config, spec.position, rows, cols,
                                              a[rows, cols])
        if refine:
            with timed(jac.timings, "refine"):
                _resolve(jac, spec.position, a, numerical, status, band, (atol, rtol))
        results.append((spec, a, numerical, status, band, one_sided, None))
    if refine and twin:
        results = _twin(jac, results, sweeps, (atol, rtol))
    return results, (atol, rtol)


def _second_step(jac: _Jacobians, analytical, first, verdicts, tolerances) -> None:
    """Before f's noise is measured: the first sweep's failing columns at h/4 (``_compare.second_step``).
    Where every one of them passes there, in place, they take its estimate and band, and the check needs
    no measurement (a pass needs none); otherwise nothing changes and the check goes on as if it had not
    run, its h/4 evaluations kept for the triage (``_Jacobians.quarter``).  It runs where it costs at most
    the measurement's own calls of f (``NOISE_TABLES`` tables of 2 ``NOISE_SIDE`` points), 2 per column:
    a float32-only special function whose first step was only truncation-limited at one element
    (igamma, zeta, atan2 in TensorFlow's tests) passes in one pair of evaluations instead of ~100."""
    atol, rtol = tolerances
    failing = [np.flatnonzero(np.any(status != _compare.OK, axis=0)) for status, _ in verdicts]
    if sum(len(columns) for columns in failing) > NOISE_TABLES * NOISE_SIDE:
        return
    passed = []
    for spec, a, (numerical, noise, _), columns, verdict in zip(jac.plan.checked, analytical, first, failing, verdicts):
        if not len(columns):
            continue
        quotient, _, _, spans = jac.quarter(spec.position, columns)
        passes, estimate, rounding = _compare.second_step(a[:, columns], numerical[:, columns], noise[:, columns],
                                                          quotient, jac.noise(spans), atol, rtol, REFINE_RATIO)
        if not passes.all():
            return
        passed.append((a, numerical, columns, estimate, rounding, verdict))
    for a, numerical, columns, estimate, rounding, (status, band) in passed:
        numerical[:, columns] = estimate
        status[:, columns], band[:, columns] = _compare.verdicts(a[:, columns], estimate, rounding, atol, rtol)


def _tolerance_bound_rows(plan: Plan, a, numerical, status, band, rtol: float) -> np.ndarray:
    """[m] the rows of outputs whose pair with this input passes at a resolution coarser than
    ``RESOLUTION_RTOLS`` rtols: the tolerances (atol against a small gradient) or the numerics keep
    it from seeing a 1% error.  A pair whose gradient and numerical derivative are 0 at every element
    (f does not move with this input: a ReLU's second derivative, a saturated activation) has no
    relative error for any twin to resolve: its twin could only pass it again."""
    rows = np.zeros(plan.m, bool)
    for output in plan.outputs:
        part = slice(output.offset, output.offset + output.size)
        s, b, x = status[part], band[part], a[part]
        if not s.size or _compare.IS_FAILING[s].any() or _compare.decisive_at_largest(x, b, s, rtol):
            continue
        if not x.any() and not numerical[part].any():
            continue
        if _compare.resolution(x, b, b, s == _compare.OK)[0] > RESOLUTION_RTOLS * rtol:
            rows[part] = True
    return rows


def _twin(jac: _Jacobians, results: list, sweeps: list, tolerances) -> list:
    """Pairs that pass at a resolution coarser than 1% of their gradient, judged again through the
    gradient's float64 twin where the numerical side computes in float64 and atol is the table's.

    The twin is the same gradient code run at the float64 point (a model's float64 copy, or f given
    float64 values): float64's rule judges it against the same numerical derivative (refined as any
    float64 check), and the float32 gradient's own rounding is then *measured*, |a - twin|, instead
    of being stood in for by float32's atol.  An element whose twin verdict is a pass or a mismatch
    gets the allowance ``float64's allowance + |a - twin|`` and is judged by it (a twin passing makes
    a pass: the triangle inequality); kinks, jumps and unresolved twin elements keep their verdict.
    The twin is not used where it differs from the float32 gradient by more than float32's
    tolerance (it is not the same computation) or is not finite.  A user's atol is the user's rule:
    then nothing is sharpened.
    """
    plan, config = jac.plan, jac.config
    if not config.twin_applies(plan) or config.autodiff == "forward":
        return results
    atol, rtol = tolerances
    targets = [_tolerance_bound_rows(plan, a, n, s, b, rtol) for _, a, n, s, b, _, _ in results]
    if not any(rows.any() for rows in targets):
        return results
    with timed(jac.timings, "twin"):
        try:
            twin = AutodiffJacobian(jac.executor, twin=True)()
        except Exception:  # no float64 gradient (an op without a float64 kernel): the verdicts stand
            return results
        if jac.plan.noise is None:  # float64's rule needs f's noise where it is evaluated
            jac.measure()
        atol64, rtol64 = config.twin_tolerances()
        sharpened: list[tuple] = []
        for (spec, a, numerical, status, band, one_sided, _), rows, t, spans in zip(results, targets, twin, sweeps):
            with np.errstate(invalid="ignore"):
                same = np.all(np.isfinite(t[rows])) and np.all(np.abs(a[rows] - t[rows]) <= _compare.allowance(t[rows], atol, rtol))
            if not rows.any() or not same:
                sharpened.append((spec, a, numerical, status, band, one_sided, None))
                continue
            # Every row is judged (the evaluations give them all), only the coarse pairs' rows are used.
            n_twin = numerical.copy()
            noise = jac.noise_factors(spans)
            t_status, t_band = _compare.verdicts(t, n_twin, noise, atol64, rtol64)
            t_status[~rows] = _compare.OK  # the other pairs' columns need no refinement for the twin
            t_status, t_band, _ = _refine(jac, spec.position, t, n_twin, noise, t_status, t_band, (atol64, rtol64))
            with np.errstate(invalid="ignore"):
                allowed = t_band + np.abs(a - t)
                usable = (rows[:, None] & np.isin(t_status, (_compare.OK, _compare.MISMATCH))
                          & (status == _compare.OK) & (allowed < band))
                verdict = np.where(np.abs(a - n_twin) <= allowed, _compare.OK, _compare.MISMATCH)
            _twin_holds_above(jac, spec.position, a, t, n_twin, allowed, usable, verdict, (atol64, rtol64))
            status[usable] = verdict[usable]
            band[usable] = allowed[usable]
            numerical[usable] = n_twin[usable]
            full_twin = np.where(usable, t, np.nan)
            sharpened.append((spec, a, numerical, status, band, one_sided, full_twin))
    return sharpened


def _twin_holds_above(jac: _Jacobians, position: int, a, t, n_twin, allowed, usable, verdict, tolerances) -> None:
    """A twin mismatch stands only where it holds at larger steps too; else, in place, it is not used.

    The twin's allowance is float64's, a few 1e-8 on a gradient of 1e-5 .. 1e-3: there the quotient's
    own error is f's measured noise over the step, and a float64 network's noise is not Gaussian
    everywhere (a correct nested MobileNetV2, seed 1: 7 of ~900 elements at 1.1-1.7x that allowance,
    a false FAIL).  The mismatched columns are re-estimated on the ladder h * 4**RESOLVE_UP ... h, where
    the noise is 4**RESOLVE_UP times smaller; an element stays a mismatch only where that settled
    estimate is outside its own float64 allowance plus |a - twin|, by the same rule (a 1% defect in the
    gradient code, which the twin shares, is far outside it).  Elsewhere the twin is not used: the
    element keeps its native verdict (a pass too coarse for 1%, undecidable).
    """
    atol64, rtol64 = tolerances
    suspect = usable & (verdict == _compare.MISMATCH)
    if not suspect.any():
        return
    columns = np.flatnonzero(suspect.any(axis=0))
    estimate, error, settled, *_ = descend(jac.ladder(position, columns), len(columns), range(-RESOLVE_UP, 1))
    with np.errstate(invalid="ignore"):
        holds = settled & (np.abs(a[:, columns] - estimate) > atol64 + rtol64 * np.abs(estimate) + error
                           + np.abs(a[:, columns] - t[:, columns]))
    usable[:, columns] &= ~suspect[:, columns] | holds


def _resolve(jac: _Jacobians, position: int, a, numerical, status, band, tolerances) -> None:
    """Sharpen, in place, a pair whose every element passes at a resolution ``_compare.coarse`` rejects.

    Its ``RESOLVE_COLUMNS`` most resolving columns (largest |a| / allowed) are re-estimated on the
    ladder h * 4**RESOLVE_UP ... h, where f's rounding is 4**RESOLVE_UP times smaller: an element whose
    settled estimate there passes with a smaller allowance keeps that estimate and allowance.  None is
    failed by it (a larger step's truncation is what the ladder judges, not a confirmed mismatch), so a
    pair the larger steps do not resolve stays undecidable (float32 sum(x**2) over 2000 elements:
    resolution 2.3%; the ladder's settled pair resolves it).
    """
    atol, rtol = tolerances
    if (not status.size or (status.any() and _compare.IS_FAILING[status].any())
            or _compare.decisive_at_largest(a, band, status, rtol)):
        return
    with np.errstate(invalid="ignore"):
        tolerated = _compare.allowance(numerical, atol, rtol)
    if not _compare.coarse(*_compare.resolution(a, band, tolerated, status == _compare.OK), rtol):
        return
    with np.errstate(invalid="ignore", divide="ignore"):
        score = np.nanmax(np.where(status == _compare.OK, np.abs(a) / band, 0.0), axis=0)
    columns = np.sort(np.argsort(-score, kind="stable")[:RESOLVE_COLUMNS])
    estimate, error, settled, *_ = descend(jac.ladder(position, columns), len(columns), range(-RESOLVE_UP, 1))
    with np.errstate(invalid="ignore"):
        allowed = _compare.allowance(estimate, atol, rtol, error)
        better = (settled & (np.abs(a[:, columns] - estimate) <= allowed) & (allowed < band[:, columns])
                  & (status[:, columns] == _compare.OK))
    band[:, columns] = np.where(better, allowed, band[:, columns])
    numerical[:, columns] = np.where(better, estimate, numerical[:, columns])


def _refine(jac: _Jacobians, position: int, a, numerical, noise, status, band, tolerances):
    """Re-examine suspicious columns in place; returns the new (status, band, one-sided values).

    Only columns with a mismatch or a non-finite difference are re-evaluated, so
    the first pass stays one batched sweep:

    1. triage at h/4 (``_triage``): where the estimate barely moves and the
       one-sided derivatives agree, the numbers are conclusive and the mismatch
       stands if it also holds at h/4 x 0.618 (``_golden_holds``) and at the finest
       step whose rounding stays below an eighth of the mismatch (``_finest_holds``:
       a kink within the step makes the derivative at the point another) -- a wrong
       gradient costs three extra evaluation pairs per column, not five;
    2. the rest go down the ladder (``_ladder``): h ... h/4**5 (``_compare.refine``),
       where a step that crossed a kink, a domain edge or strong curvature gets a
       better estimate and an error bound instead of a false alarm; still unsettled
       or unconfirmed ones (features far below the step) down to h/4**12; if even
       that does not settle, the element is UNRESOLVED (undecidable), not a wrong
       gradient;
    3. an element whose steps crossed a kink (``_compare._kinks``) and that no
       resolving steps settled is NONDIFFERENTIABLE when the analytical value lies
       between the one-sided derivatives, else UNRESOLVED_KINK (undecidable): only
       a settled, confirmed estimate makes a mismatch (``_compare.classify``).
    """
    atol, rtol = tolerances
    if isinstance(noise, _compare.RankOne):
        if not jac.noisy and not np.any(status != _compare.OK):
            return status, band, {}  # a passing sweep: nothing to refine, no [m, n] noise needed
        if jac.noisy:  # _coarsen reads every column's allowance
            noise = noise.dense()
    coarsened = _coarsen(jac, position, a, numerical, noise, status, band, tolerances) if jac.noisy else np.zeros(0, int)
    suspicious = np.flatnonzero(np.any((status == _compare.MISMATCH) | (status == _compare.NUMERICAL_NONFINITE), axis=0))
    suspicious = np.setdiff1d(suspicious, coarsened)
    if not len(suspicious):
        return status, band, {}
    # Only the suspicious columns' noise is needed (a RankOne's, made dense there alone), and only
    # their verdicts change below: the rule is element-wise.
    doubtful = _triage(jac, position, suspicious, a[:, suspicious], numerical[:, suspicious], noise[:, suspicious],
                       status[:, suspicious] != _compare.OK, atol)
    suspicious = suspicious[doubtful]
    if not len(suspicious):
        return status, band, {}
    found = _ladder(jac, position, suspicious, a[:, suspicious], tolerances)
    numerical[:, suspicious] = found.estimate
    status[:, suspicious], band[:, suspicious] = _compare.verdicts(a[:, suspicious], found.estimate, found.error,
                                                                   atol, rtol)
    rows, ks = np.nonzero(status[:, suspicious] == _compare.MISMATCH)
    columns = suspicious[ks]
    found = found.at((rows, ks))
    status[rows, columns], reported = _compare.classify(a[rows, columns], found, atol, rtol)
    one_sided = {(int(row), int(column)): (float(left), float(right))
                 for row, column, left, right in zip(rows[reported], columns[reported], found.left[reported],
                                                     found.right[reported])}
    return status, band, one_sided


def _ladder(jac: _Jacobians, position: int, columns: np.ndarray, a, tolerances) -> _compare.Refined:
    """The suspicious ``columns`` down the shared ladder (``descend``): h ... h/4**REFINE_LEVELS, then,
    for a column with a mismatch not settled and confirmed (``_confirmed``) or a step outside f's domain,
    h ... h/4**DEEP_LEVELS -- h/4**EDGE_LEVELS where every step so far left f's domain (log at 3e-9: only
    steps below 3e-9 stay inside); a mismatch still unconfirmed after the deep steps is unsettled."""
    atol, rtol = tolerances

    def mismatch(found: _compare.Refined, selection) -> np.ndarray:
        return _compare.verdicts(a[:, selection], found.estimate, found.error, atol, rtol, bands=False)[0] \
            == _compare.MISMATCH

    def confirm(selection: np.ndarray, found: _compare.Refined) -> np.ndarray:
        return _confirmed(jac, position, columns[selection], a[:, selection], found.estimate, found.error,
                          found.chosen, mismatch(found, selection) & found.settled)

    def still_open(found: _compare.Refined) -> np.ndarray:
        status = _compare.verdicts(a, found.estimate, found.error, atol, rtol, bands=False)[0]
        return np.any(((status == _compare.MISMATCH) & ~(found.settled & ~found.jump))
                      | (status == _compare.NUMERICAL_NONFINITE), axis=0)

    def deeper(found: _compare.Refined, selection: np.ndarray) -> range:
        outside = np.any(~np.isfinite(found.estimate[:, selection]))
        return range(0, (EDGE_LEVELS if outside else DEEP_LEVELS) + 1)

    return descend(jac.ladder(position, columns), len(columns), range(0, REFINE_LEVELS + 1), still_open,
                           deeper, confirm)


class _Quarter(NamedTuple):
    """The suspicious columns at step h/4 (``_triage``): the steps [k], quotients, sides, second
    differences [m, k], spans [k], and the first sweep's mismatch |a - n| [m, k]."""

    delta: np.ndarray
    quotient: np.ndarray
    plus: np.ndarray
    minus: np.ndarray
    curvature: np.ndarray
    spans: np.ndarray
    mismatch: np.ndarray


def _triage(jac: _Jacobians, position: int, suspicious, a, first, first_noise, failing, atol: float) -> np.ndarray:
    """[k] whether each suspicious column is doubtful: not settled by the triage at h/4.

    A column is settled there when, at every failing element, the h/4 quotient is ``_conclusive``,
    it holds at h/4 x 0.618 (``_golden_holds``) and at the finest step whose rounding stays below an
    eighth of the mismatch (``_finest_holds``); the others go down the ladder.
    """
    quotient, plus, minus, spans = jac.quarter(position, suspicious)
    delta = steps(jac.plan, jac.config, position)[suspicious] / REFINE_RATIO
    with np.errstate(invalid="ignore", over="ignore"):
        mismatch = np.abs(a - first)
    quarter = _Quarter(delta, quotient, plus, minus, _curvature(plus, minus, jac.y0), spans, mismatch)
    conclusive = _conclusive(quarter, first, first_noise, atol)
    # A conclusive mismatch must also hold at an independent step (h/4 times the golden
    # ratio): a step near a multiple of a period of f makes quotients agree by coincidence.
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
    """[m, k] whether the h/4 quotient settles the first sweep's value: it barely moves (by at most
    ``TRIAGE_MOVED`` of the mismatch and ``TRIAGE_DRIFT`` of itself, plus atol), its one-sided
    derivatives agree (within ``TRIAGE_SIDES`` of the mismatch: no kink crossed), and the step is small
    for f (its second-order term within ``TRIAGE_LOCAL`` of the first-order one, up to rounding:
    otherwise, as for cos at 5e7 where the relative step spans periods, two steps can agree by
    coincidence, and only smaller steps can tell)."""
    with np.errstate(invalid="ignore", over="ignore"):
        moved = np.abs(quarter.quotient - first)
        sides = quarter.curvature / (quarter.spans[None, :] / 2)
        local = (quarter.curvature <= TRIAGE_LOCAL * np.abs(quarter.plus - quarter.minus)
                 + 2 * first_noise * quarter.spans[None, :])
        return (np.isfinite(moved) & (moved <= TRIAGE_MOVED * quarter.mismatch)
                & (moved <= TRIAGE_DRIFT * np.abs(first) + atol) & (sides <= TRIAGE_SIDES * quarter.mismatch) & local)


def _golden_holds(jac: _Jacobians, position: int, columns, quarter: _Quarter) -> np.ndarray:
    """[m, k] whether the h/4 quotients of ``columns`` hold at the independent step h/4 x ``CONFIRM_RATIO``."""
    other, plus, minus, spans = numerical_columns(jac.executor, position, columns, quarter.delta * CONFIRM_RATIO)
    with np.errstate(invalid="ignore"):
        slack = 2 * jac.noise(spans) * spans[None, :]
    return _agrees_at_golden(quarter, other, _curvature(plus, minus, jac.y0), spans, slack)


def _agrees_at_golden(quarter: _Quarter, other, other_curvature, other_spans, slack) -> np.ndarray:
    """[m, k] whether the quotient at the golden step agrees with the h/4 one within ``CONFIRM_AGREES`` of it
    (plus rounding), and its second difference with the h/4 one's scaled by h^2 within ``CONFIRM_CURVATURE``
    (plus rounding ``slack``): at a step near a period of f the second difference is far off (cos h = 1
    there, and nowhere near at the other step)."""
    with np.errstate(invalid="ignore"):
        expected = CONFIRM_RATIO**2 * quarter.curvature
        return ((np.abs(other - quarter.quotient) <= CONFIRM_AGREES * np.abs(quarter.quotient) + slack / other_spans)
                & (np.abs(other_curvature - expected) <= CONFIRM_CURVATURE * expected + 2 * slack))


def _finest_holds(jac: _Jacobians, position: int, columns, quarter: _Quarter, conclusive) -> np.ndarray:
    """[m, k] whether the mismatches of ``columns`` hold at the finest step whose rounding stays below
    1/``FINEST_ROUNDING`` of them (``_finest_powers``): a kink within that step of the point (a ReLU input
    at 1e-8 in a fresh network) makes the derivative there differ from the one every coarser step agrees on.
    Where no step qualifies, h/4 itself included (its rounding above 1/``FINEST_ROUNDING`` of the mismatch),
    the triage settles nothing: its quotients agree by chance (float32's are multiples of one rounding over
    the span: a correct ReLU MLP's h and h/4 quotients came out bit-identical, 9.2e-5 from the gradient with
    2.8e-4 of rounding), and the ladder decides."""
    quarter_noise = jac.noise(quarter.spans)
    powers = _finest_powers(quarter.mismatch, conclusive, quarter_noise)
    finest, *_ = numerical_columns(jac.executor, position, columns, quarter.delta / REFINE_RATIO**powers)
    with np.errstate(invalid="ignore"):
        resolved = FINEST_ROUNDING * quarter_noise <= quarter.mismatch
    return _agrees_finest(finest, quarter, powers) & resolved


def _finest_powers(mismatch, conclusive, quarter_noise) -> np.ndarray:
    """[k] how many powers of ``REFINE_RATIO`` below h/4 the finest step lies: its rounding (growing by the
    ratio per power) at most 1/``FINEST_ROUNDING`` of the smallest conclusive mismatch, 0 ... DEEP_LEVELS."""
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.nanmin(np.where(conclusive, mismatch, np.inf) / (FINEST_ROUNDING * quarter_noise), axis=0)
    return np.clip(np.floor(np.log(np.maximum(room, 1.0)) / np.log(REFINE_RATIO)), 0, DEEP_LEVELS)


def _agrees_finest(finest, quarter: _Quarter, powers) -> np.ndarray:
    """[m, k] whether the finest step's quotient lies within ``FINEST_HOLDS`` of the mismatch of the h/4 one
    (trivially where the finest step is h/4 itself)."""
    with np.errstate(invalid="ignore"):
        holds = np.abs(finest - quarter.quotient) <= FINEST_HOLDS * quarter.mismatch
    return holds | (powers == 0)[None, :]


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
        limited = noise > _compare.allowance(numerical, atol, rtol)
    # Columns that left f's domain are for the shrinking ladder, not this one.
    columns = np.flatnonzero(np.any(limited, axis=0) & np.all(np.isfinite(numerical), axis=0)
                             & np.all(np.isfinite(a), axis=0))
    if not len(columns):
        return columns
    # Column by column independent: in chunks whose [m, 9, k] tables (the evaluations' quotients,
    # both sides, the fit's values; twice) stay within memory_budget (a bfloat16 conv 32x32x8: 8192
    # noisy columns held ~30 GB at once, and the OS killed the check).
    chunk = max(1, int(jac.config.budget // (COARSE_TABLES * 9 * 8 * max(jac.plan.m, 1))))
    taken = [_coarsen_columns(jac, position, columns[start:start + chunk], a, numerical, noise, status, band,
                              tolerances, sigma) for start in range(0, len(columns), chunk)]
    return np.concatenate(taken)


def _coarsen_columns(jac: _Jacobians, position: int, columns, a, numerical, noise, status, band, tolerances,
                     sigma) -> np.ndarray:
    """``_coarsen`` on the noise-limited ``columns``; returns those taken."""
    atol, rtol = tolerances
    base = steps(jac.plan, jac.config, position)[columns]
    scale = base / jac.config.step(jac.eps_eval)  # max(1, |x_j|)
    spread = MEASURED_NOISE_FACTOR * COARSE_SLOPE_NOISE
    with np.errstate(divide="ignore", invalid="ignore"):
        needed = np.nanmax(3 * spread * sigma[:, None] / _compare.allowance(a[:, columns], atol, rtol), axis=0)
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
    _, plus, minus, spans = numerical_columns(jac.executor, position, idx, delta)
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
    error = MEASURED_NOISE_FACTOR * COARSE_SLOPE_NOISE * sigma[:, None] / width[None, :]
    return estimate, error, residual


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
    derivative, plus, minus, spans = numerical_columns(jac.executor, position, idx,
                                                       np.concatenate([coarse, coarse / REFINE_RATIO]))
    half = len(check)
    other, other_error = _compare.richardson(derivative[:, :half], derivative[:, half:], REFINE_RATIO)
    other_error = other_error + jac.noise(spans[half:]) * 2  # the noise bound over the span, as a quotient's
    with np.errstate(invalid="ignore"):
        curvature = np.abs(plus + minus - 2 * jac.y0[:, None])  # f(x + h) + f(x - h) - 2 f(x)
        slack = 2 * jac.noise(spans) * spans[None, :]  # that second difference's rounding
        agree = ((np.abs(other - estimate[:, check]) <= CONFIRM_AGREES * np.abs(estimate[:, check]) + CONFIRM_ERRORS * (
            error[:, check] + other_error))
            & (curvature[:, half:] <= curvature[:, :half] / CONFIRM_SHRINK + slack[:, :half] + slack[:, half:]))
    result[check] = np.all(agree | ~mismatch[:, check], axis=0)
    return result & _holds_below(jac, position, columns, a, estimate, level, check, mismatch)


def _holds_below(jac: _Jacobians, position: int, columns, a, estimate, level, check, mismatch) -> np.ndarray:
    """Per column: whether its mismatches hold at the step below the pair, averaged where needed.

    A kink between the pair's fine step and the next one (a ReLU input at 0.5 h/4) moves both of
    the pair's quotients alike, and only the next step shows the derivative at the point.  Where
    that step's rounding bound exceeds a quarter of the mismatch (float32), the ladder could not
    tell, so ``BELOW_POINTS`` steps in [BELOW_LOW, 1] x that step are averaged: the mismatch holds unless
    their mean departs from the estimate by more than ``BELOW_HOLDS`` of it plus ``BELOW_DEVIATIONS``
    of its standard deviations (see ``_tables``)."""
    result = np.ones(len(columns), bool)
    # The pair is (level, level + 1); the step below it, level + 2.
    below = steps(jac.plan, jac.config, position)[columns[check]] / REFINE_RATIO ** (level + 2)
    with np.errstate(invalid="ignore"):
        miss = np.abs(a[:, check] - estimate[:, check])
        noisy = np.any(mismatch[:, check] & (jac.noise(2 * below) > BELOW_NOISY * miss), axis=0)
    if not noisy.any():
        return result
    chosen = check[noisy]
    ladder = np.outer(np.linspace(BELOW_LOW, 1.0, BELOW_POINTS), below[noisy]).ravel()
    derivative, _, _, spans = numerical_columns(jac.executor, position, np.tile(columns[chosen], BELOW_POINTS), ladder)
    count = len(chosen)
    mean = derivative.reshape(len(derivative), BELOW_POINTS, count).mean(axis=1)
    deviation = jac.noise(spans).reshape(len(derivative), BELOW_POINTS, count).mean(axis=1) / (
        BOUND_DEVIATIONS * np.sqrt(BELOW_POINTS))
    with np.errstate(invalid="ignore"):
        departs = np.abs(mean - estimate[:, chosen])
        # ... and only where the mean shows the mismatch, not the gradient: nearer the estimate than the analytical
        # value (the deviations are slack for the estimate, never a reason to side against the gradient).
        holds = ((departs <= BELOW_HOLDS * miss[:, noisy] + BELOW_DEVIATIONS * deviation)
                 & (departs <= np.abs(mean - a[:, chosen])))
    result[chosen] = np.all(holds | ~mismatch[:, chosen] | ~np.isfinite(mean), axis=0)
    return result


def _split_rows(plan: Plan, block: np.ndarray) -> list[np.ndarray]:
    return [block[o.offset : o.offset + o.size] for o in plan.outputs]


def _view_shape(spec) -> tuple:
    return tuple(spec.real_view.shape)


def _output_view_shape(output) -> tuple:
    return tuple(output.shape) + ((2,) if output.dtype.is_complex else ())


def check_full(executor: Executor, plan: Plan, timings: dict, supplied=None, output_name=None,
               twin: bool = True) -> Outcome:
    """Full Jacobians, compared and cut into one PairReport per (output, input)."""
    jac = _Jacobians(executor, plan, timings)
    try:
        results, (atol, rtol) = _compute(jac, supplied, twin=twin)
    except (TypeError, ValueError, GradientCheckError):
        raise
    except Exception as error:  # f failed inside a batched kernel: say so, keep the cause
        raise kernel_failure(error) from error
    plan = jac.plan  # with f's measured noise and precision, when they were needed
    side = "forward" if jac.config.autodiff == "forward" else "reverse"
    pairs = _pairs(plan, results, atol, rtol, output_name, side)
    notes: list = []  # events (``fastcheck._events``)
    warnings: list[str] = []
    if supplied is None and jac.config.autodiff == "auto" and plan.n and executor.path == EAGER:
        notes.append(ForwardNotChecked("eager"))
    elif supplied is None and jac.config.autodiff == "auto" and plan.n and 2 * plan.n < FORWARD_MIN_EVALUATIONS:
        notes.append(ForwardNotChecked("few evaluations", FORWARD_MIN_EVALUATIONS))
    elif supplied is None and jac.config.autodiff == "auto" and plan.n and executor.route.has_loops:
        notes.append(ForwardNotChecked("loops"))
    elif supplied is None and jac.config.autodiff in ("auto", "both") and plan.n:
        with timed(jac.timings, "forward"):
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
                        f"{element_name(pair.output_name, e.output_index)} / d {element_name(pair.input_name, e.input_index)}: "
                        f"JVP={e.analytical:.8g} numerical={e.numerical:.8g}. Reverse mode, which training uses, "
                        "agrees; forward mode differentiates f's forward ops (it ignores tf.custom_gradient) or uses "
                        "a wrong forward-mode rule of an op. Pass autodiff='both' to make it part of the verdict."
                    )
    kind = "supplied" if supplied is not None else jac.autodiff.mode
    return Outcome(pairs, plan, atol, rtol, kind, notes, warnings)


def _pairs(plan: Plan, results, atol, rtol, output_name, side: str) -> list[PairReport]:
    pairs = []
    for spec, a, numerical, status, band, one_sided, twin in results:
        twins = _split_rows(plan, twin) if twin is not None and side == "reverse" else [None] * len(plan.outputs)
        for output, a_rows, n_rows, s_rows, b_rows, t_rows in zip(
            plan.outputs, *(_split_rows(plan, x) for x in (a, numerical, status, band)), twins
        ):
            used = t_rows is not None and bool(np.any(np.isfinite(t_rows)))
            pair = PairReport(output_name or output.name, spec.name, _output_view_shape(output), _view_shape(spec),
                              Dense(n_rows, a_rows, s_rows, b_rows), atol, rtol, side=side, float64_gradient=used)
            pair.one_sided = {(r - output.offset, c): v for (r, c), v in one_sided.items()
                              if output.offset <= r < output.offset + output.size}
            pair.hint = pair.diagnose() if (s_rows != _compare.OK).any() else None  # a hint explains what is not OK
            pairs.append(pair)
    return pairs


# autodiff="auto" probes forward mode only on traced paths: TensorFlow's ForwardAccumulator
# traces a helper function per op signature (10-30 ms each), so on a check small enough to
# run eagerly the probe cost 2-40x the whole check (the corpus: layer norm 0.17 s of 0.21 s);
# nor on traced checks of fewer first-sweep evaluations than FORWARD_MIN_EVALUATIONS (``_tables``);
# nor through while_loops, which forward mode runs op by op, iteration by iteration
# (TFP's special functions in the corpus: 0.25-2.5 s, as much as the rest of the check).


def _forward_side(jac: _Jacobians, results, atol, rtol, output_name) -> tuple[list[PairReport], ForwardProbe]:
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
                  for spec, _, _, status, _, _, _ in results]
    jvp, why = forward_probe(plan, directions)
    if jvp is None:
        if config.autodiff == "both":
            raise ValueError(f"autodiff='both' asks for forward-mode Jacobians, but TensorFlow cannot compute them for f "
                             f"({why}); pass autodiff='reverse'.")
        return [], ForwardProbe("unsupported", error=str(why))
    if config.autodiff == "auto" and _compare.directions_agree(jvp, directions, [r[2] for r in results],
                                                                [r[4] for r in results]):
        return [], ForwardProbe("agrees", FORWARD_PROBES)
    try:
        forward = AutodiffJacobian(jac.executor, forward=True)()
    except Exception as error:
        if config.autodiff == "both":
            raise ValueError(f"autodiff='both' asks for forward-mode Jacobians, but TensorFlow cannot compute them for f "
                             f"({type(error).__name__}: {first_line(error)}); pass autodiff='reverse'.") from error
        return [], ForwardProbe("failed", error=type(error).__name__)
    compared = []
    for (spec, _, numerical, status, band, one_sided, _), block in zip(results, forward):
        forward_status = _compare.verdicts(block, numerical, band, 0.0, 0.0, bands=False)[0]  # the reverse side's bands
        undecided = status != _compare.OK  # kinks, unresolved and non-finite numerics: as on the reverse side
        forward_status[undecided] = status[undecided]
        compared.append((spec, block, numerical, forward_status, band, one_sided, None))
    return _pairs(plan, compared, atol, rtol, output_name, "forward"), ForwardProbe("compared")


def numerical_blocks(executor: Executor, plan: Plan) -> list[np.ndarray]:
    """The first-sweep numerical Jacobian [m, n_k] of every checked input (``numerical_jacobian``)."""
    jac = _Jacobians(executor, plan, {})
    return [jac.numerical(spec.position)[0] for spec in plan.checked]


def analytical_blocks(executor: Executor, plan: Plan) -> list[np.ndarray]:
    """The autodiff Jacobian [m, n_k] of every checked input (``autodiff_jacobian``)."""
    return _Jacobians(executor, plan, {}).analytical()
