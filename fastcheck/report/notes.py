"""Each event's note, composed in one place from its facts (``fastcheck.report.events``) by dispatch on the event's
type (``EVENT_TEXT``; a mode's reasons, ``MODE_REASON_TEXT``).  Stages hand over facts, never sentences."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from fastcheck.engine.tables import SCREEN_MARGIN
from fastcheck.report import events
from fastcheck.report.text import element_name


def compose(event) -> str:
    """One event as the report's note."""
    return _text_of(EVENT_TEXT, event, "event")(event)


def _screened_text(block) -> str:
    """How coloured mode's device screen shared a block's verdicts with numpy (empty where it did not run)."""
    if not block.cleared:
        return ""
    rest = block.nonzeros - block.cleared
    return (f" ({'all' if not rest else block.cleared} passed by the element rule with a {SCREEN_MARGIN:g} margin in "
            "one fused XLA pass" + (f", the other {rest} judged in numpy)" if rest else ")"))


def _coloured_summary(e) -> str:
    text = (f"coloured mode: sparsity pattern {e.source}; "
            + "; ".join(f"{b.input}: {b.nonzeros} structural nonzeros of {b.rows} x {b.columns}, "
                        f"{_counted(b.colours, 'column colour')}"
                        + _screened_text(b) for b in e.blocks)
            + ("" if e.row_colours is None else f"; reverse mode: {_counted(e.row_colours, 'row colour')} "
               "(one VJP each)")
            + f"; {_counted(e.evaluations, 'evaluation')} of f; "
            + "; ".join(f"{b.input}'s pattern checked by {_counted(b.probes, 'random dense probe')}" if b.probes
                        else f"{b.input}'s pattern (each output element on its own input element) trusted from "
                             "f's graph, as the eager path's element-wise calls trust it" for b in e.blocks))
    if e.noise_rows is not None:
        failing, sampled, moved = e.noise_rows
        text += (f"; f's noise measured on the {failing} output(s) of failing nonzeros and {sampled} sampled "
                 f"ones, moving the {moved} input elements they depend on")
    return text


def _fast_summary(e) -> str:
    span = (f"spanning all {e.inputs} checked inputs" if e.groups == 1 else
            f"for each of {e.groups} groups of similar-sized inputs ({e.inputs} checked inputs)")
    return (f"fast mode: {e.probes} random probes {span}, {e.elements} elements: one VJP and {e.evaluations} "
            "evaluations of f" + (f"; failing probes were localised by bisection over the inputs, then within "
                                  f"{', '.join(e.localised)}" if e.localised else ""))


def _log_det_convention(e) -> str:
    if e.convention == "chart":
        return (f"log-det-Jacobian in TFP's convention for {e.bijector}: log|det| of the square Jacobian of forward "
                f"from {e.chart} (the coordinates TFP's own tests use; a coordinate selection adds no log-det of "
                "its own)")
    return (f"{e.bijector} maps {e.sizes[0]} numbers per event to {e.sizes[1]} and fastcheck knows no TFP chart "
            "for it: its log-det-Jacobian was judged as the volume change 0.5 log det(J^T J), which differs from "
            "a log-det defined in coordinates of the output by that chart's own volume factor")


def _nothing_to_check(e) -> str:
    empty = "f's outputs have" if e.outputs else "the checked inputs have"
    return (f"nothing to check: {empty} no elements, so the Jacobian has no entries ({e.m} output x {e.n} input "
            "elements); the check passes vacuously")


_TRAINING_UNCHANGED = (
    "training=True changes nothing here: the loss equals the training=False loss at this point (no layer of this "
    "model behaves differently in training), so this is the training=False check")
_TRAINING = (
    "training=True: every evaluation draws the same dropout mask (seed states passed unchanged, tf_keras random "
    "layers made stateless with a fixed seed), batch normalization uses the batch's statistics, and every moving "
    "statistic and seed state is restored bit for bit")

def _text_of(table: dict, fact, what: str) -> Callable[[Any], str]:
    """``table``'s text function for the type of ``fact`` (an event, or a mode reason)."""
    said = table.get(type(fact))
    if said is None:
        raise TypeError(f"no text for {what} {fact!r}")
    return said


def _counted(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


_FORWARD_PROBE = {
    "unsupported": "forward mode (JVP) not checked: {error}",
    "agrees": "forward mode (JVP) agrees along {directions} random direction(s)",
    "failed": "forward mode (JVP) disagreed on a random direction, but its full Jacobian failed ({error})",
    "compared": "forward mode (JVP): full Jacobian compared",
}


def native_reason(e: events.NumericalSide) -> str:
    """Why the numerical side is not evaluated in float64 (also the error of precision='float64')."""
    if e.reason == "elements":
        return (f"{e.elements:.3g} input elements in float64 would double the time and memory of the check (pass "
                "precision='float64' to insist)")
    if e.reason == "returns":
        return f"f returned {e.dtype} for float64 inputs"
    if e.reason == "shapes":
        return "f returned different shapes for float64 inputs"
    if e.reason == "fails":
        return f"f does not run in float64 ({e.error})"
    why = ("an op of f is not finite in float64 where it is natively" if not math.isfinite(e.float64) else
           "f chooses weights, layers or code by dtype")
    return (f"f computes something else in float64 (flat output {e.row} is {e.float64:.8g} in float64 but "
            f"{e.native:.8g} natively, beyond native rounding): {why}")


def _precision_why(why) -> str:
    if isinstance(why, events.LowPrecisionOp):
        return f"f computes in {why.precision} inside (op {why.op})"
    if isinstance(why, events.TensorFloat32):
        return (f"f runs float32 op {why.op} on a GPU with TensorFloat-32 enabled "
                "(tf.config.experimental.enable_tensor_float_32_execution)")
    return why


# autodiff="auto" probes forward mode only on traced paths (see ``full``).
_FORWARD_NOT_CHECKED = {
    "eager": ("forward mode (JVP) not checked: the check ran eagerly, and TensorFlow's forward mode traces a helper "
              "function per op, which on checks this small costs more than the check itself; pass autodiff='both' "
              "to check it"),
    "few evaluations": ("forward mode (JVP) not checked: TensorFlow's forward mode traces a helper function per op "
                        "(10-30 ms each, ~1 s for some TFP special functions), a large share of a check of fewer "
                        "than {evaluations} evaluations; pass autodiff='both' to check it"),
    "loops": ("forward mode (JVP) not checked: f contains while_loops, through which TensorFlow's forward mode runs "
              "op by op and iteration by iteration; pass autodiff='both' to check it"),
    "no passing column": ("forward mode (JVP) not checked: its probe moves only the input elements whose Jacobian "
                          "column passes on the reverse side (where the numerical values are settled derivatives), "
                          "and none does; pass autodiff='both' to check it"),
}


def mode_reasons(why: tuple) -> str:
    """The chain of reasons a mode was chosen for, as one phrase."""
    return "; ".join(_text_of(MODE_REASON_TEXT, reason, "mode reason")(reason) for reason in why)


# Each mode reason's text (``events.ModeChosen.why`` holds a chain of them).
MODE_REASON_TEXT: dict[type, Callable[[Any], str]] = {
    events.Requested: lambda r: "as requested",
    events.FullFits: lambda r: f"the full Jacobian ({r.entries:.3g} entries) fits memory_budget" + (
        "" if r.seconds is None else f", and is predicted to take {r.seconds:.2g} s, within {r.budget:g} s"),
    events.FullTooLarge: lambda r: f"the full Jacobian has {r.entries:.3g} entries, more than {r.fitting:.3g} fit memory_budget",
    events.InputTooLarge: lambda r: f"an input has more than {r.limit} elements: 2n evaluations would take too long",
    events.FullTooSlow: lambda r: (
        f"full Jacobians predicted to take {r.seconds:.3g} s ({prediction(r.how)}), more than {r.budget:g} s; "
        "pass mode='full' to run them anyway"),
    events.NoPattern: lambda r: f"no sparsity pattern for coloured mode ({r.error})",
    events.TooDense: lambda r: (
        f"f's Jacobian has {r.nonzeros:.3g} structural nonzeros in {r.colours} column colours: too dense for "
        "coloured mode"),
    events.ColouredTooLarge: lambda r: (
        f"coloured mode would hold {r.held / 2**30:.3g} GiB for its {r.nonzeros:.3g} structural nonzeros, more than "
        f"the {r.limit / 2**30:.3g} GiB a check may hold"),
    events.ColouredTooSlow: lambda r: (
        f"coloured mode ({r.colours} column colours) predicted to take {r.seconds:.3g} s, more than {r.budget:g} s"),
    events.Sparse: lambda r: (
        f"f's Jacobian is sparse ({r.nonzeros:.3g} structural nonzeros in {r.colours} column colours, predicted "
        f"{r.seconds:.2g} s): element-wise verdicts on every nonzero"),
    events.Escalated: lambda r: (
        f"coloured mode ({mode_reasons(r.coloured)}) found the reverse-mode gradient inconsistent with f's sparsity "
        "pattern (see the notes), so the full Jacobians, which fit, give the element verdicts"),
}


def prediction(how: events.Prediction) -> str:
    """How a full check's time was predicted, as a phrase."""
    if how.by == "eager":
        return f"an eager loop of {how.calls} calls of f at {how.per_call * 1e3:.2g} ms"
    return (f"{how.kernels} kernels to trace at ~{how.per_kernel:.2g} s and {how.calls:.3g} batched evaluations at "
            f"~{how.per_call * 1e3:.2g} ms")


# Each event type's text: a function of the event.  One entry per type of ``events``; ``compose`` dispatches on
# the type.
EVENT_TEXT: dict[type, Callable[[Any], str]] = {
    events.FellBack: lambda e: f"{e.path} failed for {e.what} ({e.error}); fell back to {e.following}",
    events.CallNoise: lambda e: (
        f"output{e.output} differs between two calls at the same point by up to {e.difference:.3g} (not bitwise "
        "deterministic): counted as noise of the numerical side"),
    events.NumericalSide: lambda e: ("numerical side evaluated in float64 (precision='auto')" if e.upcast else
                                     f"numerical side evaluated in native precision: {native_reason(e)}"),
    events.PrecisionFound: lambda e: (
        f"{_precision_why(e.why)}: the analytical side is judged with {e.precision} tolerances "
        f"atol={e.atol:g}, rtol={e.rtol:g}{' (as given)' if e.given else ''}"),
    events.NoiseMeasured: lambda e: (
        f"f's evaluations carry relative noise {e.relative:.2g} (measured; {e.dtype} rounds at {e.epsilon:.2g}): "
        "noise allowances follow it, and columns it swamps are re-estimated at larger steps"),
    events.ModeChosen: lambda e: f"mode: {e.mode} ({mode_reasons(e.why)})",
    events.Inconsistent: lambda e: f"coloured mode: {e.found}",
    events.NothingToCheck: _nothing_to_check,
    events.EmptyPart: lambda e: f"nothing to check for {e.name}: it has no elements (its pairs' Jacobians are empty)",
    events.NonfiniteInput: lambda e: (
        f"{e.name} holds {_counted(e.count, 'non-finite element')} ("
        f"{', '.join(f'{element_name(e.name, i)}={v:g}' for i, v in zip(e.first, e.values))}"
        f"{' ...' if e.count > len(e.first) else ''}): each moves by the relative step itself, x +- h is x there, "
        "and its difference quotient is (f(x) - f(x)) / 2h, as tf.test.compute_gradient computes it: 0 where f is "
        "finite there, judged by the rule; not finite where f is not"),
    events.ForwardNotChecked: lambda e: _FORWARD_NOT_CHECKED[e.reason].format(evaluations=e.evaluations),
    events.ForwardProbe: lambda e: _FORWARD_PROBE[e.result].format(directions=e.directions, error=e.error),
    events.FastSummary: _fast_summary,
    events.FastForwardOnly: lambda e: (
        f"fast mode: the reverse-mode gradient cannot be differentiated once more ({e.error}); " + (
            "the element-wise comparison uses forward-mode JVPs, which do not see tf.custom_gradient (the projection "
            "u.J.d still checks the reverse-mode gradient)" if e.jvp else
            "forward mode has no JVP for some op of f either, so there is no element-wise comparison: the projection "
            "u.J.d alone checks the reverse-mode gradient")),
    events.ColouredSummary: _coloured_summary,
    events.TapeGradient: lambda e: (
        "analytical side: tape.gradient of the loss over the model's own variables, as a training step computes it "
        "(custom gradients with variables= included)"),
    events.SecondOrder: lambda e: (
        "order=2: the Jacobian of grads was checked (its reverse mode against its central differences); grads "
        "itself was not compared with f's derivatives: verify_gradients with order=1 does that"),
    events.FrozenChecked: lambda e: (
        f"not trainable, checked because variables= names them: {', '.join(e.names)}; the analytical side watches "
        "them on the tape (a training step's tape.gradient would return None for them)"),
    events.TrainingMode: lambda e: _TRAINING if e.changes else _TRAINING_UNCHANGED,
    events.ModelCopy: lambda e: (f"numerical side on a float64 copy of the model: {e.detail}" if e.copied else
                                 f"numerical side in the model's own precision: {e.detail}"),
    events.SampleNotChecked: lambda e: (
        f"sample not checked: {e.distribution} is not fully reparameterized (samples carry no gradient)"
        if e.reason == "not reparameterized" else
        f"sample not checked: {e.distribution}'s sampler {e.sampler}: an implicitly reparameterized sample's "
        "gradient holds the CDF fixed, not the noise, so a difference quotient at a fixed seed is not its derivative"),
    events.IdentitiesJudged: lambda e: (
        f"identities judged with atol={e.atol:g}, rtol={e.rtol:g} ({'as given' if e.given else e.dtype + ' defaults'}), "
        "plus the numerical Jacobian's band carried into log|det J| and y's rounding carried through the inverse"),
    events.LogDetConvention: _log_det_convention,
    events.SampleSeeded: lambda e: (
        f"sample drawn with the stateless seed ({e.seed}, 0) at every evaluation (never under XLA, which draws "
        "other numbers from the same seed)"),
    events.PathsDiffer: lambda e: (
        f"the workers routed f to different paths; every worker evaluated {e.what} eagerly instead (pass "
        "jit_compile= to pin the path)"),
    events.EagerUnsplit: lambda e: (
        f"strategy: {e.what} ran on the eager path, on one device" + (" on every worker" if e.multi else "")
        + ", not over the replicas (pass jit_compile=False to trace f)"),
}
