"""Coloured mode's judgement: the element rule on every structural nonzero, block by block, and the two probes
that guard what colouring assumes.

Each checked input's nonzeros are a ``block._Block``, judged one block of VERDICT_CHUNK nonzeros at a time (a large
diagonal block first screened in one fused XLA pass, _screen; every verdict is still numpy's).  The dense random direction
finds Jacobian mass outside the pattern (_pattern_problem: a report problem, not a gradient verdict); the dense
random cotangent finds a VJP off the pattern or one ignoring dy (_vjp_problems: the pair is inconsistent).
"""


from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from fastcheck.engine.autodiff import vjp_kernel
from fastcheck.engine.config import MACHINE_EPSILON, PRECISION_EPSILON, device_span
from fastcheck.engine.executor import Batch, Executor, view
from fastcheck.engine.plan import Plan
from fastcheck.engine.tables import (
    PATTERN_MARGIN,
    PATTERN_PROBES,
    REFINE_RATIO,
    SCREEN_MARGIN,
    VERDICT_CHUNK,
    VJP_PROBE_ROUNDING,
    VJP_PROBE_WEIGHTS,
)
from fastcheck.judge import compare
from fastcheck.judge.block import _Block
from fastcheck.modes.colours import _eager_vjp, _kernel_path, _large, _vjp_weights
from fastcheck.report.text import element_name

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


def _probe_signs(seed: int, count: int):
    """The pattern probes' seeds, in order."""
    rng = np.random.default_rng(seed + 7919)
    for _ in range(count):
        yield int(rng.integers(0, 2**31 - 1))


def _pattern_probes(block: _Block, source: str) -> int:
    """Random dense probes of ``block``'s pattern: none for a traced diagonal one, trusted as the eager path's
    element-wise calls (``diagonal``) trust the rules of the ops they run (its probe would cost as much as its
    sweep); ``PATTERN_PROBES`` for every other pattern (a given one above all)."""
    return 0 if source == TRACED and block.pattern.diagonal else PATTERN_PROBES


def _judged(plan: Plan, blocks: list[_Block], atol: float, rtol: float) -> None:
    """``judge`` every block, numpy's rule on what the device screen (``_screen``) leaves of a large diagonal one."""
    for block in blocks:
        left = _screen(plan, block, atol, rtol)
        block.judge(plan, atol, rtol, among=left)


def _screen(plan: Plan, block: _Block, atol: float, rtol: float) -> np.ndarray | None:
    """The nonzeros that numpy's rule must judge, of a large diagonal block whose sweep and VJP are on the device:
    one fused pass (``_screened``) clears the rest, each with its error below ``SCREEN_MARGIN`` of what the rule
    allows it -- verdicts that do not depend on how the pass rounds.  None where the block does not qualify (numpy
    judges it all): below ``SCREEN_ELEMENTS`` nonzeros, f's noise measured (per-row allowances), a complex input or
    output, or values the eager path left on the host."""
    sides, vjp = block.compressed.tensor if block.compressed is not None else None, block.analytical.tensor
    if (not _large(block.columns.executor.config, block.nnz) or not block.pattern.diagonal or block.nnz != plan.m
            or plan.noise is not None or plan.uniform_epsilon is None or sides is None or vjp is None
            or block.columns.step_tensor is None or len(plan.outputs) != 1 or plan.outputs[0].dtype.is_complex
            or block.spec.is_complex):
        return None
    columns = block.columns
    try:
        judged = _screened(sides, tf.reshape(columns.executor.values[columns.position], [-1]), columns.step_tensor,
                           tf.reshape(vjp, [-1]), _centre(plan), *(tf.constant(v, tf.float64) for v in (
                               atol, rtol, float(plan.uniform_epsilon), SCREEN_MARGIN)))
    except tf.errors.OpError:  # no XLA for this device or dtype, or no memory for the pass: numpy judges it all
        return None
    return np.flatnonzero(view(judged))


def _centre(plan: Plan) -> tf.Tensor:
    """f(x) flat [m] as the numerical side computed it, on the device: f's own output where it is that
    (float64 ``eval_output`` is it, exactly), else a copy of ``eval_output``."""
    leaves = [leaf for leaf, keep in zip(tf.nest.flatten(plan.structure), plan.leaf_is_output) if keep]
    if (not plan.eval_upcast and len(leaves) == 1 and isinstance(leaves[0], tf.Tensor)
            and leaves[0].dtype == plan.eval_flat_dtype):
        return tf.reshape(leaves[0], [-1])
    return tf.constant(plan.eval_output)


@tf.function(jit_compile=True, autograph=False, reduce_retracing=True)
def _screened(sides, x, step, vjp, centre, atol, rtol, epsilon, margin):
    """The mask [m] of a diagonal block's nonzeros not cleared by ``compare``'s rule with every allowance scaled by
    ``margin``, as ``_noise``, ``_span`` and ``first_sweep`` compute them, in one fused pass (a value that is not
    finite clears nothing)."""
    wide = functools.partial(tf.cast, dtype=tf.float64)
    span = wide(device_span(x, step, x.dtype))
    numerical = (wide(sides[0]) - wide(sides[sides.shape[0] // 2])) / span  # f(x + d) first, f(x - d) half way
    analytical = wide(vjp)
    noise = compare.quotient_noise(compare.rounding_level(wide(centre), epsilon), span)
    band = compare.allowance(numerical, atol, rtol, noise)
    finite = tf.math.is_finite(numerical) & tf.math.is_finite(analytical)
    return tf.logical_not(finite & (tf.abs(analytical - numerical) <= margin * band))


def _pattern_problem(block: _Block, plan: Plan, seed: int, source: str) -> str | None:
    """Whether random dense probes find Jacobian mass outside the pattern (confirmed at h/4)."""
    m = plan.m
    eps = MACHINE_EPSILON[plan.eval_dtype]

    def excess(signs, divide, where=None):
        """(rows, |J d - sum N_ij d_j|, what it may be: rounding and the nonzeros' bands) at the rows
        where it is exceeded (at ``where`` when given)."""
        probe = block.columns.probe(signs, divide)
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
        with np.errstate(invalid="ignore", over="ignore"):
            rounding = compare.rounding_level(plan.eval_output, eps, None if plan.noise is None else plan.noise.sigma)
            coarse, allowed = np.abs(value - predicted), PATTERN_MARGIN * (spread + rounding)
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


def _probes(executor: Executor, plan: Plan, blocks: list, source: str, atol: float, supplied: bool):
    """(problems, blocks with a wrong pattern, [(block, text)] whose reverse-mode gradient is off it): the pattern
    probe on every block, then the VJP probe on those whose pattern holds."""
    problems, wrong = [], []
    for block in blocks:
        problem = _pattern_problem(block, plan, executor.config.seed, source)
        if problem:
            problems.append(problem)
            wrong.append(block)
    # Under a wrong pattern the compressed values mix in entries outside it: no element
    # verdict can be read off them, so their disagreements are undecidable, not mismatches.
    for block in wrong:
        block.wrong_pattern = True
        block.status[np.flatnonzero(block.status)] = compare.UNRESOLVED  # OK is 0
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
