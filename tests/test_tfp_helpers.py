"""fastcheck.tfp: check_bijector (Jacobian, log-det identity, inverse, log-det gradient) and check_distribution."""

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from conftest import events_of

import fastcheck
from fastcheck.tfp import BijectorReport, check_bijector, check_distribution

tfb, tfd = tfp.bijectors, tfp.distributions
RNG = np.random.default_rng(3)
X = RNG.normal(size=(4, 3))
SCALE_TRIL = np.array([[1.0, 0.0, 0.0], [0.5, 2.0, 0.0], [-0.3, 0.2, 0.7]])


def f64(value):
    return tf.constant(value, tf.float64)


class OffLogDet(tfb.Exp):
    """Exp whose forward_log_det_jacobian is twice the right one."""

    def _forward_log_det_jacobian(self, x):
        return 2.0 * x


class WrongLocGradient(tfd.Normal):
    """A Normal whose log_prob has a custom gradient 1.5 times too large with respect to loc."""

    def _log_prob(self, x):
        @tf.custom_gradient
        def log_prob(x, loc, scale):
            z = (x - loc) / scale
            value = -0.5 * z**2 - tf.math.log(scale) - 0.5 * np.log(2 * np.pi)

            def grad(g):
                return -g * z / scale, 1.5 * g * z / scale, g * (z**2 - 1) / scale

            return value, grad

        loc, scale = tf.convert_to_tensor(self.loc), tf.convert_to_tensor(self.scale)
        return log_prob(x, tf.broadcast_to(loc, tf.shape(x)), tf.broadcast_to(scale, tf.shape(x)))


BIJECTORS = {
    "exp": (lambda: tfb.Exp(), X, 0),
    "softplus": (lambda: tfb.Softplus(), X, 0),
    "sigmoid": (lambda: tfb.Sigmoid(), X, 0),
    "sigmoid_float32_saturating": (lambda: tfb.Sigmoid(), (X * 4).astype("float32"), 0),
    "chain": (lambda: tfb.Chain([tfb.Exp(), tfb.Shift(f64(0.5)), tfb.Scale(f64(2.0))]), X, 1),
    "scale_matvec_tril": (lambda: tfb.ScaleMatvecTriL(scale_tril=f64(SCALE_TRIL)), X, 1),
    "scale_matvec_tril_batch_of_matrices": (lambda: tfb.ScaleMatvecTriL(scale_tril=f64(SCALE_TRIL)), X[None], 1),
}


@pytest.mark.parametrize("name", sorted(BIJECTORS))
def test_real_bijectors_pass(name):
    make, x, event_ndims = BIJECTORS[name]
    report = check_bijector(make(), x, event_ndims)
    assert isinstance(report, BijectorReport)
    assert report.ok and bool(report) and report.verdict == "pass", str(report)
    assert [i.verdict for i in report.identities] == ["pass"] * 3
    assert "forward_log_det_jacobian(x) = log|det J|" in str(report)


def test_wrong_log_det_jacobian_fails_naming_the_identity():
    report = check_bijector(OffLogDet(), X, 0)
    assert not report.ok and report.verdict == "fail"
    assert report.forward.ok  # forward itself is right: only the identities catch the defect
    log_det, inverse, inverse_log_det = report.identities
    assert not log_det.ok and inverse.ok and not inverse_log_det.ok
    worst = int(np.argmax(np.abs(X)))
    assert log_det.index == np.unravel_index(worst, X.shape)
    assert log_det.actual == pytest.approx(2 * X.flat[worst]) and log_det.expected == pytest.approx(X.flat[worst])
    assert log_det.failed == X.size
    text = str(report)
    assert "forward_log_det_jacobian(x) = log|det J| of the numerical Jacobian J of forward: FAIL at batch member" in text
    assert f"|diff|={abs(X.flat[worst]):.3g}" in text


def test_event_ndims_misuse_names_the_fix():
    with pytest.raises(ValueError, match=r"event_ndims=3 but x has rank 2 .*pass event_ndims <= 2"):
        check_bijector(tfb.Exp(), X, 3)
    with pytest.raises(ValueError, match=r"ScaleMatvecTriL acts on events of at least 1 .*pass event_ndims=1"):
        check_bijector(tfb.ScaleMatvecTriL(scale_tril=f64(SCALE_TRIL)), X, 0)
    with pytest.raises(ValueError, match=r"ScaleMatvecTriL.forward failed on x of shape \(4, 2\)"):
        check_bijector(tfb.ScaleMatvecTriL(scale_tril=f64(SCALE_TRIL)), X[:, :2], 1)
    with pytest.raises(ValueError, match="pass x as float32"):
        check_bijector(tfb.Scale(2.0), X, 0)
    with pytest.raises(TypeError, match="event_ndims must be an integer"):
        check_bijector(tfb.Exp(), X, 0.5)


@pytest.mark.parametrize("make, params, x", [
    (tfd.Normal, [f64([0.5, 1.0]), f64([1.0, 2.0])], None),
    (tfd.Normal, [0.5, 1.5], f64([0.3, -1.0])),
    (tfd.Gamma, [f64([2.5, 1.5]), f64([1.3, 2.0])], None),
    (tfd.Beta, [f64([2.5, 1.5]), f64([1.3, 2.0])], f64([0.3, 0.6])),
    (lambda loc, tril: tfd.MultivariateNormalTriL(loc, tril), [f64([0.5, 1.0]), f64([[1.0, 0.0], [0.3, 2.0]])], None),
], ids=["normal", "normal_x", "gamma", "beta", "mvn_tril"])
def test_distributions_pass(make, params, x):
    report = check_distribution(make, params, x)
    assert report.ok, str(report)
    outputs = {p.output_name for p in report.pairs}
    distribution = make(*params)
    if distribution.reparameterization_type == tfd.FULLY_REPARAMETERIZED and not isinstance(distribution, (tfd.Gamma, tfd.Beta)):
        assert outputs == {"output['log_prob']", "output['sample']"}
    else:  # implicit reparameterization: a fixed seed gives no derivative to compare
        assert outputs == {"output['log_prob']"}
        assert [e.reason for e in events_of(report, "SampleNotChecked")] == ["implicit"], report.notes
    if x is not None:
        assert "x" in {p.input_name for p in report.pairs}


def test_distribution_with_wrong_custom_gradient_fails():
    report = check_distribution(WrongLocGradient, [f64([0.5, 1.0]), f64([1.0, 2.0])], f64([0.3, -1.0]))
    assert report.verdict == "fail"
    assert [p.title for p in report.failures] == ["output['log_prob'] / param 0"]
    assert "factor of 1.5" in report.failures[0].hint
    assert report.title == "check_distribution (WrongLocGradient)"


def test_sample_is_checked_at_a_fixed_seed():
    @tf.custom_gradient
    def double_grad(y):
        return tf.identity(y), lambda g: 2.0 * g

    def make(loc):
        return tfd.TransformedDistribution(tfd.Normal(f64(0.0), f64(1.0)), tfb.Shift(double_grad(loc)))

    report = check_distribution(make, [f64([0.5, 1.0])], f64([0.1, 0.2]))
    assert report.verdict == "fail"
    assert {p.output_name for p in report.failures} == {"output['log_prob']", "output['sample']"}


def test_check_distribution_misuse():
    with pytest.raises(TypeError, match="make_distribution must be callable"):
        check_distribution(3, [1.0])
    with pytest.raises(TypeError, match="unknown option"):
        check_distribution(tfd.Normal, [0.0, 1.0], tolerance=1e-3)


def test_fastcheck_does_not_import_tfp_until_a_check_runs():
    code = ("import sys, fastcheck, fastcheck.tfp; assert fastcheck.tfp.check_bijector; "
            "print('tensorflow_probability' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
    assert fastcheck.tfp.check_distribution is check_distribution


class OffCorrelationCholesky(tfb.CorrelationCholesky):
    """CorrelationCholesky (3 numbers -> a 3x3 Cholesky factor) whose log-det-Jacobian is 0.01 too large."""

    def _forward_log_det_jacobian(self, x):
        return super()._forward_log_det_jacobian(x) + 0.01


class OffIteratedSigmoidCentered(tfb.IteratedSigmoidCentered):
    """IteratedSigmoidCentered (n numbers -> a point of the n-simplex in R^(n+1)), log-det 0.01 too large."""

    def _forward_log_det_jacobian(self, x):  # TFP defines only the inverse one
        return -self._inverse_log_det_jacobian(self.forward(x)) + 0.01


EVENT_CHANGING = {
    "correlation_cholesky_3x3": (lambda: tfb.CorrelationCholesky(), X, 1),  # 3 -> 3x3
    "correlation_cholesky_4x4": (lambda: tfb.CorrelationCholesky(), RNG.normal(size=(2, 6)), 1),  # 6 -> 4x4
    "correlation_cholesky_event_ndims_2": (lambda: tfb.CorrelationCholesky(), X[None], 2),
    "iterated_sigmoid_centered": (lambda: tfb.IteratedSigmoidCentered(), X, 1),  # 3 -> 4
    "inverse_correlation_cholesky": (lambda: tfb.Invert(tfb.CorrelationCholesky()),
                                     tfb.CorrelationCholesky().forward(f64(X)), 2),
    "inverse_iterated_sigmoid_centered": (lambda: tfb.Invert(tfb.IteratedSigmoidCentered()),
                                          tfb.IteratedSigmoidCentered().forward(f64(X)), 1),
    "scaled_correlation_cholesky": (lambda: tfb.Chain([tfb.TransformDiagonal(tfb.Exp()), tfb.CorrelationCholesky()]),
                                    X, 1),
    "cholesky_outer_product": (lambda: tfb.CholeskyOuterProduct(),
                               np.tril(RNG.normal(size=(2, 3, 3))) + 2 * np.eye(3), 2),
}


@pytest.mark.parametrize("name", sorted(EVENT_CHANGING))
def test_event_size_changing_bijectors_pass_in_tfps_chart(name):
    make, x, event_ndims = EVENT_CHANGING[name]
    bijector = make()
    report = check_bijector(bijector, x, event_ndims)
    assert report.ok, str(report)
    assert report.convention == "chart" and report.chart
    log_det = report.identities[0]
    assert "in TFP's chart" in log_det.name and log_det.abs_error < 1e-6
    fldj = np.asarray(bijector.forward_log_det_jacobian(f64(x), event_ndims=event_ndims)).reshape(-1)
    assert log_det.actual == pytest.approx(fldj[log_det.index[0] if log_det.index else 0])
    (convention,) = events_of(report, "LogDetConvention")
    assert convention.convention == "chart" and convention.chart == report.chart, report.notes


def test_iterated_sigmoid_centered_matches_tfps_closed_form():
    # TFP's own test: inverse_log_det_jacobian(y) = -sum(log y), so forward_log_det_jacobian = sum(log y).
    y = tfb.IteratedSigmoidCentered().forward(f64(X)).numpy()
    report = check_bijector(tfb.IteratedSigmoidCentered(), X, 1)
    log_det = report.identities[0]
    assert log_det.expected == pytest.approx(np.sum(np.log(y), axis=1)[log_det.index[0]], abs=1e-6)


@pytest.mark.parametrize("bijector", [OffCorrelationCholesky(), OffIteratedSigmoidCentered(),
                                      tfb.Chain([tfb.TransformDiagonal(tfb.Exp()), OffCorrelationCholesky()])],
                         ids=["correlation_cholesky", "iterated_sigmoid_centered", "in_a_chain"])
def test_wrong_log_det_on_event_size_changing_bijector_fails(bijector):
    report = check_bijector(bijector, X, 1)
    assert report.verdict == "fail" and report.convention == "chart"
    assert report.forward.ok and report.log_det_gradient.ok  # a constant offset changes no gradient
    log_det = report.identities[0]
    assert log_det.verdict == "fail" and log_det.failed == len(X)
    assert log_det.actual - log_det.expected == pytest.approx(0.01, abs=1e-6)
    assert "FAIL at batch member" in str(report)


def test_bijector_report_mode_timings_and_dict():
    report = check_bijector(tfb.CorrelationCholesky(), X, 1)
    assert report.mode == report.forward.mode == report.log_det_gradient.mode
    stages = set(report.forward.timings) | set(report.log_det_gradient.timings)
    assert stages and stages | {"jacobian", "identities"} == set(report.timings)
    for stage in stages:
        expected = report.forward.timings.get(stage, 0.0) + report.log_det_gradient.timings.get(stage, 0.0)
        assert report.timings[stage] == pytest.approx(expected)
    assert all(isinstance(seconds, float) and seconds >= 0 for seconds in report.timings.values())
    out = report.to_dict()
    assert out["mode"] == report.mode and out["convention"] == "chart" and out["timings"] == report.timings
    assert all(isinstance(out["identities"][0][key], float) for key in ("actual", "expected", "abs_error", "allowed"))
    assert isinstance(out["identities"][0]["failed"], int)
    json.dumps(out)


def test_lower_triangular_bijector_rejects_a_full_matrix():
    with pytest.raises(ValueError, match=r"CholeskyOuterProduct acts on lower-triangular matrices.*band_part"):
        check_bijector(tfb.CholeskyOuterProduct(), RNG.normal(size=(2, 3, 3)) + 2 * np.eye(3), 2)


def test_bijector_sweep_rows():
    from benchmarks.bijectors import sweep_one

    row = sweep_one("CorrelationCholesky", tfb.CorrelationCholesky)
    assert row["verdict"] == "pass" and row["convention"] == "chart" and row["seconds"] > 0
    skipped = sweep_one("Shift", tfb.Shift)
    assert skipped["verdict"] == "skipped" and "cannot be built with no arguments" in skipped["note"]
