"""f that TensorFlow cannot batch, f that refuses points near x, and f's own exceptions.

* An f ``vectorized_map`` or XLA cannot batch (it runs eagerly at the same inputs) is checked on a path that runs
  it (the loop, or the eager loop), with a note naming what failed: a pass for a correct gradient, a FAIL naming the
  element for a planted 1% defect, on every ``jit_compile`` and on every repeat alike.
* f that raises at a perturbed point (an assertion, TFP's ``validate_args``) is f not finite there: the check
  returns a report, its verdicts those of the domain edge's ladder.
* f's own exception, from whichever call of f, leaves the check as itself, a variable input restored bit for bit.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from conftest import checked

import fastcheck

JIT = [True, False, "auto"]


def _sqrt_through_a_tape(defect: float):
    """sqrt(|x|) whose gradient is the tape's inside a custom_gradient (a cond pfor cannot convert), times
    (1 + defect) at element 1."""
    @tf.custom_gradient
    def g(x):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = tf.cond(tf.reduce_all(x > 0), lambda: tf.sqrt(x), lambda: tf.sqrt(-x))
        planted = 1.0 + defect * tf.one_hot(1, tf.size(x), dtype=x.dtype)
        return y, lambda dy: dy * tape.gradient(y, x) * planted

    return g


def _through_python(defect: float):
    """sin(x) computed by numpy inside tf.py_function (XLA cannot compile it), its gradient given by
    custom_gradient, times (1 + defect) at element 1."""
    @tf.custom_gradient
    def g(x):
        y = tf.py_function(lambda t: np.sin(t.numpy()), [x], x.dtype)
        y = tf.ensure_shape(y, x.shape)
        planted = 1.0 + defect * tf.one_hot(1, tf.size(x), dtype=x.dtype)
        return y, lambda dy: dy * tf.cos(x) * planted

    return g


UNBATCHABLE = {"custom_gradient over a tape and a cond": _sqrt_through_a_tape,
               "tf.py_function": _through_python}
POINTS = {"3 float64": lambda: tf.constant([0.5, 1.5, 2.0], tf.float64),
          "500 float32": lambda: tf.constant(np.linspace(0.5, 2.0, 500), tf.float32)}


def _verdict(report) -> tuple:
    return report.ok, tuple((p.worst_element.input_index, p.failed_count) for p in report.pairs if not p.ok)


REPEATS = {"3 float64": 10, "500 float32": 3}


@pytest.mark.parametrize("points", list(POINTS))
@pytest.mark.parametrize("jit_compile", JIT)
@pytest.mark.parametrize("name", list(UNBATCHABLE))
def test_an_unbatchable_f_gets_the_loops_verdict_on_every_repeat(name, jit_compile, points):
    x = POINTS[points]()
    for defect, ok in ((0.0, True), (0.01, False)):
        g = UNBATCHABLE[name](defect)
        reports = [fastcheck.check_gradients(g, x, jit_compile=jit_compile) for _ in range(REPEATS[points])]
        first = reports[0]
        assert first.ok is ok, first
        if not ok:
            (pair,) = first.pairs
            assert pair.worst_element.input_index == (1,) and pair.failed_count == 1, first
        assert [_verdict(r) for r in reports] == [_verdict(first)] * len(reports), reports
        if jit_compile is not False:  # no advice to pass what was passed
            assert not any("jit_compile=False" in n and "failed for" in n for n in first.notes), first.notes
        if jit_compile is not True:
            assert first.path in ("loop", "eager", "graph"), first
        assert {r.path for r in reports} == {first.path}, [r.path for r in reports]


def test_an_unbatchable_f_takes_one_path_on_every_repeat_under_auto():
    g, x = _sqrt_through_a_tape(0.0), POINTS["3 float64"]()
    paths = [fastcheck.check_gradients(g, x, jit_compile="auto").path for _ in range(10)]
    assert paths == paths[:1] * 10, paths


def _assert_above(edge, offset):
    def f(x):
        tf.debugging.assert_positive(x - edge)
        return offset + 0.01 * tf.sin(x)
    return f


def _if_above(edge, offset):
    def f(x):
        if np.any(x.numpy() < edge):
            f.refused += 1
            raise tf.errors.InvalidArgumentError(None, None, f"x below {edge}")
        return offset + 0.01 * tf.sin(x)
    f.refused = 0
    return f


REFUSING = {"assert_positive": _assert_above, "python if": _if_above}
CASES = [(name, jit) for name in REFUSING for jit in JIT if (name, jit) != ("python if", True)]  # .numpy(): no XLA


@pytest.mark.parametrize("name,jit_compile", CASES)
def test_f_refusing_points_near_x_is_f_not_finite_there(name, jit_compile):
    # float32 at 0.75, f = 1000 + 0.01 sin(x): the first sweep's pass is too coarse, and the stage sharpening it
    # takes steps up to 256 x the first (0.0049 x 256 = 1.26), across 0.7, where f refuses: a report, no FAIL.
    x = tf.constant([0.75, 1.5], tf.float32)
    f = REFUSING[name](0.7, 1e3)
    report = fastcheck.check_gradients(f, x, jit_compile=jit_compile, precision="native")
    assert all(p.failed_count == 0 for p in report.pairs), report
    if name == "python if":
        assert f.refused > 0  # the ladder did go past the edge
    # A decisive case beside the edge: a wrong element still fails, a right one passes.
    g = REFUSING[name](0.7, 0.0)

    @tf.custom_gradient
    def wrong(x):
        return g(x), lambda dy: dy * 0.01 * tf.cos(x) * tf.constant([1.0, 1.2])

    report = fastcheck.check_gradients(wrong, x, jit_compile=jit_compile, precision="native")
    (pair,) = report.pairs
    assert pair.failed_count == 1 and pair.worst_element.input_index == (1,), report


def _gamma(c):
    return tfp.distributions.Gamma(c, tf.constant(1.0, c.dtype), validate_args=True).log_prob(
        tf.constant(0.5, c.dtype))


@pytest.mark.parametrize("jit_compile", JIT)
def test_a_distribution_validating_its_arguments_is_checked_near_its_edge(jit_compile):
    x = tf.constant([1e-3, 0.5, 2.0], tf.float32)
    report = fastcheck.check_gradients(_gamma, x, jit_compile=jit_compile)
    assert all(p.failed_count == 0 for p in report.pairs), report


class MyError(RuntimeError):
    """The user's own exception."""


@pytest.mark.parametrize("jit_compile", JIT)
@pytest.mark.parametrize("k", range(1, 6))  # a clean check of f calls it 5 times
def test_fs_own_exception_from_its_kth_call_is_itself(k, jit_compile):
    value = np.array([0.3, -0.5, 0.7])
    x = tf.Variable(value)
    raised = []

    def f(v):
        f.calls += 1
        x.assign_add(tf.ones_like(x))  # state the check must restore
        if f.calls == k:
            raised.append(MyError(f"call {k}"))
            raise raised[-1]
        return tf.sin(v) * v

    f.calls = 0
    # Routed to traced kernels (traces priced at nothing: no eager loop for a small check): calls 1 and 2 are
    # planning's, call 3 the routing trace.
    tables = {"TRACE_SECONDS": 0, "TRACE_CALLS": 0}
    if k == 3 and jit_compile is not True:
        # Raised where f is traced, never where it runs eagerly: f refusing tracing (the eager calls run it), not
        # f's error; the check runs eagerly and says why.
        report = checked(f, x, jit_compile=jit_compile, tables=tables)
        assert report.ok and report.path == "eager" and "MyError" in " ".join(report.notes), report
    else:
        with pytest.raises(MyError) as caught:
            checked(f, x, jit_compile=jit_compile, tables=tables)
        assert caught.value is raised[0] and f.calls == k
    assert x.numpy().tobytes() == value.tobytes()
