"""Element-wise f on the eager path (``diagonal``): the same Jacobians, bit for bit, as the loops."""

import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf
from conftest import checked, logged

import fastcheck


def _reports(f, xs, **options):
    """(the loops' check, ``DIAGONAL_MIN_ELEMENTS`` above any size and no colours; the default check, which tries the
    few calls; the calls of f each made).  The loops' first sweep is 2n calls of f, the shortcut's 2: an element-wise f's check
    makes fewer calls than the loops, any other f's at least as many (the two calls that show it is not element-wise
    on top)."""
    calls = []

    def counted(*args):
        calls.append(1)
        return f(*args)

    tables = options.pop("tables", {})
    loops = checked(counted, xs, progress=False, **options,
                    tables={**tables, "DIAGONAL_MIN_ELEMENTS": 10**9, "EAGER_COLOUR_SECONDS": 1e9})
    loop_calls = len(calls)
    calls.clear()
    fast = checked(counted, xs, progress=False, tables=tables, **options)
    return loops, fast, loop_calls, len(calls)


ELEMENTWISE = "%s: f is element-wise in it"  # (input, side, what took 2 calls)
EAGER_COLOURS = "eager %s loop by f's traced sparsity pattern"  # (side, rows or columns, which, colours)


def _elementwise_sides(caplog) -> set:
    """The sides on which the logged checks' eager loops made ``diagonal``'s few calls."""
    return {side for _, side, _ in logged(caplog, ELEMENTWISE)}


def _eager_colours(caplog) -> dict:
    """side -> the most colours an eager loop of the logged checks took by f's traced pattern."""
    found: dict = {}
    for side, _, _, colours in logged(caplog, EAGER_COLOURS):
        found[side] = max(colours, found.get(side, 0))
    return found


def _same(a, b) -> bool:
    return a.verdict == b.verdict and len(a.pairs) == len(b.pairs) and all(
        np.array_equal(x, y, equal_nan=True)
        for p, q in zip(a.pairs, b.pairs) for x, y in ((p.numerical, q.numerical), (p.analytical, q.analytical)))


@pytest.mark.parametrize("op", [tf.math.tanh, tf.math.sqrt, tf.math.log, tf.math.sign, tf.math.special.bessel_i1e,
                                lambda t: t * tf.sin(t) + 3.0])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_same_jacobians_as_the_loops(op, dtype):
    # 0 and a negative value: sqrt's and log's gradients are not finite there (NaN off the diagonal
    # of the row loop's blocks, 0 * inf), log's value too: the blocks must carry them as the loops do
    x = tf.constant([[0.0, -1.5, 0.25], [2.0, 3.5, 1e-3]], dtype)
    f = lambda t: op(t)  # noqa: E731
    loops, fast, loop_calls, calls = _reports(f, [x])
    assert calls < loop_calls, (loop_calls, calls)  # the loops, then the shortcut's few calls
    assert fast.path == "eager" and _same(loops, fast)


def test_a_broadcast_gradients_sum_over_a_leading_axis_of_one_is_elementwise(debug_log):
    # 1.1 * t: Mul's gradient sums the cotangent over the axes t shares with the scalar by broadcasting, here the
    # leading 1 (BroadcastGradientArgs names it): a reduction of n elements to n, one element each (TensorFlow's
    # own binary-op tests check such an f).  The VJPs make the few calls, with the row loop's numbers.
    x = tf.constant([[[0.1, 0.5], [-0.3, 0.9], [1.7, -2.2]]])
    loops, fast, loop_calls, calls = _reports(lambda t: 1.1 * tf.multiply(t, tf.cos(x)), [x])
    assert calls < loop_calls and _same(loops, fast)
    assert _elementwise_sides(debug_log) == {"reverse", "numerical"}


# sign's own gradient (zeros); a wrong one, alike in every row (ones: every entry off the diagonal wrong too)
@pytest.mark.parametrize("forward, gradient, verdict", [(tf.sign, tf.zeros_like, "pass"),
                                                        (lambda t: 2.0 * t, tf.ones_like, "fail")])
def test_a_gradient_that_ignores_its_cotangent_is_elementwise(forward, gradient, verdict, debug_log):
    # Every row's VJP is the same value: the two VJPs give it bit for bit, and the row loop's block is that value in
    # every row.
    @tf.custom_gradient
    def f(t):
        return forward(t), lambda g: gradient(t)

    x = tf.constant([[0.3, -1.5, 0.25], [2.0, -3.5, 1e-3]])
    loops, fast, _, _ = _reports(f, [x])
    assert _same(loops, fast) and fast.verdict == verdict
    assert _elementwise_sides(debug_log) == {"reverse", "numerical"}


def test_a_gradient_that_mixes_elements_is_not_elementwise():
    @tf.custom_gradient
    def mixed(t):
        y = tf.tanh(t)
        return y, lambda g: tf.reverse(g, [0]) * (1 - y * y)  # wrong: row i's gradient lands on element n-1-i

    x = tf.constant([0.1, 0.5, -0.3, 0.9])
    loops, fast, loop_calls, calls = _reports(mixed, [x])
    # Its forward is element-wise (the numerical side's two calls), its gradient not (the rows' loop): a shortcut
    # taken for the VJPs would give another analytical block than the loops'.
    assert calls < loop_calls and fast.verdict == "fail" and _same(loops, fast)


@pytest.mark.parametrize("f", [
    lambda t: t * tf.constant(float(np.sum(t.numpy())), t.dtype),  # a dependence through numpy: no graph
    lambda t: tf.cumsum(t),  # not element-wise
    lambda t: tf.tanh(t) * tf.reduce_sum(t),
    lambda t: tf.reverse(tf.tanh(t), [0]),
])
def test_not_elementwise(f):
    x = tf.constant([0.1, 0.5, -0.3, 0.9], tf.float64)
    loops, fast, loop_calls, calls = _reports(f, [x])
    assert calls >= loop_calls and _same(loops, fast)


def test_compute_gradient_with_delta_does_not_keep_f_alive():
    # delta= moves f's own inputs (no wrapper around f): a repeated call gives the same Jacobians, and
    # f leaves with its last reference (its cached kernels and structure with it).
    x = tf.constant([1.0, 2.0, 3.0])
    f = lambda t: tf.sin(t)  # noqa: E731
    first = fastcheck.compute_gradient(f, [x], delta=1e-3)
    again = fastcheck.compute_gradient(f, [x.numpy()], delta=1e-3)
    assert all(np.array_equal(a, b) for a, b in zip(first[0] + first[1], again[0] + again[1]))
    held = weakref.ref(f)
    del f
    gc.collect()
    assert held() is None


def test_a_fresh_f_makes_the_few_calls_on_its_first_check():
    # Its ops are read as they run: no graph to build, so a suite's fresh f per test makes the few calls at once,
    # and a repeated check makes as many.
    calls = []

    def f(t):
        calls.append(1)
        return tf.tanh(t)

    x = tf.constant(np.linspace(-1.0, 1.0, 6))
    counts = []
    for _ in range(2):
        calls.clear()
        report = fastcheck.check_gradients(f, [x], progress=False)
        assert report.ok and report.path == "eager", str(report)
        counts.append(len(calls))
    assert counts[0] == counts[1] < 2 * x.shape[0], counts  # planning's calls, the taped call and 2, not 2n + 5


@pytest.mark.parametrize("f", [
    lambda t: t * tf.constant(float(np.sum(np.abs(t.numpy()))), t.dtype),  # a constant read through numpy
    lambda t: tf.tanh(t) * tf.constant(np.cumsum(t.numpy()), t.dtype),
])
def test_a_dependence_through_numpy_is_seen_in_the_constants(f):
    # No op links the moved values to the constant f builds from them: it differs between the two calls, and the
    # loops run (their Jacobian has the dependence the gradient misses: a FAIL either way, with the loops' numbers).
    x = tf.constant([0.1, 0.5, -0.3, 0.9], tf.float64)
    loops, fast, loop_calls, calls = _reports(f, [x])
    assert calls >= loop_calls and _same(loops, fast) and fast.verdict == "fail"


def test_a_gradient_read_through_numpy_is_not_elementwise():
    @tf.custom_gradient
    def g(t):
        return tf.sin(t), lambda dy: dy * tf.cos(t) + tf.constant(float(np.sum(dy.numpy())), t.dtype)  # wrong

    x = tf.constant([0.1, 0.5, -0.3, 0.9], tf.float64)
    loops, fast, loop_calls, calls = _reports(g, [x])
    assert fast.verdict == "fail" and _same(loops, fast)


@pytest.mark.parametrize("name", ["gelu", "mish", "hard_silu", "log1mexp", "where", "lambertw"])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_library_functions_take_the_few_calls_with_the_loops_numbers(name, dtype):
    # Keras activations and TFP functions as users call them: element-wise ones make the few calls, bit for bit
    # the loops' Jacobians; lambertw (a while_loop inside) is not read as element-wise and runs the loops.
    import keras
    import tensorflow_probability as tfp

    f = {"gelu": keras.activations.gelu, "mish": keras.activations.mish, "hard_silu": keras.activations.hard_silu,
         "log1mexp": lambda t: tfp.math.log1mexp(-tf.abs(t) - 0.1),
         "where": lambda t: tf.where(t > 0, tf.sqrt(tf.abs(t)), tf.zeros_like(t)),
         "lambertw": lambda t: tfp.math.lambertw(tf.abs(t))}[name]
    x = tf.constant(np.random.default_rng(0).normal(size=(3, 4)), dtype)
    # Traces priced high keep every f eager (the shortcut under test is the eager path's); the colours off:
    # lambertw's traced pattern would let its columns share calls, ``test_a_while_loop...``.
    loops, fast, loop_calls, calls = _reports(f, [x], tables={"EAGER_COLOUR_SECONDS": 1e9, "TRACE_SECONDS": 1e3})
    assert fast.path == "eager" and _same(loops, fast) and fast.verdict == "pass", str(fast)
    assert (calls >= loop_calls) == (name == "lambertw"), (loop_calls, calls)


def test_the_log_says_which_sides_made_the_few_calls(debug_log):
    @tf.custom_gradient
    def mixed(t):
        y = tf.tanh(t)
        return y, lambda g: tf.reverse(g, [0]) * (1 - y * y)  # its gradient mixes elements: the rows' loop

    x = tf.constant([0.1, 0.5, -0.3, 0.9], tf.float64)
    fastcheck.check_gradients(tf.tanh, x)
    assert _elementwise_sides(debug_log) == {"reverse", "numerical"}
    assert {name for name, _, _ in logged(debug_log, ELEMENTWISE)} == {"input"}
    assert not any(n.startswith("input: f is element-wise") for n in checked(tf.tanh, x).notes)  # no verdict's note
    debug_log.clear()
    fastcheck.check_gradients(mixed, x)
    assert _elementwise_sides(debug_log) == {"numerical"}
    for f, tables in ((tf.math.cumsum, None), (tf.tanh, {"DIAGONAL_MIN_ELEMENTS": 10**9})):
        debug_log.clear()
        checked(f, x, tables=tables)
        assert not logged(debug_log, ELEMENTWISE)


# -- the eager loops by colours of f's traced pattern (``eager_colours``) ---------------------------------------

KERNEL_2X2 = tf.constant(np.random.default_rng(4).normal(size=(2, 2, 3, 2)), tf.float32)


def _coloured_and_loop(f, x, log):
    """(the check with the eager loops coloured whatever their length, the loops' check), both on the eager path
    (traces priced at 1000 s); the loops' check runs first and takes no colours, so ``log`` (``debug_log``) holds
    the coloured check's lines."""
    loop = checked(f, x, tables={"EAGER_COLOUR_SECONDS": 1e9, "TRACE_SECONDS": 1e3})
    assert not _eager_colours(log)
    log.clear()
    coloured = checked(f, x, tables={"EAGER_COLOUR_SECONDS": 0.0, "TRACE_SECONDS": 1e3})
    return coloured, loop


def test_the_eager_loops_take_one_call_per_colour_with_the_loops_numbers(debug_log):
    # A depthwise convolution (as TensorFlow's own test): 96 rows in 8 colours, 48 columns in 4; every value is
    # the loops'.
    x = tf.constant(np.random.default_rng(5).normal(size=(1, 4, 4, 3)), tf.float32)
    coloured, loop = _coloured_and_loop(lambda t: tf.nn.depthwise_conv2d(t, KERNEL_2X2, [1, 1, 1, 1], "SAME"), x,
                                        debug_log)
    assert coloured.path == loop.path == "eager" and coloured.ok and loop.ok
    rows = {count for side, count, _, _ in logged(debug_log, EAGER_COLOURS) if side == "reverse"}
    sides = _eager_colours(debug_log)
    assert rows == {96} and sides["reverse"] < 96 // 2 and sides["numerical"] < 48 // 2
    assert _same(coloured, loop)


def test_a_gradient_leaking_outside_fs_pattern_fails_as_in_the_row_loop(debug_log):
    # Output (0, 0) reads x's top-left 2x2 window only; this gradient also sends 1e-3 of every row's cotangent to
    # x's last element.  Coloured VJPs read only the pattern's nonzeros: the random cotangent's VJP shows the leak,
    # and the row loop runs.
    x = tf.constant(np.random.default_rng(6).normal(size=(1, 4, 4, 1)), tf.float32)
    kernel = tf.constant([[[[0.5]], [[-1.0]]], [[[2.0]], [[0.25]]]], tf.float32)

    @tf.custom_gradient
    def leaky(t):
        def grad(dy):
            true = tf.compat.v1.nn.conv2d_backprop_input(tf.shape(t), kernel, dy, [1, 1, 1, 1], "VALID")
            return true + 1e-3 * tf.reduce_sum(dy) * tf.reshape(tf.one_hot(15, 16), t.shape)

        return tf.nn.conv2d(t, kernel, 1, "VALID"), grad

    coloured, loop = _coloured_and_loop(leaky, x, debug_log)
    assert coloured.verdict == loop.verdict == "fail" and _same(coloured, loop)
    assert "reverse" not in _eager_colours(debug_log)  # the numerical side may take its colours: f's pattern is right
    np.testing.assert_array_equal(coloured.pairs[0].status, loop.pairs[0].status)


def test_a_gradient_that_runs_once_per_forward_pass_leaves_the_colours_to_the_loop(debug_log):
    # Like tf.py_function's gradient, this one runs once per forward pass: the colours' second VJP raises, and the
    # row loop (a fresh tape per row) checks it as before the colours existed.
    x = tf.constant(np.random.default_rng(5).normal(size=(1, 4, 4, 3)), tf.float32)

    @tf.custom_gradient
    def once(t):
        used = []

        def grad(dy):
            if used:
                raise RuntimeError("this gradient runs once")
            used.append(1)
            return tf.compat.v1.nn.depthwise_conv2d_native_backprop_input(tf.shape(t), KERNEL_2X2, dy, [1, 1, 1, 1],
                                                                           "SAME")

        return tf.nn.depthwise_conv2d(t, KERNEL_2X2, [1, 1, 1, 1], "SAME"), grad

    coloured, loop = _coloured_and_loop(once, x, debug_log)
    assert coloured.ok and loop.ok and _same(coloured, loop) and not _eager_colours(debug_log)


def _windows(leak: float = 0.0):
    """Three outputs over overlapping windows of 48 columns: two row colours (more than half the rows: the row loop
    runs), 20 column colours (at most half the columns).  ``leak``: the gradient also sends that share of y0's
    cotangent to x[47], which y0 does not read."""

    @tf.custom_gradient
    def leaky(x):
        def grad(dy):
            return dy * tf.ones_like(x) + leak * dy[0] * tf.one_hot(47, 48, dtype=x.dtype)

        return tf.identity(x), grad

    def f(x):
        x = leaky(x)
        return tf.stack([tf.reduce_sum(x[0:20] ** 2), tf.reduce_sum(tf.sin(x[14:34])), tf.reduce_sum(x[28:48] ** 3)])

    return f


def test_a_row_loop_too_short_to_colour_checks_the_pattern_for_the_columns(debug_log):
    x = tf.constant(np.random.default_rng(7).normal(size=48), tf.float64)
    coloured, loop = _coloured_and_loop(_windows(), x, debug_log)
    assert _eager_colours(debug_log).keys() == {"numerical"} and coloured.ok and loop.ok and _same(coloured, loop)


def test_a_gradient_leaking_outside_fs_pattern_keeps_the_column_loop(debug_log):
    # The row loop's blocks show the gradient outside f's pattern: the columns are not coloured by it.
    x = tf.constant(np.random.default_rng(7).normal(size=48), tf.float64)
    coloured, loop = _coloured_and_loop(_windows(leak=1e-3), x, debug_log)
    assert coloured.verdict == loop.verdict == "fail" and not _eager_colours(debug_log)
    assert _same(coloured, loop)


@pytest.mark.parametrize("wrong", [False, True], ids=["correct", "wrong"])
def test_routing_prices_the_eager_loops_by_fs_pattern(wrong, debug_log):
    # A depthwise convolution of 1600 elements: its eager loops, 2n calls of f and m VJPs, are predicted at many
    # traces, by f's pattern (4 column and 4 row colours) at a few dozen calls: routed eager, saying so.  (Eager
    # loops predicted at 4x f's calls: on a machine whose eager calls are cheap, the dense loops still cost more than
    # a trace, and the colours' few dozen calls far less.)

    kernel = tf.constant(np.random.default_rng(8).normal(size=(2, 2, 1, 1)))

    @tf.custom_gradient
    def off(y):
        return y, lambda g: (1.01 if wrong else 1.0) * g

    x = tf.constant(np.random.default_rng(9).normal(size=(1, 40, 40, 1)))
    report = fastcheck.check_gradients(lambda t: off(tf.nn.depthwise_conv2d(t, kernel, [1, 1, 1, 1], "SAME")), x)
    ((path, why),) = logged(debug_log, "route: ")
    assert path == report.path == "eager" and why.startswith("eager loops by colours of f's traced pattern predicted")
    assert _eager_colours(debug_log)
    assert report.verdict == ("fail" if wrong else "pass"), str(report)


def test_a_while_loops_element_wise_pattern_lets_its_columns_share_calls(debug_log):
    # lambertw iterates in a while loop: its numerical side is not read as element-wise from the ops its calls run,
    # but its traced pattern (the loop's settled dependencies) is the diagonal, which its element-wise VJPs keep to:
    # its 12 columns take one pair of calls, with the loops' numbers.
    import tensorflow_probability as tfp

    x = tf.constant(np.random.default_rng(0).normal(size=(3, 4)), tf.float64)
    coloured, loop = _coloured_and_loop(lambda t: tfp.math.lambertw(tf.abs(t)), x, debug_log)
    assert _eager_colours(debug_log) == {"numerical": 1} and coloured.ok and _same(coloured, loop)
