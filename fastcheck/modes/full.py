"""The full check: both Jacobians element by element, refined where they disagree.

One strategy of ``_check.run_check`` (with ``fast`` and ``coloured``): coloured mode with the trivial colouring.
The numerical Jacobian by batched central differences through the executor, the analytical one from reverse mode
(or the user's gradients), each input's elements a ``block._Block`` over ``Pattern.full`` (every column its own
colour, ``full_steps._DenseColumns``), judged by the stages every element-wise mode runs (``block.stages``, a
coarse pass sharpened among them); then the float64 twin (``block.twinned``) and the forward-mode side (``_forward_side``),
each writing what it settles into the block; the pairs are coloured mode's (``block.pairs``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from fastcheck.engine.autodiff import AutodiffJacobian, forward_probe
from fastcheck.engine.executor import Executor, timed
from fastcheck.engine.paths import EAGER
from fastcheck.engine.plan import Plan, first_line
from fastcheck.engine.tables import (
    FORWARD_MIN_EVALUATIONS,
    FORWARD_PROBES,
)
from fastcheck.judge import compare
from fastcheck.judge.block import _Block, pairs, stages, twinned
from fastcheck.modes.colours import _Analytical
from fastcheck.modes.full_steps import _DenseColumns, _Jacobians
from fastcheck.report.diagnosis import kernel_failure
from fastcheck.report.events import ForwardNotChecked, ForwardProbe
from fastcheck.report.results import Outcome, PairReport
from fastcheck.report.text import forward_wrong
from fastcheck.sparsity.pattern import Pattern


def _compute(jac: _Jacobians, supplied=None, twin: bool = True):
    """Each checked input's block judged (numerical and analytical Jacobians [m, n_k], statuses), the elements
    judged through the float64 twin (per block, or None), and (atol, rtol).

    ``supplied`` replaces autodiff: a callable returning the analytical blocks.  After the first sweep, the stages
    of every element-wise mode (``block.stages``: the second step, f's noise only where an element still fails,
    refinement, a coarse pass sharpened), then the float64 twin (``block.twinned``).
    """
    plan = jac.plan
    if supplied is None and jac.config.autodiff == "forward" and plan.n:
        directions = [np.ones((1, spec.size)) for spec in plan.checked]
        _, why = forward_probe(plan, directions)
        if why is not None:
            raise ValueError(f"autodiff='forward' checks forward-mode (JVP) Jacobians, but TensorFlow cannot compute "
                             f"them for f ({why}); pass autodiff='reverse' (what training uses).")
    with timed(jac.timings, "analytical"):
        try:
            analytical = supplied(plan) if supplied is not None else jac.analytical()
        except tf.errors.OpError as error:  # the gradient at the inputs, not f at a point a step away
            raise kernel_failure(error, jac.executor.path, jac.config.jit_compile, analytical=True) from error

    with timed(jac.timings, "numerical"):
        blocks = [_block(jac, spec, a, *jac.numerical(spec.position)) for spec, a in zip(plan.checked, analytical)]
    atol, rtol = jac.config.tolerances(jac.plan.precision)
    for block in blocks:
        block.judge(jac.plan, atol, rtol)

    def measure(plan: Plan, passed: dict) -> Plan:
        with timed(jac.timings, "noise"):
            jac.measure()
        return jac.plan

    _, atol, rtol = stages(blocks, jac.plan, measure, lambda plan: jac.config.tolerances(plan.precision),
                           lambda stage: timed(jac.timings, stage))
    rows: list = []
    if twin:
        def measured(plan: Plan) -> Plan:
            jac.measure()
            return jac.plan

        # The twin's block: full mode's over the block's numerical values as they stand (refined ones included).
        def twin_block(block: _Block, t: _Analytical) -> _Block:
            return _block(jac, block.spec, t.compressed, _dense(block)[1], block.columns.spans)

        _, rows = twinned(blocks, jac.plan, jac.config, atol, rtol, lambda: [
            _Analytical(t, None) for t in AutodiffJacobian(jac.executor, twin=True)()], twin_block, measured,
            lambda stage: timed(jac.timings, stage))
    return blocks, rows, (atol, rtol)


def _block(jac: _Jacobians, spec, analytical: np.ndarray, first: np.ndarray, spans: np.ndarray) -> _Block:
    """One checked input's elements as a block (``block._Block``: every element a nonzero of ``Pattern.full``)
    over full mode's first sweep."""
    block = _Block(spec, Pattern.full(*first.shape), _DenseColumns(jac, spec.position, first, spans),
                   _Analytical(analytical, None))
    block.sweep()
    return block


def _dense(block: _Block) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(analytical, numerical, status, band) [m, n_k] of a full block (``status`` a view of the block's)."""
    m, n = block.pattern.shape
    _, _, a, numerical, band = block.values(slice(0, m * n), bands=True)
    return a.reshape(m, n), numerical.reshape(m, n), block.status.reshape(m, n), band.reshape(m, n)


def check_full(executor: Executor, plan: Plan, timings: dict, supplied=None, output_name=None,
               twin: bool = True) -> Outcome:
    """Full Jacobians, compared and cut into one PairReport per (output, input)."""
    jac = _Jacobians(executor, plan, timings)
    try:
        blocks, twin_rows, (atol, rtol) = _compute(jac, supplied, twin=twin)
    except tf.errors.OpError as error:  # f failed inside TensorFlow where the check evaluated it: say so, keep the
        # cause (anything else -- f's own exception, a fault of fastcheck's -- leaves as itself)
        raise kernel_failure(error, executor.path, executor.config.jit_compile) from error
    plan = jac.plan  # with f's measured noise and precision, when they were needed
    side = "forward" if jac.config.autodiff == "forward" else "reverse"
    reports = pairs(plan, blocks, atol, rtol, output_name, side, np.inf, twin_rows)
    notes: list = []  # events (``fastcheck.report.events``)
    warnings: list[str] = []
    if supplied is None and jac.config.autodiff == "auto" and plan.n and executor.path == EAGER:
        notes.append(ForwardNotChecked("eager"))
    elif supplied is None and jac.config.autodiff == "auto" and plan.n and 2 * plan.n < FORWARD_MIN_EVALUATIONS:
        notes.append(ForwardNotChecked("few evaluations", FORWARD_MIN_EVALUATIONS))
    elif supplied is None and jac.config.autodiff == "auto" and plan.n and executor.route.has_loops:
        notes.append(ForwardNotChecked("loops"))
    elif supplied is None and jac.config.autodiff in ("auto", "both") and plan.n:
        with timed(jac.timings, "forward"):
            forward_pairs, note = _forward_side(jac, blocks, atol, rtol, output_name)
        notes.append(note)
        if jac.config.autodiff == "both":
            reports += forward_pairs
        else:
            warnings += [forward_wrong(pair, reverse.ok) for reverse, pair in zip(reports, forward_pairs)
                         if not pair.ok and pair.worst_element is not None]
    kind = "supplied" if supplied is not None else jac.autodiff.mode
    return Outcome(reports, plan, atol, rtol, kind, notes, warnings)


# autodiff="auto" probes forward mode only on traced paths: TensorFlow's ForwardAccumulator traces a helper function
# per op signature (10-30 ms each), so on a check small enough to run eagerly the probe cost 2-40x the whole check;
# nor on traced checks of fewer first-sweep evaluations than FORWARD_MIN_EVALUATIONS (``tables``); nor through
# while_loops, which forward mode runs op by op, iteration by iteration (as much time as the rest of the check).


def _forward_side(jac: _Jacobians, blocks: list[_Block], atol, rtol,
                  output_name) -> tuple[list[PairReport], ForwardProbe | ForwardNotChecked]:
    """Forward-mode pairs (autodiff="both", or "auto" after a failing probe) and a note on what was checked.

    autodiff="auto" first compares a few random JVPs ``J v`` (one eager forward pass each, all inputs at once) with
    the numerical ``N v`` under the 2-norm of the element bands; only when they disagree is the full forward Jacobian
    computed, to name the elements.
    """
    plan, config = jac.plan, jac.config
    rng = np.random.default_rng(config.seed + 4242)
    dense = [_dense(block) for block in blocks]  # (analytical, numerical, status, band)
    # Columns at kinks or unresolved stay out: there the numerical value is not a derivative.
    directions = [rng.choice([-1.0, 1.0], size=(FORWARD_PROBES, block.spec.size)) * np.all(status == compare.OK, axis=0)
                  for block, (_, _, status, _) in zip(blocks, dense)]
    if config.autodiff == "auto" and not any(d.any() for d in directions):
        return [], ForwardNotChecked("no passing column")
    jvp, why = forward_probe(plan, directions)
    if jvp is None:
        if config.autodiff == "both":
            raise ValueError(f"autodiff='both' asks for forward-mode Jacobians, but TensorFlow cannot compute them for f "
                             f"({why}); pass autodiff='reverse'.")
        return [], ForwardProbe("unsupported", error=str(why))
    if config.autodiff == "auto" and compare.directions_agree(jvp, directions, [d[1] for d in dense],
                                                                [d[3] for d in dense]):
        return [], ForwardProbe("agrees", FORWARD_PROBES)
    try:
        forward = AutodiffJacobian(jac.executor, forward=True)()
    except Exception as error:
        if config.autodiff == "both":
            raise ValueError(f"autodiff='both' asks for forward-mode Jacobians, but TensorFlow cannot compute them for f "
                             f"({type(error).__name__}: {first_line(error)}); pass autodiff='reverse'.") from error
        return [], ForwardProbe("failed", error=type(error).__name__)
    compared = []
    for block, (_, numerical, status, band), jacobian in zip(blocks, dense, forward):
        forward_status = compare.verdicts(jacobian, numerical, band, 0.0, 0.0, bands=False)[0]  # the reverse side's bands
        # What the numerical side left undecidable (kinks, jumps, unresolved or non-finite numerics, f not moving)
        # is so on this side too; a pass or a mismatch is each side's own.
        undecided = ~np.isin(status, (compare.OK, compare.MISMATCH, compare.ANALYTICAL_NONFINITE))
        forward_status[undecided] = status[undecided]
        compared.append(dataclasses.replace(block, analytical=_Analytical(jacobian, None),
                                            status=forward_status.reshape(-1)))
    return pairs(plan, compared, atol, rtol, output_name, "forward", np.inf), ForwardProbe("compared")


def numerical_blocks(executor: Executor, plan: Plan) -> list[np.ndarray]:
    """The first-sweep numerical Jacobian [m, n_k] of every checked input (``numerical_jacobian``)."""
    jac = _Jacobians(executor, plan, {})
    return [jac.numerical(spec.position)[0] for spec in plan.checked]


def analytical_blocks(executor: Executor, plan: Plan) -> list[np.ndarray]:
    """The autodiff Jacobian [m, n_k] of every checked input (``autodiff_jacobian``)."""
    return _Jacobians(executor, plan, {}).analytical()
