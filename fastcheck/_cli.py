"""The ``fastcheck`` command: ``fastcheck demo`` and ``fastcheck bench``."""

from __future__ import annotations

import argparse
import os
import sys


def _quiet_tensorflow() -> None:
    # Before TensorFlow loads: its C++ start-up and numerics logs would bury the reports.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="fastcheck",
        description="Fast, batched gradient checks for TensorFlow.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="run the built-in examples and print their reports",
        description="Run built-in gradient checks (correct and deliberately wrong) and print their reports. "
        "Exits 0 when every example behaves as expected.",
    )
    demo.add_argument("--dtype", choices=["float32", "float64"], default="float64", help="dtype of the examples")
    demo.add_argument("--json", metavar="PATH", help="also write every report as JSON to PATH")
    bench = commands.add_parser(
        "bench",
        help="run the benchmark suite (same as python -m benchmarks)",
        description="Run the benchmark suite; arguments are passed on to python -m benchmarks.",
        add_help=False,
    )
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    args, unknown = parser.parse_known_args(argv)
    if args.command == "bench":
        args.rest = [*unknown, *args.rest]  # options like --quick belong to the benchmark suite
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help()
        return 2
    _quiet_tensorflow()
    if args.command == "demo":
        from fastcheck._demo import run_demo

        return run_demo(args.dtype, args.json)
    return _bench(args.rest)


def _bench(argv: list) -> int:
    """Run the benchmark suite from a source checkout (it is not installed with the package)."""
    import importlib.util
    import pathlib

    if importlib.util.find_spec("benchmarks") is None or not _is_fastcheck_suite():
        checkout = pathlib.Path.cwd()
        if (checkout / "benchmarks" / "__main__.py").is_file():
            sys.path.insert(0, str(checkout))
        else:
            print("fastcheck bench runs the benchmark suite of a source checkout: cd into the fastcheck repository "
                  "(the folder with benchmarks/) and run it there, or run python -m benchmarks.", file=sys.stderr)
            return 2
    from benchmarks.__main__ import main as bench_main

    return bench_main(argv)


def _is_fastcheck_suite() -> bool:
    """Whether the importable ``benchmarks`` is this project's (a user may have their own)."""
    import importlib.util

    spec = importlib.util.find_spec("benchmarks.contenders")
    return spec is not None


if __name__ == "__main__":
    sys.exit(main())
