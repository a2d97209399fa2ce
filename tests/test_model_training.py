"""check_model(training=True): fixed dropout masks, batch statistics, state restored bit for bit; losses by name."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from conftest import events_of

import fastcheck
from fastcheck.testing import GradientTestCase

RNG = np.random.default_rng(7)
X = RNG.normal(size=(6, 3)).astype("float32")
Y = RNG.normal(size=(6, 1)).astype("float32")


class ScaledGradient(keras.layers.Layer):
    """The identity, whose custom gradient multiplies by ``factor`` (1.5: a planted defect)."""

    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def call(self, x):
        factor = self.factor

        @tf.custom_gradient
        def identity(y):
            return tf.identity(y), lambda dy: factor * dy

        return identity(x)


class NoisyInTraining(keras.layers.Layer):
    """Adds unseeded noise in training mode only: randomness no check can hold fixed."""

    def call(self, x, training=False):
        return x + tf.random.uniform(tf.shape(x)) if training else x


def _keras3(*middle, dropout=0.5):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.BatchNormalization(), keras.layers.Dropout(dropout, seed=1), *middle,
                              keras.layers.Dense(1)])
    model(X[:1])
    return model


def _state(model) -> dict:
    return {getattr(v, "path", v.name): v.numpy().tobytes() for v in model.variables}


def test_keras3_dropout_and_batch_norm_in_training_mode_pass_and_leave_state_bit_identical():
    model = _keras3()
    before = _state(model)
    assert any("seed_generator_state" in name for name in before)
    assert any("moving_mean" in name for name in before) and any("moving_variance" in name for name in before)
    report = fastcheck.check_model(model, keras.losses.MeanSquaredError(), (X, Y), training=True)
    assert report.ok, str(report)
    assert report.title == "check_model (training=True)"
    assert [p.input_name for p in report.pairs] == [v.path for v in model.trainable_variables]
    assert _state(model) == before
    # The training loss really differs from the inference loss: dropout and batch statistics are in play.
    masked = fastcheck.check_model(model, keras.losses.MeanSquaredError(), (X, Y))
    assert not np.allclose(report.pairs[0].analytical, masked.pairs[0].analytical)


def test_planted_defect_after_dropout_fails_in_training_mode():
    model = _keras3(ScaledGradient(1.5))
    before = _state(model)
    report = fastcheck.check_model(model, keras.losses.MeanSquaredError(), (X, Y), training=True)
    assert report.verdict == "fail", str(report)
    failing = {p.input_name for p in report.failures}
    # Every variable before the defective layer gets 1.5 times its gradient; the last Dense is right.
    last = {v.path for v in model.layers[-1].trainable_variables}
    assert failing == {v.path for v in model.trainable_variables} - last
    assert any("1.5" in p.hint for p in report.failures), str(report)
    assert _state(model) == before


def test_tf_keras_dropout_and_batch_norm_in_training_mode():
    model = tf_keras.Sequential([tf_keras.layers.Dense(4, activation="tanh", input_shape=(3,)),
                                 tf_keras.layers.BatchNormalization(), tf_keras.layers.Dropout(0.5),
                                 tf_keras.layers.Dense(1)])
    generator = model.layers[2]._random_generator
    before, rng_state = _state(model), (generator._rng_type, generator._seed)
    report = fastcheck.check_model(model, "mse", (X, Y), training=True, jit_compile=True)
    assert report.ok, str(report)
    # dropout masks never under XLA: the report says jit_compile=True was overridden
    assert report.path == "graph" and "xla failed for f (f draws random numbers" in str(report), str(report)
    assert "jit_compile=True overridden" in str(report), report.notes
    assert _state(model) == before and (generator._rng_type, generator._seed) == rng_state


def _two_in_two_out():
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    hidden = keras.layers.Dense(4, activation="tanh")(keras.layers.Concatenate()([a, b]))
    hidden = keras.layers.Dropout(0.3, seed=3)(hidden)
    regression = keras.layers.Dense(2, name="reg")(hidden)
    classes = keras.layers.Dense(3, activation="softmax", name="cls")(hidden)
    x = {"a": RNG.normal(size=(5, 3)).astype("float32"), "b": RNG.normal(size=(5, 2)).astype("float32")}
    y = {"reg": RNG.normal(size=(5, 2)).astype("float32"), "cls": np.eye(3, dtype="float32")[[0, 1, 2, 0, 1]]}
    return (a, b), (regression, classes), x, y


def test_multi_input_multi_output_with_sample_weight_and_loss_names():
    (a, b), (regression, classes), x, y = _two_in_two_out()
    weights = np.array([1.0, 2.0, 0.5, 1.0, 3.0], "float32")
    by_name = keras.Model({"a": a, "b": b}, {"reg": regression, "cls": classes})
    losses = {"reg": "mse", "cls": "categorical_crossentropy"}
    report = fastcheck.check_model(by_name, losses, (x, y), training=True, sample_weight=weights)
    assert report.ok, str(report)
    # The same model with list inputs and outputs, losses as objects, per-output weights: the same gradients.
    in_order = keras.Model([a, b], [regression, classes])
    objects = [keras.losses.MeanSquaredError(), keras.losses.CategoricalCrossentropy()]
    listed = fastcheck.check_model(in_order, objects, ([x["a"], x["b"]], [y["reg"], y["cls"]]), training=True,
                                   sample_weight=[weights, weights])
    assert listed.ok, str(listed)
    assert {p.input_name for p in report.pairs} == {p.input_name for p in listed.pairs}
    positional = {p.input_name: p.analytical for p in listed.pairs}
    for pair in report.pairs:
        np.testing.assert_allclose(pair.analytical, positional[pair.input_name], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name, loss", [("mse", keras.losses.MeanSquaredError()),
                                        ("mean_absolute_error", keras.losses.MeanAbsoluteError()),
                                        ("categorical_crossentropy", keras.losses.CategoricalCrossentropy())])
def test_loss_names_resolve_like_keras_loss_objects(name, loss):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    model(X[:1])
    targets = np.eye(2, dtype="float32")[[0, 1, 1, 0, 1, 0]]
    weights = np.arange(1.0, 7.0, dtype="float32")
    by_name = fastcheck.check_model(model, name, (X, targets), sample_weight=weights)
    by_object = fastcheck.check_model(model, loss, (X, targets), sample_weight=weights)
    assert by_name.ok, str(by_name)
    for a, b in zip(by_name.pairs, by_object.pairs):
        np.testing.assert_allclose(a.analytical, b.analytical, rtol=1e-6)
    unweighted = fastcheck.check_model(model, name, (X, targets))
    assert not np.allclose(unweighted.pairs[0].analytical, by_name.pairs[0].analytical)


def test_loss_misuse_is_explained():
    model = _keras3()
    with pytest.raises(ValueError, match=r"loss_fn='msee' is not a loss keras\.losses\.get knows.*such as 'mse'"):
        fastcheck.check_model(model, "msee", (X, Y), training=True)
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        fastcheck.check_model(model, 3, (X, Y))
    (a, b), (regression, classes), x, y = _two_in_two_out()
    two = keras.Model([a, b], [regression, classes])
    with pytest.raises(ValueError, match="without an entry for the model's output 'cls'"):
        fastcheck.check_model(two, {"reg": "mse"}, ([x["a"], x["b"]], [y["reg"], y["cls"]]))
    with pytest.raises(ValueError, match="2 outputs .* but y is a single value"):
        fastcheck.check_model(two, "mse", ([x["a"], x["b"]], y["reg"]))


def test_training_on_a_model_without_training_behaviour_is_the_inference_check():
    model = _dense()
    report = fastcheck.check_model(model, "mse", (X, Y), training=True)
    assert report.ok, str(report)
    assert [e.changes for e in events_of(report, "TrainingMode")] == [False], report.notes


def test_module_without_training_argument_refuses_training():
    class Module(tf.Module):
        def __init__(self):
            self.w = tf.Variable(RNG.normal(size=(3, 1)).astype("float32"))

        def __call__(self, x):
            return x @ self.w

    with pytest.raises(ValueError, match="takes no `training` argument"):
        fastcheck.check_model(Module(), "mse", (X, Y), training=True)


def test_unseeded_randomness_in_training_mode_is_undecidable_and_names_training():
    model = _keras3(NoisyInTraining())
    before = _state(model)
    report = fastcheck.check_model(model, "mse", (X, Y), training=True)
    assert report.verdict == "undecidable"
    assert "not deterministic" in str(report) and "training=True) is the likely cause" in str(report)
    assert _state(model) == before
    assert fastcheck.check_model(model, "mse", (X, Y)).ok


def _dense():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
    model(X[:1])
    return model


def test_training_passes_through_gradient_checker_and_plugin(gradcheck):
    model = _dense()
    checker = fastcheck.GradientChecker(precision="native")
    assert checker.check_model(model, "mse", (X, Y), training=True).title == "check_model (training=True)"
    assert gradcheck.check_model(model, "mse", (X, Y), training=True).title == "check_model (training=True)"
    assert gradcheck.check_model(model, "mse", (X, Y)).title == "check_model"


class TrainingModeTestCase(GradientTestCase, tf.test.TestCase):
    def test_assert_model_gradients_close_passes_training(self):
        model = _keras3(NoisyInTraining())
        self.assertModelGradientsClose(model, "mse", (X, Y))
        with self.assertRaisesRegex(AssertionError, "training=True"):
            self.assertModelGradientsClose(model, "mse", (X, Y), training=True)
