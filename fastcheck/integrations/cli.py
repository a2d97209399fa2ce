"""The ``fastcheck`` command: ``fastcheck check``, ``fastcheck demo`` and ``fastcheck bench``."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import pathlib
import sys

# Exit status of ``fastcheck check`` by verdict; 2 also for a mistake in the command line.
EXIT_STATUS = {"pass": 0, "fail": 1, "undecidable": 2}


class UsageError(Exception):
    """A mistake in the command line: one line on stderr, exit status 2."""


def _quiet_tensorflow() -> None:
    """Load TensorFlow without its start-up log lines: they would bury the reports."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0" or "tensorflow" in sys.modules:
        return
    # TensorFlow >= 2.20 logs through absl, which writes its start-up lines (oneDNN, "Could not find cuda drivers") to
    # file descriptor 2 whatever TF_CPP_MIN_LOG_LEVEL says: point it at /dev/null while TensorFlow loads. Devices are
    # left uncreated, so that a user's module may still configure them when it imports (tf.config.set_visible_devices).
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fastcheck", description="Fast, batched gradient checks for TensorFlow.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="run the built-in examples and print their reports",
        description="Run built-in gradient checks (correct and deliberately wrong) and print their reports. "
        "Exits 0 when every example behaves as expected.",
    )
    demo.add_argument("--dtype", choices=["float32", "float64"], default="float64", help="dtype of the examples")
    demo.add_argument("--json", metavar="PATH", help="also write every report as JSON to PATH")
    check = commands.add_parser(
        "check",
        help="check the gradients of your own function",
        description="Check the gradients of FUNCTION in MODULE (a module name, or path/to/file.py) on random "
        "normal inputs of the given shapes, or on the arrays of an .npz file, and print the report. "
        "Exit status: 0 pass, 1 a wrong gradient, 2 undecidable or a mistake in the command line.",
    )
    check.add_argument("target", metavar="MODULE:FUNCTION", help="e.g. mypackage.ops:my_op or path/to/file.py:my_op")
    check.add_argument("--shape", action="append", default=[], metavar="D0,D1,...",
                       help="shape of one input, once per input in order (e.g. --shape 3,4 --shape 4; '' for a scalar)")
    check.add_argument("--inputs", metavar="FILE.npz",
                       help="the inputs instead: the arrays of numpy.savez(FILE, x, w), in the order they were saved")
    check.add_argument("--dtype", choices=["float32", "float64"],
                       help="dtype of the random inputs (default float32); with --inputs, floating arrays are cast to it")
    check.add_argument("--seed", type=int, default=0, help="seed of the random inputs and of fast mode's probes")
    check.add_argument("--mode", choices=["auto", "full", "fast", "coloured"], default="auto",
                       help="full Jacobians, fast random projections, coloured sparse Jacobians, or auto (by size and time)")
    check.add_argument("--precision", choices=["auto", "native", "float64"], default="auto",
                       help="precision of the numerical side")
    check.add_argument("--device", help="device to check on, e.g. /GPU:0, or a comma-separated list (/GPU:0,/GPU:1) "
                                        "whose replicas share the check")
    check.add_argument("--json", metavar="OUT", help="also write the report as JSON to OUT")
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
    if args.command == "check":
        try:
            return _check(args)
        except UsageError as error:
            print(f"fastcheck check: {error}", file=sys.stderr)
            return 2
    _quiet_tensorflow()
    if args.command == "demo":
        from fastcheck.integrations.demo import run_demo

        return run_demo(args.dtype, args.json)
    return _bench(args.rest)


def _check(args) -> int:
    """``fastcheck check``: the command line checked before TensorFlow loads, then the check."""
    import numpy as np

    shapes = [_shape(text) for text in args.shape]
    if bool(shapes) == bool(args.inputs):
        raise UsageError("pass --shape once per input (e.g. --shape 3,4 --shape 4) or --inputs FILE.npz, one of the two.")
    if args.inputs:
        inputs = _load_inputs(args.inputs, args.dtype)
    else:
        rng = np.random.default_rng(args.seed)
        inputs = [rng.standard_normal(shape).astype(args.dtype or "float32") for shape in shapes]
    _quiet_tensorflow()  # before the user's module imports TensorFlow
    function = _function(args.target)
    import tensorflow as tf

    import fastcheck

    options = {"mode": args.mode, "precision": args.precision, "seed": args.seed}
    if args.device:
        options["device"] = [d.strip() for d in args.device.split(",")] if "," in args.device else args.device
    described = ", ".join(f"{list(x.shape)} {x.dtype}" for x in inputs)
    try:
        report = fastcheck.check_gradients(function, inputs, **options)
    except (TypeError, ValueError, tf.errors.OpError) as error:
        first_line = (str(error).strip().splitlines() or [""])[0]
        raise UsageError(f"checking {args.target} on inputs {described} failed: {type(error).__name__}: {first_line} "
                         "(do --shape/--inputs, --dtype and --device fit the function?)") from None
    report.title = f"{args.target} on inputs {described}"
    print(report)
    if args.json:
        record = {"target": args.target, "inputs": [{"shape": list(x.shape), "dtype": str(x.dtype)} for x in inputs],
                  "exit_status": EXIT_STATUS[report.verdict], **report.to_dict()}
        pathlib.Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    return EXIT_STATUS[report.verdict]


def _shape(text: str) -> tuple[int, ...]:
    parts = [part.strip() for part in text.strip().strip("()[]").split(",") if part.strip()]
    if not all(part.isdigit() for part in parts):
        raise UsageError(f"--shape {text!r} is not a shape: pass sizes separated by commas, e.g. --shape 3,4 "
                         "(--shape '' for a scalar).")
    return tuple(int(part) for part in parts)


def _load_inputs(path: str, dtype: str | None) -> list:
    import numpy as np

    if not pathlib.Path(path).is_file():
        raise UsageError(f"--inputs {path}: no such file: pass an .npz file written by numpy.savez(FILE, x, w).")
    try:
        loaded = np.load(path, allow_pickle=False)
    except Exception as error:
        raise UsageError(f"--inputs {path} is not an .npz file numpy can read ({error}): write it with "
                         "numpy.savez(FILE, x, w).") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile) or not loaded.files:
        raise UsageError(f"--inputs {path} holds no arrays by name: write it with numpy.savez(FILE, x, w).")
    with loaded:
        arrays = [loaded[name] for name in loaded.files]  # the order numpy.savez wrote them in
    if dtype:
        arrays = [a.astype(dtype) if np.issubdtype(a.dtype, np.floating) else a for a in arrays]
    return arrays


def _function(target: str):
    """The callable ``MODULE:FUNCTION`` names; MODULE is a module name or a path to a .py file."""
    module_name, colon, name = target.rpartition(":")
    if not colon or not module_name or not name:
        raise UsageError(f"{target!r} does not name a function: pass MODULE:FUNCTION, e.g. mypackage.ops:my_op "
                         "or path/to/file.py:my_op.")
    module = _import(module_name)
    function = module
    for part in name.split("."):
        function = getattr(function, part, None)
    if function is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_") and not isinstance(v, type))
        raise UsageError(f"{module_name} has no {name!r}: name one of its functions ({', '.join(public[:12]) or 'none'}).")
    if not callable(function):
        raise UsageError(f"{target} is not a function (its type is {type(function).__name__}): name a callable.")
    return function


def _import(module_name: str):
    is_path = module_name.endswith(".py") or "/" in module_name or os.sep in module_name
    try:
        if not is_path:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())  # as python -m does: modules of the current folder import
            return importlib.import_module(module_name)
        path = pathlib.Path(module_name)
        if not path.is_file():
            raise UsageError(f"{module_name}: no such file: pass the path of a Python file, or a module name.")
        sys.path.insert(0, str(path.resolve().parent))  # the file's neighbours import, as when it runs
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"{module_name} is not a Python file: pass path/to/file.py:FUNCTION.")
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(path.stem, module)
        spec.loader.exec_module(module)
        return module
    except ModuleNotFoundError as error:
        if not is_path and error.name and (module_name + ".").startswith(error.name + "."):
            raise UsageError(f"cannot import {module_name!r} ({error}): run fastcheck in the folder that holds it, add "
                             "that folder to PYTHONPATH, or pass a file path such as path/to/module.py:FUNCTION.") from None
        raise UsageError(f"importing {module_name} failed: {error}: install the missing module.") from None
    except UsageError:
        raise
    except Exception as error:
        raise UsageError(f"importing {module_name} failed: {type(error).__name__}: {error} "
                         "(import it in Python to see the traceback).") from None


def _bench(argv: list) -> int:
    """Run the benchmark suite from a source checkout (it is not installed with the package)."""
    # The importable ``benchmarks`` may be a user's own: this project's has ``benchmarks.contenders``.
    if importlib.util.find_spec("benchmarks") is None or importlib.util.find_spec("benchmarks.contenders") is None:
        checkout = pathlib.Path.cwd()
        if (checkout / "benchmarks" / "__main__.py").is_file():
            sys.path.insert(0, str(checkout))
        else:
            print("fastcheck bench runs the benchmark suite of a source checkout: cd into the fastcheck repository "
                  "(the folder with benchmarks/) and run it there, or run python -m benchmarks.", file=sys.stderr)
            return 2
    from benchmarks.__main__ import main as bench_main

    return bench_main(argv)


if __name__ == "__main__":
    sys.exit(main())
