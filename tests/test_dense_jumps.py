"""Jumps of f denser than any step resolves are f's shape, not noise that licenses wide steps.

A mean over many fixed draws, each switching branch at its own point, a floor over shifted copies, a sum of many
step functions: f is a staircase of jumps far closer together than a float32 step, smooth between them, and autodiff
gives the slope between them.  A step across hundreds of jumps measures their trend instead: no step may count as
evidence against the gradient there.  A planted 1% defect on an f that is smooth around x still fails.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import fastcheck

POINT = [0.7, 1.1, 1.6]


def _draws_mean(n: int, dtype, seed: int = 0):
    """The mean over n fixed draws of a * (1/s where u < 1/(1 + s**2), else s), one set of draws per element."""
    rng = np.random.default_rng(seed)
    u = tf.constant(rng.uniform(size=(n, len(POINT))), dtype)
    a = tf.constant(rng.normal(size=(n, len(POINT))), dtype)
    return lambda s: tf.reduce_mean(a * tf.where(u < 1 / (1 + s**2), 1 / s, s), axis=0)


def _floors(n: int, dtype, seed: int = 1):
    """sin(s) plus the mean of floor(10 s + c) / 10 over n shifts c: jumps 1 / (10 n) apart."""
    c = tf.constant(np.random.default_rng(seed).uniform(size=(n, 1)), dtype)
    return lambda s: tf.sin(s) + tf.reduce_mean(tf.floor(s * 10 + c), axis=0) / 10


def _steps(n: int, dtype, seed: int = 2):
    """s**2 plus a sum of n weighted unit steps at thresholds in (0, 2)."""
    rng = np.random.default_rng(seed)
    t = tf.constant(rng.uniform(0, 2, size=(n, 1)), dtype)
    w = tf.constant(rng.normal(1, 1, size=(n, 1)) / n, dtype)
    return lambda s: s**2 + tf.reduce_sum(tf.where(s > t, w, tf.zeros_like(w)), axis=0)


CORRECT = {
    f"{name} {dtype.name}": (make, dtype)
    for dtype in (tf.float32, tf.float64)
    for name, make in [("mean of 2000 draws", lambda d: _draws_mean(2000, d)),
                       ("mean of 200000 draws", lambda d: _draws_mean(200000, d)),
                       ("floor staircase", lambda d: _floors(100000, d)),
                       ("sum of step functions", lambda d: _steps(100000, d))]
}


def _scaled(f, factor: float):
    """f with its gradient (autodiff's) multiplied by ``factor``."""
    @tf.custom_gradient
    def g(s):
        def grad(dy):
            with tf.GradientTape() as tape:
                tape.watch(s)
                y = f(s)
            return tape.gradient(y, s, dy) * factor

        return f(s), grad

    return g


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_correct_gradient_of_dense_jumps_is_never_a_fail(name):
    make, dtype = CORRECT[name]
    report = fastcheck.check_gradients(make(dtype), tf.constant(POINT, dtype))
    assert report.verdict != "fail", str(report)
    assert not any(pair.count("mismatch") for pair in report.pairs), str(report)


def test_the_staircase_mean_of_the_issue_does_not_fail_nor_crash():
    rng = np.random.default_rng(0)
    u = tf.constant(rng.uniform(size=200000), tf.float32)
    a = tf.constant(rng.normal(size=200000), tf.float32)
    report = fastcheck.check_gradients(lambda s: tf.reduce_mean(a * tf.where(u < 1 / (1 + s**2), 1 / s, s)),
                                       tf.constant([0.7], tf.float32))
    assert report.verdict != "fail", str(report)


def test_wide_steps_across_dense_jumps_are_no_evidence():
    # A floor staircase in float32: every step the ladder takes crosses jumps 1e-6 apart, each ~8 roundings of f;
    # the steps' quotients agree on the jumps' trend (cos s + 1), not on autodiff's cos s.  Once the jumps are seen
    # the elements are undecidable, never mismatches.
    report = fastcheck.check_gradients(_floors(100000, tf.float32), tf.constant(POINT, tf.float32))
    assert report.verdict == "undecidable", str(report)
    assert report.pairs[0].count("f jumps here") == len(POINT), str(report)


@pytest.mark.parametrize("jit_compile", [True, False, "auto"])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_a_one_percent_defect_on_a_smooth_f_fails_naming_the_element(jit_compile, dtype):
    f = _scaled(lambda s: tf.sin(s) * s, 1.01)
    verdicts = []
    for _ in range(2):  # and again, from the cached kernels
        report = fastcheck.check_gradients(f, tf.constant(POINT, dtype), jit_compile=jit_compile)
        assert report.verdict == "fail", str(report)
        assert report.pairs[0].count("mismatch") == len(POINT), str(report)
        assert "d output[0] / d input[0]" in str(report), str(report)
        verdicts.append([pair.statuses.tolist() for pair in report.pairs])
    assert verdicts[0] == verdicts[1]


@pytest.mark.parametrize("jit_compile", [True, False, "auto"])
def test_dense_jumps_get_one_verdict_on_every_path(jit_compile):
    report = fastcheck.check_gradients(_floors(100000, tf.float32), tf.constant(POINT, tf.float32),
                                       jit_compile=jit_compile)
    assert report.verdict == "undecidable", str(report)
    assert report.pairs[0].count("f jumps here") == len(POINT), str(report)


def test_one_failing_element_gets_no_factor_hint_and_several_do():
    f = _scaled(lambda s: tf.sin(s) * s, 1.5)
    one = fastcheck.check_gradients(f, tf.constant([0.7], tf.float64))
    assert one.verdict == "fail", str(one)
    assert "factor" not in (one.pairs[0].hint or ""), str(one)
    several = fastcheck.check_gradients(f, tf.constant(POINT, tf.float64))
    assert "constant factor of 1.5" in several.pairs[0].hint, str(several)


def test_the_issue_staircase_says_f_jumps_near_x_and_how_near():
    # Its noise (8% of f) swamps every step; no larger step resolves the pass: the jumps are what the report names,
    # with the distance to the nearest one found, not a pass too coarse for 1%.
    rng = np.random.default_rng(0)
    u = tf.constant(rng.uniform(size=200000), tf.float32)
    a = tf.constant(rng.normal(size=200000), tf.float32)
    report = fastcheck.check_gradients(lambda s: tf.reduce_mean(a * tf.where(u < 1 / (1 + s**2), 1 / s, s)),
                                       tf.constant([0.7], tf.float32))
    pair = report.pairs[0]
    assert report.verdict == "undecidable", str(report)
    assert pair.count("f jumps here") == 1 and not pair.coarse, str(report)
    (distance,) = pair.jumps.values()
    assert 0 < distance < 1e-3, str(report)
    assert f"(f jumps here: a jump within {distance:.2g} of x)" in str(report), str(report)
    assert pair.hint.startswith(f"f jumps within {distance:.2g} of the point"), str(report)
    assert "jumps at the point" not in pair.hint, str(report)


def test_dense_jumps_name_the_nearest_jump_on_every_element():
    report = fastcheck.check_gradients(_floors(100000, tf.float32), tf.constant(POINT, tf.float32))
    pair = report.pairs[0]
    assert len(pair.jumps) == len(POINT), str(report)
    assert all(0 < d < 1e-2 for d in pair.jumps.values()), str(report)
    assert str(report).count("(f jumps here: a jump within") == len(POINT), str(report)
    assert pair.hint.startswith(f"f jumps within {min(pair.jumps.values()):.2g} of the point"), str(report)


def _expected(f, slope):
    """f with the gradient ``slope(s)``: the slope of f's trend, not f's own."""
    @tf.custom_gradient
    def g(s):
        return f(s), lambda dy: dy * slope(s)

    return g


SECANT = "the gradient matches f's secant over wide steps but not its local slope"
# A gradient of the trend of an f with fine structure the wide steps average out: not f's derivative, and the hint
# says what it is instead of a factor.
TREND_GRADIENTS = {
    "fast oscillation": (lambda: lambda s: s + 1e-3 * tf.sin(1e4 * s), lambda s: tf.ones_like(s)),
    "floor staircase": (lambda: _floors(100000, tf.float64), lambda s: tf.cos(s) + 1),
}


@pytest.mark.parametrize("name", sorted(TREND_GRADIENTS))
def test_a_gradient_of_f_s_trend_is_named_so_and_does_not_pass(name):
    make, slope = TREND_GRADIENTS[name]
    report = fastcheck.check_gradients(_expected(make(), slope), tf.constant(POINT, tf.float64))
    assert report.verdict == "fail", str(report)
    assert report.pairs[0].hint.startswith(SECANT), str(report)
    assert "factor" not in report.pairs[0].hint, str(report)


# Planted defects of smooth f keep the hints their evidence gives; a wide step's truncation is no secant evidence.
PLANTED = {
    "factor": (1.5, "constant factor of 1.5"),
    "sign": (-1.0, "wrong sign"),
}


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_defects_keep_their_hints(name, dtype):
    factor, hint = PLANTED[name]
    report = fastcheck.check_gradients(_scaled(lambda s: tf.sin(s) * s, factor), tf.constant(POINT, dtype))
    assert report.verdict == "fail", str(report)
    assert hint in report.pairs[0].hint and SECANT not in report.pairs[0].hint, str(report)
