"""Truth cases for the verdict corpus: gradients whose verdict a checker can get wrong by construction.

``benchmarks.corpus`` imports ``CASES`` from here and appends them to its own.  Each class
targets one way a checker can be fooled:

1. ``fanout_*``: a ``tf.custom_gradient`` behind more outputs than inputs (a checker that
   builds the analytical Jacobian in forward mode never sees the custom gradient).
2. ``variable_*``: custom gradients that close over ``tf.Variable`` objects
   (``grad(dy, variables=None)``); only the input is checked, the variables just take part.
3. ``hidden_*``: float32/float64 inputs and outputs with a bfloat16/float16 op inside
   (cast down, op, cast up): correct ones have a right (low-precision) TF gradient, wrong
   ones a gross (factor 2, sign) planted defect.
4. ``large_x_*``: large |x| (cos at 1e4..5e7, exp at 20..60, log at 1e8).
5. ``edge_*``: points just inside a domain edge (log, sqrt, log1p, atanh, acosh, xlogy).
6. ``kink_*``: f' jumps at a point a small distance away, or a kink 1e-9 from the point.
7. ``noisy_*``: correct functions whose output carries rounding noise far above machine
   epsilon (float32 sums with cancellation, float64 computed through float32).

plus ``resize_*`` and ``scatter_nd_*``: ops whose forward-mode autodiff is missing or odd.

Where a dtype cannot represent the float64 point (cos at 5e7 in float32, 1 - 1e-7,
1 + 1e-10, -1 + 1e-9), ``make_inputs`` picks a point as hard as that dtype allows, so a case
runs in both dtypes.  Planted defects are gross (> 10x the dtype's tolerance) at the inputs.
"""

from __future__ import annotations

import sys

if __name__ == "benchmarks.corpus_truth" and "benchmarks.corpus" not in sys.modules:
    # Imported before benchmarks.corpus, whose last line imports this module: let that line do
    # the import (it runs this file again, in full, and that copy is the module importers get).
    del sys.modules[__name__]
    import benchmarks.corpus  # noqa: E402, F401

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.corpus import Case, _c, _custom1, _custom2, _fixed, _normal, _t  # noqa: E402

F32_ONLY = ("float32",)


def _per_dtype(float32_values, float64_values):
    """make_inputs with dtype-dependent points: one list of arrays per dtype."""

    def make(dtype):
        arrays = float64_values if dtype == tf.float64 else float32_values
        return [_t(a, dtype) for a in arrays]

    return make


def _planted(fn, scales):
    """``fn`` with TF's own gradient multiplied by ``scales[i]`` for input ``i``."""

    @tf.custom_gradient
    def f(*xs):
        def grad(upstream):
            with tf.GradientTape() as tape:
                tape.watch(xs)
                y = fn(*xs)
            true = tape.gradient(y, xs, output_gradients=upstream)
            return [s * g for s, g in zip(scales, true)]

        return fn(*xs), grad

    return f


# ----------------------------------------------------- 1. custom gradients behind fan-out


def _x_sin_x(x):
    return x * tf.sin(x)


def _d_x_sin_x(x):
    return tf.sin(x) + x * tf.cos(x)


def _fanout(g):
    """f(x) = [g(x), 2 g(x), g(x)^2]: three times as many outputs as inputs."""

    def f(x):
        y = g(x)
        return tf.concat([y, 2.0 * y, y * y], axis=0)

    return f


_softplus_custom = _custom1(tf.math.softplus, lambda x, g: g * tf.sigmoid(x))


def fanout_custom_softplus(x):
    y = _softplus_custom(x)
    return tf.concat([y, x * y, tf.exp(-y)], axis=0)


@tf.custom_gradient
def _x_exp_x_forward_mode_blind(x):
    """x e^x with the exp behind stop_gradient: forward mode sees e^x, the custom gradient is right."""
    e = tf.exp(x)
    return x * tf.stop_gradient(e), lambda g: g * (1.0 + x) * e


_OUTER = [0.5, -1.0, 1.5, 2.0]


def _fanout_outer(g):
    """f(x, y) = g(x, y) outer c, flattened: 8 outputs from 4 input elements."""

    def f(x, y):
        return tf.reshape(g(x, y)[:, None] * _c(_OUTER, x)[None, :], [-1])

    return f


def _x_exp_y(x, y):
    return x * tf.exp(y)


_FANOUT_X = _fixed([0.4, -1.1, 2.3])
_FANOUT_XY = _fixed([0.6, -1.4], [0.3, -0.5])

# ------------------------------------------------- 2. custom gradients over tf.Variables

_VAR_RNG = np.random.default_rng(70)
_VW = _VAR_RNG.normal(size=(3, 3)) * 0.6
_VB = np.array([0.7, -1.2, 1.9])
_VM = _VAR_RNG.normal(size=(3, 2)) * 0.7
_VS = 1.3
_VARIABLES = {
    dtype: {
        "w": tf.Variable(_VW, dtype=dtype, name=f"truth_w_{dtype.name}"),
        "b": tf.Variable(_VB, dtype=dtype, name=f"truth_b_{dtype.name}"),
        "m": tf.Variable(_VM, dtype=dtype, name=f"truth_m_{dtype.name}"),
        "s": tf.Variable(_VS, dtype=dtype, name=f"truth_s_{dtype.name}"),
    }
    for dtype in (tf.float32, tf.float64)
}


def _variable_grads(variables, grads: dict):
    """Gradients for ``variables`` in their order; ``grads`` maps variable.ref() to its gradient."""
    return [grads.get(v.ref(), tf.zeros_like(v)) for v in variables]


def _variable_layer(defect=None):
    """y = tanh(W x) + b * x with W, b variables; ``defect`` plants an error in the x gradient."""

    @tf.custom_gradient
    def layer(x):
        v = _VARIABLES[x.dtype]
        w, b = v["w"], v["b"]
        t = tf.tanh(tf.linalg.matvec(w, x))

        def grad(g, variables=None):
            local = g * (1.0 - t * t)
            if defect == "transposed":
                gx = tf.linalg.matvec(w, local) + g * b
            elif defect == "missing_variable_term":
                gx = tf.linalg.matvec(w, local, transpose_a=True)
            else:
                gx = tf.linalg.matvec(w, local, transpose_a=True) + g * b
            if not variables:
                return gx
            if defect == "bad_variable_grads":  # wrong for W and b, right for x
                return gx, _variable_grads(variables, {w.ref(): 3.0 * local[:, None] * x[None, :]})
            return gx, _variable_grads(variables, {w.ref(): local[:, None] * x[None, :], b.ref(): g * x})

        return t + b * x, grad

    return layer


@tf.custom_gradient
def variable_softplus_matmul(x):
    """y = s * softplus(x M) with M [3, 2] and scalar s variables; x [2, 3]."""
    v = _VARIABLES[x.dtype]
    m, s = v["m"], v["s"]
    z = tf.matmul(x, m)

    def grad(g, variables=None):
        local = g * s * tf.sigmoid(z)
        gx = tf.matmul(local, m, transpose_b=True)
        if not variables:
            return gx
        return gx, _variable_grads(
            variables, {m.ref(): tf.matmul(x, local, transpose_a=True), s.ref(): tf.reduce_sum(g * tf.math.softplus(z))}
        )

    return s * tf.math.softplus(z), grad


# --------------------------------------------------------------- 3. hidden low precision


def hidden_bf16_matmul(x, w):
    return tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), tf.cast(w, tf.bfloat16)), x.dtype)


def hidden_bf16_conv(image, kernel):
    y = tf.nn.conv2d(tf.cast(image, tf.bfloat16), tf.cast(kernel, tf.bfloat16), strides=1, padding="VALID")
    return tf.cast(y, image.dtype)


def hidden_f16_sum_squares(x):
    return tf.cast(tf.reduce_sum(tf.square(tf.cast(x, tf.float16)), axis=-1), x.dtype)


def hidden_bf16_dense_tanh(x, w, b):
    return tf.tanh(hidden_bf16_matmul(x, w) + b)


# -------------------------------------------------------------------------- 4. large |x|

_COS_X = _per_dtype([[1.234e3, 4.567e3, 1.0237e4]], [[1.2345e4, 3.7123e5, 8.1234e6, 4.9876e7]])
_EXP_X = _per_dtype([[20.3, 31.7, 42.9]], [[30.5, 41.2, 55.7]])
_LOG_X = _fixed([1.2e8, 3.4e8, 9.9e8])


def xlogx(x):
    return x * tf.math.log(x)


# ---------------------------------------------------------------- 5. near a domain edge

_LOG_EDGE = _fixed([3e-9, 7e-9, 2.5e-8, 1e-7])
_SQRT_EDGE = _fixed([1e-10, 4e-10, 3e-9])
_LOG1P_EDGE = _per_dtype([[-1 + 1e-5, -1 + 4e-5, -1 + 2e-4]], [[-1 + 1e-9, -1 + 5e-9, -1 + 3e-8]])
_ATANH_EDGE = _per_dtype([[1 - 1e-3, -(1 - 2e-3), 1 - 5e-3]], [[1 - 1e-7, -(1 - 3e-7), 1 - 2e-6]])
_ACOSH_EDGE = _per_dtype([[1 + 1e-5, 1 + 3e-5, 1 + 2e-4]], [[1 + 1e-10, 1 + 7e-10, 1 + 5e-9]])
_XLOGY_EDGE = _fixed([0.5, 1.5, 2.5], [2e-9, 8e-9, 5e-8])


def _xlogy_y_sign(x, y, g):
    return g * tf.math.log(y), -g * x / y


# ---------------------------------------------------------------------- 6. kinks nearby

_KINK = 0.25  # exactly representable, so the kink is at the same point in both dtypes
_AT_1E_9 = _fixed([1e-9, -1e-9, 3e-9, -4e-9, 0.7, -0.6])
_NEAR_KINK = _fixed([_KINK + 1e-6, _KINK - 2e-6, _KINK + 4e-4, _KINK - 1e-3, _KINK + 0.05])
_NEAR_CLIP = _fixed([0.5 - 1e-6, 0.5 + 3e-6, -0.5 + 2e-4, -0.5 - 1e-3, 0.1])


def kink_abs_offset(x):
    return tf.abs(x - _KINK) * (1.0 + x * x)


def kink_clip_near_bound(x):
    return tf.clip_by_value(x, -0.5, 0.5) + 0.1 * x * x


def _max_near_tie(dtype):
    x = np.array([0.3, 1.0, -0.7])
    return [_t(x, dtype), _t(x + np.array([3e-7, -5e-7, 2e-4]), dtype)]


def _relu_switch_1e_8(x, g):
    return g * tf.cast(x > 1e-8, x.dtype)


def _abs_offset_wrong_center(x, g):  # sign(x) instead of sign(x - 0.25)
    return g * (tf.sign(x) * (1.0 + x * x) + 2.0 * x * tf.abs(x - _KINK))


# --------------------------------------------------------------------------- 7. noisy f

_NOISE_RNG = np.random.default_rng(71)
_SUM_C = _NOISE_RNG.choice([-1.0, 1.0], size=(3, 6)) * _NOISE_RNG.uniform(1e3, 3e3, size=(3, 6))
_SUM_A = _NOISE_RNG.normal(size=(3, 6))
_LONG_C = _NOISE_RNG.choice([-1.0, 1.0], size=300) * _NOISE_RNG.uniform(100.0, 300.0, size=300)


def noisy_cancelling_sum(x):
    """sum_j (C_kj + A_kj sin x_j) - sum_j C_kj, with |C| ~ 2e3: float32 noise ~1e-3 on O(1) outputs."""
    return tf.reduce_sum(_c(_SUM_C, x) + _c(_SUM_A, x) * tf.sin(x), axis=-1) - _c(_SUM_C.sum(axis=-1), x)


def noisy_long_sum(x):
    """sum of 300 terms C_j + sin x_j minus sum C_j, |C| ~ 200: float32 noise ~1e-3."""
    return tf.reduce_sum(_c(_LONG_C, x) + tf.sin(x)) - _c(_LONG_C.sum(), x)


def noisy_float32_input(x):
    """u^2 + sin u with u = float32(x): as a float64 function, accurate only to ~1e-7."""
    u = tf.cast(x, tf.float32)
    return tf.cast(u * u + tf.sin(u), x.dtype)


def noisy_float32_output(x):
    """exp(x/2) sin(x + 1) rounded to float32: the input keeps float64 resolution."""
    return tf.cast(tf.cast(tf.exp(0.5 * x) * tf.sin(x + 1.0), tf.float32), x.dtype)


_NOISY_X = _fixed([0.3, 0.9, 1.7, -1.2])

# ------------------------------------------------------- extras: forward mode odd / missing


def resize_bilinear(image):
    return tf.cast(tf.tanh(tf.image.resize(image, [5, 7], method="bilinear")), image.dtype)


def resize_bicubic(image):
    return tf.cast(tf.tanh(tf.image.resize(image, [5, 7], method="bicubic")), image.dtype)


_SCATTER_INDICES = [[0], [2], [0], [3], [2]]


def scatter_nd_duplicates(u):
    return tf.scatter_nd(_SCATTER_INDICES, u * tf.sin(u), shape=[4, 2])


CORRECT = [
    # --- 1. fan-out through a custom gradient
    Case("fanout_custom_x_sin_x", _fanout(_custom1(_x_sin_x, lambda x, g: g * _d_x_sin_x(x))), _FANOUT_X, True,
         "fanout-custom", "[g, 2g, g^2] for custom-gradient g = x sin x: 9 outputs from 3 inputs"),
    Case("fanout_custom_softplus", fanout_custom_softplus, _fixed([-0.8, 1.3]), True, "fanout-custom",
         "[g, x g, exp(-g)] for a custom-gradient softplus g: 6 outputs from 2 inputs"),
    Case("fanout_custom_outer", _fanout_outer(_custom2(_x_exp_y, lambda x, y, g: (g * tf.exp(y), g * x * tf.exp(y)))),
         _FANOUT_XY, True, "fanout-custom", "outer(custom-gradient x e^y, c): 8 outputs from 2 + 2 inputs"),
    Case("fanout_custom_forward_mode_blind", _fanout(_x_exp_x_forward_mode_blind), _FANOUT_X, True, "fanout-custom",
         "[g, 2g, g^2] for custom g = x stop_gradient(e^x) with the right gradient (1 + x) e^x: forward-mode "
         "autodiff, which ignores the custom gradient, gets e^x"),
    # --- 2. custom gradients over variables
    Case("variable_custom_layer", _variable_layer(), _fixed([0.5, -0.9, 1.4]), True, "variable-custom",
         "tanh(W x) + b x with W, b tf.Variables and a grad(dy, variables) custom gradient"),
    Case("variable_custom_softplus_matmul", variable_softplus_matmul, _normal(72, (2, 3)), True, "variable-custom",
         "s softplus(x M) with M, s tf.Variables and a grad(dy, variables) custom gradient"),
    Case("variable_custom_bad_variable_grads", _variable_layer("bad_variable_grads"), _fixed([0.5, -0.9, 1.4]), True,
         "variable-custom",
         "tanh(W x) + b x whose custom gradient is wrong for the variables but right for x (only x is checked)"),
    # --- 3. hidden low precision
    Case("hidden_bf16_matmul", hidden_bf16_matmul, _normal(73, (2, 3), (3, 2), scale=0.6), True, "hidden-precision",
         "matmul computed in bfloat16 between casts"),
    Case("hidden_bf16_conv", hidden_bf16_conv, _normal(74, (1, 4, 4, 1), (2, 2, 1, 2), scale=0.6), True,
         "hidden-precision", "VALID conv2d computed in bfloat16 between casts"),
    Case("hidden_f16_sum_squares", hidden_f16_sum_squares, _normal(75, (3, 5), scale=0.5), True, "hidden-precision",
         "row sums of squares computed in float16 between casts"),
    Case("hidden_bf16_dense_tanh", hidden_bf16_dense_tanh, _normal(76, (2, 4), (4, 3), (3,), scale=0.5), True,
         "hidden-precision", "tanh(x W + b) with the matmul in bfloat16"),
    # --- 4. large |x|
    Case("large_x_cos", tf.cos, _COS_X, True, "large-x", "cos at x ~ 1e4..5e7 (float64), 1e3..1e4 (float32)"),
    Case("large_x_exp", tf.exp, _EXP_X, True, "large-x", "exp at x ~ 30..56 (float64), 20..43 (float32)"),
    Case("large_x_log_1e8", tf.math.log, _LOG_X, True, "large-x", "log at x ~ 1e8..1e9 (derivative ~1e-8)"),
    Case("large_x_xlogx_1e8", xlogx, _LOG_X, True, "large-x", "x log x at x ~ 1e8..1e9"),
    # --- 5. near a domain edge
    Case("edge_log_3e_9", tf.math.log, _LOG_EDGE, True, "domain-edge", "log at x = 3e-9..1e-7"),
    Case("edge_sqrt_1e_10", tf.sqrt, _SQRT_EDGE, True, "domain-edge", "sqrt at x = 1e-10..3e-9"),
    Case("edge_log1p_near_minus_one", tf.math.log1p, _LOG1P_EDGE, True, "domain-edge",
         "log1p at -1 + 1e-9 (float64), -1 + 1e-5 (float32)"),
    # float64: steps below 1e-7 of the edge give the derivative (5e6) only to 1.8% (|diff| 4e-5 relative,
    # but the ladder cannot claim better), so a 1% defect could pass: undecidable.
    Case("edge_atanh_near_one", tf.math.atanh, _ATANH_EDGE, True, "domain-edge",
         "atanh at +-(1 - 1e-7) (float64), +-(1 - 1e-3) (float32)", unresolvable=("float64",)),
    Case("edge_acosh_near_one", tf.math.acosh, _ACOSH_EDGE, True, "domain-edge",
         "acosh at 1 + 1e-10 (float64), 1 + 1e-5 (float32)"),
    Case("edge_xlogy_y_near_zero", tf.math.xlogy, _XLOGY_EDGE, True, "domain-edge",
         "xlogy(x, y) at y = 2e-9..5e-8, w.r.t. x and y"),
    # --- 6. kinks nearby
    Case("kink_relu_at_1e_9", tf.nn.relu, _AT_1E_9, True, "kink-nearby", "relu at +-1e-9..4e-9 from its kink"),
    Case("kink_leaky_relu_at_1e_9", lambda x: tf.nn.leaky_relu(x, alpha=0.2), _AT_1E_9, True, "kink-nearby",
         "leaky relu (slope 0.2) at +-1e-9..4e-9 from its kink"),
    Case("kink_abs_offset", kink_abs_offset, _NEAR_KINK, True, "kink-nearby",
         "|x - 0.25| (1 + x^2) at 1e-6..1e-3 from the kink (f' jumps inside the default step)"),
    Case("kink_clip_near_bound", kink_clip_near_bound, _NEAR_CLIP, True, "kink-nearby",
         "clip(x, -0.5, 0.5) + 0.1 x^2 at 1e-6..1e-3 from the clip bounds"),
    Case("kink_max_near_tie", tf.maximum, _max_near_tie, True, "kink-nearby",
         "maximum(x, y) with y - x = 3e-7, -5e-7, 2e-4, w.r.t. both"),
    # --- 7. noisy f
    Case("noisy_cancelling_sum", noisy_cancelling_sum, _normal(77, (6,)), True,
         "noisy", "sums of +-2e3 constants plus A sin x that cancel to O(1): float32 noise ~1e-3"),
    Case("noisy_long_sum", noisy_long_sum, _normal(78, (300,)), True, "noisy",
         "300-term float32 sum with +-200 constants cancelling: noise ~1e-3 on an O(10) output"),
    Case("noisy_float32_input", noisy_float32_input, _NOISY_X, True, "noisy",
         "u^2 + sin u with u = float32(x), cast back: float64 f resolved only to float32"),
    Case("noisy_float32_output", noisy_float32_output, _NOISY_X, True, "noisy",
         "exp(x/2) sin(x + 1) rounded to float32 and cast back"),
    # --- extras: ops with missing or odd forward-mode autodiff
    Case("resize_bilinear", resize_bilinear, _normal(79, (1, 3, 4, 1)), True, "forward-mode-odd",
         "tanh(bilinear resize 3x4 -> 5x7); forward-mode JVP of ResizeBilinear is None", F32_ONLY),
    Case("resize_bicubic", resize_bicubic, _normal(80, (1, 3, 4, 1)), True, "forward-mode-odd",
         "tanh(bicubic resize 3x4 -> 5x7); ResizeBicubicGrad has no gradient (no forward mode)", F32_ONLY),
    Case("scatter_nd_duplicates", scatter_nd_duplicates, _normal(81, (5, 2)), True, "forward-mode-odd",
         "scatter_nd of u sin u with duplicate indices (summed)"),
]

WRONG = [
    # --- 1. fan-out through a custom gradient
    Case("fanout_custom_factor_2", _fanout(_custom1(_x_sin_x, lambda x, g: 2.0 * g * _d_x_sin_x(x))), _FANOUT_X, False,
         "fanout-custom", "[g, 2g, g^2], custom g = x sin x with its gradient doubled"),
    Case("fanout_custom_sign", _fanout(_custom1(_x_sin_x, lambda x, g: -g * _d_x_sin_x(x))), _FANOUT_X, False,
         "fanout-custom", "[g, 2g, g^2], custom g = x sin x with its gradient negated"),
    Case("fanout_custom_missing_term", _fanout(_custom1(_x_sin_x, lambda x, g: g * tf.sin(x))), _FANOUT_X, False,
         "fanout-custom", "[g, 2g, g^2], custom g = x sin x with d g = sin x (missing x cos x)"),
    Case("fanout_custom_outer_wrong_y",
         _fanout_outer(_custom2(_x_exp_y, lambda x, y, g: (g * tf.exp(y), g * tf.exp(y)))), _FANOUT_XY, False,
         "fanout-custom", "outer(custom x e^y, c) with d/dy = e^y (missing x); d/dx right"),
    # --- 2. custom gradients over variables
    Case("variable_custom_transposed", _variable_layer("transposed"), _fixed([0.5, -0.9, 1.4]), False,
         "variable-custom", "tanh(W x) + b x with the x gradient using W instead of W^T"),
    Case("variable_custom_missing_variable_term", _variable_layer("missing_variable_term"), _fixed([0.5, -0.9, 1.4]),
         False, "variable-custom", "tanh(W x) + b x with the x gradient missing the b term"),
    # --- 3. hidden low precision
    Case("hidden_bf16_matmul_factor_2", _planted(hidden_bf16_matmul, (2.0, 1.0)), _normal(73, (2, 3), (3, 2), scale=0.6),
         False, "hidden-precision", "bfloat16 matmul with the x gradient doubled (w gradient right)"),
    Case("hidden_bf16_conv_kernel_sign", _planted(hidden_bf16_conv, (1.0, -1.0)),
         _normal(74, (1, 4, 4, 1), (2, 2, 1, 2), scale=0.6), False, "hidden-precision",
         "bfloat16 conv2d with the kernel gradient negated (image gradient right)"),
    Case("hidden_f16_sum_squares_half", _planted(hidden_f16_sum_squares, (0.5,)), _normal(75, (3, 5), scale=0.5),
         False, "hidden-precision", "float16 sum of squares with d x^2 = x (factor 2 missing)"),
    # --- 4. large |x|
    Case("large_x_cos_sign", _custom1(tf.cos, lambda x, g: g * tf.sin(x)), _COS_X, False, "large-x",
         "cos at x ~ 1e4..5e7 with d cos = +sin"),
    Case("large_x_cos_factor_1_5", _custom1(tf.cos, lambda x, g: -1.5 * g * tf.sin(x)), _COS_X, False, "large-x",
         "cos at x ~ 1e4..5e7 with its gradient 1.5x too large"),
    Case("large_x_exp_factor_1_5", _custom1(tf.exp, lambda x, g: 1.5 * g * tf.exp(x)), _EXP_X, False, "large-x",
         "exp at x ~ 20..56 with its gradient 1.5x too large"),
    Case("large_x_xlogx_1e8_factor_1_5", _planted(xlogx, (1.5,)), _LOG_X, False, "large-x",
         "x log x at x ~ 1e8 with its gradient 1.5x too large"),
    # --- 5. near a domain edge
    Case("edge_log_epsilon", _custom1(tf.math.log, lambda x, g: g / (x + 1e-9)), _LOG_EDGE, False, "domain-edge",
         "d log x = 1/(x + 1e-9) at x = 3e-9..1e-7 (25% .. 1% off)"),
    Case("edge_sqrt_sign", _custom1(tf.sqrt, lambda x, g: -0.5 * g / tf.sqrt(x)), _SQRT_EDGE, False, "domain-edge",
         "d sqrt x = -1/(2 sqrt x) at x = 1e-10..3e-9"),
    Case("edge_log1p_factor_1_5", _custom1(tf.math.log1p, lambda x, g: 1.5 * g / (1.0 + x)), _LOG1P_EDGE, False,
         "domain-edge", "log1p near -1 with its gradient 1.5x too large"),
    Case("edge_atanh_missing_factor", _custom1(tf.math.atanh, lambda x, g: g / (1.0 - x)), _ATANH_EDGE, False,
         "domain-edge", "d atanh x = 1/(1 - x) (missing 1/(1 + x)) near +-1"),
    Case("edge_acosh_missing_factor", _custom1(tf.math.acosh, lambda x, g: g * tf.math.rsqrt(x - 1.0)), _ACOSH_EDGE,
         False, "domain-edge", "d acosh x = 1/sqrt(x - 1) (missing 1/sqrt(x + 1)) near 1"),
    Case("edge_xlogy_y_sign", _custom2(tf.math.xlogy, _xlogy_y_sign), _XLOGY_EDGE, False, "domain-edge",
         "xlogy(x, y) at y ~ 1e-9 with d/dy = -x/y (d/dx right)"),
    # --- 6. kinks nearby
    Case("kink_relu_switch_at_1e_8", _custom1(tf.nn.relu, _relu_switch_1e_8), _AT_1E_9, False, "kink-nearby",
         "relu gradient switching at 1e-8 instead of 0 (wrong at 1e-9 and 3e-9)"),
    Case("kink_abs_offset_wrong_center", _custom1(kink_abs_offset, _abs_offset_wrong_center), _NEAR_KINK, False,
         "kink-nearby", "|x - 0.25| (1 + x^2) with sign(x) for sign(x - 0.25): wrong just below the kink"),
    # --- 7. noisy f
    Case("noisy_cancelling_sum_factor_2", _planted(noisy_cancelling_sum, (2.0,)), _normal(77, (6,)), False, "noisy",
         "cancelling float32 sums with the gradient doubled"),
    Case("noisy_long_sum_factor_2", _planted(noisy_long_sum, (2.0,)), _normal(78, (300,)), False, "noisy",
         "300-term cancelling float32 sum with the gradient doubled"),
    Case("noisy_float32_input_factor_2", _planted(noisy_float32_input, (2.0,)), _NOISY_X, False, "noisy",
         "f through a float32 input cast with the gradient doubled"),
    Case("noisy_float32_output_factor_2", _planted(noisy_float32_output, (2.0,)), _NOISY_X, False, "noisy",
         "f rounded to float32 with the gradient doubled"),
]

CASES: list[Case] = CORRECT + WRONG
