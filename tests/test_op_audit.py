"""Op audit: fastcheck passes TensorFlow's and TFP's own gradients (a quick subset of benchmarks.op_audit.OPS).

Every op is called at points inside its domain, away from kinks and ties, so its
registered gradient is expected to be right: fastcheck must not raise and must
say "pass".  An op with ``known_bug`` documents a real TF / TFP gradient bug and
must still fail.  The full table runs with ``python -m benchmarks.op_audit``.
"""

import re

import numpy as np
import pytest
import tensorflow as tf

import fastcheck
from benchmarks.op_audit import BY_NAME, CATEGORIES, OPS, QUICK, REFERENCE_TOLERANCES, Op, compare_reference

MIN_OPS = 110
PARAMS = [pytest.param(BY_NAME[name], dtype, id=f"{name}-{dtype}") for name in QUICK for dtype in BY_NAME[name].dtypes]


@pytest.mark.parametrize("op, dtype", PARAMS)
def test_tensorflow_gradient_passes(op: Op, dtype: str):
    inputs = op.make_inputs(tf.as_dtype(dtype))
    report = fastcheck.check_gradients(op.f, inputs)
    if op.known_bug:
        assert report.verdict == "fail", f"{op.name} [{dtype}] known bug no longer caught: {op.known_bug}\n{report}"
        if op.reference is not None:  # the independent reference sides with the numerical Jacobian
            agreement = compare_reference(op, inputs, report, dtype)
            assert agreement["numerical_agrees"] and not agreement["analytical_agrees"], (op.name, dtype, agreement)
        return
    assert report.verdict == "pass", f"{op.name} [{dtype}, {op.category}]: TF's own gradient\n{report}"
    if op.reference is not None:
        agreement = compare_reference(op, inputs, report, dtype)
        assert agreement["analytical_agrees"] and agreement["numerical_agrees"], (op.name, dtype, agreement)


def test_table_shape():
    assert len(OPS) >= MIN_OPS, len(OPS)
    names = [op.name for op in OPS]
    assert len(set(names)) == len(names), sorted({n for n in names if names.count(n) > 1})
    assert set(QUICK) <= set(names)
    assert {op.category for op in OPS} == set(CATEGORIES)
    assert {BY_NAME[name].category for name in QUICK} == set(CATEGORIES), "the quick subset spans every category"
    for op in OPS:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", op.name), op.name
        assert op.dtypes and set(op.dtypes) <= set(REFERENCE_TOLERANCES), (op.name, op.dtypes)


@pytest.mark.parametrize("name", QUICK)
def test_quick_op_runs_in_its_dtypes(name: str):
    op = BY_NAME[name]
    for dtype in op.dtypes:
        dt = tf.as_dtype(dtype)
        inputs = op.make_inputs(dt)
        for x, y in zip(inputs, op.make_inputs(dt)):
            assert x.dtype == dt, (name, x.dtype)
            np.testing.assert_array_equal(x.numpy(), y.numpy())
        out = op.f(*inputs)
        assert out.dtype == dt, (name, dtype, out.dtype)
        assert np.all(np.isfinite(out.numpy())), f"{name} is not finite at its inputs"
