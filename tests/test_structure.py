"""Structured inputs: tf.nest structures kept as structures, wrt, sparse and ragged tensors."""

import collections

import numpy as np
import pytest
import tensorflow as tf

import fastcheck

RNG = np.random.default_rng(7)
PARAMS = {"dense": {"kernel": tf.constant(RNG.normal(size=(3, 2))), "bias": tf.constant([0.1, -0.2], tf.float64)}}
X = tf.constant(RNG.normal(size=(4, 3)))


def layer(params, x, n):
    assert isinstance(n, int)  # Python numbers stay Python numbers
    return tf.reduce_sum(tf.tanh(x @ params["dense"]["kernel"] + params["dense"]["bias"]) ** n)


@tf.custom_gradient
def leaky_bias(b):
    return b * 1.0, lambda g: 1.5 * g  # wrong: the derivative is 1


def test_dict_params_are_checked_leaf_by_leaf_and_named_by_path():
    report = fastcheck.check_gradients(layer, [PARAMS, X, 3])
    assert report.ok, str(report)
    assert [p.input_name for p in report.pairs] == ["input 0['dense']['bias']", "input 0['dense']['kernel']", "input 1"]


def test_a_wrong_gradient_in_a_structured_leaf_is_named_by_its_path():
    f = lambda p, x: tf.reduce_sum(tf.tanh(x @ p["dense"]["kernel"] + leaky_bias(p["dense"]["bias"])))  # noqa: E731
    report = fastcheck.check_gradients(f, [PARAMS, X])
    assert not report.ok
    assert [p.input_name for p in report.failures] == ["input 0['dense']['bias']"]
    assert "input 0['dense']['bias'][" in str(report)


@pytest.mark.parametrize("wrt", [[(0, "dense", "kernel")], ["input 0['dense']['kernel']"], [(0, "dense", "kernel"), 1]])
def test_wrt_selects_leaves_and_the_rest_pass_through_unchanged(wrt):
    seen = []

    def f(p, x, n):
        seen.append(type(p["dense"]["bias"]))
        return layer(p, x, n)

    report = fastcheck.check_gradients(f, [PARAMS, X, 2], wrt=wrt)
    assert report.ok, str(report)
    names = [p.input_name for p in report.pairs]
    assert names[0] == "input 0['dense']['kernel']" and ("input 1" in names) == (1 in wrt)
    jacobian = fastcheck.numerical_jacobian(f, [PARAMS, X, 2], wrt=wrt)
    assert jacobian[0][0].shape == (1, 6)


def test_nested_lists_are_structures_and_number_lists_are_arrays():
    pair = [tf.constant([1.0, 2.0], tf.float64), tf.constant([3.0, 4.0], tf.float64)]
    report = fastcheck.check_gradients(lambda xs: xs[0] * xs[1], [pair])
    assert report.ok and [p.input_name for p in report.pairs] == ["input 0[0]", "input 0[1]"]
    literal = fastcheck.check_gradients(lambda x: x * x, [[1.0, 2.0, 3.0]])  # one array argument, as numpy reads it
    assert literal.ok and [p.input_shape for p in literal.pairs] == [(3,)]


def test_namedtuples_keep_their_type():
    Point = collections.namedtuple("Point", "x y")
    report = fastcheck.check_gradients(lambda p: tf.sin(p.x) * p.y, Point(tf.constant([0.3], tf.float64),
                                                                           tf.constant([2.0], tf.float64)))
    assert report.ok and [p.input_name for p in report.pairs] == ["input.x", "input.y"]


def test_sparse_inputs_perturb_values_and_keep_indices():
    sparse = tf.sparse.from_dense(tf.constant([[0.0, 2.0, 0.5], [3.0, 0.0, 0.0]], tf.float64))
    report = fastcheck.check_gradients(lambda s: tf.sparse.reduce_sum(tf.sparse.map_values(tf.sin, s), axis=1), sparse)
    assert report.ok, str(report)
    assert report.pairs[0].input_name == "input.values" and report.pairs[0].input_shape == (3,)
    wrong = fastcheck.check_gradients(lambda s: tf.sparse.map_values(leaky_bias, s), sparse)
    assert not wrong.ok  # a sparse output is checked through its values


def test_ragged_inputs_and_outputs_use_flat_values():
    ragged = tf.ragged.constant([[1.0, 2.0], [3.0]], dtype=tf.float64)
    report = fastcheck.check_gradients(lambda r: tf.reduce_sum(r * r, axis=1), ragged)
    assert report.ok and report.pairs[0].input_name == "input.flat_values"
    np.testing.assert_allclose(report.pairs[0].analytical, [[2.0, 4.0, 0.0], [0.0, 0.0, 6.0]], atol=1e-12)
    wrong = fastcheck.check_gradients(lambda r: r * leaky_bias(tf.ones_like(r.flat_values))[0], ragged)
    assert wrong.ok  # d/dr of r * c is c: the constant's wrong gradient does not reach r
    assert not fastcheck.check_gradients(lambda r: tf.ragged.map_flat_values(leaky_bias, r), ragged).ok


def test_bad_wrt_names_the_inputs_and_the_fix():
    with pytest.raises(ValueError, match=r"wrt='nope' matches no input; the inputs are: input 0\['dense'\]\['bias'\]"):
        fastcheck.check_gradients(layer, [PARAMS, X, 3], wrt=["nope"])
    with pytest.raises(TypeError, match="not floating point"):
        fastcheck.check_gradients(layer, [PARAMS, X, 3], wrt=[2])
    with pytest.raises(TypeError, match="wrt entries are positions"):
        fastcheck.check_gradients(layer, [PARAMS, X, 3], wrt=[1.5])
