"""``cswap train --memory-budget``: validated at config load, held in training, in the report and plots."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cswap.budget import format_bytes

from cswap.cli import app
from cswap.training.config import RecipeError, TrainConfig, load_config
from cswap.training.loop import train

runner = CliRunner()


def test_training_under_a_budget_reports_the_peak_of_every_iteration(tmp_path: Path) -> None:
    cfg = TrainConfig(report=tmp_path / "report.json", model="vgg11", width_mult=0.125, epochs=2, batch_size=16,
                      train_samples=48, policy="swap", min_bytes=0, memory_budget=0.5, device="cpu")
    out = Console(file=io.StringIO(), width=300)
    report = train(cfg, console=out, show_progress=False)
    saved = json.loads((tmp_path / "report.json").read_text())
    budget, none_peak = saved["budget_bytes"], saved["none_peak_bytes"]
    assert budget is not None and budget == report["stats"]["budget_bytes"] > 0
    # said once, at the start: the fraction in bytes, and in the summary's title
    said = [line for line in out.file.getvalue().splitlines() if line.startswith("memory budget")]
    assert said == [f"memory budget 0.5 of policy none's activation peak of {format_bytes(none_peak)}: {format_bytes(budget)}"]
    assert budget == none_peak // 2
    peaks = [p for epoch in saved["epochs"] for p in epoch["iteration_peak_resident_bytes"]]
    assert len(peaks) == 2 * 3 and all(0 < p <= budget for p in peaks)
    assert [epoch["iteration_profiled"] for epoch in saved["epochs"]] == [[True, False, False]] * 2  # each epoch's first
    assert saved["epochs"][0]["decisions"]["swap"] > 0
    assert Path(report["plots"]["budget"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("given, budget", [("512MiB", "512MiB"), ("0.25", "0.25"), ("4096B", "4096B"), ("4194304", "4194304")])
def test_the_flag_reaches_the_config(given: str, budget: str) -> None:
    assert load_config(None, {"memory_budget": given}).memory_budget == budget


@pytest.mark.parametrize("bad", ["0", "1.5", "12 parsecs", "-3", "4096"])
def test_a_bad_budget_is_a_one_line_error_at_load(bad: str, tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="key 'memory_budget'.*memory budget"):
        load_config(None, {"memory_budget": bad})
    result = runner.invoke(app, ["train", "--memory-budget", bad, "--report", str(tmp_path / "r.json"), "--no-progress"])
    text = " ".join(result.output.split())  # the console wraps long lines
    assert result.exit_code == 2 and "key 'memory_budget'" in text and "accepted forms" in text
