"""The judge's tunables, as data: every threshold of the rule, the step ladders, the noise
measurement and the modes' search, each with one line of where its value comes from.

The rule (``_compare``), the strategies (``_full``, ``_fast``, ``_coloured``), the flat test
(``_flat``) and the noise measurement (``_precision``) read them from here; nothing else
defines a number that changes a verdict.  Measurements behind the values are in
``docs/measurements.md``.
"""

from __future__ import annotations

# -- tolerances ------------------------------------------------------------------------------
# By the precision the analytical side computes in (its dtype, or what fastcheck found inside f);
# the rule is |a - n| <= atol + rtol |n| + noise, never scaled by the tensor's size.  float32's and
# float64's are jax check_grads' orders of magnitude; float16's and TF32's keep a 10-bit mantissa.
DEFAULT_TOLERANCES = {
    "float64": {"atol": 1e-8, "rtol": 1e-6},
    "float32": {"atol": 1e-5, "rtol": 1e-4},
    "tensorfloat32": {"atol": 1e-2, "rtol": 1e-2},
    "float16": {"atol": 1e-2, "rtol": 1e-2},
    "bfloat16": {"atol": 5e-2, "rtol": 5e-2},
}

# -- the numerical side's own error ------------------------------------------------------------
NOISE_FACTOR = 4.0  # one evaluation's rounding, in eps * |f|: a few roundings of the last op
MEASURED_NOISE_FACTOR = 10.0  # measured noise, in its standard deviations: ~6 of a quotient, no alarm in 1e6 elements

# -- the step ladders ------------------------------------------------------------------------------
REFINE_RATIO = 4.0  # steps shrink 4x per level: the h^2 regime shows as gaps shrinking 16x, Richardson's factor
REFINE_LEVELS = 5  # failing columns (probes) re-evaluated at h/4 ... h/4**5
DEEP_LEVELS = 12  # ... those still unsettled down to h/4**12
EDGE_LEVELS = 20  # ... and h/4**20 where every step so far left f's domain (log at 1e-12)
CONFIRM_RATIO = 0.6180339887  # an independent step (the golden ratio): a step near a period of f (cos at 5e7) agrees by chance
CONFIRM_AGREES = 0.1  # ... whose estimate a confirmed one is within this share of itself (plus rounding): a coincidence is far off
CONFIRM_CURVATURE = 0.5  # ... and whose second difference the h^2-scaled one within this share (cos h = 1 near a period)
# Full mode's triage at h/4 (``_full._conclusive``): a mismatch is settled there without the ladder where the h/4
# quotient moves by at most TRIAGE_MOVED of the mismatch and TRIAGE_DRIFT of itself, its one-sided quotients differ
# by at most TRIAGE_SIDES of the mismatch (no kink crossed), and its second-order term is at most TRIAGE_LOCAL of the
# first-order one (a step small for f); then it must hold at the finest step whose rounding is 1/FINEST_ROUNDING of
# the mismatch, within FINEST_HOLDS of it (a ReLU input at 1e-8 of a fresh network: every coarser step agrees).
TRIAGE_MOVED = 0.01
TRIAGE_DRIFT = 0.1
TRIAGE_SIDES = 0.1
TRIAGE_LOCAL = 0.1
FINEST_ROUNDING = 8.0
FINEST_HOLDS = 0.25
# Steps averaged below a noisy pair, spread over [BELOW_LOW, 1] x the next step (a kink there moves both alike);
# a noise bound is about BOUND_DEVIATIONS standard deviations of a central quotient (MEASURED_NOISE_FACTOR / sqrt 2).
BELOW_POINTS = 8
BELOW_LOW = 0.6
BOUND_DEVIATIONS = 7.0

# -- kinks, jumps and quantised f -----------------------------------------------------------------
# One-sided quotients differ "visibly" beyond this many of the level's noise bounds (~4 deviations of their
# gap): at 8, float32 ReLU networks' kinks crossed at h and h/4 (gaps of 6-16 deviations) went unseen and
# settled false mismatches.  Sides that move between steps need UNSTEADY_VISIBLE; a jump of f, compared at the
# two finest steps only, JUMP_VISIBLE.
KINK_VISIBLE = 2.0
UNSTEADY_VISIBLE = 4.0
JUMP_VISIBLE = 20.0
QUANTA = 64  # a move of at most this many measured quanta before f freezes marks a quantised f (float32 in float64)

# -- where f does not move (``_flat``) ------------------------------------------------------------
FLAT_ROUNDINGS = 4.0  # a quotient is flat when f moved by at most this many of one evaluation's roundings
FLAT_MAX_STEP = 1.0  # larger steps tried up past this relative step: a binarized layer's latent weight crosses its sign
FLAT_JUMP_GROWTH = 2.0  # a 4x step moving f less than this many times as far is a jump (past a kink: 4x or more)
FLAT_AGREES = 0.5  # a larger step's quotient within this of the analytical value agrees (a leaking dead ReLU: 100x off)
NOISE_IS_F = 0.1  # measured noise this share of |f_i| or more: f keeps < ~3 bits (sin at 1e20: 0.8; bfloat16 inside: ~1e-3)

# -- resolution ----------------------------------------------------------------------------------
# A pass is decisive while its resolution (the smallest relative error of the gradient it flags) is within
# RESOLUTION_RTOLS of rtol (float32: 1%, no 1% defect passes for a wide allowance) or within
# RESOLUTION_NOISE_SHARE of the tolerances' own (atol sets it for small gradients): a fast-mode probe allowed
# 43% of its value once passed a 1% defect.
RESOLUTION_RTOLS = 100.0
RESOLUTION_NOISE_SHARE = 2.0
RESOLVE_COLUMNS = 8  # a coarse full-mode pass re-estimates this many of its most resolving columns ...
RESOLVE_UP = 4  # ... on the ladder h * 4**RESOLVE_UP ... h (float32 sum(x**2) over 2000 elements: 2.3% -> decisive)

# -- noise-limited columns: least-squares cubics (``_full._coarsen``) --------------------------------
COARSE_MAX_STEP = 0.25  # 4 H at most this relative step: past it the cubic's truncation, not the noise, rules
COARSE_TABLES = 8  # float64 [m, 9, k] tables alive at once in a fit (plus, minus, quotients, values, residuals)

# -- f's noise (``_precision``) ------------------------------------------------------------------
NOISE_SIDE = 8  # points on each side of x, each side on its own: four 4th differences per side (More & Wild)
SEPARATE_INPUTS = 4  # up to this many checked inputs get directions of their own
NOISE_DIRECTIONS = 2  # random integer-weighted directions per input
NOISE_START = 64.0  # machine epsilons (relative to max(1, |x|)): the first scale tried
NOISE_SCALES = 3  # fine scales tried for every check
NOISE_GROWTH = 1000.0  # between scales
NOISE_MAX_SCALE = 1e-2  # relative: far beyond any rounding, still far below most features of f
# Roughness first seen at a scale counts as noise only within CONFIRM_MARGIN of itself at a scale CONFIRM_SCALE
# times finer (rounding is scale-free; kinks crossed are not); CALM_SPREAD bounds the spread of calm scales.
CONFIRM_SCALE = 32.0
CONFIRM_MARGIN = 8.0
CALM_SPREAD = 2.0
# A jump of a piecewise-constant f (a straight-through quantizer's staircase) crossed by the line is not noise: an
# interval whose difference leaves the median one by JUMP_RATIO times the others' median deviation (and the table's
# rounding) is a jump while at most JUMP_MAX of a side's intervals are (round(4x)/4 over 64 elements: 1-2 of 7-8;
# Gaussian noise's 7 deviations reach 32 medians ~never); those tables are read without their jumps (issue #27).
JUMP_RATIO = 32.0
JUMP_MAX = 2
JUMP_RELATIVE = 2.0 ** -7  # and beyond bfloat16's epsilon of |f|: no rounding of f's value to a float dtype jumps so far
NOISY_EPSILONS = 16.0  # relative noise beyond this many machine epsilons: f loses precision inside (names the op)

# -- fast mode's search (``_fast``) -----------------------------------------------------------------
BLOCKS = 8  # the within-input bisection's blocks per level, and inputs per screening group
REGION_MAX = 64  # a localised region this small is checked element by element
REFINED_COLUMNS = 4  # the worst columns of a localised region refined before its worst element is named
LOCALISE_DRAWS = 3  # random draws per bisection level before giving up on it
MAX_LOCALISED_INPUTS = 4  # inputs localised one by one; further failing groups fail as groups
BLOCK_REFINE_OUTPUTS = 4096  # block probes refined for f with at most this many outputs (past it: seconds per level)
PARALLEL_ROWS = 8  # rows of a batched evaluation in flight at once (tf.map_fn's parallel_iterations)
# A group's probes dilute a defect in its smallest input by at most DILUTION (a group holds at most DILUTION**2
# times the elements of its smallest input): one direction over a 203-variable network missed a 1% defect 3 of 3.
DILUTION = 4

# -- coloured mode (``_coloured``) ---------------------------------------------------------------
DENSE_REPORT_ENTRIES = 1_000_000  # pairs up to this many entries are reported dense (zeros outside the pattern)
PATTERN_PROBES = 1  # random dense probes of the pattern (each confirmed at a quarter step only where it fails)
PATTERN_MARGIN = 3.0  # J d may leave the pattern's prediction by this factor before a quarter step confirms it
VJP_PROBE_WEIGHTS = (-4.0, -2.0, -1.0, 1.0, 2.0, 4.0)  # the dense cotangent's values: powers of two keep u exact
VJP_PROBE_ROUNDING = 64.0  # unit roundoffs of the native dtype per unit of sum_i |u_i a_ij|
NOISE_SAMPLE = 512  # rows whose noise is measured besides the failing nonzeros' (f's relative noise as a whole)
NOISE_ALL = 1 << 17  # up to this many outputs the noise is measured on all (the other modes' sigma, their verdicts)

# -- the memory a check may hold (``_check``) --------------------------------------------------------
# Full mode's peak host memory per Jacobian entry: numerical, analytical, noise and band (float64),
# f(x+h) and f(x-h) of the sweep (float64), the status (int8).
FULL_BYTES_PER_ENTRY = 49
# The arrays a check holds (full Jacobians, coloured mode's per-nonzero arrays) may use the larger of
# memory_budget (which sizes the batched evaluations) and this, never more than the free memory.
HELD_MEMORY_FLOOR = 4 << 30

# -- overridable per check ---------------------------------------------------------------------------
# The tunables a check reads from its options (``CheckConfig.table``), so ``tables={name: value}``
# overrides them for that check: for experiments with a threshold, and for tests that reach a branch
# (coloured mode's sampled noise, its sparse report, a check too large to hold) on a small problem.
CONFIGURABLE = frozenset({"NOISE_ALL", "DENSE_REPORT_ENTRIES", "FULL_BYTES_PER_ENTRY", "HELD_MEMORY_FLOOR"})
