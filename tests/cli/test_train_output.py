"""What ``cswap train`` prints: progress lines and the summary table agree, are labelled, and fit 80 columns."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cswap.cli import app
from cswap.training.progress import EpochProgress
from cswap.training.report import summarize


def _epoch(index: int, **figures: float) -> dict:
    return {"epoch": index, "loss": 2.25, "accuracy": 0.5, "samples_per_s": 123.4, "peak_memory_bytes": 340 << 10,
            "offloaded_bytes": 1 << 20, "compressed_input_bytes": 3 << 20, "compressed_bytes": 1 << 20,
            "decisions": {"keep": 3, "swap": 12, "zvc-swap": 1, "zvc-keep": 0}, **figures}


@pytest.mark.parametrize("big", [False, True], ids=["typical", "large-figures"])
def test_summary_fits_80_columns_uncut_with_1_based_epochs_and_a_legend(big: bool) -> None:
    figures = dict(samples_per_s=12345.6, peak_memory_bytes=1023 << 20, offloaded_bytes=1000 << 20,
                   decisions={"keep": 12, "swap": 123, "zvc-swap": 45, "zvc-keep": 6}) if big else {}
    console = Console(file=io.StringIO(), width=80)
    summarize({"model": "vgg[16]", "policy": "cswap", "epochs": [_epoch(0, **figures), _epoch(1, **figures)]}, console)
    text = console.file.getvalue()
    assert "…" not in text
    assert all(len(line) <= 80 for line in text.splitlines())
    flat = " ".join(text.split())
    words = flat.split()
    for header in ("epoch", "mean loss", "accuracy", "samples/s", "peak memory", "offloaded", "ratio", "k/s/zs/zk"):
        assert all(word in words for word in header.split()), header  # a header may wrap onto two lines
    assert "vgg[16] under policy cswap" in flat
    assert "mean loss: over the epoch's batches" in flat and "offloaded: bytes moved to host memory in that epoch" in flat
    rows = [line.split() for line in text.splitlines() if re.match(r"\s*[12]\s+2\.2500", line)]
    assert [row[0] for row in rows] == ["1", "2"]


@pytest.mark.parametrize("recomputed", [0, 7])
def test_summary_counts_recomputed_tensors_only_where_there_are_some(recomputed: int) -> None:
    decisions = {"keep": 12, "swap": 123, "zvc-swap": 45, "zvc-keep": 6, "recompute": recomputed}
    console = Console(file=io.StringIO(), width=80)
    summarize({"model": "vgg16", "policy": "cswap", "epochs": [_epoch(0, decisions=decisions)]}, console)
    text = console.file.getvalue()
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines())
    flat = " ".join(text.split())
    assert ("k/s/zs/zk/r" in flat and "r: dropped and rebuilt" in flat) == bool(recomputed)
    # the counts may fold onto a second line (never cut): read the cell's lines together
    assert ("12/123/45/6/7" in "".join(flat.split())) == bool(recomputed) and "12/123/45/6" in flat


def test_progress_lines_fit_80_columns_uncut_and_are_labelled() -> None:
    console = Console(file=io.StringIO(), width=80, force_terminal=False)
    with EpochProgress(console, enabled=True, epochs=2, steps=3) as bars:
        for step in range(3):
            bars.update(0, step, loss=0.8812345, samples_per_s=12345.6, memory_bytes=1023 << 20,
                        offloaded_bytes=1000 << 20, ratio=2.5)
    text = console.file.getvalue()
    assert "…" not in text
    flat = " ".join(text.split())
    assert "epoch 1/2" in flat and "3/3 batches" in flat
    assert ("mean loss 0.8812 · 12345.6 samples/s · peak memory 1023.0 MiB · offloaded this epoch 1000.0 MiB · "
            "ratio 2.50x") in flat


def test_train_progress_and_summary_agree(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["train", "--model", "tests.cli.nets:tiny_cnn", "--image-size", "16", "--epochs", "2", "--batch-size", "16",
              "--train-samples", "64", "--device", "cpu", "--min-bytes", "0", "--policy", "compress-swap",
              "--report", str(tmp_path / "r.json")],
        env={"COLUMNS": "80", "CSWAP_HOME": str(tmp_path / "home")},
    )
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    flat = " ".join(result.stdout.split())
    report = json.loads((tmp_path / "r.json").read_text())
    for record in report["epochs"]:
        shown = re.search(rf"epoch {record['epoch'] + 1}/2 .*? mean loss (\S+) · .*? offloaded this epoch (\S+ \S+) ·", flat)
        assert shown is not None, flat
        assert shown.group(1) == f"{record['loss']:.4f}"
        row = re.search(rf"(?:^|\s){record['epoch'] + 1} {record['loss']:.4f} ", flat)
        assert row is not None, flat
    offloaded = [re.search(rf"epoch {e}/2 .*? offloaded this epoch (\S+ \S+) ·", flat).group(1) for e in (1, 2)]
    assert offloaded[0] == offloaded[1]  # per epoch, not cumulative: both epochs move the same tensors
