"""Per-element dependency sets (``Dep``) and their algebra (``Sets``): what ``trace``'s walk of f's graph gives
each tensor, and how an op's rule combines its inputs' sets (unions, reads through index tables), within a budget of
(element, input element) pairs beyond which the pattern is "too dense" (``UnknownSparsity``)."""

from __future__ import annotations

import numpy as np

from fastcheck.sparsity.pattern import UnknownSparsity, distinct, ranges, sorted_unique


class Dep:
    """Per element of a tensor, the input elements (global columns) it depends on, as shared sets: element e's set
    is group ``group[e]`` of a CSR table ``indptr``/``cols``; ``group`` None: element e is group e (an explicit CSR).

    Why groups: a reduction over an axis gives one set per reduced row, and everything broadcast from it, or
    combined element-wise with something whose sets it contains (x - mean(x): each element's own column is in its
    row's set), shares that set (layer norm over rows of 64 at 10^6 elements: 15625 sets of 64 columns, where
    per-element lists would be 6.4e7 pairs for every intermediate).  Broadcasting and data movement only re-index
    ``group``; no column list is copied.

    ``injective``: every element depends on at most one column, and no two on the same one (the checked input
    itself, and any pure rearrangement of it); composing with such a Dep needs no deduplication.
    """

    __slots__ = ("_indptr", "_cols", "group", "injective", "offset", "_keys", "_identity")

    def __init__(self, indptr: np.ndarray | None, cols: np.ndarray | None, injective: bool = False, offset: int = -1,
                 group: np.ndarray | None = None):
        self._indptr, self._cols, self.injective, self.group = indptr, cols, injective, group
        # >= 0: element i depends on column offset + i alone (a checked input itself, or an
        # elementwise function of it), known without reading the arrays.
        self.offset = offset
        self._keys: np.ndarray | None = None
        self._identity: int | None = None  # the size of an identity whose arrays are not built yet

    @property
    def indptr(self) -> np.ndarray:
        if self._indptr is None:  # an identity's, built on first use (10^7 elements: 80 MB)
            assert self._identity is not None
            self._indptr = np.arange(self._identity + 1, dtype=np.int64)
        return self._indptr

    @property
    def cols(self) -> np.ndarray:
        if self._cols is None:
            assert self._identity is not None
            self._cols = np.arange(self.offset, self.offset + self._identity, dtype=np.int64)
        return self._cols

    @property
    def size(self) -> int:
        return self.groups if self.group is None else len(self.group)

    @property
    def groups(self) -> int:
        return self._identity if self._identity is not None else len(self.indptr) - 1

    @property
    def owners(self) -> np.ndarray:
        """The group of every element."""
        return np.arange(self.size, dtype=np.int64) if self.group is None else self.group

    @property
    def counts(self) -> np.ndarray:
        counts = np.diff(self.indptr)
        return counts if self.group is None else counts[self.group]

    def keys(self, n: int) -> np.ndarray:
        """Sorted ``group * n + column`` over the table (made once): membership tests search it."""
        if self._keys is None:
            keys = np.repeat(np.arange(self.groups, dtype=np.int64), np.diff(self.indptr)) * n + self.cols
            self._keys = keys if keys.size < 2 or bool(np.all(keys[1:] >= keys[:-1])) else np.sort(keys)
        return self._keys

    @staticmethod
    def identity(size: int, offset: int) -> Dep:
        # Its arrays are built on first use: an elementwise f's trace never reads them.
        dep = Dep(None, None, True, offset)
        dep._identity = size
        return dep

    @staticmethod
    def empty(size: int) -> Dep:
        return Dep(np.zeros(size + 1, np.int64), np.zeros(0, np.int64), True)

    def same(self, other: Dep) -> bool:
        if self is other:
            return True
        if (self.group is None) != (other.group is None) or self.size != other.size:
            return False
        return (np.array_equal(self.indptr, other.indptr) and np.array_equal(self.cols, other.cols)
                and (self.group is None or other.group is None or np.array_equal(self.group, other.group)))

    def rows(self, source: np.ndarray) -> Dep:
        """The Dep whose element i is this one's element ``source[i]`` (-1: depends on nothing):
        the groups are shared, only the element -> group map is new."""
        source = np.asarray(source, np.int64)
        valid = source >= 0
        indptr = self.indptr
        group = self.owners[np.where(valid, source, 0)]
        if not valid.all():  # one empty group for the elements that depend on nothing
            indptr = np.append(indptr, indptr[-1])
            group = np.where(valid, group, self.groups)
        picked = group[valid]
        injective = self.injective and np.bincount(picked, minlength=1).max(initial=0) <= 1
        return Dep(indptr, self.cols, injective, group=group)


def unique_inverse(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct sorted keys, index of each key among them), by sorting (see ``sorted_unique``)."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    fresh = np.empty(ordered.size, bool)
    if ordered.size:
        fresh[0] = True
        np.not_equal(ordered[1:], ordered[:-1], out=fresh[1:])
    ids = np.cumsum(fresh) - 1
    inverse = np.empty(keys.size, np.int64)
    inverse[order] = ids
    return ordered[fresh], inverse


def stack(deps: list, sizes: list[int]) -> Dep:
    """Deps (None: no dependence) of several tensors one after another, as one Dep."""
    parts = [d if d is not None else Dep.empty(s) for d, s in zip(deps, sizes)]
    if not parts:
        return Dep.empty(0)
    if all(p.group is None for p in parts):
        counts = np.concatenate([p.counts for p in parts])
        indptr = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        cols = np.concatenate([p.cols for p in parts])
        return Dep(indptr, cols, all(p.injective for p in parts) and distinct(cols))
    starts = np.cumsum([0] + [p.groups for p in parts])
    group = np.concatenate([p.owners + start for p, start in zip(parts, starts)])
    counts = np.concatenate([np.diff(p.indptr) for p in parts])
    indptr = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    cols = np.concatenate([p.cols for p in parts])
    injective = all(p.injective for p in parts) and distinct(cols) and np.all(counts <= 1) and distinct(group[
        (counts > 0)[group]])
    return Dep(indptr, cols, bool(injective), group=group)


# Ops constant folding (``Tracer.constant``) never runs (its depth: ``tables.FOLD_DEPTH``).


class Sets:
    """The algebra of Deps over ``n`` input elements, refusing a result beyond ``budget`` (element, input element)
    pairs."""

    def __init__(self, n: int, budget: int):
        self.n, self.budget = n, budget

    def _check(self, pairs: int, what: str) -> None:
        if pairs > self.budget:
            raise UnknownSparsity(f"the dependencies of {what} reach {pairs:.3g} (element, input element) pairs, "
                                  f"more than the {self.budget:.3g} a coloured check may hold: the Jacobian is too "
                                  "dense for colouring to pay")

    def _from_keys(self, keys: np.ndarray, size: int) -> Dep:
        n = max(self.n, 1)
        rows = keys // n
        indptr = np.searchsorted(rows, np.arange(size + 1)).astype(np.int64)
        cols = keys - rows * n
        return Dep(indptr, cols, bool(np.all(np.diff(indptr) <= 1)) and distinct(cols))

    def union(self, deps: list, what: str) -> Dep | None:
        """Element-wise union of Deps of one size (None entries ignored)."""
        present = [d for d in deps if d is not None]
        if not present:
            return None
        result = present[0]
        for other in present[1:]:
            result = self._union2(result, other, what)
        return result

    def _union2(self, a: Dep, b: Dep, what: str) -> Dep:
        """Union of two Deps, over the distinct (group of a, group of b) pairs of their elements: where
        one pair's set contains the other's (detected by a vectorised search of sorted keys), the
        element keeps the containing group; only the other pairs' sets are united explicitly."""
        if a.same(b):
            return a
        n = max(self.n, 1)
        distinct, inverse = unique_inverse(a.owners * max(b.groups, 1) + b.owners)
        xa, yb = distinct // max(b.groups, 1), distinct % max(b.groups, 1)
        b_in_a = self._within(b, yb, a, xa, what)
        if b_in_a.all():
            return self._regroup(a, xa[inverse])
        a_in_b = self._within(a, xa, b, yb, what, ~b_in_a)
        if np.all(a_in_b | b_in_a):
            if a_in_b.all():
                return self._regroup(b, yb[inverse])
            # Each pair keeps a containing group: the two tables side by side.
            chosen = np.where(b_in_a, xa, yb + a.groups)
            joined = Dep(np.concatenate([a.indptr, b.indptr[1:] + a.indptr[-1]]), np.concatenate([a.cols, b.cols]))
            return self._regroup(joined, chosen[inverse])
        counts = np.diff(a.indptr)[xa] + np.diff(b.indptr)[yb]
        self._check(int(counts.sum()), what)
        pair = np.arange(len(distinct), dtype=np.int64)
        keys = np.concatenate([
            np.repeat(pair, np.diff(a.indptr)[xa]) * n + a.cols[ranges(a.indptr[xa], np.diff(a.indptr)[xa])],
            np.repeat(pair, np.diff(b.indptr)[yb]) * n + b.cols[ranges(b.indptr[yb], np.diff(b.indptr)[yb])]])
        united = self._from_keys(sorted_unique(keys), len(distinct))
        if len(distinct) == a.size and np.array_equal(inverse, np.arange(a.size)):
            return united
        return self._regroup(united, inverse)

    def _within(self, inner: Dep, gi: np.ndarray, outer: Dep, go: np.ndarray, what: str,
                wanted: np.ndarray | None = None) -> np.ndarray:
        """Per pair p, whether group ``gi[p]`` of ``inner`` is a subset of group ``go[p]`` of ``outer``
        (only where ``wanted``; False elsewhere)."""
        n = max(self.n, 1)
        counts = np.diff(inner.indptr)[gi]
        possible = counts <= np.diff(outer.indptr)[go]
        if wanted is not None:
            possible &= wanted
        counts = np.where(possible, counts, 0)
        self._check(int(counts.sum()), what)
        owner = np.repeat(np.arange(len(gi), dtype=np.int64), counts)
        query = go[owner] * n + inner.cols[ranges(inner.indptr[gi], counts)]
        keys = outer.keys(n)
        where = np.minimum(np.searchsorted(keys, query), max(len(keys) - 1, 0))
        missing = keys[where] != query if len(keys) else np.ones(len(query), bool)
        return possible & (np.bincount(owner[missing], minlength=len(gi)) == 0)

    @staticmethod
    def _regroup(table: Dep, group: np.ndarray) -> Dep:
        """``table``'s groups under a new element -> group map (``table`` itself where it is the same)."""
        if table.group is None and np.array_equal(group, np.arange(table.groups)):
            return table
        if table.group is not None and np.array_equal(group, table.group):
            return table
        counts = np.diff(table.indptr)[group]
        injective = bool(np.all(counts <= 1)) and distinct(group[counts > 0]) and distinct(
            table.cols[table.indptr[group[counts > 0]]])
        return Dep(table.indptr, table.cols, injective, group=group)

    def compose(self, indptr: np.ndarray, idx: np.ndarray, dep: Dep | None, what: str) -> Dep | None:
        """Output element o reads input elements ``idx[indptr[o]:indptr[o+1]]`` (distinct): its Dep."""
        if dep is None:
            return None
        size = len(indptr) - 1
        if dep.offset >= 0:  # reading the checked input itself: element e is column offset + e
            self._check(len(idx), what)
            cols = idx + dep.offset if dep.offset else idx
            return Dep(indptr, cols, bool(np.all(np.diff(indptr) <= 1)) and distinct(cols))
        reads = np.diff(indptr)
        owner = np.repeat(np.arange(size, dtype=np.int64), reads)
        groups = dep.owners[idx]
        if dep.group is not None:  # only the distinct (output, group) pairs matter
            keys = sorted_unique(owner * max(dep.groups, 1) + groups)
            owner, groups = keys // max(dep.groups, 1), keys % max(dep.groups, 1)
            reads = np.bincount(owner, minlength=size)
        if np.all(reads <= 1):  # each output reads one set: it shares that group
            chosen = np.full(size, dep.groups, np.int64)
            chosen[owner] = groups
            table = dep if np.all(reads == 1) else Dep(np.append(dep.indptr, dep.indptr[-1]), dep.cols)
            return self._regroup(Dep(table.indptr, table.cols), chosen)
        counts = np.diff(dep.indptr)[groups]
        self._check(int(counts.sum()), what)
        cols = dep.cols[ranges(dep.indptr[groups], counts)]
        rows = np.repeat(owner, counts)
        if dep.injective and dep.group is None:  # distinct inputs of distinct columns: no duplicate within a row
            out_counts = np.bincount(rows, minlength=size)
            out = np.zeros(size + 1, np.int64)
            np.cumsum(out_counts, out=out[1:])
            return Dep(out, cols, bool(np.all(out_counts <= 1)) and distinct(cols))
        return self._from_keys(sorted_unique(rows * max(self.n, 1) + cols), size)

    def windows(self, table: np.ndarray, dep: Dep | None, what: str) -> Dep | None:
        """``compose`` for a dense table [out_size, k] of input elements (-1: none)."""
        if dep is None:
            return None
        table = table.reshape(table.shape[0], -1)
        valid = table >= 0
        indptr = np.zeros(table.shape[0] + 1, np.int64)
        np.cumsum(valid.sum(axis=1), out=indptr[1:])
        return self.compose(indptr, table[valid], dep, what)
