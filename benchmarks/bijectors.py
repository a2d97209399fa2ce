"""``python -m benchmarks.bijectors`` (also ``python -m benchmarks bijectors``): ``check_bijector`` on every TFP bijector.

Every public class of ``tfp.bijectors`` is built with no arguments; one that cannot
be (it needs parameters, or it fails to build here) is listed as skipped with the
reason.  For one that builds, ``event_ndims`` is ``forward_min_event_ndims`` and
``x`` (a batch of 2 events, in the bijector's dtype, float64 when it has none) is
the first of these candidates that lies in the domain -- ``forward(x)`` and the
log-det-Jacobian finite and ``inverse(forward(x))`` back at ``x`` within 1e-3:

1. an unconstrained draw ``z ~ 0.8 N(0, 1)``;
2. a positive one, ``|z| + 0.2``;
3. one in (0, 1), ``sigmoid(z)``;
4. a lower-triangular matrix with a positive diagonal, ``tril(z)`` with diagonal
   ``softplus(z) + 0.5`` (the domain of the Cholesky bijectors);
5. for an event size that forward rejects, the same in the first event size it accepts.

Every shipped bijector is believed right, so the sweep should pass every one it
can check; it exits 1 when one fails or raises.

    python -m benchmarks.bijectors [--only NAME[,NAME]] [--out DIR]

writes ``bijectors.md`` to ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import inspect
import os
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_probability as tfp  # noqa: E402

from fastcheck.tfp import check_bijector  # noqa: E402

tfb = tfp.bijectors
RESULTS = Path(__file__).resolve().parent / "results"
BATCH = 2
# Event shapes tried, per forward_min_event_ndims: the first is preferred, the others are
# for bijectors that accept some sizes only (e.g. a triangular number of elements).
EVENT_SHAPES = {0: [()], 1: [(6,), (3,), (4,)], 2: [(3, 3), (2, 2)]}


# Why a skip happens, where TFP's own message does not say it (each seen with TF 2.21, TFP 0.25, numpy 2).
EXPLAINED = {
    "AbsoluteValue": "not injective: TFP defines no forward_log_det_jacobian for it",
    "BatchNormalization": "with its default training=True, inverse normalizes with the batch's own statistics, so "
                          "inverse(forward(x)) != x for a fresh batch: not a bijection of one point",
    "Scale": "Scale() holds neither scale nor log_scale",
    "Pad": "TFP 0.25 calls np.reshape(newshape=...), which numpy 2 removed",
    "SoftmaxCentered": "TFP 0.25 calls np.reshape(newshape=...), which numpy 2 removed",
    "UnitVector": "TFP 0.25 calls np.reshape(newshape=...), which numpy 2 removed",
}


def bijector_classes() -> list[tuple[str, type]]:
    """The public Bijector classes of ``tfp.bijectors``, by name."""
    return [(name, obj) for name, obj in sorted(vars(tfb).items())
            if not name.startswith("_") and inspect.isclass(obj) and issubclass(obj, tfb.Bijector)]


def _candidates(event_shape: tuple, rng: np.random.Generator):
    """(description, array of shape [BATCH, *event_shape]) candidates for x, in the order tried."""
    z = 0.8 * rng.normal(size=(BATCH, *event_shape))
    yield "unconstrained", z
    yield "positive", np.abs(z) + 0.2
    yield "in (0, 1)", 1.0 / (1.0 + np.exp(-z))
    if len(event_shape) >= 2 and event_shape[-1] == event_shape[-2]:
        tril = np.tril(z)
        n = event_shape[-1]
        diagonal = np.log1p(np.exp(np.diagonal(z, axis1=-2, axis2=-1))) + 0.5
        tril[..., np.arange(n), np.arange(n)] = diagonal
        yield "lower-triangular, positive diagonal", tril


def choose_x(bijector, event_ndims: int, dtype, seed: int = 0):
    """(x, how it was chosen) for the first candidate in the domain, or (None, why none was)."""
    rng = np.random.default_rng(seed)
    why = ""
    for event_shape in EVENT_SHAPES.get(event_ndims, [(3,) * event_ndims]):
        for description, value in _candidates(event_shape, rng):
            x = tf.constant(value, dtype)
            try:
                y = bijector.forward(tf.identity(x))
                back = bijector.inverse(tf.identity(y))
                fldj = bijector.forward_log_det_jacobian(tf.identity(x), event_ndims=event_ndims)
            except Exception as error:  # noqa: BLE001 - a candidate outside the domain may raise anything
                why = why or f"forward/inverse raised {type(error).__name__}: {str(error).splitlines()[0][:120]}"
                continue
            values = [np.asarray(v, np.float64) for v in (y, back, fldj)]
            if not all(np.isfinite(v).all() for v in values):
                why = why or f"{description} x of event shape {event_shape}: forward, inverse or the log-det not finite"
                continue
            if values[1].shape != value.shape or not np.allclose(values[1], value, rtol=1e-3, atol=1e-3):
                why = why or f"{description} x of event shape {event_shape}: inverse(forward(x)) != x"
                continue
            return x, f"{description}, event shape {event_shape}"
    return None, why or "no event shape tried"


def sweep_one(name: str, cls: type) -> dict:
    """One row: verdict ("pass", "fail", "undecidable", "skipped", "error"), seconds, and a note."""
    row = {"bijector": name, "verdict": "skipped", "seconds": None, "event_ndims": None, "x": None,
           "convention": None, "note": ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated aliases (MatvecLU) say so on construction
        try:
            bijector = cls()
        except Exception as error:  # noqa: BLE001 - the reason is the row's note
            row["note"] = f"cannot be built with no arguments: {type(error).__name__}: {str(error).splitlines()[0][:140]}"
            if name in EXPLAINED:
                row["note"] += f" ({EXPLAINED[name]})"
            return row
    event_ndims = bijector.forward_min_event_ndims
    if not isinstance(event_ndims, (int, np.integer)):
        row["note"] = f"acts on a structure of tensors (forward_min_event_ndims={event_ndims!r})"
        return row
    event_ndims = int(event_ndims)
    row["event_ndims"] = event_ndims
    # A bijector without a dtype may still hold float32 parameters (GumbelCDF's loc=0.): float64, then float32.
    dtypes = [tf.as_dtype(bijector.dtype)] if bijector.dtype is not None else [tf.float64, tf.float32]
    for dtype in dtypes:
        if dtype != dtypes[0]:
            bijector = cls()  # afresh: a Keras layer inside (BatchNormalization) keeps the dtype it was first built in
        x, how = choose_x(bijector, event_ndims, dtype)
        if x is not None:
            break
    if x is None:
        row["note"] = f"no x found in the domain ({how})"
        if name in EXPLAINED:
            row["note"] += f": {EXPLAINED[name]}"
        return row
    row["x"] = f"{how}, {dtype.name}"
    start = time.perf_counter()
    try:
        report = check_bijector(bijector, x, event_ndims)
    except Exception as error:  # noqa: BLE001 - a crash is a result
        row.update(verdict="error", seconds=time.perf_counter() - start,
                   note=f"check_bijector raised {type(error).__name__}: {str(error).splitlines()[0][:200]}")
        return row
    row.update(verdict=report.verdict, seconds=time.perf_counter() - start, convention=report.convention,
               mode=report.mode, timings=report.timings)
    if not report.ok:
        failing = report.failures[0]
        row["note"] = (getattr(failing, "title", None) or str(failing)).splitlines()[0][:300]
        row["report"] = str(report)
    return row


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def markdown(record: dict) -> str:
    counts = record["counts"]
    lines = ["# check_bijector on every TFP bijector built with no arguments", "",
             f"{record['timestamp']} · TF {record['versions']['tensorflow']}, TFP {record['versions']['tfp']}, "
             f"numpy {record['versions']['numpy']} · {record['cpu']} x {record['cpus']} · "
             f"checks {record['check_seconds']:.1f} s, total wall time {record['wall_seconds']:.1f} s", "",
             "Counts: " + ", ".join(f"{k} {v}" for k, v in counts.items()), "",
             "`x`: how the point was chosen (see `benchmarks/bijectors.py`); `convention`: how the log-det-Jacobian "
             "was judged (`square`: log|det J| of forward's own Jacobian; a chart: TFP's coordinates of the input and "
             "output, as in its own `get_fldj_theoretical` tests).", "",
             "| bijector | verdict | time | event_ndims | x | convention | note |", "|---|---|---|---|---|---|---|"]
    for row in record["rows"]:
        seconds = "" if row["seconds"] is None else f"{row['seconds']:.2f} s"
        lines.append(f"| {row['bijector']} | {row['verdict']} | {seconds} | "
                     f"{'' if row['event_ndims'] is None else row['event_ndims']} | {row['x'] or ''} | "
                     f"{row['convention'] or ''} | {row['note'].replace('|', '/')} |")
    failing = [row for row in record["rows"] if row.get("report")]
    if failing:
        lines += ["", "## Reports that did not pass", ""]
        for row in failing:
            lines += [f"**{row['bijector']}**", "", "```", row["report"], "```", ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bijectors", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, metavar="NAME[,NAME]", help="bijector class names, comma-separated")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results folder (default {RESULTS})")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    classes = bijector_classes()
    if args.only:
        wanted = {name.strip() for name in args.only.split(",") if name.strip()}
        unknown = wanted - {name for name, _ in classes}
        if unknown:
            print(f"unknown bijector(s) {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        classes = [(name, cls) for name, cls in classes if name in wanted]
    started = time.perf_counter()
    logger, level = tf.get_logger(), tf.get_logger().level
    logger.setLevel("ERROR")
    rows = []
    try:
        for name, cls in classes:
            row = sweep_one(name, cls)
            rows.append(row)
            seconds = "" if row["seconds"] is None else f" {row['seconds']:.2f} s"
            print(f"{name:32s} {row['verdict']:11s}{seconds} {row['convention'] or ''} {row['note'][:100]}", flush=True)
    finally:
        logger.setLevel(level)
    counts = {verdict: sum(row["verdict"] == verdict for row in rows)
              for verdict in ("pass", "fail", "undecidable", "error", "skipped")}
    record = {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": {"tensorflow": tf.__version__, "tfp": tfp.__version__, "numpy": np.__version__,
                     "python": platform.python_version()},
        "cpu": _cpu_model(), "cpus": os.cpu_count(), "counts": counts,
        "check_seconds": sum(row["seconds"] or 0.0 for row in rows),
        "wall_seconds": time.perf_counter() - started, "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bijectors.md").write_text(markdown(record))
    print(f"{', '.join(f'{k} {v}' for k, v in counts.items())}; checks {record['check_seconds']:.1f} s, "
          f"wall {record['wall_seconds']:.1f} s; wrote {args.out / 'bijectors.md'}")
    return 1 if counts["fail"] or counts["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
