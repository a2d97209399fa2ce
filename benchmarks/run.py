"""Measurement: time, memory and path of every contender on every problem; the JSON record.

Figures (per problem and contender, all from the same run):

``seconds``
    Wall time (``time.perf_counter``) of one complete check, median over the
    repeats.  A cold measurement uses a fresh function object in every repeat;
    the process has already run TensorFlow and XLA once (a warm-up at start), so
    "cold" means "first check of a new function", not "first check in a new
    process".
``ratio``
    ``seconds(contender) / seconds(fastcheck baseline)`` in this run, baseline per
    ``contenders.BASELINE``: > 1 means fastcheck was faster (its speedup).
``peak_rss_mib``
    Peak growth of the process's resident set during the measurement, in MiB:
    the kernel's high-water mark (VmHWM, reset through ``/proc/self/clear_refs``
    just before) minus the resident set just before.  Exact, not sampled, and it
    includes TensorFlow's C++ allocations; memory the process already held (for
    instance buffers TensorFlow's allocator kept from an earlier problem) is
    reused without counting, so it is the *additional* physical memory the check
    needed.  Maximum over the repeats.  Elsewhere than Linux it falls back to the
    growth of ``ru_maxrss`` (only a new lifetime peak shows).
``peak_device_mib``
    With ``--device /GPU:k``: TensorFlow's peak allocated device memory during the
    measurement (``tf.config.experimental.get_memory_info``), minus what was
    allocated before.
``status``
    ``ok``; ``over_cap`` (``seconds`` is a projection from a partial run,
    ``estimate``, or the time at which the hard limit stopped it, ``lower
    bound``); ``skipped`` (a smaller size of the same problem already exceeded
    the cap); ``error``; ``n/a`` (the contender does not apply).

The cap (``--cap``, 60 s; 15 s with ``--quick``) bounds each contender on each
problem: compute_gradient is estimated from a cost model before it runs, the
element loop is projected from its first elements, a contender that exceeded
the cap is not repeated and is skipped at the larger sizes of that problem, and
a hard limit of 2 x cap + 5 s stops whatever the estimates missed.  fastcheck
itself is always measured (never estimated or skipped; a hard limit of 10 x cap
only catches a hang), but a run over the cap is not repeated.
``fast`` (fast-mode problems only)
    ``reference_seconds`` (2k eager forward calls + one VJP + one JVP, k = 4),
    ``fastcheck_cold_over_reference`` / ``fastcheck_warm_over_reference``,
    fastcheck's mode, path and verdict; for the planted 1% defect, whether it
    was caught and the localised ``regions`` (from each pair's ``.region``)
    with ``region_inside_defect``.
``flop_rate`` (dense only)
    The 2n perturbed evaluations cost ``2n * (2 * 64 * n)`` FLOPs.  Divided by the
    *warm* time this is a lower bound on the FLOP rate of the batched evaluation
    (the time also covers the autodiff Jacobian and the comparison);
    ``fastcheck_sweep`` divides by the sweep alone, as fastcheck times it
    (``report.timings["numerical"]``, median over the warm repeats).  ``fraction``
    compares each with a plain float64 matmul ``[min(2n, 4096), n] @ [n, 64]``
    (warm, median of 5, the faster of XLA and TF's own kernel) timed in the same run.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib.metadata
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import tensorflow as tf

import fastcheck
from benchmarks import contenders as C
from benchmarks import problems as P

SCHEMA = 1


@dataclasses.dataclass
class Settings:
    preset: str  # "full", "quick" or "smoke"
    repeats: int
    cap: float  # seconds per contender per problem
    device: str | None
    families: tuple
    out: Path

    @property
    def hard_limit(self) -> float:
        """Safety net behind the projections: a baseline contender is stopped after this long."""
        return 2.0 * self.cap + 5.0

    @property
    def fastcheck_limit(self) -> float:
        """fastcheck is what is measured: it is only stopped when something is clearly stuck."""
        return 10.0 * self.cap


# ----------------------------------------------------------------------------- memory


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _can_reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return _status_kib("VmHWM") is not None
    except OSError:
        return False


MEMORY_METHOD = ("VmHWM after resetting it via /proc/self/clear_refs, minus VmRSS before" if _can_reset_hwm()
                 else "growth of ru_maxrss (lower bound: only a new lifetime peak of the process shows)")


class PeakMemory:
    """Peak resident-set growth (and device peak) of the process during a ``with`` block."""

    def __init__(self, device: str | None):
        self.device = device.lstrip("/").upper().replace("DEVICE:", "") if device else None
        self.rss_mib = None
        self.device_mib = None

    def __enter__(self):
        self._hwm = _can_reset_hwm()
        self._before = _status_kib("VmRSS") if self._hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self._gpu = bool(self.device and "GPU" in self.device)
        if self._gpu:
            try:
                tf.config.experimental.reset_memory_stats(self.device)
                self._device_before = tf.config.experimental.get_memory_info(self.device)["current"]
            except (ValueError, tf.errors.OpError):
                self._gpu = False
        return self

    def __exit__(self, *exc):
        after = _status_kib("VmHWM") if self._hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if after is not None and self._before is not None:
            self.rss_mib = max(0, after - self._before) / 1024.0  # both in KiB on Linux
        if self._gpu:
            try:
                peak = tf.config.experimental.get_memory_info(self.device)["peak"]
                self.device_mib = max(0, peak - self._device_before) / 2**20
            except (ValueError, tf.errors.OpError):
                pass
        return False


# ----------------------------------------------------------------------------- one measurement


@dataclasses.dataclass
class Measurement:
    status: str = "pending"
    samples: list = dataclasses.field(default_factory=list)
    seconds: float | None = None
    estimate: str | None = None  # None (measured), "estimate" or "lower bound"
    how: str | None = None  # how an estimate was made, or why skipped
    peak_rss_mib: float | None = None
    peak_device_mib: float | None = None
    ratio: float | None = None
    baseline: str | None = None
    note: str | None = None
    error: str | None = None
    traceback: str | None = None
    facts: dict = dataclasses.field(default_factory=dict)
    done: bool = False  # no further repeats

    def stop(self, status: str, **fields) -> None:
        self.status, self.done = status, True
        for key, value in fields.items():
            setattr(self, key, value)

    def to_dict(self) -> dict:
        record = dataclasses.asdict(self)
        record.pop("done")
        return record


def _max(a, b):
    return b if a is None else a if b is None else max(a, b)


def _measure_once(name: str, instance, state: dict, settings: Settings, ctx, record: Measurement) -> None:
    try:
        limit = settings.fastcheck_limit if name in C.FASTCHECK else settings.hard_limit
        with PeakMemory(settings.device) as memory, C.hard_stop(limit):
            start = time.perf_counter()
            facts = C.FUNCTIONS[name](instance, state, ctx)
            seconds = time.perf_counter() - start
    except C.OverCap as over:
        record.stop("over_cap", seconds=over.seconds, estimate=over.kind, how=over.how)
        return
    except Exception as error:  # noqa: BLE001 -- reported in the results, never hidden
        record.stop("error", error=C._first_line(error), traceback=traceback.format_exc(limit=8))
        return
    record.status = "ok"
    record.samples.append(seconds)
    record.peak_rss_mib = _max(record.peak_rss_mib, memory.rss_mib)
    record.peak_device_mib = _max(record.peak_device_mib, memory.device_mib)
    if not record.facts:
        record.facts = facts
    if facts and "timings" in facts:  # fastcheck's own per-stage seconds, one entry per repeat
        record.facts.setdefault("timings_by_repeat", []).append(facts["timings"])
    if seconds > settings.cap:
        record.done = True
        record.note = f"one run took {seconds:.3g} s, over the {settings.cap:.0f} s cap: not repeated"


@dataclasses.dataclass
class _Context:
    device: str | None
    cap: float


def measure_instance(instance, settings: Settings, over_cap: dict, log) -> dict:
    """All contenders on one instance, ``settings.repeats`` times, interleaved per repeat.

    ``over_cap`` maps (family, contender) to the label of a smaller size that
    exceeded the cap; such contenders are skipped here and recorded as such.
    """
    ctx = _Context(settings.device, settings.cap)
    records = {name: Measurement() for name in C.CONTENDERS}
    for name, record in records.items():
        if name.startswith("hand_batched") and instance.hand_batched is None:
            record.stop("n/a", how="no hand-batched version of this workload")
        elif name == "reference" and instance.reference is None:
            record.stop("n/a", how="only the fast-mode problems have a reference")
        elif name in instance.skip:
            record.stop("skipped", how=instance.skip[name], note=instance.skip[name])
        elif (instance.family, name) in over_cap and name not in C.FASTCHECK:
            record.stop("skipped", how=f"over the cap at {over_cap[instance.family, name]}")
    cg = records["compute_gradient"]
    if not cg.done and instance.cases is None:
        try:
            predicted, how = C.predict_compute_gradient(instance, ctx)
        except Exception as error:  # noqa: BLE001
            cg.stop("error", error=C._first_line(error), traceback=traceback.format_exc(limit=8))
        else:
            if predicted > settings.cap:
                cg.stop("over_cap", seconds=predicted, estimate="estimate", how=how)

    if instance.reference is not None and not records["reference"].done:
        # The reference stands for eager work a check cannot avoid: time it warm (the first eager
        # ForwardAccumulator / tape calls of a new shape pay one-off set-up costs).
        try:
            C.reference(instance, {}, ctx)
        except Exception as error:  # noqa: BLE001
            records["reference"].stop("error", error=C._first_line(error), traceback=traceback.format_exc(limit=8))

    for repeat in range(settings.repeats):
        state: dict = {}
        for name in C.CONTENDERS:
            record = records[name]
            if record.done:
                continue
            needs = {"fastcheck_warm": "fresh", "hand_batched_warm": "hand"}.get(name)
            if needs and needs not in state:  # its cold call did not run in this repeat
                if record.samples:
                    record.done = True  # the cold one stopped repeating (over the cap)
                else:
                    record.stop("skipped", how="the cold call did not complete")
                continue
            _measure_once(name, instance, state, settings, ctx, record)
            if repeat == 0:
                log(f"  {C.TITLES[name]:<26} {_brief(record)}")

    for name, record in records.items():
        if record.status == "ok":
            record.seconds = statistics.median(record.samples)
        if record.status == "over_cap" or (record.status == "ok" and max(record.samples) > settings.cap):
            over_cap.setdefault((instance.family, name), instance.label)
    for name, base in C.BASELINE.items():
        record, reference = records[name], records[base]
        if record.seconds and reference.seconds and reference.status == "ok":
            record.ratio, record.baseline = record.seconds / reference.seconds, base

    result = {
        "family": instance.family,
        "label": instance.label,
        "size": instance.size,
        "n": instance.n,
        "m": instance.m,
        "description": instance.description,
        "expected_ok": instance.correct,
        "notes": list(instance.notes),
        "check_options": dict(instance.check_options),
        "contenders": {name: record.to_dict() for name, record in records.items()},
        "fastcheck": _fastcheck_summary(records),
    }
    if instance.sweep_flops:
        result["flop_rate"] = _flop_rate(instance, records, settings.device)
    if instance.reference is not None:
        result["fast"] = _fast_summary(instance, records)
    return result


def _fast_summary(instance, records: dict) -> dict:
    """Fast-mode problems: fastcheck / reference time ratios, and (planted defect) where it was localised."""
    ref = records["reference"]
    summary = {"reference_seconds": ref.seconds if ref.status == "ok" else None}
    for name in C.FASTCHECK:
        fc = records[name]
        if fc.status == "ok" and fc.seconds and summary["reference_seconds"]:
            summary[f"{name}_over_reference"] = fc.seconds / summary["reference_seconds"]
    facts = records["fastcheck_cold"].facts
    summary["mode"], summary["path"] = facts.get("mode"), facts.get("path")
    summary["verdict"] = facts.get("verdict")
    if instance.defect is not None:
        summary["defect"] = dict(instance.defect)
        summary["caught"] = facts.get("ok") is False and facts.get("verdict") == "fail"
        regions = facts.get("regions", [])
        summary["regions"] = regions
        summary["region_text"] = facts.get("region_text", [])
        low, high = instance.defect["flat"]
        first_row, last_row = instance.defect["rows"]
        cols = instance.defect["shape"][1]
        flat = [(r["first"][0] * cols + r["first"][1], r["last"][0] * cols + r["last"][1]) for r in regions
                if len(r["first"]) == 2 and len(r["last"]) == 2]
        # inside: the region lies within the defect rows; overlaps: it meets them (a defect smaller than
        # fastcheck's final region, as at the smoke size, can only be overlapped).
        summary["region_inside_defect"] = bool(flat) and all(low <= a <= b <= high for a, b in flat)
        summary["region_overlaps_defect"] = bool(flat) and all(a <= high and b >= low for a, b in flat)
        worst = [r["worst_element"] for r in regions if r.get("worst_element")]
        summary["worst_element_in_defect"] = bool(worst) and all(first_row <= w[0] <= last_row for w in worst)
    return summary


def _brief(record: Measurement) -> str:
    if record.status == "ok":
        verdict = "" if record.facts.get("ok", True) else f", verdict {record.facts.get('verdict', 'not ok')}"
        extra = f"  [{record.facts['path']}{verdict}]" if "path" in record.facts else ""
        return f"{record.samples[-1]:9.3f} s{extra}"
    if record.status == "over_cap":
        return f"over cap ({record.estimate} {record.seconds:.3g} s: {record.how})"
    if record.status == "error":
        return f"ERROR {record.error}"
    return f"{record.status} ({record.how})"


def _fastcheck_summary(records: dict) -> dict:
    """Path, verdict and notes of fastcheck's cold check (the warm one's path too)."""
    cold, warm = records["fastcheck_cold"], records["fastcheck_warm"]
    summary = dict(cold.facts)
    if warm.facts.get("path") and warm.facts.get("path") != cold.facts.get("path"):
        summary["warm_path"] = warm.facts["path"]
    summary["raised"] = [r.error for r in (cold, warm) if r.status == "error"]
    return summary


def matmul_rate(n: int, device: str | None) -> dict:
    """FLOP rate of a plain float64 matmul [min(2n, 4096), n] @ [n, 64], warm, median of 5.

    Timed with and without XLA; the faster one is the reference.
    """
    rows = min(2 * n, 4096)
    rng = np.random.default_rng(0)
    flops = 2.0 * rows * n * 64
    rates = {}
    with C.on_device(device):
        a = tf.constant(rng.normal(size=(rows, n)))
        b = tf.constant(rng.normal(size=(n, 64)))
        for label, jit in (("xla", True), ("graph", False)):
            product = tf.function(lambda a, b: tf.matmul(a, b), jit_compile=jit)
            product(a, b).numpy()
            times = []
            for _ in range(5):
                start = time.perf_counter()
                product(a, b).numpy()
                times.append(time.perf_counter() - start)
            rates[label] = flops / statistics.median(times) / 1e9
    best = max(rates, key=rates.get)
    return {"shape": [rows, n, 64], "gflops": rates[best], "best": best, "gflops_by_path": rates}


def _flop_rate(instance, records: dict, device: str | None) -> dict:
    reference = matmul_rate(instance.n, device)
    rate = {"sweep_gflop": instance.sweep_flops / 1e9, "matmul": reference}
    for name in ("fastcheck_warm", "hand_batched_warm"):
        record = records[name]
        if record.status == "ok" and record.seconds:
            gflops = instance.sweep_flops / record.seconds / 1e9
            rate[name] = {"gflops": gflops, "fraction": gflops / reference["gflops"]}
    # The sweep alone: fastcheck's own timing of its first numerical pass (median over warm repeats).
    sweeps = [t["numerical"] for t in records["fastcheck_warm"].facts.get("timings_by_repeat", []) if t.get("numerical")]
    if sweeps:
        gflops = instance.sweep_flops / statistics.median(sweeps) / 1e9
        rate["fastcheck_sweep"] = {"seconds": statistics.median(sweeps), "gflops": gflops,
                                   "fraction": gflops / reference["gflops"]}
    return rate


# ----------------------------------------------------------------------------- environment


def _git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                              capture_output=True, text=True, timeout=10)
        return done.stdout.strip() or None if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_total() -> int | None:
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(settings: Settings) -> dict:
    devices = [f"{d.device_type}:{d.name}" for d in tf.config.list_physical_devices()]
    return {
        "machine": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpu": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "memory_bytes": _memory_total(),
        },
        "device": {
            "requested": settings.device,
            "used": settings.device or "TensorFlow default placement",
            "physical_devices": devices,
            "built_with_cuda": tf.test.is_built_with_cuda(),
        },
        "versions": {
            "python": sys.version.split()[0],
            "tensorflow": tf.__version__,
            "tensorflow_probability": _version("tensorflow-probability") or _version("tfp-nightly"),
            "keras": _version("keras"),
            "numpy": np.__version__,
            "fastcheck": getattr(fastcheck, "__version__", None),
        },
        "git_commit": _git_commit(),
    }


def warm_up(device: str | None) -> None:
    """Pay TensorFlow's and XLA's once-per-process start-up before anything is timed."""
    x = tf.constant([0.3, 0.7], tf.float64)
    with C.on_device(device):
        fastcheck.check_gradients(lambda v: tf.sin(v), x, jit_compile=True, device=device)
        fastcheck.check_gradients(lambda v: tf.sin(v), x, jit_compile=False, device=device)
        tf.test.compute_gradient(tf.sin, [x])
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.sin(x)
        tape.jacobian(y, x)


# ----------------------------------------------------------------------------- the run


def run(settings: Settings, argv: list, log=print) -> dict:
    """Measure every selected problem; returns the JSON-ready record (not yet written)."""
    started = time.perf_counter()
    stamp = _dt.datetime.now(_dt.timezone.utc)
    warm_up(settings.device)
    results, skipped, over_cap = [], [], {}
    for family, instance, reason in P.instances(settings.preset, settings.families):
        if instance is None:
            log(f"{family}: skipped ({reason})")
            skipped.append({"family": family, "reason": reason})
            continue
        log(f"{instance.label}: {instance.description}")
        results.append(measure_instance(instance, settings, over_cap, log))
    return {
        "schema": SCHEMA,
        "timestamp": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": ["python", "-m", "benchmarks", *argv],
        "settings": {
            "preset": settings.preset,
            "repeats": settings.repeats,
            "cap_seconds": settings.cap,
            "hard_limit_seconds": settings.hard_limit,
            "fastcheck_limit_seconds": settings.fastcheck_limit,
            "device": settings.device,
            "families": list(settings.families),
        },
        **environment(settings),
        "memory_method": MEMORY_METHOD,
        "results": results,
        "skipped_problems": skipped,
        "wall_seconds": time.perf_counter() - started,
    }


def write_json(record: dict, out: Path) -> list[Path]:
    """``<timestamp>.json`` and ``latest.json`` in ``out`` (each written to .tmp, then renamed)."""
    out.mkdir(parents=True, exist_ok=True)
    name = record["timestamp"].replace(":", "").replace("-", "")
    paths = []
    text = json.dumps(record, indent=1, default=_json_default)
    for path in (out / f"{name}.json", out / "latest.json"):
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        paths.append(path)
    return paths


def _json_default(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.bool_):
        return bool(value)
    return str(value)


def fastcheck_failures(record: dict) -> list[str]:
    """Lines for every problem where fastcheck raised, or judged a correct gradient wrong."""
    lines = []
    for result in record["results"]:
        summary = result["fastcheck"]
        for error in summary.get("raised", []):
            lines.append(f"{result['label']}: fastcheck raised {error}")
        if result["family"] == "corpus":
            for item in summary.get("errors", []):
                lines.append(f"{result['label']}: fastcheck raised on {item['case']}: {item['error']}")
        elif summary.get("ok") is False and result["expected_ok"]:
            lines.append(f"{result['label']}: fastcheck reported a correct gradient as wrong "
                         f"(problems: {summary.get('problems')}; notes: {summary.get('notes')})")
        elif summary.get("ok") is True and not result["expected_ok"]:
            lines.append(f"{result['label']}: fastcheck passed a deliberately wrong gradient")
    return lines
