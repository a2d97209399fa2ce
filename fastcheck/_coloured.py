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
   an element fails, failing nonzeros refined over h/4 ... h/4**5 (deeper where
   unsettled) by re-evaluating only their colours, with ``_compare.refine``'s kink
   and jump tests, as in full mode;
5. the pattern check: random dense probes ``J d`` (numerical) against the
   pattern-restricted ``sum N_ij d_j``; mass outside the pattern (confirmed at a
   quarter of the step) is a *problem* of the report -- the pattern is wrong --,
   not a gradient verdict.

Memory is linear in the nonzeros: no array of the Jacobian's size exists, except
for the dense ``PairReport`` of a small pair (``DENSE_REPORT_ENTRIES``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from fastcheck import _compare, _sparsity
from fastcheck._autodiff import ZERO, reverse_rows_kernel
from fastcheck._config import MACHINE_EPSILON
from fastcheck._executor import Executor, evaluate_rows, steps, timed, view
from fastcheck._fast import _measured
from fastcheck._full import DEEP_LEVELS, REFINE_LEVELS, REFINE_RATIO
from fastcheck._paths import EAGER, compile_kernel, is_compile_failure, pad
from fastcheck._plan import InputSpec, Plan, _first_line
from fastcheck._report import Element, GradientCheckError, Outcome, PairReport, _index, _num

# Pairs with at most this many Jacobian entries are reported as a dense PairReport
# (zeros outside the pattern, as full mode shows them); larger ones as nonzeros only.
DENSE_REPORT_ENTRIES = 1_000_000
# Random dense probes of the pattern check (each confirmed at a quarter step only where it fails), and the factor by which J d may leave the
# pattern's prediction before a quarter step is asked to confirm it.
PATTERN_PROBES = 1
PATTERN_MARGIN = 3.0
WRONG_PATTERN_HINT = ("the sparsity pattern misses dependencies of f (see the problem above): each colour's "
                      "difference and VJP mixes in entries outside it, so these elements are undecidable, not wrong.")


# -- kernels -------------------------------------------------------------------------------


def _colour_kernel(plan: Plan, position: int, chunk: int, path: str, flat_function=None):
    """f(x + d_c) and f(x - d_c), [2 chunk, m], for colours ``ids``: d_c = step where labels == c, else 0."""

    def kernel(values, labels, step, ids):
        flat = tf.reshape(values[position], [-1])
        direction = tf.where(labels[None, :] == ids[:, None], step[None, :], tf.zeros_like(step)[None, :])
        batch = tf.concat([flat[None] + direction, flat[None] - direction], axis=0)
        return evaluate_rows(plan, position, path, values, batch, flat_function)

    return compile_kernel(kernel, path, plan.autograph)


def _vjp_kernel(plan: Plan, path: str):
    """J^T u_c [chunk, n_k] per checked input, u_c the indicator of row colour ``ids[c]``."""

    def colours(y, labels, ids):
        return tf.linalg.matvec(tf.cast(labels[None, :] == ids[:, None], y.dtype), y)

    return reverse_rows_kernel(plan, path, colours)


# -- the numerical side ----------------------------------------------------------------------


class _Columns:
    """Central differences of one checked input along its colours' directions."""

    def __init__(self, executor: Executor, plan: Plan, position: int, pattern: _sparsity.Pattern, labels: np.ndarray):
        self.executor, self.plan, self.position, self.pattern = executor, plan, position, pattern
        self.labels = labels.astype(np.int32)
        self.colours = int(labels.max()) + 1 if labels.size else 0
        value = executor.values[position]
        self.dtype = value.dtype.as_numpy_dtype
        self.x = value.numpy().reshape(-1)
        self.h = steps(plan, executor.config, position)
        self.element_colour = self.labels[pattern.cols].astype(np.int64)
        self.chunk = max(1, min(executor.chunks[position], max(self.colours, 1)))
        self.key = ("coloured", position)
        executor.chunks[self.key] = self.chunk
        self.evaluations = 0

    def spans(self, step: np.ndarray, columns: np.ndarray) -> np.ndarray:
        """(x + d) - (x - d) in the evaluation dtype, as float64, for ``columns``."""
        x, d = self.x[columns], step[columns].astype(self.dtype)
        return ((x + d) - (x - d)).astype(np.float64)

    def run(self, labels: np.ndarray, step: np.ndarray, ids: np.ndarray, consume) -> None:
        """Evaluate f(x +- d_c) for each colour in ``ids``; ``consume(part, plus, minus)`` gets
        [count, m] float64-convertible arrays of each chunk (``part``: the slice of ``ids``)."""
        executor, plan = self.executor, self.plan
        self.evaluations += 2 * len(ids)
        labels_t = tf.constant(labels.astype(np.int32))
        step_t = tf.constant(step.astype(self.dtype))

        def call(chunk, part, count):
            kernel = executor.kernel(("coloured", self.position, chunk), lambda: _colour_kernel(
                plan, self.position, chunk, executor.path, executor.route.flat_function))
            outs = view(kernel(executor.values, labels_t, step_t, tf.constant(pad(ids[part], chunk), tf.int32)))
            consume(part, outs[:count], outs[chunk : chunk + count])

        def eager():
            values = list(executor.values)
            for k, colour in enumerate(ids):
                direction = np.where(labels == colour, step.astype(self.dtype), self.dtype(0))
                sides = []
                for sign in (1, -1):
                    moved = self.x + direction if sign > 0 else self.x - direction
                    values[self.position] = tf.constant(moved.reshape(executor.values[self.position].shape))
                    sides.append(plan.call_flat_numpy(values, plan.eval_upcast)[None, :])
                consume(slice(k, k + 1), *sides)

        executor._batched("coloured differences", self.key, len(ids), call, eager)

    def sides(self, elements: np.ndarray, divide: float = 1.0):
        """f(x + d), f(x - d) at each element's row, along its colour's direction at step h / divide;
        and the spans of its column.  Only the colours of ``elements`` are evaluated."""
        rows, cols = self.pattern.rows[elements], self.pattern.cols[elements]
        colour = self.element_colour[elements]
        present = np.bincount(colour, minlength=max(self.colours, 1)) > 0
        ids = np.flatnonzero(present)
        slot = (np.cumsum(present) - 1)[colour]
        order = _grouped(slot)
        sorted_slots = slot[order]
        plus, minus = np.empty(len(elements)), np.empty(len(elements))

        def consume(part, up, down):
            lo, hi = np.searchsorted(sorted_slots, [part.start, part.stop])
            picked = order[lo:hi]
            within = slot[picked] - part.start
            plus[picked] = np.asarray(up)[within, rows[picked]]
            minus[picked] = np.asarray(down)[within, rows[picked]]

        step = self.h / divide
        self.run(self.labels, step, ids, consume)
        return plus, minus, self.spans(step, cols)

    def probe(self, signs: np.ndarray, divide: float = 1.0):
        """(f(x + d) - f(x - d)) / 2 [m] along d = signs * h / divide over every element, and the
        realised direction ((x + d) - (x - d)) / 2 [n]."""
        step = signs * self.h / divide
        result: dict = {}

        def consume(part, up, down):
            result["value"] = (np.asarray(up[0], np.float64) - np.asarray(down[0], np.float64)) / 2

        self.run(np.zeros(self.x.size, np.int32), step, np.zeros(1, np.int64), consume)
        d = step.astype(self.dtype)
        return result["value"], ((self.x + d) - (self.x - d)).astype(np.float64) / 2


def _grouped(keys: np.ndarray) -> np.ndarray:
    """An order that sorts ``keys`` (no sort where they already are: a single colour)."""
    if keys.size < 2 or bool(np.all(keys[1:] >= keys[:-1])):
        return np.arange(keys.size)
    return np.argsort(keys, kind="stable")


# -- the analytical side -----------------------------------------------------------------------


def _analytical(executor: Executor, plan: Plan, patterns: list, row_labels: np.ndarray) -> list[np.ndarray]:
    """Reverse-mode values of every nonzero, per checked input: one VJP per row colour."""
    colours = int(row_labels.max()) + 1 if row_labels.size else 0
    ids = np.arange(colours)
    element_colour = [row_labels[p.rows] for p in patterns]
    orders = [_grouped(c) for c in element_colour]
    sorted_colours = [c[o] for c, o in zip(element_colour, orders)]
    result = [np.empty(p.nnz) for p in patterns]

    def consume(part, blocks):
        for k, (pattern, block) in enumerate(zip(patterns, blocks)):
            lo, hi = np.searchsorted(sorted_colours[k], [part.start, part.stop])
            picked = orders[k][lo:hi]
            result[k][picked] = np.asarray(block)[element_colour[k][picked] - part.start, pattern.cols[picked]]

    itemsize = plan.native_flat_dtype.size
    per_colour = (plan.m + plan.n + max(executor.route.elements_per_eval, 1)) * itemsize * 4
    chunk = int(max(1, min(colours, executor.config.budget // per_colour)))
    labels_t = tf.constant(row_labels.astype(np.int32))
    while executor.path != EAGER:
        try:
            kernel = executor.kernel(("coloured vjp",), lambda: _vjp_kernel(executor.plan, executor.path))
            start = 0
            while start < colours:
                count = min(chunk, colours - start)
                part = slice(start, start + count)
                try:
                    out = kernel(executor.native, labels_t, tf.constant(pad(ids[part], chunk), tf.int32))
                except tf.errors.ResourceExhaustedError:
                    if chunk == 1:
                        raise MemoryError("f ran out of memory computing one VJP") from None
                    chunk //= 2
                    executor.note(f"coloured mode: out of memory at {2 * chunk} VJPs per call; retried with {chunk}")
                    continue
                consume(part, [view(b)[:count] for b in out])
                start += count
            return result
        except Exception as error:
            if not is_compile_failure(error) or not executor.fall_back(error, "coloured VJPs"):
                raise
    values = [tf.identity(v) for v in executor.native]
    sources = [values[s.position] for s in plan.checked]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(sources)
        leaves = plan.output_leaves(values)
    sizes = [int(leaf.shape.num_elements()) for leaf in leaves]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    for colour in ids:
        weights = (row_labels == colour)
        cotangents = [tf.constant(weights[bounds[i] : bounds[i + 1]].reshape(leaf.shape), leaf.dtype)
                      for i, leaf in enumerate(leaves)]
        grads = tape.gradient(leaves, sources, output_gradients=cotangents, unconnected_gradients=ZERO)
        consume(slice(colour, colour + 1), [tf.reshape(tf.convert_to_tensor(g), [1, -1]).numpy() for g in grads])
    return result


# -- verdicts -------------------------------------------------------------------------------------


def _noise(plan: Plan, rows: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """``_compare.rounding_noise`` for single elements (row, span) rather than an outer product."""
    eps = MACHINE_EPSILON[plan.eval_dtype]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        level = _compare.NOISE_FACTOR * eps * np.abs(plan.eval_output[rows])
        if plan.noise is not None:
            level = np.maximum(level, _compare.MEASURED_NOISE_FACTOR * plan.noise.sigma[rows])
        level[~np.isfinite(level)] = 0.0
        inverse = 1.0 / np.abs(spans)
        inverse[~np.isfinite(inverse)] = 0.0
        return level * inverse


def _verdicts(a, numerical, noise, atol, rtol):
    status, band = _compare.verdicts(a[None, :], numerical[None, :], noise[None, :], atol, rtol)
    return status[0], band[0]


@dataclasses.dataclass
class _Block:
    """The nonzeros of one checked input and everything known about them."""

    spec: InputSpec
    pattern: _sparsity.Pattern
    columns: _Columns
    analytical: np.ndarray
    numerical: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    spans: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    noise: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    status: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int8))
    band: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    one_sided: dict = dataclasses.field(default_factory=dict)
    wrong_pattern: bool = False
    first: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))

    def sweep(self) -> None:
        everything = np.arange(self.pattern.nnz)
        plus, minus, self.spans = self.columns.sides(everything)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            self.numerical = (plus - minus) / self.spans
        self.first = self.numerical.copy()

    def reset(self) -> None:
        """Back to the first sweep's values (before a new judgement under measured noise)."""
        self.numerical, self.one_sided = self.first.copy(), {}

    def judge(self, plan: Plan, atol: float, rtol: float) -> None:
        self.noise = _noise(plan, self.pattern.rows, self.spans)
        self.status, self.band = _verdicts(self.analytical, self.numerical, self.noise, atol, rtol)

    def refine(self, plan: Plan, atol: float, rtol: float) -> None:
        """Failing nonzeros: their colours again at h/4 ... h/4**5 (h/4**12 where still unsettled)."""
        failing = np.flatnonzero((self.status == _compare.MISMATCH) | (self.status == _compare.NUMERICAL_NONFINITE))
        if not len(failing):
            return
        result = self._ladder(plan, failing, REFINE_LEVELS)
        estimate, error, settled = result[0][0], result[1][0], result[2][0]
        a = self.analytical[failing]
        status, band = _verdicts(a, estimate, error, atol, rtol)
        unsettled = ((status == _compare.MISMATCH) & ~settled) | (status == _compare.NUMERICAL_NONFINITE)
        if unsettled.any():
            deeper = self._ladder(plan, failing[unsettled], DEEP_LEVELS)
            for target, value in zip(result, deeper):
                target[0, unsettled] = value[0]
            estimate, error = result[0][0], result[1][0]
            status, band = _verdicts(a, estimate, error, atol, rtol)
        _, _, settled, kink, right, left, jump, _, sides_error = (r[0] for r in result)
        for k in np.flatnonzero(status == _compare.MISMATCH):
            if jump[k]:
                status[k] = _compare.DISCONTINUOUS
            elif settled[k]:
                continue  # a settled estimate from steps that cross no kink: a wrong gradient
            elif kink[k]:
                low, high = sorted((left[k], right[k]))
                if np.isfinite(low) and np.isfinite(high):
                    self.one_sided[(int(failing[k]),)] = (float(left[k]), float(right[k]))
                allowed = band[k] + sides_error[k]
                inside = bool(low - allowed <= a[k] <= high + allowed)
                status[k] = _compare.NONDIFFERENTIABLE if inside else _compare.UNRESOLVED_KINK
            else:
                status[k] = _compare.UNRESOLVED
        self.numerical[failing], self.noise[failing] = estimate, error
        self.status[failing], self.band[failing] = status, band

    def _ladder(self, plan: Plan, elements: np.ndarray, levels: int):
        """``_compare.refine`` over the first sweep and ``levels`` finer steps, elements as columns of one row.

        Each element's row value f(x) is subtracted from its sides, so the shared
        ``y0`` of ``refine`` is 0 (its one-sided quotients and second differences only
        ever use differences from f(x)).
        """
        y0 = plan.eval_output[self.pattern.rows[elements]]
        stack: list[tuple] = [(self.numerical[elements][None, :], self.noise[elements][None, :], None, None, None)]
        for level in range(1, levels + 1):
            plus, minus, spans = self.columns.sides(elements, REFINE_RATIO**level)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                derivative = (plus - minus) / spans
            noise = _noise(plan, self.pattern.rows[elements], spans)
            stack.append((derivative[None, :], noise[None, :], (plus - y0)[None, :], (minus - y0)[None, :], spans))
        sigma = None
        if plan.noise is not None:
            sigma = np.array([float(np.max(plan.noise.sigma[self.pattern.rows[elements]], initial=0.0))])
        return list(_compare.refine(stack, np.zeros(1), REFINE_RATIO, sigma))


def _pattern_problem(block: _Block, plan: Plan, seed: int, source: str) -> str | None:
    """Whether random dense probes find Jacobian mass outside the pattern (confirmed at h/4)."""
    m, rng = plan.m, np.random.default_rng(seed + 7919)
    rows, cols = block.pattern.rows, block.pattern.cols
    usable = np.isfinite(block.numerical)
    eps = MACHINE_EPSILON[plan.eval_dtype]
    rounding = _compare.NOISE_FACTOR * eps * np.abs(plan.eval_output)
    if plan.noise is not None:
        rounding = np.maximum(rounding, _compare.MEASURED_NOISE_FACTOR * plan.noise.sigma)

    def excess(signs, divide):
        value, realised = block.columns.probe(signs, divide)
        predicted = np.bincount(rows, weights=np.where(usable, block.numerical * realised[cols], 0.0), minlength=m)
        spread = np.sqrt(np.bincount(rows, weights=(block.band * realised[cols]) ** 2, minlength=m))
        with np.errstate(invalid="ignore"):
            return np.abs(value - predicted), PATTERN_MARGIN * (spread + rounding)

    for _ in range(PATTERN_PROBES):
        signs = rng.choice([-1.0, 1.0], size=block.columns.x.size)
        coarse, allowed = excess(signs, 1.0)
        with np.errstate(invalid="ignore"):
            outside = coarse > allowed
        if not outside.any():
            continue
        # Mass outside the pattern scales with the step: it stays at a quarter of it (a
        # truncation effect of the dense direction shrinks 16-fold).
        fine, fine_allowed = excess(signs, REFINE_RATIO)
        with np.errstate(invalid="ignore"):
            outside &= (fine > fine_allowed) & (REFINE_RATIO * fine >= 0.5 * coarse)
        if outside.any():
            worst = int(np.argmax(np.where(outside, coarse / np.maximum(allowed, 1e-300), 0.0)))
            output = next(o for o in plan.outputs if o.offset <= worst < o.offset + o.size)
            shape = tuple(output.shape) + ((2,) if output.dtype.is_complex else ())
            where = _index(output.name, tuple(int(i) for i in np.unravel_index(worst - output.offset, shape)) if shape
                           else ())
            return (f"the sparsity pattern ({source}) is wrong for {block.spec.name}: f depends on elements outside it "
                    f"(a random direction moves {where} by {coarse[worst]:.3g} more than the pattern's nonzeros "
                    f"predict, allowed {allowed[worst]:.3g}; {int(outside.sum())} output element(s) so). The "
                    "element verdicts cover only the pattern's nonzeros: pass the right sparsity=, or mode='full'.")
    return None


# -- the report -------------------------------------------------------------------------------------


@dataclasses.dataclass(repr=False)
class SparsePairReport(PairReport):
    """A ``PairReport`` over the structural nonzeros only: ``numerical``, ``analytical``,
    ``status`` and ``band`` are 1-D over the nonzeros ``(rows[k], cols[k])`` of the
    ``jacobian_shape`` block; ``one_sided`` is keyed by ``(k,)``."""

    rows: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    cols: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    jacobian_shape: tuple = (0, 0)

    def _element(self, flat_index: int):
        k = int(flat_index)
        row, col = int(self.rows[k]), int(self.cols[k])
        return Element(
            tuple(int(i) for i in np.unravel_index(row, self.output_shape)) if self.output_shape else (),
            tuple(int(i) for i in np.unravel_index(col, self.input_shape)) if self.input_shape else (),
            float(self.analytical[k]), float(self.numerical[k]), float(abs(self.analytical[k] - self.numerical[k])),
            float(self.band[k]), _compare.STATUS_NAMES[int(self.status[k])])

    def kinks(self) -> list:
        return [(self._element(int(k)), *self.one_sided.get((int(k),), (np.nan, np.nan)))
                for k in np.flatnonzero(self.status == _compare.NONDIFFERENTIABLE)]

    def __repr__(self) -> str:
        return (f"<SparsePairReport {self.title}: {self.label}, {self.failed_count} of {self.status.size} nonzeros "
                f"failed, max abs error {self.max_abs_error:.2g}>")

    def to_dict(self, arrays: bool = False) -> dict:
        counts = {key: self.count(status) for key, status in _COUNTS}
        summary = {"output": self.output_name, "input": self.input_name, "side": self.side, "ok": self.ok,
                   "shape": [int(d) for d in self.jacobian_shape], "nonzeros": int(self.status.size),
                   "max_abs_error": _num(self.max_abs_error), "max_rel_error": _num(self.max_rel_error),
                   "relative_norm_error": _num(self.relative_norm_error), **counts, "atol": self.atol,
                   "rtol": self.rtol, "worst": [e.to_dict() for e in self.worst(3)], "hint": self.hint}
        if arrays:
            summary.update(rows=self.rows.tolist(), cols=self.cols.tolist(), numerical=self.numerical.tolist(),
                           analytical=self.analytical.tolist())
        return summary


# The per-status counts of ``PairReport.to_dict``, by key.
_COUNTS = (("mismatches", _compare.MISMATCH), ("analytical_nonfinite", _compare.ANALYTICAL_NONFINITE),
           ("numerical_nonfinite", _compare.NUMERICAL_NONFINITE), ("not_differentiable", _compare.NONDIFFERENTIABLE),
           ("unresolved", _compare.UNRESOLVED), ("discontinuous", _compare.DISCONTINUOUS),
           ("kinks_unresolved", _compare.UNRESOLVED_KINK))


def _pairs(plan: Plan, blocks: list[_Block], atol, rtol, output_name, side: str) -> list:
    pairs = []
    for block in blocks:
        spec, pattern = block.spec, block.pattern
        input_shape = tuple(spec.real_view.shape)
        for output in plan.outputs:
            output_shape = tuple(output.shape) + ((2,) if output.dtype.is_complex else ())
            lo, hi = np.searchsorted(pattern.rows, [output.offset, output.offset + output.size])
            rows, cols = pattern.rows[lo:hi] - output.offset, pattern.cols[lo:hi]
            name = output_name or output.name
            one_sided = {(k - lo,): v for (k,), v in block.one_sided.items() if lo <= k < hi}
            numerical, analytical, status, band = (x[lo:hi] for x in (block.numerical, block.analytical,
                                                                        block.status, block.band))
            pair: PairReport
            if output.size * spec.size <= DENSE_REPORT_ENTRIES:
                dense = []
                for x, fill in zip((numerical, analytical, status, band), (0.0, 0.0, _compare.OK, atol)):
                    array = np.full((output.size, spec.size), fill, dtype=x.dtype)
                    array[rows, cols] = x
                    dense.append(array)
                pair = PairReport(name, spec.name, output_shape, input_shape, dense[0], dense[1], dense[2], dense[3],
                                  atol, rtol, side=side)
                pair.one_sided = {(int(rows[k]), int(cols[k])): v for (k,), v in one_sided.items()}
                pair.hint = _compare.diagnose(dense[1], dense[0], dense[2])
                pair.hint = WRONG_PATTERN_HINT if block.wrong_pattern else pair.hint
            else:
                pair = SparsePairReport(name, spec.name, output_shape, input_shape, numerical, analytical, status, band,
                                        atol, rtol, side=side, rows=rows, cols=cols,
                                        jacobian_shape=(output.size, spec.size))
                pair.one_sided = one_sided
                pair.hint = _compare.diagnose(analytical[None, :], numerical[None, :], status[None, :])
                pair.hint = WRONG_PATTERN_HINT if block.wrong_pattern else pair.hint
            pairs.append(pair)
    return pairs


# -- the strategy ---------------------------------------------------------------------------------------


def find_patterns(executor: Executor, plan: Plan) -> tuple[list[_sparsity.Pattern], str]:
    """(one pattern per checked input, where it came from); ``UnknownSparsity`` when there is none."""
    sizes, names = [s.size for s in plan.checked], [s.name for s in plan.checked]
    given = executor.config.sparsity
    if given is not None:
        return given.patterns(plan.m, sizes, names), "given by sparsity="
    function = executor.route.flat_function
    if not callable(function):
        function = tf.function(lambda *vs: plan.call_flat(list(vs), plan.eval_upcast), autograph=plan.autograph)
    signature = [tf.TensorSpec(v.shape, v.dtype) for v in executor.values]
    try:
        m, dep = _sparsity.trace(function, signature, [(s.position, s.size) for s in plan.checked])
    except _sparsity.UnknownSparsity as error:
        raise _sparsity.UnknownSparsity(
            f"mode='coloured' needs the sparsity pattern of f's Jacobian, but {error}. Pass the pattern with "
            "sparsity= (a boolean [m, n] array, (rows, cols) index pairs or a scipy.sparse matrix), or "
            "mode='full' / mode='fast'.") from None
    except Exception as error:  # f cannot be traced: no graph to read dependencies from
        raise _sparsity.UnknownSparsity(
            f"mode='coloured' traces f to find its Jacobian's sparsity pattern, but f cannot be traced "
            f"({type(error).__name__}: {_first_line(error, 160)}); pass sparsity=, or mode='full' / mode='fast'.") from None
    return _sparsity.traced_patterns(m, dep, sizes), "traced from f's graph"


def check_coloured(executor: Executor, plan: Plan, timings: dict, supplied=None, output_name=None) -> Outcome:
    """Element-wise verdicts on every structural nonzero (see the module docstring)."""
    try:
        return _check(executor, plan, timings, supplied, output_name)
    except (TypeError, ValueError, GradientCheckError, MemoryError):
        raise
    except Exception as error:  # f failed inside a batched kernel: say so, keep the cause
        raise ValueError(
            f"f raised {type(error).__name__} while fastcheck evaluated it in a batched tf.function: "
            f"{_first_line(error)}\nf ran eagerly at the inputs; check that it can be traced "
            "(no .numpy() calls or Python side effects on tensors), or pass jit_compile=False.") from error


def _check(executor: Executor, plan: Plan, timings: dict, supplied, output_name) -> Outcome:
    config = executor.config
    with timed(timings, "sparsity"):
        patterns, source = find_patterns(executor, plan)
        labels = [_sparsity.colour(p, tuple(s.real_view.shape), config.seed) for p, s in zip(patterns, plan.checked)]
        output_shape = (tuple(plan.outputs[0].shape) + ((2,) if plan.outputs[0].dtype.is_complex else ())
                        if len(plan.outputs) == 1 else (plan.m,))
        row_labels = _sparsity.colour(_sparsity.transpose(_sparsity.joined(patterns)), output_shape, config.seed)
    with timed(timings, "analytical"):
        if supplied is not None:
            dense = supplied(plan)
            analytical = [np.asarray(d, np.float64)[p.rows, p.cols] for d, p in zip(dense, patterns)]
        else:
            analytical = _analytical(executor, plan, patterns, row_labels)
    blocks = [_Block(spec, p, _Columns(executor, plan, spec.position, p, lab), a)
              for spec, p, lab, a in zip(plan.checked, patterns, labels, analytical)]
    with timed(timings, "numerical"):
        for block in blocks:
            block.sweep()
    atol, rtol = config.tolerances(plan.precision)
    for block in blocks:
        block.judge(plan, atol, rtol)
    problems, wrong = [], []
    with timed(timings, "pattern"):
        for block in blocks:
            problem = _pattern_problem(block, plan, config.seed, source)
            if problem:
                problems.append(problem)
                wrong.append(block)
    # Under a wrong pattern the compressed values mix in entries outside it: no element
    # verdict can be read off them, so their disagreements are undecidable, not mismatches.
    for block in wrong:
        block.wrong_pattern = True
        block.status[block.status != _compare.OK] = _compare.UNRESOLVED
    judged = [b for b in blocks if not any(b is w for w in wrong)]
    # Failing nonzeros are refined first (a few colours at smaller steps): at 10^7 elements
    # truncation fails a handful of them, and measuring f's noise costs far more than
    # refining them.  Only what still fails then measures f's noise and precision, and is
    # judged and refined again under them (larger allowances only turn failures into passes).
    with timed(timings, "refine"):
        for block in judged:
            block.refine(plan, atol, rtol)
    if any(np.any(b.status != _compare.OK) for b in judged) and plan.noise is None:
        with timed(timings, "noise"):
            plan = _measured(executor, plan)
        atol, rtol = config.tolerances(plan.precision)
        with timed(timings, "refine"):
            for block in judged:
                block.reset()
                block.judge(plan, atol, rtol)
                block.refine(plan, atol, rtol)
    side = "supplied" if supplied is not None else "reverse"
    pairs = _pairs(plan, blocks, atol, rtol, output_name, side)
    row_colours = int(row_labels.max()) + 1 if row_labels.size else 0
    notes = [f"coloured mode: sparsity pattern {source}; "
             + "; ".join(f"{b.spec.name}: {b.pattern.nnz} structural nonzeros of {b.pattern.shape[0]} x "
                         f"{b.pattern.shape[1]}, {b.columns.colours} column colours" for b in blocks)
             + ("" if supplied is not None else f"; reverse mode: {row_colours} row colours (one VJP each)")
             + f"; {sum(b.columns.evaluations for b in blocks)} evaluations of f; the pattern checked by "
             f"{PATTERN_PROBES} random dense probes per input"]
    return Outcome(pairs, plan, atol, rtol, "supplied" if supplied is not None else "reverse", notes,
                           problems=problems)
