"""PNG plots of a training run (matplotlib, Agg): sparsity, decisions, memory, BO convergence.

Every function takes plain data (what the JSON report holds) and a path, so plots can be redrawn
from a saved report.

Example:
    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "s.png"
    >>> plot_sparsity([{"epoch": 0, "sparsity": {"0": 0.5, "1": 0.1}}], out).exists()
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap

__all__ = [
    "ACTION_COLORS", "decision_label", "plot_budget", "plot_convergence", "plot_decisions", "plot_memory", "plot_sparsity",
    "profiling_iterations",
]

#: One colour per runtime action, in the order of the decision map's legend.
ACTION_COLORS: dict[str, str] = {"keep": "#9e9e9e", "swap": "#1f77b4", "zvc-swap": "#2ca02c", "zvc-keep": "#ff7f0e"}


def _epoch_labels(epochs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Epochs numbered from 1, as the console table numbers them (the report counts from 0)."""
    return [str(e["epoch"] + 1) for e in epochs]


def _keys(epochs: Sequence[Mapping[str, Any]], field: str) -> list[str]:
    keys = sorted({k for e in epochs for k in e.get(field, {})}, key=int)
    return keys


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sparsity(epochs: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Heat map of each saved tensor's sparsity (rows, by pack order) over epochs (columns)."""
    keys = _keys(epochs, "sparsity")
    grid = [[e.get("sparsity", {}).get(k, float("nan")) for e in epochs] for k in keys]
    fig, ax = plt.subplots(figsize=(2.5 + 0.6 * len(epochs), 2 + 0.12 * max(len(keys), 1)))
    image = ax.imshow(grid or [[float("nan")]], aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
    fig.colorbar(image, ax=ax, label="sparsity (fraction of zeros)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("saved tensor (pack order)")
    ax.set_xticks(range(len(epochs)), _epoch_labels(epochs))
    ax.set_title("Sparsity of each saved activation")
    return _save(fig, path)


def decision_label(key: int, module: str) -> str:
    """How a plot names a saved tensor: its pack index and, when known, the module that produced it.

    Example:
        >>> decision_label(7, "features.3 (ReLU)"), decision_label(2, "")
        ('7 features.3 (ReLU)', '2')
    """
    return f"{key} {module}" if module else str(key)


def plot_decisions(epochs: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Decision map: saved tensor x epoch, coloured by the action the plan chose."""
    actions = list(ACTION_COLORS)
    keys = sorted({d["key"] for e in epochs for d in e.get("plan", [])})
    modules = {d["key"]: d["module"] for e in epochs for d in e.get("plan", []) if d.get("module")}
    row = {k: i for i, k in enumerate(keys)}
    grid = [[float("nan")] * len(epochs) for _ in keys]
    for column, epoch in enumerate(epochs):
        for decision in epoch.get("plan", []):
            grid[row[decision["key"]]][column] = actions.index(decision["action"])
    fig, ax = plt.subplots(figsize=(3.5 + 0.6 * len(epochs), 2 + 0.12 * max(len(keys), 1)))
    ax.imshow(grid or [[float("nan")]], aspect="auto", interpolation="nearest",
              cmap=ListedColormap(list(ACTION_COLORS.values())), vmin=-0.5, vmax=len(actions) - 0.5)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ACTION_COLORS.values()]
    ax.legend(handles, actions, loc="upper left", bbox_to_anchor=(1.02, 1), fontsize="small")
    ax.set_xlabel("epoch")
    ax.set_ylabel("saved tensor (pack order)")
    ax.set_xticks(range(len(epochs)), _epoch_labels(epochs))
    if modules:
        # Named by where each tensor comes from (a runtime given model=), not only its index: the
        # module that produced it, the parameter it is, or the module that saved it.
        ax.set_yticks(range(len(keys)), [decision_label(k, modules.get(k, "")) for k in keys], fontsize="x-small")
        ax.set_ylabel("saved tensor (pack order, module or parameter)")
    ax.set_title("What the plan did with each tensor")
    return _save(fig, path)


def profiling_iterations(epochs: Sequence[Mapping[str, Any]]) -> list[int]:
    """The indices, counted over the whole run, of the iterations that profiled.

    An epoch's ``iteration_profiled`` flags say which (a graph that changed profiles again in the
    middle of one); a report without them profiled the first iteration of each epoch.

    Example:
        >>> profiling_iterations([{"iteration_peak_resident_bytes": [1, 2, 2]},
        ...                       {"iteration_peak_resident_bytes": [1, 2], "iteration_profiled": [True, True]}])
        [0, 3, 4]
    """
    found, start = [], 0
    for epoch in epochs:
        count = len(epoch.get("iteration_peak_resident_bytes", []))
        flags = epoch.get("iteration_profiled") or [i == 0 for i in range(count)]
        found += [start + i for i, profiled in enumerate(flags[:count]) if profiled]
        start += count
    return found


def plot_budget(epochs: Sequence[Mapping[str, Any]], budget_bytes: int, path: Path) -> Path:
    """The resident peak of each iteration against the memory budget, from 0 MiB, the profiling
    iterations marked (under a budget they store every tensor at the policy's smallest footprint,
    so their peak dips below the planned ones)."""
    peaks = [p / 2**20 for e in epochs for p in e.get("iteration_peak_resident_bytes", [])]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(len(peaks)), peaks, marker=".", color="#1f77b4", label="peak resident", zorder=2)
    # Planned iterations peak at the budget itself: the budget goes on top, in a colour of its
    # own and dashed, so that the peak line shows through it rather than hiding it.
    ax.axhline(budget_bytes / 2**20, color="#d62728", linestyle=(0, (5, 3)), linewidth=1.5, label="budget", zorder=3)
    for index in profiling_iterations(epochs):
        if index < len(peaks):
            ax.annotate("profiling", xy=(index, peaks[index]), xytext=(index, peaks[index] / 2), ha="center",
                        fontsize="x-small", arrowprops={"arrowstyle": "->", "linewidth": 0.6})
    ax.set_ylim(bottom=0, top=max([budget_bytes / 2**20, *peaks]) * 1.08)
    ax.set_xlabel("iteration (a profiling one stores every tensor at the policy's smallest footprint)")
    ax.set_ylabel("saved activations on the device (MiB)")
    ax.set_title("Peak per iteration against the memory budget")
    ax.legend(loc="lower right")
    return _save(fig, path)


def plot_memory(lines: Mapping[str, Sequence[Sequence[float]]], path: Path, ylabel: str = "device memory (MiB)",
                budget_bytes: int | None = None) -> Path:
    """Memory over one iteration, one line per policy (samples are ``(seconds, bytes)``).

    The policies are compared without a memory budget, and the plot says so on itself; with
    ``budget_bytes`` (the training run had one) it also says that budget applied to the training
    run only, so that a line above it is not read as the budget broken.
    """
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, samples in lines.items():
        if samples:
            ax.step([s[0] * 1e3 for s in samples], [s[1] / 2**20 for s in samples], where="post", label=policy)
    ax.set_xlabel("time in the iteration (ms)")
    ax.set_ylabel(ylabel)
    note = "comparison policies run without a budget"
    if budget_bytes is not None:
        note += f"\n(the training run's budget, {budget_bytes / 2**20:.1f} MiB, is not applied here)"
    ax.set_title(f"Memory over one iteration, per policy\n{note}", fontsize="medium")
    ax.legend(title="without a budget", fontsize="small")
    return _save(fig, path)


def plot_convergence(runs: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Best time found so far against evaluations, one line per tuning run (``kernel``, ``evaluations``)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        best = float("inf")
        xs, ys = [], []
        for index, evaluation in enumerate(run.get("evaluations", []), start=1):
            best = min(best, evaluation["time_s"])
            if best != float("inf"):
                xs.append(index)
                ys.append(best * 1e3)
        if xs:
            ax.plot(xs, ys, marker="o", markersize=3, label=f"{run.get('kernel')} ({run.get('method')}, bucket {run.get('bucket')})")
    ax.set_xlabel("evaluations")
    ax.set_ylabel("best time so far (ms)")
    ax.set_title("Launch-config search convergence")
    ax.legend(fontsize="small")
    return _save(fig, path)
