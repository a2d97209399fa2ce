"""The package type-checks and lints clean and has no import cycle (the style guide's tooling, run as tests)."""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent


def test_ruff_is_clean():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "fastcheck", "tests"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean():
    result = subprocess.run([sys.executable, "-m", "mypy", "fastcheck"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _module(path: pathlib.Path) -> str:
    """A file's dotted module name within fastcheck ("engine.plan"; "" for the package itself)."""
    parts = path.relative_to(ROOT / "fastcheck").with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in (ROOT / "fastcheck").rglob("*.py")}


def _imported_modules(path: pathlib.Path) -> set[str]:
    """fastcheck modules a module imports at run time (not under ``if TYPE_CHECKING``), function-level ones
    included, as dotted names within the package."""
    tree = ast.parse(path.read_text())
    typing_only = {id(sub) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for sub in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only or not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        if node.module == "fastcheck" or node.module.startswith("fastcheck."):
            base = node.module.removeprefix("fastcheck").lstrip(".")
            for alias in node.names:
                name = f"{base}.{alias.name}".lstrip(".")
                found.add(name if name in MODULES else base)
    return found - {""}


def test_no_import_cycle():
    """No module of fastcheck reaches itself through its imports, function-local ones included."""
    graph = {m: _imported_modules(p) for m, p in MODULES.items() if m}
    assert len(graph) > 40 and sum(map(len, graph.values())) > 100, "the import graph was not read"
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for other in sorted(graph[module] & graph.keys() - {module}):
            assert state.get(other) != 1, f"import cycle: {' -> '.join(path + [other])}"
            if other not in state:
                visit(other, path + [other])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def _module_runs() -> list[str]:
    """fastcheck's modules on the stack from the entry point down to here, a run of frames of one module once."""
    modules = []
    frame = sys._getframe(2)
    package = ROOT / "fastcheck"
    while frame is not None:
        path = pathlib.Path(frame.f_code.co_filename)
        if package in path.parents:
            modules.append(_module(path))
        frame = frame.f_back
    modules.reverse()
    return [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]


def test_the_rule_evaluates_f_only_through_the_strategys_evaluation():
    """The rule's modules judge what a strategy evaluated and call back into its evaluation (``Evaluate``,
    ``sides``, ``along``) for more: they import only each other, the configuration, the tables and the events --
    no evaluator, strategy or plan (one mechanism, whatever evaluates f)."""
    rule = {"judge.refine", "judge.compare", "judge.wide", "judge.flat"}
    for module in sorted(rule):
        imported = _imported_modules(MODULES[module])
        assert imported and imported <= rule | {"engine.config", "engine.tables", "report.events"}, module


def test_following_f_visits_each_module_at_most_twice():
    """Every call of f, from check_gradients down (planning, routing, tracing, the batched sweeps, refinement,
    each mode), passes through each of fastcheck's modules in at most two separate stretches of the stack."""
    import numpy as np
    import tensorflow as tf

    import fastcheck

    worst: dict[str, tuple[int, str]] = {}

    def watched(g):
        def f(*args):
            runs = _module_runs()
            for module in set(runs):
                if runs.count(module) > worst.get(module, (0, ""))[0]:
                    worst[module] = (runs.count(module), " > ".join(runs))
            return g(*args)

        return f

    rng = np.random.default_rng(0)
    w = tf.constant(rng.normal(size=(5, 4)))
    x = tf.constant(rng.normal(size=4))
    for mode in ("full", "fast", "coloured"):
        for jit_compile in (False, "auto"):
            fastcheck.check_gradients(watched(lambda v: tf.tanh(tf.linalg.matvec(w, v))), [x], mode=mode,
                                      jit_compile=jit_compile)
    fastcheck.check_gradients(watched(lambda v: tf.sin(v) * v), [tf.constant(rng.normal(size=50))])  # element-wise
    fastcheck.check_gradients(watched(lambda v: tf.nn.relu(v) * 1.01), [x])  # a kink at each element: refinement
    fastcheck.compute_gradient(watched(lambda v: tf.tanh(v) ** 2), [x])
    assert worst, "f was never called"
    bouncing = {m: chain for m, (count, chain) in worst.items() if count > 2}
    assert {"_check", "modes.full", "engine.executor"} <= worst.keys(), sorted(worst)
    assert not bouncing, "\n".join(f"{k}: {v}" for k, v in bouncing.items())


def test_every_test_the_design_names_exists():
    """docs/design.md states each invariant with the tests that enforce it: each of them must exist."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    named = set(re.findall(r"`(test_\w+)`", (root / "docs" / "design.md").read_text()))
    defined = {m for path in root.glob("tests/**/*.py") for m in re.findall(r"^def (test_\w+)", path.read_text(), re.M)}
    assert len(named) >= 20 and not named - defined, sorted(named - defined)


def test_every_hint_is_a_fact_whose_text_is_composed_in_one_place():
    """Strategies hand a pair's hint over as a fact (``events.Hint``: its kind and numbers); ``text.HINTS`` holds
    every hint's text: each kind a module names has its text there, and each text there is a kind some module
    names (``compare.diagnose`` names the undecidable statuses by their ``STATUS_NAMES``)."""
    from fastcheck.judge import compare as _compare
    from fastcheck.report import text as _text

    named = set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Hint"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                named.add(node.args[0].value)
    assert named and named <= set(_text.HINTS), named - set(_text.HINTS)
    assert set(_text.HINTS) - named <= set(_compare.STATUS_NAMES.values()), set(_text.HINTS) - named
