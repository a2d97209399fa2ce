"""A value at a kink outside its settled one-sided derivatives fails; a gradient zero within the numerics passes by
its absolute bound (public API only)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import fastcheck


def _leaky(x):
    return tf.where(x > 0, x, 0.1 * x)


# (name, f, its one-sided derivatives at 0 (left, right)): each checked at 0 beside points where f is smooth.
KINKS = {"leaky_relu": (_leaky, (0.1, 1.0)), "abs": (tf.abs, (-1.0, 1.0)), "relu": (tf.nn.relu, (0.0, 1.0))}

# (kink, the gradient's value at 0, verdict): a value outside both one-sided derivatives is no subgradient (FAIL);
# one of them or any value between them passes ("not differentiable here").
KINK_CASES = [
    ("leaky_relu", 5.0, "fail"), ("leaky_relu", -1.0, "fail"), ("leaky_relu", 1.5, "fail"),
    ("leaky_relu", 0.0, "fail"),
    ("leaky_relu", 0.1, "pass"), ("leaky_relu", 1.0, "pass"), ("leaky_relu", 0.5, "pass"),
    ("abs", 2.0, "fail"), ("abs", -3.0, "fail"),
    ("abs", 0.0, "pass"), ("abs", 1.0, "pass"), ("abs", -1.0, "pass"), ("abs", 0.3, "pass"),
    ("relu", 2.0, "fail"), ("relu", -0.5, "fail"),
    ("relu", 0.0, "pass"), ("relu", 1.0, "pass"), ("relu", 0.5, "pass"),
]


def _with_gradient_at_zero(kink: str, value: float):
    """The kink's f with a custom gradient: its derivative off 0, ``value`` at 0."""
    f, (left, right) = KINKS[kink]

    @tf.custom_gradient
    def g(x):
        slope = tf.where(x > 0, tf.constant(right, x.dtype), tf.constant(left, x.dtype))
        return f(x), lambda dy: dy * tf.where(tf.equal(x, 0), tf.constant(value, x.dtype), slope)

    return g


@pytest.mark.parametrize("jit_compile", ["auto", True, False], ids=lambda j: f"jit={j}")
@pytest.mark.parametrize("dtype, precision", [(tf.float64, "auto"), (tf.float32, "auto"), (tf.float32, "native")],
                         ids=["float64", "float32", "float32-native"])
@pytest.mark.parametrize("kink, value, verdict", KINK_CASES)
def test_a_value_outside_a_kinks_settled_sides_fails_and_one_between_them_passes(kink, value, verdict, dtype,
                                                                                 precision, jit_compile):
    f = _with_gradient_at_zero(kink, value)
    x = tf.constant([0.0, 1.0, -1.0], dtype)
    left, right = KINKS[kink][1]
    reports = [fastcheck.check_gradients(f, x, jit_compile=jit_compile, precision=precision) for _ in range(2)]
    for report in reports:  # a repeat (compiled work cached) gives the same verdict
        assert report.verdict == verdict, str(report)
        (pair,) = report.pairs
        assert np.all(pair.statuses.ravel()[1:] == "ok"), str(report)  # the smooth elements pass
        if verdict == "pass":  # at the kink, or the central difference itself (abs: 0, relu: 0.5)
            assert pair.statuses[0, 0] in ("not differentiable here", "ok"), str(report)
        else:
            assert pair.statuses[0, 0] == "mismatch", str(report)
            assert pair.one_sided[(0, 0)] == pytest.approx((left, right), abs=1e-3), pair.one_sided
            assert pair.worst_element.input_index == (0,), str(report)
            assert "outside its settled one-sided derivatives" in str(report), str(report)


@pytest.mark.parametrize("mode", ["full", "coloured", "fast"])
@pytest.mark.parametrize("kink, value, verdict", [("leaky_relu", 5.0, "fail"), ("leaky_relu", 0.5, "pass"),
                                                  ("relu", 2.0, "fail"), ("abs", 1.0, "pass")])
def test_every_mode_gives_a_kinks_verdict(kink, value, verdict, mode):
    x = tf.constant([0.0, 1.0, -1.0, 2.0, 0.0], tf.float32)
    report = fastcheck.check_gradients(_with_gradient_at_zero(kink, value), x, mode=mode)
    assert report.verdict == verdict, str(report)


def test_kinks_closer_than_any_step_stay_undecidable_for_the_chain_rules_value_outside_their_sides():
    # f(w) = 1 + 2 relu(w - e) - relu(w + e): from outside a kink with sides 0 and 1, while the derivative at 0 (and
    # the tape's) is -1.  The kinks' offsets move the one-sided quotients by e/h at every step: no settled sides.
    e = 1e-14

    def f(w):
        return 1.0 + tf.reduce_sum(2.0 * tf.nn.relu(w - e) - tf.nn.relu(w + e))

    report = fastcheck.check_gradients(f, tf.zeros([3], tf.float64))
    assert report.verdict == "undecidable", str(report)
    assert set(report.pairs[0].statuses.ravel()) == {"kinks no step resolves"}, str(report)


# -- gradients zero within the numerics ------------------------------------------------------------------------------


class _PlantedScale(keras.layers.Layer):
    """``y = scale * x``, scale initialised to 1, whose custom gradient multiplies the scale's part by ``factor``."""

    def __init__(self, factor: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def build(self, shape):
        self.scale = self.add_weight(shape=(shape[-1],), initializer="ones", name="scale")

    def call(self, x):
        factor = self.factor

        @tf.custom_gradient
        def scaled(x, s):
            return x * s, lambda dy: (dy * s, factor * tf.reduce_sum(dy * x, axis=0))

        return scaled(x, self.scale.value)


def _dense_batch_norm_dropout_dense(factor: float | None = None):
    """Dense -> BatchNormalization -> Dropout -> Dense (-> a planted scale): batch normalization in training mode
    cancels the first Dense's bias, so its gradient is zero up to float32 rounding."""
    keras.utils.set_random_seed(1)
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(16, 5)).astype("float32"), rng.normal(size=(16, 2)).astype("float32")
    layers = [keras.Input((5,)), keras.layers.Dense(4), keras.layers.BatchNormalization(), keras.layers.Dropout(0.3),
              keras.layers.Dense(2)]
    model = keras.Sequential(layers + ([] if factor is None else [_PlantedScale(factor)]))
    return model, (x, y)


@pytest.mark.parametrize("factor", [None, 1.0, 1.01], ids=["model", "with a correct scale", "a 1% defect"])
def test_a_zero_gradient_passes_stating_its_bound_and_a_defect_beside_it_fails(factor):
    model, data = _dense_batch_norm_dropout_dense(factor)
    report = fastcheck.check_model(model, keras.losses.MeanSquaredError(), data, training=True)
    bias = next(p for p in report.pairs if p.input_name == model.layers[0].bias.path)
    assert np.max(np.abs(bias.analytical)) < bias.atol  # the cancelled gradient (not a pair resolving anything)
    assert bias.ok and bias.zero_bound is not None and 0 < bias.zero_bound < 1e-3, str(report)
    assert bias.to_dict()["zero_bound"] == pytest.approx(bias.zero_bound)
    assert report.zero_gradients == [bias], str(report)
    assert f"|d loss / d {bias.input_name}| <= {bias.zero_bound:.3g}" in str(report), str(report)
    others = [p for p in report.pairs if p is not bias]
    assert all(p.zero_bound is None for p in others), str(report)
    if factor == 1.01:
        assert report.verdict == "fail", str(report)
        assert [p.input_name for p in report.failures] == [model.layers[-1].scale.path], str(report)
    else:
        assert report.verdict == "pass", str(report)


def test_an_input_f_ignores_beside_one_it_uses_passes_by_its_bound():
    # float32 throughout: f's value (50) rounds every quotient of the ignored input to within its noise of 0.
    x = tf.constant(np.random.default_rng(2).normal(size=[8]), tf.float32)

    def f(used, ignored):
        return tf.reduce_sum(tf.sin(used)) + 50.0 + tf.reduce_sum(1e-3 * ignored) - tf.reduce_sum(1e-3 * ignored)

    report = fastcheck.check_gradients(f, [x, x], precision="native")
    assert report.verdict == "pass", str(report)
    used, ignored = report.pairs
    assert used.zero_bound is None and used.resolution < 1e-2, str(report)
    assert ignored.zero_bound is not None and report.zero_gradients == [ignored], str(report)
    assert "zero gradient within the numerical side's resolution" in str(report)
    assert report.tolerance_bound == [], str(report)


@pytest.mark.parametrize("case", ["resolved below atol", "swamped above atol"])
def test_a_small_nonzero_gradient_keeps_its_resolution(case):
    x = tf.constant(np.random.default_rng(3).normal(size=[20]), tf.float32)
    if case == "resolved below atol":
        # ~1e-6 with a float64 numerical side: the numerics resolve it as nonzero; atol bounds the pass, and says so.
        report = fastcheck.check_gradients(lambda x: tf.reduce_sum(1e-6 * tf.sin(x)), x)
        assert report.verdict == "pass" and report.pairs[0].zero_bound is None, str(report)
        assert report.tolerance_bound == report.pairs and report.zero_gradients == [], str(report)
    else:
        # ~3e-5 (above atol) under float32 rounding of f ~ 1e4: no step resolves it; a coarse pass, undecidable.
        w = tf.constant(np.random.default_rng(4).uniform(2e-5, 4e-5, [20]), tf.float32)
        report = fastcheck.check_gradients(lambda x: 1e4 + tf.reduce_sum(w * x), x, precision="native")
        assert report.verdict == "undecidable" and report.pairs[0].coarse, str(report)
        assert report.pairs[0].zero_bound is None and report.zero_gradients == [], str(report)
