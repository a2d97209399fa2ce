"""The text of a report's notes, composed in one place (``text``) from its typed events.

The other tests assert on ``report.events`` and their fields; these check that the text reads right: each
event's sentence.
"""

import json

import numpy as np
import pytest
import tensorflow as tf
from conftest import checked, logged

import fastcheck

RNG = np.random.default_rng(26)


def test_each_event_is_one_note_and_to_dict_writes_both(debug_log):
    report = fastcheck.check_gradients(tf.tanh, tf.constant(RNG.normal(size=(3, 4))), mode="full", jit_compile=False)
    summary = json.loads(json.dumps(report.to_dict()))
    assert len(report.notes) == len(report.events) == len(summary["events"]) and summary["notes"] == report.notes
    assert [e["kind"] for e in summary["events"]] == [type(e).__name__ for e in report.events]
    assert "mode: full (as requested)" in report.notes
    # How the work ran is no note: the route is logged at DEBUG.
    assert not any(n.startswith("path: ") for n in report.notes) and report.path == "graph"
    assert logged(debug_log, "route: ") == [("graph", "jit_compile=False")]
    (chosen,) = [e for e in summary["events"] if e["kind"] == "ModeChosen"]
    assert chosen == {"kind": "ModeChosen", "mode": "full", "why": [{"kind": "Requested"}]}


def test_precision_and_noise_found_read_as_sentences():
    report = fastcheck.check_gradients(lambda x: tf.cast(tf.exp(tf.cast(x, tf.float32)), tf.float64),
                                       tf.constant(RNG.normal(size=(3, 4))))
    assert ("f computes in float32 inside (op Exp): the analytical side is judged with float32 tolerances "
            "atol=1e-05, rtol=0.0001") in report.notes, report.notes
    noise = next(n for n in report.notes if n.startswith("f's evaluations carry relative noise "))
    assert noise.endswith("(measured; float64 rounds at 2.2e-16): noise allowances follow it, and columns it swamps "
                          "are re-estimated at larger steps"), noise
    upcast = fastcheck.check_gradients(tf.exp, tf.constant([0.5, 1.5], tf.float32))
    assert "numerical side evaluated in float64 (precision='auto')" in upcast.notes
    native = fastcheck.check_gradients(lambda x: tf.cast(tf.sin(x), tf.float32), tf.constant([0.5, 1.5], tf.float32))
    assert "numerical side evaluated in native precision: f returned float32 for float64 inputs" in native.notes


def test_mode_reasons_read_as_one_phrase():
    x = tf.constant(RNG.normal(size=30_000))  # the time rule applies from 20,000 elements
    report = checked(lambda x: tf.reduce_sum(tf.tanh(x)), x, tables={"FULL_SECONDS": 1e-9})
    note = next(n for n in report.notes if n.startswith("mode: fast (full Jacobians predicted to take "))
    assert "more than 1e-09 s; pass mode='full' to run them anyway)" in note, note
    big = fastcheck.check_gradients(tf.sin, tf.constant(RNG.normal(size=300)), memory_budget=1_000)
    note = next(n for n in big.notes if n.startswith("mode: coloured (the full Jacobian has 9e+04 entries, more than "))
    assert "fit memory_budget; f's Jacobian is sparse (300 structural nonzeros in 1 column colours" in note, note


@pytest.mark.parametrize("escalated", [True, False], ids=["full rerun", "coloured"])
def test_an_inconsistent_gradient_says_why_full_mode_ran(escalated):
    @tf.custom_gradient
    def transpose(x):  # the gradient forgets to transpose back
        return tf.transpose(x), lambda dy: dy

    tables = None if escalated else {"FULL_BYTES_PER_ENTRY": 1 << 60}
    report = checked(transpose, tf.constant(RNG.normal(size=(12, 12))), mode="coloured", tables=tables)
    text = str(report)
    assert ("found the reverse-mode gradient inconsistent with f's sparsity pattern (see the notes), so the full "
            "Jacobians, which fit, give the element verdicts)" in text) == escalated, text
    assert any(n.startswith("coloured mode: ") and "is not the transpose of f's Jacobian" in n
               for n in report.notes) == escalated, report.notes


def test_a_bijector_reports_its_tolerances_and_chart_as_notes():
    import tensorflow_probability as tfp

    from fastcheck.tfp import check_bijector

    report = check_bijector(tfp.bijectors.CorrelationCholesky(), RNG.normal(size=(2, 3)), 1)
    assert [type(e).__name__ for e in report.events] == ["IdentitiesJudged", "LogDetConvention"]
    assert report.notes[0].startswith("identities judged with atol=1e-08, rtol=1e-06 (float64 defaults), plus ")
    assert report.notes[1].startswith("log-det-Jacobian in TFP's convention for CorrelationCholesky: log|det| of "
                                      "the square Jacobian of forward from ")
    assert f"  note: {report.notes[1]}" in str(report).splitlines()
    assert report.to_dict()["events"][1]["convention"] == "chart"


def _scaled_first(x, factor):
    """sin, whose custom gradient multiplies its first 3 elements by ``factor``."""

    @tf.custom_gradient
    def f(v):
        scale = tf.where(tf.range(tf.size(v)) < 3, tf.constant(factor, v.dtype), tf.constant(1.0, v.dtype))
        return tf.sin(v), lambda dy: dy * tf.cos(v) * scale

    return f(x)


@pytest.mark.parametrize(("f", "x", "options", "row"), [
    (lambda v: _scaled_first(v, 1.1), np.linspace(-1, 1, 40), {"mode": "full"}, "FAIL .* 3 wrong of 40x40$"),
    (tf.sin, np.linspace(-1, 1, 40), {"mode": "full"}, "ok .* all 40x40 ok$"),
    (lambda v: _scaled_first(v, 1.1), np.linspace(-1, 1, 40), {"mode": "fast"}, r"FAIL .* \d+ wrong of 8 probe checks$"),
    # a straight-through quantiser: f does not move at any element, its surrogate gradient is 1
    (lambda v: v + tf.stop_gradient(tf.round(4 * v) / 4 - v), np.linspace(-0.9, 0.9, 6), {"mode": "full"},
     "undec. .* 6 undecidable of 6x6$"),
])
def test_the_pair_table_counts_wrong_and_undecidable_elements_of_what_was_compared(f, x, options, row):
    """The table says what a pair compared (the Jacobian's m x n entries, or fast mode's probe checks) and how many
    of them are wrong or undecidable, never an undecidable element counted as failed."""
    import re

    report = fastcheck.check_gradients(f, tf.constant(x), **options)
    header, line = str(report).splitlines()[1:3]
    assert header.rstrip().endswith("elements") and re.search(row, line.rstrip()), str(report)
