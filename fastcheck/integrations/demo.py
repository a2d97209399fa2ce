"""``fastcheck demo``: built-in examples whose verdicts are known in advance."""

from __future__ import annotations

import json
import time

import numpy as np
import tensorflow as tf

import fastcheck

WRONG_ELEMENT = 123_456  # the flat index example 6 gets wrong


def _cross_entropy(y_true, y_pred):
    return -tf.reduce_sum(y_true * tf.math.log(y_pred))


def _examples(dtype):
    """(title, expected verdict, what the reader should see, thunk returning a report)."""
    rng = np.random.default_rng(0)
    y_true = tf.constant(np.eye(5)[rng.integers(0, 5, size=4)], dtype)
    logits = rng.normal(size=(4, 5))
    probabilities = tf.constant(np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True), dtype)
    normal_sample = tf.constant(rng.normal(size=(4, 5)), dtype)

    def model_check():
        import keras

        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                                  keras.layers.Dense(3), keras.layers.Softmax()])
        x = rng.normal(size=(16, 6)).astype("float32")
        y = np.eye(3)[rng.integers(0, 3, size=16)].astype("float32")
        return fastcheck.check_model(model, keras.losses.CategoricalCrossentropy(), (x, y))

    @tf.custom_gradient
    def softplus(x):
        def grad(upstream):
            return -upstream * tf.sigmoid(x)  # deliberate bug: the sign is flipped

        return tf.math.softplus(x), grad

    @tf.custom_gradient
    def gelu(x):
        def grad(upstream):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = tf.nn.gelu(x)
            slip = 1 + 1e-3 * tf.one_hot(WRONG_ELEMENT, tf.size(x), dtype=x.dtype)  # deliberate bug: one element
            return tape.gradient(y, x, upstream) * tf.reshape(slip, tf.shape(x))

        return tf.nn.gelu(x), grad

    def manual_gradient():
        x = tf.constant(rng.normal(size=(3, 4)), dtype)
        w = tf.constant(rng.normal(size=(4, 2)), dtype)
        f = lambda x, w: tf.reduce_sum(tf.tanh(x @ w) ** 2)  # noqa: E731
        t = tf.tanh(x @ w)
        upstream = 2 * t * (1 - t**2)  # d f / d (x @ w), by hand
        grads = [upstream @ tf.transpose(w), tf.transpose(x) @ upstream]
        return fastcheck.verify_gradients(f, [x, w], grads)

    return [
        ("cross-entropy w.r.t. y_pred on valid probabilities", "pass",
         "the batched numerical gradient matches autodiff",
         lambda: fastcheck.check_gradients(lambda p: _cross_entropy(y_true, p), probabilities)),
        ("the same loss on y_pred drawn from a normal distribution", "undecidable",
         "f is NaN because log received non-positive values: undecidable, not a gradient bug",
         lambda: fastcheck.check_gradients(lambda p: _cross_entropy(y_true, p), normal_sample)),
        ("a small Keras model's trainable variables (check_model)", "pass",
         "one line per variable, each with its own errors",
         model_check),
        ("softplus with a deliberately wrong tf.custom_gradient", "fail",
         "the worst elements with both values, and the hint 'wrong sign'",
         lambda: fastcheck.check_gradients(softplus, tf.constant(rng.normal(size=(3, 4)), dtype))),
        ("a gradient computed by hand (verify_gradients)", "pass",
         "hand-derived gradients of tanh(x @ w)**2 agree with central differences",
         manual_gradient),
        ("gelu on 512 x 512 elements, its custom gradient off by 0.1% at one element", "fail",
         "auto picks coloured mode (the Jacobian is diagonal: one colour), and names the element "
         f"[{WRONG_ELEMENT // 512}, {WRONG_ELEMENT % 512}]",
         lambda: fastcheck.check_gradients(gelu, tf.constant(rng.normal(size=(512, 512)), dtype))),
    ]


def run_demo(dtype_name: str = "float64", json_path: str | None = None) -> int:
    """Run every example, print its report, and return 0 when each verdict is the expected one."""
    dtype = tf.as_dtype(dtype_name)
    start = time.perf_counter()
    records, behaved = [], []
    for number, (title, expected, look_for, run) in enumerate(_examples(dtype), 1):
        report = run()
        report.title = f"example {number}: {title}"
        as_expected = report.verdict == expected
        print(report)
        print(f"  -> expected {expected.upper()} ({look_for}): got {report.verdict.upper()}, "
              f"{'as expected' if as_expected else 'NOT AS EXPECTED'}\n")
        behaved.append(as_expected)
        records.append({**report.to_dict(), "expected_verdict": expected, "as_expected": as_expected})
    if json_path:
        with open(json_path, "w") as handle:
            json.dump({"dtype": dtype_name, "examples": records}, handle, indent=2)
    print(f"fastcheck demo ({dtype_name}): {sum(behaved)} of {len(behaved)} examples behaved as expected "
          f"in {time.perf_counter() - start:.1f} s.")
    return 0 if all(behaved) else 1
