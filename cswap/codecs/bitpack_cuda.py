"""Bit-packing on the GPU: Numba CUDA kernels writing the words of :mod:`cswap.codecs.bitpack_torch`.

``pack`` gives each thread one word: it reads that word's 32 bytes as four 8-byte reads (a warp
reads 1 KiB in a row) and sets their bits. ``unpack`` gives each thread eight elements: one byte of
a word, spread into eight bytes by three shift-and-mask steps, one 8-byte store. Output or input
memory that is not 8-byte aligned (a view at an odd offset), and the bytes past the last whole
word, take one byte at a time. Both loop grid-stride, with the grid
and block of ``compress`` and ``decompress`` in :class:`~cswap.codecs.launch.CudaLaunch`; a launch
the device refuses falls back to the defaults with one warning. No warp intrinsics, so the same
kernels run under Numba's CUDA simulator.

Example:
    >>> import torch
    >>> words = pack(torch.ones(40, dtype=torch.uint8, device="cuda"), None)  # doctest: +SKIP
    >>> words.tolist()  # doctest: +SKIP
    [-1, 255]
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from numba import cuda, uint32, uint64

from cswap.codecs import cuda_adapter
from cswap.codecs.bitpack import eight_byte_prefix
from cswap.codecs.cuda_launch import check_launch, with_fallback
from cswap.codecs.format import n_words_for
from cswap.codecs.launch import CudaLaunch

__all__ = ["available", "check_launch", "pack", "unpack"]


def available() -> bool:
    """True where torch and Numba both see a GPU, or under ``NUMBA_ENABLE_CUDASIM=1``."""
    return cuda_adapter.simulator_enabled() or cuda_adapter.gpu_available()


@functools.cache
def _kernels() -> tuple[Any, Any]:
    @cuda.jit
    def pack_kernel(x, wide, numel, words):  # type: ignore[no-untyped-def]
        start = cuda.grid(1)
        stride = cuda.gridsize(1)
        for w in range(start, words.size, stride):
            base = w * 32
            word = uint32(0)
            if base + 32 <= numel and wide.size:  # the word's 32 bytes as four 8-byte reads
                for q in range(4):
                    v = wide[w * 4 + q]
                    for b in range(8):
                        if (v >> uint64(8 * b)) & uint64(0xFF):
                            word |= uint32(1) << uint32(q * 8 + b)
            else:
                for j in range(min(32, numel - base)):
                    if x[base + j] != 0:
                        word |= uint32(1) << uint32(j)
            words[w] = word

    @cuda.jit
    def unpack_kernel(words, numel, out, wide):  # type: ignore[no-untyped-def]
        start = cuda.grid(1)
        stride = cuda.gridsize(1)
        for i in range(start, wide.size, stride):  # eight elements, one 8-byte store
            spread = uint64((words[i >> 2] >> uint32(8 * (i & 3))) & uint32(0xFF))
            spread = (spread | (spread << uint64(28))) & uint64(0x0000000F0000000F)
            spread = (spread | (spread << uint64(14))) & uint64(0x0003000300030003)
            wide[i] = (spread | (spread << uint64(7))) & uint64(0x0101010101010101)
        for i in range(wide.size * 8 + start, numel, stride):
            out[i] = (words[i // 32] >> uint32(i % 32)) & uint32(1)

    return pack_kernel, unpack_kernel


def pack(flat: torch.Tensor, launch: CudaLaunch | None) -> torch.Tensor:
    """The words of a flat uint8 tensor on its GPU (on the CPU under the simulator)."""
    launch = check_launch(launch)
    cuda_adapter.check_tensor(flat, "tensor to compress")
    words = torch.empty(n_words_for(flat.numel()), dtype=torch.int32, device=flat.device)
    if not words.numel():
        return words
    wide = eight_byte_prefix(flat, 32)

    def run(chosen: CudaLaunch) -> torch.Tensor:
        with cuda_adapter.launcher(flat.device) as launcher:
            launcher(
                _kernels()[0], chosen.compress_grid, chosen.compress_block, cuda_adapter.as_array(flat),
                cuda_adapter.as_array(wide, np.uint64), flat.numel(), cuda_adapter.as_array(words, np.uint32),
            )
        return words

    return with_fallback(launch, launch.chunk_words, run)


def unpack(words: torch.Tensor, out: torch.Tensor, launch: CudaLaunch | None) -> None:
    """Write 0 or 1 per element of ``words`` into the flat uint8 tensor ``out`` on the same device."""
    launch = check_launch(launch)
    cuda_adapter.check_tensor(words, "packed words")
    cuda_adapter.check_tensor(out, "output")
    wide = eight_byte_prefix(out, 8)

    def run(chosen: CudaLaunch) -> None:
        with cuda_adapter.launcher(out.device) as launcher:
            launcher(
                _kernels()[1], chosen.decompress_grid, chosen.decompress_block,
                cuda_adapter.as_array(words.contiguous(), np.uint32), out.numel(), cuda_adapter.as_array(out),
                cuda_adapter.as_array(wide, np.uint64),
            )

    with_fallback(launch, launch.chunk_words, run)
