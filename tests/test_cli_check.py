"""``fastcheck check MODULE:FUNCTION``: exit statuses, inputs, JSON, and one-line usage errors."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from fastcheck.integrations.cli import main

ROOT = pathlib.Path(__file__).parent.parent

USER_OPS = '''
import tensorflow as tf

@tf.custom_gradient
def wrong_softplus(x):
    return tf.math.softplus(x), lambda g: -g * tf.sigmoid(x)  # the sign is wrong

def layer(x, w):
    return tf.tanh(x @ w)

def log_total(x):
    return tf.reduce_sum(tf.math.log(x))

not_a_function = 3
'''


@pytest.fixture
def user_ops(tmp_path, monkeypatch):
    """A user's module, user_ops.py, in the current folder."""
    (tmp_path / "user_ops.py").write_text(USER_OPS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path / "user_ops.py"
    sys.modules.pop("user_ops", None)


@pytest.mark.parametrize("args, status, verdict", [
    (["user_ops:layer", "--shape", "3,4", "--shape", "4,2"], 0, "ok"),
    (["user_ops.py:wrong_softplus", "--shape", "5", "--dtype", "float64"], 1, "FAIL"),
    (["user_ops:log_total", "--shape", "3", "--seed", "0"], 2, "UNDECIDABLE"),  # a negative sample: log is NaN
    (["user_ops:log_total", "--shape", "", "--seed", "1"], 0, "ok"),  # a scalar (0.35)
])
def test_exit_status_follows_the_verdict(user_ops, capsys, args, status, verdict):
    assert main(["check", *args]) == status
    out = capsys.readouterr().out
    assert out.startswith(f"fastcheck {args[0]} on inputs ") and f": {verdict} -- " in out.splitlines()[0]


def test_inputs_from_npz_in_saved_order_and_json(user_ops, capsys):
    rng = np.random.default_rng(0)
    np.savez(user_ops.parent / "inputs.npz", x=rng.normal(size=(3, 4)), w=rng.normal(size=(4, 2)))
    assert main(["check", f"{user_ops}:layer", "--inputs", "inputs.npz", "--dtype", "float32", "--mode", "full",
                 "--json", "out.json"]) == 0
    assert "on inputs [3, 4] float32, [4, 2] float32: ok" in capsys.readouterr().out
    record = json.loads((user_ops.parent / "out.json").read_text())
    assert record["inputs"] == [{"shape": [3, 4], "dtype": "float32"}, {"shape": [4, 2], "dtype": "float32"}]
    assert record["verdict"] == "pass" and record["exit_status"] == 0 and len(record["pairs"]) == 2


@pytest.mark.parametrize("args, message", [
    (["no_such_module:f", "--shape", "3"], "cannot import 'no_such_module' (No module named 'no_such_module'): run "
                                          "fastcheck in the folder that holds it"),
    (["user_ops:nothing", "--shape", "3"], "user_ops has no 'nothing': name one of its functions (layer, log_total, "
                                           "wrong_softplus)."),
    (["user_ops:not_a_function", "--shape", "3"], "user_ops:not_a_function is not a function (its type is int)"),
    (["user_ops", "--shape", "3"], "'user_ops' does not name a function: pass MODULE:FUNCTION"),
    (["missing/ops.py:f", "--shape", "3"], "missing/ops.py: no such file"),
    (["user_ops:layer", "--shape", "3,x"], "--shape '3,x' is not a shape: pass sizes separated by commas"),
    (["user_ops:layer"], "pass --shape once per input (e.g. --shape 3,4 --shape 4) or --inputs FILE.npz"),
    (["user_ops:layer", "--inputs", "missing.npz"], "--inputs missing.npz: no such file"),
    (["user_ops:layer", "--inputs", "user_ops.py"], "--inputs user_ops.py is not an .npz file numpy can read"),
    (["user_ops:layer", "--shape", "3", "--shape", "5"], "checking user_ops:layer on inputs [3] float32, [5] float32 "
                                                         "failed: "),
    (["user_ops:layer", "--shape", "3,4", "--shape", "4,2", "--device", "/GPU:99"], "failed: ValueError: "),
    (["user_ops:layer", "--shape", "3,4", "--shape", "4,2", "--device", "/CPU:0,/CPU:9"],
     "failed: ValueError: device=['/CPU:0', '/CPU:9']: '/CPU:9' does not exist on this machine"),
])
def test_usage_errors_are_one_line_with_status_2(user_ops, capsys, args, message):
    assert main(["check", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("fastcheck check: ") and message in captured.err and captured.err.count("\n") == 1


def test_a_new_process_has_a_clean_stderr(user_ops):
    # TensorFlow's start-up lines (absl, oneDNN, CUDA) are kept off stderr.
    result = subprocess.run([sys.executable, "-m", "fastcheck", "check", "user_ops:layer", "--shape", "2,3",
                             "--shape", "3,2"], capture_output=True, text=True, timeout=300, cwd=user_ops.parent,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == "" and ": ok -- " in result.stdout
