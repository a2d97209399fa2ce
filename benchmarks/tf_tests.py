"""``python -m benchmarks tf_tests``: TensorFlow's own gradient tests, as TensorFlow writes them.

Each case is one gradient check of a TensorFlow test file -- its function, shapes,
dtypes, values or seeds, step (``delta``) and tolerance -- written in the form
TensorFlow's suites use: ``gradient_checker_v2.compute_gradient(f, [x])`` and then
``max_error`` (or ``assertAllClose``) against the test's own bound.  Each case's ``source``
names its file::Class.method.  Two groups of correct cases, summarised apart:

*tuned* -- the cases used while tuning fastcheck:

* ``tensorflow/python/ops/gradient_checker_v2_test.py`` (GradientCheckerTest, MiniMNISTTest)
* ``tensorflow/python/ops/nn_grad_test.py`` (its v1 checks ported to the v2 call: f of the
  placeholder, the placeholder's random initial value drawn from a fixed seed, since the
  v1 checker draws it unseeded)
* ``tensorflow/python/kernel_tests/math_ops/cwise_ops_unary_test.py`` (testFloatBasic and
  testDoubleBasic: every op with a gradient, at the test's x, y, z, w and k, its delta
  -- 1e-3 in float32, 1e-5 in float64 -- and ``assertAllClose(jacob_t, jacob_n)`` at
  the file's ``_default_tolerance``: 1e-3 in float32, 1e-5 in float64)

*held-out* -- test files not used while tuning fastcheck (v1 checks ported the same way, at
the v1 checker's default delta of 1e-3 where the test passes none; draws the test makes
unseeded come from a fixed seed):

* ``tensorflow/python/kernel_tests/math_ops/cwise_ops_binary_test.py`` (BinaryOpTest:
  ``_compareGradientX/Y`` of ``1.1 * op(x, y)`` in testFloatBasic/testDoubleBasic -- add, subtract,
  multiply, truediv, atan2, and igamma, igammac, zeta, polygamma in float32 -- three testBCast_*
  pairs, testComplexPowGrad and testZeroPowGrad)
* ``tensorflow/python/kernel_tests/nn_ops/relu_op_test.py`` (testGradientFloat32/64 and
  testGradGradFloat32/64 of relu, relu6, leaky_relu, elu, selu)
* ``tensorflow/python/kernel_tests/math_ops/reduction_ops_test.py`` (testGradient of sum, mean,
  euclidean norm; prod's testGradientWithZeros; delta=1 as the file's ``_compareGradient``)
* ``tensorflow/python/kernel_tests/linalg/linalg_grad_test.py`` (matrix_solve and
  triangular_solve, both arguments, delta = eps^(1/3); DetGradSingularMatrixTest's numerical checks)
* ``tensorflow/python/kernel_tests/nn_ops/pooling_ops_3d_test.py`` (max_pool3d and avg_pool3d,
  the pool and its gradient as a function of the upstream gradient)

A TF check may fail on this TensorFlow itself: nn_grad_test's selu grad-of-grad checks, and
DetGradSingularMatrixTest's complex determinants (their test is newer than TF 2.21, whose
complex det gradient is wrong); complex64 pow(-2, y) at delta=1e-3 fails on the noise of
tf.test.compute_gradient's complex64 differences, the gradient being right.

*Planted defects* (``defect_cases``, their own section of the report, never in the speed
summary): functions of the same kinds -- unary ops, a batch matmul, a solve, a conv, a softmax,
a reduction, atan2 -- with a ``tf.custom_gradient`` whose VJP is deliberately wrong (one element
scaled by 1.01 or 1.001, a constant added, two elements swapped, a term dropped, the wrong sign for
negative inputs, a transpose forgotten), each under the check of the TF test it is modelled on.
Each contender runs each once: *caught* where the assertion fails (tf, drop-in) or ``report.ok``
is False (verdict).

Three contenders per case, side by side in one process:

* ``tf``: ``tf.test.compute_gradient`` + ``max_error`` / the test's assertion;
* ``drop-in``: ``fastcheck.compute_gradient`` (the same arguments, ``delta`` included) +
  the same assertion;
* ``verdict``: ``fastcheck.check_gradients(f, xs)`` (its own rule; ``report.ok``; the report's text, which
  only a failing test prints, is composed after the timing).

Each is timed twice per case: on fresh function objects ("fresh": what a test suite
pays, every test building its own f; the fastest of ``FRESH_REPEATS`` = 3, each run a new
object) after a warm-up case has run every contender once,
and again on the same function ("warm": a repeated check, fastcheck's kernels cached; the
fastest of ``WARM_REPEATS`` = 7 runs, the contenders taking turns).
The table gives the seconds, the ratios fastcheck / tf (below 1: fastcheck is faster),
their median and the ratio of the totals, group by group, with the CPU model and the load average.

    python -m benchmarks tf_tests [--only SUBSTRING[,SUBSTRING]] [--group tuned,held-out,defect] [--out DIR]
    python -m benchmarks tf_tests --once [--only ...]   # each case checked once, as a suite runs it (tf_tests_once.md)
    python -m benchmarks tf_tests --cold --only ...   # each check the first of a fresh process (tf_tests_cold.md)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"

GC_V2 = "tensorflow/python/ops/gradient_checker_v2_test.py"
NN_GRAD = "tensorflow/python/ops/nn_grad_test.py"
UNARY = "tensorflow/python/kernel_tests/math_ops/cwise_ops_unary_test.py"
BINARY = "tensorflow/python/kernel_tests/math_ops/cwise_ops_binary_test.py"
RELU = "tensorflow/python/kernel_tests/nn_ops/relu_op_test.py"
REDUCTION = "tensorflow/python/kernel_tests/math_ops/reduction_ops_test.py"
LINALG = "tensorflow/python/kernel_tests/linalg/linalg_grad_test.py"
POOL3D = "tensorflow/python/kernel_tests/nn_ops/pooling_ops_3d_test.py"

TUNED, HELD_OUT, DEFECT = "tuned", "held-out", "defect"
GROUPS = (TUNED, HELD_OUT)  # correct cases, timed and summarised group by group


@dataclass
class Case:
    name: str
    source: str  # file::Test.method
    make: object  # () -> (f, xs): a fresh function object and its arguments each call
    check: object  # (theoretical, numerical) -> bool: the test's own assertion
    bound: str  # the assertion, in words
    delta: float | None = None  # as the test passes it (None: TensorFlow's default, 1/1024)
    notes: list = field(default_factory=list)
    group: str = TUNED  # TUNED: used while tuning fastcheck; HELD_OUT: not; DEFECT: a planted wrong gradient


def _max_below(bound: float):
    def check(theoretical, numerical) -> bool:
        return _max_error(theoretical, numerical) < bound  # NaN is never below

    return check


def _max_error(theoretical, numerical) -> float:
    from tensorflow.python.ops import gradient_checker_v2

    return float(gradient_checker_v2.max_error(theoretical, numerical))


def _all_close(tol: float):
    """``assertAllClose(jacob_t, jacob_n, rtol=tol, atol=tol)``: |a - b| <= atol + rtol |b|, NaN never close."""

    def check(theoretical, numerical) -> bool:
        return all(np.allclose(t, n, rtol=tol, atol=tol) for t, n in zip(theoretical, numerical))

    return check


# -- gradient_checker_v2_test.py ------------------------------------------------------------


def _gc_v2_cases() -> list[Case]:
    import tensorflow as tf

    cases = []

    def add(name, method, make, check, bound, delta=None):
        cases.append(Case(name, f"{GC_V2}::{method}", make, check, bound, delta))

    def sparse_reshape():
        def sparse_tensor_reshape(values):
            sparse = tf.SparseTensor(indices=[[0, 0], [1, 2]], values=values, dense_shape=[3, 4])
            return tf.sparse.reshape(sparse, shape=(12,)).values

        return sparse_tensor_reshape, [tf.constant(2.0, shape=(2,))]

    add("sparse_tensor_reshape", "GradientCheckerTest.testSparseTensorReshape", sparse_reshape, _max_below(1e-4),
        "max_error < 1e-4")

    def static_shape():
        constant = tf.constant(2.0, shape=(2, 3))

        def add_constant_with_static_shape_check(x):
            assert x.shape.as_list() == constant.shape.as_list()
            return x + constant

        return add_constant_with_static_shape_check, [tf.constant(3.0, shape=(2, 3))]

    add("with_static_shape", "GradientCheckerTest.testWithStaticShape", static_shape, _max_below(1e-4), "max_error < 1e-4")

    def add_simple():
        x2 = tf.constant(3.0, shape=(2, 3))
        return (lambda x1: tf.add(x1, x2)), [tf.constant(2.0, shape=(2, 3))]

    add("add_simple", "GradientCheckerTest.testAddSimple", add_simple, _max_below(1e-4), "max_error < 1e-4")

    def arguments_as_tuple():
        f, xs = add_simple()
        return f, tuple(xs)

    add("arguments_as_tuple", "GradientCheckerTest.testWithArgumentsAsTuple", arguments_as_tuple, _max_below(1e-4),
        "max_error < 1e-4")

    def bfloat16():
        x2 = tf.constant(3.0, dtype="bfloat16")
        return (lambda x1: tf.add(x1, x2)), [tf.constant(2.0, dtype="bfloat16")]

    add("bfloat16_add", "GradientCheckerTest.testBfloat16", bfloat16, _max_below(0.07), "max_error < 0.07", delta=0.1)

    def add_customized():
        x1 = tf.constant(2.0, shape=(2, 3), dtype=tf.float64)
        return (lambda x2: tf.add(x1, x2)), [np.asarray(np.arange(6, dtype=np.float64).reshape(2, 3))]

    add("add_customized", "GradientCheckerTest.testAddCustomized", add_customized, _max_below(1e-10),
        "max_error < 1e-10", delta=1e-2)

    def gather():
        def f(params):
            return tf.gather(params, tf.constant([1, 3]))

        return f, [tf.constant(np.arange(8).astype(np.float64), shape=(4, 2))]

    add("gather", "GradientCheckerTest.testGather", gather, _max_below(1e-4), "max_error < 1e-4")

    def nested_gather():
        def f(params):
            y = tf.gather(params, tf.constant([1, 3, 5, 6]))
            return tf.gather(y, tf.constant([0, 2]))

        return f, [tf.constant(np.arange(16).astype(np.float64), shape=(8, 2))]

    add("nested_gather", "GradientCheckerTest.testNestedGather", nested_gather, _max_below(1e-4), "max_error < 1e-4")

    def random_complex(shape, dtype, seed):
        rng = np.random.RandomState(seed)  # the test draws from np.random unseeded
        data = rng.random_sample(shape).astype(dtype.as_numpy_dtype)
        data.imag = rng.random_sample(shape)
        return data

    def complex_mul():
        c = tf.constant(5 + 7j, dtype=tf.complex64)
        return (lambda x: c * x), [tf.constant(random_complex((), tf.complex64, 0))]

    add("complex_mul", "GradientCheckerTest.testComplexMul", complex_mul, _max_below(3e-4), "max_error < 3e-4")

    def complex_conj():
        return (lambda x: tf.math.conj(x)), [tf.constant(random_complex((), tf.complex64, 1))]

    add("complex_conj", "GradientCheckerTest.testComplexConj", complex_conj, _max_below(2e-5), "max_error < 2e-5")

    def grad_grad():
        def f(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = tf.square(x)
                z = tf.square(y)
            return tape.gradient(z, x)

        return f, [2.0]

    def grad_grad_check(theoretical, numerical) -> bool:
        return bool(np.array_equal(np.asarray(theoretical), [[[48.0]]])
                    and np.allclose(np.asarray(numerical), [[[48.0]]], rtol=1e-4, atol=1e-6))

    add("grad_grad", "GradientCheckerTest.testGradGrad", grad_grad, grad_grad_check,
        "analytical == 48, assertAllClose(numerical, 48, rtol=1e-4)")

    # MiniMNISTTest._BuildAndTestMiniMNIST: np.random.seed(6), batch 3, 16 inputs, 32 features, 10 classes
    def mnist(param_index):
        def make():
            np.random.seed(6)
            batch, inputs, features, classes = 3, 16, 32, 10
            inp_data = np.random.random_sample(inputs * batch)
            hidden_weight_data = np.random.randn(inputs * features) / np.sqrt(inputs)
            hidden_bias_data = np.random.random_sample(features)
            sm_weight_data = np.random.randn(features * classes) / np.sqrt(features)
            sm_bias_data = np.random.random_sample(classes)
            label_data = np.random.random(batch * classes).reshape((batch, classes))
            label_data /= label_data.sum(axis=1)[:, None]
            params = [tf.constant(inp_data.tolist(), shape=[batch, inputs], dtype=tf.float64),
                      tf.constant(hidden_weight_data.tolist(), shape=[inputs, features], dtype=tf.float64),
                      tf.constant(hidden_bias_data.tolist(), shape=[features], dtype=tf.float64),
                      tf.constant(sm_weight_data.tolist(), shape=[features, classes], dtype=tf.float64),
                      tf.constant(sm_bias_data.tolist(), shape=[classes], dtype=tf.float64)]

            def f(inp, hidden_weight, hidden_bias, softmax_weight, softmax_bias):
                features_ = tf.nn.relu(tf.compat.v1.nn.xw_plus_b(inp, hidden_weight, hidden_bias))
                logits = tf.compat.v1.nn.xw_plus_b(features_, softmax_weight, softmax_bias)
                labels = tf.constant(label_data.tolist(), shape=[batch, classes], dtype=tf.float64)
                return tf.nn.softmax_cross_entropy_with_logits(labels=labels, logits=logits)

            def f_restricted(x):
                xs = params[0:param_index] + [x] + params[param_index + 1 :]
                return f(*xs)

            return f_restricted, [params[param_index]]

        return make

    for index, tag in enumerate(["input", "hidden_weight", "hidden_bias", "softmax_weight", "softmax_bias"]):
        method = "".join(part.title() for part in tag.split("_"))
        add(f"mini_mnist_{tag}", f"MiniMNISTTest.test{method}Gradient", mnist(index), _max_below(1e-8),
            "max_error < 1e-8", delta=1e-5)
    return cases


# -- nn_grad_test.py --------------------------------------------------------------------------


def _nn_grad_cases() -> list[Case]:
    import tensorflow as tf

    cases = []

    def add(name, method, make, bound):
        cases.append(Case(name, f"{NN_GRAD}::{method}", make, _max_below(bound), f"max_error < {bound:g}"))

    def softmax_grad_grad():
        def f(x):
            assert x.dtype == tf.float32
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = tf.nn.softmax(x)
            return tape.gradient(y, x)

        return f, [tf.constant([[-2, -1, 1, 3], [5, 7, 8, 9]], dtype=tf.float32)]

    add("softmax_grad_grad", "SoftmaxOpTest.testSoftmaxGradGradExtendType", softmax_grad_grad, 1e-4)

    def swish():
        return tf.nn.silu, [tf.constant([[-2, -1, 1, 3]], dtype=tf.float32), tf.constant(0.25, dtype=tf.float32)]

    add("swish", "SwishGradOpTest.testSwishGrad", swish, 1e-4)

    def relu6_grad_grad():
        def f(inputs):
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                r = tf.nn.relu6(inputs)
            return tape.gradient(r, inputs)

        return f, [tf.constant(np.array([[-3.5, -1.5, 2, 4], [4.5, 7.5, 8.5, 11]]), dtype=tf.float32)]

    add("relu6_grad_grad", "Relu6OpTest.testRelu6GradGrad", relu6_grad_grad, 1e-4)

    def placeholder_init(shape, seed):  # the v1 checker's x_init_value: np.random.random_sample(x_shape)
        return tf.constant(np.random.RandomState(seed).random_sample(shape), dtype=tf.float32)

    half = lambda shape: tf.constant(0.5, dtype=tf.float32, shape=shape)  # noqa: E731

    def conv_input():
        f = half([2, 2, 3, 2])
        return (lambda x: tf.nn.conv2d(x, f, [1, 1, 1, 1], "SAME")), [placeholder_init([1, 4, 4, 3], 0)]

    def conv_filter():
        x = half([1, 4, 4, 3])
        return (lambda f: tf.nn.conv2d(x, f, [1, 1, 1, 1], "SAME")), [placeholder_init([2, 2, 3, 2], 1)]

    def depthwise_input():
        f = half([2, 2, 3, 2])
        return (lambda x: tf.nn.depthwise_conv2d(x, f, [1, 1, 1, 1], "SAME")), [placeholder_init([1, 4, 4, 3], 2)]

    def depthwise_filter():
        x = half([1, 4, 4, 3])
        return (lambda f: tf.nn.depthwise_conv2d(x, f, [1, 1, 1, 1], "SAME")), [placeholder_init([2, 2, 3, 2], 3)]

    add("conv2d_wrt_input", "Conv2dOpTest.testConv2dGradWRTInput", conv_input, 1e-3)
    add("conv2d_wrt_filter", "Conv2dOpTest.testConv2dGradWRTFilter", conv_filter, 1e-3)
    add("depthwise_conv2d_wrt_input", "DepthwiseConv2dTest.testDepthwiseConv2dGradWRTInput", depthwise_input, 1e-3)
    add("depthwise_conv2d_wrt_filter", "DepthwiseConv2dTest.testDepthwiseConv2dGradWRTFilter", depthwise_filter, 1e-3)

    inputs_value = [[-2, -1, 1, 3], [5, 7, 8, 9]]
    dummy_value = [[3, 1, -1, -2], [9, 8, 7, 6]]

    def grad_of(op, wrt):
        def make():
            inputs = tf.constant(inputs_value, dtype=tf.float32)
            dummy = tf.constant(dummy_value, dtype=tf.float32)

            def gradient(x, dy):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y = op(x)
                return tape.gradient(y, x, output_gradients=dy)

            if wrt == "grad_ys":
                return (lambda dy: gradient(inputs, dy)), [dummy]
            return (lambda x: gradient(x, dummy)), [inputs]

        return make

    for op, label in ((tf.nn.elu, "Elu"), (tf.nn.selu, "Selu")):
        for wrt in ("grad_ys", "inputs"):
            add(f"{label.lower()}_grad_grad_wrt_{wrt}", f"{label}GradOpTest.test{label}GradGradWRT{wrt}",
                grad_of(op, wrt), 1e-4)
    return cases


# -- cwise_ops_unary_test.py ------------------------------------------------------------------


def _unary_cases() -> list[Case]:
    import tensorflow as tf

    def values(dtype):
        x = np.arange(-3, 3).reshape(1, 3, 2).astype(dtype)
        w = x - x.min() + 1.02  # all greater than 1
        y = (x + 0.5).astype(dtype)  # no zero
        z = (x + 15.5).astype(dtype)  # all positive
        if dtype == np.float32:
            k = np.arange(-0.90, 0.90, 0.25).astype(dtype)  # between -1 and 1
        else:
            k = np.arange(-0.90, 0.90, 0.35).reshape(1, 3, 2).astype(dtype)
        return {"x": x, "w": w, "y": y, "z": z, "k": k}

    float_ops = [("x", "abs", tf.math.abs), ("x", "abs_builtin", abs), ("x", "negative", tf.math.negative),
                 ("x", "neg_lambda", lambda t: -t), ("y", "reciprocal", tf.math.reciprocal),
                 ("x", "square", tf.math.square), ("z", "sqrt", tf.math.sqrt), ("z", "rsqrt", tf.math.rsqrt),
                 ("x", "exp", tf.math.exp), ("x", "expm1", tf.math.expm1), ("z", "log", tf.math.log),
                 ("z", "log1p", tf.math.log1p), ("x", "sinh", tf.math.sinh), ("x", "cosh", tf.math.cosh),
                 ("x", "tanh", tf.math.tanh), ("x", "asinh", tf.math.asinh), ("w", "acosh", tf.math.acosh),
                 ("k", "atanh", tf.math.atanh), ("x", "sigmoid", tf.math.sigmoid),
                 ("x", "log_sigmoid", tf.math.log_sigmoid), ("y", "sign", tf.math.sign), ("x", "sin", tf.math.sin),
                 ("x", "cos", tf.math.cos), ("k", "asin", tf.math.asin), ("k", "acos", tf.math.acos),
                 ("x", "atan", tf.math.atan), ("x", "tan", tf.math.tan), ("y", "lgamma", tf.math.lgamma),
                 ("x", "erf", tf.math.erf), ("x", "erfc", tf.math.erfc),
                 ("x", "bessel_i0e", tf.math.special.bessel_i0e), ("x", "bessel_i1e", tf.math.special.bessel_i1e)]
    # testDoubleBasic: the same ops but log_sigmoid; tan at k instead of x
    double_ops = [(("k" if name == "tan" else at), name, op) for at, name, op in float_ops if name != "log_sigmoid"]
    cases = []
    for dtype, ops, method, delta, tol in ((np.float32, float_ops, "testFloatBasic", 1e-3, 1e-3),
                                           (np.float64, double_ops, "testDoubleBasic", 1e-5, 1e-5)):
        table = values(dtype)
        for at, name, op in ops:
            def make(op=op, value=table[at]):
                return (lambda t: op(t)), [tf.constant(value)]

            cases.append(Case(f"unary_{np.dtype(dtype).name}_{name}", f"{UNARY}::UnaryOpTest.{method} ({name} at {at})",
                              make, _all_close(tol), f"assertAllClose(jacob_t, jacob_n, rtol=atol={tol:g})", delta))
    return cases


# == held-out: TensorFlow test files not used while tuning fastcheck ==========================
#
# v1 checks (gradient_checker.compute_gradient(x, x_shape, y, y_shape, x_init_value=...)) are
# ported to the v2 call as for nn_grad_test.py: f of the checked input, the others constant, and
# the v1 checker's default step, delta=1e-3, where the test passes none.

V1_DELTA = 1e-3  # gradient_checker.compute_gradient's default delta (the v1 checker)


def _held_out(cases: list[Case]) -> list[Case]:
    for case in cases:
        case.group = HELD_OUT
    return cases


def _binary_cases() -> list[Case]:
    """cwise_ops_binary_test.py: BinaryOpTest._compareGradientX / _compareGradientY, which check
    ``1.1 * op(x, y)`` (float32, float64) against the other argument held constant, and
    ``assertAllClose(jacob_t, jacob_n, rtol=tol, atol=tol)`` at ``_GRAD_TOL`` of x's dtype."""
    import tensorflow as tf

    grad_tol = {np.float32: 1e-3, np.float64: 1e-5, np.complex64: 1e-2, np.complex128: 1e-4}
    cases = []

    def add(name, method, op, x, y, wrt):
        def make(op=op, x=x, y=y):
            if wrt == "x":
                other = tf.constant(y)
                return (lambda t: 1.1 * op(t, other)), [x]
            other = tf.constant(x)
            return (lambda t: 1.1 * op(other, t)), [y]

        tol = grad_tol[x.dtype.type]
        helper = "_compareGradientX" if wrt == "x" else "_compareGradientY"
        cases.append(Case(f"binary_{np.dtype(x.dtype).name}_{name}_wrt_{wrt}", f"{BINARY}::BinaryOpTest.{method} "
                          f"({name}, {helper})", make, _all_close(tol),
                          f"assertAllClose(jacob_t, jacob_n, rtol=atol={tol:g})", V1_DELTA))

    # testFloatBasic / testDoubleBasic: x, y on linspaces, y + 0.1 for the division; atan2 again on
    # random normals with the tiny ones pushed away from the origin (the test draws them unseeded)
    for dtype, method, (rows, cols), floor in ((np.float32, "testFloatBasic", (5, 6), 0.05),
                                              (np.float64, "testDoubleBasic", (7, 4), 0.5)):
        x = np.linspace(-5, 20, 15).reshape(1, 3, 5).astype(dtype)
        y = np.linspace(20, -5, 15).reshape(1, 3, 5).astype(dtype)
        rng = np.random.RandomState(0)
        x1, x2 = rng.randn(rows, cols).astype(dtype), rng.randn(rows, cols).astype(dtype)
        for a in (x1, x2):
            a[np.abs(a) < floor] = floor * np.sign(a[np.abs(a) < floor])
        for name, op, a, b in (("add", tf.math.add, x, y), ("subtract", tf.math.subtract, x, y),
                               ("multiply", tf.math.multiply, x, y), ("truediv", tf.math.truediv, x, y + 0.1),
                               ("atan2", tf.math.atan2, x, y), ("atan2_random", tf.math.atan2, x1, x2)):
            for wrt in ("x", "y"):
                add(name, method, op, a, b, wrt)
    # testFloatBasic's special functions (scipy present): float32 arrays; zeta and polygamma
    # only have a gradient in their second argument
    a_pos_small = np.linspace(0.1, 2, 15).reshape(1, 3, 5).astype(np.float32)
    x_pos_small = np.linspace(0.1, 10, 15).reshape(1, 3, 5).astype(np.float32)
    n_small = np.arange(0, 15).reshape(1, 3, 5).astype(np.float32)
    for name, op in (("igamma", tf.math.igamma), ("igammac", tf.math.igammac)):
        for wrt in ("x", "y"):
            add(name, "testFloatBasic", op, a_pos_small, x_pos_small, wrt)
    add("zeta", "testFloatBasic", tf.math.zeta, x_pos_small + 1, a_pos_small, "y")
    add("polygamma", "testFloatBasic", tf.math.polygamma, n_small, x_pos_small, "y")

    # _compareBCast: x = 1 + linspace(0, 5) over each shape; testBCast_8B (pow), _15C (multiply), _3D
    # (truediv, the reversed pair _testBCastByFunc also runs)
    def bcast(shape, dtype):
        return (1 + np.linspace(0, 5, int(np.prod(shape)))).astype(dtype).reshape(shape)

    for method, name, op, xs, ys, dtype in (("testBCast_8B", "pow_bcast", tf.math.pow, [2, 1, 5], [2, 3, 1], np.float32),
                                            ("testBCast_15C", "multiply_bcast", tf.math.multiply, [10, 3, 1, 2],
                                             [3, 1, 2], np.float64),
                                            ("testBCast_3D", "truediv_bcast", tf.math.truediv, [3, 1], [1, 3, 2],
                                             np.float32)):
        for wrt in ("x", "y"):
            add(name, method, op, bcast(xs, dtype), bcast(ys, dtype), wrt)

    # testComplexPowGrad: pow(base, y) with respect to y = 2, compute_gradient_error < 2e-4
    for dtype in (tf.complex64, tf.complex128):
        for base in (2.0, -2.0):
            def make(dtype=dtype, base=base):
                x = tf.constant(base, dtype=dtype)
                return (lambda y: tf.math.pow(x, y)), [tf.constant(2.0, dtype=dtype)]

            cases.append(Case(f"binary_{dtype.name}_pow_base_{base:g}_wrt_y", f"{BINARY}::BinaryOpTest.testComplexPowGrad",
                              make, _max_below(2e-4), "max_error < 2e-4", V1_DELTA))
    # testZeroPowGrad: pow(0, y) with respect to y = 2, compute_gradient_error == 0
    for dtype in (tf.float32, tf.float64):
        def make(dtype=dtype):
            x = tf.constant(0.0, dtype=dtype)
            return (lambda y: tf.math.pow(x, y)), [tf.constant(2.0, dtype=dtype)]

        cases.append(Case(f"binary_{dtype.name}_zero_pow_wrt_y", f"{BINARY}::BinaryOpTest.testZeroPowGrad", make,
                          lambda t, n: _max_error(t, n) == 0, "max_error == 0", V1_DELTA))
    return _held_out(cases)


def _relu_cases() -> list[Case]:
    """relu_op_test.py: testGradientFloat32/Float64 and testGradGradFloat32/Float64 of each
    activation, at the file's x (away from the kinks), ``max_error`` below the test's bound."""
    import tensorflow as tf

    below_kink = [[-0.9, -0.7, -0.5, -0.3, -0.1], [0.1, 0.3, 0.5, 0.7, 0.9]]
    relu6_x = [[-0.9, -0.7, -0.5, -0.3, -0.1], [6.1, 6.3, 6.5, 6.7, 6.9]]

    def grad_of(op):
        def f(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = op(x)
            return tape.gradient(y, x)

        return f

    # (test class, method, op, values, dtype, bound, delta as the test passes it, grad-of-grad?)
    table = [("ReluTest", "testGradientFloat32", tf.nn.relu, below_kink, np.float32, 1e-6, 1.0 / 1024, False),
             ("ReluTest", "testGradientFloat64", tf.nn.relu, below_kink, np.float64, 1e-15, 1.0 / 1024, False),
             ("ReluTest", "testGradGradFloat32", tf.nn.relu, below_kink, np.float32, 1e-4, 1.0 / 1024, True),
             ("ReluTest", "testGradGradFloat64", tf.nn.relu, below_kink, np.float64, 1e-10, 1.0 / 1024, True),
             ("Relu6Test", "testGradientFloat32", tf.nn.relu6, relu6_x, np.float32, 1e-4, None, False),
             ("Relu6Test", "testGradientFloat64", tf.nn.relu6, relu6_x, np.float64, 1e-10, None, False),
             ("LeakyReluTest", "testGradientFloat32", tf.nn.leaky_relu, below_kink, np.float32, 1e-4, None, False),
             ("LeakyReluTest", "testGradientFloat64", tf.nn.leaky_relu, below_kink, np.float64, 1e-10, None, False),
             ("LeakyReluTest", "testGradGradFloat32", tf.nn.leaky_relu, below_kink, np.float32, 1e-4, None, True),
             ("LeakyReluTest", "testGradGradFloat64", tf.nn.leaky_relu, below_kink, np.float64, 1e-10, None, True),
             ("EluTest", "testGradientFloat32", tf.nn.elu, below_kink, np.float32, 1e-4, None, False),
             ("EluTest", "testGradientFloat64", tf.nn.elu, below_kink, np.float64, 1e-6, None, False),
             ("EluTest", "testGradGradFloat32", tf.nn.elu, below_kink, np.float32, 1e-4, None, True),
             ("EluTest", "testGradGradFloat64", tf.nn.elu, below_kink, np.float64, 1e-6, None, True),
             ("SeluTest", "testGradientFloat32", tf.nn.selu, below_kink, np.float32, 1e-4, 1.0 / 1024, False),
             ("SeluTest", "testGradientFloat64", tf.nn.selu, below_kink, np.float64, 1e-6, None, False),
             ("SeluTest", "testGradGradFloat32", tf.nn.selu, below_kink, np.float32, 1e-4, 1.0 / 1024, True),
             ("SeluTest", "testGradGradFloat64", tf.nn.selu, below_kink, np.float64, 1e-6, None, True)]
    cases = []
    for cls, method, op, values, dtype, bound, delta, twice in table:
        def make(op=op, values=values, dtype=dtype, twice=twice):
            # the test passes the numpy array itself (Fortran order), as here
            return (grad_of(op) if twice else op), [np.asarray(values, dtype=dtype, order="F")]

        kind = "grad_grad" if twice else "grad"
        cases.append(Case(f"{op.__name__}_{kind}_{np.dtype(dtype).name}", f"{RELU}::{cls}.{method}", make,
                          _max_below(bound), f"max_error < {bound:g}", delta))
    return _held_out(cases)


def _reduction_cases() -> list[Case]:
    """reduction_ops_test.py: BaseReductionTest._compareGradient -- x = arange(48) in shape
    [2, 3, 4, 2], the v1 check at delta=1 and ``assertAllClose(jacob_t, jacob_n, rtol, atol)``."""
    import tensorflow as tf

    def incremental(dtype):
        return np.arange(48).reshape([2, 3, 4, 2]).astype(dtype)

    prod_x = incremental(np.float32) / 20.0
    zero_in_middle = prod_x.copy()
    zero_in_middle[:, :, 2, :] = 0
    # (test class.method, op, x, axes, tol)
    table = [("SumReductionTest.testGradient", tf.math.reduce_sum, incremental(np.float32), [1, 2], 1e-8),
             ("SumReductionTest.testGradient", tf.math.reduce_sum, incremental(np.float64), None, 1e-8),
             ("MeanReductionTest.testGradient", tf.math.reduce_mean, incremental(np.float32), [1], 1e-3),
             ("MeanReductionTest.testGradient", tf.math.reduce_mean, incremental(np.float64), [0, 1, 2, 3], 1e-3),
             ("EuclideanNormReductionTest.testGradient", tf.math.reduce_euclidean_norm, incremental(np.float32) + 1.0,
              [1, 2], 1e-2),
             ("EuclideanNormReductionTest.testGradient", tf.math.reduce_euclidean_norm, incremental(np.float64) + 1.0,
              None, 1e-2),
             ("ProdReductionTest.testGradientWithZeros", tf.math.reduce_prod, prod_x, [2], 1e-3),
             ("ProdReductionTest.testGradientWithZeros", tf.math.reduce_prod, zero_in_middle, [1, 2], 1e-3)]
    cases = []
    for index, (method, op, x, axes, tol) in enumerate(table):
        def make(op=op, x=x, axes=axes):
            return (lambda t: op(t, axes, False)), [tf.constant(x)]

        axes_name = "all" if axes is None else "".join(map(str, axes))
        name = f"{op.__name__}_{np.dtype(x.dtype).name}_axes_{axes_name}"
        if method.endswith("WithZeros"):
            name += "_zero_in_middle" if index == len(table) - 1 else "_one_zero"
        cases.append(Case(name, f"{REDUCTION}::{method} (axes {axes})", make, _all_close(tol),
                          f"assertAllClose(jacob_t, jacob_n, rtol=atol={tol:g})", 1.0))
    return _held_out(cases)


def _linalg_random(shape, dtype):
    """linalg_grad_test.py's RandomInput: np.random.seed(1), uniform in [-1, 1)."""
    np.random.seed(1)
    return np.random.uniform(low=-1.0, high=1.0, size=np.prod(shape)).reshape(shape).astype(dtype)


def _linalg_cases() -> list[Case]:
    """linalg_grad_test.py: _GetMatrixBinaryFunctorGradientTest (both arguments, delta = eps^(1/3),
    assertAllClose at 1e-6 in float64, 0.05 x fudge in float32) and DetGradSingularMatrixTest."""
    import tensorflow as tf

    cases = []
    for op, dtype, shape, kwargs, fudge, test_name in (
            (tf.linalg.solve, np.float64, (5, 5), {"adjoint": False}, 1.0, "MatrixSolveGradient_float64_5_5_adj_False"),
            (tf.linalg.solve, np.float32, (3, 5, 5), {"adjoint": True}, 1.0, "MatrixSolveGradient_float32_3_5_5_adj_True"),
            (tf.linalg.triangular_solve, np.float64, (2, 5, 5), {"adjoint": False, "lower": True}, 4.0,
             "MatrixTriangularSolveGradient_float64_2_5_5_adj_False_low_True")):
        delta = float(np.finfo(dtype).eps ** (1.0 / 3.0))
        tol = 1e-6 if dtype == np.float64 else fudge * 0.05
        for side in ("left", "right"):
            def make(op=op, dtype=dtype, shape=shape, kwargs=kwargs, side=side):
                fixed = _linalg_random(shape, dtype)
                if side == "left":
                    return (lambda x: op(x, fixed, **kwargs)), [_linalg_random(shape, dtype)]
                return (lambda y: op(fixed, y, **kwargs)), [_linalg_random(shape, dtype)]

            label = {"MatrixSolve": "matrix_solve", "MatrixTriangularSolve": "triangular_solve"}[test_name.split("Gradient")[0]]
            cases.append(Case(f"{label}_{test_name.split('Gradient_')[1]}_{side}",
                              f"{LINALG}::MatrixBinaryFunctorGradientTest.test_{test_name} ({side} argument)", make,
                              _all_close(tol), f"assertAllClose(theoretical, numerical, rtol=atol={tol:g})", delta))

    def det_check(atol, adjugate=None):
        def check(theoretical, numerical) -> bool:
            close = bool(np.allclose(theoretical[0], numerical[0], rtol=1e-6, atol=atol))
            return close and (adjugate is None or bool(np.allclose(theoretical[0], adjugate, rtol=1e-6, atol=1e-6)))

        return check

    for name, method, value, dtype, atol, adjugate in (
            ("det_invertible_2x2_float64", "testDetGradInvertible2x2", [[1.0, 2.0], [3.0, 4.0]], np.float64, 1e-6,
             [[4.0, -3.0, -2.0, 1.0]]),
            ("det_near_singular_float64", "testDetGradNearSingularNumerical", [[1.0, 1.0], [1.0, 1.0 + 1e-6]],
             np.float64, 1e-6, None),
            ("det_complex64_invertible", "testDetGradComplexInvertible",
             [[1.0 + 1.0j, 2.0 - 1.0j], [3.0 + 0.5j, 4.0 + 2.0j]], np.complex64, 2e-2, None),
            ("det_complex128_invertible", "testDetGradComplexInvertible",
             [[1.0 + 1.0j, 2.0 - 1.0j], [3.0 + 0.5j, 4.0 + 2.0j]], np.complex128, 1e-6, None)):
        def make(value=value, dtype=dtype):
            return tf.linalg.det, [np.array(value, dtype=dtype)]

        bound = f"assertAllClose(theoretical, numerical, atol={atol:g})" + (", theoretical == adjugate" if adjugate else "")
        cases.append(Case(name, f"{LINALG}::DetGradSingularMatrixTest.{method}", make, det_check(atol, adjugate), bound))
    return _held_out(cases)


def _pool3d_cases() -> list[Case]:
    """pooling_ops_3d_test.py: _getJacobians (NDHWC on the CPU) -- the pool of x = arange(n) and the
    pool's gradient with respect to random upstream gradients, ``assertAllClose`` at 1e-3."""
    import tensorflow as tf

    table = [("testMaxPoolGradValidPadding2_1_6_3d", tf.nn.max_pool3d, [1, 2, 3, 4, 2], [1, 1, 2, 3, 2], (2, 2, 2),
              (1, 1, 1), "VALID"),
             ("testMaxPoolGradSamePadding2_2_3d", tf.nn.max_pool3d, [1, 5, 2, 4, 2], [1, 3, 1, 2, 2], (2, 2, 2),
              (2, 2, 2), "SAME"),
             ("testAvgPoolGradValidPadding2_1_3d", tf.nn.avg_pool3d, [1, 3, 3, 3, 2], [1, 2, 2, 2, 2], (2, 2, 2),
              (1, 1, 1), "VALID"),
             ("testAvgPoolGradSamePadding3_1_3d", tf.nn.avg_pool3d, [1, 3, 6, 2, 1], [1, 3, 6, 2, 1], (3, 3, 3),
              (1, 1, 1), "SAME")]
    cases = []
    for index, (method, pool, input_sizes, output_sizes, window, strides, padding) in enumerate(table):
        def pooled(pool=pool, window=window, strides=strides, padding=padding):
            return lambda t: pool(t, ksize=[1, *window, 1], strides=[1, *strides, 1], padding=padding,
                                  data_format="NDHWC")

        def make(pooled=pooled, input_sizes=input_sizes):
            x = np.arange(np.prod(input_sizes)).reshape(input_sizes).astype(np.float32)
            return pooled(), [tf.constant(x, shape=input_sizes)]

        source = f"{POOL3D}::PoolingTest.{method}"
        stem = f"{pool.__name__}_{method.split('Grad')[1][:-len('_3d')].lower().replace('padding', '_')}"
        cases.append(Case(f"{stem}_input", f"{source} (input)", make,
                          _all_close(1e-3), "assertAllClose(jacob_a, jacob_n, rtol=atol=1e-3)"))
        if index == 0:  # the same test's second check: the pool's gradient, as a function of the upstream one
            def make_grad(pooled=pooled, input_sizes=input_sizes, output_sizes=output_sizes):
                x = tf.constant(np.arange(np.prod(input_sizes)).reshape(input_sizes).astype(np.float32))
                pool_ = pooled()

                def pool_grad_function(upstream_gradients):
                    with tf.GradientTape() as tape:
                        tape.watch(x)
                        injected = pool_(x) * upstream_gradients
                    return tape.gradient(injected, x)

                upstream = 2 * np.random.RandomState(0).rand(*output_sizes) - 1  # the test draws it unseeded
                return pool_grad_function, [tf.constant(upstream, dtype=tf.float32)]

            cases.append(Case(f"{stem}_upstream",
                              f"{source} (gradient w.r.t. upstream)", make_grad, _all_close(1e-3),
                              "assertAllClose(grad_jacob_a, grad_jacob_n, rtol=atol=1e-3)"))
    return _held_out(cases)


def held_out_cases() -> list[Case]:
    return _binary_cases() + _relu_cases() + _reduction_cases() + _linalg_cases() + _pool3d_cases()


# == planted defects: gradients deliberately wrong, each under the check its TF test would use ====


def _planted(forward, vjp):
    """``forward`` with a hand-written gradient ``vjp(x, y, dy)`` (a tf.custom_gradient)."""
    import tensorflow as tf

    @tf.custom_gradient
    def f(x):
        y = forward(x)
        return y, lambda dy: vjp(x, y, dy)

    return f


def _scaled_at(shape, index, factor, dtype):
    """Ones of ``shape`` but ``factor`` at flat ``index``: one element of a VJP scaled."""
    import tensorflow as tf

    mask = np.ones(shape)
    mask.flat[index] = factor
    return tf.constant(mask, dtype=dtype)


def _swapped(g, i, j):
    """``g`` with flat elements i and j exchanged."""
    import tensorflow as tf

    order = np.arange(int(np.prod(g.shape)))
    order[i], order[j] = j, i
    return tf.reshape(tf.gather(tf.reshape(g, [-1]), order), tf.shape(g))


def defect_cases() -> list[Case]:
    import tensorflow as tf

    cases = []

    def add(name, defect, source, make, check, bound, delta=None):
        cases.append(Case(name, source, make, check, bound, delta, notes=[defect], group=DEFECT))

    unary_x32 = np.arange(-3, 3).reshape(1, 3, 2).astype(np.float32)
    unary_x64 = np.arange(-3, 3).reshape(1, 3, 2).astype(np.float64)

    def sin_scaled():
        mask = _scaled_at(unary_x32.shape, 2, 1.01, tf.float32)
        return _planted(tf.sin, lambda x, y, dy: dy * tf.cos(x) * mask), [tf.constant(unary_x32)]

    add("sin_float32_one_element_x1.01", "the VJP scaled by 1.01 at one element", f"{UNARY}::UnaryOpTest.testFloatBasic",
        sin_scaled, _all_close(1e-3), "assertAllClose(jacob_t, jacob_n, rtol=atol=1e-3)", 1e-3)

    def tanh_offset():
        return _planted(tf.tanh, lambda x, y, dy: dy * (1 - y * y + 1e-4)), [tf.constant(unary_x64)]

    add("tanh_float64_plus_1e-4", "the derivative off by a constant 1e-4 everywhere",
        f"{UNARY}::UnaryOpTest.testDoubleBasic", tanh_offset, _all_close(1e-5),
        "assertAllClose(jacob_t, jacob_n, rtol=atol=1e-5)", 1e-5)

    def exp_sign():
        return _planted(tf.exp, lambda x, y, dy: tf.where(x < 0, -dy * y, dy * y)), [tf.constant(unary_x32)]

    add("exp_float32_wrong_sign_negative", "the wrong sign for negative inputs", f"{UNARY}::UnaryOpTest.testFloatBasic",
        exp_sign, _all_close(1e-3), "assertAllClose(jacob_t, jacob_n, rtol=atol=1e-3)", 1e-3)

    def sigmoid_scaled():
        mask = _scaled_at(unary_x64.shape, 4, 1.001, tf.float64)
        return _planted(tf.sigmoid, lambda x, y, dy: dy * y * (1 - y) * mask), [tf.constant(unary_x64)]

    add("sigmoid_float64_one_element_x1.001", "the VJP scaled by 1.001 at one element",
        f"{UNARY}::UnaryOpTest.testDoubleBasic", sigmoid_scaled, _all_close(1e-5),
        "assertAllClose(jacob_t, jacob_n, rtol=atol=1e-5)", 1e-5)

    def log1p_formula():
        z = np.arange(-3, 3).reshape(1, 3, 2).astype(np.float64) + 15.5
        return _planted(tf.math.log1p, lambda x, y, dy: dy / x), [tf.constant(z)]

    add("log1p_float64_drops_the_1", "1/x for 1/(1 + x): a term dropped", f"{UNARY}::UnaryOpTest.testDoubleBasic",
        log1p_formula, _all_close(1e-5), "assertAllClose(jacob_t, jacob_n, rtol=atol=1e-5)", 1e-5)

    def leaky_relu_alpha():
        x = np.asarray([[-0.9, -0.7, -0.5, -0.3, -0.1], [0.1, 0.3, 0.5, 0.7, 0.9]], dtype=np.float64)
        return _planted(tf.nn.leaky_relu, lambda x, y, dy: tf.where(x > 0, dy, tf.zeros_like(dy))), [x]

    add("leaky_relu_float64_drops_alpha", "the negative side's alpha term dropped (relu's gradient)",
        f"{RELU}::LeakyReluTest.testGradientFloat64", leaky_relu_alpha, _max_below(1e-10), "max_error < 1e-10")

    def batch_matmul_swapped():
        rng = np.random.RandomState(3)
        b = tf.constant(rng.uniform(-1.0, 1.0, (2, 4, 5)))
        a = rng.uniform(-1.0, 1.0, (2, 3, 4))
        return (_planted(lambda t: tf.matmul(t, b), lambda x, y, dy: _swapped(tf.matmul(dy, b, transpose_b=True), 0, 1)),
                [tf.constant(a)])

    add("batch_matmul_float64_two_swapped", "two elements of the VJP swapped",
        f"{LINALG}::MatrixBinaryFunctorGradientTest (its float64 rule)", batch_matmul_swapped, _all_close(1e-6),
        "assertAllClose(theoretical, numerical, rtol=atol=1e-6)", float(np.finfo(np.float64).eps ** (1.0 / 3.0)))

    def solve_adjoint():
        a = tf.constant(_linalg_random((5, 5), np.float64))
        return (_planted(lambda b: tf.linalg.solve(a, b), lambda x, y, dy: tf.linalg.solve(a, dy)),
                [_linalg_random((5, 5), np.float64)])

    add("matrix_solve_float64_rhs_no_adjoint", "A^-1 dy for A^-T dy: the transpose forgotten",
        f"{LINALG}::MatrixBinaryFunctorGradientTest.test_MatrixSolveGradient_float64_5_5_adj_False", solve_adjoint,
        _all_close(1e-6), "assertAllClose(theoretical, numerical, rtol=atol=1e-6)",
        float(np.finfo(np.float64).eps ** (1.0 / 3.0)))

    def conv_scaled():
        filters = tf.constant(0.5, dtype=tf.float32, shape=[2, 2, 3, 2])
        mask = _scaled_at([1, 4, 4, 3], 5, 1.01, tf.float32)

        def vjp(x, y, dy):
            return tf.raw_ops.Conv2DBackpropInput(input_sizes=[1, 4, 4, 3], filter=filters, out_backprop=dy,
                                                  strides=[1, 1, 1, 1], padding="SAME") * mask

        x = tf.constant(np.random.RandomState(0).random_sample([1, 4, 4, 3]), dtype=tf.float32)
        return _planted(lambda t: tf.nn.conv2d(t, filters, [1, 1, 1, 1], "SAME"), vjp), [x]

    add("conv2d_float32_one_element_x1.01", "the input VJP scaled by 1.01 at one element",
        f"{NN_GRAD}::Conv2dOpTest.testConv2dGradWRTInput", conv_scaled, _max_below(1e-3), "max_error < 1e-3")

    def softmax_term():
        x = tf.constant([[-2, -1, 1, 3], [5, 7, 8, 9]], dtype=tf.float32)
        return _planted(tf.nn.softmax, lambda x, y, dy: dy * y), [x]

    add("softmax_float32_drops_a_term", "dy * s: the - s * sum(dy * s) term dropped",
        f"{NN_GRAD}::SoftmaxOpTest (its bound)", softmax_term, _max_below(1e-4), "max_error < 1e-4")

    def sum_scaled():
        x = np.arange(48).reshape([2, 3, 4, 2]).astype(np.float32)
        mask = _scaled_at(x.shape, 7, 1.001, tf.float32)

        def vjp(t, y, dy):
            return tf.broadcast_to(tf.expand_dims(tf.expand_dims(dy, 1), 1), t.shape) * mask

        return _planted(lambda t: tf.reduce_sum(t, [1, 2]), vjp), [tf.constant(x)]

    add("reduce_sum_float32_one_element_x1.001", "the VJP scaled by 1.001 at one element",
        f"{REDUCTION}::SumReductionTest.testGradient", sum_scaled, _all_close(1e-8),
        "assertAllClose(jacob_t, jacob_n, rtol=atol=1e-8)", 1.0)

    def atan2_swapped():
        x = np.linspace(-5, 20, 15).reshape(1, 3, 5).astype(np.float32)
        y = np.linspace(20, -5, 15).reshape(1, 3, 5).astype(np.float32)
        a = tf.constant(x)

        def vjp(t, out, dy):  # d/dt 1.1 atan2(a, t) = -1.1 a / (a^2 + t^2), two elements swapped
            return _swapped(1.1 * dy * -a / (a * a + t * t), 3, 4)

        return _planted(lambda t: 1.1 * tf.math.atan2(a, t), vjp), [y]

    add("atan2_float32_wrt_y_two_swapped", "two elements of the VJP swapped",
        f"{BINARY}::BinaryOpTest.testFloatBasic (atan2, _compareGradientY)", atan2_swapped, _all_close(1e-3),
        "assertAllClose(jacob_t, jacob_n, rtol=atol=1e-3)", V1_DELTA)
    return cases


def all_cases() -> list[Case]:
    """The correct cases, the tuned ones first, then the held-out ones."""
    return _gc_v2_cases() + _nn_grad_cases() + _unary_cases() + held_out_cases()


# -- measurement -------------------------------------------------------------------------------


def _tf(case: Case, f, xs):
    import tensorflow as tf

    out = tf.test.compute_gradient(f, xs) if case.delta is None else tf.test.compute_gradient(f, xs, delta=case.delta)
    return {"ok": bool(case.check(*out)), "max_error": _max_error(*out)}


def _drop_in(case: Case, f, xs):
    import fastcheck

    out = fastcheck.compute_gradient(f, xs) if case.delta is None else fastcheck.compute_gradient(f, xs, delta=case.delta)
    return {"ok": bool(case.check(*out)), "max_error": float(fastcheck.max_error(*out))}


def _verdict(case: Case, f, xs):
    import tensorflow as tf

    import fastcheck

    # tf.test.compute_gradient converts each x with tf.convert_to_tensor (a Python float is float32): the same here
    report = fastcheck.check_gradients(f, [tf.convert_to_tensor(x) for x in xs], progress=False)
    return {"ok": bool(report.ok), "report": report}  # described after the timing (_described)


def _described(result: dict) -> dict:
    """A verdict's row without its report: what a test reads of a passing check is ``report.ok``;
    composing ``str(report)`` (the text a failure prints) is not timed."""
    report = result.pop("report", None)
    if report is None:
        return result
    return {**result, "status": report.verdict, "path": report.path, "mode": report.mode,
            "timings": {k: round(v, 4) for k, v in dict(report.timings).items()},
            "summary": str(report).splitlines()[0][:200]}


CONTENDERS = {"tf": _tf, "drop-in": _drop_in, "verdict": _verdict}


def _timed(run, case, f, xs):
    start = time.perf_counter()
    try:
        result = run(case, f, xs)
    except Exception as error:  # recorded, the suite goes on
        result = {"ok": False, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"}
    result["seconds"] = time.perf_counter() - start
    return _described(result)


WARM_REPEATS = 7
FRESH_REPEATS = 3


def measure(case: Case) -> dict:
    row = {"name": case.name, "group": case.group, "source": case.source, "bound": case.bound, "delta": case.delta}
    made: dict = {}
    firsts: dict = {label: [] for label in CONTENDERS}
    # fresh: a new function object for each run (what each test of a suite pays), the fastest of
    # FRESH_REPEATS, the contenders taking turns; the last one's function is the warm runs'
    for _ in range(FRESH_REPEATS):
        for label, run in CONTENDERS.items():
            made[label] = case.make()
            firsts[label].append(_timed(run, case, *made[label]))
    fresh = {label: min(results, key=lambda result: result["seconds"]) for label, results in firsts.items()}
    # warm: the same function again, the fastest of WARM_REPEATS runs, the contenders taking turns
    # (one run of a few milliseconds on a shared machine is as likely to measure the load as the check)
    warm: dict = {label: [] for label in CONTENDERS}
    for _ in range(WARM_REPEATS):
        for label, run in CONTENDERS.items():
            warm[label].append(_timed(run, case, *made[label]))
    for label in CONTENDERS:
        best = min(warm[label], key=lambda result: result["seconds"])
        row[label] = {**fresh[label], "warm_seconds": best["seconds"], "warm_ok": best["ok"]}
    return row


# The two passes of ``--once`` in its process: fastcheck first, where the op kernels TensorFlow caches per op are
# cold for fastcheck and warm for compute_gradient (what fastcheck pays as the first test of its ops); then, a
# pass later, tf first, every kernel warm for both (a later test of the same ops, each with a new f).  A third
# pass pairs the first pass's fastcheck with compute_gradient run first in a fresh process (``_tf_first``): each
# contender the first test of its ops.
ONCE_PASSES = {"fastcheck first": ("verdict", "tf"), "a pass later, tf first": ("tf", "verdict")}
BOTH_COLD = "each first of its ops"


def measure_once(case: Case, order=ONCE_PASSES["fastcheck first"]) -> dict:
    """Each contender of ``order`` checks a new function object of ``case`` once, as one test of a suite does."""
    row = {"name": case.name, "group": case.group, "source": case.source, "bound": case.bound, "delta": case.delta}
    for label in order:
        row[label] = _timed(CONTENDERS[label], case, *case.make())
    return row


def summarise_once(rows: list[dict]) -> dict:
    """Median and total ratios fastcheck / tf of checks run once, group by group and over all correct cases."""
    def one(members):
        ratios = [_ratio(r["verdict"]["seconds"], r["tf"]["seconds"]) for r in members]
        verdict, tf_total = sum(r["verdict"]["seconds"] for r in members), sum(r["tf"]["seconds"] for r in members)
        return {"cases": len(members), "median_ratio": statistics.median(ratios), "total_ratio": _ratio(verdict, tf_total),
                "total_seconds": verdict, "tf_total_seconds": tf_total, "slower": sum(x > 1 for x in ratios),
                "disagreements": [r["name"] for r in members if r["verdict"]["ok"] != r["tf"]["ok"]]}

    groups = {g: one([r for r in rows if r["group"] == g]) for g in GROUPS if any(r["group"] == g for r in rows)}
    return {**groups, "all": one(rows)}


def once_markdown(record: dict) -> str:
    lines = ["# TensorFlow's own gradient tests, each case run once", "",
             "Each correct case checked once by `fastcheck.check_gradients` (verdict) and once by "
             "`tf.test.compute_gradient` + the test's assertion (tf), each on a new function object in one warm "
             "process: what a test suite pays per test. Two passes over the cases: *fastcheck first* (the op "
             "kernels TensorFlow caches per op cold for fastcheck, warm for compute_gradient after it), then *a "
             "pass later, tf first* (every kernel warm for both: a later test of the same ops). *Each first of its "
             "ops* pairs the first pass's fastcheck times with compute_gradient's run first, case by case, in a "
             "fresh process after the same warm-up: each contender the first test of its ops. Ratios are "
             "fastcheck / tf seconds (below 1: fastcheck faster); speed-up = 1 / ratio.",
             "", f"- CPU: {record['cpu']} ({record['cpus']} logical CPUs), TensorFlow {record['tensorflow']}",
             f"- load before: `{record['uptime_before']}`", f"- load after: `{record['uptime_after']}`",
             f"- date: {record['date']}, wall time {record['wall_seconds']:.0f} s", "",
             "| pass | group | cases | median ratio | median speed-up | total ratio | total speed-up | fastcheck s | tf s | slower than tf |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, summary in record["summary"].items():
        for group, s in summary.items():
            lines.append(f"| {name} | {group} | {s['cases']} | {s['median_ratio']:.2f} | {1 / s['median_ratio']:.2f}x | "
                         f"{s['total_ratio']:.2f} | {1 / s['total_ratio']:.2f}x | {s['total_seconds']:.2f} | "
                         f"{s['tf_total_seconds']:.2f} | {s['slower']} |")
    if "floor" in record:
        ms = record["floor"]
        lines += ["", f"The eager floor (``eager_floor``, five 6-element float32 unary ops, warm): fastcheck "
                  f"{ms['fastcheck']:.2f} ms a check, compute_gradient {ms['compute_gradient']:.2f} ms, and the calls "
                  f"of f and VJPs of the eager loops (2n + 4 calls of f, m VJPs; an element-wise f's check now makes 2 "
                  f"calls a side and 2 VJPs instead), alone, {ms['floor']:.2f} ms."]
    first = next(iter(record["summary"].values()))
    lines += ["", f"Verdicts that differ from the test's own assertion: {', '.join(first['all']['disagreements']) or 'none'}",
              "", "| case | group | " + " | ".join(f"verdict s, tf s ({name})" for name in record["passes"]) + " | verdict |",
              "|---|---|" + "---:|" * len(record["passes"]) + "---|"]
    for rows in zip(*record["passes"].values()):
        r = rows[0]
        lines.append(f"| {r['name']} | {r['group']} | "
                     + " | ".join(f"{x['verdict']['seconds']:.4f}, {x['tf']['seconds']:.4f}" for x in rows)
                     + f" | {_marked(r['verdict'])} |")
    return "\n".join(lines) + "\n"


def run_once(cases: list[Case], log=print) -> dict:
    import tensorflow as tf

    started = time.perf_counter()
    record = {"cpu": _cpu_model(), "cpus": os.cpu_count(), "tensorflow": tf.__version__,
              "uptime_before": _uptime(), "date": time.strftime("%Y-%m-%d %H:%M")}
    measure_once(Case("warm-up", "-", lambda: ((lambda x: tf.sin(x) * x), [tf.constant([0.1, 0.2, 0.3])]),
                      _max_below(1e-2), "-"))  # the process's first imports and tracing, paid before any case
    record["passes"] = {}
    for name, order in ONCE_PASSES.items():
        rows = record["passes"][name] = []
        for index, case in enumerate(cases):
            row = measure_once(case, order)
            rows.append(row)
            log(f"[{name} {index + 1}/{len(cases)}] {case.name}: tf {row['tf']['seconds']:.4f} s, verdict "
                f"{row['verdict']['seconds']:.4f} s ({'ok' if row['verdict']['ok'] else 'not ok'})")
    record["floor"] = eager_floor()
    tf_first = _tf_first(cases)
    record["passes"][BOTH_COLD] = [{**row, "tf": cold_tf} for row, cold_tf in
                                   zip(record["passes"]["fastcheck first"], tf_first)]
    record["uptime_after"] = _uptime()
    record["wall_seconds"] = time.perf_counter() - started
    record["summary"] = {name: summarise_once(rows) for name, rows in record["passes"].items()}
    return record


def eager_floor(rounds: int = 5) -> dict:
    """Milliseconds per check of five 6-element float32 unary ops (a new f each time, every kernel warm; the median
    of ``rounds`` rounds of 20 checks): fastcheck, compute_gradient, and the eager calls a full check of them
    makes and nothing else -- f three times at x and once in float64 (planning), 2n float64 calls (the
    differences), one taped call and m VJPs (reverse mode).  These unary ops are element-wise: since
    ``diagonal`` reads that from the ops they run, fastcheck makes 2 calls a side and 2 VJPs instead of the loops,
    so its time can fall below this floor."""
    import tensorflow as tf

    import fastcheck

    x = tf.constant(np.arange(-3, 3).reshape(1, 3, 2).astype(np.float32))

    def floor(f):
        for _ in range(3):
            f(x)
        flat = x.numpy().astype(np.float64).reshape(-1)
        f(tf.constant(flat.reshape(x.shape)))
        for j in range(flat.size):
            for sign in (1, -1):
                moved = flat.copy()
                moved[j] += sign * 1e-5
                f(tf.constant(moved.reshape(x.shape))).numpy()
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = f(x)
        for basis in np.eye(flat.size, dtype=np.float32):
            tape.gradient(y, x, output_gradients=tf.constant(basis.reshape(x.shape))).numpy()

    runs = {"floor": floor, "fastcheck": lambda f: fastcheck.check_gradients(f, x),
            "compute_gradient": lambda f: tf.test.compute_gradient(f, [x])}
    ops = [tf.math.abs, tf.math.sin, tf.math.exp, tf.math.tanh, tf.math.square]
    seconds: dict = {label: [] for label in runs}
    for round_ in range(rounds + 1):
        for label, run in runs.items():
            start = time.perf_counter()
            for op in ops * 4:
                run(lambda t, op=op: op(t))
            if round_:  # the first round warms every kernel
                seconds[label].append((time.perf_counter() - start) / (4 * len(ops)) * 1e3)
    return {label: statistics.median(values) for label, values in seconds.items()}


_TF_FIRST_CHILD = r"""
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, {root!r})
import tensorflow as tf
from benchmarks import tf_tests as T
wanted = json.loads(sys.stdin.read())
cases = {{c.name: c for c in T.all_cases()}}
T.measure_once(T.Case("warm-up", "-", lambda: ((lambda x: tf.sin(x) * x), [tf.constant([0.1, 0.2, 0.3])]),
                      T._max_below(1e-2), "-"))
print("RESULT " + json.dumps([T.measure_once(cases[name], ("tf", "verdict"))["tf"] for name in wanted]))
"""


def _tf_first(cases: list[Case]) -> list[dict]:
    """compute_gradient's row of each case run once, tf first, in a fresh process after the same warm-up as
    ``run_once``'s: the op kernels cold for it as they are for fastcheck in the first pass."""
    code = _TF_FIRST_CHILD.format(root=str(Path(__file__).resolve().parent.parent))
    done = subprocess.run([sys.executable, "-c", code], input=json.dumps([c.name for c in cases]), capture_output=True,
                          text=True, timeout=1800, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not found:
        raise RuntimeError(f"the tf-first process printed no result: {done.stderr[-2000:]}")
    return json.loads(found[-1][len("RESULT "):])


def catches(case: Case) -> dict:
    """A planted defect, run once by each contender on a fresh function: caught where the check
    fails (tf, drop-in: the test's assertion; verdict: ``report.ok`` False) or raises.  Not timed
    for the speed summary."""
    row = {"name": case.name, "group": case.group, "defect": case.notes[0], "source": case.source,
           "bound": case.bound, "delta": case.delta}
    for label, run in CONTENDERS.items():
        result = _timed(run, case, *case.make())
        row[label] = {**result, "caught": not result["ok"]}
    return row


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return f"load average {os.getloadavg()}"


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf


def summarise(rows: list[dict]) -> dict:
    """One group's speed ratios and verdicts (``rows``: correct cases only, never a defect)."""
    summary = {}
    for label in ("drop-in", "verdict"):
        for when, key in (("fresh", "seconds"), ("warm", "warm_seconds")):
            ratios = [_ratio(r[label][key], r["tf"][key]) for r in rows]
            summary[f"{label} {when}"] = {
                "median_ratio": statistics.median(ratios),
                "total_ratio": _ratio(sum(r[label][key] for r in rows), sum(r["tf"][key] for r in rows)),
                "total_seconds": sum(r[label][key] for r in rows),
                "tf_total_seconds": sum(r["tf"][key] for r in rows),
                "slower": sum(ratio > 1 for ratio in ratios),
            }
    summary["disagreements"] = {
        label: [r["name"] for r in rows if r[label]["ok"] != r["tf"]["ok"]] for label in ("drop-in", "verdict")}
    summary["tf_failing"] = [r["name"] for r in rows if not r["tf"]["ok"]]
    summary["errors"] = {label: [r["name"] for r in rows if "error" in r[label]] for label in CONTENDERS}
    return summary


def summarise_groups(rows: list[dict]) -> dict:
    """``summarise`` for each group of correct cases present (a defect row is never in ``rows``)."""
    return {group: summarise([r for r in rows if r["group"] == group]) for group in GROUPS
            if any(r["group"] == group for r in rows)}


def summarise_defects(rows: list[dict]) -> dict:
    return {label: {"caught": sum(r[label]["caught"] for r in rows), "of": len(rows),
                    "missed": [r["name"] for r in rows if not r[label]["caught"]]} for label in CONTENDERS}


def _stages(row: dict) -> str:
    timings = row["verdict"].get("timings") or {}
    top = sorted(timings.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{k} {v * 1e3:.0f}" for k, v in top)


def _marked(result: dict) -> str:
    return "ok" if result["ok"] else ("ERROR" if "error" in result else "FAIL")


def markdown(record: dict) -> str:
    rows, groups = record["cases"], record["summary"]
    defects = record.get("defects", [])
    counts = ", ".join(f"{sum(r['group'] == g for r in rows)} {g}" for g in groups)
    lines = [
        "# TensorFlow's own gradient tests, as TensorFlow writes them",
        "",
        f"{len(rows)} correct cases from TensorFlow's test files ({counts}: *tuned* are the cases used while "
        "tuning fastcheck, *held-out* ones from test files not used then), each run three ways in one process: "
        "`tf.test.compute_gradient` + the test's own assertion (**tf**), `fastcheck.compute_gradient` + the same "
        "assertion (**drop-in**), and `fastcheck.check_gradients` (**verdict**, fastcheck's rule). *fresh*: a new "
        f"function object for each run (what each test of a suite pays; the fastest of {FRESH_REPEATS}), after a "
        f"warm-up case; *warm*: the same function again (the fastest of {WARM_REPEATS} runs, the contenders taking turns). Ratios are fastcheck / tf seconds (below 1: fastcheck faster).",
        "",
        f"- CPU: {record['cpu']} ({record['cpus']} logical CPUs), TensorFlow {record['tensorflow']}",
        f"- load before: `{record['uptime_before']}`",
        f"- load after: `{record['uptime_after']}`",
        f"- date: {record['date']}, wall time {record['wall_seconds']:.0f} s",
        "",
        "## Summary",
        "",
        "The cases of TensorFlow's tests, each group on its own (planted defects are never timed here). Their "
        "gradients are correct in the TensorFlow each test was written for; two held-out ones, the complex "
        "determinants, fail on TensorFlow 2.21 (its gradient is wrong there: the verdict lines below).",
        "",
        "| group | contender | when | median ratio | total ratio | fastcheck total s | tf total s | cases slower than tf |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for group, summary in groups.items():
        size = sum(r["group"] == group for r in rows)
        for key, s in summary.items():
            if key in ("disagreements", "tf_failing", "errors"):
                continue
            label, when = key.split(" ")
            lines.append(f"| {group} | {label} | {when} | {s['median_ratio']:.2f} | {s['total_ratio']:.2f} | "
                         f"{s['total_seconds']:.2f} | {s['tf_total_seconds']:.2f} | {s['slower']} / {size} |")
    lines += ["", "Verdicts against the test's own assertion on tf.test.compute_gradient's Jacobians:", ""]
    for group, summary in groups.items():
        lines.append(f"- {group}: tf's own assertion fails on: {', '.join(summary['tf_failing']) or 'none'}")
        for label in ("drop-in", "verdict"):
            names = summary["disagreements"][label]
            lines.append(f"- {group}: {label} disagrees with it on {len(names)}: {', '.join(names) or 'none'}")
        for label, names in summary["errors"].items():
            if names:
                lines.append(f"- {group}: {label} raised on: {', '.join(names)}")
    if defects:
        lines += _defect_lines(defects, record["defect_summary"])
    for group in groups:
        lines += _case_lines(group, [r for r in rows if r["group"] == group])
    lines += _slower_lines(rows)
    details = [r for r in rows if not r["verdict"]["ok"] or "error" in r["drop-in"] or "error" in r["tf"]]
    if details:
        lines += ["", "## Correct cases fastcheck's verdict does not pass, or a contender raised", ""]
        for r in details:
            for label in CONTENDERS:
                if "error" in r[label]:
                    lines.append(f"- {r['name']} ({label}): {r[label]['error']}")
            if not r["verdict"]["ok"] and "summary" in r["verdict"]:
                lines.append(f"- {r['name']} (verdict): {r['verdict']['summary']}")
    return "\n".join(lines) + "\n"


def _defect_lines(defects: list[dict], summary: dict) -> list[str]:
    lines = ["", "## Planted defects", "",
             f"{len(defects)} functions whose gradient is deliberately wrong (a `tf.custom_gradient` with a "
             "hand-written VJP), each under the check of the TF test it is modelled on, run once by each contender "
             "(not in the speed summary). *caught*: the test's assertion fails (tf, drop-in) or `report.ok` is False "
             "(verdict); an exception counts as caught.", ""]
    for label, s in summary.items():
        lines.append(f"- {label}: caught {s['caught']} / {s['of']}" + (f"; missed: {', '.join(s['missed'])}"
                                                                        if s["missed"] else ""))
    lines += ["", "| defect | what is wrong | check (source) | tf | drop-in | verdict | tf max_error | verdict's report |",
              "|---|---|---|---|---|---|---:|---|"]
    for r in defects:
        step = "" if r["delta"] is None else f", delta={r['delta']:g}"

        def caught(result):
            return ("caught" if result["caught"] else "**missed**") + (" (raised)" if "error" in result else "")

        error = r["tf"].get("max_error")
        lines.append(f"| {r['name']} | {r['defect']} | {r['bound']}{step} (`{r['source'].split('/')[-1]}`) "
                     f"| {caught(r['tf'])} | {caught(r['drop-in'])} | {caught(r['verdict'])} "
                     f"| {'-' if error is None else f'{error:.2e}'} "
                     f"| {r['verdict'].get('summary') or r['verdict'].get('error', '')} |")
    return lines


def _case_lines(group: str, rows: list[dict]) -> list[str]:
    lines = ["", f"## Cases: {group}", "",
             "| case | source | bound | tf s (ok) | drop-in s (ok) | verdict s (ok, path) | drop-in / tf | verdict / tf | "
             "warm: tf s | warm: drop-in / tf | warm: verdict / tf | verdict's top stages (ms) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        tf_, drop, verdict = r["tf"], r["drop-in"], r["verdict"]
        step = "" if r["delta"] is None else f", delta={r['delta']:g}"
        lines.append(
            f"| {r['name']} | `{r['source'].split('/')[-1]}` | {r['bound']}{step} "
            f"| {tf_['seconds']:.3f} ({_marked(tf_)}) | {drop['seconds']:.3f} ({_marked(drop)}) "
            f"| {verdict['seconds']:.3f} ({_marked(verdict)}{', ' + verdict['path'] if 'path' in verdict else ''}) "
            f"| {_ratio(drop['seconds'], tf_['seconds']):.2f} | {_ratio(verdict['seconds'], tf_['seconds']):.2f} "
            f"| {tf_['warm_seconds']:.3f} | {_ratio(drop['warm_seconds'], tf_['warm_seconds']):.2f} "
            f"| {_ratio(verdict['warm_seconds'], tf_['warm_seconds']):.2f} | {_stages(r)} |")
    return lines


def _slower_lines(rows: list[dict]) -> list[str]:
    lines: list[str] = []
    slower = [r for r in rows if r["verdict"]["seconds"] > r["tf"]["seconds"] and r["verdict"].get("timings")]
    if slower:
        stages: dict = {}
        for r in slower:
            for k, v in r["verdict"]["timings"].items():
                stages.setdefault(k, []).append(v)
        outside = [r["verdict"]["seconds"] - sum(r["verdict"]["timings"].values()) for r in slower]
        lines += ["", "## Where the verdict is slower than tf", "",
                  f"{len(slower)} cases (fresh). Their median tf time is "
                  f"{statistics.median(r['tf']['seconds'] for r in slower) * 1e3:.1f} ms and median verdict time "
                  f"{statistics.median(r['verdict']['seconds'] for r in slower) * 1e3:.1f} ms; median per stage "
                  "(`report.timings`, ms): "
                  + ", ".join(f"{k} {statistics.median(v) * 1e3:.1f}" for k, v in sorted(stages.items(), key=lambda kv: -statistics.median(kv[1])))
                  + f"; outside the stages (problem building, report) {statistics.median(outside) * 1e3:.1f}. "
                  "Paths: " + ", ".join(f"{p} {sum(r['verdict']['path'] == p for r in slower)}"
                                        for p in sorted({r['verdict']['path'] for r in slower})) + "."]
    return lines


def run(cases: list[Case], defects: list[Case] = (), log=print) -> dict:
    import tensorflow as tf

    started = time.perf_counter()
    record = {"cpu": _cpu_model(), "cpus": os.cpu_count(), "tensorflow": tf.__version__,
              "uptime_before": _uptime(), "date": time.strftime("%Y-%m-%d %H:%M"), "cases": []}
    warm_up = Case("warm-up", "-", lambda: ((lambda x: tf.sin(x) * x), [tf.constant([0.1, 0.2, 0.3])]),
                   _max_below(1e-2), "-")
    measure(warm_up)  # the process's first tracing, kernel lookups and imports: paid before any case
    for index, case in enumerate(cases):
        row = measure(case)
        record["cases"].append(row)
        log(f"[{index + 1}/{len(cases)}] {case.name}: tf {row['tf']['seconds']:.3f} s, drop-in "
            f"{row['drop-in']['seconds']:.3f} s, verdict {row['verdict']['seconds']:.3f} s "
            f"({'ok' if row['verdict']['ok'] else 'not ok'})")
    record["defects"] = []
    for index, case in enumerate(defects):
        row = catches(case)
        record["defects"].append(row)
        log(f"[defect {index + 1}/{len(defects)}] {case.name}: " + ", ".join(
            f"{label} {'caught' if row[label]['caught'] else 'MISSED'}" for label in CONTENDERS))
    record["uptime_after"] = _uptime()
    record["wall_seconds"] = time.perf_counter() - started
    record["summary"] = summarise_groups(record["cases"])
    record["defect_summary"] = summarise_defects(record["defects"])
    return record


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks tf_tests", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma-separated substrings of case names")
    parser.add_argument("--group", default=None,
                        help=f"comma-separated groups to run: {', '.join(GROUPS)}, {DEFECT} (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--cold", action="store_true",
                        help="each case's check as the first thing a fresh process does (tf_tests_cold.md)")
    parser.add_argument("--once", action="store_true",
                        help="each case checked once per contender, as a test suite runs it (tf_tests_once.md)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    cases, defects = all_cases(), defect_cases()
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        cases = [c for c in cases if any(w in c.name for w in wanted)]
        defects = [c for c in defects if any(w in c.name for w in wanted)]
    if args.group:
        groups = {g.strip() for g in args.group.split(",")}
        cases = [c for c in cases if c.group in groups]
        defects = [c for c in defects if c.group in groups]
    if not cases and not defects:
        print("no case matches --only / --group", file=sys.stderr)
        return 2
    if args.cold:
        text = cold_markdown([cold(case) for case in cases])
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tf_tests_cold.md").write_text(text)
        print(text)
        return 0
    if args.once:
        record = run_once(cases, log=lambda line: print(line, flush=True))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tf_tests_once.json").write_text(json.dumps(_json_safe(record), indent=1))
        text = once_markdown(record)
        (args.out / "tf_tests_once.md").write_text(text)
        print(text.split("| case |")[0])
        return 0
    record = run(cases, defects, log=lambda line: print(line, flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tf_tests.json").write_text(json.dumps(_json_safe(record), indent=1))
    text = markdown(record)
    (args.out / "tf_tests.md").write_text(text)
    print(text)
    print(f"wrote {args.out / 'tf_tests.md'}, {args.out / 'tf_tests.json'}")
    raised = any(s["errors"][label] for s in record["summary"].values() for label in ("drop-in", "verdict"))
    return 1 if raised else 0


# -- the first check of a fresh process ------------------------------------------------------------

_COLD_CHILD = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, {root!r})
import tensorflow as tf
import fastcheck
fastcheck.check_gradients, fastcheck.compute_gradient  # fastcheck's modules load on first use: before the clock
from benchmarks import tf_tests
case = next(c for c in tf_tests.all_cases() if c.name == {name!r})
f, xs = case.make()
start = time.perf_counter()
result = tf_tests.CONTENDERS[{label!r}](case, f, xs)
print("RESULT " + json.dumps({{"seconds": time.perf_counter() - start, "ok": bool(result["ok"])}}))
"""


def cold(case: Case) -> dict:
    """``case`` checked by tf and by fastcheck's verdict, each the first check of its own fresh process
    (TensorFlow and fastcheck imported, the case built, before the clock): ``python my_test.py``."""
    root = str(Path(__file__).resolve().parent.parent)
    row: dict = {"name": case.name, "group": case.group}
    for label in ("tf", "verdict"):
        code = _COLD_CHILD.format(root=root, name=case.name, label=label)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        row[label] = json.loads(found[-1][len("RESULT "):]) if found else {"seconds": math.nan, "ok": False}
    return row


def cold_markdown(rows: list[dict]) -> str:
    ratios = [_ratio(r["verdict"]["seconds"], r["tf"]["seconds"]) for r in rows]
    lines = ["# TensorFlow's own gradient tests, cold", "",
             "Each case's check as the first thing a fresh Python process does (TensorFlow and fastcheck imported and "
             "the case built before the clock), `tf.test.compute_gradient` + the test's assertion against "
             "`fastcheck.check_gradients`, one process each. Ratios are fastcheck / tf seconds.", "",
             f"- CPU: {_cpu_model()} ({os.cpu_count()} logical CPUs); load: `{_uptime()}`",
             f"- median ratio {statistics.median(ratios):.2f}, total ratio "
             f"{_ratio(sum(r['verdict']['seconds'] for r in rows), sum(r['tf']['seconds'] for r in rows)):.2f} "
             f"over {len(rows)} cases", "",
             "| case | group | tf s (ok) | verdict s (ok) | verdict / tf |", "|---|---|---:|---:|---:|"]
    for r, ratio in zip(rows, ratios):
        lines.append(f"| {r['name']} | {r['group']} | {r['tf']['seconds']:.3f} ({r['tf']['ok']}) | "
                     f"{r['verdict']['seconds']:.3f} ({r['verdict']['ok']}) | {ratio:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
