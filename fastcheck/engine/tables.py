"""The package's tunables, as data: every threshold of the rule, the step ladders, the noise measurement and the
modes' search, and every number of routing (path choice and its time model), the memory model, mode choice,
execution blocks and the report, each with where its value comes from.

The rule (``compare``), the strategies (``full``, ``fast``, ``coloured``), the flat test (``flat``), the noise
measurement (``precision``), routing (``paths``, ``_check``) and the rest read them from here; no other module
defines a numeric tunable (only names, enums, texts, seeds and cache sizes).  Measurements behind the values are in
``docs/measurements.md``.
"""

from __future__ import annotations

# -- tolerances ------------------------------------------------------------------------------
# By the precision the analytical side computes in (its dtype, or what fastcheck found inside f); the rule is
# |a - n| <= atol + rtol |n| + noise, never scaled by the tensor's size.  float32's and float64's are jax
# check_grads' orders of magnitude; float16's and TF32's keep a 10-bit mantissa.
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
SECOND_STEP = 1  # every element-wise mode: a first sweep's failures at h/4 before any ladder (5321 of 10^7 float32 sin(x) x: all pass there)
CONFIRM_RATIO = 0.6180339887  # an independent step (the golden ratio): a step near a period of f (cos at 5e7) agrees by chance
CONFIRM_AGREES = 0.1  # ... whose estimate a confirmed one is within this share of itself (plus rounding): a coincidence is far off
CONFIRM_CURVATURE = 0.5  # ... and whose second difference the h^2-scaled one within this share (cos h = 1 near a period)
CONFIRM_ERRORS = 2.0  # a settled mismatch's confirmation: the two estimates agree within this many times their errors
CONFIRM_SHRINK = 4.0  # ... and the finer step's second difference is at most 1/this of the coarser's (h^2 predicts 16)
# The triage at h/4 (``refine._conclusive``, ``_finest_holds``; full and coloured mode): the h/4 quotient settles a
# mismatch without the ladder where it moves by at most TRIAGE_MOVED of the mismatch and TRIAGE_DRIFT of itself, its sides
# differ by at most TRIAGE_SIDES of the mismatch, and its second-order term is at most TRIAGE_LOCAL of the first-order
# one; then it must hold, within FINEST_HOLDS of it, at the finest step whose rounding is 1/FINEST_ROUNDING of it.
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
# Averaged only where the next step's rounding bound exceeds BELOW_NOISY of the mismatch; the mismatch holds unless
# their mean departs from the estimate by more than BELOW_HOLDS of it plus BELOW_DEVIATIONS of its deviations.
BELOW_NOISY = 0.25
BELOW_HOLDS = 0.5
BELOW_DEVIATIONS = 2.0
BOUND_DEVIATIONS = 7.0

# -- kinks, jumps and quantised f -----------------------------------------------------------------
# One-sided quotients differ "visibly" beyond this many of the level's noise bounds (~4 deviations of their gap):
# at 8, float32 ReLU networks' kinks crossed at h and h/4 went unseen and settled false mismatches.  Sides that move
# between steps need UNSTEADY_VISIBLE; a jump of f, compared at the two finest steps only, JUMP_VISIBLE.
KINK_VISIBLE = 2.0
UNSTEADY_VISIBLE = 4.0
JUMP_VISIBLE = 20.0
QUANTA = 64  # a move of at most this many measured quanta before f freezes marks a quantised f (float32 in float64)

# -- where f does not move (``flat``) ------------------------------------------------------------
FLAT_ROUNDINGS = 4.0  # a quotient is flat when f moved by at most this many of one evaluation's roundings
FLAT_MAX_STEP = 1.0  # larger steps tried up past this relative step: a binarized layer's latent weight crosses its sign
FLAT_JUMP_GROWTH = 2.0  # a 4x step moving f less than this many times as far is a jump (past a kink: 4x or more)
FLAT_AGREES = 0.5  # a larger step's quotient within this of the analytical value agrees (a leaking dead ReLU: 100x off)
NOISE_IS_F = 0.1  # measured noise this share of |f_i| or more: f keeps < ~3 bits (sin at 1e20: 0.8; bfloat16 inside: ~1e-3)

# -- resolution ----------------------------------------------------------------------------------
# A pass is decisive while its resolution (the smallest relative error of the gradient it flags) is within
# RESOLUTION_RTOLS of rtol (float32: 1%, no 1% defect passes for a wide allowance) or within RESOLUTION_NOISE_SHARE
# of the tolerances' own (atol sets it for small gradients): a fast-mode probe allowed 43% of its value once passed
# a 1% defect.
RESOLUTION_RTOLS = 100.0
RESOLUTION_NOISE_SHARE = 2.0
RESOLVE_COLUMNS = 8  # a coarse pass (full and coloured mode) re-estimates this many of its most resolving columns ...
RESOLVE_UP = 4  # ... on the ladder h * 4**RESOLVE_UP ... h (float32 sum(x**2) over 2000 elements: 2.3% -> decisive)
# A mismatch matches f's secant over wide steps (h * 4**RESOLVE_UP: the ladder's widest) where the analytical value is
# within the rule's band of that quotient (its error: how far the next finer one lies) and f's slope at the fine steps
# lies SECANT_APART bands or more away (a smooth f's truncation moves the two widest alike: a planted defect's slope
# stays within them); looked at for the first SECANT_SAMPLE mismatches of a block.
SECANT_APART = 2.0
SECANT_SAMPLE = 8

# -- noise-limited directions: least-squares cubics (``wide``) ------------------------------------------------
COARSE_MAX_STEP = 0.25  # 4 H at most this relative step: past it the cubic's truncation, not the noise, rules
COARSE_TABLES = 8  # float64 [m, 9, k] tables alive at once in a fit (plus, minus, quotients, values, residuals)

# -- f's noise (``precision``) ------------------------------------------------------------------
NOISE_SIDE = 8  # points on each side of x, each side on its own: four 4th differences per side (More & Wild)
SEPARATE_INPUTS = 4  # up to this many checked inputs get directions of their own
NOISE_DIRECTIONS = 2  # random integer-weighted directions per input
NOISE_START = 64.0  # machine epsilons (relative to max(1, |x|)): the first scale tried
NOISE_SCALES = 3  # fine scales tried for every check
NOISE_TABLES = NOISE_DIRECTIONS * (NOISE_SCALES + 1)  # (derived) the tables a measurement of f's noise evaluates
NOISE_GROWTH = 1000.0  # between scales
NOISE_MAX_SCALE = 1e-2  # relative: far beyond any rounding, still far below most features of f
# Roughness first seen at a scale counts as noise only within CONFIRM_MARGIN of itself at a scale CONFIRM_SCALE
# times finer (rounding is scale-free; kinks crossed are not); CALM_SPREAD bounds the spread of calm scales.
CONFIRM_SCALE = 32.0
CONFIRM_MARGIN = 8.0
CALM_SPREAD = 2.0
# A jump of a piecewise-constant f (a straight-through quantizer's staircase) crossed by the line is not noise: an
# interval whose difference leaves the median one by JUMP_RATIO times the others' median deviation (and the table's
# rounding) is a jump while at most JUMP_MAX of a side's intervals are (round(4x)/4: 1-2 of 7-8; Gaussian noise's 7
# deviations reach 32 medians ~never); those tables are read without their jumps.
JUMP_RATIO = 32.0
JUMP_MAX = 2
JUMP_RELATIVE = 2.0 ** -7  # and beyond bfloat16's epsilon of |f|: no rounding of f's value to a float dtype jumps so far
NOISY_EPSILONS = 16.0  # relative noise beyond this many machine epsilons: f loses precision inside (names the op)

# -- fast mode's search (``fast``) -----------------------------------------------------------------
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

# -- coloured mode (``coloured``) ---------------------------------------------------------------
DENSE_REPORT_ENTRIES = 1_000_000  # pairs up to this many entries are reported dense (zeros outside the pattern)
PATTERN_PROBES = 1  # random dense probes of the pattern (each confirmed at a quarter step only where it fails)
PATTERN_MARGIN = 3.0  # J d may leave the pattern's prediction by this factor before a quarter step confirms it
VJP_PROBE_WEIGHTS = (-4.0, -2.0, -1.0, 1.0, 2.0, 4.0)  # the dense cotangent's values: powers of two keep u exact
VJP_PROBE_ROUNDING = 64.0  # unit roundoffs of the native dtype per unit of sum_i |u_i a_ij|
# From this many nonzeros a diagonal pattern's judgement is screened beside the evaluations
# (``coloured_judge._screen``): one fused XLA pass over the sweep and the VJP clears every
# element whose error is below SCREEN_MARGIN of its band (faster than numpy's passes); numpy's rule judges the rest.
SCREEN_ELEMENTS = 1 << 18
# A cleared element's error is below this fraction of its band: numpy's rule passes it too, however XLA's fused
# float64 arithmetic rounds (a contracted multiply-add moves a band by ~1e-16 relative).
SCREEN_MARGIN = 0.9
NOISE_SAMPLE = 512  # rows whose noise is measured besides the failing nonzeros' (f's relative noise as a whole)
NOISE_ALL = 1 << 17  # up to this many outputs the noise is measured on all (the other modes' sigma, their verdicts)

# -- routing: path choice and its cost model (``paths``, ``autodiff``, ``executor``, ``full``) ------
# Tracing, pfor conversion and the first run of a batched kernel cost about TRACE_SECONDS + TRACE_CALLS eager calls
# of f (``cost.CallCost``'s counted seconds); an eager reverse-mode row costs about VJP_CALLS calls of f (tape walk,
# cotangent).  Constants, not measurements of the running process: the same check routes alike in every process
# (TRACE_SECONDS: a cold trace of a small f's kernels, 0.1-0.2 s on an Intel Xeon @ 2.80GHz, TF 2.21).
TRACE_SECONDS = 0.15
TRACE_CALLS = 40
VJP_CALLS = 4
EQUAL_BLOCK = 1 << 18  # bytes per block of ``plan``'s bitwise comparison of two calls: in cache, no output-sized temporary
# What one eager call of f costs is counted, not timed (``cost.CallCost``): each Python call, eager op, element an
# op writes and multiply-add of a product or convolution at these seconds, least-squares fitted on 11 functions from
# sin of 10 elements to TFP's Gamma, a Keras MLP, a convolution and a 10^6-element map (Intel Xeon @ 2.80GHz, TF
# 2.21; within 2.5x of each call's time).  Routing's predictions are made from them alone.
COST_PER_PYTHON_CALL = 4.8e-7
COST_PER_OP = 1.1e-5
COST_PER_ELEMENT = 5.8e-9
COST_PER_FLOP = 1e-10  # between a memory-bound matvec (3.4e-10) and oneDNN convolutions (4e-11)
# The eager loops take one call per colour of f's traced pattern (``eager_colours``) where a loop would take this long
# at two calls of f a row or column (tracing f and its pattern: 4-8 ms for TensorFlow's convolution tests) and the
# colours are at most this share of its rows or columns (a depthwise convolution's 96 rows: 8 to 16 colours).
EAGER_COLOUR_SECONDS = 0.01
COLOUR_SHARE = 0.5
# Where XLA does not pay: three rules, one per kind of work, in different units (not one number).
# Routing (``paths.choose_route``): below XLA_MIN_WORK element-evaluations of batched work XLA's compile time
# (0.2-0.4 s on CPU) does not pay off.  Measured cold on TF 2.21 CPU: graph mode wins on dense tanh(W x) up to
# n = 2048 (work 1e7); XLA wins from dense n = 4096 (3.6e7).
XLA_MIN_WORK = 20_000_000
# Coloured kernels (``colours._kernel_path``) run few evaluations (2 per colour): XLA's compilation (0.4 s for an
# elementwise f at 10^7 elements, whose graph kernel also runs faster) pays only from this many.
XLA_MIN_EVALUATIONS = 512
# (Fast mode's probes, ``directions.Joint._evaluate``, never pay it -- a few dozen evaluations: graph mode unless
# jit_compile=True; no number.)
# Full mode's differences run through one kernel for all checked inputs when that saves more tracing than it costs
# (``paths.joint_chunk``): each of its evaluations carries every checked input as a batched row (about
# JOINT_EXTRA_ELEMENTS elements per element of the n, at JOINT_ELEMENTS_PER_SECOND) and evaluates, for each input's
# perturbations, the ops that depend on the other inputs only (their FLOPs at BATCHED_FLOPS), where each per-input
# kernel costs a trace and, on the XLA path, a compile (a 39-variable BertBackbone: a 30-37 s sweep with per-input
# kernels, 4.4-4.9 s joint; a 30-variable nested MobileNetV2: 9.4 s, 7.6-8.0 s joint).  Its calls are padded to
# its chunk per input: the chunk (at least JOINT_MIN_CHUNK) minimises the padded perturbations plus
# JOINT_CALL_PERTURBATIONS per call (the ~0.5 ms a call costs).
JOINT_EXTRA_ELEMENTS = 3
JOINT_ELEMENTS_PER_SECOND = 2e9
JOINT_CALL_PERTURBATIONS = 4
JOINT_MIN_CHUNK = 8
# Eager autodiff passes (``autodiff``) run when predicted (from the first pass) to finish within these.
EAGER_SECONDS = 0.25
EAGER_LOOP_SECONDS = 30.0
VJP_LOOP_SECONDS = 0.05  # row colours x one eager call of f up to which coloured VJPs run one colour per call
# f's noise tables each run as one call of a traced loop over their points where that pays (``executor.noise_line``;
# the same numbers as f called point by point); 0 measures every table point by point.
NOISE_LINE = 1
# On the eager path the line kernel (``executor``) is traced only where the calls it saves are predicted to cost
# this many times its tracing: the routing's trace estimate is a whole check's, and some f trace far slower.
LINE_MARGIN = 2.0
# ``diagonal``: an element-wise f's two calls of each side replace the loops' 2n calls and m VJPs from this many
# elements (at 1 the loops make as many); its ops are recorded as they run, so trying costs no more than the calls.
DIAGONAL_MIN_ELEMENTS = 2
# ``diagonal.rows``' all-ones and all-zeros cotangents are kept up to this many elements, for at most this many
# (shape, dtype, device) keys (then forgotten): a small check then makes no constant for them (measured: ~15 us of
# a ~620 us check of a 6-element f).
COTANGENT_ELEMENTS = 1 << 12
COTANGENT_SHAPES = 64
# The eager loops make the moved inputs (and one-hot cotangents) of a chunk of calls from one constant of at most this
# many elements, split by one Unpack op (``plan.unstacked``): a constant per call cost ~5 us, as much as a small f.
LOOP_BATCH_ELEMENTS = 1 << 20
# autodiff="auto" probes forward mode (``full``) only on traced checks of at least this many first-sweep
# evaluations: below, the ForwardAccumulator's helper traces cost a third of the check or more, for a side training
# does not use and that cannot see custom gradients.
FORWARD_MIN_EVALUATIONS = 4096
FORWARD_PROBES = 1  # random sign vectors of that JVP check: one over every column catches a wrong column w.p. ~1

# -- memory model (``paths``, ``coloured``, ``config``) ---------------------------------------------
DEFAULT_MEMORY_BUDGET = 1 << 30  # bytes: memory_budget=None, which sizes the batched evaluations
# Each call's working set -- f's shared constants and variables, the chunk's x+ and x- rows and their
# intermediates -- is kept within the CPU's last-level cache (``paths.cache_bytes``) where that still leaves
# MIN_CACHED_CHUNK perturbations per call (to amortise the ~0.5 ms per call): on an AMD EPYC with a 32 MiB L3,
# cache-sized calls ran tanh(W x) sweeps 1.3-1.6x faster than memory_budget's (the largest calls are never
# fastest).  A memory-bound f (fewer FLOPs than MEMORY_BOUND_INTENSITY per intermediate element) gets cache-sized
# calls even when its shared data leave less than that (a 20,000-parameter MLP: 8.1-8.6 s at 24-32 perturbations
# per call, 14.4-14.9 s at 40-96).  CACHE_BYTES where the OS does not say.
MEMORY_BOUND_INTENSITY = 32
CACHE_BYTES = 64 << 20
MACHINE_CACHE = 0  # bytes of the CPU's cache calls are sized to; 0: as the OS says (``paths.cache_bytes``)
# Entries of the compiled-kernel cache (LRU; a function's kernels also leave it when f is collected): not tuned by
# a measurement.
KERNEL_CACHE_ENTRIES = 64
MIN_CACHED_CHUNK = 32
# Working memory of one perturbed evaluation, relative to its traced tensors (pfor keeps some intermediates of
# both the plus and minus halves alive).
MEMORY_SAFETY = 2
# Host bytes per structural nonzero held through a coloured check: its status (int8).  Everything else lives
# compressed -- the colours' differences [C, m] (float64) and the VJPs [R, n] (native dtype), about one value per
# nonzero each for a good colouring -- or exists one block of ``VERDICT_CHUNK`` nonzeros at a time.
BYTES_PER_NONZERO = 1

# -- the memory a check may hold (``_check``) --------------------------------------------------------
# Full mode's peak host memory per Jacobian entry: numerical, analytical, noise and band (float64), f(x+h) and
# f(x-h) of the sweep (float64), the status (int8).
FULL_BYTES_PER_ENTRY = 49
# Coloured mode's float64 twin, per nonzero of its blocks: the twin's compressed VJPs and statuses, and the arrays
# it compares the pairs it judges by (values, bands and the twin's of each, ~10 float64s).
TWIN_BYTES_PER_NONZERO = 80
# The arrays a check holds (full Jacobians, coloured mode's per-nonzero arrays) may use the larger of memory_budget
# (which sizes the batched evaluations) and this, never more than the free memory.
HELD_MEMORY_FLOOR = 4 << 30

# -- mode choice (``_check``, ``config``, ``plan``, ``model``, ``trace``) -----------------------
DEFAULT_PROBES = 4  # fast mode's random probes per check (probes=)
FULL_SECONDS = 60.0  # mode="auto" runs full Jacobians only where predicted (``_check.predict_full_seconds``) within this
# mode="auto" runs full Jacobians up to these sizes (elements of one Jacobian block per GiB of memory_budget, and
# elements of one input), and within FULL_SECONDS of predicted time; projections beyond.
FULL_MAX_ENTRIES_PER_GIB = 25_000_000
FULL_MAX_INPUT = 200_000
# One batched evaluation of a full sweep (vectorized_map chunks) costs about max(BATCHED_PER_CALL single calls of
# f's traced function, flops / BATCHED_FLOPS + elements / BATCHED_ELEMENTS), with f's FLOPs and intermediate
# elements as the route's probe counted them (fitted on an AMD EPYC x 2, TF 2.21: within 2x from dense layers to
# MobileNetV2).  The call alone misses memory-bound f, whose batches gain little; the FLOPs and elements alone miss
# small convolutions (4 channels run 17x slower per element than MobileNetV2's).
BATCHED_PER_CALL = 1 / 8
BATCHED_FLOPS = 3e10
BATCHED_ELEMENTS = 2e9
# The predicted-cost rule applies only to checks this large: a small one runs in full whatever its prediction says
# (a 16-element check is never worth projections).
TIME_RULE_MIN_INPUTS = 16
TIME_RULE_MIN_ELEMENTS = 20_000
# Coloured mode in auto: at most this share of the columns as colours (beyond it the Jacobian is too dense for
# compression to pay), and this much host time per structural nonzero on top of f's evaluations (measured: 0.35-0.7
# us).
COLOURED_MAX_COLUMN_SHARE = 1 / 16
COLOURED_SECONDS_PER_NONZERO = 1e-6
# Coloured mode's full rerun (element verdicts for a reverse-mode gradient off the pattern) up to this many
# Jacobian entries (a noisy f's full check at 67M entries, a bfloat16 conv 32x32x8, takes ~50 s and ~4 GB);
# beyond, the pair fails with the probe's text.
FULL_RERUN_MAX_ENTRIES = 1 << 23
# A traced pattern (or one intermediate tensor's dependencies) with more than this many (element, input element)
# pairs is "dense / unknown": a coloured check would not pay (``trace``).
NONZERO_BUDGET = 50_000_000
GREEDY_WORK = 20_000_000  # the greedy colouring runs when the sum of squared row lengths is at most this
FOLD_DEPTH = 32  # constant folding (``trace.Tracer.constant``): how deep a chain of ops it follows
# A while loop's dependencies (``trace.Tracer.loop``): its body applied until they stop growing, at most this many
# times (a recurrence along n elements needs n; TFP's element-wise special functions settle in two).
LOOP_ROUNDS = 64
UPCAST_MAX_ELEMENTS = 1_000_000  # precision="auto" upcasts the numerical side to float64 up to this many input elements
# The float64 copy of a model (``model``) stands in for it on the numerical side when its loss equals the model's
# within this many float32 roundings (machine epsilons) of the loss's magnitude: correct models measured 0.1 to 9 eps
# (the roundings mostly cancel), and 256 eps (3e-5 relative) is the allowance of ``training_gradients``'s
# real-vs-stateless comparison.  Beyond it the copy computes another function (a dtype-dependent layer), or the
# model's float32 evaluation is so ill-conditioned that exact derivatives would judge its float32 rounding.
FLOAT64_COPY_ROUNDINGS = 256

# -- execution blocks ------------------------------------------------------------------------------
# Fast mode evaluates at most this many rows per call: one compiled kernel then serves probes, bisection blocks and
# element columns alike (``directions.Joint``).
FAST_ROWS = 16
VERDICT_BLOCK = 1 << 14  # ``compare``: elements per block of the element-wise rule (a few arrays of it stay in cache)
ROW_BLOCK = 256  # ``compare``: rows per block when a pass over an [m, n] Jacobian is memory-bound
# ``coloured``: nonzeros handled per block: every per-nonzero quantity but the status (values, noise, bands,
# indices) exists one block at a time -- float64 temporaries per block, not per nonzero, and they stay in cache.
VERDICT_CHUNK = 1 << 16
# ``storage``: values of a dense pair summarised at a time: the summary's temporaries stay ~8 MB each.
SUMMARY_CHUNK = 1 << 20
PROGRESS_SECONDS = 2.0  # ``executor.Progress``: a sweep shows progress (on a terminal) when predicted to take longer
# ``distribute``: a collective waits this long for the other workers (a worker computing a long chunk keeps the
# others waiting; one that took another path would otherwise hang them).
COLLECTIVE_TIMEOUT_SECONDS = 600.0

# -- report (``results``, ``text``, ``compare``) ------------------------------------------------------------
WORST_KEPT = 8  # worst elements kept by the one summary pass (the text asks for 3)
COLLAPSE_PASSING = 20  # past this many passing pairs, the text collapses them to one line by layer
UNDECIDED_DETAILS = 4  # past this many undecidable fast-mode pairs, their details are one line
FACTOR_ELEMENTS = 2  # failing elements a sign or constant-factor diagnosis needs: one element fits any factor

# -- overridable per check ---------------------------------------------------------------------------
# The tunables a check reads through ``CheckConfig.table``, which ``fastcheck.testing.tunables`` overrides
# for that check: for experiments with a threshold, and for tests that reach a branch (coloured mode's sampled
# noise, its sparse report, a check too large to hold) on a small problem.
CONFIGURABLE = frozenset({"NOISE_ALL", "NOISE_LINE", "SCREEN_ELEMENTS", "DENSE_REPORT_ENTRIES", "FULL_BYTES_PER_ENTRY", "HELD_MEMORY_FLOOR", "DIAGONAL_MIN_ELEMENTS",
                          "EAGER_COLOUR_SECONDS", "MACHINE_CACHE", "FULL_SECONDS",
                          "TRACE_SECONDS", "TRACE_CALLS"})

