"""Element-wise f on the eager path: the full Jacobians from a few calls instead of 2n + m.

Where output element i of f depends on element i of its one checked input alone, in f's forward ops *and* in the
ops of its gradient, each Jacobian is diagonal and the eager loops' per-column and per-row calls are redundant:

* numerical side: ``f(x + sum_j d_j e_j)`` moves every column at once.  Output i sees only element i moved, so its
  value is bit for bit ``f(x + d_i e_i)_i``; every other entry of column j is ``f(x)_i`` (the centre, NaN
  included), as the one-column call gives it.
* analytical side: one VJP with the cotangent ``1`` gives every diagonal entry (row i's one-hot VJP computes
  element i from the same values), one VJP with the cotangent ``0`` every entry off the diagonal (element j of row
  i's VJP sees a zero cotangent: ``0``, or NaN where the gradient's factor is not finite, as the row loop gives it).
  A gradient that ignores its cotangent (sign's zeros) is the same value in both VJPs, and in every row.

So the blocks are the eager loops' own numbers and every verdict is unchanged; the check only makes fewer calls.

Whether f is element-wise is read from the ops these calls run, recorded as they run (TensorFlow's op callbacks:
no graph is built, a few microseconds an op), never from the values they return.  Every op that reads a value
derived from the moved input (from the cotangent, for the VJPs) must be one of ``trace``'s element-wise ops, a
flat identity (reshape, cast) or a reduction over axes of size 1 (or none), with that value and its outputs of the
input's n elements; an op without such a rule, a function call, a broadcast or a gather is not element-wise.  A
value f reads through numpy (``.numpy()``, ``float(t)``) runs no op: it enters the ops as a constant.  So the two
calls of each side (f at x + d and x - d; the VJPs of the cotangents 1 and 0) must run the same ops on the same
constants, and a constant that depends on the moved values differs between them.  Where anything fails, the loops
run as before: the two calls are the whole cost of finding out.
"""

from __future__ import annotations

import weakref

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import op_callbacks

from fastcheck.engine.config import CheckConfig
from fastcheck.engine.plan import EAGER_TENSOR, REFUSALS, Plan
from fastcheck.engine.tables import COTANGENT_ELEMENTS, COTANGENT_SHAPES
from fastcheck.sparsity.ops import ELEMENTWISE, FLAT_IDENTITY, NO_DEPENDENCE, REDUCTIONS

# _sparsity's element-wise ops, and two on the complex values a gradient may pass through.
PER_ELEMENT = ELEMENTWISE | FLAT_IDENTITY | {"Conj", "Real"}


def eligible(plan: Plan, config: CheckConfig) -> bool:
    """Whether the eager loops may try the few calls: one real floating checked input and one real output leaf of
    as many elements, at least ``DIAGONAL_MIN_ELEMENTS`` of them."""
    if len(plan.checked) != 1 or len(plan.outputs) != 1:
        return False
    spec, output = plan.checked[0], plan.outputs[0]
    return (spec.dtype.is_floating and not output.dtype.is_complex and spec.size == output.size
            and spec.size >= config.table("DIAGONAL_MIN_ELEMENTS"))


class _Reads:
    """While active (TensorFlow's op callbacks, eager ops only), from ``watch(source)`` to ``of(target)``: for each op
    that reads a value derived from ``source``, its type and the inputs it reads that are not derived (its
    constants); ``found`` None once such an op is not element-wise over n elements, and between readings.  Derived
    values are followed by weak reference (an id alone could be reused by a later tensor once its own is freed), so
    recording holds no more of f's intermediates than f does; the constants are held, to be compared with another
    call's."""

    def __init__(self, n: int):
        self.n = n
        self.found: list | None = None  # nothing watched yet: no op is recorded
        self.derived: dict = {}

    def watch(self, source) -> None:
        """Record from now on the ops that read values derived from ``source`` (a new reading)."""
        self.found = []
        self.derived = {id(source): weakref.ref(source)}

    def __enter__(self) -> _Reads:
        op_callbacks.add_op_callback(self._op)
        return self

    def __exit__(self, *exc) -> None:
        op_callbacks.remove_op_callback(self._op)

    def of(self, target) -> list | None:
        """The constants, or None where an op was not element-wise.  A ``target`` not derived from the source (a
        gradient that ignores its cotangent: sign's zeros) is one constant: the same in every call, it is every
        row's (every column's) value.  The reading ends here: later ops are not recorded."""
        found, self.found = self.found, None
        if found is None:
            return None
        return found if self._is_derived(target) else [("independent", [target])]

    def _is_derived(self, tensor) -> bool:
        ref = self.derived.get(id(tensor))
        return ref is not None and ref() is tensor

    def _op(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        # An op built into a graph (f tracing a tf.function) runs later, as one call op.
        if graph is not None or self.found is None:
            return None
        try:
            reads = [self._is_derived(t) for t in inputs]
            if not any(reads) or op_type in NO_DEPENDENCE:
                return None
            # A reduction of n elements to n reduces axes of size 1 alone (a broadcast gradient's Sum over a leading
            # 1): each output element is one input element's.
            flat = op_type in PER_ELEMENT or (op_type in REDUCTIONS and not any(reads[1:]))
            if (not flat or any(_size(t) != self.n for t, read in zip(inputs, reads) if read)
                    or any(_size(t) != self.n for t in outputs)):
                self.found = None
                return None
            self.found.append((op_type, [t for t, read in zip(inputs, reads) if not read]))
            self.derived.update((id(t), weakref.ref(t)) for t in outputs)
        except Exception:  # an input this reading does not know: not shown element-wise
            self.found = None
        return None


def _size(tensor) -> int | None:
    count = getattr(tensor, "_num_elements", None)  # an eager tensor's count, without building its TensorShape
    return count() if count is not None else tensor.shape.num_elements()


def _same(first: list | None, second: list | None) -> bool:
    """Whether two calls ran the same element-wise ops on the same constants (the same objects, or the same bits)."""
    if first is None or second is None or len(first) != len(second):
        return False
    for (kind, constants), (other_kind, others) in zip(first, second):
        if kind != other_kind or len(constants) != len(others):
            return False
        for a, b in zip(constants, others):
            if a is b:
                continue
            try:
                if a.dtype != b.dtype or a.shape != b.shape or a.numpy().tobytes() != b.numpy().tobytes():
                    return False
            except Exception:  # a resource or variant handle: no bits to compare
                return False
    return True


def differences(plan: Plan, values: list, position: int, flat: np.ndarray, shape, idx, delta, centre: np.ndarray):
    """The eager loop's (plus, minus) [m, len(idx)] for an element-wise f from two calls of f, every column of
    ``idx`` moved at once (``values``: the call's inputs, ``flat`` input ``position`` flattened); None where the
    calls show f is not element-wise in that input."""
    k = len(idx)
    cols = np.arange(k)
    sides, found = [], []
    with _Reads(plan.m) as reads:
        for sign in (1, -1):
            moved = flat.copy()
            moved[idx] = flat[idx] + (sign * np.asarray(delta, np.float64)).astype(flat.dtype)
            values[position] = source = tf.constant(moved.reshape(shape))
            reads.watch(source)
            try:
                result = plan.call(values, untaped=True)
            except REFUSALS:  # f refuses a point that moves every element: the loops find which
                return None
            leaves = [result] if type(result) is EAGER_TENSOR else [
                leaf for leaf, kept in zip(tf.nest.flatten(result), plan.leaf_is_output) if kept]
            if len(leaves) != 1 or type(leaves[0]) is not EAGER_TENSOR:
                return None
            found.append(reads.of(leaves[0]))
            if found[-1] is None:  # not element-wise, or not of m elements: the loops run (and say why, if f changed)
                return None
            y = plan.flat_numpy(result, plan.eval_upcast)
            block = np.repeat(centre[:, None], k, axis=1)
            block[idx, cols] = y[idx]
            sides.append(block)
    return tuple(sides) if _same(*found) else None


def rows(vjp, leaf) -> list[np.ndarray] | None:
    """The row loop's [m, m] block of an element-wise f from two VJPs (``vjp(cotangent)``: the gradient tensor):
    the cotangent 1 gives each row's diagonal entry, the cotangent 0 each row's entries off it; None where the VJPs
    are not element-wise in the cotangent."""
    n = leaf.shape.num_elements()
    grads, found = [], []
    with _Reads(n) as reads:
        for value in (1, 0):
            cotangent = _cotangent(leaf, value)
            reads.watch(cotangent)
            grad = vjp(cotangent)
            if type(grad) is not EAGER_TENSOR:  # IndexedSlices (a gather's gradient), or no gradient
                return None
            found.append(reads.of(grad))
            grads.append(grad.numpy().reshape(-1).astype(np.float64))
    if not _same(*found):
        return None
    on, off = grads
    block = np.repeat(off[None, :], off.size, axis=0)
    np.fill_diagonal(block, on)
    return [block]


# The cotangents of ``rows``, made once per shape, dtype and device (a constant costs as much as a small f's call).
_COTANGENTS: dict = {}


def _cotangent(leaf, value: int):
    """A tensor of ``value`` shaped as ``leaf``, kept where small (``COTANGENT_ELEMENTS``, ``COTANGENT_SHAPES``)."""
    key = (tuple(leaf.shape.as_list()), leaf.dtype, value, context.context().device_name)
    found = _COTANGENTS.get(key)
    if found is None:
        found = tf.constant(np.full(key[0], value, leaf.dtype.as_numpy_dtype))
        if leaf.shape.num_elements() <= COTANGENT_ELEMENTS:
            if len(_COTANGENTS) >= COTANGENT_SHAPES:
                _COTANGENTS.clear()
            _COTANGENTS[key] = found
    return found
