"""Problem adapters: every entry point turns its arguments into one ``Problem``.

A problem is a function of some inputs whose Jacobian is checked, and where the analytical side comes from: reverse
mode of f itself (``check_gradients``), the user's gradients of the summed f (``verify_gradients``), the real
model's ``tape.gradient`` (``check_model``).  ``order=2`` turns f into its gradient function.  ``_check.run_check``
runs any of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from fastcheck.engine.config import MACHINE_EPSILON, CheckConfig
from fastcheck.engine.plan import Plan, normalize_inputs, to_real_view
from fastcheck.engine.tables import UPCAST_MAX_ELEMENTS
from fastcheck.problem.float64_model import with_float64_copy
from fastcheck.problem.model import RANDOM_IN_TRAINING, model_loss_function, training_gradients
from fastcheck.problem.model import preserved_variables as preserved_variables  # run_check restores through it
from fastcheck.problem.structure import flatten, needs_flattening
from fastcheck.report.events import SecondOrder, TapeGradient


@dataclasses.dataclass(frozen=True)
class Problem:
    """What to check, ready for ``run_check``."""

    f: Callable
    inputs: Any
    title: str = "gradient check"
    supplied: Callable | None = None  # plan -> analytical blocks [1, n_k]; None: reverse mode of f
    names: list | None = None  # input names (a model's variable paths)
    protect: tuple = ()  # variables restored bit for bit afterwards, besides those among the inputs
    output_name: str | None = None
    kind: str | None = None  # what the report calls the analytical side, when not the strategy's own
    notes: tuple = ()  # events (``fastcheck.report.events``) the problem knows before the check
    if_random: str | None = None  # what to add when f turns out not to be deterministic
    computes_in: tuple | None = None  # (precision, reason): the analytical side computes below its dtypes
    # Whether f's reverse mode at the float64 point is the analytical side's code run in float64 (``block.twinned``):
    # f's own gradient, a model's loss on its float64 copy; not a user's supplied gradients.
    twin: bool = True
    # f has no float64 evaluation (a model whose float64 copy failed; the problem's note says why): the plan does not
    # try one (calling the float32 model with float64 values fails again, with a second note).
    native: bool = False

    @property
    def variables(self) -> list:
        items = self.inputs if isinstance(self.inputs, (list, tuple)) else [self.inputs]
        return [*[item for item in items if isinstance(item, tf.Variable)], *self.protect]


def function_problem(f: Callable, inputs, config: CheckConfig, wrt=None) -> Problem:
    """``check_gradients``, ``numerical_jacobian``, ``autodiff_jacobian``: f's own Jacobian (or its gradient's).
    Structured inputs (and ``wrt``) become a function of the checked leaves (``structure``)."""
    if not callable(f):
        raise TypeError(f"f must be callable (a function, tf.function or Keras layer); got {type(f).__name__}.")
    names = None
    if needs_flattening(inputs, wrt):
        f, inputs, names = flatten(f, inputs, wrt)
    if config.order == 2:
        return Problem(gradient_function(f, inputs, config.seed), inputs, "second-order check", names=names)
    return Problem(f, inputs, names=names)


def supplied_problem(f: Callable, inputs, grads, config: CheckConfig) -> Problem:
    """``verify_gradients``: the user's gradients of the summed f (order 2: the Jacobian of ``grads``)."""
    if config.order == 2:
        # Gradients of the supplied gradients: the Jacobian of the user's gradient function (its autodiff, e.g. a
        # custom gradient's own gradient) against central differences of it.
        if not callable(grads):
            raise TypeError("verify_gradients(order=2) checks the derivatives of your gradient function: pass grads "
                            "as a callable taking the inputs, not as arrays.")
        return Problem(grads, inputs, "verify_gradients (order=2: Jacobian of grads)", notes=(SecondOrder(),))
    return Problem(_summed(f), inputs, "verify_gradients", supplied=_supplied_gradients(inputs, grads),
                   output_name="sum(f)", twin=False)


def model_problem(model, loss_fn, data, variables, config: CheckConfig, *, training: bool = False,
                  sample_weight=None) -> Problem:
    """``check_model``: the loss as a pure function of the variables' values, against the real tape gradient.

    A training-mode loss draws its dropout masks from stateless ops with fixed seeds; routing keeps such an f off
    XLA (which draws other numbers from the same seed).
    """
    loss = with_float64_copy(model_loss_function(model, loss_fn, data, variables, training=training,
                                                 sample_weight=sample_weight, precision=config.precision),
                             config.precision, UPCAST_MAX_ELEMENTS)
    title = "check_model (training=True)" if training else "check_model"
    if_random = RANDOM_IN_TRAINING if training else None
    if config.order == 2:
        with preserved_variables(loss.every):  # gradient_function calls the loss once
            gradient = gradient_function(_summed(loss.f), loss.values, config.seed)
            _assert_stateless_gradient(gradient, loss)
        return Problem(gradient, loss.values,
                       f"{title} (order=2: Hessian of the loss)", names=loss.names, protect=tuple(loss.every),
                       notes=loss.notes, if_random=if_random, computes_in=loss.computes_in, native=loss.native)
    # Called inside the check, after the determinism test, with every variable restored afterwards.
    supplied = _supplied_gradients(loss.values, lambda *_: training_gradients(loss))
    return Problem(_summed(loss.f), loss.values, title, supplied=supplied, names=loss.names,
                   protect=tuple(loss.every), output_name="loss", kind="reverse",
                   notes=(TapeGradient(), *loss.notes), if_random=if_random,
                   computes_in=loss.computes_in, native=loss.native)


def gradient_function(f: Callable, inputs, seed: int = 0) -> Callable:
    """``g(*inputs)`` = the gradient of ``u . f(*inputs)`` w.r.t. every floating input.

    ``u`` is 1 for a scalar ``f`` (so the check of ``g`` is a check of the Hessian) and a fixed seeded random
    cotangent otherwise.  Checking ``g``'s Jacobian catches a custom gradient whose own gradient is wrong.
    """
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


def _assert_stateless_gradient(gradient: Callable, loss) -> None:
    """order=2 checks the Jacobian of the loss's gradient as a function of the variables' values (the stateless
    loss): that gradient must be the training one at the point, or the Hessian checked is not the one training's
    gradient has.  A layer's ``tf.custom_gradient`` taking ``variables=`` sees no variables in a stateless call (its
    grad_fn gets ``variables=None``)."""
    why = ("check_model(order=2) differentiates the loss as a function of the variables' values, where a layer's "
           "tf.custom_gradient taking variables= gets variables=None")
    try:
        stateless = [np.asarray(g, np.float64).reshape(-1) for g in gradient(*loss.values)]
    except Exception as error:
        raise ValueError(f"{why}, and the gradient raised {type(error).__name__}: {str(error).splitlines()[0][:200]}. "
                         "Check such a layer with order=1, or give its grad_fn the variables' gradients through "
                         "inputs.") from error
    real = [np.asarray(g, np.float64).reshape(-1) for g in training_gradients(loss)]
    for name, value, a, b in zip(loss.names, loss.values, stateless, real):
        eps = float(MACHINE_EPSILON[tf.as_dtype(value.dtype)])
        scale = float(np.max(np.abs(b), initial=0.0))
        if a.shape != b.shape or not np.allclose(a, b, rtol=256 * eps, atol=256 * eps * scale):
            k = int(np.argmax(np.abs(a - b))) if a.shape == b.shape else 0
            raise ValueError(f"{why}: its gradient there differs from the training gradient (variable {name!r}, "
                             f"element {k}: {a[k] if a.size else float('nan'):.6g} against {b[k] if b.size else float('nan'):.6g}), "
                             "so its Hessian is not training's. Check such a layer with order=1.")


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
