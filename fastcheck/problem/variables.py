"""Variables as libraries define them: substitution inside wrappers, attribute-path names, library flags.

The numerical side evaluates the loss at given values of the variables.  Swapping a module's attribute for a tensor
skips whatever a library does when a variable is *read*: larq's ``QuantizedVariable`` quantizes its latent
variable, a TFP ``TransformedVariable`` (a GPflow ``Parameter``) applies its bijector and carries ``.trainable``
and ``.prior``, a tf_keras ``AutoCastVariable`` casts.  So a wrapper stays where the model keeps it, and the
variable *inside* it (its storage, found by following the wrappers' attributes) is swapped for a
``VariableReading``: an object that reads as the given value and has the variable's attributes.  Every wrapper
still applies its read transform, nothing is assigned, and the value may be a symbolic tensor (``tf.function``,
``vectorized_map`` with batched values).  A variable held directly by a layer or module is swapped for the value.

A check must also leave the process as it found it: some libraries keep global context flags that a context
manager sets without ``try``/``finally``, so an error raised inside a layer leaves them switched (larq's
``quantized_scope``: afterwards every quantized variable reads quantized, ``get_weights()`` included).
``library_state_restored`` restores the known ones (``LIBRARY_FLAGS``, and the contents of ``LIBRARY_STACKS``)
whatever happens inside.
"""

from __future__ import annotations

import contextlib
import inspect
import sys

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

# Where a variable wrapper keeps the variable it reads: larq QuantizedVariable, tf_keras
# AutoCastVariable, TFP DeferredTensor / TransformedVariable (GPflow Parameter).
WRAPPED_VARIABLE_ATTRIBUTES = ("latent_variable", "_variable", "_pretransformed_input")

# (module, attribute path) of library context flags set without try/finally (module docstring): read before a
# check and restored after it when the module is loaded (it is never imported for this).
LIBRARY_FLAGS = (
    # larq's quantized_scope(True), entered by every quantized layer's call: larq >= 0.12 keeps it
    # on a thread-local (restored in the calling thread, where the check runs), earlier larq as a global.
    ("larq.context", "_quantized_scope.should_quantize"),
    ("larq.quantized_scope", "_SHOULD_QUANTIZE"),
)
# Library stacks (lists kept per thread) whose contents an exception can leave changed: restored to their entries
# of before.  Keras 3's name-scope stack keeps a layer's scope when the layer's call raises inside a traced stateless
# call (a custom gradient that iterates ``variables``, None there): every later layer and variable is named under it.
LIBRARY_STACKS = (("keras.src.backend.common.global_state", "GLOBAL_STATE_TRACKER.name_scope_stack"),)

_MISSING = object()


def storage(variable):
    """The ``tf.Variable`` holding ``variable``'s bytes: the variable itself, or what its wrappers wrap."""
    hops = _innermost(variable)
    return hops[-1][2] if hops else variable


def _innermost(variable) -> list:
    """The wrapper hops from ``variable`` to its storage: [(wrapper, attribute, wrapped), ...]."""
    hops, seen = [], set()
    while id(variable) not in seen and not isinstance(variable, resource_variable_ops.BaseResourceVariable):
        seen.add(id(variable))
        attributes = vars(variable) if hasattr(variable, "__dict__") else {}
        name = next((n for n in WRAPPED_VARIABLE_ATTRIBUTES if isinstance(attributes.get(n), tf.Variable)), None)
        if name is None:
            break
        hops.append((variable, name, attributes[name]))
        variable = attributes[name]
    return hops


def stored_value(variable) -> tf.Tensor:
    """The value in ``variable``'s storage (a wrapper's latent value, not its transformed read)."""
    held = storage(variable) if isinstance(variable, tf.Variable) else variable
    return tf.identity(tf.convert_to_tensor(held))


def is_wrapper_slot(owner, key) -> bool:
    """``owner.key`` is where a variable wrapper keeps the variable it reads (a DeferredTensor's input)."""
    return isinstance(key, str) and key in WRAPPED_VARIABLE_ATTRIBUTES and hasattr(owner, "__dict__") and not (
        isinstance(owner, (list, tuple, dict)))


@contextlib.contextmanager
def swapped(places, substitutes: dict):
    """While inside, the model reads each variable of ``places`` (``(owner, key, variable, path)``, from
    ``model._paths_to``) as its substitute (``substitutes`` maps ``id(variable)`` to its value).

    A variable held by a layer or module is replaced there by the value (a tensor: raw ops in eager mode read a
    variable's handle, not its Python methods).  A wrapper stays where it is, and the variable *inside* it is
    replaced by a ``VariableReading``, as is the input of a TFP ``DeferredTensor`` (a GPflow ``Parameter``), so the
    wrapper's read transform applies to the value.  Everything is swapped back at once; nothing is assigned."""
    done = []  # (owner, key, original)
    readings: dict = {}

    def reading(variable, value):
        if id(variable) not in readings:
            readings[id(variable)] = VariableReading(variable, value)
        return readings[id(variable)]

    # Found before anything is swapped: a wrapper kept in several places is seen swapped at the second.
    wrapped = [(place, _innermost(place[2])) for place in places]
    try:
        for (owner, key, variable, _), hops in wrapped:
            if isinstance(owner, tuple):
                continue
            value = substitutes[id(variable)]
            if hops:  # a wrapper: substitute inside it, once for all its places
                owner, key, variable = hops[-1]
                if id(variable) in readings:
                    continue
            if hops or is_wrapper_slot(owner, key):
                value = reading(variable, value)
            _set(owner, key, value)
            done.append((owner, key, variable))
        yield
    finally:
        for owner, key, original in reversed(done):
            _set(owner, key, original)


def _set(owner, key, value) -> None:
    if isinstance(key, str) and not isinstance(owner, (dict, list)) and type(owner).__name__ not in (
            "ListWrapper", "_DictWrapper"):
        object.__setattr__(owner, key, value)  # bypassing attribute tracking
    else:
        storage_ = getattr(owner, "_storage", None)  # tf tracking wrappers keep a plain list/dict
        (storage_ if storage_ is not None else owner)[key] = value


class VariableReading:
    """A variable as a wrapper sees it while the loss is computed: every read gives ``value``.

    Reads (tensor conversion, ``value()``, ``read_value()``, ``numpy()``, operators, slicing, ``sparse_read``,
    ``gather_nd``) give the substitute value, whose dtype and shape are this object's; every other attribute
    (``trainable``, ``name``, ``constraint``, a GPflow ``Parameter``'s checks on its unconstrained variable) is the
    variable's.  It is not a ``tf.Variable``: eager raw ops would read a variable's handle directly."""

    def __init__(self, variable, value):
        object.__setattr__(self, "_fastcheck_variable", variable)
        object.__setattr__(self, "_fastcheck_value", value)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_fastcheck_variable"), name)

    def _read(self):
        return tf.identity(self._fastcheck_value)

    def value(self):
        return self._read()

    read_value = read_value_no_copy = _read_variable_op = value

    # Converted through the registry, not ``__tf_tensor__``: a wrapper delegating unknown attributes
    # to its variable (larq's ``__getattr__``) would hand that protocol on and skip its own transform.
    def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
        del as_ref
        return tf.convert_to_tensor(self._read(), dtype=dtype, name=name)

    def numpy(self):
        return self._read().numpy()

    def __array__(self, dtype=None):
        return np.asarray(self.numpy(), dtype=dtype)

    def sparse_read(self, indices, name=None):
        return tf.gather(self._fastcheck_value, indices, name=name)

    def gather_nd(self, indices, name=None):
        return tf.gather_nd(self._fastcheck_value, indices, name=name)

    @property
    def dtype(self):
        return self._fastcheck_value.dtype

    @property
    def shape(self):
        return self._fastcheck_value.shape

    def get_shape(self):
        return self.shape

    def __repr__(self):
        return f"<fastcheck reading of {self._fastcheck_variable!r}>"


def _operator(name):
    def apply(self, *args):
        return getattr(self._read(), name)(*args)

    apply.__name__ = name
    return apply


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__", "__matmul__",
              "__rmatmul__", "__neg__", "__abs__", "__lt__", "__le__", "__gt__", "__ge__", "__getitem__",
              "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__", "__invert__"):
    setattr(VariableReading, _name, _operator(_name))
tf.register_tensor_conversion_function(
    VariableReading, lambda reading, dtype=None, name=None, as_ref=False: reading._dense_var_to_tensor(dtype, name))


# ---------------------------------------------------------------- names

def attribute_paths(module, variables) -> dict:
    """``{id(variable): "kernel.lengthscales"}``: where ``module`` keeps each variable, as Python spells it.

    Attributes join with dots, list items and dict entries index (``layers[0].kernel``, ``blocks['a'].w``); the hop
    into a variable wrapper (``_pretransformed_input`` of a GPflow ``Parameter``) is left out, so the variable is
    named as its parameter.  Of several places, the one with the fewest private hops, then the shortest, names it."""
    flatten = getattr(module, "_flatten", None)
    if flatten is None:
        return {}
    wanted = {id(v) for v in variables}
    best: dict = {}
    for path, variable in flatten(predicate=lambda v: isinstance(v, tf.Variable), with_path=True):
        if id(variable) not in wanted or not path:
            continue
        name, private = _spelled(module, path)
        if name is None:
            continue
        rank = (private, len(path), name)
        if id(variable) not in best or rank < best[id(variable)][0]:
            best[id(variable)] = (rank, name)
    return {key: name for key, (_, name) in best.items()}


def _spelled(module, path) -> tuple[str | None, int]:
    owner, text, private = module, "", 0
    for position, key in enumerate(path):
        last = position == len(path) - 1
        if last and key in WRAPPED_VARIABLE_ATTRIBUTES and text and not _is_container(owner):
            break  # the wrapper's own variable: named as the wrapper
        if _is_container(owner):
            text += f"[{key!r}]" if isinstance(key, str) else f"[{key}]"
        else:
            text += f".{key}" if text else str(key)
            private += str(key).startswith("_")
        try:
            owner = owner[key] if _is_container(owner) else getattr(owner, key)
        except (AttributeError, KeyError, IndexError, TypeError):
            return None, 0
    return text, private


def _is_container(owner) -> bool:
    return isinstance(owner, (list, tuple, dict)) or type(owner).__name__ in ("ListWrapper", "_DictWrapper",
                                                                               "_TupleWrapper")


# ---------------------------------------------------------------- library state

@contextlib.contextmanager
def library_state_restored():
    """Every flag of ``LIBRARY_FLAGS`` whose library is loaded has its value of before afterwards."""
    saved = [(owner, attribute, getattr(owner, attribute, _MISSING)) for owner, attribute in _places(LIBRARY_FLAGS)]
    stacks = [(owner, attribute, stack, list(stack)) for owner, attribute in _places(LIBRARY_STACKS)
              if isinstance(stack := getattr(owner, attribute, None), list)]
    try:
        yield
    finally:
        for owner, attribute, value in saved:
            if getattr(owner, attribute, _MISSING) is value:
                continue
            if value is _MISSING:
                delattr(owner, attribute)
            else:
                setattr(owner, attribute, value)
        for owner, attribute, stack, entries in stacks:
            if stack != entries:
                stack[:] = entries
            if getattr(owner, attribute, None) is not stack:
                setattr(owner, attribute, stack)


def _places(paths) -> list:
    """(owner, attribute) of each (module, attribute path) whose module is loaded and whose owner exists."""
    places = []
    for module_name, path in paths:
        owner = sys.modules.get(module_name)
        *hops, attribute = path.split(".")
        for hop in hops:
            owner = getattr(owner, hop, None)
        if owner is not None:
            places.append((owner, attribute))
    return places


# ---------------------------------------------------------------- zero-argument losses

def takes_no_arguments(fn) -> bool:
    """``fn`` can be called with no arguments (GPflow's ``model.training_loss``, a closure)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    required = [p for p in signature.parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return not required


def python_function(fn):
    """A ``tf.function``'s Python function (its traced graph reads the variables it captured, not
    their substitutes); any other callable as it is."""
    inner = getattr(fn, "python_function", None)
    return inner if callable(inner) and type(fn).__module__.startswith("tensorflow") else fn
