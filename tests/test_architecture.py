"""The layers of the design, checked by import-linter, and the lint rules, checked by ruff.

import-linter reads a package from one folder, but ``tuner/``, ``predictors/`` and ``server/`` sit
at the top of the checkout and install inside ``cswap``; the check therefore runs on a copy laid out
as the wheel lays it out.
"""

from __future__ import annotations

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


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=300)


def test_imports_flow_down_the_layers(tmp_path: Path) -> None:
    result = _lint_imports(_installed_layout(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken." in result.stdout


def test_the_layer_check_catches_an_upward_import(tmp_path: Path) -> None:
    tree = _installed_layout(tmp_path)
    codec = tree / "cswap" / "codecs" / "zvc.py"
    codec.write_text(codec.read_text() + "\nimport cswap.runtime  # an upward import\n")
    result = _lint_imports(tree)
    assert result.returncode != 0
    assert "cswap.codecs.zvc -> cswap.runtime" in result.stdout


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
