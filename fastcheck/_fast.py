"""The fast check (``mode="fast"``): random projections and localisation of a defect.

One strategy of ``_check.run_check`` (the other is ``_full``), evaluating f through the same executor.

For k probe pairs (u, d) per input -- seeded numpy draws that never touch
TensorFlow's or numpy's global RNG -- three numbers are compared:

* numerical  ``J d  ~ (f(x + eps d) - f(x - eps d)) / (2 eps)`` for all k probes
  in one batched evaluation (refined with smaller steps where it disagrees);
* forward    ``J d`` from ``tf.autodiff.ForwardAccumulator`` (a JVP);
* reverse    ``u . (J d)`` against ``(J^T u) . d`` from the tape (a VJP).

Directions are ``d = max(1, |x|) * v`` with ``v ~ N(0, 1)``, so every element
moves by about the step full mode would use.  The tolerance accounts for the
probe's norm explicitly and is never a multiple of the tensor size:

    forward, per output element i:  |a_i - n_i| <= atol * ||d||_2 + rtol * |n_i| + noise_i = band_i
    reverse, per probe:             |a - n|     <= ||u * band||_2

(independent per-element errors add up like 2-norms: of size atol over the
entries of d, and of size band_i over the outputs weighted by u).

When a probe fails, the input is bisected: probes restricted to each of 8
blocks (contiguous in the flattened input, i.e. slabs along the leading axes)
show which block carries the defect; the worst block is split again until it
is small enough for an element-by-element check, whose worst element is
reported with the region.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from fastcheck import _compare
from fastcheck._autodiff import jvp_rows, reverse_jvp
from fastcheck._config import MACHINE_EPSILON
from fastcheck._executor import Executor, timed
from fastcheck._paths import GRAPH, XLA
from fastcheck._plan import Plan, measure_precision
from fastcheck._report import Comparison, Element, Outcome, ProjectionReport

BLOCKS = 8
REGION_MAX = 64
LOCALISE_DRAWS = 3  # random draws per bisection level before giving up on it
ZERO = tf.UnconnectedGradients.ZERO


def _jvp_kernel(plan: Plan, position: int):
    """J d for a batch of tangents [k, n] of one input, as one vectorized ForwardAccumulator pass."""
    return tf.function(lambda values, tangents: jvp_rows(plan, position, GRAPH, values, tangents), autograph=plan.autograph)


@tf.function(jit_compile=True)
def _perturb(x, directions, step):
    """x +- step * d as one [2k, n] batch in x's dtype, and the directions actually realised (float64).

    One fused XLA pass instead of a dozen eager passes over arrays of k * n.
    """
    offsets = tf.cast(directions, x.dtype) * step
    plus_x, minus_x = x[None] + offsets, x[None] - offsets
    if x.dtype == tf.float64:
        realised = directions  # float64 rounding of x +- eps d is ~1e-11 of the step: negligible
    else:  # the step actually taken, so that both sides differentiate along the same direction
        realised = (tf.cast(plus_x, tf.float64) - tf.cast(minus_x, tf.float64)) / (2 * tf.cast(step, tf.float64))
    return tf.concat([plus_x, minus_x], 0), realised


class Directional:
    """Numerical directional derivatives and their autodiff counterparts for one input.

    Everything of size n (input) or m (output) stays in TensorFlow, on the
    device; only per-probe summaries come back to the host.
    """

    def __init__(self, executor: Executor, plan: Plan, position: int, y0: np.ndarray):
        self.executor, self.plan, self.config, self.position = executor, plan, executor.config, position
        self.values, self.native = executor.values, executor.native
        self.x = tf.reshape(self.values[position], [-1])
        self.dtype = self.x.dtype
        self.scale = tf.cast(tf.maximum(1.0, tf.abs(tf.cast(self.x, tf.float64))), tf.float64)
        self.eps = self.config.step(plan.noise_epsilon)
        self.eps_eval = MACHINE_EPSILON[plan.eval_dtype]
        self.y0 = y0
        self.forward_only = False  # set when the reverse-mode gradient cannot be differentiated twice
        self.batched_jvp = True  # cleared when forward mode cannot run as one batched kernel
        # Error of one evaluation per output: rounding, or f's measured noise when larger.
        sigma = plan.noise.sigma if plan.noise is not None else 0.0
        level = np.maximum(self.eps_eval * np.abs(y0), _compare.MEASURED_NOISE_FACTOR / _compare.NOISE_FACTOR * sigma)
        self.level = tf.constant(level, tf.float64)

    @property
    def probes_per_call(self) -> int:
        return max(1, self.executor.rows_per_call(self.position) // 2)

    def numerical(self, directions: tf.Tensor, divide: float = 1.0):
        """(J d estimates [k, m], realised directions [k, n], plus, minus, noise [m]) at step eps/divide."""
        step = float(np.asarray(self.eps / divide, self.dtype.as_numpy_dtype))
        k = int(directions.shape[0])
        batch, realised = _perturb(self.x, directions, tf.constant(step, self.dtype))
        out = self.executor.rows(self.position, batch)
        plus, minus = out[:k], out[k:]
        estimate = (plus - minus) / (2 * step)
        noise = _compare.NOISE_FACTOR * self.level / (2 * step)
        return estimate, realised, plus, minus, noise

    def jvp(self, tangents: tf.Tensor) -> tf.Tensor:
        """J d for each direction [k, m] float64, from the reverse-mode gradient training uses.

        J d is the derivative of the VJP (J^T u) . d with respect to u (see
        ``_autodiff.reverse_jvp``), so every element of it comes from the user's
        custom gradients.  Where TensorFlow cannot differentiate the VJP once more,
        forward mode (``ForwardAccumulator``) stands in, and the report says so.
        """
        if not self.forward_only:
            try:
                tangents_native = tf.cast(tangents, self.native[self.position].dtype)
                if self.executor.path in (XLA, GRAPH):
                    kernel = self.executor.kernel(("rjvp", self.position, int(tangents.shape[0])), lambda: tf.function(
                        lambda values, t: reverse_jvp(self.plan, self.position, list(values), t),
                        autograph=self.plan.autograph))
                    return kernel(self.native, tangents_native)
                return reverse_jvp(self.plan, self.position, list(self.native), tangents_native)
            except Exception as error:
                self.forward_only = True
                self.executor.note(
                    f"fast mode: the reverse-mode gradient cannot be differentiated once more ({type(error).__name__}); "
                    "the element-wise comparison uses forward-mode JVPs, which do not see tf.custom_gradient "
                    "(the projection u.J.d still checks the reverse-mode gradient)")
        return self._forward_jvp(tangents)

    def _forward_jvp(self, tangents: tf.Tensor) -> tf.Tensor:
        """Forward-mode J d for each direction: [k, m] float64 (one batched call when traceable)."""
        if self.batched_jvp and self.executor.path in (XLA, GRAPH):
            try:
                kernel = self.executor.kernel(("jvp", self.position, int(tangents.shape[0])),
                                              lambda: _jvp_kernel(self.plan, self.position))
                return tf.cast(kernel(self.native, tf.cast(tangents, self.native[self.position].dtype)), tf.float64)
            except Exception as error:  # fall back to eager JVPs, and say so
                self.executor.note(f"fast mode: batched JVP failed ({type(error).__name__}); ran eagerly")
                self.batched_jvp = False
        source = self.native[self.position]
        rows = []
        for i in range(int(tangents.shape[0])):
            tangent = tf.reshape(tf.cast(tangents[i], source.dtype), source.shape)
            with tf.autodiff.ForwardAccumulator(source, tangent) as acc:
                values = list(self.native)
                values[self.position] = source
                y = self.plan.call_flat(values)
            rows.append(tf.cast(acc.jvp(y, unconnected_gradients=ZERO), tf.float64))
        return tf.stack(rows)

    def vjp(self, cotangent: tf.Tensor) -> tf.Tensor:
        """Reverse-mode J^T u for one cotangent [m], eagerly: [n] float64."""
        source = self.native[self.position]
        with tf.GradientTape() as tape:
            tape.watch(source)
            values = list(self.native)
            values[self.position] = source
            y = self.plan.call_flat(values)
        g = tape.gradient(y, source, output_gradients=tf.cast(cotangent, y.dtype), unconnected_gradients=ZERO)
        return tf.cast(tf.reshape(tf.convert_to_tensor(g), [-1]), tf.float64)


@tf.function
def _summaries(estimate, forward, realised, noise, u, gradient, atol, rtol):
    """Per-probe summaries in one graph call (TF's multi-threaded kernels; XLA CPU was 3x slower here)."""
    norms = tf.norm(realised, axis=1)
    band = atol * norms[:, None] + rtol * tf.abs(estimate) + noise
    difference = tf.abs(forward - estimate)
    ratio = tf.where(tf.math.is_nan(difference / band), tf.constant(np.inf, tf.float64), difference / band)
    rows = tf.argmax(ratio, axis=1, output_type=tf.int32)
    pick = lambda t: tf.gather(t, rows, axis=1, batch_dims=1)  # noqa: E731
    reverse = tf.stack([tf.reduce_sum(gradient[None, :] * realised, axis=1), tf.reduce_sum(u[None, :] * estimate, axis=1),
                        tf.norm(u[None, :] * band, axis=1)], axis=1)
    finite = tf.math.is_finite(forward - estimate)
    safe = lambda t: tf.where(finite, t, tf.zeros_like(t))  # noqa: E731
    squares = tf.stack([tf.reduce_sum(safe(forward - estimate) ** 2), tf.reduce_sum(safe(estimate) ** 2),
                        tf.reduce_sum(safe(forward) ** 2)])
    worst = tf.stack([tf.cast(rows, tf.float64), pick(forward), pick(estimate), pick(band)], axis=1)
    return tf.reduce_max(ratio, axis=1), worst, reverse, squares


def _judge(estimate, forward, realised, noise, u, gradient, atol, rtol) -> Comparison:
    noise = noise if noise.shape.rank == 2 else tf.broadcast_to(noise[None, :], estimate.shape)
    forward_ratio, worst, reverse, squares = (t.numpy() for t in _summaries(
        estimate, forward, realised, noise, u, gradient, tf.constant(atol, tf.float64), tf.constant(rtol, tf.float64)))
    with np.errstate(invalid="ignore", divide="ignore"):
        reverse_ratio = np.abs(reverse[:, 0] - reverse[:, 1]) / reverse[:, 2]
    return Comparison(forward_ratio, np.where(np.isnan(reverse_ratio), np.inf, reverse_ratio), worst, reverse, squares)


def compare(directional: Directional, directions: tf.Tensor, u: tf.Tensor, gradient: tf.Tensor, atol, rtol,
            forward_side=True, refine=True) -> Comparison:
    """Numerical vs forward and reverse for the given probes, a group at a time.

    ``forward_side=False`` skips the JVPs (the forward comparison then passes
    trivially); ``refine=False`` skips the smaller-step re-evaluation of failing
    probes (Richardson over h/4, h/16, h/64, as in full mode).
    """
    parts = []
    group = directional.probes_per_call
    for start in range(0, int(directions.shape[0]), group):
        d = directions[start : start + group]
        estimate, realised, plus, minus, noise = directional.numerical(d)
        forward = directional.jvp(realised) if forward_side else estimate
        result = _judge(estimate, forward, realised, noise, u, gradient, atol, rtol)
        failing = np.flatnonzero((result.forward_ratio > 1) | (result.reverse_ratio > 1))
        if refine and len(failing):
            # Curvature along a long direction is not a gradient bug: refine the
            # failing probes with smaller steps and an error estimate.
            y0 = directional.y0
            estimate = estimate.numpy()
            noise_rows = np.broadcast_to(noise.numpy(), estimate.shape).copy()
            for i in failing:
                levels: list[tuple] = [(estimate[i][:, None], noise_rows[i][:, None], None, None, None)]
                for divide in (4.0, 16.0, 64.0):
                    e, _, p, mi, nz = directional.numerical(d[i : i + 1], divide)
                    span = np.array([2 * directional.eps / divide])
                    levels.append((e.numpy().T, nz.numpy()[:, None], p.numpy().T, mi.numpy().T, span))
                best, error, *_ = _compare.refine(levels, y0, 4.0)
                estimate[i], noise_rows[i] = best[:, 0], error[:, 0]
            estimate = tf.constant(estimate)
            result = _judge(estimate, forward if forward_side else estimate, realised, tf.constant(noise_rows),
                            u, gradient, atol, rtol)
        parts.append(result)
    return Comparison.join(parts)


def _normal(shape, seed) -> tf.Tensor:
    """Seeded standard normal draws as float64 (drawn in float32: half the cost, and any
    random direction serves; the realised direction is computed exactly)."""
    return tf.cast(tf.random.stateless_normal(shape, seed, dtype=tf.float32), tf.float64)


def check_fast(executor: Executor, plan: Plan, timings: dict, supplied=None, output_name=None) -> Outcome:
    """The fast check: one ProjectionReport per checked input (``supplied`` gradients are never fast-checked)."""
    with timed(timings, "noise"):
        plan = measure_precision(plan)  # a few evaluations, next to fast mode's cost
    atol, rtol = executor.config.tolerances(plan.precision)
    with timed(timings, "fast"):
        pairs = _projections(executor, plan, atol, rtol)
    return Outcome(pairs, plan, atol, rtol, "fast")


def _projections(executor: Executor, plan: Plan, atol: float, rtol: float) -> list:
    """One ProjectionReport per checked input (``plan`` with f's measured noise)."""
    config, reports = executor.config, []
    for spec in plan.checked:
        directional = Directional(executor, plan, spec.position, plan.eval_output)
        # Stateless draws from (seed, input): reproducible, and no global RNG state is touched.
        seed = [config.seed, spec.position]
        directions = _normal([config.probes, spec.size], seed) * directional.scale[None, :]
        # One cotangent u for all probes: a single VJP then checks every u.J.d_i.
        u = _normal([plan.m], [config.seed, spec.position + 1000])
        gradient = directional.vjp(u)
        result = compare(directional, directions, u, gradient, atol, rtol)
        report = ProjectionReport(spec.name, tuple(spec.real_view.shape), result, atol, rtol)
        if not report.ok:
            report.hint = ("a directional derivative disagrees: the gradient of the named input is wrong in the region "
                           "shown; check that region with mode='full' on a slice, starting at the worst element.")
            _localise(report, directional, config.seed, u, gradient, result, atol, rtol)
        reports.append(report)
    return reports


def _localise(report: ProjectionReport, directional: Directional, seed: int, u, gradient, result, atol, rtol) -> None:
    """Bisect the flattened input into blocks, follow the worst, then check its elements one by one."""
    forward_side = bool(np.any(result.forward_ratio > 1))  # follow only the side(s) that failed
    m, n = directional.plan.m, int(directional.x.shape[0])
    region_max = int(max(1, min(REGION_MAX, directional.config.budget // max(1, 40 * m))))
    low, high, level = 0, n, 0
    index = tf.range(n)
    while high - low > region_max:
        edges = np.linspace(low, high, min(BLOCKS, high - low) + 1).astype(int)
        blocks = [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]
        inside = tf.stack([(index >= a) & (index < b) for a, b in blocks])
        # A projection catches a defect with a random-sized signal: when no block
        # shows it, draw again before concluding that it is spread over blocks.
        for draw in range(LOCALISE_DRAWS):
            noise = _normal([len(blocks), n], [seed, 7919 + 1000 * draw + level])
            directions = tf.where(inside, noise * directional.scale[None, :], tf.zeros_like(noise))
            found = compare(directional, directions, u, gradient, atol, rtol, forward_side=forward_side, refine=False)
            score = np.maximum(found.forward_ratio, found.reverse_ratio)
            if np.max(score) > 1:
                break
        level += 1
        if np.max(score) <= 1:
            break  # the defect no longer shows in any one block: report the region so far
        low, high = blocks[int(np.argmax(score))]
    shape = report.input_shape
    at = lambda flat: tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()  # noqa: E731
    report.region = (at(low), at(high - 1))
    if high - low > region_max:
        report.hint = (f"{report.hint} The defect did not show in any single block of the region; it may be "
                       "spread thinly over it or close to the tolerance: rerun with more probes or mode='full' on a slice.")
        return
    # Element by element inside the region: each column of the numerical
    # Jacobian against the forward column and the reverse entry (J^T u)_j.
    columns = np.arange(low, high)
    directions = tf.one_hot(columns, n, dtype=tf.float64) * tf.gather(directional.scale, columns)[:, None]
    found = compare(directional, directions, u, gradient, atol, rtol, forward_side=forward_side)
    scales = tf.gather(directional.scale, columns).numpy()
    forward_best = int(np.argmax(found.forward_ratio)) if forward_side else None
    reverse_best = int(np.argmax(found.reverse_ratio))
    outputs = directional.plan.outputs
    out_shape = outputs[0].shape if len(outputs) == 1 and not outputs[0].dtype.is_complex else (m,)
    if forward_best is not None and found.forward_ratio[forward_best] >= found.reverse_ratio[reverse_best]:
        column, report.side = forward_best, "forward"
        row, a, num, band = found.forward_worst[column]
        output_index = tuple(int(i) for i in np.unravel_index(int(row), out_shape)) if out_shape else ()
        ratio = found.forward_ratio[column]
    else:
        column, report.side = reverse_best, "reverse"
        (a, num, band), output_index, ratio = found.reverse[column], (), found.reverse_ratio[column]
    scale = scales[column]
    report.worst = Element(output_index, at(columns[column]), float(a / scale), float(num / scale),
                           float(abs(a - num) / scale), float(band / scale), "mismatch" if ratio > 1 else "ok")
