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
from fastcheck._fast import check_fast
from fastcheck._model import model_loss_function
from fastcheck._numeric import NumericalDifferences, numerical_columns, steps
from fastcheck._paths import choose_route
from fastcheck._plan import Plan, _first_line, build_plan, describe_nonfinite, normalize_inputs, to_real_view
from fastcheck._report import GradientCheckError, GradientReport, PairReport

# Refinement: failing columns are re-evaluated with the step divided by this.
REFINE_RATIO = 4.0
REFINE_LEVELS = 5
DEEP_LEVELS = 12


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
def _timed(timings: dict, stage: str):
    """Add the seconds spent inside to ``timings[stage]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[stage] = timings.get(stage, 0.0) + time.perf_counter() - start


@contextlib.contextmanager
def _on_device(device):
    if device is None:
        yield
    else:
        with tf.device(device):
            yield


class _Jacobians:
    """Both Jacobians of a plan, per checked input, with the numerical noise estimate."""

    def __init__(self, plan: Plan, config: CheckConfig, timings: dict | None = None):
        self.plan, self.config, self.timings = plan, config, {} if timings is None else timings
        with _timed(self.timings, "route"):
            self.route = choose_route(plan, config)
        self.differences = NumericalDifferences(plan, config, self.route)
        self.autodiff = AutodiffJacobian(plan, config, self.route)
        self.eps_eval = MACHINE_EPSILON[plan.eval_dtype]
        if plan.eval_upcast or plan.native_output is None:
            self.y0 = plan.call_flat(plan.eval_values(), plan.eval_upcast).numpy().astype(np.float64)
        else:
            self.y0 = plan.native_output  # f at the point, from planning: no extra call

    def numerical(self, position: int, columns=None, divide: float = 1.0):
        """Central differences [m, k] for ``columns`` (default all) and their rounding noise."""
        size = self.plan.inputs[position].size
        columns = np.arange(size) if columns is None else columns
        if not len(columns):
            return np.zeros((self.plan.m, 0)), np.zeros((self.plan.m, 0))
        delta = steps(self.plan, self.config, position)[columns] / divide
        jacobian, _, _, spans = numerical_columns(self.differences, position, columns, delta)
        return jacobian, _compare.rounding_noise(self.y0, spans, self.eps_eval)

    def refined(self, position: int, columns: np.ndarray, first: np.ndarray, first_noise: np.ndarray, levels: int):
        """Re-evaluate ``columns`` at steps h/4 ... h/4**levels in one batch; see ``_compare.refine``."""
        count = len(columns)
        base = steps(self.plan, self.config, position)[columns]
        divisors = [REFINE_RATIO**k for k in range(1, levels + 1)]
        idx = np.tile(columns, len(divisors))
        delta = np.concatenate([base / d for d in divisors])
        jacobian, plus, minus, spans = numerical_columns(self.differences, position, idx, delta)
        noise = _compare.rounding_noise(self.y0, spans, self.eps_eval)
        stack: list[tuple] = [(first, first_noise, None, None, None)]
        for k in range(len(divisors)):
            part = slice(k * count, (k + 1) * count)
            stack.append((jacobian[:, part], noise[:, part], plus[:, part], minus[:, part], spans[part]))
        return _compare.refine(stack, self.y0, REFINE_RATIO)

    def analytical(self) -> list[np.ndarray]:
        if self.plan.n == 0:
            return [np.zeros((self.plan.m, 0)) for _ in self.plan.checked]
        return self.autodiff()


def _compute(jac: _Jacobians, atol: float, rtol: float, supplied=None, refine: bool = True):
    """Numerical and analytical Jacobians [m, n_k] per checked input, with verdicts.

    ``supplied`` replaces autodiff: a callable returning the analytical blocks.
    """
    plan = jac.plan
    with _timed(jac.timings, "analytical"):
        analytical = supplied(plan) if supplied is not None else jac.analytical()
    results = []
    for spec, a in zip(plan.checked, analytical):
        with _timed(jac.timings, "numerical"):
            numerical, noise = jac.numerical(spec.position)
        status, band = _compare.verdicts(a, numerical, noise, atol, rtol)
        one_sided = {}
        if refine:
            with _timed(jac.timings, "refine"):
                status, band, one_sided = _refine(jac, spec.position, a, numerical, noise, status, band, (atol, rtol))
        results.append((spec, a, numerical, status, band, one_sided))
    return results


def _refine(jac: _Jacobians, position: int, a, numerical, noise, status, band, tolerances):
    """Re-examine suspicious columns in place; returns the new (status, band, one-sided values).

    Only columns with a mismatch or a non-finite difference are re-evaluated, so
    the first pass stays one batched sweep:

    1. triage at h/4: where the estimate barely moves (by < 1% of the mismatch
       and < 10% of itself)
       and the one-sided derivatives agree, the numbers are conclusive and the
       mismatch stands -- a wrong gradient
       costs one extra evaluation pair per column, not five;
    2. the rest go down to h/4**5 (``_compare.refine``): a step that crossed a
       kink, a domain edge or strong curvature gets a better estimate and an
       error bound instead of a false alarm;
    3. still unsettled ones (features far below the step) go down to h/4**12;
       if even that does not settle, the element is UNRESOLVED (undecidable),
       not a wrong gradient.
    """
    atol, rtol = tolerances
    suspicious = np.flatnonzero(np.any((status == _compare.MISMATCH) | (status == _compare.NUMERICAL_NONFINITE), axis=0))
    if not len(suspicious):
        return status, band, {}
    first, first_noise = numerical[:, suspicious], noise[:, suspicious]
    delta = steps(jac.plan, jac.config, position)[suspicious] / REFINE_RATIO
    quarter, plus, minus, spans = numerical_columns(jac.differences, position, suspicious, delta)
    with np.errstate(invalid="ignore", over="ignore"):
        mismatch = np.abs(a[:, suspicious] - first)
        moved = np.abs(quarter - first)
        # One-sided derivatives that disagree mean a possible kink: not conclusive.
        sides = np.abs(plus + minus - 2 * jac.y0[:, None]) / (spans[None, :] / 2)
        conclusive = (np.isfinite(moved) & (moved <= 0.01 * mismatch) & (moved <= 0.1 * np.abs(first) + atol)
                      & (sides <= 0.1 * mismatch))
    doubtful = np.any((status[:, suspicious] != _compare.OK) & ~conclusive, axis=0)
    suspicious, first, first_noise = suspicious[doubtful], first[:, doubtful], first_noise[:, doubtful]
    if not len(suspicious):
        return status, band, {}

    estimate, error, settled, kink, right, left = jac.refined(position, suspicious, first, first_noise, REFINE_LEVELS)
    numerical[:, suspicious], noise[:, suspicious] = estimate, error
    status, band = _compare.verdicts(a, numerical, noise, atol, rtol)
    unsettled = np.any((status[:, suspicious] == _compare.MISMATCH) & ~settled, axis=0)
    if unsettled.any():
        keep = np.flatnonzero(unsettled)
        deeper = jac.refined(position, suspicious[keep], first[:, keep], first_noise[:, keep], DEEP_LEVELS)
        for target, value in zip((estimate, error, settled, kink, right, left), deeper):
            target[:, keep] = value
        numerical[:, suspicious], noise[:, suspicious] = estimate, error
        status, band = _compare.verdicts(a, numerical, noise, atol, rtol)
    kink &= settled  # a kink shows as settled central differences with unequal sides
    one_sided = {}
    for row, k in zip(*np.nonzero(status[:, suspicious] == _compare.MISMATCH)):
        column = suspicious[k]
        if not settled[row, k]:
            status[row, column] = _compare.UNRESOLVED
        elif kink[row, k]:
            # A kink at the point itself: both one-sided derivatives are reported;
            # the analytical value is wrong only if it lies outside their range.
            low, high = sorted((left[row, k], right[row, k]))
            one_sided[(int(row), int(column))] = (float(left[row, k]), float(right[row, k]))
            if low - band[row, column] <= a[row, column] <= high + band[row, column]:
                status[row, column] = _compare.NONDIFFERENTIABLE
    return status, band, one_sided


# mode="auto" runs full Jacobians up to these sizes (elements of one Jacobian
# block, and elements of one input), random projections beyond.
FULL_MAX_ENTRIES_PER_GIB = 25_000_000
FULL_MAX_INPUT = 200_000


def choose_mode(plan: Plan, config: CheckConfig, supplied=None) -> tuple[str, str]:
    """("full" | "fast", why): full Jacobians when they fit the budget and a time estimate."""
    if supplied is not None:
        return "full", "supplied gradients are compared element by element"
    if config.mode != "auto":
        return config.mode, "as requested"
    entries = plan.m * plan.n
    limit = FULL_MAX_ENTRIES_PER_GIB * config.budget / (1 << 30)
    if entries > limit:
        return "fast", f"the full Jacobian has {entries:.3g} entries, more than {limit:.3g} fit memory_budget"
    if max((s.size for s in plan.checked), default=0) > FULL_MAX_INPUT:
        return "fast", f"an input has more than {FULL_MAX_INPUT} elements: 2n evaluations would take too long"
    return "full", f"the full Jacobian ({entries:.3g} entries) fits memory_budget"


def _split_rows(plan: Plan, block: np.ndarray) -> list[np.ndarray]:
    return [block[o.offset : o.offset + o.size] for o in plan.outputs]


def _view_shape(spec) -> tuple:
    return tuple(spec.real_view.shape)


def _output_view_shape(output) -> tuple:
    return tuple(output.shape) + ((2,) if output.dtype.is_complex else ())


def _run(f: Callable, inputs, config: CheckConfig, title: str = "gradient check", *, supplied=None,
         names=None, protect=(), output_name=None) -> GradientReport:
    start = time.perf_counter()
    timings: dict[str, float] = {}
    with _on_device(config.device), preserved_variables([*_variables_in(inputs), *protect]):
        with _timed(timings, "plan"):
            plan = build_plan(f, inputs, config, names)
        if plan.nondeterministic:
            return GradientReport([], "none", "-", time.perf_counter() - start, plan.notes, [plan.nondeterministic], title,
                                  timings)
        mode, why = choose_mode(plan, config, supplied)
        jac = _Jacobians(plan, config, timings)
        atol, rtol = config.tolerances(plan.analytical_dtype)
        if mode == "fast":
            with _timed(timings, "fast"):
                pairs: list = check_fast(plan, config, jac.route, jac.y0, atol, rtol)
            kind = "fast"
        else:
            pairs = _full_pairs(jac, atol, rtol, supplied, output_name)
            kind = "supplied" if supplied is not None else jac.autodiff.mode
        notes = [*plan.notes, f"mode: {mode} ({why})", f"path: {jac.route.path} ({jac.route.reason})", *jac.route.fallbacks]
        for spec in plan.checked:
            chunk = jac.route.chunks.get(spec.position, spec.size)
            if mode == "full" and jac.route.path != "eager" and 0 < chunk < spec.size:
                notes.append(f"{spec.name}: chunked to {chunk} perturbations per call "
                             f"({-(-spec.size // chunk)} calls) {jac.route.chunk_reason}")
        problems = [] if np.all(np.isfinite(jac.y0)) else [describe_nonfinite(plan, jac.y0)]
        return GradientReport(pairs, jac.route.path, kind, time.perf_counter() - start, notes, problems, title, timings)


def _full_pairs(jac: _Jacobians, atol: float, rtol: float, supplied, output_name) -> list[PairReport]:
    """Full Jacobians, compared and cut into one PairReport per (output, input)."""
    plan = jac.plan
    try:
        results = _compute(jac, atol, rtol, supplied)
    except (TypeError, ValueError):
        raise
    except Exception as error:  # f failed inside a batched kernel: say so, keep the cause
        raise ValueError(
            f"f raised {type(error).__name__} while fastcheck evaluated it in a batched tf.function: "
            f"{_first_line(error)}\nf ran eagerly at the inputs; check that it can be traced "
            "(no .numpy() calls or Python side effects on tensors), or pass jit_compile=False."
        ) from error
    pairs = []
    for spec, a, numerical, status, band, one_sided in results:
        for output, a_rows, n_rows, s_rows, b_rows in zip(
            plan.outputs, *(_split_rows(plan, x) for x in (a, numerical, status, band))
        ):
            pair = PairReport(output_name or output.name, spec.name, _output_view_shape(output), _view_shape(spec),
                              n_rows, a_rows, s_rows, b_rows, atol, rtol)
            pair.one_sided = {(r - output.offset, c): v for (r, c), v in one_sided.items()
                              if output.offset <= r < output.offset + output.size}
            pair.hint = _compare.diagnose(a_rows, n_rows, s_rows)
            pairs.append(pair)
    return pairs


def check_gradients(f: Callable, inputs, *, eps=None, atol=None, rtol=None, jit_compile="auto",
                    memory_budget=None, device=None, precision="auto", mode="auto", probes=4, seed=0,
                    order=1, progress=None) -> GradientReport:
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
      mode: "full" (whole Jacobians), "fast" (``probes`` random projections
        u.J.d checked against both a JVP and a VJP, with localisation of a
        defect), or "auto": full when the Jacobian fits ``memory_budget`` and
        inputs have at most 200,000 elements; the report says which ran.
      probes, seed: number of random probe pairs in fast mode, and the seed of
        their private generator (global RNG state is never touched).
      order: 1 checks gradients; 2 checks gradients of gradients (Hessian-vector
        products for scalar f; the gradient of u.f for a fixed seeded u otherwise).
      progress: a progress bar for long sweeps: None shows one on a terminal when
        the sweep will take more than 2 s, True always, False never.

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
    config = CheckConfig(eps, atol, rtol, jit_compile, memory_budget, device, precision, mode, probes, seed, order, progress)
    if order == 2:
        return _run(gradient_function(f, inputs, seed), inputs, config, "second-order check", output_name=None)
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

    def verify_gradients(self, f: Callable, inputs, grads, **overrides) -> GradientReport:
        return verify_gradients(f, inputs, grads, **self._options(overrides))

    def check_model(self, model, loss_fn: Callable, data, *, variables=None, **overrides) -> GradientReport:
        return check_model(model, loss_fn, data, variables=variables, **self._options(overrides))



def gradient_function(f: Callable, inputs, seed: int = 0) -> Callable:
    """``g(*inputs)`` = the gradient of ``u . f(*inputs)`` w.r.t. every floating input.

    ``u`` is 1 for a scalar ``f`` (so the check of ``g`` is a check of the
    Hessian) and a fixed seeded random cotangent otherwise.  Checking ``g``'s
    Jacobian catches a custom gradient whose own gradient is wrong.
    """
    if not callable(f):
        raise TypeError(f"f must be callable (a function, tf.function or Keras layer); got {type(f).__name__}.")
    values = [spec.value for spec in normalize_inputs(inputs)]  # as the check itself will see them
    leaves = [tf.convert_to_tensor(t) for t in tf.nest.flatten(f(*values))]
    rng = np.random.default_rng(seed)
    weights = [None if not t.dtype.is_floating else (tf.ones_like(t) if t.shape.num_elements() == 1
               else tf.constant(rng.standard_normal(t.shape.as_list()), t.dtype)) for t in leaves]

    def gradient(*args):
        args = list(args)
        floating = [i for i, a in enumerate(args) if tf.as_dtype(a.dtype).is_floating]
        with tf.GradientTape() as tape:
            for i in floating:
                tape.watch(args[i])
            outs = [tf.convert_to_tensor(t) for t in tf.nest.flatten(f(*args))]
            total = tf.add_n([tf.reduce_sum(tf.cast(w, o.dtype) * o) for w, o in zip(weights, outs) if w is not None])
        grads = tape.gradient(total, [args[i] for i in floating], unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return tuple(tf.convert_to_tensor(g) for g in grads)

    return gradient


def _supplied_gradients(inputs, grads):
    """Analytical blocks [1, n_k] from the user's gradients, with errors naming the input."""

    def blocks(plan: Plan):
        given = grads(*[s.value for s in plan.inputs]) if callable(grads) else grads
        several = isinstance(inputs, (list, tuple))
        if several:
            if not isinstance(given, (list, tuple)) or len(given) != len(plan.inputs):
                count = len(given) if isinstance(given, (list, tuple)) else "a single value"
                raise ValueError(f"grads must have one entry per input ({len(plan.inputs)}), got {count}.")
            items = list(given)
        else:
            items = [given[0] if isinstance(given, (list, tuple)) and len(given) == 1 else given]
        result = []
        for spec in plan.checked:
            item = items[spec.position]
            if item is None:
                raise ValueError(f"grads for {spec.name} is None: pass the gradient of the summed output with "
                                 f"respect to {spec.name}, shape {tuple(spec.value.shape)}.")
            try:
                value = tf.convert_to_tensor(item)
            except (TypeError, ValueError):
                raise TypeError(f"grads for {spec.name} is a {type(item).__name__}, not a tensor or array.") from None
            if tuple(value.shape) != tuple(spec.value.shape):
                raise ValueError(f"grads for {spec.name} has shape {tuple(value.shape)} but {spec.name} has shape "
                                 f"{tuple(spec.value.shape)}; pass one gradient entry per input element.")
            if spec.is_complex and not value.dtype.is_complex:
                value = tf.complex(tf.cast(value, spec.dtype.real_dtype), tf.zeros_like(tf.cast(value, spec.dtype.real_dtype)))
            real = to_real_view(value) if spec.is_complex else value
            result.append(real.numpy().astype(np.float64).reshape(1, -1))
        return result

    return blocks


def _summed(f: Callable) -> Callable:
    def scalar(*args):
        out = f(*args)
        if out is None:
            return None
        leaves = [tf.convert_to_tensor(t) for t in tf.nest.flatten(out)]
        floating = [t for t in leaves if t.dtype.is_floating]
        if not floating:
            return out
        dtype = min((t.dtype for t in floating), key=lambda d: MACHINE_EPSILON[d])
        return tf.add_n([tf.reduce_sum(tf.cast(t, dtype)) for t in floating])

    return scalar


def verify_gradients(f: Callable, inputs, grads, **options) -> GradientReport:
    """Check gradients computed by hand against batched central differences.

    ``f`` returns a scalar; if it returns a tensor (or a structure of them), the
    sum of all its elements is the scalar. ``grads`` are the gradients of that
    scalar with respect to each input -- tensors/arrays with the inputs'
    structure and shapes -- or a callable taking the inputs and returning them.
    The rule and report are those of ``check_gradients``.

    Raises:
      ValueError / TypeError: when ``grads`` does not match the inputs (a wrong
        shape, a missing entry, a ``None``), naming the input.

    Example:
      >>> import tensorflow as tf, fastcheck
      >>> x = tf.constant([1.0, 2.0], tf.float64)
      >>> fastcheck.verify_gradients(lambda x: tf.reduce_sum(x ** 2), x, 2 * x).ok
      True
    """
    config = CheckConfig(**options)
    return _run(_summed(f), inputs, config, "verify_gradients", supplied=_supplied_gradients(inputs, grads),
                output_name="sum(f)")


def check_model(model, loss_fn: Callable, data, *, variables=None, **options) -> GradientReport:
    """Check the gradient of ``loss_fn(y, model(x, training=False))`` w.r.t. the model's variables.

    One report pair per variable (``model.trainable_variables``, or ``variables``),
    named by the variable's path.  Works for Keras 3 models (via
    ``stateless_call``), tf_keras models and ``tf.Module``s; perturbations of
    variable values are batched and no variable is ever assigned: every value is
    bit-for-bit the same afterwards, even when the check raises.

    Args:
      model: the model or module.
      loss_fn: ``loss_fn(y_true, y_pred)`` returning a scalar (or a tensor, summed).
      data: a pair ``(x, y)``.
      variables: the variables to check (default: all trainable ones).
      **options: as for ``check_gradients``.
    """
    config = CheckConfig(**options)
    f, values, names, every = model_loss_function(model, loss_fn, data, variables)
    return _run(_summed(f), values, config, "check_model", names=names, protect=every, output_name="loss")
