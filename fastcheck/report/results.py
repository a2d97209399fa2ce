"""The result of a check as values: the verdict per pair over the storage each mode fills, the report and
its JSON.  Its text is composed in ``text``, each note in ``notes``; what a check learnt on its way is ``events``."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fastcheck.engine.tables import RESOLUTION_RTOLS, WORST_KEPT
from fastcheck.judge.compare import (
    ANALYTICAL_NONFINITE,
    DISCONTINUOUS,
    FAILING,
    FLAT,
    MISMATCH,
    NONDIFFERENTIABLE,
    NUMERICAL_NONFINITE,
    OK,
    STATUS_NAMES,
    UNDECIDED,
    UNRESOLVED,
    UNRESOLVED_KINK,
    allowance,
    coarse,
    resolution,
    zero,
)
from fastcheck.judge.compare import diagnose as _diagnose
from fastcheck.report import text as _text
from fastcheck.report.events import Hint
from fastcheck.report.notes import compose
from fastcheck.report.storage import Comparison, Element, Nonzeros, Projections, Storage, json_number


class GradientCheckError(AssertionError):
    """Raised by ``assert_gradients_close`` when a check fails; ``.report`` holds the result."""

    def __init__(self, report: GradientReport):
        super().__init__(str(report))
        self.report = report


# Status names, by code (``PairReport.statuses``) and codes by name (``PairReport.count``).
_STATUS_NAMES = np.array([STATUS_NAMES[code] for code in range(len(STATUS_NAMES))], dtype=object)
STATUS_CODES = {name: code for code, name in STATUS_NAMES.items()}

# The per-status counts of ``PairReport.to_dict``, by key.
COUNT_KEYS = (("mismatches", MISMATCH), ("analytical_nonfinite", ANALYTICAL_NONFINITE),
              ("numerical_nonfinite", NUMERICAL_NONFINITE), ("not_differentiable", NONDIFFERENTIABLE),
              ("unresolved", UNRESOLVED), ("discontinuous", DISCONTINUOUS), ("kinks_unresolved", UNRESOLVED_KINK),
              ("flat", FLAT))


@dataclasses.dataclass(eq=False)
class PairReport:
    """One (output, input) pair of the Jacobian and its verdict, in every mode.

    The verdict, summaries, text and JSON are defined here once; the ``storage`` only hands
    over the compared values, block by block (``chunks``) or one at a time (``entry``):

    * ``Dense`` (full mode): ``numerical`` and ``analytical`` have shape (output_size,
      input_size), the convention of ``tf.test.compute_gradient``; complex values count as
      (real, imag) pairs;
    * ``Nonzeros`` (coloured mode's large pairs, ``sparse``): the values at the pattern's
      structural nonzeros ``(rows[k], cols[k])``, 1-D; ``one_sided`` is keyed by ``(k,)``;
    * ``Projections`` (fast mode, ``projected``): the probes of one input, output ``u.J.d``.
    """

    output_name: str
    input_name: str
    output_shape: tuple
    input_shape: tuple
    storage: Storage
    atol: float
    rtol: float
    cause: Hint | None = None  # what explains the verdict; ``hint`` is its text
    # (row, column) -> (left, right) one-sided derivatives, for elements at a kink
    one_sided: dict = dataclasses.field(default_factory=dict)
    # (row, column) -> distance from x to the nearest jump of f found, for elements where f jumps within the steps
    jumps: dict = dataclasses.field(default_factory=dict)
    # (row, column) -> whether a mismatch's analytical value matches f's secant over wide steps but not its fine slope
    secants: dict = dataclasses.field(default_factory=dict)
    # Which autodiff side ``analytical`` holds: "reverse" (VJPs, what training uses),
    # "forward" (JVPs), or "supplied" (the user's gradients).
    side: str = "reverse"
    # Coloured mode: the reverse-mode gradient failed the dense cotangent probe (a report problem
    # says where), whatever its values at the pattern's nonzeros.
    inconsistent: bool = False
    # Judged through the gradient's float64 twin (the same gradient code at the float64 point,
    # ``block.twinned``, ``fast._Probes.twinned``): its own tolerances could not see a 1% error.
    float64_gradient: bool = False
    _summary: dict | None = dataclasses.field(default=None, init=False, repr=False)
    _counts: np.ndarray | None = dataclasses.field(default=None, init=False, repr=False)
    _coarse: bool | None = dataclasses.field(default=None, init=False, repr=False)

    # -- the values, from the storage ----------------------------------------------------

    hint = property(lambda self: _text.hint_text(self.cause), doc="What explains the verdict, as a sentence (or None).")
    numerical = property(lambda self: self.storage.numerical)
    analytical = property(lambda self: self.storage.analytical)
    allowed = property(lambda self: self.storage.band)  # each element's allowance, as the text shows it
    status = property(lambda self: self.storage.status,
                      doc="The ``compare`` status of each value (fast mode: [k, 2], each probe's J d and u.J.d).")

    @property
    def sparse(self) -> bool:
        """Values over the structural nonzeros only (coloured mode's large pairs)."""
        return isinstance(self.storage, Nonzeros)

    @property
    def projected(self) -> bool:
        """Judged by random projections (fast mode), not element by element."""
        return isinstance(self.storage, Projections)

    rows = property(lambda self: self._nonzeros().rows,
                    doc="Coloured mode's large pairs: the output element (flat) of every nonzero.")
    cols = property(lambda self: self._nonzeros().cols,
                    doc="Coloured mode's large pairs: the input element (flat) of every nonzero.")

    @property
    def jacobian_shape(self) -> tuple:
        return self._nonzeros().jacobian_shape if self.sparse else tuple(self.status.shape)

    def _nonzeros(self) -> Nonzeros:
        if not isinstance(self.storage, Nonzeros):
            raise AttributeError("rows and cols exist on coloured mode's large (sparse) pairs only")
        return self.storage

    @property
    def comparison(self) -> Comparison:
        """Fast mode: the per-probe comparisons."""
        if not isinstance(self.storage, Projections):
            raise AttributeError("comparison exists on fast mode's pairs only")
        return self.storage.comparison

    @property
    def region(self) -> tuple | None:
        """Fast mode: the (first, last) multi-indices of the region the defect was localised to."""
        return self.storage.region if isinstance(self.storage, Projections) else None

    # -- the verdict -----------------------------------------------------------------------

    def count(self, status: int | str) -> int:
        """Values (fast mode: probe comparisons) with this status: its name (``"mismatch"``, the README's table)
        or its code in ``status``."""
        if self._counts is None:  # one bincount for every status the text asks about
            codes = self.status.reshape(-1)
            codes = codes.view(np.uint8) if codes.dtype.itemsize == 1 else codes.astype(np.uint8)
            self._counts = np.bincount(codes, minlength=len(STATUS_NAMES))
        return int(self._counts[STATUS_CODES[status] if isinstance(status, str) else status])

    @property
    def statuses(self) -> np.ndarray:
        """Each value's status by name (``"ok"``, ``"mismatch"``, ``"not differentiable here"``, ...), shaped as
        ``status`` (its codes)."""
        return _STATUS_NAMES[self.status]

    @property
    def failed_count(self) -> int:
        return sum(self.count(status) for status in FAILING)

    @property
    def ok(self) -> bool:
        return not self.inconsistent and not self.failed_count and not self.coarse

    @property
    def coarse(self) -> bool:
        """Whether every value passes but the resolution is too coarse for the pass to say much
        (``compare.coarse``): undecidable, not ok.  Made once, as the summaries (``ok`` is read many times)."""
        if self._coarse is None:
            # (dense: its largest element alone resolving the limit, no pass over every element)
            self._coarse = not self.failed_count and not self.storage.decisive(self.rtol) and coarse(
                *self.resolutions, self.rtol)
        return self._coarse

    @property
    def resolutions(self) -> tuple[float, float]:
        """(resolution, the tolerances' own): see ``resolution``."""
        return self.summary()["resolutions"]

    @property
    def resolution(self) -> float:
        """The smallest relative error of this pair's gradient (all of it scaled by 1 + r) that the rule
        flags: min over passing elements (or probes) of allowed / |analytical| (inf for a zero gradient)."""
        return float(self.resolutions[0])

    @property
    def zero_bound(self) -> float | None:
        """Where every passing value of this pair is a zero gradient within the numerics (``compare.zero``, or an
        exact 0): the absolute bound they were judged by, the largest allowance among them; None where some value
        resolves a relative error (and in fast mode)."""
        return None if self.projected or self.failed_count else self.summary()["zero_bound"]

    @property
    def largest_gradient(self) -> float:
        """max |analytical| over the finite values (fast mode: over its probes' values)."""
        return self.summary()["largest_gradient"]

    @property
    def label(self) -> str:
        if self.ok:
            return "ok"
        return "FAIL" if self.inconsistent or self.count(MISMATCH) or self.count(ANALYTICAL_NONFINITE) else "undec."

    @property
    def title(self) -> str:
        forward = " (forward mode)" if self.side == "forward" else ""
        return f"{self.output_name} / {self.input_name}{forward}"

    def __repr__(self) -> str:
        return (f"<PairReport {self.title}: {self.label}, {self.failed_count} of {self.status.size} "
                f"{self.storage.what} failed, max abs error {self.max_abs_error:.2g}>")

    # -- summaries, in one pass over the values ------------------------------------------

    def summary(self) -> dict:
        """Every summary in one pass over the values, made once (the report no longer changes): the
        largest absolute and relative errors, the norms of the relative norm error, the resolutions
        and the worst ``WORST_KEPT`` values (score |a - n| / allowed, ties in index order)."""
        if self._summary is None:
            self._summary = self._scan(WORST_KEPT)
        return self._summary

    def _scan(self, keep: int) -> dict:
        projected = isinstance(self.storage, Projections)
        # max_rel_error's floor atol / rtol is where the element rule switches from absolute to relative, so
        # noise near zero does not read as 100%; a probe's atol scales with its norm, so it has none.
        floor = self.atol / self.rtol if self.rtol > 0 and not projected else 0.0
        # A probe's non-finite value shows in its ratio (inf): its largest error is over the others.
        largest_of = np.fmax.reduce if projected else np.max
        largest, relative, squares, candidates, scores = [], [], np.zeros(3), [], []
        resolved, tolerance, bound, largest_gradient, passed = np.inf, np.inf, 0.0, 0.0, False
        for chunk in self.storage.chunks():
            status, a, n, band = chunk.status, chunk.analytical, chunk.numerical, chunk.band
            assert band is not None
            if not len(status):
                continue
            with np.errstate(invalid="ignore"):
                passing = status == OK
                part = resolution(a, band, allowance(n, self.atol, self.rtol),
                                  passing & ~zero(a, n, band, self.atol, self.rtol))
                bound, passed = max(bound, float(np.max(band, where=passing, initial=0.0))), passed or passing.any()
                largest_gradient = max(largest_gradient, float(np.max(np.abs(a), where=np.isfinite(a), initial=0.0)))
                error = np.where(status == NONDIFFERENTIABLE, 0.0, np.abs(a - n))  # kinks: a is a one-sided value
            resolved, tolerance = min(resolved, part[0]), min(tolerance, part[1])
            largest.append(largest_of(error))
            with np.errstate(invalid="ignore", divide="ignore"):
                if chunk.relative:
                    scale = np.maximum(np.maximum(np.abs(a), np.abs(n)), floor)
                    relative.append(np.max(np.where(scale > 0, error / scale, 0.0)))
                score = error / band
            finite = np.isfinite(n) & np.isfinite(a)
            kept_n, kept_a = n[finite], a[finite].astype(np.float64)
            difference = kept_n - kept_a
            # Sums of squares, not np.dot: BLAS threads cost milliseconds per call on a busy machine.
            squares += (np.sum(difference * difference), np.sum(kept_n * kept_n), np.sum(kept_a * kept_a))
            score = np.nan_to_num(score, nan=np.inf)
            if status.any():  # OK is 0
                score = np.where(status == ANALYTICAL_NONFINITE, np.inf, score)
                # Undecidable (a NaN quotient too: f not finite at an infinite input): after the mismatches.
                score = np.where(status == NUMERICAL_NONFINITE, 1.0, score)
                score = np.where(np.isin(status, (UNRESOLVED, DISCONTINUOUS, UNRESOLVED_KINK, FLAT)),
                                 np.maximum(score, 1.0), score)
                score = np.where(status == NONDIFFERENTIABLE, 0.0, score)  # reported apart, in detail_lines
            best = _top(score, keep)
            candidates.append(best + chunk.offset)
            scores.append(score[best])
        worst = []
        if candidates:
            index, score = np.concatenate(candidates), np.concatenate(scores)
            worst = [int(index[k]) for k in _top(score, keep)]
        if isinstance(self.storage, Projections):  # over its probes' J d vectors, and its shares of the probes
            squares = np.sum(self.storage.comparison.squares, axis=0, dtype=np.float64)
            resolved, tolerance = self.storage.resolutions
        difference, numerical, analytical = np.sqrt(squares)
        return {"max_abs_error": float(largest_of(largest)) if largest else 0.0,
                "max_rel_error": float(np.max(relative)) if relative else 0.0,
                "relative_norm_error": float(difference / (numerical + analytical + 1e-8)),
                "worst": worst, "resolutions": (float(resolved), float(tolerance)),
                "zero_bound": bound if resolved == np.inf and passed else None, "largest_gradient": largest_gradient}

    @property
    def max_abs_error(self) -> float:
        """max |a - n| over the values (0 at kinks, where a is a valid one-sided derivative; fast mode: the
        probes' worst element-wise J d and their projections)."""
        return self.summary()["max_abs_error"]

    @property
    def max_rel_error(self) -> float:
        """max |a - n| / max(|a|, |n|, atol / rtol) over elements (2 for a sign flip); fast mode: over the
        projections u.J.d, without the floor."""
        return self.summary()["max_rel_error"]

    @property
    def relative_norm_error(self) -> float:
        """||n - a|| / (||n|| + ||a|| + 1e-8) over the finite values (fast mode: over the probes' J d)."""
        return self.summary()["relative_norm_error"]

    @property
    def abs_error(self) -> np.ndarray:
        """|a - n| per value; 0 at kinks, where the analytical value is a valid one-sided derivative."""
        status = self.status[:, 1] if self.projected else self.status
        with np.errstate(invalid="ignore"):
            return np.where(status == NONDIFFERENTIABLE, 0.0, np.abs(self.analytical - self.numerical))

    # -- elements ---------------------------------------------------------------------------

    def _element(self, k: int) -> Element:
        assert not isinstance(self.storage, Projections)
        row, col, a, n, band = self.storage.entry(k)
        return Element(_unravel(row, self.output_shape), _unravel(col, self.input_shape), float(a), float(n),
                       float(abs(a - n)), float(band), STATUS_NAMES[int(self.status.reshape(-1)[k])])

    def _key(self, k: int) -> tuple:
        """``one_sided``'s key of the value at flat index k: (row, column), or (k,) over nonzeros."""
        return tuple(int(i) for i in np.unravel_index(k, self.status.shape))

    def _worst_indices(self, count: int) -> list[int]:
        return (self.summary() if count <= WORST_KEPT else self._scan(count))["worst"][:count]

    def worst(self, count: int = 1) -> list[Element]:
        """The elements furthest outside (or closest to the edge of) their tolerance band; fast mode: the
        element its localisation found, if any."""
        if isinstance(self.storage, Projections):
            return [self.storage.found][:count] if self.storage.found is not None else []
        return [self._element(k) for k in self._worst_indices(count)]

    @property
    def worst_element(self) -> Element | None:
        return next(iter(self.worst(1)), None)

    def kinks(self) -> list[tuple[Element, float, float]]:
        """Elements at a kink of f: (element, left derivative, right derivative).  Fast mode names none:
        its probes move every element at once (the probes that crossed kinks are counted in the text)."""
        if self.projected:
            return []
        return [(self._element(int(k)), *self.one_sided.get(self._key(int(k)), (np.nan, np.nan)))
                for k in having(self.status.reshape(-1), NONDIFFERENTIABLE)]

    @property
    def kinked_probes(self) -> int:
        """Fast mode: probes that crossed kinks of f, with the analytical J d between the one-sided derivatives."""
        return int(np.sum(np.any(self.status == NONDIFFERENTIABLE, axis=1))) if self.projected else 0

    @property
    def undecided_probes(self) -> int:
        """Fast mode: probes whose refinement could not decide (kinks, or jumps, that no step resolves)."""
        return int(np.sum(np.any(np.isin(self.status, UNDECIDED), axis=1))) if self.projected else 0

    def diagnose(self) -> Hint | None:
        """``compare.diagnose`` on what the storage samples of its values (fast mode: none, its hint
        comes from the localisation), the share of failing elements taken over all of them."""
        found = self.storage.sample()
        return None if found is None else _diagnose(*found, size=int(self.status.size),
                                                    jump=min(self.jumps.values(), default=None),
                                                    secant=bool(self.secants) and all(self.secants.values()))

    # -- JSON ----------------------------------------------------------------------------------

    def to_dict(self, arrays: bool = False) -> dict:
        """JSON-serialisable summary; ``arrays=True`` adds the values (coloured mode's large pairs: with
        their ``rows`` and ``cols``)."""
        worst: dict | list | None
        if isinstance(self.storage, Projections):
            worst = self.storage.found.to_dict() if self.storage.found is not None else None
        else:
            worst = [e.to_dict() for e in self.worst(3)]
        summary = {
            "output": self.output_name,
            "input": self.input_name,
            "side": self.side,
            "ok": self.ok,
            **self.storage.facts(),
            "max_abs_error": json_number(self.max_abs_error),
            "max_rel_error": json_number(self.max_rel_error),
            "relative_norm_error": json_number(self.relative_norm_error),
            **{key: self.count(status) for key, status in COUNT_KEYS},
            "resolution": json_number(self.resolution),
            "coarse": self.coarse,
            "zero_bound": json_number(self.zero_bound) if self.zero_bound is not None else None,
            "float64_gradient": self.float64_gradient,
            "atol": self.atol,
            "rtol": self.rtol,
            "worst": worst,
            "hint": self.hint,
        }
        if arrays:
            summary.update(self.storage.arrays())
        return summary


def _unravel(flat: int, shape: tuple) -> tuple:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def event_dict(event) -> dict:
    """An event as JSON: ``{"kind": its type's name, **its fields}``, nested events alike."""
    def value(v):
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return event_dict(v)
        if isinstance(v, tuple):
            return [value(x) for x in v]
        return json_number(v) if isinstance(v, float) else v

    return {"kind": type(event).__name__, **{f.name: value(getattr(event, f.name)) for f in dataclasses.fields(event)}}


def having(status: np.ndarray, *codes: int, among: np.ndarray | None = None) -> np.ndarray:
    """Indices of the values whose status is one of ``codes`` (not OK): found among the nonzero
    statuses (OK is 0), so no value-sized boolean temporary is made; only among the indices
    ``among`` (ascending) where given: a superset of those not OK, known without a pass over them all."""
    index = np.flatnonzero(status) if among is None else among[status[among] != OK]
    return index[np.isin(status[index], codes)] if len(index) else index


def _top(score: np.ndarray, count: int) -> np.ndarray:
    """Indices of the ``count`` largest scores, largest first, ties in index order (as
    ``np.argsort(-score, kind="stable")[:count]``) without sorting them all."""
    if len(score) > count:
        kth = np.partition(score, len(score) - count)[len(score) - count]
        above = np.flatnonzero(score > kth)
        ties = np.flatnonzero(score == kth)[: count - len(above)]
        picked = np.sort(np.concatenate([above, ties]))
    else:
        picked = np.arange(len(score))
    return picked[np.argsort(-score[picked], kind="stable")][:count]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a strategy (``full.check_full``, ``fast.check_fast``, ``coloured.check_coloured``) hands to the report."""

    pairs: list[PairReport]
    plan: Any  # a plan.Plan; the plan as the strategy left it (with f's measured noise, when it was needed)
    atol: float
    rtol: float
    kind: str  # what the analytical side was: "reverse", "forward", "supplied", "fast"
    notes: list = dataclasses.field(default_factory=list)
    warnings: list = dataclasses.field(default_factory=list)
    problems: list = dataclasses.field(default_factory=list)  # not gradient verdicts (a violated sparsity pattern)
    # Coloured mode: the reverse-mode gradient is inconsistent with f's sparsity pattern (one text
    # per input); run_check reruns a full check for element verdicts where it fits.
    inconsistent: list = dataclasses.field(default_factory=list)
    path: str | None = None  # the path its evaluations ran on, where not the route's (few evaluations: graph)


@dataclasses.dataclass
class GradientReport:
    """What a check found.  ``bool(report)`` is ``report.ok``.

    ``events`` is what the check learnt on its way that bears on how its verdict reads, as typed facts
    (``fastcheck.report.events``, in order): the mode chosen and why, a path's fallback, the precision and noise
    found, a rerun in full mode, what a model or distribution check held fixed.  ``notes`` is their text, one note
    per event; ``to_dict`` writes both, each event as ``{"kind": ..., **fields}``.  How the work ran (route, chunks,
    kernels, retries, replicas) is logged at DEBUG on the ``fastcheck`` logger.
    """

    pairs: list[PairReport]  # over dense, sparse or projected storage, by mode
    path: str  # the path the evaluations ran on (eager, loop, graph, xla), after any fallback
    mode: str
    seconds: float
    events: tuple = ()  # what the check learnt on its way (see above)
    problems: list[str] = dataclasses.field(default_factory=list)
    title: str = "gradient check"
    # Seconds per stage: plan (structure, determinism), route (probe trace),
    # analytical, numerical (first sweep), refine, fast (projection checks).
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    # True statements about f that do not change the verdict (a wrong forward-mode JVP
    # where the checked reverse-mode gradient is right).
    warnings: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(p.ok for p in self.pairs)

    @property
    def notes(self) -> list[str]:
        """The events as text, one note each (``str(report)`` shows a note said twice once)."""
        return [compose(event) for event in self.events]

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        """One line, what pytest shows for a failing ``assert report``; ``str(report)`` is the full table."""
        return _text.report_line(self)

    @property
    def verdict(self) -> str:
        """"pass", "fail" (a gradient is wrong: a mismatch, a non-finite analytical value, a VJP off the pattern), or
        "undecidable" (no wrong gradient shown, but not every pair passes: f not finite or not deterministic, kinks
        or jumps no step resolves, f not moving, unresolved differences, or a pass too coarse to see a 1% error)."""
        if self.ok:
            return "pass"
        wrong = any(p.count(MISMATCH) or p.count(ANALYTICAL_NONFINITE) or p.inconsistent
                    for p in self.pairs)
        return "fail" if wrong else "undecidable"

    @property
    def max_abs_error(self) -> float:
        return max((p.max_abs_error for p in self.pairs), default=0.0)

    @property
    def max_rel_error(self) -> float:
        return max((p.max_rel_error for p in self.pairs), default=0.0)

    @property
    def failures(self) -> list[PairReport]:
        return [p for p in self.pairs if not p.ok]

    def to_dict(self, arrays: bool = False) -> dict:
        """JSON-serialisable summary; ``arrays=True`` includes the full Jacobians."""
        return {
            "title": self.title,
            "ok": self.ok,
            "verdict": self.verdict,
            "max_abs_error": json_number(self.max_abs_error),
            "max_rel_error": json_number(self.max_rel_error),
            "path": self.path,
            "mode": self.mode,
            "seconds": self.seconds,
            "timings": dict(self.timings),
            "rule": _text.FAST_RULE if self.mode == "fast" else _text.RULE,
            "notes": list(self.notes),
            "events": [event_dict(event) for event in self.events],
            "problems": list(self.problems),
            "warnings": list(self.warnings),
            "pairs": [p.to_dict(arrays) for p in self.pairs],
        }

    def __str__(self) -> str:
        """The report as text (``text.report_text``): failing pairs first, passing ones collapsed by layer."""
        return _text.report_text(self)

    @property
    def tolerance_bound(self) -> list:
        """Passing pairs that could not see a 1% error of their gradient because the tolerances themselves
        are that coarse there (atol against small gradients): decisive by the rule, and said so."""
        return [p for p in self.pairs if p.ok and not p.sparse and not p.storage.decisive(p.rtol)
                and RESOLUTION_RTOLS * p.rtol < p.resolution < np.inf]

    @property
    def zero_gradients(self) -> list:
        """Passing pairs whose gradient is zero within the numerics (``PairReport.zero_bound``): no relative error
        means anything there, and each passes by its absolute bound, which the text states."""
        return [p for p in self.pairs if p.ok and p.zero_bound is not None]
