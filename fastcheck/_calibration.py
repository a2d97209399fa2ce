"""Routing's costs as a value: what an eager call and a trace cost on this machine, learnt from checks.

``_paths.choose_route`` predicts with a ``Calibration``; nothing here imports the configuration or the routing that
read it (no import cycle: ``_config`` validates ``calibration=`` against this class).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
import typing

import numpy as np
import tensorflow as tf

from fastcheck._tables import (
    CACHE_BYTES,
    CLOSE_CALL,
    EAGER_LEARN_SECONDS,
    FIRST_TRACE_SECONDS,
    REFERENCE_DISPATCH,
    TRACE_CALLS,
    TRACE_SECONDS,
    VJP_CALLS,
)

if typing.TYPE_CHECKING:
    from fastcheck._paths import Route
    from fastcheck._plan import Plan

# The eager path (``_paths.EAGER``): its checks' costs are learnt apart from traced ones.
EAGER = "eager"


@functools.lru_cache(maxsize=1)
def measured_dispatch() -> float:
    """Seconds of one eager dispatch of a small op on this machine (measured once per process)."""
    one = tf.constant(1.0)
    tf.raw_ops.AddV2(x=one, y=one)  # the first call pays kernel lookup
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(20):
            tf.raw_ops.AddV2(x=one, y=one)
        times.append((time.perf_counter() - start) / 20)
    return min(times)


@functools.lru_cache(maxsize=64)  # every check's routing reads the same few ratios, several times
def _geometric_mean(ratios: tuple[float, ...]) -> float:
    return float(np.exp(np.mean(np.log(ratios)))) if ratios else 1.0


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Routing's costs, measured rather than assumed, as a value.

    A check receives one (``CheckConfig.calibration``; default: the process's shared one, ``shared_calibration()``)
    and returns what it learnt as a new one (``GradientReport.calibration``), which ``_check.run_check`` keeps as
    the shared one when the check used it.

    * ``dispatch``: the eager dispatch time of one small op (None: this machine's, ``measured_dispatch``).
    * ``cache``: bytes of the CPU's last-level cache (None: this machine's, ``cache_bytes``).
    * ``traced``: whether a fastcheck kernel was traced before (the first trace in a process pays TensorFlow's
      warm-up, FIRST_TRACE_SECONDS).
    * ``eager_ratios``, ``traced_ratios``: actual/predicted seconds of the last ``WINDOW`` checks that ran eagerly
      or traced; their geometric mean (``scale``) multiplies later predictions: a machine whose tracing is slower
      than the constants say routes more checks eagerly, and the reverse.
    """

    dispatch: float | None = None
    cache: int | None = None
    traced: bool = False
    eager_ratios: tuple[float, ...] = ()
    traced_ratios: tuple[float, ...] = ()

    WINDOW: typing.ClassVar[int] = 8

    @property
    def dispatch_seconds(self) -> float:
        return measured_dispatch() if self.dispatch is None else self.dispatch

    @property
    def cache_size(self) -> int:
        return cache_bytes() if self.cache is None else self.cache

    def ratios(self, kind: str) -> tuple[float, ...]:
        return self.eager_ratios if kind == EAGER else self.traced_ratios

    def scale(self, kind: str) -> float:
        return _geometric_mean(self.ratios(kind))

    def learn(self, kind: str, predicted: float, actual: float) -> Calibration:
        """This calibration with ``actual / predicted`` seconds of a ``kind`` ("eager", "traced") check learnt."""
        if not (predicted > 0 and actual > 0):
            return self
        ratios = (*self.ratios(kind), actual / predicted)[-self.WINDOW :]
        if kind == EAGER:
            return dataclasses.replace(self, eager_ratios=ratios)
        return dataclasses.replace(self, traced_ratios=ratios)

    def after_trace(self) -> Calibration:
        """This calibration once a kernel has been traced in the process."""
        return self if self.traced else dataclasses.replace(self, traced=True)

    def predict(self, plan: Plan, loops: tuple = ()) -> tuple[float, float]:
        """(eager loop, traced) seconds predicted for a full check of ``plan``; ``loops``: the eager loops' calls of f
        and VJPs where f's pattern colours them (``_eager_colours.loops``), else 2n and min(n, m)."""
        calls, vjps = loops or (2 * plan.n, 1 if plan.m == 1 else min(plan.n, plan.m))
        eager = (calls + VJP_CALLS * vjps + 1) * plan.call_seconds
        traced = self.tracing() + TRACE_CALLS * plan.call_seconds * self.scale("traced")
        return eager * self.scale(EAGER), traced

    def tracing(self) -> float:
        """Seconds predicted for tracing a check's kernels (the first trace in a process pays TensorFlow's warm-up)."""
        # Tracing is Python-side work, but it grows less than eager dispatch does (a machine at 3.5x the reference
        # dispatch traced at 2.3x the reference's time): hence the square root.  Clipped: one measurement under a
        # momentary load must not make tracing look 100x dearer.
        machine = min(max((self.dispatch_seconds / REFERENCE_DISPATCH) ** 0.5, 0.5), 4.0)
        return (TRACE_SECONDS + (0.0 if self.traced else FIRST_TRACE_SECONDS)) * machine * self.scale("traced")

    def learn_from(self, route: Route, path: str, seconds: float) -> Calibration:
        """This calibration after a finished check: ``seconds`` spent on routing and both Jacobians on ``path``.

        An eager check teaches only when its predicted loop is long enough (EAGER_LEARN_SECONDS) for the calls of f
        to dominate: a check of a few calls costs a few milliseconds of fixed work (plan, comparison, report) the
        per-call model leaves out, and learning from it would scale every later eager prediction up 5-20x.  A traced
        check teaches only when the call was close (predictions within CLOSE_CALL of each other): there the batched
        run is small next to tracing, which is what the traced prediction models; a long sweep would read as slow
        tracing.
        """
        eager, traced = route.predicted
        if not eager or not traced or path != route.path:
            return self  # not predicted (jit_compile given), or a fallback changed the path
        # Ratios are against the uncorrected prediction, so the correction settles instead of drifting.
        if path == EAGER:
            if eager >= EAGER_LEARN_SECONDS * self.scale(EAGER):
                return self.learn(EAGER, eager / self.scale(EAGER), seconds)
        elif max(eager, traced) < CLOSE_CALL * min(eager, traced):
            return self.learn("traced", traced / self.scale("traced"), seconds)
        return self


# The process's calibration: what its checks learnt, for the checks that follow (the module-level default of
# ``CheckConfig.calibration``); only ``keep_shared`` replaces it.
_shared = Calibration()


def shared_calibration() -> Calibration:
    """The process's calibration: what the checks that used it learnt."""
    return _shared


def keep_shared(calibration: Calibration) -> None:
    """Make ``calibration`` the process's (``_check`` calls this once per check that used the shared one)."""
    global _shared
    _shared = calibration


@contextlib.contextmanager
def routing_calibration(calibration: Calibration | None = None):
    """Within the block, checks without ``calibration=`` route by ``calibration`` (default: a fresh ``Calibration()``)
    and learn into it; the process's own calibration is back after the block."""
    before = _shared
    keep_shared(Calibration() if calibration is None else calibration)
    try:
        yield
    finally:
        keep_shared(before)


@functools.lru_cache(maxsize=1)
def cache_bytes() -> int:
    """The largest data cache of this machine's CPUs at level 3 or above (Linux sysfs), else CACHE_BYTES."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    found = 0
    try:
        for entry in os.listdir(base):
            if not entry.startswith("index"):
                continue
            with open(os.path.join(base, entry, "level")) as level, open(os.path.join(base, entry, "type")) as kind, \
                    open(os.path.join(base, entry, "size")) as size:
                if int(level.read()) >= 3 and kind.read().strip() != "Instruction":
                    found = max(found, _bytes(size.read().strip()))
    except (OSError, ValueError):
        return CACHE_BYTES
    return found or CACHE_BYTES


def _bytes(text: str) -> int:
    """'32768K' -> 33554432 (sysfs cache sizes: a number with an optional K/M/G suffix)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale
