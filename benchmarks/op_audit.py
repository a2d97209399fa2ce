"""``python -m benchmarks.op_audit``: fastcheck over TensorFlow's and TFP's own registered gradients.

Every ``Op`` of ``OPS`` is one TensorFlow / TensorFlow Probability op or function
whose gradient TF itself provides, called as ``f(*make_inputs(dtype))`` at points
strictly inside its domain and away from kinks and ties.  These gradients are
believed right, so fastcheck should pass every entry; an entry that does not pass
is either a false alarm (an engine problem) or a real gradient bug in TF / TFP,
which ``known_bug`` documents (the audit then expects a *fail*).

Where it is cheap to write correctly, ``reference(*arrays)`` gives an independent
Jacobian (closed form or ``scipy.special``) per input, shape (output_size,
input_size) like ``report.pairs[i].numerical``, or ``None`` for an input it does
not cover; the audit says whether it agrees with fastcheck's numerical and
autodiff Jacobians.

Categories: math, special, linalg, nn, image, signal, indexing, control_flow,
tfp_special, tfp_distribution_log_prob, tfp_bijector_ldj.

    python -m benchmarks.op_audit [--quick] [--only NAME[,NAME]] [--dtypes float32,float64] [--out DIR]
        [--no-compute-gradient]

writes ``op_audit.md`` and ``op_audit.json`` to ``--out`` (default
``benchmarks/results``), prints the summary and every entry that did not behave,
and exits 1 when fastcheck crashed, raised a false alarm or missed a known bug.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads

import numpy as np  # noqa: E402
import scipy.linalg  # noqa: E402
import scipy.special as sp  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_probability as tfp  # noqa: E402

from benchmarks.corpus import _c, _fixed, _normal, _t, _uniform  # noqa: E402  (the corpus's input makers)

tfd, tfb = tfp.distributions, tfp.bijectors

RESULTS = Path(__file__).resolve().parent / "results"
BOTH = ("float32", "float64")
F32 = ("float32",)
CATEGORIES = ("math", "special", "linalg", "nn", "image", "signal", "indexing", "control_flow", "tfp_special",
              "tfp_distribution_log_prob", "tfp_bijector_ldj")
# (atol, rtol) for reference vs fastcheck's Jacobians: the reference is exact at the
# dtype's input values, TF's float32 kernels are not.
REFERENCE_TOLERANCES = {"float32": (1e-4, 1e-3), "float64": (1e-8, 1e-6)}


@dataclasses.dataclass(frozen=True)
class Op:
    name: str  # unique, snake_case
    category: str  # one of CATEGORIES
    f: Callable  # called as f(*inputs); returns one tensor of the input dtype
    make_inputs: Callable  # make_inputs(dtype: tf.DType) -> list of tensors, deterministic
    dtypes: tuple = BOTH
    reference: Callable | None = None  # reference(*float64 arrays) -> [Jacobian or None per input]
    known_bug: str | None = None  # a real TF gradient bug: the audit expects fastcheck to fail
    description: str = ""


def _away_from_zero(seed, low, high, *shapes):
    """|x| uniform in [low, high] with a random sign."""

    def make(dtype):
        rng = np.random.default_rng(seed)
        return [_t(rng.choice([-1.0, 1.0], size=s) * rng.uniform(low, high, size=s), dtype) for s in shapes]

    return make


def _distinct(seed, shape, low=-2.0, high=2.0):
    """Shuffled, evenly spaced values (no ties: neighbours differ by (high - low) / (size - 1))."""

    def make(dtype):
        rng = np.random.default_rng(seed)
        size = int(np.prod(shape))
        return [_t(rng.permutation(np.linspace(low, high, size)).reshape(shape), dtype)]

    return make


def _well_conditioned(seed, n, extra_shapes=(), m=None):
    """A random m x n matrix plus 3 I (condition number ~3), then more N(0, 1) inputs."""

    def make(dtype):
        rng = np.random.default_rng(seed)
        rows = m or n
        a = rng.normal(size=(rows, n)) * 0.5 + 3 * np.eye(rows, n)
        return [_t(a, dtype)] + [_t(rng.normal(size=s), dtype) for s in extra_shapes]

    return make


def _spd(seed, n, extra_shapes=()):
    """A symmetric positive definite matrix with eigenvalues in [1, 4], then more N(0, 1) inputs."""

    def make(dtype):
        rng = np.random.default_rng(seed)
        q, _ = np.linalg.qr(rng.normal(size=(n, n)))
        a = (q * np.linspace(1.0, 4.0, n)) @ q.T
        return [_t((a + a.T) / 2, dtype)] + [_t(rng.normal(size=s), dtype) for s in extra_shapes]

    return make


def _lower(seed, n, batch=()):
    """A lower-triangular matrix with diagonal in [1, 2] (upper part exactly zero)."""

    def make(dtype):
        rng = np.random.default_rng(seed)
        a = np.tril(rng.normal(size=(*batch, n, n)) * 0.4, -1)
        a = a + np.eye(n) * rng.uniform(1.0, 2.0, size=(*batch, n))[..., None, :]
        return [_t(a, dtype)]

    return make


def _concat(*makers):
    return lambda dtype: [x for make in makers for x in make(dtype)]


def _fresh(f):
    """f on fresh copies of its inputs: TFP bijectors (and so TransformedDistribution.log_prob: LogNormal,
    Weibull, Kumaraswamy, ...) cache inverse / log-det-Jacobian per input tensor object, so a call under a
    tape after an untaped call with the same tensors gets cached, disconnected values (zero or None
    gradients, a missing log-det-Jacobian term)."""
    return lambda *xs: f(*(tf.identity(x) for x in xs))


# ----------------------------------------------------------------------------- references


def _elementwise(*derivatives):
    """Reference for a function whose output has the shape of every input: diagonal Jacobians."""

    def reference(*xs):
        shape = np.broadcast_shapes(*(x.shape for x in xs))
        return [np.diag(np.broadcast_to(d(*xs), shape).ravel()) for d in derivatives]

    return reference


def _rowwise(jacobian_of_row):
    """Reference for a function applied to each row of a 2-D input independently."""
    return lambda x: [scipy.linalg.block_diag(*(jacobian_of_row(row) for row in x))]


def _scipy_partials(fn):
    """Reference for an elementwise fn(*xs) of scipy: each partial by a 4-point central difference in float64
    (truncation ~h^4, rounding ~1e-16 / h), for ops with no closed-form derivative."""

    def reference(*xs):
        jacobians = []
        for k, x in enumerate(xs):
            h = 1e-3 * np.maximum(1.0, np.abs(x))

            def at(shift, k=k, h=h, x=x):
                return fn(*(x + shift * h if i == k else v for i, v in enumerate(xs)))

            d = (8 * (at(1) - at(-1)) - (at(2) - at(-2))) / (12 * h)
            jacobians.append(np.diag(d.ravel()))
        return jacobians

    return reference


def _softmax(v):
    e = np.exp(v - v.max())
    return e / e.sum()


def _phi(x):
    return np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)


# ----------------------------------------------------------------------------- math

_SIGMOID = sp.expit


def _math_ops() -> list[Op]:
    u = _normal  # brevity in the table below
    ops = [
        Op("sin", "math", tf.sin, u(1, (6,)), reference=_elementwise(np.cos)),
        Op("cos", "math", tf.cos, u(2, (6,)), reference=_elementwise(lambda x: -np.sin(x))),
        Op("tan", "math", tf.tan, _uniform(3, -1.2, 1.2, (6,)), reference=_elementwise(lambda x: 1 / np.cos(x) ** 2)),
        Op("exp", "math", tf.exp, u(4, (6,)), reference=_elementwise(np.exp)),
        Op("expm1", "math", tf.math.expm1, u(5, (6,)), reference=_elementwise(np.exp)),
        Op("log", "math", tf.math.log, _uniform(6, 0.2, 3.0, (6,)), reference=_elementwise(lambda x: 1 / x)),
        Op("log1p", "math", tf.math.log1p, _uniform(7, -0.5, 3.0, (6,)), reference=_elementwise(lambda x: 1 / (1 + x))),
        Op("sqrt", "math", tf.sqrt, _uniform(8, 0.2, 3.0, (6,)), reference=_elementwise(lambda x: 0.5 / np.sqrt(x))),
        Op("rsqrt", "math", tf.math.rsqrt, _uniform(9, 0.2, 3.0, (6,)), reference=_elementwise(lambda x: -0.5 * x**-1.5)),
        Op("tanh", "math", tf.tanh, u(10, (6,)), reference=_elementwise(lambda x: 1 - np.tanh(x) ** 2)),
        Op("sigmoid", "math", tf.sigmoid, u(11, (6,), scale=2.0),
           reference=_elementwise(lambda x: _SIGMOID(x) * (1 - _SIGMOID(x)))),
        Op("softplus", "math", tf.math.softplus, u(12, (6,), scale=3.0), reference=_elementwise(_SIGMOID)),
        Op("log_sigmoid", "math", tf.math.log_sigmoid, u(13, (6,), scale=3.0),
           reference=_elementwise(lambda x: 1 - _SIGMOID(x))),
        Op("erf", "math", tf.math.erf, u(14, (6,)), reference=_elementwise(lambda x: 2 / np.sqrt(np.pi) * np.exp(-x * x))),
        Op("erfc", "math", tf.math.erfc, u(15, (6,)),
           reference=_elementwise(lambda x: -2 / np.sqrt(np.pi) * np.exp(-x * x))),
        Op("erfinv", "math", tf.math.erfinv, _uniform(16, -0.9, 0.9, (6,)),
           reference=_elementwise(lambda x: np.sqrt(np.pi) / 2 * np.exp(sp.erfinv(x) ** 2))),
        Op("ndtri", "math", tf.math.ndtri, _uniform(17, 0.05, 0.95, (6,)),
           reference=_elementwise(lambda x: 1 / _phi(sp.ndtri(x)))),
        Op("ndtr", "math", lambda x: tfd.Normal(_c(0.0, x), _c(1.0, x)).cdf(x), u(18, (6,), scale=2.0),
           reference=_elementwise(_phi), description="standard normal cdf (tfd.Normal.cdf)"),
        Op("log_ndtr", "math", lambda x: tfd.Normal(_c(0.0, x), _c(1.0, x)).log_cdf(x),
           _fixed([-12.0, -7.5, -2.0, -0.3, 0.8, 3.0, 6.5]),
           reference=_elementwise(lambda x: np.exp(-0.5 * x * x - 0.5 * np.log(2 * np.pi) - sp.log_ndtr(x))),
           description="log of the standard normal cdf, including the asymptotic tail branch"),
        Op("atan2", "math", tf.math.atan2, u(19, (6,), (6,)),
           reference=_elementwise(lambda y, x: x / (x * x + y * y), lambda y, x: -y / (x * x + y * y))),
        Op("pow", "math", tf.pow, _concat(_uniform(20, 0.5, 2.5, (6,)), _uniform(21, -1.5, 2.0, (6,))),
           reference=_elementwise(lambda x, y: y * x ** (y - 1), lambda x, y: x**y * np.log(x))),
        Op("xlogy", "math", tf.math.xlogy, _concat(_uniform(22, -2, 2, (6,)), _uniform(23, 0.3, 3.0, (6,))),
           reference=_elementwise(lambda x, y: np.log(y), lambda x, y: x / y)),
        Op("xlog1py", "math", tf.math.xlog1py, _concat(_uniform(24, -2, 2, (6,)), _uniform(25, -0.5, 3.0, (6,))),
           reference=_elementwise(lambda x, y: np.log1p(y), lambda x, y: x / (1 + y))),
        Op("xdivy", "math", tf.math.xdivy, _concat(_uniform(26, -2, 2, (6,)), _away_from_zero(27, 0.3, 3.0, (6,))),
           reference=_elementwise(lambda x, y: 1 / y, lambda x, y: -x / y**2)),
        Op("divide", "math", tf.math.divide, _concat(u(28, (6,)), _away_from_zero(29, 0.3, 3.0, (6,))),
           reference=_elementwise(lambda x, y: 1 / y, lambda x, y: -x / y**2)),
        Op("squared_difference", "math", tf.math.squared_difference, u(30, (6,), (6,)),
           reference=_elementwise(lambda x, y: 2 * (x - y), lambda x, y: 2 * (y - x))),
        Op("maximum_distinct", "math", tf.maximum, _concat(_distinct(31, (6,)), _distinct(32, (6,), -1.95, 2.05)),
           reference=_elementwise(lambda x, y: (x > y) * 1.0, lambda x, y: (y > x) * 1.0)),
        Op("abs", "math", tf.abs, _away_from_zero(33, 0.3, 2.0, (6,)), reference=_elementwise(np.sign)),
        Op("reciprocal", "math", tf.math.reciprocal, _away_from_zero(34, 0.3, 2.0, (6,)),
           reference=_elementwise(lambda x: -1 / x**2)),
        Op("square", "math", tf.square, u(35, (6,)), reference=_elementwise(lambda x: 2 * x)),
        Op("asinh", "math", tf.asinh, u(36, (6,), scale=2.0), reference=_elementwise(lambda x: 1 / np.sqrt(x * x + 1))),
        Op("acosh", "math", tf.acosh, _uniform(37, 1.2, 4.0, (6,)), reference=_elementwise(lambda x: 1 / np.sqrt(x * x - 1))),
        Op("atanh", "math", tf.atanh, _uniform(38, -0.8, 0.8, (6,)), reference=_elementwise(lambda x: 1 / (1 - x * x))),
        Op("asin", "math", tf.asin, _uniform(39, -0.8, 0.8, (6,)), reference=_elementwise(lambda x: 1 / np.sqrt(1 - x * x))),
        Op("acos", "math", tf.acos, _uniform(40, -0.8, 0.8, (6,)), reference=_elementwise(lambda x: -1 / np.sqrt(1 - x * x))),
        Op("atan", "math", tf.atan, u(41, (6,), scale=2.0), reference=_elementwise(lambda x: 1 / (1 + x * x))),
        Op("sinh", "math", tf.sinh, u(42, (6,)), reference=_elementwise(np.cosh)),
        Op("cosh", "math", tf.cosh, u(43, (6,)), reference=_elementwise(np.sinh)),
        # reductions and scans
        Op("reduce_sum", "math", lambda x: tf.reduce_sum(x, axis=1), u(44, (3, 4)),
           reference=lambda x: [np.kron(np.eye(3), np.ones((1, 4)))]),
        Op("reduce_mean", "math", lambda x: tf.reduce_mean(x, axis=0), u(45, (3, 4)),
           reference=lambda x: [np.kron(np.ones((1, 3)), np.eye(4)) / 3]),
        Op("reduce_prod", "math", lambda x: tf.reduce_prod(x, axis=-1), _away_from_zero(46, 0.5, 1.5, (2, 4)),
           reference=_rowwise(lambda r: (np.prod(r) / r)[None, :])),
        Op("reduce_logsumexp", "math", lambda x: tf.reduce_logsumexp(x, axis=-1), u(47, (3, 5), scale=2.0),
           reference=_rowwise(lambda r: _softmax(r)[None, :])),
        Op("reduce_std", "math", lambda x: tf.math.reduce_std(x, axis=-1), u(48, (2, 5)),
           reference=_rowwise(lambda r: ((r - r.mean()) / (r.size * r.std()))[None, :])),
        Op("reduce_variance", "math", lambda x: tf.math.reduce_variance(x, axis=-1), u(49, (2, 5)),
           reference=_rowwise(lambda r: (2 * (r - r.mean()) / r.size)[None, :])),
        Op("reduce_max_distinct", "math", lambda x: tf.reduce_max(x, axis=-1), _distinct(50, (3, 4)),
           reference=_rowwise(lambda r: (r == r.max())[None, :] * 1.0)),
        Op("reduce_min_distinct", "math", lambda x: tf.reduce_min(x, axis=0), _distinct(51, (3, 4)),
           description="column minima of distinct values"),
        Op("norm_euclidean", "math", lambda x: tf.norm(x), u(52, (7,)), reference=lambda x: [x[None, :] / np.linalg.norm(x)]),
        Op("norm_l1", "math", lambda x: tf.norm(x, ord=1), _away_from_zero(53, 0.2, 2.0, (7,)),
           reference=lambda x: [np.sign(x)[None, :]]),
        Op("reduce_euclidean_norm", "math", lambda x: tf.math.reduce_euclidean_norm(x, axis=-1), u(54, (2, 4)),
           reference=_rowwise(lambda r: r[None, :] / np.linalg.norm(r))),
        Op("cumsum", "math", tf.math.cumsum, u(55, (6,)), reference=lambda x: [np.tril(np.ones((6, 6)))]),
        Op("cumsum_reverse_exclusive", "math", lambda x: tf.math.cumsum(x, exclusive=True, reverse=True), u(56, (6,)),
           reference=lambda x: [np.triu(np.ones((6, 6)), 1)]),
        Op("cumprod", "math", tf.math.cumprod, _uniform(57, 0.5, 1.5, (6,)),
           reference=lambda x: [np.tril(np.cumprod(x)[:, None] / x[None, :])]),
        Op("cumprod_reverse_exclusive", "math", lambda x: tf.math.cumprod(x, exclusive=True, reverse=True),
           _away_from_zero(58, 0.5, 1.5, (6,))),
        Op("cumulative_logsumexp", "math", tf.math.cumulative_logsumexp, u(59, (6,), scale=2.0),
           reference=lambda x: [np.tril(np.exp(x[None, :] - np.logaddexp.accumulate(x)[:, None]))]),
        Op("polyval", "math", lambda c, x: tf.math.polyval([c[0], c[1], c[2]], x), u(60, (3,), (5,)),
           description="polynomial c0 x^2 + c1 x + c2 w.r.t. coefficients and x"),
    ]
    return ops


# ----------------------------------------------------------------------------- special


def _special_ops() -> list[Op]:
    def igamma_x(x):
        return tf.math.igamma(_c([0.5, 1.5, 3.0, 6.0], x), x)

    def igammac_x(x):
        return tf.math.igammac(_c([0.5, 1.5, 3.0, 6.0], x), x)

    def igamma_a(a):
        return tf.math.igamma(a, _c([0.4, 1.2, 2.5, 5.0], a))

    def betainc_x(x):
        return tf.math.betainc(_c([0.7, 1.5, 3.0, 5.0], x), _c([2.0, 0.8, 4.0, 1.5], x), x)

    def betainc_ab(a, b):
        return tf.math.betainc(a, b, _c([0.2, 0.45, 0.6, 0.85], a))

    def zeta_x(x):
        return tf.math.zeta(x, _c([0.5, 1.3, 2.0, 3.7], x))

    def igammac_a(a):
        return tf.math.igammac(a, _c([0.4, 1.2, 2.5, 5.0], a))

    def zeta_q(q):
        return tf.math.zeta(_c([2.5, 3.0, 4.5, 6.0], q), q)

    return [
        Op("lgamma", "special", tf.math.lgamma, _fixed([-2.5, -0.5, 0.3, 0.9, 1.7, 4.2, 9.0]),
           reference=_elementwise(sp.digamma), description="log|Gamma(x)|, including negative non-integers"),
        Op("digamma", "special", tf.math.digamma, _fixed([-1.5, -0.5, 0.3, 0.9, 1.7, 4.2, 9.0]),
           reference=_elementwise(lambda x: sp.polygamma(1, x))),
        Op("polygamma_1", "special", lambda x: tf.math.polygamma(tf.ones_like(x), x), _fixed([0.3, 0.9, 1.7, 4.2, 9.0]),
           reference=_elementwise(lambda x: sp.polygamma(2, x)), description="trigamma w.r.t. x"),
        Op("polygamma_3", "special", lambda x: tf.math.polygamma(3.0 * tf.ones_like(x), x), _fixed([0.6, 1.7, 4.2, 9.0]),
           reference=_elementwise(lambda x: sp.polygamma(4, x))),
        Op("igamma_x", "special", igamma_x, _fixed([0.4, 1.2, 2.5, 5.0]),
           reference=_elementwise(lambda x: np.exp((np.array([0.5, 1.5, 3.0, 6.0]) - 1) * np.log(x) - x
                                                   - sp.gammaln(np.array([0.5, 1.5, 3.0, 6.0]))))),
        Op("igammac_x", "special", igammac_x, _fixed([0.4, 1.2, 2.5, 5.0]),
           reference=_elementwise(lambda x: -np.exp((np.array([0.5, 1.5, 3.0, 6.0]) - 1) * np.log(x) - x
                                                    - sp.gammaln(np.array([0.5, 1.5, 3.0, 6.0]))))),
        Op("igamma_a", "special", igamma_a, _fixed([0.5, 1.5, 3.0, 6.0]), description="igamma w.r.t. a (IgammaGradA)"),
        Op("betainc_x", "special", betainc_x, _fixed([0.2, 0.45, 0.6, 0.85]),
           reference=_elementwise(lambda x: np.exp((np.array([0.7, 1.5, 3.0, 5.0]) - 1) * np.log(x)
                                                   + (np.array([2.0, 0.8, 4.0, 1.5]) - 1) * np.log1p(-x)
                                                   - sp.betaln(np.array([0.7, 1.5, 3.0, 5.0]),
                                                               np.array([2.0, 0.8, 4.0, 1.5]))))),
        Op("igammac_a", "special", igammac_a, _fixed([0.5, 1.5, 3.0, 6.0]),
           reference=_scipy_partials(lambda a: sp.gammaincc(a, np.array([0.4, 1.2, 2.5, 5.0])))),
        Op("betainc_a_b", "special", betainc_ab, _fixed([0.7, 1.5, 3.0, 5.0], [2.0, 0.8, 4.0, 1.5]),
           reference=_scipy_partials(lambda a, b: sp.betainc(a, b, np.array([0.2, 0.45, 0.6, 0.85]))),
           known_bug="tf.math.betainc's registered gradient returns None for a and b (unimplemented, no error): "
           "a tape silently reports 0 where d betainc / da, db are nonzero (tfp.math.betainc has them)",
           description="regularized incomplete beta w.r.t. a and b"),
        Op("zeta_x", "special", zeta_x, _fixed([2.5, 3.0, 4.5, 6.0]),
           reference=_scipy_partials(lambda x: sp.zeta(x, np.array([0.5, 1.3, 2.0, 3.7]))),
           known_bug="tf.math.zeta's registered gradient returns None for x (unimplemented, no error): a tape "
           "silently reports 0 where d zeta(x, q) / dx is nonzero",
           description="Hurwitz zeta w.r.t. x"),
        Op("zeta_q", "special", zeta_q, _fixed([0.5, 1.3, 2.0, 3.7]),
           reference=_elementwise(lambda q: -np.array([2.5, 3.0, 4.5, 6.0]) * sp.zeta(np.array([3.5, 4.0, 5.5, 7.0]), q)),
           description="Hurwitz zeta w.r.t. q"),
        Op("bessel_i0e", "special", tf.math.special.bessel_i0e, _fixed([-3.0, -0.7, 0.4, 1.5, 6.0]),
           reference=_elementwise(lambda x: sp.i1e(x) - np.sign(x) * sp.i0e(x))),
        Op("bessel_i1e", "special", tf.math.special.bessel_i1e, _fixed([-3.0, -0.7, 0.4, 1.5, 6.0]),
           reference=_elementwise(lambda x: sp.i0e(x) - sp.i1e(x) / x - np.sign(x) * sp.i1e(x))),
        Op("bessel_k0e", "special", tf.math.special.bessel_k0e, _fixed([0.3, 0.9, 1.5, 3.0, 7.0]),
           reference=_elementwise(lambda x: sp.k0e(x) - sp.k1e(x))),
        Op("bessel_k1e", "special", tf.math.special.bessel_k1e, _fixed([0.3, 0.9, 1.5, 3.0, 7.0]),
           reference=_elementwise(lambda x: sp.k1e(x) - sp.k0e(x) - sp.k1e(x) / x)),
        Op("bessel_i0", "special", tf.math.special.bessel_i0, _fixed([-2.0, -0.5, 0.7, 3.0]), reference=_elementwise(sp.i1)),
        Op("bessel_i1", "special", tf.math.special.bessel_i1, _fixed([-2.0, -0.5, 0.7, 3.0]),
           reference=_elementwise(lambda x: sp.i0(x) - sp.i1(x) / x)),
        Op("bessel_k0", "special", tf.math.special.bessel_k0, _fixed([0.3, 0.9, 2.0, 4.0]),
           reference=_elementwise(lambda x: -sp.k1(x))),
        Op("bessel_k1", "special", tf.math.special.bessel_k1, _fixed([0.3, 0.9, 2.0, 4.0]),
           reference=_elementwise(lambda x: -sp.k0(x) - sp.k1(x) / x)),
        Op("bessel_j0", "special", tf.math.special.bessel_j0, _fixed([-3.0, -0.5, 0.7, 2.0, 6.0]),
           reference=_elementwise(lambda x: -sp.j1(x))),
        Op("bessel_j1", "special", tf.math.special.bessel_j1, _fixed([-3.0, -0.5, 0.7, 2.0, 6.0]),
           reference=_elementwise(lambda x: sp.j0(x) - sp.j1(x) / x)),
        Op("bessel_y0", "special", tf.math.special.bessel_y0, _fixed([0.3, 0.9, 2.0, 6.0]),
           reference=_elementwise(lambda x: -sp.y1(x))),
        Op("bessel_y1", "special", tf.math.special.bessel_y1, _fixed([0.3, 0.9, 2.0, 6.0]),
           reference=_elementwise(lambda x: sp.y0(x) - sp.y1(x) / x)),
        Op("spence", "special", tf.math.special.spence, _fixed([0.2, 0.6, 1.7, 3.5]),
           reference=_elementwise(lambda x: np.log(x) / (1 - x))),
        Op("dawsn", "special", tf.math.special.dawsn, _fixed([-2.5, -0.7, 0.2, 1.1, 3.4]),
           reference=_elementwise(lambda x: 1 - 2 * x * sp.dawsn(x))),
        Op("expint", "special", tf.math.special.expint, _fixed([0.3, 0.9, 2.0, 4.5]),
           reference=_elementwise(lambda x: np.exp(x) / x)),
        Op("fresnel_cos", "special", tf.math.special.fresnel_cos, _fixed([-1.7, -0.4, 0.3, 0.9, 2.2]),
           reference=_elementwise(lambda x: np.cos(np.pi * x * x / 2))),
        Op("fresnel_sin", "special", tf.math.special.fresnel_sin, _fixed([-1.7, -0.4, 0.3, 0.9, 2.2]),
           reference=_elementwise(lambda x: np.sin(np.pi * x * x / 2))),
    ]


# ----------------------------------------------------------------------------- linalg


def _sym(a):
    return 0.5 * (a + tf.linalg.matrix_transpose(a))


def _spread(a, values):
    """Symmetric part of a plus diag(values): a separated spectrum."""
    return _sym(a) + tf.linalg.diag(_c(values, a))


def _linalg_ops() -> list[Op]:
    def inv_ref(a):
        ai = np.linalg.inv(a)
        return [-np.kron(ai, ai.T)]

    def eigh_projector(a):
        _, v = tf.linalg.eigh(_spread(a, [0.0, 2.0, 4.0, 6.0]))
        first = v[:, :1]
        return tf.matmul(first, first, transpose_b=True)

    def svd_values(a):
        return tf.linalg.svd(a + _c(np.eye(4, 3) * [3.0, 2.0, 1.0], a), compute_uv=False)

    def svd_u_projector(a):
        _, u, _ = tf.linalg.svd(a + _c(np.eye(4, 3) * [3.0, 2.0, 1.0], a))
        return tf.matmul(u[:, :1], u[:, :1], transpose_b=True)

    def logdet(a):
        return tf.linalg.logdet(tf.matmul(a, a, transpose_b=True) + tf.eye(4, dtype=a.dtype))

    def cholesky(a):
        return tf.linalg.cholesky(tf.matmul(a, a, transpose_b=True) + 2.0 * tf.eye(3, dtype=a.dtype))

    def cholesky_solve(a, b):
        chol = tf.linalg.cholesky(tf.matmul(a, a, transpose_b=True) + 2.0 * tf.eye(3, dtype=a.dtype))
        return tf.linalg.cholesky_solve(chol, b)

    def tridiagonal_solve(diags, rhs):
        main = diags[1] + _c(4.0, diags)
        return tf.linalg.tridiagonal_solve(tf.stack([diags[0], main, diags[2]]), rhs, diagonals_format="compact")

    def spectral_norm(a):
        return tf.norm(a + _c(np.diag([3.0, 2.0, 1.0]), a), ord=2, axis=[-2, -1])

    return [
        Op("matmul", "linalg", tf.matmul, _normal(100, (3, 4), (4, 2)),
           reference=lambda a, b: [np.kron(np.eye(3), b.T), np.kron(a, np.eye(2))]),
        Op("matmul_batched_transpose_b", "linalg", lambda a, b: tf.matmul(a, b, transpose_b=True),
           _normal(101, (2, 3, 4), (2, 2, 4))),
        Op("matvec", "linalg", tf.linalg.matvec, _normal(102, (3, 4), (4,)),
           reference=lambda a, x: [np.kron(np.eye(3), x[None, :]), a]),
        Op("inv", "linalg", tf.linalg.inv, _well_conditioned(103, 4), reference=inv_ref),
        Op("det", "linalg", tf.linalg.det, _well_conditioned(104, 4),
           reference=lambda a: [(np.linalg.det(a) * np.linalg.inv(a).T).reshape(1, -1)]),
        Op("slogdet", "linalg", lambda a: tf.linalg.slogdet(a)[1], _well_conditioned(105, 4),
           reference=lambda a: [np.linalg.inv(a).T.reshape(1, -1)]),
        Op("logdet_spd", "linalg", logdet, _normal(106, (4, 4)), description="logdet(a a^T + I)"),
        Op("cholesky_spd", "linalg", cholesky, _normal(107, (3, 3)), description="cholesky(a a^T + 2 I)"),
        Op("cholesky_solve", "linalg", cholesky_solve, _normal(108, (3, 3), (3, 2))),
        Op("triangular_solve", "linalg", lambda m, b: tf.linalg.triangular_solve(m, b, lower=True),
           _well_conditioned(109, 4, [(4, 2)]),
           description="lower solve with a full matrix: the op reads only the lower triangle"),
        Op("triangular_solve_adjoint_upper", "linalg",
           lambda m, b: tf.linalg.triangular_solve(m, b, lower=False, adjoint=True), _well_conditioned(110, 3, [(3, 2)])),
        Op("solve", "linalg", tf.linalg.solve, _well_conditioned(111, 4, [(4, 2)])),
        Op("lstsq", "linalg", tf.linalg.lstsq, _well_conditioned(112, 3, [(5, 2)], m=5),
           description="least squares with a tall full-rank 5x3 matrix"),
        Op("lstsq_l2_regularized", "linalg", lambda a, b: tf.linalg.lstsq(a, b, l2_regularizer=0.1),
           _well_conditioned(113, 3, [(5, 2)], m=5)),
        Op("qr_q", "linalg", lambda a: tf.linalg.qr(a).q, _well_conditioned(114, 3, m=4)),
        Op("qr_r", "linalg", lambda a: tf.linalg.qr(a).r, _well_conditioned(115, 3, m=4)),
        Op("eigvalsh", "linalg", lambda a: tf.linalg.eigvalsh(_spread(a, [0.0, 2.0, 4.0, 6.0])),
           _normal(116, (4, 4), scale=0.5)),
        Op("eigh_projector", "linalg", eigh_projector, _normal(117, (4, 4), scale=0.5),
           description="v0 v0^T of the lowest eigenvector (sign-free)"),
        Op("svd_values", "linalg", svd_values, _normal(118, (4, 3), scale=0.3)),
        Op("svd_u_projector", "linalg", svd_u_projector, _normal(119, (4, 3), scale=0.3),
           description="u0 u0^T of the leading left singular vector"),
        Op("matrix_exponential", "linalg", tf.linalg.expm, _normal(120, (3, 3), scale=0.5)),
        Op("matrix_square_root", "linalg", tf.linalg.sqrtm, _spd(121, 3)),
        Op("trace", "linalg", tf.linalg.trace, _normal(122, (2, 3, 3)),
           reference=lambda a: [np.kron(np.eye(2), np.eye(3).reshape(1, -1))]),
        Op("einsum_batched", "linalg", lambda a, b: tf.einsum("bij,bjk->bik", a, b), _normal(123, (2, 3, 2), (2, 2, 3))),
        Op("tensordot", "linalg", lambda a, b: tf.tensordot(a, b, axes=[[1, 2], [0, 1]]), _normal(124, (2, 3, 2), (3, 2, 2))),
        Op("norm_frobenius", "linalg", lambda a: tf.norm(a, ord="fro", axis=[-2, -1]), _normal(125, (3, 3)),
           reference=lambda a: [a.reshape(1, -1) / np.linalg.norm(a)]),
        Op("norm_spectral", "linalg", spectral_norm, _normal(126, (3, 3), scale=0.3)),
        Op("pinv", "linalg", tf.linalg.pinv, _well_conditioned(127, 3, m=4)),
        Op("tridiagonal_solve", "linalg", tridiagonal_solve, _normal(128, (3, 5), (5, 2), scale=0.5)),
        Op("band_part", "linalg", lambda a: tf.linalg.band_part(a, 1, 0), _normal(129, (3, 3)),
           reference=lambda a: [np.diag(np.tril(np.triu(np.ones((3, 3)), -1)).ravel())]),
        Op("diag_part_set_diag", "linalg", lambda a, d: tf.linalg.set_diag(a, d) * tf.linalg.diag_part(a)[:, None],
           _normal(130, (3, 3), (3,))),
        Op("cross", "linalg", tf.linalg.cross, _normal(131, (2, 3), (2, 3))),
        Op("matrix_triangular_inverse", "linalg", lambda m: tf.linalg.triangular_solve(m, tf.eye(3, dtype=m.dtype)),
           _lower(132, 3)),
    ]


# ----------------------------------------------------------------------------- nn


def _nn_ops() -> list[Op]:
    def softmax_row(r):
        s = _softmax(r)
        return np.diag(s) - np.outer(s, s)

    def log_softmax_row(r):
        return np.eye(r.size) - _softmax(r)[None, :]

    def l2_row(r):
        n = np.linalg.norm(r)
        return (np.eye(r.size) - np.outer(r, r) / n**2) / n

    def batch_norm(x, mean, variance, offset, scale):
        return tf.nn.batch_normalization(x, mean, variance, offset, scale, variance_epsilon=1e-3)

    def layer_norm(x, gamma, beta):
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-5) * gamma + beta

    def moments(x):
        mean, var = tf.nn.moments(x, axes=[0])
        return tf.concat([mean, var], 0)

    def softmax_ce(logits, labels):
        return tf.nn.softmax_cross_entropy_with_logits(labels=labels, logits=logits)

    def softmax_ce_ref(logits, labels):
        rows = [(labels[i].sum() * _softmax(r) - labels[i])[None, :] for i, r in enumerate(logits)]
        log_softmax = logits - sp.logsumexp(logits, axis=-1, keepdims=True)
        return [scipy.linalg.block_diag(*rows), scipy.linalg.block_diag(*(-row[None, :] for row in log_softmax))]

    def soft_labels(seed, normalized):
        def make(dtype):
            rng = np.random.default_rng(seed)
            raw = rng.uniform(0.05, 0.8, size=(3, 5))
            labels = raw / raw.sum(axis=-1, keepdims=True) if normalized else raw
            return [_t(rng.normal(size=(3, 5)), dtype), _t(labels, dtype)]

        return make

    def sparse_ce(logits):
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.constant([1, 0, 3]), logits=logits)

    def ctc(logits):
        labels = tf.constant([[1, 2, 1], [3, 1, 0]])
        return tf.nn.ctc_loss(labels, logits, label_length=tf.constant([3, 2]), logit_length=tf.constant([6, 5]),
                              logits_time_major=True, blank_index=0)

    def fused_batch_norm(x, scale, offset):
        return tf.compat.v1.nn.fused_batch_norm(x, scale, offset, epsilon=1e-3, is_training=True)[0]

    def conv2d_transpose(x, w):
        return tf.nn.conv2d_transpose(x, w, output_shape=[1, 6, 6, 2], strides=2, padding="SAME")

    def relu6_inputs(dtype):
        rng = np.random.default_rng(220)
        return [_t(rng.permutation([-1.5, -0.4, 0.3, 1.1, 2.7, 4.4, 5.6, 6.9, 8.0]), dtype)]

    return [
        Op("softmax", "nn", tf.nn.softmax, _normal(200, (2, 4)), reference=_rowwise(softmax_row)),
        Op("softmax_axis_0", "nn", lambda x: tf.nn.softmax(x, axis=0), _normal(201, (3, 2))),
        Op("log_softmax", "nn", tf.nn.log_softmax, _normal(202, (2, 4)), reference=_rowwise(log_softmax_row)),
        Op("l2_normalize", "nn", lambda x: tf.math.l2_normalize(x, axis=-1), _normal(203, (2, 4)),
           reference=_rowwise(l2_row)),
        Op("conv1d", "nn", lambda x, w: tf.nn.conv1d(x, w, stride=1, padding="SAME"), _normal(204, (1, 6, 2), (3, 2, 2))),
        Op("conv2d", "nn", lambda x, w: tf.nn.conv2d(x, w, strides=1, padding="SAME"),
           _normal(205, (1, 4, 4, 2), (3, 3, 2, 2))),
        Op("conv2d_strided_valid", "nn", lambda x, w: tf.nn.conv2d(x, w, strides=2, padding="VALID"),
           _normal(206, (1, 5, 5, 2), (3, 3, 2, 3))),
        Op("conv2d_dilated", "nn", lambda x, w: tf.nn.conv2d(x, w, strides=1, padding="SAME", dilations=2),
           _normal(207, (1, 5, 5, 1), (2, 2, 1, 2)), dtypes=F32,
           description="float32 only: the CPU float64 Conv2DBackpropInput rejects dilation rates > 1"),
        Op("conv2d_transpose", "nn", conv2d_transpose, _normal(208, (1, 3, 3, 3), (3, 3, 2, 3))),
        Op("depthwise_conv2d", "nn", lambda x, w: tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME"),
           _normal(209, (1, 4, 4, 2), (3, 3, 2, 2))),
        Op("separable_conv2d", "nn", lambda x, d, p: tf.nn.separable_conv2d(x, d, p, [1, 1, 1, 1], "VALID"),
           _normal(210, (1, 4, 4, 2), (2, 2, 2, 1), (1, 1, 2, 3))),
        Op("conv3d", "nn", lambda x, w: tf.nn.conv3d(x, w, [1, 1, 1, 1, 1], "VALID"),
           _normal(211, (1, 3, 3, 3, 1), (2, 2, 2, 1, 2))),
        Op("avg_pool", "nn", lambda x: tf.nn.avg_pool2d(x, 2, 2, "VALID"), _normal(212, (1, 4, 4, 2))),
        Op("avg_pool_same_overlap", "nn", lambda x: tf.nn.avg_pool2d(x, 3, 2, "SAME"), _normal(213, (1, 5, 5, 1))),
        Op("max_pool_distinct", "nn", lambda x: tf.nn.max_pool2d(x, 2, 2, "VALID"), _distinct(214, (1, 4, 4, 2))),
        Op("max_pool_overlap_distinct", "nn", lambda x: tf.nn.max_pool2d(x, 3, 1, "SAME"), _distinct(215, (1, 4, 4, 1))),
        Op("avg_pool3d", "nn", lambda x: tf.nn.avg_pool3d(x, 2, 1, "VALID"), _normal(216, (1, 3, 3, 3, 1)), dtypes=F32,
           description="float32 only: no float64 AvgPool3D kernel on CPU"),
        Op("batch_normalization", "nn", batch_norm,
           _concat(_normal(217, (3, 4), (4,)), _uniform(218, 0.5, 2.0, (4,)), _normal(219, (4,), (4,)))),
        Op("fused_batch_norm_training", "nn", fused_batch_norm, _normal(221, (2, 2, 2, 3), (3,), (3,)), dtypes=F32,
           description="FusedBatchNormV3, is_training=True (float32 only)"),
        Op("layer_norm", "nn", layer_norm, _normal(222, (2, 5), (5,), (5,))),
        Op("moments", "nn", moments, _normal(223, (4, 3))),
        Op("elu", "nn", tf.nn.elu, _away_from_zero(224, 0.2, 2.0, (8,)),
           reference=_elementwise(lambda x: np.where(x > 0, 1.0, np.exp(x)))),
        Op("selu", "nn", tf.nn.selu, _away_from_zero(225, 0.2, 2.0, (8,)),
           reference=_elementwise(lambda x: 1.0507009873554805 * np.where(x > 0, 1.0, 1.6732632423543772 * np.exp(x)))),
        Op("gelu_exact", "nn", tf.nn.gelu, _normal(226, (8,), scale=2.0),
           reference=_elementwise(lambda x: sp.ndtr(x) + x * _phi(x))),
        Op("gelu_tanh", "nn", lambda x: tf.nn.gelu(x, approximate=True), _normal(227, (8,), scale=2.0)),
        Op("silu", "nn", tf.nn.silu, _normal(228, (8,), scale=2.0),
           reference=_elementwise(lambda x: _SIGMOID(x) * (1 + x * (1 - _SIGMOID(x))))),
        Op("leaky_relu", "nn", lambda x: tf.nn.leaky_relu(x, alpha=0.1), _away_from_zero(229, 0.2, 2.0, (8,)),
           reference=_elementwise(lambda x: np.where(x > 0, 1.0, 0.1))),
        Op("relu", "nn", tf.nn.relu, _away_from_zero(230, 0.2, 2.0, (8,)), reference=_elementwise(lambda x: (x > 0) * 1.0)),
        Op("relu6", "nn", tf.nn.relu6, relu6_inputs, reference=_elementwise(lambda x: ((x > 0) & (x < 6)) * 1.0)),
        Op("softsign", "nn", tf.nn.softsign, _normal(231, (8,), scale=2.0),
           reference=_elementwise(lambda x: 1 / (1 + np.abs(x)) ** 2)),
        Op("crelu", "nn", tf.nn.crelu, _away_from_zero(232, 0.2, 2.0, (2, 3))),
        Op("bias_add", "nn", tf.nn.bias_add, _normal(233, (2, 3, 4), (4,))),
        Op("softmax_cross_entropy", "nn", softmax_ce, soft_labels(234, normalized=True), reference=softmax_ce_ref,
           description="w.r.t. logits and soft labels whose rows sum to 1"),
        Op("softmax_cross_entropy_unnormalized_labels", "nn", softmax_ce, soft_labels(235, normalized=False),
           reference=softmax_ce_ref,
           known_bug="SoftmaxCrossEntropyWithLogits backprops softmax(logits) - labels w.r.t. logits, the derivative "
           "only when each row of labels sums to 1 (a documented precondition the forward does not enforce); "
           "the derivative of the value it returns is sum(labels) * softmax(logits) - labels",
           description="labels rows summing to ~1.2-2.3: TF's logits gradient drops the sum(labels) factor"),
        Op("sparse_softmax_cross_entropy", "nn", sparse_ce, _normal(236, (3, 4)),
           reference=lambda x: [scipy.linalg.block_diag(*((_softmax(r) - np.eye(4)[k])[None, :]
                                                          for r, k in zip(x, [1, 0, 3])))]),
        Op("sigmoid_cross_entropy", "nn",
           lambda logits, labels: tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits),
           _concat(_normal(237, (6,), scale=2.0), _uniform(238, 0.0, 1.0, (6,))),
           reference=_elementwise(lambda x, z: _SIGMOID(x) - z, lambda x, z: -x)),
        Op("weighted_cross_entropy", "nn",
           lambda logits, labels: tf.nn.weighted_cross_entropy_with_logits(labels, logits, pos_weight=2.5),
           _concat(_normal(239, (6,), scale=2.0), _uniform(240, 0.0, 1.0, (6,)))),
        Op("log_poisson_loss", "nn", lambda log_input, targets: tf.nn.log_poisson_loss(targets, log_input,
                                                                                       compute_full_loss=True),
           _concat(_normal(241, (5,)), _uniform(242, 0.5, 4.0, (5,)))),
        Op("ctc_loss", "nn", ctc, _normal(243, (6, 2, 4)), dtypes=F32, description="CTC loss w.r.t. logits (float32 only)"),
        Op("local_response_normalization", "nn",
           lambda x: tf.nn.local_response_normalization(x, depth_radius=2, bias=1.0, alpha=0.5, beta=0.75),
           _normal(244, (1, 2, 2, 5)), dtypes=F32, description="LRN (float32 only)"),
    ]


# ----------------------------------------------------------------------------- image


def _image_ops() -> list[Op]:
    def rgb_inputs(dtype):
        """Colours with well separated channels: no ties in the max / min, no hue wrap-around."""
        rng = np.random.default_rng(300)
        pixels = []
        for _ in range(6):
            channels = rng.permutation([0.15, 0.5, 0.85]) + rng.uniform(-0.05, 0.05, size=3)
            pixels.append(channels)
        return [_t(np.reshape(pixels, (2, 3, 3)), dtype)]

    def crop_and_resize_image(image):
        boxes = tf.constant([[0.13, 0.21, 0.77, 0.86], [0.05, 0.4, 0.62, 0.93]])
        return tf.image.crop_and_resize(image, boxes, tf.constant([0, 0]), [3, 3])

    def crop_and_resize_boxes(boxes):
        image = tf.constant(np.random.default_rng(301).normal(size=(1, 5, 5, 2)), tf.float32)
        return tf.image.crop_and_resize(image, boxes, tf.constant([0, 0]), [3, 3])

    def image_gradients(x):
        dy, dx = tf.image.image_gradients(x)
        return tf.concat([tf.reshape(dy, [-1]), tf.reshape(dx, [-1])], 0)

    def ssim(a, b):
        return tf.image.ssim(a, b, max_val=1.0, filter_size=3)

    def extract_patches(x):
        return tf.image.extract_patches(x, sizes=[1, 2, 2, 1], strides=[1, 1, 1, 1], rates=[1, 1, 1, 1],
                                        padding="VALID")

    return [
        Op("resize_bilinear_up", "image", lambda x: tf.image.resize(x, [5, 7], method="bilinear"),
           _normal(302, (1, 3, 4, 2)), dtypes=F32, description="output is float32 whatever the input"),
        Op("resize_bilinear_down_antialias", "image",
           lambda x: tf.image.resize(x, [3, 2], method="bilinear", antialias=True), _normal(303, (1, 6, 5, 1)),
           dtypes=F32),
        Op("resize_nearest_up", "image", lambda x: tf.image.resize(x, [6, 8], method="nearest"),
           _normal(304, (1, 3, 4, 1))),
        Op("resize_bicubic", "image", lambda x: tf.image.resize(x, [5, 6], method="bicubic"),
           _normal(305, (1, 4, 4, 1)), dtypes=F32),
        Op("resize_lanczos3", "image", lambda x: tf.image.resize(x, [3, 3], method="lanczos3"),
           _normal(306, (1, 5, 5, 1)), dtypes=F32),
        Op("crop_and_resize_image", "image", crop_and_resize_image, _normal(307, (1, 5, 5, 2)), dtypes=F32),
        Op("crop_and_resize_boxes", "image", crop_and_resize_boxes,
           _fixed([[0.13, 0.21, 0.77, 0.86], [0.05, 0.4, 0.62, 0.93]]), dtypes=F32,
           description="w.r.t. box corners; sample points off the pixel grid"),
        Op("rgb_to_hsv", "image", tf.image.rgb_to_hsv, rgb_inputs),
        Op("rgb_to_yuv", "image", tf.image.rgb_to_yuv, rgb_inputs),
        Op("rgb_to_grayscale", "image", tf.image.rgb_to_grayscale, rgb_inputs,
           description="computes in float32 internally (convert_image_dtype) also for float64 images"),
        Op("adjust_gamma", "image", lambda x: tf.image.adjust_gamma(x, gamma=1.7, gain=1.2), _uniform(308, 0.1, 1.0, (2, 2, 3)),
           description="computes in float32 internally also for float64 images"),
        Op("per_image_standardization", "image", tf.image.per_image_standardization, _normal(309, (3, 3, 2)),
           dtypes=F32, description="output is float32 whatever the input"),
        Op("image_gradients", "image", image_gradients, _normal(310, (1, 3, 4, 2))),
        Op("total_variation", "image", tf.image.total_variation, _normal(311, (3, 3, 2)),
           description="sum of |neighbour differences| (no zero differences)"),
        Op("extract_patches", "image", extract_patches, _normal(312, (1, 3, 4, 2))),
        Op("sobel_edges", "image", tf.image.sobel_edges, _normal(313, (1, 4, 4, 1))),
        Op("ssim", "image", ssim, _concat(_uniform(314, 0.0, 1.0, (1, 5, 5, 1)), _uniform(315, 0.0, 1.0, (1, 5, 5, 1))),
           dtypes=F32, description="structural similarity, filter size 3 (output is float32)"),
    ]


# ----------------------------------------------------------------------------- signal


def _signal_ops() -> list[Op]:
    def fft(re, im):
        c = tf.signal.fft(tf.complex(re, im))
        return tf.concat([tf.math.real(c), tf.math.imag(c)], 0)

    def ifft(re, im):
        c = tf.signal.ifft(tf.complex(re, im))
        return tf.concat([tf.math.real(c), tf.math.imag(c)], 0)

    def fft2d(re, im):
        c = tf.signal.fft2d(tf.complex(re, im))
        return tf.concat([tf.math.real(c), tf.math.imag(c)], 0)

    def rfft_power(x):
        return tf.abs(tf.signal.rfft(x)) ** 2

    def rfft_parts(x):
        c = tf.signal.rfft(x)
        return tf.concat([tf.math.real(c), tf.math.imag(c)], 0)

    def irfft(re, im):
        return tf.signal.irfft(tf.complex(re, im))

    def stft_magnitude(x):
        return tf.abs(tf.signal.stft(x, frame_length=8, frame_step=4, fft_length=8))

    def mfccs(x):
        return tf.signal.mfccs_from_log_mel_spectrograms(x)

    def dft_matrix(x):
        n = np.arange(8)
        w = np.exp(-2j * np.pi * np.outer(n, n) / 8)
        return [np.vstack([w.real, w.imag])]

    def frame_weighted(x):
        frames = tf.signal.frame(x, frame_length=4, frame_step=2)
        return frames * _c(np.arange(1.0, 5.0), x)

    return [
        Op("fft", "signal", fft, _normal(400, (8,), (8,)), description="complex fft as (real, imag) of (re, im)"),
        Op("ifft", "signal", ifft, _normal(401, (8,), (8,))),
        Op("fft2d", "signal", fft2d, _normal(402, (3, 4), (3, 4))),
        Op("rfft_parts", "signal", rfft_parts, _normal(403, (8,)),
           reference=lambda x: [np.vstack([np.exp(-2j * np.pi * np.outer(np.arange(5), np.arange(8)) / 8).real,
                                           np.exp(-2j * np.pi * np.outer(np.arange(5), np.arange(8)) / 8).imag])]),
        Op("rfft_power", "signal", rfft_power, _normal(404, (8,))),
        Op("irfft", "signal", irfft, _normal(405, (5,), (5,)),
           description="irfft of 5 complex bins to 8 samples w.r.t. real and imaginary parts"),
        Op("stft_magnitude", "signal", stft_magnitude, _normal(406, (24,))),
        Op("dct_2_ortho", "signal", lambda x: tf.signal.dct(x, type=2, norm="ortho"), _normal(407, (2, 8))),
        Op("idct_2", "signal", lambda x: tf.signal.idct(x, type=2), _normal(408, (8,))),
        Op("dct_1", "signal", lambda x: tf.signal.dct(x, type=1), _normal(409, (6,))),
        Op("frame", "signal", frame_weighted, _normal(410, (10,))),
        Op("overlap_and_add", "signal", lambda x: tf.signal.overlap_and_add(x, frame_step=2), _normal(411, (4, 4))),
        Op("mfccs_from_log_mel", "signal", mfccs, _normal(412, (2, 8))),
    ]


# ----------------------------------------------------------------------------- indexing


def _indexing_ops() -> list[Op]:
    def selector(out_size, picks, in_size):
        j = np.zeros((out_size, in_size))
        for row, col in enumerate(picks):
            j[row, col] = 1.0
        return j

    def gather(x):
        return tf.gather(x, [3, 0, 3, 5, 1])

    def dynamic_partition_stitch(x):
        partitions = tf.constant([0, 1, 2, 1, 0, 2, 2])
        parts = tf.dynamic_partition(x, partitions, 3)
        indices = tf.dynamic_partition(tf.range(7), partitions, 3)
        weighted = [p * _c(k + 1.0, x) for k, p in enumerate(parts)]
        return tf.dynamic_stitch(indices, weighted)

    def scatter_nd_duplicates(updates):
        return tf.scatter_nd(tf.constant([[1], [3], [1], [0]]), updates, [5, 2])

    def tensor_scatter_update(tensor, updates):
        return tf.tensor_scatter_nd_update(tensor, tf.constant([[0, 1], [2, 0]]), updates)

    def tensor_scatter_add(tensor, updates):
        return tf.tensor_scatter_nd_add(tensor, tf.constant([[0, 1], [2, 0], [0, 1]]), updates)

    def where_select(x, y):
        return tf.where(tf.constant([True, False, False, True, True, False]), x, y)

    def split_weighted(x):
        a, b, c = tf.split(x, [1, 2, 3], axis=1)
        return tf.concat([a * 2.0, b * 3.0, c * -1.0], 1)

    return [
        Op("gather", "indexing", gather, _normal(500, (6,)), reference=lambda x: [selector(5, [3, 0, 3, 5, 1], 6)]),
        Op("gather_axis_1_batch_dims", "indexing", lambda x: tf.gather(x, [[1, 0], [2, 2]], axis=1, batch_dims=1),
           _normal(501, (2, 3))),
        Op("gather_nd", "indexing", lambda x: tf.gather_nd(x, [[0, 1], [2, 2], [0, 1]]), _normal(502, (3, 3))),
        Op("scatter_nd_duplicates", "indexing", scatter_nd_duplicates, _normal(503, (4, 2)),
           description="duplicate indices add"),
        Op("tensor_scatter_nd_update", "indexing", tensor_scatter_update, _normal(504, (3, 2), (2,))),
        Op("tensor_scatter_nd_add_duplicates", "indexing", tensor_scatter_add, _normal(505, (3, 2), (3,))),
        Op("boolean_mask", "indexing", lambda x: tf.boolean_mask(x, tf.constant([True, False, True, True, False])),
           _normal(506, (5, 2))),
        Op("slice", "indexing", lambda x: x[1:3, ::2], _normal(507, (4, 5))),
        Op("strided_slice_negative", "indexing", lambda x: x[::-2, 3:0:-1], _normal(508, (5, 5))),
        Op("tile", "indexing", lambda x: tf.tile(x, [2, 3]), _normal(509, (2, 2))),
        Op("broadcast_to", "indexing", lambda x: tf.broadcast_to(x, [3, 2, 4]), _normal(510, (2, 1))),
        Op("pad_reflect", "indexing", lambda x: tf.pad(x, [[1, 2], [2, 1]], mode="REFLECT"), _normal(511, (3, 4))),
        Op("pad_symmetric", "indexing", lambda x: tf.pad(x, [[2, 0], [1, 1]], mode="SYMMETRIC"), _normal(512, (3, 3))),
        Op("pad_constant", "indexing", lambda x: tf.pad(x, [[1, 0], [0, 2]], constant_values=0.5), _normal(513, (2, 2))),
        Op("reverse", "indexing", lambda x: tf.reverse(x, axis=[1]), _normal(514, (2, 4))),
        Op("transpose", "indexing", lambda x: tf.transpose(x, [2, 0, 1]), _normal(515, (2, 3, 2))),
        Op("reshape", "indexing", lambda x: tf.reshape(x, [3, 4]) * _c(np.arange(12.0).reshape(3, 4), x),
           _normal(516, (2, 6))),
        Op("concat", "indexing", lambda x, y: tf.concat([x, 2.0 * y], axis=0), _normal(517, (2, 3), (1, 3))),
        Op("stack", "indexing", lambda x, y: tf.stack([x, y * y], axis=1), _normal(518, (4,), (4,))),
        Op("split", "indexing", split_weighted, _normal(519, (2, 6))),
        Op("roll", "indexing", lambda x: tf.roll(x, shift=2, axis=0), _normal(520, (5,))),
        Op("repeat", "indexing", lambda x: tf.repeat(x, [1, 3, 2], axis=0), _normal(521, (3, 2))),
        Op("where_select", "indexing", where_select, _normal(522, (6,), (6,))),
        Op("unsorted_segment_sum", "indexing",
           lambda x: tf.math.unsorted_segment_sum(x, tf.constant([2, 0, 2, 1, 0, 2]), 4), _normal(523, (6, 2))),
        Op("segment_mean", "indexing", lambda x: tf.math.segment_mean(x, tf.constant([0, 0, 1, 2, 2, 2])),
           _normal(524, (6, 2))),
        Op("unsorted_segment_max_distinct", "indexing",
           lambda x: tf.math.unsorted_segment_max(x, tf.constant([1, 0, 1, 1, 0, 2]), 3), _distinct(525, (6,))),
        Op("unsorted_segment_prod", "indexing",
           lambda x: tf.math.unsorted_segment_prod(x, tf.constant([1, 0, 1, 1, 0, 2]), 3), _away_from_zero(526, 0.5, 1.5, (6,))),
        Op("top_k_values", "indexing", lambda x: tf.math.top_k(x, k=3).values, _distinct(527, (2, 6))),
        Op("sort_values", "indexing", lambda x: tf.sort(x, axis=-1) * _c(np.arange(1.0, 7.0), x), _distinct(528, (2, 6))),
        Op("dynamic_partition_stitch", "indexing", dynamic_partition_stitch, _normal(529, (7,))),
        Op("embedding_lookup", "indexing", lambda w: tf.nn.embedding_lookup(w, tf.constant([[0, 2], [2, 3]])),
           _normal(530, (4, 3))),
    ]


# ----------------------------------------------------------------------------- control flow


def _control_flow_ops() -> list[Op]:
    def while_accumulate(x):
        def body(i, acc):
            return i + 1, acc * tf.sin(x) + x * tf.cast(i, x.dtype)

        return tf.while_loop(lambda i, acc: i < 5, body, (tf.constant(0), tf.ones_like(x)))[1]

    @tf.function
    def while_in_function(x):
        def body(i, acc):
            return i + 1, tf.tanh(acc + x)

        return tf.while_loop(lambda i, acc: i < 4, body, (tf.constant(0), x))[1]

    def while_tensor_array(x):
        ta = tf.TensorArray(x.dtype, size=4)

        def body(i, acc, ta):
            acc = acc * x + 1.0
            return i + 1, acc, ta.write(i, acc)

        _, _, ta = tf.while_loop(lambda i, acc, ta: i < 4, body, (tf.constant(0), tf.ones_like(x), ta),
                                 maximum_iterations=4)
        return ta.stack()

    def cond(x):
        return tf.cond(tf.reduce_sum(x) > 0, lambda: tf.sin(x) * x, lambda: tf.cos(x))

    def switch_case(x):
        return tf.switch_case(tf.constant(1), [lambda: x, lambda: tf.exp(x) * x, lambda: -x])

    def scan(x):
        return tf.scan(lambda acc, v: acc * 0.9 + tf.sin(v), x, initializer=tf.zeros_like(x[0]))

    def map_fn(x):
        return tf.map_fn(lambda row: tf.reduce_sum(row * row) * row, x)

    def foldl(x):
        return tf.foldl(lambda acc, v: acc * v + 1.0, x)

    def foldr(x):
        return tf.foldr(lambda acc, v: tf.tanh(acc + v), x, initializer=tf.zeros_like(x[0]))

    def vectorized_map(x):
        return tf.vectorized_map(lambda row: tf.tanh(row) * tf.reduce_sum(row), x)

    def recompute_grad(x):
        return tf.recompute_grad(lambda v: tf.sin(v) * tf.exp(v))(x)

    return [
        Op("while_loop_accumulate", "control_flow", while_accumulate, _normal(600, (4,), scale=0.7)),
        Op("while_loop_in_function", "control_flow", while_in_function, _normal(601, (4,))),
        Op("while_loop_tensor_array", "control_flow", while_tensor_array, _uniform(602, 0.5, 1.2, (3,))),
        Op("cond", "control_flow", cond, _uniform(603, 0.2, 1.5, (4,))),
        Op("switch_case", "control_flow", switch_case, _normal(604, (4,))),
        Op("scan", "control_flow", scan, _normal(605, (5, 2))),
        Op("map_fn", "control_flow", map_fn, _normal(606, (3, 2))),
        Op("foldl", "control_flow", foldl, _uniform(607, 0.5, 1.5, (4, 2))),
        Op("foldr", "control_flow", foldr, _normal(608, (4, 2))),
        Op("vectorized_map", "control_flow", vectorized_map, _normal(609, (3, 2))),
        Op("recompute_grad", "control_flow", recompute_grad, _normal(610, (5,))),
    ]


# ----------------------------------------------------------------------------- tfp special


def _tfp_special_ops() -> list[Op]:
    def owens_t_ref(h, a):
        dh = -_phi(h) * sp.erf(a * h / np.sqrt(2)) / 2
        da = np.exp(-0.5 * h * h * (1 + a * a)) / (2 * np.pi * (1 + a * a))
        return [np.diag(dh), np.diag(da)]

    v_ive = np.array([0.5, 1.0, 2.5, 4.0, 0.0])

    return [
        Op("owens_t", "tfp_special", tfp.math.owens_t, _fixed([-1.5, -0.3, 0.6, 2.0], [0.4, -1.2, 2.5, 0.9]),
           reference=owens_t_ref),
        Op("log_bessel_ive_z", "tfp_special", lambda z: tfp.math.log_bessel_ive(_c(v_ive, z), z),
           _fixed([0.3, 1.2, 3.5, 7.0, 2.0]),
           reference=_elementwise(lambda z: sp.ivp(v_ive, z) / sp.iv(v_ive, z) - 1)),
        Op("bessel_ive_z", "tfp_special", lambda z: tfp.math.bessel_ive(_c(v_ive, z), z), _fixed([0.3, 1.2, 3.5, 7.0, 2.0]),
           reference=_elementwise(lambda z: sp.ivp(v_ive, z) * np.exp(-z) - sp.ive(v_ive, z))),
        Op("bessel_kve_z", "tfp_special", lambda z: tfp.math.bessel_kve(_c(v_ive, z), z), _fixed([0.3, 1.2, 3.5, 7.0, 2.0]),
           reference=_elementwise(lambda z: sp.kvp(v_ive, z) * np.exp(z) + sp.kve(v_ive, z))),
        Op("log_bessel_kve_z", "tfp_special", lambda z: tfp.math.log_bessel_kve(_c(v_ive, z), z),
           _fixed([0.3, 1.2, 3.5, 7.0, 2.0]),
           reference=_elementwise(lambda z: sp.kvp(v_ive, z) / sp.kv(v_ive, z) + 1)),
        Op("lbeta", "tfp_special", tfp.math.lbeta, _fixed([0.5, 1.3, 2.7, 4.1], [3.2, 0.8, 1.9, 5.0]),
           reference=_elementwise(lambda a, b: sp.digamma(a) - sp.digamma(a + b),
                                  lambda a, b: sp.digamma(b) - sp.digamma(a + b))),
        Op("log1mexp", "tfp_special", tfp.math.log1mexp, _fixed([0.05, 0.4, 0.9, 2.0, 6.0]),
           reference=_elementwise(lambda x: 1 / np.expm1(x))),
        Op("softplus_inverse", "tfp_special", tfp.math.softplus_inverse, _fixed([0.05, 0.4, 0.9, 2.0, 12.0]),
           reference=_elementwise(lambda y: -1 / np.expm1(-y))),
        Op("tfp_betainc", "tfp_special", tfp.math.betainc,
           _fixed([0.8, 1.5, 3.0, 4.5], [2.0, 0.9, 4.0, 1.3], [0.2, 0.45, 0.6, 0.85]),
           description="w.r.t. a, b and x (custom gradient)"),
        Op("erfcx", "tfp_special", tfp.math.erfcx, _fixed([-1.5, -0.2, 0.5, 2.0, 8.0]),
           reference=_elementwise(lambda x: 2 * x * sp.erfcx(x) - 2 / np.sqrt(np.pi))),
        Op("logerfc", "tfp_special", tfp.math.logerfc, _fixed([-1.5, -0.2, 0.5, 2.0, 8.0]),
           reference=_elementwise(lambda x: -2 / np.sqrt(np.pi) / sp.erfcx(x))),
        Op("lambertw", "tfp_special", tfp.math.lambertw, _fixed([-0.3, -0.1, 0.5, 1.7, 9.0]),
           reference=_elementwise(lambda x: sp.lambertw(x).real / (x * (1 + sp.lambertw(x).real)))),
        Op("tfp_dawsn", "tfp_special", tfp.math.dawsn, _fixed([-2.5, -0.7, 0.2, 1.1, 3.4]),
           reference=_elementwise(lambda x: 1 - 2 * x * sp.dawsn(x))),
        Op("von_mises_cdf", "tfp_special", _fresh(lambda loc, k, x: tfd.VonMises(loc, k).cdf(x)),
           _fixed([0.3, -1.0, 2.0, 0.0], [0.5, 2.0, 8.0, 30.0], [0.1, -0.2, 2.5, 0.05]),
           description="von Mises cdf (custom gradient) w.r.t. loc, concentration and x"),
        Op("gamma_cdf", "tfp_special", _fresh(lambda c, rate, x: tfd.Gamma(c, rate).cdf(x)),
           _fixed([0.8, 1.5, 2.5, 4.0], [0.5, 1.2, 2.0, 0.9], [0.4, 1.1, 2.5, 4.2])),
        Op("student_t_cdf", "tfp_special", _fresh(lambda df, loc, scale, x: tfd.StudentT(df, loc, scale).cdf(x)),
           _fixed([1.5, 3.0, 5.0, 12.0], [0.0, -0.4, 0.3, 1.0], [0.8, 1.1, 2.0, 0.6], [-2.0, -0.3, 0.8, 3.1])),
        Op("beta_cdf", "tfp_special", _fresh(lambda a, b, x: tfd.Beta(a, b).cdf(x)),
           _fixed([0.7, 1.8, 2.5, 4.0], [1.2, 0.9, 3.0, 2.2], [0.15, 0.4, 0.7, 0.9]),
           reference=_scipy_partials(sp.betainc)),
        Op("igammainv", "tfp_special", tfp.math.igammainv, _fixed([0.7, 1.5, 3.0, 6.0], [0.15, 0.4, 0.65, 0.9])),
        Op("log_gamma_difference", "tfp_special", tfp.math.log_gamma_difference,
           _fixed([0.5, 1.5, 2.5, 3.0], [2.0, 4.5, 7.0, 10.0]),
           reference=_elementwise(lambda x, y: -sp.digamma(x + y), lambda x, y: sp.digamma(y) - sp.digamma(x + y))),
        Op("log_cosh", "tfp_special", tfp.math.log_cosh, _normal(700, (6,), scale=3.0), reference=_elementwise(np.tanh)),
        Op("log_add_exp", "tfp_special", tfp.math.log_add_exp, _normal(701, (5,), (5,), scale=2.0),
           reference=_elementwise(lambda x, y: _SIGMOID(x - y), lambda x, y: _SIGMOID(y - x))),
        Op("reduce_weighted_logsumexp", "tfp_special",
           lambda x, w: tfp.math.reduce_weighted_logsumexp(x, w, axis=-1), _concat(_normal(702, (2, 4)),
                                                                                     _uniform(703, 0.2, 1.5, (2, 4)))),
    ]


# ----------------------------------------------------------------------------- tfp distributions


def _distribution_ops() -> list[Op]:
    cat = "tfp_distribution_log_prob"

    def lognormal_cached(loc, scale, x):
        return tfd.LogNormal(loc, scale).log_prob(x)

    def lognormal_ref(loc, scale, x):
        z = (np.log(x) - loc) / scale
        return [np.diag(z / scale), np.diag((z * z - 1) / scale), np.diag(-(1 + z / scale) / x)]

    def normal_ref(loc, scale, x):
        z = (x - loc) / scale
        return [np.diag(z / scale), np.diag((z * z - 1) / scale), np.diag(-z / scale)]

    def gamma_ref(c, rate, x):
        return [np.diag(np.log(rate) - sp.digamma(c) + np.log(x)), np.diag(c / rate - x), np.diag((c - 1) / x - rate)]

    def mvn_tril(loc, scale_tril, x):
        return tfd.MultivariateNormalTriL(loc, scale_tril).log_prob(x)

    def categorical(logits):
        return tfd.Categorical(logits=logits).log_prob(tf.constant([2, 0, 3]))

    def binomial(probs):
        return tfd.Binomial(total_count=_c([5.0, 10.0, 3.0, 8.0], probs), probs=probs).log_prob(_c([2.0, 7.0, 0.0, 8.0],
                                                                                                   probs))

    def poisson(rate):
        return tfd.Poisson(rate).log_prob(_c([0.0, 3.0, 1.0, 7.0], rate))

    def negative_binomial(total_count, logits):
        return tfd.NegativeBinomial(total_count, logits=logits).log_prob(_c([0.0, 2.0, 5.0, 1.0], logits))

    def truncated_normal(loc, scale, x):
        return tfd.TruncatedNormal(loc, scale, _c(-1.0, loc), _c(2.5, loc)).log_prob(x)

    def multinomial(logits):
        return tfd.Multinomial(total_count=_c(6.0, logits), logits=logits).log_prob(_c([[1.0, 3.0, 2.0],
                                                                                       [0.0, 2.0, 4.0]], logits))

    ops = [
        Op("normal_log_prob", cat, lambda loc, scale, x: tfd.Normal(loc, scale).log_prob(x),
           _fixed([0.1, -0.5, 1.0, 2.0], [0.7, 1.3, 0.5, 2.2], [-1.3, 0.2, 0.9, 2.4]), reference=normal_ref),
        Op("gamma_log_prob", cat, lambda c, rate, x: tfd.Gamma(c, rate).log_prob(x),
           _fixed([0.8, 1.5, 2.5, 4.0], [0.5, 1.2, 2.0, 0.9], [0.4, 1.1, 2.5, 4.2]), reference=gamma_ref),
        Op("beta_log_prob", cat, lambda a, b, x: tfd.Beta(a, b).log_prob(x),
           _fixed([0.7, 1.8, 2.5, 4.0], [1.2, 0.9, 3.0, 2.2], [0.15, 0.4, 0.7, 0.9]),
           reference=_elementwise(lambda a, b, x: np.log(x) - sp.digamma(a) + sp.digamma(a + b),
                                  lambda a, b, x: np.log1p(-x) - sp.digamma(b) + sp.digamma(a + b),
                                  lambda a, b, x: (a - 1) / x - (b - 1) / (1 - x))),
        Op("student_t_log_prob", cat, lambda df, loc, scale, x: tfd.StudentT(df, loc, scale).log_prob(x),
           _fixed([1.5, 3.0, 5.0, 12.0], [0.0, -0.4, 0.3, 1.0], [0.8, 1.1, 2.0, 0.6], [-2.0, -0.3, 0.8, 3.1])),
        Op("dirichlet_log_prob", cat, lambda c, x: tfd.Dirichlet(c).log_prob(x),
           _fixed([[0.8, 2.0, 3.5], [1.5, 0.6, 2.2]], [[0.2, 0.3, 0.5], [0.6, 0.1, 0.3]])),
        Op("mvn_tril_log_prob", cat, mvn_tril, _concat(_normal(800, (3,)), _lower(801, 3), _normal(802, (2, 3))),
           description="w.r.t. loc, scale_tril (upper part zero and unused) and value"),
        Op("von_mises_log_prob", cat, lambda loc, k, x: tfd.VonMises(loc, k).log_prob(x),
           _fixed([0.3, -1.0, 2.0, 0.0], [0.5, 2.0, 8.0, 30.0], [0.1, -0.2, 2.5, 0.05])),
        Op("poisson_log_prob_rate", cat, poisson, _fixed([0.5, 2.0, 1.5, 6.0])),
        Op("binomial_log_prob_probs", cat, binomial, _fixed([0.2, 0.6, 0.3, 0.85])),
        Op("categorical_log_prob_logits", cat, categorical, _normal(803, (3, 4)),
           reference=lambda x: [scipy.linalg.block_diag(*((np.eye(4)[k] - _softmax(r))[None, :]
                                                          for r, k in zip(x, [2, 0, 3])))]),
        Op("multinomial_log_prob_logits", cat, multinomial, _normal(804, (2, 3))),
        Op("negative_binomial_log_prob", cat, negative_binomial, _fixed([1.5, 3.0, 6.0, 0.8], [-0.5, 0.3, 1.0, -1.2])),
        Op("lognormal_log_prob", cat, lambda loc, scale, x: tfd.LogNormal(loc, scale).log_prob(x),
           _fixed([0.1, -0.5, 1.0], [0.7, 1.3, 0.5], [0.4, 1.2, 3.0]), reference=lognormal_ref),
        Op("weibull_log_prob", cat, lambda k, lam, x: tfd.Weibull(k, lam).log_prob(x),
           _fixed([0.8, 1.5, 3.0], [0.5, 1.2, 2.0], [0.3, 1.1, 2.6])),
        Op("laplace_log_prob", cat, lambda loc, scale, x: tfd.Laplace(loc, scale).log_prob(x),
           _fixed([0.1, -0.5, 1.0], [0.7, 1.3, 0.5], [-1.2, 0.6, 2.1]), description="value away from loc"),
        Op("truncated_normal_log_prob", cat, truncated_normal,
           _fixed([0.2, -0.5, 1.5], [0.8, 1.3, 0.6], [-0.4, 0.9, 2.2])),
        Op("inverse_gamma_log_prob", cat, lambda c, s, x: tfd.InverseGamma(c, s).log_prob(x),
           _fixed([1.5, 3.0, 0.8], [0.5, 2.0, 1.2], [0.4, 1.3, 2.5])),
        Op("kumaraswamy_log_prob", cat, lambda a, b, x: tfd.Kumaraswamy(a, b).log_prob(x),
           _fixed([0.8, 2.0, 3.5], [1.5, 0.7, 2.5], [0.2, 0.5, 0.8])),
        Op("gumbel_log_prob", cat, lambda loc, scale, x: tfd.Gumbel(loc, scale).log_prob(x),
           _fixed([0.1, -0.5, 1.0], [0.7, 1.3, 0.5], [-1.2, 0.6, 2.1])),
        Op("chi2_log_prob", cat, lambda df, x: tfd.Chi2(df).log_prob(x), _fixed([1.5, 3.0, 7.0], [0.5, 2.2, 6.0])),
    ]
    # Every entry above runs on fresh tensors (see _fresh); this one shows the cache trap itself.
    # Plain TFP code, no fresh copies inside f: fastcheck's taped calls get fresh tensors
    # (as a training step does), so TFP's per-tensor bijector cache cannot leak into them.
    plain = Op("lognormal_log_prob_plain", cat, lognormal_cached, _fixed([0.1, -0.5, 1.0], [0.7, 1.3, 0.5],
                                                                         [0.4, 1.2, 3.0]),
               reference=lognormal_ref,
               description="tfd.LogNormal(loc, scale).log_prob(x) without fresh copies of the inputs inside f")
    return [dataclasses.replace(op, f=_fresh(op.f)) for op in ops] + [plain]


# ----------------------------------------------------------------------------- tfp bijectors


def _ldj(bijector, event_ndims):
    """forward_log_det_jacobian at a fresh tensor (TFP caches the LDJ per input tensor object)."""
    return lambda x: bijector.forward_log_det_jacobian(tf.identity(x), event_ndims=event_ndims)


def _bijector_ops() -> list[Op]:
    cat = "tfp_bijector_ldj"

    def sinh_arcsinh(x, skewness, tailweight):
        return tfb.SinhArcsinh(skewness, tailweight).forward_log_det_jacobian(tf.identity(x), event_ndims=0)

    def shift_scale(x, scale):
        chain = tfb.Chain([tfb.Shift(_c(1.0, x)), tfb.Scale(scale)])
        return chain.forward_log_det_jacobian(tf.identity(x), event_ndims=1)

    def kumaraswamy_cdf(x, c1, c0):
        return tfb.KumaraswamyCDF(c1, c0).forward_log_det_jacobian(tf.identity(x), event_ndims=0)

    def scale_matvec_tril(x, tril):
        return tfb.ScaleMatvecTriL(tril).forward_log_det_jacobian(tf.identity(x), event_ndims=1)

    def fill_scale_tril(x):
        bijector = tfb.FillScaleTriL(diag_shift=_c(1e-5, x))
        return bijector.forward_log_det_jacobian(tf.identity(x), event_ndims=1)

    def power(x):
        return tfb.Power(_c(2.5, x)).forward_log_det_jacobian(tf.identity(x), event_ndims=0)

    def generalized_pareto(x):
        return tfb.GeneralizedPareto(_c(0.5, x), _c(1.5, x), _c(0.3, x)).forward_log_det_jacobian(tf.identity(x),
                                                                                                  event_ndims=0)

    # Not here: tfb.SoftmaxCentered (and tfb.Pad) cannot be constructed with TFP 0.25 under numpy 2
    # (np.reshape(..., newshape=...) raises TypeError), so its gradient cannot be audited.
    return [
        Op("exp_ldj", cat, _ldj(tfb.Exp(), 0), _normal(900, (5,)), description="ldj = x"),
        Op("softplus_ldj", cat, _ldj(tfb.Softplus(), 0), _normal(901, (5,), scale=2.0),
           reference=_elementwise(lambda x: 1 - _SIGMOID(x))),
        Op("sigmoid_ldj", cat, _ldj(tfb.Sigmoid(), 0), _normal(902, (5,), scale=2.0),
           reference=_elementwise(lambda x: 1 - 2 * _SIGMOID(x))),
        Op("tanh_ldj", cat, _ldj(tfb.Tanh(), 0), _normal(903, (5,)), reference=_elementwise(lambda x: -2 * np.tanh(x))),
        Op("sinh_ldj", cat, _ldj(tfb.Sinh(), 0), _normal(904, (5,)), reference=_elementwise(np.tanh)),
        Op("sinh_arcsinh_ldj", cat, sinh_arcsinh, _concat(_normal(905, (4,)), _fixed([0.3, -0.5, 0.0, 1.0],
                                                                                     [0.7, 1.5, 1.0, 2.0])),
           description="w.r.t. x, skewness and tailweight"),
        Op("fill_scale_tril_ldj", cat, fill_scale_tril, _normal(906, (2, 6)),
           description="vector of 6 -> 3x3 scale_tril, event_ndims=1"),
        Op("cholesky_outer_product_ldj", cat, _ldj(tfb.CholeskyOuterProduct(), 2), _lower(907, 3)),
        Op("power_ldj", cat, power, _uniform(908, 0.3, 2.0, (5,)),
           reference=_elementwise(lambda x: 1.5 / x)),
        Op("shift_scale_chain_ldj", cat, shift_scale, _concat(_normal(909, (3,)), _away_from_zero(910, 0.5, 2.0, (3,))),
           reference=lambda x, s: [np.zeros((1, 3)), (1 / s)[None, :]]),
        Op("normal_cdf_ldj", cat, _ldj(tfb.NormalCDF(), 0), _normal(912, (5,), scale=2.0),
           reference=_elementwise(lambda x: -x)),
        Op("kumaraswamy_cdf_ldj", cat, kumaraswamy_cdf,
           _fixed([0.2, 0.5, 0.8], [0.8, 2.0, 3.5], [1.5, 0.7, 2.5])),
        Op("scale_matvec_tril_ldj", cat, scale_matvec_tril, _concat(_normal(913, (3,)), _lower(914, 3)),
           reference=lambda x, m: [np.zeros((1, 3)), np.diag(1 / np.diag(m)).reshape(1, -1)]),
        Op("ascending_ldj", cat, _ldj(tfb.Ascending(), 1), _normal(915, (2, 4))),
        Op("correlation_cholesky_ldj", cat, _ldj(tfb.CorrelationCholesky(), 1), _normal(916, (3,), scale=0.7)),
        Op("generalized_pareto_ldj", cat, generalized_pareto, _normal(917, (5,))),
        Op("invert_softplus_ldj", cat, _ldj(tfb.Invert(tfb.Softplus()), 0), _uniform(918, 0.2, 4.0, (5,)),
           reference=_elementwise(lambda y: -1 / np.expm1(y)), description="ldj of softplus^-1"),
        Op("reciprocal_ldj", cat, _ldj(tfb.Reciprocal(), 0), _away_from_zero(919, 0.3, 2.0, (5,)),
           reference=_elementwise(lambda x: -2 / x)),
        Op("matrix_inverse_tril_ldj", cat, _ldj(tfb.MatrixInverseTriL(), 2), _lower(920, 3)),
    ]


OPS: list[Op] = (_math_ops() + _special_ops() + _linalg_ops() + _nn_ops() + _image_ops() + _signal_ops()
                 + _indexing_ops() + _control_flow_ops() + _tfp_special_ops() + _distribution_ops() + _bijector_ops())
BY_NAME = {op.name: op for op in OPS}

# A quick subset across every category (the test suite runs these).
QUICK = ("sin", "log1p", "erfinv", "pow", "reduce_logsumexp", "cumprod", "lgamma", "igamma_x", "bessel_k1e",
         "inv", "cholesky_spd", "eigvalsh", "softmax", "conv2d", "max_pool_distinct", "layer_norm",
         "softmax_cross_entropy_unnormalized_labels", "resize_bilinear_up", "rgb_to_hsv", "rfft_parts", "gather", "scatter_nd_duplicates", "sort_values",
         "while_loop_accumulate", "scan", "betainc_a_b", "owens_t", "lbeta", "gamma_log_prob", "mvn_tril_log_prob",
         "sinh_arcsinh_ldj", "fill_scale_tril_ldj")


# ----------------------------------------------------------------------------- running the audit


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:300] if text else ''}"


def compare_reference(op: Op, inputs, report, dtype_name: str) -> dict:
    """Reference Jacobians vs fastcheck's autodiff and numerical ones, element-wise ``atol + rtol * |ref|``."""
    atol, rtol = REFERENCE_TOLERANCES[dtype_name]
    arrays = [np.asarray(x.numpy(), dtype=np.float64) for x in inputs]
    worst = {"analytical": 0.0, "numerical": 0.0}
    for i, ref in enumerate(op.reference(*arrays)):
        if ref is None:
            continue
        pair = report.pairs[i]
        ref = np.asarray(ref, dtype=np.float64).reshape(pair.numerical.shape)
        for side in worst:
            other = np.asarray(getattr(pair, side), dtype=np.float64)
            with np.errstate(invalid="ignore"):
                ratio = np.abs(other - ref) / (atol + rtol * np.abs(ref))
            ratio = np.nan_to_num(ratio, nan=np.inf)
            worst[side] = max(worst[side], float(np.max(ratio, initial=0.0)))
    return {"analytical_agrees": worst["analytical"] <= 1.0, "numerical_agrees": worst["numerical"] <= 1.0,
            "worst_ratio": worst}


def _compute_gradient_errors(op: Op, inputs, report) -> dict:
    """tf.test.compute_gradient's own max |theoretical - numerical|, and its numerical side vs fastcheck's."""
    theoretical, numerical = tf.test.compute_gradient(op.f, list(inputs))
    own = max((float(np.max(np.abs(np.asarray(t, np.float64) - np.asarray(n, np.float64)), initial=0.0))
               for t, n in zip(theoretical, numerical)), default=0.0)
    versus = max((float(np.max(np.abs(np.asarray(n, np.float64) - p.numerical), initial=0.0))
                  for n, p in zip(numerical, report.pairs)), default=0.0)
    return {"max_abs_error": own, "numerical_vs_fastcheck": versus}


def audit_op(op: Op, dtype_name: str, compute_gradient: bool = False, **options) -> dict:
    """One row: fastcheck's verdict on ``op`` in one dtype, its time, and the reference's opinion."""
    import fastcheck

    row = {"name": op.name, "category": op.category, "dtype": dtype_name, "known_bug": op.known_bug,
           "verdict": None, "seconds": None, "error": None, "report": None, "warnings": [], "reference": None,
           "compute_gradient": None}
    inputs = op.make_inputs(tf.as_dtype(dtype_name))
    start = time.perf_counter()
    try:
        report = fastcheck.check_gradients(op.f, inputs, **options)
    except Exception as error:  # noqa: BLE001 -- recorded: a crash is a result of the audit
        row["seconds"] = time.perf_counter() - start
        row["error"] = _first_line(error)
        row["outcome"] = "crash"
        return row
    row["seconds"] = time.perf_counter() - start
    row["verdict"] = report.verdict
    row["max_abs_error"] = float(report.max_abs_error)
    row["report"] = str(report)
    # lines the report flags without failing (e.g. a forward-mode JVP that disagrees while reverse mode passes)
    row["warnings"] = [line.strip() for line in row["report"].splitlines() if line.strip().startswith("WARNING")]
    if op.reference is not None and options.get("mode") != "fast":  # fast mode holds projections, not Jacobians
        try:
            row["reference"] = compare_reference(op, inputs, report, dtype_name)
        except Exception as error:  # noqa: BLE001 -- a broken reference is reported, not fatal
            row["reference"] = {"error": _first_line(error)}
    if compute_gradient:
        try:
            row["compute_gradient"] = _compute_gradient_errors(op, inputs, report)
        except Exception as error:  # noqa: BLE001
            row["compute_gradient"] = {"error": _first_line(error)}
    row["outcome"] = _outcome(op, report.verdict)
    return row


def _outcome(op: Op, verdict: str) -> str:
    if op.known_bug:
        return "known bug caught" if verdict == "fail" else "known bug missed"
    return "pass" if verdict == "pass" else f"false alarm ({verdict})"


def run_audit(entries=None, dtypes=BOTH, compute_gradient: bool = False, log=None, **options) -> list[dict]:
    """Audit rows for every op in ``entries`` (default ``OPS``) and every dtype it supports among ``dtypes``.

    Each row holds name, category, dtype, verdict (None on a crash), seconds, error
    (the exception's first line), outcome (pass, false alarm (fail|undecidable),
    crash, known bug caught|missed), the reference comparison (or None) and, with
    ``compute_gradient=True``, tf.test.compute_gradient's errors.  ``options`` go
    to ``fastcheck.check_gradients``.
    """
    rows = []
    for op in OPS if entries is None else entries:
        for dtype_name in dtypes:
            if dtype_name not in op.dtypes:
                continue
            row = audit_op(op, dtype_name, compute_gradient=compute_gradient, **options)
            rows.append(row)
            if log is not None:
                log(f"{op.name:<34} {dtype_name:<8} {row['outcome']:<26} {row['seconds']:6.2f} s"
                    f"{'  ' + _reference_text(row) if row['reference'] else ''}"
                    f"{'  ' + row['error'] if row['error'] else ''}")
    return rows


def _reference_text(row: dict) -> str:
    ref = row["reference"]
    if not ref:
        return "n/a"
    if "error" in ref:
        return f"reference error: {ref['error']}"
    if ref["analytical_agrees"] and ref["numerical_agrees"]:
        return "agrees"
    sides = [side for side in ("analytical", "numerical") if not ref[f"{side}_agrees"]]
    return "DISAGREES with " + " and ".join(f"{side} ({ref['worst_ratio'][side]:.3g}x tol)" for side in sides)


def _agrees(ref: dict) -> bool:
    return "error" not in ref and ref["analytical_agrees"] and ref["numerical_agrees"]


def _reference_confirms_bug(ref: dict) -> bool:
    return "error" not in ref and ref["numerical_agrees"] and not ref["analytical_agrees"]


def summarise(rows: list[dict], dtypes) -> dict:
    """Counts per dtype: entries, passes, crashes, false alarms, fails, undecidable, known bugs, reference disagreements."""
    summary = {}
    for dtype_name in dtypes:
        mine = [r for r in rows if r["dtype"] == dtype_name]
        if not mine:
            continue
        summary[dtype_name] = {
            "entries": len(mine),
            "pass": sum(r["outcome"] == "pass" for r in mine),
            "crashes": sum(r["outcome"] == "crash" for r in mine),
            "false_alarms": sum(r["outcome"].startswith("false alarm") for r in mine),
            "fails": sum(r["verdict"] == "fail" for r in mine),
            "undecidable": sum(r["verdict"] == "undecidable" for r in mine),
            "known_bugs_caught": sum(r["outcome"] == "known bug caught" for r in mine),
            "known_bugs_missed": sum(r["outcome"] == "known bug missed" for r in mine),
            # the reference should disagree with autodiff on a known bug, nowhere else
            "reference_disagreements": sum(bool(r["reference"]) and not r["known_bug"] and not _agrees(r["reference"])
                                           for r in mine),
            "known_bugs_confirmed_by_reference": sum(bool(r["reference"]) and bool(r["known_bug"])
                                                     and _reference_confirms_bug(r["reference"]) for r in mine),
            "with_warnings": sum(bool(r["warnings"]) for r in mine),
            "seconds": sum(r["seconds"] or 0.0 for r in mine),
        }
    return summary


def summary_markdown(summary: dict) -> str:
    lines = ["| dtype | entries | pass | crashes | false alarms | fails | undecidable | known bugs caught | "
             "known bugs missed | known bugs confirmed by reference | reference disagreements elsewhere | "
             "reports with warnings | fastcheck seconds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for dtype_name, s in summary.items():
        lines.append(f"| {dtype_name} | {s['entries']} | {s['pass']} | {s['crashes']} | {s['false_alarms']} | "
                     f"{s['fails']} | {s['undecidable']} | {s['known_bugs_caught']} | {s['known_bugs_missed']} | "
                     f"{s['known_bugs_confirmed_by_reference']} | {s['reference_disagreements']} | "
                     f"{s['with_warnings']} | {s['seconds']:.1f} |")
    return "\n".join(lines)


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(record: dict) -> str:
    versions = record["versions"]
    rows = record["rows"]
    lines = [
        "# fastcheck audit of TensorFlow's and TFP's own gradients",
        "",
        f"{record['timestamp']} · {len(rows)} op-dtype checks ({len(record['op_names'])} ops) · "
        f"TF {versions['tensorflow']}, TFP {versions['tensorflow_probability']}, Python {versions['python']} · "
        f"total wall time {record['wall_seconds']:.0f} s",
        "",
        "Each op is checked with `fastcheck.check_gradients(op.f, op.make_inputs(dtype))` ("
        + ("default options" if record["settings"].get("mode", "auto") == "auto" else f"mode={record['settings']['mode']!r}")
        + ") at points "
        "inside its domain, away from kinks and ties, so every gradient is expected to pass; a non-pass is a false "
        "alarm unless the op carries a `known_bug`. `reference`: an independent closed-form / scipy Jacobian "
        f"compared with fastcheck's autodiff and numerical Jacobians (atol, rtol: {REFERENCE_TOLERANCES}). "
        "`compute_gradient`: tf.test.compute_gradient's own max |theoretical - numerical| and the max |difference| "
        "between its numerical Jacobian and fastcheck's.",
        "",
        "## Summary",
        "",
        summary_markdown(record["summary"]),
        "",
        "## Entries that did not pass",
        "",
    ]
    bad = [r for r in rows if r["outcome"] != "pass"]
    if not bad:
        lines.append("none")
    for r in bad:
        detail = r["error"] or "\n".join((r["report"] or "").splitlines()[:6])
        lines += [f"**{r['name']}** ({r['dtype']}, {r['category']}): {r['outcome']}"
                  + (f" -- known bug: {r['known_bug']}" if r["known_bug"] else ""), "", "```", detail, "```", ""]
    warned = [r for r in rows if r["warnings"]]
    lines += ["## Reports with warnings (verdict unaffected)", ""]
    lines += [f"- **{r['name']}** ({r['dtype']}, {r['outcome']}): {_cell(w[:400])}" for r in warned for w in r["warnings"]]
    lines += ["" if warned else "none", ""]
    lines += ["## Every entry", "",
              "| op | category | dtype | outcome | verdict | seconds | reference | compute_gradient | error |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cg = r["compute_gradient"]
        cg_text = ("" if cg is None else cg.get("error") or
                   f"{cg['max_abs_error']:.2g} (vs fastcheck numerical {cg['numerical_vs_fastcheck']:.2g})")
        outcome = r["outcome"] if r["outcome"] == "pass" else r["outcome"].upper()
        lines.append(f"| {r['name']} | {r['category']} | {r['dtype']} | {outcome} | {r['verdict'] or ''} | "
                     f"{r['seconds']:.2f} | {_cell(_reference_text(r))} | {_cell(cg_text)} | {_cell(r['error'] or '')} |")
    return "\n".join(lines) + "\n"


def _versions() -> dict:
    import importlib.metadata

    from benchmarks.verdicts import _versions as corpus_versions

    return {**corpus_versions(), "scipy": importlib.metadata.version("scipy")}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.op_audit",
        description="fastcheck (default options) on TensorFlow's and TFP's own registered gradients, per dtype.")
    parser.add_argument("--quick", action="store_true", help=f"only the quick subset ({len(QUICK)} ops)")
    parser.add_argument("--only", default=None, metavar="NAME[,NAME]", help="only these ops")
    parser.add_argument("--dtypes", default=",".join(BOTH), metavar="DTYPE[,DTYPE]",
                        help="only these dtypes (default float32,float64; an op runs only in its own dtypes)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results folder (default {RESULTS})")
    parser.add_argument("--mode", default="auto", choices=("auto", "full", "fast"),
                        help="check_gradients' mode (default auto; another writes op_audit-MODE.md/.json)")
    parser.add_argument("--no-compute-gradient", action="store_true",
                        help="skip the tf.test.compute_gradient comparison")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    if not dtypes or any(d not in BOTH for d in dtypes):
        print(f"--dtypes: choose among {', '.join(BOTH)}", file=sys.stderr)
        return 2
    names = list(QUICK) if args.quick else [op.name for op in OPS]
    if args.only:
        names = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = [name for name in names if name not in BY_NAME]
        if unknown:
            print(f"unknown op(s) {', '.join(unknown)}", file=sys.stderr)
            return 2
    ops = [BY_NAME[name] for name in names]

    started = time.perf_counter()
    stamp = _dt.datetime.now(_dt.timezone.utc)
    logger, level = tf.get_logger(), tf.get_logger().level
    logger.setLevel("ERROR")
    try:
        options = {} if args.mode == "auto" else {"mode": args.mode}
        rows = run_audit(ops, dtypes, compute_gradient=not args.no_compute_gradient,
                         log=lambda line: print(line, flush=True), **options)
    finally:
        logger.setLevel(level)
    summary = summarise(rows, dtypes)
    record = {
        "schema": 1,
        "timestamp": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": ["python", "-m", "benchmarks.op_audit", *(argv or [])],
        "settings": {"quick": args.quick, "only": args.only, "dtypes": list(dtypes), "mode": args.mode,
                     "compute_gradient": not args.no_compute_gradient},
        "versions": _versions(),
        "op_names": names,
        "summary": summary,
        "rows": rows,
        "wall_seconds": time.perf_counter() - started,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    stem = "op_audit" if args.mode == "auto" else f"op_audit-{args.mode}"
    for name, text in ((f"{stem}.json", json.dumps(record, indent=1)), (f"{stem}.md", markdown(record))):
        path = args.out / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
        written.append(path)
    print()
    print(summary_markdown(summary))
    print("wrote " + ", ".join(str(p) for p in written))
    print(f"total wall time {record['wall_seconds']:.1f} s")
    bad = [r for r in rows if r["outcome"] not in ("pass", "known bug caught")]
    for r in bad:
        print(f"{r['outcome'].upper()}: {r['name']} ({r['dtype']}): {r['error'] or (r['report'] or '').splitlines()[0]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
