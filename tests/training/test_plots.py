"""The training plots: epochs numbered as the console table numbers them (from 1), and each plot
saying on itself what it shows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

import cswap
from cswap.models import build
from cswap.training import plots
from cswap.training.plots import plot_budget, plot_decisions, plot_sparsity
from cswap.training.report import draw_plots

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


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """The figures the plot functions draw (they stay readable after the file is saved)."""
    figures: list[Figure] = []
    save = plots._save

    def keep(fig: Figure, path: Path) -> Path:
        figures.append(fig)
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return figures


MIB = 2**20
#: Two epochs under a budget of 15.5 MiB: each profiling iteration (the first of its epoch, and a
#: second one in the middle of epoch 2 after the graph changed) peaks lower than the planned ones.
BUDGETED = [
    {"epoch": 0, "iteration_peak_resident_bytes": [12 * MIB] + [int(15.5 * MIB)] * 4},
    {"epoch": 1, "iteration_peak_resident_bytes": [12 * MIB, int(15.5 * MIB), 13 * MIB, int(15.5 * MIB)],
     "iteration_profiled": [True, False, True, False]},
]


def test_the_budget_plot_starts_at_zero_marks_profiling_and_draws_the_budget_on_top(drawn: list[Figure], tmp_path: Path) -> None:
    plot_budget(BUDGETED, int(15.5 * MIB), tmp_path / "budget.png")
    (ax,) = drawn[0].axes
    assert ax.get_ylim()[0] == 0
    marks = [(text.get_text(), text.xy) for text in ax.texts]
    assert marks == [("profiling", (0, 12.0)), ("profiling", (5, 12.0)), ("profiling", (7, 13.0))]
    peak, budget = ax.get_lines()
    assert (peak.get_label(), budget.get_label()) == ("peak resident", "budget")
    assert budget.get_zorder() > peak.get_zorder() and budget.get_color() != peak.get_color()
    assert budget.get_linestyle() == "--" and list(budget.get_ydata()) == [15.5, 15.5]


def test_the_memory_plot_of_a_budgeted_run_says_its_policies_ran_without_one(drawn: list[Figure], tmp_path: Path) -> None:
    lines = {"none": [(0.0, 0), (0.1, 25 * MIB), (0.3, 0)], "cswap": [(0.0, 0), (0.1, 26 * MIB), (0.2, 0)]}
    report = {"epochs": [], "budget_bytes": int(15.5 * MIB), "memory_timeline": lines, "device": {"kind": "cpu"}}
    assert set(draw_plots(report, lambda name: tmp_path / f"{name}.png")) == {"sparsity", "decisions", "budget", "memory"}
    (ax,) = drawn[-1].axes
    assert ax.get_title().splitlines() == [
        "Memory over one iteration, per policy",
        "comparison policies run without a budget",
        "(the training run's budget, 15.5 MiB, is not applied here)",
    ]
    assert ax.get_legend().get_title().get_text() == "without a budget"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["none", "cswap"]


def test_every_row_of_the_decisions_plot_is_named_on_a_real_model(drawn: list[Figure], tmp_path: Path) -> None:
    """Model inputs, weights, dropout masks, pooling indices and the loss's tensors included."""
    torch.manual_seed(0)
    model = build("vgg11", num_classes=10, width_mult=0.125)
    rt = cswap.Runtime("swap", device="cpu", min_bytes=0, model=model, d2h_gbps=10.0, h2d_gbps=10.0)
    with rt.iteration():
        torch.nn.functional.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.randint(0, 10, (4,))).backward()
    plan = rt.plan().to_dict()["decisions"]
    plot_decisions([{"epoch": 0, "plan": plan}], tmp_path / "decisions.png")
    (ax,) = drawn[0].axes
    labels = [label.get_text() for label in ax.get_yticklabels()]
    assert len(labels) == len(plan) == 49
    unnamed = [label for label in labels if len(label.split(" ", 1)) < 2]
    assert unnamed == []
    by_key = dict(label.split(" ", 1) for label in labels)
    # the image (saved by the first conv), its weight, a dropout mask, and what the loss saves
    assert (by_key["0"], by_key["1"], by_key["38"]) == ("features.0 (Conv2d)", "features.0.weight", "classifier.2 (Dropout)")
    assert (by_key["45"], by_key["47"]) == ("LogSoftmaxBackward0", "outside the model")
