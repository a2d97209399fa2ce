"""``python -m benchmarks models``: check_model on real model classes, correct and with a planted 1% defect.

For each model class, two variants that differ in one number:

``correct``
    The model with a custom-gradient layer whose hand-written gradient is exact
    (``factor=1.0``).
``defect``
    The same model with that gradient off by 1% (``factor=1.01``) in one float
    variable (the ``planted`` variable of the table): a right check FAILs it,
    naming it.

Each is checked with ``fastcheck.check_model`` in the default mode
(``mode="auto"``) and with ``mode="fast"``, over seeds 0-7 (the seed draws the
weights and the data); where ``mode="auto"`` resolves to fast mode anyway
(``mobilenet-nested``), also with ``mode="full"`` on seeds 0-1 (``EXTRA_MODES``).  Per check the JSON keeps the verdict, the resolved mode
and path, the FAIL-named and undecidable variables, the seconds of the
``check_model`` call (the model built before the clock; the first check of a
class in its process includes TensorFlow's tracing), the report's note on the
numerical side (a float64 copy of the model, or the model's own precision and
why), or the exception it raised.  The table sums them up per class, variant and
mode; "right" counts the seeds whose verdict is the right one (correct: ``pass``;
defect: ``fail`` with the planted variable among the FAIL-named ones -- for the
larq network only the real-valued head's variables decide, see below).

Classes (``--classes``), main environment (Keras 3, numpy 2):

``bert-backbone``, ``gpt2-backbone``
    ``keras_hub.models.BertBackbone`` / ``GPT2Backbone`` (2 layers, 2 heads,
    hidden 32, intermediate 64, vocabulary 100, sequence 8, batch 2) nested in
    a functional model, a ``PlantedScale`` gain (per channel) on the sequence
    output, mean squared error against random targets.
``gpt2-causallm``, ``bert-classifier``
    ``keras_hub.models.GPT2CausalLM`` / ``BertTextClassifier`` (3 classes) with
    ``preprocessor=None`` on the same backbones, nested likewise with the gain on
    the logits, sparse categorical cross-entropy from logits.
``mobilenet-nested``
    ``keras.applications.MobileNetV2(weights=None, alpha=0.35, include_top=False,
    input 32x32x3)`` truncated after ``block_2_add``, nested as a sub-model in a
    functional model: trunk, ``PlantedScale`` gain, global average pooling,
    Dense(10); categorical cross-entropy; batch 4.
``tf-keras``
    A tf_keras Sequential model: Conv2D(4, 3, tanh), Flatten, Dense(8, tanh), and
    a ``PlantedDense(3)`` head; batch 4 of 8x8x3 images, cross-entropy from logits.

Legacy environment (numpy < 2, ``TF_USE_LEGACY_KERAS=1``; setup in
``benchmarks/README-legacy.md``):

``gpflow-gpr``, ``gpflow-svgp``
    ``gpflow.models.GPR`` (16 points in 2-D) and ``SVGP`` (24 points, 6 inducing
    points, Gaussian likelihood) with a squared-exponential kernel, Gamma priors on
    its lengthscales and variance and on the likelihood variance, and a
    ``PlantedLinear`` mean function (normal prior on ``A``, the planted variable),
    in float64.  The loss has no data argument: ``check_model(model,
    model.training_loss)`` (SVGP: ``model.training_loss_closure(data)``).  Where
    this fastcheck has no zero-argument form yet (``data`` is required), the loss is
    wrapped -- a ``tf.Module`` holding the model whose call returns the training
    loss, ``check_model(wrapper, lambda y, loss: loss, (0, 0))`` -- and the table
    marks the row ``wrapped``.
``larq-bnn``
    ``larq.layers.QuantConv2D(4, 3)`` and ``QuantDense(8)`` with
    ``kernel_quantizer="ste_sign"`` and ``kernel_constraint="weight_clip"`` (tanh
    between), and a real-valued ``PlantedDense(3)`` head, on tf_keras.  The
    quantized kernels' autodiff gradient is the straight-through estimate, not the
    derivative of ``sign`` (zero almost everywhere), so a FAIL naming them is
    right too: only the head decides "right".

    python -m benchmarks models [--env main|legacy|auto] [--quick] [--classes NAME,NAME]
                                [--modes default,fast,full] [--seeds 8] [--out DIR] [--in-process]

``--seeds``: ``N`` for every class and mode, or comma-separated entries ``N``, ``MODE=N``, ``CLASS:N``
and ``CLASS:MODE=N``, the most specific one applying (a class's own entry before a mode's), e.g.
``--seeds 4,default=2,tf-keras:8,mobilenet-nested:default=4`` (the extra full mode of ``EXTRA_MODES``
keeps its own count unless an entry names it).

``--env auto`` (the default) runs the legacy classes when numpy < 2 (the legacy
venv) and the main ones otherwise.  ``--quick``: seed 0 only and fewer classes
(``bert-backbone``, ``mobilenet-nested``, ``tf-keras``; legacy ``gpflow-gpr``,
``larq-bnn``), for a smoke run.  Each class runs in a fresh Python process (one
per class, all its variants, modes and seeds), killed after ``--timeout``
seconds; a class one of whose checks takes over 60 s drops to 2 seeds from then
on (the table says so).  ``--in-process`` runs the checks in this process instead
(the smoke test).  Writes ``models.md`` and ``models.json`` (legacy:
``models-legacy.md`` / ``.json``) to ``--out`` (default ``benchmarks/results``;
``--name`` changes the file stem) with the CPU model.  Exits 0: the verdicts are the measurement, not a pass/fail of this run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.run import _cpu_model, _git_commit

RESULTS = Path(__file__).resolve().parent / "results"
MAIN_CLASSES = ("bert-backbone", "gpt2-backbone", "gpt2-causallm", "bert-classifier", "mobilenet-nested", "tf-keras")
LEGACY_CLASSES = ("gpflow-gpr", "gpflow-svgp", "larq-bnn")
QUICK = {"main": ("bert-backbone", "mobilenet-nested", "tf-keras"), "legacy": ("gpflow-gpr", "larq-bnn")}
VARIANTS = {"correct": 1.0, "defect": 1.01}
MODES = {"default": {}, "fast": {"mode": "fast"}, "full": {"mode": "full"}}
DEFAULT_MODES = ("default", "fast")
# Where mode="auto" resolves to fast mode, the full check too, on this many seeds (unless --modes is given).
EXTRA_MODES = {"mobilenet-nested": {"full": 2}}
SLOW_CHECK_S = 60.0  # a class one of whose checks takes longer drops to SLOW_SEEDS seeds
SLOW_SEEDS = 2
MOBILENET_CUT = "block_2_add"
# keras-hub sizes
VOCAB, SEQ, BATCH, HIDDEN = 100, 8, 2, 32


# ----------------------------------------------------------------------------- planted layers


_LAYERS: dict = {}


def planted_dense_class(keras_module):
    """``PlantedDense`` for ``keras_module`` (Keras 3 or tf_keras): ``x @ kernel + bias`` whose custom gradient
    for ``kernel`` is multiplied by ``factor`` (exact at 1.0)."""
    key = ("dense", keras_module.__name__)
    if key in _LAYERS:
        return _LAYERS[key]
    import tensorflow as tf

    class PlantedDense(keras_module.layers.Layer):
        def __init__(self, units, factor=1.0, **kwargs):
            super().__init__(**kwargs)
            self.units, self.factor = units, factor

        def build(self, shape):
            self.kernel = self.add_weight(name="kernel", shape=(int(shape[-1]), self.units),
                                          initializer="glorot_uniform")
            self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="zeros")

        def call(self, x):
            factor = self.factor

            @tf.custom_gradient
            def dense(x, kernel):
                def grad(dy):
                    return tf.matmul(dy, kernel, transpose_b=True), factor * tf.matmul(x, dy, transpose_a=True)

                return tf.matmul(x, kernel), grad

            # A Keras 3 variable reads its stateless-scope value here; tf_keras's is swapped for a tensor.
            return dense(x, tf.convert_to_tensor(self.kernel)) + tf.convert_to_tensor(self.bias)

        def get_config(self):
            return {**super().get_config(), "units": self.units, "factor": self.factor}

    _LAYERS[key] = PlantedDense
    return PlantedDense


def planted_linear_class():
    """GPflow mean function ``X @ A`` whose custom gradient for ``A`` is multiplied by ``factor``."""
    if "linear" in _LAYERS:
        return _LAYERS["linear"]
    import gpflow
    import tensorflow as tf

    class PlantedLinear(gpflow.mean_functions.MeanFunction):
        def __init__(self, A, factor=1.0):
            super().__init__()
            self.A = gpflow.Parameter(A)
            self.factor = factor

        def __call__(self, X):
            factor = self.factor

            @tf.custom_gradient
            def linear(X, A):
                def grad(dy):
                    return tf.matmul(dy, A, transpose_b=True), factor * tf.matmul(X, dy, transpose_a=True)

                return tf.matmul(X, A), grad

            return linear(X, tf.convert_to_tensor(self.A))

    _LAYERS["linear"] = PlantedLinear
    return PlantedLinear


# ----------------------------------------------------------------------------- model builders


class Case:
    """What one check needs: ``check_model(model, loss, data)`` (``data`` None: a zero-argument loss)."""

    def __init__(self, model, loss, data, planted, planted_name: str | None = None):
        self.model, self.loss, self.data, self.planted_variable = model, loss, data, planted
        self.planted = planted_name or getattr(planted, "path", None) or planted.name

    def planted_gradient(self) -> float:
        """max |d loss / d planted| by autodiff (with the defect: 1.01 x the true one)."""
        import tensorflow as tf

        with tf.GradientTape() as tape:
            if self.data is None:
                value = self.loss()
            else:
                x, y = self.data
                value = tf.reduce_sum(self.loss(y, self.model(x, training=False)))
        gradient = tape.gradient(value, self.planted_variable)
        return float(np.max(np.abs(np.asarray(gradient)))) if gradient is not None else float("nan")


def _hub_backbone(kind: str):
    import keras_hub

    cls = keras_hub.models.BertBackbone if kind == "bert" else keras_hub.models.GPT2Backbone
    return cls(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=HIDDEN, intermediate_dim=2 * HIDDEN,
               max_sequence_length=SEQ)


def _hub_inputs(kind: str, rng):
    import keras

    names = ("token_ids", "segment_ids", "padding_mask") if kind == "bert" else ("token_ids", "padding_mask")
    tensors = {"token_ids": rng.integers(0, VOCAB, (BATCH, SEQ)).astype("int32"),
               "segment_ids": rng.integers(0, 2, (BATCH, SEQ)).astype("int32"),
               "padding_mask": (np.arange(SEQ)[None, :] < np.array([[SEQ], [SEQ - 2]])).astype("int32")}
    symbolic = {name: keras.Input(shape=(SEQ,), dtype="int32", name=name) for name in names}
    return symbolic, {name: tensors[name] for name in names}


def build_keras_hub(name: str, factor: float, seed: int) -> Case:
    import keras

    keras.backend.clear_session()  # layer names restart: the same names in every seed's report
    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    kind = "bert" if name.startswith("bert") else "gpt2"
    symbolic, x = _hub_inputs(kind, rng)
    backbone = _hub_backbone(kind)
    gain = planted_scale_class()(factor, name="planted_scale")
    if name.endswith("backbone"):
        outputs = backbone(symbolic)
        sequence = outputs["sequence_output"] if isinstance(outputs, dict) else outputs
        model = keras.Model(symbolic, gain(sequence))
        y = rng.normal(size=(BATCH, SEQ, HIDDEN)).astype("float32")
        loss = keras.losses.MeanSquaredError()
    else:
        import keras_hub

        if name == "gpt2-causallm":
            task = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
            y = rng.integers(0, VOCAB, (BATCH, SEQ)).astype("int32")
        else:
            task = keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=3, preprocessor=None)
            y = rng.integers(0, 3, (BATCH,)).astype("int32")
        model = keras.Model(symbolic, gain(task(symbolic)))
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return Case(model, loss, (x, y), gain.scale)


def build_mobilenet(factor: float, seed: int) -> Case:
    import keras

    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    base = keras.applications.MobileNetV2(input_shape=(32, 32, 3), weights=None, alpha=0.35, include_top=False)
    trunk = keras.Model(base.input, base.get_layer(MOBILENET_CUT).output, name="mobilenet_trunk")
    gain = planted_scale_class()(factor, name="planted_scale")
    inputs = keras.Input((32, 32, 3))
    h = gain(trunk(inputs))
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(10, name="head")(h))
    x = rng.uniform(-1, 1, size=(4, 32, 32, 3)).astype("float32")
    y = np.eye(10, dtype="float32")[rng.integers(0, 10, 4)]
    return Case(model, keras.losses.CategoricalCrossentropy(from_logits=True), (x, y), gain.scale)


def build_tf_keras(factor: float, seed: int) -> Case:
    import tf_keras

    tf_keras.backend.clear_session()
    tf_keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    head = planted_dense_class(tf_keras)(3, factor, name="planted_dense")
    model = tf_keras.Sequential([tf_keras.Input((8, 8, 3)), tf_keras.layers.Conv2D(4, 3, activation="tanh"),
                                 tf_keras.layers.Flatten(), tf_keras.layers.Dense(8, activation="tanh"), head])
    x = rng.uniform(-1, 1, size=(4, 8, 8, 3)).astype("float32")
    y = np.eye(3, dtype="float32")[rng.integers(0, 3, 4)]
    return Case(model, tf_keras.losses.CategoricalCrossentropy(from_logits=True), (x, y), head.kernel)


def build_larq(factor: float, seed: int) -> Case:
    import larq
    import tensorflow as tf

    keras_module = tf.keras  # tf_keras under TF_USE_LEGACY_KERAS=1, as larq needs
    keras_module.backend.clear_session()
    keras_module.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    head = planted_dense_class(keras_module)(3, factor, name="planted_dense")
    quantized = dict(kernel_quantizer="ste_sign", kernel_constraint="weight_clip", use_bias=False)
    model = keras_module.Sequential([
        keras_module.Input((8, 8, 1)),
        larq.layers.QuantConv2D(4, 3, **quantized), keras_module.layers.Activation("tanh"),
        keras_module.layers.Flatten(),
        larq.layers.QuantDense(8, **quantized), keras_module.layers.Activation("tanh"),
        head])
    x = rng.uniform(-1, 1, size=(4, 8, 8, 1)).astype("float32")
    y = np.eye(3, dtype="float32")[rng.integers(0, 3, 4)]
    return Case(model, keras_module.losses.CategoricalCrossentropy(from_logits=True), (x, y), head.kernel)


def build_gpflow(name: str, factor: float, seed: int) -> Case:
    import gpflow
    import tensorflow_probability as tfp

    tfd = tfp.distributions
    f64 = gpflow.utilities.to_default_float
    rng = np.random.default_rng(seed)
    n = 16 if name == "gpflow-gpr" else 24
    X = rng.uniform(-2, 2, size=(n, 2))
    Y = np.sin(X[:, :1] * 1.5) + 0.3 * X[:, 1:] + 0.1 * rng.normal(size=(n, 1))
    kernel = gpflow.kernels.SquaredExponential(lengthscales=[1.0, 1.0])
    kernel.lengthscales.prior = tfd.Gamma(f64(2.0), f64(2.0))
    kernel.variance.prior = tfd.Gamma(f64(2.0), f64(2.0))
    mean = planted_linear_class()(rng.normal(size=(2, 1)) * 0.3, factor)
    mean.A.prior = tfd.Normal(f64(0.0), f64(1.0))
    if name == "gpflow-gpr":
        model = gpflow.models.GPR((X, Y), kernel=kernel, mean_function=mean, noise_variance=0.1)
        loss = model.training_loss
    else:
        Z = X[rng.choice(n, 6, replace=False)].copy()
        model = gpflow.models.SVGP(kernel, gpflow.likelihoods.Gaussian(variance=0.1), Z, mean_function=mean)
        # q_mu and q_sqrt away from their zero / identity initial values, so the KL term is not at its minimum
        model.q_mu.assign(0.3 * rng.normal(size=(6, 1)))
        model.q_sqrt.assign(np.tril(0.2 * rng.normal(size=(1, 6, 6))) + 0.7 * np.eye(6)[None])
        loss = model.training_loss_closure((X, Y), compile=False)
    model.likelihood.variance.prior = tfd.Gamma(f64(2.0), f64(2.0))
    # fastcheck names an unnamed tf.Variable by where the module keeps it
    return Case(model, loss, None, mean.A.unconstrained_variable, planted_name="mean_function.A")


def build(name: str, variant: str, seed: int) -> Case:
    factor = VARIANTS[variant]
    if name in ("bert-backbone", "gpt2-backbone", "gpt2-causallm", "bert-classifier"):
        return build_keras_hub(name, factor, seed)
    if name == "mobilenet-nested":
        return build_mobilenet(factor, seed)
    if name == "tf-keras":
        return build_tf_keras(factor, seed)
    if name == "larq-bnn":
        return build_larq(factor, seed)
    if name in ("gpflow-gpr", "gpflow-svgp"):
        return build_gpflow(name, factor, seed)
    raise ValueError(f"unknown class {name!r}; choose from {MAIN_CLASSES + LEGACY_CLASSES}")


def planted_scale_class():
    from benchmarks.mobilenet import planted_scale_class as made

    return made()


# ----------------------------------------------------------------------------- one check


def _zero_argument_form() -> bool:
    """Whether this fastcheck's check_model takes a loss with no data (``data`` has a default)."""
    import inspect

    import fastcheck

    parameter = inspect.signature(fastcheck.check_model).parameters.get("data")
    return parameter is not None and parameter.default is not inspect.Parameter.empty


def _wrapped(case: Case):
    """(model, loss, data) for a zero-argument loss where check_model needs data: a module returning the loss."""
    import tensorflow as tf

    class TrainingLoss(tf.Module):
        def __init__(self, model, loss):
            super().__init__(name="training_loss")
            self.model = model
            self._loss = loss

        def __call__(self, x):
            return self._loss()

    return TrainingLoss(case.model, case.loss), (lambda y, value: value), (tf.zeros(()), tf.zeros(()))


def _gist(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:240]}"


def _numerical_note(report) -> str:
    """The note saying where the numerical side computes: the model's float64 copy's, else the plan's."""
    for kind in ("ModelCopy", "NumericalSide"):
        for event, note in zip(report.events, report.notes):
            if type(event).__name__ == kind:
                return note
    return ""


def _chosen_mode(report, fallback: str) -> str:
    """full / fast / ... as the report's ModeChosen event says."""
    return next((event.mode for event in report.events if type(event).__name__ == "ModeChosen"), fallback)


def check_one(name: str, variant: str, mode: str, seed: int) -> dict:
    """Build one model and check it once; the row of the JSON."""
    import fastcheck

    case = build(name, variant, seed)
    row = {"class": name, "variant": variant, "mode": mode, "seed": seed, "planted": case.planted}
    model, loss, data, form = case.model, case.loss, case.data, None
    if data is None:
        form = "zero-argument" if _zero_argument_form() else "wrapped"
        if form == "wrapped":
            model, loss, data = _wrapped(case)
    row["loss_form"] = form
    start = time.perf_counter()
    try:
        if form == "zero-argument":
            report = fastcheck.check_model(model, loss, **MODES[mode])
        else:
            report = fastcheck.check_model(model, loss, data, **MODES[mode])
    except Exception as error:  # noqa: BLE001 -- recorded: a raise is part of today's behaviour
        row.update(seconds=time.perf_counter() - start, verdict="error", error=_gist(error))
        return row
    row["seconds"] = time.perf_counter() - start
    try:
        row["planted_gradient"] = case.planted_gradient()
    except Exception as error:  # noqa: BLE001 -- a side figure
        row["planted_gradient_error"] = _gist(error)
    failures = list(report.failures)
    row.update(verdict=report.verdict, resolved_mode=_chosen_mode(report, report.mode), path=report.path,
               report_mode=report.mode,
               fail=[p.input_name for p in failures if p.label == "FAIL"],
               undecidable=[p.input_name for p in failures if p.label != "FAIL"],
               pairs=len(report.pairs), numerical=_numerical_note(report), notes=list(report.notes),
               pair_detail=_pair_detail(report.pairs, case.planted))
    return row


def _pair_detail(pairs, planted: str) -> list:
    """Per pair not ok, and the planted variable's: label, resolution, flat count and the report's lines."""
    detail = []
    for pair in pairs:
        name = getattr(pair, "input_name", "?")
        if pair.label == "ok" and not _same_variable(name, planted):
            continue
        try:
            entry = {"input": name, "label": pair.label, "resolution": float(pair.resolution)}
            own = pair.resolutions
            entry["tolerance_resolution"] = float(own[1])  # the tolerances' own (coarse: > max(100 rtol, 2x this))
            summary = pair.to_dict()
            entry.update({k: summary[k] for k in ("flat", "mismatches", "unresolved", "coarse") if k in summary})
            entry["lines"] = [line.strip() for line in pair.detail_lines()][:6]
        except Exception as error:  # noqa: BLE001 -- a side record
            entry = {"input": name, "label": pair.label, "error": _gist(error)}
        detail.append(entry)
    return detail


def right(row: dict) -> bool:
    """Whether the row's verdict is the right one (see the module docstring)."""
    if row["verdict"] == "error":
        return False
    planted = row["planted"]
    if row["class"] == "larq-bnn":  # only the real-valued head decides
        head_fails = [n for n in row["fail"] + row["undecidable"] if _is_head(n)]
        if row["variant"] == "correct":
            return not head_fails
        return any(_is_head(n) for n in row["fail"])
    if row["variant"] == "correct":
        return row["verdict"] == "pass"
    return row["verdict"] == "fail" and any(_same_variable(n, planted) for n in row["fail"])


def _is_head(name: str) -> bool:
    return "planted_dense" in name


def _same_variable(reported: str, planted: str) -> bool:
    """The same variable, however prefixed: tf_keras names end in ":0", module paths start with the wrapper's."""
    a, b = reported.split(":")[0], planted.split(":")[0]
    return a == b or any(a.endswith(sep + b) or b.endswith(sep + a) for sep in "/.")


def parse_seeds(text: str) -> dict:
    """``--seeds``'s entries: {(class or None, mode or None): N}; ``ValueError`` on a malformed one."""
    spec: dict = {}
    for entry in (e.strip() for e in str(text).split(",")):
        if not entry:
            continue
        name, _, rest = entry.rpartition(":")
        mode, _, count = rest.rpartition("=")
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"--seeds entry {entry!r}: want N, MODE=N, CLASS:N or CLASS:MODE=N")
        spec[(name or None, mode or None)] = int(count)
    if not spec:
        raise ValueError("--seeds: no entry")
    return spec


def seeds_for(spec: dict, name: str, mode: str, fallback: int) -> int:
    """The most specific entry of ``spec`` for (class, mode), else ``fallback``."""
    for key in ((name, mode), (name, None), (None, mode), (None, None)):
        if key in spec:
            return spec[key]
    return fallback


def run_class(name: str, variants, modes, seeds, emit, extra: dict | None = None) -> None:
    """Every check of one class, in this process; ``emit(row)`` after each.  A check over SLOW_CHECK_S seconds
    cuts the seeds to SLOW_SEEDS from then on.  ``seeds``: a count, or {mode: count}.  ``extra``: {mode: seeds}
    run after ``modes``."""
    per_mode = seeds if isinstance(seeds, dict) else {mode: seeds for mode in modes}
    limit = max(list(per_mode.values()) + list((extra or {}).values()))
    plan = [(mode, per_mode[mode]) for mode in modes] + [(mode, n) for mode, n in (extra or {}).items()
                                                         if mode not in modes]
    for variant in variants:
        for mode, count in plan:
            for seed in range(count):
                if seed >= limit:
                    break
                row = check_one(name, variant, mode, seed)
                if row["seconds"] > SLOW_CHECK_S and limit > SLOW_SEEDS:
                    limit = SLOW_SEEDS
                    row["slow"] = f"check took {row['seconds']:.0f} s > {SLOW_CHECK_S:.0f} s: {SLOW_SEEDS} seeds from now"
                emit(row)


# ----------------------------------------------------------------------------- processes and output


_CHILD = r"""
import os, sys, json
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, {root!r})
import tensorflow as tf
tf.get_logger().setLevel("ERROR")
from benchmarks import models
models.run_class({name!r}, {variants!r}, {modes!r}, {seeds!r},
                 lambda row: print("RESULT " + json.dumps(row), flush=True), {extra!r})
"""


def measure_class(name: str, variants, modes, seeds, timeout: float, log,
                  extra: dict | None = None) -> tuple[list, str | None]:
    """Run one class in a fresh process; (its rows, an error line or None)."""
    root = str(Path(__file__).resolve().parent.parent)
    code = _CHILD.format(root=root, name=name, variants=list(variants), modes=list(modes), seeds=seeds,
                         extra=dict(extra or {}))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    if name in LEGACY_CLASSES:
        env["TF_USE_LEGACY_KERAS"] = "1"
    rows: list = []
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    deadline = time.monotonic() + timeout
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    stderr_tail: list = []
    selector.register(process.stderr, selectors.EVENT_READ)
    open_streams = 2
    while open_streams and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=max(0.1, deadline - time.monotonic())):
            line = key.fileobj.readline()
            if not line:
                selector.unregister(key.fileobj)
                open_streams -= 1
                continue
            if key.fileobj is process.stderr:
                stderr_tail = (stderr_tail + [line.rstrip()])[-5:]
            elif line.startswith("RESULT "):
                row = json.loads(line[len("RESULT "):])
                rows.append(row)
                log(_progress(row))
    if process.poll() is None and time.monotonic() >= deadline:
        process.kill()
        process.wait()
        return rows, f"stopped after {timeout:.0f} s (--timeout)"
    process.wait()
    if process.returncode != 0:
        return rows, f"exit {process.returncode}: " + " | ".join(stderr_tail)[-400:]
    return rows, None


def _progress(row: dict) -> str:
    what = row.get("error") or ", ".join(row.get("fail", [])[:3]) or "-"
    return (f"  {row['class']:17s} {row['variant']:7s} {row['mode']:7s} seed {row['seed']}  "
            f"{row['seconds']:6.1f} s  {row['verdict']:11s} {what[:120]}")


def _tally(values) -> str:
    counts: dict = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def _short_numerical(note: str) -> str:
    if not note:
        return "-"
    if note.startswith("numerical side on a float64 copy"):
        return "float64 copy"
    if note.startswith("numerical side in the model's own precision"):
        return "own precision: " + note.split(": ", 1)[-1][:140]
    return note[:140]


def summarise(rows: list) -> list:
    """One entry per (class, variant, mode)."""
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["class"], row["variant"], row["mode"]), []).append(row)
    summary = []
    for (name, variant, mode), group in groups.items():
        seconds = [r["seconds"] for r in group]
        named: dict = {}
        for r in group:
            for n in r.get("fail", []):
                named[n] = named.get(n, 0) + 1
        errors = sorted({r["error"] for r in group if r.get("error")})
        undecided: dict = {}
        for r in group:
            for n in r.get("undecidable", []):
                undecided[n] = undecided.get(n, 0) + 1
        gradients = [r["planted_gradient"] for r in group if r.get("planted_gradient") is not None]
        summary.append({
            "class": name, "variant": variant, "mode": mode, "seeds": len(group),
            "verdicts": _tally(r["verdict"] for r in group),
            "right": sum(right(r) for r in group),
            "resolved": _tally(f"{r['resolved_mode']}/{r['path']}" for r in group if "resolved_mode" in r) or "-",
            "fail_named": named, "undecidable_named": undecided,
            "planted_gradient": [min(gradients), max(gradients)] if gradients else None, "numerical": _tally(_short_numerical(r.get("numerical", "")) for r in group
                                                     if r["verdict"] != "error") or "-",
            "median_s": statistics.median(seconds), "max_s": max(seconds), "first_s": seconds[0],
            "errors": errors, "loss_form": sorted({r["loss_form"] for r in group if r.get("loss_form")}),
            "planted": group[0]["planted"], "slow": [r["slow"] for r in group if r.get("slow")],
        })
    return summary


def to_markdown(record: dict) -> str:
    env = record["environment"]
    lines = [f"# check_model on model classes: correct vs planted 1% defect ({record['env']} environment)", "",
             f"{record['timestamp']}, fastcheck at {record['git_commit'] or '?'}; CPU: {record['cpu']} x "
             f"{record['cpus']}; python {env['python']}, tensorflow {env['tensorflow']}, numpy {env['numpy']}"
             + "".join(f", {k} {v}" for k, v in env.items() if k not in ("python", "tensorflow", "numpy") and v)
             + f"; seeds {_seeds_text(record)}; total {record['wall_seconds']:.0f} s.", "",
             "\"right\": seeds whose verdict is the right one (correct: pass; defect: fail naming the planted "
             "variable). \"default\" is mode=\"auto\". Time: median (max) seconds of one check_model call, the "
             "model built before the clock; the first check of a class in its process includes tracing.", "",
             "| model | variant | mode | verdicts over seeds | right | resolved mode/path | FAIL-named (seeds) | "
             "numerical side | time per check | notes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in record["summary"]:
        named = ", ".join(f"{n} ({c})" for n, c in sorted(s["fail_named"].items(), key=lambda kv: -kv[1])[:4])
        if len(s["fail_named"]) > 4:
            named += f", ... {len(s['fail_named']) - 4} more"
        notes = []
        if s["variant"] == "defect":
            low, high = s["planted_gradient"] or (float("nan"), float("nan"))
            notes.append(f"planted: {s['planted']}, max abs gradient {low:.2g}-{high:.2g}")
        if s["undecidable_named"]:
            top = sorted(s["undecidable_named"].items(), key=lambda kv: -kv[1])
            notes.append(f"undecidable: {len(top)} variables, e.g. " + ", ".join(n for n, _ in top[:2]))
        if "wrapped" in s["loss_form"]:
            notes.append("wrapped: no zero-argument check_model yet")
        elif s["loss_form"]:
            notes.append("loss: " + ", ".join(s["loss_form"]))
        notes += [f"raised {e}" for e in s["errors"][:2]]
        notes += s["slow"]
        lines.append(f"| {s['class']} | {s['variant']} | {s['mode']} | {s['verdicts']} | {s['right']}/{s['seeds']} | "
                     f"{s['resolved']} | {named or 'none'} | {s['numerical']} | {s['median_s']:.1f} s "
                     f"({s['max_s']:.1f}) | {'; '.join(notes).replace('|', '/')} |")
    for name, error in record["class_errors"].items():
        lines.append(f"| {name} | - | - | process: {error.replace('|', '/')} | - | - | - | - | - | - |")
    return "\n".join(lines) + "\n"


def _seeds_text(record: dict) -> str:
    """"0-7", or the --seeds spec where counts differ by class or mode (the table's "right" column has each row's)."""
    spec = record.get("seeds_spec")
    if spec and not str(spec).isdigit():
        return f"per --seeds {spec} (up to {record['seeds']}; a row's count is its \"right\" denominator)"
    return f"0-{record['seeds'] - 1}"


def _environment_versions(env: str) -> dict:
    import importlib.metadata
    import platform

    versions = {"python": platform.python_version()}
    names = ("tensorflow", "numpy", "keras", "keras-hub", "tf-keras", "tensorflow-probability") if env == "main" \
        else ("tensorflow", "numpy", "tf-keras", "tensorflow-probability", "gpflow", "larq")
    for dist in names:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def detect_env() -> str:
    import importlib.metadata

    try:
        numpy_major = int(importlib.metadata.version("numpy").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return "main"
    return "legacy" if numpy_major < 2 else "main"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks models",
                                     description=__doc__.splitlines()[0].split(": ", 1)[-1])
    parser.add_argument("--env", choices=("auto", "main", "legacy"), default="auto",
                        help="which classes: main (Keras 3, numpy 2) or legacy (GPflow, larq); auto: by numpy's version")
    parser.add_argument("--quick", action="store_true", help="seed 0 only and fewer classes (a smoke run)")
    parser.add_argument("--classes", default=None, help="comma-separated, among " + ", ".join(MAIN_CLASSES + LEGACY_CLASSES))
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: correct, defect")
    parser.add_argument("--modes", default=None,
                        help="comma-separated among default, fast, full (default: default,fast, and full on "
                        + ", ".join(f"{c} ({n['full']} seeds)" for c, n in EXTRA_MODES.items()) + ")")
    parser.add_argument("--seeds", default=None, help="seeds 0..N-1 (default 8; --quick 1); or entries N, MODE=N, "
                        "CLASS:N, CLASS:MODE=N, comma-separated, the most specific applying")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per class process (default 1800)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results folder (default {RESULTS})")
    parser.add_argument("--name", default=None, help="file stem of the outputs (default models; models-legacy in the "
                        "legacy environment)")
    parser.add_argument("--in-process", action="store_true", help="run the checks in this process (for tests)")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    env = detect_env() if args.env == "auto" else args.env
    if args.classes:
        classes = tuple(c.strip() for c in args.classes.split(",") if c.strip())
    else:
        classes = QUICK[env] if args.quick else (MAIN_CLASSES if env == "main" else LEGACY_CLASSES)
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    modes = tuple(m.strip() for m in (args.modes or ",".join(DEFAULT_MODES)).split(",") if m.strip())
    problems = [c for c in classes if c not in MAIN_CLASSES + LEGACY_CLASSES]
    problems += [v for v in variants if v not in VARIANTS] + [m for m in modes if m not in MODES]
    if problems:
        print(f"unknown: {', '.join(problems)}", file=sys.stderr)
        return 2
    try:
        spec = parse_seeds(args.seeds) if args.seeds else {}
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    fallback = 1 if args.quick else 8
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    started = time.perf_counter()
    rows: list = []
    class_errors: dict = {}

    def emit(row: dict) -> None:
        rows.append(row)
        print(_progress(row), flush=True)

    most = 0
    for name in classes:
        seeds = {mode: seeds_for(spec, name, mode, fallback) for mode in modes}
        class_start = time.perf_counter()
        extra = {} if args.modes or args.quick else dict(EXTRA_MODES.get(name, {}))
        extra = {mode: seeds_for(spec, name, mode, n) if (name, mode) in spec or (None, mode) in spec else n
                 for mode, n in extra.items()}
        most = max([most] + list(seeds.values()) + list(extra.values()))
        print(f"{name}: {len(variants)} variants x " + ", ".join(f"{m} {n}" for m, n in {**seeds, **extra}.items())
              + " seeds", flush=True)
        if args.in_process:
            run_class(name, variants, modes, seeds, emit, extra)
            error = None
        else:
            got, error = measure_class(name, variants, modes, seeds, args.timeout, lambda line: print(line, flush=True),
                                       extra)
            rows += got
        if error:
            class_errors[name] = error
            print(f"  {name}: {error}", flush=True)
        print(f"  {name}: {time.perf_counter() - class_start:.0f} s", flush=True)
    record = {
        "schema": 1, "env": env, "timestamp": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_commit": _git_commit(), "cpu": _cpu_model(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "environment": _environment_versions(env), "argv": list(argv if argv is not None else sys.argv[1:]),
        "classes": list(classes), "seeds": most, "seeds_spec": args.seeds or str(fallback),
        "wall_seconds": time.perf_counter() - started,
        "class_errors": class_errors, "rows": rows,
    }
    record["summary"] = summarise(rows)
    stem = args.name or ("models" if env == "main" else "models-legacy")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    text = to_markdown(record)
    (args.out / f"{stem}.md").write_text(text)
    print()
    print(text)
    print(f"wrote {args.out / (stem + '.md')}, {args.out / (stem + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
