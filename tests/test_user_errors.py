"""The user's own exception, raised by f on its Nth call, reaches the caller as itself.

fastcheck calls f after planning traced into its kernels (xla, graph), or eagerly;
an exception of the user's there used to come out as a ValueError (jit_compile=False),
as TensorFlow's StagingError (jit_compile=True), or not at all (a failing trace
read as "f needs AutoGraph" and retried).  Errors fastcheck handles on purpose (a
compile failure falling back a path, an untraceable f evaluated eagerly) still are.
"""

import traceback

import numpy as np
import pytest
import tensorflow as tf
from conftest import events_of

import fastcheck


class MyError(RuntimeError):
    """A user's exception: RuntimeError's constructor, so AutoGraph cannot rebuild it (StagingError)."""


def counting(step, fail_on=None, state=None):
    """f = step(x), which raises MyError on call ``fail_on``; ``f.calls`` counts, ``f.raised`` keeps what it raised."""

    def f(x):
        f.calls += 1
        if state is not None:
            state.assign_add(tf.ones_like(state))  # a side effect the check must undo
        if f.calls == fail_on:
            error = MyError(f"boom on call {f.calls}")
            f.raised.append(error)
            raise error
        return step(x)

    f.calls, f.raised = 0, []
    return f


def traced(x):
    return tf.sin(x) * x


def untraceable(x):  # .numpy(): no tf.function can run it, so the check runs eagerly
    return tf.sin(x) * (1.0 if x.numpy().max() < 10 else 2.0)


# (function, check_gradients options, the path a clean check takes)
SETTINGS = {
    "graph": (traced, {"jit_compile": False}, "graph"),
    "xla": (traced, {"jit_compile": True}, "xla"),
    "eager": (untraceable, {"jit_compile": False}, "eager"),
}
# The first two calls are planning's, at the inputs; the next is the trace that picks the route.  f's own
# exception on any of them is f's, as on every later call: no path falls back for it.
PLANNING_CALLS = 2
PROBE_CALL = PLANNING_CALLS + 1


def _calls_of_a_clean_check(step, options, path, x):
    f = counting(step)
    report = fastcheck.check_gradients(f, x, **options)
    assert report.ok and report.path == path, report
    assert f.calls > PLANNING_CALLS + 1
    return f.calls


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_own_exception_on_every_later_call_comes_out_as_itself(setting):
    step, options, path = SETTINGS[setting]
    value = np.array([0.3, -0.5, 0.7])
    x = tf.Variable(value)
    total = _calls_of_a_clean_check(step, options, path, x)
    for n in range(1, total + 1):
        f = counting(step, fail_on=n)
        try:
            report = fastcheck.check_gradients(f, x, **options)
        except MyError as error:
            raised = pytest.ExceptionInfo.from_exception(error)
        else:  # only while the route's trace probes f (its AutoGraph retry too): read as f refusing tracing
            assert options.get("jit_compile") is not True and n > PLANNING_CALLS, f"call {n}: swallowed"
            (fell,) = events_of(report, "FellBack")
            assert report.path == "eager" and fell.path == "tracing" and fell.error.startswith("MyError"), report.notes
            continue
        assert raised.value is f.raised[0], f"call {n}: not the user's own exception object"
        assert str(raised.value) == f"boom on call {n}"  # its message as f wrote it (the note is apart)
        assert f.calls == n, f"call {n}: fastcheck called f again after it raised"
        notes = "\n".join(raised.value.__notes__)
        assert notes.startswith("fastcheck: f raised this"), notes
        innermost = traceback.extract_tb(raised.value.__traceback__)[-1]
        # Into f: its frame, or (raised in AutoGraph's conversion of f) the note's line of f's source
        assert (innermost.filename, innermost.name) == (__file__, "f") or f'File "{__file__}"' in notes, (innermost, notes)
        assert x.numpy().tobytes() == value.tobytes()
    assert tf.executing_eagerly()  # no graph context left behind
    # Nothing of the failed checks lingers: the same kind of check still runs and passes.
    report = fastcheck.check_gradients(counting(step), x, **options)
    assert report.ok and report.path == path


@pytest.mark.parametrize("setting", ["graph", "eager"])
def test_state_f_changes_is_restored_when_it_raises(setting):
    step, options, path = SETTINGS[setting]
    value = np.array([1.0, 2.0, 3.0])
    x = tf.Variable(value)
    f = counting(step, state=x)
    fastcheck.check_gradients(f, x, **options)  # f moves x on every call; the check restores it
    np.testing.assert_array_equal(x.numpy(), value)
    for n in (PROBE_CALL + 2, f.calls):
        with pytest.raises(MyError):
            fastcheck.check_gradients(counting(step, fail_on=n, state=x), x, **options)
        assert x.numpy().tobytes() == value.tobytes()


def test_own_exception_in_the_routing_trace_means_f_runs_eagerly():
    # Raised only where f is traced: f refuses tracing (test_truth's NoTracing), and its eager calls, which run,
    # give the verdict; with XLA demanded, f's exception as itself.
    f = counting(traced, fail_on=PROBE_CALL)
    report = fastcheck.check_gradients(f, tf.constant([0.3, -0.5, 0.7], tf.float64), jit_compile=False)
    assert report.ok and report.path == "eager"
    (fell,) = events_of(report, "FellBack")
    assert (fell.path, fell.following) == ("tracing", "eager") and fell.error.startswith("MyError"), report.notes
    assert report.notes[report.events.index(fell)].startswith("tracing failed for f (MyError: "), report.notes
    with pytest.raises(MyError):
        fastcheck.check_gradients(counting(traced, fail_on=PROBE_CALL), tf.constant([0.3, 0.5], tf.float64),
                                  jit_compile=True)


def test_planning_calls_pass_it_and_wrap_handled_errors_with_the_cause():
    for n in range(1, PLANNING_CALLS + 1):
        f = counting(traced, fail_on=n)
        with pytest.raises(MyError) as raised:
            fastcheck.check_gradients(f, tf.constant([0.3, 0.5], tf.float64))
        assert raised.value is f.raised[0]

    def refusing(x):
        raise ValueError("not at these inputs")

    with pytest.raises(ValueError, match="f raised ValueError when called with the inputs") as raised:
        fastcheck.check_gradients(refusing, tf.constant([0.3, 0.5], tf.float64))
    assert str(raised.value.__cause__) == "not at these inputs"


def test_compute_gradient_passes_it_on_every_call():
    # As tf.test.compute_gradient, which calls f itself: the user's exception on any call.
    x = tf.constant([0.3, -0.5, 0.7], tf.float64)
    f = counting(traced)
    fastcheck.compute_gradient(f, [x])
    total = f.calls
    for n in range(1, total + 1):
        failing = counting(traced, fail_on=n)
        with pytest.raises(MyError) as raised:
            fastcheck.compute_gradient(failing, [x])
        assert raised.value is failing.raised[0] and str(raised.value) == f"boom on call {n}"
        assert traceback.extract_tb(raised.value.__traceback__)[-1].filename == __file__


def test_builtin_exception_raised_in_f_is_f_own():
    calls = []

    def f(x):
        calls.append(1)
        if len(calls) == PLANNING_CALLS + 1:  # the trace of the route's probe
            raise KeyError("missing")
        return tf.sin(x)

    with pytest.raises(KeyError, match="missing"):
        fastcheck.check_gradients(f, tf.constant([0.3, 0.5], tf.float64), jit_compile=True)


def test_handled_errors_keep_their_handling():
    # .numpy() cannot be traced: AttributeError, read as "evaluate eagerly", not re-raised.
    x = tf.constant([0.3, -0.5, 0.7], tf.float64)
    assert fastcheck.check_gradients(untraceable, x, jit_compile=False).path == "eager"
    # XLA cannot compile MatrixSquareRoot: InvalidArgumentError, read as "fall back a path".
    report = fastcheck.check_gradients(tf.linalg.sqrtm, tf.constant([[2.0, 0.3], [0.3, 1.5]], tf.float64),
                                       jit_compile=True)
    assert report.ok and report.path == "graph"
    assert [(e.path, e.following) for e in events_of(report, "FellBack")] == [("xla", "graph")], report.notes
    # Python control flow on a tensor fails to trace without AutoGraph: retried with it.
    report = fastcheck.check_gradients(lambda x: tf.sin(x) if tf.reduce_sum(x) > 0 else x, x, jit_compile=True)
    assert report.ok and report.path == "xla"
