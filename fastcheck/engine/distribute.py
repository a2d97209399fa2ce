"""Checks spread over the replicas of a ``tf.distribute`` strategy (``device=`` a strategy or a list of devices).

The executor's chunk loop hands each chunk to ``Share.wave``, which splits its items (perturbations, colour
directions, rows) into one contiguous share per replica, in replica order, each share at most
``ceil(chunk / replicas)`` items (the batched evaluations in flight together use what one device's chunk used):

* **local replicas** (``MirroredStrategy``, ``OneDeviceStrategy``, the local devices of a worker): one thread per
  device calls the caller's ``call`` under ``tf.device(replica)``; TensorFlow releases the GIL while a kernel runs,
  so the devices compute at the same time, and each share lands in its place in the caller's arrays.
* **several workers** (``MultiWorkerMirroredStrategy``): each worker computes the shares of its own replicas, their
  kernel outputs are all-gathered (a collective ``all_gather`` over ``strategy.run``, float64 on the wire, which
  every float dtype round-trips exactly), and every worker then replays the caller's ``call`` for every share in
  order with the gathered outputs in place of the kernel's (``Executor.kernel`` answers through a thread-local
  ``Tap``).  Every worker thus holds the same numbers and writes the same report.  A small header gathered first
  checks that all workers are at the same step (same evaluation, items, chunk, path) and carries their errors, so
  an out-of-memory halving happens on all of them together and a worker that diverged raises instead of hanging.

Each wave's work per replica is logged at DEBUG on the ``fastcheck`` logger.  ``None`` (the default) leaves the
executor exactly as it was: no thread, no device scope, no collective.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import zlib
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from fastcheck.engine.paths import EAGER
from fastcheck.engine.raised import Raised
from fastcheck.engine.tables import COLLECTIVE_TIMEOUT_SECONDS
from fastcheck.report.events import EagerUnsplit, PathsDiffer

_log = logging.getLogger(__name__)
_OK, _OUT_OF_MEMORY, _FAILED = 0, 1, 2


# -- the strategy's replicas ----------------------------------------------------------


class Spread:
    """How one strategy's replicas share batched work; one per strategy, reused by every check."""

    def __init__(self, strategy: tf.distribute.Strategy):
        self.strategy = strategy
        self.kind = ("MultiWorkerMirroredStrategy" if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
                     else type(strategy).__name__)
        self.devices = tuple(strategy.extended.worker_devices)  # this worker's replicas
        self.replicas = int(strategy.num_replicas_in_sync)
        self.multi = self.replicas > len(self.devices)
        self.pool = (concurrent.futures.ThreadPoolExecutor(len(self.devices), thread_name_prefix="fastcheck-replica")
                     if len(self.devices) > 1 else None)
        self.ids = list(range(len(self.devices)))  # global replica id of each local replica
        self._gather: Callable | None = None
        if self.multi:
            ids: list[int] = []

            def record(context):
                ids.append(int(context.replica_id_in_sync_group))
                return tf.zeros([])

            strategy.experimental_distribute_values_from_function(record)
            self.ids = ids
            self.workers = self.replicas // len(self.devices)
            options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=COLLECTIVE_TIMEOUT_SECONDS)

            def gather_replica(vector):
                context = tf.distribute.get_replica_context()
                return context.all_gather(tf.identity(vector), axis=0, options=options)

            self._gather = tf.function(lambda values: strategy.run(gather_replica, args=(values,)), autograph=False)

    def where(self) -> str:
        if self.multi:
            return f"{self.replicas} replicas on {self.workers} workers ({self.kind})"
        names = ", ".join(tf.DeviceSpec.from_string(d).to_string().rsplit("device:", 1)[-1] for d in self.devices)
        return f"{self.replicas} replica{'s' * (self.replicas != 1)} ({self.kind} on {names})"

    def shares(self, start: int, count: int) -> list[tuple[int, int]]:
        """(first item, items) of each replica's share of [start, start + count), in replica order."""
        per = math.ceil(count / self.replicas)
        return [(start + r * per, max(0, min(per, count - r * per))) for r in range(self.replicas)]

    def sub_chunk(self, chunk: int) -> int:
        return max(1, math.ceil(chunk / self.replicas))

    # -- running calls on the local replicas --------------------------------------

    def locally(self, jobs: list) -> list:
        """Run ``job()`` for each (device index, job) under its device, at the same time; results in order.

        Every job finishes before any error is raised (a retry never overlaps a running call); the first error in
        replica order is raised.
        """

        def placed(index, job):
            with tf.device(self.devices[index]):
                return job()

        if self.pool is None or len(jobs) < 2:
            return [placed(i, job) for i, job in jobs]
        futures = [self.pool.submit(placed, i, job) for i, job in jobs]
        concurrent.futures.wait(futures)
        return [future.result() for future in futures]

    # -- across workers ------------------------------------------------------------

    def all_gather(self, vectors: list[np.ndarray]) -> np.ndarray:
        """[replicas, L] float64: each local replica's vector (``vectors[i]`` for local replica i), gathered from
        every worker in global replica order."""
        local = {g: i for i, g in enumerate(self.ids)}
        values = self.strategy.experimental_distribute_values_from_function(
            lambda context: tf.constant(vectors[local[int(context.replica_id_in_sync_group)]][None], tf.float64))
        assert self._gather is not None, "all_gather is for strategies across workers"
        out = self._gather(values)
        return self.strategy.experimental_local_results(out)[0].numpy()


_SPREADS: dict = {}
_LOCK = threading.Lock()


def spread_for(config) -> Spread | None:
    """The ``Spread`` of ``config.device`` when it spreads the check: a strategy, or a tuple of device names (a
    MirroredStrategy over them, made once per tuple); None for one device."""
    device = config.device
    if device is None or isinstance(device, str):
        return None
    if type(device).__name__ == "_DefaultDistributionStrategy":
        return None  # tf.distribute.get_strategy() outside any scope: one device, as without a strategy
    key = ("devices", device) if isinstance(device, tuple) else ("strategy", id(device))
    with _LOCK:
        if key not in _SPREADS:
            strategy = tf.distribute.MirroredStrategy(list(device)) if isinstance(device, tuple) else device
            _SPREADS[key] = (strategy, Spread(strategy))  # the strategy is held: its id stays its own
        return _SPREADS[key][1]


# -- one check's share of the work: waves, taps, its log ---------------------------------


def signature(*parts) -> float:
    """A number that two workers at the same step agree on (exact in float64)."""
    return float(zlib.crc32(repr(parts).encode()))


class Tap:
    """What ``Executor.kernel`` hands out while a share is recorded or replayed (thread-local)."""

    def __init__(self, replay=None):
        self.replay = replay  # the kernel's outputs to hand back instead of running it
        self.outputs = None  # the outputs a recorded kernel call produced

    def wrap(self, kernel):
        def tapped(*args, **kwargs):
            if self.replay is not None:
                return self.replay
            self.outputs = kernel(*args, **kwargs)
            return self.outputs

        return tapped


def _pack(outputs) -> tuple[np.ndarray, list]:
    leaves = tf.nest.flatten(outputs)
    layout = [(tuple(leaf.shape), leaf.dtype) for leaf in leaves]
    flat = [np.asarray(leaf.numpy() if hasattr(leaf, "numpy") else leaf).astype(np.float64).reshape(-1) for leaf in leaves]
    return (np.concatenate(flat) if flat else np.zeros(0)), layout


def _unpack(vector: np.ndarray, structure, layout: list):
    leaves, offset = [], 0
    for shape, dtype in layout:
        size = int(np.prod(shape, dtype=np.int64))
        leaves.append(tf.constant(vector[offset : offset + size].reshape(shape), dtype))
        offset += size
    return tf.nest.pack_sequence_as(structure, leaves)


class Share:
    """One check's use of a ``Spread``: runs waves of the executor's chunk loop and logs the work per replica;
    where f does not run over the replicas, the report's note (``events``)."""

    def __init__(self, spread: Spread, events: list):
        self.spread, self.events = spread, events
        self.tap = threading.local()
        self.eager_note = False

    def current_tap(self) -> Tap | None:
        return getattr(self.tap, "value", None)

    def _logged(self, label: str, counts: list, each_worker: bool = False) -> None:
        _log.debug("%s over %s: %s%s", label, self.spread.where(), " / ".join(map(str, counts)),
                   " on each worker" if each_worker else "")

    def wave(self, label: str, call, sub: int, start: int, count: int, what: str) -> list:
        """``call(sub, part, n)`` for each replica's share of items [start, start + count): results in order."""
        shares = self.spread.shares(start, count)
        if not self.spread.multi:
            jobs = [(r, lambda b=b, n=n: call(sub, slice(b, b + n), n)) for r, (b, n) in enumerate(shares) if n > 0]
            results = self.spread.locally(jobs)
            self._logged(label, [n for _, n in shares])
            return results
        return self._across(label, call, sub, start, count, shares, what)

    def _across(self, label, call, sub, start, count, shares, what) -> list:
        spread = self.spread

        def record(b, n) -> tuple[Tap | None, BaseException | None]:
            tap = Tap()
            self.tap.value = tap
            try:
                call(sub, slice(b, b + n), n)
            except (Exception, Raised) as error:  # reported to every worker through the header (f's own: re-raised here)
                return None, error
            finally:
                self.tap.value = None
            return tap, None

        jobs = []
        for i, g in enumerate(spread.ids):
            b, n = shares[g]
            # A replica with no items computes the first one anyway (its result unused): every worker brings a
            # payload of the same layout to the collective.
            jobs.append((i, lambda b=b if n else start, n=n or 1: record(b, n)))
        outcomes = spread.locally(jobs)
        taps, errors = [tap for tap, _ in outcomes], [error for _, error in outcomes]
        status = _OK
        for error in errors:
            if error is not None:
                status = max(status, _OUT_OF_MEMORY if isinstance(error, tf.errors.ResourceExhaustedError) else _FAILED)
        vectors: list[np.ndarray] = []
        layout: list = []
        structure = None
        if status == _OK:
            for tap in taps:
                vector, layout = _pack(tap.outputs)
                structure = tap.outputs
                vectors.append(vector)
        length = len(vectors[0]) if vectors else 0
        step = signature(what, label, start, count, sub)
        header = spread.all_gather([np.array([step, status, length], np.float64) for _ in spread.ids])
        if np.any(header[:, 1] != _OK):
            mine = next((e for e in errors if e is not None), None)
            if mine is not None:
                raise mine
            if np.any(header[:, 1] == _OUT_OF_MEMORY):
                raise tf.errors.ResourceExhaustedError(None, None, "another worker ran out of memory")
            raise RuntimeError(f"another worker failed evaluating {what} (see its log); this worker stops too.")
        if np.any(header[:, 0] != header[0, 0]) or np.any(header[:, 2] != header[0, 2]):
            raise RuntimeError(
                f"the workers of the {spread.kind} are at different steps of the check ({what}): each worker must "
                "run the same check on the same inputs; pin the choices a worker's free memory decides with mode= and "
                "jit_compile=.")
        gathered = spread.all_gather(vectors)
        results = []
        for g, (b, n) in enumerate(shares):
            if n == 0:
                continue
            self.tap.value = Tap(replay=_unpack(gathered[g], structure, layout))
            try:
                results.append(call(sub, slice(b, b + n), n))
            finally:
                self.tap.value = None
        self._logged(label, [n for _, n in shares])
        return results

    def agree_on_path(self, path: str, what: str, total: int) -> str:
        """The path every worker takes for this batched evaluation (eager where they differ); on the eager path, a
        note that f runs on one device, unsplit."""
        agreed = path
        if self.spread.multi:
            code = 0.0 if path == EAGER else float(zlib.crc32(path.encode()))
            header = self.spread.all_gather([np.array([signature(what, total), code], np.float64)
                                             for _ in self.spread.ids])
            if np.any(header[:, 0] != header[0, 0]):
                raise RuntimeError(
                    f"the workers of the {self.spread.kind} are at different steps of the check ({what}): each worker "
                    "must run the same check on the same inputs; pin the choices a worker's free memory decides with mode= and "
                    "jit_compile=.")
            if np.any(header[:, 1] != header[0, 1]):
                agreed = EAGER
                self.events.append(PathsDiffer(what))
        if agreed == EAGER and not self.eager_note:
            self.eager_note = True
            self.events.append(EagerUnsplit(what, bool(self.spread.multi)))
        return agreed

    def local_wave(self, label: str, call, chunk: int, start: int, total: int) -> int:
        """``call(sub, part, n)`` for the items of one chunk from ``start`` (of ``total``), split over this
        worker's local replicas (the reverse-mode rows: every worker computes all of them); the items done."""
        spread = self.spread
        local = len(spread.devices)
        sub = max(1, math.ceil(chunk / local))
        count = min(sub * local, total - start)
        per = math.ceil(count / local)
        jobs = [(i, lambda b=start + i * per, n=min(per, count - i * per): call(sub, slice(b, b + n), n))
                for i in range(local) if count - i * per > 0]
        spread.locally(jobs)
        self._logged(label, [max(0, min(per, count - i * per)) for i in range(local)], spread.multi)
        return count
