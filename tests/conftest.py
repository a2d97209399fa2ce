import logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# tests/examples is a user's test suite, run by test_examples.py with the plugin's options: not collected here.
collect_ignore = ["examples"]

# How the *user's* function is wrapped: the check must work for each.
VARIANTS = {
    "eager": lambda f: f,
    "tf_function": lambda f: tf.function(f),
    "xla": lambda f: tf.function(f, jit_compile=True),
}
DTYPES = {"float32": tf.float32, "float64": tf.float64}


@pytest.fixture(params=sorted(VARIANTS))
def variant(request):
    return VARIANTS[request.param]


@pytest.fixture(params=sorted(DTYPES))
def dtype(request):
    return DTYPES[request.param]


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def events_of(report, kind: str) -> list:
    """The report's events of one kind (``to_dict``'s "kind": the event's type name, ``fastcheck.report.events``)."""
    return [event for event in report.events if type(event).__name__ == kind]


@pytest.fixture
def debug_log(caplog):
    """``caplog`` with the "fastcheck" logger at DEBUG: how a check's work ran (route, chunks, kernels, retries)."""
    caplog.set_level(logging.DEBUG, logger="fastcheck")
    return caplog


NOISE_TABLES = "f's noise measured from"  # the log line of a noise measurement: (tables, of them one call each)


def logged(caplog, start: str) -> list[tuple]:
    """The arguments of the fastcheck log lines (``debug_log``) whose format starts with ``start``, in order."""
    return [record.args for record in caplog.records
            if record.name.startswith("fastcheck") and str(record.msg).startswith(start)]


def checked(f, inputs, tables=None, **options):
    """``fastcheck.check_gradients`` with some tunables overridden (``fastcheck.testing.tunables``) for this check."""
    import fastcheck
    from fastcheck.testing import tunables

    with tunables(**(tables or {})):
        return fastcheck.check_gradients(f, inputs, **options)
