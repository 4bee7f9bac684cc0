"""Training against a tuning service that dies mid-run: training finishes and nothing tuned is lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cswap.server.spawn import spawn_service
from cswap.tuner.store import ConfigStore

REPO = Path(__file__).resolve().parents[2]


def test_killing_the_service_does_not_stop_training(tmp_path: Path) -> None:
    service_store = tmp_path / "service.db"
    server, url = spawn_service(service_store)
    home = tmp_path / "trainer-home"
    env = {**os.environ, "PYTHONPATH": str(REPO), "CSWAP_HOME": str(home)}
    command = [sys.executable, "-m", "cswap.train", "--model", "tests.cli.nets:tiny_cnn", "--dataset", "digits",
               "--image-size", "16", "--epochs", "3", "--batch-size", "16", "--train-samples", "256",
               "--tune", "bo", "--tune-budget", "4", "--tuner-url", url, "--device", "cpu", "--min-bytes", "0",
               "--no-progress", "--report", str(tmp_path / "report.json")]
    trainer = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not ConfigStore(service_store).runs() and trainer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert trainer.poll() is None, "training ended before the service got its first run"
        assert ConfigStore(service_store).runs(), "the service never received a tuning run"
    finally:
        server.kill()
        server.wait(timeout=30)
    output, _ = trainer.communicate(timeout=300)
    assert trainer.returncode == 0, output
    assert "using the local config store" in output or "kept in the local store" in output, output
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["epochs"]) == 3
    local_runs = {run.kernel for run in ConfigStore(home / "store.db").runs()}
    # ZVC's kernels and exponent coding's (the CNN saves float32 activations), each op
    assert local_runs == {"zvc.cpu.compress", "zvc.cpu.decompress", "exponent.cpu.compress", "exponent.cpu.decompress"}
    published = {run.kernel for run in ConfigStore(service_store).runs()}
    assert published == {"zvc.cpu.compress"}
