"""No confident FAIL where no step can resolve the derivative (issue #28 item 6).

At x = 1e20 in float64 neighbouring representable inputs lie 16384 apart, thousands of periods
of sin: f's evaluations there are noise as large as f itself, and every difference quotient
reads ~0 against a correct derivative of order 1.  The element is undecidable (unresolved),
never a mismatch; a wrong gradient where f is resolved still FAILs in the same check.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import fastcheck


@pytest.mark.parametrize("function, x", [(tf.sin, 1e20), (tf.sin, 1e300), (tf.cos, 1e20)])
def test_a_derivative_no_step_resolves_is_undecidable(function, x):
    report = fastcheck.check_gradients(function, tf.constant([x], tf.float64))
    assert report.verdict == "undecidable", str(report)


def test_an_unresolvable_element_beside_a_wrong_one():
    # Element 0 at 1e20 (unresolvable), element 1 at 0.5 with a gradient 1% off: FAIL, naming element 1 only.
    @tf.custom_gradient
    def f(x):
        return tf.sin(x), lambda dy: dy * tf.cos(x) * tf.constant([1.0, 1.01], x.dtype)

    report = fastcheck.check_gradients(f, tf.constant([1e20, 0.5], tf.float64))
    assert report.verdict == "fail", str(report)
    (pair,) = report.pairs
    status = np.diagonal(pair.statuses)
    assert status[1] == "mismatch" and status[0] == "numerical derivative unresolved", str(report)
