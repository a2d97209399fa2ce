"""The ``fastcheck`` command, run as a user runs it."""

import json
import subprocess
import sys

import pytest


def _run(*args):
    return subprocess.run([sys.executable, "-m", "fastcheck", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_demo_runs_and_every_example_behaves(dtype, tmp_path):
    out = tmp_path / "demo.json"
    result = _run("demo", "--dtype", dtype, "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""  # TensorFlow's start-up lines are kept off stderr
    text = result.stdout
    assert "6 of 6 examples behaved as expected" in text
    assert "log received non-positive values" in text and "UNDECIDABLE" in text
    assert "wrong sign" in text and "analytical=" in text and "numerical=" in text
    assert "loss / sequential/dense/kernel" in text
    assert "verify_gradients" in text
    assert "coloured mode" in text and "d output[241, 64] / d input[241, 64]" in text  # the one wrong element of 262,144
    records = json.loads(out.read_text())
    assert [e["verdict"] for e in records["examples"]] == ["pass", "undecidable", "pass", "fail", "pass", "fail"]
    assert all(e["as_expected"] for e in records["examples"])


def test_help_texts():
    main = _run("--help")
    assert main.returncode == 0 and "demo" in main.stdout and "bench" in main.stdout and "check" in main.stdout
    demo = _run("demo", "--help")
    assert demo.returncode == 0 and "--dtype" in demo.stdout and "--json" in demo.stdout
    assert _run().returncode == 2


def test_bench_outside_a_checkout_says_where_to_run_it(tmp_path):
    # benchmarks/ is not installed with the package: it runs from a source checkout.
    result = subprocess.run([sys.executable, "-m", "fastcheck", "bench", "--help"], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert result.returncode == 2 and "source checkout" in result.stderr
