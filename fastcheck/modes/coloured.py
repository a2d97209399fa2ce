"""The coloured check: element-wise verdicts on every structural nonzero of a sparse Jacobian.

One strategy of ``_check.run_check`` (with ``full`` and ``fast``), for f whose Jacobian is sparse (elementwise ops,
normalisations over a small axis, stencils):

1. the pattern per checked input (``trace``: the user's ``sparsity=``, or a dependency trace of f's graph; an
   op without a rule refuses with ``UnknownSparsity``, a ValueError naming it);
2. numerical side: the columns coloured so that columns sharing a row differ; one central difference per colour
   along ``d_c = sum of h_j e_j`` over the colour's columns (full mode's steps), batched through the executor's
   chunk loop, and each nonzero (i, j) read off its column's colour -- 2C evaluations instead of 2n;
3. analytical side: reverse mode, the gradient training uses: rows coloured so that rows sharing a column differ,
   one VJP per row colour (batched ``tape.jacobian`` of the colour-weighted outputs), each nonzero read off its
   row's colour;
4. the element rule of ``compare`` on the nonzeros (a large diagonal block, ``SCREEN_ELEMENTS``, screened on the
   device beside its evaluations: ``coloured_judge._screen``), then the stages every element-wise mode runs
   (``block.stages``), re-evaluating only the colours of failing nonzeros, f's noise measured on the rows that
   matter (``_measured_rows``), then the float64 twin (``block.twinned``, where f's noise is measured on every
   row, at most ``NOISE_ALL`` outputs, and its per-nonzero arrays fit what a check may hold);
5. the pattern check: random dense probes ``J d`` (numerical) against the pattern-restricted ``sum N_ij d_j``; mass
   outside the pattern (confirmed at a quarter of the step) is a *problem* of the report -- the pattern is wrong
   --, not a gradient verdict.  A traced diagonal pattern is trusted instead, as the eager path's
   element-wise calls (``diagonal``) trust the same rules; a dense random cotangent checks the reverse-mode
   gradient itself (``coloured_judge._vjp_problems``) in every case.

The evaluations (steps 2 and 3) are ``colours``; the rule and the probes (4 and 5) ``coloured_judge``.

Memory: one status byte per nonzero; the colours' differences [C, m] (float32 where exact) and the VJPs [R, n]
stay compressed, and every other per-nonzero quantity (indices, values, noise, bands) exists one block of
``VERDICT_CHUNK`` nonzeros at a time -- in the check and in its report's ``Nonzeros`` storage.  No array of the
Jacobian's size exists, except for the ``Dense`` storage of a small pair (``DENSE_REPORT_ENTRIES``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import tensorflow as tf

from fastcheck.engine.config import MACHINE_EPSILON, memory_limit
from fastcheck.engine.executor import Executor, measured, timed, view
from fastcheck.engine.paths import EAGER, GRAPH, XLA
from fastcheck.engine.plan import Plan, first_line, with_noise
from fastcheck.engine.precision import measure_noise
from fastcheck.engine.tables import (
    BYTES_PER_NONZERO,
    NOISE_SAMPLE,
    PATTERN_PROBES,
    REFINE_LEVELS,
    TWIN_BYTES_PER_NONZERO,
    XLA_MIN_EVALUATIONS,
)
from fastcheck.judge.block import _Block, pairs, stages, twinned
from fastcheck.modes.coloured_judge import TRACED, _judged, _pattern_probes, _probes
from fastcheck.modes.colours import (
    _Analytical,
    _analytical,
    _Columns,
    _kernel_path,
)
from fastcheck.report.diagnosis import kernel_failure
from fastcheck.report.events import ColouredBlock, ColouredSummary
from fastcheck.report.results import Outcome
from fastcheck.sparsity import colouring
from fastcheck.sparsity import pattern as _pattern
from fastcheck.sparsity.trace import patterns_of

_log = logging.getLogger(__name__)

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
        return patterns_of(function.get_concrete_function(*signature).graph, plan), TRACED
    except _pattern.UnknownSparsity as error:
        raise _pattern.UnknownSparsity(
            f"mode='coloured' needs the sparsity pattern of f's Jacobian, but {error}. Pass the pattern with "
            "sparsity= (a boolean [m, n] array, (rows, cols) index pairs or a scipy.sparse matrix), or "
            "mode='full' / mode='fast'.") from None
    except Exception as error:  # f cannot be traced: no graph to read dependencies from
        raise _pattern.UnknownSparsity(
            f"mode='coloured' traces f to find its Jacobian's sparsity pattern, but f cannot be traced "
            f"({type(error).__name__}: {first_line(error, 160)}); pass sparsity=, or mode='full' / mode='fast'.") from None


def check_coloured(executor: Executor, plan: Plan, timings: dict, supplied=None, output_name=None,
                   twin: bool = True) -> Outcome:
    """Element-wise verdicts on every structural nonzero (see the module docstring)."""
    try:
        return _check(executor, plan, timings, supplied, output_name, twin)
    except tf.errors.OpError as error:  # f failed inside TensorFlow where the check evaluated it: say so, keep the
        # cause (anything else -- f's own exception, a fault of fastcheck's -- leaves as itself)
        raise kernel_failure(error, executor.path, executor.config.jit_compile) from error


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
    """The patterns and colourings of this check, found once per executor (``Executor.once``): mode choice
    (``prospect``) and the check itself share them.  Raises ``UnknownSparsity`` (remembered too) when there is none."""
    found = executor.once(LAYOUT_KEY, lambda: _found_layout(executor, plan))
    if isinstance(found, _pattern.UnknownSparsity):
        raise found
    return found


def _found_layout(executor: Executor, plan: Plan) -> Layout | _pattern.UnknownSparsity:
    try:
        patterns, source = find_patterns(executor, plan)
    except _pattern.UnknownSparsity as error:
        return error
    labels, row_labels = colouring.colourings(patterns, plan, executor.config.seed)
    return Layout(patterns, source, labels, row_labels)


# Evaluations of f a coloured check allows for beyond its sweep: the pattern probe (two evaluations, twice where it
# must be confirmed) and one refinement ladder (REFINE_LEVELS steps of two evaluations) per checked input, assuming
# the failing nonzeros of an input fit one colour's direction (elementwise f at 10^7: a handful, all of colour 0).
def prospect(executor: Executor, plan: Plan) -> dict:
    """The coloured check's predicted size, from ``layout`` (raises ``UnknownSparsity``): ``colours`` (column colours
    over checked inputs), ``row_colours`` (VJPs), ``nonzeros``, ``evaluations`` of f (2 per colour plus the allowance
    above), ``bytes`` (host memory of the nonzeros' arrays, peak) and ``source``."""
    found = layout(executor, plan)
    colours = sum(found.colours)
    nonzeros = sum(p.nnz for p in found.patterns)
    inputs = len(found.patterns)
    allowance = inputs * (4 * PATTERN_PROBES + 2 * REFINE_LEVELS)
    return {"colours": colours, "row_colours": found.row_colours, "nonzeros": nonzeros,
            "evaluations": 2 * colours + allowance, "vjps": found.row_colours,
            "bytes": held_bytes(found, plan), "source": found.source}


def held_bytes(found: Layout, plan: Plan) -> int:
    """Host bytes the coloured check holds from its sweep to its report: the statuses, the colours' differences
    [C, m] (float32 for f evaluated in float32, else float64; one colour: f(x + d) and f(x - d) in the evaluation
    dtype, ``_Differences.sides``), the VJPs [R, n] (native dtype) and the patterns."""
    narrow = 4 if plan.eval_dtype.size <= 4 else 8
    differences = sum(2 * plan.eval_dtype.size if c == 1 else narrow * c for c in found.colours) * plan.m
    return int(sum(p.nnz for p in found.patterns) * BYTES_PER_NONZERO + differences
               + plan.native_flat_dtype.size * found.row_colours * plan.n + sum(p.bytes for p in found.patterns))


def _check(executor: Executor, plan: Plan, timings: dict, supplied, output_name, twin: bool) -> Outcome:
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
        _judged(plan, blocks, atol, rtol)
    with timed(timings, "pattern"):
        problems, wrong, inconsistent = _probes(executor, plan, blocks, source, atol, supplied is not None)
    sampled = None
    if (problems or inconsistent) and plan.noise is None:
        # f's own rounding may be what a probe saw (an op in bfloat16 inside moves every output by ~1e-3): measure
        # it (``_measured_rows``), judge again under it and probe again.
        with timed(timings, "noise"):
            plan, sampled = _measured_rows(executor, plan, blocks)
        atol, rtol = config.tolerances(plan.precision)
        for block in blocks:
            block.reset()
            block.wrong_pattern = block.inconsistent = False
        _judged(plan, blocks, atol, rtol)
        with timed(timings, "pattern"):
            problems, wrong, inconsistent = _probes(executor, plan, blocks, source, atol, supplied is not None)
    judged = [b for b in blocks if not any(b is w for w in wrong)]

    def measure(plan: Plan, passed: dict) -> Plan:
        nonlocal sampled
        failing = [block.failing() for block in judged]
        with timed(timings, "noise"):  # the rows of the nonzeros the second step did not pass
            plan, sampled = _measured_rows(executor, plan, judged, [index[~passed[k]] if k in passed else index
                                                                   for k, index in enumerate(failing)])
        return plan

    plan, atol, rtol = stages(judged, plan, measure, lambda plan: config.tolerances(plan.precision),
                              lambda stage: timed(timings, stage))
    twin_rows: dict = {}
    # The twin where f's noise is measured on every row, and its per-nonzero arrays fit what a check may hold.
    if (twin and supplied is None and plan.m <= config.table("NOISE_ALL")
            and TWIN_BYTES_PER_NONZERO * sum(b.nnz for b in judged) <= memory_limit(config)[0]):
        plan, rows = twinned(
            judged, plan, config, atol, rtol, lambda: _analytical(executor, plan, patterns, row_labels, held, twin=True),
            lambda block, t: _Block(block.spec, block.pattern, block.columns, t, compressed=block.compressed),
            lambda plan: _measured_rows(executor, plan, judged)[0], lambda stage: timed(timings, stage))
        twin_rows = {id(block): used for block, used in zip(judged, rows)}
    side = "supplied" if supplied is not None else "reverse"
    with timed(timings, "report"):
        reports = pairs(plan, blocks, atol, rtol, output_name, side, config.table("DENSE_REPORT_ENTRIES"),
                        [twin_rows.get(id(block)) for block in blocks])
    notes: list = [ColouredSummary(
        source, tuple(ColouredBlock(b.spec.name, int(b.pattern.nnz), int(b.pattern.shape[0]), int(b.pattern.shape[1]),
                                    int(b.columns.colours), b.cleared, _pattern_probes(b, source)) for b in blocks),
        None if supplied is not None else int(found.row_colours), int(sum(b.columns.evaluations for b in blocks)),
        sampled)]
    # The paths the colours' and the row colours' kernels ran on (the route's, or the graph path for few evaluations).
    ran = {_kernel_path(executor, 2 * b.columns.colours) for b in blocks}
    if supplied is None:
        ran.add(_kernel_path(executor, 4 * int(found.row_colours)))
    if executor.path == XLA and GRAPH in ran:
        _log.debug("coloured mode: the colours' evaluations ran on the graph path, not XLA: XLA's compilation pays "
                   "only from %d evaluations", XLA_MIN_EVALUATIONS)
    return Outcome(reports, plan, atol, rtol, "supplied" if supplied is not None else "reverse", notes,
                   problems=problems, inconsistent=[text for _, text in inconsistent],
                   path=GRAPH if executor.path == XLA and ran == {GRAPH} else None)


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


def _measured_rows(executor: Executor, plan: Plan, blocks: list[_Block],
                   among: list | None = None) -> tuple[Plan, tuple | None]:
    """The plan with f's noise measured on the rows of the failing nonzeros (``among``, per block; by default those
    not OK) plus a random sample of rows (every row where there are few), and the precision f computes in.

    ``precision.measure_noise`` runs over a sub-problem: its values are the columns those rows depend on (the
    pattern's), the rest of x held, and it reads only those rows -- the noise of a row is that of f moved along the
    columns it depends on (measuring every output of a 10^7-element f took 100 s).  Unmeasured rows keep the
    rounding allowance their elements passed with.
    """
    m = plan.m
    failing = np.unique(np.concatenate([b.pattern.at(np.flatnonzero(b.status) if index is None else index)[0]
                                        for b, index in zip(blocks, among or [None] * len(blocks))]))
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
    plan = with_noise(plan, dataclasses.replace(noise, sigma=sigma))
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
    return lambda subs: np.asarray(plan.call_flat_numpy_at(moved_values(subs), plan.eval_upcast))[rows]
