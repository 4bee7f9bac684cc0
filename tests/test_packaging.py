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
SHIPPED = sorted(p.relative_to(ROOT / "configs").as_posix() for p in (ROOT / "configs").rglob("*.yaml"))


def _declared_packages() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]


def test_every_package_is_declared() -> None:
    found = sorted(
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in TOP_PACKAGES
        for init in (ROOT / top).rglob("__init__.py")
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
    modules = sorted(p.relative_to(ROOT).as_posix() for top in TOP_PACKAGES for p in (ROOT / top).rglob("*.py"))
    assert [m for m in modules if m not in names] == []


def test_runtime_loads_its_defaults_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import json, cswap, torch\n"
        "from cswap.options import default_options_path\n"
        "from cswap.simulate.hardware import hardware_names\n"
        "from tuner.space import load_search_spaces\n"
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
