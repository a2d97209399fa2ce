"""Where f does not move, each pair's resolution, and checks that show nothing (public API only)."""

import numpy as np
import pytest
import tensorflow as tf

import fastcheck


@tf.custom_gradient
def straight_through_sign(x):
    return tf.sign(x), lambda dy: dy  # a surrogate gradient: sign's derivative is 0 almost everywhere


def _dead_relu(leak):
    @tf.custom_gradient
    def relu(x):
        return tf.nn.relu(x), lambda dy: dy * tf.where(x > 0, tf.ones_like(x), leak * tf.ones_like(x))

    return relu


@tf.custom_gradient
def _writes_where_f_does_not_depend(x):
    return 2.0 * x[:2], lambda dy: tf.concat([2.0 * dy, tf.ones([2], dy.dtype)], 0)


def _weights(seed, size=32, low=-0.5, high=0.5):
    return tf.constant(np.random.RandomState(seed).uniform(low, high, [size]), tf.float64)


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_a_straight_through_estimator_is_undecidable_and_a_defect_beside_it_fails(mode):
    w, v = _weights(0), _weights(1)
    correct = fastcheck.check_gradients(lambda w, v: tf.reduce_sum(0.1 * straight_through_sign(w) + tf.sin(v)),
                                        [w, v], mode=mode)
    assert correct.verdict == "undecidable", str(correct)
    assert [p.label for p in correct.pairs] == ["undec.", "ok"]
    assert "surrogate" in (correct.pairs[0].hint or "")

    @tf.custom_gradient
    def wrong_sin(v):
        return tf.sin(v), lambda dy: dy * tf.cos(v) * 1.01

    planted = fastcheck.check_gradients(lambda w, v: tf.reduce_sum(0.1 * straight_through_sign(w) + wrong_sin(v)),
                                        [w, v], mode=mode)
    assert planted.verdict == "fail"
    assert [p.label for p in planted.pairs] == ["undec.", "FAIL"]


def test_flat_elements_are_counted_in_the_pair():
    report = fastcheck.check_gradients(straight_through_sign, tf.constant([0.3, -0.2, 0.01, 1.5], tf.float32))
    assert report.verdict == "undecidable"
    assert report.pairs[0].to_dict()["flat"] == 4
    assert report.pairs[0].to_dict()["mismatches"] == 0


@pytest.mark.parametrize("x", [-0.2, -0.7, -3.0])
def test_a_dead_relu_whose_gradient_leaks_fails(x):
    """f is flat at the point, but moves steadily (not by a jump) with another slope once steps cross the kink."""
    report = fastcheck.check_gradients(_dead_relu(0.01), tf.constant([x, 0.8], tf.float64))
    assert report.verdict == "fail", str(report)
    assert report.pairs[0].to_dict()["mismatches"] == 1


def test_a_gradient_where_f_does_not_depend_fails():
    report = fastcheck.check_gradients(_writes_where_f_does_not_depend, tf.constant([0.3, -0.2, 0.5, 1.5], tf.float64))
    assert report.verdict == "fail", str(report)


def test_every_pair_states_its_resolution():
    x = tf.random.stateless_normal([6, 5], seed=[1, 2], dtype=tf.float64)
    full = fastcheck.check_gradients(tf.sin, x, mode="full")
    fast = fastcheck.check_gradients(lambda x: tf.reduce_sum(tf.sin(x)), x, mode="fast")
    for report in (full, fast):
        assert report.ok
        pair = report.pairs[0]
        assert 0 < pair.resolution < 1e-4
        assert pair.to_dict()["resolution"] == pytest.approx(pair.resolution)
        assert pair.to_dict()["coarse"] is False


def _noisy_float32(factor=1.0):
    """A float32 f whose value (1e4) dwarfs its gradient (~1): rounding swamps the first step's quotient."""
    weights = tf.constant(np.random.RandomState(3).uniform(0.5, 1.5, [200]), tf.float32)

    @tf.custom_gradient
    def f(x):
        return 1e4 + tf.reduce_sum(weights * x), lambda dy: dy * weights * factor

    return f, tf.constant(np.random.RandomState(4).uniform(-1, 1, [200]), tf.float32)


def test_a_pass_too_coarse_to_see_a_percent_error_is_sharpened_in_full_and_coloured_mode():
    # One stage of every element-wise mode (``block.stages``): coloured mode once left this pass undecidable
    # (resolution 0.33) where full mode sharpened it.
    f, x = _noisy_float32()
    full, coloured = (fastcheck.check_gradients(f, x, precision="native", mode=mode) for mode in ("full", "coloured"))
    for report in (full, coloured):
        assert report.ok, str(report)
        assert report.pairs[0].resolution <= 0.01
    assert coloured.pairs[0].resolution == full.pairs[0].resolution
    np.testing.assert_array_equal(coloured.pairs[0].statuses, full.pairs[0].statuses)


@pytest.mark.parametrize("mode", ["full", "coloured"])
def test_sharpening_never_passes_a_one_percent_defect(mode):
    f, x = _noisy_float32(1.01)
    report = fastcheck.check_gradients(f, x, precision="native", mode=mode)
    assert report.verdict != "pass", str(report)
    assert report.pairs[0].coarse and report.pairs[0].resolution > 0.01


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_fast_mode_never_passes_a_one_percent_defect_for_a_wide_band(seed):
    f, x = _noisy_float32(1.01)
    report = fastcheck.check_gradients(f, x, precision="native", mode="fast", seed=seed)
    assert report.verdict != "pass", str(report)
    pair = report.pairs[0]
    if report.verdict == "undecidable":
        assert pair.to_dict()["coarse"] and pair.resolution > 0.01


def test_a_check_of_nothing_warns():
    variable = tf.Variable(tf.ones([3], tf.float64))
    report = fastcheck.check_gradients(lambda *unused: tf.reduce_sum(variable**2), [tf.ones([3], tf.float64)])
    assert report.ok
    assert any("does not depend on any checked input" in w for w in report.warnings)
    assert not fastcheck.check_gradients(tf.sin, tf.ones([3], tf.float64)).warnings


@pytest.mark.parametrize("seed", [0, 1])
def test_fast_mode_sharpens_a_coarse_pass_of_a_correct_gradient(seed):
    f, x = _noisy_float32()
    report = fastcheck.check_gradients(f, x, precision="native", mode="fast", seed=seed)
    assert report.verdict != "fail", str(report)
    assert report.ok or report.pairs[0].coarse  # never a FAIL of a correct gradient; a pass when the ladder resolves it


def _head_beside_a_backbone(factor):
    """A 32-element head whose gradient (~2e-3) is small beside a 512-element input's, in one fast-mode group:
    the group's atol ||d||_2 resolves only ~2% of the head's gradient."""
    weights = np.random.RandomState(5).uniform(1.0, 3.0, [32]) * 1e-3

    @tf.custom_gradient
    def head(b):
        w = tf.constant(weights, b.dtype)  # in the input's dtype: the numerical side runs in float64
        return tf.reduce_sum(w * b), lambda dy: dy * w * factor

    return lambda a, b: tf.reduce_sum(tf.sin(a)) + head(b)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fast_mode_tests_a_small_gradient_on_its_own_probes(seed):
    a = tf.constant(np.random.RandomState(6).normal(size=[512]), tf.float32)
    b = tf.constant(np.random.RandomState(7).normal(size=[32]), tf.float32)
    correct = fastcheck.check_gradients(_head_beside_a_backbone(1.0), [a, b], mode="fast", seed=seed)
    assert correct.ok, str(correct)
    assert correct.pairs[1].resolution < 0.01
    planted = fastcheck.check_gradients(_head_beside_a_backbone(1.01), [a, b], mode="fast", seed=seed)
    assert planted.verdict == "fail", str(planted)
    assert [p.label for p in planted.pairs] == ["ok", "FAIL"]


def test_a_pass_as_coarse_as_its_tolerances_says_so():
    """A gradient of ~1e-4 in float32: atol (1e-5) alone resolves only ~6% of it; the pass stands, with a note."""
    w = tf.constant(np.random.RandomState(0).normal(size=[50]) * 1e-4, tf.float32)
    x = tf.constant(np.random.RandomState(1).normal(size=[50]), tf.float32)
    report = fastcheck.check_gradients(lambda x: tf.reduce_sum(w * tf.sin(x)), x)
    assert report.ok and report.tolerance_bound == report.pairs
    assert report.pairs[0].resolution > 0.01 and "pass a smaller atol" in str(report)
    assert fastcheck.check_gradients(lambda x: tf.reduce_sum(w * tf.sin(x)), x, atol=1e-9).tolerance_bound == []
    assert fastcheck.check_gradients(tf.sin, tf.constant([0.1, 0.2], tf.float64)).tolerance_bound == []
