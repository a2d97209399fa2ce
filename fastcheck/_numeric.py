"""Batched central differences.

For input ``k`` with ``n`` elements, a kernel evaluates ``f`` at ``x + d_j e_j``
and ``x - d_j e_j`` for a chunk of ``(j, d_j)`` pairs as one batch (one
``vectorized_map``), and returns ``f(x + d e_j) - f(x - d e_j)`` together with
the step actually taken, ``(x_j + d_j) - (x_j - d_j)`` in the evaluation dtype
(the exactly representable span, not the nominal ``2 d_j``).  The same kernel
serves the first pass over all columns and any later refinement of a few
columns with other steps, so a check traces it once.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from fastcheck._config import MACHINE_EPSILON, CheckConfig
from fastcheck._paths import EAGER, LOOP, Progress, Route, cached, compile_kernel, pad, plan_key
from fastcheck._plan import Plan


class ShapeChangeError(ValueError):
    pass


def evaluate_rows(plan: Plan, position: int, path: str, values, batch, flat_function=None):
    """f at each row of ``batch`` (values of input ``position``, flattened): flat outputs [rows, m].

    Traced code: one ``vectorized_map`` over the rows, or ``map_fn`` on the loop
    path, where it calls the probe's already-traced function so f is not traced twice.
    """
    shape, m = plan.eval_value(plan.inputs[position]).shape, plan.m

    def evaluate(row):
        moved = list(values)
        moved[position] = tf.reshape(row, shape)
        if path == LOOP and flat_function is not None:
            return tf.ensure_shape(flat_function(*moved), [m])
        return tf.ensure_shape(plan.call_flat(moved, plan.eval_upcast), [m])

    if path == LOOP:
        return tf.map_fn(evaluate, batch, parallel_iterations=32, fn_output_signature=tf.TensorSpec([m], plan.eval_flat_dtype))
    return tf.vectorized_map(evaluate, batch)


def _make_kernel(plan: Plan, position: int, chunk: int, path: str, flat_function=None):
    size = plan.inputs[position].size

    def kernel(values, idx, delta):
        flat = tf.reshape(values[position], [-1])
        perturbation = tf.one_hot(idx, size, dtype=flat.dtype) * delta[:, None]
        batch = tf.concat([flat[None] + perturbation, flat[None] - perturbation], axis=0)
        outs = evaluate_rows(plan, position, path, values, batch, flat_function)
        picked = tf.gather(flat, idx)
        # [m, chunk] each: the Jacobian's own layout, so the host never transposes it.
        return tf.transpose(outs[:chunk]), tf.transpose(outs[chunk:]), (picked + delta) - (picked - delta)

    return compile_kernel(kernel, path)


class NumericalDifferences:
    """Evaluates ``f(x + d e_j) - f(x - d e_j)`` for chosen (input, j, d)."""

    def __init__(self, plan: Plan, config: CheckConfig, route: Route):
        self.plan, self.config, self.route = plan, config, route
        self.values = tuple(plan.eval_values())

    def __call__(self, position: int, idx: np.ndarray, delta: np.ndarray):
        """Returns f(x + d e_j) and f(x - d e_j) as [m, len(idx)] float64, and the spans [len(idx)]."""
        while self.route.path != EAGER:
            try:
                return self._batched(position, idx, delta)
            except ShapeChangeError:
                raise
            except Exception as error:
                if not self.route.fall_back(error, "numerical differences"):
                    raise
        return self._eager(position, idx, delta)

    def _kernel(self, position: int, chunk: int):
        key = plan_key(self.plan, self.config) + ("numeric", position, chunk, self.route.path)
        return cached(key, lambda: _make_kernel(self.plan, position, chunk, self.route.path, self.route.flat_function))

    def _batched(self, position, idx, delta):
        dtype = self.values[position].dtype.as_numpy_dtype
        pluses, minuses, spans = [], [], []
        start, progress = 0, Progress(self.config.progress, len(idx), "perturbations")
        while start < len(idx):
            chunk = self.route.chunks[position]
            kernel = self._kernel(position, chunk)
            part = slice(start, start + chunk)
            count = len(idx[part])
            try:
                plus, minus, span = kernel(self.values, tf.constant(pad(idx[part], chunk), tf.int32),
                                           tf.constant(pad(delta[part], chunk).astype(dtype)))
            except tf.errors.ResourceExhaustedError:
                if chunk == 1:
                    raise MemoryError(
                        f"f ran out of memory evaluating a single perturbation of {self.plan.inputs[position].name}; "
                        "pass mode='fast' or a smaller problem."
                    ) from None
                # Halve the chunk and retry: the estimate of f's footprint was too low.
                self.route.chunks[position] = chunk // 2
                self.route.fallbacks.append(
                    f"{self.plan.inputs[position].name}: out of memory at {chunk} perturbations per call; "
                    f"retried with {chunk // 2}"
                )
                continue
            except tf.errors.InvalidArgumentError as error:
                if "ensure_shape" in str(error).lower() or "EnsureShape" in str(error):
                    raise ShapeChangeError(
                        f"The output shape of f changed when {self.plan.inputs[position].name} was perturbed; "
                        "fastcheck needs outputs whose shapes do not depend on input values "
                        "(avoid tf.boolean_mask/tf.where with one argument on perturbed values)."
                    ) from None
                raise
            pluses.append(plus.numpy()[:, :count].astype(np.float64, copy=False))
            minuses.append(minus.numpy()[:, :count].astype(np.float64, copy=False))
            spans.append(span.numpy()[:count].astype(np.float64, copy=False))
            start += count
            progress.advance(count)
        progress.close()
        if len(pluses) == 1:
            return pluses[0], minuses[0], spans[0]
        return np.concatenate(pluses, axis=1), np.concatenate(minuses, axis=1), np.concatenate(spans)

    def _eager(self, position, idx, delta):
        plan = self.plan
        base = self.values[position].numpy()
        shape, dtype = base.shape, base.dtype
        flat = base.reshape(-1)
        m = plan.m
        pluses, minuses = np.empty((m, len(idx))), np.empty((m, len(idx)))
        spans = np.empty(len(idx))
        values = list(self.values)
        for row, (j, d) in enumerate(zip(idx, delta)):
            outs = []
            for sign in (1, -1):
                moved = flat.copy()
                moved[j] = flat[j] + dtype.type(sign * d)
                values[position] = tf.constant(moved.reshape(shape))
                y = plan.call_flat_numpy(values, plan.eval_upcast)
                if y.shape != (m,):
                    raise ShapeChangeError(
                        f"The output shape of f changed when {plan.inputs[position].name} was perturbed at element {j}; "
                        "fastcheck needs outputs whose shapes do not depend on input values."
                    )
                outs.append(y)
            pluses[:, row], minuses[:, row] = outs
            spans[row] = float(flat[j] + dtype.type(d)) - float(flat[j] - dtype.type(d))
        return pluses, minuses, spans


def steps(plan: Plan, config: CheckConfig, position: int) -> np.ndarray:
    """Per-element step ``eps * max(1, |x_j|)`` for one input (real view, flattened).

    ``eps`` is the evaluation dtype's ``machine_epsilon ** (1/3)``: the steps do not
    follow f's measured noise (a larger relative step spans periods of cos at 5e7);
    noise-limited columns are re-estimated over larger steps instead (``_api._coarsen``).
    """
    x = plan.eval_value(plan.inputs[position]).numpy().reshape(-1).astype(np.float64)
    return config.step(MACHINE_EPSILON[plan.eval_dtype]) * np.maximum(1.0, np.abs(x))


def numerical_columns(differences: NumericalDifferences, position: int, columns: np.ndarray, delta: np.ndarray):
    """Central differences for some columns: Jacobian [m, k], and f(x+), f(x-) as [m, k], spans [k]."""
    plus, minus, span = differences(position, columns, delta)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        jacobian = plus - minus
        jacobian /= span[None, :]
        return jacobian, plus, minus, span
