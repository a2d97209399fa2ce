"""Models as libraries build them: variables read through wrappers, tf.Module models with a loss of their own.

Small stand-ins for larq (a QuantizedVariable that transforms its latent variable when
read, a quantized_scope flag set without try/finally) and GPflow (a tf.Module of TFP
TransformedVariable parameters with priors and a zero-argument training_loss), which
need numpy < 2 and are not installed here.
"""

import contextlib
import sys
import textwrap
import types

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
import tf_keras
from conftest import events_of

import fastcheck

RNG = np.random.default_rng(11)


def _tanh(value, defect):
    """tanh, whose gradient is scaled by ``defect`` (1.0: the right one)."""

    @tf.custom_gradient
    def read(x):
        y = tf.tanh(x)
        return y, lambda dy: dy * (1 - y * y) * defect

    return read(tf.convert_to_tensor(value))


class TanhVariable(tf.Variable):
    """Stand-in for larq's QuantizedVariable: wraps a variable and reads it transformed (tanh), when ``active()``."""

    def __init__(self, variable, defect=1.0, active=None):
        self.latent_variable = variable
        self.defect, self.active = defect, active

    def _transform(self, value):
        return value if self.active is not None and not self.active() else _tanh(value, self.defect)

    def value(self):
        return self._transform(self.latent_variable.value())

    def read_value(self):
        return self._transform(self.latent_variable.read_value())

    def numpy(self):
        return self._transform(tf.convert_to_tensor(self.latent_variable)).numpy()

    def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
        return self._transform(self.latent_variable._dense_var_to_tensor(dtype, name, as_ref))

    def _should_act_as_resource_variable(self):
        pass

    def __getattr__(self, name):
        return getattr(self.latent_variable, name)

    def assign(self, value, use_locking=None, name=None, read_value=True):
        return self.latent_variable.assign(value, use_locking, name, read_value)

    dtype = property(lambda self: self.latent_variable.dtype)
    shape = property(lambda self: self.latent_variable.shape)
    name = property(lambda self: self.latent_variable.name)
    trainable = property(lambda self: self.latent_variable.trainable)
    constraint = property(lambda self: self.latent_variable.constraint)


TanhVariable._OverloadAllOperators()
tf.register_tensor_conversion_function(TanhVariable, TanhVariable._dense_var_to_tensor)


def _mse(y_true, y_pred):
    return tf.reduce_mean((y_pred - y_true) ** 2)


def _bytes(variables):
    return [v.latent_variable.numpy().tobytes() if isinstance(v, TanhVariable) else v.numpy().tobytes()
            for v in variables]


# ---------------------------------------------------------------- (a) a variable transformed on read

class QuantLayer(tf.Module):
    def __init__(self, n_in, n_out, dtype, defect=1.0):
        super().__init__()
        self.kernel = TanhVariable(tf.Variable(RNG.normal(size=(n_in, n_out)).astype(dtype)), defect)
        self.bias = tf.Variable(RNG.normal(size=n_out).astype(dtype) * 0.1)

    def __call__(self, x):
        return x @ self.kernel + self.bias


class QuantNet(tf.Module):
    def __init__(self, dtype="float64", defect=1.0):
        super().__init__()
        self.layers = [QuantLayer(3, 4, dtype), QuantLayer(4, 2, dtype, defect)]

    def __call__(self, x):
        return self.layers[1](tf.tanh(self.layers[0](x)))


def _data(dtype="float64"):
    return RNG.normal(size=(5, 3)).astype(dtype), RNG.normal(size=(5, 2)).astype(dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_variable_transformed_on_read_is_checked_through_its_transform(dtype):
    model = QuantNet(dtype)
    before = _bytes(model.variables)
    report = fastcheck.check_model(model, _mse, _data(dtype))
    assert report.ok, str(report)
    assert [p.input_name for p in report.pairs] == ["layers[0].bias", "layers[0].kernel", "layers[1].bias",
                                                    "layers[1].kernel"]
    if dtype == "float32":  # the module itself in float64: the wrapper's transform applies to float64 values
        assert any(e.copied for e in events_of(report, "ModelCopy")), report.notes
    assert _bytes(model.variables) == before


def test_planted_defect_in_a_read_transform_fails_naming_the_variable():
    model = QuantNet(defect=1.01)
    before = _bytes(model.variables)
    report = fastcheck.check_model(model, _mse, _data())
    assert not report.ok
    assert [p.input_name for p in report.pairs if not p.ok] == ["layers[1].kernel"], str(report)
    assert _bytes(model.variables) == before


class QuantDense(tf_keras.layers.Dense):
    """A tf_keras Dense whose kernel is wrapped as larq wraps it (a custom getter), with a constraint."""

    def __init__(self, units, defect=1.0, **kwargs):
        super().__init__(units, kernel_constraint=tf_keras.constraints.MaxNorm(5.0), **kwargs)
        self.defect = defect

    def _add_variable_with_custom_getter(self, name, **kwargs):
        if name == "kernel":
            getter = kwargs.pop("getter")
            kwargs["getter"] = lambda *args, **options: TanhVariable(getter(*args, **options), self.defect)
        return super()._add_variable_with_custom_getter(name, **kwargs)


@pytest.mark.parametrize("defect", [1.0, 1.01])
def test_tf_keras_layer_with_a_wrapped_kernel(defect):
    tf_keras.utils.set_random_seed(3)
    model = tf_keras.Sequential([QuantDense(4, activation="tanh", input_shape=(3,)), QuantDense(2, defect=defect)])
    assert isinstance(model.layers[0].kernel, TanhVariable)
    x, y = _data("float32")
    before = _bytes(model.variables)
    report = fastcheck.check_model(model, "mse", (x, y), precision="native")
    failing = [p.input_name for p in report.pairs if not p.ok]
    assert failing == ([] if defect == 1.0 else [model.layers[1].kernel.name.split(":")[0]]), str(report)
    assert _bytes(model.variables) == before


# ---------------------------------------------------------------- (b) a GPflow-like tf.Module

class Parameter(tfp.util.TransformedVariable):
    """As GPflow's: a softplus-constrained TransformedVariable with a prior, trainable through its variable."""

    def __init__(self, value, prior=None, name=None):
        super().__init__(tf.constant(value, tf.float64), tfp.bijectors.Softplus(), name=name)
        self.prior = prior

    @property
    def unconstrained_variable(self):
        return self.pretransformed_input

    @property
    def trainable(self):
        return self.unconstrained_variable.trainable

    def log_prior_density(self):
        if self.prior is None:
            return tf.constant(0.0, tf.float64)
        return tf.reduce_sum(self.prior.log_prob(tf.convert_to_tensor(self)))


class Kernel(tf.Module):
    def __init__(self, defect=1.0):
        super().__init__()
        self.variance = Parameter(1.3)
        self.lengthscales = Parameter([0.7, 1.4], prior=tfp.distributions.Gamma(np.float64(2.0), np.float64(2.0)))
        self.defect = defect

    def __call__(self, a, b):
        lengthscales = _scaled_gradient(tf.convert_to_tensor(self.lengthscales), self.defect)
        d = (a[:, None, :] - b[None, :, :]) / lengthscales
        return tf.convert_to_tensor(self.variance) * tf.exp(-0.5 * tf.reduce_sum(d * d, -1))


def _scaled_gradient(x, factor):
    @tf.custom_gradient
    def identity(x):
        return tf.identity(x), lambda dy: dy * factor

    return identity(x)


class Gaussian(tf.Module):
    def __init__(self):
        super().__init__()
        self.variance = Parameter(0.2, prior=tfp.distributions.Gamma(np.float64(1.5), np.float64(4.0)))


class GPR(tf.Module):
    """Exact GP regression as GPflow computes it: not callable, its loss takes no arguments."""

    def __init__(self, defect=1.0):
        super().__init__()
        self.data = (RNG.normal(size=(7, 2)), RNG.normal(size=(7, 1)))
        self.kernel, self.likelihood = Kernel(defect), Gaussian()

    @property
    def trainable_parameters(self):
        found = self._flatten(predicate=lambda m: isinstance(m, Parameter))
        return [p for p in found if p.trainable]  # reads .trainable, as GPflow's log_prior_density does

    def training_loss(self):
        x, y = self.data
        k = self.kernel(x, x) + tf.convert_to_tensor(self.likelihood.variance) * tf.eye(len(x), dtype=tf.float64)
        chol = tf.linalg.cholesky(k)
        alpha = tf.linalg.cholesky_solve(chol, y)
        fit = 0.5 * tf.reduce_sum(y * alpha) + tf.reduce_sum(tf.math.log(tf.linalg.diag_part(chol)))
        return fit - tf.add_n([p.log_prior_density() for p in self.trainable_parameters])

    def training_loss_closure(self):
        return tf.function(lambda: self.training_loss())  # GPflow compiles its closure by default


def test_gpflow_like_module_with_a_loss_of_its_own():
    model = GPR()
    before = _bytes(model.variables)
    report = fastcheck.check_model(model, model.training_loss)
    assert report.ok, str(report)
    assert [p.input_name for p in report.pairs] == ["kernel.lengthscales", "kernel.variance", "likelihood.variance"]
    # The analytical side is training's: tape.gradient over the unconstrained variables.
    with tf.GradientTape() as tape:
        loss = model.training_loss()
    expected = tape.gradient(loss, model.trainable_variables)
    for pair, gradient in zip(report.pairs, expected):
        np.testing.assert_allclose(pair.analytical.reshape(-1), gradient.numpy().reshape(-1), rtol=1e-12)
    assert _bytes(model.variables) == before
    compiled = fastcheck.GradientChecker().check_model(model, model.training_loss_closure())
    assert compiled.ok and len(compiled.pairs) == 3, str(compiled)


def test_gpflow_like_planted_defect_fails_naming_the_parameter():
    model = GPR(defect=1.01)
    report = fastcheck.check_model(model, model.training_loss, None)
    assert [p.input_name for p in report.pairs if not p.ok] == ["kernel.lengthscales"], str(report)


def test_keras3_model_with_a_loss_of_its_own():
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])
    x, y = _data("float32")
    report = fastcheck.check_model(model, lambda: _mse(y, model(x)))
    assert report.ok, str(report)
    assert [p.input_name for p in report.pairs] == [v.path for v in model.trainable_variables]
    (side,) = events_of(report, "ModelCopy")
    assert not side.copied and side.detail.startswith("loss_fn takes no arguments"), report.notes
    with pytest.raises(ValueError, match="precision='float64' was requested, but loss_fn takes no arguments"):
        fastcheck.check_model(model, lambda: _mse(y, model(x)), precision="float64")


def test_module_loss_misuse_is_explained():
    model = GPR()
    x, y = model.data
    with pytest.raises(ValueError, match=r"loss_fn takes no arguments .* omit data: check_model\(model, loss_fn\)"):
        fastcheck.check_model(model, model.training_loss, (x, y))
    with pytest.raises(TypeError, match=r"model \(GPR\) is not callable.*check_model\(model, model.training_loss\)"):
        fastcheck.check_model(model, _mse, (x, y))
    with pytest.raises(TypeError, match="data is None, so loss_fn must be a callable taking no arguments"):
        fastcheck.check_model(model, "mse")
    with pytest.raises(ValueError, match=r"data is None, so fastcheck calls loss_fn\(\) .* pass data=\(x, y\)"):
        fastcheck.check_model(model, _mse)
    with pytest.raises(ValueError, match="training=True is for .* omit training=True"):
        fastcheck.check_model(model, model.training_loss, training=True)


# ---------------------------------------------------------------- (c, d) library flags, state restored

def _fake_larq_scope():
    """larq.quantized_scope as larq writes it: a module flag its scope sets without try/finally."""
    module = types.ModuleType("larq.quantized_scope")
    exec(textwrap.dedent("""
        import contextlib
        _SHOULD_QUANTIZE = False

        @contextlib.contextmanager
        def scope(quantize):
            global _SHOULD_QUANTIZE
            backup = _SHOULD_QUANTIZE
            _SHOULD_QUANTIZE = quantize
            yield quantize
            _SHOULD_QUANTIZE = backup

        def should_quantize():
            return _SHOULD_QUANTIZE
    """), module.__dict__)
    return module


def _scoped_model(scope):
    class ScopedLayer(tf.Module):
        """A larq-like layer: reads its kernel quantized in the scope, and fails for float64 inputs inside it."""

        def __init__(self):
            super().__init__()
            self.kernel = TanhVariable(tf.Variable(RNG.normal(size=(3, 2)).astype("float32")),
                                       active=scope.should_quantize)

        def __call__(self, x):
            with scope.scope(True):
                if x.dtype == tf.float64:
                    raise TypeError("this layer computes in float32 only")
                return tf.tanh(x @ self.kernel)

    return ScopedLayer()


def test_library_flags_are_restored_after_a_check_also_when_it_raises(monkeypatch):
    scope = _fake_larq_scope()
    monkeypatch.setitem(sys.modules, "larq.quantized_scope", scope)
    model = _scoped_model(scope)
    x, y = _data("float32")
    latent = model.kernel.latent_variable.numpy()
    # The stand-in leaks as larq does: a failure inside the scope leaves it switched on.
    with contextlib.suppress(TypeError):
        model(tf.constant(x, tf.float64))
    assert scope.should_quantize() and not np.array_equal(model.kernel.numpy(), latent)
    scope._SHOULD_QUANTIZE = False

    before = _bytes(model.variables)
    report = fastcheck.check_model(model, _mse, (x, y))  # precision="auto": the float64 attempt raises inside
    assert report.ok, str(report)
    assert any(not e.copied and "its float64 copy" in e.detail and "float32 only" in e.detail
               for e in events_of(report, "ModelCopy")), report.notes
    assert scope._SHOULD_QUANTIZE is False and np.array_equal(model.kernel.numpy(), latent)
    assert _bytes(model.variables) == before

    with pytest.raises(ValueError, match="precision='float64' was requested"):
        fastcheck.check_model(model, _mse, (x, y), precision="float64")
    assert scope._SHOULD_QUANTIZE is False and _bytes(model.variables) == before

    scope._SHOULD_QUANTIZE = True  # a flag that was on before the check is on after it
    fastcheck.check_model(model, _mse, (x, y), precision="native")
    assert scope._SHOULD_QUANTIZE is True
