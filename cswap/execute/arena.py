"""The host arena: page-locked host memory for offloaded tensors, allocated between iterations, reused.

Allocating pinned memory synchronises the device, so the executor never does it while packing:
:meth:`HostArena.reserve` grows the arena before an iteration (from the profiled need), and packing
takes blocks with :meth:`HostArena.alloc` (first fit, 64-byte aligned) and returns them with
:meth:`HostArena.free` when the saved tensor's handle dies, in any order (neighbours coalesce).
A request that does not fit returns ``None``; the caller falls back to ordinary host memory and the
miss is counted, so the next :meth:`reserve` can grow. Growing adds a chunk while blocks are live
and merges everything into one chunk when the arena is empty.

Not thread-safe on its own: the executor calls it under its lock.

Example:
    >>> arena = HostArena(pin_memory=False)
    >>> arena.reserve(1024)
    >>> block = arena.alloc(100)
    >>> arena.tensor(block, torch.float32, (25,)).numel(), block.size, arena.used_bytes
    (25, 128, 128)
    >>> arena.free(block); arena.used_bytes
    0
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

import torch

__all__ = ["ALIGN_BYTES", "ArenaBlock", "HostArena", "aligned"]

#: Every block starts on a multiple of this many bytes (any dtype view of a block is aligned).
ALIGN_BYTES = 64


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`ALIGN_BYTES`."""
    return -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES


class ArenaBlock(NamedTuple):
    """A block of the arena (a tuple: one is made per offloaded tensor); :meth:`HostArena.tensor` views it.

    Attributes:
        chunk: index of the chunk it lives in.
        offset: byte offset in that chunk.
        size: bytes reserved (the request rounded up to the alignment).
    """

    chunk: int
    offset: int
    size: int


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride = []
    step = 1
    for size in reversed(shape):
        stride.append(step)
        step *= max(size, 1)
    return tuple(reversed(stride))


class _Chunk:
    """One host buffer and its free list of ``(offset, size)`` sorted by offset."""

    def __init__(self, nbytes: int, pin_memory: bool) -> None:
        self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin_memory)
        self.free: list[tuple[int, int]] = [(0, nbytes)] if nbytes else []
        self.typed: dict[torch.dtype, torch.Tensor] = {torch.uint8: self.buffer}

    def of_dtype(self, dtype: torch.dtype) -> torch.Tensor:
        """The whole buffer as elements of ``dtype`` (its size is a multiple of the alignment)."""
        view = self.typed.get(dtype)
        if view is None:
            view = self.typed[dtype] = self.buffer.view(dtype)
        return view

    def alloc(self, size: int) -> int | None:
        for i, (offset, free_size) in enumerate(self.free):
            if free_size >= size:
                if free_size == size:
                    del self.free[i]
                else:
                    self.free[i] = (offset + size, free_size - size)
                return offset
        return None

    def release(self, offset: int, size: int) -> None:
        i = bisect.bisect_left(self.free, (offset, 0))
        # Coalesce with the free neighbours on either side.
        if i < len(self.free) and offset + size == self.free[i][0]:
            size += self.free[i][1]
            del self.free[i]
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == offset:
            offset, size = self.free[i - 1][0], self.free[i - 1][1] + size
            del self.free[i - 1]
            i -= 1
        self.free.insert(i, (offset, size))


class HostArena:
    """Reusable host memory, pinned on CUDA machines.

    Args:
        pin_memory: page-lock the chunks (only possible, and only useful, with a GPU).

    Attributes:
        capacity_bytes: bytes of all chunks.
        used_bytes: bytes in live blocks.
        peak_used_bytes: the most ``used_bytes`` reached since :meth:`reset_peak`.
        missed_bytes: bytes requested since :meth:`reset_peak` that did not fit.
        misses: requests that did not fit, ever.
    """

    def __init__(self, pin_memory: bool) -> None:
        self.pin_memory = pin_memory
        self._chunks: list[_Chunk] = []
        self.used_bytes = 0
        self.peak_used_bytes = 0
        self.missed_bytes = 0
        self.misses = 0

    @property
    def capacity_bytes(self) -> int:
        """Bytes of all chunks."""
        return sum(chunk.buffer.numel() for chunk in self._chunks)

    def reserve(self, nbytes: int) -> None:
        """Make the arena hold at least ``nbytes``; call between iterations (it may pin memory).

        Args:
            nbytes: the capacity wanted, in bytes.
        """
        nbytes = aligned(nbytes)
        capacity = self.capacity_bytes
        if nbytes <= capacity:
            return
        if self.used_bytes == 0:
            self._chunks = [_Chunk(nbytes, self.pin_memory)]
        else:
            self._chunks.append(_Chunk(nbytes - capacity, self.pin_memory))

    def alloc(self, nbytes: int) -> ArenaBlock | None:
        """A block of at least ``nbytes``, or ``None`` when no chunk has room (counted as a miss)."""
        size = -(-max(nbytes, 1) // ALIGN_BYTES) * ALIGN_BYTES
        for index, chunk in enumerate(self._chunks):
            offset = chunk.alloc(size)
            if offset is not None:
                used = self.used_bytes = self.used_bytes + size
                if used > self.peak_used_bytes:
                    self.peak_used_bytes = used
                return ArenaBlock(index, offset, size)
        self.misses += 1
        self.missed_bytes += size
        return None

    def alloc_tensor(self, dtype: torch.dtype, shape: tuple[int, ...], stride: tuple[int, ...], nbytes: int) -> tuple[torch.Tensor, ArenaBlock | None]:
        """A host tensor of ``dtype``, ``shape`` and ``stride`` spanning ``nbytes``: in an arena block
        (returned with it), or, when no chunk has room, fresh pageable memory (a miss; the block is
        ``None``): pinning now would synchronise the device in the middle of an iteration."""
        block = self.alloc(nbytes)
        if block is None:
            return torch.empty_strided(shape, stride, dtype=dtype), None
        typed = self._chunks[block.chunk].of_dtype(dtype)
        return typed.as_strided(shape, stride, block.offset // dtype.itemsize), block

    def tensor(self, block: ArenaBlock, dtype: torch.dtype, shape: tuple[int, ...], stride: tuple[int, ...] | None = None) -> torch.Tensor:
        """``block`` as a tensor of ``dtype``, ``shape`` and ``stride`` (default: contiguous), from its start.

        One view of the chunk's typed buffer: blocks start on :data:`ALIGN_BYTES`, a multiple of
        every itemsize. The caller keeps the elements within the block.
        """
        typed = self._chunks[block.chunk].of_dtype(dtype)
        start = block.offset // dtype.itemsize
        return typed.as_strided(shape, _row_major(shape) if stride is None else stride, start)

    def free(self, block: ArenaBlock) -> None:
        """Return ``block`` (exactly once)."""
        self._chunks[block.chunk].release(block.offset, block.size)
        self.used_bytes -= block.size

    def reset_peak(self) -> None:
        """Start a new measurement of peak use and missed bytes (one per iteration)."""
        self.peak_used_bytes = self.used_bytes
        self.missed_bytes = 0
