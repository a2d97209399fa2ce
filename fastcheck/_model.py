"""Turn a model and a loss into a pure function of its variables' values.

The numerical side perturbs each variable element in a batch, so the loss must
be a *function* of the variables' values, not of their state:

* Keras 3 models: ``model.stateless_call(trainable_values, non_trainable_values, x)``.
* tf_keras models and ``tf.Module``s: the variable attributes are swapped for
  the given tensors while the loss is computed (bypassing attribute tracking),
  and swapped back at once.  No variable is ever assigned.
"""

from __future__ import annotations

import contextlib

import numpy as np
import tensorflow as tf


def variable_name(variable) -> str:
    path = getattr(variable, "path", None)
    if isinstance(path, str) and path:
        return path
    return getattr(variable, "name", "variable").split(":")[0]


def variable_value(variable) -> tf.Tensor:
    return tf.identity(tf.convert_to_tensor(variable))


def _is_keras3(model) -> bool:
    return hasattr(model, "stateless_call") and hasattr(model, "non_trainable_variables")


def _module_variables(model) -> tuple[list, list]:
    trainable = list(getattr(model, "trainable_variables", []) or [])
    every = list(getattr(model, "variables", []) or [])
    return trainable, every


def _paths_to(module, wanted: set) -> list[tuple[object, object, object, str]]:
    """(owner, key, variable, path) for every place under ``module`` that holds a wanted variable.

    Paths come from ``tf.Module._flatten``; only the last hop is substituted, so a
    path through a property that builds a fresh list substitutes nothing (and is
    caught by the reachability check below).
    """
    found: list[tuple[object, object, object, str]] = []
    flatten = getattr(module, "_flatten", None)
    if flatten is None:
        return found
    for path, variable in flatten(predicate=lambda v: isinstance(v, tf.Variable), with_path=True):
        if id(variable) not in wanted or not path:
            continue
        owner = module
        try:
            for key in path[:-1]:
                owner = getattr(owner, key) if isinstance(key, str) and not isinstance(owner, dict) else owner[key]
        except (AttributeError, KeyError, IndexError, TypeError):
            continue
        found.append((owner, path[-1], variable, "/".join(str(k) for k in path)))
    return found


@contextlib.contextmanager
def _swapped(places, substitutes: dict):
    done = []
    try:
        for owner, key, variable, _ in places:
            if isinstance(owner, tuple):
                continue
            if isinstance(key, str) and not isinstance(owner, (dict, list)) and type(owner).__name__ not in ("ListWrapper", "_DictWrapper"):
                object.__setattr__(owner, key, substitutes[id(variable)])
            else:
                _set_item(owner, key, substitutes[id(variable)])
            done.append((owner, key, variable))
        yield
    finally:
        for owner, key, variable in reversed(done):
            if isinstance(key, str) and not isinstance(owner, (dict, list)) and type(owner).__name__ not in ("ListWrapper", "_DictWrapper"):
                object.__setattr__(owner, key, variable)
            else:
                _set_item(owner, key, variable)


def _set_item(container, key, value):
    storage = getattr(container, "_storage", None)  # tf tracking wrappers keep a plain list/dict
    (storage if storage is not None else container)[key] = value


def model_loss_function(model, loss_fn, data, variables=None):
    """Returns (f, values, names, protected): f(*values) is the loss at those variable values."""
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable as loss_fn(y_true, y_pred); got {type(loss_fn).__name__}.")
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError("data must be a pair (x, y); the loss is loss_fn(y, model(x, training=False)).")
    x, y = data
    if _is_keras3(model):
        trainable = list(model.trainable_variables)
        non_trainable = list(model.non_trainable_variables)
        every = trainable + non_trainable
    else:
        trainable, every = _module_variables(model)
    chosen = list(variables) if variables is not None else trainable
    if not chosen:
        raise ValueError("The model has no trainable variables to check; build it first (call it once on data) "
                         "or pass variables=[...].")
    known = {id(v) for v in every}
    for variable in chosen:
        if id(variable) not in known:
            raise ValueError(f"variables contains {variable_name(variable)!r}, which does not belong to the model.")
    names = [variable_name(v) for v in chosen]
    values = [variable_value(v) for v in chosen]

    if _is_keras3(model):
        slots = {id(v): i for i, v in enumerate(every)}

        def loss(*new_values):
            state = [v.value for v in every]
            for variable, value in zip(chosen, new_values):
                state[slots[id(variable)]] = value
            outputs, _ = model.stateless_call(state[: len(trainable)], state[len(trainable):], x, training=False)
            return loss_fn(y, outputs)

        return loss, values, names, every

    places = _paths_to(model, {id(v) for v in chosen})
    reachable = {id(v) for _, _, v, _ in places}
    generic = [n for n in names if names.count(n) > 1 or n.startswith("Variable")]
    if generic:  # unnamed tf.Variables: name them by where the module keeps them
        where = {}
        for _, _, variable, path in places:
            where.setdefault(id(variable), path)
        names = [where.get(id(v), n) if n in generic else n for v, n in zip(chosen, names)]
    missing = [variable_name(v) for v in chosen if id(v) not in reachable]
    if missing:
        raise ValueError(
            f"Could not find where the model keeps {missing[0]!r} (not an attribute or list item of the model "
            "or its submodules), so it cannot be substituted; pass a Keras 3 model or keep variables as attributes."
        )

    def loss(*new_values):
        substitutes = {id(v): value for v, value in zip(chosen, new_values)}
        with _swapped(places, substitutes):
            return loss_fn(y, model(x, training=False) if _accepts_training(model) else model(x))

    _assert_substitution_reaches_loss(loss, chosen, values, names, model, loss_fn, x, y)
    return loss, values, names, every


def _accepts_training(model) -> bool:
    import inspect

    call = getattr(model, "call", None) or type(model).__call__
    try:
        parameters = inspect.signature(call).parameters
    except (TypeError, ValueError):
        return False
    return "training" in parameters or any(p.kind == p.VAR_KEYWORD for p in parameters.values())


def _assert_substitution_reaches_loss(loss, chosen, values, names, model, loss_fn, x, y):
    """Every variable that the real loss depends on must also reach the substituted loss."""
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(values)
        substituted = loss(*values)
        real = loss_fn(y, model(x, training=False) if _accepts_training(model) else model(x))
    for name, value, variable in zip(names, values, chosen):
        if tape.gradient(real, variable) is not None and tape.gradient(substituted, value) is None:
            raise ValueError(
                f"Variable {name!r} is read in a way fastcheck cannot substitute (e.g. through a closure or a "
                "tuple), so its gradient cannot be checked; keep it as a module attribute."
            )


def training_gradients(model, loss_fn, data, variables, loss, values, names) -> list:
    """``tape.gradient(loss, variables)`` on the real model, as a training step computes it.

    A layer's ``tf.custom_gradient`` that takes the layer's variables
    (``grad(dy, variables=None)``) is called only when the variables themselves
    are on the tape, so the analytical side differentiates the real variables;
    the numerical side evaluates the same loss statelessly, after checking that
    both losses agree at the point.
    """
    x, y = data
    chosen = list(variables) if variables is not None else list(model.trainable_variables)
    with tf.GradientTape() as tape:
        real = loss_fn(y, model(x, training=False) if _accepts_training(model) else model(x))
    gradients = tape.gradient(real, chosen, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    stateless = loss(*values)
    real_value, stateless_value = _total(real), _total(stateless)
    eps = float(np.finfo(np.float32 if real_value.dtype != np.float64 else np.float64).eps)
    if not np.isclose(real_value, stateless_value, rtol=256 * eps, atol=0) and np.isfinite(real_value):
        raise ValueError(
            f"The model's loss is {float(real_value):.9g} when called with its variables but {float(stateless_value):.9g} "
            "when fastcheck substitutes their values, so the numerical side would differentiate another function; "
            "check that the model reads every variable through the model (not a copy) and is deterministic."
        )
    return [tf.convert_to_tensor(g) if g is not None else tf.zeros_like(v) for g, v in zip(gradients, values)]


def _total(loss) -> np.float64:
    leaves = [np.asarray(t, np.float64) for t in tf.nest.flatten(loss)]
    return np.float64(sum(float(np.sum(leaf)) for leaf in leaves))
