"""``python -m benchmarks cold``: the first check in a fresh process, fastcheck against compute_gradient.

The main suite measures "a new function in a warm process" (the CI-suite case: the
process has already run TensorFlow).  This measures the other case a user meets:
``python my_check.py``, where the check is the first thing the process does after
importing TensorFlow.  Each contender runs in its own fresh Python process per
problem and repeat (TensorFlow and fastcheck imported -- fastcheck's modules load
lazily, on first use of a public name, and are loaded before the clock too -- and the
problem built before the clock starts), and the table gives the median seconds and the ratio
``compute_gradient / fastcheck`` from the same run, with the CPU model; the JSON adds every run's seconds and
``report.timings`` (seconds per stage) of the last fastcheck run.

    python -m benchmarks cold [--only dense-1024,mlp-20000] [--repeats 3] [--out DIR] [--warm] [--profile]

``--warm`` measures the other case beside it: a new function checked in a process that
has already checked (and traced, and XLA-compiled) another one.  On small checks that is
the pipeline's own overhead (planning, routing, tracing, the report) beside
compute_gradient's loop: ``dense-256`` with default options and ``mlp-9610-fast``
(``mode="fast"`` against compute_gradient's full Jacobian), with ``dense-4096`` and
``mlp-9610`` in default mode for context.  ``--profile`` adds one cProfile run of
fastcheck's check per problem and writes ``<stem>-<problem>.prof`` beside the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.run import _cpu_model

# name -> (problems.<factory>, its keyword arguments, fastcheck.check_gradients's options)
PROBLEMS = {
    "dense-256": ("dense", {"n": 256}, {}),
    "dense-1024": ("dense", {"n": 1024}, {}),
    "dense-4096": ("dense", {"n": 4096}, {}),
    "dense-16384": ("dense", {"n": 16384}, {}),
    "conv-32": ("conv", {"side": 32}, {}),
    "mlp-9610": ("mlp", {"target_params": 9610, "features": 64, "outputs": 10}, {}),  # 64 -> 128 -> 10
    "mlp-9610-fast": ("mlp", {"target_params": 9610, "features": 64, "outputs": 10}, {"mode": "fast"}),
    "mlp-20000": ("mlp", {"target_params": 20000}, {}),
}

_CHILD = r"""
import os, sys, time, json
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, {root!r})
import tensorflow as tf
from benchmarks import problems
from benchmarks.contenders import _for_compute_gradient
if {warm!r}:  # a process that has already checked and traced something: the CI-suite case
    import fastcheck
    fastcheck.check_gradients(lambda x: tf.tanh(x) * 2, tf.constant([[0.1] * 64] * 64, tf.float64), jit_compile=True)
    tf.test.compute_gradient(tf.sin, [tf.constant([0.1, 0.2], tf.float64)])
instance = getattr(problems, {factory!r})(**{arguments!r})
if {contender!r} == "fastcheck":
    import fastcheck
    check = fastcheck.check_gradients  # its modules load here (lazily on first use), as TensorFlow's did above
    if {profile!r}:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    start = time.perf_counter()
    report = check(instance.f, instance.inputs, **{options!r})
    seconds = time.perf_counter() - start
    if {profile!r}:
        profiler.disable()
        profiler.dump_stats({profile!r})
    facts = {{"ok": report.ok, "path": report.path, "mode": report.mode, "timings": report.timings}}
else:
    f, xs = _for_compute_gradient(instance.f, instance.inputs)
    start = time.perf_counter()
    tf.test.compute_gradient(f, xs)
    seconds = time.perf_counter() - start
    facts = {{}}
print("RESULT " + json.dumps({{"seconds": seconds, **facts}}))
"""


def measure(name: str, contender: str, timeout: float = 900.0, warm: bool = False, profile: str = "") -> dict:
    """One fresh process: seconds of the first check of this function (and fastcheck's path, mode, verdict
    and seconds per stage); with ``warm``, after a warm-up check of another function in the same process;
    with ``profile``, fastcheck's check runs under cProfile, its statistics written to that file."""
    factory, arguments, options = PROBLEMS[name]
    root = str(Path(__file__).resolve().parent.parent)
    code = _CHILD.format(root=root, factory=factory, arguments=arguments, options=options, contender=contender,
                         warm=warm, profile=profile)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{contender} on {name} failed: {done.stderr.strip().splitlines()[-1:]}")


def run(names: list[str], repeats: int, warm: bool = False) -> dict:
    rows = {}
    for name in names:
        options = PROBLEMS[name][2]
        times = {"fastcheck": [], "compute_gradient": []}
        facts: dict = {}
        for _ in range(repeats):
            for contender in times:
                result = measure(name, contender, warm=warm)
                times[contender].append(result["seconds"])
                if contender == "fastcheck":
                    facts = result
        fast, anchor = statistics.median(times["fastcheck"]), statistics.median(times["compute_gradient"])
        rows[name] = {"fastcheck": fast, "compute_gradient": anchor, "ratio": anchor / fast,
                      "path": facts.get("path"), "mode": facts.get("mode"), "ok": facts.get("ok"),
                      "options": options, "fastcheck_runs": times["fastcheck"],
                      "compute_gradient_runs": times["compute_gradient"], "timings": facts.get("timings")}
        print(f"{name:14s} fastcheck {fast:7.3f} s ({facts.get('path')}, {facts.get('mode')}, ok={facts.get('ok')})  "
              f"compute_gradient {anchor:7.3f} s  x{anchor / fast:.2f}", flush=True)
    return {"cpu": _cpu_model(), "cpus": os.cpu_count(), "repeats": repeats, "warm": warm, "problems": rows}


def to_markdown(record: dict) -> str:
    what = "A new function in a warm process" if record.get("warm") else "First check in a fresh process"
    lines = [f"{what} (median of {record['repeats']}), {record['cpu']} x {record['cpus']}:",
             "", "| problem | fastcheck | path | mode | tf.test.compute_gradient | ratio |", "|---|---|---|---|---|---|"]
    for name, row in record["problems"].items():
        lines.append(f"| {name} | {row['fastcheck']:.3g} s | {row['path']} | {row.get('mode') or '-'} | "
                     f"{row['compute_gradient']:.3g} s | x{row['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks cold", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(PROBLEMS), help="problems, comma-separated: " + ", ".join(PROBLEMS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    parser.add_argument("--warm", action="store_true",
                        help="check a new function in a process that has already checked another (the CI-suite case)")
    parser.add_argument("--profile", action="store_true",
                        help="also run fastcheck's check once under cProfile per problem: <stem>-<problem>.prof")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROBLEMS]
    if unknown:
        parser.error(f"unknown problem(s) {unknown}; choose from {list(PROBLEMS)}")
    record = run(names, args.repeats, args.warm)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "warm" if args.warm else "cold"
    if args.profile:
        for name in names:
            measure(name, "fastcheck", warm=args.warm, profile=str((out / f"{stem}-{name}.prof").resolve()))
    (out / f"{stem}.json").write_text(json.dumps(record, indent=2))
    (out / f"{stem}.md").write_text(to_markdown(record))
    print(to_markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
