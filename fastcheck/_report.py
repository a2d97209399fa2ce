"""The result of a check: per-pair verdicts, a readable table and a JSON summary."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator
from typing import Any, ClassVar, NamedTuple

import numpy as np
import tensorflow as tf

from fastcheck import _events as events
from fastcheck._compare import (
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
    coarse,
    decisive_at_largest,
    resolution,
)
from fastcheck._compare import diagnose as _diagnose
from fastcheck._config import MACHINE_EPSILON
from fastcheck._plan import InputSpec, Plan, first_line
from fastcheck._tables import (
    COLLAPSE_PASSING,
    RESOLUTION_RTOLS,
    SCREEN_MARGIN,
    SUMMARY_CHUNK,
    UNDECIDED_DETAILS,
    WORST_KEPT,
)

RULE = "|analytical - numerical| <= atol + rtol * |numerical| + noise (element-wise; both finite)"
FAST_RULE = ("|(J d)_i - numerical_i| <= atol * ||d||_2 + rtol * |numerical_i| + noise_i per output element i of each probe d, "
             "J d from the reverse-mode gradient; projection: |u.VJP.d - u.numerical| <= ||u * allowed||_2")

# How a verdict reads in the text of every report (GradientReport, tfp.BijectorReport, its identities).
VERDICT_LABELS = {"pass": "ok", "fail": "FAIL", "undecidable": "UNDECIDABLE"}

class GradientCheckError(AssertionError):
    """Raised by ``assert_gradients_close`` when a check fails; ``.report`` holds the result."""

    def __init__(self, report: GradientReport):
        super().__init__(str(report))
        self.report = report


@dataclasses.dataclass
class Element:
    """One entry of a Jacobian: d output[output_index] / d input[input_index]."""

    output_index: tuple
    input_index: tuple
    analytical: float
    numerical: float
    abs_error: float
    band: float
    status: str

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v if isinstance(v, str) else _num(v)) for k, v in dataclasses.asdict(self).items()}


# What ``_compare.diagnose`` reads of a pair: (analytical, numerical, status).
Sample = tuple[np.ndarray, np.ndarray, np.ndarray]


class Chunk(NamedTuple):
    """A run of a pair's compared values, in the pair's flat order (``Storage.chunks``)."""

    offset: int  # the run's first value
    status: np.ndarray
    analytical: np.ndarray
    numerical: np.ndarray
    band: np.ndarray | None  # None where not asked for
    relative: bool = True  # whether the run enters max_rel_error (a probe's element-wise J d does not)


@dataclasses.dataclass(eq=False)
class Dense:
    """A pair's whole Jacobian block, [output_size, input_size] arrays (full mode; coloured mode's
    small pairs, zeros outside the pattern)."""

    numerical: np.ndarray
    analytical: np.ndarray
    status: np.ndarray
    band: np.ndarray
    what: ClassVar[str] = "elements"

    def chunks(self, bands: bool = True) -> Iterator[Chunk]:
        """Blocks of whole rows, flattened (a copy of the block only where an array is not contiguous)."""
        if not self.status.size:
            return
        width = self.status.shape[1]
        step = max(1, SUMMARY_CHUNK // width)
        for row in range(0, self.status.shape[0], step):
            status, a, n, band = (x[row : row + step].reshape(-1) for x in (self.status, self.analytical,
                                                                          self.numerical, self.band))
            yield Chunk(row * width, status, a, n, band)

    def entry(self, k: int) -> tuple:
        """(row, column, analytical, numerical, band) of the value at flat index ``k``."""
        row, col = (int(i) for i in np.unravel_index(k, self.status.shape))
        return row, col, self.analytical[row, col], self.numerical[row, col], self.band[row, col]

    def decisive(self, rtol: float) -> bool:
        return decisive_at_largest(self.analytical, self.band, self.status, rtol)

    def sample(self) -> Sample | None:
        """What ``_compare.diagnose`` reads: here the whole block (its transpose test needs it)."""
        return self.analytical, self.numerical, self.status

    def facts(self) -> dict:
        return {"shape": [int(self.status.shape[0]), int(self.status.shape[1])]}

    def arrays(self) -> dict:
        return {"numerical": self.numerical.tolist(), "analytical": self.analytical.tolist()}


class Nonzeros:
    """Coloured mode's large pairs: values at the structural nonzeros ``(rows[k], cols[k])`` of the
    ``jacobian_shape`` block only, 1-D over them.

    Only ``status`` is held (a view of the check's int8 array); values, bands and indices are read
    off the check's compressed arrays (``_coloured._Block``) block by block, and made whole arrays
    only when asked for by name (``numerical``, ``rows`` ..., ``to_dict(arrays=True)``): at 6.4e7
    nonzeros each such array is 0.5 GB.
    """

    what: ClassVar[str] = "nonzeros"

    def __init__(self, block, start: int, stop: int, row_offset: int, jacobian_shape: tuple):
        self.status = block.status[start:stop]
        self.jacobian_shape = jacobian_shape
        self._block, self._start, self._stop, self._offset = block, start, stop, row_offset
        self._whole: tuple | None = None

    def _arrays(self) -> tuple:
        if self._whole is None:
            rows, cols, a, n, band = self._block.materialise(self._start, self._stop)
            self._whole = (rows - self._offset, cols, a, n, band)
        return self._whole

    rows = property(lambda self: self._arrays()[0], doc="Output element (flat) of every nonzero.")
    cols = property(lambda self: self._arrays()[1], doc="Input element (flat) of every nonzero.")
    analytical = property(lambda self: self._arrays()[2])
    numerical = property(lambda self: self._arrays()[3])
    band = property(lambda self: self._arrays()[4])

    def chunks(self, bands: bool = True) -> Iterator[Chunk]:
        for part in self._block.parts(self._start, self._stop):
            values = self._block.values(part, bands=bands)
            at = slice(part.start - self._start, part.stop - self._start)
            yield Chunk(at.start, self.status[at], values[2], values[3], values[4] if bands else None)

    def entry(self, k: int) -> tuple:
        rows, cols, a, n, band = self._block.values(np.array([self._start + k]), bands=True)
        return _first(rows) - self._offset, _first(cols), a[0], n[0], band[0]

    def decisive(self, rtol: float) -> bool:
        return False

    def sample(self) -> Sample | None:
        """The nonzeros that are not OK, plus three whose numerical value is nonzero (what
        ``_compare.diagnose``'s constant-factor test counts): it reads nothing else, except the
        share of failing elements, which the pair takes over all nonzeros."""
        picked, values = [], []
        spare = 3
        for chunk in self._chunks_to_sample():
            keep = chunk.status != OK
            if spare:
                extra = np.flatnonzero(~keep & np.isfinite(chunk.numerical) & (chunk.numerical != 0))[:spare]
                keep[extra] = True
                spare -= len(extra)
            where = np.flatnonzero(keep)
            if len(where):
                picked.append(chunk.status[where])
                values.append((chunk.analytical[where].astype(np.float64), chunk.numerical[where]))
        if not picked:
            return None
        a, n = (np.concatenate([v[k] for v in values]) for k in range(2))
        return a[None, :], n[None, :], np.concatenate(picked)[None, :]

    def _chunks_to_sample(self) -> Iterator[Chunk]:
        """``chunks`` without bands, from the first up to where three nonzero OK values are found, and
        after it those with a status not OK: the chunks ``sample`` reads anything from (a passing
        check of 10^7 elements: one chunk, not every one)."""
        spare = 3
        for part in self._block.parts(self._start, self._stop):
            at = slice(part.start - self._start, part.stop - self._start)
            status = self.status[at]
            if spare or status.any():  # OK is 0
                _, _, a, n = self._block.values(part)
                if spare:
                    spare -= min(spare, int(np.count_nonzero((status == OK) & np.isfinite(n) & (n != 0))))
                yield Chunk(at.start, status, a, n, None)

    def facts(self) -> dict:
        return {"shape": [int(d) for d in self.jacobian_shape], "nonzeros": int(self.status.size)}

    def arrays(self) -> dict:
        return {"rows": self.rows.tolist(), "cols": self.cols.tolist(), "numerical": self.numerical.tolist(),
                "analytical": self.analytical.tolist()}


def _first(index) -> int:
    """The first entry of an index (a slice over a diagonal pattern's nonzeros, or an array)."""
    return int(index.start) if isinstance(index, slice) else int(index[0])


@dataclasses.dataclass(eq=False)
class Projections:
    """Fast mode's k random probes d of one input: per probe its element-wise comparison of J d (the
    worst output element) and its projection u.J.d, the 2k values a pair holds; and what the
    localisation found.  Not Jacobian entries: ``numerical``, ``analytical`` and ``band`` are the
    k projections u.J.d (central differences), (J^T u).d (reverse mode) and their allowance."""

    comparison: Comparison
    # (resolution, the tolerance's own): the smallest relative error of this input's gradient its
    # probes flag (``_compare.resolution`` over its shares of the probes).
    resolutions: tuple = (math.inf, math.inf)
    region: tuple | None = None  # (first, last) multi-indices of the localised region
    found: Element | None = None  # the element localisation found in the region, if any
    found_by: str = "forward"  # the comparison it comes from: "forward" (element-wise J d) or "reverse" (u.J.d)
    what: ClassVar[str] = "probe comparisons"
    status: np.ndarray = dataclasses.field(init=False)

    def __post_init__(self):
        c = self.comparison
        kinds = c.kinds
        # [k, 2] status of each probe's element-wise and projection comparison (``_compare`` codes).
        self.status = np.stack([np.where(c.forward_ratio > 1, kinds, OK), np.where(c.reverse_ratio > 1, kinds, OK)],
                               axis=1)

    numerical = property(lambda self: self.comparison.reverse[:, 1], doc="[k] the numerical projections u.J.d.")
    analytical = property(lambda self: self.comparison.reverse[:, 0], doc="[k] the reverse-mode projections (J^T u).d.")
    band = property(lambda self: self.comparison.reverse[:, 2], doc="[k] the projections' allowances.")

    def chunks(self, bands: bool = True) -> Iterator[Chunk]:
        c = self.comparison
        yield Chunk(0, self.status[:, 0], c.forward_worst[:, 1], c.forward_worst[:, 2], c.forward_worst[:, 3], False)
        yield Chunk(len(c.reverse), self.status[:, 1], c.reverse[:, 0], c.reverse[:, 1], c.reverse[:, 2])

    def decisive(self, rtol: float) -> bool:
        return False

    def sample(self) -> Sample | None:
        return None  # a probe moves every element at once: its hint comes from the localisation

    def facts(self) -> dict:
        c = self.comparison
        return {"probes": int(len(c.reverse_ratio)), "forward_ratio": [_num(v) for v in c.forward_ratio],
                "reverse_ratio": [_num(v) for v in c.reverse_ratio],
                "region": [list(self.region[0]), list(self.region[1])] if self.region else None}

    def arrays(self) -> dict:
        return {}


Storage = Dense | Nonzeros | Projections

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
    hint: str | None = None
    # (row, column) -> (left, right) one-sided derivatives, for elements at a kink
    one_sided: dict = dataclasses.field(default_factory=dict)
    # Which autodiff side ``analytical`` holds: "reverse" (VJPs, what training uses),
    # "forward" (JVPs), or "supplied" (the user's gradients).
    side: str = "reverse"
    # Coloured mode: the reverse-mode gradient failed the dense cotangent probe (a report problem
    # says where), whatever its values at the pattern's nonzeros.
    inconsistent: bool = False
    # Judged through the gradient's float64 twin (the same gradient code at the float64 point,
    # ``_full._twin``, ``_fast._twinned``): its own tolerances could not see a 1% error.
    float64_gradient: bool = False
    _summary: dict | None = dataclasses.field(default=None, init=False, repr=False)
    _counts: np.ndarray | None = dataclasses.field(default=None, init=False, repr=False)

    # -- the values, from the storage ----------------------------------------------------

    @property
    def numerical(self) -> np.ndarray:
        return self.storage.numerical

    @property
    def analytical(self) -> np.ndarray:
        return self.storage.analytical

    @property
    def band(self) -> np.ndarray:
        return self.storage.band

    @property
    def status(self) -> np.ndarray:
        """The ``_compare`` status of each value (fast mode: [k, 2], each probe's J d and u.J.d)."""
        return self.storage.status

    @property
    def sparse(self) -> bool:
        """Values over the structural nonzeros only (coloured mode's large pairs)."""
        return isinstance(self.storage, Nonzeros)

    @property
    def projected(self) -> bool:
        """Judged by random projections (fast mode), not element by element."""
        return isinstance(self.storage, Projections)

    @property
    def rows(self) -> np.ndarray:
        """Coloured mode's large pairs: the output element (flat) of every nonzero."""
        return self._nonzeros().rows

    @property
    def cols(self) -> np.ndarray:
        """Coloured mode's large pairs: the input element (flat) of every nonzero."""
        return self._nonzeros().cols

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

    def count(self, status: int) -> int:
        """Values (fast mode: probe comparisons) with this status."""
        if self._counts is None:  # one bincount for every status the text asks about
            codes = self.status.reshape(-1)
            codes = codes.view(np.uint8) if codes.dtype.itemsize == 1 else codes.astype(np.uint8)
            self._counts = np.bincount(codes, minlength=len(STATUS_NAMES))
        return int(self._counts[status])

    @property
    def failed_count(self) -> int:
        return sum(self.count(status) for status in FAILING)

    @property
    def ok(self) -> bool:
        return not self.inconsistent and not self.failed_count and not self.coarse

    @property
    def coarse(self) -> bool:
        """Whether every value passes but the resolution is too coarse for the pass to say much
        (``_compare.coarse``): undecidable, not ok."""
        if self.failed_count or self.storage.decisive(self.rtol):
            return False  # (dense: its largest element alone resolves the limit, no pass over every element)
        resolved, tolerance = self.resolutions
        return coarse(resolved, tolerance, self.rtol)

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
        resolved, tolerance = np.inf, np.inf
        for chunk in self.storage.chunks():
            status, a, n, band = chunk.status, chunk.analytical, chunk.numerical, chunk.band
            assert band is not None
            if not len(status):
                continue
            with np.errstate(invalid="ignore"):
                part = resolution(a, band, self.atol + self.rtol * np.abs(n), status == OK)
            resolved, tolerance = min(resolved, part[0]), min(tolerance, part[1])
            with np.errstate(invalid="ignore"):
                error = np.where(status == NONDIFFERENTIABLE, 0.0, np.abs(a - n))  # kinks: a is a one-sided value
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
                score = np.where(np.isin(status, (ANALYTICAL_NONFINITE, NUMERICAL_NONFINITE)), np.inf, score)
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
            squares = np.asarray(self.storage.comparison.squares, dtype=np.float64)
            resolved, tolerance = self.storage.resolutions
        difference, numerical, analytical = np.sqrt(squares)
        return {"max_abs_error": float(largest_of(largest)) if largest else 0.0,
                "max_rel_error": float(np.max(relative)) if relative else 0.0,
                "relative_norm_error": float(difference / (numerical + analytical + 1e-8)),
                "worst": worst, "resolutions": (float(resolved), float(tolerance))}

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
        found = self.worst(1)
        return found[0] if found else None

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

    def diagnose(self) -> str | None:
        """``_compare.diagnose`` on what the storage samples of its values (fast mode: none, its hint
        comes from the localisation), the share of failing elements taken over all of them."""
        found = self.storage.sample()
        return None if found is None else _diagnose(*found, size=int(self.status.size))

    # -- text and JSON ---------------------------------------------------------------------

    def detail_lines(self) -> list[str]:
        """Kinks (or probes along kinks) found, and for a failing pair what fails, where, and the hint."""
        lines = self._probe_lines() if self.projected else self._kink_lines()
        if self.ok:
            return lines
        if self.coarse:
            return [*lines, coarse_line(self.title, self.resolutions, self.rtol, fast=self.projected)]
        lines += self._localised_lines() if self.projected else self._failing_lines()
        if self.float64_gradient:
            lines.append(f"    {TWIN_PROBES_LINE if self.projected else TWIN_LINE}")
        if self.hint:
            lines.append(f"    hint: {self.hint}")
        return lines

    def _kink_lines(self) -> list[str]:
        lines = []
        kinks = self.kinks()
        for e, left, right in kinks[:3]:
            lines.append(
                f"  not differentiable at d {element_name(self.output_name, e.output_index)} / d {element_name(self.input_name, e.input_index)}: "
                f"left derivative={left:.8g}, right derivative={right:.8g}, analytical={e.analytical:.8g} "
                "(the steps cross a kink of f at or near the point: both one-sided derivatives settled, and the "
                "analytical value is one of them or between them, within their uncertainty)"
            )
        if len(kinks) > 3:
            lines.append(f"  ... and {len(kinks) - 3} more elements at kinks")
        return lines

    def _failing_lines(self) -> list[str]:
        counts = [(self.count(MISMATCH), "mismatched"), (self.count(ANALYTICAL_NONFINITE), "analytical non-finite"),
                  (self.count(NUMERICAL_NONFINITE), "numerical non-finite"), (self.count(UNRESOLVED), "unresolved"),
                  (self.count(DISCONTINUOUS), "at a jump of f"), (self.count(UNRESOLVED_KINK), "at kinks no step resolves"),
                  (self.count(FLAT), "where f does not move")]
        lines = [f"  {self.output_name} / {self.input_name}: "
                 + ", ".join(f"{count} {what}" for count, what in counts if count or what == "mismatched")
                 + f" (atol={self.atol:g}, rtol={self.rtol:g})"]
        for k in self._worst_indices(3):
            e = self._element(k)
            if e.status == "ok":
                break
            sides = ""
            if e.status == STATUS_NAMES[UNRESOLVED_KINK]:
                found = self.one_sided.get(self._key(k))
                sides = (f", one-sided derivatives {found[0]:.8g} and {found[1]:.8g}" if found is not None
                         else ", the one-sided quotients never settle")
            lines.append(
                f"    d {element_name(self.output_name, e.output_index)} / d {element_name(self.input_name, e.input_index)}: "
                f"analytical={e.analytical:.8g} numerical={e.numerical:.8g} |diff|={e.abs_error:.3g} "
                f"allowed={e.band:.3g} ({e.status}{sides})"
            )
        return lines

    def _probe_lines(self) -> list[str]:
        c = self.comparison
        lines = [f"  {self.input_name}: {len(c.reverse_ratio)} random probes; worst element-wise |J d - numerical| / allowed = "
                 f"{np.max(c.forward_ratio):.3g}, worst reverse |u.VJP.d - u.numerical| / allowed = {np.max(c.reverse_ratio):.3g}"]
        kinked, undecided = self.kinked_probes, self.undecided_probes
        if kinked or undecided:
            found = sorted({STATUS_NAMES[int(v)] for v in self.status[np.isin(self.status, UNDECIDED)]})
            lines.append(f"    probes along kinks of f: {kinked} with J d between the one-sided derivatives (pass), "
                         f"{undecided} undecidable ({', '.join(found) or 'none'}; steps down to h/4**12 tried)")
        return lines

    def _localised_lines(self) -> list[str]:
        assert isinstance(self.storage, Projections)
        lines = []
        bad_sides = np.isin(self.status, (MISMATCH,)).any(axis=0)
        sides = [name for name, bad in zip(("element-wise J d", "projection u.VJP.d"), [bool(b) for b in np.atleast_1d(bad_sides)]) if bad]
        if sides:
            lines.append(f"    failing side(s): {', '.join(sides)}")
        region, e = self.storage.region, self.storage.found
        if region is not None:
            what = "the probes' disagreement" if e is not None and e.status == "ok" else "defect"
            lines.append(f"    {what} localised to {self.input_name}[{region[0]} .. {region[1]}] (flattened-order slab)")
        if e is not None:
            forward = self.storage.found_by == "forward"
            of = f"output[{', '.join(map(str, e.output_index))}]" if forward else "(u . output)"
            lines.append(f"    worst element found ({'element-wise J d' if forward else 'projection u.J.d'}): d {of} / d {self.input_name}"
                         f"[{', '.join(map(str, e.input_index))}]: analytical={e.analytical:.8g} numerical={e.numerical:.8g} "
                         f"|diff|={e.abs_error:.3g} allowed={e.band:.3g}")
        return lines

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
            "max_abs_error": _num(self.max_abs_error),
            "max_rel_error": _num(self.max_rel_error),
            "relative_norm_error": _num(self.relative_norm_error),
            **{key: self.count(status) for key, status in COUNT_KEYS},
            "resolution": _num(self.resolution),
            "coarse": self.coarse,
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


def having(status: np.ndarray, *codes: int, among: np.ndarray | None = None) -> np.ndarray:
    """Indices of the values whose status is one of ``codes`` (not OK): found among the nonzero
    statuses (OK is 0), so no value-sized boolean temporary is made; only among the indices
    ``among`` (ascending) where given: a superset of those not OK, known without a pass over them all."""
    index = np.flatnonzero(status) if among is None else among[status[among] != OK]
    return index[np.isin(status[index], codes)]


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


def _num(value):
    """A number for JSON: NaN and infinities (which JSON lacks) as None."""
    value = float(value)
    return value if math.isfinite(value) else None


VACUOUS_WARNING = (
    "f's output does not depend on any checked input: every numerical and analytical derivative is exactly 0, so "
    "this check shows nothing about a gradient. A likely cause: f reads variables by closure (e.g. lambda *v: "
    "model.training_loss()) instead of from its arguments; compute f from the arguments it is given, or use "
    "check_model(model, loss) to check a model's variables.")


def vacuous_warnings(pairs: list) -> list[str]:
    """``[VACUOUS_WARNING]`` when no pair's derivatives, either side, has a nonzero entry."""
    # A coloured pair's arrays are read off its compressed storage only on request (0.5 GB each at 6.4e7 nonzeros).
    dense = [p for p in pairs if not p.sparse]
    if not pairs or len(dense) != len(pairs):
        return []
    for pair in dense:
        # ndarray.any(): nonzero entries (NaN included) without an [m, n] temporary
        if np.size(pair.numerical) == 0 or np.asarray(pair.numerical).any() or np.asarray(pair.analytical).any():
            return []
    return [VACUOUS_WARNING]


def coarse_line(title: str, resolutions: tuple[float, float], rtol: float, fast: bool) -> str:
    """Why a pair whose every element (or probe) passes is undecidable: its resolution."""
    resolved, tolerance = resolutions
    where = ("no probe resolves" if fast else "no element resolves")
    fix = ("more probes (probes=...) or mode='full'" if fast else "a float64 numerical side (precision='float64'; "
           "check_model: a model its float64 copy can stand in for)")
    return (f"  {title}: every {'probe' if fast else 'element'} passes, but {where} a relative error of its gradient "
            f"below {resolved:.3g} (the tolerances alone would resolve {tolerance:.3g}; the limit is "
            f"{RESOLUTION_RTOLS:g} x rtol = {RESOLUTION_RTOLS * rtol:.3g}): the numerical side's error swamps the "
            f"allowance, and a gradient off by less than {resolved:.3g} of itself would pass unseen; undecidable, not "
            f"ok. Try {fix}.")


def element_name(name: str, index: tuple) -> str:
    return f"{name}[{', '.join(map(str, index))}]" if index else name


@dataclasses.dataclass
class Comparison:
    """Per-probe summaries of the forward and reverse comparisons (ratios > 1 fail)."""

    forward_ratio: np.ndarray  # [k] worst |JVP_i - numerical_i| / allowed_i over outputs
    reverse_ratio: np.ndarray  # [k] |u.VJP.d - u.numerical| / allowed
    forward_worst: np.ndarray  # [k, 4]: output row, analytical, numerical, allowed at the worst element
    reverse: np.ndarray  # [k, 4]: analytical, numerical, allowed, allowed by the tolerances alone
    squares: np.ndarray  # [3]: sum ||n - a||^2, ||n||^2, ||a||^2 over probes
    # [k] the status a ratio > 1 of each probe stands for: MISMATCH, or what refinement found
    # along it (NONDIFFERENTIABLE: kinks, analytical between the one-sided derivatives;
    # UNRESOLVED_KINK, UNRESOLVED, DISCONTINUOUS: undecidable).  None: all MISMATCH.
    kind: np.ndarray | None = None

    @staticmethod
    def join(parts: list) -> Comparison:
        joined = {f: np.concatenate([getattr(p, f) for p in parts])
                  for f in ("forward_ratio", "reverse_ratio", "forward_worst", "reverse")}
        kind = np.concatenate([p.kinds for p in parts])
        return Comparison(**joined, squares=np.sum([p.squares for p in parts], axis=0), kind=kind)

    @property
    def kinds(self) -> np.ndarray:
        return np.full(len(self.forward_ratio), MISMATCH) if self.kind is None else np.asarray(self.kind)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a strategy (``_full.check_full``, ``_fast.check_fast``, ``_coloured.check_coloured``) hands to the report."""

    pairs: list[PairReport]
    plan: Any  # a _plan.Plan; the plan as the strategy left it (with f's measured noise, when it was needed)
    atol: float
    rtol: float
    kind: str  # what the analytical side was: "reverse", "forward", "supplied", "fast"
    notes: list = dataclasses.field(default_factory=list)
    warnings: list = dataclasses.field(default_factory=list)
    problems: list = dataclasses.field(default_factory=list)  # not gradient verdicts (a violated sparsity pattern)
    # Coloured mode: the reverse-mode gradient is inconsistent with f's sparsity pattern (one text
    # per input); run_check reruns a full check for element verdicts where it fits.
    inconsistent: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class GradientReport:
    """What a check found.  ``bool(report)`` is ``report.ok``.

    ``events`` is what the check learnt on its way, as typed facts (``fastcheck._events``, in order):
    fallbacks and out-of-memory retries, chunking, the mode and path chosen and why, the precision
    and noise found, a rerun in full mode, what a model or distribution check held fixed.  ``notes``
    is their text, one note per event; ``to_dict`` writes both, each event as ``{"kind": ..., **fields}``.
    """

    pairs: list[PairReport]  # over dense, sparse or projected storage, by mode
    path: str
    mode: str
    seconds: float
    # What the check learnt on its way (``fastcheck._events``: fallbacks, chunking, the mode and path chosen
    # and why, the precision and noise found), in order; ``notes`` is their text.
    events: tuple = ()
    problems: list[str] = dataclasses.field(default_factory=list)
    title: str = "gradient check"
    # Seconds per stage: plan (structure, determinism), route (probe trace),
    # analytical, numerical (first sweep), refine, fast (projection checks).
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    # True statements about f that do not change the verdict (a wrong forward-mode JVP
    # where the checked reverse-mode gradient is right).
    warnings: list[str] = dataclasses.field(default_factory=list)
    # Routing's costs after this check (``_calibration.Calibration``): what it received, and what it learnt;
    # pass it as ``calibration=`` to a later check.
    calibration: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return not self.problems and all(p.ok for p in self.pairs)

    @property
    def notes(self) -> list[str]:
        """The events as text, one note each (``str(report)`` merges those about many inputs)."""
        return [compose(event) for event in self.events]

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        """One line, what pytest shows for a failing ``assert report``; ``str(report)`` is the full table."""
        verdict = VERDICT_LABELS[self.verdict]
        wrong = sum(p.label == "FAIL" for p in self.failures)
        undecided = len(self.failures) - wrong
        summary = f"{wrong} of {len(self.pairs)} pairs failed" + (f", {undecided} undecidable" if undecided else "")
        if self.failures:
            pair = self.failures[0]
            e = pair.worst_element
            if e is None:
                summary += f", worst {pair.title} abs error {pair.max_abs_error:.2g}"
            else:
                summary += (f", worst d {element_name(pair.output_name, e.output_index)} / d {element_name(pair.input_name, e.input_index)} "
                            f"abs error {e.abs_error:.2g} ({e.status})")
        elif self.problems:
            summary += f", {self.problems[0].splitlines()[0][:100]}"
        else:
            summary += f", max abs error {self.max_abs_error:.2g}"
        return f"<GradientReport {verdict}: {summary} [{self.mode} mode]>"

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
            "max_abs_error": _num(self.max_abs_error),
            "max_rel_error": _num(self.max_rel_error),
            "path": self.path,
            "mode": self.mode,
            "seconds": self.seconds,
            "timings": dict(self.timings),
            "rule": FAST_RULE if self.mode == "fast" else RULE,
            "notes": list(self.notes),
            "events": [event_dict(event) for event in self.events],
            "problems": list(self.problems),
            "warnings": list(self.warnings),
            "pairs": [p.to_dict(arrays) for p in self.pairs],
        }

    def __str__(self) -> str:
        """The report as text: failing pairs first, passing ones collapsed to a count by layer when many.

        Past ``COLLAPSE_PASSING`` passing pairs, they are one line (their count,
        largest errors and layer groups) and their kinks one summary; notes that
        differ only in an input's name and numbers are one line.  ``to_dict`` keeps
        every pair and note.
        """
        verdict = VERDICT_LABELS[self.verdict]
        wrong = sum(p.label == "FAIL" for p in self.failures)
        undecided = len(self.failures) - wrong
        lines = [
            f"fastcheck {self.title}: {verdict} -- {wrong} of {len(self.pairs)} pairs failed"
            f"{f', {undecided} undecidable' if undecided else ''}, "
            f"max abs error {self.max_abs_error:.3g}, max rel error {self.max_rel_error:.3g} "
            f"[{self.path}, {self.mode} mode, {self.seconds:.2f} s]"
        ]
        for problem in self.problems:
            lines.append(f"  PROBLEM: {problem}")
        for warning in self.warnings:
            lines.append(f"  WARNING: {warning}")
        # Wrong gradients first, then undecidable pairs, then passing ones; stable within each.
        failing = sorted(self.failures, key=lambda p: 0 if p.label == "FAIL" else 1)
        passing = [p for p in self.pairs if p.ok]
        collapsed = len(passing) > COLLAPSE_PASSING
        shown = failing + ([] if collapsed else passing)
        if shown:
            width = max(len(p.title) for p in shown)
            lines.append(f"  {'pair'.ljust(width)}  status  {'max abs':>9}  {'max rel':>9}  {'rel norm':>9}  failed")
            for p in shown:
                lines.append(
                    f"  {p.title.ljust(width)}  {p.label:6}  "
                    f"{p.max_abs_error:9.3g}  {p.max_rel_error:9.3g}  {p.relative_norm_error:9.3g}  "
                    f"{p.failed_count}/{p.status.size}"
                )
        if collapsed:
            lines.append(f"  ok: {len(passing)} {'more ' if failing else ''}pairs, max abs error "
                         f"{max(p.max_abs_error for p in passing):.3g}, max rel error "
                         f"{max(p.max_rel_error for p in passing):.3g}; by layer"
                         f"{_layer_groups([p.input_name for p in passing])}")
        # Undecidable fast-mode pairs say the same thing: past a few, one line for all of them.
        projections = [p for p in failing if p.projected and p.label != "FAIL"]
        probes_undecided = [p for p in projections if not p.coarse and p.undecided_probes]  # kinks no step resolves
        coarse_pairs = [p for p in projections if p.coarse]  # every probe passes, too coarse to decide
        summarised = len(probes_undecided) > UNDECIDED_DETAILS
        coarse_summarised = len(coarse_pairs) > UNDECIDED_DETAILS
        for p in failing:
            if not (summarised and p in probes_undecided) and not (coarse_summarised and p in coarse_pairs):
                lines += p.detail_lines()
        if summarised:
            lines.append(f"  undecidable: {sum(p.undecided_probes for p in probes_undecided)} probes over "
                         f"{len(probes_undecided)} pairs cross kinks of f that no step down to h/4**12 resolves"
                         f"{_layer_groups([p.input_name for p in probes_undecided])}")
        if coarse_summarised:
            resolutions = [p.resolution for p in coarse_pairs]
            lines.append(f"  undecidable: {len(coarse_pairs)} pairs pass every probe but resolve no relative error of "
                         f"their gradient below {min(resolutions):.3g} .. {max(resolutions):.3g} (coarser than "
                         f"{RESOLUTION_RTOLS:g} rtols and than the tolerances alone)"
                         f"{_layer_groups([p.input_name for p in coarse_pairs])}")
        if probes_undecided:
            lines.append(f"  hint: {UNDECIDED_PROBES_HINT}")
        if not collapsed:
            for p in passing:
                lines += p.detail_lines()
        else:
            kinked_probes = [p for p in passing if p.kinked_probes]
            if kinked_probes:
                lines.append(f"  {sum(p.kinked_probes for p in kinked_probes)} probes in {len(kinked_probes)} passing "
                             "pairs crossed kinks of f, with the analytical J d between the one-sided derivatives")
            with_kinks = [p for p in passing if not p.projected and p.count(NONDIFFERENTIABLE)]
            if with_kinks:
                example = next((line.strip() for p in with_kinks for line in p.detail_lines()
                                if line.strip().startswith("not differentiable")), None)
                lines.append(f"  {sum(p.count(NONDIFFERENTIABLE) for p in with_kinks)} elements in {len(with_kinks)} "
                             f"passing pairs sit at kinks of f, with the analytical value between the one-sided "
                             f"derivatives{'; e.g. ' + example if example else ''}")
        for note in composed_notes(self.events, [p.input_name for p in self.pairs]):
            lines.append(f"  note: {note}")
        twinned = [p for p in self.pairs if p.float64_gradient]
        if twinned:
            lines.append(f"  note: {len(twinned)} pair(s) whose tolerances could not see a 1% error of their gradient "
                         f"were judged through its float64 twin: {TWIN_RULE}{_layer_groups([p.input_name for p in twinned])}")
        tolerance_bound = self.tolerance_bound
        if tolerance_bound:
            low, high = min(p.resolution for p in tolerance_bound), max(p.resolution for p in tolerance_bound)
            span = f"{low:.3g}" if low == high else f"{low:.3g} .. {high:.3g}"
            lines.append(f"  note: {len(tolerance_bound)} passing pair(s) resolve no relative error of their gradient "
                         f"below {span}: their gradients are small against "
                         f"atol, so a defect below atol passes by the tolerances themselves (not the numerics); pass "
                         f"a smaller atol to judge them relatively{_layer_groups([p.input_name for p in tolerance_bound])}")
        lines.append(f"  rule: {FAST_RULE if self.mode == 'fast' else RULE}")
        return "\n".join(lines)

    @property
    def tolerance_bound(self) -> list:
        """Passing pairs that could not see a 1% error of their gradient because the tolerances themselves
        are that coarse there (atol against small gradients): decisive by the rule, and said so."""
        found = []
        for p in self.pairs:
            if not p.ok or p.sparse or p.storage.decisive(p.rtol):
                continue
            if p.resolution > RESOLUTION_RTOLS * p.rtol:
                found.append(p)
        return found


TWIN_RULE = ("the same gradient code run at the float64 point (on the model's float64 copy, or f given float64 "
             "values), judged by float64's rule against the same numerical derivative; each element is then allowed "
             "float64's allowance plus |gradient - its float64 twin|, the gradient's own rounding measured instead "
             "of float32's atol (pass atol= to judge by your tolerances alone)")
TWIN_LINE = ("judged through the float64 twin of the gradient: its allowance is float64's rule plus the measured "
             "|gradient - float64 gradient|, as float32's atol could not resolve a 1% error here")
TWIN_PROBES_LINE = ("probes compared through the float64 twin of the gradient (the same gradient code at the float64 "
                    "point, within float32's tolerance of the gradient) under float64's rule, as float32's atol could "
                    "not resolve a 1% error here")
UNDECIDED_PROBES_HINT = (
    "an undecidable probe crosses kinks of f (ReLU-like activations) closer to the point than any step resolves, "
    "as in a freshly initialised deep network whose activations have shrunk to ~1e-11; no gradient was found wrong "
    "along it. Check a trained or calibrated model (batch normalization statistics from data), or the named "
    "inputs with mode='full', which judges each element on its own.")


def _layer_groups(names: list[str]) -> str:
    """Names grouped by layer family, in order: ``": block_13* (9), ..."`` for block_13_expand/kernel, ...

    A variable path's layer is everything before its last ``/``; its family is the
    layer's last segment up to its first token with a digit (``block_13`` of
    ``block_13_depthwise_BN``), or the whole layer.  Families of one variable show as
    their variable's name, larger ones as ``family* (count)``; a leading path every
    name shares (a Sequential model's name) is said once.
    """
    shared = ""
    while names and all("/" in n[len(shared):] for n in names):
        head = names[0][len(shared):].split("/")[0] + "/"
        if not all(n[len(shared):].startswith(head) for n in names):
            break
        shared += head
    families: dict[str, list[str]] = {}
    for name in (n[len(shared):] for n in names):
        layer, _, _ = name.rpartition("/")
        head, _, last = layer.rpartition("/")
        tokens = last.split("_")
        cut = next((i for i, token in enumerate(tokens) if any(c.isdigit() for c in token)), len(tokens) - 1)
        family = (head + "/" if head else "") + "_".join(tokens[: cut + 1]) if layer else name
        families.setdefault(family, []).append(name)
    groups = [members[0] if len(members) == 1 else f"{family}* ({len(members)})" for family, members in families.items()]
    return f"{f' (in {shared})' if shared else ''}: {', '.join(groups)}"


class _Span:
    """The values of one numeric field over a merged group of events: formats as the value where they agree,
    else as ``low to high`` (each as its own format gives it, then ``:g``)."""

    def __init__(self, values: list):
        self.low, self.high = min(values), max(values)

    def __format__(self, spec: str) -> str:
        if self.low == self.high:
            return format(self.low, spec)
        return f"{float(format(self.low, spec)):g} to {float(format(self.high, spec)):g}"


def _subject(event) -> str | None:
    """The input (or mode) an event is about, said before its text."""
    return getattr(event, events.SUBJECT, None) or getattr(event, "subject", None)


def _numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def composed_notes(found, names: list[str]) -> list[str]:
    """The notes of ``found`` (events) in order, the same event about several inputs merged into one.

    Events of one kind that differ only in the input they are about and their numbers become one
    note: ``"150 inputs (conv/kernel, conv/bias, ... ): chunked to 32 perturbations per call (1 to
    40 calls) ..."``, numbers that vary shown as their range.  Other notes are kept once each.
    """
    known = set(names)
    groups: dict = {}
    for event in found:
        subject = _subject(event)
        if subject not in known:
            groups.setdefault(("text", compose(event)), [event])
            continue
        fields = dataclasses.fields(event)
        key = (type(event), *(getattr(event, f.name) for f in fields
                              if f.name not in (events.SUBJECT, "subject") and not _numeric(getattr(event, f.name))))
        groups.setdefault(key, []).append(event)
    result = []
    for members in groups.values():
        first = members[0]
        if len(members) == 1:
            result.append(compose(first))
            continue
        spans = {f.name: _Span([getattr(m, f.name) for m in members])
                 for f in dataclasses.fields(first) if _numeric(getattr(first, f.name))}
        subjects = [str(_subject(m)) for m in members]
        shown = ", ".join(subjects[:3]) + (", ..." if len(subjects) > 3 else "")
        result.append(f"{len(subjects)} inputs ({shown}): {_said(first, spans)}")
    return result


def event_dict(event) -> dict:
    """An event as JSON: ``{"kind": its type's name, **its fields}``, nested events alike."""
    def value(v):
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return event_dict(v)
        if isinstance(v, tuple):
            return [value(x) for x in v]
        return _num(v) if isinstance(v, float) else v

    return {"kind": type(event).__name__, **{f.name: value(getattr(event, f.name)) for f in dataclasses.fields(event)}}


def _screened_text(block) -> str:
    """How coloured mode's device screen shared a block's verdicts with numpy (empty where it did not run)."""
    if not block.cleared:
        return ""
    rest = block.nonzeros - block.cleared
    return (f" ({'all' if not rest else block.cleared} passed by the element rule with a {SCREEN_MARGIN:g} margin in "
            "one fused XLA pass" + (f", the other {rest} judged in numpy)" if rest else ")"))


def compose(event) -> str:
    """One event as the report's note."""
    subject = _subject(event)
    return f"{subject}: {_said(event)}" if subject is not None else _said(event)


def _said(event, spans: dict | None = None) -> str:
    """What ``event`` says, after its subject; ``spans``: numeric fields as ranges over a merged group."""
    e = dataclasses.replace(event, **spans) if spans else event
    if isinstance(e, events.OutOfMemory):
        return f"out of memory at {e.chunk} {e.unit} per call; retried with {e.retried}"
    if isinstance(e, events.FellBack):
        return f"{e.path} failed for {e.what} ({e.error}); fell back to {e.following}"
    if isinstance(e, events.Chunked):
        return f"chunked to {e.chunk} perturbations per call ({e.calls} calls) {_chunk_reason(e.why)}"
    if isinstance(e, events.JointKernelDropped):
        return ("numerical differences: with every checked input batched at once, vectorized_map converts some "
                "op of f with a while_loop; one kernel per input instead")
    if isinstance(e, events.CallNoise):
        return (f"output{e.output} differs between two calls at the same point by up to {e.difference:.3g} "
                "(not bitwise deterministic): counted as noise of the numerical side")
    if isinstance(e, events.NumericalSide):
        if e.upcast:
            return "numerical side evaluated in float64 (precision='auto')"
        return f"numerical side evaluated in native precision: {native_reason(e)}"
    if isinstance(e, events.PrecisionFound):
        return (f"{_precision_why(e.why)}: the analytical side is judged with {e.precision} tolerances "
                f"atol={e.atol:g}, rtol={e.rtol:g}{' (as given)' if e.given else ''}")
    if isinstance(e, events.NoiseMeasured):
        return (f"f's evaluations carry relative noise {e.relative:.2g} (measured; {e.dtype} rounds at "
                f"{e.epsilon:.2g}): noise allowances follow it, and columns it swamps are re-estimated at larger steps")
    if isinstance(e, events.ModeChosen):
        return f"mode: {e.mode} ({mode_reasons(e.why)})"
    if isinstance(e, events.PathChosen):
        return (f"path: {e.path} ({route_reason(e.reason)}"
                f"{'; routed, before the mode was chosen, for a full check' if e.routed_for_full else ''})")
    if isinstance(e, events.Inconsistent):
        return f"coloured mode: {e.found}"
    if isinstance(e, events.NothingToCheck):
        empty = "f's outputs have" if e.outputs else "the checked inputs have"
        return (f"nothing to check: {empty} no elements, so the Jacobian has no entries "
                f"({e.m} output x {e.n} input elements); the check passes vacuously")
    if isinstance(e, events.EmptyPart):
        return f"nothing to check for {e.name}: it has no elements (its pairs' Jacobians are empty)"
    if isinstance(e, events.ForwardNotChecked):
        return _FORWARD_NOT_CHECKED[e.reason].format(evaluations=e.evaluations)
    if isinstance(e, events.ForwardProbe):
        return _FORWARD_PROBE[e.result].format(directions=e.directions, error=e.error)
    if isinstance(e, events.FastSummary):
        span = (f"spanning all {e.inputs} checked inputs" if e.groups == 1 else
                f"for each of {e.groups} groups of similar-sized inputs ({e.inputs} checked inputs)")
        return (f"fast mode: {e.probes} random probes {span}, {e.elements} elements: one VJP and {e.evaluations} "
                "evaluations of f" + (f"; failing probes were localised by bisection over the inputs, then within "
                                      f"{', '.join(e.localised)}" if e.localised else ""))
    if isinstance(e, events.FastForwardOnly):
        return (f"fast mode: the reverse-mode gradient cannot be differentiated once more ({e.error}); the "
                "element-wise comparison uses forward-mode JVPs, which do not see tf.custom_gradient (the projection "
                "u.J.d still checks the reverse-mode gradient)")
    if isinstance(e, events.ColouredSummary):
        text = (f"coloured mode: sparsity pattern {e.source}; "
                + "; ".join(f"{b.input}: {b.nonzeros} structural nonzeros of {b.rows} x {b.columns}, "
                            f"{_counted(b.colours, 'column colour')}"
                            + _screened_text(b) for b in e.blocks)
                + ("" if e.row_colours is None else f"; reverse mode: {_counted(e.row_colours, 'row colour')} "
                   "(one VJP each)")
                + f"; {_counted(e.evaluations, 'evaluation')} of f; "
                + "; ".join(f"{b.input}'s pattern checked by {_counted(b.probes, 'random dense probe')}" if b.probes
                            else f"{b.input}'s pattern (each output element on its own input element) trusted from "
                                 "f's graph, as the element-wise walk trusts it" for b in e.blocks))
        if e.noise_rows is not None:
            failing, sampled, moved = e.noise_rows
            text += (f"; f's noise measured on the {failing} output(s) of failing nonzeros and {sampled} sampled "
                     f"ones, moving the {moved} input elements they depend on")
        return text
    if isinstance(e, events.ColouredOnGraph):
        return (f"coloured mode: the colours' evaluations ran on the graph path, not XLA: XLA's compilation pays "
                f"only from {e.evaluations} evaluations")
    if isinstance(e, events.TapeGradient):
        return ("analytical side: tape.gradient of the loss over the model's own variables, as a training step "
                "computes it (custom gradients with variables= included)")
    if isinstance(e, events.SecondOrder):
        return ("order=2: the Jacobian of grads was checked (its reverse mode against its central differences); grads "
                "itself was not compared with f's derivatives: verify_gradients with order=1 does that")
    if isinstance(e, events.FrozenChecked):
        return (f"not trainable, checked because variables= names them: {', '.join(e.names)}; the analytical side "
                "watches them on the tape (a training step's tape.gradient would return None for them)")
    if isinstance(e, events.TrainingMode):
        if not e.changes:
            return ("training=True changes nothing here: the loss equals the training=False loss at this point (no "
                    "layer of this model behaves differently in training), so this is the training=False check")
        return ("training=True: every evaluation draws the same dropout mask (seed states passed unchanged, tf_keras "
                "random layers made stateless with a fixed seed), batch normalization uses the batch's statistics, "
                "and every moving statistic and seed state is restored bit for bit")
    if isinstance(e, events.ModelCopy):
        return (f"numerical side on a float64 copy of the model: {e.detail}" if e.copied else
                f"numerical side in the model's own precision: {e.detail}")
    if isinstance(e, events.SampleNotChecked):
        if e.reason == "not reparameterized":
            return f"sample not checked: {e.distribution} is not fully reparameterized (samples carry no gradient)"
        return (f"sample not checked: {e.distribution}'s sampler {e.sampler}: an implicitly reparameterized sample's "
                "gradient holds the CDF fixed, not the noise, so a difference quotient at a fixed seed is not its "
                "derivative")
    if isinstance(e, events.IdentitiesJudged):
        return (f"identities judged with atol={e.atol:g}, rtol={e.rtol:g} ({'as given' if e.given else e.dtype + ' defaults'}), "
                "plus the numerical Jacobian's band carried into log|det J| and y's rounding carried through the inverse")
    if isinstance(e, events.LogDetConvention) and e.convention == "chart":
        return (f"log-det-Jacobian in TFP's convention for {e.bijector}: log|det| of the square Jacobian of forward "
                f"from {e.chart} (the coordinates TFP's own tests use; a coordinate selection adds no log-det of "
                "its own)")
    if isinstance(e, events.LogDetConvention):
        return (f"{e.bijector} maps {e.sizes[0]} numbers per event to {e.sizes[1]} and fastcheck knows no TFP chart "
                "for it: its log-det-Jacobian was judged as the volume change 0.5 log det(J^T J), which differs from "
                "a log-det defined in coordinates of the output by that chart's own volume factor")
    if isinstance(e, events.SampleSeeded):
        return (f"sample drawn with the stateless seed ({e.seed}, 0) at every evaluation (never under XLA, which "
                "draws other numbers from the same seed)")
    if isinstance(e, events.Distributed):
        parts = [f"{name} on each worker: {' / '.join(map(str, counts))}" if per_worker
                 else f"{' / '.join(map(str, counts))} {name}" for name, counts, per_worker in e.work]
        return (f"distributed over {e.where}: " + "; ".join(parts)
                + (" (each worker evaluated its replicas' shares; results all-gathered)" if e.multi else ""))
    if isinstance(e, events.PathsDiffer):
        return (f"the workers routed f to different paths; every worker evaluated {e.what} eagerly instead (pass "
                "jit_compile= to pin the path)")
    if isinstance(e, events.EagerUnsplit):
        return (f"strategy: {e.what} ran on the eager path, on one device" + (" on every worker" if e.multi else "")
                + ", not over the replicas (pass jit_compile=False to trace f)")
    raise TypeError(f"no text for event {e!r}")


def _counted(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


_FORWARD_PROBE = {
    "unsupported": "forward mode (JVP) not checked: {error}",
    "agrees": "forward mode (JVP) agrees along {directions} random direction(s)",
    "failed": "forward mode (JVP) disagreed on a random direction, but its full Jacobian failed ({error})",
    "compared": "forward mode (JVP): full Jacobian compared",
}


def route_reason(why: events.RouteReason) -> str:
    """Why routing chose its path, as a phrase."""
    if why.repeated:
        return (_route_rule(why) + f"; check {why.repeated} of the same f: its kernels are traced once and reused by "
                f"its later checks, instead of its eager loop (predicted {why.eager * 1e3:.0f} ms)")
    return _route_rule(why)


def _route_rule(why: events.RouteReason) -> str:
    if why.rule == "small":
        return (f"small check: eager loop predicted {why.eager * 1e3:.0f} ms, tracing {why.traced * 1e3:.0f} ms"
                + (" (the first trace in this process)" if why.first_trace else ""))
    if why.rule == "untraceable":
        return f"f cannot be traced ({why.error}): evaluated eagerly"
    if why.rule == "random":
        return (f"f draws random numbers (op {why.op}) and XLA draws different ones than TensorFlow's kernels from "
                "the same seed, so f runs without XLA" + (" (jit_compile=True overridden)" if why.overridden else ""))
    if why.rule == "slow op":
        return f"{why.op} is slow under XLA on this backend"
    if why.rule == "slow on CPU":
        return f"{why.op} is slower under XLA than TensorFlow's own on CPU"
    if why.rule in ("pays", "too small"):
        return (f"batched work of {why.work:.2g} element-evaluations "
                + ("pays for XLA compilation" if why.rule == "pays" else "is too small for XLA compilation"))
    return {"requested": "jit_compile=True", "disabled": "jit_compile=False",
            "loops": "f contains while_loops: pfor conversion would cost more than it saves"}[why.rule]


def _chunk_reason(why: events.ChunkReason) -> str:
    if why.limit == "joint":
        return (f"in the one differences kernel of all {why.inputs} checked inputs "
                f"(instead of one kernel per input; each input's calls padded to {why.padded})")
    if why.limit == "cache":
        return (f"to keep each call's working set within the CPU's {why.cache_mib} MiB cache"
                + (f" (f is memory-bound: {why.flops_per_element:.0f} FLOPs per intermediate element)"
                   if why.flops_per_element is not None else ""))
    return "to fit memory_budget"


def native_reason(e: events.NumericalSide) -> str:
    """Why the numerical side is not evaluated in float64 (also the error of precision='float64')."""
    if e.reason == "elements":
        return (f"{e.elements:.3g} input elements in float64 would double the time and memory of the check (pass "
                "precision='float64' to insist)")
    if e.reason == "returns":
        return f"f returned {e.dtype} for float64 inputs"
    if e.reason == "shapes":
        return "f returned different shapes for float64 inputs"
    if e.reason == "fails":
        return f"f does not run in float64 ({e.error})"
    return (f"f computes something else in float64 (flat output {e.row} is {e.float64:.8g} in float64 but "
            f"{e.native:.8g} natively, beyond native rounding): f chooses weights, layers or code by dtype")


def _precision_why(why) -> str:
    if isinstance(why, events.LowPrecisionOp):
        return f"f computes in {why.precision} inside (op {why.op})"
    if isinstance(why, events.TensorFloat32):
        return (f"f runs float32 op {why.op} on a GPU with TensorFloat-32 enabled "
                "(tf.config.experimental.enable_tensor_float_32_execution)")
    return why


# autodiff="auto" probes forward mode only on traced paths (see ``_full``).
_FORWARD_NOT_CHECKED = {
    "eager": ("forward mode (JVP) not checked: the check ran eagerly, and TensorFlow's forward mode traces a helper "
              "function per op, which on checks this small costs more than the check itself; pass autodiff='both' "
              "to check it"),
    "few evaluations": ("forward mode (JVP) not checked: TensorFlow's forward mode traces a helper function per op "
                        "(10-30 ms each, ~1 s for some TFP special functions), a large share of a check of fewer "
                        "than {evaluations} evaluations; pass autodiff='both' to check it"),
    "loops": ("forward mode (JVP) not checked: f contains while_loops, through which TensorFlow's forward mode runs "
              "op by op and iteration by iteration; pass autodiff='both' to check it"),
}


def mode_reasons(why: tuple) -> str:
    """The chain of reasons a mode was chosen for, as one phrase."""
    return "; ".join(_mode_reason(reason) for reason in why)


def _mode_reason(r) -> str:
    if isinstance(r, events.Requested):
        return "as requested"
    if isinstance(r, events.FullFits):
        if r.seconds is None:
            return f"the full Jacobian ({r.entries:.3g} entries) fits memory_budget"
        return (f"the full Jacobian ({r.entries:.3g} entries) fits memory_budget, and is predicted to take "
                f"{r.seconds:.2g} s, within time_budget={r.budget:g} s")
    if isinstance(r, events.FullTooLarge):
        return f"the full Jacobian has {r.entries:.3g} entries, more than {r.fitting:.3g} fit memory_budget"
    if isinstance(r, events.InputTooLarge):
        return f"an input has more than {r.limit} elements: 2n evaluations would take too long"
    if isinstance(r, events.FullTooSlow):
        return (f"full Jacobians predicted to take {r.seconds:.3g} s ({prediction(r.how)}), more than time_budget="
                f"{r.budget:g} s; pass mode='full' to run them anyway, or a larger time_budget")
    if isinstance(r, events.NoPattern):
        return f"no sparsity pattern for coloured mode ({r.error})"
    if isinstance(r, events.TooDense):
        return (f"f's Jacobian has {r.nonzeros:.3g} structural nonzeros in {r.colours} column colours: "
                "too dense for coloured mode")
    if isinstance(r, events.ColouredTooLarge):
        return (f"coloured mode would hold {r.held / 2**30:.3g} GiB for its {r.nonzeros:.3g} structural nonzeros, "
                f"more than the {r.limit / 2**30:.3g} GiB a check may hold")
    if isinstance(r, events.ColouredTooSlow):
        return (f"coloured mode ({r.colours} column colours) predicted to take {r.seconds:.3g} s, more than "
                f"time_budget={r.budget:g} s")
    if isinstance(r, events.Sparse):
        return (f"f's Jacobian is sparse ({r.nonzeros:.3g} structural nonzeros in {r.colours} column colours, "
                f"predicted {r.seconds:.2g} s): element-wise verdicts on every nonzero")
    if isinstance(r, events.Escalated):
        return (f"coloured mode ({mode_reasons(r.coloured)}) found the reverse-mode gradient inconsistent with f's "
                "sparsity pattern (see the notes), so the full Jacobians, which fit, give the element verdicts")
    raise TypeError(f"no text for mode reason {r!r}")


def prediction(how: events.Prediction) -> str:
    """How a full check's time was predicted, as a phrase."""
    if how.by == "eager":
        return f"an eager loop of {how.calls} calls of f at {how.per_call * 1e3:.2g} ms"
    if how.by == "tracing":
        return f"{how.kernels} kernels to trace at ~{how.per_kernel:.2g} s each, before any evaluation"
    return (f"{how.kernels} kernels to trace at ~{how.per_kernel:.2g} s and {how.calls:.3g} batched evaluations at "
            f"~{how.per_call * 1e3:.2g} ms")


def run_events(outcome: Outcome, executor, config, mode: str, why: tuple, problem_events=()) -> list:
    """The report's events, in the order the check learnt them."""
    plan, route = outcome.plan, executor.route
    found = [*plan.notes, *problem_events, *_precision_events(plan, config, outcome.atol, outcome.rtol),
             events.ModeChosen(mode, why), events.PathChosen(route.path, route.reason, mode != "full"),
             *executor.events, *outcome.notes]
    for spec in plan.checked:
        chunk = executor.chunks.get(spec.position, spec.size)
        if mode == "full" and route.path != "eager" and 0 < chunk < spec.size:
            found.append(events.Chunked(spec.name, chunk, -(-spec.size // chunk), route.chunk_reason))
    return found


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


# What a non-finite result of a common op usually means, for the report.
_DOMAIN = {
    "Log": "log received non-positive values",
    "Log1p": "log1p received values <= -1",
    "Sqrt": "sqrt received negative values",
    "Rsqrt": "rsqrt received non-positive values",
    "RealDiv": "a division by zero",
    "DivNoNan": "a division producing a non-finite value",
    "Reciprocal": "a reciprocal of zero",
    "Pow": "pow of a negative base or zero to a negative power",
    "Acos": "acos received values outside [-1, 1]",
    "Asin": "asin received values outside [-1, 1]",
    "Atanh": "atanh received values outside (-1, 1)",
    "Exp": "exp overflowed",
    "Lgamma": "lgamma received a non-positive integer",
    "Digamma": "digamma received a non-positive integer",
}


_OUTSIDE_DOMAIN = {
    "Log": lambda x: x <= 0,
    "Rsqrt": lambda x: x <= 0,
    "Sqrt": lambda x: x < 0,
    "Log1p": lambda x: x <= -1,
    "Reciprocal": lambda x: x == 0,
    "Acos": lambda x: np.abs(x) > 1,
    "Asin": lambda x: np.abs(x) > 1,
    "Atanh": lambda x: np.abs(x) >= 1,
}


def describe_nonfinite(plan: Plan, y0: np.ndarray) -> str:
    """Say where f is not finite at the point and, when TF can tell, which op made it so."""
    bad = np.flatnonzero(~np.isfinite(y0))
    places = []
    for output in plan.outputs:
        rows = bad[(bad >= output.offset) & (bad < output.offset + output.size)] - output.offset
        if len(rows):
            shape = tuple(output.shape) + ((2,) if output.dtype.is_complex else ())
            if shape:
                shown = ", ".join(str(tuple(int(i) for i in np.unravel_index(r, shape))) for r in rows[:5])
                places.append(f"{output.name} at {shown}{' ...' if len(rows) > 5 else ''}")
            else:
                places.append(f"{output.name} (a scalar) is {y0[output.offset]}")
    message = (f"f itself is not finite at the point ({'; '.join(places)}), so its derivative there is undecidable: "
               "the mismatches reported for those elements are not gradient bugs.")
    culprit = _first_nonfinite_op(plan)
    if culprit:
        message += " " + culprit
    return message + " Check f at points inside its domain (e.g. probabilities from a softmax, not a normal sample)."


def _user_has_check_numerics() -> bool:
    """Whether the user turned on ``tf.debugging.enable_check_numerics()`` in this thread (then it stays on)."""
    try:
        from tensorflow.python.debug.lib import check_numerics_callback
    except ImportError:  # pragma: no cover - TensorFlow moved it: assume on, never turn it off
        return True
    return getattr(check_numerics_callback._state, "check_numerics_callback", None) is not None


def _first_nonfinite_op(plan: Plan) -> str | None:
    already_on = _user_has_check_numerics()
    tf.debugging.enable_check_numerics()
    try:
        plan.f(*[s.value for s in plan.inputs])
    except Exception as error:  # the first op that produced NaN/Inf
        text = str(error)
        found = re.search(r'of (?:eagerly-executing|graph) op "([^"]+)"', text)
        if not found:
            return None
        op = found.group(1)
        what = _DOMAIN.get(op, f"op {op} produced NaN/Inf")
        sentence = f"The first non-finite value comes from op {op}: {what}."
        outside = _OUTSIDE_DOMAIN.get(op)
        spec = _logged_input(text, plan)
        if spec is not None and outside is not None:
            x = spec.value.numpy()
            positions = [tuple(int(i) for i in p) for p in np.argwhere(outside(x))[:5]]
            sentence += (f" It received {spec.name} directly, which has {int(np.sum(outside(x)))} element(s) "
                         f"outside its domain, e.g. at {', '.join(map(str, positions))}.")
        return sentence
    finally:
        if not already_on:
            tf.debugging.disable_check_numerics()
    return None


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf")


def _logged_input(text: str, plan: Plan) -> InputSpec | None:
    """The checked input that the failing op received unchanged, read off TF's numerics log."""
    found = re.search(r"Input tensor: tf\.Tensor\((.*?), shape=\(([\d, ]*)\)", text, re.S)
    if not found:
        return None
    shape = tuple(int(d) for d in found.group(2).replace(" ", "").split(",") if d)
    head = [float(v) for v in _NUMBER.findall(found.group(1).split("...")[0])[:8]]
    for spec in plan.checked:
        x = spec.value.numpy()
        if tuple(x.shape) == shape and not spec.is_complex and head:
            flat = x.reshape(-1)[: len(head)].astype(np.float64)
            if len(flat) == len(head) and np.allclose(flat, head, rtol=1e-5, atol=1e-7, equal_nan=True):
                return spec
    return None


# TensorFlow's gradient kernels: an error naming one came from the reverse-mode side, not from f.
_GRADIENT_OP = re.compile(r"\[Op:(\w*(?:Backprop|Grad)\w*)\]|node (?:gradients?|gradient_tape)/")


def kernel_failure(error: Exception) -> ValueError:
    """The error a strategy raises when f (or its gradient) fails inside a batched kernel: which, and the cause."""
    gist = first_line(error)
    gradient = _GRADIENT_OP.search(str(error))
    if gradient:
        op = f" (op {gradient.group(1)})" if gradient.group(1) else ""
        return ValueError(
            f"f's reverse-mode gradient raised {type(error).__name__}{op}: {gist}\nTensorFlow's gradient of an op in "
            "f fails at these inputs, on this device: a training step would fail the same way. Check f's ops for "
            "the device (some gradients exist only on GPU) or give the op a tf.custom_gradient.")
    return ValueError(
        f"f raised {type(error).__name__} while fastcheck evaluated it in a batched tf.function: {gist}\nf ran "
        "eagerly at the inputs; check that it can be traced (no .numpy() calls or Python side effects on "
        "tensors), or pass jit_compile=False.")
