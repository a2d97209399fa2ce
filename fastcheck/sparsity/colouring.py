"""Colourings of a sparsity pattern (Curtis-Powell-Reid): columns that share no row get one colour (one central
difference moves them all), rows that share no column one row colour (one VJP): the better of a *lattice* colouring
(optimal for elementwise f -- one colour -- and for stencils -- kernel size times channels) and a greedy one.
"""


from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fastcheck.engine.tables import GREEDY_WORK
from fastcheck.sparsity.pattern import (
    Pattern,
    ranges,
    sorted_unique,
)

if TYPE_CHECKING:
    from fastcheck.engine.plan import Plan


def colourings(patterns: list[Pattern], plan: Plan, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """(column colours [n_k] per checked input, row colours [m]) of a check's patterns, each over its index shape
    (a complex output's rows as (real, imag) pairs)."""
    labels = [colour(p, tuple(s.real_view.shape), seed) for p, s in zip(patterns, plan.checked)]
    output = plan.outputs[0]
    shape = tuple(output.shape) + ((2,) if output.dtype.is_complex else ()) if len(plan.outputs) == 1 else (plan.m,)
    return labels, row_colour(patterns, shape, seed)


def colour(pattern: Pattern, shape: tuple, seed: int = 0) -> np.ndarray:
    """Column colours [n] (0 .. C-1): columns sharing a row differ.  ``shape``: the columns' index shape.

    Rows of one group share their columns, so the constraint is the groups': both colourings read the group table,
    never the nonzeros.  The lattice colouring first; the greedy one where it is affordable and the lattice exceeds
    the lower bound (the longest row).
    """
    n = pattern.shape[1]
    if not pattern.nnz or pattern.diagonal:  # one colour: int32 zeros, what the kernels take (no copy of n labels)
        return np.zeros(n, np.int32)
    indptr, cols = pattern.table()
    lengths = np.diff(indptr)
    bound = int(lengths.max())
    if bound <= 1:  # no two columns share a row (elementwise f): one colour
        return np.zeros(n, np.int32)
    best = lattice(indptr, cols.astype(np.int64), n, shape)
    count = int(best.max()) + 1 if n else 0
    if count > bound and int(np.sum(lengths.astype(np.int64) ** 2)) <= GREEDY_WORK:
        greedy = greedy_colours(indptr, cols.astype(np.int64), n, np.random.default_rng(seed))
        if int(greedy.max()) + 1 < count:
            best = greedy
    return best


def lattice(indptr: np.ndarray, cols: np.ndarray, n: int, shape: tuple) -> np.ndarray:
    """Colour = each coordinate modulo K_a, K_a = the widest extent of a row along axis a, plus 1: two columns of one
    row differ along some axis by less than its K, so equal residues on every axis mean the same column (a valid
    colouring, in O(table))."""
    shape = tuple(shape) if shape else (n,)
    starts = indptr[:-1][np.diff(indptr) > 0]
    strides = np.cumprod((1,) + tuple(shape[:0:-1]))[::-1]
    moduli = []
    for axis in range(len(shape)):  # one axis at a time: one table-sized coordinate array alive
        coord = cols // int(strides[axis])
        coord %= int(shape[axis])
        extent = np.maximum.reduceat(coord, starts) - np.minimum.reduceat(coord, starts)
        del coord
        moduli.append(int(min(extent.max() + 1, shape[axis])))
    return _lattice_labels(shape, moduli, n)


def _lattice_labels(shape: tuple, moduli: list[int], size: int) -> np.ndarray:
    grid = np.unravel_index(np.arange(size), shape)
    labels = np.zeros(size, np.int64)
    for coord, modulus in zip(grid, moduli):
        labels = labels * modulus + coord % modulus
    return _compact(labels)


def row_colour(patterns: list[Pattern], shape: tuple, seed: int = 0) -> np.ndarray:
    """Row colours [m] (0 .. R-1) over the blocks of all checked inputs side by side: rows sharing a column of any
    block differ.  ``shape``: the rows' index shape.

    The lattice colouring reads, per output axis, the extent of the rows of each group (over the m rows) and then
    the extent over the groups holding each column (over the group table): no transpose of the nonzeros.  The
    greedy colouring, where affordable and better than the lattice, runs on the explicit transpose.
    """
    m = patterns[0].shape[0]
    if all(not p.nnz or p.diagonal for p in patterns):  # one colour, int32 as in ``colour``
        return np.zeros(m, np.int32)
    shape = tuple(shape) if shape else (m,)
    tables = []
    for p in patterns:
        if p.diagonal or not p.nnz:
            continue
        groups = p.groups
        size = len(p.gptr) - 1
        per_group = np.bincount(groups, minlength=size)
        owner = np.repeat(np.arange(size, dtype=np.int64), np.diff(p.gptr))
        column_rows = np.bincount(p.gcols, weights=per_group[owner], minlength=p.shape[1])
        tables.append((p, groups, size, owner, column_rows))
    bound = max(int(t[4].max(initial=0)) for t in tables)
    if bound <= 1:  # no two rows share a column: one colour
        return np.zeros(m, np.int32)
    strides = np.cumprod((1,) + tuple(shape[:0:-1]))[::-1]
    moduli = [1] * len(shape)
    rows = np.arange(m, dtype=np.int64)
    for axis in range(len(shape)):
        coord = rows // int(strides[axis]) % int(shape[axis])
        for p, groups, size, owner, _ in tables:
            low, high = np.full(size, np.iinfo(np.int64).max), np.full(size, -1)
            np.minimum.at(low, groups, coord)
            np.maximum.at(high, groups, coord)
            column_low = np.full(p.shape[1], np.iinfo(np.int64).max)
            column_high = np.full(p.shape[1], -1)
            np.minimum.at(column_low, p.gcols, low[owner])
            np.maximum.at(column_high, p.gcols, high[owner])
            touched = column_high >= 0
            if touched.any():
                extent = int((column_high[touched] - column_low[touched]).max())
                moduli[axis] = max(moduli[axis], min(extent + 1, int(shape[axis])))
    best = _lattice_labels(shape, moduli, m)
    count = int(best.max()) + 1 if m else 0
    work = sum(int(np.sum(t[4] ** 2)) for t in tables)
    if count > bound and work <= GREEDY_WORK:
        offsets = np.cumsum([0] + [p.shape[1] for p in patterns])
        rows_, cols_ = [], []
        for p, offset in zip(patterns, offsets):
            r, c = p.entries(0, p.nnz)
            rows_.append(r)
            cols_.append(c + offset)
        total = int(offsets[-1])
        transposed = Pattern.of((total, m), np.concatenate(cols_), np.concatenate(rows_))
        greedy = greedy_colours(transposed.indptr, transposed.gcols.astype(np.int64), m, np.random.default_rng(seed))
        if int(greedy.max()) + 1 < count:
            best = greedy
    return best


def _compact(labels: np.ndarray) -> np.ndarray:
    """Labels renumbered 0 .. C-1 in order, in O(n) (they are below n)."""
    used = np.bincount(labels) > 0
    return (np.cumsum(used) - 1)[labels].astype(np.int64)


def greedy_colours(indptr: np.ndarray, cols: np.ndarray, n: int, rng) -> np.ndarray:
    """Greedy colouring of the columns (smallest colour no column sharing a row has), in
    Jones-Plassmann rounds: each round colours every uncoloured column whose random priority
    is the highest among the uncoloured columns it shares a row with."""
    m = len(indptr) - 1
    lengths = np.diff(indptr)
    entry_row = np.repeat(np.arange(m, dtype=np.int64), lengths)
    order = np.argsort(cols, kind="stable")
    col_rows = entry_row[order]
    col_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(cols, minlength=n), out=col_ptr[1:])
    priority = rng.permutation(n).astype(np.int64)
    labels = np.full(n, -1, np.int64)
    while True:
        open_ = labels < 0
        if not open_.any():
            return labels
        entry = np.where(open_[cols], priority[cols], -1)
        row_max = _segment_max(entry, indptr)
        col_max = _segment_max(row_max[col_rows], col_ptr)
        chosen = np.flatnonzero(open_ & (col_max <= priority))
        # Colours already taken next to each chosen column: its rows' columns.
        rows_of = ranges(col_ptr[chosen], np.diff(col_ptr)[chosen])
        owner = np.repeat(np.arange(len(chosen)), np.diff(col_ptr)[chosen])
        rows = col_rows[rows_of]
        neighbours = cols[ranges(indptr[rows], lengths[rows])]
        who = np.repeat(owner, lengths[rows])
        taken = labels[neighbours]
        keep = taken >= 0
        width = int(taken.max(initial=0)) + 2
        keys = sorted_unique(who[keep] * width + taken[keep])
        group, value = keys // width, keys % width
        first = np.searchsorted(group, np.arange(len(chosen)))
        rank = np.arange(len(keys)) - first[group]
        gap = np.full(len(chosen), np.iinfo(np.int64).max)
        misses = value != rank
        np.minimum.at(gap, group[misses], rank[misses])
        sizes = np.bincount(group, minlength=len(chosen))
        labels[chosen] = np.minimum(gap, sizes)


def _segment_max(values: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """Max of each CSR segment (-1 for empty ones)."""
    lengths = np.diff(indptr)
    result = np.full(len(lengths), -1, np.int64)
    nonempty = lengths > 0
    if nonempty.any():
        result[nonempty] = np.maximum.reduceat(values, indptr[:-1][nonempty])
    return result
