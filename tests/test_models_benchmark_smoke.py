"""Smoke test of ``python -m benchmarks models``: one tiny tf_keras check writes a row to the JSON and the table.

No verdict or timing assertions: the suite records today's behaviour (benchmarks/results/models-2026-12-01-b9da3e6.md).
"""

import json

import pytest

from benchmarks import models


def test_quick_tf_keras_row(tmp_path, capsys):
    pytest.importorskip("tf_keras")
    code = models.main(["--env", "main", "--quick", "--classes", "tf-keras", "--variants", "defect", "--modes", "fast",
                        "--in-process", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().out
    record = json.loads((tmp_path / "models.json").read_text())
    assert record["cpu"] and record["seeds"] == 1
    [row] = record["rows"]
    assert (row["class"], row["variant"], row["mode"], row["seed"]) == ("tf-keras", "defect", "fast", 0)
    assert row["verdict"] in ("pass", "fail", "undecidable", "error") and row["seconds"] > 0
    assert row["planted"].startswith("planted_dense/kernel")
    assert "| tf-keras | defect | fast |" in (tmp_path / "models.md").read_text()


def test_right_judges_the_planted_variable():
    row = {"class": "tf-keras", "variant": "defect", "verdict": "fail", "planted": "planted_dense/kernel:0",
           "fail": ["planted_dense/kernel"], "undecidable": []}
    assert models.right(row)
    assert not models.right({**row, "fail": ["dense/kernel"]})
    assert models.right({**row, "class": "gpflow-gpr", "planted": "mean_function.A", "fail": ["model.mean_function.A"]})
    assert not models.right({**row, "variant": "correct"})
