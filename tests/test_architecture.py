"""The layers of the design, checked by import-linter, and the lint rules, checked by ruff.

import-linter reads a package from one folder, but ``tuner/``, ``predictors/`` and ``server/`` sit
at the top of the checkout and install inside ``cswap``; the check therefore runs on a copy laid out
as the wheel lays it out.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAMESPACED = ("predictors", "server", "tuner")
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run `make install` (the dev extra has it)")
    return found


def _installed_layout(into: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "cswap", into / "cswap", ignore=ignore)
    for name in NAMESPACED:
        shutil.copytree(ROOT / name, into / "cswap" / name, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", into / "pyproject.toml")
    return into


def _module_name(path: Path) -> str:
    for name in NAMESPACED:
        if path.is_relative_to(ROOT / name):
            parts = ("cswap", name, *path.relative_to(ROOT / name).with_suffix("").parts)
            break
    else:
        parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the cswap modules it imports anywhere in its body; ``from package import name``
    counts as importing the submodule when ``name`` is one. A module that calls ``import_module``
    imports every module it names in a string, and every module under a prefix it formats
    (``f"cswap.commands.{name}"``)."""
    files = [p for base in ("cswap", *NAMESPACED) for p in (ROOT / base).rglob("*.py")]
    modules = {_module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target in modules:
                        edges.add(target)
                    elif base in modules:
                        edges.add(base)
        if "import_module" in path.read_text():
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in modules:
                    edges.add(node.value)
                elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
                    prefix = str(node.values[0].value)
                    if prefix.startswith("cswap."):
                        edges |= {m for m in modules if m.startswith(prefix)}
        edges.discard(name)
        graph[name] = edges
    return graph


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=300)


def test_imports_flow_down_the_layers(tmp_path: Path) -> None:
    result = _lint_imports(_installed_layout(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(
    ("module", "planted"),
    [
        ("codecs/zvc.py", "cswap.runtime"),  # the bottom reaching the top
        ("planner/plan.py", "cswap.execute.executor"),  # inside the core: the planner above the executor
        ("profile/trace.py", "cswap.planner.lifetime"),  # inside the core: the profile above the planner
        ("execute/executor.py", "cswap.runtime"),  # inside the core: the executor above the runtime
        ("options.py", "cswap.runtime"),
    ],
)
def test_the_layer_check_catches_an_upward_import(tmp_path: Path, module: str, planted: str) -> None:
    tree = _installed_layout(tmp_path)
    path = tree / "cswap" / module
    path.write_text(path.read_text() + f"\nimport {planted}  # an upward import\n")
    result = _lint_imports(tree)
    assert result.returncode != 0
    importer = "cswap." + module.removesuffix(".py").replace("/", ".")
    assert f"{importer} -> {planted}" in result.stdout, result.stdout


def test_the_package_has_no_import_circles() -> None:
    """Every module's imports, lazy ones inside functions included, form no circle (a package's
    ``__init__`` is a module like any other)."""
    graph = _import_graph()
    seen: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        seen[node] = 1
        stack.append(node)
        for child in sorted(graph.get(node, ())):
            if seen.get(child) == 1:
                cycle = [*stack[stack.index(child):], child]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if child not in seen:
                visit(child)
        stack.pop()
        seen[node] = 2

    for node in sorted(graph):
        if node not in seen:
            visit(node)


def test_the_top_level_holds_the_entry_points_only() -> None:
    top = sorted(p.name for p in (ROOT / "cswap").glob("*.py"))
    assert len(top) <= 10, top


def test_the_service_check_catches_torch(tmp_path: Path) -> None:
    tree = _installed_layout(tmp_path)
    app = tree / "cswap" / "server" / "app.py"
    app.write_text(app.read_text() + "\nimport torch  # the service must not\n")
    result = _lint_imports(tree)
    assert result.returncode != 0
    assert "cswap.server.app is not allowed to import torch" in result.stdout



def test_ruff_is_clean() -> None:
    result = subprocess.run([_tool("ruff"), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
