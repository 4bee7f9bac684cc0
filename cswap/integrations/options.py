"""The runtime options a callback is given, checked when the callback is made.

A callback builds its :class:`cswap.Runtime` when training begins (it needs the trainer's model
and device), so the options are validated here first: a bad policy fails at ``CswapCallback(...)``,
not minutes later inside ``trainer.fit``.

Example:
    >>> callback_options("swap", None, {"min_bytes": 0})
    {'min_bytes': 0, 'policy': 'swap'}
    >>> callback_options("swaps", None, {})
    Traceback (most recent call last):
    ...
    ValueError: invalid Runtime option policy='swaps': choose one of none, swap, compress-swap, cswap, compress-keep
"""

from __future__ import annotations

from typing import Any

import torch

from cswap.options import load_options

__all__ = ["callback_options", "runtime_options"]


def callback_options(policy: str | None, memory_budget: Any, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with ``policy`` and ``memory_budget`` added when given, validated.

    ``memory_budget`` is passed on only when not ``None``, so a runtime without budgets still
    takes the rest.

    Raises:
        TypeError: an unknown option (naming the valid ones).
        ValueError: a bad value (naming the option).
    """
    merged = dict(options)
    if policy is not None:
        merged["policy"] = policy
    if memory_budget is not None:
        merged["memory_budget"] = memory_budget
    load_options(**merged)
    return merged


def runtime_options(options: dict[str, Any], model: torch.nn.Module | None, device: torch.device | str | None) -> dict[str, Any]:
    """``options`` completed with the trainer's model and device unless the user set them.

    The model's parameters and buffers are then never offloaded and label the profile; the device
    is where the trainer runs (a ``use_cpu`` run on a GPU machine stays on the CPU).

    Example:
        >>> runtime_options({"policy": "swap"}, None, torch.device("cpu"))
        {'policy': 'swap', 'device': 'cpu'}
    """
    completed = dict(options)
    if model is not None:
        completed.setdefault("model", model)
    if device is not None:
        completed.setdefault("device", str(device))
    return completed
