"""The pytest plugin, run as a user's pytest runs it (pytester, in subprocesses), and the one-line report repr."""

import json
import os
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf

import fastcheck

pytest_plugins = ["pytester"]

ROOT = pathlib.Path(__file__).parent.parent
EXAMPLE = ROOT / "tests" / "examples" / "test_user_gradients.py"
# The plugin by its module name, whether or not this environment's install has the entry point (an install
# made before it existed lacks it); the entry point's copy is turned off so that the plugin registers once.
PLUGIN = ("-p", "no:fastcheck", "-p", "fastcheck.pytest_plugin")

USER_TESTS = '''
import numpy as np
import tensorflow as tf
import fastcheck
from fastcheck.testing import GradientTestCase

@tf.custom_gradient
def wrong_sin(x):
    return tf.sin(x), lambda g: -g * tf.cos(x)  # the sign is wrong

X = np.array([0.1, 0.2, 0.3])

def test_pass(gradcheck):
    assert gradcheck.check(tf.sin, X)

def test_override(gradcheck):
    report = gradcheck.check(tf.sin, X, mode="full")
    assert report.mode != "fast"

def test_assert_report(gradcheck):
    report = gradcheck.check(wrong_sin, X)
    assert report

def test_assert_close(gradcheck):
    gradcheck.assert_close(wrong_sin, X)

def test_plain_api():
    report = fastcheck.check_gradients(wrong_sin, X)
    assert report.ok

class CaseTest(GradientTestCase, tf.test.TestCase):
    def test_case(self):
        self.assertGradientsClose(wrong_sin, X)
'''


def run_pytest(pytester, monkeypatch, *args):
    """pytest in a new process, as a user's CI runs it."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    return pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider", *args, timeout=300)


def test_checks_under_xdist_are_recorded_and_failures_show_the_report(pytester, monkeypatch):
    pytester.makepyfile(test_user=USER_TESTS)
    result = run_pytest(pytester, monkeypatch, "-n", "2", "--fastcheck-mode", "fast", "--fastcheck-device", "/CPU:0",
                        "--fastcheck-precision", "float64", "--fastcheck-report", "out/checks.json")
    result.assert_outcomes(passed=2, failed=4, skipped=1)  # tf.test.TestCase skips its own test_session
    output = result.stdout.str()
    # `assert report` prints the one-line repr, and the full report follows in its own section.
    assert re.search(r"E\s+assert <GradientReport FAIL: 1 of 1 pairs failed, worst d .+ \(mismatch\) \[fast mode\]>", output)
    assert output.count(" fastcheck report ") == 2  # test_assert_report and test_plain_api
    assert "hint: " in output and "rule: " in output
    assert re.search(r"GradientCheckError: fastcheck .*: FAIL -- ", output)  # assert_close: the report is the message
    # Every check of the session, the plain API's and GradientTestCase's included, failing ones too.
    assert "fastcheck: 6 gradient checks, 2 pass, 4 fail, 0 undecidable; written to" in output
    assert "failing tests made" not in output  # the report's line replaces it

    document = json.loads((pytester.path / "out" / "checks.json").read_text())
    assert document["options"] == {"device": "/CPU:0", "precision": "float64", "mode": "fast"}
    assert document["summary"] == {"checks": 6, "pass": 2, "fail": 4, "undecidable": 0}
    checks = {check["test"].split("::")[-1]: check for check in document["checks"]}  # from both workers
    assert {name: (c["call"], c["verdict"]) for name, c in checks.items()} == {
        "test_assert_close": ("assert_close", "fail"), "test_assert_report": ("check", "fail"),
        "test_override": ("check", "pass"), "test_pass": ("check", "pass"), "test_plain_api": ("api", "fail"),
        "test_case": ("api", "fail")}
    assert checks["test_pass"]["report"]["mode"] == "fast" and checks["test_override"]["report"]["mode"] != "fast"
    assert checks["test_assert_report"]["max_abs_error"] > 1 and checks["test_assert_report"]["report"]["verdict"] == "fail"
    assert all(c["seconds"] > 0 and c["report"]["pairs"] for c in checks.values())


def test_the_summary_line_names_only_failing_tests_checks(pytester, monkeypatch):
    """Without --fastcheck-report, the run ends with a line only where failing tests made checks that did not pass:
    a test that asserts a deliberate FAIL is green, and its check is nobody's concern."""
    pytester.makepyfile(test_user=USER_TESTS)
    output = run_pytest(pytester, monkeypatch, "-k", "assert_report or pass or override").stdout.str()
    assert "fastcheck: 1 failing test made 1 gradient check that did not pass (1 fail, 0 undecidable)" in output
    pytester.makepyfile(test_user=USER_TESTS.replace("    assert report\n", "    assert not report\n"))
    output = run_pytest(pytester, monkeypatch, "-k", "assert_report or pass or override").stdout.str()
    assert "3 passed" in output and "fastcheck:" not in output


def test_options_from_the_ini_file_and_the_command_line(pytester, monkeypatch):
    pytester.makeini("[pytest]\nfastcheck_device = /CPU:0\nfastcheck_precision = native\nfastcheck_mode = fast\n"
                     "fastcheck_report = reports/ini.json\n")
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    run_pytest(pytester, monkeypatch).assert_outcomes(passed=1)
    document = json.loads((pytester.path / "reports" / "ini.json").read_text())
    assert document["options"] == {"device": "/CPU:0", "precision": "native", "mode": "fast"}
    assert document["summary"]["checks"] == 0 and document["checks"] == []

    run_pytest(pytester, monkeypatch, "--fastcheck-mode", "full", "--fastcheck-report", "cli.json").assert_outcomes(passed=1)
    document = json.loads((pytester.path / "cli.json").read_text())
    assert document["options"] == {"device": "/CPU:0", "precision": "native", "mode": "full"}  # the command line wins

    # a comma-separated list: device= as a list of device names (replicas of a MirroredStrategy)
    run_pytest(pytester, monkeypatch, "--fastcheck-device", "/CPU:0,/CPU:1", "--fastcheck-report", "list.json"
               ).assert_outcomes(passed=1)
    assert json.loads((pytester.path / "list.json").read_text())["options"]["device"] == ["/CPU:0", "/CPU:1"]


def test_invalid_option_values_stop_the_run(pytester, monkeypatch):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = run_pytest(pytester, monkeypatch, "--fastcheck-mode", "fastest")
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "invalid choice: 'fastest'" in result.stderr.str()
    pytester.makeini("[pytest]\nfastcheck_precision = float16\n")
    result = run_pytest(pytester, monkeypatch)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "fastcheck_precision = float16 in the ini file is not valid: use one of auto, native, float64." in result.stderr.str()


def test_the_user_example_suite_passes_and_is_recorded(pytester):
    pytester.makepyfile(test_user_gradients=EXAMPLE.read_text())
    # In this process: TensorFlow, Keras and TFP load once (the xdist test above runs the plugin in new processes).
    result = pytester.runpytest_inprocess(*PLUGIN, "-p", "no:xdist", "-p", "no:cacheprovider", "--fastcheck-report",
                                          "user.json")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 7 and "failed" not in outcomes and "errors" not in outcomes, result.stdout.str()
    document = json.loads((pytester.path / "user.json").read_text())
    checks = {check["test"].split("::")[-1]: check for check in document["checks"]}
    assert {name: (c["call"], c["verdict"]) for name, c in checks.items()} == {
        "test_custom_op_gradient": ("check", "pass"), "test_model_gradients": ("check_model", "pass"),
        "test_model_gradients_in_training_mode": ("check_model", "pass"), "test_bijector_log_det_jacobian": ("check", "pass"),
        # GradientTestCase's checks too (graph mode's runs eagerly on the side)
        "test_eager": ("api", "pass"), "test_graph_mode": ("api", "pass"), "test_model": ("api", "pass")}
    assert "training=True" in checks["test_model_gradients_in_training_mode"]["report"]["title"]
    assert [p["input"] for p in checks["test_model_gradients"]["report"]["pairs"]] == [
        "user_model/hidden/kernel", "user_model/hidden/bias", "user_model/head/kernel", "user_model/head/bias"]


def test_option_choices_are_those_gradient_checker_accepts():
    from fastcheck.pytest_plugin import CHOICES

    for name in ("precision", "mode"):
        for value in CHOICES[name]:
            fastcheck.GradientChecker(**{name: value})
        with pytest.raises(ValueError) as error:
            fastcheck.GradientChecker(**{name: "bogus"})
        assert repr(CHOICES[name]) in str(error.value)  # "pass one of ('auto', ...)": no value missing or extra


def test_entry_point_is_declared():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'\[project\.entry-points\.pytest11\]\n(#.*\n)*fastcheck = "fastcheck\.pytest_plugin"\n', pyproject)


@tf.custom_gradient
def _wrong_sin(x):
    return tf.sin(x), lambda g: -g * tf.cos(x)


@pytest.mark.parametrize("f, x, expected", [
    (tf.sin, np.array([0.1, 0.2]), r"<GradientReport ok: 0 of 1 pairs failed, max abs error \S+ \[reverse mode\]>"),
    (_wrong_sin, np.array([0.1, 0.2]),
     r"<GradientReport FAIL: 1 of 1 pairs failed, worst d output\[\d\] / d input\[\d\] abs error 2 \(mismatch\) \[reverse mode\]>"),
    (tf.math.log, np.array([-1.0, 2.0]),
     r"<GradientReport UNDECIDABLE: 0 of 1 pairs failed, 1 undecidable, worst d output\[0\] / d input\[0\] abs error nan \(numerical not finite\)"),
])
def test_report_repr_is_one_line(f, x, expected):
    report = fastcheck.check_gradients(f, x)
    assert re.match(expected, repr(report)), repr(report)
    assert re.fullmatch(r"<PairReport output / input: (ok|FAIL|undec\.), \d+ of 4 elements failed, max abs error \S+>",
                        repr(report.pairs[0]))


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_report_json_holds_numbers_and_null_for_nan(mode):
    report = fastcheck.check_gradients(tf.math.log, np.array([-1.0, 2.0]), mode=mode)
    document = json.loads(json.dumps(report.to_dict(), allow_nan=False))  # strict JSON: no NaN or Infinity
    assert document["verdict"] == "undecidable"
    assert document["max_abs_error"] is None or isinstance(document["max_abs_error"], float)
    if mode == "full":
        assert document["max_abs_error"] is None and document["pairs"][0]["max_abs_error"] is None


def test_plain_calls_of_a_runs_first_test_are_recorded(pytester, monkeypatch):
    # No test before them loaded fastcheck: the first test's plain calls are recorded as the second's.
    pytester.makepyfile(test_first=(
        "import tensorflow as tf\nimport fastcheck\n\n"
        "def test_first():\n    assert fastcheck.check_gradients(tf.sin, tf.constant([0.5], tf.float64))\n\n"
        "def test_second():\n    assert fastcheck.check_gradients(tf.cos, tf.constant([0.5], tf.float64))\n"))
    run_pytest(pytester, monkeypatch, "--fastcheck-report", "plain.json").assert_outcomes(passed=2)
    document = json.loads((pytester.path / "plain.json").read_text())
    assert sorted(check["test"].split("::")[-1] for check in document["checks"]) == ["test_first", "test_second"]
