"""The wheel: every package and every shipped config in it, and cswap working from it alone.

A checkout finds ``configs/`` next to the package; an installed wheel must carry the same files
(as ``cswap/_configs``), or the runtime cannot load its defaults.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_PACKAGES = ("cswap", "predictors", "server", "tuner")
# Folders at the top of the checkout that install inside the cswap namespace.
NAMESPACED = ("predictors", "server", "tuner")
SHIPPED = sorted(p.relative_to(ROOT / "configs").as_posix() for p in (ROOT / "configs").rglob("*.yaml"))


def _declared_packages() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]


def test_every_package_is_declared() -> None:
    found = sorted(
        ".".join(("cswap", *parts) if parts[0] in NAMESPACED else parts)
        for top in TOP_PACKAGES
        for init in (ROOT / top).rglob("__init__.py")
        for parts in [init.parent.relative_to(ROOT).parts]
    )
    assert sorted(p for p in _declared_packages() if p != "cswap._configs") == found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the source (the build leaves nothing in the checkout)."""
    source = tmp_path_factory.mktemp("source")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in (*TOP_PACKAGES, "configs"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    (built,) = out.glob("cswap-*.whl")
    return built


def test_wheel_carries_the_shipped_configs_and_every_module(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert sorted(n.removeprefix("cswap/_configs/") for n in names if n.startswith("cswap/_configs/")) == SHIPPED
    modules = sorted(
        f"cswap/{rel}" if rel.split("/")[0] in NAMESPACED else rel
        for top in TOP_PACKAGES
        for rel in [p.relative_to(ROOT).as_posix() for p in (ROOT / top).rglob("*.py")]
    )
    assert [m for m in modules if m not in names] == []


def test_wheel_installs_one_top_level_package(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    (top_level,) = [n for n in archive.namelist() if n.endswith(".dist-info/top_level.txt")]
    assert archive.read(top_level).decode().split() == ["cswap"]
    assert not [n for n in archive.namelist() if n.split("/")[0] in NAMESPACED]


def test_runtime_loads_its_defaults_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import json, cswap, torch\n"
        "from cswap.options import default_options_path\n"
        "from cswap.simulate.hardware import hardware_names\n"
        "from cswap.tuner.space import load_search_spaces\n"
        "rt = cswap.Runtime('none', device='cpu')\n"
        "print(json.dumps({'package': cswap.__file__, 'defaults': str(default_options_path()),\n"
        "                  'min_bytes': rt.options.min_bytes, 'hardware': list(hardware_names()),\n"
        "                  'cpu_ops': sorted(load_search_spaces('cpu'))}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CSWAP_RUNTIME_CONFIG", "CSWAP_HARDWARE_DIR", "CSWAP_SEARCH_SPACES")}
    env["PYTHONPATH"] = str(site)
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(found["package"]).is_relative_to(site)
    assert Path(found["defaults"]) == site / "cswap" / "_configs" / "default.yaml"
    assert found["min_bytes"] > 0
    assert sorted(f"hardware/{name}.yaml" for name in found["hardware"]) == [n for n in SHIPPED if n.startswith("hardware/")]
    assert found["cpu_ops"] == ["compress", "decompress"]


SHADOWING_PROBE = """
import json, subprocess, sys
import cswap
from cswap import Runtime
import cswap.server.app, cswap.tuner.store, cswap.predictors.timemodel
rt = Runtime("none", device="cpu")
help_text = subprocess.run([sys.executable, "-m", "cswap.cli", "train", "--help"], capture_output=True, text=True)
print(json.dumps({
    "modules": [m.__file__ for m in (cswap, cswap.server.app, cswap.tuner.store, cswap.predictors.timemodel)],
    "help_rc": help_text.returncode, "help": help_text.stdout,
    "app": type(cswap.server.app.create_app).__name__,
}))
"""


def test_a_users_own_server_tuner_and_predictors_do_not_shadow_cswap(tmp_path: Path) -> None:
    """A training folder with its own server.py, tuner/ and predictors.py next to the script."""
    (tmp_path / "server.py").write_text("raise RuntimeError('the user server.py was imported')\n")
    (tmp_path / "predictors.py").write_text("raise RuntimeError('the user predictors.py was imported')\n")
    (tmp_path / "tuner").mkdir()
    (tmp_path / "tuner" / "__init__.py").write_text("raise RuntimeError('the user tuner/ was imported')\n")
    (tmp_path / "probe.py").write_text(SHADOWING_PROBE)
    # The script's own folder is first on sys.path, as for `python train.py`.
    result = subprocess.run([sys.executable, "probe.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert not [f for f in found["modules"] if Path(f).is_relative_to(tmp_path)]
    assert found["help_rc"] == 0 and "--model" in found["help"]
    assert found["app"] == "function"


FAKE_PYTHON = """#!/bin/sh
# Stands in for the venv's python: logs every call, answers the Makefile's torch questions from the
# environment, and installs nothing.
echo "$*" >> "$CALLS"
case "$*" in
  *"version('torch')"*) echo "$TORCH" ;;
  *find_spec*) [ "$TORCH_IN_VENV" = 1 ] || exit 1 ;;
esac
exit 0
"""


def _make_install(checkout: Path, torch_version: str) -> list[str]:
    """``make install`` in ``checkout`` with a venv whose torch is ``torch_version``: the python calls it made."""
    calls = checkout / "calls.txt"
    calls.write_text("")
    env = {**os.environ, "CALLS": str(calls), "TORCH": torch_version, "TORCH_IN_VENV": "1"}
    result = subprocess.run(["make", "-s", "install"], cwd=checkout, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return calls.read_text().splitlines()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_installs_again_when_another_package_replaced_torch(tmp_path: Path) -> None:
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(ROOT / name, tmp_path / name)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    first = _make_install(tmp_path, "2.13.0+cpu")
    assert "-m pip install --quiet -e .[dev]" in first and not [c for c in first if "uninstall" in c]
    assert (tmp_path / ".venv" / ".cswap-installed").read_text() == "2.13.0+cpu\n"
    # nothing changed: one metadata read, no install
    assert _make_install(tmp_path, "2.13.0+cpu") == ["-c from importlib.metadata import version; print(version('torch'))"]
    # a package pulled another torch into the venv: it is removed and install runs again
    replaced = _make_install(tmp_path, "2.9.1+cu128")
    assert "-m pip uninstall --quiet -y torch" in replaced and "-m pip install --quiet -e .[dev]" in replaced
    assert replaced.index("-m pip uninstall --quiet -y torch") < replaced.index("-m pip install --quiet -e .[dev]")
