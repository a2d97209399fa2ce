"""The precision f really computes in, and the noise of its evaluations, measured.

A float32 function may compute a matmul in bfloat16 inside, a Keras model under ``mixed_float16`` computes in
float16 under float32 variables, a float32 matmul on an Ampere/Hopper GPU runs in TensorFloat-32 by default, and a
float64 function may go through a float32-only op.  None of this shows in the input and output dtypes, so
fastcheck measures it:

* **Noise floor.**  ``f`` is evaluated at ``2 * NOISE_SIDE`` points ``x + t h p`` (t = +-1..8, each side on its
  own, p a random sign vector, ``h_j ~ 64 eps |x_j|``: far below any feature of f, above its rounding; grown for
  outputs that do not move at that scale, see ``measure_noise``).  The 4th differences along t of a smooth f are
  ~h^4 and vanish; what is left is f's rounding noise, whose standard deviation per output is
  ``sqrt(gamma_4 * mean(diff4^2))`` with ``gamma_4 = (4!)^2 / 8!`` (Moré & Wild, "Estimating computational
  noise", SIAM J. Sci. Comput. 2011).  Call-to-call differences at the same point (nondeterministic reductions)
  are added.
* **Named precision.**  When the measured noise is far above the evaluation dtype's rounding, one trace of f names
  the low-precision op (float16/bfloat16 ops in the graph); TensorFloat-32 is named when a float32 MatMul/Conv
  runs on a GPU with TF32 enabled.

The measured noise sets the numerical side's noise term, not its step (``executor.steps``); the precision sets
the tolerance row (``config.DEFAULT_TOLERANCES``).
"""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np
import tensorflow as tf

from fastcheck.engine.config import PRECISION_EPSILON, less_precise
from fastcheck.engine.tables import (
    CALM_SPREAD,
    CONFIRM_MARGIN,
    CONFIRM_SCALE,
    JUMP_MAX,
    JUMP_RATIO,
    JUMP_RELATIVE,
    NOISE_DIRECTIONS,
    NOISE_GROWTH,
    NOISE_MAX_SCALE,
    NOISE_SCALES,
    NOISE_SIDE,
    NOISE_START,
    SEPARATE_INPUTS,
)

_log = logging.getLogger(__name__)

_PRECISION_OF = {tf.float16: "float16", tf.bfloat16: "bfloat16", tf.float32: "float32", tf.float64: "float64"}
_TF32_OPS = frozenset({"MatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "Conv3D", "Conv2DBackpropInput",
                       "DepthwiseConv2dNative", "Einsum"})


@dataclasses.dataclass(frozen=True)
class Noise:
    """Measured noise of f's evaluations at the point."""

    sigma: np.ndarray  # [m] standard deviation of each output's rounding noise
    relative: float  # ||sigma|| / ||f(x)||: the relative noise of f as a whole

    def floored(self, y0: np.ndarray) -> Noise:
        """The noise with every output's at least ``relative * |f_i|`` and the outputs' RMS noise: for an f known
        to round in a lower precision inside (an op of it found in the graph).

        Rounding to a grid along equally spaced points is a sawtooth whose 4th differences vanish between
        wrap-arounds, so some outputs' tables look smooth (``sin(x) + float64(float32(cos(x)))``), and their tiny
        steps, where the float32 part is frozen, would settle on the derivative of the float64 part alone.  The
        RMS floor covers an output whose value cancels (sin + cos at -0.01, its float32 part 0.7).
        """
        finite = np.isfinite(y0) & np.isfinite(self.sigma)
        typical = float(np.sqrt(np.mean(self.sigma[finite] ** 2))) if finite.any() else 0.0
        with np.errstate(invalid="ignore"):
            floor = np.maximum(self.relative * np.where(np.isfinite(y0), np.abs(y0), 0.0), typical)
        return dataclasses.replace(self, sigma=np.maximum(self.sigma, floor))


def measure_noise(evaluate, values: list, positions: list[int], y0: np.ndarray, epsilon: float,
                  repeat: np.ndarray | None = None, seed: int = 0, line=None) -> Noise:
    """Noise of ``evaluate(values) -> flat float64 outputs`` around ``values`` (see the module docstring).

    ``positions``: indices of the checked (real-valued) entries of ``values``; ``repeat``: a second evaluation at
    the point itself, if one was made.  See ``_noise_along`` for the scales; an output that never moves has no
    noise.  ``line(steps, ts)``, when given, evaluates a whole table at once: f at ``x +- t step`` (``steps``:
    {position: step} of the inputs moved, t in ``ts``) as two [len(ts), m] arrays, or None where it cannot (the
    table is then evaluated point by point).
    """
    rng = np.random.default_rng(seed + 7103)
    bases = {p: values[p].numpy() for p in positions}
    # One direction per input when there are few: a smooth input (a bias added in float32) would otherwise hide
    # another that f quantises (x cast to bfloat16).
    groups = [[p] for p in positions] if len(positions) <= SEPARATE_INPUTS else [list(positions)]
    sigma = np.zeros(y0.shape)
    along = _Line(evaluate, values, line)
    for group in groups:
        # Random integer weights 1..3 with random signs (integers keep the points exact): with signs alone, an
        # output fed equally by two inputs (bilinear interpolation) cancels along half of all directions.
        for _ in range(NOISE_DIRECTIONS):
            signs = {p: rng.choice([-1.0, 1.0], size=bases[p].shape) * rng.integers(1, 4, size=bases[p].shape)
                     for p in group}
            sigma = np.maximum(sigma, _noise_along(along, {p: bases[p] for p in group}, signs, y0, epsilon))
    if repeat is not None:
        with np.errstate(invalid="ignore"):
            sigma = np.maximum(sigma, np.abs(np.asarray(repeat, np.float64) - y0) / math.sqrt(2))
    sigma = np.where(np.isfinite(sigma), sigma, 0.0)
    finite = np.isfinite(y0)
    size = float(np.linalg.norm(y0[finite])) if finite.any() else 0.0
    relative = float(np.linalg.norm(sigma[finite]) / size) if size > 0 else 0.0
    _log.debug("f's noise measured from %d tables of f along lines through x, %d of them one call of a traced loop "
               "each, the others point by point", along.tables, along.batched)
    return Noise(sigma, relative)


def _noise_along(evaluate, bases, signs, y0, epsilon) -> np.ndarray:
    """[m] noise per output along one direction.

    Scales from ``NOISE_START`` epsilons up to 1/8 of the finite-difference step (the 4th differences of a
    smooth f, ~scale^4, far below its rounding): each noise-dominated table counts (Moré & Wild's test: 5th and 6th
    differences as large as the 4th, where a smooth f's fall by orders of magnitude), so a quantisation coarser
    than the finest scale (a float32 cast inside a float64 f) is seen too.  Outputs that do not move at any of
    them grow the scale up to ``NOISE_MAX_SCALE`` (f rounds to bfloat16 inside, or does not depend on this input).

    Rounding is the same at every scale; kinks are not.  A deep ReLU network moved along all its weights crosses
    ReLU kinks within 1e-7 of the point, and its table there is as rough as noise -- but only there: at a scale
    ``CONFIRM_SCALE`` times finer it crosses ~32x fewer kinks, each bending the table ~32x less.  So an output
    whose table at a coarser scale is far rougher than at the finer ones counts only where the table at
    ``scale / CONFIRM_SCALE`` is about as rough (a float32 cast inside a float64 f: the same quantum at both);
    otherwise the roughness is f's own shape, for the steps to resolve, not noise a larger step would average away.
    """
    sigma = np.zeros(y0.shape)
    pending = np.isfinite(y0)
    calm = np.full(y0.shape, np.inf)  # the smallest estimate at a finer scale where the output moved
    ladder = list(np.geomspace(NOISE_START * epsilon, epsilon ** (1.0 / 3.0) / 8, NOISE_SCALES))
    scale = ladder[-1]
    first = True
    while ladder or (pending.any() and scale < NOISE_MAX_SCALE):
        fine = bool(ladder)
        scale = ladder.pop(0) if ladder else min(scale * NOISE_GROWTH, NOISE_MAX_SCALE)
        try:
            sides, estimate, moving, noisy, stepped = _table(evaluate, bases, signs, y0, scale, epsilon)
        except Exception:  # f refuses points this far out (a domain check): measure no further
            break
        # Only noise-dominated tables at the fine scales count.  An output that first moves at a later scale (on both
        # sides) was constant at the finer ones: f rounds it to a quantum q, and rounding to a grid has standard
        # deviation q / sqrt(12) even where a regular staircase makes the differences vanish.  The smallest gap
        # between its values bounds q from above.
        counted = noisy if fine else np.zeros(y0.shape, bool)
        with np.errstate(invalid="ignore"):
            rough = counted & (estimate > CONFIRM_MARGIN * calm)
        if rough.any():
            try:
                _, finer, finer_moving, finer_noisy, _ = _table(evaluate, bases, signs, y0, scale / CONFIRM_SCALE,
                                                                epsilon)
            except Exception:  # cannot tell: count it (a larger allowance, never a false alarm)
                finer, finer_moving, finer_noisy = estimate, moving, noisy
            with np.errstate(invalid="ignore"):
                shape_of_f = rough & finer_moving & ~(finer_noisy & (finer >= estimate / CONFIRM_MARGIN))
            counted = counted & ~shape_of_f
        # Rounding is scale-free: a coarser table within CONFIRM_MARGIN of the calm one counts at most CALM_SPREAD
        # times that (the spread of two estimates from four differences each); more would be kinks crossed at that
        # scale.  Rough, confirmed tables count whole.
        with np.errstate(invalid="ignore"):
            value = np.where(rough | ~np.isfinite(calm), estimate, np.minimum(estimate, CALM_SPREAD * calm))
        sigma[counted] = np.maximum(sigma[counted], value[counted])
        # An output that moves only by a jump or two (a staircase: f(x) = round(4x)/4) was not rounded to a
        # quantum: its gaps are the jumps' sizes, and a coarser scale would only cross more.  It is no longer
        # pending, and gives no quantum.
        thawed = pending & moving & ~stepped & (not first)
        if thawed.any():
            values_seen = np.sort(np.concatenate([sides[0], sides[1], y0[None]]), axis=0)
            gaps = np.diff(values_seen, axis=0)
            quantum = np.min(np.where(gaps > 0, gaps, np.inf), axis=0)
            quantised = thawed & np.isfinite(quantum)
            sigma[quantised] = np.maximum(sigma[quantised], quantum[quantised] / math.sqrt(12))
        if fine:
            calm = np.where(moving & np.isfinite(estimate), np.minimum(calm, estimate), calm)
        pending &= ~(moving | stepped)
        first = False
    return sigma


def _table(evaluate, bases, signs, y0, scale, epsilon):
    """(both sides' tables, noise estimate, moving mask, noise-dominated mask, stepped mask) at one scale.

    The estimate reads each side without the jumps the line crosses (``_without_jumps``);
    ``stepped``: outputs that some side, x itself included, moves only by a jump or two.
    """
    # Each side on its own, without x itself: a kink or jump of f at the point (relu at 0, relu' under order=2)
    # lies between the sides and is not noise.  The smaller side's estimate also leaves out a kink next to the
    # point on the other side.
    sides = evaluate.sides(bases, _line_steps(bases, signs, scale))
    orders = [_differences(_without_jumps(table, epsilon)) for table in sides]
    estimate = np.minimum(orders[0][4], orders[1][4])
    moving = np.ones(y0.shape, bool)
    noisy = np.ones(y0.shape, bool)
    stepped = np.zeros(y0.shape, bool)
    for table, order in zip(sides, orders):
        stepped |= _jumps(np.concatenate([y0[None], table]), epsilon).any(axis=0)
        moving &= np.any(table != y0[None], axis=0) & np.all(np.isfinite(table), axis=0)
        with np.errstate(invalid="ignore"):
            noisy &= (np.maximum(order[5], order[6]) >= order[4] / 4) & np.isfinite(order[4])
    return sides, estimate, moving, noisy, stepped


def _jumps(table: np.ndarray, epsilon: float) -> np.ndarray:
    """[len(table) - 1, m]: the intervals where a table's moves concentrate -- jumps of f, not noise.

    An interval is a jump when its difference leaves the median difference (the line's slope) by ``JUMP_RATIO``
    times the larger of the median such deviation and the table's own rounding (``epsilon * max |f|``: a staircase
    is exactly flat between its jumps), and by more than ``JUMP_RELATIVE * max |f|`` (f's value rounded to float32
    or bfloat16 moves by single quanta along the line too, and that is noise to measure); an output has jumps only
    where at most ``JUMP_MAX`` intervals are (more is a quantum crossed every few points: rounding, left alone).
    """
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.diff(table, axis=0)
        deviation = np.abs(diff - np.median(diff, axis=0))
        size = np.max(np.abs(table), axis=0)
        level = np.maximum(np.median(deviation, axis=0), epsilon * size)
        jumps = (deviation > JUMP_RATIO * level) & (deviation > JUMP_RELATIVE * size)
    few = np.asarray(np.sum(jumps, axis=0) <= JUMP_MAX)
    return jumps & few[None]


def _without_jumps(table: np.ndarray, epsilon: float) -> np.ndarray:
    """The table with its jumps (``_jumps``) taken out: each jump's difference replaced by the median one.

    Outputs without jumps keep their table bit for bit.
    """
    jumps = _jumps(table, epsilon)
    found = np.asarray(jumps.any(axis=0))
    if not found.any():
        return table
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.diff(table, axis=0)
        diff = np.where(jumps, np.median(diff, axis=0)[None], diff)
        rebuilt = table[:1] + np.concatenate([np.zeros_like(table[:1]), np.cumsum(diff, axis=0)])
    return np.where(found[None], rebuilt, table)


def _differences(table: np.ndarray) -> dict[int, np.ndarray]:
    """Noise estimates per output from the k-th differences, k = 4, 5, 6: sqrt(gamma_k * mean(diff_k^2))."""
    estimates = {}
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.diff(table, n=4, axis=0)  # each higher order from the last: np.diff(n=k) iterates the same way
        for k in (4, 5, 6):
            if k > 4:
                diff = np.diff(diff, axis=0)
            gamma = math.factorial(k) ** 2 / math.factorial(2 * k)
            estimates[k] = np.sqrt(gamma * np.mean(np.square(diff), axis=0))
    return estimates


def _line_steps(bases, signs, scale) -> dict:
    """Per input, ``h_j p_j`` with ``h_j`` the power of two nearest ``scale * min(|x_j|, 1)``.

    Relative to |x_j| near zero (log at 1e-12 moves by 1e-12 * scale), but never more than ``scale`` itself: at
    |x| = 5e7 a relative move would span periods of cos.  A power of two at least 4 ulps of x_j (times a small
    integer weight) makes every x_j + t h_j exact, so the points lie exactly on the line and the differences see
    f's noise alone.
    """
    steps = {}
    for p, base in bases.items():
        magnitude = np.abs(base.astype(np.float64))
        floor = math.sqrt(float(np.finfo(base.dtype).tiny))  # x_j = 0 still moves
        size = scale * np.clip(magnitude, floor, 1.0)
        # At least 4 ulps, so that x_j itself moves: an output that stays put then does so because f rounds it.
        ulps = 4 * np.abs(np.spacing(base)).astype(np.float64)
        steps[p] = np.fmax(np.exp2(np.round(np.log2(size))), ulps) * signs[p]  # fmax: no ulp at inf
    return steps


class _Line:
    """f along a line through x: both sides' tables [NOISE_SIDE, m] at x + t h p, t = +-(1..NOISE_SIDE)."""

    def __init__(self, evaluate, values, line=None):
        self.evaluate, self.values, self.line = evaluate, values, line
        self.tables = self.batched = 0  # how it was measured (logged): tables, and those one batched call each

    def sides(self, bases, steps) -> list[np.ndarray]:
        ts = np.arange(1, NOISE_SIDE + 1)
        self.tables += 1
        if self.line is not None:  # one batched call for both tables
            found = self.line({p: steps[p].astype(base.dtype) for p, base in bases.items()}, ts)
            if found is not None:
                self.batched += 1
                return [np.asarray(found[0], np.float64), np.asarray(found[1], np.float64)]
        return [self._along(bases, steps, ts * side) for side in (1, -1)]

    def _along(self, bases, steps, ts) -> np.ndarray:
        rows: np.ndarray | None = None
        for k, t in enumerate(ts):
            moved = list(self.values)
            for p, base in bases.items():
                moved[p] = tf.constant((base + t * steps[p]).astype(base.dtype))
            row = np.asarray(self.evaluate(moved), np.float64)
            if rows is None:
                rows = np.empty((len(ts), row.size))
            rows[k] = row
        assert rows is not None  # NOISE_SIDE >= 1
        return rows


def low_precision_op(function, signature, below: str) -> tuple[str, str] | None:
    """(precision, op type) of the op computing in the lowest precision below ``below`` in the traced f, or None.

    A float64 f may go through a float32 op (a cast, a float32-only kernel), a float32 f through float16/bfloat16
    ones.  Casts are named only when no computing op runs in that precision, so the report names the op (e.g.
    MatMul) rather than the cast into it.
    """
    graph = function.get_concrete_function(*signature).graph
    limit = PRECISION_EPSILON[below]
    found: dict[str, str] = {}
    for op_type, dtypes in _op_dtypes(graph):
        for dtype in dtypes:
            name = _PRECISION_OF.get(dtype)
            if name is None or PRECISION_EPSILON[name] <= limit:
                continue
            if name not in found or (found[name] == "Cast" and op_type != "Cast"):
                found[name] = op_type
    if not found:
        return None
    lowest = less_precise(found)
    return lowest, found[lowest]


def tensorfloat32_op(function, signature) -> str | None:
    """The float32 MatMul/Conv op that a GPU with TF32 enabled runs in TensorFloat-32, or None."""
    if not tf.config.experimental.tensor_float_32_execution_enabled() or not tf.config.list_logical_devices("GPU"):
        return None
    try:  # the device of the enclosing ``tf.device`` scope ("": TF's default placement, a GPU if one exists)
        placed = tf.constant(0.0).device
    except Exception:  # pragma: no cover - eager always has a device
        placed = ""
    if placed and "GPU" not in placed.upper():
        return None
    graph = function.get_concrete_function(*signature).graph
    for op_type, dtypes in _op_dtypes(graph):
        if op_type in _TF32_OPS and tf.float32 in dtypes:
            return op_type
    return None


def _op_dtypes(graph):
    """(op type, output dtypes) of every op in the graph and the functions it calls."""
    for op in graph.get_operations():
        yield op.type, [o.dtype for o in op.outputs]
    for function_def in graph.as_graph_def().library.function:
        for node in function_def.node_def:
            dtypes = []
            for key in ("T", "dtype", "DstT", "Tout"):
                if key in node.attr and node.attr[key].type:
                    dtypes.append(tf.as_dtype(node.attr[key].type))
            yield node.op, dtypes


