"""Gradient checks in a project's own test suite, written the way a user writes them.

Not collected by fastcheck's own test run (tests/conftest.py ignores this folder):
tests/test_examples.py runs it with pytest, as a user's CI would, and checks the outcomes
and the --fastcheck-report JSON.
"""

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from fastcheck.testing import GradientTestCase


@tf.custom_gradient
def softplus(x):
    """A custom op with a hand-written gradient: the kind of code that needs a gradient check."""

    def grad(upstream):
        return upstream * tf.sigmoid(x)

    return tf.math.softplus(x), grad


def small_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="tanh", name="hidden"),
                             keras.layers.Dense(2, name="head")], name="user_model")


def regression_data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(8, 4)).astype("float32"), rng.normal(size=(8, 2)).astype("float32")


# pytest style: the gradcheck fixture takes --fastcheck-device/-precision/-mode and records every check.


def test_custom_op_gradient(gradcheck):
    report = gradcheck.check(softplus, np.linspace(-3.0, 3.0, 12).reshape(3, 4))
    assert report


def test_model_gradients(gradcheck):
    assert gradcheck.check_model(small_model(), keras.losses.MeanSquaredError(), regression_data())


def test_model_gradients_in_training_mode(gradcheck):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="tanh", name="hidden"),
                              keras.layers.BatchNormalization(name="norm"), keras.layers.Dropout(0.3, name="drop"),
                              keras.layers.Dense(2, name="head")], name="training_model")
    assert gradcheck.check_model(model, "mse", regression_data(), training=True)


def test_bijector_log_det_jacobian(gradcheck):
    bijector = tfp.bijectors.Sigmoid()
    x = np.random.default_rng(1).normal(size=(5, 3))
    # tf.identity: a fresh tensor on every call, so the bijector's cache never answers for a perturbed x.
    report = gradcheck.check(lambda x: bijector.forward_log_det_jacobian(tf.identity(x), event_ndims=1), x)
    assert report


# tf.test.TestCase style, eager and graph mode.


class BijectorGradientTest(GradientTestCase, tf.test.TestCase):
    def test_eager(self):
        bijector = tfp.bijectors.Softplus()
        self.assertGradientsClose(lambda x: bijector.inverse(tf.identity(x)), np.array([0.5, 1.0, 2.0]))

    def test_graph_mode(self):
        with tf.Graph().as_default():
            x = tf.constant([0.5, 1.0, 2.0], tf.float64)  # a graph tensor: its value is taken with self.evaluate
            report = self.assertGradientsClose(tfp.bijectors.Exp().forward, x)
        self.assertEqual(report.verdict, "pass")

    def test_model(self):
        report = self.assertModelGradientsClose(small_model(), keras.losses.MeanSquaredError(), regression_data())
        self.assertEqual(len(report.pairs), 4)  # two kernels, two biases
