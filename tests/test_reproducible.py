"""A check is a function of its inputs: the same report (timings aside) in a fresh process, after 100 other checks,
as the tenth repeat, and while other threads keep every core busy."""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

import fastcheck


def _model():
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh", name="hidden"),
                              keras.layers.Dense(1, name="out")], name="net")  # named: the same names every time
    rng = np.random.default_rng(2)
    model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.get_weights()])
    return model


@tf.custom_gradient
def _sqrt_through_a_tape(x):
    # vectorized_map cannot batch a persistent tape over a tf.cond (TensorFlow raises); f runs eagerly
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = tf.cond(tf.reduce_all(x > 0), lambda: tf.sqrt(x), lambda: tf.sqrt(-x))
    return y, lambda dy: dy * tape.gradient(y, x)


def _checks():
    """name -> a check to run (each builds its inputs afresh, from its own seed)."""
    rng = lambda seed: np.random.default_rng(seed)  # noqa: E731
    w = tf.constant(rng(1).normal(size=(24, 32)))
    return {
        "element-wise": lambda: fastcheck.check_gradients(tf.tanh, tf.constant(rng(3).normal(size=50))),
        "dense": lambda: fastcheck.check_gradients(lambda x: tf.tanh(tf.linalg.matvec(w, x)),
                                                   tf.constant(rng(4).normal(size=32))),
        "structured": lambda: fastcheck.check_gradients(
            lambda d: d["a"] * tf.reduce_sum(d["b"] ** 2), {"a": tf.constant(rng(5).normal(size=3)),
                                                            "b": tf.constant(rng(6).normal(size=(2, 2)))}),
        "keras model": lambda: fastcheck.check_model(
            _model(), "mse", (rng(7).normal(size=(8, 4)).astype("float32"), np.ones((8, 1), "float32"))),
        "coloured": lambda: fastcheck.check_gradients(tf.sin, tf.constant(rng(8).normal(size=300)), memory_budget=1000),
        "fast": lambda: fastcheck.check_gradients(lambda x: tf.reduce_sum(tf.tanh(x)),
                                                  tf.constant(rng(9).normal(size=300)), memory_budget=1000),
        "not vectorisable": lambda: fastcheck.check_gradients(_sqrt_through_a_tape,
                                                              tf.constant(rng(10).uniform(0.5, 2.0, size=40))),
    }


def records() -> dict:
    """Each check's ``to_dict()`` without its timings, as JSON reads it back."""
    found = {}
    for name, check in _checks().items():
        record = check().to_dict()
        found[name] = {key: value for key, value in record.items() if key not in ("seconds", "timings")}
    return json.loads(json.dumps(found))


def _busy(stop: threading.Event) -> None:
    a = np.random.default_rng(0).normal(size=(300, 300))
    while not stop.is_set():
        a = np.tanh(a @ a.T / 300)  # numpy releases the GIL: every core stays busy
        sum(range(10_000))  # and the interpreter too


def test_a_report_is_the_same_whatever_ran_before():
    here = records()
    names = {name: record["mode"] for name, record in here.items()}
    assert names["coloured"] == "coloured" and names["fast"] == "fast", names
    assert all(record["verdict"] == "pass" for record in here.values()), {n: r["verdict"] for n, r in here.items()}
    # a fresh process
    code = "import json, sys; sys.path.insert(0, 'tests'); import test_reproducible as t; print(json.dumps(t.records()))"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert json.loads(out.stdout.strip().splitlines()[-1]) == here
    # after 100 other checks
    other = np.random.default_rng(11)
    for k in range(100):
        f = [tf.sin, tf.tanh, lambda x: tf.reduce_sum(x**3), lambda x: tf.cumsum(x) * x][k % 4]
        fastcheck.check_gradients(f, tf.constant(other.normal(size=1 + k % 7)))
    assert records() == here
    # the tenth repeat
    for _ in range(8):
        records()
    assert records() == here
    # while other threads keep every core busy
    stop = threading.Event()
    threads = [threading.Thread(target=_busy, args=(stop,)) for _ in range(os.cpu_count() or 2)]
    for thread in threads:
        thread.start()
    try:
        loaded = records()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert loaded == here


@pytest.mark.parametrize("name", ["element-wise", "dense", "not vectorisable"])
def test_a_check_takes_its_path_from_its_inputs(name):
    paths = {_checks()[name]().path for _ in range(3)}
    assert len(paths) == 1, paths
