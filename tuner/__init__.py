"""Launch-config tuning of the codec kernels, and the store that keeps what was tuned.

Example:
    >>> from tuner import ConfigStore, size_bucket
    >>> size_bucket(16 << 20)
    12
"""

import importlib
from typing import Any

from tuner.store import (
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
    "KERNELS": "tuner.kernels",
    "KernelObjective": "tuner.objective",
    "METHODS": "tuner.search",
    "SearchResult": "tuner.search",
    "SearchSpace": "tuner.space",
    "SearchSpaceError": "tuner.space",
    "kernel_name": "tuner.kernels",
    "kernel_source_hash": "tuner.kernels",
    "launch_for": "tuner.lookup",
    "load_search_space": "tuner.space",
    "search": "tuner.search",
    "tune": "tuner.lookup",
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
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
