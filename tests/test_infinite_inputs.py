"""Infinite input elements: clamps, smooth steps, CDFs and bounded bijectors are tested at +-inf.

An infinite ``x_j`` moves by a finite step (``x_j +- h`` stays ``x_j``), so ``compute_gradient`` gives
``tf.test.compute_gradient``'s numbers there, ``check_gradients`` judges those elements by its rule where both sides
are finite, and the report names the infinite elements instead of blaming f's domain.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

import fastcheck

INF = np.inf


def normal_cdf(x):
    return 0.5 * (1.0 + tf.math.erf(x / math.sqrt(2.0)))


def softplus_like(x):
    """log(1 + e^x), written as a bounded-below library would: finite at -inf, infinite at +inf."""
    return tf.maximum(x, 0.0) + tf.math.log1p(tf.exp(-tf.abs(x)))


FUNCTIONS = {
    "clip": lambda x: tf.clip_by_value(x, 0.0, 1.0),
    "sigmoid": tf.sigmoid,
    "erf": tf.math.erf,
    "normal_cdf": normal_cdf,
    "tanh": tf.tanh,
    "softplus": tf.nn.softplus,
    "softplus_like": softplus_like,
}
POINTS = {
    "-inf first": [-INF, 0.5, -1.25],
    "+inf last": [0.3, -0.7, INF],
    "both": [INF, -0.4, -INF, 1.5],
}
DTYPES = (tf.float32, tf.float64)


def _tf_compute_gradient(f, x, delta):
    with np.errstate(invalid="ignore"):  # TensorFlow's own inf - inf
        return tf.test.compute_gradient(f, [x], delta=delta)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("point", POINTS, ids=str)
@pytest.mark.parametrize("name", FUNCTIONS)
def test_compute_gradient_gives_tensorflows_numbers_at_infinite_inputs(name, point, dtype):
    f, x = FUNCTIONS[name], tf.constant(POINTS[point], dtype)
    for delta in (1 / 1024, None):  # None: fastcheck's step against TensorFlow's default 1/1024 (finite columns)
        # TensorFlow's float32 differences carry ~1e-4; its default step's truncation error ~1e-7 in float64
        rtol = 1e-3 if dtype == tf.float32 else 1e-9 if delta else 1e-5
        theirs = _tf_compute_gradient(f, x, delta)
        ours = fastcheck.compute_gradient(f, [x], delta=delta)
        for their, our in zip(theirs, ours):
            assert our[0].dtype == their[0].dtype
            # element for element, NaN where TensorFlow's is NaN (f infinite there), 0 at the infinite columns
            np.testing.assert_allclose(our[0], their[0], rtol=rtol, atol=rtol, equal_nan=True)
        numerical = ours[1][0]
        infinite = ~np.isfinite(x.numpy())
        finite_rows = np.isfinite(f(x).numpy())
        # f(inf) - f(inf) where f is finite (within a traced path's rounding of the other elements)
        np.testing.assert_allclose(numerical[np.ix_(finite_rows, infinite)], 0.0, atol=rtol)


def _infinite_named(report, x) -> None:
    text, data = str(report), report.to_dict()
    notes = [note for note in data["notes"] if "non-finite element" in note]
    assert len(notes) == 1, data["notes"]
    nonfinite = np.flatnonzero(~np.isfinite(x))
    assert f"holds {len(nonfinite)} non-finite element" in notes[0]
    for index in nonfinite[:5]:  # the first five, by name and value
        assert f"input[{index}]={x[index]:g}" in notes[0]
    assert notes[0] in text
    for pair in data["pairs"]:
        assert "f's domain" not in (pair["hint"] or "")
    assert "move the point inside f's domain" not in text


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("point", POINTS, ids=str)
@pytest.mark.parametrize("name", FUNCTIONS)
def test_correct_gradients_at_infinite_inputs_never_fail_and_the_report_names_them(name, point, dtype):
    f, x = FUNCTIONS[name], tf.constant(POINTS[point], dtype)
    report = fastcheck.check_gradients(f, x)
    assert report.verdict != "fail", str(report)
    _infinite_named(report, x.numpy())
    (pair,) = report.pairs
    finite_rows = np.isfinite(f(x).numpy())
    # The finite elements are judged: every element in a row where f is finite passes by the rule.
    assert np.all(pair.statuses[finite_rows] == "ok"), str(report)
    if finite_rows.all():
        assert report.ok, str(report)
    else:  # softplus at +inf: f is infinite there, its row undecidable, the hint names the input
        assert report.verdict == "undecidable"
        assert "the input itself is infinite or NaN" in report.to_dict()["pairs"][0]["hint"]


def _planted(g, index: int, factor: float = 1.01):
    """g with its gradient off by 1% at element ``index`` (a defect on a finite element)."""

    @tf.custom_gradient
    def f(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = g(x)

        def grad(dy):
            true = tape.gradient(y, x, output_gradients=dy)
            scale = tf.tensor_scatter_nd_update(tf.ones_like(x), [[index]], tf.constant([factor], x.dtype))
            return true * scale

        return y, grad

    return f


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", ["clip", "sigmoid", "normal_cdf", "tanh", "softplus"])
def test_a_one_percent_defect_on_a_finite_element_beside_infinite_ones_fails_naming_it(name, dtype):
    x = tf.constant([INF, 0.4, -INF, -0.9], dtype)
    report = fastcheck.check_gradients(_planted(FUNCTIONS[name], 1), x)
    assert report.verdict == "fail", str(report)
    (pair,) = report.pairs
    mismatched = {tuple(int(i) for i in at) for at in np.argwhere(pair.statuses == "mismatch")}
    assert mismatched == {(1, 1)}, str(report)
    assert "d output[1] / d input[1]: analytical=" in str(report)
    _infinite_named(report, x.numpy())


def test_the_infinite_inputs_are_judged_in_fast_and_coloured_mode_too():
    x = tf.constant([-INF, 0.5, INF, -2.0] * 8, tf.float32)
    for mode in ("coloured", "fast"):
        report = fastcheck.check_gradients(tf.sigmoid, x, mode=mode)
        assert report.ok, str(report)
        _infinite_named(report, x.numpy())
