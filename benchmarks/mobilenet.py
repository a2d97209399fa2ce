"""``python -m benchmarks.mobilenet``: check_model on MobileNetV2, cold, with and without a planted defect.

The network of issue "Real networks": ``keras.applications.MobileNetV2(input_shape=(32, 32, 3),
weights=None, classes=10, alpha=0.35)`` (423,018 parameters in 158 variables), a batch of 4
random images, ``keras.losses.CategoricalCrossentropy()``, ``fastcheck.check_model(model, loss,
(x, y))`` with default options.  Each case runs in a fresh Python process (TensorFlow imported and
the model built before the clock starts: the "cold" first check of a process); the table gives
seconds, verdict, mode and path, what failed, how many elements sat at kinks, and
``tf.test.compute_gradient``'s projected time over the same variables (two eager calls of the loss
per element, timed in the same process), with the CPU model.

Cases:

* ``init``: the network as built (random weights, batch normalization in inference mode with moving
  mean 0 and variance 1).  Activations shrink layer by layer to ~1e-11, so every ReLU6 of the last
  blocks sits at its kink; the gradient is correct, and the verdict must never be a FAIL.
* ``init-defect``: ``init`` with a ``PlantedScale`` layer (``y = scale * x`` per channel, its custom
  gradient for ``scale`` off by 1%) after ``block_16_project_BN``.  At this point every
  multiplicative parameter's gradient is ~1e-12 (the network's output barely depends on them), so a
  1% error is ~1e-14, far below ``atol``: no check at the default tolerances can see it, and the
  table prints the planted gradient's size beside the verdict.
* ``calibrated``, ``calibrated-defect``: the same network and defect with each batch-normalization
  layer's moving statistics set to its input's statistics on the batch (as after training), so
  activations and gradients are O(1): the defect must FAIL, naming ``planted_scale/scale``.

    python -m benchmarks.mobilenet [--cases init,init-defect,calibrated,calibrated-defect]
                                   [--options mode=fast] [--variables Conv_1_bn,block_16] [--out DIR]

``--options`` passes check_model options (``key=value``, comma-separated; numbers and
``True``/``False`` are parsed) to every case; ``--variables`` checks only the variables whose paths
start with one of the given prefixes (the planted variable always included), to iterate quickly.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.run import _cpu_model

CASES = ("init", "init-defect", "calibrated", "calibrated-defect")
PLANTED_AFTER = "block_16_project_BN"
# Batch-normalization statistics of the calibrated cases come from this many other random images.
CALIBRATION_IMAGES = 256

_CHILD = r"""
import os, sys, time, json
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, {root!r})
import numpy as np
import tensorflow as tf
import keras
from benchmarks.mobilenet import build
model, loss, data, planted = build({case!r})
prefixes = {variables!r}
variables = None
if prefixes:
    variables = [v for v in model.trainable_variables
                 if any(v.path.startswith(p) for p in prefixes) or (planted is not None and v.path == planted.path)]
import fastcheck
start = time.perf_counter()
report = fastcheck.check_model(model, loss, data, variables=variables, **{options!r})
seconds = time.perf_counter() - start
checked = variables if variables is not None else model.trainable_variables
size = int(sum(np.prod(v.shape) for v in checked))
calls = []
for _ in range(7):
    begin = time.perf_counter()
    loss(data[1], model(data[0], training=False))
    calls.append(time.perf_counter() - begin)
with tf.GradientTape() as tape:
    value = loss(data[1], model(data[0], training=False))
planted_gradient = None if planted is None else float(np.max(np.abs(tape.gradient(value, planted))))
statuses = {{}}
for pair in report.pairs:
    if hasattr(pair, "undecided_probes"):  # fast mode: probes, not elements
        statuses[4] = statuses.get(4, 0) + pair.kinked_probes
        statuses[7] = statuses.get(7, 0) + pair.undecided_probes
        continue
    for code, count in zip(*np.unique(np.asarray(pair.status), return_counts=True)):
        statuses[int(code)] = statuses.get(int(code), 0) + int(count)
print("RESULT " + json.dumps({{
    "seconds": seconds, "verdict": report.verdict, "mode": report.mode, "path": report.path,
    "pairs": len(report.pairs), "elements": size, "failures": [p.input_name for p in report.failures],
    "statuses": statuses, "timings": report.timings, "planted": None if planted is None else planted.path,
    "planted_gradient": planted_gradient, "eager_call": sorted(calls)[len(calls) // 2],
    "notes": report.notes, "text": str(report)}}))
"""


def build(case: str, seed: int = 0):
    """(model, loss, (x, y), planted variable or None) for one case (see the module docstring)."""
    import keras
    import numpy as np

    if case not in CASES:
        raise ValueError(f"case={case!r} is not one of {CASES}.")
    keras.utils.set_random_seed(seed)
    model = keras.applications.MobileNetV2(input_shape=(32, 32, 3), weights=None, classes=10, alpha=0.35)
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(4, 32, 32, 3)).astype("float32")
    y = np.eye(10, dtype="float32")[rng.integers(0, 10, 4)]
    planted = None
    if case.endswith("defect"):
        layer = planted_scale_class()(1.01, name="planted_scale")

        def call_function(original, *args, **kwargs):
            out = original(*args, **kwargs)
            return layer(out) if original.name == PLANTED_AFTER else out

        copy = keras.models.clone_model(model, call_function=call_function)
        for target in copy.layers:
            if target is not layer and target.weights:
                target.set_weights(model.get_layer(target.name).get_weights())
        model, planted = copy, layer.scale
    if case.startswith("calibrated"):
        images = rng.uniform(-1, 1, size=(CALIBRATION_IMAGES, 32, 32, 3)).astype("float32")
        for layer in model.layers:  # in order: each layer sees the statistics of the calibrated ones before it
            if isinstance(layer, keras.layers.BatchNormalization):
                inputs = keras.Model(model.inputs[0], layer.input)(images).numpy()
                axes = tuple(range(inputs.ndim - 1))
                layer.moving_mean.assign(inputs.mean(axes))
                layer.moving_variance.assign(inputs.var(axes))
    return model, keras.losses.CategoricalCrossentropy(), (x, y), planted


_PLANTED: list = []


def planted_scale_class():
    """The ``PlantedScale`` layer class (made once, on first use: importing this module needs no TensorFlow)."""
    if _PLANTED:
        return _PLANTED[0]
    import keras
    import tensorflow as tf

    class PlantedScale(keras.layers.Layer):
        """``y = scale * x`` per channel; the custom gradient for ``scale`` is multiplied by ``factor``."""

        def __init__(self, factor=1.0, **kwargs):
            super().__init__(**kwargs)
            self.factor = factor

        def build(self, shape):
            self.scale = self.add_weight(shape=(shape[-1],), initializer="ones", name="scale")

        def call(self, x):
            factor = self.factor

            @tf.custom_gradient
            def scaled(x, scale):
                def grad(dy):
                    return dy * scale, factor * tf.reduce_sum(dy * x, axis=list(range(len(x.shape) - 1)))

                return x * scale, grad

            return scaled(x, self.scale.value)

        def get_config(self):
            return {**super().get_config(), "factor": self.factor}

    _PLANTED.append(PlantedScale)
    return PlantedScale


def measure(case: str, options: dict, variables: list[str], timeout: float) -> dict:
    root = str(Path(__file__).resolve().parent.parent)
    code = _CHILD.format(root=root, case=case, options=options, variables=variables)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"case {case} failed: {done.stderr.strip().splitlines()[-3:]}")


def to_markdown(record: dict) -> str:
    options = ", ".join(f"{k}={v!r}" for k, v in record["options"].items()) or "defaults"
    lines = [f"check_model on MobileNetV2 (alpha=0.35, 32x32, batch 4), first check in a fresh process, {options}"
             f"{'; variables ' + ', '.join(record['variables']) + '*' if record['variables'] else ''}; "
             f"{record['cpu']} x {record['cpus']}:", "",
             "| case | fastcheck | verdict | mode / path | failing pairs | kinks (pass / undecidable; elements, or probes in fast mode) | "
             "planted gradient | compute_gradient (projected) |", "|---|---|---|---|---|---|---|---|"]
    for case, row in record["cases"].items():
        statuses = {int(k): v for k, v in row["statuses"].items()}
        planted = "-" if row["planted_gradient"] is None else f"{row['planted_gradient']:.2g}"
        failing = ", ".join(row["failures"][:3]) + (" ..." if len(row["failures"]) > 3 else "") or "none"
        projected = 2 * row["elements"] * row["eager_call"]
        lines.append(f"| {case} | {row['seconds']:.1f} s | {row['verdict']} | {row['mode']} / {row['path']} | "
                     f"{failing} | {statuses.get(4, 0)} / {statuses.get(7, 0)} | {planted} | "
                     f"{projected:.3g} s ({row['elements']} elements x 2 x {row['eager_call'] * 1e3:.3g} ms) |")
    return "\n".join(lines) + "\n"


def _options(text: str) -> dict:
    options = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        try:
            options[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            options[key.strip()] = value.strip()
    return options


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mobilenet", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--options", default="", help="check_model options, e.g. mode=fast,probes=8")
    parser.add_argument("--variables", default="", help="check only variables whose paths start with these prefixes")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per case")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {list(CASES)}")
    options = _options(args.options)
    variables = [v.strip() for v in args.variables.split(",") if v.strip()]
    record = {"cpu": _cpu_model(), "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
              else os.cpu_count(), "options": options, "variables": variables, "cases": {}}
    for case in cases:
        row = measure(case, options, variables, args.timeout)
        record["cases"][case] = row
        print(f"{case:18s} {row['seconds']:7.1f} s  {row['verdict']:11s} {row['mode']}/{row['path']}  "
              f"failing: {', '.join(row['failures'][:3]) or 'none'}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mobilenet.json").write_text(json.dumps(record, indent=2))
    (out / "mobilenet.md").write_text(to_markdown(record))
    print(to_markdown(record))
    for case, row in record["cases"].items():
        print(f"\n--- {case}\n{row['text']}")
    # A FAIL on the correct network, or a pass on the calibrated defect, is a wrong verdict.
    wrong = [c for c, row in record["cases"].items()
             if (row["verdict"] == "fail") != (c == "calibrated-defect")]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
