"""Supplied gradients and whole models: pass when right, fail when planted wrong, lose nothing."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from conftest import events_of

import fastcheck

RNG = np.random.default_rng(7)


# ---------------------------------------------------------------- verify_gradients

def _loss(a, b):
    return tf.reduce_sum(tf.sin(a)) * tf.reduce_sum(b**2)


def _inputs(dtype):
    return [tf.constant(RNG.normal(size=(3, 2)), dtype), tf.constant(RNG.normal(size=4), dtype)]


def _true_grads(a, b):
    return [tf.cos(a) * tf.reduce_sum(b**2), 2 * b * tf.reduce_sum(tf.sin(a))]


# name -> gradients maker from the inputs, and whether it is right
SUPPLIED = {
    "exact": (_true_grads, True),
    "as_callable_result": (lambda a, b: tuple(_true_grads(a, b)), True),
    "first_sign_flipped": (lambda a, b: [-_true_grads(a, b)[0], _true_grads(a, b)[1]], False),
    "second_missing_factor_two": (lambda a, b: [_true_grads(a, b)[0], _true_grads(a, b)[1] / 2], False),
    "one_element_off": (lambda a, b: [_true_grads(a, b)[0] + tf.one_hot(1, 2, dtype=a.dtype) * 1e-2, _true_grads(a, b)[1]], False),
}


@pytest.mark.parametrize("name", sorted(SUPPLIED))
@pytest.mark.parametrize("as_callable", [False, True])
def test_verify_gradients(name, as_callable, dtype):
    make, right = SUPPLIED[name]
    inputs = _inputs(dtype)
    grads = make if as_callable else make(*inputs)
    report = fastcheck.verify_gradients(_loss, inputs, grads)
    assert report.ok == right, str(report)
    if name == "one_element_off":
        worst = report.pairs[0].worst_element
        assert worst.input_index[1] == 1 and report.pairs[1].ok


def test_verify_gradients_sums_tensor_outputs():
    x = tf.constant([0.5, 1.5], tf.float64)
    assert fastcheck.verify_gradients(lambda x: x**2, x, 2 * x).ok
    assert not fastcheck.verify_gradients(lambda x: x**2, x, x).ok
    assert fastcheck.GradientChecker().verify_gradients(lambda x: x**2, x, 2 * x).ok


@pytest.mark.parametrize(
    "grads, message",
    [
        ([tf.zeros((3, 2), tf.float64)], "one entry per input"),
        ([tf.zeros((3, 2), tf.float64), None], "grads for input 1 is None"),
        ([tf.zeros((2, 3), tf.float64), tf.zeros(4, tf.float64)], "grads for input 0 has shape \\(2, 3\\)"),
        ([tf.zeros((3, 2), tf.float64), "x"], "input 1"),
    ],
)
def test_verify_gradients_bad_grads(grads, message):
    with pytest.raises((ValueError, TypeError), match=message):
        fastcheck.verify_gradients(_loss, _inputs(tf.float64), grads)


# ---------------------------------------------------------------- check_model

class WrongGradientDense(keras.layers.Layer):
    """A Dense layer whose custom gradient drops the factor on its kernel."""

    def __init__(self, units, wrong=True):
        super().__init__()
        self.units, self.wrong = units, wrong

    def build(self, shape):
        self.kernel = self.add_weight(shape=(shape[-1], self.units), initializer="glorot_uniform", name="kernel")
        self.bias = self.add_weight(shape=(self.units,), initializer="random_normal", name="bias")

    def call(self, x):
        wrong = self.wrong

        @tf.custom_gradient
        def dense(x, kernel, bias):
            def grad(g):
                dk = tf.matmul(x, g, transpose_a=True)
                return tf.matmul(g, kernel, transpose_b=True), dk * (0.5 if wrong else 1.0), tf.reduce_sum(g, 0)

            return tf.matmul(x, kernel) + bias, grad

        return dense(x, self.kernel.value, self.bias.value)


class Exploding(keras.layers.Layer):
    """Raises once it has been called more than ``after`` times."""

    def __init__(self, after):
        super().__init__()
        self.after, self.calls = after, 0

    def call(self, x):
        self.calls += 1
        if self.calls > self.after:
            raise RuntimeError("layer exploded")
        return x


class Noisy(keras.layers.Layer):
    def call(self, x):
        return x + tf.random.normal(tf.shape(x), dtype=x.dtype)


def _keras3(*layers):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.BatchNormalization(), *layers, keras.layers.Dense(1)])
    model(np.zeros((1, 3), "float32"))
    return model


def _data():
    return RNG.normal(size=(6, 3)).astype("float32"), RNG.normal(size=(6, 1)).astype("float32")


def _snapshot(model):
    return [v.numpy().tobytes() for v in model.variables]


def test_keras3_model_passes_with_one_pair_per_variable():
    model = _keras3()
    before = _snapshot(model)
    report = fastcheck.check_model(model, keras.losses.MeanSquaredError(), _data())
    assert report.ok, str(report)
    assert [p.input_name for p in report.pairs] == [v.path for v in model.trainable_variables]
    assert all(p.output_name == "loss" for p in report.pairs)
    assert all(0 <= p.relative_norm_error < 1e-3 for p in report.pairs)
    assert _snapshot(model) == before


def test_keras3_model_with_wrong_layer_gradient_fails_and_is_restored():
    model = _keras3(WrongGradientDense(2))
    before = _snapshot(model)
    report = fastcheck.check_model(model, keras.losses.MeanSquaredError(), _data())
    assert not report.ok
    failing = [p.input_name for p in report.pairs if not p.ok]
    assert failing == [v.path for v in model.trainable_variables if "wrong_gradient_dense" in v.path and "kernel" in v.path]
    assert "factor of 0.5" in report.failures[0].hint
    assert _snapshot(model) == before


def test_model_exception_inside_check_restores_variables():
    model = _keras3(Exploding(after=3))
    before = _snapshot(model)
    with pytest.raises(Exception, match="layer exploded"):
        fastcheck.check_model(model, keras.losses.MeanSquaredError(), _data())
    assert _snapshot(model) == before


def test_nondeterministic_model_is_reported():
    report = fastcheck.check_model(_keras3(Noisy()), keras.losses.MeanSquaredError(), _data())
    assert not report.ok and "not deterministic" in str(report)


def test_non_trainable_variables_untouched_and_checked_only_when_passed():
    model = _keras3()
    moving = [v for v in model.non_trainable_variables]
    before = [v.numpy().tobytes() for v in moving]
    report = fastcheck.check_model(model, keras.losses.MeanSquaredError(), _data())
    assert not any("moving" in p.input_name for p in report.pairs)
    assert [v.numpy().tobytes() for v in moving] == before
    explicit = fastcheck.check_model(model, keras.losses.MeanSquaredError(), _data(), variables=[model.trainable_variables[0]])
    assert [p.input_name for p in explicit.pairs] == [model.trainable_variables[0].path]


def test_non_trainable_variable_named_in_variables_gets_its_true_gradient():
    # A tape does not watch a non-trainable variable: named in variables=, it is watched (its real
    # derivative, not tape.gradient's None read as 0 against a nonzero numerical one).
    model = _keras3()
    model(_data()[0], training=True)  # moving statistics away from their initial values
    moving_mean = next(v for v in model.non_trainable_variables if "moving_mean" in v.path)
    before = _snapshot(model)
    report = fastcheck.check_model(model, "mse", _data(), variables=[moving_mean])
    assert report.ok, str(report)
    assert np.abs(report.pairs[0].analytical).max() > 1e-3, str(report)
    assert [e.names for e in events_of(report, "FrozenChecked")] == [(report.pairs[0].input_name,)], report.notes
    assert _snapshot(model) == before


def test_variable_the_loss_does_not_use_has_zero_gradient():
    class TwoHeads(keras.Model):
        def __init__(self):
            super().__init__()
            self.used, self.aux = keras.layers.Dense(1), keras.layers.Dense(1)  # aux: not in this call

        def call(self, x, training=False):
            return self.used(x)

    model = TwoHeads()
    x, y = _data()
    model.aux(x)
    model(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = fastcheck.check_model(model, "mse", (x, y))
    assert report.ok, str(report)
    # the float64 copy leaves aux unbuilt too: Keras's warning about it is about fastcheck's copy, not the user's model
    assert not [w for w in caught if "build()" in str(w.message)], [str(w.message) for w in caught]
    assert [p.input_name for p in report.pairs] == [v.path for v in model.trainable_variables]
    assert not np.any(report.pairs[-1].analytical) and not np.any(report.pairs[-1].numerical)


def test_model_with_dropout_gets_its_float64_copy():
    # A clone numbers its seed generators afresh (seed_generator_1): matched by shape, not refused
    # (the refusal left a float32 numerical side, whose steps near ReLU kinks raised false alarms).
    model = _keras3(keras.layers.Dropout(0.2))
    report = fastcheck.check_model(model, "mse", _data())
    assert report.ok, str(report)
    assert any(e.copied for e in events_of(report, "ModelCopy")), report.notes


def test_keras3_weight_kept_from_build_is_refused_clearly():
    # self.k = self.kernel.value in build(): the stateless evaluation never moves it, and the check
    # read numerical 0 against the right tape gradient (a false alarm).
    class Cached(keras.layers.Layer):
        def build(self, shape):
            self.kernel = self.add_weight(shape=(shape[-1], 1), initializer="glorot_uniform", name="kernel")
            self.k = self.kernel.value

        def call(self, x):
            return tf.matmul(x, self.k)

    model = keras.Sequential([keras.Input((3,)), Cached()])
    before = _snapshot(model)
    with pytest.raises(ValueError, match=r"read the weight as the layer's attribute in call\(\)"):
        fastcheck.check_model(model, "mse", _data())
    assert _snapshot(model) == before


def test_frozen_model_is_named_as_such():
    model = _keras3()
    model.trainable = False
    with pytest.raises(ValueError, match=f"all {len(model.variables)} of its variables are frozen"):
        fastcheck.check_model(model, "mse", _data())


def test_tf_keras_model_right_and_wrong():
    x, y = _data()
    model = tf_keras.Sequential([tf_keras.layers.Dense(4, activation="tanh", input_shape=(3,)), tf_keras.layers.Dense(1)])
    before = _snapshot(model)
    assert fastcheck.check_model(model, tf_keras.losses.MeanSquaredError(), (x, y)).ok
    assert _snapshot(model) == before

    def wrong_loss(y_true, y_pred):  # gradient of the loss w.r.t. y_pred has a flipped sign
        @tf.custom_gradient
        def mse(p):
            return tf.reduce_mean((p - y_true) ** 2), lambda g: -g * 2 * (p - y_true) / tf.cast(tf.size(p), p.dtype)

        return mse(y_pred)

    report = fastcheck.check_model(model, wrong_loss, (x, y))
    assert not report.ok and len(report.failures) == 4
    assert _snapshot(model) == before


def test_tf_module_with_unnamed_variables():
    class Module(tf.Module):
        def __init__(self):
            self.w = tf.Variable(RNG.normal(size=(3, 2)))
            self.biases = [tf.Variable(np.zeros(2))]

        def __call__(self, x):
            return tf.tanh(x @ self.w + self.biases[0])

    x, y = _data()
    module = Module()
    report = fastcheck.GradientChecker().check_model(module, lambda t, p: tf.reduce_mean((p - t) ** 2), (x.astype("float64"), y.astype("float64")))
    assert report.ok, str(report)
    assert [p.input_name for p in report.pairs] == ["biases[0]", "w"]  # where the module keeps them
    assert report.pairs[1].analytical.shape == (1, 6)


def test_check_model_bad_arguments():
    with pytest.raises(TypeError, match="data must be a pair"):
        fastcheck.check_model(_keras3(), keras.losses.MeanSquaredError(), np.zeros((2, 3)))
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        fastcheck.check_model(_keras3(), None, _data())
    with pytest.raises(ValueError, match="does not belong to the model"):
        fastcheck.check_model(_keras3(), keras.losses.MeanSquaredError(), _data(), variables=[tf.Variable(1.0)])
    x, y = _data()
    for training in (False, True):  # the loss's own error, with the shapes involved: no raw traceback
        model = _keras3()
        before = _snapshot(model)
        with pytest.raises(ValueError, match=r"loss_fn\(y, model\(x, training=.*Incompatible shapes.*output shape\(s\) "
                                             r"\(6, 1\), y's \(5, 1\)"):
            fastcheck.check_model(model, "mse", (x, y[:5]), training=training)
        assert _snapshot(model) == before
