"""Jacobians from autodiff: reverse mode (tape VJPs) and forward mode (ForwardAccumulator JVPs).

The checked gradient is the reverse-mode one, the one training and ``tf.test.compute_gradient`` use: forward mode
differentiates f's forward ops and ignores ``tf.custom_gradient``, and some ops have no forward-mode rule.  Forward
mode is an extra check (``autodiff="auto"``: a few random JVPs; ``"both"``: the full forward Jacobian too) or,
with ``autodiff="forward"``, the checked side.  All checked inputs are differentiated in the same pass, chunked so
that at most ``output_chunk`` rows or ``chunks[k]`` columns are in flight at once, under the route's path (XLA /
graph / loop / eager), falling back like the numerical side.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_array_ops

from fastcheck.engine import diagonal, eager_colours
from fastcheck.engine.executor import Batch, Executor, view
from fastcheck.engine.kernels import pad
from fastcheck.engine.paths import EAGER, LOOP, compile_kernel
from fastcheck.engine.plan import EAGER_TENSOR, Plan, first_line, unstacked
from fastcheck.engine.tables import EAGER_LOOP_SECONDS, EAGER_SECONDS, LOOP_BATCH_ELEMENTS, VJP_CALLS

ZERO = tf.UnconnectedGradients.ZERO
_EAGER = object()  # what a batch's eager fallback returns: the eager loops take over


def densify(gradient):
    """A gradient as a dense tensor (an embedding lookup's gradient comes as ``tf.IndexedSlices``)."""
    return tf.convert_to_tensor(gradient) if isinstance(gradient, tf.IndexedSlices) else gradient


def eager_vjp(tape: tf.GradientTape, targets: list, sources: list, cotangents: list | None = None) -> list:
    """``tape.gradient(targets, sources, output_gradients=cotangents, unconnected_gradients=ZERO)`` for eager
    tensors, outside the tape's context: the reverse pass that ``tape.gradient`` itself runs (``imperative_grad``),
    the same numbers, without its per-call checks and nest walks (~95 us of a small f's ~135 us VJP; the eager
    loops make one per output row).  Anything else -- variables, composite tensors, a TensorFlow without that
    function -- goes through ``tape.gradient``."""
    plain = _IMPERATIVE_GRAD is not None and all(
        type(t) is EAGER_TENSOR for t in (*targets, *sources, *(cotangents or ())))
    if not plain:
        return list(tape.gradient(targets, sources, output_gradients=cotangents, unconnected_gradients=ZERO))
    return list(_IMPERATIVE_GRAD(tape._tape, targets, sources, output_gradients=cotangents, sources_raw=sources,
                                 unconnected_gradients=ZERO))


def _imperative_grad():
    """TensorFlow's eager reverse pass, or None where this TensorFlow has it elsewhere."""
    try:
        from tensorflow.python.eager.imperative_grad import imperative_grad

        return imperative_grad
    except ImportError:  # pragma: no cover - a TensorFlow that moved it: tape.gradient does the same
        return None


_IMPERATIVE_GRAD = _imperative_grad()


def reverse_rows_kernel(plan: Plan, path: str, select):
    """kernel(values, *args) -> [rows, n_k] per checked input: the reverse-mode Jacobian of the rows
    ``select(y, *args)`` of f's flat output y (rows of J, or sums of rows), one batched tape.jacobian."""
    checked = [s.position for s in plan.checked]

    def kernel(values, *args):
        sources = [values[p] for p in checked]
        with tf.GradientTape(persistent=path == LOOP) as tape:
            tape.watch(sources)
            y = plan.call_flat(values)
            rows = select(y, *args)
        jacobians = tape.jacobian(rows, sources, unconnected_gradients=ZERO, experimental_use_pfor=path != LOOP)
        return [tf.reshape(densify(j), [-1, s.size]) for j, s in zip(jacobians, plan.checked)]

    return compile_kernel(kernel, path, plan.autograph)


def vjp_kernel(plan: Plan, path: str, cotangent=None):
    """kernel(values, *args) -> [1, n_k] per checked input: one VJP of f's flat output y with the
    cotangent ``cotangent(y, *args)`` (None: the gradient of a scalar f)."""
    checked = [s.position for s in plan.checked]

    def kernel(values, *args):
        sources = [values[p] for p in checked]
        with tf.GradientTape() as tape:
            tape.watch(sources)
            y = plan.call_flat(values)
        weights = None if cotangent is None else cotangent(y, *args)
        grads = tape.gradient(y, sources, output_gradients=weights, unconnected_gradients=ZERO)
        return [tf.reshape(densify(g), [1, s.size]) for g, s in zip(grads, plan.checked)]

    return compile_kernel(kernel, path, plan.autograph)


def vjps_kernel(plan: Plan, path: str, cotangents):
    """kernel(values, *args) -> [1, n_k] per checked input for each of the cotangents ``cotangents(y, *args)``
    (a list), in that order: one forward pass and a backward pass per cotangent, on one persistent tape."""
    checked = [s.position for s in plan.checked]

    def kernel(values, *args):
        sources = [values[p] for p in checked]
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(sources)
            y = plan.call_flat(values)
        grads = [tape.gradient(y, sources, output_gradients=u, unconnected_gradients=ZERO) for u in cotangents(y, *args)]
        return [tf.reshape(densify(g), [1, s.size]) for found in grads for g, s in zip(found, plan.checked)]

    return compile_kernel(kernel, path, plan.autograph)


def jvp_rows(plan: Plan, position: int, path: str, values, tangents):
    """J t for each row t of ``tangents`` (directions in input ``position``): [rows, m], traced."""
    shape = plan.inputs[position].real_view.shape

    def column(tangent):
        moved = list(values)
        with tf.autodiff.ForwardAccumulator(moved[position], tf.reshape(tangent, shape)) as accumulator:
            y = plan.call_flat(moved)
        return accumulator.jvp(y, unconnected_gradients=ZERO)

    if path == LOOP:
        return tf.map_fn(column, tangents, fn_output_signature=tf.TensorSpec([plan.m], plan.native_flat_dtype))
    return tf.vectorized_map(column, tangents)


def _forward_kernel(plan: Plan, position: int, path: str):
    size = plan.inputs[position].size

    def kernel(values, idx):
        return jvp_rows(plan, position, path, values, tf.one_hot(idx, size, dtype=values[position].dtype))

    return compile_kernel(kernel, path, plan.autograph)


class AutodiffJacobian:
    """Computes the autodiff Jacobian of every (output, input) pair at once."""

    def __init__(self, executor: Executor, forward: bool = False, twin: bool = False):
        """``twin``: the gradient at the numerical side's values (float64 when it is upcast): the same
        gradient code computing in float64 (``block.twinned``), not the one training runs."""
        self.executor, self.plan, self.config = executor, executor.plan, executor.config
        self.values = executor.values if twin else executor.native
        self.forward, self.twin = forward, twin

    @property
    def mode(self) -> str:
        return "forward" if self.forward else "reverse"

    def __call__(self) -> list[np.ndarray]:
        """One array [m, n_k] per checked input, in the analytical dtype's precision (as float64)."""
        # Eager VJPs/JVPs cost no tracing: they win for scalar outputs, few rows, and above all for while-loop
        # functions, whose gradient graphs take seconds to trace.  Whether they run is predicted from f's counted
        # call cost (never timed), so a check takes the same side's numbers in every process.  Under a strategy the
        # rows go over the replicas, on a traced path.
        eager = self.executor.path == EAGER or (self.executor.share is None and self._eager_fits())
        result = self._eager() if eager else None
        if result is None and self.executor.path != EAGER:
            result = self._batched()
        return self._eager() if result is None else result

    def _eager_fits(self) -> bool:
        """Whether the eager passes (a row of VJP_CALLS calls of f each, a column each for forward mode) are
        predicted within EAGER_SECONDS (EAGER_LOOP_SECONDS on the loop path, where gradient graphs trace slowest)."""
        plan = self.plan
        passes = plan.n if self.forward else 1 if plan.m == 1 else plan.m
        limit = EAGER_LOOP_SECONDS if self.executor.path == LOOP else EAGER_SECONDS
        return passes * VJP_CALLS * plan.call_seconds <= limit

    def _batched(self):
        """The Jacobian from batched kernels on the executor's path, chunked by its one chunk loop; None when
        a fallback reached the eager path (the caller's loops take over)."""
        plan, executor = self.plan, self.executor
        if plan.m == 1 and not self.forward:
            def gradient(chunk, part, count):
                kernel = executor.kernel(("autodiff", self.twin, "gradient"), lambda: vjp_kernel(plan, executor.path))
                return [g.numpy().astype(np.float64) for g in kernel(self.values)]

            batch = Batch("gradient", "gradient", 1, subject="reverse mode", unit="gradients", item="gradient",
                          spread=False)
            grads = executor.chunked(batch, 1, gradient, eager=lambda: _EAGER)
            return None if grads is _EAGER else grads
        if self.forward:
            result = []
            for spec in plan.checked:
                columns = np.empty((plan.m, spec.size))  # columns land in place

                def call(chunk, part, count, position=spec.position, columns=columns):
                    kernel = executor.kernel(("autodiff", self.twin, "forward", position, chunk),
                                             lambda: _forward_kernel(plan, position, executor.path))
                    out = kernel(self.values, tf.constant(pad(np.arange(part.start, part.stop), chunk), tf.int32))
                    columns[:, part] = view(out)[:count].T

                batch = Batch("forward-mode columns", ("forward", spec.position), executor.chunks[spec.position],
                              subject=spec.name, unit="columns", item=f"forward-mode column of {spec.name}",
                              spread=False)
                if executor.chunked(batch, spec.size, call, eager=lambda: _EAGER) is _EAGER:
                    return None
                result.append(columns)
            return result
        blocks = [np.empty((plan.m, spec.size)) for spec in plan.checked]  # rows land in place

        def rows(chunk, part, count):
            kernel = executor.kernel(("autodiff", self.twin, "reverse", chunk), lambda: reverse_rows_kernel(plan, executor.path, tf.gather))
            for block, out in zip(blocks, kernel(self.values, tf.constant(pad(np.arange(part.start, part.stop), chunk),
                                                                          tf.int32))):
                block[part] = view(out)[:count]

        # Spread over replicas (device= a strategy or a device list): each chunk of rows split over this worker's
        # local replicas (every worker computes all).
        batch = Batch("reverse-mode rows", "reverse rows", executor.route.output_chunk, subject="reverse mode",
                      unit="rows", item="reverse-mode row", spread=False, local=True)
        return None if executor.chunked(batch, plan.m, rows, eager=lambda: _EAGER) is _EAGER else blocks

    def _eager(self):
        """Row by row (reverse) or column by column (forward), eagerly."""
        plan = self.plan
        # Fresh tensors, as a training step has: TFP bijectors cache log-det-Jacobians per tensor object, so a taped
        # call on the objects planning used would reuse values computed outside the tape (and miss their gradient).
        values = [gen_array_ops.identity(v) for v in self.values]  # the op itself: tf.identity's Python is ~30 calls
        sources = [values[s.position] for s in plan.checked]
        if self.forward:
            blocks = []
            for spec, source in zip(plan.checked, sources):
                columns = []
                for j in range(spec.size):
                    tangent = tf.reshape(tf.one_hot(j, spec.size, dtype=source.dtype), source.shape)
                    with tf.autodiff.ForwardAccumulator(source, tangent) as accumulator:
                        leaves = plan.output_leaves(values)
                    columns.append(_flat_numpy(plan, [accumulator.jvp(leaf, unconnected_gradients=ZERO) for leaf in leaves]))
                blocks.append(np.stack(columns, axis=1))
            return blocks
        # The tape holds f's own output leaves: no flattening ops to differentiate per row.
        with tf.GradientTape(persistent=plan.m > 1) as tape:
            tape.watch(sources)
            leaves = plan.output_leaves(values)
        if plan.m == 1:
            (scalar,) = (leaf for leaf in leaves if leaf.shape.num_elements())  # other leaves, if any, are empty
            grads = eager_vjp(tape, [scalar], sources)
            return [densify(g).numpy().reshape(1, -1).astype(np.float64) for g in grads]
        if len(leaves) == 1 and self.values is self.executor.native and self.executor.elementwise():
            try:
                block = diagonal.rows(lambda cotangent: eager_vjp(tape, leaves, sources, [cotangent])[0], leaves[0])
            except Exception:  # the row loop decides (and raises, if the gradient does)
                block = None
            self.executor.elementwise_ran(block is not None, forward=False)
            if block is not None:
                self.executor.row_blocks(block)
                return block
        found = (eager_colours.structure(plan, self.config, self.executor.native, plan.m)
                 if self.executor.path == EAGER and self.values is self.executor.native else None)
        if found is not None and sum(leaf.shape.num_elements() for leaf in leaves) == plan.m:
            def vjp(weights: np.ndarray) -> list[np.ndarray]:
                cotangents, start = [], 0
                for leaf in leaves:
                    size = leaf.shape.num_elements()
                    cotangents.append(tf.constant(weights[start : start + size].reshape(leaf.shape.as_list())
                                                  .astype(leaf.dtype.as_numpy_dtype)))
                    start += size
                return [densify(g).numpy().reshape(-1).astype(np.float64)
                        for g in eager_vjp(tape, leaves, sources, cotangents)]

            try:
                block = eager_colours.rows(plan, self.config, found, vjp)
            except Exception:  # noqa: BLE001 -- a gradient that runs once per tape (py_function's): the loop decides
                block = None
            if block is not None:
                self.executor.coloured("reverse", int(found.row_labels.max()) + 1)
                return block
        try:
            blocks = self._rows(leaves, sources, lambda: (tape, leaves))
        except Exception:
            # tf.py_function's gradient runs once per forward call (TensorFlow drops its
            # Python function after the first backward pass): one forward pass per row.
            def fresh():
                with tf.GradientTape() as row_tape:
                    row_tape.watch(sources)
                    outputs = plan.output_leaves(values)
                return row_tape, outputs

            return self._rows(leaves, sources, fresh)
        if blocks is not None and self.executor.path == EAGER and self.values is self.executor.native:
            self.executor.row_blocks(blocks)  # a row loop too short to colour: its blocks check f's pattern
        return blocks

    def _rows(self, leaves, sources, taped):
        """Reverse mode one output row at a time; ``taped()`` gives a (tape, leaves) pass to differentiate."""
        rows: list[list[np.ndarray]] = [[] for _ in sources]
        for index, leaf in enumerate(leaves):
            shape = leaf.shape.as_list()  # numpy reads a list at once, a TensorShape dimension by dimension
            size = leaf.shape.num_elements()
            per = max(1, LOOP_BATCH_ELEMENTS // max(1, size))
            for start in range(0, size, per):
                # The one-hot cotangents of a chunk of rows from one constant (``unstacked``).
                count = min(per, size - start)
                basis = np.zeros((count, size), leaf.dtype.as_numpy_dtype)
                basis[np.arange(count), start + np.arange(count)] = 1
                for cotangent in unstacked(basis.reshape(-1, *shape)):
                    tape, outputs = taped()
                    grads = eager_vjp(tape, [outputs[index]], sources, [cotangent])
                    for row, g in zip(rows, grads):
                        row.append(densify(g).numpy().reshape(-1))
        return [np.stack(row).astype(np.float64) for row in rows]


def _flat_numpy(plan: Plan, leaves) -> np.ndarray:
    """Flat float64 vector of per-leaf results, rounded as ``plan.call_flat`` would round them."""
    target = plan.native_flat_dtype.as_numpy_dtype
    return np.concatenate([np.asarray(leaf).astype(target, copy=False).reshape(-1) for leaf in leaves]).astype(np.float64)


def forward_probe(plan: Plan, directions: list[np.ndarray]) -> tuple[np.ndarray | None, str | None]:
    """Forward-mode J v for each probe (all checked inputs move at once), eagerly: ([k, m], None), or (None, why
    TensorFlow cannot compute it).

    ``directions[i]`` is [k, n_i] for the i-th checked input.  An op with no forward-mode rule shows as an error
    (ResizeBicubic: no gradient for its gradient op) or as a missing JVP (ResizeBilinear: None); ``IndexedSlices``
    JVPs (scatter_nd with duplicate indices) are made dense."""
    values = [tf.identity(v) for v in plan.native_values()]  # fresh tensors (TFP's per-tensor caches)
    sources = [values[s.position] for s in plan.checked]
    rows = []
    for probe in range(directions[0].shape[0]):
        tangents = [tf.constant(d[probe].reshape(s.real_view.shape), s.real_view.dtype) for d, s in zip(directions, plan.checked)]
        try:
            with tf.autodiff.ForwardAccumulator(sources, tangents) as accumulator:
                leaves = plan.output_leaves(values)
            jvps = [accumulator.jvp(leaf) for leaf in leaves]
        except Exception as error:  # no forward-mode rule for some op
            return None, f"{type(error).__name__}: {first_line(error)}"
        missing = [i for i, j in enumerate(jvps) if j is None]
        if missing:
            return None, (f"TensorFlow returned no JVP for {plan.outputs[missing[0]].name} (an op on its path has no "
                          "forward-mode rule, e.g. ResizeBilinear)")
        rows.append(_flat_numpy(plan, [densify(j) for j in jvps]))
    return np.stack(rows), None

