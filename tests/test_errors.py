"""Misuse gets a clear error; inputs are never left changed."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import events_of

import fastcheck


def test_non_callable():
    with pytest.raises(TypeError, match="f must be callable"):
        fastcheck.check_gradients(3.0, tf.constant(1.0))


def test_no_floating_inputs():
    with pytest.raises(TypeError, match="None of the inputs is floating point.*int32"):
        fastcheck.check_gradients(lambda x: tf.cast(x, tf.float32), tf.constant([1, 2]))


def test_returns_none():
    with pytest.raises(TypeError, match="returned None"):
        fastcheck.check_gradients(lambda x: None, tf.constant([1.0]))


def test_returns_non_tensor():
    with pytest.raises(TypeError, match="returned a str"):
        fastcheck.check_gradients(lambda x: "loss", tf.constant([1.0]))


def test_function_raises_is_reraised_with_context():
    def f(x):
        raise tf.errors.InvalidArgumentError(None, None, "boom inside f")

    with pytest.raises(ValueError, match="f raised InvalidArgumentError.*boom inside f") as raised:
        fastcheck.check_gradients(f, tf.constant([1.0]))
    assert isinstance(raised.value.__cause__, tf.errors.InvalidArgumentError)

    def g(x):  # f's own exception: itself, with a note
        raise RuntimeError("boom inside g")

    with pytest.raises(RuntimeError, match="boom inside g") as raised:
        fastcheck.check_gradients(g, tf.constant([1.0]))
    assert "fastcheck: f raised this" in "\n".join(raised.value.__notes__)


def test_output_shape_changes_under_perturbation():
    f = lambda x: tf.boolean_mask(x, x > 0.5)  # noqa: E731
    with pytest.raises(ValueError, match="output shape of f changed"):
        fastcheck.check_gradients(f, tf.constant([0.5, 0.2, 0.9], tf.float64))
    # Shorter when every element moves at once (the element-wise calls of the eager path): the same error.
    g = lambda x: x if float(tf.reduce_max(x)) < 9.99995 else x[:2]  # noqa: E731
    with pytest.raises(ValueError, match="output shape of f changed"):
        fastcheck.check_gradients(g, tf.constant([9.9999, 1.0, 2.0], tf.float64), eps=1e-3)


def test_mismatched_structure_of_inputs():
    with pytest.raises(ValueError, match="f raised TypeError"):
        fastcheck.check_gradients(lambda x, y: x * y, [tf.constant([1.0])])


def test_bad_options():
    with pytest.raises(ValueError, match="jit_compile"):
        fastcheck.check_gradients(tf.sin, tf.constant([1.0]), jit_compile="yes")
    with pytest.raises(ValueError, match="atol"):
        fastcheck.check_gradients(tf.sin, tf.constant([1.0]), atol=-1)
    with pytest.raises(ValueError, match="memory_budget"):
        fastcheck.check_gradients(tf.sin, tf.constant([1.0]), memory_budget=0)
    with pytest.raises(TypeError, match="inputs\\[0\\] is None"):
        fastcheck.check_gradients(tf.sin, [None])


def test_zero_size_input_is_a_trivially_passing_check():
    report = fastcheck.check_gradients(lambda x, y: tf.reduce_sum(x) + y, [tf.zeros([0], tf.float64), tf.constant(1.0, tf.float64)])
    assert report.ok
    assert report.pairs[0].numerical.shape == (1, 0)


def test_nondeterministic_function_is_reported_not_mismatched():
    report = fastcheck.check_gradients(lambda x: x + tf.random.normal(x.shape, dtype=x.dtype), tf.constant([1.0], tf.float64))
    assert not report.ok
    assert "not deterministic" in str(report)


@pytest.mark.parametrize("outcome", ["pass", "fail", "raise"])
def test_variable_input_keeps_its_exact_value(outcome):
    value = np.array([0.1, -2.5, 3.25], np.float32)
    variable = tf.Variable(value)

    @tf.custom_gradient
    def wrong(x):
        return tf.sin(x), lambda g: -g * tf.cos(x)

    f = {"pass": tf.sin, "fail": wrong, "raise": lambda x: (_ for _ in ()).throw(RuntimeError("fail"))}[outcome]
    if outcome == "raise":
        with pytest.raises(RuntimeError, match="fail"):  # f's own exception, as itself
            fastcheck.check_gradients(f, variable)
    else:
        assert fastcheck.check_gradients(f, variable).ok == (outcome == "pass")
    assert variable.numpy().tobytes() == value.tobytes()


def test_variable_modified_by_f_is_restored():
    variable = tf.Variable([1.0, 2.0], dtype=tf.float64)

    def f(x):
        variable.assign_add(tf.ones_like(variable))  # a bad side effect
        return x * 2.0

    fastcheck.check_gradients(f, variable)
    np.testing.assert_array_equal(variable.numpy(), [1.0, 2.0])


def test_rounding_level_jitter_is_a_note_not_nondeterminism():
    calls = []

    def f(x):
        calls.append(1)
        return tf.reduce_sum(x) * (1.0 + (len(calls) % 2) * 1e-15)

    report = fastcheck.check_gradients(f, tf.constant([1.0, 2.0], tf.float64), precision="native")
    assert "not deterministic" not in str(report)
    assert events_of(report, "CallNoise")[0].difference > 0, report.notes


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="TensorFlow's CPU kernels lack this gradient")
def test_a_gradient_op_that_fails_is_named_as_the_gradients():
    # TensorFlow has no CPU gradient for a dilated convolution: the error is the gradient's, not f's tracing.
    kernel = tf.constant(np.random.default_rng(0).normal(size=(3, 3, 2, 2)))
    x = tf.constant(np.random.default_rng(1).normal(size=(1, 12, 12, 2)))
    with pytest.raises(ValueError, match=r"f's reverse-mode gradient raised InvalidArgumentError \(op Conv2DBackpropInput\)"):
        fastcheck.check_gradients(lambda x: tf.nn.conv2d(x, kernel, 1, "VALID", dilations=2), x)


@pytest.mark.parametrize("jit_compile", [False, "auto"])
def test_a_custom_gradient_that_fails_is_named_as_the_gradients(jit_compile):
    # The custom gradient multiplies by a float32 constant: TensorFlow refuses it at the inputs themselves, so the
    # error is the gradient's (a training step fails the same way), not f's at a point a step away.
    @tf.custom_gradient
    def f(x):
        return tf.sin(x), lambda dy: dy * tf.cos(x) * tf.constant(1.0, tf.float32)

    with pytest.raises(ValueError, match=r"f's reverse-mode gradient raised InvalidArgumentError: .*\n.*custom "
                                         r"gradient's\) fails at these inputs") as raised:
        fastcheck.check_gradients(f, tf.constant(np.linspace(-1, 1, 6)), jit_compile=jit_compile)
    assert isinstance(raised.value.__cause__, tf.errors.InvalidArgumentError)
