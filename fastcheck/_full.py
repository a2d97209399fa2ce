"""The full check: both Jacobians element by element, refined where they disagree.

One strategy of ``_check.run_check`` (with ``_fast`` and ``_coloured``): coloured mode with the trivial colouring.
The numerical Jacobian by batched central differences through the executor, the analytical one from reverse mode
(or the user's gradients), each input's elements a ``_block._Block`` over ``Pattern.full`` (every column its own
colour, ``_full_steps._DenseColumns``), judged by the stages every element-wise mode runs (``_block.stages``, a
coarse pass sharpened among them); then the float64 twin (``_twin``) and the forward-mode side (``_forward_side``),
each writing what it settles into the block; the pairs are coloured mode's (``_block.pairs``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fastcheck import _compare
from fastcheck._autodiff import AutodiffJacobian, forward_probe
from fastcheck._block import _Block, pairs, stages
from fastcheck._colours import _Analytical
from fastcheck._diagnosis import kernel_failure
from fastcheck._events import ForwardNotChecked, ForwardProbe
from fastcheck._executor import Executor, timed
from fastcheck._full_steps import _DenseColumns, _Jacobians
from fastcheck._paths import EAGER
from fastcheck._pattern import Pattern
from fastcheck._plan import Plan, first_line
from fastcheck._refine import LADDER, confirmation, descend
from fastcheck._results import GradientCheckError, Outcome, PairReport
from fastcheck._tables import (
    FORWARD_MIN_EVALUATIONS,
    FORWARD_PROBES,
    RESOLUTION_RTOLS,
)
from fastcheck._text import forward_wrong


def _compute(jac: _Jacobians, supplied=None, twin: bool = True):
    """Each checked input's block judged (numerical and analytical Jacobians [m, n_k], statuses), the elements
    judged through the float64 twin (per block, or None), and (atol, rtol).

    ``supplied`` replaces autodiff: a callable returning the analytical blocks.  After the first sweep, the stages
    of every element-wise mode (``_block.stages``: the second step, f's noise only where an element still fails,
    refinement, a coarse pass sharpened), then the float64 twin (``_twin``).
    """
    plan = jac.plan
    if supplied is None and jac.config.autodiff == "forward" and plan.n:
        directions = [np.ones((1, spec.size)) for spec in plan.checked]
        _, why = forward_probe(plan, directions)
        if why is not None:
            raise ValueError(f"autodiff='forward' checks forward-mode (JVP) Jacobians, but TensorFlow cannot compute "
                             f"them for f ({why}); pass autodiff='reverse' (what training uses).")
    with timed(jac.timings, "analytical"):
        analytical = supplied(plan) if supplied is not None else jac.analytical()

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
    twinned = _twin(jac, blocks, (atol, rtol)) if twin else []
    return blocks, twinned, (atol, rtol)


def _block(jac: _Jacobians, spec, analytical: np.ndarray, first: np.ndarray, spans: np.ndarray) -> _Block:
    """One checked input's elements as a block (``_block._Block``: every element a nonzero of ``Pattern.full``)
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


def _tolerance_bound_rows(plan: Plan, a, numerical, status, band, rtol: float) -> np.ndarray:
    """[m] the rows of outputs whose pair with this input passes at a resolution coarser than ``RESOLUTION_RTOLS``
    rtols: the tolerances (atol against a small gradient) or the numerics keep it from seeing a 1% error.  A pair
    whose gradient and numerical derivative are 0 at every element (a ReLU's second derivative, a saturated
    activation) has no relative error for any twin to resolve."""
    rows = np.zeros(plan.m, bool)
    for output in plan.outputs:
        part = slice(output.offset, output.offset + output.size)
        s, b, x = status[part], band[part], a[part]
        if not s.size or _compare.IS_FAILING[s].any() or _compare.decisive_at_largest(x, b, s, rtol):
            continue
        if not x.any() and not numerical[part].any():
            continue
        if _compare.resolution(x, b, b, s == _compare.OK)[0] > RESOLUTION_RTOLS * rtol:
            rows[part] = True
    return rows


def _twin(jac: _Jacobians, blocks: list[_Block], tolerances) -> list:
    """Pairs that pass at a resolution coarser than 1% of their gradient, judged again through the gradient's
    float64 twin where the numerical side computes in float64 and atol is the table's; returns, per block, the
    elements [m, n_k] so judged (None where none was).

    The twin is the same gradient code run at the float64 point (a model's float64 copy, or f given float64 values):
    float64's rule judges it against the same numerical derivative (refined as any float64 check), and the float32
    gradient's own rounding is then *measured*, |a - twin|, instead of being stood in for by float32's atol.  An
    element whose twin verdict is a pass or a mismatch gets the allowance ``float64's allowance + |a - twin|`` and is
    judged by it (a twin passing makes a pass: the triangle inequality); kinks, jumps and unresolved twin elements
    keep their verdict.  The twin is not used where it differs from the float32 gradient by more than float32's
    tolerance (it is not the same computation) or is not finite.  A user's atol is the user's rule: then nothing is
    sharpened.
    """
    plan, config = jac.plan, jac.config
    if not config.twin_applies(plan) or config.autodiff == "forward":
        return []
    atol, rtol = tolerances
    dense = [_dense(block) for block in blocks]  # (analytical, numerical, status, band)
    targets = [_tolerance_bound_rows(plan, *arrays, rtol) for arrays in dense]
    if not any(rows.any() for rows in targets):
        return []
    with timed(jac.timings, "twin"):
        try:
            twin = AutodiffJacobian(jac.executor, twin=True)()
        except Exception:  # no float64 gradient (an op without a float64 kernel): the verdicts stand
            return []
        if jac.plan.noise is None:  # float64's rule needs f's noise where it is evaluated
            jac.measure()
        atol64, rtol64 = config.twin_tolerances()
        twinned: list = []
        for rows, t, block, (a, numerical, status, band) in zip(targets, twin, blocks, dense):
            if not rows.any() or not _compare.same_computation(a[rows], t[rows], atol, rtol).all():
                twinned.append(None)
                continue
            # Every row is judged (the evaluations give them all), only the coarse pairs' rows are used.
            twin_block = _block(jac, block.spec, t, numerical, block.columns.spans)
            twin_block.judge(jac.plan, atol64, rtol64)
            twin_block.status.reshape(rows.size, -1)[~rows] = _compare.OK  # the other pairs' need no refinement
            twin_block.flagged = twin_block.failing()
            twin_block.refine(jac.plan, atol64, rtol64, flat=False)
            _, n_twin, t_status, t_band = _dense(twin_block)
            with np.errstate(invalid="ignore"):
                allowed = t_band + np.abs(a - t)
                usable = (rows[:, None] & np.isin(t_status, (_compare.OK, _compare.MISMATCH))
                          & (status == _compare.OK) & (allowed < band))
                verdict = np.where(np.abs(a - n_twin) <= allowed, _compare.OK, _compare.MISMATCH)
            _twin_holds_above(jac.plan, twin_block, a, t, usable, verdict, (atol64, rtol64))
            status[usable] = verdict[usable]
            index = np.flatnonzero(usable)  # ascending, as ``_Block.adopt`` takes them
            block.adopt(index, n_twin.reshape(-1)[index], allowed.reshape(-1)[index])
            block.flagged = np.union1d(block.flagged, np.flatnonzero(usable & (verdict != _compare.OK)))
            twinned.append(usable)
    return twinned


def _twin_holds_above(plan: Plan, block: _Block, a, t, usable, verdict, tolerances) -> None:
    """A twin mismatch stands only where it holds at larger steps too, confirmed; else, in place, it is not used.

    The twin's allowance is float64's, a few 1e-8 on a gradient of 1e-5 .. 1e-3: there the quotient's own error is
    f's measured noise over the step, and a float64 network's noise is not Gaussian everywhere (a correct network
    had a few elements just past that allowance).  The mismatched elements are re-estimated on the twin block's
    ladder (``_Block.ladder``, each element a direction of its own) at h * 4**RESOLVE_UP ... h, where the noise is
    4**RESOLVE_UP times smaller; an element stays a mismatch only where that settled estimate is outside its own
    float64 allowance plus |a - twin|, by the same rule (a 1% defect in the gradient code, which the twin shares, is
    far outside it), and where ``confirmation`` finds it again at independent steps and below the pair: a ReLU6 kink
    a few h away moves the larger steps' quotients by 3e-4 of the gradient, and the smaller steps show the
    derivative at the point (a correct nested MobileNetV2).  Elsewhere the twin is not used: the element keeps its
    native verdict (a pass too coarse for 1%, undecidable).
    """
    atol64, rtol64 = tolerances
    rows, cols = np.nonzero(usable & (verdict == _compare.MISMATCH))
    if not len(rows):
        return
    a_suspect, slack = a[rows, cols][None, :], np.abs(a - t)[rows, cols][None, :]

    def mismatch(selection, found: _compare.Refined) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return np.abs(a_suspect[:, selection] - found.estimate) > (
                _compare.allowance(found.estimate, atol64, rtol64, found.error) + slack[:, selection])

    evaluate = block.ladder(plan, rows, cols)
    found = descend(evaluate, len(rows), LADDER.larger,
                    confirm=confirmation(evaluate, block.line(plan, rows, cols), a_suspect, mismatch,
                                         first=LADDER.larger.start))
    usable[rows, cols] = (found.settled & mismatch(np.arange(len(rows)), found))[0]


def check_full(executor: Executor, plan: Plan, timings: dict, supplied=None, output_name=None,
               twin: bool = True) -> Outcome:
    """Full Jacobians, compared and cut into one PairReport per (output, input)."""
    jac = _Jacobians(executor, plan, timings)
    try:
        blocks, twinned, (atol, rtol) = _compute(jac, supplied, twin=twin)
    except (TypeError, ValueError, GradientCheckError):
        raise
    except Exception as error:  # f failed inside a batched kernel: say so, keep the cause
        raise kernel_failure(error) from error
    plan = jac.plan  # with f's measured noise and precision, when they were needed
    side = "forward" if jac.config.autodiff == "forward" else "reverse"
    reports = pairs(plan, blocks, atol, rtol, output_name, side, np.inf, twinned)
    notes: list = []  # events (``fastcheck._events``)
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
# nor on traced checks of fewer first-sweep evaluations than FORWARD_MIN_EVALUATIONS (``_tables``); nor through
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
    directions = [rng.choice([-1.0, 1.0], size=(FORWARD_PROBES, block.spec.size)) * np.all(status == _compare.OK, axis=0)
                  for block, (_, _, status, _) in zip(blocks, dense)]
    if config.autodiff == "auto" and not any(d.any() for d in directions):
        return [], ForwardNotChecked("no passing column")
    jvp, why = forward_probe(plan, directions)
    if jvp is None:
        if config.autodiff == "both":
            raise ValueError(f"autodiff='both' asks for forward-mode Jacobians, but TensorFlow cannot compute them for f "
                             f"({why}); pass autodiff='reverse'.")
        return [], ForwardProbe("unsupported", error=str(why))
    if config.autodiff == "auto" and _compare.directions_agree(jvp, directions, [d[1] for d in dense],
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
        forward_status = _compare.verdicts(jacobian, numerical, band, 0.0, 0.0, bands=False)[0]  # the reverse side's bands
        # What the numerical side left undecidable (kinks, jumps, unresolved or non-finite numerics, f not moving)
        # is so on this side too; a pass or a mismatch is each side's own.
        undecided = ~np.isin(status, (_compare.OK, _compare.MISMATCH, _compare.ANALYTICAL_NONFINITE))
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
