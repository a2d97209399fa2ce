"""Full mode's differences of many inputs through one kernel (``Route.joint_chunk``): same Jacobians
and verdicts as a kernel per input, one trace, and a planted defect still names its input -- convolutions
included, whose batched filters pfor alone would loop over (``pfor``)."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import checked, logged

import fastcheck
from fastcheck.engine import paths as _paths
from fastcheck.engine import tables as _tables

# A machine where tracing is (nearly) free.
FREE_TRACING = {"TRACE_SECONDS": 1e-9, "TRACE_CALLS": 0}

# The log lines of the differences' kernels: the one kernel (inputs, perturbations per call), dropped, an input's own.
JOINT = "differences: one kernel for all %d checked inputs"
DROPPED = "differences: vectorized_map converts some op"
OWN = "%s: its later differences run on a kernel of its own"

RNG = np.random.default_rng(3)
SHAPES = [(6, 5), (5,), (5, 4), (4,), (4, 3), (3,), (7,)]


def _mlp(off: int | None = None):
    values = [tf.constant(RNG.normal(size=shape) * 0.5) for shape in SHAPES]

    def wrong(v):
        @tf.custom_gradient
        def scaled(x):
            return x, lambda g: 1.01 * g

        return scaled(v)

    def f(w1, b1, w2, b2, w3, b3, x):
        params = [w1, b1, w2, b2, w3, b3]
        if off is not None:
            params[off] = wrong(params[off])
        w1, b1, w2, b2, w3, b3 = params
        h = tf.tanh(x[None, :6] @ w1 + b1)
        h = tf.tanh(h @ w2 + b2)
        return tf.reduce_sum(tf.sin(h @ w3 + b3)) + tf.reduce_sum(x**2)

    return f, values


@pytest.mark.parametrize("jit_compile", [True, False])
def test_one_kernel_gives_the_per_input_jacobians(jit_compile, debug_log):
    f, values = _mlp()
    joint = fastcheck.check_gradients(f, values, mode="full", jit_compile=jit_compile)
    assert [inputs for inputs, _ in logged(debug_log, JOINT)] == [7] and not logged(debug_log, DROPPED)
    # On a machine where tracing is (nearly) free a kernel per input saves the joint kernel's extra work.
    debug_log.clear()
    separate = checked(f, values, mode="full", jit_compile=jit_compile, tables=FREE_TRACING)
    assert not logged(debug_log, JOINT)
    assert joint.ok and separate.ok
    for a, b in zip(joint.pairs, separate.pairs):
        # the batched rows round f otherwise (a batched matmul): a few roundings of f over the span 2h ~ 1e-5
        np.testing.assert_allclose(a.numerical, b.numerical, rtol=0, atol=1e-9)
        np.testing.assert_array_equal(a.status, b.status)


def test_one_kernel_names_the_defective_input(debug_log):
    f, values = _mlp(off=2)
    report = fastcheck.check_gradients(f, values, mode="full", jit_compile=True)
    assert logged(debug_log, JOINT) and not logged(debug_log, DROPPED)
    assert [p.input_name for p in report.failures] == [report.pairs[2].input_name], str(report)


def _cnn(off: int | None = None):
    """A convolution, a second one and a depthwise one (NHWC), every filter and the image checked: in one kernel
    every filter is batched; in the first inputs' own kernels the later depthwise filter is not."""
    shapes = [(2, 6, 6, 3), (3, 3, 3, 4), (3, 3, 4, 4), (3, 3, 4, 1)]
    values = [tf.constant(RNG.normal(size=shape) * 0.5) for shape in shapes]

    def f(x, k1, k2, depthwise):
        if off is not None:
            @tf.custom_gradient
            def scaled(v):
                return v, lambda g: 1.01 * g

            depthwise = scaled(depthwise)
        h = tf.tanh(tf.nn.conv2d(x, k1, 1, "SAME"))
        h = tf.tanh(tf.nn.conv2d(h, k2, 1, "SAME"))
        return tf.reduce_sum(tf.sin(tf.nn.depthwise_conv2d(h, depthwise, (1, 1, 1, 1), "VALID")))

    return f, values


@pytest.mark.parametrize("jit_compile", [True, False])
def test_convolutions_share_one_kernel(jit_compile, debug_log):
    f, values = _cnn()
    joint = fastcheck.check_gradients(f, values, mode="full", jit_compile=jit_compile)
    assert [inputs for inputs, _ in logged(debug_log, JOINT)] == [4] and not logged(debug_log, DROPPED)
    debug_log.clear()
    separate = checked(f, values, mode="full", jit_compile=jit_compile, tables=FREE_TRACING)
    assert not logged(debug_log, JOINT)
    assert joint.ok and separate.ok, (str(joint), str(separate))
    for a, b in zip(joint.pairs, separate.pairs):
        # f sums 36 outputs of size ~1: a few of its roundings over the span 2h ~ 1e-5 (threads order the
        # convolutions' sums otherwise)
        np.testing.assert_allclose(a.numerical, b.numerical, rtol=0, atol=2e-8)
        np.testing.assert_array_equal(a.status, b.status)
    debug_log.clear()
    wrong = fastcheck.check_gradients(*_cnn(off=3), mode="full", jit_compile=jit_compile)
    assert logged(debug_log, JOINT) and not logged(debug_log, DROPPED)
    assert [p.input_name for p in wrong.failures] == [wrong.pairs[3].input_name], str(wrong)


def test_a_transposed_convolution_keeps_a_kernel_per_input(debug_log):
    # pfor loops over a transposed convolution whose filter is batched: routing gives its f a kernel per input
    # rather than trace a joint kernel only to drop it.
    x, k1, k2 = (tf.constant(RNG.normal(size=shape) * 0.5) for shape in [(1, 4, 4, 2), (3, 3, 2, 3), (3, 3, 2, 3)])

    def f(k1, k2):
        h = tf.tanh(tf.nn.conv2d(x, k1, 1, "SAME"))
        return tf.reduce_sum(tf.sin(tf.nn.conv2d_transpose(h, k2, [1, 8, 8, 2], 2)))

    report = fastcheck.check_gradients(f, [k1, k2], mode="full", jit_compile=False)
    assert report.ok, str(report)
    assert not logged(debug_log, DROPPED) and not logged(debug_log, JOINT)


def _deep(off: bool = False):
    """w feeds every op of f, b only its last three: b's own kernel evaluates a small share of the joint one's."""
    v = tf.constant(RNG.normal(size=(4,)))
    values = [tf.constant(RNG.normal(size=shape) * 0.5) for shape in [(4, 4), (4,)]]

    def f(w, b):
        if off:
            @tf.custom_gradient
            def scaled(x):
                return x, lambda g: 1.01 * g

            b = scaled(b)
        h = tf.tanh(tf.linalg.matvec(w, v))
        for _ in range(6):
            h = tf.tanh(tf.linalg.matvec(w, h))
        return tf.reduce_sum(tf.sin(h + b))

    return f, values


@pytest.mark.parametrize("off", [False, True], ids=["correct", "b wrong"])
def test_an_input_whose_own_kernel_evaluates_less_leaves_the_joint_one(off, debug_log):
    # A kernel's trace predicted at microseconds (still more than the joint kernel's extra work): the ladder on b's
    # wrong columns makes its joint calls' predicted cost beyond its own kernel's share add up to a trace, so its later
    # differences take their own kernel; w's own kernel would evaluate every op (no excess), so it stays.  The
    # numbers are a kernel per input's.
    f, values = _deep(off)
    report = checked(f, values, mode="full", jit_compile=False, tables={"TRACE_SECONDS": 3e-6, "TRACE_CALLS": 0})
    assert logged(debug_log, JOINT)
    own = [report.pairs[1].input_name] if off else []
    assert [name for (name,) in logged(debug_log, OWN)] == own
    debug_log.clear()
    separate = checked(f, values, mode="full", jit_compile=False, tables=FREE_TRACING)
    assert not logged(debug_log, OWN) and report.ok == separate.ok == (not off)
    for a, b in zip(report.pairs, separate.pairs):
        np.testing.assert_allclose(a.numerical, b.numerical, rtol=0, atol=1e-9)
        np.testing.assert_array_equal(a.status, b.status)
    if off:
        assert [p.input_name for p in report.failures] == [report.pairs[1].input_name], str(report)


def test_joint_chunk_rule():
    plan_sizes = [int(np.prod(s)) for s in SHAPES]

    class Spec:
        def __init__(self, size, position):
            self.size, self.dtype, self.position = size, tf.float64, position

    class Plan:
        checked = [Spec(s, i) for i, s in enumerate(plan_sizes)]
        eval_upcast = True
        n = sum(plan_sizes)

    assert _paths.joint_chunk(Plan, _paths.LOOP, 64, 1.0) == 0  # map_fn reuses f's one trace already
    assert _paths.joint_chunk(Plan, _paths.XLA, 64, 0.0) == 0  # nothing to save
    chunk = _paths.joint_chunk(Plan, _paths.XLA, 64, 1.0)
    assert _tables.JOINT_MIN_CHUNK <= chunk <= max(plan_sizes)
    # Every op depends on every input: a row of the joint kernel evaluates what a per-input one does.
    dense = _paths.Probe(False, 1, 10**6, None, frozenset(), False, downstream=(10**6,) * len(SHAPES),
                         checked_flops=10**6)
    assert _paths.joint_chunk(Plan, _paths.XLA, 64, 1.0, dense) == chunk
    # A convolution stem every row of the joint kernel evaluates, before a head of many elements whose own kernel
    # evaluates the head alone: a kernel per input.
    stem = _paths.Probe(False, 1, 10**8, None, frozenset(), False, downstream=(10**8,) + (10**3,) * (len(SHAPES) - 1),
                        checked_flops=10**8)
    Plan.checked = [Spec(432, 0)] + [Spec(4000, i) for i in range(1, len(SHAPES))]
    Plan.n = sum(s.size for s in Plan.checked)
    assert _paths.joint_chunk(Plan, _paths.XLA, 64, 1.0) > 0
    assert _paths.joint_chunk(Plan, _paths.XLA, 64, 1.0, stem) == 0
    Plan.checked = Plan.checked[:1]
    assert _paths.joint_chunk(Plan, _paths.XLA, 64, 1.0) == 0  # one input: its own kernel
