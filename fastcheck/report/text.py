"""The report's text, composed in one place from its facts: a pair's details, the report's table, and each
event's note by dispatch on the event's type (``EVENT_TEXT``).  Stages hand over facts, never sentences."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fastcheck.engine.tables import COLLAPSE_PASSING, RESOLUTION_RTOLS, SCREEN_MARGIN, UNDECIDED_DETAILS
from fastcheck.judge.compare import (
    ANALYTICAL_NONFINITE,
    DISCONTINUOUS,
    FLAT,
    MISMATCH,
    NONDIFFERENTIABLE,
    NUMERICAL_NONFINITE,
    STATUS_NAMES,
    UNDECIDED,
    UNRESOLVED,
    UNRESOLVED_KINK,
)
from fastcheck.report import events

RULE = "|analytical - numerical| <= atol + rtol * |numerical| + noise (element-wise; both finite)"
FAST_RULE = ("|(J d)_i - numerical_i| <= atol * ||d||_2 + rtol * |numerical_i| + noise_i per output element i of each probe d, "
             "J d from the reverse-mode gradient; projection: |u.VJP.d - u.numerical| <= ||u * allowed||_2")

# How a verdict reads in the text of every report (GradientReport, tfp.BijectorReport, its identities).
VERDICT_LABELS = {"pass": "ok", "fail": "FAIL", "undecidable": "UNDECIDABLE"}


VACUOUS_WARNING = (
    "f's output does not depend on any checked input: every numerical and analytical derivative is exactly 0, so "
    "this check shows nothing about a gradient. A likely cause: f reads variables by closure (e.g. lambda *v: "
    "model.training_loss()) instead of from its arguments; compute f from the arguments it is given, or use "
    "check_model(model, loss) to check a model's variables.")


def vacuous_warnings(pairs: list) -> list[str]:
    """``[VACUOUS_WARNING]`` when no pair's derivatives, either side, has a nonzero entry."""
    # A coloured pair's arrays are read off its compressed storage only on request (0.5 GB each at 6.4e7 nonzeros).
    if not pairs or any(p.sparse for p in pairs):
        return []
    # ndarray.any(): nonzero entries (NaN included) without an [m, n] temporary
    informative = any(np.size(p.numerical) == 0 or np.asarray(p.numerical).any() or np.asarray(p.analytical).any()
                      for p in pairs)
    return [] if informative else [VACUOUS_WARNING]


def forward_wrong(pair, reverse_ok: bool) -> str:
    """The warning of a failing forward-mode (JVP) pair (autodiff="auto"); ``reverse_ok``: whether the same pair's
    reverse side (the verdict's) passes."""
    e = pair.worst_element
    reverse = ("Reverse mode, which training uses, agrees; forward mode" if reverse_ok else
               "Reverse mode, which training uses, fails this pair too (see the pair's lines); forward mode")
    return (f"forward mode (JVP, tf.autodiff.ForwardAccumulator) is wrong for {pair.output_name} / {pair.input_name}: "
            f"{pair.count('mismatch')} elements differ, worst d {element_name(pair.output_name, e.output_index)} / d "
            f"{element_name(pair.input_name, e.input_index)}: JVP={e.analytical:.8g} numerical={e.numerical:.8g}. "
            f"{reverse} differentiates f's forward ops (it ignores tf.custom_gradient) or uses a wrong forward-mode "
            "rule of an op. Pass autodiff='both' to make it part of the verdict.")


def forward_not_checked(autodiff: str, mode: str) -> str:
    """The warning of a check that asked for forward mode (autodiff="forward" or "both") where mode="auto" chose a
    mode that judges the reverse-mode gradient."""
    return (f"forward mode (JVP) was not checked: autodiff={autodiff!r} asks for forward-mode Jacobians, but "
            f"mode='auto' chose {mode} mode (see its note), whose analytical side is the reverse-mode gradient (what "
            "training uses). Pass mode='full' to check forward mode, or autodiff='reverse'.")


def coarse_line(title: str, resolutions: tuple[float, float], rtol: float, fast: bool) -> str:
    """Why a pair whose every element (or probe) passes is undecidable: its resolution."""
    resolved, tolerance = resolutions
    unit = "probe" if fast else "element"
    fix = ("more probes (probes=...) or mode='full'" if fast else "a float64 numerical side (precision='float64'; "
           "check_model: a model its float64 copy can stand in for)")
    return (f"  {title}: every {unit} passes, but no {unit} resolves a relative error of its gradient "
            f"below {resolved:.3g} (the tolerances alone would resolve {tolerance:.3g}; the limit is "
            f"{RESOLUTION_RTOLS:g} x rtol = {RESOLUTION_RTOLS * rtol:.3g}): the numerical side's error swamps the "
            f"allowance, and a gradient off by less than {resolved:.3g} of itself would pass unseen; undecidable, not "
            f"ok. Try {fix}.")


# A pair's hint, by the kind of what explains its verdict (``events.Hint``: ``compare.diagnose``'s guess from the
# failing elements, coloured mode's pattern problems, fast mode's localisation), composed from the hint's fields.
FLAT_CAUSE = (
    "f's output does not move beyond its rounding at these elements while the analytical gradient is not zero: f is "
    "piecewise constant there (a quantizer, sign, round, a staircase: the analytical value is then a surrogate "
    "gradient, e.g. a straight-through estimator, which no difference quotient can check), or float32 rounding inside "
    "f swallows the change (check with a float64 numerical side); if f should not depend on these elements, the "
    "gradient flows where f does not.")
NONFINITE_CAUSE = ("a classic cause is tf.where(cond, g(x), 0) with g non-finite on the discarded branch; make the "
                   "input to g safe too (the double-where trick).")
LOCALISED = ("a directional derivative disagrees: the gradient of the named input is wrong in the region shown; check "
             "that region with mode='full' on a slice, starting at the worst element.")
HINTS = {
    "analytical not finite": "the analytical gradient is NaN/Inf where f is smooth: " + NONFINITE_CAUSE,
    "nonfinite input": (
        "the input itself is infinite or NaN at {count} element(s) (the first at {first}): x +- h is x there, so the "
        "difference quotient is (f(x) - f(x)) / 2h, not finite where f is not (f of an infinite input often is "
        "infinite, and then every quotient in its output's row is not finite too), 0 where f is finite; the point is "
        "the one you chose, not f leaving its domain: no step checks the gradient at these elements, check it at "
        "large finite inputs instead."),
    "numerical not finite": ("f is not finite at or next to the point, so the derivative there cannot be checked "
                             "numerically; move the point inside f's domain."),
    "f jumps here": ("f jumps at the point (its difference quotients grow like 1/step): it has no derivative there to "
                     "check; check at a point away from the jump."),
    "jumps near the point": (
        "f jumps within {distance:.2g} of the point, closer than any step rounding lets resolve (its second "
        "differences stop shrinking with the step): dense jumps (a mean over many fixed random draws, each switching "
        "branch at its own point; a floor or a sum of step functions) make f a staircase whose every step measures "
        "the jumps' trend, not the slope between them, so these elements are undecidable, not wrong; check the "
        "gradient on a smooth f (fewer or no draws, a smooth relaxation) or at a point away from the jumps."),
    "kinks no step resolves": (
        "every step crossed a kink of f (e.g. ReLU inputs at or within a step of 0) and the analytical value lies "
        "outside the one-sided derivatives: several kinks closer together than any step give that, as does a kink "
        "closer than the smallest step float32 rounding allows, so these elements are undecidable, not wrong; check "
        "at a point away from the kinks (e.g. nonzero biases or trained weights), or with a float64 numerical side "
        "(f must then accept float64 inputs: build its constants in the inputs' dtype)."),
    "f does not move here": FLAT_CAUSE,
    "numerical derivative unresolved": (
        "the central differences did not settle at any step tried (down to 4**12 times smaller than the first, or, "
        "for a noisy f, up to the largest step its noise allows), or f's measured noise is as large as f itself "
        "there (sin at 1e20: neighbouring inputs lie periods apart): f varies on a scale far below the step, or its "
        "noise or rounding swamps every step (float32 where f' is near 0 and f is not); pass a smaller eps where f "
        "varies below the step, check with a float64 numerical side where its rounding swamps it (f must then "
        "accept float64 inputs: build its constants in the inputs' dtype), or check at a point where f is smoother."),
    "secant": ("the gradient matches f's secant over wide steps but not its local slope at fine steps: an expected "
               "gradient, a surrogate or an implicit-reparameterization gradient, not the derivative of f itself "
               "(f varies on a finer scale than the gradient sees: a fast oscillation, dense jumps); check it against "
               "the smooth f it stands for, or accept it as not f's derivative."),
    "zero": ("the analytical gradient is zero where the numerical one is not: a missing chain-rule term, a misplaced "
             "tf.stop_gradient, or a variable that does not reach the gradient."),
    "sign": "the analytical gradient has the wrong sign.",
    "factor": ("the analytical gradient is off by a constant factor of {factor:.4g} (a missing or extra constant in "
               "the derivative)."),
    "transposed": ("the analytical Jacobian equals the transpose of the numerical one (a transposed matmul in the "
                   "gradient?)."),
    "few": "only {count} of {size} elements differ: look at indexing or a special case near the worst element.",
    # coloured mode
    "inconsistent": ("the reverse-mode gradient disagrees with f's Jacobian along a dense random cotangent (see the "
                     "problem above), although its values at the pattern's nonzeros may agree: look for a missing "
                     "transpose, gradient written to the wrong element, or a gradient that ignores dy; mode='full' on "
                     "a smaller input names the elements."),
    "wrong pattern": ("the sparsity pattern misses dependencies of f (see the problem above): each colour's "
                      "difference and VJP mixes in entries outside it, so these elements are undecidable, not wrong."),
    # fast mode's localisation
    "localised": LOCALISED,
    "throughout": LOCALISED + (" Every block of the input fails its probes: the gradient is wrong throughout it; the "
                               "region shown is where it is worst."),
    "not shown": ("the projections over these inputs together fail, but no part of them is shown wrong: neither fresh "
                  "probes of each part nor the failing probe split over the parts fail as a wrong gradient would (a "
                  "wrong gradient's error is linear: the split probe's errors add up to the whole one's); the failure "
                  "comes from kinks the probes cross (a float32 f over ReLUs) or sits at the tolerance. Check these "
                  "inputs with mode='full', or in float64."),
    "within parts": ("the projections over these inputs together fail, but every probe of every part of them passes "
                     "(the group's allowance grows less than the sum of its parts'): no part, and so no element, is "
                     "shown to be wrong -- close to the tolerance, or kinks crossed (a float32 f over ReLUs); check "
                     "these inputs with mode='full', or in float64."),
    "region passes": ("probes through the region shown disagree, but none of its elements is shown wrong on its own "
                      "(the worst one found is within its allowance, or sits at a kink of f, judged as mode='full' "
                      "judges kinks): the disagreement may come from kinks the probes cross (a float32 f over ReLUs) "
                      "or sit at the tolerance; check the input with mode='full' (on a slice)."),
    "flat element": "the probes' disagreement leads to an element where f does not move: " + FLAT_CAUSE,
    "gradient not finite": ("the reverse-mode gradient is NaN/Inf at {count} of this input's elements (the first at "
                            "{first}) where f's differences are finite: " + NONFINITE_CAUSE),
    "capped": ("the projections over this group of inputs fail; localisation stopped after {count} failing inputs: "
               "check the group's inputs with mode='full' (check_model: variables=[...])."),
}
SPREAD = (" The defect did not show in any single block of the region; it may be spread thinly over it or close to "
          "the tolerance: rerun with more probes or mode='full' on a slice.")


def hint_text(hint: events.Hint | None) -> str | None:
    """A pair's hint line (without its prefix), from what explains its verdict."""
    if hint is None:
        return None
    text = HINTS[hint.kind].format(count=hint.count, size=hint.size, factor=hint.factor, first=list(hint.first),
                                   distance=hint.distance)
    return text + SPREAD if hint.spread else text


def element_name(name: str, index: tuple) -> str:
    return f"{name}[{', '.join(map(str, index))}]" if index else name


def pair_details(pair) -> list[str]:
    """Kinks (or probes along kinks) found, and for a failing pair what fails, where, and the hint."""
    lines = _probe_lines(pair) if pair.projected else _kink_lines(pair)
    if pair.ok:
        return lines
    if pair.coarse:
        return [*lines, coarse_line(pair.title, pair.resolutions, pair.rtol, fast=pair.projected)]
    lines += _localised_lines(pair) if pair.projected else _failing_lines(pair)
    if pair.float64_gradient:
        lines.append(f"    {TWIN_PROBES_LINE if pair.projected else TWIN_LINE}")
    if pair.hint:
        lines.append(f"    hint: {pair.hint}")
    return lines

def _kink_lines(pair) -> list[str]:
    kinks = pair.kinks()
    lines = [
        f"  not differentiable at d {element_name(pair.output_name, e.output_index)} / d {element_name(pair.input_name, e.input_index)}: "
        f"left derivative={left:.8g}, right derivative={right:.8g}, analytical={e.analytical:.8g} "
        "(the steps cross a kink of f at or near the point: both one-sided derivatives settled, and the "
        "analytical value is one of them or between them, within their uncertainty)"
        for e, left, right in kinks[:3]
    ]
    if len(kinks) > 3:
        lines.append(f"  ... and {len(kinks) - 3} more elements at kinks")
    return lines

def _failing_lines(pair) -> list[str]:
    counts = [(pair.count(MISMATCH), "mismatched"), (pair.count(ANALYTICAL_NONFINITE), "analytical non-finite"),
              (pair.count(NUMERICAL_NONFINITE), "numerical non-finite"), (pair.count(UNRESOLVED), "unresolved"),
              (pair.count(DISCONTINUOUS), "at a jump of f"), (pair.count(UNRESOLVED_KINK), "at kinks no step resolves"),
              (pair.count(FLAT), "where f does not move")]
    lines = [f"  {pair.output_name} / {pair.input_name}: "
             + ", ".join(f"{count} {what}" for count, what in counts if count or what == "mismatched")
             + f" (atol={pair.atol:g}, rtol={pair.rtol:g})"]
    for k in pair._worst_indices(3):
        e = pair._element(k)
        if e.status == "ok":
            break
        sides, found = "", pair.one_sided.get(pair._key(k))
        if e.status == STATUS_NAMES[MISMATCH] and found is not None:  # at a kink: outside its settled sides
            sides = f" at a kink, outside its settled one-sided derivatives {found[0]:.8g} and {found[1]:.8g}"
        elif e.status == STATUS_NAMES[DISCONTINUOUS] and pair.jumps.get(pair._key(k)) is not None:
            sides = f": a jump within {pair.jumps[pair._key(k)]:.2g} of x"
        elif e.status == STATUS_NAMES[UNRESOLVED_KINK]:
            sides = (f", one-sided derivatives {found[0]:.8g} and {found[1]:.8g}" if found is not None
                     else ", the one-sided quotients never settle")
        lines.append(
            f"    d {element_name(pair.output_name, e.output_index)} / d {element_name(pair.input_name, e.input_index)}: "
            f"analytical={e.analytical:.8g} numerical={e.numerical:.8g} |diff|={e.abs_error:.3g} "
            f"allowed={e.band:.3g} ({e.status}{sides})"
        )
    return lines

def _probe_lines(pair) -> list[str]:
    c = pair.comparison
    lines = [f"  {pair.input_name}: {len(c.reverse_ratio)} random probes; worst element-wise |J d - numerical| / allowed = "
             f"{np.max(c.forward_ratio):.3g}, worst reverse |u.VJP.d - u.numerical| / allowed = {np.max(c.reverse_ratio):.3g}"]
    kinked, undecided = pair.kinked_probes, pair.undecided_probes
    if kinked or undecided:
        found = sorted({STATUS_NAMES[int(v)] for v in pair.status[np.isin(pair.status, UNDECIDED)]})
        lines.append(f"    probes along kinks of f: {kinked} with J d between the one-sided derivatives (pass), "
                     f"{undecided} undecidable ({', '.join(found) or 'none'}; steps down to h/4**12 tried)")
    return lines

def _localised_lines(pair) -> list[str]:
    assert pair.projected
    lines = []
    bad_sides = np.isin(pair.status, (MISMATCH,)).any(axis=0)
    sides = [name for name, bad in zip(("element-wise J d", "projection u.VJP.d"), [bool(b) for b in np.atleast_1d(bad_sides)]) if bad]
    if sides:
        lines.append(f"    failing side(s): {', '.join(sides)}")
    region, e = pair.storage.region, pair.storage.found
    if region is not None:
        what = "the probes' disagreement" if e is not None and e.status == "ok" else "defect"
        lines.append(f"    {what} localised to {pair.input_name}[{region[0]} .. {region[1]}] (flattened-order slab)")
    if e is not None:
        forward = pair.storage.found_by == "forward"
        of = f"output[{', '.join(map(str, e.output_index))}]" if forward else "(u . output)"
        lines.append(f"    worst element found ({'element-wise J d' if forward else 'projection u.J.d'}): d {of} / d {pair.input_name}"
                     f"[{', '.join(map(str, e.input_index))}]: analytical={e.analytical:.8g} numerical={e.numerical:.8g} "
                     f"|diff|={e.abs_error:.3g} allowed={e.band:.3g}")
    return lines


def report_line(report) -> str:
    """One line, what pytest shows for a failing ``assert report``; ``str(report)`` is the full table."""
    verdict = VERDICT_LABELS[report.verdict]
    wrong = sum(p.label == "FAIL" for p in report.failures)
    undecided = len(report.failures) - wrong
    summary = f"{wrong} of {len(report.pairs)} pairs failed" + (f", {undecided} undecidable" if undecided else "")
    if report.failures:
        pair = report.failures[0]
        e = pair.worst_element
        if e is None:
            summary += f", worst {pair.title} abs error {pair.max_abs_error:.2g}"
        else:
            summary += (f", worst d {element_name(pair.output_name, e.output_index)} / d {element_name(pair.input_name, e.input_index)} "
                        f"abs error {e.abs_error:.2g} ({e.status})")
    elif report.problems:
        summary += f", {report.problems[0].splitlines()[0][:100]}"
    else:
        summary += f", max abs error {report.max_abs_error:.2g}"
    return f"<GradientReport {verdict}: {summary} [{report.mode} mode]>"


def report_text(report) -> str:
    """The report as text: failing pairs first, passing ones collapsed to a count by layer when many.

    Past ``COLLAPSE_PASSING`` passing pairs, they are one line (their count,
    largest errors and layer groups) and their kinks one summary; notes that
    differ only in an input's name and numbers are one line.  ``to_dict`` keeps
    every pair and note.
    """
    verdict = VERDICT_LABELS[report.verdict]
    wrong = sum(p.label == "FAIL" for p in report.failures)
    undecided = len(report.failures) - wrong
    lines = [
        f"fastcheck {report.title}: {verdict} -- {wrong} of {len(report.pairs)} pairs failed"
        f"{f', {undecided} undecidable' if undecided else ''}, "
        f"max abs error {report.max_abs_error:.3g}, max rel error {report.max_rel_error:.3g} "
        f"[{report.path}, {report.mode} mode, {report.seconds:.2f} s]"
    ]
    lines += [f"  PROBLEM: {problem}" for problem in report.problems]
    lines += [f"  WARNING: {warning}" for warning in report.warnings]
    # Wrong gradients first, then undecidable pairs, then passing ones; stable within each.
    failing = sorted(report.failures, key=lambda p: 0 if p.label == "FAIL" else 1)
    passing = [p for p in report.pairs if p.ok]
    collapsed = len(passing) > COLLAPSE_PASSING
    shown = failing + ([] if collapsed else passing)
    if shown:
        width = max(len(p.title) for p in shown)
        lines.append(f"  {'pair'.ljust(width)}  status  {'max abs':>9}  {'max rel':>9}  {'rel norm':>9}  failed")
        lines += [f"  {p.title.ljust(width)}  {p.label:6}  {p.max_abs_error:9.3g}  {p.max_rel_error:9.3g}  "
                  f"{p.relative_norm_error:9.3g}  {p.failed_count}/{p.status.size}" for p in shown]
    if collapsed:
        lines.append(f"  ok: {len(passing)} {'more ' if failing else ''}pairs, max abs error "
                     f"{max(p.max_abs_error for p in passing):.3g}, max rel error "
                     f"{max(p.max_rel_error for p in passing):.3g}; by layer{_layer_groups(passing)}")
    # Undecidable fast-mode pairs say the same thing: past a few, one line for all of them.
    projections = [p for p in failing if p.projected and p.label != "FAIL"]
    probes_undecided = [p for p in projections if not p.coarse and p.undecided_probes]  # kinks no step resolves
    coarse_pairs = [p for p in projections if p.coarse]  # every probe passes, too coarse to decide
    summarised = len(probes_undecided) > UNDECIDED_DETAILS
    coarse_summarised = len(coarse_pairs) > UNDECIDED_DETAILS
    for p in failing:
        if not (summarised and p in probes_undecided) and not (coarse_summarised and p in coarse_pairs):
            lines += pair_details(p)
    if summarised:
        lines.append(f"  undecidable: {sum(p.undecided_probes for p in probes_undecided)} probes over "
                     f"{len(probes_undecided)} pairs cross kinks of f that no step down to h/4**12 resolves"
                     f"{_layer_groups(probes_undecided)}")
    if coarse_summarised:
        resolutions = [p.resolution for p in coarse_pairs]
        lines.append(f"  undecidable: {len(coarse_pairs)} pairs pass every probe but resolve no relative error of "
                     f"their gradient below {min(resolutions):.3g} .. {max(resolutions):.3g} (coarser than "
                     f"{RESOLUTION_RTOLS:g} rtols and than the tolerances alone){_layer_groups(coarse_pairs)}")
    if probes_undecided:
        lines.append(f"  hint: {UNDECIDED_PROBES_HINT}")
    if not collapsed:
        for p in passing:
            lines += pair_details(p)
    else:
        kinked_probes = [p for p in passing if p.kinked_probes]
        if kinked_probes:
            lines.append(f"  {sum(p.kinked_probes for p in kinked_probes)} probes in {len(kinked_probes)} passing "
                         "pairs crossed kinks of f, with the analytical J d between the one-sided derivatives")
        with_kinks = [p for p in passing if not p.projected and p.count(NONDIFFERENTIABLE)]
        if with_kinks:
            example = next((line.strip() for p in with_kinks for line in pair_details(p)
                            if line.strip().startswith("not differentiable")), None)
            lines.append(f"  {sum(p.count(NONDIFFERENTIABLE) for p in with_kinks)} elements in {len(with_kinks)} "
                         f"passing pairs sit at kinks of f, with the analytical value between the one-sided "
                         f"derivatives{'; e.g. ' + example if example else ''}")
    lines += [f"  note: {note}" for note in composed_notes(report.events, [p.input_name for p in report.pairs])]
    twinned = [p for p in report.pairs if p.float64_gradient]
    if twinned:
        lines.append(f"  note: {len(twinned)} pair(s) whose tolerances could not see a 1% error of their gradient "
                     f"were judged through its float64 twin: {TWIN_RULE}{_layer_groups(twinned)}")
    tolerance_bound = report.tolerance_bound
    if tolerance_bound:
        low, high = min(p.resolution for p in tolerance_bound), max(p.resolution for p in tolerance_bound)
        span = f"{low:.3g}" if low == high else f"{low:.3g} .. {high:.3g}"
        lines.append(f"  note: {len(tolerance_bound)} passing pair(s) resolve no relative error of their gradient "
                     f"below {span}: their gradients are small against atol, so a defect below atol passes by the "
                     f"tolerances themselves (not the numerics); pass a smaller atol to judge them relatively"
                     f"{_layer_groups(tolerance_bound)}")
    lines += zero_lines(report)
    lines.append(f"  rule: {FAST_RULE if report.mode == 'fast' else RULE}")
    return "\n".join(lines)


def zero_lines(report) -> list[str]:
    """The note on passing pairs whose gradient is zero within the numerics: each one's absolute bound, and what
    share that is of the largest derivative of the same output (where another pair has one)."""
    zeros = report.zero_gradients
    if not zeros:
        return []
    bounds = []
    for p in zeros[:UNDECIDED_DETAILS]:
        largest = max((q.largest_gradient for q in report.pairs if q.output_name == p.output_name), default=0.0)
        share = f" ({p.zero_bound / largest:.3g} of the largest, {largest:.3g})" if largest > p.zero_bound else ""
        bounds.append(f"|d {p.output_name} / d {p.input_name}| <= {p.zero_bound:.3g}{share}")
    more = f", and {len(zeros) - UNDECIDED_DETAILS} more" if len(zeros) > UNDECIDED_DETAILS else ""
    return [f"  note: {len(zeros)} passing pair(s) have a zero gradient within the numerical side's resolution "
            f"(analytical within atol of 0, numerical within its own error of 0), so no relative error of theirs means "
            f"anything; each passes by its absolute bound: {'; '.join(bounds)}{more}"]


TWIN_RULE = ("the same gradient code run at the float64 point (on the model's float64 copy, or f given float64 "
             "values), judged by float64's rule against the same numerical derivative; each element is then allowed "
             "float64's allowance plus |gradient - its float64 twin|, the gradient's own rounding measured instead "
             "of float32's atol (pass atol= to judge by your tolerances alone)")
TWIN_LINE = ("judged through the float64 twin of the gradient: its allowance is float64's rule plus the measured "
             "|gradient - float64 gradient|, as float32's atol could not resolve a 1% error here")
TWIN_PROBES_LINE = ("probes judged through the float64 twin of the gradient (the same gradient code at the float64 "
                    "point, within float32's tolerance of the gradient): each probe d is allowed float64's rule plus "
                    "|(gradient - twin) . d|, as float32's atol could not resolve a 1% error here")
UNDECIDED_PROBES_HINT = (
    "an undecidable probe crosses kinks of f (ReLU-like activations) closer to the point than any step resolves, "
    "as in a freshly initialised deep network whose activations have shrunk to ~1e-11; no gradient was found wrong "
    "along it. Check a trained or calibrated model (batch normalization statistics from data), or the named "
    "inputs with mode='full', which judges each element on its own.")


def _layer_groups(pairs: list) -> str:
    """Pairs' input names grouped by layer family, in order: ``": block_13* (9), ..."`` for block_13_expand/kernel, ...

    A variable path's layer is everything before its last ``/``; its family is the
    layer's last segment up to its first token with a digit (``block_13`` of
    ``block_13_depthwise_BN``), or the whole layer.  Families of one variable show as
    their variable's name, larger ones as ``family* (count)``; a leading path every
    name shares (a Sequential model's name) is said once.
    """
    names = [p.input_name for p in pairs]
    shared = ""
    while names and all("/" in n[len(shared):] for n in names):
        head = names[0][len(shared):].split("/")[0] + "/"
        if not all(n[len(shared):].startswith(head) for n in names):
            break
        shared += head
    families: dict[str, list[str]] = {}
    for name in (n[len(shared):] for n in names):
        layer, _, _ = name.rpartition("/")
        head, _, last = layer.rpartition("/")
        tokens = last.split("_")
        cut = next((i for i, token in enumerate(tokens) if any(c.isdigit() for c in token)), len(tokens) - 1)
        family = (head + "/" if head else "") + "_".join(tokens[: cut + 1]) if layer else name
        families.setdefault(family, []).append(name)
    groups = [members[0] if len(members) == 1 else f"{family}* ({len(members)})" for family, members in families.items()]
    return f"{f' (in {shared})' if shared else ''}: {', '.join(groups)}"


class _Span:
    """The values of one numeric field over a merged group of events: formats as the value where they agree,
    else as ``low to high`` (each as its own format gives it, then ``:g``)."""

    def __init__(self, values: list):
        self.low, self.high = min(values), max(values)

    def __format__(self, spec: str) -> str:
        if self.low == self.high:
            return format(self.low, spec)
        return f"{float(format(self.low, spec)):g} to {float(format(self.high, spec)):g}"


def _subject(event) -> str | None:
    """The input (or mode) an event is about, said before its text."""
    return getattr(event, events.SUBJECT, None) or getattr(event, "subject", None)


def _numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def composed_notes(found, names: list[str]) -> list[str]:
    """The notes of ``found`` (events) in order, the same event about several inputs merged into one.

    Events of one kind that differ only in the input they are about and their numbers become one
    note: ``"150 inputs (conv/kernel, conv/bias, ... ): chunked to 32 perturbations per call (1 to
    40 calls) ..."``, numbers that vary shown as their range.  Other notes are kept once each.
    """
    known = set(names)
    groups: dict = {}
    for event in found:
        subject = _subject(event)
        if subject not in known:
            groups.setdefault(("text", compose(event)), [event])
            continue
        fields = dataclasses.fields(event)
        key = (type(event), *(getattr(event, f.name) for f in fields
                              if f.name not in (events.SUBJECT, "subject") and not _numeric(getattr(event, f.name))))
        groups.setdefault(key, []).append(event)
    result = []
    for members in groups.values():
        first = members[0]
        if len(members) == 1:
            result.append(compose(first))
            continue
        spans = {f.name: _Span([getattr(m, f.name) for m in members])
                 for f in dataclasses.fields(first) if _numeric(getattr(first, f.name))}
        subjects = [str(_subject(m)) for m in members]
        shown = ", ".join(subjects[:3]) + (", ..." if len(subjects) > 3 else "")
        result.append(f"{len(subjects)} inputs ({shown}): {_said(first, spans)}")
    return result


def _screened_text(block) -> str:
    """How coloured mode's device screen shared a block's verdicts with numpy (empty where it did not run)."""
    if not block.cleared:
        return ""
    rest = block.nonzeros - block.cleared
    return (f" ({'all' if not rest else block.cleared} passed by the element rule with a {SCREEN_MARGIN:g} margin in "
            "one fused XLA pass" + (f", the other {rest} judged in numpy)" if rest else ")"))


def compose(event) -> str:
    """One event as the report's note."""
    subject = _subject(event)
    return f"{subject}: {_said(event)}" if subject is not None else _said(event)


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


def _distributed(e) -> str:
    parts = [f"{name} on each worker: {' / '.join(map(str, counts))}" if per_worker
             else f"{' / '.join(map(str, counts))} {name}" for name, counts, per_worker in e.work]
    return (f"distributed over {e.where}: " + "; ".join(parts)
            + (" (each worker evaluated its replicas' shares; results all-gathered)" if e.multi else ""))


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

def _said(event, spans: dict | None = None) -> str:
    """What ``event`` says, after its subject; ``spans``: numeric fields as ranges over a merged group."""
    return _text_of(EVENT_TEXT, event, "event")(dataclasses.replace(event, **spans) if spans else event)


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


def route_reason(why: events.RouteReason) -> str:
    """Why routing chose its path, as a phrase."""
    if why.rule == "small":
        loop = "eager loops by colours of f's traced pattern" if why.coloured else "small check: eager loop"
        return f"{loop} predicted {why.eager * 1e3:.0f} ms, tracing {why.traced * 1e3:.0f} ms"
    if why.rule == "untraceable":
        return f"f cannot be traced ({why.error}): evaluated eagerly"
    if why.rule == "random":
        return (f"f draws random numbers (op {why.op}) and XLA draws different ones than TensorFlow's kernels from "
                "the same seed, so f runs without XLA" + (" (jit_compile=True overridden)" if why.overridden else ""))
    if why.rule == "slow op":
        return f"{why.op} is slow under XLA on this backend"
    if why.rule == "slow on CPU":
        return f"{why.op} is slower under XLA than TensorFlow's own on CPU"
    if why.rule in ("pays", "too small"):
        return (f"batched work of {why.work:.2g} element-evaluations "
                + ("pays for XLA compilation" if why.rule == "pays" else "is too small for XLA compilation"))
    return {"requested": "jit_compile=True", "disabled": "jit_compile=False",
            "loops": "f contains while_loops: pfor conversion would cost more than it saves"}[why.rule]


def _chunk_reason(why: events.ChunkReason) -> str:
    if why.limit == "joint":
        return (f"in the one differences kernel of all {why.inputs} checked inputs "
                f"(instead of one kernel per input; each input's calls padded to {why.padded})")
    if why.limit == "cache":
        return (f"to keep each call's working set within the CPU's {why.cache_mib} MiB cache"
                + (f" (f is memory-bound: {why.flops_per_element:.0f} FLOPs per intermediate element)"
                   if why.flops_per_element is not None else ""))
    return "to fit memory_budget"


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


# Each event type's text, after its subject: a function of the event (its numeric fields may be ``_Span``s,
# which format as a value or a range). One entry per type of ``events``; ``_said`` dispatches on the type.
EVENT_TEXT: dict[type, Callable[[Any], str]] = {
    events.OutOfMemory: lambda e: f"out of memory at {e.chunk} {e.unit} per call; retried with {e.retried}",
    events.FellBack: lambda e: f"{e.path} failed for {e.what} ({e.error}); fell back to {e.following}",
    events.Chunked: lambda e: f"chunked to {e.chunk} perturbations per call ({e.calls} calls) {_chunk_reason(e.why)}",
    events.JointKernelDropped: lambda e: (
        "numerical differences: with every checked input batched at once, vectorized_map converts some op of f "
        "with a while_loop; one kernel per input instead"),
    events.ElementwiseCalls: lambda e: "f is element-wise in it (read from the ops its calls ran): " + "; ".join(
        {"reverse": "2 VJPs instead of one per output element",
         "numerical": "2 calls of f a side instead of one per element"}[side] for side in e.sides),
    events.EagerColours: lambda e: "eager loops by f's traced sparsity pattern: " + "; ".join(
        {"reverse": f"{e.rows} rows from {colours} VJPs (rows that share no input element share one; checked by a VJP "
                    "of a random cotangent)",
         "numerical": f"at most {colours} pairs of calls of f for {e.columns} columns (columns that share no output "
                      "move together)"}[side] for side, colours in e.sides),
    events.OwnKernel: lambda e: (
        "its later differences ran on a kernel of its own: a call of the one kernel evaluates every op of f that "
        "depends on a checked input, its own only the ops that follow it"),
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
    events.NoiseTables: lambda e: f"f's noise measured from {_counted(e.tables, 'table')} of f along lines through x" + (
        ", each one call of a traced loop" if e.batched == e.tables else
        f", {e.batched} of them one call of a traced loop each, the others point by point" if e.batched else
        ", point by point"),
    events.ModeChosen: lambda e: f"mode: {e.mode} ({mode_reasons(e.why)})",
    events.PathChosen: lambda e: (
        f"path: {e.path} ({route_reason(e.reason)}"
        f"{'; routed, before the mode was chosen, for a full check' if e.routed_for_full else ''})"),
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
    events.ColouredOnGraph: lambda e: (
        f"coloured mode: the colours' evaluations ran on the graph path, not XLA: XLA's compilation pays only from "
        f"{e.evaluations} evaluations"),
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
    events.Distributed: _distributed,
    events.PathsDiffer: lambda e: (
        f"the workers routed f to different paths; every worker evaluated {e.what} eagerly instead (pass "
        "jit_compile= to pin the path)"),
    events.EagerUnsplit: lambda e: (
        f"strategy: {e.what} ran on the eager path, on one device" + (" on every worker" if e.multi else "")
        + ", not over the replicas (pass jit_compile=False to trace f)"),
}
