"""Bit-packing reference backend in plain torch ops: defines the bytes the other backends write.

Example:
    >>> import torch
    >>> pack(torch.tensor([1, 0, 1, 1], dtype=torch.uint8), None).tolist()
    [13]
"""

from __future__ import annotations

import torch

from cswap.codecs.launch import Launch
from cswap.codecs.zvc_torch import bitmap_mask, bitmap_words

__all__ = ["available", "check_launch", "pack", "unpack"]


def available() -> bool:
    """Always: torch runs everywhere."""
    return True


def check_launch(launch: Launch | None) -> Launch | None:
    """The torch backend takes no launch parameters."""
    return launch


def pack(flat: torch.Tensor, launch: Launch | None) -> torch.Tensor:
    """The words of a flat uint8 tensor: bit ``i % 32`` of word ``i // 32`` set when element ``i`` is nonzero."""
    return bitmap_words(flat != 0)


def unpack(words: torch.Tensor, out: torch.Tensor, launch: Launch | None) -> None:
    """Write 0 or 1 per element of ``words`` into the flat uint8 tensor ``out``."""
    out.copy_(bitmap_mask(words, out.numel()))
