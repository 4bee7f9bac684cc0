"""The host arena: page-locked host memory for offloaded tensors, allocated between iterations, reused.

Allocating pinned memory synchronises the device, so the executor never does it while packing:
:meth:`HostArena.reserve` grows the arena before an iteration (from the profiled need), and packing
takes blocks with :meth:`HostArena.alloc` (first fit, 64-byte aligned) and returns them with
:meth:`HostArena.free` when the saved tensor's handle dies, in any order (neighbours coalesce).
A request that does not fit returns ``None``; the caller falls back to ordinary host memory and the
miss is counted, so the next :meth:`reserve` can grow. Growing adds a chunk while blocks are live
and merges everything into one chunk when the arena is empty.

A plan that lays its swaps out ahead of time (:class:`~cswap.planner.hostpool.PoolLayout`) gets its
**pool** carved from the start of the first chunk by :meth:`HostArena.plan_pool`, between
iterations: a planned key's host copy then goes to its own offset (:meth:`HostArena.alloc_tensor`
with the key), a view made once and reused every iteration, with nothing allocated or freed. A key
whose bytes are still held (by a block of another key sharing them, alive longer than profiled, or
by its own last copy) or that outgrew its slot takes a first-fit block instead, counted in
``pool_fallbacks``. First-fit blocks live in the rest of the arena.

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

# Blocks and pool slots share one alignment (any dtype view of either is aligned).
from cswap.planner.hostpool import ALIGN_BYTES, PoolLayout, aligned

__all__ = ["ALIGN_BYTES", "ArenaBlock", "HostArena", "PoolSlot", "aligned"]



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


class PoolSlot(NamedTuple):
    """A planned key's place in the pool, held by the stored data in its host copy (released with it)."""

    pool: _Pool
    key: int


class _Pool:
    """The planned region at the start of a chunk: per key, its offset, its reused view, whether held."""

    def __init__(self, layout: PoolLayout, chunk: _Chunk) -> None:
        self.layout = layout
        self.chunk = chunk
        # per key: the (dtype, shape, stride) its view was made for, and the view with its slot marker
        self.views: dict[int, tuple[torch.dtype, tuple[int, ...], tuple[int, ...], tuple[torch.Tensor, PoolSlot]]] = {}
        # per key, the keys whose slots share bytes with its own (None: none do)
        self.conflicts = {key: frozenset(keys) or None for key, keys in layout.conflicts.items()}
        self.sizes = dict(layout.sizes)  # read once per planned swap: a plain dict
        self.held: set[int] = set()
        self.hits = 0
        self.fallbacks = 0

    def _free(self, key: int) -> bool:
        """Whether no bytes of ``key``'s slot are held (by it or by a key sharing them)."""
        held = self.held
        if key in held:
            return False
        conflicts = self.conflicts.get(key)
        return conflicts is None or not held or held.isdisjoint(conflicts)

    def take(self, key: int, dtype: torch.dtype, shape: tuple[int, ...], stride: tuple[int, ...], nbytes: int) -> tuple[torch.Tensor, PoolSlot] | None:
        """The view of ``key``'s slot as ``dtype``, ``shape``, ``stride``, now held, and its marker;
        ``None`` (counted) when the key has no slot, outgrew it, or bytes of its slot are still held."""
        size = self.sizes.get(key)
        if size is None or nbytes > size or not self._free(key):
            self.fallbacks += 1
            return None
        cached = self.views.get(key)
        if cached is None or cached[0] is not dtype or cached[1] != shape or cached[2] != stride:
            view = self.chunk.of_dtype(dtype).as_strided(shape, stride, self.layout.offsets[key] // dtype.itemsize)
            cached = self.views[key] = (dtype, shape, stride, (view, PoolSlot(self, key)))
        self.held.add(key)
        self.hits += 1
        return cached[3]


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
        capacity_bytes: bytes of all chunks (the pool's included).
        pool_bytes: bytes of the planned pool (0: none).
        pool_hits, pool_fallbacks: planned keys placed in the pool, and those that took a first-fit
            block instead (cumulative over every pool).
        used_bytes: bytes in live first-fit blocks.
        peak_used_bytes: the most ``used_bytes`` reached since :meth:`reset_peak`.
        missed_bytes: bytes requested since :meth:`reset_peak` that did not fit.
        misses: requests that did not fit, ever.
    """

    def __init__(self, pin_memory: bool) -> None:
        self.pin_memory = pin_memory
        self._chunks: list[_Chunk] = []
        self._pool: _Pool | None = None
        self._pool_counts = (0, 0)  # hits and fallbacks of the pools before the current one
        self.used_bytes = 0
        self.peak_used_bytes = 0
        self.missed_bytes = 0
        self.misses = 0

    @property
    def capacity_bytes(self) -> int:
        """Bytes of all chunks."""
        return sum(chunk.buffer.numel() for chunk in self._chunks)

    @property
    def pool_bytes(self) -> int:
        """Bytes of the planned pool (0: none)."""
        return self._pool.layout.pool_bytes if self._pool is not None else 0

    @property
    def held_bytes(self) -> int:
        """Bytes held by live host copies now: first-fit blocks and held pool slots."""
        pool = self._pool
        return self.used_bytes + (sum(pool.layout.sizes[key] for key in pool.held) if pool is not None else 0)

    @property
    def pool_hits(self) -> int:
        """Planned keys placed in a pool, ever."""
        return self._pool_counts[0] + (self._pool.hits if self._pool is not None else 0)

    @property
    def pool_fallbacks(self) -> int:
        """Planned keys that took a first-fit block instead of their pool slot, ever."""
        return self._pool_counts[1] + (self._pool.fallbacks if self._pool is not None else 0)

    def plan_pool(self, layout: PoolLayout | None, other_bytes: int) -> None:
        """Lay the arena out for a plan, between iterations: ``layout``'s pool at the start of one
        chunk, and at least ``other_bytes`` for first-fit blocks after it (``layout`` ``None``: all
        first fit). While blocks of the last layout are still held (a graph kept across iterations),
        nothing moves: the old layout stays and only the first-fit room grows.

        Args:
            layout: the plan's pool, or ``None``.
            other_bytes: the first-fit room wanted besides the pool.
        """
        current = self._pool.layout if self._pool is not None else None
        if layout is current or self.used_bytes or (self._pool is not None and self._pool.held):
            self.reserve(self.pool_bytes + other_bytes)
            return
        if self._pool is not None:
            self._pool_counts = (self.pool_hits, self.pool_fallbacks)
        pool_bytes = layout.pool_bytes if layout is not None else 0
        total = aligned(pool_bytes + other_bytes)
        if len(self._chunks) != 1 or self.capacity_bytes < total:
            self._chunks = [_Chunk(max(total, self.capacity_bytes), self.pin_memory)]
        chunk = self._chunks[0]
        capacity = chunk.buffer.numel()
        chunk.free = [(pool_bytes, capacity - pool_bytes)] if capacity > pool_bytes else []
        self._pool = _Pool(layout, chunk) if layout is not None else None

    def reserve(self, nbytes: int) -> None:
        """Make the arena hold at least ``nbytes``; call between iterations (it may pin memory).

        Args:
            nbytes: the capacity wanted, in bytes.
        """
        nbytes = aligned(nbytes)
        capacity = self.capacity_bytes
        if nbytes <= capacity:
            return
        if self.used_bytes == 0 and self._pool is None:
            self._chunks = [_Chunk(nbytes, self.pin_memory)]
        else:  # live blocks, or the pool, stay where they are
            self._chunks.append(_Chunk(nbytes - capacity, self.pin_memory))

    def alloc(self, nbytes: int) -> ArenaBlock | None:
        """A block of at least ``nbytes``, or ``None`` when no chunk has room (counted as a miss)."""
        size = aligned(max(nbytes, 1))
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

    def alloc_tensor(
        self, dtype: torch.dtype, shape: tuple[int, ...], stride: tuple[int, ...], nbytes: int, key: int | None = None
    ) -> tuple[torch.Tensor, ArenaBlock | PoolSlot | None]:
        """A host tensor of ``dtype``, ``shape`` and ``stride`` spanning ``nbytes``: planned ``key``'s
        pool slot, else an arena block (returned with it), or, when no chunk has room, fresh
        pageable memory (a miss; the block is ``None``): pinning now would synchronise the device
        in the middle of an iteration."""
        pool = self._pool
        if key is not None and pool is not None:
            taken = pool.take(key, dtype, shape, stride, nbytes)
            if taken is not None:
                return taken
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

    def free(self, block: ArenaBlock | PoolSlot) -> None:
        """Return ``block`` (exactly once)."""
        if type(block) is PoolSlot:
            block.pool.held.discard(block.key)
            return
        self._chunks[block.chunk].release(block.offset, block.size)
        self.used_bytes -= block.size

    def reset_peak(self) -> None:
        """Start a new measurement of peak use and missed bytes (one per iteration)."""
        self.peak_used_bytes = self.used_bytes
        self.missed_bytes = 0
