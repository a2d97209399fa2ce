"""``python -m benchmarks`` (also ``fastcheck bench``): run the suite, or compare two runs.

    python -m benchmarks [run] [--quick] [--device /GPU:0] [--out DIR] [--only dense,conv] [--repeats N]
    python -m benchmarks compare OLD.json NEW.json [--threshold 1.25]
    python -m benchmarks verdicts [--out DIR] [--cases NAME,NAME] [--dtypes float32,float64]
    python -m benchmarks op-audit [--quick] [--only NAME,NAME]
    python -m benchmarks cold [--only dense-256,mlp-9610-fast] [--repeats 3] [--warm] [--profile]
    python -m benchmarks models [--env main|legacy] [--quick] [--classes NAME,NAME]
    python -m benchmarks bijectors [--only Exp,CorrelationCholesky]
    python -m benchmarks tf_tests [--only mnist,unary_float32]

A run writes ``<timestamp>.json``, ``latest.json``, ``latest.md`` and
``latest.png`` to ``--out`` (default ``benchmarks/results``) and prints the
markdown.  It exits 1 when fastcheck raised or judged one of the (correct)
benchmark gradients wrong, else 0; times never decide the exit code.
``compare`` exits 1 when a fastcheck time grew beyond the threshold (or a
fastcheck measurement broke), else 0.  ``verdicts`` runs fastcheck and
``tf.test.compute_gradient`` (judged with torch's and JAX's tolerances) on every
case of the corpus and writes ``verdicts.md`` / ``verdicts.json`` (see
``benchmarks/verdicts.py``); it exits 1 when fastcheck got a case wrong.
``bijectors`` runs ``check_bijector`` on every TFP bijector built with no
arguments and writes ``bijectors.md`` (see ``benchmarks/bijectors.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from benchmarks.names import FAMILIES

RESULTS = Path(__file__).resolve().parent / "results"


def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Time fastcheck against tf.test.compute_gradient, an element-by-element loop and a "
        "hand-batched limit on the same functions. Subcommand 'compare OLD.json NEW.json' compares two runs; "
        "'verdicts' tabulates right/wrong verdicts on the corpus; 'op-audit' checks TensorFlow's and TFP's own "
        "registered gradients (benchmarks/op_audit.py).",
    )
    parser.add_argument("command", nargs="?", choices=["run"], help="run the suite (the default)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes, 1 repeat, 15 s cap (about 3 minutes on 2 CPU cores)")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, 1 repeat, 10 s cap (for the test suite)")
    parser.add_argument("--device", default=None, help="e.g. /GPU:0: passed to fastcheck, other contenders run in tf.device")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results folder (default {RESULTS})")
    parser.add_argument("--only", default=None, metavar="PROBLEM[,PROBLEM]",
                        help=f"comma-separated problems among {', '.join(FAMILIES)}")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per measurement (default 3; quick/smoke 1)")
    parser.add_argument("--cap", type=float, default=None,
                        help="seconds per contender per problem before it is estimated or skipped (default 60; quick 15)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    return parser


def _compare_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks compare",
                                     description="Compare two result files; exit 1 on a fastcheck regression.")
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--threshold", type=float, default=1.25, help="flag new/old time ratios above this (default 1.25)")
    return parser


def compare_main(argv: list) -> int:
    from benchmarks import report

    args = _compare_parser().parse_args(argv)
    if args.threshold <= 1.0:
        print("--threshold must be greater than 1", file=sys.stderr)
        return 2
    text, regressions = report.compare(report.load(args.old), report.load(args.new), args.threshold)
    print(text)
    return 1 if regressions else 0


def run_main(argv: list) -> int:
    args = _run_parser().parse_args(argv)
    families = tuple(FAMILIES)
    if args.only:
        families = tuple(name.strip() for name in args.only.split(",") if name.strip())
        unknown = [name for name in families if name not in FAMILIES]
        if unknown:
            print(f"unknown problem(s) {', '.join(unknown)}; choose among {', '.join(FAMILIES)}", file=sys.stderr)
            return 2
    preset = "smoke" if args.smoke else "quick" if args.quick else "full"
    repeats = args.repeats or (1 if preset != "full" else 3)
    cap = args.cap or {"full": 60.0, "quick": 15.0, "smoke": 10.0}[preset]
    if repeats < 1 or cap <= 0:
        print("--repeats and --cap must be positive", file=sys.stderr)
        return 2

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads
    import tensorflow as tf

    from benchmarks import report
    from benchmarks import run as runner

    settings = runner.Settings(preset, repeats, cap, args.device, families, args.out)
    started = time.perf_counter()
    logger, level = tf.get_logger(), tf.get_logger().level
    logger.setLevel("ERROR")  # retracing / pfor fallback warnings would bury the progress lines
    try:
        record = runner.run(settings, argv, log=lambda line: print(line, flush=True))
    finally:
        logger.setLevel(level)
    written = runner.write_json(record, args.out)
    text = report.markdown(record)
    markdown_path = args.out / "latest.md"
    markdown_path.write_text(text)
    written.append(markdown_path)
    if not args.no_plot:
        png = report.plot(record, args.out / "latest.png")
        if png:
            written.append(png)
    print()
    print(text)
    print("wrote " + ", ".join(str(p) for p in written))
    print(f"total wall time {time.perf_counter() - started:.1f} s")
    failures = runner.fastcheck_failures(record)
    for line in failures:
        print(f"FASTCHECK FAILURE: {line}")
    return 1 if failures else 0


def main(argv=None) -> int:
    """Entry point for ``python -m benchmarks`` and ``fastcheck bench``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # `fastcheck bench -- --quick ...` passes the separator on
        argv = argv[1:]
    if argv and argv[0] == "compare":
        return compare_main(argv[1:])
    if argv and argv[0] == "cold":
        from benchmarks import cold

        return cold.main(argv[1:])
    if argv and argv[0] == "models":
        from benchmarks import models

        return models.main(argv[1:])
    if argv and argv[0] == "op-audit":
        from benchmarks import op_audit

        return op_audit.main(argv[1:])
    if argv and argv[0] == "bijectors":
        from benchmarks import bijectors

        return bijectors.main(argv[1:])
    if argv and argv[0] == "tf_tests":
        from benchmarks import tf_tests

        return tf_tests.main(argv[1:])
    if argv and argv[0] == "verdicts":
        from benchmarks import verdicts

        return verdicts.main(argv[1:])
    return run_main(argv)


if __name__ == "__main__":
    sys.exit(main())
