"""Bit-packing reference backend in plain torch ops: defines the bytes the other backends write.

Example:
    >>> import torch
    >>> pack(torch.tensor([1, 0, 1, 1], dtype=torch.uint8), None).tolist()
    [13]
"""

from __future__ import annotations

import torch

from cswap.codecs.format import n_words_for
from cswap.codecs.launch import Launch

__all__ = ["available", "check_launch", "pack", "unpack"]


def available() -> bool:
    """Always: torch runs everywhere."""
    return True


def check_launch(launch: Launch | None) -> Launch | None:
    """The torch backend takes no launch parameters."""
    return launch


def _bit_weights(device: torch.device) -> torch.Tensor:
    return torch.ones(32, dtype=torch.int64, device=device) << torch.arange(32, dtype=torch.int64, device=device)


def pack(flat: torch.Tensor, launch: Launch | None) -> torch.Tensor:
    """The words of a flat uint8 tensor: bit ``i % 32`` of word ``i // 32`` set when element ``i`` is nonzero."""
    n_words = n_words_for(flat.numel())
    padded = torch.zeros(n_words * 32, dtype=torch.int64, device=flat.device)
    padded[: flat.numel()] = flat != 0
    words = (padded.view(n_words, 32) * _bit_weights(flat.device)).sum(dim=1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack(words: torch.Tensor, out: torch.Tensor, launch: Launch | None) -> None:
    """Write 0 or 1 per element of ``words`` into the flat uint8 tensor ``out``."""
    bits = (words.to(torch.int64).unsqueeze(1) & _bit_weights(words.device)) != 0
    out.copy_(bits.view(-1)[: out.numel()])
