"""Host memory laid out before the iteration: an offset for every block the plan puts on the host.

A plan knows, from the profile, when each offloaded tensor's host copy is written (its pack) and
when it is last needed (its free point after backward read it), and how many bytes it takes. As
EMM does for device memory, :func:`place_blocks` lays these blocks out ahead of time in one pool,
so that the iteration allocates nothing: blocks whose lifetimes never overlap may share bytes.
Placement is greedy by size (largest first), each block at the best-fitting gap among the placed
blocks alive at the same time; the pool is then usually at or near :func:`live_peak_bytes`, the
lower bound (the most bytes alive at one event), and below what a first-fit allocator serving the
same requests in event order reaches (:func:`first_fit_high_water`, what the host arena does at
run time).

:func:`host_pool_of` reads the blocks of a plan's swaps off its profile (a duplicate shares its first
pack's block), each alive from its pack to its free point (:meth:`cswap.planner.plan.Plan.with_host_pool`).
Sizes are rounded up to 64 bytes, so every block starts aligned for any dtype.

Example:
    >>> blocks = [HostBlock(0, 256, 0, 2), HostBlock(1, 256, 1, 5), HostBlock(2, 512, 3, 5)]
    >>> layout = place_blocks(blocks)
    >>> layout.pool_bytes, live_peak_bytes(blocks), first_fit_high_water(blocks)
    (768, 768, 1024)
    >>> layout.offsets[2], layout.conflicts[2]   # block 2 reuses block 0's bytes: it died before
    (0, (0,))
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from cswap.planner.lifetime import lifetimes_from_trace
from cswap.profile.trace import Trace

__all__ = ["ALIGN_BYTES", "HostBlock", "PoolLayout", "aligned", "first_fit_high_water", "host_pool_of", "live_peak_bytes", "place_blocks"]

#: Every block's size is rounded up to this, so every offset suits every dtype.
ALIGN_BYTES = 64


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`ALIGN_BYTES`."""
    return -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES


def _aligned(nbytes: int) -> int:  # a block holds at least one aligned unit, even for 0 bytes
    return aligned(max(nbytes, 1))


@dataclass(frozen=True)
class HostBlock:
    """One tensor's host copy over the iteration's events.

    Attributes:
        key: the pack key it belongs to.
        nbytes: bytes it needs (rounded up to :data:`ALIGN_BYTES` when placed).
        first_event, last_event: the events it is alive at, both included (its pack, its free point).
    """

    key: int
    nbytes: int
    first_event: int
    last_event: int

    def __post_init__(self) -> None:
        if self.nbytes < 0 or self.first_event < 0 or self.last_event < self.first_event:
            raise ValueError(f"inconsistent host block {self}: need nbytes >= 0 and 0 <= first_event <= last_event")


@dataclass(frozen=True)
class PoolLayout:
    """Where each block lives in one pool.

    Attributes:
        offsets: per key, its byte offset in the pool (a multiple of :data:`ALIGN_BYTES`).
        sizes: per key, the bytes reserved for it (aligned).
        pool_bytes: the pool's size: the end of the highest block.
        lower_bound_bytes: the most aligned bytes alive at one event (no layout needs less).
        conflicts: per key, the keys whose bytes overlap its own (their lifetimes do not, in the
            profile); at run time a block is written only once every one of them is released.
    """

    offsets: Mapping[int, int]
    sizes: Mapping[int, int]
    pool_bytes: int
    lower_bound_bytes: int
    conflicts: Mapping[int, tuple[int, ...]] = field(default_factory=dict, repr=False)


def live_peak_bytes(blocks: Sequence[HostBlock]) -> int:
    """The most (aligned) bytes alive at one event: a lower bound on any layout's pool."""
    if not blocks:
        return 0
    events = max(b.last_event for b in blocks) + 2
    delta = np.zeros(events, dtype=np.int64)
    for b in blocks:
        delta[b.first_event] += _aligned(b.nbytes)
        delta[b.last_event + 1] -= _aligned(b.nbytes)
    return int(np.cumsum(delta).max())


def place_blocks(blocks: Sequence[HostBlock]) -> PoolLayout:
    """Offsets for ``blocks``, greedy by size: each, largest first, in the smallest gap that holds it
    among the placed blocks alive at some event it is alive at (or above them all).

    Args:
        blocks: one per key (keys must be distinct).
    """
    keys = [b.key for b in blocks]
    if len(set(keys)) != len(keys):
        raise ValueError("one host block per key: keys repeat")
    order = sorted(range(len(blocks)), key=lambda i: (-_aligned(blocks[i].nbytes), blocks[i].first_event, blocks[i].key))
    first = np.array([b.first_event for b in blocks], dtype=np.int64)
    last = np.array([b.last_event for b in blocks], dtype=np.int64)
    size = np.array([_aligned(b.nbytes) for b in blocks], dtype=np.int64)
    offset = np.full(len(blocks), -1, dtype=np.int64)
    placed = np.zeros(len(blocks), dtype=bool)
    for i in order:
        alive = placed & (first <= last[i]) & (last >= first[i])
        taken = sorted(zip(offset[alive].tolist(), (offset[alive] + size[alive]).tolist()))
        best, best_gap, cursor = None, None, 0
        for start, end in taken:
            gap = start - cursor
            if gap >= size[i] and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, end)
        offset[i] = cursor if best is None else best
        placed[i] = True
    ends = offset + size
    conflicts: dict[int, tuple[int, ...]] = {}
    for i, b in enumerate(blocks):
        overlap = (offset < ends[i]) & (ends > offset[i])
        overlap[i] = False
        conflicts[b.key] = tuple(sorted(blocks[j].key for j in np.flatnonzero(overlap)))
    return PoolLayout(
        offsets=MappingProxyType({b.key: int(offset[i]) for i, b in enumerate(blocks)}),
        sizes=MappingProxyType({b.key: int(size[i]) for i, b in enumerate(blocks)}),
        pool_bytes=int(ends.max()) if len(blocks) else 0,
        lower_bound_bytes=live_peak_bytes(blocks),
        conflicts=MappingProxyType(conflicts),
    )


def first_fit_high_water(blocks: Sequence[HostBlock]) -> int:
    """The highest byte a first-fit allocator reaches serving ``blocks`` in event order: at each
    event the blocks that died at the one before are freed (neighbours coalesce), then the blocks
    born at it are allocated at the lowest offset with room, in key order."""
    if not blocks:
        return 0
    born: dict[int, list[HostBlock]] = {}
    dies: dict[int, list[HostBlock]] = {}
    for b in blocks:
        born.setdefault(b.first_event, []).append(b)
        dies.setdefault(b.last_event + 1, []).append(b)
    free: list[tuple[int, int]] = []  # (offset, size), sorted, coalesced; the top is unbounded
    top = 0
    high = 0
    where: dict[int, int] = {}
    for event in range(max(b.last_event for b in blocks) + 2):
        for b in dies.get(event, ()):
            start, size = where.pop(b.key), _aligned(b.nbytes)
            i = bisect.bisect_left(free, (start, 0))
            if i < len(free) and start + size == free[i][0]:
                size += free.pop(i)[1]
            if i > 0 and free[i - 1][0] + free[i - 1][1] == start:
                start, size = free[i - 1][0], free[i - 1][1] + size
                free.pop(i - 1)
                i -= 1
            if start + size == top:
                top = start  # the block at the top gives its bytes back to the unbounded rest
            else:
                free.insert(i, (start, size))
        for b in sorted(born.get(event, ()), key=lambda b: b.key):
            size = _aligned(b.nbytes)
            for i, (start, room) in enumerate(free):
                if room >= size:
                    free[i : i + 1] = [(start + size, room - size)] if room > size else []
                    where[b.key] = start
                    break
            else:
                where[b.key] = top
                top += size
                high = max(high, top)
    return high


def host_pool_of(trace: Trace, swapped: Collection[int]) -> PoolLayout | None:
    """The pool layout of the host copies of the ``swapped`` keys, from the lifetimes in their
    profile ``trace`` (a duplicate shares its first pack's copy); ``None`` when there is none.

    Example:
        >>> from cswap.profile.trace import TensorRecord
        >>> records = tuple(TensorRecord(key=k, shape=(16,), dtype="float32", nbytes=64, sparsity=0.0, pack_at_s=k,
        ...                              unpack_at_s=10.0) for k in range(3))
        >>> host_pool_of(Trace(tensors=records), swapped={0, 2}).pool_bytes
        128
    """
    duplicates = {int(k) for k in (trace.meta.get("duplicates") or {})}
    timeline = lifetimes_from_trace(trace)
    blocks = [
        HostBlock(record.key, record.nbytes, lifetime.pack, lifetime.free)
        for record, lifetime in zip(trace.tensors, timeline.lifetimes, strict=True)
        if lifetime is not None and record.key in swapped and record.key not in duplicates
    ]
    return place_blocks(blocks) if blocks else None
