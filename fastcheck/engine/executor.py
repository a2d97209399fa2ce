"""The executor: every batched evaluation of f that a check makes goes through it.

It owns the execution state of one check -- the route (a frozen value, replaced when a path cannot run f), the
chunk sizes (halved when a call runs out of memory) and the fallbacks that become report notes -- and runs the one
chunk loop, ``chunked(batch, total, call, eager)``, falling back xla -> graph/loop -> loop -> eager as
``Route.following`` says.  Every strategy's batched evaluations go through it: full mode's differences (below),
fast mode's directions (``directions.Joint``), coloured mode's colours and VJPs (``coloured``).  Full mode's:

* ``differences(position, idx, delta)``: ``f(x + d_j e_j)`` and ``f(x - d_j e_j)`` for chosen (j, d_j) pairs of
  one input (full mode's columns, refinements), the one-hot perturbations built inside the kernel so no [2k, n]
  batch crosses from the host; it also returns the span actually taken, ``(x_j + d_j) - (x_j - d_j)`` in the
  evaluation dtype.
* ``quotients(position, idx, delta)``: the first sweep's difference quotients.

Both run as one ``vectorized_map`` (or ``map_fn`` on the loop path) per chunk.  Where routing says so
(``Route.joint_chunk``), the differences of every checked input go through one kernel whose rows carry all of them
(``_joint_kernel``): one trace and compile instead of one per input, which for a model of 39 variables was 90% of
the check.  The autodiff side (``autodiff``) runs its kernels under the same route and records its fallbacks here.
How the work ran (retries, the kernels the differences took, the eager loops' shortcuts) is logged at DEBUG.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import sys
import threading
import time
from collections.abc import Hashable

import numpy as np
import tensorflow as tf

from fastcheck.engine import diagonal, eager_colours, paths
from fastcheck.engine.config import MACHINE_EPSILON, CheckConfig, device_span, span, step_scale, tunable
from fastcheck.engine.distribute import Share, spread_for
from fastcheck.engine.kernels import FlatCall, cached, flat_call, pad, plan_key
from fastcheck.engine.paths import EAGER, GRAPH, LOOP, Route, compile_kernel, is_compile_failure
from fastcheck.engine.pfor import converted
from fastcheck.engine.plan import Plan, first_line, measure_precision, unstacked, view
from fastcheck.engine.precision import NOISE_SIDE, SEPARATE_INPUTS
from fastcheck.engine.tables import (
    BATCHED_ELEMENTS,
    BATCHED_FLOPS,
    LINE_MARGIN,
    LOOP_BATCH_ELEMENTS,
    MEMORY_SAFETY,
    NOISE_TABLES,
    PROGRESS_SECONDS,
)
from fastcheck.report.events import FellBack

_log = logging.getLogger(__name__)


class ShapeChangeError(ValueError):
    pass


@contextlib.contextmanager
def timed(timings: dict, stage: str):
    """Add the seconds spent inside to ``timings[stage]`` (the report's timings)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[stage] = timings.get(stage, 0.0) + time.perf_counter() - start


def evaluate_rows(plan: Plan, position: int, path: str, values, batch, flat_function=None):
    """f at each row of ``batch`` (values of input ``position``, flattened): flat outputs [rows, m].

    Traced code: one ``vectorized_map`` over the rows, or ``map_fn`` on the loop path, where it calls the probe's
    already-traced function so f is not traced twice.
    """
    shape, m = plan.eval_value(plan.inputs[position]).shape, plan.m

    def evaluate(row):
        moved = list(values)
        moved[position] = tf.reshape(row, shape)
        if path == LOOP and flat_function is not None:
            return tf.ensure_shape(flat_function(*moved), [m])
        return tf.ensure_shape(converted(plan.call_flat, moved, plan.eval_upcast), [m])

    if path == LOOP:
        return tf.map_fn(evaluate, batch, parallel_iterations=32, fn_output_signature=tf.TensorSpec([m], plan.eval_flat_dtype))
    return tf.vectorized_map(evaluate, batch)


def _differences_kernel(plan: Plan, position: int, chunk: int, path: str, flat_function=None, sides: bool = True):
    size = plan.inputs[position].size

    def kernel(values, idx, delta):
        flat = tf.reshape(values[position], [-1])
        perturbation = tf.one_hot(idx, size, dtype=flat.dtype) * delta[:, None]
        batch = tf.concat([flat[None] + perturbation, flat[None] - perturbation], axis=0)
        outs = evaluate_rows(plan, position, path, values, batch, flat_function)
        return _sides(outs, tf.gather(flat, idx), delta, chunk, sides)

    return compile_kernel(kernel, path, plan.autograph)


def _sides(outs, picked, delta, chunk: int, sides: bool):
    """A differences kernel's results from f at its [2 chunk] rows (x+ then x-) and the perturbed elements."""
    span = device_span(picked, delta, picked.dtype)
    # [m, chunk]: the Jacobian's own layout, so the host never transposes it.
    plus, minus = tf.transpose(outs[:chunk]), tf.transpose(outs[chunk:])
    if sides:
        return plus, minus, span
    # The quotient alone (the first sweep): half the host memory; subtracted in float64, where the difference of
    # two float32 values is exact.
    wide = tf.cast(span, tf.float64)
    return (tf.cast(plus, tf.float64) - tf.cast(minus, tf.float64)) / wide[None, :], wide


def _joint_kernel(plan: Plan, chunk: int, path: str, sides: bool = True):
    """The differences kernel of every checked input at once: ``idx`` indexes their flattened concatenation (in
    ``plan.checked`` order), so one trace serves all of them (``Route.joint_chunk``).

    Each row carries every checked input, the perturbed element moved as in the per-input kernel
    (``x + onehot * d``), the others plus zero; one ``vectorized_map`` over those rows.
    """
    specs, m = plan.checked, plan.m
    offsets = np.cumsum([0] + [s.size for s in specs])[:-1]

    def kernel(values, idx, delta):
        flats = [tf.reshape(values[s.position], [-1]) for s in specs]
        rows = []
        for spec, flat, offset in zip(specs, flats, offsets):
            # one_hot of an index outside [0, size) is all zeros: the input is not moved
            perturbation = tf.one_hot(idx - int(offset), spec.size, dtype=flat.dtype) * delta[:, None]
            rows.append(tf.concat([flat[None] + perturbation, flat[None] - perturbation], axis=0))

        def evaluate(batch):
            moved = list(values)
            for spec, row in zip(specs, batch):
                moved[spec.position] = tf.reshape(row, values[spec.position].shape)
            return tf.ensure_shape(converted(plan.call_flat, moved, plan.eval_upcast), [m])

        outs = tf.vectorized_map(evaluate, rows)
        return _sides(outs, tf.gather(tf.concat(flats, 0), idx), delta, chunk, sides)

    return compile_kernel(kernel, path, plan.autograph)


def _line_kernel(plan: Plan):
    """f at ``x + t s`` for t in ``ts`` and in ``-ts`` ([2 len(ts), m]): ``steps`` s holds one step per checked
    input (zeros for those not moved).  The noise tables of ``precision``: t and s are exact in every dtype (small
    integers, powers of two times 1..3), so each point is ``x + t s`` rounded once, as the host computes it.  A
    loop, one call of f per point."""
    m = plan.m

    def kernel(values, steps, ts):
        def evaluate(t):
            moved = list(values)
            for spec, s in zip(plan.checked, steps):
                v = values[spec.position]
                moved[spec.position] = v + tf.cast(t, v.dtype) * s
            return tf.ensure_shape(plan.call_flat(moved, plan.eval_upcast), [m])

        return tf.map_fn(evaluate, tf.concat([ts, -ts], axis=0), parallel_iterations=1,
                         fn_output_signature=tf.TensorSpec([m], plan.eval_flat_dtype))

    return compile_kernel(kernel, GRAPH, plan.autograph)


def measured(executor: Executor, plan: Plan, line=None) -> Plan:
    """``measure_precision(plan)``, each noise table one batched call (``line``, or the executor's ``noise_line``),
    else f called point by point: traced where the check's path is (a traced call of MobileNetV2 costs a tenth
    of an eager one), eagerly on the eager path."""
    if not executor.config.table("NOISE_LINE"):  # point by point, as asked
        line = None
    elif line is None:
        line = executor.noise_line()
    if executor.path == EAGER:
        return measure_precision(plan, line)
    try:  # tables the line does not take go point by point through f traced once
        # f as a traced function (one per check: the name keeps TensorFlow's retracing warning off it)
        traced = tf.function(lambda *args: plan.f(*args), autograph=executor.plan.autograph, reduce_retracing=True)
        measured_ = measure_precision(dataclasses.replace(plan, f=traced), line)
    except Exception:  # f traced for the batched kernels, but not on its own: measure it eagerly
        return measure_precision(plan)
    return dataclasses.replace(measured_, f=plan.f)


class Progress:
    """A tqdm bar for long batched sweeps: shown when asked, or on a terminal once the sweep is predicted (from its
    pace so far) to take more than PROGRESS_SECONDS."""

    def __init__(self, enabled: bool | None, total: int, unit: str):
        self.enabled, self.total, self.unit = enabled, total, unit
        self.done, self.start, self.bar = 0, time.perf_counter(), None

    def advance(self, count: int) -> None:
        self.done += count
        if self.bar is None and self.enabled is not False and self.done < self.total:
            elapsed = time.perf_counter() - self.start
            predicted = elapsed / self.done * self.total
            if self.enabled or (sys.stderr.isatty() and predicted > PROGRESS_SECONDS):
                from tqdm.auto import tqdm

                self.bar = tqdm(total=self.total, initial=self.done - count, unit=self.unit, desc="fastcheck",
                                leave=False, disable=False)
        if self.bar is not None:
            self.bar.update(count)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# Items per batched call above which the call raises ResourceExhaustedError before it runs (None: no limit), set by
# ``fastcheck.testing.out_of_memory``: a device with less memory than the chunk's footprint estimate.
_memory_items: int | None = None


@contextlib.contextmanager
def out_of_memory(above: int):
    """Within the block, every batched call of f over more than ``above`` items raises ``ResourceExhaustedError``
    before it runs; the limit before the block is back after it."""
    if isinstance(above, bool) or not isinstance(above, int) or above < 1:
        raise ValueError(f"out_of_memory(above=...) takes the items (perturbations, probes, rows) a call may hold, an "
                         f"integer >= 1; got {above!r}.")
    global _memory_items
    before, _memory_items = _memory_items, above
    try:
        yield
    finally:
        _memory_items = before


@dataclasses.dataclass(frozen=True)
class Batch:
    """What a batched evaluation tells ``Executor.chunked``: where its chunk is kept, where it starts, and the
    facts its notes and errors name."""

    what: str  # the evaluations, as a fallback note names them ("numerical differences")
    key: Hashable  # the executor keeps the chunk under it: a later batch of the key starts at the halved one
    chunk: int  # items per call, for a key the executor holds no chunk of yet
    subject: str  # what an out-of-memory note is about: the input moved, or the mode
    unit: str = "evaluations"  # what a call's items are, in that note
    item: str = "evaluation"  # what one item is, in the error when a single one does not fit
    advice: str = "pass mode='fast' or a smaller problem."  # that error's fix
    moves: str | None = None  # the input the items perturb (None: every checked input), when f's shape changes
    spread: bool = True  # replicas (device= spreads): split over them, on the path the workers agreed on
    local: bool = False  # replicas: each chunk split over this worker's local replicas, every worker taking all
    progress: bool = True  # a progress bar over a long batch


def joined(parts: list):
    """The chunks' results as one: tensors (or tuples of them) concatenated along the items, arrays likewise; None
    where the calls filled the caller's arrays (or there were none)."""
    if not parts or all(part is None for part in parts):
        return None
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], tuple):
        return tuple(joined(list(column)) for column in zip(*parts))
    if isinstance(parts[0], tf.Tensor):
        return tf.concat(parts, 0)
    return np.concatenate(parts)


class Executor:
    """Evaluates f in batches for one check; see the module docstring."""

    def __init__(self, plan: Plan, config: CheckConfig, route: Route):
        # Kernels trace f as the route's probe did: with AutoGraph only when f needs it.
        plan = dataclasses.replace(plan, autograph=route.autograph) if route.autograph != plan.autograph else plan
        self.plan, self.config, self.route = plan, config, route
        # Items per call of each batch (``Batch.key``; an input's position: its differences), written here only:
        # set by a batch's first call, halved on out-of-memory; read through ``chunk``.
        self.chunks: dict = dict(route.chunks)
        # The path's fallbacks, in order (``FellBack``, the replicas' ``PathsDiffer`` and ``EagerUnsplit``); the report
        # turns them into notes.  f that cannot be traced runs eagerly, its route says why.
        self.events: list = [FellBack(route.declined[0], route.path, "f", route.declined[1])] if route.declined else []
        # device= a strategy or device list: each chunk split over its replicas (``distribute``); None: one device.
        spread = spread_for(config)
        self.share = Share(spread, self.events) if spread is not None else None
        self._lock = threading.Lock()  # kernel lookups from the replicas' threads
        # What one check computes once and hands from mode choice to strategy (``once``: the coloured layout,
        # patterns and colourings); dies with the check, unlike the kernel cache.
        self.memo: dict = {}
        self._plan_key: tuple = (None, ())
        self.values = tuple(plan.eval_values())
        self.native = tuple(plan.native_values())
        # Full mode's differences through one kernel for every checked input (``_joint_kernel``), decided by
        # routing; not across workers, which must agree on every step.
        self.joint = route.joint_chunk > 0 and self.share is None
        self._offsets = dict(zip([s.position for s in plan.checked],
                                 itertools.accumulate([s.size for s in plan.checked], initial=0)))
        self._joint_chunks: dict = {}  # each input's own chunk, while the joint kernel's replaces it
        self._rented: dict = {}  # input position -> seconds its joint calls cost beyond its own kernel's (predicted)
        self._own: set = set()  # inputs whose differences have left the joint kernel for their own
        self._called: set = set()  # the joint kernels called once (traced)

    @property
    def path(self) -> str:
        return self.route.path

    def note(self, event) -> None:
        self.events.append(event)

    def fall_back(self, error: Exception, what: str) -> bool:
        """Move to the next path after ``error``; False when there is none (or the error is f's own)."""
        following = self.route.following
        if following is None or not is_compile_failure(error):
            return False
        self.note(FellBack(self.path, following, what, f"{type(error).__name__}: {first_line(error, 120)}"))
        self.route = dataclasses.replace(self.route, path=following)
        return True

    def once(self, key: str, make):
        """``make()`` for ``key``, made once per check: what mode choice finds and the strategy reuses (coloured
        mode's layout), what the eager loops learn of f (element-wise, f at x)."""
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]

    def kernel(self, key: tuple, make):
        """The compiled kernel for ``key`` under this check's plan, configuration and current path."""
        with self._lock:
            kernel = cached(self._cache_key(key), lambda: flat_call(make()))
        kernel = kernel.entry() if isinstance(kernel, FlatCall) else kernel
        tap = self.share.current_tap() if self.share is not None else None
        return kernel if tap is None else tap.wrap(kernel)  # across workers: recorded or replayed

    def _cache_key(self, key: tuple) -> tuple:
        """``plan_key`` (worked out once per plan: a kernel is looked up on every call) + the path + ``key``."""
        if self._plan_key[0] is not self.plan:
            self._plan_key = (self.plan, plan_key(self.plan, self.config))
        return self._plan_key[1] + (self.path, *key)

    # -- the chunk loop ---------------------------------------------------------

    def chunk(self, key) -> int | None:
        """Items per call that batches of ``key`` run at now (halved by each out-of-memory), None before any."""
        return self.chunks.get(key)

    def chunked(self, batch: Batch, total: int, call, eager):
        """Every batched evaluation of f: ``call(chunk, part, count)`` over chunks of ``total`` items.

        The chunk starts at what ``batch.key`` holds (``batch.chunk`` for a new key).  A call that runs out of memory
        halves it and is retried (logged); a path that cannot run f falls back to the next
        (``FellBack``) and the batch starts again there; on the eager path ``eager()`` runs instead.  With
        a ``device=`` that spreads (and ``batch.spread``) each chunk is split over the replicas.  Returns the calls'
        results joined (``joined``), or ``eager()``'s.
        """
        if self.share is not None and batch.spread:  # across workers: every worker takes the same path
            agreed = self.share.agree_on_path(self.path, batch.what, total)
            if agreed != self.path:
                self.route = dataclasses.replace(self.route, path=agreed)
        self.chunks.setdefault(batch.key, batch.chunk)
        while self.path != EAGER:
            try:
                return joined(self._chunks(batch, total, call))
            except ShapeChangeError:
                raise
            except Exception as error:
                if not self.fall_back(error, batch.what):
                    raise
        return eager()

    def _chunks(self, batch: Batch, total: int, call) -> list:
        results, start = [], 0
        progress = Progress(self.config.progress if batch.progress else False, total, "perturbations")
        while start < total:
            chunk = self.chunks[batch.key]
            count = min(chunk, total - start)
            try:
                if _memory_items is not None and chunk > _memory_items:
                    raise tf.errors.ResourceExhaustedError(None, None, f"a call of {chunk} {batch.unit} (simulated: "
                                                           f"fastcheck.testing.out_of_memory(above={_memory_items}))")
                if self.share is not None and batch.local:  # the chunk's items over the local replicas
                    count = self.share.local_wave(batch.what, call, chunk, start, total)
                elif self.share is None or not batch.spread:
                    results.append(call(chunk, slice(start, start + count), count))
                else:  # the chunk split over the replicas, each share at most ceil(chunk / replicas)
                    label = "perturbations" if "differences" in batch.what else batch.what
                    results.extend(self.share.wave(label, call, self.share.spread.sub_chunk(chunk), start, count,
                                                   batch.what))
            except tf.errors.ResourceExhaustedError:
                if chunk == 1:
                    raise MemoryError(f"f ran out of memory evaluating a single {batch.item}; {batch.advice}") from None
                self.chunks[batch.key] = chunk // 2  # the footprint estimate was too low
                _log.debug("%s: out of memory at %d %s per call; retried with %d", batch.subject, chunk, batch.unit,
                           chunk // 2)
                continue
            except tf.errors.InvalidArgumentError as error:
                if "ensure_shape" in str(error).lower() or "EnsureShape" in str(error):
                    moved = "its inputs were" if batch.moves is None else f"{batch.moves} was"
                    raise ShapeChangeError(
                        f"The output shape of f changed when {moved} perturbed; fastcheck needs outputs whose shapes "
                        "do not depend on input values "
                        "(avoid tf.boolean_mask/tf.where with one argument on perturbed values)."
                    ) from None
                raise
            start += count
            progress.advance(count)
        progress.close()
        return results

    def _differences_batch(self, position: int) -> Batch:
        """The batch of a differences call on ``position`` (its chunk key); the first on the joint kernel sets every
        checked input's chunk to the joint kernel's, as the report's notes say."""
        if self._joint_on() and not self._joint_chunks:
            self._joint_chunks = {s.position: self.chunks[s.position] for s in self.plan.checked}
            for spec in self.plan.checked:
                self.chunks[spec.position] = self.route.joint_chunk
            _log.debug("differences: one kernel for all %d checked inputs, %d perturbations per call (each input's "
                       "calls padded to it)", len(self.plan.checked), self.route.joint_chunk)
        name = self.plan.inputs[position].name
        return Batch("numerical differences", position, self.chunks[position], subject=name, moves=name,
                     item=f"perturbation of {name}")

    # -- full mode: columns ----------------------------------------------------

    def quotients(self, position: int, idx: np.ndarray, delta: np.ndarray):
        """Central difference quotients [m, len(idx)] float64 and the spans [len(idx)] (the first sweep)."""

        def eager():
            plus, minus, spans = self._eager_differences(position, idx, delta)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                return (plus - minus) / spans[None, :], spans

        return self._columns(position, idx, delta, (np.empty((self.plan.m, len(idx))), np.empty(len(idx))), eager)

    def differences(self, position: int, idx: np.ndarray, delta: np.ndarray):
        """f(x + d e_j) and f(x - d e_j) as [m, len(idx)] float64, and the spans [len(idx)]."""
        blocks = (np.empty((self.plan.m, len(idx))), np.empty((self.plan.m, len(idx))), np.empty(len(idx)))
        return self._columns(position, idx, delta, blocks, lambda: self._eager_differences(position, idx, delta))

    def _columns(self, position: int, idx: np.ndarray, delta: np.ndarray, arrays: tuple, eager):
        """``arrays`` (the kernel's outputs: [m, len(idx)] blocks, then the spans) filled chunk by chunk, each chunk
        in its place (no concatenation of [m, n] arrays); with three, both sides, with two, the quotients alone;
        or ``eager()``'s result."""
        if self.path == EAGER and self.share is None:  # no kernel, no chunks: the loops themselves
            return eager()
        dtype = self.values[position].dtype.as_numpy_dtype

        def call(chunk, part, count):
            kernel, at = self._differences(position, chunk, sides=len(arrays) == 3)
            out = kernel(self.values, tf.constant(pad(idx[part], chunk) + at, tf.int32),
                         tf.constant(pad(delta[part], chunk).astype(dtype)))
            for target, result in zip(arrays, out):
                target[..., part] = view(result)[..., :count]

        eager_result = self.chunked(self._differences_batch(position), len(idx), call, eager)
        return eager_result if eager_result is not None else arrays  # the calls filled the arrays

    def _joint_on(self) -> bool:
        return self.joint and self.path in (paths.XLA, GRAPH)

    def _differences(self, position: int, chunk: int, sides: bool):
        """(kernel, offset): the differences kernel for a call on ``position`` and what to add to its indices."""
        what = "differences" if sides else "quotients"
        if self._joint_on() and position not in self._own:
            kernel = self.kernel(("joint " + what, chunk), lambda: self._vectorised(
                _joint_kernel(self.plan, chunk, self.path, sides), chunk))
            if kernel is not None:
                return self._rented_kernel(kernel, position), self._offsets[position]
            self.joint = False
            self.chunks.update(self._joint_chunks)  # each input's own chunk again
            _log.debug("differences: vectorized_map converts some op of f with a while_loop when every checked input "
                       "is batched at once; one kernel per input instead")
        return self.kernel((what, position, chunk), lambda: _differences_kernel(
            self.plan, position, chunk, self.path, self.route.flat_function, sides=sides)), 0

    def _rented_kernel(self, kernel, position: int):
        """The joint differences kernel, its calls counted for ``_rent`` (not its first call: the trace)."""

        def call(*args):
            first = id(kernel) not in self._called
            self._called.add(id(kernel))
            out = kernel(*args)
            if not first:
                evaluations = 2 * int(args[1].shape[0])
                route = self.route
                self._rent(position, evaluations * (route.flops_per_eval / BATCHED_FLOPS
                                                    + route.elements_per_eval / BATCHED_ELEMENTS))
            return out

        return call

    def _rent(self, position: int, seconds: float) -> None:
        """Count a joint call on ``position`` predicted to take ``seconds``: its own kernel would evaluate only the ops that
        follow it (``Route.own_shares``), a share of them.  Once the calls' excess adds up to a kernel's predicted
        trace, the input's later differences take their own kernel and chunk (rent until the rent would have bought
        it: never more than twice the cheaper of the two).  The first sweep's few calls per input rarely add up to
        a trace; a deep ladder on a late layer's columns (a ReLU6 kink behind a depthwise convolution's batch
        normalization) does."""
        share = self.route.own_shares[position] if self.route.own_shares else 1.0
        self._rented[position] = self._rented.get(position, 0.0) + seconds * (1.0 - share)
        if self._rented[position] >= self.route.trace_seconds and self._joint_chunks:
            self._own.add(position)
            self.chunks[position] = self._joint_chunks[position]
            _log.debug("%s: its later differences run on a kernel of its own, which evaluates only the ops that "
                       "follow it", self.plan.inputs[position].name)

    def _vectorised(self, kernel, chunk: int):
        """A joint kernel, traced; None (cached as such) where pfor could not vectorise some op of f with every
        input batched (a while_loop, pfor's fallback, in its graph): each input then gets its own kernel."""
        dtype = self.values[self.plan.checked[0].position].dtype
        concrete = kernel.get_concrete_function(self.values, tf.TensorSpec([chunk], tf.int32), tf.TensorSpec([chunk], dtype))
        return None if paths.graph_op_types(concrete.graph) & paths._LOOP_OPS else kernel

    def elementwise(self) -> bool:
        """Whether the eager loops may try ``diagonal``'s few calls (f of one checked input and one output of as many
        elements, not yet shown in this check not to be element-wise)."""
        if self.path != EAGER or self.share is not None or self.memo.get("elementwise") is False:
            return False
        return self.once("eligible", lambda: diagonal.eligible(self.plan, self.config))

    def coloured(self, side: str, colours: int) -> None:
        """Record that an eager loop (``side``: "reverse", "numerical") took one call per colour of f's pattern."""
        self.memo.setdefault("colours", {})[side] = max(colours, self.memo.get("colours", {}).get(side, 0))
        _log.debug("eager %s loop by f's traced sparsity pattern: %d %s from %d colours", side,
                   self.plan.m if side == "reverse" else self.plan.n, "rows" if side == "reverse" else "columns",
                   colours)

    def row_blocks(self, blocks: list) -> None:
        """Keep the row loop's blocks [m, n_k] (or the element-wise rows'): the column loop may check f's pattern
        with them (``_pattern_held``)."""
        self.memo["row blocks"] = blocks

    def _pattern_held(self) -> bool:
        """Whether the row loop's blocks keep to f's traced pattern (``eager_colours.holds``), traced for it only
        where some block leaves room for the columns' colours (``may_pay``); once per check."""
        if "pattern held" not in self.memo:
            blocks, held = self.memo.get("row blocks"), False
            if blocks is not None and eager_colours.may_pay(blocks):
                found = eager_colours.structure(self.plan, self.config, self.native, self.plan.n)
                held = found is not None and eager_colours.holds(self.plan, self.config, found, blocks)
            self.memo["pattern held"] = held
        return self.memo["pattern held"]

    @property
    def colours(self) -> dict:
        """The eager loops that took one call per colour of f's traced pattern (``eager_colours``) in this check:
        side -> the most colours one took (empty: none did)."""
        return dict(self.memo.get("colours", {}))

    def elementwise_ran(self, ran: bool, forward: bool = True) -> None:
        """Record what ``diagonal``'s calls found: a forward that is not element-wise is not tried again in this
        check."""
        if ran:
            _log.debug("%s: f is element-wise in it (read from the ops its calls ran): its %s side took 2 %s "
                       "instead of one per element", self.plan.checked[0].name, "numerical" if forward else "reverse",
                       "calls of f a side" if forward else "VJPs")
        if forward:
            self.memo["elementwise"] = ran

    def _centre(self) -> np.ndarray:
        """f at x on the numerical side, as the eager loop calls it (flat, float64): planning's evaluation at the
        point in that precision (f of one output leaf: the same call, the same numbers)."""
        def centre() -> np.ndarray:
            found = self.plan.eval_output
            if found is None or np.shape(found) != (self.plan.m,):
                found = self.plan.call_flat_numpy(list(self.values), self.plan.eval_upcast)
            return np.asarray(found, np.float64)

        return self.once("centre", centre)

    def _eager_differences(self, position, idx, delta):
        base = self.values[position].numpy()
        shape, dtype = base.shape, base.dtype
        flat = base.reshape(-1)
        idx = np.asarray(idx)
        offsets = np.asarray(delta, np.float64)
        up, down = offsets.astype(dtype), (-offsets).astype(dtype)  # each side's offset, rounded as the input is
        spans = span(flat[idx], up)
        shortcut = self._shortcut(position, flat, shape, idx, delta) if np.unique(idx).size == len(idx) > 1 else None
        if shortcut is not None:
            return (*shortcut, spans)
        pluses, minuses = np.empty((self.plan.m, len(idx))), np.empty((self.plan.m, len(idx)))
        values = list(self.values)
        # The moved inputs of a chunk of columns from one constant (``unstacked``): x + d_j e_j, then x - d_j e_j.
        per = max(1, LOOP_BATCH_ELEMENTS // max(1, 2 * flat.size))
        for start in range(0, len(idx), per):
            part = np.arange(start, min(start + per, len(idx)))
            batch = np.repeat(flat[None], 2 * len(part), axis=0)
            for half, offset in enumerate((up, down)):
                batch[2 * np.arange(len(part)) + half, idx[part]] = flat[idx[part]] + offset[part]
            moved = unstacked(batch.reshape(-1, *shape))
            for k, column in enumerate(part):
                for half, target in enumerate((pluses, minuses)):
                    values[position] = moved[2 * k + half]
                    target[:, column] = self._evaluated(values, position, f" at element {idx[column]}")
        return pluses, minuses, spans

    def _shortcut(self, position: int, flat: np.ndarray, shape, idx: np.ndarray, delta) -> tuple | None:
        """The column loop's (plus, minus) from fewer calls of f, where f's structure allows: two calls a side for an
        element-wise f (``diagonal``), or two per colour of the pattern the row loop took and checked
        (``eager_colours``)."""
        if self.elementwise():
            sides = diagonal.differences(self.plan, list(self.values), position, flat, shape, idx, delta,
                                          self._centre())
            self.elementwise_ran(sides is not None)
            if sides is not None:
                return sides
        if "reverse" not in self.colours and not self._pattern_held():  # checked by the rows (``eager_colours``)
            return None
        found = eager_colours.structure(self.plan, self.config, self.native, len(idx))
        coloured = None if found is None else eager_colours.differences(
            self.plan, found, list(self.values), position, flat, shape, idx, delta, self._centre())
        if coloured is None:
            return None
        plus, minus, colours = coloured
        self.coloured("numerical", colours)
        return plus, minus

    def _evaluated(self, values: list, position: int, where: str = ""):
        """f's outputs [m] at ``values`` (input ``position`` moved); raises if the output shape changed."""
        plan = self.plan
        y = plan.call_flat_numpy_at(values, plan.eval_upcast)
        if y.shape != (plan.m,):
            raise ShapeChangeError(
                f"The output shape of f changed when {plan.inputs[position].name} was perturbed{where}; "
                "fastcheck needs outputs whose shapes do not depend on input values."
            )
        return y

    # -- noise tables ----------------------------------------------------------

    def noise_line(self):
        """``measure_noise``'s batched evaluator (``line(steps, ts)``: each noise table one call of a traced loop
        instead of 2 NOISE_SIDE calls of f), or None where the tables run point by point: across workers, beyond
        ``memory_budget``, and on the eager path where those calls cost less than tracing the kernel (predicted in
        f's counted call cost).
        """
        plan = self.plan
        if self.share is not None or not plan.checked:
            return None
        itemsize = 8 if plan.eval_upcast else plan.eval_dtype.size
        per_eval = (self.route.elements_per_eval + plan.n + plan.m) * itemsize * MEMORY_SAFETY
        if 2 * NOISE_SIDE * per_eval > self.config.budget:
            return None
        if self.path == EAGER:
            groups = len(plan.checked) if len(plan.checked) <= SEPARATE_INPUTS else 1
            point_by_point = groups * NOISE_TABLES * 2 * NOISE_SIDE * plan.call_seconds
            traced = tunable("TRACE_SECONDS") + groups * NOISE_TABLES * plan.call_seconds
            if point_by_point <= LINE_MARGIN * traced:
                return None
        # A loop over the table's points, not vectorised: each point runs f's own kernels, so its rounding is that
        # of f called alone (a batched matmul rounds otherwise), and no pfor conversion is paid.
        positions = [s.position for s in plan.checked]
        state = {"ran": False, "failed": False}

        def line(steps: dict, ts: np.ndarray):
            if not set(positions).issuperset(steps) or state["failed"]:
                return None
            kernel = self.kernel(("noise line",), lambda: _line_kernel(self.plan))
            moves = []
            for p in positions:
                value = self.values[p]
                dtype = value.dtype.as_numpy_dtype
                step = np.asarray(steps[p], dtype) if p in steps else np.zeros(value.shape, dtype)
                moves.append(tf.constant(step.reshape(value.shape)))
            try:
                out = view(kernel(self.values, tuple(moves), tf.constant(np.asarray(ts, np.float64))))
            except Exception:
                if state["ran"]:
                    raise  # f refuses points this far out: the measurement stops there
                state["failed"] = True  # f does not trace: point by point
                return None
            state["ran"] = True
            count = len(ts)
            return out[:count], out[count:]

        return line


def steps(plan: Plan, config: CheckConfig, position: int) -> np.ndarray:
    """Per-element step ``eps * max(1, |x_j|)`` (``step_scale``: ``eps`` where x_j is not finite) for one input
    (real view, flattened), or ``eps`` itself where the configuration asks for an absolute step
    (``compute_gradient``'s delta).

    ``eps`` is the evaluation dtype's ``machine_epsilon ** (1/3)``: the steps do not follow f's measured noise (a
    larger relative step spans periods of cos at 5e7); noise-limited columns are re-estimated over larger steps
    instead (``block._Block.coarsen``, every mode's).
    """
    if config.absolute_step and config.eps is not None:  # the configuration refuses one without the other
        return np.full(plan.inputs[position].size, float(config.eps))
    x = plan.eval_value(plan.inputs[position]).numpy().reshape(-1).astype(np.float64)
    return config.step(MACHINE_EPSILON[plan.eval_dtype]) * step_scale(x)


def along_columns(executor: Executor, position: int, rows: np.ndarray, cols: np.ndarray, width: np.ndarray,
                  multiples) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """f(x + t d), f(x - t d) and the spans [len(multiples), k] at each element's row (``rows``, ``cols`` [k] of input
    ``position``), for each t of ``multiples``, d moving each element's column by its ``width`` (the same within a
    column): every t in one batch."""
    columns, first, slot = np.unique(cols, return_index=True, return_inverse=True)
    count = len(columns)
    delta = np.concatenate([t * width[first] for t in multiples])
    plus, minus, spans = executor.differences(position, np.tile(columns, len(multiples)), delta)
    pick = slot[None, :] + count * np.arange(len(multiples))[:, None]
    return plus[rows[None, :], pick], minus[rows[None, :], pick], spans[pick]
