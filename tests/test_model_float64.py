"""The float64 copy of models as people compose them: a functional model nesting another, a subclassed model whose
constructor passes its dtype to its layers (as keras-hub's do) wrapped by a task-like model, a keras-hub backbone
inside a functional model with a custom head, and a planted 1% defect in such a head."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import events_of

import fastcheck

keras = pytest.importorskip("keras")

def copy_detail(report):
    """What the report says of the model's float64 copy, where it stands in for the model; None where none does."""
    return next((e.detail for e in events_of(report, "ModelCopy") if e.copied), None)


def native_detail(report):
    """Why no float64 copy stands in for the model, where the report says so; None otherwise."""
    return next((e.detail for e in events_of(report, "ModelCopy") if not e.copied), None)


class Head(keras.layers.Layer):
    """``h @ kernel`` with a custom gradient whose kernel part is multiplied by ``factor``."""

    def __init__(self, units=3, factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.units, self.factor = units, factor

    def build(self, shape):
        self.kernel = self.add_weight(shape=(shape[-1], self.units), initializer="glorot_uniform", name="kernel")

    def call(self, h):
        factor = self.factor

        @tf.custom_gradient
        def product(h, kernel):
            def grad(dy):
                return tf.matmul(dy, kernel, transpose_b=True), factor * tf.matmul(h, dy, transpose_a=True)

            return tf.matmul(h, kernel), grad

        return product(h, self.kernel.value)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "factor": self.factor}


def nested_cnn(factor=1.0):
    """A Conv-BN-ReLU trunk as a functional model, called as a layer of another functional model."""
    keras.utils.set_random_seed(0)
    image = keras.Input((6, 6, 2))
    h = keras.layers.Conv2D(3, 3, padding="same")(image)
    h = keras.layers.ReLU()(keras.layers.BatchNormalization()(h))
    trunk = keras.Model(image, h, name="trunk")
    inputs = keras.Input((6, 6, 2))
    outputs = Head(3, factor, name="head")(keras.layers.GlobalAveragePooling2D()(trunk(inputs)))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(2, 6, 6, 2)).astype("float32"), rng.normal(size=(2, 3)).astype("float32")
    return keras.Model(inputs, outputs), (x, y)


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_a_functional_model_nesting_a_sub_model_gets_a_float64_copy(factor):
    model, data = nested_cnn(factor)
    report = fastcheck.check_model(model, "mse", data)
    assert copy_detail(report) is not None, str(report)
    assert len(report.pairs) == len(model.trainable_variables)
    if factor == 1.0:
        assert report.ok and report.verdict == "pass", str(report)
    else:  # the planted defect, and only it
        assert report.verdict == "fail", str(report)
        assert [pair.input_name for pair in report.pairs if not pair.ok] == [model.get_layer("head").kernel.path]


class Trunk(keras.Model):
    """A backbone as keras-hub writes one: its constructor passes its dtype to every layer it makes."""

    def __init__(self, units=4, dtype=None, **kwargs):
        super().__init__(dtype=dtype, **kwargs)
        self.units = units
        self.hidden = keras.layers.Dense(units, activation="tanh", dtype=self.dtype_policy)
        self.norm = keras.layers.LayerNormalization(dtype=self.dtype_policy)

    def call(self, x):
        return self.norm(self.hidden(x))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


class Task(keras.Model):
    """A task as keras-hub writes one: the backbone serialised inside its config."""

    def __init__(self, trunk, classes=2, **kwargs):
        super().__init__(**kwargs)
        self.trunk, self.classes = trunk, classes
        self.out = keras.layers.Dense(classes, dtype=trunk.dtype_policy)

    def call(self, x):
        return self.out(self.trunk(x))

    def get_config(self):
        return {**super().get_config(), "trunk": keras.saving.serialize_keras_object(self.trunk),
                "classes": self.classes}

    @classmethod
    def from_config(cls, config):
        return cls(**{**config, "trunk": keras.saving.deserialize_keras_object(config["trunk"])})


class Pinned(keras.Model):
    """A constructor that pins float32 whatever its config says: no float64 copy."""

    def __init__(self, units=4, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = keras.layers.Dense(units, activation="tanh", dtype="float32")

    def call(self, x):
        return self.hidden(x)


def test_a_subclassed_model_whose_constructor_fixes_the_dtype_gets_a_float64_copy_through_its_config():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(4, 3)).astype("float32"), rng.normal(size=(4, 2)).astype("float32")
    keras.utils.set_random_seed(1)
    task = Task(Trunk(5, dtype="float32"))
    task(x)
    report = fastcheck.check_model(task, "mse", (x, y))
    assert report.ok and copy_detail(report) is not None, str(report)
    assert len(report.pairs) == len(task.trainable_variables) == 6
    pinned = Pinned(5)
    pinned(x)
    report = fastcheck.check_model(pinned, "mse", (x, y[:, :1].repeat(5, axis=1)))
    assert report.ok and copy_detail(report) is None, str(report)
    reason = native_detail(report)
    assert "float32" in reason, reason  # the layer that keeps computing in float32 is named
    # One note says why the numerical side stays float32 (the plan tries no float64 evaluation of its own).
    assert [type(e).__name__ for e in report.events if type(e).__name__ in ("ModelCopy", "NumericalSide")] == [
        "ModelCopy"], report.notes


def tiny_gpt2(keras_hub):
    keras.utils.set_random_seed(2)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=10, num_layers=1, num_heads=2, hidden_dim=4,
                                             intermediate_dim=8, max_sequence_length=4)
    rng = np.random.default_rng(2)
    x = {"token_ids": rng.integers(0, 10, (2, 4)).astype("int32"), "padding_mask": np.ones((2, 4), "int32")}
    return backbone, x


def some_variables(model, *also):
    """A few variables across the backbone (the copy is of the whole model; checking all takes ~10 s)."""
    wanted = ("token_embedding", "self_attention_layer_norm/gamma", "feedforward_output_dense/kernel")
    return [*also, *(next(v for v in model.trainable_variables if part in v.path) for part in wanted)]


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_a_keras_hub_backbone_inside_a_functional_model_gets_a_float64_copy(factor):
    keras_hub = pytest.importorskip("keras_hub")
    backbone, x = tiny_gpt2(keras_hub)
    inputs = {"token_ids": keras.Input((None,), dtype="int32", name="token_ids"),
              "padding_mask": keras.Input((None,), dtype="int32", name="padding_mask")}
    pooled = keras.layers.GlobalAveragePooling1D()(backbone(inputs))
    model = keras.Model(inputs, Head(3, factor, name="head")(pooled))
    head = model.get_layer("head").kernel
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    report = fastcheck.check_model(model, loss, (x, np.array([0, 2])), variables=some_variables(model, head))
    assert copy_detail(report) is not None, str(report)
    assert len(report.pairs) == 4
    assert [pair.input_name for pair in report.pairs if not pair.ok] == ([] if factor == 1.0 else [head.path])


def test_a_keras_hub_task_gets_a_float64_copy():
    keras_hub = pytest.importorskip("keras_hub")
    backbone, x = tiny_gpt2(keras_hub)
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    y = np.random.default_rng(3).integers(0, 10, (2, 4))
    report = fastcheck.check_model(model, loss, (x, y), variables=some_variables(model))
    assert report.ok and copy_detail(report) is not None, str(report)


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_a_model_with_a_lambda_layer_gets_a_float64_copy(factor):
    """A Lambda layer's function is the process's own code, with its globals: the copy's Lambda calls it."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    h = keras.layers.Lambda(lambda t: 2.0 * tf.tanh(t))(keras.layers.Dense(3)(inputs))
    model = keras.Model(inputs, Head(2, factor, name="head")(h))
    rng = np.random.default_rng(0)
    data = rng.normal(size=(3, 4)).astype("float32"), rng.normal(size=(3, 2)).astype("float32")
    report = fastcheck.check_model(model, keras.losses.MeanSquaredError(), data)
    assert copy_detail(report) is not None and native_detail(report) is None
    head = model.get_layer("head").kernel.path
    assert [pair.input_name for pair in report.pairs if not pair.ok] == ([] if factor == 1.0 else [head]), report
