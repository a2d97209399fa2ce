"""The fast check (``mode="fast"``): random projections over many inputs at once, and localisation.

One strategy of ``_check.run_check`` (with ``full`` and ``coloured``), evaluating f through the same executor
(its evaluations along directions are ``directions``).

**Probes over groups of inputs.**  A probe is one direction ``d = (d_1, ..., d_K)`` over several checked inputs
together, ``d_k = max(1, |x_k|) * v_k`` with ``v ~ N(0, 1)`` -- seeded draws that never touch TensorFlow's or numpy's
global RNG -- so every element moves by about the step full mode would use.  The inputs are tested in groups of
similar size (``_screening_groups``: at most 8 inputs, at most DILUTION**2 = 16 times the elements of the group's
smallest input; 20 groups for MobileNetV2's 158 variables), k probes per group, and one cotangent u:

* numerical  ``J d ~ (f(x + eps d) - f(x - eps d)) / (2 eps)``: the group's inputs move at once; every probe of
  every group goes through **one** compiled kernel (``directions._directional_kernel``: f at points that move any
  inputs), a few dozen probes per call, refined at smaller steps where they disagree;
* element-wise  ``J d = sum_k J_k d_k`` from the reverse-mode gradient: for a scalar f ``g . d`` with ``g`` the
  gradient (the user's supplied one for ``check_model``/``verify_gradients``); otherwise the derivative of the VJP
  ``(J^T u) . d`` with respect to u (``_reverse_jvp``, one kernel for all inputs, custom gradients included;
  forward mode stands in, with a note, where the VJP cannot be differentiated);
* projection  ``u . (J d)`` against ``(J^T u) . d``, from **one** VJP over every input (one ``tape.gradient``).

So the cost is one VJP, one kernel and ``2 k`` evaluations of f per group, never a trace, compile or VJP per input.
The tolerance accounts for the probe's norm explicitly and is never a multiple of the tensor size (``||d||_2`` is
over the group's elements):

    element-wise, per output element i:  |a_i - n_i| <= atol * ||d||_2 + rtol * |n_i| + noise_i = band_i
    projection, per probe:               |a - n|     <= ||u * band||_2

**Why groups, not one direction over everything.**  Numerically only the total ``J d = sum_k J_k d_k`` is
observable from a joint perturbation (the per-input terms ``(J_k^T u) . d_k`` are known on the autodiff side only),
and its allowance ``atol * ||d||_2`` grows with every element the probe moves: over a whole model a defect in a
small variable drowns in the allowance of the large ones (a 1% defect in a 32-element scale among 56,000 elements
passed one direction over all of them and failed its group's probes).  A group dilutes a defect in its smallest
input by at most DILUTION = 4 against the input's own probes.

f's noise is measured only when some group fails (measuring only widens allowances); the failing groups are then
tested again with the measured noise and precision, refined.

**Localisation** (``_Probes.localise``).  A group that still fails is bisected over its inputs, every part that shows the
defect followed (worst first, at most ``MAX_LOCALISED_INPUTS`` inputs; further failing groups fail as groups, hint
"capped").  An input reached this way gets its own k probes (as if it were the only input) and then the
within-input bisection: probes restricted to each of 8 blocks (contiguous in the flattened input, i.e. slabs along
the leading axes), recursively, down to a region small enough for an element-by-element check, whose worst element
is reported with the region.  A group whose defect shows in no single part is undecidable (hints "not shown",
"within parts"), as is a localised element where f does not move (``flat``: hint "flat element").  Each input's
pair holds the probes that decided it (its group's when the group passed, those of the part that cleared it or its
own when it was localised) and states its resolution: the smallest relative error of its gradient that its probes
flag, from its share ``(J^T u)_k . d_k`` of each projection.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools

import numpy as np
import tensorflow as tf

from fastcheck.engine.executor import Executor, along_columns, measured, steps, timed
from fastcheck.engine.plan import Plan
from fastcheck.engine.tables import (
    BLOCK_REFINE_OUTPUTS,
    BLOCKS,
    DILUTION,
    FLAT_ROUNDINGS,
    LOCALISE_DRAWS,
    MAX_LOCALISED_INPUTS,
    REFINE_RATIO,
    REFINED_COLUMNS,
    REGION_MAX,
    RESOLUTION_RTOLS,
)
from fastcheck.judge import compare as _compare
from fastcheck.judge import flat as _flat
from fastcheck.judge.refine import LADDER, Evaluate, Line, Rungs, confirmation, descend
from fastcheck.modes.directions import F64, Joint, _normal, _vjp
from fastcheck.report.events import FastSummary, Hint
from fastcheck.report.results import Outcome, PairReport
from fastcheck.report.storage import Comparison, Element, Projections

# Stateless seeds (seed, SEEDS[...] + i) of the probes, per purpose.
SEEDS = {"screen": 0, "groups": 1 << 20, "own": 2 << 20, "blocks": 3 << 20, "twin": 4 << 20}

# -- f along joint directions ------------------------------------------------------


def _screening_groups(sizes: list) -> list:
    """The checked inputs (indices) in groups of similar size, at most ``BLOCKS`` to a group: inputs taken in order
    of size, a group closed before it holds more than DILUTION**2 times the elements of its smallest input."""
    groups: list = []
    current: list = []
    total = 0
    for index in np.argsort(sizes, kind="stable"):
        if current and (total + sizes[index] > DILUTION**2 * max(1, sizes[current[0]]) or len(current) >= BLOCKS):
            groups.append(sorted(current))
            current, total = [], 0
        current.append(int(index))
        total += sizes[index]
    return [*groups, sorted(current)] if current else groups


@tf.function(reduce_retracing=True, autograph=False)  # one graph over any count of probes and outputs; no
# Python control flow on tensors: AutoGraph's conversion would cost more than the trace
def _summaries(estimate, forward, realised, noise, u, gradient, atol, rtol, own_atol, own_rtol):
    """Per-probe summaries in one graph call (TF's multi-threaded kernels; XLA CPU was 3x slower here); the
    tolerance's own allowance (a pass's resolution is measured against it) by ``own_atol``, ``own_rtol``."""
    norms = tf.norm(realised, axis=1)
    band = _compare.allowance(estimate, atol, rtol, noise, norms[:, None])
    difference = tf.abs(forward - estimate)
    ratio = tf.where(tf.math.is_nan(difference / band), tf.constant(np.inf, F64), difference / band)
    rows = tf.argmax(ratio, axis=1, output_type=tf.int32)
    pick = lambda t: tf.gather(t, rows, axis=1, batch_dims=1)  # noqa: E731
    tolerated = _compare.allowance(estimate, own_atol, own_rtol, 0.0, norms[:, None])
    reverse = tf.stack([tf.linalg.matvec(realised, gradient), tf.reduce_sum(u[None, :] * estimate, axis=1),
                        tf.norm(u[None, :] * band, axis=1), tf.norm(u[None, :] * tolerated, axis=1)], axis=1)
    finite = tf.math.is_finite(forward - estimate)
    safe = lambda t: tf.where(finite, t, tf.zeros_like(t))  # noqa: E731
    squares = tf.stack([tf.reduce_sum(safe(forward - estimate) ** 2, axis=1), tf.reduce_sum(safe(estimate) ** 2, axis=1),
                        tf.reduce_sum(safe(forward) ** 2, axis=1)], axis=1)
    worst = tf.stack([tf.cast(rows, F64), pick(forward), pick(estimate), pick(band)], axis=1)
    return tf.reduce_max(ratio, axis=1), worst, reverse, squares


def _probe_kind(status, elements, projection, settled, kink, jump) -> int:
    """One probe's status from its failing elements' (``compare.classify``'s ``status`` where ``elements``) and,
    for its projection, from every output's refinement (see ``_refined``)."""
    failing = status[elements]
    if np.any(failing == _compare.MISMATCH) or (projection and np.all(settled | ~elements)
                                                and not np.any(kink | jump)):
        return _compare.MISMATCH
    if np.any(failing == _compare.DISCONTINUOUS) or (projection and np.any(jump)):
        return _compare.DISCONTINUOUS
    at_kinks = (failing == _compare.NONDIFFERENTIABLE) | (failing == _compare.UNRESOLVED_KINK)
    if np.any(at_kinks):
        return _compare.NONDIFFERENTIABLE if np.all(failing == _compare.NONDIFFERENTIABLE) else _compare.UNRESOLVED_KINK
    if projection and np.any(kink):
        return _compare.UNRESOLVED_KINK
    if np.any(elements) or projection:
        return _compare.UNRESOLVED
    return _compare.MISMATCH  # passes after refinement: its ratio is at most 1


def _screen_directions(joint: Joint, group: list, number: int, first: int = 0, count: int | None = None) -> tf.Tensor:
    """Screening probes ``first`` .. ``first + count`` (default: all k) of group number ``number``: [count, n]."""
    k = joint.config.probes
    count = k - first if count is None else count
    return joint.restricted([joint.ranges(group)] * count, joint.config.seed, SEEDS["screen"] + number * k + first)


def _forward_failed(probes: Comparison) -> bool:
    """Whether the element-wise side of some probe shows a wrong gradient."""
    return bool(np.any((probes.forward_ratio > 1) & (probes.kind == _compare.MISMATCH)))


def _nonfinite_elsewhere(result: Comparison, index: int) -> bool:
    """Whether ``result``'s failing probes are all projections that are not finite while input ``index``'s share of
    each is finite: another input's gradient is not, and these probes say nothing of this one's."""
    failing = result.score > 1
    nan = result.kind == _compare.ANALYTICAL_NONFINITE
    return bool(nan.any() and np.all(nan[failing]) and np.all(np.isfinite(result.shares[nan, index])))


def _flat_element(joint: Joint, position: int, column: int, row: int | None, first: Comparison, at: int, side: str,
                  analytical: float) -> bool:
    """Whether the localised element (``column`` of input ``position``; output ``row``, or the projection of
    a scalar f) is one where f does not move (``flat``): its first-step quotient ``first``'s entry ``at``."""
    if row is None and joint.plan.m != 1:
        return False  # a projection over several outputs names no output to follow
    row = 0 if row is None else row
    # The unit probe's J d quotient over the span 2 eps is f's move: d = max(1, |x_j|) e_j at step eps.
    moved = abs(first.forward_worst[at][2] if side == "forward" else first.reverse[at][1]) * 2 * joint.eps
    level = _flat.rounding_level(joint.plan)[row]
    if not moved <= FLAT_ROUNDINGS * level:
        return False
    executor, rows, cols = joint.executor, np.array([row]), np.array([column])
    base = steps(executor.plan, joint.config, position)[cols]
    return int(_flat.status(executor.plan, joint.config, rows, np.array([analytical]), lambda multiples: along_columns(
        executor, position, rows, cols, base, multiples))[0]) != _compare.MISMATCH


@dataclasses.dataclass(frozen=True, eq=False)
class _Probes:
    """Fast mode's probes and what they are judged by, as one value: the joint evaluation (``Joint``), the one
    cotangent ``u`` and its VJP ``gradient`` (over every checked input, concatenated), the rule (atol, rtol) and,
    under the float64 twin's rule, the gradient less its twin (``slack``: |slack . d| added to every probe's band,
    float64's allowance plus the gradient's measured difference from its twin, as full mode's twin allows).  A
    later stage gets a new value (f's noise measured, the twin's rule), never an edited one."""

    joint: Joint
    u: tf.Tensor
    gradient: tf.Tensor
    atol: float
    rtol: float
    slack: tf.Tensor | None = None

    def measured(self, timings: dict) -> _Probes:
        """Under the plan with f's measured noise and precision (measured once per check) and its tolerances."""
        if self.joint.plan.noise is not None:
            return self
        with timed(timings, "noise"):
            joint = self.joint.with_plan(measured(self.joint.executor, self.joint.plan))
        atol, rtol = joint.config.tolerances(joint.plan.precision)
        return dataclasses.replace(self, joint=joint, atol=atol, rtol=rtol)

    def _judge(self, estimate, forward, realised, noise, own=None) -> Comparison:
        own_atol, own_rtol = (self.atol, self.rtol) if own is None else own
        forward_ratio, worst, reverse, squares = (t.numpy() for t in _summaries(
            estimate, forward, realised, noise, self.u, self.gradient,
            *(tf.constant(v, F64) for v in (self.atol, self.rtol, own_atol, own_rtol))))
        with np.errstate(invalid="ignore", divide="ignore"):
            reverse_ratio = np.abs(reverse[:, 0] - reverse[:, 1]) / reverse[:, 2]
        return Comparison(forward_ratio, np.where(np.isnan(reverse_ratio), np.inf, reverse_ratio), worst, reverse,
                          squares, np.full(len(forward_ratio), _compare.MISMATCH), np.zeros((len(forward_ratio), 0)))

    def _judge_arrays(self, estimate: np.ndarray, noise: np.ndarray, forward, realised, own=None) -> Comparison:
        """``_judge`` of host-side estimates; ``forward=None`` compares the estimate with itself."""
        estimate = tf.constant(estimate)
        return self._judge(estimate, estimate if forward is None else forward, realised, tf.constant(noise), own)

    def compare(self, directions: tf.Tensor, forward_side=True, refine=True, confirm=False, own=None) -> Comparison:
        """Numerical vs element-wise J d and projection for the given joint probes, a call's worth at a time.

        ``forward_side=False`` skips the element-wise J d (that comparison then passes trivially); ``refine=False``
        skips the smaller-step re-evaluation of failing probes (``_refined``), whose ratios > 1 then all count as
        mismatches; ``confirm`` (directions along single elements) confirms a settled mismatch as every mode does.
        ``own`` the (atol, rtol) whose allowance a pass's resolution is measured against (``compare.coarse``; the
        judging rule's by default, the native rule's under the twin's, as full mode measures a twinned pair).
        """
        joint, parts = self.joint, []
        # A gradient not finite somewhere is judged as 0 there, and only the probes that move such an element see
        # it (0 * NaN is NaN: every probe of every input would): those are "analytical not finite".
        unfinite_gradient = ~tf.math.is_finite(self.gradient)
        anywhere = bool(tf.reduce_any(unfinite_gradient))
        probes = dataclasses.replace(self, gradient=tf.where(unfinite_gradient, tf.zeros_like(self.gradient),
                                                             self.gradient)) if anywhere else self
        for start in range(0, int(directions.shape[0]), joint.rows_per_call):
            d = directions[start : start + joint.rows_per_call]
            estimate, realised, plus, minus, noise = joint.numerical(d)
            touched = (tf.linalg.matvec(tf.cast(tf.not_equal(realised, 0), F64), tf.cast(unfinite_gradient, F64)) > 0
                       if anywhere else tf.zeros([int(realised.shape[0])], tf.bool))
            extra = None if self.slack is None else tf.abs(tf.linalg.matvec(realised, self.slack))[:, None]
            forward = joint.jvp(realised, probes.gradient, self.u) if forward_side else None
            forward_side = forward is not None
            forward = estimate if forward is None else forward
            finite = tf.reduce_all(tf.math.is_finite(estimate), axis=1)  # [k], on the device
            if forward_side:
                # An element-wise J d that is not finite where the estimate is (the VJP's own derivative, NaN in
                # euclidean_norm's at a finite gradient) says nothing of the gradient: the projection alone judges.
                lost = finite & ~tf.reduce_all(tf.math.is_finite(forward), axis=1)
                forward = tf.where(lost[:, None], estimate, forward) if bool(tf.reduce_any(lost)) else forward
            result = probes._judge(estimate, forward, realised, noise if extra is None else noise + extra, own)
            # A gradient that is not finite where f's differences are (a NaN on tf.where's discarded branch) fails,
            # as full mode's ANALYTICAL_NONFINITE does: no step settles it.
            unfinite = (touched & finite).numpy()
            failing = np.flatnonzero((result.score > 1) & ~unfinite)
            if refine and len(failing):
                # Curvature along a long direction, or kinks the step crosses, are not a gradient bug: refine the
                # failing probes with smaller steps, an error estimate and a kink test.
                first = tuple(t.numpy() for t in (estimate, noise, plus, minus, realised, forward))
                extra = np.broadcast_to(np.asarray(0.0 if extra is None else extra, np.float64), tuple(estimate.shape))
                estimate, noise, kind = probes._refined(d, failing, first, forward_side, confirm, extra[failing].T)
                result = probes._judge_arrays(estimate, noise + extra, forward if forward_side else None, realised,
                                              own)
                result.kind = kind
            result.kind[unfinite], result.reverse_ratio[unfinite] = _compare.ANALYTICAL_NONFINITE, np.inf
            result.shares = joint.shares(realised, self.gradient)
            parts.append(result)
        return Comparison.join(parts)

    def _refined(self, directions: tf.Tensor, failing: np.ndarray, first: tuple, forward_side: bool,
                 confirm: bool = False, extra=0.0):
        """Refined estimates, their error and a status per probe for the ``failing`` probes.

        The same ladder and rule as full mode's (``compare.refine``), along each probe's line t -> f(x + t d) instead
        of along one element: steps h/4 ... h/4**REFINE_LEVELS in one batched call, then down to h/4**DEEP_LEVELS for
        probes whose mismatch did not settle.  A probe through a deep ReLU network crosses kinks within 1e-7 of the
        point (calibrated MobileNetV2: the quotient along all weights moves from -121 at h = 1e-3 to -548 at 1e-7): only
        steps that resolve them settle an estimate, and kinks that no step resolves are classified, never a mismatch:

        * settled estimate outside the band: MISMATCH (a wrong gradient);
        * kinks crossed: NONDIFFERENTIABLE when the analytical J d lies between the one-sided derivatives (a pass), else
          UNRESOLVED_KINK (undecidable);
        * a jump of f along d: DISCONTINUOUS; nothing settled: UNRESOLVED.

        Every level's direction realised in the evaluation dtype differs from the first level's by rounding (at
        h/4**12 by 1e-4 of each element in float64): each level is shifted to the first level's direction by
        J (r_0 - r_level), from the analytical side (an error in it changes that tiny correction by as little).

        ``first`` holds the first evaluation's (estimate, noise, plus, minus, realised, forward) [k, .] arrays, ``extra``
        [m, failing] what every band adds beyond the noise (``compare``'s |slack . d|).  Returns
        (estimate, noise) [k, m] with the failing probes' rows replaced, and the kind [k] of every probe (MISMATCH for
        the others).
        """
        joint, u, gradient, atol, rtol = self.joint, self.u, self.gradient, self.atol, self.rtol
        estimate, noise, plus, minus, realised, forward = (np.array(t) for t in first)
        norms = np.linalg.norm(realised[failing], axis=1)
        # Only the outputs some failing probe's element fails at (all of them when only a projection fails): the
        # ladder's arrays are [outputs, probes] per level (at 10^6 outputs, refining every one cost 2 minutes).
        rows = np.arange(joint.plan.m)
        if forward_side:
            with np.errstate(invalid="ignore"):
                band0 = _compare.allowance(estimate[failing].T, atol, rtol, noise[failing].T + extra, norms[None, :])
                outside = ~(np.abs(forward[failing].T - estimate[failing].T) <= band0)
            if outside.any():
                rows = np.flatnonzero(outside.any(axis=1))
        head = (estimate[failing][:, rows].T, noise[failing][:, rows].T, plus[failing][:, rows].T,
                minus[failing][:, rows].T, np.full(len(failing), 2 * joint.eps))
        analytical = forward[failing][:, rows].T if forward_side else None
        extra = np.broadcast_to(extra, (joint.plan.m, len(failing)))
        whole_estimate, whole_noise = estimate[failing].T.copy(), noise[failing].T.copy()  # [m, k]: every output
        weights = u.numpy()

        def beyond(best, error, selection=slice(None)):
            """The refined rows' elements outside their band (of the probes ``selection``), and the band."""
            with np.errstate(invalid="ignore"):
                band = _compare.allowance(best, atol, rtol, error + extra[rows][:, selection], norms[None, selection])
                return ~(np.abs(analytical[:, selection] - best) <= band), band

        def mismatched(best, error):
            """Element and projection mismatches of the refined rows, the projection over every output."""
            whole_estimate[rows], whole_noise[rows] = best, error
            if analytical is not None:
                elements, band = beyond(best, error)
            else:
                elements, band = np.zeros(best.shape, bool), _compare.allowance(best, atol, rtol, error + extra[rows],
                                                                                norms[None, :])
            with np.errstate(invalid="ignore"):
                whole_band = _compare.allowance(whole_estimate, atol, rtol, whole_noise + extra, norms[None, :])
                # Against the reverse-mode projections (J^T u) . r of the realised directions r.
                projection = ~(np.abs(weights @ whole_estimate - realised[failing] @ np.asarray(gradient, np.float64))
                               <= np.linalg.norm(weights[:, None] * whole_band, axis=0))
            return elements, projection, band

        def still_open(found: _compare.Refined) -> np.ndarray:
            elements, projection, _ = mismatched(found.estimate, found.error)
            return np.any(elements & ~found.settled, axis=0) | (projection & ~np.all(found.settled, axis=0))

        # The first level is the first evaluation's; the deeper ladder keeps the first one's levels.
        evaluate = self._ladder(directions, failing, realised, rows, head)
        confirmed = None
        if confirm and analytical is not None:
            # Along one element a probe is full mode's column: its settled mismatch holds at independent steps
            # (``refine.confirmation``).  A probe moving many elements is not confirmed: each approaches f's domain
            # edges at its own distance, and the golden steps' curvature test fails there for a real defect.
            level = np.asarray(joint.level.numpy(), np.float64)[rows]

            line = Line(lambda selection: np.full(len(selection), joint.eps),
                        lambda selection, spans: level[:, None] / spans[None, :])
            confirmed = confirmation(evaluate, line, analytical,
                                     lambda selection, found: beyond(found.estimate, found.error, selection)[0])
        found = descend(evaluate, len(failing), LADDER.first, still_open, LADDER.deeper, confirmed)
        elements, projection, band = mismatched(found.estimate, found.error)
        # Each element by the one classification (beside a kink, within the probe's band), then each probe by them.
        status, _ = _compare.classify(found.estimate if analytical is None else analytical, found, atol, rtol, band)
        kinds = np.full(len(estimate), _compare.MISMATCH)
        for j, probe in enumerate(failing):
            kinds[probe] = _probe_kind(status[:, j], elements[:, j], projection[j], found.settled[:, j], found.kink[:, j],
                                       found.jump[:, j])
        estimate[failing], noise[failing] = whole_estimate.T, whole_noise.T
        return estimate, noise, kinds

    def _ladder(self, directions: tf.Tensor, probes: np.ndarray, realised: np.ndarray, outputs: np.ndarray,
                head: tuple | None = None) -> Evaluate:
        """The evaluation ``descend`` drives for ``probes``: ``compare.refine`` levels [(estimate, noise, plus, minus,
        span)], [len(outputs), len(selection)] each, of a selection of the probes at steps h / REFINE_RATIO**p: one
        batched evaluation, every level shifted to the probe's first realised direction (see ``_refined``).  ``head``:
        the level at h (p = 0), from the first evaluation, not evaluated again."""
        joint, u, gradient = self.joint, self.u, self.gradient
        y0 = np.asarray(joint.y0, np.float64)[outputs]
        sigma = joint.plan.noise.sigma[outputs] if joint.plan.noise is not None else None

        def evaluate(selection: np.ndarray, powers, factors=None) -> Rungs:
            powers = list(powers)
            levels = []
            if head is not None and powers[0] == 0 and factors is None:
                levels.append(tuple(array[..., selection] for array in head))
                powers = powers[1:]
            if not powers:
                return Rungs(levels, y0, sigma)
            # The rest at steps h / 4**p (times ``factors``, where given), in one batched evaluation.
            count = len(selection)
            divides = np.array([REFINE_RATIO**p for p in powers], np.float64) / np.asarray(factors or 1.0, np.float64)
            rows = np.repeat(probes[selection], len(powers))
            e, r, p, mi, nz = joint.numerical(tf.gather(directions, rows), np.tile(divides, count))
            moved = joint.jvp(tf.constant(realised[rows]) - r, gradient, u)
            shift = 0.0 if moved is None else moved.numpy()[:, outputs]  # [rows, outputs]
            step = joint.eps / np.tile(divides, count)[:, None]
            e, p, mi = e.numpy()[:, outputs] + shift, p.numpy()[:, outputs] + step * shift, mi.numpy()[:, outputs] - step * shift
            nz = nz.numpy()[:, outputs]
            for j in range(len(powers)):
                pick = np.arange(count) * len(powers) + j
                levels.append((e[pick].T, nz[pick].T, p[pick].T, mi[pick].T, np.full(count, 2 * joint.eps / divides[j])))
            return Rungs(levels, y0, sigma)

        return evaluate

    def screen(self, groups: list, numbers, refine=True) -> list:
        """k probes restricted to each group of inputs (group number g draws from seeds g * k ...),
        as many groups to a batched evaluation as fit one: a ``Comparison`` per group."""
        joint = self.joint
        k = joint.config.probes
        per_call = max(1, joint.rows_per_call // k)
        results: list = []
        numbers = list(numbers)
        for start in range(0, len(groups), per_call):
            part = range(start, min(start + per_call, len(groups)))
            directions = tf.concat([_screen_directions(joint, groups[i], numbers[i]) for i in part], 0)
            found = self.compare(directions, refine=refine)
            results += [found.select(np.arange(j * k, (j + 1) * k)) for j in range(len(part))]
        return results

    def sharpened(self, group: list, number: int, result: Comparison) -> Comparison:
        """A passing group's probes re-estimated on the ladder h * 4**RESOLVE_UP ... h (``compare.refine``), as full
        mode sharpens a coarse pass: a probe whose settled estimate has a smaller allowance takes it.  The result
        replaces the group's only where every probe still passes (a larger step's truncation is judged by the
        ladder, never confirmed as a mismatch): otherwise the coarse pass stands, undecidable."""
        joint = self.joint
        directions = _screen_directions(joint, group, number)
        first, realised, _, _, first_noise = (t.numpy() for t in joint.numerical(directions))
        probes = np.arange(int(directions.shape[0]))
        best, error, settled, *_ = descend(self._ladder(directions, probes, realised, np.arange(joint.plan.m)),
                                           len(probes), LADDER.larger)
        better = np.all(settled, axis=0) & (np.max(error, axis=0) < np.max(first_noise, axis=1))  # [k]
        estimate = np.where(better[:, None], best.T, first)
        noise = np.where(better[:, None], error.T, first_noise)
        forward = joint.jvp(tf.constant(realised), self.gradient, self.u)  # None: the estimate against itself
        sharpened = self._judge_arrays(estimate, noise, forward, tf.constant(realised))
        sharpened.shares = joint.shares(tf.constant(realised), self.gradient)
        return sharpened if sharpened.ok else result

    def localise(self, failing: list) -> dict:
        """Per-input verdicts of the failing groups: ``{input index: (probes, hint, region, worst, side)}``.

        ``failing`` holds (input indices, their failing probes, the worst failing probe's direction [n]).  Bisection
        over each group's inputs (every sub-group that shows the defect followed, worst first), then each input reached
        gets its own k probes and the within-input bisection.  A part shows the defect when fresh random probes
        restricted to it fail, or, failing that, when the group's failing probe itself restricted to it does: a wrong
        gradient's error is linear in the direction, so the split probe's errors add up to the whole one's and the part
        holding a wrong element carries its error undiluted, against a smaller allowance.  A group whose failure shows
        in no part is undecidable (hint "within parts" where every probe of every part passed outright,
        "not shown" otherwise), never a FAIL without an input it names: the whole direction can cross kinks the
        parts' do not (a correct float32 ReLU MLP).
        """
        joint = self.joint
        k, seed = joint.config.probes, joint.config.seed
        decided: dict = {}
        draws = itertools.count()
        tie = itertools.count()
        pending = [(-float(np.max(probes.defect)), next(tie), list(group), probes, len(group) == 1, direction)
                   for group, probes, direction in failing]  # groups showing the defect, worst first
        heapq.heapify(pending)
        leaves: list = []
        while pending:
            _, _, group, flagged, own, direction = heapq.heappop(pending)
            if len(leaves) >= MAX_LOCALISED_INPUTS:
                for index in group:
                    decided[index] = (flagged, Hint("capped", count=MAX_LOCALISED_INPUTS), None, None, "forward")
                continue
            if len(group) == 1:
                leaves.append((group[0], flagged, own))
                continue
            forward_side = _forward_failed(flagged)  # follow only the side(s) that failed
            parts = [[int(i) for i in part] for part in np.array_split(group, min(BLOCKS, len(group)))]
            # A projection catches a defect with a random-sized signal: when no part shows it, draw again before
            # concluding that it is spread over them.
            within = True  # every probe of every part within its allowance, on every draw
            for _ in range(LOCALISE_DRAWS):
                directions = joint.restricted([joint.ranges(part) for part in parts], seed, SEEDS["groups"] + 64 * next(draws))
                found = self.compare(directions, forward_side=forward_side)
                within = within and bool(np.all(found.score <= 1))
                if found.wrong:
                    break
            if not found.wrong:  # the failing probe itself, split over the parts
                directions = joint.split(direction, parts)
                found = self.compare(directions, forward_side=forward_side)
                within = within and bool(np.all(found.score <= 1))
            if not found.wrong:
                hint = Hint("within parts") if within else Hint("not shown")
                flagged = flagged.not_shown(_compare.UNRESOLVED)
                for index in group:
                    decided[index] = (flagged, hint, None, None, "forward")
                continue
            for row, part in enumerate(parts):
                probe = found.select([row])
                if not probe.wrong:
                    for index in part:
                        decided[index] = (probe, None, None, None, "forward")
                else:
                    heapq.heappush(pending, (-float(probe.defect[0]), next(tie), part, probe, False, directions[row]))
        for index, flagged, own in leaves:
            if not own:
                # The input's own test: k probes restricted to it, as if it were the only input.
                mine = self.compare(joint.restricted([joint.ranges([index])] * k, seed, SEEDS["own"] + 64 * index))
                flagged = Comparison.join([mine, flagged])
            decided[index] = (flagged, *self.within(index, flagged))
        return decided

    def within(self, index: int, result: Comparison) -> tuple:
        """(hint, region, worst element, side) of one input: bisect its flattened elements into blocks,
        follow the worst, then check the region's elements one by one."""
        if not result.wrong:
            return None, None, None, "forward"
        joint, seed = self.joint, self.joint.config.seed
        spec = joint.specs[index]
        forward_side = _forward_failed(result)  # follow only the side(s) that failed
        m, n, offset = joint.plan.m, spec.size, int(joint.offsets[index])
        region_max = int(max(1, min(REGION_MAX, joint.config.budget // max(1, 40 * m))))
        hint = Hint("localised")
        low, high, level = 0, n, 0
        while high - low > region_max:
            edges = np.linspace(low, high, min(BLOCKS, high - low) + 1).astype(int)
            blocks = [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]
            # Drawn again when no block shows the defect, as in ``localise``.
            for draw in range(LOCALISE_DRAWS):
                directions = joint.restricted([[(offset + a, offset + b)] for a, b in blocks], seed,
                                              SEEDS["blocks"] + 1000 * draw + 64 * level)
                # Refined where they fail (a block's probes cross kinks as the whole input's do), up to
                # BLOCK_REFINE_OUTPUTS outputs: past them each level's refinement costs seconds, and the block only
                # has to show the defect more than its siblings.
                found = self.compare(directions, forward_side=forward_side, refine=joint.plan.m <= BLOCK_REFINE_OUTPUTS)
                if found.wrong:
                    break
            if not found.wrong:
                break  # the defect no longer shows in any one block: report the region so far
            if level == 0 and len(blocks) > 1 and np.all(found.defect > 1):
                hint = Hint("throughout")
            level += 1
            low, high = blocks[int(np.argmax(found.defect))]
        shape = tuple(spec.real_view.shape)
        at = lambda flat: tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()  # noqa: E731
        region = (at(low), at(high - 1))
        if high - low > region_max:
            return dataclasses.replace(hint, spread=True), region, None, "forward"
        # Element by element inside the region: each numerical Jacobian column against its J e_j and (J^T u)_j.
        scale = joint.scale.numpy()[offset:]

        def columns_of(chosen, refine):
            parts, chunk = [], min(joint.rows_per_call, joint.jvp_rows)
            for start in range(0, len(chosen), chunk):
                part = chosen[start : start + chunk]
                unit = tf.one_hot(offset + part, joint.n, dtype=F64) * tf.constant(scale[part], F64)[:, None]
                parts.append(self.compare(unit, forward_side=forward_side, refine=refine, confirm=refine))
            return Comparison.join(parts)

        # Every column at the step h, then the worst few refined (h/4 ... h/64): the worst element is picked among
        # those, so curvature along one element does not make it.
        every = np.arange(low, high)
        first = columns_of(every, refine=False)
        columns = every[np.argsort(-first.score, kind="stable")[:REFINED_COLUMNS]]
        found = columns_of(columns, refine=True)
        scales = scale[columns]
        # Mismatches rank first: an element whose steps cross kinks no step resolves is not the defect.
        wrong = found.kind == _compare.MISMATCH
        forward_rank = np.where(wrong, found.forward_ratio, np.minimum(found.forward_ratio, 1.0))
        reverse_rank = np.where(wrong, found.reverse_ratio, np.minimum(found.reverse_ratio, 1.0))
        forward_best = int(np.argmax(forward_rank)) if forward_side else None
        reverse_best = int(np.argmax(reverse_rank))
        outputs = joint.plan.outputs
        out_shape = outputs[0].shape if len(outputs) == 1 and not outputs[0].dtype.is_complex else (m,)
        if forward_best is not None and forward_rank[forward_best] >= reverse_rank[reverse_best]:
            column, side = forward_best, "forward"
            row, a, num, band = found.forward_worst[column]
            output_index = tuple(int(i) for i in np.unravel_index(int(row), out_shape)) if out_shape else ()
            ratio = found.forward_ratio[column]
        else:
            column, side = reverse_best, "reverse"
            (a, num, band, _), output_index, ratio = found.reverse[column], (), found.reverse_ratio[column]
        unit = scales[column]
        status = "ok" if ratio <= 1 else _compare.STATUS_NAMES[int(found.kind[column])]
        worst = Element(output_index, at(columns[column]), float(a / unit), float(num / unit),
                        float(abs(a - num) / unit), float(band / unit), status)
        # Only a mismatch names a wrong element; one at a kink the steps cross is judged as full mode would.
        shown = ratio > 1 and int(found.kind[column]) == _compare.MISMATCH
        if shown and _flat_element(joint, spec.position, int(columns[column]),
                                   int(found.forward_worst[column][0]) if side == "forward" else None,
                                   first, int(columns[column] - low), side, float(a / unit)):
            flat = dataclasses.replace(worst, status=_compare.STATUS_NAMES[_compare.FLAT])
            return Hint("flat element"), region, flat, side
        return (hint if shown else Hint("region passes")), region, worst, side

    def twinned(self, inputs: list) -> tuple[dict, Joint]:
        """Inputs whose probes pass at a resolution coarser than 1% of their gradient, probed again under the rule of
        the gradient's float64 twin (``block.twinned``): each probe's band is float64's allowance plus |(g - twin) . d|,
        the gradient's own rounding measured: ``{input: (probes, hint, region, worst, side)}`` and the joint (with f's
        measured noise).  Only for a scalar f (a loss: its J d is the gradient's dot product), a float64 numerical side,
        float32 or lower analytical precision and the table's atol; an input whose twin differs from the gradient by
        more than its own tolerance, or is not finite, keeps its verdict.  Each input gets its own k probes, localised
        where they fail."""
        joint, u, gradient = self.joint, self.u, self.gradient
        executor, plan, config = joint.executor, joint.plan, joint.config
        if plan.m != 1 or not config.twin_applies(plan):
            return {}, joint
        atol, rtol = self.atol, self.rtol
        try:
            twin = _vjp(executor.plan, executor.values, u)
        except Exception:  # no float64 gradient: the verdicts stand
            return {}, joint
        same = _compare.same_computation(gradient.numpy(), twin.numpy(), atol, rtol)
        inputs = [i for i in inputs if np.all(same[joint.offsets[i] : joint.offsets[i + 1]])]
        if not inputs:
            return {}, joint
        joint = self.measured({}).joint  # float64's rule needs f's noise where it is evaluated (timed as the twin)
        atol64, rtol64 = config.twin_tolerances()
        k = config.probes
        directions = tf.concat([joint.restricted([joint.ranges([i])] * k, config.seed, SEEDS["twin"] + 64 * i)
                                for i in inputs], 0)
        # The gradient judged by the twin's rule (float64's allowance plus its measured difference from the twin),
        # as full mode's twin judges each element.
        rule = dataclasses.replace(self, joint=joint, atol=atol64, rtol=rtol64, slack=gradient - twin)
        found = rule.compare(directions, own=(atol, rtol))
        decided = {}
        for j, index in enumerate(inputs):
            mine = found.select(np.arange(j * k, (j + 1) * k))
            hint, region, worst, side = rule.within(index, mine)
            if mine.wrong and (worst is None or worst.status != _compare.STATUS_NAMES[_compare.MISMATCH]):
                # A twin's disagreement FAILs only at an element shown wrong on its own (full mode's twin is
                # element-wise): probes through a float64 ReLU network sit at its rule's edge (ratios 1.02-1.06).
                hint = Hint("region passes")  # check_fast judges its probes undecidable
            decided[index] = (mine, hint, region, worst, side)
        return decided, joint


# -- the strategy ----------------------------------------------------------------------


def check_fast(executor: Executor, plan: Plan, timings: dict, supplied=None, output_name=None,
               twin: bool = True) -> Outcome:
    """The fast check: k probes per group of similar-sized inputs, all in one batched evaluation and against one
    VJP; failing groups localised to inputs, then within them.

    One ``PairReport`` over ``Projections`` per checked input (see the module docstring for what each holds).
    ``supplied`` (plan -> gradient blocks [1, n_k] of a scalar f) replaces the reverse-mode VJP: ``check_model``'s
    tape gradient, or ``verify_gradients``' gradients.
    """
    config = executor.config
    with timed(timings, "fast"):
        joint = Joint(executor, plan, supplied)
        groups = _screening_groups([spec.size for spec in joint.specs])
        # One cotangent u for all probes: a single VJP then checks every u.J.d_i (u = 1 for a scalar f).
        u = tf.ones([1], F64) if plan.m == 1 else _normal([plan.m], [config.seed, 1 << 30])
        probes = _Probes(joint, u, joint.vjp(u), *config.tolerances(plan.precision))
        results = probes.screen(groups, range(len(groups)), refine=False)
    failing = [g for g, result in enumerate(results) if not result.ok]
    decided: dict = {}
    if failing:
        # Refined at smaller steps where they disagree (a probe through a ReLU network crosses kinks at step h).
        with timed(timings, "fast"):
            for g, result in zip(failing, probes.screen([groups[g] for g in failing], failing)):
                results[g] = result
        failing = [g for g in failing if not results[g].ok]
    if failing:
        # Only now f's noise and precision (a larger allowance only turns failures into passes, so a pass needs
        # none); what still fails is refined again under them.
        probes = probes.measured(timings)
        with timed(timings, "fast"):
            for g, result in zip(failing, probes.screen([groups[g] for g in failing], failing)):
                results[g] = result
            # Only probes that show a wrong gradient are localised; kinks no step resolves leave their group
            # undecidable, with what was found along its probes.
            failing = [g for g in failing if results[g].wrong]
            if failing:
                worst = [_screen_directions(probes.joint, groups[g], g, first=int(np.argmax(results[g].defect)),
                                            count=1)[0] for g in failing]
                decided = probes.localise([(groups[g], results[g], d) for g, d in zip(failing, worst)])
    for g, group in enumerate(groups):
        # A passing group whose probes cannot see a 1% error of some input's gradient (its noise swamps the
        # allowance): the same probes on the ladder 256 h ... h, where f's rounding is smaller.
        if results[g].ok and any(_compare.coarse(resolved, tolerance, probes.rtol)
                                 for resolved, tolerance in (results[g].resolution(i) for i in group if i not in decided)):
            with timed(timings, "fast"):
                results[g] = probes.sharpened(group, g, results[g])
    # Inputs whose group's probes still resolve no 1% error of their gradient (the group's atol ||d||_2 spans every
    # input's elements: a 2e-3 head gradient beside a backbone's): their own k probes, in one batched comparison.
    # So too an input whose group fails only by a projection that is not finite through another input's gradient.
    own = [i for g, group in enumerate(groups) if len(group) > 1 for i in group if i not in decided and (
        (results[g].ok and results[g].resolution(i)[0] > RESOLUTION_RTOLS * probes.rtol)
        or _nonfinite_elsewhere(results[g], i))]
    if own:
        with timed(timings, "fast"):
            k, joint = config.probes, probes.joint
            directions = tf.concat([joint.restricted([joint.ranges([i])] * k, config.seed, SEEDS["own"] + 64 * i)
                                    for i in own], 0)
            found = probes.compare(directions)
            if not found.ok and probes.joint.plan.noise is None:
                probes = probes.measured(timings)
                found = probes.compare(directions)
            for j, index in enumerate(own):
                mine = found.select(np.arange(j * k, (j + 1) * k))
                decided[index] = (mine, *probes.within(index, mine))
    group_of = {index: g for g, group in enumerate(groups) for index in group}
    probes_of = {i: decided[i][0] if i in decided else results[group_of[i]] for i in range(len(probes.joint.specs))}
    coarse = [i for i, p in probes_of.items() if p.ok and p.resolution(i)[0] > RESOLUTION_RTOLS * probes.rtol]
    twinned: dict = {}
    if twin and coarse:
        with timed(timings, "twin"):
            twinned, joint = probes.twinned(coarse)
        probes = dataclasses.replace(probes, joint=joint)  # f's noise measured for the twin: the rule stays
        decided.update(twinned)
    joint, atol, rtol = probes.joint, probes.atol, probes.rtol
    pairs = []
    for index, spec in enumerate(joint.specs):
        found, hint, region, worst, side = decided.get(index, (results[group_of[index]], None, None, None, "forward"))
        kind = None if hint is None else hint.kind
        if kind == "flat element":  # f does not move at the element the probes' disagreement leads to: undecidable
            found = found.not_shown(_compare.FLAT)
        if kind == "region passes":
            # The probes' disagreement, followed into a region, shows in none of its elements: no wrong
            # element to name, so undecidable (the element-wise rule passes what is there), not a FAIL.
            found = found.not_shown(_compare.UNRESOLVED)
        if hint is None and np.any(found.kind == _compare.ANALYTICAL_NONFINITE):  # its share is not finite
            share = probes.gradient[joint.offsets[index] : joint.offsets[index + 1]].numpy()
            bad = np.flatnonzero(~np.isfinite(share))
            first = [int(i) for i in np.unravel_index(bad[0], tuple(spec.real_view.shape))]
            hint = Hint("gradient not finite", count=len(bad), first=tuple(first))
        storage = Projections(found, found.resolution(index), region=region, found=worst, found_by=side)
        pairs.append(PairReport("u.J.d", spec.name, (), tuple(spec.real_view.shape), storage, atol, rtol, cause=hint,
                                side="reverse" if supplied is None else "supplied", float64_gradient=index in twinned))
    notes = []
    if len(joint.specs) > 1:
        within = [joint.specs[i].name for i, entry in sorted(decided.items()) if entry[2] is not None]
        notes.append(FastSummary(config.probes, len(joint.specs), len(groups), joint.n, joint.evaluations,
                                 tuple(within)))
    return Outcome(pairs, joint.plan, atol, rtol, "fast", notes, path=joint.path)
