"""A float32 model's float64 copy: the numerical side's model, where it computes what the model computes.

Given float64 values, the loss evaluates a float64 *copy* of the model: a Keras 3 model of any kind is rebuilt from
its config with every dtype in it float64, nested configs too (``_rebuilt``); a tf_keras Sequential or functional
model is cloned layer by layer under a float64 dtype policy (``_cloned``); a plain ``tf.Module`` is called with
float64 values and data.  The copy's variables are paired with the model's by order, shape and name
(``_counterparts``), and the copy stands in only when its loss at the point equals the model's own within
``FLOAT64_COPY_ROUNDINGS`` roundings; otherwise the loss stays native and a note says why.  The analytical side is
always the real model's own ``tape.gradient``.
"""


from __future__ import annotations

import dataclasses
import inspect
import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from fastcheck.engine.config import PRECISION_EPSILON
from fastcheck.engine.tables import FLOAT64_COPY_ROUNDINGS
from fastcheck.problem.model import (
    ModelLoss,
    Source,
    _call,
    _is_functional,
    _keras3_loss,
    _keras_of,
    _paths_to,
    _stateless_randomness,
    _tf_keras_random_generators,
    _total,
    loss_of_outputs,
    preserved_variables,
    variable_name,
)
from fastcheck.problem.variables import library_state_restored, stored_value, swapped
from fastcheck.report.events import ModelCopy


def with_float64_copy(loss: ModelLoss, precision: str, upcast_limit: int | None) -> ModelLoss:
    """``loss`` evaluating a float64 copy of its model when given float64 values (``_Float64Copy``), where
    ``precision`` asks for one (not ``"native"``; ``"auto"`` up to ``upcast_limit`` checked elements) and the
    model has float32 (or lower) variables.  ``"float64"`` insists: a model that cannot be copied is a ValueError;
    otherwise the loss stays native, with a note saying why."""
    source, values = loss.source, loss.values
    low = [v.dtype for v in values if v.dtype.is_floating and v.dtype != tf.float64]
    size = sum(int(np.prod(v.shape, dtype=np.int64)) for v in values)
    if (source is None or precision == "native" or not low
            or (precision == "auto" and upcast_limit is not None and size > upcast_limit)):
        return loss
    with library_state_restored():
        float64_copy = _Float64Copy(source, loss)
        twin, note = float64_copy.loss(loss.f, values)
    if twin is None and precision == "float64":
        raise ValueError(f"precision='float64' was requested, but {note}; pass precision='native' or 'auto'.")
    return dataclasses.replace(loss, f=loss.f if twin is None else _by_dtype(loss.f, twin),
                               notes=(*loss.notes, ModelCopy(twin is not None, note)),
                               computes_in=float64_copy.computes_in if twin is not None else None, native=twin is None)


def _by_dtype(native: Callable, twin: Callable) -> Callable:
    """The loss that evaluates ``twin`` (the float64 copy) for float64 values and the model itself otherwise."""

    def loss(*new_values):
        if new_values and all(tf.as_dtype(value.dtype) == tf.float64 for value in new_values):
            return twin(*new_values)
        return native(*new_values)

    return loss


class _Float64Copy:
    """A float64 copy of a model (Keras 3: ``_keras3_copy``; tf_keras: ``_cloned``; a ``tf.Module`` that is not a
    Keras model is its own copy), and its loss as a function of the chosen variables' (float64) values, evaluated at
    the model's own values cast to float64: Keras 3 through ``stateless_call``, tf_keras by substituting every
    variable as the model's loss does."""

    def __init__(self, source: Source, loss: ModelLoss):
        self.model, self.keras3, self.x, self.y = source.model, source.keras3, source.x, source.y
        self.loss_fn, self.sample_weight, self.generators = source.loss_fn, source.sample_weight, source.generators
        self.every, self.trainable, self.chosen, self.training = loss.every, source.trainable, loss.chosen, loss.training

    def loss(self, native: Callable, values: list) -> tuple[Callable | None, str]:
        """(the copy's loss, a note saying what was compared), or (None, why no copy stands in)."""
        if self.training and (self.generators or any("seed_generator" in variable_name(v) for v in self.every)):
            return None, ("training=True draws dropout masks in the compute dtype, so a float64 copy would draw other "
                          "masks")
        try:
            twin, what = self._twin()
        except _NoCopy as reason:
            return None, str(reason)
        except Exception as error:  # a layer that cannot be rebuilt from its config, a subclassed model
            return None, (f"the model cannot be copied in float64 ({type(error).__name__}: {_gist(error)}); a copy "
                          "needs every layer rebuilt from its get_config() (a Lambda layer, or a custom layer without "
                          "get_config(), is not), or build the model in float64 and check that one")
        values64 = [tf.cast(value, tf.float64) for value in values]
        try:
            with preserved_variables(self.every):
                upcast = twin(*values64)
                own = native(*values)
        except Exception as error:
            return None, f"its float64 copy ({what}) fails ({type(error).__name__}: {_gist(error)})"
        dtypes = {tf.as_dtype(t.dtype).name for t in tf.nest.flatten(upcast)}
        if dtypes != {"float64"}:
            return None, (f"its float64 copy ({what}) returned a {', '.join(sorted(dtypes))} loss: a layer or the loss "
                          "computes in a fixed dtype")
        copied, original = _total(upcast), _total(own)
        scale = float(sum(np.sum(np.abs(np.asarray(t, np.float64))) for t in tf.nest.flatten(own)))
        eps = max(float(np.finfo(v.dtype.as_numpy_dtype).eps) for v in values)
        low = self.computes_in
        if low is not None:  # the model rounds in float16 or bfloat16 inside: their roundings
            eps = max(eps, PRECISION_EPSILON[low[0]])
        difference = abs(copied - original)
        if not (np.isfinite(copied) and np.isfinite(original)):
            return None, f"the loss is not finite at the point ({float(original):.9g})"
        if difference > FLOAT64_COPY_ROUNDINGS * eps * scale:
            return None, (f"its float64 copy ({what}) has loss {copied:.9g}, but the model's own is {original:.9g}: "
                          f"{difference / (eps * scale):.3g} roundings of the loss apart, more than the "
                          f"{FLOAT64_COPY_ROUNDINGS} allowed, so the copy computes another function or the model's "
                          "float32 evaluation is too ill-conditioned to be judged against exact derivatives" + self._hint)
        rounds = f" ({low[0]} roundings: {low[1]})" if low is not None else ""
        return twin, (f"{what}; its loss {copied:.9g} equals the model's {original:.9g} within "
                      f"{difference / (eps * scale):.2g} roundings{rounds} (at most {FLOAT64_COPY_ROUNDINGS} allowed); "
                      f"the analytical side is the model's own tape.gradient in its own precision")

    @property
    def computes_in(self) -> tuple | None:
        """(precision, reason) for a mixed-precision model: the first layer computing in float16 or bfloat16.

        Its float64 copy computes the function the model rounds (the exact network), and the model's own
        tape.gradient, computed in that precision, is judged against the copy's derivatives with that precision's
        tolerances.  The rounded function itself has no derivative below its quantum: its difference quotients at
        steps large enough to see past float16 noise average over the ReLU kinks within them (a Conv-BN-ReLU
        network under mixed_float16: numerical -0.327 against the exact -0.170, a false alarm)."""
        for layer in _layers(self.model):
            compute = _compute_dtype(layer)
            if compute in ("float16", "bfloat16") and type(layer).__name__ != "InputLayer":
                policy = getattr(getattr(layer, "dtype_policy", None), "name", compute)
                return compute, (f"layer {getattr(layer, 'name', type(layer).__name__)!r} computes in {compute} "
                                 f"(dtype policy {policy})")
        return None

    @property
    def _subclassed(self) -> bool:
        """A Keras 3 subclassed model: its copy names its layers afresh, so variables match by their own names."""
        return self.keras3 and _is_keras_model(self.model) and not _is_layer_graph(self.model)

    @property
    def _hint(self) -> str:
        """What would let a refused copy stand in: for a subclassed model on Keras's automatic config."""
        return REBUILD_HINT if self._subclassed and _automatic_config(self.model) else ""

    def _twin(self) -> tuple[Callable, str]:
        x64 = _cast_floating(self.x)
        compute = loss_of_outputs(self.loss_fn, _cast_floating(self.y), _cast_floating(self.sample_weight),
                                  self.model, dtype=tf.float64)
        if self.keras3:
            subclassed = self._subclassed
            clone, recovered, cloned = self._keras3_copy(x64)
            pairs = list(zip(self.every, [*clone.trainable_variables, *clone.non_trainable_variables]))
            if (len(pairs) != len(self.every) or len(clone.trainable_variables) != len(self.trainable)
                    or any(not _counterparts(a, b, subclassed) for a, b in pairs)):
                unmatched = next(((a, b) for a, b in pairs if not _counterparts(a, b, subclassed)), None)
                raise _NoCopy("its float64 copy's variables do not correspond one to one with the model's" + (
                    "" if unmatched is None else f" ({variable_name(unmatched[0])!r} against "
                    f"{variable_name(unmatched[1])!r} in the copy)") + self._hint)
            given = "".join(f", {name}={value!r}" for name, value in sorted(recovered.items()))
            what = (f"the model cloned layer by layer under the float64 dtype policy, same weights ({cloned})"
                    if cloned else
                    f"the model rebuilt from {type(self.model).__name__}.from_config(get_config()) under the float64 "
                    "dtype policy (every dtype of its config float64, nested configs too), same weights" + (
                        f" (constructor arguments read from the model's attributes of the same names: {given[2:]})"
                        if given else ""))
            return (_keras3_loss(self.model, x64, compute, self.every, self.trainable, self.chosen, self.training,
                                 runner=clone, dtype=tf.float64), what)
        if _is_keras_model(self.model):  # tf_keras
            clone = _cloned(self.model)
            originals, copies = list(self.model.variables), list(clone.variables)
            if len(originals) != len(copies) or any(tuple(a.shape) != tuple(b.shape) for a, b in zip(originals, copies)):
                raise _NoCopy("its float64 copy's variables do not correspond one to one with the model's")
            for original, twin in zip(originals, copies):  # also what a substitution below cannot reach
                twin.assign(tf.cast(original, twin.dtype) if twin.dtype.is_floating else original)
            counterpart = {id(a): b for a, b in zip(originals, copies)}
            what = "the model cloned layer by layer under the float64 dtype policy, same weights"
            generators = _tf_keras_random_generators(clone)
        else:
            clone, counterpart = self.model, {id(v): v for v in self.every}
            what = "the module itself, called with its variables and the data cast to float64"
            generators = self.generators
        return _substituted_float64_loss(clone, x64, compute, self.every, self.chosen, counterpart, generators,
                                         self.training), what

    def _keras3_copy(self, x64) -> tuple[Any, dict, str]:
        """(copy, constructor arguments read from attributes, why it was cloned layer by layer or ""): rebuilt from
        its float64 config (``_rebuilt``), or, for a Sequential or functional model whose config cannot be rebuilt (a
        layer deserialisation refuses), cloned layer by layer, each layer from its own config (``_cloned``)."""
        try:
            clone, recovered = _rebuilt(self.model, x64, self.training)
            return clone, recovered, ""
        except _NoCopy as reason:
            if not _is_layer_graph(self.model):
                raise
            try:
                return _cloned(self.model), {}, f"not rebuilt from its config as a whole: {reason}"
            except _NoCopy:
                raise reason from None


def _counterparts(original, copy, rebuilt: bool = False) -> bool:
    """A variable of the model and its float64 copy's, in the same place (they are paired in order): the same shape
    and the same name, without the number Keras appends to a repeated one.  A clone keeps the names of layers whose
    config holds them (``dense``), but a custom layer's automatic config does not, nor does an unnamed
    ``add_weight``: the clone of ``sequential/bad/variable`` is ``sequential/bad_1/variable_1``.  A seed generator's
    state is named afresh in a clone (``seed_generator_1``), so it matches by shape alone.  A rebuilt subclassed
    model names its layers afresh too (``net_1/conv2d_1/kernel``): its variables match by their own names.  A
    Sequential model rebuilt from its config may build its layers outside its own name scope
    (``sequential/conv2d/kernel`` against ``conv2d/kernel``): one path may end the other."""
    if tuple(original.shape) != tuple(copy.shape):
        return False
    names = [variable_name(original), variable_name(copy)]
    if rebuilt:
        names = [getattr(v, "name", name).split(":")[0] for v, name in zip((original, copy), names)]
    parts = [[re.sub(r"_\d+$", "", part) for part in name.split("/")] for name in names]
    if all(any("seed_generator" in part for part in path) for path in parts):
        return True
    shorter, longer = sorted(parts, key=len)
    return shorter == longer[len(longer) - len(shorter):] and (len(shorter) > 1 or len(longer) == 1 or rebuilt)


REBUILD_HINT = ("; Keras's automatic config records a subclassed model's constructor defaults, not the arguments "
                "given: keep each argument as an attribute of the same name (self.units = units) or define "
                "get_config() for the float64 copy")


class _NoCopy(Exception):
    """No float64 copy can stand in for the model (the message says why)."""


def _substituted_float64_loss(clone, x, compute, every, chosen, counterpart, generators, training) -> Callable:
    """The loss of ``clone`` with every floating variable substituted: the chosen ones by the given
    values, the others by the model's values cast to float64."""
    floating = [v for v in every if v.dtype.is_floating and id(v) in counterpart]
    places = _paths_to(clone, {id(counterpart[id(v)]) for v in floating})
    reachable = {id(v) for _, _, v, _ in places}
    missing = [variable_name(v) for v in chosen if id(counterpart.get(id(v))) not in reachable]
    if missing:
        raise _NoCopy(f"variable {missing[0]!r} cannot be reached in its float64 copy")
    fixed = {id(counterpart[id(v)]): tf.cast(stored_value(v), tf.float64) for v in floating}
    chosen_twins = [counterpart[id(v)] for v in chosen]

    def loss(*new_values):
        substitutes = dict(fixed)
        substitutes.update({id(twin): value for twin, value in zip(chosen_twins, new_values)})
        with swapped(places, substitutes), _stateless_randomness(generators):
            return compute(_call(clone, x, training))

    return loss


def _cloned(model):
    """``model`` cloned layer by layer (nested models too) with every layer under the float64 dtype policy."""
    keras = _keras_of(model)
    if not _is_layer_graph(model):
        raise _NoCopy(f"{type(model).__name__} is a subclassed model: only Sequential and functional models can "
                      "be copied layer by layer")

    def float64_layer(layer):
        if isinstance(layer, keras.Model):
            if not isinstance(layer, keras.Sequential) and not _is_functional(layer):
                raise _NoCopy(f"it contains the subclassed model {layer.name!r}, which cannot be copied layer by layer")
            return keras.models.clone_model(layer, clone_function=float64_layer)
        config = layer.get_config()
        if "dtype" in config or hasattr(layer, "dtype_policy"):
            config["dtype"] = "float64"  # an operation without a dtype (x + y) computes in its inputs'
        if isinstance(layer, keras.layers.Lambda):  # its config holds its function as code, without f's globals
            return type(layer)(layer.function, output_shape=layer._output_shape, mask=layer.mask,
                               arguments=layer.arguments, name=layer.name, dtype="float64")
        return layer.__class__.from_config(config)

    clone = keras.models.clone_model(model, clone_function=float64_layer)
    _assert_float64_layers(clone, "copy", "its get_config() does not carry the dtype policy")
    return clone


def _assert_float64_layers(copy, what: str, why: str) -> None:
    """Every layer of a float64 copy computes in float64 (its input layers aside)."""
    for layer in _layers(copy):
        compute = _compute_dtype(layer)
        if compute is not None and compute != "float64" and not type(layer).__name__ == "InputLayer":
            raise _NoCopy(f"layer {layer.name!r} of its {what} computes in {compute} ({why})")


def _rebuilt(model, x, training: bool):
    """A Keras 3 model made afresh from its config with every floating dtype in it float64, built on ``x``.

    ``type(model).from_config(get_config())`` with each serialised ``DTypePolicy`` and each ``"dtype"`` string of
    the config set to float64, nested configs included (``_float64_config``), while the global dtype policy is
    float64 (so a container without a dtype of its own, and every layer a constructor creates without one, computes
    in float64 too) and the model's own layer classes are known to deserialisation (``_classes_in``).  This covers
    Sequential and functional models (nested ones too), subclassed models and keras-hub backbones and tasks.  Where
    the config holds only the base arguments, a constructor that rejects them is called with none.  Under Keras's
    automatic config, arguments the model keeps as attributes of the same names are read back
    (``_arguments_kept_as_attributes``; returned, for the note); the caller matches the variables one to one and
    compares the losses, so a constructor that builds another network is refused there."""
    keras = _keras_of(model)

    def cannot(error) -> _NoCopy:
        return _NoCopy(f"{type(model).__name__} is a {'' if _is_layer_graph(model) else 'subclassed '}model that "
                       f"from_config(get_config()) cannot rebuild ({_gist(error)})")

    try:
        config = dict(model.get_config())
    except NotImplementedError as error:  # constructor arguments Keras cannot serialise
        raise cannot(error) from None
    automatic = not _is_layer_graph(model) and _automatic_config(model)
    recovered = _arguments_kept_as_attributes(model, config) if automatic else {}
    config = _float64_config({**config, **recovered})
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float64")
    try:
        with keras.saving.custom_object_scope(_classes_in(model)):
            try:
                clone = type(model).from_config(config)
            except TypeError as error:
                if set(config) - {"name", "trainable", "dtype"}:
                    raise cannot(error) from None
                try:
                    clone = type(model)()
                except TypeError:
                    raise cannot(error) from None
            except Exception as error:  # a layer deserialisation cannot make
                raise cannot(error) from None
    finally:
        keras.config.set_dtype_policy(policy)
    with warnings.catch_warnings():  # Keras warns of a sub-layer the call leaves unbuilt: fastcheck's copy, not the user's
        warnings.filterwarnings("ignore", message=r"`build\(\)` was called on layer", category=UserWarning)
        _call(clone, x, training)  # creates its variables
    _assert_float64_layers(clone, "rebuilt copy", "its constructor fixes the dtype")
    return clone, recovered


# Dtypes and dtype policies below float64 that a float64 copy's config replaces.
_BELOW_FLOAT64 = frozenset({"float16", "bfloat16", "float32", "mixed_float16", "mixed_bfloat16"})


def _float64_config(config):
    """A ``get_config()`` structure with every floating dtype below float64 set to float64, nested configs too:
    each serialised ``DTypePolicy`` (``{"class_name": "DTypePolicy", "config": {"name": "float32"}}``), each
    ``"dtype": "float32"`` entry and each dtype policy object; integer dtypes (token ids) and quantised policies
    are kept."""
    if isinstance(config, dict):
        inner = config.get("config")
        if (config.get("class_name") in ("DTypePolicy", "FloatDTypePolicy") and isinstance(inner, dict)
                and inner.get("name") in _BELOW_FLOAT64):
            return {**config, "config": {**inner, "name": "float64"}}
        return {key: "float64" if key == "dtype" and isinstance(value, str) and value in _BELOW_FLOAT64
                else _float64_config(value) for key, value in config.items()}
    if type(config) in (list, tuple):
        return type(config)(_float64_config(value) for value in config)
    if hasattr(config, "compute_dtype") and getattr(config, "name", None) in _BELOW_FLOAT64:  # a DTypePolicy
        return "float64"
    return config


def _classes_in(model) -> dict:
    """The model's own layer classes (not Keras's), by class name and registered name, for deserialisation:
    a custom layer defined in a function or a script is found where its module cannot be imported."""
    keras = _keras_of(model)
    classes: dict = {}
    for layer in [model, *_layers(model)]:
        klass = type(layer)
        if klass.__module__.startswith(("keras.", "tf_keras.")):
            continue
        for name in (klass.__name__, keras.saving.get_registered_name(klass)):
            classes.setdefault(name, klass)
    return classes


# Argument types a rebuilt model may take from its attributes: those Keras's automatic config records (it refuses others).
_SIMPLE = (str, int, float, bool, type(None))


def _automatic_config(model) -> bool:
    """Whether ``model.get_config`` is Keras's own (the automatic config), not the class's."""
    owner = next((klass for klass in type(model).__mro__ if "get_config" in vars(klass)), None)
    return owner is not None and owner.__module__.startswith(("keras.", "tf_keras."))


def _arguments_kept_as_attributes(model, config: dict) -> dict:
    """Constructor arguments read back from attributes of the same name (``self.units = units``): Keras's
    ``Model.__new__`` does not pass the constructor's arguments on, so a subclassed model's automatic config holds
    the constructor's *defaults* (``Net(units=5)`` gives ``units: 4``).  Where the model keeps an argument as an
    attribute of the same name (or with a leading underscore) of a type the config can hold, that value is the
    argument given; the copy is still matched variable by variable and loss against loss."""
    recovered = {}
    for name in set(config) - {"name", "trainable", "dtype"}:
        for attribute in (name, f"_{name}"):
            value = inspect.getattr_static(model, attribute, None)
            if value is None and attribute not in vars(model):
                continue
            simple = isinstance(value, _SIMPLE) or (
                isinstance(value, (list, tuple)) and all(isinstance(v, _SIMPLE) for v in value))
            if simple and value != config[name]:
                recovered[name] = list(value) if isinstance(value, tuple) and isinstance(config[name], list) else value
            if simple:
                break
    return recovered


def _is_layer_graph(model) -> bool:
    """A Sequential or functional Keras model: copied layer by layer."""
    keras = _keras_of(model)
    return isinstance(model, keras.Sequential) or _is_functional(model)


def _is_keras_model(model) -> bool:
    return any(klass.__name__ == "Model" and klass.__module__.startswith(("keras", "tf_keras"))
               for klass in type(model).__mro__)


def _layers(model) -> list:
    """Every layer (and sub-layer) of a Keras model; a tf.Module's submodules."""
    flatten = getattr(model, "_flatten_layers", None)
    if flatten is not None:
        try:
            return list(flatten(include_self=False, recursive=True))
        except TypeError:
            pass
    return list(getattr(model, "submodules", ()))


def _compute_dtype(layer) -> str | None:
    policy = getattr(layer, "dtype_policy", None)
    compute = getattr(policy, "compute_dtype", None) or getattr(layer, "compute_dtype", None)
    try:
        return tf.as_dtype(compute).name if compute is not None else None
    except TypeError:
        return None


def _cast_floating(structure):
    """``structure`` with every floating leaf (array or tensor) cast to float64; other leaves as they are."""
    if structure is None:
        return None

    def cast(leaf):
        if isinstance(leaf, (tf.Tensor, tf.Variable, np.ndarray, np.generic)) and tf.as_dtype(leaf.dtype).is_floating:
            return tf.cast(leaf, tf.float64)
        return leaf

    return tf.nest.map_structure(cast, structure)


def _gist(error: Exception, limit: int = 160) -> str:
    text = " ".join(line.strip() for line in str(error).strip().splitlines()[:2] if line.strip()) or repr(error)
    return text if len(text) <= limit else text[: limit - 3] + "..."
