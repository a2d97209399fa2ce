"""Refinement through ``check_gradients``: what the triage at h/4 decides, how far down the step ladder a failing
column goes, and what a settled mismatch needs to stand.

Full mode, float64 unless a case says otherwise.  f = 1 + sum_j g_j(x_j), one output: the checks are small and run
on the eager path, where every evaluation of f is one call of it, so that f itself counts what refinement costs.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import fastcheck

K = 4000.0  # sin(K x) / K at 0: f''' = -K**2 puts the h**2 truncation past the tolerance at h and at h/4
D = 1e-9  # kinks at D (and -D): the steps down to h/4**6 cross them, h/4**7 and below do not

PARTS = {  # name: (g, g', x_j)
    "smooth": (tf.sin, tf.cos, 0.3),
    "truncated": (lambda x: tf.sin(K * x) / K, lambda x: tf.cos(K * x), 0.0),
    # Slope 1.5 between the kinks, 0.5 outside: a step past both has the quotient 0.5 + D / h, and one-sided
    # derivatives that agree (the two kinks' second differences cancel), so only a step below D shows 1.5.
    "kink pair": (lambda x: 0.5 * x + tf.nn.relu(x + D) - tf.nn.relu(x - D),
                  lambda x: 0.5 + tf.cast(tf.abs(x) < D, x.dtype), 0.0),
    # One kink, on a slope of 20: a step past it has one-sided derivatives 20 and 21, and second differences
    # small beside its first (a step local to f, as the triage tests), though not beside the mismatch.
    "kink": (lambda x: 20 * x + tf.nn.relu(x - D), lambda x: 20 + tf.cast(x > D, x.dtype), 0.0),
}
TRUE = {"smooth": np.cos(0.3), "truncated": 1.0, "kink pair": 1.5, "kink": 20.0}  # g'(x_j)


def _separable(names, factors, moved: list, dtype=tf.float64):
    """(f, x): f(x) = 1 + sum_j g_j(x_j) for the ``PARTS`` ``names``, its custom gradient g_j' times ``factors[j]``
    (1.0: correct); each eager call of f appends to ``moved`` the indices of the elements it moved from x."""
    parts = [PARTS[name] for name in names]
    x0 = np.array([x for *_, x in parts], dtype.as_numpy_dtype)

    @tf.custom_gradient
    def f(x):
        if tf.executing_eagerly():
            moved.append(tuple(np.flatnonzero(x.numpy() != x0)))

        def grad(dy):
            return dy * tf.stack([factor * derivative(x[j]) for j, ((_, derivative, _), factor)
                                  in enumerate(zip(parts, factors))])

        return 1 + tf.add_n([g(x[j]) for j, (g, _, _) in enumerate(parts)]), grad

    return f, tf.constant(x0)


def _check(names, factors, dtype=tf.float64, **options):
    """The report of a full check of ``_separable`` and, per column, how many evaluations of f moved it alone
    (the first sweep's, the triage's and the ladders'; f's noise is measured along directions that move every
    column)."""
    moved: list = []
    f, x = _separable(names, factors, moved, dtype)
    report = fastcheck.check_gradients(f, x, mode="full", **options)
    assert report.path == "eager", str(report)  # the premise: every evaluation of f is a call of it
    return report, [moved.count((j,)) for j in range(len(names))]


COLUMNS = ("smooth", "truncated", "kink pair", "kink")
# The report's look at the first mismatch of a block: its quotients at the ladder's three widest steps, h 4**4 ... h 4**2
# (does the gradient match f's secant over wide steps rather than its slope?).  Not refinement: no verdict moves.
SECANT = 6


@pytest.mark.parametrize("factors, statuses, evaluations", [
    # The smooth column passes the first sweep.  The truncated one fails at h and at h/4, where its quotient moves by
    # 15/16 of the mismatch, and settles on the first ladder h ... h/4**5 (2 + 2 + 12 evaluations).  The kink pair's
    # quotients agree at h/4 and at h/4 x 0.618, not at the finest step below the kinks (the triage's three steps:
    # 2 + 6); it goes down the first ladder (12: unsettled) and the deeper one, h/4**6 ... h/4**12 (14), which
    # settles 1.5.  The kink's one-sided derivatives differ at h/4: it goes down both ladders from there (2 + 2 + 12
    # + 14), without the golden and finest steps.
    ((1.0, 1.0, 1.0, 1.0), ["ok", "ok", "ok", "ok"], [2, 16, 34, 30]),
    # The triage fails a wrong gradient of a smooth f: the first sweep's pair and three more (h/4, h/4 x 0.618,
    # the finest step); no ladder.  Each mismatch below adds the report's ``SECANT`` evaluations.
    ((1.01, 1.0, 1.0, 1.0), ["mismatch", "ok", "ok", "ok"], [8 + SECANT, 16, 34, 30]),
    # Inside the truncation at h/4: a mismatch the first ladder settles, which the confirmation at 0.618 x the
    # chosen pair's steps (2 more pairs) finds again.
    ((1.0, 1.0001, 1.0, 1.0), ["ok", "mismatch", "ok", "ok"], [2, 20 + SECANT, 34, 30]),
    # ... and mismatches the deeper ladder settles, below the kinks.
    ((1.0, 1.0, 1.01, 1.0), ["ok", "ok", "mismatch", "ok"], [2, 16, 38 + SECANT, 30]),
    ((1.0, 1.0, 1.0, 1.01), ["ok", "ok", "ok", "mismatch"], [2, 16, 34, 34 + SECANT]),
], ids=["correct", "wrong_smooth", "wrong_truncated", "wrong_kink_pair", "wrong_kink"])
def test_each_column_is_refined_as_far_as_its_true_verdict_needs(factors, statuses, evaluations):
    """One check, four columns: each gets its own verdict, the derivative at the point as its estimate (not a
    crossing step's quotient), and at most the evaluations of f its verdict needs today."""
    report, per_column = _check(COLUMNS, factors)
    (pair,) = report.pairs
    assert pair.statuses.ravel().tolist() == statuses, str(report)
    assert report.verdict == ("pass" if set(factors) == {1.0} else "fail"), str(report)
    np.testing.assert_allclose(pair.numerical.ravel(), [TRUE[name] for name in COLUMNS], rtol=0, atol=1e-5)
    # Ceilings, not counts: a refinement may get cheaper, never dearer.
    assert all(count <= ceiling for count, ceiling in zip(per_column, evaluations)), per_column


def test_float32_rounding_keeps_the_triages_finest_step_within_reach():
    """The triage's finest step is the finest whose rounding stays below an eighth of the mismatch: for float32
    at x = 0.3, h/4 itself (far finer steps leave x where it is).  A wrong gradient is failed as cheaply as in
    float64: 8 evaluations a column (the first mismatch's, ``SECANT`` more for the report)."""
    report, per_column = _check(["smooth"] * 4, [1.01] * 4, tf.float32, precision="native")
    assert report.verdict == "fail" and report.pairs[0].count("mismatch") == 4, str(report)
    assert per_column[0] <= 8 + SECANT and max(per_column[1:]) <= 8, per_column


# 4**13 (2 pi + 1e-10), a multiple of 2**-24: x +- h/4**p is exact for every p <= 13, and each such step is within
# 4**(13 - p) 1e-10 of a multiple of cos's period.
PERIODIC_STEP = round((2 * np.pi + 1e-10) * 2**50) * 2.0**-24


@pytest.mark.parametrize("factor", [1.0, -1.0])
def test_steps_at_multiples_of_a_period_are_no_evidence(factor):
    """cos at 0.5 with eps = ``PERIODIC_STEP``: every step h_p down to h/4**13 lies near a multiple of 2 pi, e_p
    away, and its quotient -sin(x) sin(e_p) / h_p, with e_p / h_p the same at every p, agrees with the others like
    converging ones: at h/4, at the finest step and on both ladders.  Only steps 0.618 x theirs (the triage's golden
    step, each ladder's confirmation) show the coincidence: the derivative stays unresolved, neither a false FAIL
    nor a pass (a real mismatch the ladder settles is still a FAIL: ``wrong_truncated`` above)."""

    @tf.custom_gradient
    def cos(x):
        return tf.cos(x), lambda dy: -factor * dy * tf.sin(x)

    report = fastcheck.check_gradients(cos, tf.constant([0.5], tf.float64), eps=PERIODIC_STEP, mode="full")
    assert report.verdict == "undecidable", str(report)
    assert report.pairs[0].count("numerical derivative unresolved") == 1, str(report)
