"""The coloured check: element-wise verdicts on every structural nonzero of a sparse Jacobian.

One strategy of ``_check.run_check`` (with ``_full`` and ``_fast``), for f whose
Jacobian is sparse (elementwise ops, normalisations over a small axis, stencils):

1. the pattern per checked input (``_sparsity``: the user's ``sparsity=``, or a
   dependency trace of f's graph; an op without a rule refuses with
   ``UnknownSparsity``, a ValueError naming it);
2. numerical side: the columns coloured so that columns sharing a row differ; one
   central difference per colour along ``d_c = sum of h_j e_j`` over the colour's
   columns (full mode's steps), batched through the executor's chunk loop, and each
   nonzero (i, j) read off its column's colour -- 2C evaluations instead of 2n;
3. analytical side: reverse mode, the gradient training uses: rows coloured so that
   rows sharing a column differ, one VJP per row colour (batched ``tape.jacobian``
   of the colour-weighted outputs), each nonzero read off its row's colour;
4. the element rule of ``_compare`` on the nonzeros, f's noise measured only when
   an element fails; a large diagonal block (``SCREEN_ELEMENTS``) is screened beside
   its evaluations, on the device (``_screen``: elements within 0.9 of their band pass,
   numpy's rule judges the rest); failing nonzeros evaluated at h/4 first (the second
   step: those its quotient and Richardson's extrapolation pass are done), the rest
   refined over h ... h/4**5 (deeper where unsettled) by re-evaluating only their
   colours, with ``_compare.refine``'s kink and jump tests, as in full mode;
5. the pattern check: random dense probes ``J d`` (numerical) against the
   pattern-restricted ``sum N_ij d_j``; mass outside the pattern (confirmed at a
   quarter of the step) is a *problem* of the report -- the pattern is wrong --,
   not a gradient verdict.  A traced diagonal pattern is trusted instead, as the
   element-wise walk (``_diagonal``) trusts the same rules; a dense random cotangent
   checks the reverse-mode gradient itself (``_vjp_problems``) in every case.

Memory: one status byte per nonzero; the colours' differences [C, m] (float32 where
exact) and the VJPs [R, n] stay compressed, and every other per-nonzero quantity
(indices, values, noise, bands) exists one block of ``VERDICT_CHUNK`` nonzeros at a
time -- in the check and in its report's ``Nonzeros`` storage.  No array of the Jacobian's
size exists, except for the ``Dense`` storage of a small pair (``DENSE_REPORT_ENTRIES``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import tensorflow as tf

from fastcheck import _compare, _pattern, _sparsity
from fastcheck._autodiff import ZERO, reverse_rows_kernel, vjp_kernel, vjps_kernel
from fastcheck._config import MACHINE_EPSILON, PRECISION_EPSILON
from fastcheck._diagnosis import kernel_failure
from fastcheck._events import ColouredBlock, ColouredOnGraph, ColouredSummary
from fastcheck._executor import Batch, Executor, evaluate_rows, measured, timed, view
from fastcheck._kernels import pad
from fastcheck._paths import EAGER, GRAPH, XLA, compile_kernel
from fastcheck._plan import InputSpec, Plan, first_line, with_noise
from fastcheck._precision import Noise, measure_noise
from fastcheck._refine import Early, Evaluate, Rungs, descend
from fastcheck._results import Dense, GradientCheckError, Nonzeros, Outcome, PairReport, having
from fastcheck._tables import (
    BYTES_PER_NONZERO,
    DEEP_LEVELS,
    MEASURED_NOISE_FACTOR,
    NOISE_FACTOR,
    NOISE_SAMPLE,
    PATTERN_MARGIN,
    PATTERN_PROBES,
    REFINE_LEVELS,
    REFINE_RATIO,
    SCREEN_MARGIN,
    SECOND_STEP,
    VERDICT_CHUNK,
    VJP_LOOP_SECONDS,
    VJP_PROBE_ROUNDING,
    VJP_PROBE_WEIGHTS,
    XLA_MIN_EVALUATIONS,
)
from fastcheck._text import element_name

INCONSISTENT_HINT = ("the reverse-mode gradient disagrees with f's Jacobian along a dense random cotangent (see the "
                     "problem above), although its values at the pattern's nonzeros may agree: look for a missing "
                     "transpose, gradient written to the wrong element, or a gradient that ignores dy; mode='full' on "
                     "a smaller input names the elements.")
TRACED = "traced from f's graph"  # the source of a pattern ``find_patterns`` traced
WRONG_PATTERN_HINT = ("the sparsity pattern misses dependencies of f (see the problem above): each colour's "
                      "difference and VJP mixes in entries outside it, so these elements are undecidable, not wrong.")


# -- kernels -------------------------------------------------------------------------------


def _kernel_path(executor: Executor, evaluations: int) -> str:
    """The route's path, but the graph path instead of XLA for fewer than ``XLA_MIN_EVALUATIONS``."""
    return GRAPH if executor.path == XLA and evaluations < XLA_MIN_EVALUATIONS else executor.path


def _colour_kernel(plan: Plan, position: int, path: str, values, flat_function=None, uniform: bool = False):
    """For colours ``ids``, d_c = step * scales[c] where labels == ids[c], else 0: f(x + d_c) and
    f(x - d_c) as [2 len(ids), m] in the evaluation dtype.  ``scales`` are powers of two (exact:
    the host knows d_c).  One kernel serves the first sweep (the host takes the differences),
    refinement (the host reads the rows it needs) and the pattern probe (labels all 0, a signed
    step): traced once, for any number of colours (an XLA kernel compiles per count, so its
    callers pad to their chunk).  ``uniform``: every label and id is 0 (one colour), d_c = step * scales[c],
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
    """J^T u_c [chunk, n_k] per checked input, u_c the indicator of row colour ``ids[c]``.

    One colour per call is one plain VJP (``tape.gradient``: no vectorisation over
    cotangents); more are one batched ``tape.jacobian`` of the colour sums.
    """
    if chunk > 1:
        def colours(y, labels, ids):
            return tf.linalg.matvec(tf.cast(labels[None, :] == ids[:, None], y.dtype), y)

        return reverse_rows_kernel(plan, path, colours)
    return vjp_kernel(plan, path, lambda y, labels, ids: tf.cast(labels == ids[0], y.dtype))


def _blocked(function, size: int, dtype=np.float64) -> np.ndarray:
    """``function(slice)`` for consecutive blocks of ``size`` elements, into one array: the
    temporaries of each block stay in cache (a fresh 80 MB array per numpy operation costs
    more than the operation at 10^7 elements)."""
    result = np.empty(size, dtype)
    for start in range(0, size, VERDICT_CHUNK):
        part = slice(start, min(start + VERDICT_CHUNK, size))
        result[part] = function(part)
    return result


def _span(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    return ((x + d) - (x - d)).astype(np.float64)


def _steps(plan: Plan, config, x: np.ndarray, dtype=np.float64) -> np.ndarray:
    """``_executor.steps`` (``eps * max(1, |x_j|)``, float64) for the flat values ``x``, block by block,
    rounded to ``dtype`` (no float64 [n] array where the evaluation dtype is narrower)."""
    eps = config.step(MACHINE_EPSILON[plan.eval_dtype])
    return _blocked(lambda part: eps * np.maximum(1.0, np.abs(x[part].astype(np.float64))), x.size, dtype)


def _device_steps(x, eps):
    """``_steps`` of a float32 or float64 tensor, made on the device as the kernels' constant: the same
    float64 operations and one rounding to x's dtype, bit for bit, without an [n] copy from the host
    (10^7 elements: the numpy blocks and ``tf.constant`` took ~0.13 s, this ~0.03 s)."""
    wide = eps * tf.maximum(tf.constant(1.0, tf.float64), tf.abs(tf.cast(tf.reshape(x, [-1]), tf.float64)))
    return tf.cast(wide, x.dtype)


def _compiled(function) -> tuple:
    """(graph, XLA) ``tf.function``s of ``function``, indexed by whether XLA pays (``_large``): XLA fuses its
    passes over 10^7 elements into one, but compiles once per shape (~0.1 s)."""
    return (tf.function(function, autograph=False, reduce_retracing=True),
            tf.function(function, jit_compile=True, autograph=False, reduce_retracing=True))


def _large(config, size: int) -> bool:
    """Whether an array of ``size`` elements is judged and drawn in fused XLA passes (``SCREEN_ELEMENTS``)."""
    return size >= config.table("SCREEN_ELEMENTS")


DEVICE_STEPS = _compiled(_device_steps)


def _take(array: np.ndarray, index) -> np.ndarray:
    """``array[index]``, or ``array`` itself where ``index`` is None (the identity: a diagonal pattern)."""
    return array if index is None else array[index]


def _array(index) -> np.ndarray:
    """An index (a slice over a diagonal pattern's nonzeros, or an array) as an int64 array."""
    return np.arange(index.start, index.stop, dtype=np.int64) if isinstance(index, slice) else index


def _shared(chunk: int, held: int, budget: int) -> int:
    """A batched kernel's chunk (sized by the executor for the whole ``memory_budget``) scaled to
    what the coloured check's own arrays (``held`` bytes: compressed differences and VJPs,
    statuses, the pattern) leave of the budget, at least an eighth of it: the two peak together."""
    return max(1, int(chunk * max(budget - held, budget / 8) / budget))


# -- the numerical side ----------------------------------------------------------------------


class _Differences:
    """The first sweep's differences f(x + d_c) - f(x - d_c), [C, m]: float64 values, held in
    float32 where that is exact.

    For f evaluated in float32 (or narrower) each difference is one of two float32 numbers:
    exact in float32 unless they differ in scale (Sterbenz), so the float32 array holds all
    but a few (outputs crossing zero), which are kept apart as (flat index, float64 value).
    Half the memory of a float64 [C, m] (conv 256x256x8: 151 MB, not 302 MB); the values read
    back are the float64 ones, bit for bit.  One colour (an elementwise f) keeps the kernel's
    f(x + d) and f(x - d) [1, m] as they came instead (``sides``), subtracted in float64 where read:
    the same values without a pass over the outputs to store them, and a lower peak (the copy
    existed beside the kernel's output).
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

    @property
    def nbytes(self) -> int:
        if self.sides is not None:
            return sum(side.nbytes for side in self.sides)
        return self.values.nbytes + self.index.nbytes + self.exact.nbytes

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
        """(x + h) - (x - h) in the evaluation dtype, as float64, at the columns ``cols`` (a slice or an
        index array).  Computed where read, a block at a time, where each column holds one nonzero (a
        stored [n] float64 array is 80 MB of fresh pages at 10^7 elements, slower to fault in than to
        recompute); stored once where columns hold several (layer norm's 64: one gather, not two and
        the arithmetic, per nonzero)."""
        if self._spans is None and self.pattern.nnz > self.x.size:
            self._spans = _blocked(lambda part: _span(self.x[part], self.step[part]), self.x.size)
        if self._spans is not None:
            return self._spans[cols]
        return _span(self.x[cols], self.step[cols])

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
                    y = plan.call_flat_numpy(values, plan.eval_upcast)
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

    def sides(self, rows: np.ndarray, cols: np.ndarray, levels: list[int]):
        """Per level k: f(x + d), f(x - d) at each nonzero's row along its column's colour direction
        at step h / REFINE_RATIO**k, and the spans of its column -- every level not yet evaluated for
        all of these nonzeros in one batch.  The direction is restricted to the columns given: columns
        of one colour share no row, so any subset of them still recovers its nonzeros.

        A (nonzero, level) evaluated before is read back, not evaluated again: f is deterministic (the
        plan checked), and a nonzero's row sees its own column alone.  The refinement under measured
        noise, after a first refinement without it, then reuses that one's ladder (a planted defect at
        10^7 elements: its ~12 evaluations of f once, not twice)."""
        keys = np.asarray(rows, np.int64) * self.x.size + np.asarray(cols, np.int64)
        found: dict = {}
        for level in levels:
            known = self._sides.get(level)
            if known is not None and len(known[0]):
                where = np.minimum(np.searchsorted(known[0], keys), len(known[0]) - 1)
                if np.array_equal(known[0][where], keys):
                    found[level] = (known[1][where], known[2][where])
        missing = [level for level in levels if level not in found]
        if missing:
            plus, minus = self._evaluated(rows, cols, missing)
            for k, level in enumerate(missing):
                found[level] = (plus[k], minus[k])
                old = self._sides.get(level, (np.zeros(0, np.int64), np.zeros(0), np.zeros(0)))
                # Each key once, the earlier evaluation first (np.unique keeps its first occurrence).
                merged, first = np.unique(np.concatenate([old[0], keys]), return_index=True)
                self._sides[level] = (merged, np.concatenate([old[1], plus[k]])[first],
                                      np.concatenate([old[2], minus[k]])[first])
        x, d = self.x[cols], self.step[cols]
        return [(*found[level], _span(x, d * self.dtype(REFINE_RATIO ** -float(level)))) for level in levels]

    def _evaluated(self, rows: np.ndarray, cols: np.ndarray, levels: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """f(x + d), f(x - d) [len(levels), len(rows)] of ``sides``, evaluated: every level in one batch."""
        colour = self.labels[cols].astype(np.int64)
        present, slot = np.unique(colour, return_inverse=True)
        # The steps of the columns given, 0 elsewhere (those stay put), made on the device (no n-sized
        # array from the host); each column once (scatter_nd adds duplicates: a column holds many nonzeros).
        # One colour moves every column, as the sweep did: each row sees its own column alone either way
        # (10^7 elements: no 40 MB scatter for the 5321 elements of a second step).
        labels, step = self.constants()
        if self.colours > 1:
            distinct = np.unique(np.asarray(cols, np.int64))
            step = tf.scatter_nd(tf.constant(distinct[:, None]), tf.constant(self.step[distinct]), [self.x.size])
        factors = [self.dtype(REFINE_RATIO ** -float(k)) for k in levels]
        ids = np.tile(present, len(levels))
        scales = np.repeat(np.array(factors, self.dtype), len(present))
        plus, minus = np.empty((len(levels), len(rows))), np.empty((len(levels), len(rows)))
        where = [np.flatnonzero(slot == c) for c in range(len(present))]

        def consume(part, up, down):
            for k in range(part.start, part.stop):
                level, c = divmod(k, len(present))
                picked = where[c]
                plus[level, picked] = np.asarray(up)[k - part.start, picked]
                minus[level, picked] = np.asarray(down)[k - part.start, picked]

        self.run(labels, step, ids, consume, scales=scales, rows=rows)
        return plus, minus

    def probe(self, seed: int, divide: float = 1.0):
        """(f(x + d) - f(x - d)) / 2 [m] along d = s * h / divide, s random weights of either sign and
        magnitude in [1/2, 1] (drawn from ``seed`` on the device: no n-sized array crosses from the
        host), and the realised direction ((x + d) - (x - d)) / 2 [n].  The colour kernel evaluates
        it: every label 0, the step weighted.  Not signs alone: an entry (i, k) missing from a pattern
        that holds (i, i) mixes into the compressed (i, i) as J_ik h_k / h_i, and equal signs of
        d_i and d_k would cancel it from the probe half the time."""
        _, step = self.constants()
        d = RANDOM_DIRECTION[_large(self.executor.config, self.x.size)](
            step, tf.constant(seed, tf.int32), tf.constant(self.dtype(0.5 / divide)))
        found: list = []

        def consume(part, plus, minus):
            found.append((plus[0], minus[0]))

        kept: list = []
        self.run(self.zero_labels(), d, np.zeros(1, np.int64), consume, what="coloured pattern probe", kept=kept)
        (plus, minus), = found
        return _Probe(plus, minus, view(d), self.x, kept[0] if len(kept) == 1 else None, d)


def _drawn(n, seed):
    """n uint32 draws of a counter-based generator: the lowbias32 hash of each element's index mixed with the
    hashed ``seed`` (int32).  One fused XLA pass (10^7 elements: ~5 ms; TensorFlow's stateless Philox took
    ~45 ms on this CPU, ~3 s compiled by XLA); the probes need draws unrelated to f's structure, which a
    full-avalanche hash of the counter gives, not cryptographic ones."""

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
    """A pattern probe's evaluations: f(x + d), f(x - d) [m] in the evaluation dtype, the direction d
    and x [n]; its float64 values are read where needed (a diagonal pattern's block by block, in cache)."""

    plus: np.ndarray
    minus: np.ndarray
    moved: np.ndarray
    x: np.ndarray
    tensor: tf.Tensor | None = None  # the kernel's [2, m] output (plus, minus) on the device
    moved_tensor: tf.Tensor | None = None

    def value(self, part=slice(None)) -> np.ndarray:
        """(f(x + d) - f(x - d)) / 2 at the outputs ``part`` (a slice or an index array), float64."""
        difference = np.subtract(self.plus[part], self.minus[part], dtype=np.float64)
        difference *= 0.5
        return difference

    def realised(self, part=slice(None)) -> np.ndarray:
        """((x + d) - (x - d)) / 2 at the input elements ``part``, float64."""
        if isinstance(part, slice) and part == slice(None):
            return _blocked(lambda block: _span(self.x[block], self.moved[block]) / 2, self.x.size)
        return _span(self.x[part], self.moved[part]) / 2


# -- the analytical side -----------------------------------------------------------------------


def _analytical(executor: Executor, plan: Plan, patterns: list, row_labels: np.ndarray,
                held: int = 0) -> list[_Analytical]:
    """Reverse-mode values of every nonzero, per checked input (native dtype): one VJP per row colour.

    The VJPs land in one [R, n_k] array per input (R row colours: the Jacobian compressed
    by rows), kept as it is and read at (row colour of i, j) for each nonzero (i, j).
    """
    colours = int(row_labels.max()) + 1 if row_labels.size else 0
    ids = np.arange(colours)
    dtype = plan.native_flat_dtype.as_numpy_dtype
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
        # One plain VJP per call: its kernel traces in a fraction of the batched tape.jacobian's
        # time (conv 32x32x8, 72 row colours: ~30 ms against ~110 ms) and the extra forward
        # pass per colour costs less than that difference.
        chunk = 1
    # One row colour (an elementwise f): the device's zeros, not a copy of an m-sized array.
    labels_t = tf.zeros([len(row_labels)], tf.int32) if colours == 1 else tf.constant(row_labels.astype(np.int32))

    probes: list = []

    def call(size, part, count):
        path = _kernel_path(executor, 4 * colours)
        if colours == 1 and size == 1:
            paired = _paired_vjps(executor, path)
            if paired is not None:
                out, probe = paired[: len(compressed)], paired[len(compressed) :]
                kept.append(out)
                probes.extend(tf.reshape(g, [-1]) for g in probe)
                consume(part, [view(b) for b in out])
                return
        kernel = executor.kernel(("coloured vjp", size, path), lambda: _vjp_kernel(executor.plan, path, size))
        out = kernel(executor.native, labels_t, tf.constant(pad(ids[part], size), tf.int32))
        if colours == 1 and size == 1:
            kept.append(out)
        consume(part, [view(b)[:count] for b in out])

    def eager():
        vjp = _eager_vjp(executor, plan, [s.position for s in plan.checked])
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


def _probe_vjps(executor: Executor, plan: Plan, positions: list[int], weights: tf.Tensor) -> list:
    """J^T w (flat, per input at ``positions``) for the cotangent ``weights`` [m]: one call of a compiled VJP
    kernel where the row colours' ran compiled (10^7 elements: ~35 ms against ~60 ms eagerly), else eagerly."""
    found: list = []
    order = [s.position for s in plan.checked]

    def call(size, part, count):
        path = _kernel_path(executor, 4)
        kernel = executor.kernel(("coloured vjp probe", path),
                                 lambda: vjp_kernel(executor.plan, path, lambda y, w: tf.cast(w, y.dtype)))
        grads = kernel(executor.native, weights)
        found.extend(tf.reshape(grads[order.index(p)], [-1]) for p in positions)

    def eager():
        found.extend(_eager_vjp(executor, plan, positions)(weights))

    batch = Batch("coloured VJP probe", "coloured vjp probe", 1, subject="coloured mode", unit="VJPs", item="VJP",
                  advice="pass a smaller problem or a device with more memory.", spread=False, progress=False)
    executor.chunked(batch, 1, call, eager)
    return found


def _eager_vjp(executor: Executor, plan: Plan, positions: list[int]):
    """``vjp(weights)``: J^T w (flat, per input at ``positions``) for a cotangent given flat over
    f's outputs [m], from one eager pass of f on a persistent tape -- or one pass per call where
    f's gradient runs only once per pass (a custom gradient that calls ``tape.gradient`` on a
    non-persistent tape it closes over raises RuntimeError the second time)."""
    state: dict = {"pass": None, "shared": True}

    def forward():
        values = [tf.identity(v) for v in executor.native]
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


# -- verdicts -------------------------------------------------------------------------------------


def _noise(plan: Plan, rows, spans: np.ndarray) -> np.ndarray:
    """``_compare.rounding_noise`` for single elements (row, span) rather than an outer product
    (``rows``: an index array, a slice, or None for every row)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        level = np.abs(_take(plan.eval_output, rows))
        level *= NOISE_FACTOR * plan.row_epsilon_at(rows)
        if plan.noise is not None:
            np.maximum(level, MEASURED_NOISE_FACTOR * _take(plan.noise.sigma, rows), out=level)
        # One test after the division, not one before it too: a level that is not finite stays so
        # divided by a span (or turns NaN), and both became 0 -- the same values, one pass less.
        level /= np.abs(spans)
        level[~np.isfinite(level)] = 0.0
        return level


def _verdicts(a, numerical, noise, atol, rtol):
    status, band = _compare.verdicts(a[None, :], numerical[None, :], noise[None, :], atol, rtol)
    return status[0], band[0]


@dataclasses.dataclass
class _Block:
    """The nonzeros of one checked input and everything known about them.

    Held per nonzero: the status (int8) only.  Numerical values are read off the colours'
    differences ``compressed`` [C, m] (nonzero (i, j) = D[colour of j, i] / span_j), analytical
    ones off ``analytical``; bands are recomputed from the last judgement's rule; refined
    nonzeros override both (``override``).
    """

    spec: InputSpec
    pattern: _pattern.Pattern
    columns: _Columns
    analytical: _Analytical
    compressed: _Differences | None = None
    status: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int8))
    # (sorted nonzero indices, numerical, band) that refinement settled; ``reset`` drops them.
    override: tuple | None = None
    # (plan, atol, rtol) of the last judgement: what the bands are computed under.
    rule: tuple | None = None
    # The nonzeros not OK after the last judgement (ascending): later stages change only statuses that
    # are not OK, so those not OK now are among them (10^7 statuses: no pass over them all to find 5321).
    flagged: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    one_sided: dict = dataclasses.field(default_factory=dict)
    cleared: int = 0  # nonzeros the last judgement's device screen passed (``_screen``)
    wrong_pattern: bool = False
    inconsistent: bool = False  # the reverse-mode gradient failed the dense cotangent probe

    @property
    def nnz(self) -> int:
        return self.pattern.nnz

    def parts(self, start: int = 0, stop: int | None = None):
        """Consecutive slices of at most ``VERDICT_CHUNK`` nonzeros over ``start:stop``."""
        stop = self.nnz if stop is None else stop
        for first in range(start, stop, VERDICT_CHUNK):
            yield slice(first, min(first + VERDICT_CHUNK, stop))

    def where(self, part: slice):
        """(rows, cols) of the nonzeros ``part``: slices for a diagonal pattern (no gather)."""
        if self.pattern.diagonal:
            return part, part
        return self.pattern.entries(part.start, part.stop)

    def first_sweep(self, rows, cols, spans: np.ndarray) -> np.ndarray:
        """The first sweep's quotient of each nonzero (float64, a fresh array); ``spans`` are its columns'."""
        compressed = self.compressed
        assert compressed is not None, "sweep() first"
        colours = None if compressed.colours == 1 else self.columns.labels[cols]
        differences = compressed.take(colours, rows)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            differences /= spans
        return differences

    def values(self, part, bands: bool = False):
        """(rows, cols, analytical, numerical[, band]) of the nonzeros ``part`` (a slice, or an
        index array), refinement applied."""
        rows, cols, a, spans, numerical = self._read(part)
        band = None
        if bands:
            assert self.rule is not None, "judge() first"
            plan, atol, rtol = self.rule
            _, band = _verdicts(a, numerical, _noise(plan, rows, spans), atol, rtol)
        if self.override is not None:
            index, values, refined_band = self.override
            if isinstance(part, slice):
                lo, hi = np.searchsorted(index, [part.start, part.stop])
                mine, theirs = index[lo:hi] - part.start, slice(lo, hi)
            else:
                found = np.minimum(np.searchsorted(index, part), len(index) - 1)
                mine = np.flatnonzero(index[found] == part)
                theirs = found[mine]
            numerical[mine] = values[theirs]
            if band is not None:
                band[mine] = refined_band[theirs]
        return (rows, cols, a, numerical, band) if bands else (rows, cols, a, numerical)

    def _read(self, part):
        """(rows, cols, analytical, spans, first-sweep numerical) of the nonzeros ``part``."""
        rows, cols = self.where(part) if isinstance(part, slice) else self.pattern.at(part)
        spans = self.columns.span(cols)
        return rows, cols, self.analytical.at(rows, cols), spans, self.first_sweep(rows, cols, spans)

    def materialise(self, start: int, stop: int):
        """(rows, cols, analytical, numerical, band) as whole arrays over ``start:stop`` (a small pair's report)."""
        found = [self.values(part, bands=True) for part in self.parts(start, stop)]
        if not found:
            empty = np.zeros(0)
            return np.zeros(0, np.int64), np.zeros(0, np.int64), empty, empty, empty
        return tuple(np.concatenate([_array(f[k]) for f in found]) for k in range(5))

    def sweep(self) -> None:
        """One central difference per colour, kept compressed: [C, m]."""
        self.compressed = self.columns.sweep()

    def reset(self) -> None:
        """Back to the first sweep's values (before a new judgement under measured noise)."""
        self.override, self.one_sided = None, {}

    def judge(self, plan: Plan, atol: float, rtol: float, beside=None, among: np.ndarray | None = None) -> None:
        """The status of every nonzero under the rounding (or measured) noise, block by block;
        ``beside(part, numerical, band)``, when given, reads each block's values and bands as they
        are judged (what ``values(part, bands=True)`` would compute again).  ``among``: the nonzeros
        a screen (``_screen``) did not clear, the only ones judged; every other one is OK."""
        assert self.override is None, "reset() first"
        self.rule = (plan, atol, rtol)
        self.cleared = 0 if among is None else self.nnz - len(among)
        if among is not None:
            self.status = np.zeros(self.nnz, np.int8)  # OK is 0 (fresh zero pages: only the judged ones written)
            self.flagged = np.zeros(0, np.int64)
            if len(among):
                rows, _, a, spans, numerical = self._read(among)
                status, _ = _verdicts(a, numerical, _noise(plan, rows, spans), atol, rtol)
                self.status[among] = status
                self.flagged = among[status != 0]
            return
        status = self.status if self.status.size == self.nnz else np.empty(self.nnz, np.int8)
        flagged = []
        for part in self.parts():
            rows, _, a, spans, numerical = self._read(part)
            status[part], band = _verdicts(a, numerical, _noise(plan, rows, spans), atol, rtol)
            flagged.append(np.flatnonzero(status[part]) + part.start)  # OK is 0
            if beside is not None:
                beside(part, numerical, band)
        self.status = status
        self.flagged = np.concatenate(flagged) if flagged else np.zeros(0, np.int64)

    def refine(self, plan: Plan, atol: float, rtol: float) -> None:
        """Failing nonzeros: their colours again at h/4 (the second step, ``_compare.second_step``), then
        those it does not pass at h ... h/4**5 (h ... h/4**12 where still unsettled)."""
        failing = having(self.status, _compare.MISMATCH, _compare.NUMERICAL_NONFINITE, among=self.flagged)
        if not len(failing):
            return
        rows, cols = self.pattern.at(failing)
        a = self.analytical.at(rows, cols)

        def still_open(found: _compare.Refined) -> np.ndarray:
            status, _ = _verdicts(a, found.estimate[0], found.error[0], atol, rtol)
            return ((status == _compare.MISMATCH) & ~found.settled[0]) | (status == _compare.NUMERICAL_NONFINITE)

        # The second step: most failures of a first sweep at 10^7 elements are float32's truncation where f' is
        # near 0, which h/4 and Richardson's extrapolation pass; only the rest go down the ladder.
        spans = self.columns.span(cols)
        first = self.first_sweep(rows, cols, spans)[None, :]
        first_noise = _noise(plan, rows, spans)[None, :]

        def passes(rungs: Rungs):
            (second, second_noise, *_), = rungs.levels
            return _compare.second_step(a[None, :], first, first_noise, second, second_noise, atol, rtol, REFINE_RATIO)

        found = descend(self._ladder(plan, rows, cols), len(failing), range(0, REFINE_LEVELS + 1), still_open,
                        range(0, DEEP_LEVELS + 1), early=Early((SECOND_STEP,), passes)).at(0)
        status, band = _verdicts(a, found.estimate, found.error, atol, rtol)
        ks = np.flatnonzero(status == _compare.MISMATCH)
        found_ks = found.at(ks)
        status[ks], reported = _compare.classify(a[ks], found_ks, atol, rtol)
        for k, left, right in zip(ks[reported], found_ks.left[reported], found_ks.right[reported]):
            self.one_sided[(int(failing[k]),)] = (float(left), float(right))
        self.override = (failing, np.asarray(found.estimate, np.float64), np.asarray(band, np.float64))
        self.status[failing] = status

    def _ladder(self, plan: Plan, rows: np.ndarray, cols: np.ndarray) -> Evaluate:
        """The evaluation ``descend`` drives for the nonzeros (rows, cols): a selection of them at steps
        h / 4**p, elements as columns of one row (h, p = 0, is the first sweep's step again, with its sides:
        the sweep keeps none; a kink crossed at h and h/4 then shows at two steps, as in full mode).

        Each element's row value f(x) is subtracted from its sides, so the shared
        ``y0`` of ``refine`` is 0 (its one-sided quotients and second differences only
        ever use differences from f(x)).
        """

        def evaluate(selection: np.ndarray, powers) -> Rungs:
            chosen = rows[selection]
            y0 = plan.eval_output[chosen]
            stack: list[tuple] = []
            for plus, minus, spans in self.columns.sides(chosen, cols[selection], list(powers)):
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    derivative = (plus - minus) / spans
                noise = _noise(plan, chosen, spans)
                stack.append((derivative[None, :], noise[None, :], (plus - y0)[None, :], (minus - y0)[None, :], spans))
            return Rungs(stack, np.zeros(1), self.grid(plan, chosen)[None, :])

        return evaluate

    def grid(self, plan: Plan, rows: np.ndarray) -> np.ndarray:
        """f's grid per element, for the test of steps below what f resolves (``_compare._below_quantum``:
        sides come back exactly f(x) after a coarser step moved f by a few quanta; their zero quotients
        would otherwise look like a settled ladder, or a step that resolves a kink).  The measured noise
        where there is one (its largest over ``rows``), floored by the outputs' own rounding: one unit
        roundoff of the terms f_i sums, sum_j |a_ij x_j| (a float32 convolution's output near 0 moves in
        steps of its partial sums' roundoff, far above |f_i|'s), and of |f_i| -- the measurement can read 0
        on rows it sampled."""
        eps = MACHINE_EPSILON[plan.eval_dtype]
        grid = eps * np.maximum(np.abs(plan.eval_output[rows]), self.row_terms(rows)) / np.sqrt(12.0)
        if plan.noise is not None:
            grid = np.maximum(grid, float(np.max(plan.noise.sigma[rows], initial=0.0)))
        return grid

    def row_terms(self, rows: np.ndarray) -> np.ndarray:
        """sum_j |a_ij x_j| over each row's nonzeros (f_i's terms were it linear), per entry of ``rows``."""
        x = self.columns.x
        if self.pattern.diagonal:
            return np.abs(np.asarray(self.analytical.at(rows, rows), np.float64) * x[rows])
        unique, inverse = np.unique(np.asarray(rows, np.int64), return_inverse=True)
        indptr = self.pattern.indptr
        counts = indptr[unique + 1] - indptr[unique]
        owner = np.repeat(np.arange(len(unique)), counts)
        r, c = self.pattern.at(_pattern.ranges(indptr[unique], counts))
        with np.errstate(invalid="ignore", over="ignore"):
            terms = np.abs(np.asarray(self.analytical.at(r, c), np.float64) * x[c])
        sums = np.bincount(owner, weights=np.where(np.isfinite(terms), terms, 0.0), minlength=len(unique))
        return sums[inverse]


def _outside(plan: Plan, part, value, predicted, spread, realised, eps):
    """(|value - predicted|, PATTERN_MARGIN * (spread + rounding)) for the rows ``part``; with
    ``realised``, ``predicted`` and ``spread`` are per-row values and bands to scale by it."""
    with np.errstate(invalid="ignore", over="ignore"):
        if realised is not None:
            predicted = np.where(np.isfinite(predicted), predicted * realised, 0.0)
            spread = np.abs(spread * realised)
        rounding = np.abs(plan.eval_output[part]) * (NOISE_FACTOR * eps)
        if plan.noise is not None:
            rounding = np.maximum(rounding, MEASURED_NOISE_FACTOR * plan.noise.sigma[part])
        return np.abs(value - predicted), PATTERN_MARGIN * (spread + rounding)


class _Exceeded:
    """A diagonal pattern's probe read block by block: the rows where |J d - N d| exceeds what it may be
    (every row of ``where`` when given), with both."""

    def __init__(self, plan: Plan, probe: _Probe, where=None):
        self.plan, self.probe, self.where = plan, probe, where
        self.eps = MACHINE_EPSILON[plan.eval_dtype]
        self._found: list = []

    def read(self, part, numerical: np.ndarray, band: np.ndarray) -> None:
        """The rows ``part`` (a slice, or an index array of rows) with their values and bands."""
        probe, where = self.probe, self.where
        coarse, allowed = _outside(self.plan, part, probe.value(part), numerical, band, probe.realised(part), self.eps)
        with np.errstate(invalid="ignore"):
            keep = np.arange(len(coarse)) if where is not None else np.flatnonzero(coarse > allowed)
        if len(keep):
            index = where[keep] if where is not None else (keep + part.start if isinstance(part, slice) else part[keep])
            self._found.append((index, coarse[keep], allowed[keep]))

    def found(self) -> tuple:
        if not self._found:
            return np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
        return tuple(np.concatenate(parts_) for parts_ in zip(*self._found))


def _probe_signs(seed: int, count: int):
    """The pattern probes' seeds, in order."""
    rng = np.random.default_rng(seed + 7919)
    for _ in range(count):
        yield int(rng.integers(0, 2**31 - 1))


def _pattern_probes(block: _Block, source: str) -> int:
    """Random dense probes of ``block``'s pattern: none for a traced diagonal one (each output element depends on
    its own input element alone), which is trusted as the element-wise walk trusts it (``_diagonal``): its probe
    would cost as much as its sweep, and the trace's rules are what the walk reads; ``PATTERN_PROBES`` for every
    other pattern (a given one above all)."""
    return 0 if source == TRACED and block.pattern.diagonal else PATTERN_PROBES


def _judged(plan: Plan, blocks: list[_Block], atol: float, rtol: float, seed: int, source: str) -> list:
    """``judge`` every block; a diagonal pattern's first pattern probe is evaluated first and read beside
    the verdicts, block by block (its values and bands are the judgement's: one pass over 10^7 elements,
    not two): per block, (the probe's seed, its ``_Exceeded``), or None."""
    firsts: list = []
    for block in blocks:
        signs = next(_probe_signs(seed, _pattern_probes(block, source)), None)
        if signs is None or not block.pattern.diagonal or block.nnz != plan.m:
            left = _screen(plan, block, None, atol, rtol)
            block.judge(plan, atol, rtol, among=None if left is None else left[0])
            firsts.append(None)
            continue
        exceeded = _Exceeded(plan, block.columns.probe(signs, 1.0))
        left = _screen(plan, block, exceeded.probe, atol, rtol)
        if left is None:
            block.judge(plan, atol, rtol, beside=exceeded.read)
        else:  # numpy's rule on what the screen left: the verdicts' and the probe's rows
            judged, probed = left
            block.judge(plan, atol, rtol, among=judged)
            if len(probed):
                _, _, _, numerical, band = block.values(probed, bands=True)
                exceeded.read(probed, numerical, band)
        firsts.append((signs, exceeded))
    return firsts


def _screen(plan: Plan, block: _Block, probe: _Probe | None, atol: float, rtol: float) -> tuple | None:
    """(nonzeros, probe rows) that numpy's rule must judge, of a large diagonal block whose sweep, VJP and first
    pattern probe (if any) are on the device: one fused pass (``_screened``) clears the rest, each with its error
    below ``SCREEN_MARGIN`` of what the rule allows it -- verdicts that do not depend on how the pass rounds.
    None where the block does not qualify (numpy judges it all): below ``SCREEN_ELEMENTS`` nonzeros, f's noise
    measured (per-row allowances), a complex input or output, or values the eager path left on the host."""
    sides, vjp = block.compressed.tensor if block.compressed is not None else None, block.analytical.tensor
    if (not _large(block.columns.executor.config, block.nnz) or not block.pattern.diagonal or block.nnz != plan.m or plan.noise is not None
            or plan.uniform_epsilon is None or sides is None or vjp is None
            or (probe is not None and probe.tensor is None)
            or block.columns.step_tensor is None or len(plan.outputs) != 1 or plan.outputs[0].dtype.is_complex
            or block.spec.is_complex):
        return None
    columns = block.columns
    noise, rounding = (NOISE_FACTOR * float(e) for e in (plan.uniform_epsilon, MACHINE_EPSILON[plan.eval_dtype]))
    try:
        judged, probed = _screened(
            sides, tf.reshape(columns.executor.values[columns.position], [-1]), columns.step_tensor,
            tf.reshape(vjp, [-1]), _centre(plan),
            *(tf.constant(v, tf.float64) for v in (atol, rtol, noise, rounding, PATTERN_MARGIN, SCREEN_MARGIN)),
            probe=None if probe is None else tf.reshape(probe.tensor, [2, -1]),
            moved=None if probe is None else probe.moved_tensor)
    except tf.errors.OpError:  # no XLA for this device or dtype, or no memory for the pass: numpy judges it all
        return None
    return np.flatnonzero(view(judged)), (np.zeros(0, np.int64) if probed is None else np.flatnonzero(view(probed)))


def _centre(plan: Plan) -> tf.Tensor:
    """f(x) flat [m] as the numerical side computed it, on the device: f's own output where it is that
    (float64 ``eval_output`` is it, exactly), else a copy of ``eval_output``."""
    leaves = [leaf for leaf, keep in zip(tf.nest.flatten(plan.structure), plan.leaf_is_output) if keep]
    if (not plan.eval_upcast and len(leaves) == 1 and isinstance(leaves[0], tf.Tensor)
            and leaves[0].dtype == plan.eval_flat_dtype):
        return tf.reshape(leaves[0], [-1])
    return tf.constant(plan.eval_output)


@tf.function(jit_compile=True, autograph=False, reduce_retracing=True)
def _screened(sides, x, step, vjp, centre, atol, rtol, noise_factor, rounding_factor, pattern_margin, margin,
              probe=None, moved=None):
    """The masks (not cleared by the element rule, not cleared by the pattern probe) [m] of a diagonal block:
    ``_compare``'s rule and ``_Exceeded``'s test with every allowance scaled by ``margin``, as ``_noise``,
    ``_span``, ``first_sweep`` and ``_outside`` compute them, in one fused pass (a value that is not finite
    clears nothing)."""
    wide = functools.partial(tf.cast, dtype=tf.float64)
    span = wide((x + step) - (x - step))
    numerical = (wide(sides[0]) - wide(sides[sides.shape[0] // 2])) / span  # f(x + d) first, f(x - d) half way
    analytical, centre = wide(vjp), tf.abs(wide(centre))
    noise = centre * noise_factor / tf.abs(span)
    noise = tf.where(tf.math.is_finite(noise), noise, tf.zeros_like(noise))
    band = _compare.allowance(numerical, atol, rtol, noise)
    finite = tf.math.is_finite(numerical) & tf.math.is_finite(analytical)
    cleared = finite & (tf.abs(analytical - numerical) <= margin * band)
    if probe is None:
        return tf.logical_not(cleared), None
    realised = wide((x + moved) - (x - moved)) / 2
    predicted = numerical * realised
    predicted = tf.where(tf.math.is_finite(predicted), predicted, tf.zeros_like(predicted))
    allowed = pattern_margin * (tf.abs(band * realised) + centre * rounding_factor)
    within = tf.abs((wide(probe[0]) - wide(probe[1])) * 0.5 - predicted) <= margin * allowed
    return tf.logical_not(cleared), tf.logical_not(within)


def _pattern_problem(block: _Block, plan: Plan, seed: int, source: str, read=None) -> str | None:
    """Whether random dense probes find Jacobian mass outside the pattern (confirmed at h/4); ``read``:
    the first probe as ``_judged`` read it."""
    m = plan.m
    eps = MACHINE_EPSILON[plan.eval_dtype]
    pattern = block.pattern

    def excess(signs, divide, where=None):
        """(rows, |J d - sum N_ij d_j|, what it may be: rounding and the nonzeros' bands) at the rows
        where it is exceeded (at ``where`` when given)."""
        if where is None and divide == 1.0 and read is not None and read[0] == signs:
            return read[1].found()  # read beside the verdicts (``_judged``)
        probe = block.columns.probe(signs, divide)
        if pattern.diagonal:  # block by block, in cache; only the exceeded rows kept
            exceeded = _Exceeded(plan, probe, where)
            for part in [where] if where is not None else block.parts(0, m):
                _, _, _, numerical, band = block.values(part, bands=True)
                exceeded.read(part, numerical, band)
            return exceeded.found()
        # sum_j N_ij d_j and the bands' spread per row, accumulated block by block (rows ascend).
        value, realised = probe.value(), probe.realised()
        predicted, spread = np.zeros(m), np.zeros(m)
        for part in block.parts():
            rows, cols, _, numerical, band = block.values(part, bands=True)
            if not len(rows):
                continue
            moved = realised[cols]
            first = int(rows[0])
            local = rows - first
            with np.errstate(invalid="ignore", over="ignore"):
                span = slice(first, int(rows[-1]) + 1)
                predicted[span] += np.bincount(local, weights=np.where(np.isfinite(numerical), numerical * moved, 0.0))
                spread[span] += np.bincount(local, weights=(band * moved) ** 2)
        np.sqrt(spread, out=spread)
        coarse, allowed = _outside(plan, slice(None), value, predicted, spread, None, eps)
        with np.errstate(invalid="ignore"):
            index = np.flatnonzero(coarse > allowed) if where is None else where
        return index, coarse[index], allowed[index]

    for signs in _probe_signs(seed, _pattern_probes(block, source)):
        index, coarse, allowed = excess(signs, 1.0)
        if not len(index):
            continue
        # Mass outside the pattern scales with the step: it stays at a quarter of it (a
        # truncation effect of the dense direction shrinks 16-fold).
        _, fine, fine_allowed = excess(signs, REFINE_RATIO, index)
        with np.errstate(invalid="ignore"):
            outside = (fine > fine_allowed) & (REFINE_RATIO * fine >= 0.5 * coarse)
        if outside.any():
            k = int(np.argmax(np.where(outside, coarse / np.maximum(allowed, 1e-300), 0.0)))
            worst = int(index[k])
            output = next(o for o in plan.outputs if o.offset <= worst < o.offset + o.size)
            shape = tuple(output.shape) + ((2,) if output.dtype.is_complex else ())
            where = element_name(output.name, tuple(int(i) for i in np.unravel_index(worst - output.offset, shape)) if shape
                           else ())
            return (f"the sparsity pattern ({source}) is wrong for {block.spec.name}: f depends on elements outside it "
                    f"(a random direction moves {where} by {coarse[k]:.3g} more than the pattern's nonzeros "
                    f"predict, allowed {allowed[k]:.3g}; {int(outside.sum())} output element(s) so). The "
                    "element verdicts cover only the pattern's nonzeros: pass the right sparsity=, or mode='full'.")
    return None


def _probes(executor: Executor, plan: Plan, blocks: list, source: str, atol: float, supplied: bool, firsts: list):
    """(problems, blocks with a wrong pattern, [(block, text)] whose reverse-mode gradient is off it):
    the pattern probe on every block (its first as ``_judged`` read it), then the VJP probe on those
    whose pattern holds."""
    problems, wrong = [], []
    for block, first in zip(blocks, firsts):
        problem = _pattern_problem(block, plan, executor.config.seed, source, first)
        if problem:
            problems.append(problem)
            wrong.append(block)
    # Under a wrong pattern the compressed values mix in entries outside it: no element
    # verdict can be read off them, so their disagreements are undecidable, not mismatches.
    for block in wrong:
        block.wrong_pattern = True
        block.status[np.flatnonzero(block.status)] = _compare.UNRESOLVED  # OK is 0
    judged = [b for b in blocks if not any(b is w for w in wrong)]
    inconsistent = [] if supplied else _vjp_problems(executor, plan, judged, atol)
    for block, _ in inconsistent:
        block.inconsistent = True
    return problems, wrong, inconsistent


def _vjp_problems(executor: Executor, plan: Plan, blocks: list, atol: float) -> list:
    """(block, text) for each checked input whose reverse-mode gradient is not what its row
    colours' VJPs say: J^T u for one dense random cotangent u differs from the recovered
    nonzeros' sum at some input element.

    Each row colour's VJP is read only at the pattern's nonzeros, so a VJP that writes to
    other input elements (a missing transpose, gradient leaked to the wrong element) or
    is not linear in its cotangent (ignores dy) could look right element by element: the
    dense cotangent sees all of it.  The numerical side's pattern probe has confirmed that
    f's Jacobian holds no mass outside the pattern, so the disagreement is the gradient's.
    """
    if not blocks:
        return []
    dtype = plan.native_flat_dtype
    # Drawn on the device in the native dtype, which holds these weights exactly (10^7 cotangents: ~5 ms;
    # from the host, a numpy draw and a fresh 40 MB tensor took ~190 ms).
    weights_t = _vjp_weights(executor, plan)
    grads = [b.analytical.take_probe() for b in blocks]
    if any(g is None for g in grads):
        grads = _probe_vjps(executor, plan, [b.spec.position for b in blocks], weights_t)
    weights = view(weights_t)
    # The rounding of the precision f computes in, where measured lower than its dtype's (a bfloat16 op inside).
    eps = max(float(np.finfo(dtype.as_numpy_dtype).eps) if dtype.is_floating else 2.0**-52,
              PRECISION_EPSILON.get(plan.precision, 0.0) if plan.noise is not None else 0.0)
    floor = atol * float(np.max(np.abs(VJP_PROBE_WEIGHTS)))
    found = []
    for block, grad in zip(blocks, grads):
        probe = view(grad)
        n = probe.size

        def judged(columns, predicted, magnitude, probe=probe):
            """(input elements, |J^T u - predicted|, allowed) where the probe exceeds the allowance."""
            value = probe[columns].astype(np.float64)
            with np.errstate(invalid="ignore"):
                error = np.abs(value - predicted)
                allowed = floor + VJP_PROBE_ROUNDING * eps * (magnitude + np.abs(value))
                bad = np.flatnonzero(np.isfinite(value) & np.isfinite(predicted) & (error > allowed))
            index = bad + columns.start if isinstance(columns, slice) else columns[bad]
            return index, error[bad], allowed[bad], value[bad], predicted[bad]

        parts = []
        if block.pattern.diagonal:  # one nonzero per column: judged block by block, no n-sized temporaries
            for part in block.parts():
                term = weights[part] * block.analytical.at(part, part)  # exact: u is a power of two
                # Where the probe is exactly u_j a_jj (an elementwise f's VJP scales with its cotangent), its
                # error is 0 and passes: the rule runs on the other elements only.
                differ = np.flatnonzero(probe[part] != term)
                if len(differ):
                    wide = term[differ].astype(np.float64)
                    parts.append(judged(differ + part.start, wide, np.abs(wide)))
        else:
            predicted, magnitude = np.zeros(n), np.zeros(n)
            for part in block.parts():
                rows, cols = block.where(part)
                # u_i a_ij in the native dtype: exact (u is a power of two).  A non-finite a makes its
                # column's sums non-finite, and such a column is not judged here (its status says so).
                term = weights[rows] * block.analytical.at(rows, cols)
                # Into the columns' range only (consecutive rows' columns lie close): no n-sized temporaries.
                lo, hi = int(cols.min(initial=0)), int(cols.max(initial=-1)) + 1
                local = cols - lo
                predicted[lo:hi] += np.bincount(local, weights=term, minlength=hi - lo)
                magnitude[lo:hi] += np.bincount(local, weights=np.abs(term), minlength=hi - lo)
            for first in range(0, n, VERDICT_CHUNK):
                span = slice(first, min(first + VERDICT_CHUNK, n))
                parts.append(judged(span, predicted[span], magnitude[span]))
        bad, error, allowed, probe_bad, predicted_bad = (np.concatenate(k) for k in zip(*parts)) if parts else \
            (np.zeros(0, np.int64),) * 5
        if not len(bad):
            continue
        k = int(np.argmax(error / np.maximum(allowed, 1e-300)))
        worst = int(bad[k])
        shape = tuple(block.spec.real_view.shape)
        where = element_name(block.spec.name, tuple(int(i) for i in np.unravel_index(worst, shape)) if shape else ())
        found.append((block, (
            f"the reverse-mode gradient of {block.spec.name} is not the transpose of f's Jacobian: for a random "
            f"cotangent u, (J^T u) at {where} is {probe_bad[k]:.8g}, but the Jacobian's nonzeros in that column "
            f"(read off one VJP per row colour) give {predicted_bad[k]:.8g} (allowed difference {allowed[k]:.3g}); "
            f"{len(bad)} of {n} input element(s) so. The VJP writes gradient where f does not depend on the input, "
            "or does not scale with its cotangent dy (a missing transpose or reversal, gradient sent to the wrong "
            "element, a gradient that ignores dy)")))
    return found


# -- the report -------------------------------------------------------------------------------------


def _pairs(plan: Plan, blocks: list[_Block], atol, rtol, output_name, side: str,
           dense_entries: int) -> list[PairReport]:
    """One ``PairReport`` per (output, input): over ``Dense`` arrays up to ``dense_entries`` entries (the
    ``DENSE_REPORT_ENTRIES`` table entry; zeros
    outside the pattern), else over the block's ``Nonzeros``, read off its compressed arrays."""
    pairs = []
    for block in blocks:
        spec, pattern = block.spec, block.pattern
        input_shape = tuple(spec.real_view.shape)
        for output in plan.outputs:
            output_shape = tuple(output.shape) + ((2,) if output.dtype.is_complex else ())
            # (A diagonal pattern's nonzero k is (k, k): no index table needed.)
            lo, hi = ((output.offset, output.offset + output.size) if pattern.diagonal else
                      (int(pattern.indptr[output.offset]), int(pattern.indptr[output.offset + output.size])))
            one_sided: dict = {(k - lo,): v for (k,), v in block.one_sided.items() if lo <= k < hi}
            storage: Dense | Nonzeros
            if output.size * spec.size <= dense_entries:
                rows, cols, analytical, numerical, band = block.materialise(lo, hi)
                rows = rows - output.offset
                status = block.status[lo:hi]
                dense = []
                for x, fill in zip((numerical, analytical, status, band), (0.0, 0.0, _compare.OK, atol)):
                    array = np.full((output.size, spec.size), fill, dtype=x.dtype)
                    array[rows, cols] = x
                    dense.append(array)
                storage = Dense(*dense)
                one_sided = {(int(rows[k]), int(cols[k])): v for (k,), v in one_sided.items()}
            else:
                storage = Nonzeros(block, lo, hi, output.offset, (output.size, spec.size))
            pair = PairReport(output_name or output.name, spec.name, output_shape, input_shape, storage, atol, rtol,
                              one_sided=one_sided, side=side, inconsistent=block.inconsistent)
            pair.hint = (WRONG_PATTERN_HINT if block.wrong_pattern else INCONSISTENT_HINT if block.inconsistent
                         else pair.diagnose())
            pairs.append(pair)
    return pairs


# -- the strategy ---------------------------------------------------------------------------------------


def find_patterns(executor: Executor, plan: Plan) -> tuple[list[_pattern.Pattern], str]:
    """(one pattern per checked input, where it came from); ``UnknownSparsity`` when there is none."""
    sizes, names = [s.size for s in plan.checked], [s.name for s in plan.checked]
    given = executor.config.sparsity
    if given is not None:
        return given.patterns(plan.m, sizes, names), "given by sparsity="
    function: Any = executor.route.flat_function
    if not callable(function):
        function = tf.function(lambda *vs: plan.call_flat(list(vs), plan.eval_upcast), autograph=plan.autograph)
    signature = [tf.TensorSpec(v.shape, v.dtype) for v in executor.values]
    try:
        graph = function.get_concrete_function(*signature).graph
        m, dep = _sparsity.trace(graph, [(s.position, s.size) for s in plan.checked])
    except _pattern.UnknownSparsity as error:
        raise _pattern.UnknownSparsity(
            f"mode='coloured' needs the sparsity pattern of f's Jacobian, but {error}. Pass the pattern with "
            "sparsity= (a boolean [m, n] array, (rows, cols) index pairs or a scipy.sparse matrix), or "
            "mode='full' / mode='fast'.") from None
    except Exception as error:  # f cannot be traced: no graph to read dependencies from
        raise _pattern.UnknownSparsity(
            f"mode='coloured' traces f to find its Jacobian's sparsity pattern, but f cannot be traced "
            f"({type(error).__name__}: {first_line(error, 160)}); pass sparsity=, or mode='full' / mode='fast'.") from None
    return _sparsity.traced_patterns(m, dep, sizes), TRACED


def check_coloured(executor: Executor, plan: Plan, timings: dict, supplied=None, output_name=None,
                   twin: bool = True) -> Outcome:
    """Element-wise verdicts on every structural nonzero (see the module docstring)."""
    try:
        return _check(executor, plan, timings, supplied, output_name)
    except (TypeError, ValueError, GradientCheckError, MemoryError):
        raise
    except Exception as error:  # f failed inside a batched kernel: say so, keep the cause
        raise kernel_failure(error) from error


@dataclasses.dataclass(frozen=True, eq=False)
class Layout:
    """What the coloured check needs before it evaluates anything: one pattern per checked
    input, where they came from, each input's column colours and the row colours."""

    patterns: list
    source: str
    labels: list  # [n_k] column colours per checked input
    row_labels: np.ndarray  # [m] row colours (over all checked inputs' columns)

    @property
    def colours(self) -> list[int]:
        return [int(lab.max()) + 1 if lab.size else 0 for lab in self.labels]

    @property
    def row_colours(self) -> int:
        return int(self.row_labels.max()) + 1 if self.row_labels.size else 0


LAYOUT_KEY = "coloured layout"


def layout(executor: Executor, plan: Plan) -> Layout:
    """The patterns and colourings of this check, found once per executor (``Executor.once``):
    mode choice (``prospect``) and the check itself share them.  Raises ``UnknownSparsity``
    (remembered too) when there is no pattern."""
    found = executor.once(LAYOUT_KEY, lambda: _found_layout(executor, plan))
    if isinstance(found, _pattern.UnknownSparsity):
        raise found
    return found


def _found_layout(executor: Executor, plan: Plan) -> Layout | _pattern.UnknownSparsity:
    try:
        patterns, source = find_patterns(executor, plan)
    except _pattern.UnknownSparsity as error:
        return error
    seed = executor.config.seed
    labels = [_sparsity.colour(p, tuple(s.real_view.shape), seed) for p, s in zip(patterns, plan.checked)]
    output_shape = (tuple(plan.outputs[0].shape) + ((2,) if plan.outputs[0].dtype.is_complex else ())
                    if len(plan.outputs) == 1 else (plan.m,))
    row_labels = _sparsity.row_colour(patterns, output_shape, seed)
    return Layout(patterns, source, labels, row_labels)


# Evaluations of f a coloured check allows for beyond its sweep: the pattern probe (two
# evaluations, twice where it must be confirmed) and one refinement ladder (REFINE_LEVELS
# steps of two evaluations) per checked input, assuming the failing nonzeros of an input
# fit one colour's direction (elementwise f at 10^7: a handful, all of colour 0).
def prospect(executor: Executor, plan: Plan) -> dict:
    """The coloured check's predicted size, from ``layout`` (raises ``UnknownSparsity``):
    ``colours`` (column colours over checked inputs), ``row_colours`` (VJPs), ``nonzeros``,
    ``evaluations`` of f (2 per colour plus the pattern probe and a refinement allowance),
    ``bytes`` (host memory of the nonzeros' arrays, peak) and ``source``."""
    found = layout(executor, plan)
    colours = sum(found.colours)
    nonzeros = sum(p.nnz for p in found.patterns)
    inputs = len(found.patterns)
    allowance = inputs * (4 * PATTERN_PROBES + 2 * REFINE_LEVELS)
    return {"colours": colours, "row_colours": found.row_colours, "nonzeros": nonzeros,
            "evaluations": 2 * colours + allowance, "vjps": found.row_colours,
            "bytes": held_bytes(found, plan), "source": found.source}


def held_bytes(found: Layout, plan: Plan) -> int:
    """Host bytes the coloured check holds from its sweep to its report: the statuses, the
    colours' differences [C, m] (float32 for f evaluated in float32, else float64; one colour:
    f(x + d) and f(x - d) in the evaluation dtype, ``_Differences.sides``), the VJPs [R, n]
    (native dtype) and the patterns."""
    narrow = 4 if plan.eval_dtype.size <= 4 else 8
    differences = sum(2 * plan.eval_dtype.size if c == 1 else narrow * c for c in found.colours) * plan.m
    return int(sum(p.nnz for p in found.patterns) * BYTES_PER_NONZERO + differences
               + plan.native_flat_dtype.size * found.row_colours * plan.n + sum(p.bytes for p in found.patterns))


def _check(executor: Executor, plan: Plan, timings: dict, supplied, output_name) -> Outcome:
    config = executor.config
    with timed(timings, "sparsity"):
        found = layout(executor, plan)
    patterns, source, labels, row_labels = found.patterns, found.source, found.labels, found.row_labels
    held = held_bytes(found, plan)
    with timed(timings, "analytical"):
        if supplied is not None:
            analytical = [_Analytical(np.asarray(d, np.float64), None) for d in supplied(plan)]
        else:
            analytical = _analytical(executor, plan, patterns, row_labels, held)
    blocks = [_Block(spec, p, _Columns(executor, plan, spec.position, p, lab, held), a)
              for spec, p, lab, a in zip(plan.checked, patterns, labels, analytical)]
    with timed(timings, "numerical"):
        for block in blocks:
            block.sweep()
    atol, rtol = config.tolerances(plan.precision)
    with timed(timings, "verdicts"):
        firsts = _judged(plan, blocks, atol, rtol, config.seed, source)
    with timed(timings, "pattern"):
        problems, wrong, inconsistent = _probes(executor, plan, blocks, source, atol, supplied is not None, firsts)
    sampled = None
    if (problems or inconsistent) and plan.noise is None:
        # f's own rounding may be what a probe saw (an op in bfloat16 inside moves every output by
        # ~1e-3): measure it -- on every output where there are few, else on the failing nonzeros'
        # rows and a sample --, judge again under it and probe again.
        with timed(timings, "noise"):
            plan, sampled = _measured_rows(executor, plan, blocks)
        atol, rtol = config.tolerances(plan.precision)
        for block in blocks:
            block.reset()
            block.wrong_pattern = block.inconsistent = False
        firsts = _judged(plan, blocks, atol, rtol, config.seed, source)
        with timed(timings, "pattern"):
            problems, wrong, inconsistent = _probes(executor, plan, blocks, source, atol, supplied is not None, firsts)
    judged = [b for b in blocks if not any(b is w for w in wrong)]
    # Failing nonzeros are refined first (a few colours at smaller steps): at 10^7 elements
    # truncation fails a handful of them, and measuring f's noise costs far more than
    # refining them.  Only what still fails then measures f's noise and precision -- on the
    # rows of the failing nonzeros and a random sample of rows --, and is judged and refined
    # again under them (larger allowances only turn failures into passes).
    with timed(timings, "refine"):
        for block in judged:
            block.refine(plan, atol, rtol)
    if any(np.count_nonzero(b.status[b.flagged]) for b in judged) and plan.noise is None:  # OK is 0
        with timed(timings, "noise"):
            plan, sampled = _measured_rows(executor, plan, judged)
        atol, rtol = config.tolerances(plan.precision)
        with timed(timings, "refine"):
            for block in judged:
                block.reset()
                block.judge(plan, atol, rtol)
                block.refine(plan, atol, rtol)
    side = "supplied" if supplied is not None else "reverse"
    with timed(timings, "report"):
        pairs = _pairs(plan, blocks, atol, rtol, output_name, side, config.table("DENSE_REPORT_ENTRIES"))
    notes: list = [ColouredSummary(
        source, tuple(ColouredBlock(b.spec.name, int(b.pattern.nnz), int(b.pattern.shape[0]), int(b.pattern.shape[1]),
                                    int(b.columns.colours), b.cleared, _pattern_probes(b, source)) for b in blocks),
        None if supplied is not None else int(found.row_colours), int(sum(b.columns.evaluations for b in blocks)),
        sampled)]
    if executor.path == XLA and any(_kernel_path(executor, 2 * b.columns.colours) == GRAPH for b in blocks):
        notes.append(ColouredOnGraph(XLA_MIN_EVALUATIONS))
    return Outcome(pairs, plan, atol, rtol, "supplied" if supplied is not None else "reverse", notes,
                   problems=problems, inconsistent=[text for _, text in inconsistent])


# -- f's noise, on the outputs that matter ---------------------------------------------------------


def _noise_line(blocks: list[_Block]):
    """``measure_noise``'s batched evaluator: each noise table (f at x +- t step, t = 1..8) is one
    call of the colour kernel already traced for the sweep (every label 0), not 16 calls of f."""
    columns = {b.spec.position: b.columns for b in blocks}

    def line(steps: dict, ts: np.ndarray):
        if len(steps) != 1:  # the colour kernel moves one input: such a table goes point by point
            return None
        (position, step), = steps.items()
        block = columns[position]
        plus, minus = np.empty((len(ts), block.plan.m), block.dtype), np.empty((len(ts), block.plan.m), block.dtype)

        def consume(part, up, down):
            plus[part], minus[part] = up, down

        block.run(block.zero_labels(), step.astype(block.dtype).reshape(-1), np.zeros(len(ts), np.int64), consume,
                  scales=np.asarray(ts, block.dtype), what="noise")
        return plus, minus

    return line


def _measured_rows(executor: Executor, plan: Plan, blocks: list[_Block]) -> tuple[Plan, tuple | None]:
    """The plan with f's noise measured on the rows of the failing nonzeros plus a random
    sample of rows (every row where there are few), and the precision f computes in.

    ``_precision.measure_noise`` runs over a sub-problem: its values are the columns those
    rows depend on (the pattern's), the rest of x held, and it reads only those rows --
    the noise of a row is that of f moved along the columns it depends on.  Unmeasured
    rows keep the rounding allowance their elements passed with.  (Measuring every output
    of a 10^7-element f took 100 s: ~100 evaluations with [8, m] tables on the host.)
    """
    m = plan.m
    failing = np.unique(np.concatenate([b.pattern.at(np.flatnonzero(b.status))[0] for b in blocks]))
    if m <= executor.config.table("NOISE_ALL"):
        return measured(executor, plan, _noise_line(blocks)), None
    rng = np.random.default_rng(executor.config.seed + 4099)
    rows = np.union1d(failing, rng.choice(m, size=min(NOISE_SAMPLE, m), replace=False))
    # The columns of each checked input that those rows depend on.
    columns = [block.pattern.columns_of(rows) for block in blocks]
    specs = [b.spec for b in blocks]
    full = [executor.values[s.position] for s in specs]
    subset = [tf.constant(view(v).reshape(-1)[c]) for v, c in zip(full, columns)]
    evaluate = _rows_function(executor, plan, specs, columns, rows)
    eps = MACHINE_EPSILON[plan.eval_dtype]
    repeat = None if plan.repeat_output is None else np.asarray(plan.repeat_output)[rows]
    noise = measure_noise(evaluate, subset, list(range(len(subset))), plan.eval_output[rows], eps, repeat)
    sigma = np.zeros(m)
    sigma[rows] = noise.sigma
    plan = with_noise(plan, Noise(sigma, noise.relative))
    return plan, (len(failing), len(rows) - len(failing), sum(len(c) for c in columns))


def _rows_function(executor: Executor, plan: Plan, specs: list, columns: list, rows: np.ndarray):
    """evaluate(sub-values) -> f's outputs ``rows`` (float64) with the checked inputs' ``columns`` set
    to the sub-values: one traced function (scatter, f, gather), or eager calls."""
    shapes = [tuple(executor.values[s.position].shape) for s in specs]
    indices = [tf.constant(c[:, None]) for c in columns]
    rows_t = tf.constant(rows)

    def moved_values(subs):
        values = list(executor.values)
        for spec, shape, index, sub in zip(specs, shapes, indices, subs):
            flat = tf.tensor_scatter_nd_update(tf.reshape(values[spec.position], [-1]), index, sub)
            values[spec.position] = tf.reshape(flat, shape)
        return values

    def traced(*subs):
        return tf.gather(plan.call_flat(moved_values(subs), plan.eval_upcast), rows_t)

    if executor.path != EAGER:
        function = tf.function(traced, autograph=plan.autograph, reduce_retracing=True)
        try:
            function(*[tf.constant(view(executor.values[s.position]).reshape(-1)[c]) for s, c in zip(specs, columns)])
        except Exception:  # f traced for the batched kernels, not on its own: eager calls
            function = None
        if function is not None:
            return lambda subs: view(function(*subs)).astype(np.float64)
    return lambda subs: np.asarray(plan.call_flat_numpy(moved_values(subs), plan.eval_upcast))[rows]
