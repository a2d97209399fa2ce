"""Real networks through check_model: a ReLU6 CNN and a Transformer encoder block, correct and with one planted
defect, in float32 (numerical side on a float64 copy of the model) and float64; kinks of ReLU networks; the copy's
fallbacks; the report of a model with many variables."""

import re

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from conftest import events_of

import fastcheck

keras = pytest.importorskip("keras")

def copy_detail(report):
    """What the report says of the model's float64 copy, where it stands in for the model; None where none does."""
    return next((e.detail for e in events_of(report, "ModelCopy") if e.copied), None)


def native_detail(report):
    """Why no float64 copy stands in for the model, where the report says so; None otherwise."""
    return next((e.detail for e in events_of(report, "ModelCopy") if not e.copied), None)


def planted_scale(x, scale, factor):
    """``x * scale`` (scale per channel), with a custom gradient whose scale part is multiplied by ``factor``."""

    @tf.custom_gradient
    def scaled(x, scale):
        def grad(dy):
            return dy * scale, factor * tf.reduce_sum(dy * x, axis=list(range(len(x.shape) - 1)))

        return x * scale, grad

    return scaled(x, scale)


class PlantedScale(keras.layers.Layer):
    """``y = scale * x`` per channel, with a custom gradient whose scale part is multiplied by ``factor``."""

    def __init__(self, factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def build(self, shape):
        self.scale = self.add_weight(shape=(shape[-1],), initializer="ones", name="scale")

    def call(self, x):
        return planted_scale(x, self.scale.value, self.factor)

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


def relu_cnn(factor=None):
    """Conv + BN + ReLU6, depthwise conv + BN + ReLU6, max pooling: kinks and max-pool ties at random init."""
    keras.utils.set_random_seed(1)
    layers = [keras.Input((6, 6, 2)), keras.layers.Conv2D(3, 3, padding="same"), keras.layers.BatchNormalization(),
              keras.layers.ReLU(6.0), keras.layers.DepthwiseConv2D(3, padding="same"),
              keras.layers.BatchNormalization(), keras.layers.ReLU(6.0)]
    if factor is not None:
        layers.append(PlantedScale(factor))
    layers += [keras.layers.MaxPooling2D(2), keras.layers.GlobalAveragePooling2D(),
               keras.layers.Dense(3, activation="softmax")]
    model = keras.Sequential(layers)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 6, 6, 2)).astype(keras.config.floatx())
    y = np.eye(3)[[0, 2]].astype(keras.config.floatx())
    return model, (x, y)


def encoder_block(factor=None):
    """Self-attention + residual + LayerNormalization, ReLU feed-forward + residual + LayerNormalization."""
    keras.utils.set_random_seed(2)
    inputs = keras.Input((3, 4))
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=2)(inputs, inputs)
    if factor is not None:
        attended = PlantedScale(factor)(attended)
    h = keras.layers.LayerNormalization()(inputs + attended)
    h = keras.layers.LayerNormalization()(h + keras.layers.Dense(4)(keras.layers.Dense(6, activation="relu")(h)))
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h)))
    rng = np.random.default_rng(2)
    return model, (rng.normal(size=(2, 3, 4)).astype(keras.config.floatx()),
                   rng.normal(size=(2, 1)).astype(keras.config.floatx()))


NETWORKS = {"relu_cnn": (relu_cnn, "categorical_crossentropy"), "encoder_block": (encoder_block, "mse")}


@pytest.fixture(params=["float32", "float64"])
def floatx(request):
    """Layers, inputs and losses built in this dtype (Keras keeps a global dtype policy beside floatx)."""
    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx(request.param)
    keras.config.set_dtype_policy(request.param)
    try:
        yield request.param
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)


@pytest.mark.parametrize("network", sorted(NETWORKS))
def test_network_passes_with_defaults(network, floatx):
    build, loss = NETWORKS[network]
    model, data = build()
    report = fastcheck.check_model(model, loss, data)
    assert report.verdict == "pass", str(report)
    assert len(report.pairs) == len(model.trainable_variables)
    copied = copy_detail(report) is not None
    # A float32 model is differentiated numerically on its float64 copy; a float64 model is its own.
    assert copied == (floatx == "float32"), report.notes


@pytest.mark.parametrize("network", sorted(NETWORKS))
def test_planted_one_percent_defect_fails_naming_its_variable(network):
    build, loss = NETWORKS[network]
    model, data = build(factor=1.01)
    report = fastcheck.check_model(model, loss, data)
    assert report.verdict == "fail", str(report)
    planted = next(layer for layer in model.layers if isinstance(layer, PlantedScale))
    assert [pair.input_name for pair in report.failures] == [planted.scale.path]
    # Full mode names the factor; auto may pick fast mode (its time rule applies from 16 variables),
    # whose pair names the wrong region instead.
    hint = report.failures[0].hint
    assert ("constant factor of 1.01" in hint) if report.mode != "fast" else ("directional derivative" in hint), hint
    assert str(report).splitlines()[2].split()[2].endswith("/scale")  # the failing pair heads the table


def collapsed_relu6_cnn():
    """A small replica of MobileNetV2 at random init: BatchNorm in inference mode (mean 0, variance 1) does not
    normalise, so small kernels shrink every layer's activations until the last ones are ~1e-11, within any
    step of their ReLU6 kinks at 0."""
    keras.utils.set_random_seed(0)
    layers = [keras.Input((4, 4, 3))]
    for _ in range(4):
        layers += [keras.layers.Conv2D(6, 3, padding="same", use_bias=False,
                                       kernel_initializer=keras.initializers.RandomNormal(stddev=4e-4)),
                   keras.layers.BatchNormalization(), keras.layers.ReLU(6.0)]
    model = keras.Sequential(layers + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3, "softmax")])
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(2, 4, 4, 3)).astype("float32")
    return model, (x, np.eye(3)[[1, 2]].astype("float32"))


def test_activations_at_their_kinks_are_never_a_failure():
    model, data = collapsed_relu6_cnn()
    hidden = keras.Model(model.inputs[0], model.layers[-3].output)(data[0])
    assert 0 < float(np.max(np.abs(hidden))) < 1e-9  # the regime of the issue: activations far below any step
    last_beta = [layer.beta for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)][-1]
    report = fastcheck.check_model(model, "categorical_crossentropy", data, variables=[last_beta])
    statuses = np.concatenate([pair.statuses.ravel() for pair in report.pairs])
    assert report.verdict in ("pass", "undecidable"), str(report)
    assert np.sum(statuses == "not differentiable here") > 0, str(report)  # kinks, the tape's value between sides
    # Whatever is not a pass is an element at kinks that no step resolves, and says so.
    assert set(statuses.tolist()) <= {"ok", "not differentiable here", "kinks no step resolves"}, str(report)
    if report.verdict == "undecidable":
        assert "kinks no step resolves" in str(report)


def test_float64_copy_is_checked_against_the_model_and_named(floatx):
    model, data = relu_cnn()
    report = fastcheck.check_model(model, "categorical_crossentropy", data, variables=model.trainable_variables[:2])
    copy_notes = [e.detail for e in events_of(report, "ModelCopy") if e.copied]
    if floatx == "float64":
        assert not copy_notes and native_detail(report) is None
        return
    assert len(copy_notes) == 1 and "roundings" in copy_notes[0] and "under the float64 dtype policy" in copy_notes[0]
    assert events_of(report, "NumericalSide")[0].upcast
    native = fastcheck.check_model(model, "categorical_crossentropy", data, variables=model.trainable_variables[:2],
                                   precision="native")
    assert not events_of(native, "ModelCopy"), native.notes


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2, activation="tanh")

    def call(self, x, training=False):
        return self.dense(x)


def _small_data():
    rng = np.random.default_rng(3)
    return rng.normal(size=(4, 3)).astype("float32"), rng.normal(size=(4, 2)).astype("float32")


class Widths(keras.Model):
    """A subclassed model whose constructor needs an argument that Keras's get_config does not record."""

    def __init__(self, width):
        super().__init__()
        self.dense = keras.layers.Dense(width)

    def call(self, x):  # no training argument
        return self.dense(x)


class Unnamed(keras.layers.Layer):
    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], 2), initializer="glorot_uniform")  # named "variable"

    def call(self, x):
        return tf.tanh(tf.matmul(x, self.w))


class Nested(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner, self.head = Unnamed(), keras.layers.Dense(2)

    def call(self, x, training=False):
        return self.head(self.inner(x))


class Leaky(keras.Model):
    """Constructor arguments that Keras's automatic config records as their defaults (Model.__new__
    drops them); ``units`` kept as an attribute of its name, ``slope`` under a leading underscore
    unless ``hidden``, where the model keeps it under another name."""

    def __init__(self, units=4, slope=0.1, hidden=False, **kwargs):
        super().__init__(**kwargs)
        self.units, self.hidden = units, hidden
        if hidden:
            self.alpha = slope
        else:
            self._slope = slope
        self.inner, self.head = keras.layers.Dense(units), keras.layers.Dense(2)

    def call(self, x):
        return self.head(tf.nn.leaky_relu(self.inner(x), self.alpha if self.hidden else self._slope))


def test_a_subclassed_model_takes_its_constructor_arguments_from_its_attributes():
    x, y = _small_data()
    model = Leaky(units=5, slope=0.3)
    model(x)
    assert model.get_config()["units"] == 4  # what Keras records: the defaults
    report = fastcheck.check_model(model, "mse", (x, y))
    copy = copy_detail(report)
    assert "attributes of the same names: slope=0.3, units=5" in copy and report.ok, str(report)
    hidden = Leaky(slope=0.3, hidden=True)  # the slope is not found: the copy computes another loss
    hidden(x)
    report = fastcheck.check_model(hidden, "mse", (x, y))
    reason = native_detail(report)
    assert "roundings of the loss apart" in reason and "keep each argument as an attribute" in reason, reason


def test_a_subclassed_model_is_rebuilt_in_float64_or_checked_natively_saying_why():
    x, y = _small_data()
    model = Subclassed()
    model(x)
    before = [v.numpy().copy() for v in model.variables]
    report = fastcheck.check_model(model, "mse", (x, y))
    assert report.ok, str(report)
    copy = copy_detail(report)
    assert "rebuilt from Subclassed.from_config(get_config()) under the float64 dtype policy" in copy
    nested = Nested()
    nested(x)  # its copy's unnamed weight is "variable_1": matched without Keras's number
    report = fastcheck.check_model(nested, "mse", (x, y))
    assert report.ok and copy_detail(report) is not None, str(report)
    widths = Widths(2)
    widths(x)
    report = fastcheck.check_model(widths, "mse", (x, y))
    assert report.ok, str(report)
    reason = native_detail(report)
    assert "Widths is a subclassed model that from_config(get_config()) cannot rebuild" in reason
    with pytest.raises(ValueError, match="precision='float64' was requested, but .*cannot rebuild"):
        fastcheck.check_model(widths, "mse", (x, y), precision="float64")
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.variables))


class AutoConfigScale(keras.layers.Layer):
    """A custom layer as users write one: no get_config (Keras's automatic config, which keeps no
    name), one unnamed and one named weight, a custom gradient off by ``factor`` for the scale."""

    def __init__(self, factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def build(self, shape):
        self.scale = self.add_weight(shape=(shape[-1],), initializer="ones")
        self.shift = self.add_weight(shape=(shape[-1],), initializer="zeros", name="shift")

    def call(self, x):
        return planted_scale(x, self.scale.value, self.factor) + self.shift


@pytest.mark.parametrize("factor", [1.0, 1.02])
def test_a_custom_layer_without_a_config_name_is_cloned_in_float64(factor):
    # Its clone is named afresh (sequential/auto_config_scale_1/variable_1): the copy used to be
    # refused, and the model checked in float32, where steps across ReLU kinks raise false alarms.
    x, y = _small_data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(6), keras.layers.ReLU(),
                              AutoConfigScale(factor), keras.layers.Dense(2)])
    model(x)
    report = fastcheck.check_model(model, "mse", (x, y))
    rebuilt = "from_config(get_config()) under the float64 dtype policy"
    assert rebuilt in (copy_detail(report) or ""), str(report)
    failed = {re.sub(r"_\d+$", "", p.input_name.rsplit("/", 1)[-1]) for p in report.pairs if not p.ok}
    assert failed == (set() if factor == 1.0 else {"variable"}), str(report)


class ReluCNN(keras.Model):
    def __init__(self, factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.conv = keras.layers.Conv2D(4, 3, padding="same")
        self.norm = keras.layers.BatchNormalization()
        self.planted = PlantedScale(factor)
        self.pool = keras.layers.MaxPooling2D()
        self.flat = keras.layers.Flatten()
        self.head = keras.layers.Dense(4)

    def call(self, x, training=False):
        return self.head(self.flat(self.pool(self.planted(tf.nn.relu(self.norm(self.conv(x), training=training))))))


@pytest.mark.parametrize("seed", [0, 2])
def test_subclassed_relu_cnn_has_no_false_alarm_and_its_planted_defect_fails(seed):
    # A float32 numerical side over this network put its steps across ReLU kinks within 1e-4 of
    # the point, and float32 noise hid them: 4 of 6 seeds of the correct model FAILed.
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(4, 8, 8, 3)).astype("float32")
    y = keras.utils.to_categorical(rng.integers(0, 4, 4), 4)
    loss = keras.losses.CategoricalCrossentropy(from_logits=True)
    keras.utils.set_random_seed(seed)
    model = ReluCNN()
    model(x)
    report = fastcheck.check_model(model, loss, (x, y))
    assert report.ok, str(report)
    assert copy_detail(report) is not None, str(report)
    keras.utils.set_random_seed(seed)
    # Rebuilt from get_config, the copy has the default factor: the same forward function, so it stands in.
    wrong = ReluCNN(factor=1.05)
    wrong(x)
    report = fastcheck.check_model(wrong, loss, (x, y))
    assert any(p.input_name.endswith("scale") and not p.ok for p in report.pairs), str(report)


def test_float16_compute_policy_gets_a_float64_copy_and_float16_tolerances():
    x, y = _small_data()
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="tanh")])
        report = fastcheck.check_model(model, "mse", (x, y))
        native = fastcheck.check_model(model, "mse", (x, y), precision="native")
    finally:
        keras.config.set_dtype_policy(policy)
    assert report.ok, str(report)
    copy = copy_detail(report)
    assert "float16 roundings: layer 'dense" in copy and "computes in float16 (dtype policy mixed_float16)" in copy
    (found,) = events_of(report, "PrecisionFound")
    assert (found.precision, found.atol, found.rtol, found.given) == ("float16", 0.01, 0.01, False), report.notes
    assert native.ok and copy_detail(native) is None, str(native)


def test_tf_keras_models_and_modules_get_a_float64_copy():
    x, y = _small_data()
    tf_keras_model = tf_keras.Sequential([tf_keras.layers.Dense(3, activation="relu", input_shape=(3,)),
                                          tf_keras.layers.BatchNormalization(), tf_keras.layers.Dense(2)])
    report = fastcheck.check_model(tf_keras_model, "mse", (x, y))
    assert report.ok and "cloned layer by layer" in (copy_detail(report) or ""), str(report)

    class Generic(tf.Module):  # dtype-generic code: the module itself runs in float64
        def __init__(self):
            self.w = tf.Variable(np.full((3, 2), 0.3, "float32"))

        def __call__(self, x):
            return tf.tanh(x @ self.w)

    report = fastcheck.check_model(Generic(), lambda t, p: tf.reduce_mean((t - p) ** 2), (x, y))
    assert report.ok and (copy_detail(report) or "").startswith("the module itself"), str(report)

    class Fixed(Generic):  # a float32 constant inside: no float64 copy
        def __call__(self, x):
            return tf.tanh(x @ self.w + tf.constant(0.5))

    report = fastcheck.check_model(Fixed(), lambda t, p: tf.reduce_mean((t - p) ** 2), (x, y))
    assert report.ok and (native_detail(report) or "").startswith("its float64 copy"), str(report)


def test_report_of_many_variables_reads_failing_first_and_collapses_the_rest():
    keras.utils.set_random_seed(4)
    layers = [keras.Input((3,))] + [keras.layers.Dense(3, activation="tanh", name=f"block_{i}_dense")
                                    for i in range(12)]
    layers.insert(7, PlantedScale(0.5, name="block_6_scale"))
    model = keras.Sequential(layers)
    x, _ = _small_data()
    report = fastcheck.check_model(model, "mse", (x, np.zeros((4, 3), "float32")), jit_compile=False,
                                   memory_budget=1 << 14)
    text = str(report).splitlines()
    assert report.verdict == "fail" and len(report.pairs) == 25
    assert text[2].split()[2] == model.get_layer("block_6_scale").scale.path and text[2].split()[3] == "FAIL"
    collapsed = [line for line in text if line.strip().startswith("ok: 24 more pairs")]
    assert len(collapsed) == 1, "\n".join(text)
    assert f"by layer (in {model.name}/): block_0* (2), block_1* (2)" in collapsed[0], collapsed[0]
    assert len(text) < 20, "\n".join(text)
    # The JSON keeps every pair and every note.
    summary = report.to_dict()
    assert len(summary["pairs"]) == 25 and summary["notes"] == report.notes
