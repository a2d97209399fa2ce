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


def _imported_modules(path: pathlib.Path) -> set[str]:
    """fastcheck modules a module imports at run time (not under ``if TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(sub) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for sub in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only or not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        if node.module.startswith("fastcheck."):
            found.add(node.module.split(".")[1])
        elif node.module == "fastcheck":
            found.update(alias.name for alias in node.names)
    return found


def test_no_import_cycle():
    """No module of fastcheck reaches itself through its imports, function-local ones included."""
    package = ROOT / "fastcheck"
    graph = {p.stem: _imported_modules(p) for p in package.glob("*.py") if p.stem != "__init__"}
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
    while frame is not None:
        path = pathlib.Path(frame.f_code.co_filename)
        if path.parent.name == "fastcheck":
            modules.append(path.stem)
        frame = frame.f_back
    modules.reverse()
    return [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]


def test_the_rule_evaluates_f_only_through_the_strategys_evaluation():
    """The rule's modules judge what a strategy evaluated and call back into its evaluation (``Evaluate``,
    ``sides``, ``along``) for more: they import only each other, the configuration, the tables and the events --
    no evaluator, strategy or plan (one mechanism, whatever evaluates f)."""
    package = ROOT / "fastcheck"
    rule = {"_refine", "_compare", "_wide", "_flat"}
    for module in sorted(rule):
        assert _imported_modules(package / f"{module}.py") <= rule | {"_config", "_tables", "_events"}, module


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
    """Strategies hand a pair's hint over as a fact (``_events.Hint``: its kind and numbers); ``_text.HINTS`` holds
    every hint's text: each kind a module names has its text there, and each text there is a kind some module
    names (``_compare.diagnose`` names the undecidable statuses by their ``STATUS_NAMES``)."""
    from fastcheck import _compare, _text

    named = set()
    for path in (ROOT / "fastcheck").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Hint"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                named.add(node.args[0].value)
    assert named and named <= set(_text.HINTS), named - set(_text.HINTS)
    assert set(_text.HINTS) - named <= set(_compare.STATUS_NAMES.values()), set(_text.HINTS) - named
