"""Lifetimes of saved tensors over one iteration's events, and the resident-bytes timeline of a plan.

An iteration is a sequence of **events**: first one per pack, in pack order (forward), then one per
first unpack, in unpack order (backward). A saved tensor's :class:`Lifetime` says at which event it
is packed, at which it is first unpacked (``None``: backward never asks for it) and the last event
at which its storage is alive. A plan decides, per tensor, which bytes it holds over which events;
:func:`resident_bytes` adds them up into the timeline the memory budget bounds.

:func:`lifetimes_from_trace` reads the orders from a :class:`~cswap.profile.trace.Trace`: pack order from
``pack_at_s``, unpack order from the records' ``unpack_order`` or else ``unpack_at_s`` (ties in
reverse pack order, as backward runs), the free point from ``free_order`` or else right after the
first unpack.

Example:
    >>> events = lifetimes_from_orders(pack_order=[0, 1], unpack_order=[1, 0])
    >>> events.lifetimes
    (Lifetime(pack=0, unpack=3, free=3), Lifetime(pack=1, unpack=2, free=2))
    >>> resident_bytes(events.event_count, [(0, 3, 100), (1, 2, 50)]).tolist()
    [100, 150, 150, 100]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from cswap.profile.trace import Trace

__all__ = ["EventTimeline", "Lifetime", "lifetimes_from_orders", "lifetimes_from_trace", "resident_bytes"]


@dataclass(frozen=True)
class Lifetime:
    """When one saved tensor lives, in event indices.

    Attributes:
        pack: the event of its pack (forward).
        unpack: the event of its first unpack (backward), or ``None``.
        free: the last event at which its storage is alive (``>= unpack``).
    """

    pack: int
    unpack: int | None
    free: int

    def __post_init__(self) -> None:
        if self.pack < 0 or self.free < self.pack or (self.unpack is not None and not self.pack < self.unpack <= self.free):
            raise ValueError(f"inconsistent lifetime {self}: need 0 <= pack < unpack <= free")


@dataclass(frozen=True)
class EventTimeline:
    """The events of one iteration and the lifetime of each tensor over them.

    Attributes:
        lifetimes: per tensor, in the order they were given (``None`` for tensors left out).
        forward_events: events ``0 .. forward_events - 1`` are packs; the rest are unpacks.
        event_count: number of events.
    """

    lifetimes: tuple[Lifetime | None, ...]
    forward_events: int
    event_count: int


def lifetimes_from_orders(
    pack_order: Sequence[int],
    unpack_order: Sequence[int | None],
    free_order: Sequence[int | None] | None = None,
) -> EventTimeline:
    """Lifetimes from each tensor's rank among packs, among first unpacks, and its free point.

    Args:
        pack_order: per tensor, its rank among packs (a permutation of ``0 .. n-1``).
        unpack_order: per tensor, its rank among first unpacks (ranks of the unpacked tensors are a
            permutation of ``0 .. m-1``), or ``None`` when backward never unpacks it.
        free_order: per tensor, the unpack rank after which its storage dies (default: its own
            unpack rank; the last event for one never unpacked). It may not precede its unpack.

    Raises:
        ValueError: orders that are not permutations, or a free point before the unpack.
    """
    count = len(pack_order)
    if len(unpack_order) != count or (free_order is not None and len(free_order) != count):
        raise ValueError(
            f"need one pack, unpack and free order per tensor: {count}, {len(unpack_order)}, {free_order and len(free_order)}"
        )
    if sorted(pack_order) != list(range(count)):
        raise ValueError(f"pack_order must be a permutation of 0..{count - 1}, got {list(pack_order)}")
    unpacked = sorted(u for u in unpack_order if u is not None)
    if unpacked != list(range(len(unpacked))):
        raise ValueError(f"the unpack orders must be a permutation of 0..{len(unpacked) - 1}, got {unpacked}")
    event_count = count + len(unpacked)
    lifetimes = []
    for i in range(count):
        unpack = unpack_order[i]
        free = None if free_order is None else free_order[i]
        if unpack is None:
            last = event_count - 1 if free is None else count + free
            lifetimes.append(Lifetime(pack=pack_order[i], unpack=None, free=last))
            continue
        if free is not None and free < unpack:
            raise ValueError(f"tensor {i} is freed at unpack rank {free}, before its own unpack at rank {unpack}")
        free = unpack if free is None else min(free, len(unpacked) - 1)
        lifetimes.append(Lifetime(pack=pack_order[i], unpack=count + unpack, free=count + free))
    return EventTimeline(lifetimes=tuple(lifetimes), forward_events=count, event_count=event_count)


def _ranks(keys: Sequence[tuple[float, ...]]) -> list[int]:
    ranks = [0] * len(keys)
    for rank, i in enumerate(sorted(range(len(keys)), key=lambda i: keys[i])):
        ranks[i] = rank
    return ranks


def lifetimes_from_trace(trace: Trace, include: Sequence[bool] | None = None) -> EventTimeline:
    """The event timeline of ``trace``'s records (default: the offloadable ones; others get ``None``).

    Example:
        >>> from cswap.profile.trace import TensorRecord
        >>> recs = tuple(TensorRecord(key=k, shape=(4,), dtype="float32", nbytes=16, sparsity=0.0, pack_at_s=k,
        ...                           unpack_at_s=10.0) for k in range(3))
        >>> [lt.unpack for lt in lifetimes_from_trace(Trace(tensors=recs)).lifetimes]   # ties: reverse pack order
        [5, 4, 3]
    """
    records = trace.tensors
    include = [r.offloadable for r in records] if include is None else list(include)
    chosen = [i for i, keep in enumerate(include) if keep]
    pack = _ranks([(records[i].pack_at_s, i) for i in chosen])
    pack_of = dict(zip(chosen, pack, strict=True))
    unpacked = [i for i in chosen if records[i].unpack_at_s is not None or records[i].unpack_order is not None]
    given = all(records[i].unpack_order is not None for i in unpacked)

    def unpack_key(i: int) -> tuple[float, ...]:
        if given:
            return (float(records[i].unpack_order),)
        return (records[i].unpack_at_s if records[i].unpack_at_s is not None else float("inf"), -pack_of[i])

    unpack_rank = dict(zip(unpacked, _ranks([unpack_key(i) for i in unpacked]), strict=True))
    free_given = [records[i].free_order for i in chosen]
    events = lifetimes_from_orders(
        pack,
        [unpack_rank.get(i) for i in chosen],
        free_given if any(f is not None for f in free_given) else None,
    )
    lifetimes: list[Lifetime | None] = [None] * len(records)
    for position, i in enumerate(chosen):
        lifetimes[i] = events.lifetimes[position]
    return EventTimeline(lifetimes=tuple(lifetimes), forward_events=events.forward_events, event_count=events.event_count)


def resident_bytes(event_count: int, segments: Iterable[tuple[int, int, int]]) -> np.ndarray:
    """Bytes resident at each event, from ``(first_event, last_event, nbytes)`` holds (both ends included).

    Returns:
        An int64 array of ``event_count`` entries.

    Example:
        >>> resident_bytes(4, [(1, 2, 8), (2, 3, 1)]).tolist()
        [0, 8, 9, 1]
    """
    delta = np.zeros(event_count + 1, dtype=np.int64)
    for start, end, nbytes in segments:
        if not 0 <= start <= end < event_count:
            raise ValueError(f"hold ({start}, {end}) is outside events 0..{event_count - 1}")
        delta[start] += nbytes
        delta[end + 1] -= nbytes
    return np.cumsum(delta[:-1])
