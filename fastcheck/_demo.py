"""``fastcheck demo``: built-in examples whose verdicts are known in advance."""

from __future__ import annotations

import json

import numpy as np
import tensorflow as tf

import fastcheck


def _examples(dtype):
    rng = np.random.default_rng(0)

    def cross_entropy(y_true, y_pred):
        return -tf.reduce_sum(y_true * tf.math.log(y_pred))

    logits = rng.normal(size=(4, 5))
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    y_true = tf.constant(np.eye(5)[rng.integers(0, 5, size=4)], dtype)

    @tf.custom_gradient
    def softplus_wrong_sign(x):
        def grad(upstream):
            return -upstream * tf.sigmoid(x)  # deliberate bug: sign flipped

        return tf.math.softplus(x), grad

    return [
        ("cross-entropy on valid probabilities", True,
         lambda: fastcheck.check_gradients(cross_entropy, [y_true, tf.constant(probabilities, dtype)])),
        ("cross-entropy on normal samples (log of negatives)", False,
         lambda: fastcheck.check_gradients(cross_entropy, [y_true, tf.constant(rng.normal(size=(4, 5)), dtype)])),
        ("custom gradient with a sign flip", False,
         lambda: fastcheck.check_gradients(softplus_wrong_sign, tf.constant(rng.normal(size=(3, 4)), dtype))),
    ]


def run_demo(dtype_name: str = "float64", json_path: str | None = None) -> int:
    dtype = tf.as_dtype(dtype_name)
    results, records = [], []
    for title, expected, run in _examples(dtype):
        report = run()
        report.title = title
        as_expected = report.ok == expected
        print(report)
        print(f"  -> expected {'pass' if expected else 'fail'}: {'as expected' if as_expected else 'UNEXPECTED'}\n")
        results.append(as_expected)
        records.append({**report.to_dict(), "expected_ok": expected, "as_expected": as_expected})
    if json_path:
        with open(json_path, "w") as handle:
            json.dump(records, handle, indent=2)
    print(f"fastcheck demo: {sum(results)} of {len(results)} examples behaved as expected ({dtype_name}).")
    return 0 if all(results) else 1
