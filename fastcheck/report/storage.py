"""How a pair's compared values are held, one storage per strategy: ``Dense`` blocks (full mode, coloured mode's
small pairs), ``Nonzeros`` (coloured mode's large pairs) and ``Projections`` (fast mode's probes, each a
``Comparison``); ``results.PairReport`` reads them all through ``chunks``, ``entry`` and ``sample``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import ClassVar, NamedTuple

import numpy as np

from fastcheck.engine.tables import SUMMARY_CHUNK
from fastcheck.judge.compare import FAILING, MISMATCH, OK, resolution, resolves


def json_number(value):
    """A number for JSON: NaN and infinities (which JSON lacks) as None."""
    value = float(value)
    return value if math.isfinite(value) else None


@dataclasses.dataclass
class Element:
    """One entry of a Jacobian: d output[output_index] / d input[input_index]."""

    output_index: tuple
    input_index: tuple
    analytical: float
    numerical: float
    abs_error: float
    allowed: float  # the allowance |a - n| was judged against (atol + rtol |n| + noise)
    status: str

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v if isinstance(v, str) else json_number(v)) for k, v in dataclasses.asdict(self).items()}


# What ``compare.diagnose`` reads of a pair: (analytical, numerical, status).
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

    def chunks(self) -> Iterator[Chunk]:
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
        """Whether the element of largest |analytical| alone resolves the limit (``resolves``): then so does the pair,
        and no pass over its [m, n] elements is needed (``coarse`` is read several times a report)."""
        flat = self.analytical.reshape(-1)
        if not flat.size:
            return True
        high, low = int(np.argmax(flat)), int(np.argmin(flat))  # a NaN is picked first: not OK, the full pass
        i = high if abs(flat[high]) >= abs(flat[low]) else low
        return resolves(flat[i], self.band.reshape(-1)[i], self.status.reshape(-1)[i] == OK, rtol)

    def sample(self) -> Sample | None:
        """What ``compare.diagnose`` reads: here the whole block (its transpose test needs it)."""
        return self.analytical, self.numerical, self.status

    def facts(self) -> dict:
        return {"shape": [int(self.status.shape[0]), int(self.status.shape[1])]}

    def arrays(self) -> dict:
        return {"numerical": self.numerical.tolist(), "analytical": self.analytical.tolist()}


class Nonzeros:
    """Coloured mode's large pairs: values at the structural nonzeros ``(rows[k], cols[k])`` of the
    ``jacobian_shape`` block only, 1-D over them.

    Only ``status`` is held (a view of the check's int8 array); values, bands and indices are read
    off the check's compressed arrays (``coloured_judge._Block``) block by block, and made whole arrays
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

    def chunks(self) -> Iterator[Chunk]:
        for part in self._block.parts(self._start, self._stop):
            _, _, a, n, band = self._block.values(part, bands=True)
            at = slice(part.start - self._start, part.stop - self._start)
            yield Chunk(at.start, self.status[at], a, n, band)

    def entry(self, k: int) -> tuple:
        rows, cols, a, n, band = self._block.values(np.array([self._start + k]), bands=True)
        return _first(rows) - self._offset, _first(cols), a[0], n[0], band[0]

    def decisive(self, rtol: float) -> bool:
        return False

    def sample(self) -> Sample | None:
        """The nonzeros that are not OK, plus three whose numerical value is nonzero (what
        ``compare.diagnose``'s constant-factor test counts): it reads nothing else, except the
        share of failing elements, which the pair takes over all nonzeros.  Values are read only
        up to where the three are found, and after it where a status is not OK (a passing check of
        10^7 elements: one chunk, not every one)."""
        picked, values = [], []
        spare = 3
        for part in self._block.parts(self._start, self._stop):
            status = self.status[part.start - self._start : part.stop - self._start]
            if not spare and not status.any():  # OK is 0
                continue
            _, _, a, n = self._block.values(part)
            keep = status != OK
            if spare:
                extra = np.flatnonzero(~keep & np.isfinite(n) & (n != 0))[:spare]
                keep[extra] = True
                spare -= len(extra)
            where = np.flatnonzero(keep)
            if len(where):
                picked.append(status[where])
                values.append((a[where].astype(np.float64), n[where]))
        if not picked:
            return None
        a, n = (np.concatenate([v[k] for v in values]) for k in range(2))
        return a[None, :], n[None, :], np.concatenate(picked)[None, :]

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
    # probes flag (``compare.resolution`` over its shares of the probes).
    resolutions: tuple = (math.inf, math.inf)
    region: tuple | None = None  # (first, last) multi-indices of the localised region
    found: Element | None = None  # the element localisation found in the region, if any
    found_by: str = "forward"  # the comparison it comes from: "forward" (element-wise J d) or "reverse" (u.J.d)
    what: ClassVar[str] = "probe comparisons"
    status: np.ndarray = dataclasses.field(init=False)

    def __post_init__(self):
        c = self.comparison
        kinds = c.kind
        # [k, 2] status of each probe's element-wise and projection comparison (``compare`` codes).
        self.status = np.stack([np.where(c.forward_ratio > 1, kinds, OK), np.where(c.reverse_ratio > 1, kinds, OK)],
                               axis=1)

    numerical = property(lambda self: self.comparison.reverse[:, 1], doc="[k] the numerical projections u.J.d.")
    analytical = property(lambda self: self.comparison.reverse[:, 0], doc="[k] the reverse-mode projections (J^T u).d.")
    band = property(lambda self: self.comparison.reverse[:, 2], doc="[k] the projections' allowances.")

    def chunks(self) -> Iterator[Chunk]:
        c = self.comparison
        yield Chunk(0, self.status[:, 0], c.forward_worst[:, 1], c.forward_worst[:, 2], c.forward_worst[:, 3], False)
        yield Chunk(len(c.reverse), self.status[:, 1], c.reverse[:, 0], c.reverse[:, 1], c.reverse[:, 2])

    def decisive(self, rtol: float) -> bool:
        return False

    def sample(self) -> Sample | None:
        return None  # a probe moves every element at once: its hint comes from the localisation

    def facts(self) -> dict:
        c = self.comparison
        return {"probes": int(len(c.reverse_ratio)), "forward_ratio": [json_number(v) for v in c.forward_ratio],
                "reverse_ratio": [json_number(v) for v in c.reverse_ratio],
                "region": [list(self.region[0]), list(self.region[1])] if self.region else None}

    def arrays(self) -> dict:
        return {}


Storage = Dense | Nonzeros | Projections


@dataclasses.dataclass
class Comparison:
    """Fast mode's per-probe results (ratios > 1 fail): what its strategy judges and a pair's ``Projections`` hold."""

    forward_ratio: np.ndarray  # [k] worst |J d_i - numerical_i| / allowed_i over outputs
    reverse_ratio: np.ndarray  # [k] |u.VJP.d - u.numerical| / allowed
    forward_worst: np.ndarray  # [k, 4]: output row, analytical, numerical, allowed at the worst element
    reverse: np.ndarray  # [k, 4]: analytical, numerical, allowed, allowed by the tolerances alone
    squares: np.ndarray  # [k, 3]: ||n - a||^2, ||n||^2, ||a||^2 of each probe's J d
    # [k] what a ratio > 1 of each probe stands for (``compare`` statuses): MISMATCH unless refinement found kinks
    # along the probe (NONDIFFERENTIABLE: the analytical value lies between the one-sided derivatives, a pass;
    # UNRESOLVED_KINK / UNRESOLVED / DISCONTINUOUS / FLAT: undecidable) -- only a MISMATCH is a wrong gradient.
    kind: np.ndarray
    # [k, inputs] each checked input's share (J^T u)_k . d_k of the analytical projection: what a relative error r
    # of that input's gradient moves the probe by (``resolution``).
    shares: np.ndarray

    def resolution(self, index: int) -> tuple[float, float]:
        """(resolution, the tolerance's own) of input ``index``'s gradient along these probes
        (``compare.resolution``): min over passing probes of allowed / |its share|."""
        usable = (self.score <= 1) | ~np.isin(self.kind, FAILING)
        return resolution(self.shares[:, index], self.reverse[:, 2], self.reverse[:, 3], usable)

    @property
    def score(self) -> np.ndarray:
        return np.maximum(self.forward_ratio, self.reverse_ratio)

    @property
    def defect(self) -> np.ndarray:
        """[k] the score of probes that show a wrong gradient (0 for the rest)."""
        return np.where(self.kind == MISMATCH, self.score, 0.0)

    @property
    def ok(self) -> bool:
        return not bool(np.any((self.score > 1) & np.isin(self.kind, FAILING)))

    @property
    def wrong(self) -> bool:
        """Whether some probe shows a wrong gradient (not merely kinks no step resolves)."""
        return bool(np.any(self.defect > 1))

    def not_shown(self, kind: int) -> Comparison:
        """These probes, each that shows a wrong gradient (``defect > 1``) judged ``kind`` instead: where what it
        was followed to names no wrong element."""
        return dataclasses.replace(self, kind=np.where(self.defect > 1, kind, self.kind))

    def select(self, rows) -> Comparison:
        rows = np.asarray(rows, int)
        return Comparison(*(getattr(self, f.name)[rows] for f in dataclasses.fields(self)))

    @staticmethod
    def join(parts: list) -> Comparison:
        return Comparison(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(Comparison)))
