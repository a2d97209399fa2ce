"""Verdict corpus: functions whose TensorFlow gradient is known to be right or deliberately wrong.

Each ``Case`` is data: ``f`` is called as ``f(*make_inputs(dtype))`` and returns one
tensor (so that ``tf.test.compute_gradient(f, inputs)`` can run it too).  ``correct``
says whether the gradient TF computes for ``f`` at those inputs is right.  Wrong
gradients are planted with ``tf.custom_gradient`` (the forward is always the true
function), except where the defect is a plain-TF mistake (``tf.stop_gradient``,
the ``tf.where`` NaN trap).  Every planted defect is real at the given inputs and
larger than the floating-point noise of each dtype listed in ``dtypes``.

Constants inside ``f`` take the dtype of its inputs, so ``f`` also runs when a
checker re-evaluates a float32 case in float64.  Inputs are seeded and small.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

tfd = tfp.distributions

BOTH = ("float32", "float64")
SQRT2 = float(np.sqrt(2.0))
TWO_OVER_SQRT_PI = float(2.0 / np.sqrt(np.pi))


@dataclasses.dataclass(frozen=True)
class Case:
    name: str  # unique, snake_case
    f: Callable  # called as f(*inputs); returns a tensor
    make_inputs: Callable  # make_inputs(dtype: tf.DType) -> list of tensors, deterministic
    correct: bool  # True: TF's gradient is right; False: deliberately wrong gradient
    category: str  # kind of function (correct) or kind of defect (wrong)
    description: str = ""
    dtypes: tuple = BOTH
    # dtypes in which no step resolves a 1% error of the correct gradient: the verdict is undecidable
    # with a coarse pair, not a pass (see docs/rule.md, "Resolution")
    unresolvable: tuple = ()


# ----------------------------------------------------------------------------- helpers


def _t(values, dtype) -> tf.Tensor:
    return tf.constant(np.asarray(values, dtype=np.float64), dtype=dtype)


def _c(values, like) -> tf.Tensor:
    """A constant with the dtype of ``like`` (so f runs in float32 and float64)."""
    return tf.constant(np.asarray(values, dtype=np.float64), dtype=like.dtype)


def _fixed(*arrays):
    """make_inputs for fixed values: one array per input."""
    return lambda dtype: [_t(a, dtype) for a in arrays]


def _normal(seed, *shapes, scale=1.0, shift=0.0):
    """make_inputs drawing each input from N(shift, scale^2) with a fixed seed."""

    def make(dtype):
        rng = np.random.default_rng(seed)
        return [_t(shift + scale * rng.normal(size=shape), dtype) for shape in shapes]

    return make


def _uniform(seed, low, high, *shapes):
    def make(dtype):
        rng = np.random.default_rng(seed)
        return [_t(rng.uniform(low, high, size=shape), dtype) for shape in shapes]

    return make


def _well_conditioned(seed, n, extra_shapes=()):
    """A random n x n matrix plus 3 I (condition number ~3), then more N(0, 1) inputs."""

    def make(dtype):
        rng = np.random.default_rng(seed)
        a = rng.normal(size=(n, n)) * 0.5 + 3 * np.eye(n)
        return [_t(a, dtype)] + [_t(rng.normal(size=s), dtype) for s in extra_shapes]

    return make


# ------------------------------------------------------------- correct: tfp custom grads


def tfp_bessel_ive_z(z):
    v = _c([0.5, 1.0, 2.5, 4.0, 0.0], z)
    return tfp.math.bessel_ive(v, z)


_NORMAL_X = [-1.3, 0.2, 0.9, 2.4]
_GAMMA_X = [0.4, 1.1, 2.5, 4.2]
_STUDENT_X = [-2.0, -0.3, 0.8, 3.1]


def tfp_normal_log_prob(loc, scale):
    return tfd.Normal(loc, scale).log_prob(_c(_NORMAL_X, loc))


def tfp_gamma_log_prob(concentration, rate):
    return tfd.Gamma(concentration, rate).log_prob(_c(_GAMMA_X, concentration))


def tfp_student_t_log_prob(df, loc, scale):
    return tfd.StudentT(df, loc, scale).log_prob(_c(_STUDENT_X, df))


def tfp_beta_log_prob(a, b):
    return tfd.Beta(a, b).log_prob(_c([0.15, 0.4, 0.7, 0.9], a))


# ------------------------------------------------------------------ correct: networks


def conv2d(image, kernel):
    return tf.nn.conv2d(tf.tanh(image), kernel, strides=1, padding="SAME")


def lstm_cell_step(x, h, c, w, b):
    """One LSTM step written with tf ops; returns concat(h', c')."""
    z = tf.matmul(tf.concat([x, h], axis=-1), w) + b
    i, f, g, o = tf.split(z, 4, axis=-1)
    c_new = tf.sigmoid(f + 1.0) * c + tf.sigmoid(i) * tf.tanh(g)
    h_new = tf.sigmoid(o) * tf.tanh(c_new)
    return tf.concat([h_new, c_new], axis=-1)


def attention(q, k, v):
    d = tf.cast(tf.shape(q)[-1], q.dtype)
    scores = tf.matmul(q, k, transpose_b=True) / tf.sqrt(d)
    return tf.matmul(tf.nn.softmax(scores, axis=-1), v)


def layer_norm(x, gamma, beta):
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-5) * gamma + beta


def softmax_cross_entropy(logits, labels):
    return tf.nn.softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def _ce_inputs(dtype):
    rng = np.random.default_rng(15)
    logits = rng.normal(size=(3, 5))
    raw = rng.uniform(0.1, 1.0, size=(3, 5))
    return [_t(logits, dtype), _t(raw / raw.sum(axis=-1, keepdims=True), dtype)]


def mlp(x, w1, b1, w2):
    return tf.matmul(tf.tanh(tf.matmul(x, w1) + b1), w2)


def causal_attention(q, k, v):
    n = q.shape[0]
    mask = _c(np.triu(np.full((n, n), -1e9), k=1), q)
    scores = tf.matmul(q, k, transpose_b=True) / tf.sqrt(tf.cast(tf.shape(q)[-1], q.dtype)) + mask
    return tf.matmul(tf.nn.softmax(scores, axis=-1), v)


# ---------------------------------------------------------------- correct: hard points


def _max_pool_ties(dtype):
    """1x4x4x1 image: each 2x2 window holds base + {0, 1, 2, 3} * 1e-3 in a shuffled order."""
    rng = np.random.default_rng(23)
    img = np.zeros((4, 4))
    for i in range(0, 4, 2):
        for j in range(0, 4, 2):
            img[i : i + 2, j : j + 2] = (rng.uniform(-1, 1) + 1e-3 * rng.permutation(4)).reshape(2, 2)
    return [_t(img.reshape(1, 4, 4, 1), dtype)]


def _near_kink(dtype):
    return [_t([-9e-4, -4e-4, -1e-4, -3e-5, 2e-5, 8e-5, 3e-4, 7e-4, 1e-3], dtype)]


SHARP = 1e-5


def sharp_tanh(x):
    return tf.tanh(x / SHARP)


# ---------------------------------------------------------------- correct: elementwise


def gelu_erf(x):
    return 0.5 * x * (1.0 + tf.math.erf(x / SQRT2))


def cholesky_spd(a):
    n = a.shape[0]
    return tf.linalg.cholesky(tf.matmul(a, a, transpose_b=True) + 2.0 * tf.eye(n, dtype=a.dtype))


def slogdet_spd(a):
    n = a.shape[0]
    return tf.linalg.slogdet(tf.matmul(a, a, transpose_b=True) + tf.eye(n, dtype=a.dtype))[1]


def eigvalsh_sym(a):
    spread = tf.linalg.diag(_c([0.0, 2.0, 4.0, 6.0], a))
    return tf.linalg.eigvalsh(0.5 * (a + tf.transpose(a)) + spread)


CORRECT_CASES = [
    # --- tensorflow_probability functions with hand-written custom gradients
    Case("tfp_lbeta", tfp.math.lbeta, _fixed([0.5, 1.3, 2.7, 4.1], [3.2, 0.8, 1.9, 5.0]), True, "tfp",
         "log Beta function, custom gradient w.r.t. both arguments"),
    Case("tfp_log_gamma_difference", tfp.math.log_gamma_difference,
         _fixed([0.5, 1.5, 2.5, 3.0], [2.0, 4.5, 7.0, 10.0]), True, "tfp", "lgamma(y) - lgamma(x + y), custom gradient"),
    Case("tfp_owens_t", tfp.math.owens_t, _fixed([-1.5, -0.3, 0.6, 2.0], [0.4, -1.2, 2.5, 0.9]), True, "tfp",
         "Owen's T function w.r.t. h and a"),
    Case("tfp_lambertw", tfp.math.lambertw, _fixed([-0.3, -0.1, 0.5, 1.7, 4.0, 9.0]), True, "tfp",
         "Lambert W (principal branch) inside its domain (> -1/e)"),
    Case("tfp_dawsn", tfp.math.dawsn, _fixed([-2.5, -0.7, 0.2, 1.1, 3.4]), True, "tfp", "Dawson's integral"),
    Case("tfp_betainc", tfp.math.betainc,
         _fixed([0.8, 1.5, 3.0, 4.5], [2.0, 0.9, 4.0, 1.3], [0.2, 0.45, 0.6, 0.85]), True, "tfp",
         "regularized incomplete beta w.r.t. a, b and x"),
    Case("tfp_igammainv", tfp.math.igammainv, _fixed([0.7, 1.5, 3.0, 6.0], [0.15, 0.4, 0.65, 0.9]), True, "tfp",
         "inverse of the regularized lower incomplete gamma w.r.t. a and p"),
    Case("tfp_bessel_ive_z", tfp_bessel_ive_z, _fixed([0.3, 1.2, 3.5, 7.0, 2.0]), True, "tfp",
         "exponentially scaled Bessel I_v(z) w.r.t. z (v fixed)"),
    Case("tfp_normal_log_prob", tfp_normal_log_prob, _fixed([0.1, -0.5, 1.0, 2.0], [0.7, 1.3, 0.5, 2.2]), True,
         "tfp", "Normal(loc, scale).log_prob w.r.t. loc and scale"),
    Case("tfp_gamma_log_prob", tfp_gamma_log_prob, _fixed([0.8, 1.5, 2.5, 4.0], [0.5, 1.2, 2.0, 0.9]), True, "tfp",
         "Gamma(concentration, rate).log_prob w.r.t. both parameters"),
    Case("tfp_student_t_log_prob", tfp_student_t_log_prob,
         _fixed([1.5, 3.0, 5.0, 12.0], [0.0, -0.4, 0.3, 1.0], [0.8, 1.1, 2.0, 0.6]), True, "tfp",
         "StudentT(df, loc, scale).log_prob w.r.t. all parameters"),
    Case("tfp_beta_log_prob", tfp_beta_log_prob, _fixed([0.7, 1.8, 2.5, 4.0], [1.2, 0.9, 3.0, 2.2]), True, "tfp",
         "Beta(a, b).log_prob w.r.t. both concentrations"),
    # --- network pieces
    Case("conv2d", conv2d, _normal(11, (1, 4, 4, 2), (3, 3, 2, 2), scale=0.7), True, "network",
         "conv2d SAME of tanh(image), w.r.t. image and kernel"),
    Case("lstm_cell_step", lstm_cell_step, _normal(12, (1, 2), (1, 3), (1, 3), (5, 12), (12,), scale=0.6), True,
         "network", "one LSTM cell step written with tf ops, w.r.t. x, h, c, kernel and bias"),
    Case("scaled_dot_product_attention", attention, _normal(13, (3, 4), (3, 4), (3, 4)), True, "network",
         "softmax(q k^T / sqrt(d)) v w.r.t. q, k, v"),
    Case("causal_attention", causal_attention, _normal(14, (4, 3), (4, 3), (4, 3)), True, "network",
         "attention with an additive -1e9 causal mask"),
    Case("layer_norm", layer_norm, _normal(16, (2, 5), (5,), (5,)), True, "network",
         "layer normalization w.r.t. x, gamma and beta"),
    Case("softmax_cross_entropy", softmax_cross_entropy, _ce_inputs, True, "network",
         "softmax cross-entropy w.r.t. logits and (normalized) soft labels"),
    Case("mlp_tanh", mlp, _normal(17, (2, 3), (3, 4), (4,), (4, 2), scale=0.8), True, "network",
         "two-layer tanh MLP w.r.t. input, weights and bias"),
    # --- hard points
    Case("log_near_1e_4", tf.math.log,
         _fixed([1e-4, 1.5e-4, 2e-4, 3e-4, 5e-4, 1e-3]), True, "hard-point",
         "log(x) at x ~ 1e-4 (large curvature relative to the step)"),
    Case("relu_near_kink", tf.nn.relu, _near_kink, True, "hard-point", "relu at points 2e-5..1e-3 from the kink"),
    Case("abs_near_kink", lambda x: tf.abs(x) * (1.0 + x), _near_kink, True, "hard-point",
         "|x| (1 + x) at points 2e-5..1e-3 from the kink"),
    Case("max_pool_near_ties", lambda x: tf.nn.max_pool2d(x, ksize=2, strides=2, padding="VALID"), _max_pool_ties,
         True, "hard-point", "2x2 max-pooling with window values 1e-3 apart"),
    Case("large_magnitude_xlogx", lambda x: x * tf.math.log(x) - tf.sqrt(x),
         _uniform(18, 5e3, 2e4, (6,)), True, "hard-point", "x log x - sqrt x at x ~ 1e4"),
    Case("large_magnitude_sin", tf.sin, _uniform(19, 5e3, 2e4, (6,)), True, "hard-point",
         "sin(x) at x ~ 1e4 (step ~0.06, large truncation error)"),
    Case("sharp_tanh_scale_1e_5", sharp_tanh, _fixed([-2e-5, -1e-5, -5e-6, 4e-6, 1e-5, 1.5e-5, 3e-5]), True,
         "hard-point", "tanh(x / 1e-5) at x ~ 1e-5"),
    Case("saturated_sigmoid", tf.sigmoid, _fixed([-16.0, -15.0, -14.0, 14.0, 15.0, 16.0]), True, "hard-point",
         "sigmoid at |x| ~ 15 (derivative ~3e-7)"),
    Case("saturated_log_sigmoid", tf.math.log_sigmoid, _fixed([-15.0, -14.5, 14.5, 15.0]), True, "hard-point",
         "log sigmoid at |x| ~ 15"),
    Case("long_reduction_sum", lambda x: tf.reduce_sum(x * tf.tanh(x)), _normal(20, (2000,)), True, "hard-point",
         "sum over 2000 elements of x tanh x"),
    Case("long_reduction_norm", lambda x: tf.norm(x), _normal(21, (2000,), shift=0.3), True, "hard-point",
         "Euclidean norm of 2000 elements"),
    Case("sqrt_near_1e_4", tf.sqrt, _fixed([1e-4, 2e-4, 4e-4, 9e-4]), True, "hard-point", "sqrt at x ~ 1e-4"),
    # --- ordinary elementwise functions
    Case("sin_times_gaussian", lambda x: tf.sin(3.0 * x) * tf.exp(-x * x), _normal(30, (8,)), True, "elementwise",
         "sin(3x) exp(-x^2)"),
    Case("atan2", tf.math.atan2, _normal(31, (6,), (6,)), True, "elementwise", "atan2(y, x) w.r.t. both"),
    Case("softplus", tf.math.softplus, _fixed(np.linspace(-6, 6, 9)), True, "elementwise", "softplus"),
    Case("erf", tf.math.erf, _fixed(np.linspace(-2, 2, 9)), True, "elementwise", "erf"),
    Case("gelu_erf", gelu_erf, _fixed(np.linspace(-3, 3, 9)), True, "elementwise", "exact (erf) GELU"),
    Case("pow_two_inputs", tf.pow, _fixed([0.5, 1.2, 2.0, 3.1], [-1.5, 0.5, 2.3, 1.1]), True, "elementwise",
         "x ** y w.r.t. base and exponent"),
    Case("lgamma_plus_digamma", lambda x: tf.math.lgamma(x) + tf.math.digamma(x), _fixed([0.3, 0.9, 1.7, 4.2, 9.0]),
         True, "elementwise", "lgamma(x) + digamma(x)"),
    Case("cumprod", tf.math.cumprod, _uniform(32, 0.5, 1.5, (6,)), True, "elementwise", "cumulative product"),
    Case("logsumexp", lambda x: tf.reduce_logsumexp(x, axis=-1), _normal(33, (3, 5), scale=2.0), True,
         "elementwise", "row-wise logsumexp"),
    Case("l2_normalize", lambda x: tf.math.l2_normalize(x, axis=-1), _normal(34, (2, 4)), True, "elementwise",
         "row-wise L2 normalization"),
    Case("sort_distinct", lambda x: tf.sort(x) * _c(np.arange(1.0, 8.0), x), _normal(35, (7,)), True,
         "elementwise", "weighted sort of distinct values"),
    # --- linear algebra
    Case("matmul", tf.matmul, _normal(40, (3, 4), (4, 2)), True, "linalg", "matrix product w.r.t. both"),
    Case("matrix_inverse", tf.linalg.inv, _well_conditioned(41, 4), True, "linalg", "inverse of a 4x4 matrix"),
    Case("cholesky_spd", cholesky_spd, _normal(42, (3, 3)), True, "linalg", "cholesky(a a^T + 2I)"),
    Case("slogdet_spd", slogdet_spd, _normal(43, (4, 4)), True, "linalg", "log|det(a a^T + I)|"),
    Case("linalg_solve", tf.linalg.solve, _well_conditioned(44, 4, [(4, 2)]), True, "linalg",
         "solve(A, B) w.r.t. A and B"),
    Case("eigvalsh", eigvalsh_sym, _normal(45, (4, 4), scale=0.5), True, "linalg",
         "eigenvalues of a symmetric matrix with separated spectrum"),
    Case("einsum_bilinear", lambda x, w, y: tf.einsum("i,ij,j->", x, w, y), _normal(46, (3,), (3, 4), (4,)), True,
         "linalg", "bilinear form x^T W y"),
]


# ------------------------------------------------------------------- wrong: planted defects


def _custom1(forward, backward):
    """One-input function with the true forward and a planted backward(x, upstream)."""

    @tf.custom_gradient
    def f(x):
        return forward(x), lambda g: backward(x, g)

    return f


def _custom2(forward, backward):
    """Two-input function; backward(x, y, upstream) -> (gx, gy)."""

    @tf.custom_gradient
    def f(x, y):
        return forward(x, y), lambda g: backward(x, y, g)

    return f


def _sigmoid_sign(x, g):
    s = tf.sigmoid(x)
    return g * s * (s - 1.0)


def _erf_truncated(x, g):
    return g * 1.128 * tf.exp(-x * x)


def _exp2_truncated(x, g):
    return g * 0.6931 * tf.pow(2.0 * tf.ones_like(x), x)


def _gelu_tanh_derivative(x, g):
    c = float(np.sqrt(2 / np.pi))
    t = tf.tanh(c * (x + 0.044715 * x**3))
    return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x))


def _softmax_wrong_axis(x, g):
    s = tf.nn.softmax(x, axis=-1)
    return s * (g - tf.reduce_sum(g * s, axis=0, keepdims=True))


def _bias_wrong_axis(x, b, g):
    return g, tf.reduce_sum(g, axis=1)


def _matmul_transposed(a, b, g):
    return tf.matmul(g, b), tf.matmul(a, g, transpose_a=True)


_A4 = np.random.default_rng(50).normal(size=(4, 4))


def _matvec_forward(x):
    return tf.linalg.matvec(_c(_A4, x), x)


def _matvec_transposed(x, g):
    return tf.linalg.matvec(_c(_A4, x), g)


def _layer_norm_forward(x):
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-5)


def _layer_norm_no_centering(x, g):
    _, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return g * tf.math.rsqrt(var + 1e-5)


_ROW_WEIGHTS = np.linspace(0.5, 1.5, 50)


def _one_wrong_element_forward(x):
    return tf.reduce_sum(tf.sin(x) * _c(_ROW_WEIGHTS, x), axis=1)


def _one_wrong_element_backward(x, g):
    true = g[:, None] * tf.cos(x) * _c(_ROW_WEIGHTS, x)
    mask = _c(np.eye(50)[17][:, None] * np.eye(50)[31][None, :], x)  # element (17, 31)
    return true * (1.0 + 0.01 * mask)


def _long_sum_off_by_one(x, g):
    keep = _c(np.r_[np.ones(1999), 0.0], x)
    return g * (tf.tanh(x) + x * (1.0 - tf.tanh(x) ** 2)) * keep


def _sigmoid_clipped(x, g):
    s = tf.sigmoid(x)
    return g * tf.where(tf.abs(x) > 6.0, tf.zeros_like(x), s * (1.0 - s))


def _tanh_clipped(x, g):
    return g * tf.where(tf.abs(x) > 3.0, tf.zeros_like(x), 1.0 - tf.tanh(x) ** 2)


def _lbeta_wrong_b(a, b, g):
    return (g * (tf.math.digamma(a) - tf.math.digamma(a + b)), g * (tf.math.digamma(b) + tf.math.digamma(a + b)))


def _dense_dropped_w(x, w, g):
    y = tf.tanh(tf.linalg.matvec(w, x))
    local = g * (1.0 - y * y)
    return tf.linalg.matvec(w, local, transpose_a=True), tf.zeros_like(w)


def _dense_bias_forward(x, w, b):
    return tf.matmul(x, w) + b


@tf.custom_gradient
def dense_dropped_bias(x, w, b):
    def grad(g):
        return tf.matmul(g, w, transpose_b=True), tf.matmul(x, g, transpose_a=True), tf.zeros_like(b)

    return _dense_bias_forward(x, w, b), grad


def _relu_kink_misplaced(x, g):
    return g * tf.cast(x > 5e-4, x.dtype)


def _log_with_epsilon(x, g):
    return g / (x + 1e-6)


def _pair_max_forward(x):
    return tf.maximum(x[0::2], x[1::2])


def _pair_max_to_loser(x, g):
    a, b = x[0::2], x[1::2]
    ga = tf.where(a < b, g, tf.zeros_like(g))  # routed to the smaller one
    gb = tf.where(a < b, tf.zeros_like(g), g)
    return tf.reshape(tf.stack([ga, gb], axis=1), [-1])


def _sharp_tanh_no_scale(x, g):
    return g * (1.0 - tf.tanh(x / SHARP) ** 2)


@tf.custom_gradient
def normal_log_prob_bad_scale(loc, scale):
    x = _c(_NORMAL_X, loc)

    def grad(g):
        z = (x - loc) / scale
        return g * z / scale, g * (-1.0 / scale + (x - loc) ** 2 / scale**2)  # should be / scale**3

    return tfd.Normal(loc, scale).log_prob(x), grad


def _cumsum_exclusive(x, g):
    return tf.cumsum(g, reverse=True, exclusive=True)


@tf.custom_gradient
def attention_scores_no_scale(q, k):
    d = tf.cast(tf.shape(q)[-1], q.dtype)

    def grad(g):
        return tf.matmul(g, k), tf.matmul(g, q, transpose_a=True)  # missing / sqrt(d)

    return tf.matmul(q, k, transpose_b=True) / tf.sqrt(d), grad


def attention_missing_scale(q, k, v):
    return tf.matmul(tf.nn.softmax(attention_scores_no_scale(q, k), axis=-1), v)


def _xlogx_missing_one(x, g):
    return g * (tf.math.log(x) - 0.5 / tf.sqrt(x))  # d/dx (x log x - sqrt x) = log x + 1 - 0.5/sqrt x


_CE_LABELS = np.eye(4)[[1, 3, 0]]


def _ce_wrong_axis_forward(logits):
    labels = _c(_CE_LABELS, logits)
    return tf.nn.softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def _ce_wrong_axis(logits, g):
    return g[:, None] * (tf.nn.softmax(logits, axis=0) - _c(_CE_LABELS, logits))


WRONG_CASES = [
    # --- sign
    Case("sign_sin", _custom1(tf.sin, lambda x, g: -g * tf.cos(x)), _fixed([0.2, 0.7, 1.1, 2.0, 2.9]), False, "sign",
         "d sin = -cos"),
    Case("sign_one_term", _custom1(lambda x: x * x - tf.sin(x), lambda x, g: g * (2.0 * x + tf.cos(x))),
         _fixed([-1.0, -0.3, 0.4, 1.2]), False, "sign", "d(x^2 - sin x) = 2x + cos x (wrong sign of one term)"),
    Case("sign_sigmoid", _custom1(tf.sigmoid, _sigmoid_sign), _fixed(np.linspace(-3, 3, 7)), False, "sign",
         "sigmoid derivative s (s - 1)"),
    Case("sign_lbeta_second_input", _custom2(tfp.math.lbeta, _lbeta_wrong_b),
         _fixed([0.5, 1.3, 2.7, 4.1], [3.2, 0.8, 1.9, 5.0]), False, "sign",
         "lbeta with d/db = digamma(b) + digamma(a + b) (sign of one term, second input only)"),
    # --- factor / constant
    Case("factor_square_half", _custom1(tf.square, lambda x, g: g * x), _fixed([-1.5, -0.5, 0.5, 1.0, 2.0]), False,
         "factor", "d x^2 = x"),
    Case("factor_exp_one_percent", _custom1(tf.exp, lambda x, g: 1.01 * g * tf.exp(x)), _normal(51, (6,)), False,
         "factor", "d exp = 1.01 exp"),
    Case("factor_attention_missing_scale", attention_missing_scale, _normal(52, (3, 4), (3, 4), (3, 4)), False,
         "factor", "attention whose score gradient misses the 1/sqrt(d) factor"),
    Case("constant_erf_truncated", _custom1(tf.math.erf, _erf_truncated), _fixed(np.linspace(-1, 1, 7)), False,
         "constant", "erf derivative with 2/sqrt(pi) truncated to 1.128 (3.4e-4 relative)"),
    Case("constant_ln2_truncated", _custom1(lambda x: tf.pow(2.0 * tf.ones_like(x), x), _exp2_truncated),
         _fixed([-1.0, 0.3, 1.5, 2.5]), False, "constant",
         "d 2^x with ln 2 truncated to 0.6931 (6.8e-5 relative: below float32 tolerance)", ("float64",)),
    Case("gelu_tanh_derivative", _custom1(gelu_erf, _gelu_tanh_derivative), _fixed(np.linspace(-3, 3, 13)), False,
         "constant", "erf GELU forward with the tanh-approximation derivative (up to 8.7e-4 off near |x|=2)"),
    # --- axis / transpose
    Case("wrong_axis_softmax", _custom1(lambda x: tf.nn.softmax(x, axis=-1), _softmax_wrong_axis),
         _normal(53, (3, 4)), False, "axis", "softmax VJP reducing over axis 0 instead of -1"),
    Case("wrong_axis_bias_broadcast", _custom2(lambda x, b: x + b, _bias_wrong_axis), _normal(54, (4, 4), (4,)), False,
         "axis", "broadcast bias gradient summed over axis 1 instead of 0"),
    Case("wrong_axis_cross_entropy", _custom1(_ce_wrong_axis_forward, _ce_wrong_axis), _normal(55, (3, 4)), False,
         "axis", "cross-entropy gradient with softmax over the batch axis"),
    Case("transposed_matmul", _custom2(tf.matmul, _matmul_transposed), _normal(56, (4, 4), (4, 4)), False,
         "transpose", "d(a b)/da = g b instead of g b^T"),
    Case("transposed_matvec", _custom1(_matvec_forward, _matvec_transposed), _normal(57, (4,)), False, "transpose",
         "VJP of A x uses A g instead of A^T g"),
    # --- chain rule / missing terms
    Case("chain_rule_sin_square", _custom1(lambda x: tf.sin(x * x), lambda x, g: g * tf.cos(x * x)),
         _fixed([0.3, 0.8, 1.1, 1.6]), False, "chain-rule", "d sin(x^2) = cos(x^2) (missing 2x)"),
    Case("chain_rule_exp_tanh", _custom1(lambda x: tf.exp(tf.tanh(x)), lambda x, g: g * tf.exp(tf.tanh(x))),
         _normal(58, (5,)), False, "chain-rule", "d exp(tanh x) misses (1 - tanh^2 x)"),
    Case("chain_rule_layer_norm", _custom1(_layer_norm_forward, _layer_norm_no_centering), _normal(59, (2, 5)), False,
         "chain-rule", "layer-norm VJP missing the mean and variance terms"),
    Case("chain_rule_sharp_tanh", _custom1(sharp_tanh, _sharp_tanh_no_scale),
         _fixed([-2e-5, -1e-5, 4e-6, 1e-5, 3e-5]), False, "chain-rule", "d tanh(x/1e-5) misses the 1e5 factor"),
    Case("chain_rule_normal_scale", normal_log_prob_bad_scale, _fixed([0.1, -0.5, 1.0, 2.0], [0.7, 1.3, 0.5, 2.2]),
         False, "chain-rule", "Normal log_prob: d/dscale uses (x-loc)^2/scale^2 instead of /scale^3"),
    Case("missing_term_large_magnitude", _custom1(lambda x: x * tf.math.log(x) - tf.sqrt(x), _xlogx_missing_one),
         _uniform(18, 5e3, 2e4, (6,)), False, "chain-rule", "d(x log x - sqrt x) misses the +1, at x ~ 1e4"),
    # --- stop-gradient
    Case("stop_gradient_exp", lambda x: x * tf.stop_gradient(tf.exp(x)), _fixed([-1.0, -0.2, 0.5, 1.3]), False,
         "stop-gradient", "x * stop_gradient(exp(x))"),
    Case("stop_gradient_normalizer", lambda x: x / tf.stop_gradient(tf.norm(x, axis=-1, keepdims=True)),
         _normal(60, (2, 4)), False, "stop-gradient", "L2 normalization with the norm behind stop_gradient"),
    # --- NaN traps
    Case("nan_trap_xlogx", lambda x: tf.where(x > 0, x * tf.math.log(x), tf.zeros_like(x)),
         _fixed([-1.0, -0.3, 0.0, 0.4, 1.2, 2.0]), False, "nan-trap",
         "tf.where(x > 0, x log x, 0) at 0 and negatives: the gradient is NaN there"),
    Case("nan_trap_smooth_bump", lambda x: tf.where(x > 0, tf.exp(-1.0 / x), tf.zeros_like(x)),
         _fixed([-0.3, -0.001, 0.0, 0.5, 1.5]), False, "nan-trap",
         "C-infinity bump tf.where(x > 0, exp(-1/x), 0): true derivative 0 at x <= 0, gradient NaN at -0.001 and 0"),
    # --- single elements
    Case("one_wrong_element_50x50", _custom1(_one_wrong_element_forward, _one_wrong_element_backward),
         _normal(61, (50, 50)), False, "one-element",
         "row sums of w * sin(x) over a 50x50 input; element (17, 31) of the gradient 1% too large"),
    Case("one_element_long_reduction", _custom1(lambda x: tf.reduce_sum(x * tf.tanh(x)), _long_sum_off_by_one),
         _normal(20, (2000,)), False, "one-element", "sum over 2000 elements: last element's gradient dropped"),
    Case("off_by_one_cumsum", _custom1(tf.cumsum, _cumsum_exclusive), _normal(62, (6,)), False, "one-element",
         "cumsum VJP with exclusive=True (every diagonal entry dropped)"),
    # --- saturated region
    Case("saturated_sigmoid_clipped", _custom1(tf.sigmoid, _sigmoid_clipped), _fixed(np.linspace(-9, 9, 10)), False,
         "saturated", "sigmoid gradient set to 0 where |x| > 6 (true value 1.2e-4..2.4e-3 there)"),
    Case("saturated_tanh_clipped", _custom1(tf.tanh, _tanh_clipped), _fixed(np.linspace(-4.5, 4.5, 10)), False,
         "saturated", "tanh gradient set to 0 where |x| > 3 (true value 5e-4..1e-2 there)"),
    # --- second input / dropped variable
    Case("second_input_only", _custom2(lambda x, y: x * tf.exp(y), lambda x, y, g: (g * tf.exp(y), g * tf.exp(y))),
         _fixed([0.5, -1.5, 2.0, 3.0], [0.1, -0.4, 0.7, 1.0]), False, "second-input",
         "d(x e^y)/dy = e^y (missing x); the x gradient is right"),
    Case("dropped_variable_weights", _custom2(lambda x, w: tf.tanh(tf.linalg.matvec(w, x)), _dense_dropped_w),
         _normal(63, (3,), (4, 3)), False, "dropped-variable",
         "tanh(W x) whose gradient returns zeros for W"),
    Case("dropped_variable_bias", dense_dropped_bias, _normal(64, (2, 3), (3, 4), (4,)), False, "dropped-variable",
         "x W + b whose gradient returns zeros for b"),
    # --- hard-point defects
    Case("kink_misplaced_relu", _custom1(tf.nn.relu, _relu_kink_misplaced), _near_kink, False, "kink",
         "relu gradient switching at x = 5e-4 instead of 0 (wrong at 2e-5, 8e-5, 3e-4)"),
    Case("epsilon_in_log_gradient", _custom1(tf.math.log, _log_with_epsilon), _fixed([1e-4, 1.5e-4, 2e-4, 3e-4]),
         False, "constant", "d log x = 1/(x + 1e-6): 1% off at x ~ 1e-4"),
    Case("max_routed_to_loser", _custom1(_pair_max_forward, _pair_max_to_loser),
         _fixed([0.300, 0.301, -0.702, -0.703, 1.500, 1.499, 0.050, 0.051]), False, "routing",
         "pairwise max whose gradient goes to the smaller of two values 1e-3 apart"),
]

CASES: list[Case] = CORRECT_CASES + WRONG_CASES

from benchmarks.corpus_truth import CASES as _TRUTH_CASES  # noqa: E402

CASES += _TRUTH_CASES
