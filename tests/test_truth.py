"""Verdict truth: the gradient training uses, in the precision f really computes, at hard points."""


import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import NOISE_TABLES, checked, events_of, logged
from test_real_networks import PlantedScale  # x * scale, its custom gradient's d/dscale times a factor

import fastcheck

RNG = np.random.default_rng(7)


def _custom_sin(factor):
    @tf.custom_gradient
    def g(x):
        return tf.sin(x), lambda dy: dy * factor * tf.cos(x)

    return g


# ---------------------------------------------------------------- reverse mode is the checked side

FAN_OUT = {
    # name: (f built from a custom-gradient g, correct?)
    "concat_2g": (lambda g: lambda x: tf.concat([g(x), 2 * g(x)], 0), None),
    "stack_g_g2": (lambda g: lambda x: tf.stack([g(x), g(x) ** 2, tf.exp(g(x))]), None),
    "outer": (lambda g: lambda x: g(x)[:, None] * tf.ones([1, 5], x.dtype), None),
}


@pytest.mark.parametrize("name", sorted(FAN_OUT))
@pytest.mark.parametrize("factor, correct", [(1.0, True), (2.0, False), (-1.0, False)])
def test_custom_gradient_behind_more_outputs_than_inputs(name, factor, correct, dtype):
    f = FAN_OUT[name][0](_custom_sin(factor))
    x = tf.constant([0.3, -0.8], dtype)
    report = fastcheck.check_gradients(f, x)
    assert report.ok == correct, str(report)
    assert report.mode == "reverse"
    if not correct:
        assert report.verdict == "fail"
        # Forward mode differentiates the forward ops and cannot see the custom gradient.
        assert fastcheck.check_gradients(f, x, autodiff="forward").ok


FORWARD_UNSUPPORTED = {
    "resize_bilinear": (lambda x: tf.image.resize(x, [6, 6], "bilinear"), "no JVP"),
    "resize_bicubic": (lambda x: tf.image.resize(x, [6, 6], "bicubic"), "LookupError"),
    "crop_and_resize": (lambda x: tf.image.crop_and_resize(x, [[0.1, 0.2, 0.8, 0.9]], [0], [3, 3]), "LookupError"),
}


@pytest.mark.parametrize("name", sorted(FORWARD_UNSUPPORTED))
def test_ops_without_forward_mode_are_checked_in_reverse_and_noted(name):
    f, why = FORWARD_UNSUPPORTED[name]
    # Traced, and 4096 evaluations: auto probes forward mode.
    image = tf.constant(RNG.uniform(size=(1, 32, 32, 2)), tf.float32)
    report = fastcheck.check_gradients(f, image, jit_compile=False)
    assert report.ok, str(report)
    assert [(e.result, why in e.error) for e in events_of(report, "ForwardProbe")] == [("unsupported", True)], \
        report.notes
    with pytest.raises(ValueError, match="autodiff='reverse'"):
        fastcheck.check_gradients(f, image, autodiff="both")


def test_scatter_nd_with_duplicate_indices(dtype):
    f = lambda u: tf.scatter_nd([[0], [0], [2]], u * u, [3])  # noqa: E731
    x = tf.constant([1.0, 2.0, 3.0], dtype)
    report = fastcheck.check_gradients(f, x)
    assert report.ok, str(report)
    # checked or explained, never a crash
    assert events_of(report, "ForwardProbe") or events_of(report, "ForwardNotChecked"), report.notes


def test_forward_only_defect_is_a_warning_in_auto_and_a_failure_in_both():
    # The forward ops hide exp behind stop_gradient, so forward mode (which ignores
    # the custom gradient) is wrong, while the gradient training uses is right.
    @tf.custom_gradient
    def f(x):
        y = tf.stop_gradient(tf.exp(x)) + 0 * x
        return y, lambda dy: dy * tf.exp(x)

    x = tf.constant([0.1, 0.4], tf.float64)
    # autodiff="auto" probes forward mode on traced checks of 4096 evaluations or more; a
    # smaller check (eager or traced) says that forward mode was not checked.
    for jit_compile in ("auto", False):
        small = fastcheck.check_gradients(lambda x: tf.concat([f(x), f(x)], 0), x, jit_compile=jit_compile)
        assert small.ok and not small.warnings, str(small)
        assert events_of(small, "ForwardNotChecked"), small.notes
    large = tf.constant(np.linspace(0.1, 0.4, 2048), tf.float64)
    auto = fastcheck.check_gradients(lambda x: tf.concat([f(x), f(x)], 0), large, jit_compile=False)
    assert auto.ok and auto.warnings and "forward mode (JVP" in auto.warnings[0], str(auto)
    assert "WARNING: forward mode" in str(auto)
    both = fastcheck.check_gradients(lambda x: tf.concat([f(x), f(x)], 0), x, autodiff="both")
    assert not both.ok and [p.side for p in both.failures] == ["forward"], str(both)
    assert "(forward mode)" in str(both)


def test_the_forward_warning_says_whether_reverse_mode_agrees():
    # Forward mode wrong everywhere (stop_gradient), reverse mode at 10 of 2048 elements: the forward probe runs on
    # the columns reverse mode passes, finds forward mode wrong, and its warning must not say reverse mode agrees.
    mask = tf.constant(np.arange(2048) < 10)

    @tf.custom_gradient
    def f(x):
        y = tf.stop_gradient(tf.exp(x)) + 0 * x
        return y, lambda dy: dy * tf.exp(x) * tf.where(mask, tf.constant(1.01, x.dtype), tf.constant(1.0, x.dtype))

    large = tf.constant(np.linspace(0.1, 0.4, 2048), tf.float64)
    report = fastcheck.check_gradients(lambda x: tf.concat([f(x), f(x)], 0), large, jit_compile=False)
    assert report.verdict == "fail" and [p.side for p in report.failures] == ["reverse"], str(report)
    assert len(report.warnings) == 1 and "Reverse mode, which training uses, fails this pair too" in report.warnings[0]
    assert "agrees" not in report.warnings[0]


def test_no_forward_probe_is_claimed_where_no_column_passes():
    # Reverse mode wrong at every element: the forward probe, which moves only columns that pass, has nothing to
    # move, and the note says forward mode was not checked (it once said it agreed along a zero direction).
    @tf.custom_gradient
    def f(x):
        return tf.exp(x), lambda dy: dy * tf.exp(x) * 1.01

    large = tf.constant(np.linspace(0.1, 0.4, 2048), tf.float64)
    report = fastcheck.check_gradients(lambda x: tf.concat([f(x), f(x)], 0), large, jit_compile=False)
    assert report.verdict == "fail" and not events_of(report, "ForwardProbe"), report.notes
    assert [e.reason for e in events_of(report, "ForwardNotChecked")] == ["no passing column"], report.notes


def test_forward_mode_asked_for_where_auto_chooses_fast_mode_is_a_warning():
    # Full Jacobians do not fit the memory budget: mode="auto" checks fast, whose analytical side is reverse mode.
    rng = np.random.default_rng(11)  # its own draws: the module's RNG stream stays as the later tests expect
    w = tf.constant(rng.normal(size=(100, 100)) * 0.1)
    x = tf.constant(rng.normal(size=(100,)))
    report = fastcheck.check_gradients(lambda x: tf.tanh(tf.linalg.matvec(w, x)), x, autodiff="forward",
                                       memory_budget=1 << 16)
    assert report.ok and report.mode == "fast", str(report)
    assert len(report.warnings) == 1 and "mode='full' to check forward mode" in report.warnings[0], report.warnings
    assert "WARNING: forward mode (JVP) was not checked" in str(report)


def test_a_reverse_only_defect_fails_only_the_reverse_side_in_both():
    # A wrong custom gradient that forward mode ignores: the forward side is right at the very elements the reverse
    # side gets wrong, and is judged there by its own values (it once took over the reverse side's mismatches).
    @tf.custom_gradient
    def f(x):
        return tf.sin(x), lambda dy: dy * tf.cos(x) * 1.01

    x = tf.constant(np.linspace(-1, 1, 12).reshape(3, 4), tf.float64)
    both = fastcheck.check_gradients(f, x, mode="full", autodiff="both")
    assert [p.side for p in both.failures] == ["reverse"], str(both)
    forward = [p for p in both.pairs if p.side == "forward"]
    assert len(forward) == 1 and forward[0].ok and forward[0].max_abs_error < 1e-9, str(both)


# ---------------------------------------------------------------- models: the real variables


def _tanh_of_matmul(x, w, sign):
    """tanh(x @ w) whose custom gradient takes the variable w; its variable gradient is scaled by sign."""

    @tf.custom_gradient
    def matmul(x):
        def grad(dy, variables=None):
            return tf.matmul(dy, w, transpose_b=True), [sign * tf.matmul(x, dy, transpose_a=True)]

        return tf.matmul(x, w), grad

    return tf.tanh(matmul(x))


class _VariableGradient(tf.Module):
    """tanh(x @ w) with a custom gradient that takes the variable (grad(dy, variables=...))."""

    def __init__(self, sign):
        self.w = tf.Variable(RNG.normal(size=(3, 2)), dtype=tf.float64)
        self.sign = sign

    def __call__(self, x):
        return _tanh_of_matmul(x, self.w, self.sign)


class _KerasVariableGradient(keras.layers.Layer):
    def __init__(self, sign=1.0, **kwargs):
        super().__init__(**kwargs)
        self.sign = sign

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], 2), initializer="glorot_uniform")

    def call(self, x):
        return _tanh_of_matmul(x, self.w, self.sign)


def _squared(y_true, y_pred):
    return tf.reduce_sum((y_pred - y_true) ** 2)


@pytest.mark.parametrize("sign, correct", [(1.0, True), (-1.0, False), (0.5, False)])
def test_module_custom_variable_gradient_is_the_checked_one(sign, correct):
    module = _VariableGradient(sign)
    before = module.w.numpy().copy()
    x = tf.constant(RNG.normal(size=(4, 3)))
    report = fastcheck.check_model(module, _squared, (x, tf.zeros([4, 2], tf.float64)))
    assert report.ok == correct, str(report)
    assert "tape.gradient of the loss over the model's own variables" in str(report)
    np.testing.assert_array_equal(module.w.numpy(), before)


@pytest.mark.parametrize("sign, correct", [(1.0, True), (-1.0, False)])
def test_keras3_custom_variable_gradient_is_the_checked_one(sign, correct):
    model = keras.Sequential([keras.Input((3,)), _KerasVariableGradient(sign)])
    x = RNG.normal(size=(4, 3)).astype("float32")
    report = fastcheck.check_model(model, keras.losses.MeanSquaredError(), (x, np.zeros((4, 2), "float32")))
    assert report.ok == correct, str(report)


class _IteratingVariableGradient(keras.layers.Layer):
    """x @ w + b whose custom gradient iterates over ``variables`` (None in a stateless call: it raises there)."""

    def __init__(self, scale=1.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = scale

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], 2), initializer="glorot_uniform", name="w")
        self.b = self.add_weight(shape=(2,), initializer="random_normal", name="b")

    def call(self, x):
        layer = self

        @tf.custom_gradient
        def op(x):
            w, b = layer.w.value, layer.b.value

            def grad(dy, variables=None):
                grads = [layer.scale * tf.matmul(x, dy, transpose_a=True) if len(v.shape) == 2 else tf.reduce_sum(dy, 0)
                         for v in variables]
                return tf.matmul(dy, w, transpose_b=True), grads

            return tf.matmul(x, w) + b, grad

        return op(x)


@pytest.mark.parametrize("scale, correct", [(1.0, True), (1.02, False)])
def test_keras3_gradient_iterating_its_variables(scale, correct):
    # Its grad_fn cannot run on the stateless loss: the check reads the real variables' gradient, and
    # the guard that every variable reaches the stateless loss moves the weights instead.
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              _IteratingVariableGradient(scale)])
    data = (RNG.normal(size=(6, 3)).astype("float32"), RNG.normal(size=(6, 2)).astype("float32"))
    report = fastcheck.check_model(model, "mse", data)
    assert report.ok == correct, str(report)
    with pytest.raises(ValueError, match=r"check_model\(order=2\) differentiates the loss as a function of"):
        fastcheck.check_model(model, "mse", data, order=2)
    # The layer's call raised inside fastcheck's traced stateless calls: Keras's name-scope stack is as it was
    # (it kept the layer's scope, and every later layer of the process was named under it).
    later = keras.layers.Dense(2, name="built_after_the_check")
    later.build((None, 3))
    assert later.kernel.path == "built_after_the_check/kernel", later.kernel.path


# ---------------------------------------------------------------- the precision f computes in


def _hidden(low, factor=1.0):
    w = RNG.normal(size=(8, 6))

    @tf.custom_gradient
    def scale(y):
        return y, lambda dy: factor * dy

    def f(x):
        product = tf.matmul(tf.cast(x, low), tf.cast(tf.constant(w, x.dtype), low))
        return tf.tanh(scale(tf.cast(product, x.dtype)) / 4)

    return f


@pytest.mark.parametrize("low", [tf.bfloat16, tf.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("factor, correct", [(1.0, True), (2.0, False), (-1.0, False)])
def test_hidden_low_precision_is_found_and_named(low, factor, correct, dtype):
    x = tf.constant(RNG.normal(size=(3, 8)), dtype)
    report = fastcheck.check_gradients(_hidden(low, factor), x)
    assert report.ok == correct, str(report)
    assert f"f computes in {low.name} inside (op MatMul)" in str(report), str(report)


def test_float64_function_through_a_float32_op_is_judged_in_float32():
    f = lambda x: tf.cast(tf.sin(tf.cast(x, tf.float32)) * 3, tf.float64)  # noqa: E731
    report = fastcheck.check_gradients(f, tf.constant(RNG.normal(size=16), tf.float64))
    assert report.ok, str(report)
    assert "f computes in float32 inside" in str(report)


def test_dense_layer_in_bfloat16_with_float_bias(dtype):
    def f(x, w, b):
        return tf.tanh(tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), tf.cast(w, tf.bfloat16)), x.dtype) + b)

    inputs = [tf.constant(RNG.normal(size=shape), dtype) for shape in ((4, 6), (6, 3), (3,))]
    report = fastcheck.check_gradients(f, inputs)
    assert report.ok, str(report)


@pytest.mark.parametrize("factor, correct", [(1.0, True), (2.0, False)])
def test_keras_mixed_precision_model(factor, correct):
    class Scaled(keras.layers.Layer):
        def call(self, x):
            @tf.custom_gradient
            def scale(y):
                return y, lambda dy: factor * dy

            return scale(x)

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), Scaled(),
                                  keras.layers.Dense(4)])
        x = RNG.normal(size=(4, 8)).astype("float32")
        report = fastcheck.check_model(model, keras.losses.MeanSquaredError(), (x, np.zeros((4, 4), "float32")))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert report.ok == correct, str(report)
    assert "computes in float16 (dtype policy mixed_float16): the analytical side is judged with float16" in str(report)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("factor, correct", [(1.0, True), (1.3, False)])
def test_mixed_precision_relu_cnn(policy, factor, correct):
    # Conv-BN-ReLU-MaxPool under a mixed policy.  The float16 function has no derivative below
    # its quantum, and its difference quotients at steps past the noise averaged over ReLU kinks:
    # all 6 seeds of the correct model FAILed (numerical -0.327 against the exact -0.170).  The
    # float64 copy gives the exact derivatives; the float16 gradient is judged at float16 tolerances.
    failures = []
    for seed in range(3):
        data_rng = np.random.default_rng(seed)
        x = data_rng.normal(size=(4, 8, 8, 3)).astype("float32")
        y = keras.utils.to_categorical(data_rng.integers(0, 4, 4), 4)
        keras.mixed_precision.set_global_policy(policy)
        try:
            keras.utils.set_random_seed(seed)
            model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, padding="same"),
                                      keras.layers.BatchNormalization(), keras.layers.ReLU(), PlantedScale(factor),
                                      keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dense(4)])
        finally:
            keras.mixed_precision.set_global_policy("float32")
        report = fastcheck.check_model(model, keras.losses.CategoricalCrossentropy(from_logits=True), (x, y))
        assert any(e.copied for e in events_of(report, "ModelCopy")), str(report)
        if report.ok != correct:
            failures.append(str(report))
        if not correct:
            assert any(p.input_name.endswith("scale") and p.count("mismatch") for p in report.pairs), str(report)
    assert not failures, failures[0]


@pytest.mark.parametrize("policy, factor, correct", [
    ("mixed_float16", 1.0, True), ("mixed_float16", 1.3, False), ("mixed_bfloat16", 2.0, False)])
def test_named_loss_of_a_mixed_precision_model_computes_in_float32(policy, factor, correct):
    # model.compile("mse") computes the loss in float32 over float16 outputs; a loss rounded to
    # float16 swamped the check in noise and passed d/ds 30% (bfloat16: 100%) too large.
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), PlantedScale(factor),
                                  keras.layers.Dense(3)])
        data = (RNG.normal(size=(6, 5)).astype("float32"), RNG.normal(size=(6, 3)).astype("float32"))
        named = fastcheck.check_model(model, "mse", data)
        loss_object = fastcheck.check_model(model, keras.losses.MeanSquaredError(), data)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert named.ok == loss_object.ok == correct, str(named)
    if not correct:
        assert any(p.input_name.endswith("scale") and not p.ok for p in named.pairs), str(named)


def test_function_that_changes_with_dtype_is_evaluated_natively():
    weights = {tf.float32: 1.0, tf.float64: 1.5}  # a dtype-dependent weight: float64 is another function
    f = lambda x: tf.sin(x) * weights[x.dtype]  # noqa: E731
    report = fastcheck.check_gradients(f, tf.constant([0.2, 0.9], tf.float32))
    assert report.ok, str(report)
    (side,) = events_of(report, "NumericalSide")
    assert not side.upcast and side.reason == "differs" and side.float64 == pytest.approx(1.5 * side.native), report.notes


# ---------------------------------------------------------------- steps and points


@pytest.mark.parametrize("factor, correct", [(1.0, True), (-1.0, False), (1.5, False)])
def test_cos_at_large_argument(factor, correct):
    @tf.custom_gradient
    def cos(x):
        return tf.cos(x), lambda dy: -factor * dy * tf.sin(x)

    report = fastcheck.check_gradients(cos, tf.constant([5e7, -3.3e6, 1.2e4], tf.float64))
    assert report.ok == correct, str(report)
    if not correct:
        assert report.verdict == "fail"


@pytest.mark.parametrize("offset, correct", [(0.0, True), (1e-3, False)])
def test_truncation_limited_float32_element_passes_its_second_step_without_measuring_noise(offset, correct):
    # x sin(x) at its stationary point 2.0288 (f' ~ 0, f''' ~ -1.8): float32's first step h ~ 1e-2 leaves a
    # truncation error ~3e-5 > atol there.  f captures a float32 constant, so it only runs in float32 (as
    # TensorFlow's own tests of atan2, igamma, pow do).  The second step at h/4 passes it in two calls of f;
    # f's noise (~100 calls) is measured only where that does not settle -- and a wrong value there is not
    # passed (undecidable today: float32's rounding swamps every step below h/4 at f ~ 1.8, so no ladder
    # settles; ok is False either way).
    scale = tf.constant(1.0, tf.float32)
    calls = []

    @tf.custom_gradient
    def f(x):
        calls.append(1)
        return x * tf.sin(x) * scale, lambda dy: dy * (tf.sin(x) + x * tf.cos(x) + offset * tf.one_hot(1, 4))

    x = tf.constant([0.3, 2.0287578, -1.1, 4.9], tf.float32)
    h = np.finfo(np.float32).eps ** (1 / 3) * 2.0287578
    x64 = np.float64(x.numpy()[1])
    first = ((x64 + h) * np.sin(x64 + h) - (x64 - h) * np.sin(x64 - h)) / (2 * h)
    assert abs(first - (np.sin(x64) + x64 * np.cos(x64))) > 2e-5  # the premise: float32's atol fails at h
    report = fastcheck.check_gradients(f, x)
    assert report.ok == correct, str(report)
    if correct:
        assert len(calls) < 40, len(calls)  # planning, the sweep, the second step; no noise tables
    else:
        worst = report.pairs[0].worst_element
        assert report.verdict in ("fail", "undecidable"), str(report)
        assert (worst.output_index, worst.input_index) == ((1,), (1,)) and worst.abs_error > 0.9 * offset, str(report)


@pytest.mark.parametrize("f, x", [
    (tf.math.log, [3e-9, 1e-12]),
    (tf.sqrt, [1e-10, 4e-9]),
    (tf.math.log1p, [-1 + 1e-9]),
    (tf.math.atanh, [1 - 1e-9]),
], ids=["log", "sqrt", "log1p", "atanh"])
def test_points_near_a_domain_edge(f, x):
    report = fastcheck.check_gradients(f, tf.constant(x, tf.float64))
    assert report.ok, str(report)


def test_second_order_at_a_jump_of_the_first_derivative_is_undecidable():
    # relu' jumps at 0: relu'' does not exist there, and a wrong value must not pass as a "kink".
    report = fastcheck.check_gradients(tf.nn.relu, tf.constant([0.0, 1.0], tf.float64), order=2)
    assert report.verdict == "undecidable", str(report)
    assert report.pairs[0].count("f jumps here") == 1
    assert "f jumps at the point" in str(report)


def test_wrong_second_derivative_away_from_a_jump_fails():
    @tf.custom_gradient
    def cos_wrong(x):  # claims d cos / dx = +sin: the second derivative of sin is wrong
        return tf.cos(x), lambda dy: dy * tf.sin(x)

    @tf.custom_gradient
    def sin(x):
        return tf.sin(x), lambda dy: dy * cos_wrong(x)

    report = fastcheck.check_gradients(lambda x: sin(x) + tf.nn.relu(x), tf.constant([0.5, -0.7], tf.float64), order=2)
    assert report.verdict == "fail", str(report)


def test_noisy_float32_function_passes_every_time():
    # Call-to-call noise at 1e-7 (nondeterministic reductions): counted as noise, never a false alarm.
    def f(x):
        return tf.sin(x) * (1 + 1e-7 * tf.random.uniform(tf.shape(x), dtype=x.dtype))

    x = tf.constant(RNG.normal(size=32), tf.float32)
    for _ in range(5):
        report = fastcheck.check_gradients(f, x)
        assert report.ok, str(report)
        assert "not deterministic" not in str(report)


def test_float64_loss_accurate_to_1e_8_is_not_a_kink():
    # Like CTC loss: a float64 value with rounding noise far above float64's.  The noise
    # is a float32 rounding of the value, outside the gradient (stop_gradient).
    def rough(x):
        exact = tf.reduce_sum(tf.sin(x) * x)
        rounded = tf.cast(tf.cast(exact, tf.float32), tf.float64)
        return exact + tf.stop_gradient(rounded - exact)

    report = fastcheck.check_gradients(rough, tf.constant(RNG.normal(size=20), tf.float64))
    assert report.ok, str(report)
    assert "carry relative noise" in str(report)


@pytest.mark.parametrize("factor, verdict", [(1.0, "pass"), (1.01, "fail")])
def test_a_float32_path_beside_a_float64_one(factor, verdict):
    # Rounding to float32 along equally spaced points is a sawtooth: some outputs' noise
    # tables look smooth, and below the float32 quantum only the float64 path moves.
    # Every output's noise is floored at f's relative noise once the float32 op is found.
    @tf.custom_gradient
    def f(x):
        def grad(dy):
            return dy * (tf.cos(x) - factor * tf.sin(x))

        return tf.sin(x) + tf.cast(tf.cast(tf.cos(x), tf.float32), tf.float64), grad

    for seed in range(3):
        x = tf.constant(np.random.default_rng(seed).normal(size=16), tf.float64)
        report = fastcheck.check_gradients(f, x)
        assert report.verdict == verdict, str(report)
        assert "float32 inside" in str(report)


# ---------------------------------------------------------------- errors and settings


def test_py_function_with_a_vector_output():
    f = lambda x: tf.py_function(lambda v: tf.sin(v) * 2.0, [x], tf.float64)  # noqa: E731
    assert fastcheck.check_gradients(f, tf.constant([0.3, 0.5, 0.7], tf.float64)).ok


def test_check_inside_a_graph_context_runs_eagerly_on_the_side():
    with tf.Graph().as_default():
        assert fastcheck.check_gradients(tf.sin, np.array([0.3, 0.5])).ok
        with pytest.raises(TypeError, match="symbolic graph tensor"):
            fastcheck.check_gradients(tf.sin, tf.constant([0.3]))


@pytest.mark.parametrize("options, error, match", [
    ({"rtol": "x"}, TypeError, "rtol='x' is not a number"),
    ({"device": "/GPU:7"}, ValueError, "does not exist on this machine"),
    ({"autodiff": "sideways"}, ValueError, "autodiff='sideways' is not valid"),
    ({"autodiff": "forward", "mode": "fast"}, ValueError, "only mode='full' computes; mode='fast' judges the reverse"),
    ({"autodiff": "both", "mode": "coloured"}, ValueError, "only mode='full' computes; mode='coloured' judges"),
    ({"sparsity": np.eye(1, dtype=bool), "mode": "full"}, ValueError, r"sparsity= .* mode='full' does not read it"),
    ({"sparsity": np.eye(1, dtype=bool), "mode": "fast"}, ValueError, r"pass mode='coloured' \(or 'auto'\)"),
])
def test_bad_options_are_named(options, error, match):
    with pytest.raises(error, match=match):
        fastcheck.check_gradients(tf.sin, tf.constant([0.3], tf.float64), **options)


def test_unknown_option_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="unknown option.*'tolerance'"):
        fastcheck.verify_gradients(tf.sin, tf.constant([0.3], tf.float64), [1.0], tolerance=1e-3)


def test_empty_output_passes_with_a_note():  # as tf.test.compute_gradient returns empty Jacobians
    report = fastcheck.check_gradients(lambda x: x[:0], tf.constant([0.3, 0.4], tf.float64))
    assert report.ok and report.verdict == "pass" and report.notes, str(report)
    assert [p.numerical.shape for p in report.pairs] == [(0, 2)]


def test_function_that_cannot_be_traced_runs_eagerly():
    class NoTracing(Exception):
        pass

    def f(x):
        if not tf.executing_eagerly():
            raise NoTracing("this f runs only eagerly")
        return tf.sin(x)

    report = fastcheck.check_gradients(f, tf.constant(np.linspace(0, 1, 3000), tf.float64))
    assert report.ok and report.path == "eager", str(report)
    with pytest.raises(NoTracing):  # the user's own exception type, when XLA was demanded
        fastcheck.check_gradients(f, tf.constant(np.linspace(0, 1, 3000), tf.float64), jit_compile=True)


def test_full_mode_that_cannot_fit_is_a_clear_error_before_any_allocation():
    # A 3x3 convolution of 64x64x8 in float64: two 32,768 x 32,768 Jacobians (8.6 GB each).
    kernel = tf.constant(RNG.normal(size=(3, 3, 8, 8)))
    f = lambda x: tf.nn.conv2d(x, kernel, 1, "SAME")  # noqa: E731
    x = tf.constant(RNG.normal(size=(1, 64, 64, 8)))
    with pytest.raises(ValueError, match=r"mode='full' needs about 49 GiB .* 32768 x 32768 .*Pass mode='fast'"):
        fastcheck.check_gradients(f, x, mode="full")


# ---------------------------------------------------------------- order=2 through every entry point


def _sin_with_second_derivative(sign):
    @tf.custom_gradient
    def cos(x):  # the derivative of cos, as the gradient of sin's gradient sees it
        return tf.cos(x), lambda dy: dy * sign * tf.sin(x)

    @tf.custom_gradient
    def sin(x):
        return tf.sin(x), lambda dy: dy * cos(x)

    return sin


@pytest.mark.parametrize("sign, correct", [(-1.0, True), (1.0, False)])
def test_order_two_in_every_entry_point(sign, correct):
    sin = _sin_with_second_derivative(sign)
    x = tf.constant([0.3, -1.1, 2.0], tf.float64)
    f = lambda x: tf.reduce_sum(sin(x))  # noqa: E731
    assert fastcheck.check_gradients(f, x, order=2).ok == correct
    assert fastcheck.GradientChecker(order=2).check(f, x).ok == correct

    def grads(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = f(x)
        return tape.gradient(y, x)

    second = fastcheck.verify_gradients(f, x, grads, order=2)
    assert second.ok == correct
    assert events_of(second, "SecondOrder"), second.notes
    with pytest.raises(TypeError, match="pass grads as a callable"):
        fastcheck.verify_gradients(f, x, [np.cos(x.numpy())], order=2)
    hessian = fastcheck.numerical_jacobian(f, x, order=2)[0][0]
    np.testing.assert_allclose(hessian, np.diag(-np.sin(x.numpy())), atol=1e-6)


def test_order_two_of_a_model_loss():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
    x = RNG.normal(size=(5, 3)).astype("float32")
    report = fastcheck.check_model(model, keras.losses.MeanSquaredError(), (x, np.zeros((5, 1), "float32")), order=2)
    assert report.ok and "order=2" in report.title, str(report)


def test_forward_side_of_a_scalar_function_is_forward_mode():
    # A wrong custom gradient on a scalar loss: reverse mode (training) sees it, forward mode cannot.
    @tf.custom_gradient
    def loss(x):
        return tf.reduce_sum(tf.sin(x)), lambda dy: 2 * dy * tf.cos(x)

    x = tf.constant([0.2, 0.7], tf.float64)
    assert not fastcheck.check_gradients(loss, x).ok
    forward = fastcheck.check_gradients(loss, x, autodiff="forward")
    assert forward.ok and forward.mode == "forward" and {p.side for p in forward.pairs} == {"forward"}


def test_a_memory_budget_that_splits_the_noisy_columns_refit_changes_no_result():
    # The cubic fits' [m, 9, k] tables for every noise-limited column at once held ~30 GB on a bfloat16 conv
    # 32x32x8 (the OS killed the check); they go in chunks within memory_budget, with the same results.  (How many
    # chunks ran is not in the report: only the results are checked.)
    rng = np.random.default_rng(2)
    w, b = tf.constant(rng.normal(size=(6, 3))), tf.constant(rng.normal(size=3))

    def f(x):
        return tf.tanh(tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), tf.cast(w, tf.bfloat16)), x.dtype) + b)

    x = tf.constant(rng.normal(size=(4, 6)))
    whole = fastcheck.check_gradients(f, x, mode="full")
    # 3 columns a chunk: 8 float64 tables [12, 9] per column, 3 columns (fastcheck/tables.py: COARSE_TABLES).
    chunked = fastcheck.check_gradients(f, x, mode="full", memory_budget=8 * 9 * 8 * 12 * 3)
    assert whole.ok and chunked.ok, str(chunked)
    assert events_of(chunked, "NoiseMeasured"), str(chunked)  # the premise: f's noise limits its columns
    np.testing.assert_array_equal(whole.pairs[0].status, chunked.pairs[0].status)
    np.testing.assert_allclose(whole.pairs[0].numerical, chunked.pairs[0].numerical, rtol=0, atol=0)


@pytest.mark.parametrize("route", ["graph", "eager"])
def test_noise_tables_are_one_traced_call_each_and_equal_the_point_by_point_noise(route, debug_log):
    # f's noise (measured when an element fails) is 100-250 evaluations of f; each table of 16 runs
    # as one traced loop over its points, with f's own kernels: the same noise as f called point by
    # point.  On the eager path the loop is traced where its calls would cost twice the tracing.
    w = tf.constant(RNG.normal(size=(6, 5)), tf.float32)

    @tf.custom_gradient
    def f(x):
        if route == "eager" and tf.executing_eagerly():
            # A dear eager call (40,000 Python calls: ~20 ms counted): the 31 calls of its eager check still cost
            # less than tracing is predicted at (40 calls and more), while a noise measurement's 8 tables of 16
            # calls cost more than twice the tracing of their loop (0.15 s and 8 calls).
            for _ in range(40_000):
                abs(1)
        y = tf.tanh(tf.linalg.matvec(w, x))
        return y, lambda dy: 1.1 * tf.linalg.matvec(w, dy * (1 - y * y), transpose_a=True)  # 10% off

    x = tf.constant(RNG.normal(size=5), tf.float32)
    options = {"jit_compile": False if route == "graph" else "auto"}
    report = fastcheck.check_gradients(f, x, **options)
    assert report.verdict == "fail" and report.path == route, str(report)
    measured = logged(debug_log, NOISE_TABLES)  # (tables, of them one batched call each)
    assert measured and all(batched == tables > 0 for tables, batched in measured), measured
    # The same check with every table point by point (NOISE_LINE=0): the same noise, so the same bands, bit for bit.
    debug_log.clear()
    pointwise = checked(f, x, tables={"NOISE_LINE": 0}, **options)
    assert pointwise.path == route and logged(debug_log, NOISE_TABLES) == [(tables, 0) for tables, _ in measured]
    _assert_same_pairs(report, pointwise)


def _assert_same_pairs(a, b):
    assert a.verdict == b.verdict and len(a.pairs) == len(b.pairs)
    for p, q in zip(a.pairs, b.pairs):
        for x, y in ((p.allowed, q.allowed), (p.numerical, q.numerical), (p.status, q.status)):
            np.testing.assert_array_equal(x, y)
