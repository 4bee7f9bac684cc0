"""Figures of simulation results (matplotlib, Agg backend: no display needed).

Example:
    >>> import tempfile, os
    >>> from cswap.simulate import meta_trace, simulate_policies
    >>> results = simulate_policies(meta_trace("vgg11", 2, 32, width_mult=0.125), "v100-pcie3", "none,swap")
    >>> path = plot_breakdown(results, os.path.join(tempfile.mkdtemp(), "b.png"), title="vgg11")
    >>> path.stat().st_size > 0
    True
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from cswap.simulate.engine import PolicyResult
from cswap.simulate.sweep import BudgetSweep

__all__ = ["plot_breakdown", "plot_budget_sweep", "plot_normalized", "plot_sweep"]


def plot_breakdown(results: Mapping[str, PolicyResult], path: str | os.PathLike[str], title: str = "") -> Path:
    """Stacked bars per policy: compute, exposed transfer and codec seconds (queue model), with the
    per-tensor formula's iteration time as a marker, and peak memory on a second axis.

    Returns:
        The written path (parent directories are created).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(results)
    compute = np.array([results[p].queue.compute_s for p in names]) * 1e3
    exposed = np.array([results[p].queue.exposed_transfer_s for p in names]) * 1e3
    codec = np.array([results[p].queue.codec_s for p in names]) * 1e3
    formula = np.array([results[p].formula.iteration_s for p in names]) * 1e3
    peak = np.array([results[p].peak_bytes for p in names]) / 1e9
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(names) + 2), 4.5))
    ax.bar(x, compute, label="compute", color="#4c72b0")
    ax.bar(x, exposed, bottom=compute, label="exposed transfer", color="#dd8452")
    ax.bar(x, codec, bottom=compute + exposed, label="(de)compression", color="#55a868")
    ax.scatter(x, formula, marker="_", s=600, color="black", label="per-tensor formula", zorder=3)
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("iteration time (ms)")
    twin = ax.twinx()
    twin.plot(x, peak, "o", color="#c44e52", label="peak activations (GB)")
    twin.set_ylabel("peak device activation memory (GB)")
    twin.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper left", fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_sweep(
    sparsities: Sequence[float],
    bandwidths_gbps: Sequence[float],
    speedup: np.ndarray,
    path: str | os.PathLike[str],
    title: str = "",
    break_even: Sequence[float | None] | None = None,
) -> Path:
    """Heat map of ``speedup[i, j]`` (compress-swap over swap at sparsity ``i``, bandwidth ``j``),
    with the contour where compression stops paying (speedup 1) and the break-even sparsity per bandwidth.

    Returns:
        The written path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = np.asarray(speedup, dtype=float)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    xs = np.arange(len(bandwidths_gbps))
    # centred on 1: red where compression loses, green where it wins
    norm = matplotlib.colors.TwoSlopeNorm(vcenter=1.0, vmin=min(float(data.min()), 0.99), vmax=max(float(data.max()), 1.01))
    mesh = ax.pcolormesh(xs, sparsities, data, shading="nearest", cmap="RdYlGn", norm=norm)
    fig.colorbar(mesh, ax=ax, label="iteration-time speedup of compress-swap over swap")
    if data.min() < 1.0 < data.max():
        ax.contour(xs, sparsities, data, levels=[1.0], colors="black", linewidths=1.5)
    if break_even is not None:
        points = [(x, s) for x, s in zip(xs, break_even) if s is not None]
        if points:
            ax.plot(*zip(*points), "k.--", label="break-even sparsity")
            ax.legend(loc="lower right", fontsize=8)
    ax.set_xticks(xs, [f"{b:g}" for b in bandwidths_gbps])
    ax.set_xlabel("host link bandwidth each way (GB/s)")
    ax.set_ylabel("sparsity of ReLU outputs")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_normalized(
    iteration_s: Mapping[str, Mapping[str, float]],
    path: str | os.PathLike[str],
    baseline: str = "swap",
    title: str = "",
) -> Path:
    """Grouped bars: per model (outer key), each policy's iteration time over ``baseline``'s.

    Args:
        iteration_s: ``{model: {policy: seconds}}``; every model must have ``baseline``.
        path: the PNG to write.
        baseline: the policy every bar is divided by.
        title: the figure's title.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    models = list(iteration_s)
    policies = list(dict.fromkeys(p for row in iteration_s.values() for p in row))
    width = 0.8 / max(len(policies), 1)
    x = np.arange(len(models))
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 * len(models) + 2), 4.5))
    for k, policy in enumerate(policies):
        values = [iteration_s[m].get(policy, np.nan) / iteration_s[m][baseline] for m in models]
        ax.bar(x + (k - (len(policies) - 1) / 2) * width, values, width, label=policy)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x, models, rotation=15, ha="right")
    ax.set_ylabel(f"iteration time / {baseline}")
    ax.set_yscale("log")
    ax.legend(fontsize=8, ncol=len(policies), loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_budget_sweep(result: BudgetSweep, path: str | os.PathLike[str], title: str = "") -> Path:
    """Iteration time against memory budget, one line per policy (points only where it meets the
    budget), with policy ``none``'s peak marked: the figure to pick a budget from.

    Example:
        >>> import tempfile, os
        >>> from cswap.simulate import Simulator, meta_trace
        >>> from cswap.simulate.sweep import budget_sweep
        >>> sweep = budget_sweep(Simulator(meta_trace("vgg11", 2, 32, width_mult=0.125), "v100-pcie3"), ("none", "swap"), (1.0, 0.5))
        >>> plot_budget_sweep(sweep, os.path.join(tempfile.mkdtemp(), "budget.png")).stat().st_size > 0
        True

    Returns:
        The written path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    budgets_gb = np.array(result.budgets_bytes) / 1e9
    order = np.argsort(budgets_gb)
    fig, ax = plt.subplots(figsize=(7.0, 4.5))
    policies = list(result.outcomes[0]) if result.outcomes else []
    # policies often coincide (cswap picks another policy's plan): distinct markers and dashes keep each visible
    styles = [("o", "-", 7), ("s", "--", 6), ("^", "-.", 6), ("D", ":", 5), ("x", "--", 8), ("v", "-", 6), ("P", "-.", 7)]
    for k, policy in enumerate(policies):
        seconds = result.iteration_s(policy)
        xs = [budgets_gb[i] for i in order if seconds[i] is not None]
        ys = [seconds[i] * 1e3 for i in order if seconds[i] is not None]  # type: ignore[operator]
        marker, dashes, size = styles[k % len(styles)]
        if xs:
            ax.plot(xs, ys, marker=marker, linestyle=dashes, markersize=size, fillstyle="none", label=policy)
    ax.axvline(result.none_peak_bytes / 1e9, color="grey", linestyle=":", label="none's peak")
    ax.set_xlabel("memory budget for saved activations (GB)")
    ax.set_ylabel("simulated iteration time (ms)")
    ax.legend(fontsize=8)
    ax.set_title(title or f"{result.model} on {result.hardware}: iteration time under a memory budget")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
