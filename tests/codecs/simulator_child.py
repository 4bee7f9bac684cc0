"""Run a test file again under Numba's CUDA simulator, in a child pytest (Numba reads the switch at import)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def run_under_simulator(test_file: str, least_passed: int, most_skipped: int | None = None, *pytest_args: str) -> None:
    """Run ``test_file`` with ``NUMBA_ENABLE_CUDASIM=1``: it must pass, at least ``least_passed`` tests,
    and skip at most ``most_skipped`` (``None``: any number)."""
    child = subprocess.run(
        [sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider", *pytest_args],
        env={**os.environ, "NUMBA_ENABLE_CUDASIM": "1"},
        capture_output=True,
        text=True,
        timeout=540,
        cwd=Path(__file__).resolve().parents[2],
    )
    report = child.stdout[-6000:] + child.stderr[-3000:]
    assert child.returncode == 0, report
    passed = re.search(r"(\d+) passed", child.stdout)
    assert passed and int(passed.group(1)) >= least_passed, report
    skipped = re.search(r"(\d+) skipped", child.stdout)
    assert most_skipped is None or not skipped or int(skipped.group(1)) <= most_skipped, report
