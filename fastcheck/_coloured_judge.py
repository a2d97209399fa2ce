"""Coloured mode's judgement: the element rule on every structural nonzero, block by block, and the two probes
that guard what colouring assumes.

Each checked input's nonzeros are a ``_block._Block``, judged one block of VERDICT_CHUNK nonzeros at a time (a large
diagonal block first screened in one fused XLA pass, _screen; every verdict is still numpy's).  The dense random direction
finds Jacobian mass outside the pattern (_pattern_problem: a report problem, not a gradient verdict); the dense
random cotangent finds a VJP off the pattern or one ignoring dy (_vjp_problems: the pair is inconsistent).
"""


from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from fastcheck import _compare
from fastcheck._autodiff import vjp_kernel
from fastcheck._block import _Block
from fastcheck._colours import _eager_vjp, _kernel_path, _large, _Probe, _vjp_weights
from fastcheck._config import MACHINE_EPSILON, PRECISION_EPSILON
from fastcheck._executor import Batch, Executor, view
from fastcheck._plan import Plan
from fastcheck._tables import (
    NOISE_FACTOR,
    PATTERN_MARGIN,
    PATTERN_PROBES,
    REFINE_RATIO,
    SCREEN_MARGIN,
    VERDICT_CHUNK,
    VJP_PROBE_ROUNDING,
    VJP_PROBE_WEIGHTS,
)
from fastcheck._text import element_name

TRACED = "traced from f's graph"  # the source of a pattern ``find_patterns`` traced


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


def _outside(plan: Plan, part, value, predicted, spread, realised, eps):
    """(|value - predicted|, PATTERN_MARGIN * (spread + rounding)) for the rows ``part``; with
    ``realised``, ``predicted`` and ``spread`` are per-row values and bands to scale by it."""
    with np.errstate(invalid="ignore", over="ignore"):
        if realised is not None:
            predicted = np.where(np.isfinite(predicted), predicted * realised, 0.0)
            spread = np.abs(spread * realised)
        rounding = _compare.rounding_level(plan.eval_output[part], eps,
                                           None if plan.noise is None else plan.noise.sigma[part])
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
    """Random dense probes of ``block``'s pattern: none for a traced diagonal one, trusted as the eager path's
    element-wise calls (``_diagonal``) trust the rules of the ops they run (its probe would cost as much as its
    sweep); ``PATTERN_PROBES`` for every other pattern (a given one above all)."""
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
        # Mass outside the pattern stays at a quarter of the step (it scales with it); truncation shrinks 16-fold.
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
                    "element verdicts cover only the pattern's nonzeros: pass the right sparsity=, or mode='full' without it.")
    return None


def _probes(executor: Executor, plan: Plan, blocks: list, source: str, atol: float, supplied: bool, firsts: list):
    """(problems, blocks with a wrong pattern, [(block, text)] whose reverse-mode gradient is off it): the pattern
    probe on every block (its first as ``_judged`` read it), then the VJP probe on those whose pattern holds."""
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
    """(block, text) for each checked input whose reverse-mode gradient is not what its row colours' VJPs say:
    J^T u for one dense random cotangent u differs from the recovered nonzeros' sum at some input element.

    Each row colour's VJP is read only at the pattern's nonzeros, so a VJP that writes to other input elements (a
    missing transpose, gradient leaked to the wrong element) or is not linear in its cotangent (ignores dy) could
    look right element by element: the dense cotangent sees all of it.  The numerical side's pattern probe has
    confirmed that f's Jacobian holds no mass outside the pattern, so the disagreement is the gradient's.
    """
    if not blocks:
        return []
    dtype = plan.native_flat_dtype
    # Drawn on the device in the native dtype, which holds these weights exactly (10^7: ~5 ms, ~190 ms from the host).
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
