"""The training plots number epochs as the console table does: from 1."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.axes import Axes

from cswap.training.plots import plot_decisions, plot_sparsity

EPOCHS = [
    {"epoch": 0, "sparsity": {"0": 0.5, "1": 0.1}, "plan": [{"key": 0, "action": "swap", "module": "features.1 (ReLU)"}]},
    {"epoch": 1, "sparsity": {"0": 0.6, "1": 0.2}, "plan": [{"key": 0, "action": "keep", "module": "features.1 (ReLU)"}]},
]


@pytest.mark.parametrize("plot", [plot_sparsity, plot_decisions])
def test_epochs_are_numbered_from_one(plot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    labels: list[list[str]] = []
    set_xticks = Axes.set_xticks

    def record(self, ticks, tick_labels=None, **kwargs):
        if tick_labels is not None:
            labels.append([str(label) for label in tick_labels])
        return set_xticks(self, ticks, tick_labels, **kwargs)

    monkeypatch.setattr(Axes, "set_xticks", record)
    assert plot(EPOCHS, tmp_path / "plot.png").exists()
    assert labels == [["1", "2"]]
