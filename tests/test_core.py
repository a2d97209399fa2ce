"""Core engine: correct Jacobians pass, planted defects fail, across variants and dtypes."""

import dataclasses
import json

import numpy as np
import pytest
import tensorflow as tf
from conftest import events_of, logged

import fastcheck

RNG = np.random.default_rng(1234)
A = RNG.normal(size=(5, 7))
B = RNG.normal(size=(7, 4))
KERNEL = RNG.normal(size=(3, 3, 2, 3))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


# name -> (f, inputs maker(dtype), closed-form Jacobian maker(numpy inputs) -> list over inputs or None)
CORRECT = {
    "linear_map": (
        lambda x: tf.linalg.matvec(tf.constant(A, x.dtype), x),
        lambda d: [tf.constant(RNG.normal(size=7), d)],
        lambda x: [A],
    ),
    "elementwise_tanh": (
        tf.tanh,
        lambda d: [tf.constant(np.linspace(-2, 2, 9), d)],
        lambda x: [np.diag(1 - np.tanh(x) ** 2)],
    ),
    "elementwise_sigmoid_times_x": (
        lambda x: x * tf.sigmoid(x),
        lambda d: [tf.constant(np.linspace(-3, 3, 8), d)],
        lambda x: [np.diag(_sigmoid(x) + x * _sigmoid(x) * (1 - _sigmoid(x)))],
    ),
    "matmul_both_inputs": (
        tf.matmul,
        lambda d: [tf.constant(A, d), tf.constant(B, d)],
        lambda a, b: [np.kron(np.eye(5), b.T), np.kron(a, np.eye(4))],
    ),
    "softmax": (
        tf.nn.softmax,
        lambda d: [tf.constant(RNG.normal(size=6), d)],
        lambda x: [np.diag(_softmax(x)) - np.outer(_softmax(x), _softmax(x))],
    ),
    "reduce_sum_of_squares": (
        lambda x: tf.reduce_sum(x**2, axis=1),
        lambda d: [tf.constant(RNG.normal(size=(3, 4)), d)],
        lambda x: [np.stack([np.concatenate([2 * x[i] if j == i else np.zeros(4) for j in range(3)]) for i in range(3)])],
    ),
    "gather": (
        lambda x: tf.gather(x, [2, 0, 2]),
        lambda d: [tf.constant(RNG.normal(size=4), d)],
        lambda x: [np.eye(4)[[2, 0, 2]]],
    ),
    "conv2d": (
        lambda img: tf.nn.conv2d(img, tf.constant(KERNEL, img.dtype), 1, "SAME"),
        lambda d: [tf.constant(RNG.normal(size=(1, 5, 5, 2)), d)],
        None,
    ),
    "reduce_logsumexp": (
        tf.reduce_logsumexp,
        lambda d: [tf.constant(RNG.normal(size=10), d)],
        lambda x: [_softmax(x)[None, :]],
    ),
}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_correct_jacobians_pass(name, variant, dtype):
    f, make, expected = CORRECT[name]
    inputs = make(dtype)
    report = fastcheck.check_gradients(variant(f), inputs)
    assert report.ok, str(report)
    assert bool(report) is True
    if expected is not None:
        want = expected(*[x.numpy().astype(np.float64) for x in inputs])
        got = fastcheck.numerical_jacobian(variant(f), inputs)[0]
        tolerance = 1e-7 if dtype == tf.float64 else 2e-4
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=tolerance, rtol=tolerance)
        for pair, w in zip(report.pairs, want):
            np.testing.assert_allclose(pair.analytical, w, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("jit_compile", [True, False])
@pytest.mark.parametrize("name", ["linear_map", "matmul_both_inputs", "conv2d", "softmax"])
def test_batched_paths_agree_with_eager_reference(name, jit_compile):
    f, make, _ = CORRECT[name]
    inputs = make(tf.float64)
    report = fastcheck.check_gradients(f, inputs, jit_compile=jit_compile)
    assert report.ok, str(report)
    assert report.path == ("xla" if jit_compile else "graph")
    reference = [tf.test.compute_gradient(f, inputs, delta=1e-6)]
    theoretical, numeric = reference[0]
    for pair, t, n in zip(report.pairs, theoretical, numeric):
        np.testing.assert_allclose(pair.analytical, t, atol=1e-9)
        np.testing.assert_allclose(pair.numerical, n, atol=1e-5)


def _custom(forward, backward):
    @tf.custom_gradient
    def f(x):
        def grad(upstream):
            return backward(x, upstream)

        return forward(x), grad

    return f


def _one_wrong_element(x, upstream):
    g = upstream * 2 * x
    mask = tf.reshape(tf.one_hot(7 * 50 + 13, 2500, dtype=x.dtype), (50, 50))
    return g + mask * upstream * 0.5


# name -> (f, inputs(dtype), (output index, input index) where the defect must be found, or None)
WRONG = {
    "sign_flip": (_custom(tf.sin, lambda x, g: -g * tf.cos(x)), lambda d: tf.constant(np.linspace(0.1, 1, 6), d), None),
    "factor_two": (_custom(tf.square, lambda x, g: g * x), lambda d: tf.constant(np.linspace(0.5, 2, 6), d), None),
    "missing_chain_term": (
        _custom(lambda x: tf.sin(x**2), lambda x, g: g * tf.cos(x**2)),
        lambda d: tf.constant(np.linspace(0.5, 1.5, 5), d),
        None,
    ),
    "transposed_matmul": (
        _custom(lambda x: tf.linalg.matvec(tf.constant(A[:, :5], x.dtype), x),
                lambda x, g: tf.linalg.matvec(tf.constant(A[:, :5], x.dtype), g)),
        lambda d: tf.constant(RNG.normal(size=5), d),
        None,
    ),
    "one_wrong_element_in_50x50": (
        _custom(lambda x: x**2, _one_wrong_element),
        lambda d: tf.constant(RNG.uniform(0.5, 1.5, size=(50, 50)), d),
        ((7, 13), (7, 13)),
    ),
    "stop_gradient_misplaced": (
        lambda x: x * tf.stop_gradient(tf.exp(x)),
        lambda d: tf.constant(np.linspace(-1, 1, 6), d),
        None,
    ),
    "wrong_only_at_large_values": (
        _custom(tf.tanh, lambda x, g: g * tf.where(tf.abs(x) > 2, tf.zeros_like(x), 1 - tf.tanh(x) ** 2)),
        lambda d: tf.constant(np.linspace(-2.5, 2.5, 11), d),
        {((0,), (0,)), ((10,), (10,))},  # tanh is odd: both ends are wrong by the same amount
    ),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_gradients_fail(name, variant, dtype):
    f, make, location = WRONG[name]
    report = fastcheck.check_gradients(variant(f), make(dtype))
    assert not report.ok, f"{name} was not flagged:\n{report}"
    with pytest.raises(fastcheck.GradientCheckError) as raised:
        fastcheck.assert_gradients_close(variant(f), make(dtype))
    assert isinstance(raised.value, AssertionError)
    assert "FAIL" in str(raised.value)
    if location is not None:  # one (output, input) entry, or a set of equally wrong ones
        places = location if isinstance(location, set) else {location}
        worst = report.pairs[0].worst_element
        assert (worst.output_index, worst.input_index) in places, str(report)
        assert f"input[{', '.join(map(str, worst.input_index))}]" in str(report)


def test_wrong_gradient_for_second_input_only(dtype):
    @tf.custom_gradient
    def f(x, y):
        def grad(g):
            return g * y, g * x * 1.01

        return x * y, grad

    report = fastcheck.check_gradients(f, [tf.constant([1.0, 2.0], dtype), tf.constant([3.0, -1.0], dtype)])
    assert [p.ok for p in report.pairs] == [True, False]
    assert "constant factor of 1.01" in report.pairs[1].hint


@pytest.mark.parametrize("size", [6, 300])
def test_transposed_jacobian_is_named(size):
    w = tf.constant(np.random.default_rng(size).normal(size=(size, size)), tf.float64)

    @tf.custom_gradient
    def f(x):
        return tf.linalg.matvec(w, x), lambda dy: tf.linalg.matvec(w, dy)  # should be w^T dy

    report = fastcheck.check_gradients(f, tf.constant(np.linspace(-1, 1, size), tf.float64))
    assert not report.ok
    assert "transpose of the numerical one" in report.pairs[0].hint, report.pairs[0].hint


def test_diagnosis_hints():
    sign = fastcheck.check_gradients(WRONG["sign_flip"][0], WRONG["sign_flip"][1](tf.float64))
    assert "wrong sign" in sign.pairs[0].hint
    factor = fastcheck.check_gradients(WRONG["factor_two"][0], WRONG["factor_two"][1](tf.float64))
    assert "constant factor of 0.5" in factor.pairs[0].hint
    transposed = fastcheck.check_gradients(WRONG["transposed_matmul"][0], WRONG["transposed_matmul"][1](tf.float64))
    assert "transpose" in transposed.pairs[0].hint
    stopped = fastcheck.check_gradients(WRONG["stop_gradient_misplaced"][0], tf.constant([0.5, 1.0], tf.float64))
    worst = stopped.pairs[0].worst_element  # d/dx x*exp(x) = (1+x) exp(x); the tape sees only exp(x)
    assert not stopped.ok and worst.input_index == (1,)
    assert worst.analytical == pytest.approx(np.exp(1.0)) and worst.numerical == pytest.approx(2 * np.exp(1.0))


def test_multiple_inputs_nested_outputs_and_integer_passthrough(variant, dtype):
    def f(x, y, k):
        return {"prod": x * y[k], "pair": (tf.reduce_sum(x), tf.exp(y)), "count": tf.shape(x)[0]}

    x = tf.constant([1.0, 2.0, 3.0], dtype)
    y = tf.constant([0.5, -0.25], dtype)
    report = fastcheck.check_gradients(variant(f), [x, y, tf.constant(1)])
    assert report.ok, str(report)
    names = {(p.output_name, p.input_name) for p in report.pairs}
    assert names == {(o, i) for o in ("output['pair'][0]", "output['pair'][1]", "output['prod']") for i in ("input 0", "input 1")}
    prod_y = next(p for p in report.pairs if p.output_name == "output['prod']" and p.input_name == "input 1")
    np.testing.assert_allclose(prod_y.analytical, [[0, 1], [0, 2], [0, 3]], atol=1e-6)
    jac = fastcheck.autodiff_jacobian(f, [x, y, tf.constant(1)])
    assert len(jac) == 3 and all(len(row) == 3 and row[2] is None for row in jac)


@pytest.mark.parametrize("autodiff", ["auto", "reverse", "forward", "both"])
def test_autodiff_sides_on_more_outputs_than_inputs(dtype, autodiff):
    f = lambda x: tf.concat([tf.sin(x * k) for k in range(1, 40)], 0)  # noqa: E731
    x = tf.constant([0.3, 0.7], dtype)
    for jit in (False, True):
        report = fastcheck.check_gradients(f, x, jit_compile=jit, autodiff=autodiff)
        assert report.ok, str(report)
        # Reverse mode (what training uses) is the checked side unless forward is asked for.
        assert report.mode == ("forward" if autodiff == "forward" else "reverse")
        sides = sorted({p.side for p in report.pairs})
        assert sides == {"both": ["forward", "reverse"], "forward": ["forward"]}.get(autodiff, ["reverse"])
        if autodiff == "auto":  # 4 evaluations: too few for the forward probe to pay
            assert events_of(report, "ForwardNotChecked"), report.notes


@pytest.mark.parametrize("jit_compile", [False, True])
def test_forward_probe_runs_from_4096_evaluations(jit_compile):
    x = tf.constant(np.linspace(-1.0, 1.0, 2048), tf.float64)  # 4096 first-sweep evaluations
    report = fastcheck.check_gradients(lambda x: tf.sin(x[:64, None] * x[None, 64:128]), x, jit_compile=jit_compile)
    assert report.ok, str(report)
    assert [(e.result, e.directions) for e in events_of(report, "ForwardProbe")] == [("agrees", 1)], report.notes


def test_complex_input_checked_as_real_pairs():
    z = tf.constant([1 + 2j, -0.5 + 0.25j], tf.complex128)
    report = fastcheck.check_gradients(lambda z: tf.math.real(z * tf.math.conj(z)) + tf.math.imag(z**2), z)
    assert report.ok, str(report)
    assert report.pairs[0].analytical.shape == (2, 4)


CHUNKED = "differences: %d perturbations per call"  # the log line of routing's chunks


def test_memory_budget_chunks_give_identical_results(debug_log):
    W = tf.constant(RNG.normal(size=(8, 300)))
    f = lambda x: tf.tanh(tf.linalg.matvec(W, x))  # noqa: E731
    x = tf.constant(RNG.normal(size=300))
    whole = fastcheck.check_gradients(f, x, jit_compile=False)
    assert not logged(debug_log, CHUNKED)
    debug_log.clear()
    tiny = fastcheck.check_gradients(f, x, jit_compile=False, memory_budget=64 * 1024, mode="full")
    assert whole.ok and tiny.ok
    ((chunk, why),) = logged(debug_log, CHUNKED)
    assert chunk < 300 and why == "to fit memory_budget", why
    # Different batch sizes may round differently inside BLAS: equal to rounding.
    np.testing.assert_allclose(whole.pairs[0].numerical, tiny.pairs[0].numerical, rtol=0, atol=1e-9)
    np.testing.assert_allclose(whole.pairs[0].analytical, tiny.pairs[0].analytical, rtol=1e-12, atol=1e-14)


def test_no_retrace_on_second_check():
    traces = []

    @tf.function
    def f(x):
        traces.append(1)
        return tf.tanh(x) * 2.0

    x = tf.constant(RNG.normal(size=200))
    first = fastcheck.check_gradients(f, x, jit_compile=False)
    count = len(traces)
    second = fastcheck.check_gradients(f, x + 1.0, jit_compile=False)
    assert first.ok and second.ok
    assert len(traces) == count, "the second check with the same shapes retraced f"


def test_a_repeated_check_gives_the_first_checks_numbers_bit_for_bit():
    # The first call of each kernel traces it; later calls, and every call of a repeated check, run its traced graph
    # through the concrete function's flat entry, which must hand it the same arguments in the same order.
    w = tf.constant(RNG.normal(size=(6, 40)))
    b = tf.constant(RNG.normal(size=6))
    x = tf.constant(RNG.normal(size=40))

    def f(x, w, b):
        return tf.tanh(tf.linalg.matvec(w, x) + b)

    first, second = (fastcheck.check_gradients(f, [x, w, b], jit_compile=False, memory_budget=1 << 16)
                     for _ in range(2))
    assert first.ok and second.ok
    assert first.path == second.path == "graph"
    for one, other in zip(first.pairs, second.pairs):
        np.testing.assert_array_equal(one.numerical, other.numerical)
        np.testing.assert_array_equal(one.analytical, other.analytical)


@pytest.mark.parametrize("rows", [8, 4096])
def test_a_repeated_check_computes_the_analytical_side_as_the_first(rows):
    # Eager reverse-mode rows or the compiled kernel: chosen from f's counted call cost before any row runs (8 rows
    # eagerly, 4096 compiled), the same on every check whether or not the kernel is compiled already.
    w = tf.constant(RNG.normal(size=(rows, 30)))
    eager_rows = []

    @tf.custom_gradient
    def tanh(z):
        y = tf.tanh(z)

        def grad(dy):
            if tf.executing_eagerly():  # a compiled kernel runs the graph traced from it, not this Python
                eager_rows.append(1)
            return dy * (1 - y * y)

        return y, grad

    def f(x):
        return tanh(tf.linalg.matvec(w, x))

    x = tf.constant(RNG.normal(size=30))
    first = fastcheck.check_gradients(f, x, jit_compile=False)
    assert first.ok and first.path == "graph", str(first)
    assert len(eager_rows) == (rows if rows < 100 else 0), len(eager_rows)
    again = fastcheck.check_gradients(f, x, jit_compile=False)
    assert again.ok and len(eager_rows) == (2 * rows if rows < 100 else 0), len(eager_rows)
    np.testing.assert_array_equal(first.pairs[0].analytical, again.pairs[0].analytical)


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_report_times_each_stage(mode):
    x = tf.constant(RNG.normal(size=(20, 30)))
    report = fastcheck.check_gradients(tf.sin, x, mode=mode)
    assert report.ok, str(report)
    stages = {"plan", "route", "fast"} if mode == "fast" else {"plan", "route", "analytical", "numerical"}
    assert stages <= set(report.timings), report.timings
    assert all(t >= 0 for t in report.timings.values())
    assert sum(report.timings.values()) <= report.seconds + 1e-6
    assert report.to_dict()["timings"] == report.timings


def test_while_loop_function_takes_loop_path():
    def f(x):
        def body(i, acc):
            return i + 1, acc * tf.cos(x) + x

        return tf.while_loop(lambda i, acc: i < tf.cast(tf.reduce_max(x) * 3, tf.int32) + 2, body, (0, x))[1]

    x = tf.constant(RNG.uniform(0.5, 1.0, size=40))
    report = fastcheck.check_gradients(f, x)
    assert report.ok, str(report)
    assert report.path in ("loop", "eager")
    forced = fastcheck.check_gradients(f, x, jit_compile=False)
    assert forced.path == "loop" and forced.ok


def test_float16_square_has_no_false_alarm():
    # tf.test.compute_gradient's fixed step 1/1024 vanishes in float16 at x >= 2.
    x = tf.constant([2.0, 3.0, 4.5, 7.0], tf.float16)
    assert fastcheck.check_gradients(tf.square, x, precision="native").ok
    assert fastcheck.check_gradients(tf.square, x).ok


def test_precision_auto_upcasts_and_says_so():
    report = fastcheck.check_gradients(tf.exp, tf.constant([0.5, 1.5], tf.float32))
    assert events_of(report, "NumericalSide")[0].upcast
    keras_like = lambda x: x * tf.constant(2.0, tf.float32)  # noqa: E731 -- cannot run in float64
    report = fastcheck.check_gradients(keras_like, tf.constant([0.5], tf.float32))
    (side,) = events_of(report, "NumericalSide")
    assert report.ok and not side.upcast and side.reason == "fails", report.notes
    with pytest.raises(ValueError, match="precision='float64'"):
        fastcheck.check_gradients(keras_like, tf.constant([0.5], tf.float32), precision="float64")


def test_report_text_and_json():
    f, make, _ = WRONG["one_wrong_element_in_50x50"]
    report = fastcheck.check_gradients(f, make(tf.float64))
    text = str(report)
    assert "FAIL" in text and "output[7, 13]" in text and "input[7, 13]" in text and "rule:" in text
    summary = json.loads(json.dumps(report.to_dict()))
    assert summary["ok"] is False
    assert summary["pairs"][0]["mismatches"] == 1
    assert summary["pairs"][0]["worst"][0]["input_index"] == [7, 13]
    assert "numerical" not in summary["pairs"][0]
    assert report.pairs[0].relative_norm_error > 0
    assert report.max_abs_error == pytest.approx(0.5, rel=1e-6)


def test_nan_in_function_is_reported_as_undecidable_with_culprit_op():
    y_true = tf.constant([0.2, 0.3, 0.5], tf.float64)
    y_pred = tf.constant([0.4, -0.1, 0.7], tf.float64)
    report = fastcheck.check_gradients(lambda p: -tf.reduce_sum(y_true * tf.math.log(p)), y_pred)
    assert not report.ok
    text = str(report)
    assert "not finite at the point" in text and "Log" in text and "(1,)" in text
    assert not _check_numerics_on()  # the diagnosis switched TF's numerics checks off again


def _check_numerics_on() -> bool:
    """Whether tf.debugging.enable_check_numerics() is in force in this thread (TensorFlow's own state)."""
    from tensorflow.python.debug.lib import check_numerics_callback

    return getattr(check_numerics_callback._state, "check_numerics_callback", None) is not None


def test_a_check_leaves_the_users_check_numerics_on():
    tf.debugging.enable_check_numerics()
    try:
        report = fastcheck.check_gradients(tf.math.log, tf.constant([0.5, 2.0], tf.float64))
        assert report.ok
        assert _check_numerics_on()  # the user's setting survives the check
    finally:
        tf.debugging.disable_check_numerics()


def test_analytical_nan_trap_is_flagged():
    f = lambda x: tf.where(x > 0, x * tf.math.log(x), tf.zeros_like(x))  # noqa: E731
    report = fastcheck.check_gradients(f, tf.constant([0.5, 0.0, -1.0, 2.0], tf.float64))
    assert not report.ok
    assert report.pairs[0].count(2) >= 1  # analytical not finite
    assert "double-where" in report.pairs[0].hint


def test_public_api_matches_readme():
    import pathlib
    import re

    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    table = readme.split("### Public API")[1].split("###")[0]
    documented = set(re.findall(r"^\| `(\w+)", table, re.M))
    assert documented == set(fastcheck.__all__)
    for name in fastcheck.__all__:
        assert getattr(fastcheck, name) is not None


def test_probe_counts_flops_of_products_and_convolutions():
    from fastcheck.engine import config as _config
    from fastcheck.engine import paths as _paths
    from fastcheck.engine import plan as _plan

    w = tf.constant(RNG.normal(size=(64, 300)))
    kernel = tf.constant(RNG.normal(size=(3, 3, 2, 5)))
    functions = {
        # 2*64*300 for the product, plus one per element of the product, tanh and sum.
        "matvec": (lambda x: tf.reduce_sum(tf.tanh(tf.linalg.matvec(w, x))), tf.constant(RNG.normal(size=300)),
                   2 * 64 * 300),
        "einsum": (lambda x: tf.einsum("ij,j->i", w, x), tf.constant(RNG.normal(size=300)), 2 * 64 * 300),
        # 2 * output elements (8*8*5) * 3*3*2 multiply-adds per output.
        "conv2d": (lambda x: tf.nn.conv2d(x, kernel, 1, "SAME"), tf.constant(RNG.normal(size=(1, 8, 8, 2))),
                   2 * 8 * 8 * 5 * 3 * 3 * 2),
    }
    for name, (f, x, product) in functions.items():
        probe = _paths.probe_graph(_plan.build_plan(f, [x], _config.CheckConfig()))
        assert product <= probe.flops <= product + 8 * probe.elements, (name, probe.flops, probe.elements)


# The elements sum(tanh(a * x[None, :])**2, axis=1) writes per evaluation, a of shape [20, 1] and x [1000]:
# x[None, :] (a strided slice: a copy), a * x, tanh and its square (20 x 1000 each), the sum (20); the reshape and
# identity around its output are views.  A call's working set: a (shared, 160 bytes), and per perturbation its
# x+ and x- rows with these.
MEMORY_BOUND_WRITTEN = 1000 + 3 * 20 * 1000 + 20


def _cached_chunk(cache: int, shared: int, n: int, written: int) -> int:
    """Perturbations a call whose working set (float64) fits ``cache`` bytes."""
    return (cache - shared) // (2 * (n + written) * 8)


def _os_cache_bytes() -> int | None:
    """The largest level-3 or higher data cache Linux lists for cpu0 (sysfs: "32768K"), None without sysfs."""
    import pathlib

    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        sizes = [int(size[:-1]) * scale[size[-1]] if size[-1] in scale else int(size)
                 for index in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")
                 if int((index / "level").read_text()) >= 3 and (index / "type").read_text().strip() != "Instruction"
                 for size in [(index / "size").read_text().strip().upper()]]
    except (OSError, ValueError):  # an unreadable listing: fastcheck then assumes its table's cache size
        return None
    return max(sizes, default=None)


def test_sysfs_cache_sizes_are_read_with_their_suffix():
    # Kept on the private parser: this machine's sysfs shows one format; others write "1M" or a plain number.
    from fastcheck.engine import paths as _paths

    bytes_of = _paths._bytes
    assert bytes_of("32768K") == 32 << 20 and bytes_of("1M") == 1 << 20 and bytes_of("512") == 512


@pytest.mark.parametrize("cache_mib", [64, 128])  # 67 and 135 perturbations a call, over MIN_CACHED_CHUNK
def test_memory_bound_calls_are_sized_to_this_machines_cache(cache_mib, debug_log):
    # The cache is read from the OS, not assumed: a 64 MiB constant on a CPU with a 32 MiB L3 put the
    # 20,000-parameter MLP's calls past its cache (15.3 s; 5.9 s at the L3's size).
    from fastcheck.engine import paths as _paths
    from fastcheck.testing import tunables

    assert _paths.cache_bytes() == (_os_cache_bytes() or _paths.cache_bytes()) > 0
    a = tf.constant(RNG.normal(size=(20, 1)))
    x = tf.constant(RNG.normal(size=1000))

    def f(x):
        return tf.reduce_sum(tf.tanh(a * x[None, :]) ** 2, axis=1)

    with tunables(MACHINE_CACHE=cache_mib << 20):
        report = fastcheck.check_gradients(f, x, jit_compile=False)
    assert report.ok, str(report)
    ((chunk, why),) = logged(debug_log, CHUNKED)
    assert why.startswith(f"to keep each call's working set within the CPU's {cache_mib} MiB cache (f is memory-bound")
    assert chunk == _cached_chunk(cache_mib << 20, 20 * 8, 1000, MEMORY_BOUND_WRITTEN) > 1


def test_calls_keep_their_working_set_in_cache(debug_log):
    # tanh(W x) is compute-bound, but its sweep still ran 1.5x faster with each call's W, x+ and x- rows
    # in the CPU's cache than in the largest calls the budget allows (n=16384: 3.2 s against 4.9 s).
    from fastcheck.testing import tunables

    x = tf.constant(RNG.normal(size=4000))
    w = tf.constant(RNG.normal(size=(64, 4000)))

    def f(x):
        return tf.tanh(tf.linalg.matvec(w, x))

    with tunables(MACHINE_CACHE=8 << 20):  # an 8 MiB cache
        report = fastcheck.check_gradients(f, x, jit_compile=True)
    assert report.ok, str(report)
    ((chunk, why),) = logged(debug_log, CHUNKED)
    # Compute-bound (2 x 64 x 4000 FLOPs a product): not memory-bound.
    assert why == "to keep each call's working set within the CPU's 8 MiB cache", why
    # Shared: W (64 x 4000 float64); written per evaluation: the product and its tanh (64 each) -- the reshapes
    # around the product are views, not counted as written.
    assert chunk == _cached_chunk(8 << 20, 64 * 4000 * 8, 4000, 2 * 64)
    # Shared data that alone nearly fill the cache (W in a 2 MiB one) leave the budget's chunk.
    debug_log.clear()
    with tunables(MACHINE_CACHE=2 << 20):
        report = fastcheck.check_gradients(f, x, jit_compile=True)
    assert report.ok and [why for _, why in logged(debug_log, CHUNKED)] == ["to fit memory_budget"], str(report)


def test_memory_bound_function_gets_cache_sized_calls_and_still_passes(debug_log):
    from fastcheck.testing import tunables

    machine = tunables(MACHINE_CACHE=32 << 20)  # a CPU with a 32 MiB cache
    a = tf.constant(RNG.normal(size=(20, 1)))

    def f(x):  # 3 FLOPs or so per intermediate element: memory-bound
        return tf.reduce_sum(tf.tanh(a * x[None, :]) ** 2, axis=1)

    x = tf.constant(RNG.normal(size=1000))
    with machine:
        report = fastcheck.check_gradients(f, x, jit_compile=False)
    assert report.ok, str(report)
    ((chunk, why),) = logged(debug_log, CHUNKED)
    assert "cache (f is memory-bound: " in why, why
    # The largest call whose working set fits the cache, and fewer perturbations than the input's 1000.
    assert chunk == _cached_chunk(32 << 20, 20 * 8, 1000, MEMORY_BOUND_WRITTEN) < 1000
    # A compute-bound f of the same size whose working set fits the cache keeps the budget's chunk: all 1000
    # perturbations in one call, so nothing chunked.
    w = tf.constant(RNG.normal(size=(256, 1000)))
    debug_log.clear()
    with tunables(MACHINE_CACHE=32 << 20):
        dense = fastcheck.check_gradients(lambda x: tf.tanh(tf.linalg.matvec(w, x)), x, jit_compile=False)
    assert dense.ok and dense.path == "graph" and logged(debug_log, CHUNKED) == [], str(dense)


def test_blocked_verdicts_match_the_rule_everywhere():
    from fastcheck.judge import compare as _compare

    a = RNG.normal(size=(37, 53))
    n = a + RNG.normal(size=a.shape) * np.where(RNG.uniform(size=a.shape) < 0.1, 1e-3, 1e-10)
    noise = np.abs(RNG.normal(size=a.shape)) * 1e-9
    n[3, 4], a[5, 6], n[7, 8], a[7, 8], noise[9, 10] = np.nan, np.inf, np.inf, np.nan, np.inf
    expected = np.where(~np.isfinite(n), _compare.NUMERICAL_NONFINITE,
                        np.where(~np.isfinite(a), _compare.ANALYTICAL_NONFINITE,
                                 (np.abs(a - n) > 1e-8 + 1e-6 * np.abs(n) + np.where(np.isfinite(noise), noise, 0)).astype(int)))
    for block in (1, 53, 100, 1 << 20):
        status, band = _compare.verdicts(a, n, noise, 1e-8, 1e-6, block=block)
        np.testing.assert_array_equal(status, expected)
        assert status[np.isfinite(a) & np.isfinite(n)].sum() > 0


@pytest.mark.parametrize("outputs", [3, 40])  # fewer outputs than inputs: reverse mode; more: forward mode
def test_eager_path_matches_graph_path_on_mixed_and_complex_outputs(outputs):
    w = tf.constant(RNG.normal(size=(outputs, 12)))

    def f(x, z):
        y = tf.tanh(tf.linalg.matvec(w, x))
        return {"f32": tf.cast(y[:2], tf.float32) * 3.0, "c": tf.complex(y, y * y) * z[0], "f64": tf.reduce_sum(y * y)}

    inputs = [tf.constant(RNG.normal(size=12)), tf.constant(RNG.normal(size=2) + 1j * RNG.normal(size=2))]
    eager = fastcheck.check_gradients(f, inputs)  # routed eagerly: a small check (f's counted calls)
    graph = fastcheck.check_gradients(f, inputs, jit_compile=False)
    assert eager.path == "eager" and graph.path == "graph"
    assert eager.mode == graph.mode == "reverse"  # the side training uses, whatever the shapes
    # The same verdict on both paths, never a FAIL: every output's rounding allowance is the least precise
    # output's (float32's), so on some draws of w a pair of the float64 output resolves only ~1.01% (undecidable).
    assert eager.verdict == graph.verdict != "fail", str(eager)
    assert all(p.ok or p.coarse for p in eager.pairs), str(eager)
    for a, b in zip(eager.pairs, graph.pairs):
        np.testing.assert_allclose(a.analytical, b.analytical, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(a.numerical, b.numerical, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("jit_compile", ["auto", False])
def test_scalar_output_beside_an_empty_output(jit_compile):
    x = tf.constant([0.3, 0.7], tf.float64)
    report = fastcheck.check_gradients(lambda x: (tf.zeros([0], tf.float64) * x[0], tf.reduce_sum(tf.sin(x))), x,
                                       jit_compile=jit_compile)
    assert report.ok, str(report)
    assert report.path == ("eager" if jit_compile == "auto" else "graph")
    np.testing.assert_allclose(report.pairs[-1].analytical, [np.cos(x.numpy())], rtol=1e-12)


def test_routing_is_a_function_of_the_plan_alone():
    from fastcheck.engine import config as _config
    from fastcheck.engine import paths as _paths
    from fastcheck.engine import plan as _plan
    from fastcheck.engine import tables as _tables

    config = _config.CheckConfig()
    plan = _plan.build_plan(lambda x: tf.reduce_sum(tf.sin(x)), [tf.constant(RNG.normal(size=100))], config)
    # f's counted call cost, not a clock: the same plan routes alike however often and under whatever load.
    assert plan.call_seconds == _plan.build_plan(plan.f, [tf.constant(RNG.normal(size=100))], config).call_seconds
    cheap = dataclasses.replace(plan, call_seconds=1e-4)  # eager loop: 205 calls = 0.02 s, against a trace's 0.15 s
    dear = dataclasses.replace(plan, call_seconds=1e-3)  # 0.2 s, against 0.19 s
    assert [_paths.choose_route(cheap, config).path for _ in range(3)] == ["eager"] * 3
    assert [_paths.choose_route(dear, config).path for _ in range(3)] == ["graph"] * 3
    eager, traced = _paths.choose_route(cheap, config).predicted
    assert eager == pytest.approx(205e-4) and traced == pytest.approx(_tables.TRACE_SECONDS + _tables.TRACE_CALLS * 1e-4)


def test_removed_options_are_refused_naming_what_replaces_them():
    x = tf.constant(RNG.normal(size=5))
    for name, value, says in [("calibration", None, "nothing to calibrate"), ("time_budget", 60, "pass mode="),
                              ("tables", {"NOISE_ALL": 1}, "fastcheck.testing.tunables"),
                              ("strategy", None, r"pass device=strategy"), ("devices", ["/CPU:0"], r"pass device=\[")]:
        with pytest.raises(TypeError, match=f"no longer takes {name}=: .*{says}"):
            fastcheck.check_gradients(tf.sin, x, **{name: value})
        with pytest.raises(TypeError, match=f"no longer takes {name}="):
            fastcheck.GradientChecker(**{name: value})
    with pytest.raises(TypeError, match="unknown option"):
        fastcheck.check_gradients(tf.sin, x, tolerance=1)


def test_every_option_of_check_gradients_is_documented_with_an_example():
    """At most 15 keyword options, each with a section of docs/options.md whose example passes it."""
    import inspect
    import pathlib
    import re

    options = [p.name for p in inspect.signature(fastcheck.check_gradients).parameters.values()
               if p.kind == p.KEYWORD_ONLY]
    assert len(options) <= 15, options
    text = (pathlib.Path(__file__).parent.parent / "docs" / "options.md").read_text()
    sections = {heading: body for heading, body in re.findall(r"^### (.*)\n((?:(?!^##).*\n?)*)", text, re.M)}
    for name in options:
        (body,) = [body for heading, body in sections.items() if f"`{name}`" in heading]
        examples = "".join(re.findall(r"```python\n(.*?)```", body, re.S))
        assert f"{name}=" in examples, f"docs/options.md: the section of {name} has no example passing {name}="


def test_tunables_override_only_within_their_block():
    from fastcheck.testing import tunables

    x = tf.constant(RNG.normal(size=5))
    # A coloured check reports past 0 dense entries as a sparse pair within the block, and only there.
    with tunables(DENSE_REPORT_ENTRIES=0):
        for seed in (0, 0, 1):
            assert fastcheck.check_gradients(tf.sin, x, mode="coloured", seed=seed).pairs[0].sparse
    assert not fastcheck.check_gradients(tf.sin, x, mode="coloured").pairs[0].sparse
    with pytest.raises(ValueError, match="'REFINE_LEVELS' is not a tunable a check reads"):
        with tunables(REFINE_LEVELS=8):
            pass
    with pytest.raises(ValueError, match="NOISE_ALL=-1.* is not valid"):
        with tunables(NOISE_ALL=-1):
            pass


def test_checks_do_not_keep_the_function_alive_or_warn_about_retracing(caplog):
    # The usual test-suite pattern: a fresh lambda per check, on the graph path.
    import gc
    import weakref

    x = tf.constant(np.random.default_rng(3).normal(size=300))
    refs = []
    with caplog.at_level("WARNING"):
        for _ in range(8):
            f = lambda x: tf.sin(x) * 2  # noqa: E731
            assert fastcheck.check_gradients(f, x, jit_compile=False).ok
            refs.append(weakref.ref(f))
            del f
    gc.collect()
    assert all(ref() is None for ref in refs)  # compiled kernels went with their function
    assert not [r for r in caplog.records if "retracing" in r.getMessage()]


def test_fast_checks_of_many_shapes_do_not_warn_about_retracing(caplog):
    # Fast mode's per-probe summaries are one tf.function over probes x outputs: a suite checking functions of
    # many sizes must not see TensorFlow's retracing warning about fastcheck's internals.
    with caplog.at_level("WARNING"):
        for m in range(1, 9):
            w = tf.constant(np.random.default_rng(m).normal(size=(m, 40 + m)))
            assert fastcheck.check_gradients(lambda x: tf.tanh(tf.linalg.matvec(w, x)),  # noqa: B023
                                             tf.constant(np.random.default_rng(m).normal(size=40 + m)),
                                             mode="fast").ok
    assert not [r for r in caplog.records if "retracing" in r.getMessage()]


@pytest.mark.parametrize("jit_compile", [False, True])
def test_python_control_flow_on_tensors_is_traced_with_autograph(jit_compile):
    # Kernels trace without AutoGraph (it costs most of a cold first trace); an f with
    # Python `if`/`for` on tensors needs it, and gets it, on the same path.
    def f(x):
        total = tf.reduce_sum(tf.sin(x))
        if total > 0:  # a Python `if` on a tensor: AutoGraph makes it a tf.cond
            return total * x
        return -total * x

    x = tf.constant(RNG.uniform(0.1, 0.5, size=40))
    report = fastcheck.check_gradients(f, x, jit_compile=jit_compile)
    assert report.ok, str(report)
    assert report.path == ("xla" if jit_compile else "graph")
    wrong = fastcheck.check_gradients(lambda x: f(x) + tf.stop_gradient(x * x), x, jit_compile=jit_compile)
    assert not wrong.ok


@pytest.mark.parametrize("jit_compile", ["auto", True])
def test_seeded_random_ops_never_run_under_xla(jit_compile, debug_log):
    # XLA draws other numbers than TensorFlow's kernels from the same stateless seed: the
    # batched evaluations would differentiate another function than the eager calls.
    def f(x):  # every output on every input (the mean): no pattern makes the eager loops short
        return tf.tanh(x) * tf.random.stateless_uniform(x.shape, seed=[1, 2], dtype=x.dtype) * tf.reduce_mean(x)

    x = tf.constant(RNG.normal(size=(64, 64)))
    report = fastcheck.check_gradients(f, x, jit_compile=jit_compile)
    assert report.ok, str(report)
    ((path, why),) = logged(debug_log, "route: ")
    assert report.path == path == "graph" and "XLA draws different ones" in why, why
    # jit_compile=True asked for XLA: not getting it is a note, as any fallback of the path
    overridden = [n for n in report.notes if n.startswith("xla failed for f (f draws random numbers")]
    assert len(overridden) == (jit_compile is True) and all("jit_compile=True overridden" in n for n in overridden)


def test_convolutions_run_without_xla_on_cpu(debug_log):
    kernel = tf.constant(RNG.normal(size=(3, 3, 4, 4)))
    # Every output on every input (the mean): no pattern makes the eager loops short.
    f = lambda x: tf.tanh(tf.nn.conv2d(x, kernel, 1, "SAME")) * tf.reduce_mean(x)  # noqa: E731
    x = tf.constant(RNG.normal(size=(1, 32, 32, 4)))
    # Routing is the same in every mode (as for a full check): fast mode's few evaluations show it cheaply.
    report = fastcheck.check_gradients(f, x, device="/CPU:0", mode="fast")
    assert report.ok and report.path == "graph", str(report)
    assert logged(debug_log, "route: ") == [("graph", "Conv2D is slower under XLA than TensorFlow's own on CPU")]
    # The same work without a convolution goes to XLA.
    debug_log.clear()
    dense = fastcheck.check_gradients(lambda x: tf.tanh(x * 2.0) @ tf.ones([4, 64], tf.float64) * tf.reduce_mean(x), x,
                                      device="/CPU:0", mode="fast")
    assert [path for path, _ in logged(debug_log, "route: ")] == ["xla"]
    assert dense.path == "graph"  # the route is a full check's; fast mode's few probes run on the graph path


@pytest.mark.parametrize("traceable", [True, False])
def test_a_check_repeated_ten_times_gives_the_first_checks_report(traceable):
    # No history: the tenth check of one f takes the first one's path and gives its numbers and notes (an f that
    # reads .numpy() cannot be traced: it runs eagerly every time).
    def f(x):
        offset = tf.constant(x.numpy() * 0.0) if not traceable else 0.0
        return offset + tf.reverse(tf.sin(x), [0]) * 2.0  # not element-wise: the eager loops

    x = tf.constant(RNG.normal(size=48), tf.float64)
    reports = [fastcheck.check_gradients(f, x, progress=False) for _ in range(10)]
    assert all(r.ok for r in reports), str(reports[0])
    first = _without_timings(reports[0].to_dict())
    assert all(_without_timings(r.to_dict()) == first for r in reports[1:])
    assert traceable or reports[-1].path == "eager"


def _without_timings(record: dict) -> dict:
    return {key: value for key, value in record.items() if key not in ("seconds", "timings")}
