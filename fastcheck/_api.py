"""Public entry points: thin wrappers over plan -> numerical / autodiff -> compare -> report."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from fastcheck import _compare
from fastcheck._autodiff import AutodiffJacobian
from fastcheck._config import MACHINE_EPSILON, CheckConfig
from fastcheck._numeric import NumericalDifferences, numerical_columns, steps
from fastcheck._paths import choose_route
from fastcheck._plan import Plan, build_plan, describe_nonfinite
from fastcheck._report import GradientCheckError, GradientReport, PairReport

# Refinement: failing columns are re-evaluated with the step divided by this.
REFINE_RATIO = 4.0


@contextlib.contextmanager
def preserved_variables(variables):
    """Restore every variable to its exact bytes afterwards, whatever happens inside."""
    saved = [(v, v.numpy().copy()) for v in variables]
    try:
        yield
    finally:
        for variable, value in saved:
            if not np.array_equal(variable.numpy(), value, equal_nan=True) or variable.numpy().tobytes() != value.tobytes():
                variable.assign(value)


def _variables_in(inputs) -> list:
    items = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    return [item for item in items if isinstance(item, tf.Variable)]


@contextlib.contextmanager
def _on_device(device):
    if device is None:
        yield
    else:
        with tf.device(device):
            yield


class _Jacobians:
    """Both Jacobians of a plan, per checked input, with the numerical noise estimate."""

    def __init__(self, plan: Plan, config: CheckConfig):
        self.plan, self.config = plan, config
        self.route = choose_route(plan, config)
        self.differences = NumericalDifferences(plan, config, self.route)
        self.autodiff = AutodiffJacobian(plan, config, self.route)
        self.eps_eval = MACHINE_EPSILON[plan.eval_dtype]
        self.y0 = plan.call_flat(plan.eval_values(), plan.eval_upcast).numpy().astype(np.float64)

    def numerical(self, position: int, columns=None, divide: float = 1.0):
        size = self.plan.inputs[position].size
        columns = np.arange(size) if columns is None else columns
        delta = steps(self.plan, self.config, position)[columns] / divide
        if not len(columns):
            return np.zeros((self.plan.m, 0)), np.zeros((self.plan.m, 0))
        jacobian, spans = numerical_columns(self.differences, position, columns, delta)
        return jacobian, _compare.rounding_noise(self.y0, spans, self.eps_eval)

    def analytical(self) -> list[np.ndarray]:
        if self.plan.n == 0:
            return [np.zeros((self.plan.m, 0)) for _ in self.plan.checked]
        return self.autodiff()


def _compute(plan: Plan, config: CheckConfig, refine: bool = True):
    """Numerical and analytical Jacobians [m, n_k] per checked input, with verdicts."""
    jac = _Jacobians(plan, config)
    analytical = jac.analytical()
    atol, rtol = config.tolerances(plan.analytical_dtype)
    results = []
    for spec, a in zip(plan.checked, analytical):
        numerical, noise = jac.numerical(spec.position)
        status, band = _compare.verdicts(a, numerical, noise, atol, rtol)
        failing = np.flatnonzero(np.any(status == _compare.MISMATCH, axis=0))
        if refine and len(failing):
            # Re-evaluate only the suspicious columns with a smaller step and
            # extrapolate: the first pass stays one batched sweep, while a
            # near-kink or curvature-dominated column gets an error estimate
            # instead of a false alarm.  A real defect far above it still fails.
            fine, fine_noise = jac.numerical(spec.position, failing, REFINE_RATIO)
            extrapolated, truncation = _compare.richardson(numerical[:, failing], fine, REFINE_RATIO)
            numerical[:, failing] = np.where(np.isfinite(extrapolated), extrapolated, fine)
            noise[:, failing] = fine_noise + truncation
            status, band = _compare.verdicts(a, numerical, noise, atol, rtol)
        results.append((spec, a, numerical, status, band))
    return jac, results, (atol, rtol)


def _split_rows(plan: Plan, block: np.ndarray) -> list[np.ndarray]:
    return [block[o.offset : o.offset + o.size] for o in plan.outputs]


def _view_shape(spec) -> tuple:
    return tuple(spec.real_view.shape)


def _output_view_shape(output) -> tuple:
    return tuple(output.shape) + ((2,) if output.dtype.is_complex else ())


def _run(f: Callable, inputs, config: CheckConfig, title: str = "gradient check") -> GradientReport:
    start = time.perf_counter()
    with _on_device(config.device), preserved_variables(_variables_in(inputs)):
        plan = build_plan(f, inputs, config)
        if plan.nondeterministic:
            return GradientReport([], "none", "-", time.perf_counter() - start, plan.notes, [plan.nondeterministic], title)
        jac, results, (atol, rtol) = _compute(plan, config)
        pairs = []
        for spec, a, numerical, status, band in results:
            for output, a_rows, n_rows, s_rows, b_rows in zip(
                plan.outputs, *(_split_rows(plan, x) for x in (a, numerical, status, band))
            ):
                pair = PairReport(output.name, spec.name, _output_view_shape(output), _view_shape(spec),
                                  n_rows, a_rows, s_rows, b_rows, atol, rtol)
                pair.hint = _compare.diagnose(a_rows, n_rows, s_rows)
                pairs.append(pair)
        notes = list(plan.notes)
        notes.append(f"path: {jac.route.path} ({jac.route.reason})")
        notes += jac.route.fallbacks
        for spec in plan.checked:
            chunk = jac.route.chunks.get(spec.position, spec.size)
            if jac.route.path != "eager" and 0 < chunk < spec.size:
                notes.append(f"{spec.name}: chunked to {chunk} perturbations per call "
                             f"({-(-spec.size // chunk)} calls) to fit memory_budget")
        problems = []
        if np.any(np.isfinite(jac.y0) == False):  # noqa: E712 -- elementwise
            problems.append(describe_nonfinite(plan, jac.y0))
        return GradientReport(pairs, jac.route.path, jac.autodiff.mode, time.perf_counter() - start, notes, problems, title)


def check_gradients(f: Callable, inputs, *, eps=None, atol=None, rtol=None, jit_compile="auto",
                    memory_budget=None, device=None, precision="auto") -> GradientReport:
    """Compare autodiff Jacobians of ``f`` with batched central differences.

    Every floating or complex input is checked (complex ones as (real, imag)
    pairs); integer and bool inputs are passed through unperturbed.  An element
    passes when ``|analytical - numerical| <= atol + rtol * |numerical| + noise``
    and both are finite, where ``noise`` is the numerical side's own error
    estimate (rounding, and the Richardson estimate for refined columns).

    Args:
      f: callable taking the inputs positionally and returning a tensor or a
        nested list/tuple/dict of tensors.
      inputs: one tensor-like (tf.Tensor, tf.Variable, numpy array, Python
        number; Python floats become float64) or a list/tuple of them.
      eps: relative step; element ``j`` is perturbed by ``eps * max(1, |x_j|)``.
        Default ``machine_epsilon ** (1/3)`` of the evaluation dtype.
      atol, rtol: tolerances; default from the table in ``_config.py`` by the
        analytical dtype (float64: 1e-8, 1e-6; float32: 1e-5, 1e-4).
      jit_compile: "auto" (XLA when the batched work pays for compilation and f
        compiles), True or False.
      memory_budget: bytes the batched evaluations may use (default 1 GiB).
      device: e.g. "/GPU:0" to pin the check to one device.
      precision: "auto" evaluates the numerical side in float64 when f accepts
        float64 inputs, "native" never, "float64" always (error if f cannot).

    Returns:
      A ``GradientReport``; ``bool(report)`` tells whether every element passed.

    Raises:
      TypeError / ValueError: for misuse (not callable, no floating inputs, f
        raising, output shapes changing under perturbation, ...).

    Example:
      >>> import tensorflow as tf, fastcheck
      >>> report = fastcheck.check_gradients(tf.sin, tf.constant([0.5, 1.0], tf.float64))
      >>> report.ok
      True
    """
    config = CheckConfig(eps, atol, rtol, jit_compile, memory_budget, device, precision)
    return _run(f, inputs, config)


def assert_gradients_close(f: Callable, inputs, **options) -> GradientReport:
    """Like ``check_gradients``, but raise ``GradientCheckError`` (its message is the report) on failure.

    Example:
      >>> import tensorflow as tf, fastcheck
      >>> _ = fastcheck.assert_gradients_close(tf.tanh, tf.constant([0.3], tf.float64))
    """
    report = check_gradients(f, inputs, **options)
    if not report.ok:
        raise GradientCheckError(report)
    return report


def _by_output(plan: Plan, blocks: dict) -> list[list]:
    return [
        [blocks[s.position][o.offset : o.offset + o.size] if s.position in blocks else None for s in plan.inputs]
        for o in plan.outputs
    ]


def numerical_jacobian(f: Callable, inputs, **options) -> list[list[np.ndarray | None]]:
    """Batched central-difference Jacobians: ``result[output][input]`` of shape (output_size, input_size).

    Outputs are the floating leaves of ``f``'s result in ``tf.nest.flatten``
    order; non-floating inputs get ``None``.  Options as for ``check_gradients``.
    """
    config = CheckConfig(**options)
    with _on_device(config.device), preserved_variables(_variables_in(inputs)):
        plan = build_plan(f, inputs, config)
        jac = _Jacobians(plan, config)
        return _by_output(plan, {s.position: jac.numerical(s.position)[0] for s in plan.checked})


def autodiff_jacobian(f: Callable, inputs, **options) -> list[list[np.ndarray | None]]:
    """Autodiff Jacobians in the same layout as ``numerical_jacobian``."""
    config = CheckConfig(**options)
    with _on_device(config.device), preserved_variables(_variables_in(inputs)):
        plan = build_plan(f, inputs, config)
        analytical = _Jacobians(plan, config).analytical()
        return _by_output(plan, {s.position: a for s, a in zip(plan.checked, analytical)})


class GradientChecker:
    """Holds default options; every method accepts overrides of them.

    Example:
      >>> import tensorflow as tf, fastcheck
      >>> checker = fastcheck.GradientChecker(rtol=1e-5)
      >>> checker.check(tf.exp, tf.constant([0.1], tf.float64)).ok
      True
    """

    def __init__(self, **defaults):
        self.config = CheckConfig(**defaults)

    def _options(self, overrides) -> dict:
        return {**self.config.__dict__, **overrides}

    def check(self, f: Callable, inputs, **overrides) -> GradientReport:
        return check_gradients(f, inputs, **self._options(overrides))

    def assert_close(self, f: Callable, inputs, **overrides) -> GradientReport:
        return assert_gradients_close(f, inputs, **self._options(overrides))

