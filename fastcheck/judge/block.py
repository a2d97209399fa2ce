"""The elements of one checked input under judgement, as every element-wise mode holds them (``_Block``).

One representation for full and coloured mode: the nonzeros of a ``Pattern`` (full mode's is dense: every element
of the Jacobian block, the trivial colouring, each column its own colour), their statuses (int8), their numerical
values read off the first sweep its evaluator (the "columns") keeps -- full mode's [m, n_k] quotients, coloured
mode's differences compressed by colours -- and the analytical ones off ``colours._Analytical``.  The block is what
``stages`` drives: the second step, the rule again under f's measured noise, then each input refined -- wide steps
where a noisy f swamps the allowance (``wide``), ``refine.examined`` for failing elements, each a direction of its
own read at its row, larger steps where f does not move (``flat``).  Its ``ladder`` is every element-wise stage's
(full mode's coarse pass sharpened and twin mismatch confirmed too).

A block's columns supply the evaluations: ``sweep()`` (what ``first_sweep`` reads), ``quotients``, ``span``,
``step`` and ``x`` [n], ``labels`` (the colour of each column), ``sides`` (per power, f(x + d) and f(x - d) at each
element's row along its column, and the spans: what ``ladder`` reads) and ``along``.
"""


from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastcheck.engine.config import MACHINE_EPSILON, PRECISION_EPSILON
from fastcheck.engine.plan import InputSpec, Plan
from fastcheck.engine.tables import (
    COARSE_TABLES,
    NOISE_SIDE,
    NOISE_TABLES,
    REFINE_RATIO,
    RESOLUTION_RTOLS,
    RESOLVE_COLUMNS,
    SECANT_APART,
    SECANT_SAMPLE,
    SECOND_STEP,
    VERDICT_CHUNK,
)
from fastcheck.judge import compare
from fastcheck.judge import flat as _flat
from fastcheck.judge import wide as _wide
from fastcheck.judge.refine import LADDER, Evaluate, Line, Rungs, confirmation, descend, examined, jumps_near
from fastcheck.modes.colours import _Analytical, _array
from fastcheck.report.events import Hint
from fastcheck.report.results import PairReport, having
from fastcheck.report.storage import Dense, Nonzeros
from fastcheck.sparsity import pattern as _pattern


def _take(array: np.ndarray, index) -> np.ndarray:
    """``array[index]``, or ``array`` itself where ``index`` is None (the identity: a diagonal pattern)."""
    return array if index is None else array[index]


def _noise(plan: Plan, rows, spans: np.ndarray) -> np.ndarray:
    """The first sweep's noise of the elements (rows, spans) (``rows``: an index array, a slice, or None for every
    row): ``compare.rounding_level`` of their outputs over their spans."""
    sigma = None if plan.noise is None else _take(plan.noise.sigma, rows)
    level = compare.rounding_level(_take(plan.eval_output, rows), plan.row_epsilon_at(rows), sigma)
    return compare.quotient_noise(level, spans)


def _verdicts(a, numerical, noise, atol, rtol):
    status, band = compare.verdicts(a[None, :], numerical[None, :], noise[None, :], atol, rtol)
    return status[0], band[0]


@dataclasses.dataclass
class _Block:
    """The nonzeros of one checked input and everything known about them.

    Held per nonzero: the status (int8) only.  Numerical values are read off the columns' first sweep
    ``compressed`` (``columns.quotients``: coloured mode's differences [C, m], nonzero (i, j) = D[colour of j, i] /
    span_j; full mode's quotients [m, n]), analytical ones off ``analytical``; bands are recomputed from the last
    judgement's rule; refined nonzeros override both (``override``).
    """

    spec: InputSpec
    pattern: _pattern.Pattern
    columns: Any  # the evaluator: ``colours._Columns``, ``full_steps._DenseColumns``
    analytical: _Analytical
    compressed: Any = None  # the columns' first sweep (``sweep``)
    status: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int8))
    # (sorted nonzero indices, numerical, band) that refinement settled; ``reset`` drops them.
    override: tuple | None = None
    # (plan, atol, rtol) of the last judgement: what the bands are computed under.
    rule: tuple | None = None
    # A full block's bands under the last judgement, kept (its [m, n] arrays exist anyway): not computed again.
    bands: np.ndarray | None = None
    # The nonzeros not OK after the last judgement (ascending): later stages change only statuses that
    # are not OK, so those not OK now are among them (10^7 statuses: no pass over them all to find 5321).
    flagged: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    one_sided: dict = dataclasses.field(default_factory=dict)
    jumps: dict = dataclasses.field(default_factory=dict)  # (nonzero,) -> distance to the nearest jump of f found
    secants: dict = dataclasses.field(default_factory=dict)  # (nonzero,) -> a mismatch matches f's wide secant
    cleared: int = 0  # nonzeros the last judgement's device screen passed (``_screen``)
    wrong_pattern: bool = False
    inconsistent: bool = False  # the reverse-mode gradient failed the dense cotangent probe

    @property
    def nnz(self) -> int:
        return self.pattern.nnz

    def parts(self, start: int = 0, stop: int | None = None):
        """Consecutive slices of at most ``VERDICT_CHUNK`` nonzeros over ``start:stop``."""
        stop = self.nnz if stop is None else stop
        for first in range(start, stop, VERDICT_CHUNK):
            yield slice(first, min(first + VERDICT_CHUNK, stop))

    def where(self, part: slice):
        """(rows, cols) of the nonzeros ``part``: slices for a diagonal pattern (no gather)."""
        if self.pattern.diagonal:
            return part, part
        return self.pattern.entries(part.start, part.stop)

    def first_sweep(self, rows, cols, spans: np.ndarray) -> np.ndarray:
        """The first sweep's quotient of each nonzero (float64, a fresh array); ``spans`` are its columns'."""
        assert self.compressed is not None, "sweep() first"
        return self.columns.quotients(self.compressed, rows, cols, spans)

    def values(self, part, bands: bool = False):
        """(rows, cols, analytical, numerical[, band]) of the nonzeros ``part`` (a slice, or an
        index array), refinement applied."""
        rows, cols, a, spans, numerical = self._read(part)
        band = None
        if bands and self.bands is not None:
            band = np.array(self.bands[part])
        elif bands:
            assert self.rule is not None, "judge() first"
            plan, atol, rtol = self.rule
            _, band = _verdicts(a, numerical, _noise(plan, rows, spans), atol, rtol)
        if self.override is not None and len(self.override[0]):  # an empty one: nothing refined
            index, values, refined_band = self.override
            if isinstance(part, slice):
                lo, hi = np.searchsorted(index, [part.start, part.stop])
                mine, theirs = index[lo:hi] - part.start, slice(lo, hi)
            else:
                found = np.minimum(np.searchsorted(index, part), len(index) - 1)
                mine = np.flatnonzero(index[found] == part)
                theirs = found[mine]
            numerical[mine] = values[theirs]
            if band is not None:
                band[mine] = refined_band[theirs]
        return (rows, cols, a, numerical, band) if bands else (rows, cols, a, numerical)

    def _read(self, part):
        """(rows, cols, analytical, spans, first-sweep numerical) of the nonzeros ``part``."""
        rows, cols = self.where(part) if isinstance(part, slice) else self.pattern.at(part)
        spans = self.columns.span(cols)
        if self.pattern.every:  # nonzero k is element k of the [m, n] arrays: read by flat index, not gathered
            numerical = np.array(self.compressed.reshape(-1)[part], np.float64)
            return rows, cols, self.analytical.compressed.reshape(-1)[part], spans, numerical
        return rows, cols, self.analytical.at(rows, cols), spans, self.first_sweep(rows, cols, spans)

    def materialise(self, start: int, stop: int):
        """(rows, cols, analytical, numerical, band) as whole arrays over ``start:stop`` (a small pair's report)."""
        found = [self.values(part, bands=True) for part in self.parts(start, stop)]
        if not found:
            empty = np.zeros(0)
            return np.zeros(0, np.int64), np.zeros(0, np.int64), empty, empty, empty
        return tuple(np.concatenate([_array(f[k]) for f in found]) for k in range(5))

    def sweep(self) -> None:
        """The columns' first sweep (coloured mode: one central difference per colour, kept compressed: [C, m])."""
        self.compressed = self.columns.sweep()

    def reset(self) -> None:
        """Back to the first sweep's values (before a new judgement under measured noise)."""
        self.override, self.one_sided, self.jumps, self.secants = None, {}, {}, {}

    def judge(self, plan: Plan, atol: float, rtol: float, among: np.ndarray | None = None) -> None:
        """The status of every nonzero under the rounding (or measured) noise, block by block.  ``among``: the
        nonzeros a screen (``_screen``) did not clear, the only ones judged; every other one is OK."""
        assert self.override is None, "reset() first"
        self.rule = (plan, atol, rtol)
        self.cleared = 0 if among is None else self.nnz - len(among)
        self.bands = None
        if among is not None:
            self.status = np.zeros(self.nnz, np.int8)  # OK is 0 (fresh zero pages: only the judged ones written)
            self.flagged = np.zeros(0, np.int64)
            if len(among):
                rows, _, a, spans, numerical = self._read(among)
                status, _ = _verdicts(a, numerical, _noise(plan, rows, spans), atol, rtol)
                self.status[among] = status
                self.flagged = among[status != 0]
            return
        status = self.status if self.status.size == self.nnz else np.empty(self.nnz, np.int8)
        kept = np.empty(self.nnz) if self.pattern.every else None
        flagged = []
        for part in self.parts():
            rows, _, a, spans, numerical = self._read(part)
            status[part], band = _verdicts(a, numerical, _noise(plan, rows, spans), atol, rtol)
            flagged.append(np.flatnonzero(status[part]) + part.start)  # OK is 0
            if kept is not None:
                kept[part] = band
        self.status, self.bands = status, kept
        self.flagged = np.concatenate(flagged) if flagged else np.zeros(0, np.int64)

    def refine(self, plan: Plan, atol: float, rtol: float, flat: bool = True) -> None:
        """Under a noisy f's measured noise, the nonzeros it swamps at wide steps first (``coarsen``); failing
        nonzeros through the triage at h/4 and the ladder (``_settle``), re-evaluating only their colours; those where
        f jumps (``_jumps``); last, mismatches where f does not move (``flat``) and whether they match f's secant
        over wide steps (``_secants``, the report's: ``flat`` False, a twin's refinement, skips both).  Full mode's
        stages, in its order."""
        noisy = _noisy(plan)
        coarsened = self.coarsen(plan, atol, rtol) if noisy else np.zeros(0, np.int64)
        failing = having(self.status, compare.MISMATCH, compare.NUMERICAL_NONFINITE, among=self.flagged)
        failing = np.setdiff1d(failing, coarsened) if len(coarsened) else failing
        if len(failing):
            self._settle(plan, failing, atol, rtol)
        if noisy:  # jumps of f beyond its rounding show in its measured noise first
            self._jumps(plan, having(self.status, compare.MISMATCH, among=self.flagged))
        if flat:
            self._flat(plan)
            self._secants(plan, atol, rtol)

    def failing(self) -> np.ndarray:
        """The nonzeros not OK now (ascending)."""
        return self.flagged[self.status[self.flagged] != compare.OK]

    def directions(self) -> int:
        """The colours holding a nonzero that is not OK."""
        failing = self.failing()
        return len(np.unique(self.columns.labels[self.pattern.at(failing)[1]])) if len(failing) else 0

    def second_step(self, plan: Plan, atol: float, rtol: float):
        """The failing nonzeros at h/4 (``compare.second_step``): which pass, and what takes their estimates."""
        index = self.failing()
        rows, cols = self.pattern.at(index)
        spans = self.columns.span(cols)
        a = self.analytical.at(rows, cols)
        (second, second_noise, *_), = self.ladder(plan, rows, cols)(np.arange(len(index)), (SECOND_STEP,)).levels
        passes, estimate, error = compare.second_step(a[None, :], self.first_sweep(rows, cols, spans)[None, :],
                                                       _noise(plan, rows, spans)[None, :], second, second_noise, atol,
                                                       rtol, REFINE_RATIO)

        def take() -> None:
            status, band = _verdicts(a, estimate[0], error[0], atol, rtol)
            self.status[index] = status
            self.adopt(index, np.asarray(estimate[0], np.float64), band)

        return passes, take

    def rejudge(self, plan: Plan, atol: float, rtol: float) -> None:
        """Every nonzero judged again from the first sweep (under f's measured noise)."""
        self.reset()
        self.judge(plan, atol, rtol)

    def _settle(self, plan: Plan, failing: np.ndarray, atol: float, rtol: float) -> None:
        """``refine``'s second step, triage and ladder for the ``failing`` nonzeros (``refine.examined``), each a
        direction of its own (its colour restricted to its column) read at its row."""
        rows, cols = self.pattern.at(failing)
        a = self.analytical.at(rows, cols)[None, :]
        spans = self.columns.span(cols)
        estimate, status, band, sides = examined(self.ladder(plan, rows, cols), self.line(plan, rows, cols), a,
                                                 self.first_sweep(rows, cols, spans)[None, :],
                                                 _noise(plan, rows, spans)[None, :], np.ones(a.shape, bool), atol, rtol)
        self.one_sided.update({(int(failing[k]),): value for (_, k), value in sides.items()})
        self.adopt(failing, estimate[0], band[0])
        self.status[failing] = status[0]

    def _jumps(self, plan: Plan, index: np.ndarray) -> None:
        """The nonzeros ``index`` (ascending: mismatches, whatever step settled them, the wide fit's or the ladder's;
        a coarse pass no larger step sharpened) where f jumps within the steps (``refine.jumps_near``):
        DISCONTINUOUS, undecidable; the distance to the nearest jump found is kept (the report names it).  Run where
        f's measured noise exceeds its rounding: dense jumps are what a measurement along lines through x reads as
        noise, and f measured as smooth as its rounding has none to find."""
        if not len(index):
            return
        rows, cols = self.pattern.at(index)
        eps = np.maximum(plan.row_epsilon_at(rows), PRECISION_EPSILON.get(plan.precision, 0.0))
        rounding = compare.rounding_level(np.maximum(np.abs(plan.eval_output[rows]), self.row_terms(rows)), eps, None,
                                           1.0)
        jumps, distance = jumps_near(self.ladder(plan, rows, cols), len(index), np.broadcast_to(rounding, index.shape))
        self.status[index[jumps]] = compare.DISCONTINUOUS
        self.flagged = np.union1d(self.flagged, index[jumps])  # a coarse pass's were OK
        self.jumps.update({(int(k),): float(d) for k, d in zip(index[jumps], distance[jumps])})

    def _secants(self, plan: Plan, atol: float, rtol: float) -> None:
        """Whether the first ``SECANT_SAMPLE`` mismatches' analytical values match f's secant over the ladder's widest
        steps (h * 4**RESOLVE_UP) but not its slope at the fine steps that judged them: an expected gradient, a
        surrogate's or an implicit reparameterisation's, of an f whose fine structure (a fast oscillation, dense
        jumps) the wide steps average out.  A fact for the report's hint; no status changes.  The first mismatch is
        looked at alone: where it does not match (a planted defect), the hint cannot hold and no more are."""
        index = having(self.status, compare.MISMATCH, among=self.flagged)[:SECANT_SAMPLE]
        for part in (index[:1], index[1:]):
            if not len(part):
                return
            matches = self._secant(plan, part, atol, rtol)
            self.secants.update({(int(k),): bool(m) for k, m in zip(part, matches)})
            if not matches.all():
                return

    def _secant(self, plan: Plan, index: np.ndarray, atol: float, rtol: float) -> np.ndarray:
        """``_secants``' test of the nonzeros ``index``: the analytical value within the rule's band of the widest
        step's quotient, f's fine-step estimate ``SECANT_APART`` bands or more away."""
        rows, cols, a, numerical = self.values(index)
        levels = self.ladder(plan, rows, cols)(np.arange(len(index)), LADDER.larger[:3]).levels
        quotients = np.array([level[0][0] for level in levels])  # widest first
        wide, noise = quotients[0], levels[0][1][0]
        with np.errstate(invalid="ignore"):
            # The wide secant's error: how far each next finer one lies, scaled down 4x a level (fine structure
            # averaged over a span shrinks like 1 / span; a smooth f's truncation grows 16x a level instead).
            spread = np.max(np.abs(np.diff(quotients, axis=0)) / 4.0 ** np.arange(len(levels) - 1)[:, None], axis=0)
            band = compare.allowance(wide, atol, rtol, spread + noise)
            return (np.abs(a - wide) <= band) & (np.abs(numerical - wide) > SECANT_APART * band)

    def _flat(self, plan: Plan) -> None:
        """Mismatches whose quotient, at the first step or refined, is f not moving: larger steps along their
        colours tell (``flat``), as in full mode (those judged at wide steps too: a cubic through a staircase's few
        steps can fit within its noise)."""
        index = having(self.status, compare.MISMATCH, among=self.flagged)
        if not len(index):
            return
        rows, cols, a, numerical = self.values(index)
        spans = self.columns.span(cols)
        level = _flat.rounding_level(plan)[rows][None, :]
        flat = (compare.flat(self.first_sweep(rows, cols, spans)[None, :], spans, level)
                | compare.flat(numerical[None, :], spans, level))[0]
        if not flat.any():
            return
        index, rows, cols, a = index[flat], rows[flat], cols[flat], a[flat]
        base = self.columns.step[cols]
        self.status[index] = _flat.status(plan, self.columns.executor.config, rows, a,
                                          lambda multiples: self.columns.along(rows, cols, base, multiples))

    def coarsen(self, plan: Plan, atol: float, rtol: float) -> np.ndarray:
        """The nonzeros whose allowance is mostly f's measured noise, re-estimated at wide steps (``wide``, the
        stage of full mode's noise-limited columns): those a fit takes get its estimate, band and status; returns
        them (ascending).  The nonzeros of a column share its width, the largest any of them needs."""
        found = []
        for part in self.parts():
            rows, _, a, spans, numerical = self._read(part)
            limited = _wide.limited(_noise(plan, rows, spans), numerical, atol, rtol)
            found.append(np.flatnonzero(limited & np.isfinite(numerical) & np.isfinite(a)) + part.start)
        index = np.concatenate(found) if found else np.zeros(0, np.int64)
        # In chunks of whole columns (each column's width is its elements' widest) whose [1, 9, k] tables stay
        # within memory_budget: a chunk starts at each column that starts past a multiple of ``chunk`` nonzeros.
        chunk = max(1, int(self.columns.executor.config.budget // (COARSE_TABLES * 9 * 8)))
        cols = self.pattern.at(index)[1]
        order = np.argsort(cols, kind="stable")
        index, cols = index[order], cols[order]
        starts = np.flatnonzero(np.diff(cols, prepend=-1) != 0)
        cuts = [*starts[np.diff(starts // chunk, prepend=-1) != 0], len(index)]
        taken = np.sort(np.concatenate([np.zeros(0, np.int64)] + [
            self._coarsened(plan, np.sort(index[start:stop]), atol, rtol) for start, stop in zip(cuts, cuts[1:])]))
        self.flagged = np.union1d(np.setdiff1d(self.flagged, taken), taken[self.status[taken] != compare.OK])
        return taken

    def _coarsened(self, plan: Plan, index: np.ndarray, atol: float, rtol: float) -> np.ndarray:
        """``coarsen`` on the noise-limited nonzeros ``index``; returns those taken."""
        rows, cols = self.pattern.at(index)
        a = self.analytical.at(rows, cols)
        assert plan.noise is not None, "coarsen under measured noise"
        eps_eval = MACHINE_EPSILON[plan.eval_dtype]
        base = self.columns.step[cols].astype(np.float64)

        def along(width: np.ndarray):
            plus, minus, spans = self.columns.along(rows, cols, width, (1.0, 2.0, 3.0, 4.0))
            return plus, minus, spans[3] / 8  # the step actually realised: half the span at t = 4, over 4

        taken, estimate, error = _wide.coarsened(along, a, plan.eval_output[rows], _take(plan.noise.sigma, rows), base,
                                                 base / self.columns.executor.config.step(eps_eval), cols, eps_eval,
                                                 atol, rtol)
        index, estimate, error = index[taken], estimate[taken], error[taken]
        self.status[index], band = _verdicts(a[taken], estimate, error, atol, rtol)
        self.adopt(index, estimate, band)
        return index

    def span_of(self, output) -> tuple[int, int]:
        """The nonzeros ``lo:hi`` of one output leaf's rows (a diagonal pattern's nonzero k is (k, k))."""
        if self.pattern.diagonal:
            return output.offset, output.offset + output.size
        return int(self.pattern.indptr[output.offset]), int(self.pattern.indptr[output.offset + output.size])

    def coarse_rows(self, plan: Plan, rtol: float) -> np.ndarray:
        """[m] the rows of the outputs whose pair with this input passes at a resolution coarser than
        ``RESOLUTION_RTOLS`` rtols: the tolerances (atol against a small gradient) or the numerics keep it from
        seeing a 1% error.  A pair whose gradient and numerical derivative are 0 at every nonzero (a ReLU's second
        derivative, a saturated activation) has no relative error for any twin to resolve."""
        rows = np.zeros(plan.m, bool)
        for output in plan.outputs:
            lo, hi = self.span_of(output)
            if hi <= lo or compare.IS_FAILING[self.status[lo:hi]].any():
                continue
            resolved, moves = np.inf, False
            for part in self.parts(lo, hi):
                _, _, a, numerical, band = self.values(part, bands=True)
                usable = self.status[part] == compare.OK
                if compare.resolves(a, band, usable, rtol):
                    break
                moves = moves or bool(np.any(a)) or bool(np.any(numerical))
                resolved = min(resolved, compare.resolution(a, band, band, usable)[0])
            else:
                if moves and resolved > RESOLUTION_RTOLS * rtol:
                    rows[output.offset : output.offset + output.size] = True
        return rows

    def in_rows(self, plan: Plan, rows: np.ndarray) -> np.ndarray:
        """The nonzeros (ascending) of the outputs whose rows ``rows`` [m] marks (whole output leaves)."""
        spans = [self.span_of(o) for o in plan.outputs if rows[o.offset : o.offset + o.size].any()]
        return np.concatenate([np.zeros(0, np.int64)] + [np.arange(lo, hi, dtype=np.int64) for lo, hi in spans])

    def sharpen(self, plan: Plan, atol: float, rtol: float) -> None:
        """Sharpen a block whose every nonzero passes at a resolution ``compare.coarse`` rejects.

        The nonzeros of its ``RESOLVE_COLUMNS`` most resolving columns (largest |a| / allowed) are re-estimated on
        the ladder (``ladder``) at h * 4**RESOLVE_UP ... h, where f's rounding is 4**RESOLVE_UP times smaller: one
        whose settled estimate there passes with a smaller allowance keeps that estimate and allowance.  None is
        failed by it (a larger step's truncation is what the ladder judges, not a confirmed mismatch), so a block the
        larger steps do not resolve stays undecidable; where f is noisy, those of its nonzeros where f jumps within
        the steps are undecidable for that (``_jumps``: its noise is dense jumps, which no step resolves).  The block
        is read a part at a time (coloured mode's 10^7 nonzeros: no whole arrays), and no further than a passing nonzero that resolves ``RESOLUTION_RTOLS`` rtols
        (the block's resolution, a minimum over its nonzeros, then does too: nothing to sharpen)."""
        if not self.nnz or compare.IS_FAILING[self.status[self.flagged]].any():  # every not-OK one is flagged
            return
        resolved, tolerance = np.inf, np.inf
        score = np.full(self.pattern.shape[1], np.nan)  # per column: max |a| / allowed over its passing nonzeros
        for part in self.parts():
            _, cols, a, numerical, band = self.values(part, bands=True)
            usable = self.status[part] == compare.OK
            if compare.resolves(a, band, usable, rtol):
                return
            with np.errstate(invalid="ignore", divide="ignore"):
                here = compare.resolution(a, band, compare.allowance(numerical, atol, rtol), usable)
                np.fmax.at(score, _array(cols), np.where(usable, np.abs(a) / band, 0.0))
            resolved, tolerance = min(resolved, here[0]), min(tolerance, here[1])
        if not compare.coarse(resolved, tolerance, rtol):
            return
        columns = np.sort(np.argsort(-score, kind="stable")[:RESOLVE_COLUMNS])
        index = np.concatenate([np.zeros(0, np.int64)] + [  # the nonzeros in those columns, ascending
            np.flatnonzero(np.isin(_array(self.where(part)[1]), columns)) + part.start for part in self.parts()])
        rows, cols, a, _, band = self.values(index, bands=True)
        found = descend(self.ladder(plan, rows, cols), len(index), LADDER.larger)
        with np.errstate(invalid="ignore"):
            allowed = compare.allowance(found.estimate[0], atol, rtol, found.error[0])
            better = (found.settled[0] & (np.abs(a - found.estimate[0]) <= allowed) & (allowed < band)
                      & (self.status[index] == compare.OK))
        self.adopt(index[better], found.estimate[0][better], allowed[better])
        if _noisy(plan) and not better.any():  # no larger step resolves: f's noise may be jumps denser than steps
            self._jumps(plan, index)

    def adopt(self, index: np.ndarray, numerical: np.ndarray, band: np.ndarray) -> None:
        """Nonzeros ``index`` (ascending) take these values and bands, over any earlier stage's."""
        if self.override is not None:
            earlier, earlier_numerical, earlier_band = self.override
            index, first = np.unique(np.concatenate([index, earlier]), return_index=True)
            numerical = np.concatenate([numerical, earlier_numerical])[first]
            band = np.concatenate([band, earlier_band])[first]
        self.override = (index, numerical, band)

    def line(self, plan: Plan, rows: np.ndarray, cols: np.ndarray) -> Line:
        """The ``Line`` of the elements (rows[k], cols[k]) for ``confirmation``: their first steps, the noise of a
        quotient over a span."""
        return Line(lambda selection: self.columns.step[cols[selection]].astype(np.float64),
                    lambda selection, spans: _noise(plan, rows[selection], spans)[None, :])

    def ladder(self, plan: Plan, rows: np.ndarray, cols: np.ndarray) -> Evaluate:
        """The evaluation ``descend`` drives for the nonzeros (rows[k], cols[k]), each a direction of its own (its
        column, read at its row): a selection of them at steps h / 4**p, as [1, k] levels (h, p = 0, is the first
        sweep's step again, with its sides: the sweep keeps none; a kink crossed at h and h/4 then shows at two
        steps).  Each element's f(x) is subtracted from its sides (``columns.sides``), so the shared ``y0`` of
        ``compare.refine`` is 0 (its one-sided quotients and second differences only use differences from f(x))."""
        y0 = plan.eval_output[rows]

        def evaluate(selection: np.ndarray, powers, factors=None) -> Rungs:
            base, levels = y0[selection], []
            for plus, minus, spans in self.columns.sides(rows[selection], cols[selection], list(powers), factors):
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    derivative = (plus - minus) / spans
                    moved = (plus - base)[None, :], (minus - base)[None, :]
                levels.append((derivative[None, :], _noise(plan, rows[selection], spans)[None, :], *moved, spans))
            return Rungs(levels, np.zeros(1), self.grid(plan, rows[selection])[None, :])

        return evaluate

    def grid(self, plan: Plan, rows: np.ndarray) -> np.ndarray:
        """f's grid at each entry of ``rows`` (``compare.grid``)."""
        return compare.grid(plan.eval_output[rows], self.row_terms(rows), MACHINE_EPSILON[plan.eval_dtype],
                             None if plan.noise is None else plan.noise.sigma[rows])

    def row_terms(self, rows: np.ndarray) -> np.ndarray:
        """sum_j |a_ij x_j| over each row's nonzeros (f_i's terms were it linear), per entry of ``rows``."""
        x = self.columns.x
        if self.pattern.diagonal:
            with np.errstate(invalid="ignore", over="ignore"):
                terms = np.abs(np.asarray(self.analytical.at(rows, rows), np.float64) * x[rows])
                return np.where(np.isfinite(terms), terms, 0.0)  # as the others: an infinite input has no term
        unique, inverse = np.unique(np.asarray(rows, np.int64), return_inverse=True)
        if self.pattern.dense:  # every column: whole rows of the analytical block
            with np.errstate(invalid="ignore", over="ignore"):
                terms = np.abs(self.analytical.at(unique[:, None], np.arange(x.size)[None, :]) * x.reshape(1, -1))
                return np.sum(np.where(np.isfinite(terms), terms, 0.0), axis=1)[inverse]
        indptr = self.pattern.indptr
        counts = indptr[unique + 1] - indptr[unique]
        owner = np.repeat(np.arange(len(unique)), counts)
        r, c = self.pattern.at(_pattern.ranges(indptr[unique], counts))
        with np.errstate(invalid="ignore", over="ignore"):
            terms = np.abs(np.asarray(self.analytical.at(r, c), np.float64) * x[c])
        sums = np.bincount(owner, weights=np.where(np.isfinite(terms), terms, 0.0), minlength=len(unique))
        return sums[inverse]


def stages(judged: Sequence[_Block], plan: Plan, measure: Callable[[Plan, dict], Plan],
           tolerances: Callable[[Plan], tuple], clock: Callable[[str], Any] = lambda stage: contextlib.nullcontext()) -> tuple:
    """The stages every element-wise mode runs after its first sweep's verdicts, in order; returns the plan (with f's
    noise and precision where they were measured) and its (atol, rtol).

    1. The second step: the failing directions at h/4, where they cost at most a measurement's own calls of f
       (``NOISE_TABLES`` tables of 2 ``NOISE_SIDE`` points).  Where every one of them passes there, each takes its
       estimate and f's noise is never measured (a float32-only special function whose first step was only
       truncation-limited at one element -- igamma, zeta, atan2 in TensorFlow's tests -- passes in one pair of
       evaluations instead of ~100; so do the 5321 of 10^7 elements of float32 sin(x) x, one colour); otherwise
       nothing changes (its evaluations are kept for the triage), and the inputs stop at the first that does not
       pass.
    2. Where an element still fails: f's noise and precision (``measure(plan, {input: passes})``, told which
       directions the second step passed, where it ran: coloured mode measures the rows of the others), and every
       element judged again under them, from the first sweep (a larger allowance only turns failures into passes,
       so a pass needs none).
    3. Each input refined (``_Block.refine``).
    4. A coarse pass sharpened (``_Block.sharpen``).

    ``clock(stage)`` times a stage ("refine"; ``measure`` times its own).
    """
    atol, rtol = tolerances(plan)
    passed: dict = {}  # input -> [k] which of its failing directions the second step passed
    if plan.noise is None and 0 < sum(j.directions() for j in judged) <= NOISE_TABLES * NOISE_SIDE:
        with clock("refine"):
            taken = []
            for index, j in enumerate(judged):
                if j.directions():
                    passed[index], take = j.second_step(plan, atol, rtol)
                    if not passed[index].all():
                        break
                    taken.append(take)
            else:
                for take in taken:
                    take()
    if plan.noise is None and any(j.directions() for j in judged):
        plan = measure(plan, passed)
        atol, rtol = tolerances(plan)
        for j in judged:
            j.rejudge(plan, atol, rtol)
    with clock("refine"):
        for j in judged:
            j.refine(plan, atol, rtol)
        for j in judged:
            j.sharpen(plan, atol, rtol)
    return plan, atol, rtol


def _noisy(plan: Plan) -> bool:
    """Whether f's measured noise exceeds its rounding (wide steps, jumps of f: what only a noisy f needs)."""
    return plan.noise is not None and plan.noise_epsilon > MACHINE_EPSILON[plan.eval_dtype]


def pairs(plan: Plan, blocks: Sequence[_Block], atol, rtol, output_name, side: str, dense_entries: float,
          twinned: Sequence[np.ndarray | None] = ()) -> list[PairReport]:
    """One ``PairReport`` per (output, input) of every element-wise mode: over ``Dense`` arrays up to
    ``dense_entries`` entries (zeros outside the pattern; full mode's blocks always), else over the block's
    ``Nonzeros``.  ``twinned`` (per block): the rows [m] with a nonzero judged through the gradient's float64 twin
    (``twinned``), None where none was."""
    reports = []
    for block, twin in itertools.zip_longest(blocks, twinned):
        spec, pattern = block.spec, block.pattern
        input_shape = tuple(spec.real_view.shape)
        for output in plan.outputs:
            output_shape = tuple(output.shape) + ((2,) if output.dtype.is_complex else ())
            lo, hi = block.span_of(output)
            # Per-element facts (a kink's one-sided derivatives, the distance to a jump, a mismatch matching f's wide
            # secant), keyed as the storage is.
            facts: list[dict] = [{(k - lo,): v for (k,), v in found.items() if lo <= k < hi}
                     for found in (block.one_sided, block.jumps, block.secants)]
            storage: Dense | Nonzeros
            shape = (output.size, spec.size)
            if pattern.every:  # nonzero k is element k: the values are the block's rows, reshaped
                _, _, analytical, numerical, band = block.values(slice(lo, hi), bands=True)
                storage = Dense(numerical.reshape(shape), analytical.reshape(shape),
                                block.status[lo:hi].reshape(shape), band.reshape(shape))
                facts = [{divmod(k, spec.size): v for (k,), v in found.items()} for found in facts]
            elif output.size * spec.size <= dense_entries:
                rows, cols, analytical, numerical, band = block.materialise(lo, hi)
                rows = rows - output.offset
                status = block.status[lo:hi]
                dense = []
                for x, fill in zip((numerical, analytical, status, band), (0.0, 0.0, compare.OK, atol)):
                    array = np.full(shape, fill, dtype=x.dtype)
                    array[rows, cols] = x
                    dense.append(array)
                storage = Dense(*dense)
                facts = [{(int(rows[k]), int(cols[k])): v for (k,), v in found.items()} for found in facts]
            else:
                storage = Nonzeros(block, lo, hi, output.offset, shape)
            used = twin is not None and bool(twin[output.offset : output.offset + output.size].any())
            pair = PairReport(output_name or output.name, spec.name, output_shape, input_shape, storage, atol, rtol,
                              one_sided=facts[0], jumps=facts[1], secants=facts[2], side=side,
                              inconsistent=block.inconsistent, float64_gradient=used)
            pair.cause = (Hint("wrong pattern") if block.wrong_pattern else Hint("inconsistent") if block.inconsistent
                          else _undecided_at_nonfinite_inputs(pair, block.columns.x, plan.eval_output[output.offset : output.offset + output.size]) or pair.diagnose())
            reports.append(pair)
    return reports


def _undecided_at_nonfinite_inputs(pair: PairReport, x: np.ndarray, y0: np.ndarray) -> Hint | None:
    """Where ``x`` (the pair's input, flat) holds elements that are not finite and every element of ``pair`` the
    numerics leave undecided lies at one of them or in a row where f is not finite at the point (``y0``: the pair's
    output, flat; the report's problem says so), what explains them: the point the user chose, not f's domain."""
    nonfinite = ~np.isfinite(x)
    undecided = np.isin(pair.status, compare.UNDECIDED)
    if not undecided.any() or not nonfinite.any():
        return None
    rows, cols = (pair.rows[undecided], pair.cols[undecided]) if pair.sparse else np.nonzero(undecided)
    if not np.all(nonfinite[cols] | ~np.isfinite(y0[rows])):
        return None
    first = tuple(int(i) for i in np.unravel_index(int(np.argmax(nonfinite)), pair.input_shape))
    return Hint("nonfinite input", count=int(nonfinite.sum()), first=first)


def twinned(blocks: Sequence[_Block], plan: Plan, config, atol: float, rtol: float,
            analytical: Callable[[], list], twin_block: Callable[[_Block, _Analytical], _Block],
            measure: Callable[[Plan], Plan],
            clock: Callable[[str], Any] = lambda stage: contextlib.nullcontext()) -> tuple[Plan, list]:
    """Pairs that pass at a resolution coarser than 1% of their gradient (``_Block.coarse_rows``), judged again
    through the gradient's float64 twin where the numerical side computes in float64 and atol is the table's; returns
    the plan (with f's noise measured: float64's rule needs it) and, per block, the rows [m] with a nonzero so judged
    (None where none was).  Every element-wise mode's: ``analytical()`` is its twin (the strategy's analytical side
    run at the float64 point: one ``_Analytical`` per block), ``twin_block(block, twin)`` the block over the twin's
    values and the same evaluations, ``measure(plan)`` f's noise; ``clock("twin")`` times it where it runs.

    The twin is the same gradient code run at the float64 point (a model's float64 copy, or f given float64 values):
    float64's rule judges it against the same numerical derivative (refined as any float64 check), and the float32
    gradient's own rounding is then *measured*, |a - twin|, instead of being stood in for by float32's atol.  A
    nonzero whose twin verdict is a pass or a mismatch gets the allowance ``float64's allowance + |a - twin|`` and is
    judged by it (a twin passing makes a pass: the triangle inequality); kinks, jumps and unresolved twin elements
    keep their verdict.  The twin is not used where it differs from the float32 gradient by more than float32's
    tolerance (it is not the same computation) or is not finite.  A user's atol is the user's rule: then nothing is
    sharpened.
    """
    if not config.twin_applies(plan) or config.autodiff == "forward":
        return plan, []
    targets = [block.coarse_rows(plan, rtol) for block in blocks]
    if not any(rows.any() for rows in targets):
        return plan, []
    with clock("twin"):
        return _twinned(blocks, plan, config, atol, rtol, targets, analytical, twin_block, measure)


def _twinned(blocks, plan: Plan, config, atol: float, rtol: float, targets: list, analytical, twin_block,
             measure) -> tuple[Plan, list]:
    try:
        twins = analytical()
    except Exception:  # no float64 gradient (an op without a float64 kernel): the verdicts stand
        return plan, []
    if plan.noise is None:
        plan = measure(plan)
    atol64, rtol64 = config.twin_tolerances()
    twinned: list = []
    for rows, t, block in zip(targets, twins, blocks):
        index = block.in_rows(plan, rows)
        r, c = block.pattern.at(index)
        a, twin_values = block.analytical.at(r, c), t.at(r, c)
        if not len(index) or not compare.same_computation(a, twin_values, atol, rtol).all():
            twinned.append(None)
            continue
        judged = twin_block(block, t)
        judged.judge(plan, atol64, rtol64)
        others = np.ones(judged.nnz, bool)
        others[index] = False
        judged.status[others] = compare.OK  # the other pairs' need no refinement
        judged.flagged = judged.failing()
        judged.refine(plan, atol64, rtol64, flat=False)
        _, _, _, n_twin, t_band = judged.values(index, bands=True)
        band = block.values(index, bands=True)[4]
        with np.errstate(invalid="ignore"):
            allowed = t_band + np.abs(a - twin_values)
            usable = (np.isin(judged.status[index], (compare.OK, compare.MISMATCH))
                      & (block.status[index] == compare.OK) & (allowed < band))
            verdict = np.where(np.abs(a - n_twin) <= allowed, compare.OK, compare.MISMATCH)
        _holds_above(plan, judged, index, a, twin_values, usable, verdict, (atol64, rtol64))
        block.status[index[usable]] = verdict[usable]
        block.adopt(index[usable], n_twin[usable], allowed[usable])
        block.flagged = np.union1d(block.flagged, index[usable & (verdict != compare.OK)])
        used = np.zeros(plan.m, bool)
        used[r[usable]] = True
        twinned.append(used)
    return plan, twinned


def _holds_above(plan: Plan, block: _Block, index: np.ndarray, a, t, usable, verdict, tolerances) -> None:
    """A twin mismatch stands only where it holds at larger steps too, confirmed; else, in place, it is not used.

    The twin's allowance is float64's, a few 1e-8 on a gradient of 1e-5 .. 1e-3: there the quotient's own error is
    f's measured noise over the step, and a float64 network's noise is not Gaussian everywhere (a correct network
    had a few elements just past that allowance).  The mismatched nonzeros (of ``index``) are re-estimated on the
    twin block's ladder (``_Block.ladder``, each a direction of its own) at h * 4**RESOLVE_UP ... h, where the noise
    is 4**RESOLVE_UP times smaller; one stays a mismatch only where that settled estimate is outside its own float64
    allowance plus |a - twin|, by the same rule (a 1% defect in the gradient code, which the twin shares, is far
    outside it), and where ``confirmation`` finds it again at independent steps and below the pair: a ReLU6 kink a
    few h away moves the larger steps' quotients by 3e-4 of the gradient, and the smaller steps show the derivative
    at the point (a correct nested MobileNetV2).  Elsewhere the twin is not used: the nonzero keeps its native
    verdict (a pass too coarse for 1%, undecidable).
    """
    atol64, rtol64 = tolerances
    suspect = np.flatnonzero(usable & (verdict == compare.MISMATCH))
    if not len(suspect):
        return
    rows, cols = block.pattern.at(index[suspect])
    a_suspect, slack = a[suspect][None, :], np.abs(a - t)[suspect][None, :]

    def mismatch(selection, found: compare.Refined) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return np.abs(a_suspect[:, selection] - found.estimate) > (
                compare.allowance(found.estimate, atol64, rtol64, found.error) + slack[:, selection])

    evaluate = block.ladder(plan, rows, cols)
    found = descend(evaluate, len(suspect), LADDER.larger,
                    confirm=confirmation(evaluate, block.line(plan, rows, cols), a_suspect, mismatch,
                                         first=LADDER.larger.start))
    usable[suspect] = (found.settled & mismatch(np.arange(len(suspect)), found))[0]
