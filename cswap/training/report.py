"""The report of a training run: a JSON file, its plots, and a summary table on the console.

The JSON holds ``model, policy, device, tune, epochs: [...]``; each epoch has ``loss, accuracy,
samples_per_s, peak_memory_bytes``, the bytes kept / offloaded / compressed, ``decisions`` per
action, predicted against measured compression seconds, and per iteration its resident peak
(``iteration_peak_resident_bytes``) and whether it profiled (``iteration_profiled``).

Example:
    >>> from rich.console import Console
    >>> summarize({"model": "m", "policy": "none", "epochs": []}, Console(quiet=True))
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any
from collections.abc import Callable, Mapping

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cswap.training.config import TrainConfig
from cswap.training.plots import plot_budget, plot_convergence, plot_decisions, plot_memory, plot_sparsity
from cswap.training.progress import format_bytes

__all__ = ["draw_plots", "summarize", "write_report"]


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def draw_plots(report: Mapping[str, Any], path_of: Callable[[str], Path]) -> dict[str, str]:
    """Draw every plot the report has data for into ``path_of(name)``; returns plot name -> file path."""
    epochs = report.get("epochs", [])
    paths = {
        "sparsity": plot_sparsity(epochs, path_of("sparsity")),
        "decisions": plot_decisions(epochs, path_of("decisions")),
    }
    if report.get("budget_bytes") is not None:
        paths["budget"] = plot_budget(epochs, report["budget_bytes"], path_of("budget"))
    timeline = report.get("memory_timeline")
    if timeline:
        unit = "device memory allocated (MiB)" if report.get("device", {}).get("kind") == "cuda" else "resident activation memory (MiB)"
        paths["memory"] = plot_memory(timeline, path_of("memory"), ylabel=unit, budget_bytes=report.get("budget_bytes"))
    runs = [r for r in report.get("tune", {}).get("runs", []) if r.get("evaluations")]
    if runs:
        paths["convergence"] = plot_convergence(runs, path_of("convergence"))
    return {name: str(path) for name, path in paths.items()}


def write_report(report: dict[str, Any], cfg: TrainConfig, console: Console) -> Path:
    """Draw the plots (:meth:`TrainConfig.plot_path`), then write the JSON report to ``cfg.report_path``."""
    report["plots"] = draw_plots(report, cfg.plot_path)
    path = cfg.report_path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_json_safe(report), indent=1))
    console.print(f"report: [bold]{escape(str(path))}[/]")
    names = ", ".join(Path(p).name for p in sorted(report["plots"].values()))
    console.print(f"plots:  [bold]{escape(str(cfg.plots_dir))}[/] ({escape(names)})")
    return path


#: The action counts column: its short header, and the legend under the table.
_ACTIONS = ("keep", "swap", "zvc-swap", "zvc-keep")
_LEGEND = ("epoch 1 is the first; mean loss: over the epoch's batches; offloaded: bytes moved to host memory "
           "in that epoch; ratio: bytes in / bytes out of compression; k/s/zs/zk: saved tensors kept, swapped, "
           "compressed and swapped (zvc-swap), compressed and kept (zvc-keep)")
_RECOMPUTE_LEGEND = "; r: dropped and rebuilt by recomputing their module"


def _is_fraction(value: object) -> bool:
    try:
        return 0.0 < float(value) <= 1.0  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def summarize(report: Mapping[str, Any], console: Console) -> None:
    """Print one row per epoch (1-based, as the progress bars number them), with a legend; fits 80 columns.

    Example:
        >>> import io
        >>> out = Console(file=io.StringIO(), width=80)
        >>> summarize({"model": "m", "policy": "none", "epochs": [{"epoch": 0, "loss": 2.0, "accuracy": 0.5,
        ...            "samples_per_s": 10.0, "peak_memory_bytes": 2048}]}, out)
        >>> "mean loss" in out.file.getvalue() and "…" not in out.file.getvalue()
        True
        >>> summarize({"model": "m", "policy": "swap", "budget_bytes": 3 << 20, "config": {"memory_budget": 0.3},
        ...            "epochs": []}, out)
        >>> "memory budget 3.0 MiB (0.3 of none's peak)" in out.file.getvalue()
        True
        >>> summarize({"model": "m", "policy": "swap", "budget_bytes": 1 << 20, "none_peak_bytes": 4 << 20,
        ...            "config": {"memory_budget": "1MiB"}, "epochs": []}, out)
        >>> "memory budget 1.0 MiB (0.25 of none's peak)" in out.file.getvalue()
        True
    """
    # the recompute count only where something was recomputed: the table stays within 80 columns otherwise
    recomputed = any(epoch.get("decisions", {}).get("recompute", 0) for epoch in report["epochs"])
    actions = (*_ACTIONS, "recompute") if recomputed else _ACTIONS
    legend = _LEGEND + (_RECOMPUTE_LEGEND if recomputed else "")
    title = f"{report['model']} under policy {report['policy']}"
    budget = report.get("budget_bytes")
    if budget is not None:
        given = report.get("config", {}).get("memory_budget")
        none_peak = report.get("none_peak_bytes")
        share = f" ({given} of none's peak)" if isinstance(given, int | float | str) and _is_fraction(given) else ""
        if not share and none_peak:
            share = f" ({budget / none_peak:.2f} of none's peak)"
        title += f", memory budget {format_bytes(budget)}{share}"
    table = Table(title=escape(title), caption=escape(legend),
                  box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True, caption_justify="left")
    counts = "k/s/zs/zk/r" if recomputed else "k/s/zs/zk"
    for column in ("epoch", "mean loss", "accuracy", "samples/s", "peak memory", "offloaded", "ratio", counts):
        # fold, never "…": a narrow terminal or a log gets a taller table, not a cut figure
        table.add_column(column, justify="right", overflow="fold")
    for epoch in report["epochs"]:
        compressed = epoch.get("compressed_bytes") or 0
        ratio = epoch.get("compressed_input_bytes", 0) / compressed if compressed else 1.0
        decisions = epoch.get("decisions", {})
        table.add_row(
            str(epoch["epoch"] + 1),
            f"{epoch['loss']:.4f}",
            f"{epoch['accuracy']:.1%}",
            f"{epoch['samples_per_s']:.1f}",
            format_bytes(epoch["peak_memory_bytes"]),
            format_bytes(epoch.get("offloaded_bytes", 0)),
            f"{ratio:.2f}x",
            "/".join(str(decisions.get(a, 0)) for a in actions),
        )
    console.print(table)
