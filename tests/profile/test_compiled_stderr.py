"""A compiled model under a recomputing policy prints nothing on stderr that the same run without
cswap does not: the profiler's module hooks, traced into the compiled graph, record nothing there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import warnings, torch, cswap
warnings.simplefilter("ignore")
from tests.zoo import compiled_cnn
model, make_step = compiled_cnn()
step = make_step(model)
rt = cswap.Runtime("{policy}", model=model, device="cpu", min_bytes=0) if "{policy}" != "plain" else None
for _ in range(2):
    if rt is None:
        step()
    else:
        with rt.iteration():
            step()
"""


def _stderr(policy: str) -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(policy=policy)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


@pytest.mark.parametrize("policy", ["recompute"])
def test_a_compiled_model_under_recompute_prints_nothing_more_on_stderr(policy: str) -> None:
    plain = set(_stderr("plain").splitlines())
    extra = [line for line in _stderr(policy).splitlines() if line not in plain]
    assert extra == [], "\n".join(extra[:20])
