"""Compiled kernels: cached per f, its signatures and the check's settings, and dropped when f dies.

A check's kernels (the differences, the autodiff rows, fast mode's probes, coloured mode's colours) are
``tf.function``s of f.  They are kept in one LRU cache keyed by ``plan_key`` (f by identity), so a repeated check of
f traces nothing; they hold f through ``WeakCall``, so the cache never keeps f alive, and f's kernels leave the
cache when f is collected (so a later function at the same address never meets them, and a suite checking a fresh
lambda per test does not accumulate graphs).  The cache saves time only: whether a kernel is in it changes no
path, mode, number or note of a check.
"""

from __future__ import annotations

import collections
import functools
import inspect
import re
import weakref

import numpy as np
import tensorflow as tf

from fastcheck.engine.config import CheckConfig
from fastcheck.engine.plan import Plan
from fastcheck.engine.raised import call_carrying_own
from fastcheck.engine.tables import KERNEL_CACHE_ENTRIES

_cache: collections.OrderedDict = collections.OrderedDict()


class _QuietInternalRetracing:
    """Drops TensorFlow's "triggered tf.function retracing" warning for fastcheck's own kernels.

    Each new function checked compiles new kernels (a test suite checks a fresh lambda per test), which TensorFlow
    reads as a tf.function created in a loop; the warning would point users at fastcheck's internals.
    """

    def filter(self, record) -> bool:
        message = record.getMessage()
        return not ("triggered tf.function retracing" in message and _OWN_KERNELS.search(message))


_OWN_KERNELS = re.compile(r"(_kernel|probe_graph|reverse_jvp|Directional)[^ ]*\.<locals>|fastcheck\.")
tf.get_logger().addFilter(_QuietInternalRetracing())


def plan_key(plan: Plan, config: CheckConfig) -> tuple:
    """What a compiled kernel depends on: f (by identity, see the module docstring), signatures, precision, the
    compile settings (worked out once for the last plan and configuration: a check asks for it several times)."""
    last_plan, last_config, key = _last_key
    if plan is last_plan() and config is last_config:
        return key
    key = _plan_key(plan, config)
    _last_key[:] = [weakref.ref(plan), config, key]  # not the plan's tensors kept alive until the next check
    return key


_last_key: list = [lambda: None, None, ()]


def _plan_key(plan: Plan, config: CheckConfig) -> tuple:
    f = plan.f.function if isinstance(plan.f, WeakCall) else plan.f
    f_key = (id(f.__func__), id(f.__self__)) if hasattr(f, "__func__") and hasattr(f, "__self__") else id(f)
    _evict_when_collected(f, f_key)
    signature = tuple((s.position, tuple(s.value.shape), s.dtype.name, s.checked) for s in plan.inputs)
    outputs = tuple((o.shape, o.dtype.name) for o in plan.outputs) + (tuple(plan.leaf_is_output),)
    return (f_key, signature, outputs, plan.eval_upcast, config.compiled_key)


_watched: dict = {}  # f_key -> the finalizer that evicts f's kernels


def _evict_when_collected(f, f_key) -> None:
    if f_key in _watched:
        return
    owner = f.__self__ if hasattr(f, "__func__") and hasattr(f, "__self__") else f
    try:
        _watched[f_key] = weakref.finalize(owner, _evict, f_key)
    except TypeError:  # not weak-referenceable (a builtin): lives as long as the process anyway
        _watched[f_key] = None


def _evict(f_key) -> None:
    _watched.pop(f_key, None)
    for key in [k for k in _cache if k[0] == f_key]:
        del _cache[key]


class WeakCall:
    """Calls f without keeping it alive: cached kernels hold this, not f (see ``plan_key``).

    Every call of f after planning goes through it: the user's own exception leaves as ``raised.Raised``, past the
    fallbacks and handlers between f and the caller.
    """

    def __init__(self, f):
        try:
            self._ref = weakref.WeakMethod(f) if hasattr(f, "__func__") and hasattr(f, "__self__") else weakref.ref(f)
        except TypeError:  # not weak-referenceable (a builtin): held, as it lives as long as the process anyway
            self._ref = lambda: f

    @property
    def function(self):
        f = self._ref()
        if f is None:  # pragma: no cover - the cache drops kernels before f dies
            raise ReferenceError("the checked function no longer exists")
        return f

    def __call__(self, *args, **kwargs):
        return call_carrying_own(self.function, args, kwargs)


def kernel_held(f) -> WeakCall:
    """f as compiled kernels hold it (``build_plan``'s ``hold``): by weak reference, when f allows one."""
    return f if isinstance(f, WeakCall) else WeakCall(f)


class FlatCall:
    """A kernel's ``tf.function``, called through the flat entry of the concrete function traced for the arguments'
    dtypes and shapes: the same graph and numbers, without ``tf.function``'s per-call binding of each argument
    (0.7-0.9 ms for a 40-variable model's values against 0.07-0.13 ms; its differences kernel is called ~700 times a
    check).  Arguments other than eager tensors and lists or tuples of them, a call under a distribution strategy's
    scope (``tf.function`` traces per device there), and a TensorFlow whose flat entry is not the one known here call
    the ``tf.function``."""

    def __init__(self, function):
        self.function, self._concrete, self._traced = function, {}, False

    def entry(self):
        """This, once the function has been traced; until then the function itself, so that its first trace runs
        beneath its caller alone (every call of f passes each of fastcheck's modules in at most two stretches)."""
        self._traced = self._traced or bool(self.function.experimental_get_tracing_count())
        return self if self._traced else self.function

    def __call__(self, *args):
        flat: list | None = [] if _has_flat_entry() and not tf.distribute.has_strategy() else None
        for arg in args:
            if flat is None:
                break
            if type(arg) is _EAGER_TENSOR:
                flat.append(arg)
            elif type(arg) in (list, tuple) and all(type(t) is _EAGER_TENSOR for t in arg):
                flat.extend(arg)
            else:
                flat = None
        if flat is None:
            return self.function(*args)
        signature = tuple((t.dtype, t.shape) for t in flat)
        if signature not in self._concrete:
            self._concrete[signature] = self.function.get_concrete_function(*args)
        concrete = self._concrete[signature]
        return concrete._call_flat(flat, concrete.captured_inputs)


_EAGER_TENSOR = type(tf.constant(0))


@functools.cache
def _has_flat_entry() -> bool:
    concrete = type(tf.function(lambda: 0).get_concrete_function())
    parameters = inspect.signature(concrete._call_flat).parameters if hasattr(concrete, "_call_flat") else {}
    return list(parameters) == ["self", "tensor_inputs", "captured_inputs"]


def flat_call(kernel):
    """``kernel`` as a ``FlatCall`` where it is a ``tf.function`` (anything else as it is)."""
    return FlatCall(kernel) if isinstance(kernel, tf.types.experimental.PolymorphicFunction) else kernel


def cached(key: tuple, make):
    """LRU cache of compiled kernels, emptied of a function's kernels when it is collected."""
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    value = make()
    _put(key, value)
    return value


def _put(key: tuple, value) -> None:
    _cache[key] = value
    _cache.move_to_end(key)
    while len(_cache) > KERNEL_CACHE_ENTRIES:
        _cache.popitem(last=False)


def pad(values: np.ndarray, size: int) -> np.ndarray:
    """Pad a chunk to the kernel's static size by repeating its last entry."""
    if len(values) == size:
        return values
    return np.concatenate([values, np.repeat(values[-1:], size - len(values), axis=0)])
