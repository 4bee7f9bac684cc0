"""Helpers shared by the model families: channel scaling and argument checks.

Example:
    >>> scaled(64, 0.125)
    8
    >>> scaled(3, 0.01)
    1
"""

from __future__ import annotations

import math

from torch import nn

__all__ = ["check_common", "on_meta", "scaled"]


def scaled(channels: int, width_mult: float) -> int:
    """``channels * width_mult`` rounded to the nearest integer, at least 1."""
    return max(1, int(round(channels * width_mult)))


def on_meta(module: nn.Module) -> bool:
    """True when ``module``'s parameters live on the meta device, where random initialisation is moot.

    Skipping it there matters: the first ``normal_`` on a meta tensor imports torch's compiler stack.
    """
    return any(p.is_meta for p in module.parameters())


def check_common(num_classes: int, width_mult: float) -> None:
    """``ValueError`` naming the bad argument when ``num_classes`` or ``width_mult`` is out of range."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    if isinstance(width_mult, bool) or not isinstance(width_mult, (int, float)):
        raise ValueError(f"width_mult must be a positive float, got {width_mult!r}")
    if not (math.isfinite(width_mult) and width_mult > 0):
        raise ValueError(f"width_mult must be a positive finite float (e.g. 1.0 or 0.125), got {width_mult!r}")
