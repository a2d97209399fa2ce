"""Hard points: near kinks, at kinks, near domain edges, sharp features, precision fallbacks."""

import numpy as np
import pytest
import tensorflow as tf

import fastcheck

PRECISIONS = ["auto", "native"]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("f", [tf.nn.relu, tf.abs, lambda x: tf.maximum(x, 0.3)], ids=["relu", "abs", "max"])
def test_near_kink_is_not_a_false_alarm(f, precision, dtype):
    # Within the default step of the kink, but not at it.
    x = tf.constant([-1e-3, 2e-4, 0.3 + 5e-4, 0.3 - 2e-4, 1.5], dtype)
    report = fastcheck.check_gradients(f, x, precision=precision)
    assert report.ok, str(report)


def test_kink_at_the_point_reports_both_one_sided_derivatives():
    report = fastcheck.check_gradients(tf.nn.relu, tf.constant([-1.0, 0.0, 2.0], tf.float64))
    assert report.ok, str(report)  # TF's 0 at the kink is a valid one-sided derivative
    pair = report.pairs[0]
    assert pair.count("not differentiable here") == 1
    element, left, right = pair.kinks()[0]
    assert element.input_index == (1,) and (left, right) == pytest.approx((0.0, 1.0), abs=1e-6)
    assert "not differentiable at d output[1] / d input[1]" in str(report)


def test_wrong_value_at_a_kink_still_fails():
    @tf.custom_gradient
    def relu(x):
        return tf.nn.relu(x), lambda g: g * tf.where(x >= 0, 3.0 * tf.ones_like(x), tf.zeros_like(x))

    report = fastcheck.check_gradients(relu, tf.constant([-1.0, 0.0, 2.0], tf.float64))
    assert not report.ok and report.verdict == "fail"


@pytest.mark.parametrize("precision", PRECISIONS)
def test_log_and_sqrt_near_zero(precision):
    x = tf.constant([1e-4, 3e-4, 0.5], tf.float32)
    for f in (tf.math.log, tf.sqrt):
        report = fastcheck.check_gradients(f, x, precision=precision)
        assert report.ok, str(report)


def test_sharp_feature_far_below_the_step():
    f = lambda x: tf.tanh(x / 1e-5)  # noqa: E731
    x = tf.constant([-2e-5, 1e-6, 1.5e-5], tf.float32)
    assert fastcheck.check_gradients(f, x).ok
    assert fastcheck.check_gradients(f, x, precision="native").ok


def test_unresolved_numerics_are_undecidable_not_wrong():
    # A feature far below even the smallest refined step: say so instead of "wrong gradient".
    f = lambda x: tf.tanh((x - 0.3) / 1e-14)  # noqa: E731
    report = fastcheck.check_gradients(f, tf.constant([0.3, 0.5], tf.float64), eps=1e-2)
    assert not report.ok and report.verdict == "undecidable", str(report)
    assert report.pairs[0].count("numerical derivative unresolved") == 1
    assert "did not settle at any step tried" in report.pairs[0].hint


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
def test_large_magnitude_inputs(dtype_name):
    dtype = tf.as_dtype(dtype_name)
    x = tf.constant([1e4, -2.5e4, 3.3e4], dtype)
    assert fastcheck.check_gradients(lambda x: tf.sin(x) * x, x).ok
    assert fastcheck.check_gradients(lambda x: tf.sin(x) * x, x, precision="native").ok


def test_long_float32_reduction():
    x = tf.constant(np.random.default_rng(0).uniform(0.5, 1.5, size=2000), tf.float32)
    assert fastcheck.check_gradients(lambda x: tf.reduce_sum(x**2) * 1e3, x).ok
    assert fastcheck.check_gradients(lambda x: tf.reduce_sum(x**2) * 1e3, x, precision="native").ok
