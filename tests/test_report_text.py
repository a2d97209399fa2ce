"""The text of a report's notes, composed in one place (``text``) from its typed events.

The other tests assert on ``report.events`` and their fields; these check that the text reads right:
each event's sentence, and the same event about many inputs merged into one line, numbers as ranges.
"""

import json

import numpy as np
import pytest
import tensorflow as tf
from conftest import checked, events_of

import fastcheck

RNG = np.random.default_rng(26)


def _stacked_sums(*values):
    return tf.stack([tf.reduce_sum(tf.tanh(v)) for v in values])


def test_each_event_is_one_note_and_to_dict_writes_both():
    report = fastcheck.check_gradients(tf.tanh, tf.constant(RNG.normal(size=(3, 4))), mode="full", jit_compile=False)
    summary = json.loads(json.dumps(report.to_dict()))
    assert len(report.notes) == len(report.events) == len(summary["events"]) and summary["notes"] == report.notes
    assert [e["kind"] for e in summary["events"]] == [type(e).__name__ for e in report.events]
    assert "mode: full (as requested)" in report.notes
    assert "path: graph (jit_compile=False)" in report.notes
    (chosen,) = [e for e in summary["events"] if e["kind"] == "ModeChosen"]
    assert chosen == {"kind": "ModeChosen", "mode": "full", "why": [{"kind": "Requested"}]}


def test_chunking_of_many_inputs_is_one_line_with_the_range_of_calls():
    sizes = (200, 300, 250, 400, 220)
    values = [tf.constant(RNG.normal(size=size)) for size in sizes]
    report = fastcheck.check_gradients(_stacked_sums, values, jit_compile=False, memory_budget=32 * 1024, mode="full")
    assert report.ok, str(report)
    chunked = events_of(report, "Chunked")
    assert [e.input for e in chunked] == [f"input {i}" for i in range(5)], report.notes
    assert all(e.calls == -(-size // e.chunk) for e, size in zip(chunked, sizes))
    # report.notes keeps one note per input; str(report) merges them on the events' fields.
    assert f"input 3: chunked to {chunked[3].chunk} perturbations per call ({chunked[3].calls} calls)" in "\n".join(
        report.notes)
    chunks, calls = {e.chunk for e in chunked}, [e.calls for e in chunked]
    assert len(chunks) == 1, report.notes  # what the line below assumes
    line = (f"  note: 5 inputs (input 0, input 1, input 2, ...): chunked to {chunks.pop()} perturbations per call "
            f"({min(calls)} to {max(calls)} calls) ")
    assert sum(text.startswith(line) for text in str(report).splitlines()) == 1, str(report)


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
