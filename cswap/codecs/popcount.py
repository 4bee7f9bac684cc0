"""Set bits per chunk of a ZVC bitmap, for :meth:`cswap.codecs.format.Packed.validate`.

On the CPU one serial Numba pass with the popcount instruction (no temporaries, no thread pool,
so a loaded machine does not stall it at a barrier); on other devices a torch SWAR bit count over
one int64 copy of the bitmap (8 bytes per 32 elements). Either way the memory is proportional to
the bitmap, never to ``chunk_words`` or to a per-bit expansion.

Example:
    >>> import torch
    >>> chunk_popcounts(torch.tensor([1, 3, -1], dtype=torch.int32), 2).tolist()
    [3, 32]
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from cswap.codecs.intrinsics import popcount

__all__ = ["chunk_popcounts", "chunk_popcounts_torch"]


@njit(cache=True, nogil=True)
def _chunk_popcounts_numba(bitmap: np.ndarray, chunk_words: int, counts: np.ndarray) -> None:
    n_words = bitmap.size
    for c in range(counts.size):
        w0 = c * chunk_words
        total = 0
        for w in range(w0, min(w0 + chunk_words, n_words)):
            total += popcount(bitmap[w])
        counts[c] = total


def _word_popcounts(bitmap: torch.Tensor) -> torch.Tensor:
    """Set bits of each 32-bit word as int64: the SWAR count, in place on one int64 copy."""
    x = bitmap.to(torch.int64, copy=True)
    x &= 0xFFFFFFFF
    x -= (x >> 1) & 0x55555555
    x = (x & 0x33333333).add_((x >> 2) & 0x33333333)
    x += x >> 4
    x &= 0x0F0F0F0F
    x *= 0x01010101
    x >>= 24
    x &= 0xFF
    return x


def chunk_popcounts_torch(bitmap: torch.Tensor, chunk_words: int) -> torch.Tensor:
    """:func:`chunk_popcounts` in torch ops, on the bitmap's device.

    Example:
        >>> chunk_popcounts_torch(torch.tensor([7, 0, 1], dtype=torch.int32), 2).tolist()
        [3, 1]
    """
    per_word = _word_popcounts(bitmap)
    full_chunks, rest = divmod(per_word.numel(), chunk_words)
    counts = per_word[: full_chunks * chunk_words].view(full_chunks, chunk_words).sum(dim=1)
    if rest:
        counts = torch.cat([counts, per_word[full_chunks * chunk_words :].sum().reshape(1)])
    return counts


def chunk_popcounts(bitmap: torch.Tensor, chunk_words: int) -> torch.Tensor:
    """Set bits per chunk of ``chunk_words`` words, as int64 on the bitmap's device.

    Bits past the tensor's end in the last word are counted: callers check first that they are zero.

    Args:
        bitmap: 1-d int32 bitmap words (uint32 bit patterns).
        chunk_words: words per chunk, >= 1.

    Example:
        >>> chunk_popcounts(torch.tensor([-1, 0, 5], dtype=torch.int32), 32).tolist()
        [34]
    """
    if bitmap.device.type != "cpu":
        return chunk_popcounts_torch(bitmap, chunk_words)
    counts = torch.empty((bitmap.numel() + chunk_words - 1) // chunk_words, dtype=torch.int64)
    _chunk_popcounts_numba(bitmap.contiguous().numpy().view(np.uint32), chunk_words, counts.numpy())
    return counts
