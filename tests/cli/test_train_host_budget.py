"""``cswap train --host-memory-budget``: validated at config load, passed to the runtime, held in training."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cswap.cli import app
from cswap.training.config import RecipeError, TrainConfig, load_config
from cswap.training.loop import train

runner = CliRunner()


@pytest.mark.parametrize("given", ["8GiB", "auto", "4194304"])
def test_the_flag_reaches_the_config(given: str) -> None:
    assert load_config(None, {"host_memory_budget": given}).host_memory_budget == given


@pytest.mark.parametrize("bad", ["0.5", "12 parsecs", "0"])
def test_a_bad_host_budget_is_a_one_line_error_at_load(bad: str, tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="key 'host_memory_budget'.*host memory budget"):
        load_config(None, {"host_memory_budget": bad})
    result = runner.invoke(app, ["train", "--host-memory-budget", bad, "--report", str(tmp_path / "r.json"), "--no-progress"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "key 'host_memory_budget'" in text and "'auto'" in text


def test_training_holds_the_host_budget(tmp_path: Path) -> None:
    cfg = TrainConfig(report=tmp_path / "report.json", model="vgg11", width_mult=0.125, epochs=1, batch_size=16,
                      train_samples=32, policy="swap", min_bytes=0, host_memory_budget="64KiB", device="cpu")
    report = train(cfg, console=Console(file=io.StringIO(), width=300), show_progress=False)
    stats = report["stats"]
    assert stats["host_budget_bytes"] == 64 << 10 and 0 < stats["host_peak_bytes"] <= 64 << 10
    assert json.loads((tmp_path / "report.json").read_text())["stats"]["host_peak_bytes"] == stats["host_peak_bytes"]
