"""ZVC reference backend in plain torch ops: runs on any device, defines the expected bytes.

It is the specification the ``cpu`` and ``cuda`` backends are tested against, and the baseline
their speed is measured against; clarity wins over speed here.

Example:
    >>> import torch
    >>> from cswap.codecs import zvc_torch
    >>> bitmap, offsets, values = zvc_torch.compress_bits(torch.tensor([0, 5, 0, 7], dtype=torch.int32), 32, None)
    >>> bitmap.tolist(), offsets.tolist(), values.tolist()
    ([10], [0, 2], [5, 7])
"""

from __future__ import annotations

import torch

from cswap.codecs.format import Packed, n_chunks_for, n_words_for
from cswap.codecs.launch import Launch

__all__ = ["available", "bitmap_mask", "bitmap_words", "check_launch", "compress_bits", "decompress_bits"]


def available() -> bool:
    """Always: torch runs everywhere."""
    return True


def check_launch(launch: Launch | None) -> Launch | None:
    """The torch backend takes no launch parameters but honours ``chunk_words`` of any launch."""
    return launch


def _bit_weights(device: torch.device) -> torch.Tensor:
    return torch.ones(32, dtype=torch.int64, device=device) << torch.arange(32, dtype=torch.int64, device=device)


def _as_uint32_bits(words: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2**32) to int32 tensors with the same low 32 bits."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def bitmap_words(mask: torch.Tensor) -> torch.Tensor:
    """The int32 words of a flat bool ``mask``: bit ``i % 32`` of word ``i // 32`` set where it is
    True (ZVC's bitmap, and bit-packing's whole format)."""
    n_words = n_words_for(mask.numel())
    padded = torch.zeros(n_words * 32, dtype=torch.int64, device=mask.device)
    padded[: mask.numel()] = mask
    return _as_uint32_bits((padded.view(n_words, 32) * _bit_weights(mask.device)).sum(dim=1))


def bitmap_mask(words: torch.Tensor, numel: int) -> torch.Tensor:
    """The flat bool mask of ``numel`` elements that :func:`bitmap_words` made ``words`` from."""
    unsigned = words.to(torch.int64) & 0xFFFFFFFF
    return ((unsigned.unsqueeze(1) & _bit_weights(words.device)) != 0).view(-1)[:numel]


def compress_bits(
    flat_bits: torch.Tensor, chunk_words: int, launch: Launch | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bitmap, offsets and values of a flat integer tensor.

    Args:
        flat_bits: contiguous 1-d integer tensor (the element bits).
        chunk_words: bitmap words per offsets chunk.
        launch: ignored.
    """
    numel = flat_bits.numel()
    device = flat_bits.device
    n_chunks = n_chunks_for(numel, chunk_words)
    mask = flat_bits != 0
    padded = torch.zeros(n_chunks * chunk_words * 32, dtype=torch.int64, device=device)
    padded[:numel] = mask
    chunk_counts = padded.view(n_chunks, chunk_words * 32).sum(dim=1)
    offsets = torch.zeros(n_chunks + 1, dtype=torch.int64, device=device)
    torch.cumsum(chunk_counts, dim=0, out=offsets[1:])
    values = torch.masked_select(flat_bits, mask)
    return bitmap_words(mask), offsets, values


def decompress_bits(packed: Packed, out_bits: torch.Tensor, launch: Launch | None) -> None:
    """Write the element bits of ``packed`` into the flat integer tensor ``out_bits``."""
    mask = bitmap_mask(packed.bitmap, out_bits.numel())
    out_bits.zero_()
    out_bits.masked_scatter_(mask, packed.values)
