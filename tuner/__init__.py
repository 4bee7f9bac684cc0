"""Launch-config tuning of the codec kernels, and the store that keeps what was tuned.

Example:
    >>> from cswap.tuner import ConfigStore, size_bucket
    >>> size_bucket(16 << 20)
    12
"""

import importlib
from typing import Any

from cswap.tuner.store import (
    ConfigStore,
    Evaluation,
    LookupResult,
    StoreError,
    TuningRun,
    fingerprint_key,
    size_bucket,
)

# The search and the measuring code import torch and the codecs; the store must not (the tuning
# service imports it on machines without torch), so they load on first use.
_LAZY = {
    "KERNELS": "cswap.tuner.kernels",
    "KernelObjective": "cswap.tuner.objective",
    "METHODS": "cswap.tuner.search",
    "SearchResult": "cswap.tuner.search",
    "SearchSpace": "cswap.tuner.space",
    "SearchSpaceError": "cswap.tuner.space",
    "kernel_name": "cswap.tuner.kernels",
    "kernel_source_hash": "cswap.tuner.kernels",
    "launch_for": "cswap.tuner.lookup",
    "load_search_space": "cswap.tuner.space",
    "search": "cswap.tuner.search",
    "tune": "cswap.tuner.lookup",
}

__all__ = [
    *_LAZY,
    "ConfigStore",
    "Evaluation",
    "LookupResult",
    "StoreError",
    "TuningRun",
    "fingerprint_key",
    "size_bucket",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cswap.tuner' has no attribute {name!r}")
