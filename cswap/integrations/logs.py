"""The runtime's counters as flat ``name -> number`` logs for a framework's logger.

Example:
    >>> import cswap
    >>> logs = stats_logs(cswap.Runtime("swap", device="cpu").stats(), "1MiB")
    >>> logs["cswap/offloaded_bytes"], logs["cswap/memory_budget_bytes"], logs["cswap/peak_over_budget"]
    (0.0, 1048576.0, 0.0)
"""

from __future__ import annotations

from typing import Any

from cswap.budget import parse_budget
from cswap.runtime import RuntimeStats

__all__ = ["PREFIX", "stats_logs"]

#: Every logged name starts with it, so the runtime's numbers group together in a dashboard.
PREFIX = "cswap/"


def stats_logs(stats: RuntimeStats, memory_budget: Any = None) -> dict[str, float]:
    """What was offloaded and compressed, and the resident peak against the budget, cumulative.

    Args:
        stats: ``rt.stats()``.
        memory_budget: the budget the runtime was given (any form :func:`cswap.budget.parse_budget`
            takes), or ``None``. An absolute budget adds ``memory_budget_bytes`` and
            ``peak_over_budget``; a fraction adds ``memory_budget_fraction``.

    Returns:
        Floats keyed ``cswap/<name>`` (loggers take floats).
    """
    logs = {
        "offloaded_bytes": stats.offloaded_bytes,
        "transferred_bytes": stats.transferred_bytes,
        "compressed_input_bytes": stats.compressed_input_bytes,
        "compressed_bytes": stats.compressed_bytes,
        "compression_ratio": stats.compression_ratio,
        "peak_resident_bytes": stats.peak_resident_bytes,
    }
    budget = parse_budget(memory_budget)
    if budget is not None and budget.nbytes is not None:
        logs["memory_budget_bytes"] = budget.nbytes
        logs["peak_over_budget"] = stats.peak_resident_bytes / budget.nbytes
    elif budget is not None:
        logs["memory_budget_fraction"] = budget.fraction
    return {PREFIX + name: float(value) for name, value in logs.items()}
