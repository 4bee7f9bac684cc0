"""Small user models for the training tests, loaded as ``--model tests.cli.nets:NAME``."""

from __future__ import annotations

from torch import nn


def tiny_cnn(num_classes: int = 10, **_: object) -> nn.Module:
    """A dropout- and batch-norm-free CNN, so distributed and single-process runs compute the same thing."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
        nn.Flatten(), nn.Linear(64, num_classes),
    )
