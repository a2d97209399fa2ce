"""Structured inputs: any ``tf.nest`` structure of arguments, flattened for the engine.

The engine checks a function of positional tensors.  ``flatten`` turns ``f(*args)`` whose arguments are dicts,
nested lists/tuples, namedtuples, ``tf.SparseTensor`` or ``tf.RaggedTensor`` into ``flat_f(*leaves)`` over the
*checked* leaves only, named by their path (``input 0['dense']['kernel']``):

* structures are kept as structures, never stacked into one tensor (a list of Python numbers alone is an array, as
  numpy reads it);
* a ``tf.SparseTensor`` is checked through its values (indices fixed), a ``tf.RaggedTensor`` through its flat
  values (row partitions fixed); as outputs they are flattened the same way;
* ``wrt`` selects the checked leaves; every other leaf reaches f unchanged, and Python ints and bools always stay
  Python numbers (``x ** n`` with ``n=3``).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

import numpy as np
import tensorflow as tf

_COMPOSITE = (tf.SparseTensor, tf.RaggedTensor)


def _is_literal(item) -> bool:
    """A (nested) list/tuple of Python numbers: one array, as numpy reads it."""
    if isinstance(item, (list, tuple)) and not hasattr(item, "_fields"):
        return len(item) > 0 and all(_is_literal(i) for i in item)
    return isinstance(item, numbers.Number) and not isinstance(item, bool)


def _is_structured(item) -> bool:
    if isinstance(item, (dict, *_COMPOSITE)):
        return True
    if isinstance(item, (list, tuple)):
        return not _is_literal(item)
    return isinstance(item, (bool, numbers.Integral)) and not isinstance(item, np.ndarray)


def _positional(inputs) -> bool:
    """Whether ``inputs`` lists f's positional arguments (a namedtuple is one argument)."""
    return isinstance(inputs, (list, tuple)) and not hasattr(inputs, "_fields")


def needs_flattening(inputs, wrt) -> bool:
    items = inputs if _positional(inputs) else [inputs]
    return wrt is not None or any(_is_structured(item) for item in items)


def _leaves(item, path: tuple, name: str, out: list) -> None:
    """(path, name, leaf) in tf.nest order; composites and literals are leaves."""
    if isinstance(item, dict):
        for key in sorted(item):  # tf.nest's order
            _leaves(item[key], (*path, key), f"{name}[{key!r}]", out)
    elif isinstance(item, tuple) and hasattr(item, "_fields"):
        for field in item._fields:
            _leaves(getattr(item, field), (*path, field), f"{name}.{field}", out)
    elif isinstance(item, (list, tuple)) and not _is_literal(item):
        for i, sub in enumerate(item):
            _leaves(sub, (*path, i), f"{name}[{i}]", out)
    else:
        out.append((path, name, item))


def _checkable(leaf) -> bool:
    """Whether a leaf is checked by default: floating or complex values (Python floats too)."""
    if isinstance(leaf, bool) or (isinstance(leaf, numbers.Integral) and not isinstance(leaf, np.generic)):
        return False
    leaf = _checked_part(leaf)
    dtype = getattr(leaf, "dtype", None)
    if dtype is None:
        dtype = np.asarray(leaf).dtype
    dtype = tf.as_dtype(dtype)
    return dtype.is_floating or dtype.is_complex


def _checked_part(leaf):
    if isinstance(leaf, tf.SparseTensor):
        return leaf.values
    if isinstance(leaf, tf.RaggedTensor):
        return leaf.flat_values
    return leaf


def _rebuild(original, value):
    if isinstance(original, tf.SparseTensor):
        return tf.SparseTensor(original.indices, value, original.dense_shape)
    if isinstance(original, tf.RaggedTensor):
        return original.with_flat_values(value)
    return value


def dense_outputs(out):
    """f's output with sparse/ragged leaves replaced by their values / flat values."""
    return tf.nest.map_structure(_checked_part, out)


def _selected(wrt, leaves: list, several: bool) -> list[bool]:
    """Which leaves ``wrt`` selects: positions, paths (tuples) or names (strings, exact or a prefix)."""
    selectors = wrt if isinstance(wrt, (list, set)) else [wrt]
    chosen = [False] * len(leaves)
    for selector in selectors:
        if isinstance(selector, bool) or not isinstance(selector, (int, tuple, str)):
            raise TypeError(f"wrt entries are positions (int), paths (tuples of keys) or names (str); got {selector!r}.")
        path = (selector,) if isinstance(selector, int) and several else selector
        hits = [i for i, (leaf_path, name, _) in enumerate(leaves)
                if (isinstance(path, str) and (name == path or name.startswith(path + "[") or name.startswith(path + ".")))
                or (isinstance(path, tuple) and leaf_path[: len(path)] == path)
                or (isinstance(path, int) and not several and path == 0)]
        if not hits:
            known = ", ".join(name for _, name, _ in leaves[:12]) + (" ..." if len(leaves) > 12 else "")
            raise ValueError(f"wrt={selector!r} matches no input; the inputs are: {known} "
                             "(select by position, a path tuple like (0, 'dense', 'kernel'), or one of these names).")
        for i in hits:
            chosen[i] = True
    return chosen


def flatten(f: Callable, inputs, wrt=None) -> tuple[Callable, list, list[str]]:
    """``(flat_f, checked leaves, their names)``: f of the checked leaves, everything else held as given."""
    several = _positional(inputs)
    args = list(inputs) if several else [inputs]
    leaves: list = []
    for position, arg in enumerate(args):
        _leaves(arg, (position,) if several else (), f"input {position}" if several else "input", leaves)
    chosen = _selected(wrt, leaves, several) if wrt is not None else [_checkable(leaf) for _, _, leaf in leaves]
    for (_, name, leaf), pick in zip(leaves, chosen):
        if pick and not _checkable(leaf):
            raise TypeError(f"wrt selects {name}, which is not floating point ({type(leaf).__name__}): only float "
                            "and complex inputs have derivatives to check.")
    checked = [i for i, pick in enumerate(chosen) if pick]
    values = [_checked_part(leaves[i][2]) for i in checked]
    names = [leaves[i][1] + (".values" if isinstance(leaves[i][2], tf.SparseTensor) else
                             ".flat_values" if isinstance(leaves[i][2], tf.RaggedTensor) else "") for i in checked]
    held = [leaf for _, _, leaf in leaves]

    def flat_f(*moved):
        current = list(held)
        for i, value in zip(checked, moved):
            current[i] = _rebuild(held[i], value)
        structure = args if several else args[0]
        rebuilt = _pack(structure, iter(current))
        return dense_outputs(f(*rebuilt) if several else f(rebuilt))

    return flat_f, values, names


def _pack(item, leaves):
    """``item``'s structure with its leaves taken in order from ``leaves`` (the inverse of ``_leaves``)."""
    if isinstance(item, dict):
        packed = {key: None for key in item}
        for key in sorted(item):
            packed[key] = _pack(item[key], leaves)
        return type(item)(packed) if type(item) is not dict else packed
    if hasattr(item, "_fields") and isinstance(item, tuple):
        return type(item)(*[_pack(getattr(item, field), leaves) for field in item._fields])
    if isinstance(item, (list, tuple)) and not _is_literal(item):
        return type(item)(_pack(sub, leaves) for sub in item)
    return next(leaves)
