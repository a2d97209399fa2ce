"""Finding the Jacobian's sparsity pattern from f's graph (for ``mode="coloured"``; its colourings: ``colouring``).

A pattern (``pattern.Pattern``: shared column sets per row group) comes from one of two sources:

* the user's ``sparsity=`` option (``pattern.GivenSparsity``): a boolean array ``[m, n_k]``, index pairs
  ``(rows, cols)``, or anything with ``.tocoo()`` (scipy.sparse-like; scipy itself is not needed), or a list of
  those, one per checked input;
* a **dependency trace** of f's traced graph (``trace``): op by op, each tensor gets, per element, the set of input
  elements it depends on (``dep.Dep``: elements pointing at shared groups of a CSR table; unions of sets that contain
  one another keep the containing group).  Structured ops are index arithmetic on numpy index arrays, never a
  Python loop per element; data-movement ops (slices, concatenations, pads, gathers with constant indices ...) are
  *replayed*: TensorFlow runs the op itself on a float64 tensor of element codes, so each output element names the
  input element it copies.  An op without a rule, or a pattern beyond ``NONZERO_BUDGET``, raises
  ``UnknownSparsity``: the coloured check refuses.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from fastcheck.engine.tables import FOLD_DEPTH, LOOP_ROUNDS, NONZERO_BUDGET
from fastcheck.sparsity.dep import Dep, Sets, stack, unique_inverse
from fastcheck.sparsity.ops import (
    ELEMENTWISE,
    FLAT_IDENTITY,
    MATRIX_OPS,
    MOVEMENT,
    NO_DEPENDENCE,
    NO_FOLD,
    REDUCTIONS,
    RESIZES,
    STENCILS,
)
from fastcheck.sparsity.pattern import Pattern, UnknownSparsity, index_array, ranges, sorted_unique

if TYPE_CHECKING:
    from fastcheck.engine.plan import Plan



def _run_op(op, inputs: list) -> list:
    """``op`` run eagerly through ``tf.raw_ops`` on ``inputs`` (one tensor per op input), with its attributes."""
    run = getattr(tf.raw_ops, op.type)
    # tf.raw_ops renames a few inputs (Split's split_dim is its axis): those go by position.
    params, names = list(inspect.signature(run).parameters), [arg.name for arg in op.op_def.input_arg]
    rename = dict(zip(names, params)) if set(names) - set(params) else {}
    kwargs, inferred, position = {}, set(), 0
    for arg in op.op_def.input_arg:
        count = op.get_attr(arg.number_attr) if arg.number_attr else (
            len(op.get_attr(arg.type_list_attr)) if arg.type_list_attr else 1)
        for attr in (arg.type_attr, arg.number_attr, arg.type_list_attr):
            if attr:
                inferred.add(attr)
        values = inputs[position : position + count]
        kwargs[rename.get(arg.name, arg.name)] = values if arg.number_attr or arg.type_list_attr else values[0]
        position += count
    for name in op.node_def.attr:
        if name not in inferred and not name.startswith("_"):
            kwargs[name] = op.get_attr(name)
    result = run(**kwargs)
    return list(result) if isinstance(result, (list, tuple)) else [result]


class Tracer(Sets):
    """Walks a traced graph op by op, giving each tensor its ``Dep`` (None: no dependence)."""

    def __init__(self, n: int, budget: int, captured: dict | None = None):
        super().__init__(n, budget)
        # Placeholders of values f captured from outside (a tf.constant made before f): their values.
        self.captured = captured or {}
        self._folded: dict = {}

    def constant(self, tensor, depth: int = 0):
        """The value of ``tensor`` if it is constant -- in the graph, a captured eager value, or
        computed by stateless ops from those (``tf.nn.softmax(x, axis=0)`` builds its transposes'
        permutation with Range and Sub) -- else None."""
        key = tensor.ref()
        if key in self._folded:
            return self._folded[key]
        value = tf.get_static_value(tensor)
        if value is None and key in self.captured:
            external = self.captured[key]
            if external.dtype != tf.resource and hasattr(external, "numpy"):
                value = external.numpy()
        op = tensor.op
        if (value is None and depth < FOLD_DEPTH and op.inputs and op.type != "Placeholder"
                and not op.op_def.is_stateful and op.type not in NO_FOLD):
            inputs = [self.constant(t, depth + 1) for t in op.inputs]
            if all(v is not None for v in inputs):
                try:
                    results = _run_op(op, [tf.constant(v, t.dtype) for v, t in zip(inputs, op.inputs)])
                    value = results[list(op.outputs).index(tensor)].numpy()
                except Exception:  # an attribute or form this cannot replay: not a constant here
                    value = None
        self._folded[key] = value
        return value

    # -- the walk ------------------------------------------------------------------------

    def run(self, graph, inputs: list) -> dict:
        """Deps of every tensor of ``graph`` reachable from ``inputs`` (one Dep or None per graph input)."""
        return self.walk(graph, {tensor.ref(): dep for tensor, dep in zip(graph.inputs, inputs)})

    def walk(self, graph, deps: dict) -> dict:
        """``deps`` (tensor ref -> Dep of the tensors the walk starts from) with every tensor of ``graph``
        reachable from them added, op by op in graph order."""
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
        if kind in ("While", "StatelessWhile"):
            return self.loop(op, ins, what)
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
            # One set per row of the last axis, shared by the row's outputs.
            shape = _shape(op.inputs[0])
            last = shape[-1] if shape else 1
            per_row = self.windows(np.arange(_prod(shape), dtype=np.int64).reshape(-1, last), ins[0], what)
            return [None if per_row is None else per_row.rows(np.arange(_prod(shape), dtype=np.int64) // last)]
        if kind in ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
            return [self.matmul(op, ins, what)]
        if kind in STENCILS:
            return [self.stencil(op, ins, what)]
        if kind in RESIZES:
            return [self.resize(op, ins, what)]
        if kind == "ScatterNd":
            return [self.scatter(op, ins, what)]
        if kind in ("Conv2DBackpropInput", "Conv3DBackpropInputV2"):
            return [self.transposed(op, ins, what)]
        if kind in ("SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits"):
            return self.cross_entropy(op, ins, what)
        if kind in MATRIX_OPS:
            return self.matrices(op, ins, what)
        if kind in ("Cumsum", "Cumprod"):
            return [self.cumulative(op, ins, what)]
        if kind == "TopKV2":  # the values read their whole row of the last axis; the indices are integers
            if ins[1] is not None:
                raise UnknownSparsity(f"{what}: its k depends on a checked input")
            shape, k = _shape(op.inputs[0]), _shape(op.outputs[0])[-1]
            size = _prod(shape)
            per_row = self.windows(np.arange(size, dtype=np.int64).reshape(-1, shape[-1] if shape else 1), ins[0], what)
            assert per_row is not None
            return [per_row.rows(np.arange(_prod(_shape(op.outputs[0])), dtype=np.int64) // max(k, 1)), None]
        if kind == "Einsum":
            return [self.einsum(op, ins, what)]
        raise UnknownSparsity(f"{what} has no dependency rule")

    def cumulative(self, op, ins: list, what: str) -> Dep | None:
        """Cumsum, Cumprod: element i along the axis reads the elements before it (``exclusive``: strictly; ``reverse``:
        after it), the other axes fixed."""
        if ins[1] is not None:
            raise UnknownSparsity(f"{what}: its axis depends on a checked input")
        shape = _shape(op.inputs[0])
        axis = self.constant(op.inputs[1])
        if axis is None or not shape:
            raise UnknownSparsity(f"{what}: its axis is not constant")
        axis = int(axis) % len(shape)
        size, length = _prod(shape), shape[axis]
        self._check(size * length, what)
        i, j = np.arange(length)[:, None], np.arange(length)[None, :]
        exclusive, reverse = op.get_attr("exclusive"), op.get_attr("reverse")
        read = (j > i if exclusive else j >= i) if reverse else (j < i if exclusive else j <= i)
        moved = np.moveaxis(np.arange(size, dtype=np.int64).reshape(shape), axis, -1)  # [..., L]: flat indices
        table = np.where(read, moved[..., None, :], -1).reshape(-1, length)  # per element of ``moved``: what it reads
        ordered = np.empty_like(table)
        ordered[moved.reshape(-1)] = table
        return self.windows(ordered, ins[0], what)

    def einsum(self, op, ins: list, what: str) -> Dep | None:
        """An output element reads, of each input, the elements whose letters it shares take its coordinates (the
        summed letters range over their axis): one set per combination of shared coordinates."""
        inputs, _, output = op.get_attr("equation").decode().replace(" ", "").partition("->")
        out_shape = _shape(op.outputs[0])
        if "." in inputs + output or len(output) != len(out_shape):
            raise UnknownSparsity(f"{what}: an equation with an ellipsis or without its output")
        coords = np.indices(out_shape, dtype=np.int64).reshape(len(out_shape), _prod(out_shape))
        parts = []
        for term, tensor, dep in zip(inputs.split(","), op.inputs, ins):
            if dep is None:
                continue
            shape = _shape(tensor)
            shared = [c for c in term if c in output]
            if len(term) != len(shape) or len(set(term)) != len(term) or any(
                    shape[term.index(c)] != out_shape[output.index(c)] for c in shared):
                raise UnknownSparsity(f"{what}: a repeated or broadcast letter in {term!r}")
            order = [term.index(c) for c in shared] + [a for a, c in enumerate(term) if c not in output]
            sizes = [shape[term.index(c)] for c in shared]
            sets = np.arange(_prod(shape), dtype=np.int64).reshape(shape).transpose(order).reshape(_prod(sizes), -1)
            group = np.zeros(coords.shape[1], np.int64)
            for c, extent in zip(shared, sizes):
                group = group * extent + coords[output.index(c)]
            per_set = self.windows(sets, dep, what)
            assert per_set is not None
            parts.append(per_set.rows(group))
        return self.union(parts, what)

    def loop(self, op, ins: list, what: str) -> list:
        """A while loop's outputs: the fixed point of its body's dependencies over the loop variables, which only grow
        from round to round -- so whatever the number of iterations, it holds every dependence they make."""
        body = op.graph._get_function(op.get_attr("body").name).graph
        deps = list(ins)
        for _ in range(LOOP_ROUNDS):
            inner = self.run(body, deps + [None] * (len(body.inputs) - len(deps)))
            out = [inner.get(t.ref()) for t in body.outputs]
            if any(d is not None and o is not None and d.size != o.size for d, o in zip(deps, out)):
                raise UnknownSparsity(f"{what}: a loop variable changes its shape")
            grown = [self.union([d, o], what) for d, o in zip(deps, out)]
            if all(a is b or (a is not None and b is not None and a.same(b)) for a, b in zip(deps, grown)):
                return grown
            deps = grown
        raise UnknownSparsity(f"{what}: its dependencies still grew after {LOOP_ROUNDS} rounds of its body")

    def scatter(self, op, ins: list, what: str) -> Dep | None:
        """ScatterNd with constant indices [N, d] into a shape [*outer (d axes), *slice]: an output element reads the
        same slice element of every update row scattered to its outer position (duplicates sum)."""
        indices, shape = self.constant(op.inputs[0]), self.constant(op.inputs[2])
        if ins[0] is not None or ins[2] is not None or indices is None or shape is None:
            raise UnknownSparsity(f"{what}: its indices or shape are not constant")
        indices, shape = np.asarray(indices, np.int64), [int(d) for d in np.atleast_1d(shape)]
        depth = indices.shape[-1]
        outer, width = _prod(shape[:depth]), _prod(shape[depth:])
        target = np.ravel_multi_index(tuple(indices.reshape(-1, depth).T), shape[:depth]) if depth else \
            np.zeros(indices.size, np.int64)
        self._check(len(target) * width, what)
        # every (update row, slice element) pair, as the output element it adds to
        rows = np.repeat(np.arange(len(target), dtype=np.int64), width)
        element = np.tile(np.arange(width, dtype=np.int64), len(target))
        keys = target[rows] * width + element
        order = np.argsort(keys, kind="stable")
        indptr = np.zeros(outer * width + 1, np.int64)
        np.cumsum(np.bincount(keys, minlength=outer * width), out=indptr[1:])
        return self.compose(indptr, (rows * width + element)[order], ins[1], what)

    def resize(self, op, ins: list, what: str) -> Dep | None:
        """Image resizing [B, H, W, C] (``RESIZES``): separable, so an output pixel reads the input rows its row's
        weights reach times the columns its column's do -- each read by running the op itself on a basis of rows
        (columns) of one pixel's width (height), with its attributes (corners, pixel centres)."""
        if ins[1] is not None:
            raise UnknownSparsity(f"{what}: its size depends on a checked input")
        batch, height, width, channels = _shape(op.inputs[0])
        _, out_h, out_w, _ = _shape(op.outputs[0])
        size = tf.constant([out_h, out_w], tf.int32)

        def reached(n: int, axis: int) -> np.ndarray:
            """[out, k]: the input rows (axis 1) or columns (axis 2) each output one reads, -1 past them."""
            basis = np.eye(n).reshape((n, n, 1, 1) if axis == 1 else (n, 1, n, 1))
            out = np.asarray(_run_op(op, [tf.constant(basis, op.inputs[0].dtype), size])[0].numpy(), np.float64)
            weights = (out[:, :, 0, 0] if axis == 1 else out[:, 0, :, 0]) != 0  # [in, out]
            k = max(int(weights.sum(axis=0).max(initial=0)), 1)
            first = np.argsort(~weights, axis=0, kind="stable")[:k]  # each output's reached inputs first, in order
            return np.where(np.take_along_axis(weights, first, 0), first, -1).T

        ys, xs = reached(height, 1), reached(width, 2)
        self._check(batch * out_h * out_w * channels * ys.shape[1] * xs.shape[1], what)
        b = np.arange(batch)[:, None, None, None, None, None]
        y, x = ys[None, :, None, None, :, None], xs[None, None, :, None, None, :]
        c = np.arange(channels)[None, None, None, :, None, None]
        table = np.where((y >= 0) & (x >= 0), ((b * height + y) * width + x) * channels + c, -1)
        return self.windows(table.reshape(batch * out_h * out_w * channels, -1), ins[0], what)

    def transposed(self, op, ins: list, what: str) -> Dep | None:
        """A transposed convolution (conv2d_transpose: a convolution's input gradient), channels last: output pixel
        p reads every channel of the incoming pixels whose forward window holds p, and of the filter its input
        channel's taps (all of them: a superset at the edges)."""
        if ins[0] is not None or not _data_format(op).endswith("C"):
            raise UnknownSparsity(f"{what}: its sizes depend on a checked input, or its channels come first")
        shape, incoming, f_shape = _shape(op.outputs[0]), _shape(op.inputs[2]), _shape(op.inputs[1])
        spatial, order = len(shape) - 2, tuple(range(len(shape)))
        channels, out_c = shape[-1], incoming[-1]
        pixels, incoming_pixels = _prod(shape[:-1]), _prod(incoming[:-1])
        strides, dilations = list(op.get_attr("strides"))[1:-1], list(op.get_attr("dilations"))[1:-1]
        # The forward convolution's window of each incoming pixel, as output pixels (channel 0 of each).
        window = _window(op, shape, order, list(incoming[1:-1]), strides, list(f_shape[:spatial]), dilations)
        reads = window[..., 0].reshape(incoming_pixels, -1)
        source = np.repeat(np.arange(incoming_pixels, dtype=np.int64), reads.shape[1])
        target = reads.reshape(-1) // channels
        keep = reads.reshape(-1) >= 0
        source, target = source[keep], target[keep]
        by_pixel = np.argsort(target, kind="stable")
        indptr = np.zeros(pixels + 1, np.int64)
        np.cumsum(np.bincount(target, minlength=pixels), out=indptr[1:])
        self._check(len(source) * out_c, what)
        # every channel of each incoming pixel: its elements source * C_out + c
        elements = (source[by_pixel][:, None] * out_c + np.arange(out_c)[None, :]).reshape(-1)
        element = np.arange(_prod(shape), dtype=np.int64)
        parts = []
        if ins[2] is not None:
            per_pixel = self.compose(indptr * out_c, elements, ins[2], what)
            assert per_pixel is not None
            parts.append(per_pixel.rows(element // channels))
        if ins[1] is not None:  # filter [*kernel, C_in, C_out]: output channel c reads its taps of every C_out
            taps = np.arange(_prod(f_shape), dtype=np.int64).reshape(-1, channels, out_c).transpose(1, 0, 2)
            per_channel = self.windows(np.ascontiguousarray(taps).reshape(channels, -1), ins[1], what)
            assert per_channel is not None
            parts.append(per_channel.rows(element % channels))
        return self.union(parts, what)

    def cross_entropy(self, op, ins: list, what: str) -> list:
        """The loss [B] and its backprop [B, C] of row b read row b of the logits and of dense labels."""
        batch, classes = _shape(op.inputs[0])
        if op.type.startswith("Sparse") and ins[1] is not None:
            raise UnknownSparsity(f"{what}: its integer labels depend on a checked input")
        by_row = np.arange(batch * classes, dtype=np.int64).reshape(batch, classes)
        per_row = self.union([self.windows(by_row, dep, what) for dep in ins], what)
        return [per_row, None if per_row is None else per_row.rows(by_row.reshape(-1) // classes)]

    def matrices(self, op, ins: list, what: str) -> list:
        """Ops of a batch of matrices [..., M, N]: each output's batch member reads (at most) the whole matrix of its
        member (an inverse, a determinant, a solve's every entry), and a solve's column k of its right-hand side."""
        shape = _shape(op.inputs[0])
        members = _prod(shape[:-2])
        outputs: list[Dep | None] = []
        for tensor in op.outputs:
            out_shape = _shape(tensor)
            if not _prod(out_shape):  # eigh's vectors when not computed
                outputs.append(None)
                continue
            if _prod(out_shape[: len(shape) - 2]) != members:
                raise UnknownSparsity(f"{what}: its batch is broadcast")
            size = _prod(out_shape)
            member = np.arange(size, dtype=np.int64) // max(size // max(members, 1), 1)
            per_member = self.windows(np.arange(_prod(shape), dtype=np.int64).reshape(members, -1), ins[0], what)
            parts = [None if per_member is None else per_member.rows(member)]
            if len(ins) > 1 and ins[1] is not None:  # MatrixSolve's rhs [..., M, K]: x[..., :, k] reads its column k
                rhs = _shape(op.inputs[1])
                columns = np.arange(_prod(rhs), dtype=np.int64).reshape(members, rhs[-2], rhs[-1]).transpose(0, 2, 1)
                per_column = self.windows(columns.reshape(members * rhs[-1], rhs[-2]), ins[1], what)
                assert per_column is not None
                parts.append(per_column.rows(member * rhs[-1] + np.arange(size, dtype=np.int64) % rhs[-1]))
            outputs.append(self.union(parts, what))
        return outputs

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
        sizes: list[int] = []
        codes_of: list = []
        names = [arg.name for arg in op.op_def.input_arg
                 for _ in range(op.get_attr(arg.number_attr) if arg.number_attr else
                                len(op.get_attr(arg.type_list_attr)) if arg.type_list_attr else 1)]
        inputs = []
        for name, tensor, dep in zip(names, op.inputs, ins):
            if name in data:
                size = _prod(_shape(tensor))
                start = sum(sizes) + 1
                codes = (np.arange(size, dtype=np.float64) + start) if dep is not None else np.zeros(size)
                inputs.append(tf.constant(codes.reshape(_shape(tensor)), tf.float64))
                sizes.append(size)
                codes_of.append(dep)
            else:
                if dep is not None:
                    raise UnknownSparsity(f"{what}: its argument {name!r} depends on a checked input")
                value = self.constant(tensor)
                if value is None:
                    raise UnknownSparsity(f"{what}: its argument {name!r} is not a constant")
                inputs.append(tf.constant(value, tensor.dtype))
        try:
            results = _run_op(op, inputs)
        except Exception as error:  # an attribute or form this rule does not know
            raise UnknownSparsity(f"{what}: replaying it on element codes failed ({type(error).__name__})") from None
        stacked = stack(codes_of, sizes)
        return [stacked.rows(np.asarray(r.numpy(), np.float64).reshape(-1).astype(np.int64) - 1)
                if r.dtype == tf.float64 else None for r in results]

    def reduction(self, op, ins: list, what: str) -> Dep | None:
        if ins[1] is not None:
            raise UnknownSparsity(f"{what}: its axes depend on a checked input")
        shape = _shape(op.inputs[0])
        axes = self.constant(op.inputs[1])
        if axes is None:
            raise UnknownSparsity(f"{what}: its axes are not constant")
        axes = sorted({int(a) % max(len(shape), 1) for a in np.atleast_1d(axes)})
        kept = [a for a in range(len(shape)) if a not in axes]
        idx = np.arange(_prod(shape), dtype=np.int64).reshape(shape).transpose(kept + axes)
        return self.windows(idx.reshape(_prod([shape[a] for a in kept]), -1), ins[0], what)

    def matmul(self, op, ins: list, what: str) -> Dep | None:
        """out[..., i, j] reads row i of a and column j of b: one set per row of a (per column of b),
        shared by the row's (column's) outputs."""
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
        out = np.arange(_prod(out_shape), dtype=np.int64).reshape(out_shape)
        parts = []
        if ins[0] is not None:  # set of (batch, i), for every j
            per_row = self.windows(np.ascontiguousarray(a).reshape(-1, k), ins[0], what)
            assert per_row is not None  # its input depends on the checked one
            parts.append(per_row.rows((out // j).reshape(-1)))
        if ins[1] is not None:  # set of (batch, j), for every i
            per_col = self.windows(np.ascontiguousarray(np.swapaxes(b, -1, -2)).reshape(-1, k), ins[1], what)
            assert per_col is not None
            parts.append(per_col.rows(((out // (i * j)) * j + out % j).reshape(-1)))
        return self.union(parts, what)

    def stencil(self, op, ins: list, what: str) -> Dep | None:
        """Convolutions and pooling over 2 or 3 spatial axes (``STENCILS``): each output reads a window of the input.

        The input's part is one set per output pixel (Conv2D, Conv3D: every output channel reads the same window) or
        per pixel and input channel (depthwise, pooling); the filter's part one set per output channel: the output
        elements share them (a 256x256x8 -> 8 3x3 convolution: 65536 windows of 72 columns, not 3.8e7 pairs).
        """
        shape, out_shape = _shape(op.inputs[0]), _shape(op.outputs[0])
        spatial = len(shape) - 2
        # The channels-last view of f's layout.
        order = (0, *range(2, len(shape)), 1) if _data_format(op).startswith("NC") else tuple(range(len(shape)))
        batch, *_, channels = (shape[a] for a in order)
        _, *outs, out_c = (out_shape[a] for a in order)
        strides = [op.get_attr("strides")[a] for a in order][1:-1]
        pooling = "Pool" in op.type
        dilations = [1] * spatial if pooling else [op.get_attr("dilations")[a] for a in order][1:-1]
        kernel = [op.get_attr("ksize")[a] for a in order][1:-1] if pooling else list(_shape(op.inputs[1])[:spatial])
        window = _window(op, shape, order, outs, strides, kernel, dilations)  # [B, *outs, *kernel, C]
        pixels = batch * _prod(outs)
        # Every output element in f's layout, as (pixel, output channel) of the channels-last view.
        out = np.arange(_prod(out_shape), dtype=np.int64).reshape(out_shape).transpose(order).reshape(pixels, out_c)
        pixel, channel = np.empty(out.size, np.int64), np.empty(out.size, np.int64)
        pixel[out] = np.arange(pixels, dtype=np.int64)[:, None]
        channel[out] = np.arange(out_c, dtype=np.int64)[None, :]
        parts = []
        if ins[0] is not None:
            if op.type in ("Conv2D", "Conv3D"):  # one window per pixel, every output channel
                per_pixel = self.windows(window.reshape(pixels, -1), ins[0], what)
                assert per_pixel is not None
                parts.append(per_pixel.rows(pixel))
            else:  # one window per (pixel, channel); depthwise output channel c * multiplier + q reads channel c
                per_channel = np.moveaxis(window, -1, 1 + spatial).reshape(pixels * channels, -1)
                multiplier = out_c // channels
                per_channel_dep = self.windows(per_channel, ins[0], what)
                assert per_channel_dep is not None
                parts.append(per_channel_dep.rows(pixel * channels + channel // multiplier))
        if len(ins) > 1 and ins[1] is not None and not pooling:
            f_shape = _shape(op.inputs[1])
            f_idx = np.arange(_prod(f_shape), dtype=np.int64).reshape(_prod(f_shape[:spatial]), -1, f_shape[-1])
            if op.type.startswith("Conv"):
                per_out = np.moveaxis(f_idx, -1, 0).reshape(out_c, -1)  # [Co, kernel * Ci]
            else:
                per_out = np.moveaxis(f_idx.reshape(f_idx.shape[0], -1), -1, 0)  # [C * mult, kernel]
            per_filter = self.windows(np.ascontiguousarray(per_out), ins[1], what)
            assert per_filter is not None
            parts.append(per_filter.rows(channel))
        return self.union(parts, what)


def _window(op, shape: tuple, order: tuple, outs: list, strides: list, kernel: list, dilations: list) -> np.ndarray:
    """[B, *outs, *kernel, C]: the elements (flat, in ``shape``, -1 in the padding) each output pixel of a stencil op
    reads, by its padding; ``order`` the channels-last view of ``shape``."""
    spatial = len(shape) - 2
    sizes = [shape[a] for a in order][1:-1]
    padding = op.get_attr("padding").decode()
    explicit = op.get_attr("explicit_paddings") if padding == "EXPLICIT" else []
    idx = np.arange(_prod(shape), dtype=np.int64).reshape(shape).transpose(order)
    pads, positions = [], []
    for axis, (size, out, s, k, d) in enumerate(zip(sizes, outs, strides, kernel, dilations)):
        needed = (out - 1) * s + (k - 1) * d + 1
        if padding == "SAME":
            before = max(needed - size, 0) // 2
        elif padding == "EXPLICIT":
            before = explicit[2 * order[axis + 1]]
        else:
            before = 0
        pads.append((before, max(needed - size - before, 0)))
        at = [1] * (2 * spatial)  # [*outs, *kernel]: this axis's output and kernel position
        at[axis], at[spatial + axis] = out, k
        positions.append((np.arange(out)[:, None] * s + np.arange(k)[None, :] * d).reshape(at))
    padded = np.pad(idx, ((0, 0), *pads, (0, 0)), constant_values=-1)
    return padded[(slice(None), *positions, slice(None))]


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


def trace(graph, checked: list[tuple[int, int]], budget: int = NONZERO_BUDGET) -> tuple[int, Dep | None]:
    """(m, Dep of the flat output) of the graph of a one-output ``tf.function`` of every input (its concrete
    function's ``graph``: the caller traces f, this module only reads ops).  ``checked``: (argument position, size)
    of each checked input, in order; their elements are the global columns, one input after another."""
    n = sum(size for _, size in checked)
    tracer = Tracer(n, budget, {internal.ref(): external for external, internal in graph.captures})
    inputs: list = [None] * len(graph.inputs)
    offset = 0
    for position, size in checked:
        inputs[position] = Dep.identity(size, offset)
        offset += size
    deps = tracer.run(graph, inputs)
    (output,) = graph.outputs
    return _prod(_shape(output)), deps.get(output.ref())


def patterns_of(graph, plan: Plan) -> list[Pattern]:
    """One Pattern [m, n_k] per checked input of ``plan``, read from ``graph`` (of f's flat outputs as a
    ``tf.function`` of every input; the caller traces f); raises ``UnknownSparsity`` for an op without a rule."""
    m, dep = trace(graph, [(s.position, s.size) for s in plan.checked])
    return traced_patterns(m, dep, [s.size for s in plan.checked])


def traced_patterns(m: int, dep: Dep | None, sizes: list[int]) -> list[Pattern]:
    """The Dep of the flat output cut into one Pattern per checked input (groups kept shared)."""
    if dep is None:
        dep = Dep.empty(m)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    if dep.offset >= 0 and dep.size == m:  # elementwise in one input: no index arithmetic
        return [Pattern.identity(m) if (dep.offset == bounds[k] and size == m)
                else Pattern((m, size), np.zeros(m + 1, np.int64), np.zeros(0, np.int32))
                for k, size in enumerate(sizes)]
    # Only the groups some element uses, each group's columns sorted.
    group = dep.group
    indptr, cols = dep.indptr, dep.cols
    if group is not None:
        used, group = unique_inverse(group)
        counts = np.diff(indptr)[used]
        cols = cols[ranges(indptr[used], counts)]
        indptr = np.zeros(len(used) + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        group = index_array(group, len(used))
    owner = np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))
    total = max(int(bounds[-1]), 1)
    keys = owner * total + cols
    if keys.size > 1 and not bool(np.all(keys[1:] > keys[:-1])):
        keys = sorted_unique(keys)
        owner, cols = keys // total, keys % total
    result = []
    for k, size in enumerate(sizes):
        mine = (cols >= bounds[k]) & (cols < bounds[k + 1])
        gptr = np.zeros(len(indptr), np.int64)
        np.cumsum(np.bincount(owner[mine], minlength=len(indptr) - 1), out=gptr[1:])
        own = cols[mine] - bounds[k]
        if group is None and size == m and np.array_equal(gptr, np.arange(m + 1)) and np.array_equal(own, gptr[:-1]):
            result.append(Pattern.identity(m))  # elementwise in this input beside others (maximum(x, y))
            continue
        result.append(Pattern((m, size), gptr, index_array(own, size), group))
    return result
