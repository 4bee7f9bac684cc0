"""Bit-packing on the CPU with Numba: one 32-lane vector compare per word, parallel over words;
unpacking spreads each byte of a word into eight output bytes by a 256-entry table.

Example:
    >>> import torch
    >>> pack(torch.tensor([1, 0, 1, 1], dtype=torch.uint8), None).tolist()
    [13]
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from cswap.codecs.bitpack import eight_byte_prefix
from cswap.codecs.format import n_words_for
from cswap.codecs.intrinsics import nonzero_mask32 as _nonzero_mask32
from cswap.codecs.cpu_launch import check_launch, require_cpu, threads, threads_for
from cswap.codecs.launch import CpuLaunch

__all__ = ["available", "check_launch", "pack", "unpack"]

#: Words per parallel task: small tasks would cost more to schedule than to pack.
_WORDS_PER_TASK = 4096


def available() -> bool:
    """Always: Numba's CPU JIT runs wherever cswap installs."""
    return True


@njit(parallel=True, cache=True, nogil=True)
def _pack(x: np.ndarray, words: np.ndarray) -> None:
    numel = x.size
    full = numel // 32
    n_tasks = (words.size + _WORDS_PER_TASK - 1) // _WORDS_PER_TASK
    for task in prange(n_tasks):
        w0 = task * _WORDS_PER_TASK
        for w in range(w0, min(w0 + _WORDS_PER_TASK, full)):
            words[w] = _nonzero_mask32(x, w * 32)
    if full < words.size:  # the partial last word
        word = np.uint32(0)
        for j in range(numel - full * 32):
            word |= np.uint32(x[full * 32 + j] != 0) << np.uint32(j)
        words[full] = word


def _byte_spread_table() -> np.ndarray:
    """Entry ``b``: the eight bytes 0 or 1 that bits 0..7 of ``b`` unpack to, as one little-endian uint64."""
    bits = (np.arange(256, dtype=np.uint64)[:, None] >> np.arange(8, dtype=np.uint64)) & np.uint64(1)
    table = (bits << (np.uint64(8) * np.arange(8, dtype=np.uint64))).sum(axis=1, dtype=np.uint64)
    table.flags.writeable = False
    return table


#: Read-only; Numba freezes it into the compiled unpack.
_BYTE_SPREAD = _byte_spread_table()


@njit(parallel=True, cache=True, nogil=True)
def _unpack(words: np.ndarray, out: np.ndarray, wide: np.ndarray) -> None:
    """``wide`` is ``out``'s whole words as uint64, four per packed word (empty where ``out`` is not
    8-byte aligned): one table lookup and one 8-byte store per packed byte, not eight 1-byte stores."""
    numel = out.size
    full = numel // 32
    n_tasks = (words.size + _WORDS_PER_TASK - 1) // _WORDS_PER_TASK
    for task in prange(n_tasks):
        w0 = task * _WORDS_PER_TASK
        for w in range(w0, min(w0 + _WORDS_PER_TASK, full)):
            word = words[w]
            if wide.size:
                for q in range(4):
                    wide[w * 4 + q] = _BYTE_SPREAD[(word >> np.uint32(8 * q)) & np.uint32(255)]
            else:
                for j in range(32):
                    out[w * 32 + j] = (word >> np.uint32(j)) & np.uint32(1)
    for i in range(full * 32, numel):  # the partial last word
        out[i] = (words[full] >> np.uint32(i - full * 32)) & np.uint32(1)


def pack(flat: torch.Tensor, launch: CpuLaunch | None) -> torch.Tensor:
    """The words of a flat uint8 tensor: bit ``i % 32`` of word ``i // 32`` set when element ``i`` is nonzero."""
    require_cpu("the tensor", flat)
    words = torch.empty(n_words_for(flat.numel()), dtype=torch.int32)
    with threads(threads_for(check_launch(launch), flat.numel())):
        _pack(flat.numpy(), words.numpy().view(np.uint32))
    return words


def unpack(words: torch.Tensor, out: torch.Tensor, launch: CpuLaunch | None) -> None:
    """Write 0 or 1 per element of ``words`` into the flat uint8 tensor ``out``."""
    require_cpu("the words", words)
    wide = eight_byte_prefix(out, 32).numpy().view(np.uint64)
    with threads(threads_for(check_launch(launch), out.numel())):
        _unpack(words.contiguous().numpy().view(np.uint32), out.numpy(), wide)

