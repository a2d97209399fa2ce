"""The report's text, composed in one place from its facts: a pair's details and hint, the report's table and its
warnings.  Each event's note is composed in ``notes``.  Stages hand over facts, never sentences."""

from __future__ import annotations

import numpy as np

from fastcheck.engine.tables import COLLAPSE_PASSING, RESOLUTION_RTOLS, UNDECIDED_DETAILS
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
from fastcheck.report.storage import Nonzeros

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
            f"allowed={e.allowed:.3g} ({e.status}{sides})"
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
                     f"|diff|={e.abs_error:.3g} allowed={e.allowed:.3g}")
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
    largest errors and layer groups) and their kinks one summary; a note said
    twice is shown once.  ``to_dict`` keeps every pair and note.
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
        lines.append(f"  {'pair'.ljust(width)}  status  {'max abs':>9}  {'max rel':>9}  {'rel norm':>9}  elements")
        lines += [f"  {p.title.ljust(width)}  {p.label:6}  {p.max_abs_error:9.3g}  {p.max_rel_error:9.3g}  "
                  f"{p.relative_norm_error:9.3g}  {_elements(p)}" for p in shown]
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
    lines += [f"  note: {note}" for note in dict.fromkeys(report.notes)]  # each text once
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
def _elements(pair) -> str:
    """What a pair compared and how much of it is wrong or undecidable: ``3 wrong of 40x40`` (the Jacobian's
    entries), ``2 undecidable of 120 nonzeros`` (coloured mode's sparse report), ``1 wrong of 8 probe checks`` (fast
    mode: each probe element-wise and projected)."""
    if pair.projected:
        checked = f"{pair.status.size} probe checks"
    elif isinstance(pair.storage, Nonzeros):
        checked = f"{pair.status.size} nonzeros"
    else:
        checked = f"{int(np.prod(pair.output_shape))}x{int(np.prod(pair.input_shape))}"
    wrong = pair.count(MISMATCH) + pair.count(ANALYTICAL_NONFINITE)
    undecided = sum(pair.count(status) for status in UNDECIDED)
    counts = [f"{n} {what}" for n, what in ((wrong, "wrong"), (undecided, "undecidable")) if n]
    if counts:
        return f"{', '.join(counts)} of {checked}"
    return f"all {checked} ok" if pair.ok else f"none wrong of {checked}"


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
