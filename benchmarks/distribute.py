"""Checks over several replicas (``python -m benchmarks.distribute``; not part of ``benchmarks``' suite).

The same full checks timed side by side in one run: on one device as always
(``device=None``), through the distribution machinery on one replica
(``device=["/CPU:0"]``), and over two replicas on two logical CPU devices
(``device=["/CPU:0", "/CPU:1"]``); with GPUs present, also on one GPU
(``device="/GPU:0"``) and, with two or more, over two GPUs.  Each configuration
runs once to trace its kernels, then ``--repeats`` rounds over all configurations in
turn; the table gives the
best total and the numerical side (``report.timings``), and whether the
verdicts match the one-device check's.

Two logical CPU devices share the process's CPU thread pools: on a CPU-only
machine they show the machinery's overhead rather than a speed-up (each batched
call already uses every core); separate devices (GPUs) run their shares at the
same time.

    python -m benchmarks.distribute [--repeats 3] [--only mlp,conv]
"""

from __future__ import annotations

import argparse
import logging
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# Two logical CPU devices: configured before TensorFlow initialises its devices.
_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_CPU, [tf.config.LogicalDeviceConfiguration()] * 2)

import fastcheck  # noqa: E402
from benchmarks.run import _cpu_model  # noqa: E402


def _problems() -> dict:
    rng = np.random.default_rng(0)
    w1 = tf.constant(rng.normal(size=(1024, 4096)) / 64, tf.float32)
    w2 = tf.constant(rng.normal(size=(64, 1024)) / 32, tf.float32)

    def mlp(x):
        return tf.linalg.matvec(w2, tf.tanh(tf.linalg.matvec(w1, x)))

    kernel = tf.constant(rng.normal(size=(3, 3, 8, 8)) / 8, tf.float32)
    head = tf.constant(rng.normal(size=(24 * 24 * 8, 32)) / 64, tf.float32)

    def conv(x):
        hidden = tf.nn.conv2d(tf.tanh(tf.nn.conv2d(x, kernel, 1, "SAME")), kernel, 1, "SAME")
        return tf.matmul(tf.reshape(tf.tanh(hidden), [1, -1]), head)

    return {
        "mlp": ("MLP 4096 -> 1024 -> 64 (float32, full: 8192 evaluations)", mlp,
                tf.constant(rng.normal(size=4096), tf.float32)),
        "conv": ("two 3x3 convolutions on 24x24x8 -> 32 (float32, full: 9216 evaluations)", conv,
                 tf.constant(rng.normal(size=(1, 24, 24, 8)), tf.float32)),
    }


def _configurations() -> list[tuple[str, dict]]:
    configurations = [("1 device (device=None)", {}),
                      ("1 replica (device=[CPU:0])", {"device": ["/CPU:0"]}),
                      ("2 replicas (device=[CPU:0, CPU:1])", {"device": ["/CPU:0", "/CPU:1"]})]
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        configurations.append(("1 GPU (device=/GPU:0)", {"device": "/GPU:0"}))
    if len(gpus) >= 2:
        configurations.append(("2 GPUs (device=[GPU:0, GPU:1])", {"device": ["/GPU:0", "/GPU:1"]}))
    return configurations


class _Waves(logging.Handler):
    """The work per replica a check logs (``fastcheck.engine.distribute``, DEBUG), summed per kind of item."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.where, self.work = "", {}

    def emit(self, record):
        label, self.where, counts, each = record.args
        total = self.work.setdefault(label + each, [0] * len(counts.split(" / ")))
        for replica, count in enumerate(counts.split(" / ")):
            total[replica] += int(count)

    def note(self) -> str:
        return f"distributed over {self.where}: " + "; ".join(
            f"{' / '.join(map(str, counts))} {label}" for label, counts in self.work.items()) if self.work else ""


def _logged_check(f, x, options) -> tuple:
    """(the report, its work per replica as one line) of a check."""
    logger, waves = logging.getLogger("fastcheck.engine.distribute"), _Waves()
    level = logger.level
    logger.addHandler(waves)
    logger.setLevel(logging.DEBUG)
    try:
        return fastcheck.check_gradients(f, x, **options), waves.note()
    finally:
        logger.removeHandler(waves)
        logger.setLevel(level)


def _verdict(report) -> tuple:
    return tuple((p.ok, p.status.tobytes()) for p in report.pairs)


def measure(repeats: int, only: list[str] | None = None) -> list[dict]:
    """Per problem: every configuration once (tracing), then ``repeats`` rounds over all of them
    in turn (a machine whose load changes meets every configuration alike); best of the rounds."""
    rows = []
    for key, (title, f, x) in _problems().items():
        if only and key not in only:
            continue
        configurations = [(name, {"mode": "full", "jit_compile": False, **options})
                          for name, options in _configurations()]
        for _, options in configurations:
            fastcheck.check_gradients(f, x, **options)  # traces the kernels
        totals: dict = {name: [] for name, _ in configurations}
        numerical: dict = {name: [] for name, _ in configurations}
        reports: dict = {}
        notes: dict = {}
        for _ in range(repeats):
            for name, options in configurations:
                start = time.perf_counter()
                reports[name], notes[name] = _logged_check(f, x, options)
                totals[name].append(time.perf_counter() - start)
                numerical[name].append(reports[name].timings.get("numerical", float("nan")))
        reference = _verdict(reports[configurations[0][0]])
        for name, _ in configurations:
            report = reports[name]
            note = notes[name]
            rows.append({"problem": title, "configuration": name, "total": min(totals[name]),
                         "numerical": min(numerical[name]), "ok": report.ok, "same": _verdict(report) == reference,
                         "note": note})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.distribute", description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated problems: mlp, conv")
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    print(f"CPU: {_cpu_model()} ({cores} usable cores), GPUs: {', '.join(gpus) or 'none'}, "
          f"TensorFlow {tf.__version__}; best of {args.repeats} rounds after one warm-up run\n")
    rows = measure(args.repeats, [s for s in args.only.split(",") if s] or None)
    print("| problem | configuration | total (s) | numerical side (s) | verdict | same verdicts as 1 device |")
    print("| --- | --- | ---: | ---: | --- | --- |")
    for row in rows:
        print(f"| {row['problem']} | {row['configuration']} | {row['total']:.3f} | {row['numerical']:.3f} | "
              f"{'pass' if row['ok'] else 'FAIL'} | {'yes' if row['same'] else 'NO'} |")
    print()
    for row in rows:
        if row["note"]:
            print(f"- {row['problem'].split(' (')[0]}, {row['configuration']}: {row['note']}")
    return 0 if all(row["same"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
