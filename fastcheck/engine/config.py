"""Check configuration and the per-dtype tables every other module reads.

Steps and tolerances are data, kept here in one place:

* The finite-difference step for element ``x_j`` is ``h_j = eps * max(1, |x_j|)`` where ``eps`` defaults to
  ``machine_epsilon(dtype) ** (1/3)`` of the dtype the numerical side is *evaluated* in (the least precise floating
  dtype on the path: inputs and outputs).  ``eps**(1/3)`` balances the O(h^2) truncation error of central
  differences against the O(eps/h) rounding error.  An infinite (or NaN) ``x_j`` takes ``h_j = eps``
  (``step_scale``): ``x_j +- h_j`` is ``x_j`` itself, and its quotient ``(f(x) - f(x)) / 2 h_j`` is what
  ``tf.test.compute_gradient`` computes there (0 where f is finite).
* Tolerances come from the dtype of the *analytical* side (the user's dtype), the computation being judged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from typing import Any

import numpy as np
import tensorflow as tf

from fastcheck.engine import tables as _tables
from fastcheck.engine.tables import (
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_PROBES,
    DEFAULT_TOLERANCES,  # re-exported: the tolerance table users override
)
from fastcheck.sparsity.pattern import given

# Machine epsilon per dtype, as data (bfloat16 is not a numpy dtype).
MACHINE_EPSILON = {
    tf.float16: float(np.finfo(np.float16).eps),
    tf.bfloat16: 2.0**-7,
    tf.float32: float(np.finfo(np.float32).eps),
    tf.float64: float(np.finfo(np.float64).eps),
}

# The precisions f may compute in, by name, with their unit roundoff.  TensorFloat-32 (float32 matmuls and
# convolutions on Ampere/Hopper GPUs) keeps float16's 10-bit mantissa.
PRECISION_EPSILON = {
    "float64": MACHINE_EPSILON[tf.float64],
    "float32": MACHINE_EPSILON[tf.float32],
    "tensorfloat32": 2.0**-10,
    "float16": MACHINE_EPSILON[tf.float16],
    "bfloat16": MACHINE_EPSILON[tf.bfloat16],
}


def step_scale(x) -> np.ndarray:
    """``max(1, |x_j|)`` as float64, the factor of element ``j``'s step ``eps * max(1, |x_j|)``; 1 where ``x_j`` is
    not finite (an infinite step would move x_j to ``inf - inf``, NaN: ``tf.test.compute_gradient`` moves it by its
    finite delta, and ``x_j +- delta`` stays where it is)."""
    magnitude = np.abs(np.asarray(x, np.float64))
    return np.where(np.isfinite(magnitude), np.maximum(1.0, magnitude), 1.0)


def device_step_scale(x: tf.Tensor) -> tf.Tensor:
    """``step_scale`` of a tensor, flattened, on the device (float64)."""
    magnitude = tf.abs(tf.cast(tf.reshape(x, [-1]), tf.float64))
    return tf.where(tf.math.is_finite(magnitude), tf.maximum(tf.constant(1.0, tf.float64), magnitude), 1.0)


def span(x, d, dtype=np.float64) -> np.ndarray:
    """``(x + d) - (x - d)`` as float64, each side rounded in x's dtype (``d``: the step in that dtype) and subtracted
    in ``dtype``: the step actually taken both ways; ``2 d`` where x is not finite (``x +- d`` is x itself, and its
    difference quotient divides by the nominal span, as ``tf.test.compute_gradient`` does, not by ``inf - inf``)."""
    x = np.asarray(x)
    with np.errstate(over="ignore"):  # x + d past the dtype's largest value: an infinite span, judged non-finite
        centre = np.where(np.isfinite(x), x, x.dtype.type(0))
        return ((centre + d).astype(dtype) - (centre - d).astype(dtype)).astype(np.float64)


def device_span(x: tf.Tensor, d: tf.Tensor, dtype: tf.DType = tf.float64) -> tf.Tensor:
    """``span`` on the device, in ``dtype``."""
    centre = tf.where(tf.math.is_finite(x), x, tf.zeros_like(x))
    return tf.cast(centre + d, dtype) - tf.cast(centre - d, dtype)


PRECISIONS = ("auto", "native", "float64")
MODES = ("auto", "full", "fast", "coloured")
# Which autodiff side is checked: reverse mode (VJPs, what training uses) always, forward mode (JVPs) as an extra
# check where TensorFlow supports it ("auto").
AUTODIFF = ("auto", "reverse", "forward", "both")


# Memoised (a few microseconds of TensorFlow's dtype properties each, read many times in every check).
@functools.lru_cache(maxsize=256)
def real_dtype(dtype: tf.DType) -> tf.DType:
    """The real dtype behind ``dtype`` (complex64 -> float32, ...)."""
    dtype = tf.as_dtype(dtype)
    return dtype.real_dtype if dtype.is_complex else dtype


def least_precise(dtypes) -> tf.DType:
    """The floating dtype with the largest machine epsilon among ``dtypes``."""
    return _extreme_precision(tuple(dtypes), True)


def most_precise(dtypes) -> tf.DType:
    return _extreme_precision(tuple(dtypes), False)


@functools.lru_cache(maxsize=256)
def _extreme_precision(dtypes: tuple, least: bool) -> tf.DType:
    reals = [real_dtype(d) for d in dtypes if tf.as_dtype(d).is_floating or tf.as_dtype(d).is_complex]
    return (max if least else min)(reals, key=lambda d: MACHINE_EPSILON[d])


def precision_name(dtype: tf.DType) -> str:
    return real_dtype(dtype).name


def less_precise(names) -> str:
    """The least precise of the named precisions (see ``PRECISION_EPSILON``)."""
    return max(names, key=PRECISION_EPSILON.__getitem__)


# -- device=: where the check runs (the replicas' work is ``distribute``'s) -------------------------------------

DEVICE_FORMS = ("a device name such as '/GPU:0' (the check pinned to it), a list of device names such as "
                "['/GPU:0', '/GPU:1'] (a MirroredStrategy over them), a tf.distribute.Strategy (MirroredStrategy, "
                "MultiWorkerMirroredStrategy or OneDeviceStrategy), or None (TensorFlow places the check)")


def _unsupported(strategy) -> str | None:
    from tensorflow.python.distribute import central_storage_strategy, parameter_server_strategy_v2, tpu_strategy

    for module, name in ((tpu_strategy, "TPUStrategy"), (parameter_server_strategy_v2, "ParameterServerStrategyV2"),
                         (central_storage_strategy, "CentralStorageStrategy")):
        if isinstance(strategy, getattr(module, name)):
            return name
    return None


def validate_device(device):
    """``device=`` as the engine reads it: None, one device name (str), a tuple of device names (a MirroredStrategy
    over them) or a supported ``tf.distribute.Strategy``; a ``TypeError`` / ``ValueError`` naming ``device=``, its
    accepted forms and the devices this machine has, for anything else."""
    if device is None:
        return None
    if isinstance(device, tf.distribute.Strategy):
        name = _unsupported(device)
        if name is not None:
            raise ValueError(f"device={name} is not supported: fastcheck spreads its batched evaluations over the "
                             "replicas of a MirroredStrategy, MultiWorkerMirroredStrategy or OneDeviceStrategy.")
        return device
    if isinstance(device, str):
        _resolve(device, f"device={device!r}", one=False)
        return device
    if not isinstance(device, (list, tuple)):
        raise TypeError(f"device={device!r} is not valid: pass {DEVICE_FORMS}.")
    names = tuple(device)
    if not names:
        raise ValueError(f"device={device!r} is empty: pass at least one device name, e.g. ['/GPU:0', '/GPU:1'], "
                         "or None.")
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"device={list(names)!r}: {name!r} is not a device name; pass strings such as '/GPU:0'.")
    resolved = [_resolve(name, f"device={list(names)!r}: {name!r}", one=True) for name in names]
    duplicates = sorted({n for n, r in zip(names, resolved) if resolved.count(r) > 1})
    if duplicates:
        raise ValueError(f"device={list(names)!r} names a device more than once ({', '.join(duplicates)}); "
                         "pass each device once.")
    return names


def _resolve(name: str, said: str, one: bool) -> str | None:
    """The device of this machine that ``name`` names (``one``: it must name a type and an index, as a replica
    does); None for a name without a device type (a job or task only)."""
    available = [d.name for d in tf.config.list_logical_devices()]
    try:
        spec = tf.DeviceSpec.from_string(name)
    except ValueError as error:
        raise ValueError(f"{said} is not a device name ({error}); the devices here are {', '.join(available)}.") \
            from None
    if one and (spec.device_type is None or spec.device_index is None):
        raise ValueError(f"{said} does not name one device (a type and an index, e.g. '/GPU:0'); the devices here "
                         f"are {', '.join(available)}.")
    if spec.device_type is None:
        return None
    matches = [d for d in available if tf.DeviceSpec.from_string(d).device_type == spec.device_type.upper()
               and (spec.device_index is None or tf.DeviceSpec.from_string(d).device_index == spec.device_index)]
    if not matches:
        raise ValueError(f"{said} does not exist on this machine (devices: {', '.join(available)}); pass "
                         + ("some of those." if one else "one of those, or device=None to let TensorFlow place "
                            "the check."))
    return matches[0]


# Tunables of ``tables`` overridden within a ``tunables`` block (a test seam: tests reach a branch -- coloured
# mode's sampled noise, its sparse report, a check too large to hold -- on a small problem).
_overrides: dict = {}


@contextlib.contextmanager
def tunables(**overrides):
    """Within the block, every check reads these tunables of ``fastcheck/engine/tables.py`` (those in ``CONFIGURABLE``)
    instead of the table's values; the values before the block are back after it."""
    for name, value in overrides.items():
        if name not in _tables.CONFIGURABLE:
            raise ValueError(f"tunables({name}=...): {name!r} is not a tunable a check reads; pass some of "
                             f"{', '.join(sorted(_tables.CONFIGURABLE))}.")
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                or not np.isfinite(value) or value < 0:
            raise ValueError(f"tunables({name}={value!r}) is not valid: pass a finite number >= 0 "
                             f"(the default is {getattr(_tables, name)!r}).")
    global _overrides
    before, _overrides = _overrides, {**_overrides, **overrides}
    try:
        yield
    finally:
        _overrides = before


def tunable(name: str):
    """The tunable ``name`` of ``tables``, or its override within a ``tunables`` block."""
    return _overrides.get(name, getattr(_tables, name))


# Options earlier versions took, and what replaces each (passing one is a TypeError that says so).
REMOVED_OPTIONS = {
    "calibration": "routing is decided from the check's own inputs (sizes, f's counted call cost and graph), so "
                   "there is nothing to calibrate; drop calibration=",
    "time_budget": "mode='auto' decides from the check's sizes and predicted cost; pass mode='full', 'coloured' or "
                   "'fast' to choose the mode yourself",
    "tables": "fastcheck's tunables are constants (fastcheck/engine/tables.py); tests may override some within "
              "fastcheck.testing.tunables(...)",
    "strategy": "device= takes the strategy: pass device=strategy (a tf.distribute.Strategy)",
    "devices": "device= takes the list: pass device=['/GPU:0', '/GPU:1'] for a MirroredStrategy over those devices",
}


# Fields no public entry point takes as an option (``CheckConfig.options``).
INTERNAL_FIELDS = frozenset({"absolute_step"})


@dataclasses.dataclass(frozen=True)
class CheckConfig:
    """Everything that decides how a check runs; frozen and hashable.  ``None`` fields: "derive from the dtype
    tables"."""

    eps: float | None = None
    atol: float | None = None
    rtol: float | None = None
    jit_compile: Any = "auto"
    memory_budget: int | None = None
    # Where the check runs (``validate_device``): None, one device name (``pinned``), a tuple of device names (a
    # MirroredStrategy over them) or a tf.distribute.Strategy, whose replicas share the batched evaluations.
    device: Any = None
    precision: str = "auto"
    mode: str = "auto"
    probes: int = DEFAULT_PROBES
    seed: int = 0
    order: int = 1
    progress: bool | None = None
    autodiff: str = "auto"
    # The Jacobian's sparsity pattern for mode="coloured" (see ``pattern.GivenSparsity``); normalised, identity-hashed.
    sparsity: Any = None
    # eps is every element's absolute step (``compute_gradient``'s delta), not a relative one
    absolute_step: bool = False

    def __post_init__(self):
        object.__setattr__(self, "sparsity", given(self.sparsity))
        object.__setattr__(self, "device", validate_device(self.device))
        for name in ("eps", "atol", "rtol"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating))):
                raise TypeError(f"{name}={value!r} is not a number: pass a finite positive float, or None for the dtype default.")
            if value is not None and (not np.isfinite(value) or value < 0 or (name == "eps" and value == 0)):
                raise ValueError(f"{name}={value!r} is not valid: pass a finite positive number, or None for the dtype default.")
        if self.absolute_step and self.eps is None:
            raise ValueError("absolute_step=True takes its step from eps: pass eps= as well.")
        if self.jit_compile not in ("auto", True, False):
            raise ValueError(f"jit_compile={self.jit_compile!r} is not valid: pass 'auto', True or False.")
        if self.memory_budget is not None and (not isinstance(self.memory_budget, (int, np.integer)) or self.memory_budget <= 0):
            raise ValueError(f"memory_budget={self.memory_budget!r} is not valid: pass a positive number of bytes, e.g. 1 << 30.")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} is not valid: pass one of {PRECISIONS}.")
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is not valid: pass one of {MODES}.")
        if not isinstance(self.probes, (int, np.integer)) or self.probes < 1:
            raise ValueError(f"probes={self.probes!r} is not valid: pass a positive number of random probes, e.g. 4.")
        if self.order not in (1, 2):
            raise ValueError(f"order={self.order!r} is not valid: pass 1 (gradients) or 2 (gradients of gradients).")
        if self.autodiff not in AUTODIFF:
            raise ValueError(f"autodiff={self.autodiff!r} is not valid: pass one of {AUTODIFF}.")
        if self.autodiff in ("forward", "both") and self.mode in ("fast", "coloured"):
            raise ValueError(f"autodiff={self.autodiff!r} asks for forward-mode (JVP) Jacobians element by element, which "
                             f"only mode='full' computes; mode={self.mode!r} judges the reverse-mode gradient (what "
                             "training uses): pass mode='full', or autodiff='reverse'.")
        if self.sparsity is not None and self.mode in ("full", "fast"):
            raise ValueError(f"sparsity= gives the Jacobian's pattern to coloured mode, but mode={self.mode!r} does not "
                             "read it (full mode checks every element, fast mode random directions): pass "
                             "mode='coloured' (or 'auto'), or drop sparsity=.")
        if self.progress not in (None, True, False):
            raise ValueError(f"progress={self.progress!r} is not valid: pass True, False or None (on a terminal only).")

    @property
    def pinned(self) -> str | None:
        """The one device the check is pinned to (``device`` as a name); None where TensorFlow places it or replicas
        share it."""
        return self.device if isinstance(self.device, str) else None

    @property
    def budget(self) -> int:
        return int(self.memory_budget or DEFAULT_MEMORY_BUDGET)

    def twin_applies(self, plan) -> bool:
        """Whether a pass too coarse for a 1% error may be judged again through the gradient's float64 twin
        (``block.twinned``, ``fast._Probes.twinned``): the numerical side computes in float64, the analytical side below it,
        and atol is the table's (a user's atol is the user's rule)."""
        return bool(plan.eval_upcast and plan.precision != "float64" and self.atol is None)

    def twin_tolerances(self) -> tuple[float, float]:
        """float64's rule for the twin: the table's atol, and the user's rtol where given (a relative statement)."""
        row = DEFAULT_TOLERANCES["float64"]
        return float(row["atol"]), float(row["rtol"] if self.rtol is None else self.rtol)

    def tolerances(self, precision: str) -> tuple[float, float]:
        """(atol, rtol): the user's, else the table row of the precision the analytical side computes in."""
        table = DEFAULT_TOLERANCES[precision]
        atol = table["atol"] if self.atol is None else self.atol
        rtol = table["rtol"] if self.rtol is None else self.rtol
        return float(atol), float(rtol)

    def step(self, noise_epsilon: float) -> float:
        """Relative step: ``eps``, else the cube root of the evaluations' relative noise (the machine epsilon of the
        evaluation dtype, or the measured noise when larger)."""
        return float(self.eps) if self.eps is not None else noise_epsilon ** (1.0 / 3.0)

    def table(self, name: str):
        """The tunable ``name`` of ``tables``, or its override within a ``tunables`` block."""
        return tunable(name)

    def options(self) -> dict:
        """The configuration as the keyword options of the public entry points (without ``absolute_step``, which
        only ``compute_gradient``'s delta sets)."""
        return {name: value for name, value in self.__dict__.items() if name not in INTERNAL_FIELDS}

    def replace(self, **overrides) -> CheckConfig:
        return dataclasses.replace(self, **overrides)

    @property
    def compiled_key(self) -> tuple:
        """The fields compiled kernels depend on: steps, tolerances and modes are arguments or host-side, so changing
        them reuses the kernels (the path and chunk are in each kernel's key)."""
        return (self.jit_compile, self.pinned)


def memory_limit(config: CheckConfig) -> tuple[int, str]:
    """The bytes a check may hold (full Jacobians, coloured mode's twin): the larger of memory_budget and
    HELD_MEMORY_FLOOR (4 GiB), but never more than the memory this machine has free (the full Jacobians are not the
    batched evaluations memory_budget sizes, so the budget alone would forbid common checks)."""
    floor = int(config.table("HELD_MEMORY_FLOOR"))
    limit, what = max(config.budget, floor), f"the larger of memory_budget and {floor / 2**30:.3g} GiB"
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not Linux: no reading
        return limit, what
    if free < limit:
        return int(free), "this machine's free memory"
    return limit, what
