"""Check configuration and the per-dtype tables every other module reads.

Steps and tolerances are data, kept here in one place:

* The finite-difference step for element ``x_j`` is ``h_j = eps * max(1, |x_j|)``
  where ``eps`` defaults to ``machine_epsilon(dtype) ** (1/3)`` of the dtype the
  numerical side is *evaluated* in (the least precise floating dtype on the
  path: inputs and outputs).  ``eps**(1/3)`` balances the O(h^2) truncation
  error of central differences against the O(eps/h) rounding error.
* Tolerances come from the dtype of the *analytical* side (the user's dtype),
  because that is the computation being judged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

DEFAULT_MEMORY_BUDGET = 1 << 30  # bytes

# Machine epsilon per dtype, as data (bfloat16 is not a numpy dtype).
MACHINE_EPSILON = {
    tf.float16: float(np.finfo(np.float16).eps),
    tf.bfloat16: 2.0**-7,
    tf.float32: float(np.finfo(np.float32).eps),
    tf.float64: float(np.finfo(np.float64).eps),
}

# Default tolerances of the analytical side, by its dtype.  The element-wise
# rule is |analytical - numerical| <= atol + rtol * |numerical| + noise, where
# noise is the numerical side's own error estimate (see _compare.py).
DEFAULT_TOLERANCES = {
    tf.float16: {"atol": 1e-2, "rtol": 1e-2},
    tf.bfloat16: {"atol": 5e-2, "rtol": 5e-2},
    tf.float32: {"atol": 1e-5, "rtol": 1e-4},
    tf.float64: {"atol": 1e-8, "rtol": 1e-6},
}

PRECISIONS = ("auto", "native", "float64")
MODES = ("auto", "full", "fast")
DEFAULT_PROBES = 4


def real_dtype(dtype: tf.DType) -> tf.DType:
    """The real dtype behind ``dtype`` (complex64 -> float32, ...)."""
    dtype = tf.as_dtype(dtype)
    return dtype.real_dtype if dtype.is_complex else dtype


def least_precise(dtypes) -> tf.DType:
    """The floating dtype with the largest machine epsilon among ``dtypes``."""
    reals = [real_dtype(d) for d in dtypes if tf.as_dtype(d).is_floating or tf.as_dtype(d).is_complex]
    return max(reals, key=lambda d: MACHINE_EPSILON[d])


def most_precise(dtypes) -> tf.DType:
    reals = [real_dtype(d) for d in dtypes if tf.as_dtype(d).is_floating or tf.as_dtype(d).is_complex]
    return min(reals, key=lambda d: MACHINE_EPSILON[d])


def default_step(dtype: tf.DType) -> float:
    return MACHINE_EPSILON[real_dtype(dtype)] ** (1.0 / 3.0)


@dataclasses.dataclass(frozen=True)
class CheckConfig:
    """Everything that decides how a check runs; frozen and hashable.

    ``None`` fields mean "derive from the dtype tables".
    """

    eps: float | None = None
    atol: float | None = None
    rtol: float | None = None
    jit_compile: Any = "auto"
    memory_budget: int | None = None
    device: str | None = None
    precision: str = "auto"
    mode: str = "auto"
    probes: int = DEFAULT_PROBES
    seed: int = 0
    order: int = 1
    progress: bool | None = None

    def __post_init__(self):
        for name in ("eps", "atol", "rtol"):
            value = getattr(self, name)
            if value is not None and (not np.isfinite(value) or value < 0 or (name == "eps" and value == 0)):
                raise ValueError(f"{name}={value!r} is not valid: pass a finite positive number, or None for the dtype default.")
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
        if self.progress not in (None, True, False):
            raise ValueError(f"progress={self.progress!r} is not valid: pass True, False or None (on a terminal only).")

    @property
    def budget(self) -> int:
        return int(self.memory_budget or DEFAULT_MEMORY_BUDGET)

    def tolerances(self, analytical_dtype: tf.DType) -> tuple[float, float]:
        table = DEFAULT_TOLERANCES[real_dtype(analytical_dtype)]
        atol = table["atol"] if self.atol is None else self.atol
        rtol = table["rtol"] if self.rtol is None else self.rtol
        return float(atol), float(rtol)

    def step(self, eval_dtype: tf.DType) -> float:
        return float(self.eps) if self.eps is not None else default_step(eval_dtype)

    def replace(self, **overrides) -> CheckConfig:
        return dataclasses.replace(self, **overrides)

    @property
    def compiled_key(self) -> CheckConfig:
        """The fields compiled kernels depend on (progress, probes and seed do not matter)."""
        return dataclasses.replace(self, progress=None, probes=DEFAULT_PROBES, seed=0, mode="auto")
