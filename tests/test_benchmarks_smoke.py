"""Smoke test of the benchmark suite: a tiny run writes its files, and compare flags regressions.

No timing assertions: only that the machinery runs and its outputs have the documented shape.
"""

import copy
import json

import pytest

from benchmarks import report
from benchmarks.__main__ import main
from benchmarks.names import CONTENDERS


def test_smoke_run_writes_json_markdown_and_plot(tmp_path, capsys):
    code = main(["--smoke", "--only", "dense", "--out", str(tmp_path), "--repeats", "1"])
    assert code == 0, capsys.readouterr().out

    for name in ("latest.json", "latest.md", "latest.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    stamped = [p for p in tmp_path.glob("*.json") if p.name != "latest.json"]
    assert len(stamped) == 1
    assert not list(tmp_path.glob("*.tmp"))

    record = json.loads((tmp_path / "latest.json").read_text())
    for key in ("schema", "timestamp", "settings", "machine", "device", "versions", "git_commit",
                "memory_method", "results", "wall_seconds"):
        assert key in record, key
    for key in ("python", "tensorflow", "tensorflow_probability", "numpy"):
        assert record["versions"][key], key
    assert record["settings"]["preset"] == "smoke"
    assert [r["family"] for r in record["results"]] == ["dense"]

    result = record["results"][0]
    assert set(result["contenders"]) == set(CONTENDERS)
    assert result["fastcheck"]["path"] in ("xla", "graph", "loop", "eager")
    assert "flop_rate" in result and result["flop_rate"]["matmul"]["gflops"] > 0
    for name, measurement in result["contenders"].items():
        assert measurement["status"] in ("ok", "over_cap", "skipped", "error", "n/a"), name
        for key in ("seconds", "samples", "peak_rss_mib", "ratio"):
            assert key in measurement, (name, key)
    assert result["contenders"]["fastcheck_cold"]["status"] == "ok"
    assert result["contenders"]["compute_gradient"]["baseline"] == "fastcheck_cold"

    markdown = (tmp_path / "latest.md").read_text()
    assert "| dense n=" in markdown and "tf.test.compute_gradient" in markdown
    assert markdown in capsys.readouterr().out  # the table is printed too


def _record(seconds: dict, ok: bool = True) -> dict:
    """A hand-made result file: one problem, the given seconds per contender."""
    contenders = {
        name: {"status": "ok" if name in seconds else "n/a", "seconds": seconds.get(name), "samples": [],
               "estimate": None, "ratio": None}
        for name in CONTENDERS
    }
    return {
        "timestamp": "2025-01-01T00:00:00Z",
        "git_commit": "0" * 40,
        "settings": {"preset": "quick"},
        "machine": {"cpu": "test cpu"},
        "device": {"used": "cpu"},
        "results": [{"family": "dense", "label": "dense n=256", "size": 256, "expected_ok": True,
                     "fastcheck": {"ok": ok, "path": "xla"}, "contenders": contenders}],
    }


def test_compare_flags_a_planted_regression_but_not_an_improvement(tmp_path):
    old = _record({"fastcheck_cold": 1.0, "fastcheck_warm": 0.1, "compute_gradient": 5.0})
    slower = _record({"fastcheck_cold": 1.0, "fastcheck_warm": 0.2, "compute_gradient": 5.0})
    faster = _record({"fastcheck_cold": 0.5, "fastcheck_warm": 0.05, "compute_gradient": 5.0})

    text, regressions = report.compare(old, slower, threshold=1.25)
    assert regressions == 1
    warm_line = next(line for line in text.splitlines() if "fastcheck warm" in line)
    assert "REGRESSION" in warm_line and "2.00" in warm_line

    text, regressions = report.compare(old, faster, threshold=1.25)
    assert regressions == 0
    assert "REGRESSION" not in text and "improved" in text

    # A verdict regression counts even when the time did not change.
    text, regressions = report.compare(old, _record({"fastcheck_cold": 1.0, "fastcheck_warm": 0.1,
                                                     "compute_gradient": 5.0}, ok=False))
    assert regressions == 1

    # The command line: exit code 1 on a fastcheck regression, 0 otherwise.
    paths = {}
    for name, record in (("old", old), ("slower", slower), ("faster", faster)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(record))
    assert main(["compare", str(paths["old"]), str(paths["slower"]), "--threshold", "1.25"]) == 1
    assert main(["compare", str(paths["old"]), str(paths["faster"]), "--threshold", "1.25"]) == 0
    # A slower baseline contender is shown but does not fail the comparison.
    slow_baseline = copy.deepcopy(old)
    slow_baseline["results"][0]["contenders"]["compute_gradient"]["seconds"] = 50.0
    assert report.compare(old, slow_baseline)[1] == 0


def test_corpus_problem_is_skipped_with_a_note_when_corpus_is_missing(monkeypatch):
    import sys

    import benchmarks
    from benchmarks import problems

    monkeypatch.delattr(benchmarks, "corpus", raising=False)
    monkeypatch.setitem(sys.modules, "benchmarks.corpus", None)  # import now fails as if the file were absent
    instance, reason = problems.corpus_instance(None)
    assert instance is None and "corpus.py" in reason


def test_fast_mode_problems_record_reference_ratio_and_region(tmp_path, capsys):
    code = main(["--smoke", "--only", "fast_scale,fast_defect", "--out", str(tmp_path), "--repeats", "1", "--no-plot"])
    assert code == 0, capsys.readouterr().out
    record = json.loads((tmp_path / "latest.json").read_text())
    results = {r["family"]: r for r in record["results"]}
    assert set(results) == {"fast_scale", "fast_defect"}
    for family, result in results.items():
        contenders = result["contenders"]
        assert contenders["fastcheck_cold"]["status"] == "ok", family
        assert contenders["reference"]["status"] == "ok", family
        for name in ("compute_gradient", "loop"):
            assert contenders[name]["status"] == "skipped" and "out of reach" in contenders[name]["how"]
        fast = result["fast"]
        assert fast["mode"] == "fast" and fast["reference_seconds"] > 0
        assert fast["fastcheck_cold_over_reference"] > 0
    assert results["fast_scale"]["expected_ok"] and results["fast_scale"]["fast"]["verdict"] == "pass"
    defect = results["fast_defect"]["fast"]
    assert not results["fast_defect"]["expected_ok"]
    assert defect["caught"] and defect["regions"] and defect["region_overlaps_defect"]
    markdown = (tmp_path / "latest.md").read_text()
    assert "## Fast mode at scale" in markdown


def test_verdict_table_on_a_few_cases_writes_markdown_and_json(tmp_path, capsys):
    from fastcheck.integrations.cli import main as cli_main  # `fastcheck bench verdicts` passes its arguments on

    cases = ["sign_sin", "erf", "tfp_dawsn"]
    code = cli_main(["bench", "verdicts", "--cases", ",".join(cases), "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    for name in ("verdicts.json", "verdicts.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert not list(tmp_path.glob("*.tmp"))

    record = json.loads((tmp_path / "verdicts.json").read_text())
    for key in ("schema", "timestamp", "settings", "rules", "versions", "summary", "wrong", "cases", "wall_seconds"):
        assert key in record, key
    assert sorted(record["case_names"]) == sorted(cases)
    assert set(record["summary"]) == {"float32", "float64"}
    contenders = ("fastcheck", "torch", "jax")
    for dtype, by_name in record["summary"].items():
        assert set(by_name) == set(contenders), dtype
        for name, counts in by_name.items():
            assert counts["wrong"] == 1 and counts["correct"] == 2, (dtype, name)
            for key in ("caught", "false_alarms", "misses", "errors"):
                assert key in counts, key
            assert counts["caught"] + counts["misses"] == counts["wrong"]
    assert set(record["wrong"]) == set(contenders)
    assert len(record["cases"]) == 2 * len(cases)
    for entry in record["cases"]:
        assert {"case", "dtype", "correct", "category", "compute_gradient", *contenders} <= set(entry)
        for name in contenders:
            assert entry[name]["outcome"] in ("pass", "caught", "false alarm", "miss")
    sign = [e for e in record["cases"] if e["case"] == "sign_sin"]
    assert all(e["fastcheck"]["outcome"] == "caught" for e in sign)  # a sign flip: every checker sees it

    markdown = (tmp_path / "verdicts.md").read_text()
    assert "wrong caught / total wrong" in markdown and "false alarms / total correct" in markdown
    assert "wrong caught / total wrong" in out  # the summary is printed too


def test_cold_process_table_and_problem_names():
    from benchmarks import cold

    record = {"cpu": "Some CPU", "cpus": 2, "repeats": 1,
              "problems": {"dense-4096": {"fastcheck": 0.5, "compute_gradient": 1.5, "ratio": 3.0, "path": "xla",
                                          "mode": "full", "ok": True}}}
    table = cold.to_markdown(record)
    assert "Some CPU x 2" in table and "| dense-4096 | 0.5 s | xla | full | 1.5 s | x3.00 |" in table
    with pytest.raises(SystemExit):
        cold.main(["--only", "no-such-problem"])
