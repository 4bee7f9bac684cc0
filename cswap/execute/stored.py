"""What the executor holds: the data behind each saved tensor's handle, and its counters.

A :class:`Handle` is what autograd keeps for one saved slot; several handles share one
:class:`Stored` entry when the same storage and view is saved twice. A :class:`Stored` entry holds
the tensor itself (``keep``), its host copy (``swap``), or its compressed buffers (``zvc-swap``,
``zvc-keep``), and when it dies it posts what it held to the executor's release queue, so that no
lock is ever taken from a finaliser. :class:`Counters` are the executor's running totals, and
:class:`PlainStorage` a storage as plain PyTorch holds it (what a fraction's first profile counts).

Example:
    >>> import collections
    >>> from cswap.execute.layout import Layout
    >>> from cswap.planner.plan import Action, Decision
    >>> released = collections.deque()
    >>> decision = Decision(key=7, shape=(4,), dtype="float32", nbytes=16, sparsity=0.0, action=Action.KEEP, reason="kept")
    >>> entry = Stored(7, decision, Layout.of(torch.zeros(4)), released)
    >>> entry.held_bytes = 16
    >>> del entry
    >>> released.popleft()
    (7, None, 16, 0, None, 0, None)
"""

from __future__ import annotations

import collections
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from cswap.codecs import Unsized
from cswap.codecs.format import Packed
from cswap.execute.arena import ArenaBlock, PoolSlot
from cswap.execute.layout import Layout
from cswap.planner.plan import Action, Decision

__all__ = ["Counters", "Handle", "Stored"]


@dataclass
class Counters:
    """What the executor did, cumulative; :class:`cswap.stats.RuntimeStats` is the public snapshot.

    Attributes are documented on :class:`cswap.runtime.RuntimeStats`, but for the host-memory
    ones, which it does not report yet:

    Attributes:
        host_bytes: host bytes holding saved tensors now: raw host copies (``swap``, and
            ``host-zvc-swap`` until its compression is collected) and compressed buffers
            (``zvc-swap``, ``host-zvc-swap``), whatever memory they are in (arena, pool slot, pageable).
        peak_host_bytes: the most ``host_bytes`` reached (raw copy and compressed buffers of one
            ``host-zvc-swap`` tensor count together for the moment both are held).
        iteration_peak_host_bytes: the same since the current iteration began.
        host_compressed_tensors: ``host-zvc-swap`` tensors whose host copy was replaced by its compression.
        host_compressed_input_bytes, host_compressed_bytes: their raw and compressed bytes.
    """

    packed_tensors: int = 0
    deduplicated_tensors: int = 0
    never_moved_tensors: int = 0
    unknown_keys: int = 0
    actions: dict[str, int] = field(default_factory=lambda: {a.value: 0 for a in Action})
    kept_bytes: int = 0
    offloaded_bytes: int = 0
    transferred_bytes: int = 0
    compressed_input_bytes: int = 0
    compressed_bytes: int = 0
    resident_bytes: int = 0
    peak_resident_bytes: int = 0
    epoch_peak_resident_bytes: int = 0
    iteration_peak_resident_bytes: int = 0
    pack_s: float = 0.0
    unpack_s: float = 0.0
    unpacks: int = 0
    prefetches: int = 0
    prefetch_hits: int = 0
    budget_fallbacks: int = 0
    budget_waits: int = 0
    evicted_tensors: int = 0
    budget_evictions: int = 0
    outgrown_tensors: int = 0
    recomputed_bytes: int = 0
    host_bytes: int = 0
    peak_host_bytes: int = 0
    iteration_peak_host_bytes: int = 0
    host_compressed_tensors: int = 0
    host_compressed_input_bytes: int = 0
    host_compressed_bytes: int = 0

    def add_resident(self, nbytes: int) -> None:
        """Account ``nbytes`` more (or, negative, fewer) resident bytes and track the peaks."""
        self.resident_bytes += nbytes
        if self.resident_bytes > self.peak_resident_bytes:
            self.peak_resident_bytes = self.resident_bytes
        if self.resident_bytes > self.epoch_peak_resident_bytes:
            self.epoch_peak_resident_bytes = self.resident_bytes
        if self.resident_bytes > self.iteration_peak_resident_bytes:
            self.iteration_peak_resident_bytes = self.resident_bytes

    def add_host(self, nbytes: int) -> None:
        """Account ``nbytes`` more (or, negative, fewer) host bytes holding saved tensors and track the peak."""
        self.host_bytes += nbytes
        if self.host_bytes > self.peak_host_bytes:
            self.peak_host_bytes = self.host_bytes
        if self.host_bytes > self.iteration_peak_host_bytes:
            self.iteration_peak_host_bytes = self.host_bytes


class Stored:
    """The data behind one or more handles (more than one when deduplicated).

    On death it posts its arena block and held bytes to the executor's release queue, which the
    executor drains at its next hook call (so no lock is ever taken from a finaliser).
    """

    __slots__ = (
        "key",
        "action",
        "decision",
        "layout",
        "tensor",
        "packed",
        "host",
        "block",
        "held_bytes",
        "ready",
        "prefetched",
        "prefetched_bytes",
        "last_out",
        "held_out",
        "handles",
        "unpacks",
        "unpacked",
        "decompress_launch",
        "storage_ref",
        "unsized",
        "source",
        "owner",
        "dedupe_key",
        "compressing",
        "host_nbytes",
        "host_reserved",
        "plain",
        "_sink",
        "__weakref__",
    )

    def __init__(self, key: int, decision: Decision, layout: Layout, sink: collections.deque[Any]) -> None:
        self.key = key
        self.decision = decision
        self.action = decision.action
        self.layout = layout
        self.tensor: torch.Tensor | None = None
        self.packed: Packed | None = None
        self.host: torch.Tensor | None = None
        self.block: ArenaBlock | PoolSlot | None = None
        self.held_bytes = 0
        self.ready: Any = None
        self.prefetched: tuple[torch.Tensor, Any] | None = None
        self.prefetched_bytes = 0
        self.last_out: weakref.ref[torch.Tensor] | None = None
        # The rebuilt tensor, held while handles sharing this entry have yet to read it (backward
        # asks for a deduplicated tensor once per handle, often with the first copy freed between).
        self.held_out: torch.Tensor | None = None
        self.handles = 1  # handles that refer to this entry
        self.unpacks = 0  # unpacks served from it
        self.unpacked = False
        self.decompress_launch: Any = None
        # The stored tensor's storage: deduplication keys on the storage's address, and a new
        # storage may take a dead one's address, so a match must be this very storage.
        self.storage_ref: weakref.ref[torch.UntypedStorage] | None = None
        self.unsized: Unsized | None = None  # compressed, its size not read back yet
        self.source: torch.Tensor | None = None  # what it was compressed from, until then
        self.owner: Stored | None = None  # the entry counting the storage this one keeps too
        self.dedupe_key: tuple[Any, ...] | None = None  # the executor's key for this stored view
        self.compressing: Any = None  # host-zvc-swap: the worker's future, until collected
        self.host_nbytes = 0  # host bytes it holds (a host copy or compressed buffers)
        self.host_reserved = 0  # of those, set aside for a host compression not collected yet
        # the storage plain PyTorch would hold for it, counted under a provisional budget (IterationState.budget_bytes)
        self.plain: PlainStorage | None = None
        self._sink = sink

    def __del__(self) -> None:
        try:
            self._sink.append((self.key, self.block, self.held_bytes + self.prefetched_bytes, self.prefetched_bytes, self.dedupe_key,
                               self.host_nbytes, self.plain))
        except Exception:  # interpreter shutdown
            pass


class PlainStorage:
    """A storage as plain PyTorch holds it for the saved views that reference it: its bytes count once
    (what keeping the first view holds, as :class:`~cswap.planner.problem.SharedStorage` counts
    them: all of the storage for a slice of an activation) until the last of those views' entries dies.

    Attributes:
        storage_id: the storage's address (``storage._cdata``), the executor's key for it.
        nbytes: the bytes counted: what keeping the first saved view holds.
        entries: the live entries that reference it.
        storage_ref: the storage, so that a new storage at a dead one's address is not taken for it.
    """

    __slots__ = ("entries", "nbytes", "storage_id", "storage_ref")

    def __init__(self, storage_id: int, nbytes: int, storage: torch.UntypedStorage) -> None:
        self.storage_id = storage_id
        self.nbytes = nbytes
        self.entries = 1
        self.storage_ref = weakref.ref(storage)

    def holds(self, storage: torch.UntypedStorage, nbytes: int) -> bool:
        """Whether a view of ``nbytes`` of ``storage`` is counted here already: this very storage,
        alive, and counted at no fewer bytes."""
        return self.entries > 0 and self.storage_ref() is storage and nbytes <= self.nbytes


class Handle:
    """What autograd holds for one saved slot: the key and the stored data (or, for a tensor never moved, itself)."""

    __slots__ = ("key", "stored", "tensor")

    def __init__(self, key: int, stored: Stored | None, tensor: torch.Tensor | None = None) -> None:
        self.key = key
        self.stored = stored
        self.tensor = tensor
