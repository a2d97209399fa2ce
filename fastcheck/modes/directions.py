"""Fast mode's evaluations along random directions: Joint evaluates f at x +- h d for k directions d over a
group of inputs at once (both sides in one batched kernel, chunked by the executor), J d by reverse-over-reverse
(or forward mode, where the gradient cannot be differentiated again), and one VJP.  Everything here evaluates;
_fast judges.
"""


from __future__ import annotations

import numpy as np
import tensorflow as tf

from fastcheck.engine.autodiff import ZERO, densify
from fastcheck.engine.config import device_span, device_step_scale
from fastcheck.engine.executor import Batch, Executor, ShapeChangeError
from fastcheck.engine.paths import GRAPH, XLA
from fastcheck.engine.plan import Plan
from fastcheck.engine.tables import (
    BLOCKS,
    FAST_ROWS,
    PARALLEL_ROWS,
)
from fastcheck.judge import compare
from fastcheck.report.events import FastForwardOnly

F64 = tf.float64


def _normal(shape, seed) -> tf.Tensor:
    """Seeded standard normal draws as float64 (drawn in float32: half the cost, and any
    random direction serves; the realised direction is computed exactly)."""
    return tf.cast(tf.random.stateless_normal(shape, seed, dtype=tf.float32), F64)


def _concatenated(plan: Plan, values):
    """Every checked input's values, flattened and concatenated: [n], or None when their dtypes differ."""
    checked = [values[spec.position] for spec in plan.checked]
    if len({value.dtype for value in checked}) > 1:
        return None
    return tf.concat([tf.reshape(value, [-1]) for value in checked], 0) if len(checked) > 1 else tf.reshape(checked[0], [-1])


def _perturbed(plan: Plan, values, flat, direction, step):
    """The values at ``x + step d`` and ``x - step d``, and the direction realised.

    ``direction`` is [n] float64 over every checked input (flattened real views, concatenated in ``plan.checked``
    order); ``flat`` is x so concatenated (``_concatenated``; None: inputs of several dtypes, moved one by one).  Each
    input moves in its own evaluation dtype; the realised direction is ``((x + s d) - (x - s d)) / 2s`` in float64
    (``device_span``: d itself where x is not finite), so that both sides differentiate along the step actually taken.
    """
    sizes = [spec.size for spec in plan.checked]

    def split(vector):
        return tf.split(vector, sizes) if len(sizes) > 1 else [vector]

    if flat is not None:  # one dtype: a few ops over the whole vector (a model has hundreds of variables)
        offset = tf.cast(direction * step, flat.dtype)
        up, down = split(flat + offset), split(flat - offset)
        realised = device_span(flat, offset) / (2 * step)
    else:
        up, down, parts = [], [], []
        for spec, piece in zip(plan.checked, split(direction)):
            x = tf.reshape(values[spec.position], [-1])
            offset = tf.cast(piece * step, x.dtype)
            up.append(x + offset)
            down.append(x - offset)
            parts.append(device_span(x, offset) / (2 * step))
        realised = tf.concat(parts, 0) if len(parts) > 1 else parts[0]
    plus, minus = list(values), list(values)
    for spec, a, b in zip(plan.checked, up, down):
        shape = values[spec.position].shape
        plus[spec.position], minus[spec.position] = tf.reshape(a, shape), tf.reshape(b, shape)
    return plus, minus, realised


def _directional_kernel(plan: Plan, path: str, flat_function):
    """f(x + s_i d_i) and f(x - s_i d_i) for each row of a [b, n] batch of joint directions: one kernel
    for every checked input together, traced once for any b (dynamic batch).

    ``tf.map_fn`` rather than ``vectorized_map``: fast mode evaluates a few dozen points, and pfor's conversion of a
    large f costs more than it saves there (MobileNetV2 on CPU: 3.2 s to trace against map_fn's 1.3 s).
    """
    m, n = plan.m, plan.n
    # The probe's traced flat function on traced paths (f is then not traced again); XLA compiles f itself.
    call = flat_function if flat_function is not None and path != XLA else (
        lambda *vs: plan.call_flat(list(vs), plan.eval_upcast))

    def kernel(values, directions, steps):
        flat = _concatenated(plan, values)

        def both(row):
            direction, step = row
            plus, minus, realised = _perturbed(plan, values, flat, direction, step)
            return (tf.ensure_shape(tf.cast(call(*plus), F64), [m]), tf.ensure_shape(tf.cast(call(*minus), F64), [m]),
                    tf.ensure_shape(realised, [n]))

        return tf.map_fn(both, (directions, steps), parallel_iterations=PARALLEL_ROWS,
                         fn_output_signature=(tf.TensorSpec([m], F64), tf.TensorSpec([m], F64), tf.TensorSpec([n], F64)))

    values = plan.eval_values()
    signature = (tuple(tf.TensorSpec(v.shape, v.dtype) for v in values), tf.TensorSpec([None, n], F64),
                 tf.TensorSpec([None], F64))
    return tf.function(kernel, jit_compile=path == XLA, autograph=plan.autograph, input_signature=signature)


def _reverse_jvp(plan: Plan, values, tangents: tf.Tensor) -> tf.Tensor:
    """J d for each row d of ``tangents`` [k, n] (every checked input, concatenated) from the reverse-mode gradient:
    [k, m] float64; raises when the VJP cannot be differentiated.

    J d = d/du [(J^T u) . d], with one VJP over every input: the VJP is linear in u, so differentiating it once more
    gives the JVP *of the VJP that training uses* (custom gradients included).
    """
    u = tf.zeros([plan.m], plan.native_flat_dtype)
    with tf.GradientTape(persistent=True) as outer:
        outer.watch(u)
        g = _vjp(plan, values, u)
        sums = tf.unstack(tf.linalg.matvec(tangents, g))  # on the tape: one scalar per direction
    rows = []
    for total in sums:
        row = outer.gradient(total, u)
        if row is None:
            raise LookupError("the reverse-mode gradient of f cannot be differentiated once more")
        rows.append(tf.cast(densify(row), F64))
    return tf.stack(rows)


def _reverse_jvp_kernel(plan: Plan):
    """``_reverse_jvp`` as a traced function of (values, tangents)."""
    return tf.function(lambda values, tangents: _reverse_jvp(plan, list(values), tangents), autograph=plan.autograph)


def _vjp(plan: Plan, values, u) -> tf.Tensor:
    """J^T u over every checked input at once (one tape, every input a source): [n] float64.

    The sources are fresh tensors, so an input passed twice (``f(x, x)``) gets the gradient of its own argument
    only, and per-tensor caches (TFP bijectors) see tensors computed on the tape.
    """
    moved = list(values)
    with tf.GradientTape() as tape:
        sources = [tf.identity(values[spec.position]) for spec in plan.checked]
        tape.watch(sources)
        for spec, source in zip(plan.checked, sources):
            moved[spec.position] = source
        y = plan.call_flat(moved)
    grads = tape.gradient(y, sources, output_gradients=tf.cast(u, y.dtype), unconnected_gradients=ZERO)
    return tf.concat([tf.reshape(tf.cast(densify(g), F64), [-1]) for g in grads], 0)


# The executor's chunk of fast mode's directions (``Joint``).
JOINT_ROWS = "joint rows"


class Joint:
    """Numerical directional derivatives along joint directions, and their autodiff counterparts.

    Directions are [b, n] float64 over every checked input (concatenated in ``plan.checked`` order).  Everything of
    size n or m stays in TensorFlow; only per-probe summaries come back to the host.
    """

    def __init__(self, executor: Executor, plan: Plan, supplied=None):
        self.executor, self.plan, self.config = executor, plan, executor.config
        self.specs = plan.checked
        self.offsets = np.concatenate([[0], np.cumsum([spec.size for spec in self.specs])]).astype(np.int64)
        self.n = int(self.offsets[-1])
        values = executor.values
        self.scale = tf.concat([device_step_scale(values[s.position]) for s in self.specs], 0)
        self.eps = self.config.step(plan.noise_epsilon)
        self.y0 = plan.eval_output
        self.supplied = supplied
        self.forward_only = False  # set when the reverse-mode gradient cannot be differentiated twice
        self.jvp_missing = False  # ... and forward mode has no JVP for f either
        self.evaluations = 0  # evaluations of f, for the report's note
        # What one evaluation of each output may be off by (``compare.rounding_level``).
        level = compare.rounding_level(self.y0, plan.row_epsilon, plan.noise.sigma if plan.noise is not None else None)
        self.level = tf.constant(level, F64)
        route = executor.route
        itemsize = executor.plan.eval_flat_dtype.size
        # Per row: the direction and realised direction (float64), both perturbed points, both outputs,
        # and f's intermediates twice over.
        per_row = (16 * self.n + 2 * (self.n + route.elements_per_eval) * itemsize + 16 * plan.m) * 2
        rows = int(max(1, min(FAST_ROWS, self.config.budget // max(per_row, 1))))
        self.batch = Batch("fast-mode evaluations", JOINT_ROWS, rows, subject="fast mode", unit="probes",
                           item="fast-mode probe", advice="pass a smaller problem or a device with more memory.",
                           spread=False, progress=False)
        # Directions per reverse-mode J d call: the probes, or one bisection level's blocks.
        self.jvp_rows = max(self.config.probes, BLOCKS)

    @property
    def rows_per_call(self) -> int:
        """Directions per call of f's kernel: as sized to the budget, halved by each out-of-memory."""
        return self.executor.chunk(JOINT_ROWS) or self.batch.chunk

    def with_plan(self, plan: Plan) -> Joint:
        """The same inputs and kernels, with the steps and noise of ``plan`` (after measuring f's noise)."""
        joint = Joint(self.executor, plan, self.supplied)
        joint.forward_only, joint.jvp_missing, joint.evaluations = self.forward_only, self.jvp_missing, self.evaluations
        return joint

    # -- numerical side --------------------------------------------------------

    def numerical(self, directions: tf.Tensor, divides=1.0):
        """(J d estimates [b, m], realised directions [b, n], plus, minus, noise [b, m]) at steps eps/divide."""
        b = int(directions.shape[0])
        steps = self.eps / np.broadcast_to(np.asarray(divides, np.float64), [b])
        plus, minus, realised = self._evaluate(directions, tf.constant(steps, F64))
        step = tf.constant(steps, F64)[:, None]
        estimate = (plus - minus) / (2 * step)
        noise = compare.quotient_noise(self.level[None, :], 2 * step)
        return estimate, realised, plus, minus, noise

    @property
    def path(self) -> str:
        """The path the probes run on: the route's, but the graph path for XLA unless jit_compile=True asks for it
        (XLA's compilation, seconds for a model, does not pay off over a few dozen evaluations)."""
        executor = self.executor
        return GRAPH if executor.path == XLA and self.config.jit_compile is not True else executor.path

    def _evaluate(self, directions: tf.Tensor, steps: tf.Tensor):
        """f(x + s d), f(x - s d) [b, m] float64 and the realised directions [b, n]: the executor's
        chunk loop (``rows_per_call`` rows a call), its kernel moving every checked input at once."""
        executor = self.executor
        self.evaluations += 2 * int(directions.shape[0])

        def call(chunk, part, count):
            path = self.path
            kernel = executor.kernel(("joint directional", path), lambda: _directional_kernel(
                executor.plan, path, executor.route.flat_function))
            return kernel(executor.values, directions[part], steps[part])

        return executor.chunked(self.batch, int(directions.shape[0]), call, lambda: self._eager(directions, steps))

    def _eager(self, directions: tf.Tensor, steps: tf.Tensor):
        plan, rows = self.executor.plan, []
        flat = _concatenated(plan, self.executor.values)
        for i in range(int(directions.shape[0])):
            plus, minus, realised = _perturbed(plan, self.executor.values, flat, directions[i], steps[i])
            sides = [tf.cast(plan.call_flat(values, plan.eval_upcast), F64) for values in (plus, minus)]
            if any(side.shape != (plan.m,) for side in sides):
                raise ShapeChangeError("The output shape of f changed when its inputs were perturbed; fastcheck needs "
                                       "outputs whose shapes do not depend on input values.")
            rows.append((*sides, realised))
        return tuple(tf.stack(column) for column in zip(*rows))

    # -- autodiff side ---------------------------------------------------------

    def vjp(self, u: tf.Tensor) -> tf.Tensor:
        """J^T u over every checked input: [n] float64 (one VJP; the supplied gradient times u for a scalar f)."""
        if self.supplied is not None:
            blocks = self.supplied(self.executor.plan)
            return tf.constant(np.concatenate([np.reshape(b, [-1]) for b in blocks]), F64) * tf.cast(u[0], F64)
        return _vjp(self.executor.plan, self.executor.native, u)

    def jvp(self, tangents: tf.Tensor, gradient: tf.Tensor, u: tf.Tensor) -> tf.Tensor | None:
        """J d for each direction [b, m] float64, from the reverse-mode gradient training uses (None: none to have).

        For a scalar f, ``J d = (J^T u) . d / u`` (the gradient itself when u = 1); otherwise the derivative of the
        VJP (J^T u) . d with respect to u (``_reverse_jvp``), so every element of it comes from the user's custom
        gradients.  Where TensorFlow cannot differentiate the VJP once more, forward mode (``ForwardAccumulator``)
        stands in, and the report says so; where forward mode has no JVP for f either, there is no element-wise J d
        (None), and only the projections check the gradient.
        """
        plan = self.executor.plan
        if plan.m == 1:
            return (tf.linalg.matvec(tangents, gradient) / tf.cast(u[0], F64))[:, None]
        if not self.forward_only:
            try:
                eager = lambda: _reverse_jvp(plan, list(self.executor.native), tangents)  # noqa: E731
                if self.executor.path not in (XLA, GRAPH):
                    return eager()

                def call(chunk, part, count):
                    # One kernel per check, for jvp_rows directions a call: tracing f's second
                    # derivative costs far more than a few padded rows.
                    kernel = self.executor.kernel(("joint rjvp", chunk), lambda: _reverse_jvp_kernel(plan))
                    padded = tf.pad(tangents[part.start : part.stop], [[0, chunk - count], [0, 0]])
                    return kernel(self.executor.native, padded)[:count]

                batch = Batch("reverse-mode J d", "joint rjvp", self.jvp_rows, subject="fast mode", unit="directions",
                              item="direction", spread=False)
                return self.executor.chunked(batch, int(tangents.shape[0]), call, eager)
            except Exception as error:
                self.forward_only = True
                rows = self._forward_jvp(tangents)
                self.executor.note(FastForwardOnly(type(error).__name__, jvp=rows is not None))
                return rows
        return self._forward_jvp(tangents)

    def _forward_jvp(self, tangents: tf.Tensor) -> tf.Tensor | None:
        """Forward-mode J d for each joint direction: [b, m] float64, one eager accumulator per direction; None
        where forward mode has no JVP for f (an op without one, ResizeBilinear: its tangent would read as 0; or one
        whose JVP raises, ResizeBicubic)."""
        if self.jvp_missing:
            return None
        try:
            rows = self._forward_rows(tangents)
        except Exception:  # an op whose JVP raises (ResizeBicubic, CropAndResize)
            rows = None
        self.jvp_missing = rows is None
        return rows

    def _forward_rows(self, tangents: tf.Tensor) -> tf.Tensor | None:
        plan = self.executor.plan
        sizes = [spec.size for spec in self.specs]
        rows = []
        for i in range(int(tangents.shape[0])):
            sources = [tf.identity(self.executor.native[spec.position]) for spec in self.specs]
            pieces = tf.split(tangents[i], sizes) if len(sizes) > 1 else [tangents[i]]
            directions = [tf.reshape(tf.cast(p, s.dtype), s.shape) for p, s in zip(pieces, sources)]
            with tf.autodiff.ForwardAccumulator(sources, directions) as accumulator:
                values = list(self.executor.native)
                for spec, source in zip(self.specs, sources):
                    values[spec.position] = source
                y = plan.call_flat(values)
            jvp = accumulator.jvp(y)
            if jvp is None:
                return None
            rows.append(tf.cast(jvp, F64))
        return tf.stack(rows)

    def shares(self, realised: tf.Tensor, gradient: tf.Tensor) -> np.ndarray:
        """[b, inputs] each input's part (J^T u)_k . d_k of the analytical projections (J^T u) . d."""
        # One matvec per input's slice: no [b, n] product (32 probes over 1e7 elements would be 2.5 GB).
        realised = tf.cast(realised, F64)
        return np.stack([tf.linalg.matvec(realised[:, a:b], gradient[a:b]).numpy()
                         for a, b in zip(self.offsets[:-1], self.offsets[1:])], axis=1)

    # -- directions --------------------------------------------------------------

    def ranges(self, indices) -> list:
        """Element ranges [a, b) of the concatenated inputs that hold the given inputs."""
        return [(int(self.offsets[i]), int(self.offsets[i + 1])) for i in indices]

    def split(self, direction: tf.Tensor, parts: list) -> tf.Tensor:
        """``direction`` [n] restricted to each part (a list of input indices): [len(parts), n]."""
        rows = []
        for part in parts:
            index = np.concatenate([np.arange(a, b) for a, b in self.ranges(part)])[:, None]
            rows.append(tf.scatter_nd(index, tf.gather_nd(direction, index), [self.n]))
        return tf.stack(rows)

    def restricted(self, rows: list, seed: int, first: int) -> tf.Tensor:
        """One random direction per entry of ``rows`` (a list of element ranges [a, b)), zero outside
        its ranges: [len(rows), n].  Row i draws from the stateless seed (seed, first + i)."""
        directions = []
        for i, ranges in enumerate(rows):
            index = np.concatenate([np.arange(a, b) for a, b in ranges])[:, None]
            noise = _normal([len(index)], [seed, first + i]) * tf.gather_nd(self.scale, index)
            directions.append(tf.scatter_nd(index, noise, [self.n]))
        return tf.stack(directions)
