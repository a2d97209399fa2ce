"""The Jacobian's sparsity pattern, and colourings of it (for ``mode="coloured"``).

A ``Pattern`` holds the structural nonzeros of one Jacobian block ``[m, n_k]``
(the flat outputs against one checked input) as index arrays: memory linear in
the nonzeros, never an ``[m, n]`` array.  It comes from one of two sources:

* the user's ``sparsity=`` option (``GivenSparsity``): a boolean array
  ``[m, n_k]``, index pairs ``(rows, cols)``, or anything with ``.tocoo()``
  (scipy.sparse-like; scipy itself is not needed), or a list of those, one per
  checked input;
* a **dependency trace** of f's traced graph (``trace``): op by op, each tensor
  gets, per element, the set of input elements it depends on (``Dep``, a CSR
  structure).  Structured ops are index arithmetic on numpy index arrays, never
  a Python loop per element; data-movement ops (slices, concatenations, pads,
  gathers with constant indices ...) are *replayed*: TensorFlow runs the op
  itself on a float64 tensor of element codes, so each output element names the
  input element it copies.  An op without a rule, or a pattern beyond
  ``NONZERO_BUDGET``, raises ``UnknownSparsity``: the coloured check refuses.

Colourings: columns sharing a row must get different colours (Curtis-Powell-Reid)
so that one difference per colour recovers every nonzero; rows sharing a column
likewise for one VJP per row colour.  ``colour`` takes the better of a *lattice*
colouring (colour = each coordinate of the element modulo the widest extent of a
row along that axis: O(nonzeros), optimal for elementwise f -- one colour -- and
for stencils -- kernel size times channels) and a greedy colouring (Jones-Plassmann
rounds in numpy, random priorities, smallest free colour), run only when its
work (sum of squared row lengths) is affordable.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

# A traced pattern (or one intermediate tensor's dependencies) with more than this many
# (element, input element) pairs is "dense / unknown": a coloured check would not pay.
NONZERO_BUDGET = 50_000_000
# The greedy colouring runs when the sum of squared row lengths is at most this.
GREEDY_WORK = 20_000_000


def _unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of an integer array by sorting: NumPy 2's hashing ``unique`` takes 3.7 s for
    3e6 int64 keys where a sort takes 0.18 s."""
    ordered = np.sort(values, axis=None)
    if ordered.size < 2:
        return ordered
    keep = np.empty(ordered.size, bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def _distinct(values: np.ndarray) -> bool:
    """Whether no value repeats."""
    return _unique(values).size == values.size


class UnknownSparsity(ValueError):
    """The pattern cannot be found (an op without a rule) or is too dense to pay."""


# -- the pattern ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Pattern:
    """Structural nonzeros of one Jacobian block: ``rows``, ``cols`` (int64), sorted by (row, col).

    ``diagonal``: the identity pattern (m == n, nonzero (i, i) for every i; elementwise f),
    which lets the coloured check read every nonzero without an index gather.
    """

    shape: tuple[int, int]
    rows: np.ndarray
    cols: np.ndarray
    diagonal: bool = False

    @staticmethod
    def identity(size: int) -> Pattern:
        index = np.arange(size, dtype=np.int64)
        return Pattern((size, size), index, index, True)

    @property
    def nnz(self) -> int:
        return int(self.rows.size)

    @staticmethod
    def of(shape: tuple[int, int], rows, cols) -> Pattern:
        """A pattern from index pairs in any order, duplicates dropped."""
        m, n = shape
        rows, cols = np.asarray(rows, np.int64).reshape(-1), np.asarray(cols, np.int64).reshape(-1)
        keys = _unique(rows * max(n, 1) + cols)
        return Pattern((m, n), keys // max(n, 1), keys % max(n, 1))

    @property
    def indptr(self) -> np.ndarray:
        """Row pointers (CSR) into ``rows``/``cols``."""
        indptr = np.zeros(self.shape[0] + 1, np.int64)
        np.cumsum(np.bincount(self.rows, minlength=self.shape[0]), out=indptr[1:])
        return indptr

    def max_row(self) -> int:
        return 1 if self.diagonal else int(np.diff(self.indptr).max(initial=0))


class GivenSparsity:
    """The user's ``sparsity=``, normalised at configuration time (shapes are checked against the plan later).

    Identity-hashed, so a ``CheckConfig`` holding it stays hashable.
    """

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


# -- dependencies of one tensor -----------------------------------------------------------


class Dep:
    """Per element of a tensor, the input elements (global columns) it depends on: CSR ``indptr``/``cols``.

    ``injective``: every element depends on at most one column, and no two on the same
    one (the checked input itself, and any pure rearrangement of it); composing with
    such a Dep needs no deduplication.
    """

    __slots__ = ("indptr", "cols", "injective", "offset")

    def __init__(self, indptr: np.ndarray, cols: np.ndarray, injective: bool = False, offset: int = -1):
        self.indptr, self.cols, self.injective = indptr, cols, injective
        # >= 0: element i depends on column offset + i alone (a checked input itself, or an
        # elementwise function of it), known without reading the arrays.
        self.offset = offset

    @property
    def size(self) -> int:
        return len(self.indptr) - 1

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.indptr)

    @staticmethod
    def identity(size: int, offset: int) -> Dep:
        return Dep(np.arange(size + 1, dtype=np.int64), np.arange(offset, offset + size, dtype=np.int64), True, offset)

    @staticmethod
    def empty(size: int) -> Dep:
        return Dep(np.zeros(size + 1, np.int64), np.zeros(0, np.int64), True)

    def same(self, other: Dep) -> bool:
        return self is other or (np.array_equal(self.indptr, other.indptr) and np.array_equal(self.cols, other.cols))

    def rows(self, source: np.ndarray) -> Dep:
        """The Dep whose element i is this one's element ``source[i]`` (-1: depends on nothing)."""
        source = np.asarray(source, np.int64)
        valid = source >= 0
        counts = np.where(valid, self.counts[np.where(valid, source, 0)], 0)
        indptr = np.zeros(len(source) + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        picked = source[valid]
        injective = self.injective and np.bincount(picked, minlength=1).max(initial=0) <= 1
        if counts.size and np.all(counts == 1) and np.array_equal(self.indptr, np.arange(self.size + 1)):
            return Dep(indptr, self.cols[source], injective)
        positions = _ranges(self.indptr[source], counts)
        return Dep(indptr, self.cols[positions], injective)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(start, start + count)`` for each pair, vectorised."""
    total = int(counts.sum())
    if not total:
        return np.zeros(0, np.int64)
    ends = np.cumsum(counts)
    shift = np.repeat(starts - (ends - counts), counts)
    return np.arange(total, dtype=np.int64) + shift


def _stack(deps: list, sizes: list[int]) -> Dep:
    """Deps (None: no dependence) of several tensors one after another, as one Dep."""
    parts = [d if d is not None else Dep.empty(s) for d, s in zip(deps, sizes)]
    counts = np.concatenate([p.counts for p in parts]) if parts else np.zeros(0, np.int64)
    indptr = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    cols = np.concatenate([p.cols for p in parts]) if parts else np.zeros(0, np.int64)
    injective = all(p.injective for p in parts) and _distinct(cols)
    return Dep(indptr, cols, injective)


class _Tracer:
    """Walks a traced graph op by op, giving each tensor its ``Dep`` (None: no dependence)."""

    def __init__(self, n: int, budget: int):
        self.n, self.budget = n, budget

    # -- combining ---------------------------------------------------------------------

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
        return Dep(indptr, cols, bool(np.all(np.diff(indptr) <= 1)) and _distinct(cols))

    def union(self, deps: list, what: str) -> Dep | None:
        """Element-wise union of Deps of one size (None entries ignored)."""
        present = [d for d in deps if d is not None]
        if not present:
            return None
        first = present[0]
        if all(first.same(d) for d in present[1:]):
            return first
        self._check(sum(len(d.cols) for d in present), what)
        n = max(self.n, 1)
        keys = np.concatenate([np.repeat(np.arange(d.size, dtype=np.int64), d.counts) * n + d.cols for d in present])
        return self._from_keys(_unique(keys), first.size)

    def compose(self, indptr: np.ndarray, idx: np.ndarray, dep: Dep | None, what: str) -> Dep | None:
        """Output element o reads input elements ``idx[indptr[o]:indptr[o+1]]`` (distinct): its Dep."""
        if dep is None:
            return None
        size = len(indptr) - 1
        if dep.offset >= 0:  # reading the checked input itself: element e is column offset + e
            self._check(len(idx), what)
            cols = idx + dep.offset if dep.offset else idx
            return Dep(indptr, cols, bool(np.all(np.diff(indptr) <= 1)) and _distinct(cols))
        counts = dep.counts[idx]
        self._check(int(counts.sum()), what)
        owner = np.repeat(np.arange(size, dtype=np.int64), np.diff(indptr))
        cols = dep.cols[_ranges(dep.indptr[idx], counts)]
        rows = np.repeat(owner, counts)
        if dep.injective:  # distinct inputs of distinct columns: no duplicate within a row
            out_counts = np.bincount(rows, minlength=size)
            out = np.zeros(size + 1, np.int64)
            np.cumsum(out_counts, out=out[1:])
            return Dep(out, cols, bool(np.all(out_counts <= 1)) and _distinct(cols))
        return self._from_keys(_unique(rows * max(self.n, 1) + cols), size)

    def windows(self, table: np.ndarray, dep: Dep | None, what: str) -> Dep | None:
        """``compose`` for a dense table [out_size, k] of input elements (-1: none)."""
        if dep is None:
            return None
        table = table.reshape(table.shape[0], -1)
        valid = table >= 0
        indptr = np.zeros(table.shape[0] + 1, np.int64)
        np.cumsum(valid.sum(axis=1), out=indptr[1:])
        return self.compose(indptr, table[valid], dep, what)

    # -- the walk ------------------------------------------------------------------------

    def run(self, graph, inputs: list) -> dict:
        """Deps of every tensor of ``graph`` reachable from ``inputs`` (one Dep or None per graph input)."""
        deps: dict = {}
        for tensor, dep in zip(graph.inputs, inputs):
            deps[tensor.ref()] = dep
        for op in graph.get_operations():
            if op.type == "Placeholder":
                continue
            ins = [deps.get(t.ref()) for t in op.inputs]
            if all(d is None for d in ins) or not op.outputs:
                continue
            outs = self.op(op, ins)
            for tensor, dep in zip(op.outputs, outs):
                deps[tensor.ref()] = dep
        return deps

    def op(self, op, ins: list) -> list:
        kind = op.type
        what = f"op {kind} ({op.name})"
        if kind in NO_DEPENDENCE:
            return [None] * len(op.outputs)
        if kind in FLAT_IDENTITY:
            return [ins[0]]
        if kind == "IdentityN":
            return list(ins)
        if kind in ("PartitionedCall", "StatefulPartitionedCall"):
            body = op.graph._get_function(op.get_attr("f").name).graph
            inner = self.run(body, ins + [None] * (len(body.inputs) - len(ins)))
            return [inner.get(t.ref()) for t in body.outputs]
        if kind in ELEMENTWISE or kind in ("BiasAdd", "BiasAddV1"):
            return [self.elementwise(op, ins, what)]
        if kind in MOVEMENT:
            return self.replay(op, ins, what)
        if kind in REDUCTIONS:
            return [self.reduction(op, ins, what)]
        if kind in ("Softmax", "LogSoftmax"):
            shape = _shape(op.inputs[0])
            idx = np.arange(_prod(shape)).reshape(-1, shape[-1] if shape else 1)
            table = np.repeat(idx, idx.shape[1], axis=0)
            return [self.windows(table, ins[0], what)]
        if kind in ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
            return [self.matmul(op, ins, what)]
        if kind in ("Conv2D", "DepthwiseConv2dNative", "AvgPool", "MaxPool"):
            return [self.stencil(op, ins, what)]
        raise UnknownSparsity(f"{what} has no dependency rule")

    def elementwise(self, op, ins: list, what: str) -> Dep | None:
        out_shape = _shape(op.outputs[0])
        size = _prod(out_shape)
        parts = []
        for position, (tensor, dep) in enumerate(zip(op.inputs, ins)):
            if dep is None:
                continue
            if op.type == "Fill" and position == 0:
                raise UnknownSparsity(f"{what}: its shape depends on a checked input")
            shape = _shape(tensor)
            if op.type.startswith("BiasAdd") and position == 1 and _data_format(op).startswith("NC"):
                shape = shape + (1,) * (len(out_shape) - 2)  # the bias runs along axis 1
            if shape == out_shape:
                parts.append(dep)
                continue
            source = np.arange(_prod(shape), dtype=np.int64).reshape((1,) * (len(out_shape) - len(shape)) + shape)
            parts.append(dep.rows(np.broadcast_to(source, out_shape).reshape(size)))
        return self.union(parts, what)

    def replay(self, op, ins: list, what: str) -> list:
        """Run the op itself on element codes (float64 offset + index + 1; 0: no dependence)."""
        data = MOVEMENT[op.type]
        inferred, kwargs, position = set(), {}, 0
        sizes: list[int] = []
        codes_of: list = []
        for arg in op.op_def.input_arg:
            count = op.get_attr(arg.number_attr) if arg.number_attr else 1
            for attr in (arg.type_attr, arg.number_attr, arg.type_list_attr):
                if attr:
                    inferred.add(attr)
            tensors = list(op.inputs[position : position + count])
            values = []
            for offset, tensor in enumerate(tensors):
                dep = ins[position + offset]
                if arg.name in data:
                    size = _prod(_shape(tensor))
                    start = sum(sizes) + 1
                    codes = (np.arange(size, dtype=np.float64) + start) if dep is not None else np.zeros(size)
                    values.append(tf.constant(codes.reshape(_shape(tensor)), tf.float64))
                    sizes.append(size)
                    codes_of.append(dep)
                else:
                    if dep is not None:
                        raise UnknownSparsity(f"{what}: its argument {arg.name!r} depends on a checked input")
                    value = tf.get_static_value(tensor)
                    if value is None:
                        raise UnknownSparsity(f"{what}: its argument {arg.name!r} is not a constant")
                    values.append(tf.constant(value, tensor.dtype))
            kwargs[arg.name] = values if arg.number_attr or arg.type_list_attr else values[0]
            position += count
        for name in op.node_def.attr:
            if name not in inferred and not name.startswith("_"):
                kwargs[name] = op.get_attr(name)
        try:
            result = getattr(tf.raw_ops, op.type)(**kwargs)
        except Exception as error:  # an attribute or form this rule does not know
            raise UnknownSparsity(f"{what}: replaying it on element codes failed ({type(error).__name__})") from None
        results = result if isinstance(result, (list, tuple)) else [result]
        stacked = _stack(codes_of, sizes)
        return [stacked.rows(np.asarray(r.numpy(), np.float64).reshape(-1).astype(np.int64) - 1)
                if r.dtype == tf.float64 else None for r in results]

    def reduction(self, op, ins: list, what: str) -> Dep | None:
        if ins[1] is not None:
            raise UnknownSparsity(f"{what}: its axes depend on a checked input")
        shape = _shape(op.inputs[0])
        axes = tf.get_static_value(op.inputs[1])
        if axes is None:
            raise UnknownSparsity(f"{what}: its axes are not constant")
        axes = sorted({int(a) % max(len(shape), 1) for a in np.atleast_1d(axes)})
        kept = [a for a in range(len(shape)) if a not in axes]
        idx = np.arange(_prod(shape), dtype=np.int64).reshape(shape).transpose(kept + axes)
        return self.windows(idx.reshape(_prod([shape[a] for a in kept]), -1), ins[0], what)

    def matmul(self, op, ins: list, what: str) -> Dep | None:
        a_shape, b_shape, out_shape = _shape(op.inputs[0]), _shape(op.inputs[1]), _shape(op.outputs[0])
        if op.type == "MatMul":
            flips = (op.get_attr("transpose_a"), op.get_attr("transpose_b"))
        else:
            flips = (op.get_attr("adj_x"), op.get_attr("adj_y"))
        a = np.arange(_prod(a_shape), dtype=np.int64).reshape(a_shape)
        b = np.arange(_prod(b_shape), dtype=np.int64).reshape(b_shape)
        a = np.swapaxes(a, -1, -2) if flips[0] else a
        b = np.swapaxes(b, -1, -2) if flips[1] else b
        batch, (i, j), k = out_shape[:-2], out_shape[-2:], a.shape[-1]
        a = np.broadcast_to(a, batch + a.shape[-2:])
        b = np.broadcast_to(b, batch + b.shape[-2:])
        parts = []
        if ins[0] is not None:
            parts.append(self.windows(np.broadcast_to(a[..., :, None, :], batch + (i, j, k)).reshape(-1, k), ins[0], what))
        if ins[1] is not None:
            rows = np.swapaxes(b, -1, -2)[..., None, :, :]  # [..., 1, j, k]
            parts.append(self.windows(np.broadcast_to(rows, batch + (i, j, k)).reshape(-1, k), ins[1], what))
        return self.union(parts, what)

    def stencil(self, op, ins: list, what: str) -> Dep | None:
        """Conv2D, DepthwiseConv2dNative, AvgPool, MaxPool: each output reads a window of the input."""
        fmt = _data_format(op)
        shape, out_shape = _shape(op.inputs[0]), _shape(op.outputs[0])
        if fmt.startswith("NC"):
            order, back = (0, 2, 3, 1), (0, 3, 1, 2)
        else:
            order, back = (0, 1, 2, 3), (0, 1, 2, 3)
        batch, height, width, channels = (shape[a] for a in order)
        _, out_h, out_w, out_c = (out_shape[a] for a in order)
        strides = [op.get_attr("strides")[a] for a in order][1:3]
        dilations = [op.get_attr("dilations")[a] for a in order][1:3] if op.type.startswith(("Conv", "Depth")) else [1, 1]
        if op.type in ("AvgPool", "MaxPool"):
            kernel = [op.get_attr("ksize")[a] for a in order][1:3]
        else:
            kernel = list(_shape(op.inputs[1])[:2])
        padding = op.get_attr("padding").decode()
        explicit = op.get_attr("explicit_paddings") if padding == "EXPLICIT" else []
        idx = np.arange(_prod(shape), dtype=np.int64).reshape(shape).transpose(order)  # NHWC view
        pads = []
        for axis, (size, out, s, k, d) in enumerate(zip((height, width), (out_h, out_w), strides, kernel, dilations)):
            needed = (out - 1) * s + (k - 1) * d + 1
            if padding == "SAME":
                before = max(needed - size, 0) // 2
            elif padding == "EXPLICIT":
                before = explicit[2 * order[axis + 1]]
            else:
                before = 0
            pads.append((before, max(needed - size - before, 0)))
        padded = np.pad(idx, ((0, 0), pads[0], pads[1], (0, 0)), constant_values=-1)
        ys = np.arange(out_h)[:, None] * strides[0] + np.arange(kernel[0])[None, :] * dilations[0]
        xs = np.arange(out_w)[:, None] * strides[1] + np.arange(kernel[1])[None, :] * dilations[1]
        window = padded[:, ys[:, None, :, None], xs[None, :, None, :], :]  # [B, OH, OW, kh, kw, C]
        spatial = (batch, out_h, out_w)
        parts = []
        if op.type == "Conv2D":
            flat = window.reshape(spatial + (1, -1))
            table = np.broadcast_to(flat, spatial + (out_c, flat.shape[-1]))
        else:  # per channel: depthwise (times its multiplier) and pooling
            per_channel = np.moveaxis(window, -1, 3).reshape(spatial + (channels, 1, -1))
            multiplier = out_c // channels
            table = np.broadcast_to(per_channel, spatial + (channels, multiplier, per_channel.shape[-1]))
        table = np.transpose(table.reshape(spatial + (out_c, -1)), back + (4,))
        if ins[0] is not None:
            parts.append(self.windows(table.reshape(-1, table.shape[-1]), ins[0], what))
        if len(ins) > 1 and ins[1] is not None and op.type != "AvgPool":
            f_shape = _shape(op.inputs[1])
            f_idx = np.arange(_prod(f_shape), dtype=np.int64).reshape(f_shape[0] * f_shape[1], -1, f_shape[-1])
            if op.type == "Conv2D":
                per_out = np.moveaxis(f_idx, -1, 0).reshape(out_c, -1)  # [Co, kh*kw*Ci]
            else:
                per_out = np.moveaxis(f_idx.reshape(f_idx.shape[0], -1), -1, 0)  # [C*mult, kh*kw]
            filters = np.broadcast_to(per_out, spatial + per_out.shape)
            filters = np.transpose(filters, back + (4,))
            parts.append(self.windows(filters.reshape(-1, per_out.shape[-1]), ins[1], what))
        return self.union(parts, what)


def _shape(tensor) -> tuple:
    shape = tensor.shape
    if shape.rank is None or any(d is None for d in shape.as_list()):
        raise UnknownSparsity(f"tensor {tensor.name} has no static shape")
    return tuple(int(d) for d in shape.as_list())


def _prod(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _data_format(op) -> str:
    try:
        return op.get_attr("data_format").decode()
    except ValueError:
        return "NHWC"


# -- the rules, as data ---------------------------------------------------------------------

# Ops whose outputs never depend on input values.
NO_DEPENDENCE = frozenset({"Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike", "BroadcastArgs",
                           "BroadcastGradientArgs", "NoOp"})
# Ops whose output is their first input in flat order (same elements, maybe another shape or dtype).
FLAT_IDENTITY = frozenset({"Identity", "Snapshot", "Reshape", "Squeeze", "ExpandDims", "EnsureShape", "StopGradient",
                           "PreventGradient", "CheckNumerics", "Cast", "Bitcast"})
# Element-wise ops, with numpy broadcasting of their inputs.
ELEMENTWISE = frozenset({
    # unary
    "Neg", "Abs", "Sign", "Square", "Sqrt", "Rsqrt", "Reciprocal", "Inv", "Exp", "Expm1", "Log", "Log1p",
    "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Tanh", "Asinh", "Acosh", "Atanh",
    "Sigmoid", "Relu", "Relu6", "Elu", "Selu", "Gelu", "LeakyRelu", "Softplus", "Softsign", "Erf", "Erfc", "Erfinv",
    "Lgamma", "Digamma", "Floor", "Ceil", "Round", "Rint", "IsFinite", "IsNan", "IsInf", "LogicalNot",
    # binary and more
    "Add", "AddV2", "Sub", "Mul", "MulNoNan", "Div", "RealDiv", "DivNoNan", "FloorDiv", "FloorMod", "TruncateDiv",
    "Maximum", "Minimum", "Pow", "SquaredDifference", "Atan2", "Xdivy", "Xlogy", "Xlog1py", "Igamma", "Igammac",
    "Less", "LessEqual", "Greater", "GreaterEqual", "Equal", "NotEqual", "LogicalAnd", "LogicalOr",
    "AddN", "Select", "SelectV2", "ClipByValue", "Fill", "Betainc",
})
# Data-movement ops, replayed on element codes: op type -> the arguments that carry data.
MOVEMENT = {
    "Transpose": ("x",), "Slice": ("input",), "StridedSlice": ("input",), "ConcatV2": ("values",),
    "Pack": ("values",), "Unpack": ("value",), "Pad": ("input",), "PadV2": ("input", "constant_values"),
    "MirrorPad": ("input",), "Tile": ("input",), "GatherV2": ("params",), "GatherNd": ("params",),
    "ReverseV2": ("tensor",), "BroadcastTo": ("input",), "Split": ("value",), "SplitV": ("value",),
    "DepthToSpace": ("input",), "SpaceToDepth": ("input",), "Roll": ("input",),
}
# Reductions over constant axes (argument 1).
REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "EuclideanNorm", "ArgMax", "ArgMin", "All", "Any"})


def trace(function, signature: list, checked: list[tuple[int, int]], budget: int = NONZERO_BUDGET) -> tuple[int, Dep | None]:
    """(m, Dep of the flat output) of a one-output ``tf.function`` of every input.

    ``checked``: (argument position, size) of each checked input, in order; their
    elements are the global columns, one input after another.
    """
    concrete = function.get_concrete_function(*signature)
    graph = concrete.graph
    n = sum(size for _, size in checked)
    tracer = _Tracer(n, budget)
    inputs: list = [None] * len(graph.inputs)
    offset = 0
    for position, size in checked:
        inputs[position] = Dep.identity(size, offset)
        offset += size
    deps = tracer.run(graph, inputs)
    (output,) = graph.outputs
    return _prod(_shape(output)), deps.get(output.ref())


def traced_patterns(m: int, dep: Dep | None, sizes: list[int]) -> list[Pattern]:
    """The Dep of the flat output cut into one Pattern per checked input."""
    if dep is None:
        dep = Dep.empty(m)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    if dep.offset >= 0 and dep.size == m:  # elementwise in one input: no index arithmetic
        return [Pattern.identity(m) if (dep.offset == bounds[k] and size == m)
                else Pattern((m, size), np.zeros(0, np.int64), np.zeros(0, np.int64)) for k, size in enumerate(sizes)]
    rows = np.repeat(np.arange(m, dtype=np.int64), dep.counts)
    rows, cols = _sorted(rows, dep.cols, max(int(bounds[-1]), 1))
    result = []
    for k, size in enumerate(sizes):
        mine = (cols >= bounds[k]) & (cols < bounds[k + 1])
        result.append(Pattern((m, size), rows[mine], cols[mine] - bounds[k]))
    return result


# -- colourings -------------------------------------------------------------------------------


def colour(pattern: Pattern, shape: tuple, seed: int = 0) -> np.ndarray:
    """Column colours [n] (0 .. C-1): columns sharing a row differ.  ``shape``: the columns' index shape.

    The lattice colouring first; the greedy one where it is affordable and the lattice
    exceeds the lower bound (the longest row).
    """
    n = pattern.shape[1]
    if not pattern.nnz or pattern.diagonal:
        return np.zeros(n, np.int64)
    indptr = pattern.indptr
    bound = int(np.diff(indptr).max())
    if bound <= 1:  # no two columns share a row (elementwise f): one colour
        return np.zeros(n, np.int64)
    best = lattice(pattern, indptr, shape)
    count = int(best.max()) + 1 if n else 0
    if count > bound and int(np.sum(np.diff(indptr) ** 2)) <= GREEDY_WORK:
        greedy = greedy_colours(indptr, pattern.cols, n, np.random.default_rng(seed))
        if int(greedy.max()) + 1 < count:
            best = greedy
    return best


def lattice(pattern: Pattern, indptr: np.ndarray, shape: tuple) -> np.ndarray:
    """Colour = each coordinate modulo K_a, K_a = the widest extent of a row along axis a, plus 1.

    Two columns of one row differ along some axis by less than its K, so equal
    residues on every axis mean the same column: the colouring is valid, in O(nonzeros).
    """
    shape = tuple(shape) if shape else (pattern.shape[1],)
    starts = indptr[:-1][np.diff(indptr) > 0]
    strides = np.cumprod((1,) + tuple(shape[:0:-1]))[::-1]
    moduli = []
    for axis in range(len(shape)):  # one axis at a time: one nnz-sized coordinate array alive
        coord = pattern.cols // int(strides[axis])
        coord %= int(shape[axis])
        extent = np.maximum.reduceat(coord, starts) - np.minimum.reduceat(coord, starts)
        del coord
        moduli.append(int(min(extent.max() + 1, shape[axis])))
    grid = np.unravel_index(np.arange(pattern.shape[1]), shape)
    labels = np.zeros(pattern.shape[1], np.int64)
    for coord, modulus in zip(grid, moduli):
        labels = labels * modulus + coord % modulus
    return _compact(labels)


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
        rows_of = _ranges(col_ptr[chosen], np.diff(col_ptr)[chosen])
        owner = np.repeat(np.arange(len(chosen)), np.diff(col_ptr)[chosen])
        rows = col_rows[rows_of]
        neighbours = cols[_ranges(indptr[rows], lengths[rows])]
        who = np.repeat(owner, lengths[rows])
        taken = labels[neighbours]
        keep = taken >= 0
        width = int(taken.max(initial=0)) + 2
        keys = _unique(who[keep] * width + taken[keep])
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


def _sorted(rows: np.ndarray, cols: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs ordered by (row, col); no sort when they already are (elementwise f: always)."""
    keys = rows * n + cols
    if keys.size < 2 or bool(np.all(keys[1:] > keys[:-1])):
        return rows, cols
    order = np.argsort(keys, kind="stable")
    return rows[order], cols[order]


def transpose(pattern: Pattern) -> Pattern:
    """The pattern of the transposed block (for row colourings)."""
    if pattern.diagonal:
        return pattern
    rows, cols = _sorted(pattern.cols, pattern.rows, max(pattern.shape[0], 1))
    return Pattern((pattern.shape[1], pattern.shape[0]), rows, cols)


def joined(patterns: list[Pattern]) -> Pattern:
    """Blocks of one set of rows side by side: [m, n_1 + n_2 + ...]."""
    m = patterns[0].shape[0]
    offsets = np.concatenate([[0], np.cumsum([p.shape[1] for p in patterns])])
    if len(patterns) == 1:
        return patterns[0]
    rows = np.concatenate([p.rows for p in patterns])
    cols = np.concatenate([p.cols + o for p, o in zip(patterns, offsets)])
    rows, cols = _sorted(rows, cols, max(int(offsets[-1]), 1))
    return Pattern((m, int(offsets[-1])), rows, cols)
