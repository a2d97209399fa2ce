"""fastcheck.testing.GradientTestCase in tf.test.TestCase tests, eager and graph mode."""

import sys

import keras
import numpy as np
import tensorflow as tf

from fastcheck.testing import GradientTestCase

X = np.array([0.1, 0.5, 1.5])


@tf.custom_gradient
def wrong_tanh(x):
    y = tf.tanh(x)
    return y, lambda g: g * (1 + y * y)  # should be 1 - y * y


def tiny_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


DATA = (np.linspace(-1.0, 1.0, 12, dtype="float32").reshape(4, 3), np.ones((4, 2), "float32"))


class GradientTestCaseTest(GradientTestCase, tf.test.TestCase):
    def assert_fails_with_report(self, check):
        with self.assertRaises(AssertionError) as caught:
            check()
        message = str(caught.exception)
        self.assertRegex(message, r"^fastcheck .*: FAIL -- ")
        self.assertRegex(message, r"analytical=.* numerical=.* \(mismatch\)")

    def test_eager(self):
        report = self.assertGradientsClose(tf.tanh, X)
        self.assertEqual(report.verdict, "pass")
        self.assert_fails_with_report(lambda: self.assertGradientsClose(wrong_tanh, X))

    def test_graph_mode(self):
        with tf.Graph().as_default():
            self.assertFalse(tf.executing_eagerly())
            report = self.assertGradientsClose(tf.tanh, X)
            self.assertEqual(report.verdict, "pass")
            # Graph tensors among the inputs are evaluated first.
            self.assertEqual(self.assertGradientsClose(tf.tanh, [tf.constant(X)]).verdict, "pass")
            self.assert_fails_with_report(lambda: self.assertGradientsClose(wrong_tanh, X))

    def test_graph_mode_with_a_session(self):
        with tf.Graph().as_default(), self.session():
            self.assertEqual(self.assertGradientsClose(tf.sin, tf.constant(X) * 2.0).verdict, "pass")

    def test_graph_tensor_inside_f_is_explained(self):
        with tf.Graph().as_default():
            scale = tf.constant(2.0, tf.float64)
            with self.assertRaises(Exception) as caught:
                self.assertGradientsClose(lambda x: x * scale, X)
        if sys.version_info >= (3, 11):
            self.assertIn("must not use tensors or variables of that graph", "".join(caught.exception.__notes__))

    def test_model(self):
        report = self.assertModelGradientsClose(tiny_model(), keras.losses.MeanSquaredError(), DATA)
        self.assertEqual([p.input_name.split("/")[-1] for p in report.pairs], ["kernel", "bias"])
        model = tiny_model()  # built eagerly, as in setUp: a graph-mode test can check it
        with tf.Graph().as_default():
            report = self.assertModelGradientsClose(model, keras.losses.MeanSquaredError(), DATA)
        self.assertEqual(report.verdict, "pass")
        self.assert_fails_with_report(
            lambda: self.assertModelGradientsClose(model, lambda y, p: tf.reduce_sum(wrong_tanh(p - y)), DATA))
