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
