"""A ``cswap train`` run's defaults as plain values, read without pydantic or yaml.

:class:`cswap.training.config.TrainConfig` takes its defaults from here, and ``cswap train --help``
shows them from here too: printing the command line's help then imports neither the config's
validation (pydantic) nor its recipe reader (yaml). ``None`` means "not set" (no budget, no service,
the report's own folder, ...).

Example:
    >>> TRAIN_DEFAULTS["model"], TRAIN_DEFAULTS["epochs"], TRAIN_DEFAULTS["memory_budget"]
    ('vgg16', 2, None)
"""

from __future__ import annotations

from typing import Any

__all__ = ["TRAIN_DEFAULTS"]

#: Per :class:`~cswap.training.config.TrainConfig` field, its default.
TRAIN_DEFAULTS: dict[str, Any] = {
    "model": "vgg16",
    "dataset": "digits",
    "epochs": 2,
    "batch_size": 32,
    "lr": 0.02,
    "momentum": 0.9,
    "weight_decay": 5e-4,
    "policy": "cswap",
    "tune": "off",
    "tune_budget": 12,
    "tuner_url": None,
    "device": "auto",
    "amp": "off",
    "image_size": 32,
    "width_mult": 1.0,
    "train_samples": None,
    "min_bytes": None,
    "memory_budget": None,
    "host_memory_budget": None,
    "report": None,
    "plots": None,
    "seed": 0,
    "save_model": None,
}
