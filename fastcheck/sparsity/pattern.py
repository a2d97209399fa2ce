"""A Jacobian block's sparsity pattern as a value (``Pattern``), and the user's ``sparsity=`` (``GivenSparsity``).

``trace`` finds patterns by tracing f's graph, ``colouring`` colours them; the configuration only normalises
``sparsity=`` here, without the tracer.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of an integer array by sorting: NumPy 2's hashing ``unique`` takes 3.7 s for
    3e6 int64 keys where a sort takes 0.18 s."""
    ordered = np.sort(values, axis=None)
    if ordered.size < 2:
        return ordered
    keep = np.empty(ordered.size, bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def distinct(values: np.ndarray) -> bool:
    """Whether no value repeats."""
    return sorted_unique(values).size == values.size


class UnknownSparsity(ValueError):
    """The pattern cannot be found (an op without a rule) or is too dense to pay."""


# -- the pattern ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Pattern:
    """Structural nonzeros of one Jacobian block ``[m, n_k]`` (the flat outputs against one checked input) as
    *shared column sets*.

    Row i's columns are group ``group[i]`` of a CSR table (``gptr``/``gcols``, columns sorted within each group);
    ``group`` None: row i is group i (an explicit CSR).  Rows of a normalisation share their block's set (as in
    ``dep.Dep``), and the output channels of a convolution their pixel's window: memory follows the distinct
    sets, not the nonzeros.  Nonzeros are numbered by (row, column); ``entries`` and ``at`` give the (row, column)
    of any range or subset of them, so no nnz-sized index array need exist.

    ``diagonal``: the identity pattern (m == n, nonzero (i, i) for every i; elementwise f), which lets the coloured
    check read every nonzero without an index gather.
    """

    shape: tuple[int, int]
    stored_gptr: np.ndarray | None  # None: the identity's, built only if asked for (``gptr``)
    stored_gcols: np.ndarray | None
    group: np.ndarray | None = None
    diagonal: bool = False
    every: bool = False  # every element a nonzero, numbered row-major (``Pattern.full``): read by division

    @staticmethod
    def identity(size: int) -> Pattern:
        # Tables built on first use: a diagonal pattern is read without them (at 10^7 elements: 0.4 s of page faults).
        return Pattern((size, size), None, None, None, True)

    @staticmethod
    def full(m: int, n: int) -> Pattern:
        """Every element of an [m, n] block (full mode's): one column set that every row shares, O(m + n)."""
        return Pattern((m, n), np.array([0, n], np.int64), np.arange(n, dtype=np.int64), np.zeros(m, np.int64),
                       every=True)

    @property
    def dense(self) -> bool:
        """Whether every element is a nonzero."""
        return self.every or self.nnz == self.shape[0] * self.shape[1]

    @property
    def gptr(self) -> np.ndarray:
        if self.stored_gptr is None:
            object.__setattr__(self, "stored_gptr", np.arange(self.shape[0] + 1, dtype=np.int64))
        assert self.stored_gptr is not None
        return self.stored_gptr

    @property
    def gcols(self) -> np.ndarray:
        if self.stored_gcols is None:
            object.__setattr__(self, "stored_gcols", index_array(np.arange(self.shape[0]), self.shape[0]))
        assert self.stored_gcols is not None
        return self.stored_gcols

    @staticmethod
    def of(shape: tuple[int, int], rows, cols) -> Pattern:
        """A pattern from index pairs in any order, duplicates dropped (one group per row)."""
        m, n = shape
        rows, cols = np.asarray(rows, np.int64).reshape(-1), np.asarray(cols, np.int64).reshape(-1)
        keys = sorted_unique(rows * max(n, 1) + cols)
        gptr = np.searchsorted(keys // max(n, 1), np.arange(m + 1)).astype(np.int64)
        return Pattern((m, n), gptr, index_array(keys % max(n, 1), n))

    @functools.cached_property
    def indptr(self) -> np.ndarray:
        """Row pointers (CSR) of the nonzeros: row i's are ``indptr[i]:indptr[i + 1]``."""
        if self.group is None:
            return self.gptr
        indptr = np.zeros(self.shape[0] + 1, np.int64)
        np.cumsum(np.diff(self.gptr)[self.group], out=indptr[1:])
        return indptr

    @property
    def nnz(self) -> int:
        return self.shape[0] if self.diagonal else self.shape[0] * self.shape[1] if self.every else int(self.indptr[-1])

    @property
    def groups(self) -> np.ndarray:
        """The group of every row (int64)."""
        return np.arange(self.shape[0], dtype=np.int64) if self.group is None else self.group.astype(np.int64)

    @property
    def bytes(self) -> int:
        """Host memory of the pattern: its table, row -> group map and row pointers."""
        if self.diagonal:
            return 0 if self.stored_gptr is None else self.gptr.nbytes + self.gcols.nbytes
        held = self.gptr.nbytes + self.gcols.nbytes + (0 if self.group is None else self.group.nbytes)
        return held + (0 if self.group is None else 8 * (self.shape[0] + 1))

    def max_row(self) -> int:
        return 1 if self.diagonal else int(np.diff(self.indptr).max(initial=0))

    def entries(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, cols) int64 of the nonzeros ``start:stop``, vectorised over the rows they span."""
        if stop <= start:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if self.diagonal or self.every:
            return self.at(np.arange(start, stop, dtype=np.int64))
        indptr = self.indptr
        first, last = np.searchsorted(indptr, [start, stop - 1], side="right") - 1
        spanned = np.arange(first, last + 1, dtype=np.int64)
        lengths = np.minimum(indptr[spanned + 1], stop) - np.maximum(indptr[spanned], start)
        rows = np.repeat(spanned, lengths)
        return rows, self._cols(rows, np.arange(start, stop, dtype=np.int64))

    def at(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, cols) int64 of the nonzeros ``index`` (any order)."""
        index = np.asarray(index, np.int64)
        if self.diagonal:
            return index, index
        if self.every:
            return np.divmod(index, self.shape[1])
        rows = np.searchsorted(self.indptr, index, side="right") - 1
        return rows, self._cols(rows, index)

    def _cols(self, rows: np.ndarray, index: np.ndarray) -> np.ndarray:
        groups = rows if self.group is None else self.group[rows]
        return self.gcols[self.gptr[groups] + (index - self.indptr[rows])].astype(np.int64)

    @property
    def rows(self) -> np.ndarray:
        """Row of every nonzero (materialised: small patterns and tests; checks read ``entries``)."""
        return self.entries(0, self.nnz)[0]

    @property
    def cols(self) -> np.ndarray:
        """Column of every nonzero (materialised, as ``rows``)."""
        return self.entries(0, self.nnz)[1]

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """(gptr, gcols) of the groups some row uses, in group order: what colourings read."""
        if self.group is None:
            return self.gptr, self.gcols
        used = np.zeros(len(self.gptr) - 1, bool)
        used[self.group] = True
        if used.all():
            return self.gptr, self.gcols
        counts = np.diff(self.gptr)[used]
        gptr = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=gptr[1:])
        return gptr, self.gcols[ranges(self.gptr[:-1][used], counts)]

    def columns_of(self, rows: np.ndarray) -> np.ndarray:
        """The sorted distinct columns that the rows ``rows`` depend on."""
        if self.diagonal:
            return np.unique(rows[rows < self.shape[1]])
        groups = np.unique(rows if self.group is None else self.group[rows])
        counts = np.diff(self.gptr)[groups]
        return np.unique(self.gcols[ranges(self.gptr[groups], counts)]).astype(np.int64)


def index_array(values: np.ndarray, bound: int) -> np.ndarray:
    """Indices below ``bound`` as int32 where they fit (half the memory of int64), else int64."""
    return np.asarray(values, np.int32 if bound < 2**31 else np.int64)


class GivenSparsity:
    """The user's ``sparsity=``, normalised at configuration time (shapes are checked against the plan later);
    identity-hashed, so a ``CheckConfig`` holding it stays hashable."""

    FORMS = ("a boolean array [m, n] (m: f's flat outputs, n: the checked input's elements), "
             "index pairs (rows, cols) as a tuple of two integer arrays, an object with .tocoo() "
             "(scipy.sparse-like), or a list of those, one per checked input")

    def __init__(self, value: Any):
        self.per_input = isinstance(value, list)
        items = value if self.per_input else [value]
        if not items:
            raise ValueError(f"sparsity=[] is not valid: pass {self.FORMS}.")
        self.blocks = [self._block(item, i if self.per_input else None) for i, item in enumerate(items)]

    @classmethod
    def _block(cls, item, index) -> tuple[tuple | None, np.ndarray, np.ndarray]:
        where = "sparsity" if index is None else f"sparsity[{index}]"
        if hasattr(item, "tocoo"):
            coo = item.tocoo()
            data = np.asarray(coo.data)
            keep = data != 0
            return tuple(int(d) for d in coo.shape), np.asarray(coo.row)[keep], np.asarray(coo.col)[keep]
        if isinstance(item, tuple) and len(item) == 2:
            rows, cols = (np.asarray(a) for a in item)
            if rows.ndim != 1 or cols.ndim != 1 or rows.shape != cols.shape or (
                    rows.size and not (np.issubdtype(rows.dtype, np.integer) and np.issubdtype(cols.dtype, np.integer))):
                raise ValueError(f"{where}: index pairs must be two 1-D integer arrays of equal length (rows, cols); "
                                 f"got shapes {rows.shape} and {cols.shape}. Pass {cls.FORMS}.")
            if rows.size and (rows.min() < 0 or cols.min() < 0):
                raise ValueError(f"{where}: index pairs must be non-negative.")
            return None, rows.astype(np.int64), cols.astype(np.int64)
        try:
            array = np.asarray(item)
        except Exception:  # not array-like at all
            array = np.asarray(None)
        if array.ndim != 2 or not (array.dtype == bool or np.issubdtype(array.dtype, np.number)):
            raise TypeError(f"{where}={type(item).__name__} is not a sparsity pattern: pass {cls.FORMS}.")
        rows, cols = np.nonzero(array)
        return tuple(array.shape), rows, cols

    def patterns(self, m: int, sizes: list[int], names: list[str]) -> list[Pattern]:
        """One pattern per checked input, checked against the plan's shapes (ValueError naming sparsity=)."""
        if len(self.blocks) != len(sizes):
            raise ValueError(f"sparsity= gives {len(self.blocks)} pattern(s) but f has {len(sizes)} checked input(s) "
                             f"({', '.join(names)}): pass a list with one pattern per checked input.")
        result = []
        for (shape, rows, cols), n, name in zip(self.blocks, sizes, names):
            if shape is not None and shape != (m, n):
                raise ValueError(f"sparsity= for {name} has shape {shape}, but its Jacobian block is [{m}, {n}] "
                                 f"(f's {m} flat outputs x {n} elements of {name}).")
            if rows.size and (rows.max() >= m or cols.max() >= n):
                raise ValueError(f"sparsity= for {name} has indices outside its Jacobian block [{m}, {n}].")
            result.append(Pattern.of((m, n), rows, cols))
        return result


def given(value) -> GivenSparsity | None:
    """``sparsity=`` as ``CheckConfig`` stores it."""
    if value is None or isinstance(value, GivenSparsity):
        return value
    return GivenSparsity(value)



def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(start, start + count)`` for each pair, vectorised."""
    total = int(counts.sum())
    if not total:
        return np.zeros(0, np.int64)
    ends = np.cumsum(counts)
    shift = np.repeat(starts - (ends - counts), counts)
    return np.arange(total, dtype=np.int64) + shift
