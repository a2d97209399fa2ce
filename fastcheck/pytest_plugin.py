"""pytest plugin: the ``gradcheck`` fixture, ``--fastcheck-*`` options and a JSON record of every check.

Installing fastcheck enables it (entry point ``fastcheck`` in the ``pytest11`` group; ``-p no:fastcheck`` turns it
off). TensorFlow is imported only when a test uses the fixture.

* ``gradcheck``: a ``fastcheck.GradientChecker`` whose defaults come from ``--fastcheck-device``,
  ``--fastcheck-precision`` and ``--fastcheck-mode`` (or the ini keys ``fastcheck_device``, ``fastcheck_precision``,
  ``fastcheck_mode``; the command line wins).
* Every check a test makes -- through ``gradcheck`` (recorded under its method's name: ``check``, ``assert_close``,
  ``verify_gradients``, ``check_model``), ``GradientTestCase`` or the plain API (``api``) -- is recorded: test id,
  verdict, errors, seconds and ``report.to_dict()``.
* ``--fastcheck-report=PATH`` (ini ``fastcheck_report``): one JSON document with every recorded check of the run,
  pytest-xdist workers included.
* A failing test shows, in a "fastcheck report" section, the full text of every failing report it made with
  ``gradcheck`` or holds in the frame that failed: ``assert report`` itself prints only the one-line ``repr``
  (pytest's assertion rewriting explains comparisons, not the truth value of an object).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import json
import pathlib
import sys

import pytest

# The values GradientChecker accepts (fastcheck.engine.config), checked here so that a typo stops the
# run before any test, and TensorFlow, starts. None: any value (a device is checked by the check).
CHOICES = {"device": None, "precision": ("auto", "native", "float64"), "mode": ("auto", "full", "fast", "coloured")}
HELP = {
    "device": "device the gradient checks run on, e.g. /GPU:0, or a comma-separated list (/GPU:0,/GPU:1) whose "
              "replicas share them",
    "precision": "precision of the numerical side: auto (float64 when f accepts it), native or float64",
    "mode": "full Jacobians, fast random projections, coloured sparse Jacobians, or auto (by size and time)",
}
RECORDED_METHODS = ("check", "assert_close", "verify_gradients", "check_model")
WORKER_KEY = "fastcheck_checks"  # pytest-xdist: what each worker hands the controller in config.workeroutput


@dataclasses.dataclass
class Run:
    """The options of this run and every check recorded so far (plain JSON values)."""

    options: dict
    report_path: pathlib.Path | None
    checks: list = dataclasses.field(default_factory=list)
    item: object = None  # the test running now
    observing: bool = False  # whether fastcheck's run_check reports to this run


# The gradcheck method a check runs under, if any (plain API and GradientTestCase checks: "api").
CALL: contextvars.ContextVar[str] = contextvars.ContextVar("fastcheck_call", default="api")


RUN = pytest.StashKey[Run]()
FAILED_TEXTS = pytest.StashKey[list]()  # per test item: str() of the failing reports gradcheck made (not the
# reports themselves: their Jacobians would stay in memory until the test run ends)


def pytest_addoption(parser):
    group = parser.getgroup("fastcheck", "gradient checks (fastcheck)")
    for name, choices in CHOICES.items():
        group.addoption(f"--fastcheck-{name}", dest=f"fastcheck_{name}", choices=choices, help=f"{HELP[name]} "
                        f"(ini: fastcheck_{name})")
        parser.addini(f"fastcheck_{name}", f"fastcheck: {HELP[name]}")
    group.addoption("--fastcheck-report", dest="fastcheck_report", metavar="PATH",
                    help="write every check the gradcheck fixture ran to PATH as JSON (ini: fastcheck_report)")
    parser.addini("fastcheck_report", "fastcheck: write every gradcheck check to this JSON file")


def pytest_configure(config):
    options = {}
    for name, choices in CHOICES.items():
        value = config.getoption(f"fastcheck_{name}") or config.getini(f"fastcheck_{name}")
        if value and choices and value not in choices:
            raise pytest.UsageError(f"fastcheck_{name} = {value} in the ini file is not valid: use one of {', '.join(choices)}.")
        if value:
            options[name] = _device_list(value) if name == "device" else value
    # A path on the command line is relative to where pytest runs, one in the ini file to the rootdir.
    path = None
    if config.getoption("fastcheck_report"):
        path = config.invocation_params.dir / config.getoption("fastcheck_report")
    elif config.getini("fastcheck_report"):
        path = config.rootpath / config.getini("fastcheck_report")
    config.stash[RUN] = Run(options, path)


def _device_list(text: str):
    """``device=`` from a command-line value: one name, or a list of them from a comma-separated one."""
    return [part.strip() for part in text.split(",")] if "," in text else text


@pytest.fixture
def gradcheck(request):
    """A ``fastcheck.GradientChecker`` configured by the ``--fastcheck-*`` options that records its checks."""
    import fastcheck

    run = request.config.stash[RUN]
    checker = fastcheck.GradientChecker(**run.options)
    for name in RECORDED_METHODS:
        setattr(checker, name, _recorded(getattr(checker, name), name, request.node, run))
    return checker


def _recorded(method, name: str, item, run: Run):
    @functools.wraps(method)
    def recorded(*args, **kwargs):
        __tracebackhide__ = True  # failures point at the test, not at this wrapper
        _observe(run)
        token = CALL.set(name)  # run_check's observer records the check under this name
        try:
            return method(*args, **kwargs)
        finally:
            CALL.reset(token)

    return recorded


def _observe(run: Run) -> None:
    """Record every check fastcheck makes from now on (``observers`` loads no TensorFlow: a run's first test's
    plain calls are recorded too)."""
    if run.observing:
        return
    from fastcheck.integrations.observers import OBSERVERS

    OBSERVERS.append(lambda report: _record(run, run.item, CALL.get(), report))
    run.observing = True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    run = item.config.stash[RUN]
    run.item = item
    _observe(run)
    try:
        return (yield)
    finally:
        run.item = None


def _record(run: Run, item, name: str, report) -> None:
    summary = report.to_dict()
    check = {"test": item.nodeid if item is not None else "(outside a test)", "call": name, "verdict": report.verdict,
             "max_abs_error": summary["max_abs_error"], "max_rel_error": summary["max_rel_error"],
             "seconds": report.seconds, "report": summary}
    run.checks.append(json.loads(json.dumps(check, default=_plain)))  # plain values: they cross to the xdist controller
    if not report.ok and item is not None and name != "api":  # the plain API's failing reports show where they fail
        item.stash.setdefault(FAILED_TEXTS, []).append(str(report))


def _plain(value):
    return value.item() if hasattr(value, "item") else str(value)  # numpy scalars; anything else as text


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "call":
        for check in reversed(item.config.stash[RUN].checks):  # this test's checks are the last ones recorded
            if check["test"] != item.nodeid or "test_outcome" in check:
                break
            check["test_outcome"] = report.outcome
    if call.when == "call" and call.excinfo is not None:
        texts = _failing_reports(item, call.excinfo)
        if texts:
            report.sections.append(("fastcheck report", "\n\n".join(texts)))
    return report


def _failing_reports(item, excinfo) -> list[str]:
    """The text of failing reports the test made with gradcheck or holds where it failed."""
    texts = item.stash.get(FAILED_TEXTS, [])
    if "fastcheck.report.results" in sys.modules:  # else no report exists (and importing one would import TensorFlow)
        from fastcheck import GradientReport

        tb = excinfo.tb
        while tb.tb_next is not None:
            tb = tb.tb_next
        texts = texts + [str(v) for v in tb.tb_frame.f_locals.values() if isinstance(v, GradientReport) and not v.ok]
    shown = {str(excinfo.value)}  # a GradientCheckError's message is its report already
    return [text for text in dict.fromkeys(texts) if text not in shown]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist controller: collect the checks a worker recorded."""
    output = getattr(node, "workeroutput", {})  # none from a worker that crashed
    node.config.stash[RUN].checks.extend(output.get(WORKER_KEY, []))


def pytest_sessionfinish(session):
    config = session.config
    run = config.stash[RUN]
    if hasattr(config, "workerinput"):  # an xdist worker: the controller writes the report
        config.workeroutput[WORKER_KEY] = run.checks
    elif run.report_path is not None:
        run.report_path.parent.mkdir(parents=True, exist_ok=True)
        run.report_path.write_text(json.dumps(_document(run), indent=2) + "\n")


def _document(run: Run) -> dict:
    from fastcheck import __version__

    checks = sorted(run.checks, key=lambda check: check["test"])  # stable: each test's checks keep their order
    verdicts = [check["verdict"] for check in checks]
    return {
        "fastcheck": __version__,
        "options": run.options,
        "summary": {"checks": len(checks), **{v: verdicts.count(v) for v in ("pass", "fail", "undecidable")}},
        "checks": checks,
    }


def pytest_terminal_summary(terminalreporter, config):
    """With ``--fastcheck-report``, the run's verdicts and where they were written; else a line only where failing
    tests made checks that did not pass (a test asserting a deliberate FAIL passes, and is no one's concern)."""
    run = config.stash[RUN]
    if run.report_path is not None:
        summary = _document(run)["summary"]
        terminalreporter.write_line(
            f"fastcheck: {summary['checks']} gradient checks, {summary['pass']} pass, {summary['fail']} fail, "
            f"{summary['undecidable']} undecidable; written to {run.report_path}")
        return
    failing = [c for c in run.checks if c.get("test_outcome") == "failed" and c["verdict"] != "pass"]
    if failing:
        verdicts = [c["verdict"] for c in failing]
        tests = len({c["test"] for c in failing})
        terminalreporter.write_line(
            f"fastcheck: {tests} failing test{'s' * (tests != 1)} made {len(failing)} gradient "
            f"check{'s' * (len(failing) != 1)} that did not pass ({verdicts.count('fail')} fail, {verdicts.count('undecidable')} undecidable); "
            "--fastcheck-report=PATH writes every check")
