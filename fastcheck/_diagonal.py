"""Element-wise f on the eager path: the full Jacobians from a few calls instead of 2n + m.

Where output element i of f depends on element i of its one checked input alone, in f's forward ops *and* in the
ops of its gradient, each Jacobian is diagonal and the eager loops' per-column and per-row calls are redundant:

* numerical side: ``f(x + sum_j d_j e_j)`` moves every column at once.  Output i sees only element i moved, so its
  value is bit for bit ``f(x + d_i e_i)_i``; every other entry of column j is ``f(x)_i`` (the centre, NaN
  included), as the one-column call gives it.
* analytical side: one VJP with the cotangent ``1`` gives every diagonal entry (row i's one-hot VJP computes
  element i from the same values), one VJP with the cotangent ``0`` every entry off the diagonal (element j of row
  i's VJP sees a zero cotangent: ``0``, or NaN where the gradient's factor is not finite, as the row loop gives it).

So the blocks are the eager loops' own numbers and every verdict is unchanged; the check only makes fewer calls.

Whether f is element-wise is read from the ops these calls run, recorded as they run (TensorFlow's op callbacks:
no graph is built, a few microseconds an op), never from the values they return.  Every op that reads a value
derived from the moved input (from the cotangent, for the VJPs) must be one of ``_sparsity``'s element-wise ops, a
flat identity (reshape, cast) or a reduction over no axes, with that value and its outputs of the input's n
elements; an op without such a rule, a function call, a broadcast or a gather is not element-wise.  A value f reads
through numpy (``.numpy()``, ``float(t)``) runs no op: it enters the ops as a constant.  So the two calls of each
side (f at x + d and x - d; the VJPs of the cotangents 1 and 0) must run the same ops on the same constants, and a
constant that depends on the moved values differs between them.  Where anything fails, the loops run as before:
the two calls are the whole cost of finding out.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import op_callbacks

from fastcheck._config import CheckConfig
from fastcheck._plan import EAGER_TENSOR, Plan
from fastcheck._sparsity import ELEMENTWISE, FLAT_IDENTITY, NO_DEPENDENCE, REDUCTIONS

# Element-wise ops besides _sparsity's (forward ops): the gradient kernels of element-wise ops, and
# unary special functions.
GRADIENT_ELEMENTWISE = frozenset({
    "TanhGrad", "SigmoidGrad", "SqrtGrad", "RsqrtGrad", "ReciprocalGrad", "InvGrad", "ReluGrad", "Relu6Grad",
    "EluGrad", "SeluGrad", "LeakyReluGrad", "SoftplusGrad", "SoftsignGrad", "GeluGrad",
    "BesselI0e", "BesselI1e", "BesselI0", "BesselI1", "Polygamma", "Zeta", "Conj", "Real",
})
PER_ELEMENT = ELEMENTWISE | FLAT_IDENTITY | GRADIENT_ELEMENTWISE


def eligible(plan: Plan, config: CheckConfig) -> bool:
    """Whether the eager loops may try the few calls: one real floating checked input and one real output leaf of
    as many elements, at least ``DIAGONAL_MIN_ELEMENTS`` of them."""
    if len(plan.checked) != 1 or len(plan.outputs) != 1:
        return False
    spec, output = plan.checked[0], plan.outputs[0]
    return (spec.dtype.is_floating and not output.dtype.is_complex and spec.size == output.size
            and spec.size >= config.table("DIAGONAL_MIN_ELEMENTS"))


class _Recording:
    """The eager ops run while it is active: (type, inputs, outputs), the tensors themselves (held, so that no
    tensor's id is reused while the record lives)."""

    def __enter__(self) -> list:
        self.ops: list = []
        op_callbacks.add_op_callback(self._record)
        return self.ops

    def __exit__(self, *exc) -> None:
        op_callbacks.remove_op_callback(self._record)

    def _record(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if graph is None:  # an op built into a graph (f tracing a tf.function) runs later, as one call op
            self.ops.append((op_type, tuple(inputs), tuple(outputs)))


def _constants(ops: list, source, target, n: int) -> list | None:
    """For each op of ``ops`` that reads a value derived from ``source``: its type and the inputs it reads that are
    not (its constants); None where one of those ops is not element-wise over n elements or ``target`` is not
    derived from ``source``."""
    derived = {id(source)}
    found = []
    for kind, inputs, outputs in ops:
        reads = [id(t) in derived for t in inputs]
        if not any(reads) or kind in NO_DEPENDENCE:
            continue
        flat = kind in PER_ELEMENT or (kind in REDUCTIONS and not reads[1] and _size(inputs[1]) == 0)
        if not flat or any(_size(t) != n for t, read in zip(inputs, reads) if read) or any(_size(t) != n for t in outputs):
            return None
        found.append((kind, [t for t, read in zip(inputs, reads) if not read]))
        derived.update(id(t) for t in outputs)
    return found if id(target) in derived else None


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
    for sign in (1, -1):
        moved = flat.copy()
        moved[idx] = flat[idx] + (sign * np.asarray(delta, np.float64)).astype(flat.dtype)
        values[position] = source = tf.constant(moved.reshape(shape))
        with _Recording() as ops:
            result = plan.call(values, untaped=True)
        leaves = [leaf for leaf, kept in zip(tf.nest.flatten(result), plan.leaf_is_output) if kept]
        if len(leaves) != 1 or type(leaves[0]) is not EAGER_TENSOR:
            return None
        found.append(_constants(ops, source, leaves[0], plan.m))
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
    for value in (1, 0):
        cotangent = tf.constant(np.full(leaf.shape.as_list(), value, leaf.dtype.as_numpy_dtype))
        with _Recording() as ops:
            grad = vjp(cotangent)
        if type(grad) is not EAGER_TENSOR:  # IndexedSlices (a gather's gradient), or no gradient
            return None
        found.append(_constants(ops, cotangent, grad, n))
        grads.append(grad.numpy().reshape(-1).astype(np.float64))
    if not _same(*found):
        return None
    on, off = grads
    block = np.repeat(off[None, :], off.size, axis=0)
    np.fill_diagonal(block, on)
    return [block]
