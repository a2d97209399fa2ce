"""fastcheck.compute_gradient / max_error against tf.test.compute_gradient, and empty Jacobians."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.ops import gradient_checker_v2

import fastcheck

RNG = np.random.default_rng(7)


@tf.custom_gradient
def _wrong_square(x):
    return x * x, lambda g: g * 3.0 * x  # the derivative is 2x


# (f, x, tolerance on the values): ops across dtypes, one with several inputs, complex ones.
CASES = {
    "sin float32": (tf.sin, [tf.constant(RNG.normal(size=(3, 2)), tf.float32)], 1e-3),
    "tanh float64": (tf.tanh, [tf.constant(RNG.normal(size=5), tf.float64)], 1e-6),
    "matmul float32, two inputs": (tf.matmul, [tf.constant(RNG.normal(size=(2, 3)), tf.float32),
                                               tf.constant(RNG.normal(size=(3, 4)), tf.float32)], 1e-3),
    "mixed dtypes, python list": (lambda x, y: x * tf.cast(tf.reduce_sum(y), tf.float32),
                                  [[1.0, 3.0], tf.constant([0.5, 2.0], tf.float64)], 1e-3),
    "python float scalar": (lambda x: x ** 3, [2.0], 1e-2),
    "complex64": (lambda z: z * z + tf.math.conj(z), [tf.constant([1 + 2j, -0.5j], tf.complex64)], 1e-2),
    "complex128, real input": (lambda x, z: tf.exp(tf.complex(x, x) * z),
                               [tf.constant([0.3, -0.2], tf.float64), tf.constant([0.1 + 0.4j, 1j], tf.complex128)], 1e-6),
    "reduction": (lambda x: tf.reduce_logsumexp(x, axis=1), [tf.constant(RNG.normal(size=(2, 3)), tf.float64)], 1e-6),
}


def _layout(result):
    return (type(result), len(result), [(type(side), [(a.shape, a.dtype) for a in side]) for side in result])


@pytest.mark.parametrize("name", sorted(CASES))
def test_compute_gradient_matches_tf_structure_and_values(name):
    f, x, tolerance = CASES[name]
    ours = fastcheck.compute_gradient(f, x)
    theirs = tf.test.compute_gradient(f, x)
    assert _layout(ours) == _layout(theirs)
    assert all(isinstance(a, np.ndarray) and a.ndim == 2 for side in ours for a in side)
    theoretical, numerical = ours
    for ours_t, theirs_t in zip(theoretical, theirs[0]):  # both are reverse mode
        np.testing.assert_allclose(ours_t, theirs_t, rtol=1e-6, atol=1e-6)
    for ours_n, theirs_t in zip(numerical, theirs[0]):
        np.testing.assert_allclose(ours_n, theirs_t, rtol=tolerance, atol=tolerance)


def test_given_delta_matches_tf_numerical_jacobian():
    f = lambda z, w: tf.exp(z) * tf.math.conj(z) + tf.sin(w)  # noqa: E731
    x = [tf.constant([1 + 2j, 3j], tf.complex128), tf.constant([0.7, -1.2], tf.complex128)]
    ours = fastcheck.compute_gradient(f, x, delta=1e-3)
    theirs = tf.test.compute_gradient(f, x, delta=1e-3)
    assert _layout(ours) == _layout(theirs)
    for a, b in zip(ours[1], theirs[1]):  # the same differences, in float64 both
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("delta", [1e-2, 3e-3, 1e-3])
def test_given_delta_is_the_absolute_step(delta):
    # d/dx x**3 by central differences is 3x^2 + delta^2 exactly: at |x| = 4 an absolute step
    # gives delta^2, a relative one (delta * |x|) would give 16 delta^2.
    x = tf.constant([4.0, -4.0, 0.5], tf.float64)
    theoretical, numerical = fastcheck.compute_gradient(lambda x: x ** 3, [x], delta=delta)
    truncation = np.diag(numerical[0]) - np.diag(theoretical[0])
    np.testing.assert_allclose(truncation, delta ** 2, rtol=1e-3)
    assert not np.any(numerical[0] - np.diag(np.diag(numerical[0])))


def test_default_step_is_more_accurate_than_tfs_in_float32():
    x = [tf.constant(RNG.normal(size=6), tf.float32)]
    f = lambda x: tf.exp(x) * tf.sin(x)  # noqa: E731
    ours = fastcheck.max_error(*fastcheck.compute_gradient(f, x))
    theirs = gradient_checker_v2.max_error(*tf.test.compute_gradient(f, x))
    assert ours < 1e-6 < theirs


def test_max_error_equals_tfs():
    f, x, _ = CASES["matmul float32, two inputs"]
    theoretical, numerical = tf.test.compute_gradient(f, x)
    ours = fastcheck.max_error(theoretical, numerical)
    assert ours == gradient_checker_v2.max_error(theoretical, numerical)
    assert ours > 0
    shifted = [a + 0.25 for a in numerical]
    assert fastcheck.max_error(theoretical, shifted) == gradient_checker_v2.max_error(theoretical, shifted)
    empty = [np.zeros((0, 3)), np.zeros((2, 0))]
    assert fastcheck.max_error(empty, empty) == gradient_checker_v2.max_error(empty, empty) == 0


def test_wrong_custom_gradient_gives_a_large_max_error():
    x = [tf.constant([0.5, -1.5, 2.0], tf.float64)]
    error = fastcheck.max_error(*fastcheck.compute_gradient(_wrong_square, x))
    assert error == pytest.approx(2.0, rel=1e-6)  # |3x - 2x| at x = 2
    assert fastcheck.max_error(*fastcheck.compute_gradient(lambda x: x * x, x)) < 1e-8


def test_x_must_be_a_list_or_tuple():
    with pytest.raises(ValueError, match="list or tuple"):
        fastcheck.compute_gradient(tf.sin, tf.constant([0.5]))
    with pytest.raises(TypeError, match="int32"):
        fastcheck.compute_gradient(lambda x, n: x * tf.cast(n, tf.float32), [[0.5], tf.constant([2])])


def test_compute_gradient_accepts_a_tf_function():
    f = tf.function(lambda x, y: tf.reduce_sum(x * y))
    x = [tf.constant([1.0, 2.0], tf.float64), tf.constant([3.0, -1.0], tf.float64)]
    theoretical, numerical = fastcheck.compute_gradient(f, x)
    np.testing.assert_allclose(theoretical[0], [[3.0, -1.0]])
    np.testing.assert_allclose(numerical[1], [[1.0, 2.0]], rtol=1e-8)


def test_compute_gradient_in_graph_mode_runs_eagerly_on_the_side():
    x = np.array([0.2, -0.7], np.float64)
    with tf.Graph().as_default():
        theoretical, numerical = fastcheck.compute_gradient(tf.sin, [x])
    np.testing.assert_allclose(theoretical[0], np.diag(np.cos(x)), rtol=1e-12)
    np.testing.assert_allclose(numerical[0], np.diag(np.cos(x)), rtol=1e-8, atol=1e-10)


# Empty inputs and outputs: nothing to check, as tf.test.compute_gradient returns empty Jacobians.
EMPTY = {
    "empty input and output": (lambda x: tf.reshape(x, [-1, 0]), [tf.zeros([3, 0], tf.float64)]),
    "empty output": (lambda x: x[:0] * 2.0, [tf.constant([0.3, 0.4], tf.float64)]),
    "empty input": (lambda x: tf.reduce_sum(x, axis=1) + 1.0, [tf.zeros([2, 0], tf.float64)]),
}


@pytest.mark.parametrize("name", sorted(EMPTY))
def test_empty_jacobians_pass_with_a_note(name):
    f, x = EMPTY[name]
    report = fastcheck.check_gradients(f, x)
    assert report.ok and report.verdict == "pass" and not report.problems
    assert report.notes
    assert fastcheck.assert_gradients_close(f, x).ok
    theirs = tf.test.compute_gradient(f, x)
    assert _layout(fastcheck.compute_gradient(f, x)) == _layout(theirs)
    assert _layout(fastcheck.compute_gradient(f, x, delta=1e-3)) == _layout(theirs)
    shape = theirs[0][0].shape
    assert [p.numerical.shape for p in report.pairs] == [shape]
    assert fastcheck.numerical_jacobian(f, x)[0][0].shape == shape
    assert fastcheck.autodiff_jacobian(f, x)[0][0].shape == shape


def test_empty_and_nonempty_mix_checks_the_nonempty_pairs():
    x = [tf.zeros([3, 0], tf.float64), tf.constant([1.0, 2.0], tf.float64)]

    def f(empty, y):
        return tf.reduce_sum(empty) + y ** 2, empty * 2.0

    report = fastcheck.check_gradients(f, x)
    assert report.ok, str(report)
    assert len(report.notes) > len(fastcheck.check_gradients(lambda y: y ** 2, x[1]).notes)
    shapes = {p.title: p.numerical.shape for p in report.pairs}
    assert shapes == {"output[0] / input 0": (2, 0), "output[0] / input 1": (2, 2),
                      "output[1] / input 0": (0, 0), "output[1] / input 1": (0, 2)}
    checked = [p for p in report.pairs if p.numerical.size]
    np.testing.assert_allclose(checked[0].numerical, np.diag([2.0, 4.0]), rtol=1e-8)

    def wrong(empty, y):  # the non-empty pair is checked for real: a wrong gradient there fails
        return tf.reduce_sum(empty) + _wrong_square(y), empty * 2.0

    assert fastcheck.check_gradients(wrong, x).verdict == "fail"
    jacobians = fastcheck.numerical_jacobian(f, x)
    assert [[j.shape for j in row] for row in jacobians] == [[(2, 0), (2, 2)], [(0, 0), (0, 2)]]


def test_bfloat16_scalars_as_tensorflows_own_test_writes_them():
    """gradient_checker_v2_test's bfloat16 add: 0-d bfloat16 outputs read back on the eager path."""
    x, y = tf.constant(1.5, tf.bfloat16), tf.constant(0.5, tf.bfloat16)
    assert fastcheck.check_gradients(lambda x, y: x + y, [x, y]).ok
    theoretical, numerical = fastcheck.compute_gradient(lambda x, y: x + y, [x, y])
    assert [t.shape for t in theoretical] == [(1, 1), (1, 1)]
    assert fastcheck.max_error(theoretical, numerical) < 1e-2


def test_repeated_call_at_numpy_values_reuses_what_it_learnt():
    # TensorFlow's tests pass numpy arrays: new tensors on every call. Every call finds f's element-wise
    # structure (a few calls of f instead of 2n + m: fewer than n), and a call at other values differentiates
    # there.
    calls = []

    def f(x):
        calls.append(1)
        return tf.sin(x) * 2.0

    x = np.linspace(-1.0, 1.0, 15).reshape(3, 5)
    counts = []
    for _ in range(3):
        calls.clear()
        theoretical, numerical = fastcheck.compute_gradient(f, [x.copy()], delta=1e-3)
        counts.append(len(calls))
        np.testing.assert_allclose(np.diag(theoretical[0]), 2 * np.cos(x).reshape(-1), rtol=1e-12)
    assert max(counts) < x.size / 2, counts
    other = x + 0.5
    theoretical, numerical = fastcheck.compute_gradient(f, [other], delta=1e-3)
    np.testing.assert_allclose(np.diag(theoretical[0]), 2 * np.cos(other).reshape(-1), rtol=1e-12)
    np.testing.assert_allclose(np.diag(numerical[0]), 2 * np.cos(other).reshape(-1), rtol=1e-5)
