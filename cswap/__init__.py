"""cswap: a self-tuning compressed-swap runtime for PyTorch training.

The public entry point is :class:`cswap.Runtime`; it is imported lazily so that the lower layers
(``cswap.codecs``, ``cswap.device``) load without the runtime.

Example:
    >>> import cswap
    >>> cswap.__version__
    '0.1.0'
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Runtime": "cswap.runtime",
    "RuntimeStats": "cswap.stats",
    "Plan": "cswap.planner.plan",
    "Action": "cswap.planner.plan",
    "Trace": "cswap.profile.trace",
    "BudgetError": "cswap.budget",
    "MemoryBudget": "cswap.budget",
    "HostBudget": "cswap.budget",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cswap' has no attribute {name!r}")
