"""Turn a model and a loss into a pure function of its variables' values.

The numerical side perturbs each variable element in a batch, so the loss must be a *function* of the variables'
values, not of their state:

* Keras 3 models: ``model.stateless_call(trainable_values, non_trainable_values, x)``, with every non-trainable
  value (batch-norm moving statistics, seed-generator states) held at its value before the check; the updated
  state it returns is discarded.
* tf_keras models and ``tf.Module``s: the variable attributes are swapped for the given tensors while the loss is
  computed (bypassing attribute tracking), and swapped back at once; a variable inside a wrapper (larq's
  ``QuantizedVariable``, a TFP ``TransformedVariable`` such as a GPflow ``Parameter``) is swapped inside it for an
  object that reads as the tensor and has the variable's attributes, so the wrapper's read transform still
  applies (``variables.swapped``).  No variable is ever assigned.
* a zero-argument loss (GPflow's ``model.training_loss``) with no data: the loss itself, with the model's
  variables read as above.

With ``training=True`` randomness is held fixed so that every evaluation, perturbed or not, batched or not, draws
the same dropout mask: Keras 3 seed generators keep their state (a non-trainable value, passed unchanged), and
tf_keras random layers (Dropout, GaussianNoise, ...) draw from a stateless generator with a fixed seed.  The real
call that gives the analytical side runs with the same state and seeds, and every state it updates (moving
statistics, seed states) is restored bit for bit.

Float64 numerics for a float32 model come from its float64 copy (``float64_model``), built from the ``Source``
this module's loss carries.  The analytical side is always the real model's ``tape.gradient``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from fastcheck.engine.plan import first_line
from fastcheck.problem.variables import (
    attribute_paths,
    library_state_restored,
    python_function,
    storage,
    stored_value,
    swapped,
    takes_no_arguments,
)
from fastcheck.report.events import FrozenChecked, ModelCopy, TrainingMode

# Seed of the stateless ops tf_keras random layers without an integer seed draw from (``_stateless_randomness``).
_FIXED_SEED = 1234


def variable_name(variable) -> str:
    path = getattr(variable, "path", None)
    if isinstance(path, str) and path:
        return path
    return getattr(variable, "name", "variable").split(":")[0]


@contextlib.contextmanager
def preserved_variables(variables):
    """Restore every variable to its exact bytes afterwards, whatever happens inside, and every
    library context flag fastcheck knows (``variables.LIBRARY_FLAGS``) to its value."""
    saved = _saved(variables)
    try:
        with library_state_restored():
            yield
    finally:
        _restore(saved)


def _saved(variables) -> list:
    # The storage's bytes: a wrapper's numpy() may read transformed (larq: quantized in its scope).
    held = [storage(v) if isinstance(v, tf.Variable) else v for v in variables]
    return [(v, v.numpy().copy()) for v in dict((id(v), v) for v in held).values()]


def _restore(saved) -> None:
    for variable, value in saved:
        current = variable.numpy()
        if not np.array_equal(current, value, equal_nan=True) or current.tobytes() != value.tobytes():
            variable.assign(value)


@dataclasses.dataclass(frozen=True)
class ModelLoss:
    """A model's loss, as a pure function of the chosen variables' values and as the real model computes it."""

    f: Callable  # f(*values): the loss at those values of the chosen variables; assigns nothing
    values: list  # the chosen variables' values at the point
    names: list  # their names (variable paths)
    chosen: list  # the variables whose gradients are checked
    every: list  # every variable of the model, restored bit for bit after the check
    real: Callable  # real(): the loss of the model called with its own variables, state restored afterwards
    training: bool
    notes: tuple = ()  # events (``fastcheck.report.events``) for the report
    computes_in: tuple | None = None  # (precision, reason): the model computes below its variables' dtype
    native: bool = False  # no float64 evaluation of the loss exists; its note says why
    source: Source | None = None  # what a float64 copy is built from (None: a loss without data has none)


@dataclasses.dataclass(frozen=True)
class Source:
    """What a float64 copy of the model is built from (``float64_model.with_float64_copy``)."""

    model: Any
    keras3: bool
    x: Any
    y: Any
    loss_fn: Any
    sample_weight: Any
    trainable: list
    generators: list


def model_loss_function(model, loss_fn, data, variables=None, *, training: bool = False,
                        sample_weight=None, precision: str = "native") -> ModelLoss:
    """The loss of ``model`` on ``data`` as a pure function of the chosen variables' values, natively, carrying
    what a float64 copy is built from (``float64_model.with_float64_copy``).  With ``data=None`` the loss is
    ``loss_fn()`` (``_loss_without_data``), which no float64 copy can stand in for: it says so when the check's
    ``precision`` is not native (``"float64"`` raises).  Library context flags an attempt leaves switched are
    restored (``library_state_restored``)."""
    with library_state_restored():
        if data is None:
            return _loss_without_data(model, loss_fn, variables, training, sample_weight, precision)
        return _model_loss_function(model, loss_fn, data, variables, training=training, sample_weight=sample_weight)


def _loss_without_data(model, loss_fn, variables, training, sample_weight, precision) -> ModelLoss:
    """``loss_fn()`` (GPflow's ``model.training_loss``, a closure over the data) as a function of the model's
    variables' values: each read where the model keeps it, as ``variables.swapped`` does; a Keras 3 model's through
    ``keras.StatelessScope``.  The analytical side is ``tape.gradient(loss_fn(), variables)``."""
    if isinstance(loss_fn, str) or not callable(loss_fn):
        raise TypeError(f"data is None, so loss_fn must be a callable taking no arguments that returns the loss (e.g. "
                        f"model.training_loss, or model.training_loss_closure(data)); got {loss_fn!r}. To check "
                        "loss_fn(y, model(x)), pass data=(x, y).")
    if not takes_no_arguments(loss_fn):
        raise ValueError("data is None, so fastcheck calls loss_fn() with no arguments, but loss_fn takes arguments "
                         "(y_true, y_pred); pass data=(x, y), or a loss taking no arguments (e.g. model.training_loss).")
    if training is not False or sample_weight is not None:
        what = "training=True" if training is not False else "sample_weight"
        raise ValueError(f"{what} is for loss_fn(y, model(x, training=...)), but data is None and loss_fn takes no "
                         f"arguments, so fastcheck cannot pass it on; omit {what} (build it into loss_fn).")
    keras3 = _is_keras3(model)
    if keras3:
        trainable, every = list(model.trainable_variables), list(model.variables)
    else:
        trainable, every = _module_variables(model)
    chosen, names, values = _chosen(variables, trainable, every)
    own = python_function(loss_fn)  # a tf.function's graph would read the variables it captured
    if keras3:
        import keras

        def f(*new_values):
            with keras.StatelessScope(state_mapping=list(zip(chosen, new_values))):
                return own()
    else:
        places = _places(model, chosen)
        names = _module_names(model, chosen, names)

        def f(*new_values):
            with swapped(places, {id(v): value for v, value in zip(chosen, new_values)}):
                return own()

    with preserved_variables(every):
        try:
            loss_fn()
        except Exception as error:
            if _raised_by_fastcheck(error):
                raise
            raise ValueError(f"loss_fn() raised {type(error).__name__}: {first_line(error)}.") from error
    _assert_substitution_reaches_loss(f, loss_fn, chosen, values, names, every, keras3=keras3)
    notes = _frozen_note(names, chosen)
    if precision != "native" and any(v.dtype.is_floating and v.dtype != tf.float64 for v in values):
        why = ("loss_fn takes no arguments, so fastcheck cannot give it float64 data (a float64 copy needs "
               "data=(x, y))")
        if precision == "float64":
            raise ValueError(f"precision='float64' was requested, but {why}; pass precision='native' or 'auto'.")
        notes += (ModelCopy(False, why),)
    return ModelLoss(f, values, names, chosen, every, loss_fn, False, notes)


def _chosen(variables, trainable, every) -> tuple[list, list, list]:
    """The variables to check (``variables``, or every trainable one; each must be the model's), their names and
    values."""
    chosen = list(variables) if variables is not None else trainable
    if not chosen:
        if every:
            raise ValueError(f"The model has no trainable variables to check: all {len(every)} of its variables are "
                             "frozen (trainable=False); set trainable=True on the layers to check, or pass "
                             "variables=[...].")
        raise ValueError("The model has no trainable variables to check; build it first (call it once on data) "
                         "or pass variables=[...].")
    known = {id(v) for v in every}
    for variable in chosen:
        if id(variable) not in known:
            raise ValueError(f"variables contains {variable_name(variable)!r}, which does not belong to the model.")
    return chosen, [variable_name(v) for v in chosen], [stored_value(v) for v in chosen]


def _frozen_note(names, chosen) -> tuple:
    frozen = [name for name, v in zip(names, chosen) if not getattr(v, "trainable", True)]
    return (FrozenChecked(tuple(frozen)),) if frozen else ()


def _model_loss_function(model, loss_fn, data, variables, training: bool, sample_weight) -> ModelLoss:
    if takes_no_arguments(loss_fn) and not isinstance(loss_fn, str):
        raise ValueError("loss_fn takes no arguments (it computes the loss by itself, as model.training_loss does), "
                         "so data is unused; omit data: check_model(model, loss_fn).")
    if not callable(model):
        raise TypeError(f"model ({type(model).__name__}) is not callable, so fastcheck cannot compute "
                        "loss_fn(y, model(x)); pass a loss taking no arguments and omit data, e.g. "
                        "check_model(model, model.training_loss).")
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError(f"data must be a pair (x, y); the loss is loss_fn(y, model(x, training={training})).")
    if not isinstance(training, bool):
        raise TypeError(f"training must be True or False; got {training!r}.")
    x, y = data
    keras3 = _is_keras3(model)
    if keras3:
        trainable = list(model.trainable_variables)
        every = trainable + list(model.non_trainable_variables)
    else:
        trainable, every = _module_variables(model)
    if not keras3 and training and not _accepts_training(model):
        raise ValueError(f"training=True, but {type(model).__name__}'s call takes no `training` argument, so the "
                         "model has no training mode to check; call check_model without training=True.")
    compute = loss_of_outputs(loss_fn, y, sample_weight, model)
    chosen, names, values = _chosen(variables, trainable, every)
    checkable = {id(v) for v in [*chosen, *trainable]}
    # What a training-mode call updates (moving statistics, seed states): held at these values.
    state_before = _saved([v for v in every if id(v) not in checkable]) if training else []
    generators = _tf_keras_random_generators(model)

    def real():
        """The loss of the model called with its own variables, as a training step computes it."""
        _restore(state_before)  # the same seed states (so the same masks) as the stateless loss
        try:
            with _stateless_randomness(generators):
                return compute(_call(model, x, training))
        finally:
            _restore(state_before)

    _assert_loss_runs(model, x, y, compute, every, training)
    if keras3:
        f = _keras3_loss(model, x, compute, every, trainable, chosen, training)
    else:
        f, names = _swapped_loss(model, x, compute, chosen, names, generators, training)
    _assert_substitution_reaches_loss(f, real, chosen, values, names, every, keras3=keras3)
    notes = _frozen_note(names, chosen)
    if training:
        with preserved_variables(every):  # a tf_keras model updates its moving statistics in training mode
            unchanged = _same_loss(f(*values), _inference_loss(model, x, compute, every, trainable, chosen))
        notes += (TrainingMode(not unchanged),)
    return ModelLoss(f, values, names, chosen, every, real, training, notes,
                     source=Source(model, keras3, x, y, loss_fn, sample_weight, trainable, generators))


def _assert_loss_runs(model, x, y, compute, every, training: bool) -> None:
    """The model on x and the loss on its outputs, once, state restored: a failure of either says
    which (and the shapes involved), not a TensorFlow traceback from inside the check."""
    with preserved_variables(every):
        try:
            outputs = _call(model, x, training)
        except Exception as error:
            if _raised_by_fastcheck(error):
                raise
            raise ValueError(f"model(x, training={training}) raised {type(error).__name__}: {first_line(error)}; "
                             f"check x (shape(s) {_shapes(x)}) against the model's inputs.") from error
        try:
            compute(outputs)
        except Exception as error:
            if _raised_by_fastcheck(error):
                raise
            raise ValueError(f"loss_fn(y, model(x, training={training})) raised {type(error).__name__}: "
                             f"{first_line(error)}; the model's output shape(s) {_shapes(outputs)}, y's {_shapes(y)}: "
                             "check that y matches the outputs and loss_fn takes (y_true, y_pred).") from error


def _shapes(value) -> str:
    shapes = [tuple(np.shape(leaf)) for leaf in tf.nest.flatten(value)]
    return str(shapes[0]) if len(shapes) == 1 else ", ".join(map(str, shapes))


def _raised_by_fastcheck(error: BaseException) -> bool:
    """The error came from fastcheck's own argument checks (its innermost frame is fastcheck's)."""
    frame, last = error.__traceback__, None
    while frame is not None:
        last, frame = frame, frame.tb_next
    return last is not None and "fastcheck" in last.tb_frame.f_code.co_filename.replace("\\", "/").split("/")[-2:-1]


def _is_keras3(model) -> bool:
    return hasattr(model, "stateless_call") and hasattr(model, "non_trainable_variables")


def _module_variables(model) -> tuple[list, list]:
    return list(getattr(model, "trainable_variables", []) or []), list(getattr(model, "variables", []) or [])


def _call(model, x, training: bool):
    return model(x, training=training) if _accepts_training(model) else model(x)


def _keras3_loss(model, x, compute, every, trainable, chosen, training, runner=None, dtype=None):
    """The loss at given values of ``chosen``; ``runner`` (a copy of ``model`` whose variables
    correspond one to one) computes it instead, with every fixed floating value cast to ``dtype``."""
    slots = {id(v): i for i, v in enumerate(every)}
    # Fixed values, not the variables: a seed state read at each call would move with the real call's updates.
    fixed = [stored_value(v) for v in every]
    if dtype is not None:
        fixed = [tf.cast(value, dtype) if value.dtype.is_floating else value for value in fixed]
    count = len(trainable)
    runner = model if runner is None else runner
    # stateless_call runs ``call`` itself, which may take no ``training`` argument.
    mode = {"training": training} if _accepts_training(runner) else {}

    def loss(*new_values):
        state = list(fixed)
        for variable, value in zip(chosen, new_values):
            state[slots[id(variable)]] = value
        outputs, _ = runner.stateless_call(state[:count], state[count:], x, **mode)
        return compute(outputs)

    return loss


def _swapped_loss(model, x, compute, chosen, names, generators, training) -> tuple[Callable, list]:
    """The loss with each chosen variable read as the given value where the model keeps it (``variables.swapped``)."""
    places = _places(model, chosen)

    def loss(*new_values):
        substitutes = {id(v): value for v, value in zip(chosen, new_values)}
        with swapped(places, substitutes), _stateless_randomness(generators):
            return compute(_call(model, x, training))

    return loss, _module_names(model, chosen, names)


def _places(model, chosen) -> list:
    """Where the model keeps each chosen variable (``_paths_to``): every one must be somewhere."""
    places = _paths_to(model, {id(v) for v in chosen})
    reachable = {id(v) for _, _, v, _ in places}
    missing = [variable_name(v) for v in chosen if id(v) not in reachable]
    if missing:
        raise ValueError(
            f"Could not find where the model keeps {missing[0]!r} (not an attribute or list item of the model "
            "or its submodules), so it cannot be substituted; pass a Keras 3 model or keep variables as attributes."
        )
    return places


def _module_names(model, chosen, names) -> list:
    """A ``tf.Module``'s variables named by where it keeps them (``likelihood.variance``, ``layers[0].kernel``);
    a tf_keras model's by their own names, unnamed ones (``Variable``, repeated names) by their path."""
    if not _is_keras_layer(model):
        paths = attribute_paths(model, chosen)
        return [paths.get(id(v), n) for v, n in zip(chosen, names)]
    generic = [n for n in names if names.count(n) > 1 or n.startswith("Variable")]
    if not generic:
        return names
    where: dict = {}
    for _, _, variable, path in _paths_to(model, {id(v) for v in chosen}):
        where.setdefault(id(variable), path)
    return [where.get(id(v), n) if n in generic else n for v, n in zip(chosen, names)]


def _is_keras_layer(model) -> bool:
    """A Keras (3 or tf_keras) layer or model, the user's subclasses included."""
    return any(klass.__module__.startswith(("keras.", "tf_keras.")) for klass in type(model).__mro__)


def _inference_loss(model, x, compute, every, trainable, chosen):
    """The training=False loss at the point, to tell whether training=True changes anything."""
    if _is_keras3(model):
        return _keras3_loss(model, x, compute, every, trainable, chosen, False)(*[stored_value(v) for v in chosen])
    with preserved_variables(every):
        return compute(_call(model, x, False))


def _is_functional(model) -> bool:
    """A functional (graph of layers) Keras model, Keras 3 or tf_keras."""
    return bool(getattr(model, "_is_graph_network", False)) or type(model).__name__ == "Functional" or any(
        klass.__name__ == "Functional" for klass in type(model).__mro__[:2])


def _same_loss(a, b) -> bool:
    first, second = _total(a), _total(b)
    return bool(first == second or (np.isnan(first) and np.isnan(second)))


def _tf_keras_random_generators(model) -> list:
    """The random generators of tf_keras layers (Dropout, GaussianNoise, ...) in the model."""
    modules = [model, *getattr(model, "submodules", ())] if isinstance(model, tf.Module) else [model]
    found, seen = [], set()
    for module in modules:
        generator = vars(module).get("_random_generator") if hasattr(module, "__dict__") else None
        if generator is not None and hasattr(generator, "_rng_type") and id(generator) not in seen:
            seen.add(id(generator))
            found.append(generator)
    return found


@contextlib.contextmanager
def _stateless_randomness(generators):
    """tf_keras random layers draw from stateless ops with a fixed seed while inside: their default draws are
    stateful (a fresh mask at every call, or a ``tf.random.Generator`` whose state advances); a stateless op with a
    fixed seed draws one mask at every evaluation, in eager, ``tf.function`` and ``vectorized_map`` alike."""
    saved = [(g, g._rng_type, g._seed, g._built) for g in generators]
    try:
        for index, generator in enumerate(generators):
            seed = generator._seed if isinstance(generator._seed, int) else _FIXED_SEED + index
            generator._rng_type, generator._seed, generator._built = "stateless", seed, True
        yield
    finally:
        for generator, rng_type, seed, built in saved:
            generator._rng_type, generator._seed, generator._built = rng_type, seed, built


def _paths_to(module, wanted: set) -> list[tuple[object, object, object, str]]:
    """(owner, key, variable, path) for every place under ``module`` that holds a wanted variable.

    Paths come from ``tf.Module._flatten``; only the last hop is substituted, so a path through a property that
    builds a fresh list substitutes nothing (caught by ``_assert_substitution_reaches_loss``)."""
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


def _accepts(fn, argument: str) -> bool:
    """Whether ``fn`` takes ``argument`` (by name or through ``**kwargs``); False where it has no signature."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return argument in parameters or any(p.kind == p.VAR_KEYWORD for p in parameters.values())


def _accepts_training(model) -> bool:
    return _accepts(getattr(model, "call", None) or type(model).__call__, "training")


def _assert_substitution_reaches_loss(loss, real, chosen, values, names, every, keras3: bool = False):
    """Every variable that the real loss depends on must also reach the substituted loss: read off reverse mode
    where it can (the substituted gradient is not None); a variable whose substituted gradient is None -- or every
    one, where that gradient cannot run (a layer's ``tf.custom_gradient`` taking ``variables=`` gets none in a
    stateless call) -- is moved by 1% instead, and must move the substituted loss."""
    with preserved_variables(every), tf.GradientTape(persistent=True) as tape:
        tape.watch(values)
        substituted = loss(*values)
        real_loss = real()
    try:
        reached = [gradient is not None for gradient in tape.gradient(substituted, list(values))]  # one pass
    except Exception:  # reverse mode of the stateless loss cannot run here: perturb instead
        reached = [False] * len(values)
    for k, (name, value, variable) in enumerate(zip(names, values, chosen)):
        if reached[k]:
            continue
        try:
            gradient = tape.gradient(real_loss, _tf_variable(variable))
        except Exception:  # the real gradient's own error belongs to the check, not to this guard
            continue
        if gradient is None or not np.any(np.asarray(tf.convert_to_tensor(gradient))):
            continue
        moved = list(values)
        moved[k] = value * tf.constant(1.01, value.dtype) + tf.constant(0.01, value.dtype)
        with preserved_variables(every):
            unmoved = _total(loss(*moved)) == _total(substituted)
        if unmoved:
            how = ("Keras evaluates the model statelessly through its weights: read the weight as the layer's "
                   "attribute in call() (self.kernel), not a tensor or tf.Variable kept from build() "
                   "(self.kernel.value)" if keras3 else
                   "keep it as a module attribute (not in a closure or a tuple), and read it in Python, not inside "
                   "a tf.function of the model traced before the check (its graph reads the variable it captured)")
            raise ValueError(
                f"Variable {name!r} is read in a way fastcheck cannot substitute, so the numerical side would "
                f"not move it and its gradient cannot be checked; {how}."
            )


def _tf_variable(variable):
    """A Keras 3 variable's tf.Variable (the variable itself otherwise): what a tape differentiates;
    tape.gradient's zeros for a variable the loss does not use fail on the Keras wrapper itself."""
    return variable if isinstance(variable, tf.Variable) else getattr(variable, "value", variable)


def training_gradients(model_loss: ModelLoss) -> list:
    """``tape.gradient(loss, variables)`` on the real model, as a training step computes it.

    A layer's ``tf.custom_gradient`` that takes the layer's variables (``grad(dy, variables=None)``) is called only
    when the variables themselves are on the tape, so the analytical side differentiates the real variables; the
    numerical side evaluates the same loss statelessly, after checking that both losses agree at the point.  With
    ``training=True`` the real call starts from the same seed states (so the same dropout mask), and the state it
    updates is restored at once."""
    sources = [_tf_variable(v) for v in model_loss.chosen]
    with tf.GradientTape() as tape:
        # A tape watches trainable variables by itself; a non-trainable one named in variables= is watched
        # here (a training step would leave its gradient None: noted by model_loss_function).
        tape.watch([s for s, v in zip(sources, model_loss.chosen) if not getattr(v, "trainable", True)])
        real = model_loss.real()
    gradients = tape.gradient(real, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    stateless = model_loss.f(*model_loss.values)
    real_value, stateless_value = _total(real), _total(stateless)
    eps = float(np.finfo(np.float32 if real_value.dtype != np.float64 else np.float64).eps)
    if not np.isclose(real_value, stateless_value, rtol=256 * eps, atol=0) and np.isfinite(real_value):
        cause = ("check that the model reads every variable through the model (not a copy) and is deterministic"
                 if not model_loss.training else
                 "with training=True, a layer probably draws random numbers outside the model's seed generators "
                 "(e.g. keras.random.* with seed=None or a tf.random op in a custom layer): draw them from a "
                 "keras.random.SeedGenerator the layer holds, or check with training=False")
        raise ValueError(
            f"The model's loss is {float(real_value):.9g} when called with its variables but {float(stateless_value):.9g} "
            f"when fastcheck substitutes their values, so the numerical side would differentiate another function; "
            f"{cause}."
        )
    return [tf.convert_to_tensor(g) if g is not None else tf.zeros_like(v) for g, v in zip(gradients, model_loss.values)]


# Added to a "not deterministic" verdict of a training-mode check.
RANDOM_IN_TRAINING = ("check_model(training=True) is the likely cause: fastcheck holds dropout masks fixed (Keras 3 "
                      "seed generators, tf_keras random layers), so some layer draws random numbers in training mode "
                      "that the check cannot hold fixed, e.g. tf.random.uniform without a seed or keras.random.* with "
                      "seed=None in a custom layer. Draw them from a keras.random.SeedGenerator the layer holds "
                      "(Keras 3) or with a stateless tf.random op and a fixed seed, or check with training=False.")


def loss_of_outputs(loss_fn, y, sample_weight, model, dtype=None) -> Callable:
    """``compute(y_pred)``: the loss of the model's outputs, per output and summed for several outputs.

    ``loss_fn`` is a callable ``loss_fn(y_true, y_pred)`` (a function or a Keras loss object), a Keras loss name
    (``"mse"``, ``"categorical_crossentropy"``), or for a model with several outputs a list or dict of those (one
    per output; a single loss applies to every output).  Names resolve with ``keras.losses.get``
    (``tf_keras.losses.get`` for tf_keras models) into loss objects that reduce as ``model.compile`` does;
    ``sample_weight`` goes to each loss as Keras passes it."""
    names = _output_names(model)

    def compute(outputs):
        if not isinstance(outputs, (list, tuple, dict)):
            return _apply(_only(loss_fn), y, outputs, sample_weight, model, None, dtype)
        keys = list(outputs) if isinstance(outputs, dict) else list(range(len(outputs)))
        labels = [str(k) if isinstance(outputs, dict) else (names[k] if k < len(names) else f"output_{k}")
                  for k in keys]
        losses = _per_output("loss_fn", loss_fn, keys, labels, single_ok=True)
        targets = _per_output("y", y, keys, labels, single_ok=False)
        weights = _per_output("sample_weight", sample_weight, keys, labels, single_ok=True)
        return [_apply(loss, target, outputs[key], weight, model, label, dtype)
                for key, label, loss, target, weight in zip(keys, labels, losses, targets, weights)]

    # Misuse is an error here, before the check, not in its middle.
    if isinstance(loss_fn, (list, tuple, dict)):
        for key, item in (loss_fn.items() if isinstance(loss_fn, dict) else enumerate(loss_fn)):
            _resolve(item, model, sample_weight is not None, key)
    else:
        _resolve(loss_fn, model, sample_weight is not None, None)
    return compute


def _only(loss_fn):
    """The loss of a model with one output: a list or dict of losses must then have one entry."""
    if not isinstance(loss_fn, (list, tuple, dict)):
        return loss_fn
    items = list(loss_fn.values()) if isinstance(loss_fn, dict) else list(loss_fn)
    if len(items) != 1:
        raise ValueError(f"loss_fn has {len(items)} entries but the model has one output; pass one loss.")
    return items[0]


def _output_names(model) -> list:
    names = getattr(model, "output_names", None)
    try:
        return [str(n) for n in names] if names else []
    except TypeError:
        return []


def _per_output(what: str, value, keys: list, labels: list, single_ok: bool) -> list:
    """``value`` aligned with the outputs: a dict by output name or key, a list by position, or one for all."""
    if isinstance(value, dict):
        missing = [label for key, label in zip(keys, labels) if key not in value and label not in value]
        if missing:
            raise ValueError(f"{what} is a dict without an entry for the model's output {missing[0]!r} (its keys: "
                             f"{', '.join(map(repr, value))}); give one entry per output: {', '.join(map(repr, labels))}.")
        return [value[key] if key in value else value[label] for key, label in zip(keys, labels)]
    if isinstance(value, (list, tuple)) and not (what == "sample_weight" and _is_array_like(value)):
        if len(value) != len(keys):
            raise ValueError(f"{what} has {len(value)} entries but the model has {len(keys)} outputs "
                             f"({', '.join(map(repr, labels))}); give one entry per output, in order.")
        return list(value)
    if not single_ok:
        raise ValueError(f"The model has {len(keys)} outputs ({', '.join(map(repr, labels))}) but {what} is a single "
                         f"value; pass a list (in output order) or a dict keyed by output name.")
    return [value] * len(keys)


def _is_array_like(value) -> bool:
    return bool(value) and all(isinstance(v, (int, float, np.number)) for v in value)


def _apply(loss_fn, y_true, y_pred, sample_weight, model, label, dtype=None):
    loss = _resolve(loss_fn, model, sample_weight is not None, label)
    if dtype is None and loss is not loss_fn:
        # A loss object fastcheck made (from a name or a function) computes as model.compile's does, in Keras's
        # floatx (float32; for a mixed-precision model's float16 outputs too: a float16 loss would swamp the check
        # in noise), but in the outputs' dtype where that is wider (floatx would round a float64 loss to float32).
        out = next((t.dtype for t in tf.nest.flatten(y_pred) if getattr(t, "dtype", None) is not None
                    and tf.as_dtype(t.dtype).is_floating), None)
        if out is not None and tf.as_dtype(out).size > tf.as_dtype(_keras_of(model).backend.floatx()).size:
            dtype = out
    if dtype is not None:
        loss = _in_dtype(loss, dtype)
    if sample_weight is None:
        return loss(y_true, y_pred)
    return loss(y_true, y_pred, sample_weight=sample_weight)


def _resolve(loss_fn, model, weighted: bool, label) -> Callable:
    """A callable loss: names through the Keras of the model, functions wrapped when a sample weight needs it."""
    where = "loss_fn" if label is None else f"loss_fn for output {label!r}"
    keras = _keras_of(model)
    if isinstance(loss_fn, str):
        try:
            resolved = keras.losses.get(loss_fn)
        except (ValueError, TypeError) as error:
            raise ValueError(f"{where}={loss_fn!r} is not a loss {keras.__name__}.losses.get knows ({error}); pass a "
                             "Keras loss name such as 'mse', 'mean_absolute_error' or 'categorical_crossentropy', a "
                             f"{keras.__name__}.losses.Loss object, or a function loss_fn(y_true, y_pred).") from None
        # As model.compile does: a named function reduces to the mean over the batch and takes sample weights.
        return resolved if isinstance(resolved, keras.losses.Loss) else _as_loss_object(keras, resolved)
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable as loss_fn(y_true, y_pred), a Keras loss name (e.g. 'mse'), or for "
                        f"several outputs a list or dict of those; got {type(loss_fn).__name__}"
                        f"{'' if label is None else f' for output {label!r}'}.")
    if weighted and not isinstance(loss_fn, keras.losses.Loss) and not _accepts(loss_fn, "sample_weight"):
        return _as_loss_object(keras, loss_fn)
    return loss_fn


def _in_dtype(loss, dtype):
    """A Keras 3 loss object computing in ``dtype`` (a copy: the user's object is left as it is); other losses as given."""
    if getattr(loss, "_dtype_policy", None) is None or not hasattr(loss, "_dtype"):
        return loss
    import keras

    # Not copy.copy: Keras objects copy through their config, which a loss defined in a function has not.
    changed = object.__new__(type(loss))
    changed.__dict__.update(vars(loss))
    changed._dtype_policy = keras.dtype_policies.get(tf.as_dtype(dtype).name)
    changed._dtype = changed._dtype_policy.compute_dtype
    return changed


def _keras_of(model):
    if type(model).__module__.startswith("tf_keras"):
        import tf_keras

        return tf_keras
    import keras

    return keras


def _as_loss_object(keras, fn):
    """``fn(y_true, y_pred)`` as a Keras loss object: weighted and reduced as ``model.compile`` does."""

    class FunctionLoss(keras.losses.Loss):
        def call(self, y_true, y_pred):
            return fn(y_true, y_pred)

    return FunctionLoss(name=getattr(fn, "__name__", "loss"))


def _total(loss) -> np.float64:
    leaves = [np.asarray(t, np.float64) for t in tf.nest.flatten(loss)]
    return np.float64(sum(float(np.sum(leaf)) for leaf in leaves))
