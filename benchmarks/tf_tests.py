"""``python -m benchmarks tf_tests``: TensorFlow's own gradient tests, as TensorFlow writes them.

Each case is one gradient check of a TensorFlow test file -- its function, shapes,
dtypes, values or seeds, step (``delta``) and tolerance -- written in the form
TensorFlow's suites use: ``gradient_checker_v2.compute_gradient(f, [x])`` and then
``max_error`` (or ``assertAllClose``) against the test's own bound.  The sources:

* ``tensorflow/python/ops/gradient_checker_v2_test.py`` (GradientCheckerTest, MiniMNISTTest)
* ``tensorflow/python/ops/nn_grad_test.py`` (its v1 checks ported to the v2 call: f of the
  placeholder, the placeholder's random initial value drawn from a fixed seed, since the
  v1 checker draws it unseeded)
* ``tensorflow/python/kernel_tests/math_ops/cwise_ops_unary_test.py`` (testFloatBasic and
  testDoubleBasic: every op with a gradient, at the test's x, y, z, w and k, its delta
  -- 1e-3 in float32, 1e-5 in float64 -- and ``assertAllClose(jacob_t, jacob_n)`` at
  the file's ``_default_tolerance``: 1e-3 in float32, 1e-5 in float64)

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
their median and the ratio of the totals, with the CPU model and the load average.

    python -m benchmarks tf_tests [--only SUBSTRING[,SUBSTRING]] [--out DIR]
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


@dataclass
class Case:
    name: str
    source: str  # file::Test.method
    make: object  # () -> (f, xs): a fresh function object and its arguments each call
    check: object  # (theoretical, numerical) -> bool: the test's own assertion
    bound: str  # the assertion, in words
    delta: float | None = None  # as the test passes it (None: TensorFlow's default, 1/1024)
    notes: list = field(default_factory=list)


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


def all_cases() -> list[Case]:
    return _gc_v2_cases() + _nn_grad_cases() + _unary_cases()


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
    row = {"name": case.name, "source": case.source, "bound": case.bound, "delta": case.delta}
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


def _stages(row: dict) -> str:
    timings = row["verdict"].get("timings") or {}
    top = sorted(timings.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{k} {v * 1e3:.0f}" for k, v in top)


def markdown(record: dict) -> str:
    rows, summary = record["cases"], record["summary"]
    lines = [
        "# TensorFlow's own gradient tests, as TensorFlow writes them",
        "",
        f"{len(rows)} cases from TensorFlow's test files, each run three ways in one process: "
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
        "| contender | when | median ratio | total ratio | fastcheck total s | tf total s | cases slower than tf |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for key, s in summary.items():
        if key in ("disagreements", "tf_failing", "errors"):
            continue
        label, when = key.split(" ")
        lines.append(f"| {label} | {when} | {s['median_ratio']:.2f} | {s['total_ratio']:.2f} | {s['total_seconds']:.2f} | "
                     f"{s['tf_total_seconds']:.2f} | {s['slower']} / {len(rows)} |")
    lines += ["", "Verdicts against the test's own assertion on tf.test.compute_gradient's Jacobians:", ""]
    lines.append(f"- tf's own assertion fails on: {', '.join(summary['tf_failing']) or 'none'}")
    for label in ("drop-in", "verdict"):
        names = summary["disagreements"][label]
        lines.append(f"- {label} disagrees with it on {len(names)}: {', '.join(names) or 'none'}")
    for label, names in summary["errors"].items():
        if names:
            lines.append(f"- {label} raised on: {', '.join(names)}")
    lines += ["", "## Cases", "",
              "| case | source | bound | tf s (ok) | drop-in s (ok) | verdict s (ok, path) | drop-in / tf | verdict / tf | "
              "warm: tf s | warm: drop-in / tf | warm: verdict / tf | verdict's top stages (ms) |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        tf_, drop, verdict = r["tf"], r["drop-in"], r["verdict"]

        def mark(result):
            return "ok" if result["ok"] else ("ERROR" if "error" in result else "FAIL")

        step = "" if r["delta"] is None else f", delta={r['delta']:g}"
        lines.append(
            f"| {r['name']} | `{r['source'].split('/')[-1]}` | {r['bound']}{step} "
            f"| {tf_['seconds']:.3f} ({mark(tf_)}) | {drop['seconds']:.3f} ({mark(drop)}) "
            f"| {verdict['seconds']:.3f} ({mark(verdict)}{', ' + verdict['path'] if 'path' in verdict else ''}) "
            f"| {_ratio(drop['seconds'], tf_['seconds']):.2f} | {_ratio(verdict['seconds'], tf_['seconds']):.2f} "
            f"| {tf_['warm_seconds']:.3f} | {_ratio(drop['warm_seconds'], tf_['warm_seconds']):.2f} "
            f"| {_ratio(verdict['warm_seconds'], tf_['warm_seconds']):.2f} | {_stages(r)} |")
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
    details = [r for r in rows if not r["verdict"]["ok"] or "error" in r["drop-in"] or "error" in r["tf"]]
    if details:
        lines += ["", "## Cases fastcheck's verdict does not pass, or a contender raised", ""]
        for r in details:
            for label in CONTENDERS:
                if "error" in r[label]:
                    lines.append(f"- {r['name']} ({label}): {r[label]['error']}")
            if not r["verdict"]["ok"] and "summary" in r["verdict"]:
                lines.append(f"- {r['name']} (verdict): {r['verdict']['summary']}")
    return "\n".join(lines) + "\n"


def run(cases: list[Case], log=print) -> dict:
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
    record["uptime_after"] = _uptime()
    record["wall_seconds"] = time.perf_counter() - started
    record["summary"] = summarise(record["cases"])
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
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    cases = all_cases()
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        cases = [c for c in cases if any(w in c.name for w in wanted)]
    if not cases:
        print("no case matches --only", file=sys.stderr)
        return 2
    record = run(cases, log=lambda line: print(line, flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tf_tests.json").write_text(json.dumps(_json_safe(record), indent=1))
    text = markdown(record)
    (args.out / "tf_tests.md").write_text(text)
    print(text)
    print(f"wrote {args.out / 'tf_tests.md'}, {args.out / 'tf_tests.json'}")
    errors = record["summary"]["errors"]
    return 1 if errors["drop-in"] or errors["verdict"] else 0


if __name__ == "__main__":
    sys.exit(main())
