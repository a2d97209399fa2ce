"""device= a strategy or a list of devices: batched evaluations split over the replicas of a tf.distribute strategy.

Two logical CPU devices must be configured before TensorFlow initialises its devices,
and a MultiWorkerMirroredStrategy must be created before any other TensorFlow op: those
checks run in fresh processes (``sys.executable``), the verdicts compared with a check
on one device.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import logged

import fastcheck
import fastcheck.testing

ROOT = Path(__file__).resolve().parents[1]
WAVE = "%s over %s: %s%s"  # the log line of a wave's work per replica

# The problems, as code every process runs alike: a correct f, the same f with a reverse-mode
# gradient 1% off at input element 37, and an elementwise f for coloured mode off at 1234.
PROBLEMS = textwrap.dedent("""
    import logging

    import numpy as np
    import tensorflow as tf
    import fastcheck

    _rng = np.random.default_rng(0)
    W = tf.constant(_rng.normal(size=(300, 200)) / 10)
    X = tf.constant(_rng.normal(size=200))
    X_COLOURED = tf.constant(_rng.normal(size=3000))


    def f(x):
        return tf.tanh(tf.linalg.matvec(W, x)) * 2.0


    def off_at(g, index, factor):
        @tf.custom_gradient
        def wrong(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = g(x)

            def grad(dy):
                scale = 1 + (factor - 1) * tf.one_hot(index, tf.size(x), dtype=x.dtype)
                return tape.gradient(y, x, output_gradients=dy) * scale

            return y, grad

        return wrong


    wrong = off_at(f, 37, 1.01)
    coloured = off_at(lambda x: tf.sin(x) * x, 1234, 1.001)
    CASES = {"correct": (f, X, "full"), "wrong": (wrong, X, "full"), "coloured": (coloured, X_COLOURED, "coloured")}


    def summary(report):
        pairs = [{"ok": bool(p.ok), "status": p.status.astype(int).ravel().tolist(),
                  "worst": [[d["output_index"], d["input_index"], d["status"]]
                            for d in (w.to_dict() for w in p.worst(3))],
                  "numerical": p.numerical.ravel()[:: max(1, p.numerical.size // 4000)].tolist()}
                 for p in report.pairs]
        spread = [e for e in report.to_dict()["events"] if e["kind"] in ("PathsDiffer", "EagerUnsplit")]
        return {"ok": bool(report.ok), "pairs": pairs, "events": spread}


    class Waves(logging.Handler):  # each wave's work per replica as logged: [label, where, counts, on each worker]

        def __init__(self):
            super().__init__(logging.DEBUG)
            self.waves = []

        def emit(self, record):
            self.waves.append([str(a) for a in record.args])


    def run(name, **options):
        g, x, mode = CASES[name]
        logger, waves = logging.getLogger("fastcheck.engine.distribute"), Waves()
        level = logger.level
        logger.addHandler(waves)
        logger.setLevel(logging.DEBUG)
        try:
            report = fastcheck.check_gradients(g, x, mode=mode, jit_compile=False, **options)
        finally:
            logger.removeHandler(waves)
            logger.setLevel(level)
        return {**summary(report), "waves": waves.waves}
""")


def _python(code: str, env: dict | None = None) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    environment = {**base, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=environment, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _results(process: subprocess.Popen, timeout: float = 150) -> dict:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        pytest.fail(f"the check process did not finish within {timeout} s:\n{out[-4000:]}")
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert process.returncode == 0 and lines, f"the check process failed (exit {process.returncode}):\n{out[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def _reference(names) -> dict:
    namespace: dict = {}
    exec(PROBLEMS, namespace)  # noqa: S102 -- the same problem code the subprocesses run
    return {name: namespace["run"](name) for name in names}


def _same_verdicts(got: dict, want: dict) -> None:
    assert got["ok"] == want["ok"]
    assert len(got["pairs"]) == len(want["pairs"])
    for g, w in zip(got["pairs"], want["pairs"]):
        assert g["ok"] == w["ok"]
        assert g["status"] == w["status"]  # every element's verdict
        assert g["worst"] == w["worst"]  # the same worst elements, named by index
        np.testing.assert_allclose(g["numerical"], w["numerical"], rtol=1e-12, atol=1e-15)


def test_two_logical_cpu_devices_give_the_verdicts_of_one():
    code = textwrap.dedent("""
        import json
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    """) + PROBLEMS + textwrap.dedent("""
        mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        out = {}
        for name in CASES:
            out[name] = {"one": run(name), "devices": run(name, device=["/CPU:0", "/CPU:1"]),
                         "strategy": run(name, device=mirrored)}
        print("RESULT " + json.dumps(out), flush=True)
    """)
    results = _results(_python(code))
    for runs in results.values():
        for way in ("devices", "strategy"):
            _same_verdicts(runs[way], runs["one"])
            assert runs["one"]["waves"] == [] and runs[way]["events"] == [], runs[way]["events"]
            assert runs[way]["waves"], runs[way]
            assert {where for _, where, _, _ in runs[way]["waves"]} == {"2 replicas (MirroredStrategy on CPU:0, CPU:1)"}
    assert results["correct"]["one"]["ok"]
    for name, index in (("wrong", 37), ("coloured", 1234)):
        worst = results[name]["devices"]["pairs"][0]["worst"][0]
        assert not results[name]["devices"]["ok"] and worst[1] == [index] and worst[2] == "mismatch", worst
    # full mode: the sweep's columns split evenly ("100 / 100" perturbations for 200 inputs)
    waves = [[int(c) for c in counts.split(" / ")] for label, _, counts, _ in results["correct"]["devices"]["waves"]
             if label == "perturbations"]
    assert all(len(c) == 2 and abs(c[0] - c[1]) <= 1 for c in waves) and sum(map(sum, waves)) >= 200, waves


def test_two_workers_on_localhost_give_the_verdicts_of_one_process():
    ports = []
    sockets = [socket.socket() for _ in range(2)]
    for s in sockets:
        s.bind(("localhost", 0))
        ports.append(s.getsockname()[1])
    for s in sockets:
        s.close()
    code = textwrap.dedent("""
        import json
        import tensorflow as tf
        strategy = tf.distribute.MultiWorkerMirroredStrategy()  # before any other op
    """) + PROBLEMS + textwrap.dedent("""
        out = {name: run(name, device=strategy) for name in ("correct", "wrong")}
        print("RESULT " + json.dumps(out), flush=True)
    """)
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    workers = [_python(code, {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})})
               for i in range(2)]
    try:
        reference = _reference(("correct", "wrong"))
        results = [_results(worker) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    assert results[0] == results[1]  # every worker writes the same report
    for name in ("correct", "wrong"):
        _same_verdicts(results[0][name], reference[name])
        # each worker evaluated its replicas' shares, results all-gathered
        wheres = {where for _, where, _, _ in results[0][name]["waves"]}
        assert wheres == {"2 replicas on 2 workers (MultiWorkerMirroredStrategy)"}, wheres
    assert reference["correct"]["ok"] and not reference["wrong"]["ok"]
    assert results[0]["wrong"]["pairs"][0]["worst"][0][1] == [37]


def test_one_replica_is_the_one_device_check(debug_log):
    x = tf.constant(np.linspace(-1, 1, 40))
    f = lambda x: tf.sin(x) * tf.reduce_sum(x)  # noqa: E731
    plain = fastcheck.check_gradients(f, x, mode="full", jit_compile=False)
    assert not logged(debug_log, WAVE)
    spread = fastcheck.check_gradients(f, x, mode="full", jit_compile=False, device=["/CPU:0"])
    assert plain.ok and spread.ok
    np.testing.assert_array_equal(plain.pairs[0].numerical, spread.pairs[0].numerical)
    np.testing.assert_array_equal(plain.pairs[0].analytical, spread.pairs[0].analytical)
    where = "1 replica (MirroredStrategy on CPU:0)"
    assert logged(debug_log, WAVE)[:2] == [("reverse-mode rows", where, "40", ""), ("perturbations", where, "40", "")]


@pytest.mark.parametrize(("device", "error", "match"), [
    (5, TypeError, r"device=5 is not valid: pass a device name such as '/GPU:0' .*a list of device names .*"
                   r"a tf.distribute.Strategy"),
    (object(), TypeError, r"device=<object .*> is not valid: pass a device name"),
    ("/CPU:9", ValueError, r"device='/CPU:9' does not exist on this machine .*or device=None"),
    ("nonsense", ValueError, r"device='nonsense' is not a device name"),
    (["/CPU:0", "/GPU:7"], ValueError, r"device=.*'/GPU:7' does not exist on this machine"),
    (("/CPU:0", "/CPU:9"), ValueError, r"device=.*'/CPU:9' does not exist on this machine"),
    (["nonsense"], ValueError, r"device=.*'nonsense' is not a device name"),
    (["/CPU"], ValueError, r"device=.*'/CPU' does not name one device"),
    ([], ValueError, r"device=\[\] is empty"),
    ([0], TypeError, r"device=\[0\]: 0 is not a device name"),
    (["/CPU:0", "/cpu:0"], ValueError, r"device=.* names a device more than once"),
])
def test_device_is_validated_naming_the_argument(device, error, match):
    x = tf.constant([0.5, 1.0], tf.float64)
    with pytest.raises(error, match=match):
        fastcheck.check_gradients(tf.sin, x, device=device)
    with pytest.raises(error, match=match):  # every entry point shares the validation
        fastcheck.numerical_jacobian(tf.sin, x, device=device)


def test_strategy_and_devices_are_refused_naming_device_and_every_entry_point_takes_a_strategy(debug_log):
    x = tf.constant([0.5, 1.0], tf.float64)
    one = tf.distribute.OneDeviceStrategy("/CPU:0")
    for name, value in (("strategy", one), ("devices", ["/CPU:0"])):
        with pytest.raises(TypeError, match=f"check_gradients\\(\\) no longer takes {name}=: device= takes"):
            fastcheck.check_gradients(tf.sin, x, **{name: value})
        with pytest.raises(TypeError, match=f"GradientChecker\\(\\) no longer takes {name}=: .*pass device="):
            fastcheck.GradientChecker(**{name: value})
        with pytest.raises(TypeError, match=f"verify_gradients\\(\\) no longer takes {name}="):
            fastcheck.verify_gradients(tf.sin, x, tf.cos(x), **{name: value})
    checker = fastcheck.GradientChecker(device=["/CPU:0"], jit_compile=False, mode="full")
    assert checker.check(tf.sin, x).ok
    assert {r[1] for r in logged(debug_log, WAVE)} == {"1 replica (MirroredStrategy on CPU:0)"}
    debug_log.clear()
    report = fastcheck.verify_gradients(lambda v: tf.reduce_sum(tf.sin(v)), x, tf.cos(x), device=one,
                                        jit_compile=False)
    assert report.ok and {r[1] for r in logged(debug_log, WAVE)} == {"1 replica (OneDeviceStrategy on CPU:0)"}
    jacobian = fastcheck.autodiff_jacobian(tf.sin, x, device=one, jit_compile=False)[0][0]
    np.testing.assert_allclose(jacobian, np.diag(np.cos(x.numpy())))


def test_out_of_memory_halves_the_chunk_and_the_shares_give_the_one_device_numbers(debug_log):
    x = tf.constant(np.linspace(0, 1, 50))
    f = lambda x: tf.sin(x) * tf.reduce_sum(x)  # noqa: E731
    plain = fastcheck.check_gradients(f, x, mode="full", jit_compile=False)
    with fastcheck.testing.out_of_memory(above=8):
        spread = fastcheck.check_gradients(f, x, mode="full", jit_compile=False, device=["/CPU:0"])
    assert plain.ok and spread.ok, str(spread)
    retries = logged(debug_log, "%s: out of memory at")  # (subject, chunk, unit, retried with)
    assert retries and all(r[3] == r[1] // 2 for r in retries), retries
    assert min(r[3] for r in retries) <= 8 < max(r[1] for r in retries)
    np.testing.assert_array_equal(plain.pairs[0].numerical, spread.pairs[0].numerical)
    assert {r[1] for r in logged(debug_log, WAVE)} == {"1 replica (MirroredStrategy on CPU:0)"}
