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

Whether f is element-wise is read from its graph, never from its values: f and its VJP are built once in a
``FuncGraph`` (no ``tf.function``, no AutoGraph: a Python branch on a tensor value or a ``.numpy()`` fails there
and f is not element-wise) and walked op by op with ``_sparsity``'s dependency rules, plus the element-wise gradient
ops (``TanhGrad``, ...).  An op without a rule, a while loop, a py_function, a broadcast of the input: not
element-wise, and the loops run as before.  The answer is cached with f's kernels (per f, signatures and
configuration; dropped when f is collected), so a repeated check of f pays for it once.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from fastcheck._config import CheckConfig
from fastcheck._kernels import cached, is_cached, plan_key
from fastcheck._plan import Plan
from fastcheck._sparsity import Dep, Tracer
from fastcheck._tables import MIN_ELEMENTS, WALK_CALL_SECONDS

# Element-wise ops besides _sparsity's (which walks forward graphs): the gradient kernels of element-wise ops, and
# unary special functions.
GRADIENT_ELEMENTWISE = frozenset({
    "TanhGrad", "SigmoidGrad", "SqrtGrad", "RsqrtGrad", "ReciprocalGrad", "InvGrad", "ReluGrad", "Relu6Grad",
    "EluGrad", "SeluGrad", "LeakyReluGrad", "SoftplusGrad", "SoftsignGrad", "GeluGrad",
    "BesselI0e", "BesselI1e", "BesselI0", "BesselI1", "Polygamma", "Zeta", "Conj", "Real",
})


class _Walker(Tracer):
    def op(self, op, ins: list) -> list:
        if op.type in GRADIENT_ELEMENTWISE:
            return [self.elementwise(op, ins, f"op {op.type} ({op.name})")]
        return super().op(op, ins)


def _walk(graph, source, target, n: int) -> bool:
    """Whether each element of ``target`` (n elements) depends on the same element of ``source`` at most."""
    walker = _Walker(n, 4 * n + 16, {internal.ref(): external for external, internal in graph.captures})
    deps = walker.walk(graph, {source.ref(): Dep.identity(n, 0)})
    dep = deps.get(target.ref())
    if dep is None:  # no dependence at all: zero blocks, diagonal too
        return True
    if dep.size != n:
        return False
    if dep.offset == 0 and dep.group is None:
        return True
    indptr, cols = dep.explicit()
    counts = np.diff(indptr)
    if np.any(counts > 1):
        return False
    return bool(np.array_equal(np.asarray(cols, np.int64), np.repeat(np.arange(n, dtype=np.int64), counts)))


def _placeholders(values):
    return [tf.compat.v1.placeholder(v.dtype, v.shape) for v in values]


def _leaf(plan: Plan, values):
    (leaf,) = plan.output_leaves(values)
    return leaf


def _structure(plan: Plan, eval_values, native_values) -> bool:
    """Whether f is element-wise in its checked input, forward (at the numerical side's dtypes) and backward (at
    the native ones); see the module docstring.  f's output leaf itself, not ``call_flat``'s reshaped one: each
    graph holds f's ops and a placeholder per input (graph ops cost ~0.3 ms each to build)."""
    (spec,) = plan.checked
    position, n = spec.position, spec.size
    from tensorflow.python.framework import func_graph

    try:
        backward = func_graph.FuncGraph("fastcheck_elementwise_backward")
        with backward.as_default():
            values = _placeholders(native_values)
            source = values[position]
            with tf.GradientTape() as tape:
                tape.watch(source)
                y = _leaf(plan, values)
            if y.shape.num_elements() != n:
                return False
            cotangent = tf.compat.v1.placeholder(y.dtype, y.shape)
            grad = tape.gradient(y, source, output_gradients=cotangent, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            if isinstance(grad, tf.IndexedSlices) or grad.shape.num_elements() != n:
                return False
        if not _walk(backward, cotangent, grad, n):
            return False
        if not plan.eval_upcast:
            return _walk(backward, source, y, n)
        forward = func_graph.FuncGraph("fastcheck_elementwise_forward")
        with forward.as_default():
            values = _placeholders(eval_values)
            y = _leaf(plan, values)
        return y.shape.num_elements() == n and _walk(forward, values[position], y, n)
    except Exception:  # f does not build as a graph, or an op has no rule (f's own exception leaves as itself)
        return False


def elementwise(plan: Plan, config: CheckConfig, eval_values, native_values) -> bool:
    """Whether the eager loops may run as this module's few calls: one real checked input and one real output leaf
    of as many elements, and f element-wise in it (cached per f).

    The walk that finds out costs a few milliseconds: on the first check of f it runs only where the loops it could
    spare cost more (``WALK_ELEMENTS``, ``WALK_CALL_SECONDS``); a repeated check of f walks once, and every later one
    reads the cached answer."""
    if len(plan.checked) != 1 or len(plan.outputs) != 1:
        return False
    spec, output = plan.checked[0], plan.outputs[0]
    if (spec.is_complex or output.dtype.is_complex or spec.size != output.size or spec.size < MIN_ELEMENTS
            or not spec.dtype.is_floating):
        return False
    key = plan_key(plan, config) + ("elementwise",)
    cheap = spec.size < config.table("WALK_ELEMENTS") and plan.call_seconds < WALK_CALL_SECONDS
    if not is_cached(key) and cheap and not is_cached(key + ("seen",)):
        cached(key + ("seen",), lambda: True)  # f's first check: the loops are cheaper than the walk
        return False
    return bool(cached(key, lambda: _structure(plan, eval_values, native_values)))
