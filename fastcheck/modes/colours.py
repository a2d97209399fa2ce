"""Coloured mode's evaluations: the numerical side through column colours, the analytical side through row colours.

Columns that share no row of the sparsity pattern move together in one central difference (_Columns: one colour's
sweep, its second step and ladder, the probes' dense directions, drawn on the device by a counter hash); rows that
share no column share one VJP (_Analytical: one cotangent per row colour, the dense random cotangent that checks the
gradient off the pattern taken beside them).  Everything here evaluates; _coloured_judge judges.
"""


from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from fastcheck.engine.autodiff import ZERO, reverse_rows_kernel, vjp_kernel, vjps_kernel
from fastcheck.engine.config import MACHINE_EPSILON, device_step_scale, span, step_scale
from fastcheck.engine.executor import Batch, Executor, evaluate_rows, view
from fastcheck.engine.kernels import pad
from fastcheck.engine.paths import GRAPH, XLA, compile_kernel
from fastcheck.engine.plan import Plan
from fastcheck.engine.tables import (
    REFINE_RATIO,
    VERDICT_CHUNK,
    VJP_LOOP_SECONDS,
    VJP_PROBE_WEIGHTS,
    XLA_MIN_EVALUATIONS,
)
from fastcheck.sparsity import pattern as _pattern


def _kernel_path(executor: Executor, evaluations: int) -> str:
    """The route's path, but the graph path instead of XLA for fewer than ``XLA_MIN_EVALUATIONS``."""
    return GRAPH if executor.path == XLA and evaluations < XLA_MIN_EVALUATIONS else executor.path


def _colour_kernel(plan: Plan, position: int, path: str, values, flat_function=None, uniform: bool = False):
    """For colours ``ids``, d_c = step * scales[c] where labels == ids[c], else 0: f(x + d_c) and f(x - d_c) as
    [2 len(ids), m] in the evaluation dtype.  ``scales`` are powers of two (exact: the host knows d_c).  One kernel
    serves the first sweep (the host takes the differences), refinement (the host reads the rows it needs) and the
    pattern probe (labels all 0, a signed step): traced once, for any number of colours (an XLA kernel compiles per
    count, so its callers pad to their chunk).  ``uniform``: every label and id is 0 (one colour), so d_c is made
    without the comparison and select over every column (10^7 elements: ~6 ms a call)."""
    n = plan.inputs[position].size
    dtype = values[position].dtype

    def kernel(values, labels, step, ids, scales):
        flat = tf.reshape(values[position], [-1])
        direction = step[None, :] * scales[:, None]
        if not uniform:
            direction = tf.where(labels[None, :] == ids[:, None], direction, tf.zeros_like(step)[None, :])
        batch = tf.concat([flat[None] + direction, flat[None] - direction], axis=0)
        return evaluate_rows(plan, position, path, values, batch, flat_function)

    # Labels: one per column, or one for all (``_Columns.zero_labels``).
    signature = (tuple(tf.TensorSpec(v.shape, v.dtype) for v in values), tf.TensorSpec([None], tf.int32),
                 tf.TensorSpec([n], dtype), tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], dtype))
    return compile_kernel(kernel, path, plan.autograph, signature)


def _vjp_kernel(plan: Plan, path: str, chunk: int):
    """J^T u_c [chunk, n_k] per checked input, u_c the indicator of row colour ``ids[c]``: one colour per call is one
    plain VJP (``tape.gradient``: no vectorisation over cotangents), more one batched ``tape.jacobian``."""
    if chunk > 1:
        def colours(y, labels, ids):
            return tf.linalg.matvec(tf.cast(labels[None, :] == ids[:, None], y.dtype), y)

        return reverse_rows_kernel(plan, path, colours)
    return vjp_kernel(plan, path, lambda y, labels, ids: tf.cast(labels == ids[0], y.dtype))


def _blocked(function, size: int, dtype=np.float64) -> np.ndarray:
    """``function(slice)`` for consecutive blocks of ``size`` elements, into one array: the temporaries of each block
    stay in cache (a fresh 80 MB array per numpy operation costs more than the operation at 10^7 elements)."""
    result = np.empty(size, dtype)
    for start in range(0, size, VERDICT_CHUNK):
        part = slice(start, min(start + VERDICT_CHUNK, size))
        result[part] = function(part)
    return result


def _steps(plan: Plan, config, x: np.ndarray, dtype=np.float64) -> np.ndarray:
    """``executor.steps`` (``eps * max(1, |x_j|)``, float64) for the flat values ``x``, block by block,
    rounded to ``dtype`` (no float64 [n] array where the evaluation dtype is narrower)."""
    eps = config.step(MACHINE_EPSILON[plan.eval_dtype])
    return _blocked(lambda part: eps * step_scale(x[part]), x.size, dtype)


def _device_steps(x, eps):
    """``_steps`` of a float32 or float64 tensor, made on the device as the kernels' constant: the same float64
    operations and one rounding to x's dtype, bit for bit, without an [n] copy from the host (~0.03 s, not ~0.13 s)."""
    return tf.cast(eps * device_step_scale(x), x.dtype)


def _compiled(function) -> tuple:
    """(graph, XLA) ``tf.function``s of ``function``, indexed by whether XLA pays (``_large``): XLA fuses its
    passes over 10^7 elements into one, but compiles once per shape (~0.1 s)."""
    return (tf.function(function, autograph=False, reduce_retracing=True),
            tf.function(function, jit_compile=True, autograph=False, reduce_retracing=True))


def _large(config, size: int) -> bool:
    """Whether an array of ``size`` elements is judged and drawn in fused XLA passes (``SCREEN_ELEMENTS``)."""
    return size >= config.table("SCREEN_ELEMENTS")


DEVICE_STEPS = _compiled(_device_steps)


def _array(index) -> np.ndarray:
    """An index (a slice over a diagonal pattern's nonzeros, or an array) as an int64 array."""
    return np.arange(index.start, index.stop, dtype=np.int64) if isinstance(index, slice) else index


def _shared(chunk: int, held: int, budget: int) -> int:
    """A batched kernel's chunk (sized by the executor for the whole ``memory_budget``) scaled to
    what the coloured check's own arrays (``held`` bytes: compressed differences and VJPs,
    statuses, the pattern) leave of the budget, at least an eighth of it: the two peak together."""
    return max(1, int(chunk * max(budget - held, budget / 8) / budget))


class _Differences:
    """The first sweep's differences f(x + d_c) - f(x - d_c), [C, m]: float64 values, held in float32 where exact.

    For f evaluated in float32 (or narrower) each difference is one of two float32 numbers: exact in float32 unless
    they differ in scale (Sterbenz), so the float32 array holds all but a few (outputs crossing zero), which are
    kept apart as (flat index, float64 value): half the memory of a float64 [C, m], and the values read back are the
    float64 ones, bit for bit.  One colour (an elementwise f) keeps the kernel's f(x + d) and f(x - d) [1, m] as
    they came instead (``sides``), subtracted in float64 where read: the same values without a pass over the outputs
    to store them, and a lower peak (no copy beside the kernel's output).
    """

    def __init__(self, colours: int, m: int, narrow: bool):
        self.m = m
        self.values = np.empty((colours, m), np.float32 if narrow else np.float64)  # no pages until written
        self.narrow = narrow
        self.sides: tuple | None = None
        # One colour: the kernel's output on the device, f(x + d) first and f(x - d) half way down (``sides``).
        self.tensor: tf.Tensor | None = None
        self._index: list = []
        self._exact: list = []
        self.index, self.exact = np.zeros(0, np.int64), np.zeros(0)
        self.bits = np.zeros(0, np.uint8)

    @property
    def colours(self) -> int:
        return self.values.shape[0]

    def store(self, part: slice, plus: np.ndarray, minus: np.ndarray) -> None:
        """``consume`` of the sweep: rows ``part`` (colours) of the differences ``plus - minus`` [count, m],
        taken in float64 one block of ``VERDICT_CHUNK`` outputs at a time (in cache: no float64 [count, m])."""
        if self.colours == 1:
            self.sides = (plus, minus)
            return
        for start in range(0, self.m, VERDICT_CHUNK):
            block = slice(start, min(start + VERDICT_CHUNK, self.m))
            self._stored(part, block, np.subtract(plus[:, block], minus[:, block], dtype=np.float64))
        if self._index:
            self._indexed()

    def _stored(self, part: slice, block: slice, difference: np.ndarray) -> None:
        target = self.values[part, block]
        target[...] = difference
        if not self.narrow:
            return
        with np.errstate(invalid="ignore"):
            row, column = np.nonzero(target != difference)  # NaN too (NaN != NaN), left out among the few found
        if len(row):
            exact = ~np.isnan(difference[row, column])
            row, column = row[exact], column[exact]
        if len(row):
            self._index.append((row + part.start) * self.m + column + block.start)
            self._exact.append(difference[row, column])

    def _indexed(self) -> None:
        """The inexact differences found so far as one sorted index (colours in order, outputs in order)."""
        if sum(len(i) for i in self._index) != len(self.index):
            order = np.argsort(np.concatenate(self._index), kind="stable")
            self.index = np.concatenate(self._index)[order]
            self.exact = np.concatenate(self._exact)[order]
            # One bit per difference: a read searches the few inexact ones only where a bit is set.
            bits = np.zeros(self.values.size, bool)
            bits[self.index] = True
            self.bits = np.packbits(bits)

    def take(self, colours, rows) -> np.ndarray:
        """float64 values at (``colours``, ``rows``): arrays, or ``colours`` None for a single colour
        (``rows`` may then be a slice)."""
        if self.sides is not None:  # one colour
            plus, minus = self.sides
            with np.errstate(invalid="ignore", over="ignore"):
                return np.subtract(plus[0][rows], minus[0][rows], dtype=np.float64)
        if colours is None:
            result = self.values[0][rows].astype(np.float64)
        else:
            result = self.values[colours, rows].astype(np.float64)
        if len(self.index):
            if colours is None and isinstance(rows, slice):  # consecutive keys: one range of the sorted index
                lo, hi = np.searchsorted(self.index, [rows.start, rows.stop])
                result[self.index[lo:hi] - rows.start] = self.exact[lo:hi]
                return result
            rows = _array(rows)
            keys = rows if colours is None else colours.astype(np.int64) * self.m + rows
            hit = np.flatnonzero((self.bits[keys >> 3] >> (7 - (keys & 7)).astype(np.uint8)) & 1)
            if len(hit):
                where = np.searchsorted(self.index, keys[hit])
                result[hit] = self.exact[where]
        return result


class _Columns:
    """Central differences of one checked input along its colours' directions."""

    def __init__(self, executor: Executor, plan: Plan, position: int, pattern: _pattern.Pattern, labels: np.ndarray,
                 held: int = 0):
        self.executor, self.plan, self.position, self.pattern = executor, plan, position, pattern
        self.labels = np.asarray(labels, np.int32)  # no copy of int32 labels (10^7 columns: 40 MB)
        self.colours = int(labels.max()) + 1 if labels.size else 0
        value = executor.values[position]
        self.dtype = value.dtype.as_numpy_dtype
        self.x = view(value).reshape(-1)
        self.step_tensor: tf.Tensor | None = None  # the steps on the device (float32 and float64 inputs)
        if value.dtype in (tf.float32, tf.float64):
            eps = executor.config.step(MACHINE_EPSILON[plan.eval_dtype])
            self.step_tensor = DEVICE_STEPS[_large(executor.config, self.x.size)](value, tf.constant(eps, tf.float64))
            self.step = view(self.step_tensor)
        else:
            self.step = _steps(plan, executor.config, self.x, self.dtype)
        chunk = max(1, min(_shared(executor.chunks[position], held, executor.config.budget), max(self.colours, 1)))
        name = plan.inputs[position].name
        self.batch = Batch("coloured differences", ("coloured", position), chunk, subject=name, moves=name,
                           item=f"perturbation of {name}")
        self.evaluations = 0
        self._constants: tuple | None = None
        self._zeros: tf.Tensor | None = None
        self._spans: np.ndarray | None = None  # [n] where columns hold several nonzeros (``span``)
        self._sides: dict = {}  # level -> (sorted keys row * n + col, f(x + d), f(x - d)) evaluated by ``sides``

    def span(self, cols) -> np.ndarray:
        """(x + h) - (x - h) in the evaluation dtype, as float64, at the columns ``cols`` (a slice or an index
        array).  Computed where read, a block at a time, where each column holds one nonzero (a stored [n] float64
        array is 80 MB of fresh pages at 10^7 elements, slower to fault in than to recompute); stored once where
        columns hold several (layer norm's 64: one gather, not two and the arithmetic, per nonzero)."""
        if self._spans is None and self.pattern.nnz > self.x.size:
            self._spans = _blocked(lambda part: span(self.x[part], self.step[part], self.dtype), self.x.size)
        if self._spans is not None:
            return self._spans[cols]
        return span(self.x[cols], self.step[cols], self.dtype)

    def run(self, labels, step, ids: np.ndarray, consume, sides: bool = True, scales=None, rows=None,
            what: str = "coloured differences", kept: list | None = None) -> None:
        """Evaluate f(x +- d_c) for each colour in ``ids`` (d_c scaled by ``scales``, default 1):
        ``consume(part, plus, minus)`` gets [count, len(rows)] arrays of each chunk at the outputs
        ``rows`` (``part``: the slice of ``ids``), or ``consume(part, difference)`` [count, m] in
        float64 without ``sides``.  ``labels`` and ``step`` are numpy arrays or tensors.  ``kept``
        receives each call's output tensor [2 width, m] as it came (none on the eager path)."""
        executor, plan = self.executor, self.plan
        self.evaluations += 2 * len(ids)
        labels_t = labels if isinstance(labels, tf.Tensor) else tf.constant(np.asarray(labels, np.int32))
        step_t = step if isinstance(step, tf.Tensor) else tf.constant(np.asarray(step, self.dtype))
        scales = np.ones(len(ids), self.dtype) if scales is None else np.asarray(scales, self.dtype)
        path = _kernel_path(executor, 2 * self.colours)
        wanted = None if rows is None else np.asarray(rows, np.int64)

        uniform = labels_t is self._zeros and not np.any(ids)  # every column moves: no select

        def call(chunk, part, count):
            kernel = executor.kernel(("coloured", self.position, path, uniform), lambda: _colour_kernel(
                plan, self.position, path, executor.values, executor.route.flat_function, uniform))
            # An XLA kernel compiles per shape: padded to the chunk, one compilation serves every call.
            width = chunk if path == XLA else count
            raw = kernel(executor.values, labels_t, step_t, tf.constant(pad(ids[part], width), tf.int32),
                         tf.constant(pad(scales[part], width)))
            if kept is not None:
                kept.append(raw)
            outs = view(raw)
            plus, minus = outs[:count], outs[width : width + count]
            if not sides:
                consume(part, np.subtract(plus, minus, dtype=np.float64))
            elif wanted is None:
                consume(part, plus, minus)
            else:
                consume(part, plus[:, wanted], minus[:, wanted])

        def eager():
            values = list(executor.values)
            lab, stp = np.asarray(labels), np.asarray(step)
            for k, colour in enumerate(ids):
                direction = np.where(lab == colour, stp * scales[k], self.dtype(0))
                out = []
                for moved in (self.x + direction, self.x - direction):
                    values[self.position] = tf.constant(moved.reshape(executor.values[self.position].shape))
                    y = plan.call_flat_numpy_at(values, plan.eval_upcast)
                    out.append((y if wanted is None or not sides else y[wanted])[None, :])
                consume(slice(k, k + 1), *out) if sides else consume(slice(k, k + 1), np.subtract(*out, dtype=np.float64))

        executor.chunked(dataclasses.replace(self.batch, what=what), len(ids), call, eager)

    def constants(self) -> tuple:
        """The colour labels and steps as tensors, made once (10^7 elements: 80 MB to copy)."""
        if self._constants is None:
            # One colour over every column (an elementwise f): one zero label for all, not a copy.
            same = self.colours == 1 and not np.any(self.labels)
            step = self.step_tensor if self.step_tensor is not None else tf.constant(self.step)
            self._constants = (self.zero_labels() if same else tf.constant(self.labels), step)
        return self._constants

    def zero_labels(self) -> tf.Tensor:
        """Every column labelled 0: one label that broadcasts over the columns (not a 40 MB tensor at 10^7);
        with colour id 0 the kernel moves x along the whole step given (the sweep of one colour, the pattern
        probe's signed step, a noise table's line)."""
        if self._zeros is None:
            self._zeros = tf.zeros([1], tf.int32)
        return self._zeros

    def sweep(self) -> _Differences:
        """The first sweep: f(x + d_c) - f(x - d_c) [C, m] for every colour c, held as ``_Differences``."""
        result = _Differences(self.colours, self.plan.m, self.plan.eval_dtype.size <= 4)
        labels, step = self.constants()
        # One colour's output stays on the device for the screen; more colours' are dropped chunk by chunk.
        kept: list | None = [] if self.colours == 1 else None
        self.run(labels, step, np.arange(self.colours), result.store, kept=kept)
        if kept is not None and len(kept) == 1:
            result.tensor = kept[0]
        return result

    def sides(self, rows: np.ndarray, cols: np.ndarray, levels: list[int], factors: list[float] | None = None):
        """Per level k: f(x + d), f(x - d) at each nonzero's row along its column's colour direction at step
        h / REFINE_RATIO**k (times ``factors[k]``, where given), and the spans of its column -- every level not yet
        evaluated for all of these nonzeros in one batch.  The direction is restricted to the columns given: columns
        of one colour share no row, so any subset of them still recovers its nonzeros.

        A (nonzero, level) evaluated before is read back, not evaluated again: f is deterministic (the plan
        checked), and a nonzero's row sees its own column alone.  So the refinement under measured noise reuses the
        ladder of the first refinement, without it."""
        keys = np.asarray(rows, np.int64) * self.x.size + np.asarray(cols, np.int64)
        steps: list = list(levels) if factors is None else list(zip(levels, factors))  # a step: its power, its factor
        found: dict = {}
        for level in steps:
            known = self._sides.get(level)
            if known is not None and len(known[0]):
                where = np.minimum(np.searchsorted(known[0], keys), len(known[0]) - 1)
                if np.array_equal(known[0][where], keys):
                    found[level] = (known[1][where], known[2][where])
        missing = [level for level in steps if level not in found]
        if missing:
            plus, minus = self._evaluated(rows, cols, [self._scale(level) for level in missing])
            for k, level in enumerate(missing):
                found[level] = (plus[k], minus[k])
                old = self._sides.get(level, (np.zeros(0, np.int64), np.zeros(0), np.zeros(0)))
                # Each key once, the earlier evaluation first (np.unique keeps its first occurrence).
                merged, first = np.unique(np.concatenate([old[0], keys]), return_index=True)
                self._sides[level] = (merged, np.concatenate([old[1], plus[k]])[first],
                                      np.concatenate([old[2], minus[k]])[first])
        x, d = self.x[cols], self.step[cols]
        return [(*found[level], span(x, d * self._scale(level), self.dtype)) for level in steps]

    def _scale(self, level) -> np.floating:
        """A step's multiple of h in f's dtype: REFINE_RATIO**-p, times the factor of a (p, factor) step."""
        power, factor = level if isinstance(level, tuple) else (level, 1.0)
        return self.dtype(REFINE_RATIO ** -float(power) * factor)

    def along(self, rows: np.ndarray, cols: np.ndarray, width: np.ndarray, multiples) -> tuple:
        """f(x + t d), f(x - t d) and the spans [len(multiples), len(rows)] at each nonzero's row, for each t of
        ``multiples``, d moving each of the columns ``cols`` by its ``width`` (one per nonzero, the same within a
        column)."""
        width = np.asarray(width, self.dtype)
        plus, minus = self._evaluated(rows, cols, [self.dtype(t) for t in multiples], width)
        x = self.x[cols]
        return plus, minus, np.stack([span(x, width * self.dtype(t), self.dtype) for t in multiples])

    def quotients(self, compressed: _Differences, rows, cols, spans: np.ndarray) -> np.ndarray:
        """The first sweep's quotient of each nonzero (float64, a fresh array) off ``compressed``."""
        colours = None if compressed.colours == 1 else self.labels[cols]
        differences = compressed.take(colours, rows)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            differences /= spans
        return differences

    def _evaluated(self, rows: np.ndarray, cols: np.ndarray, scales: list,
                   width: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """f(x + s d), f(x - s d) [len(scales), len(rows)] of ``sides`` (d: the columns' steps h) and ``along``
        (d: ``width``), evaluated: every scale in one batch."""
        colour = self.labels[cols].astype(np.int64)
        present, slot = np.unique(colour, return_inverse=True)
        # The steps of the columns given, 0 elsewhere (those stay put), made on the device (no n-sized array from
        # the host); each column once (scatter_nd adds duplicates: a column holds many nonzeros).  One colour moves
        # every column at h, as the sweep did: each row sees its own column alone either way (no 40 MB scatter at
        # 10^7).
        labels, step = self.constants()
        if self.colours > 1 or width is not None:
            distinct, first = np.unique(np.asarray(cols, np.int64), return_index=True)
            moved = self.step[distinct] if width is None else width[first]
            step = tf.scatter_nd(tf.constant(distinct[:, None]), tf.constant(moved), [self.x.size])
        ids = np.tile(present, len(scales))
        plus, minus = np.empty((len(scales), len(rows))), np.empty((len(scales), len(rows)))
        repeated = np.repeat(np.array(scales, self.dtype), len(present))
        where = [np.flatnonzero(slot == c) for c in range(len(present))]

        def consume(part, up, down):
            for k in range(part.start, part.stop):
                level, c = divmod(k, len(present))
                picked = where[c]
                plus[level, picked] = np.asarray(up)[k - part.start, picked]
                minus[level, picked] = np.asarray(down)[k - part.start, picked]

        self.run(labels, step, ids, consume, scales=repeated, rows=rows)
        return plus, minus

    def probe(self, seed: int, divide: float = 1.0):
        """(f(x + d) - f(x - d)) / 2 [m] along d = s * h / divide, s random weights of either sign and magnitude in
        [1/2, 1] (drawn on the device from ``seed``), and the realised direction ((x + d) - (x - d)) / 2 [n], by the
        colour kernel: every label 0, the step weighted.  Not signs alone: an entry (i, k) missing from a pattern
        that holds (i, i) mixes into the compressed (i, i) as J_ik h_k / h_i, and equal signs of d_i and d_k would
        cancel it from the probe half the time."""
        _, step = self.constants()
        d = RANDOM_DIRECTION[_large(self.executor.config, self.x.size)](
            step, tf.constant(seed, tf.int32), tf.constant(self.dtype(0.5 / divide)))
        found: list = []

        def consume(part, plus, minus):
            found.append((plus[0], minus[0]))

        self.run(self.zero_labels(), d, np.zeros(1, np.int64), consume, what="coloured pattern probe")
        (plus, minus), = found
        return _Probe(plus, minus, view(d), self.x)


def _drawn(n, seed):
    """n uint32 draws of a counter-based generator: the lowbias32 hash of each element's index mixed with the hashed
    ``seed`` (int32), in one fused XLA pass (10^7 elements: ~5 ms against ~45 ms for TensorFlow's stateless Philox).
    The probes need draws unrelated to f's structure, which a full-avalanche hash of the counter gives."""

    def mixed(x):
        for shift, factor in ((16, 0x7FEB352D), (15, 0x846CA68B)):
            x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(shift, tf.uint32)))
            x = x * tf.constant(factor, tf.uint32)
        return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(16, tf.uint32)))

    index = tf.bitcast(tf.range(n, dtype=tf.int32), tf.uint32)
    return mixed(tf.bitwise.bitwise_xor(index, mixed(tf.bitcast(seed, tf.uint32))))


def _probe_weights(table, seed, m):
    """m cotangent weights drawn uniformly from ``table`` (``_drawn`` from ``seed``, on the device); ``m`` a
    tensor, or an int under XLA (a static shape)."""
    return tf.gather(table, tf.cast(_drawn(m, seed) % tf.cast(tf.size(table), tf.uint32), tf.int32))


def _random_direction(step, seed, scale):
    """step * s * scale, s uniform in [-2, -1) or [1, 2) (``_drawn`` from ``seed``), on the device."""
    r = tf.cast(tf.bitwise.right_shift(_drawn(tf.size(step), seed), tf.constant(8, tf.uint32)), tf.float32)
    r = r * (2.0**-23) - 1.0  # uniform in [-1, 1) on a grid of 2^-23: exact in float32
    return step * tf.cast(tf.where(r < 0, r - 1, r + 1), step.dtype) * scale


PROBE_WEIGHTS, RANDOM_DIRECTION = _compiled(_probe_weights), _compiled(_random_direction)


@dataclasses.dataclass(frozen=True)
class _Probe:
    """A pattern probe's evaluations: f(x + d), f(x - d) [m] in the evaluation dtype, the direction d and x [n]."""

    plus: np.ndarray
    minus: np.ndarray
    moved: np.ndarray
    x: np.ndarray

    def value(self) -> np.ndarray:
        """(f(x + d) - f(x - d)) / 2, float64."""
        difference = np.subtract(self.plus, self.minus, dtype=np.float64)
        difference *= 0.5
        return difference

    def realised(self) -> np.ndarray:
        """((x + d) - (x - d)) / 2, float64."""
        return _blocked(lambda block: span(self.x[block], self.moved[block], self.x.dtype) / 2, self.x.size)


def _analytical(executor: Executor, plan: Plan, patterns: list, row_labels: np.ndarray,
                held: int = 0, twin: bool = False) -> list[_Analytical]:
    """Reverse-mode values of every nonzero, per checked input (native dtype): one VJP per row colour, into one
    [R, n_k] array per input (the Jacobian compressed by rows), kept as it is and read by ``_Analytical``.
    ``twin``: the same gradient code run at the numerical side's values (float64: the float64 twin,
    ``block.twinned``)."""
    colours = int(row_labels.max()) + 1 if row_labels.size else 0
    ids = np.arange(colours)
    values = executor.values if twin else executor.native
    dtype = np.float64 if twin else plan.native_flat_dtype.as_numpy_dtype
    compressed = [np.empty((colours, p.shape[1]), dtype) for p in patterns]

    kept: list = []

    def consume(part, blocks):
        for k, (target, block) in enumerate(zip(compressed, blocks)):
            if part == slice(0, colours) and block.shape == target.shape and block.dtype == target.dtype:
                compressed[k] = block  # every colour in one call: its array as it came, not a copy (40 MB at 10^7)
            else:
                target[part] = block

    itemsize = plan.native_flat_dtype.size
    per_colour = (plan.m + plan.n + max(executor.route.elements_per_eval, 1)) * itemsize * 4
    chunk = int(max(1, min(colours, _shared(executor.config.budget // per_colour, held, executor.config.budget))))
    if colours * plan.call_seconds <= VJP_LOOP_SECONDS:
        # One plain VJP per call: its kernel traces in a fraction of the batched tape.jacobian's time (72 row colours:
        # ~30 ms against ~110 ms), and the extra forward pass per colour costs less than that difference.
        chunk = 1
    # One row colour (an elementwise f): the device's zeros, not a copy of an m-sized array.
    labels_t = tf.zeros([len(row_labels)], tf.int32) if colours == 1 else tf.constant(row_labels.astype(np.int32))

    probes: list = []

    def call(size, part, count):
        path = _kernel_path(executor, 4 * colours)
        if colours == 1 and size == 1 and not twin:
            paired = _paired_vjps(executor, path)
            if paired is not None:
                out, probe = paired[: len(compressed)], paired[len(compressed) :]
                kept.append(out)
                probes.extend(tf.reshape(g, [-1]) for g in probe)
                consume(part, [view(b) for b in out])
                return
        kernel = executor.kernel(("coloured vjp", size, path, twin), lambda: _vjp_kernel(executor.plan, path, size))
        out = kernel(values, labels_t, tf.constant(pad(ids[part], size), tf.int32))
        if colours == 1 and size == 1:
            kept.append(out)
        consume(part, [view(b)[:count] for b in out])

    def eager():
        vjp = _eager_vjp(executor, plan, [s.position for s in plan.checked], values)
        for colour in ids:
            consume(slice(colour, colour + 1), [g.numpy()[None, :] for g in vjp(row_labels == colour)])

    batch = Batch("coloured VJPs", "coloured vjp", chunk, subject="coloured mode", unit="VJPs", item="VJP",
                  advice="pass a smaller problem or a device with more memory.", spread=False, progress=False)
    executor.chunked(batch, colours, call, eager)
    tensors = kept[0] if len(kept) == 1 else [None] * len(compressed)
    probes = probes if len(probes) == len(compressed) else [None] * len(compressed)
    return [_Analytical(block, row_labels, tensor, probe) for block, tensor, probe in zip(compressed, tensors, probes)]


def _paired_vjps(executor: Executor, path: str) -> list | None:
    """[J^T 1 [1, n_k] per checked input] + [J^T w [1, n_k] per checked input] for the VJP probe's cotangent w
    (``_vjp_weights``): one row colour's VJP and the probe's from one forward pass, in one call (10^7 elements:
    ~15 ms less than two).  None where f's gradient cannot run twice on one tape (a custom gradient that
    consumes its own) or the kernel fails otherwise: the VJPs are then taken one by one."""
    plan = executor.plan

    def make():
        return vjps_kernel(plan, path, lambda y, weights: [tf.ones_like(y), tf.cast(weights, y.dtype)])

    try:
        return list(executor.kernel(("coloured vjp pair", path), make)(executor.native, _vjp_weights(executor, plan)))
    except Exception:  # noqa: BLE001 -- the single VJP kernel runs f again and raises what is f's own
        return None


def _vjp_weights(executor: Executor, plan: Plan) -> tf.Tensor:
    """The VJP probe's dense cotangent [m] (native dtype): ``VJP_PROBE_WEIGHTS`` drawn on the device from the
    check's seed, drawn once per check (``_paired_vjps`` and ``_vjp_problems`` read the same)."""
    xla = _large(executor.config, plan.m)
    return executor.once("coloured vjp probe weights", lambda: PROBE_WEIGHTS[xla](
        tf.constant(VJP_PROBE_WEIGHTS, plan.native_flat_dtype), tf.constant((executor.config.seed + 6151) % 2**31,
                                                                          tf.int32),
        plan.m if xla else tf.constant(plan.m, tf.int32)))


def _eager_vjp(executor: Executor, plan: Plan, positions: list[int], at=None):
    """``vjp(weights)``: J^T w (flat, per input at ``positions``) for a cotangent given flat over
    f's outputs [m], from one eager pass of f on a persistent tape -- or one pass per call where
    f's gradient runs only once per pass (a custom gradient that calls ``tape.gradient`` on a
    non-persistent tape it closes over raises RuntimeError the second time).  ``at``: the values
    (default: the native ones)."""
    state: dict = {"pass": None, "shared": True}

    def forward():
        values = [tf.identity(v) for v in (executor.native if at is None else at)]
        sources = [values[p] for p in positions]
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(sources)
            leaves = plan.output_leaves(values)
        return tape, sources, leaves

    def vjp(weights) -> list:
        if state["pass"] is None or not state["shared"]:
            state["pass"] = forward()
        tape, sources, leaves = state["pass"]
        bounds = np.concatenate([[0], np.cumsum([int(leaf.shape.num_elements()) for leaf in leaves])])
        cotangents = [tf.reshape(tf.cast(weights[bounds[i] : bounds[i + 1]], leaf.dtype), leaf.shape)
                      for i, leaf in enumerate(leaves)]
        try:
            grads = tape.gradient(leaves, sources, output_gradients=cotangents, unconnected_gradients=ZERO)
        except RuntimeError:
            if not state["shared"]:
                raise
            state["shared"] = False  # f's gradient consumed its own tape: a fresh pass per call from now on
            return vjp(weights)
        return [tf.reshape(tf.convert_to_tensor(g), [-1]) for g in grads]

    return vjp


class _Analytical:
    """The analytical values of one block's nonzeros, read where needed off the Jacobian compressed
    by rows ([R, n_k]: nonzero (i, j) is ``[row colour of i, j]``) or off the user's dense
    gradient (``row_labels`` None): a per-nonzero copy would cost as much again."""

    def __init__(self, compressed: np.ndarray, row_labels: np.ndarray | None, tensor: tf.Tensor | None = None,
                 probe: tf.Tensor | None = None):
        self.compressed, self.row_labels = compressed, row_labels
        self.tensor = tensor  # one row colour: the VJP [1, n] on the device
        self.probe = probe  # J^T w [n] of the VJP probe, where taken beside it (``_paired_vjps``)

    def take_probe(self) -> tf.Tensor | None:
        """The VJP probe's J^T w, handed over once: the report keeps the blocks, not this [n] array."""
        probe, self.probe = self.probe, None
        return probe

    def at(self, rows, cols) -> np.ndarray:
        if self.row_labels is None:
            return self.compressed[_array(rows), _array(cols)]
        if self.compressed.shape[0] == 1:
            return self.compressed[0][cols]
        return self.compressed[self.row_labels[_array(rows)], _array(cols)]
