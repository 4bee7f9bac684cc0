# Longer than the ~500-line guide on purpose: pack, unpack, prefetch and the release queue share one
# lock and one set of counters, and the locking discipline is easiest to check when it is in one file.
"""The executor: ``saved_tensors_hooks`` that keep, swap, compress-then-swap or compress-and-keep each tensor.

Every tensor autograd saves inside ``rt.iteration()`` passes through :meth:`Executor.pack`, which
returns a :class:`_Handle`; backward gives the handle back to :meth:`Executor.unpack` for the data.
How the facts of saved-tensor hooks are handled:

* **Repeated unpack** (``retain_graph``, ``grad_fn._saved_*``) rebuilds the same values each time
  from what the handle holds; nothing is freed in unpack. Buffers are released when the last
  handle referring to them dies (Python reference counting), in any order.
* **The same storage and view packed twice** (``x * x``) is stored once: handles are deduplicated
  by storage, offset, shape, stride, dtype and version.
* **Views** (transposes, slices, ``expand`` broadcasts) are stored compactly and rebuilt with the
  original strides (:class:`cswap.layout.Layout`).
* **Parameters and buffers** (of ``model=``, leaves that require grad, and their views) and tensors
  on another device, of a tensor subclass or of a non-strided layout are never moved.
* **Thread-locality and nesting** come from ``saved_tensors_hooks`` itself: the hooks apply only
  in the thread that entered the iteration (and autograd's engine threads working for it), and an
  inner ``saved_tensors_hooks`` (``save_on_cpu``, non-reentrant checkpoint) wins inside it.

On CUDA, copies and (de)compression run on one side stream: it waits for the compute stream
(captured before entering the side stream's context) before reading a tensor, the source is
protected with ``record_stream`` until its copy finished, and the compute stream waits on an event
before it uses a rebuilt tensor. Host copies go to a pinned :class:`~cswap.arena.HostArena` that is
grown only between iterations. During backward, each unpack prefetches the next offloaded tensors
in the profiled unpack order, up to ``prefetch_bytes`` fetched ahead. On CPU the same code runs
without streams: swapping copies into the (unpinned) arena, compression uses the ``cpu`` backend.

On a GPU the host never waits for a compression in pack: it is written into a workspace sized by
numel (:func:`cswap.codecs.encode_unsized`) and its size is read back asynchronously; a later hook
that finds it arrived cuts a ``zvc-keep`` tensor to its exact bytes or copies exactly the
compressed bytes of a ``zvc-swap`` one to the host. Only the budget's back-pressure (the oldest copy
or compression), an unpack that needs the data and a stats call wait for one (``defer_sizes``;
profiling iterations, which read their trace back anyway, encode exactly).

The executor decides nothing: for every pack it states the facts (key, shape, dtype, compact bytes,
whether the tensor may move at all, whether its data is already stored) and carries out the
:class:`~cswap.plan.Decision` that :meth:`cswap.plan.Plan.resolve` returns, launch configs included.
Compression is the codecs' one encoding step (:func:`cswap.codecs.encode`: exact integer narrowing,
then ZVC) and its inverse (:func:`cswap.codecs.decode`).

Resident bytes (:attr:`Counters.resident_bytes`) count what the saved-tensor machinery holds on the
device: kept tensors at their compact size, compress-keep tensors at their compressed size,
compressions whose size is not read back yet at their workspace plus their source, tensors a
recompute region's recomputation saved for backward until their storage is freed
(:meth:`Executor.hold_rebuilt`), sources of device-to-host copies not yet finished (GPU only; CPU
copies finish inside pack), and tensors rebuilt for backward from the moment they are fetched (or
prefetched) until their storage is freed. Two kept views of one storage count it once. Parameters
and buffers are not counted. The counts are updated at every hook call, so the peak is exact at
the moments memory grows.

Example:
    >>> import torch
    >>> from cswap.advisor import Action, Plan
    >>> executor = Executor(torch.device("cpu"), backend="cpu", prefetch_bytes=0)
    >>> it = executor.begin(Plan(policy="swap", epoch=0, default_action=Action.SWAP))
    >>> x = torch.randn(64, requires_grad=True)
    >>> with torch.autograd.graph.saved_tensors_hooks(*executor.hooks(it)):
    ...     y = (x.exp() * 2).sum()
    >>> y.backward(); executor.end(it)
    >>> torch.equal(x.grad, 2 * x.exp().detach()), executor.counters.actions["swap"]
    (True, 1)
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from cswap.arena import ArenaBlock, HostArena, aligned
from cswap.codecs import NarrowingMissed, Unsized, decode, encode, encode_unsized, value_range
from cswap.codecs.format import Packed
from cswap.layout import Layout
from cswap.pending import ReadbackSlots
from cswap.plan import Action, Decision, Plan
from cswap.profiler import Profiler

__all__ = ["Counters", "Executor", "IterationState"]

_BITS_BY_ITEMSIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


@contextmanager
def _torch_threads_kept() -> Iterator[None]:
    """Restore torch's intra-op thread count after a codec call.

    Numba's OpenMP threading layer sets the calling thread's OpenMP thread count, which is also
    torch's: left alone, a compression would silently change how many threads (and so in which
    order) torch's kernels reduce.
    """
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _storage_id(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


@dataclass
class Counters:
    """What the executor did, cumulative; :class:`cswap.runtime.RuntimeStats` is the public snapshot.

    Attributes are documented on :class:`cswap.runtime.RuntimeStats`.
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

    def add_resident(self, nbytes: int) -> None:
        """Account ``nbytes`` more (or, negative, fewer) resident bytes and track the peaks."""
        self.resident_bytes += nbytes
        if self.resident_bytes > self.peak_resident_bytes:
            self.peak_resident_bytes = self.resident_bytes
        if self.resident_bytes > self.epoch_peak_resident_bytes:
            self.epoch_peak_resident_bytes = self.resident_bytes
        if self.resident_bytes > self.iteration_peak_resident_bytes:
            self.iteration_peak_resident_bytes = self.resident_bytes


class _Stored:
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
        "unpacked",
        "decompress_launch",
        "storage_ref",
        "unsized",
        "source",
        "owner",
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
        self.block: ArenaBlock | None = None
        self.held_bytes = 0
        self.ready: Any = None
        self.prefetched: tuple[torch.Tensor, Any] | None = None
        self.prefetched_bytes = 0
        self.last_out: weakref.ref[torch.Tensor] | None = None
        self.unpacked = False
        self.decompress_launch: Any = None
        self.storage_ref: StorageWeakRef | None = None
        self.unsized: Unsized | None = None  # compressed, its size not read back yet
        self.source: torch.Tensor | None = None  # what it was compressed from, until then
        self.owner: _Stored | None = None  # the entry counting the storage this one keeps too
        self._sink = sink

    def __del__(self) -> None:
        try:
            self._sink.append((self.key, self.block, self.held_bytes + self.prefetched_bytes, self.prefetched_bytes))
        except Exception:  # interpreter shutdown
            pass


class _Handle:
    """What autograd holds for one saved slot: the key and the stored data (or, for a tensor never moved, itself)."""

    __slots__ = ("key", "stored", "tensor")

    def __init__(self, key: int, stored: _Stored | None, tensor: torch.Tensor | None = None) -> None:
        self.key = key
        self.stored = stored
        self.tensor = tensor


class IterationState:
    """Per-iteration state of the hooks.

    Args:
        plan: the plan that decides every pack (:meth:`Plan.resolve`).
        profiler: records the iteration when it is a profiling one.
        protected: storage ids of the model's parameters and buffers.
    """

    def __init__(self, plan: Plan, profiler: Profiler | None, protected: frozenset[int]) -> None:
        self.plan = plan
        self.profiler = profiler
        self.protected = protected
        self.next_key = 0
        self.stored_by_key: dict[int, weakref.ref[_Stored]] = {}
        self.unpack_position = {key: i for i, key in enumerate(plan.unpack_order)}
        self.prefetch_cursor = 0


class Executor:
    """Applies a plan to saved tensors.

    Args:
        device: the training device (``cuda:N`` with an index, or ``cpu``).
        backend: the ZVC codec backend.
        prefetch_bytes: the most bytes of offloaded tensors fetched ahead of their unpack.
        arena_slack: extra host-arena room over the need, as a fraction.
        defer_sizes: compress without waiting for the size (module docstring); default: on a GPU.
    """

    def __init__(self, device: torch.device, backend: str, prefetch_bytes: int, arena_slack: float = 0.25,
                 defer_sizes: bool | None = None) -> None:
        self.device = device
        self.backend = backend
        self.prefetch_bytes = prefetch_bytes
        self.arena_slack = arena_slack
        self.cuda = device.type == "cuda"
        self.side_stream = torch.cuda.Stream(device) if self.cuda else None
        self.arena = HostArena(pin_memory=self.cuda)
        self.counters = Counters()
        self._lock = threading.RLock()
        self._dedupe: weakref.WeakValueDictionary[tuple[Any, ...], _Stored] = weakref.WeakValueDictionary()
        # storage id -> the kept entry counting that storage's bytes
        self._kept_storages: weakref.WeakValueDictionary[int, _Stored] = weakref.WeakValueDictionary()
        self._released: collections.deque[tuple[int, ArenaBlock | None, int, int]] = collections.deque()
        self._inflight: list[tuple[Any, int]] = []
        self._handed_out: list[tuple[StorageWeakRef, int, int]] = []
        self._prefetched_bytes = 0
        # Compressions whose size is read back later (module docstring), oldest first.
        self.defer_sizes = self.cuda if defer_sizes is None else defer_sizes
        self._unsized: collections.deque[_Stored] = collections.deque()
        self._rebuilt: dict[int, tuple[StorageWeakRef, int]] = {}  # storage id -> (ref, bytes)
        self._slots = ReadbackSlots(pin_memory=self.cuda) if self.defer_sizes else None

    # ------------------------------------------------------------------ iterations

    def begin(
        self,
        plan: Plan,
        profiler: Profiler | None = None,
        model: torch.nn.Module | None = None,
    ) -> IterationState:
        """Prepare an iteration: grow the host arena to the plan's need (never during one), return its state.

        Args:
            plan: the plan that decides every pack.
            profiler: set for a profiling iteration.
            model: the module whose parameters and buffers are protected.
        """
        with self._lock:
            self._drain()
            observed = self.arena.peak_used_bytes + self.arena.missed_bytes
            need = max(plan.host_bytes, observed)
            if need:
                self.arena.reserve(int(need * (1.0 + self.arena_slack)))
            self.arena.reset_peak()
            self.counters.iteration_peak_resident_bytes = self.counters.resident_bytes
        protected: frozenset[int] = frozenset()
        if model is not None:
            protected = frozenset(_storage_id(t) for t in (*model.parameters(), *model.buffers()))
        return IterationState(plan, profiler, protected)

    def end(self, it: IterationState) -> None:
        """Finish an iteration (the state stops recording; later unpacks still work)."""
        with self._lock:
            self._drain(it.profiler)
            it.profiler = None

    def hooks(self, it: IterationState) -> tuple[Callable[[torch.Tensor], _Handle], Callable[[_Handle], torch.Tensor]]:
        """``(pack, unpack)`` for ``torch.autograd.graph.saved_tensors_hooks``."""
        return functools.partial(self.pack, it), functools.partial(self.unpack, it)

    def snapshot(self) -> Counters:
        """A copy of the counters, after applying pending releases."""
        with self._lock:
            while self._unsized:  # exact counts: waiting is fine outside the hooks
                self._finish_unsized(self._unsized.popleft())
            self._drain()
            return replace(self.counters, actions=dict(self.counters.actions))

    def hold_rebuilt(self, it: IterationState, tensor: torch.Tensor) -> None:
        """Count the storage of ``tensor``, which a recompute region's recomputation saved for backward,
        as resident until it is freed (torch's checkpoint holds it, not these hooks).

        A parameter's or buffer's storage, or one already counted, is not counted again.
        """
        storage = tensor.untyped_storage()
        sid = storage._cdata
        if sid in it.protected:
            return
        with self._lock:
            known = self._rebuilt.get(sid)
            if known is not None and not known[0].expired():
                return
            nbytes = storage.nbytes()
            self._rebuilt[sid] = (StorageWeakRef(storage), nbytes)
            self.counters.add_resident(nbytes)

    def release_rebuilt(self) -> None:
        """Stop counting the rebuilt storages still alive: the iteration is over, and what holds them
        now is not its backward."""
        with self._lock:
            self.counters.resident_bytes -= sum(nbytes for _, nbytes in self._rebuilt.values())
            self._rebuilt.clear()

    def count_recomputed(self, tensors: int) -> None:
        """Count ``tensors`` saved tensors that recompute regions dropped and rebuilt (never packed here)."""
        with self._lock:
            self.counters.actions[Action.RECOMPUTE.value] += tensors

    def evict_kept(self, it: IterationState) -> int:
        """Swap every tensor of ``it`` that is kept on the device and not yet unpacked to host memory.

        Capuchin's passive mode (:class:`cswap.passive.SwapOnOutOfMemory`) calls it when the
        device ran out of memory. The copies are synchronous: the device is full, and the freed
        memory is what the op that failed needs next. An evicted tensor is then counted as
        swapped (``actions``, offloaded and transferred bytes) and in ``evicted_tensors``.

        Returns:
            how many tensors it moved (their memory is freed unless something else holds them).
        """
        moved = 0
        with self._lock:
            counters = self.counters
            for ref in list(it.stored_by_key.values()):
                stored = ref()
                if stored is None or stored.action is not Action.KEEP or stored.unpacked or stored.tensor is None:
                    continue
                layout = stored.layout
                try:
                    flat = layout.compact(stored.tensor)
                except torch.OutOfMemoryError:  # a strided view needs a gathered copy: no room for it
                    continue
                self._copy_to_host(stored, flat, non_blocking=False)
                stored.tensor, stored.action = None, Action.SWAP
                counters.add_resident(-stored.held_bytes)
                stored.held_bytes = 0
                counters.kept_bytes -= layout.nbytes
                counters.offloaded_bytes += layout.nbytes
                counters.transferred_bytes += layout.nbytes
                counters.actions[Action.KEEP.value] -= 1
                counters.actions[Action.SWAP.value] += 1
                counters.evicted_tensors += 1
                moved += 1
        return moved

    def new_epoch(self) -> None:
        """Start a new per-epoch peak."""
        with self._lock:
            self.counters.epoch_peak_resident_bytes = self.counters.resident_bytes

    # ------------------------------------------------------------------ bookkeeping

    def _drain(self, profiler: Profiler | None = None) -> None:
        """Apply releases posted by dead handles, finished copies and freed rebuilt tensors.

        A profiling iteration's ``profiler`` learns which keys' stored data or rebuilt tensors
        were seen dead here (their lifetimes end at the last unpack before this hook).
        """
        counters = self.counters
        while self._unsized and self._unsized[0].unsized.ready():  # type: ignore[union-attr]
            self._finish_unsized(self._unsized.popleft())
        freed: list[int] = []
        while self._released:
            key, block, held, prefetched = self._released.popleft()
            if block is not None:
                self.arena.free(block)
            counters.resident_bytes -= held
            self._prefetched_bytes -= prefetched
            freed.append(key)
        if self._inflight:
            pending = []
            for event, nbytes in self._inflight:
                if event.query():
                    counters.resident_bytes -= nbytes
                else:
                    pending.append((event, nbytes))
            self._inflight = pending
        if self._handed_out:
            alive = []
            for ref, nbytes, key in self._handed_out:
                if ref.expired():
                    counters.resident_bytes -= nbytes
                    freed.append(key)
                else:
                    alive.append((ref, nbytes, key))
            self._handed_out = alive
        if self._rebuilt:
            for sid, (ref, nbytes) in list(self._rebuilt.items()):
                if ref.expired():
                    counters.resident_bytes -= nbytes
                    del self._rebuilt[sid]
        if profiler is not None and freed:
            profiler.record_free(freed)

    def _never_move(self, it: IterationState, t: torch.Tensor) -> str | None:
        """Why ``t`` must stay where it is, or ``None``."""
        if type(t) not in _PLAIN_TYPES:
            return f"tensor subclass {type(t).__name__}: kept"
        if t.layout != torch.strided:
            return f"layout {t.layout}: kept"
        if t.device != self.device:
            return f"on {t.device}, not the runtime's {self.device}: kept"
        if t.numel() == 0:
            return "empty tensor: kept"
        if t.is_leaf and t.requires_grad:
            return "leaf tensor that requires grad (a parameter): never offloaded"
        base = t._base
        if base is not None and base.is_leaf and base.requires_grad:
            return "view of a leaf tensor that requires grad (a parameter): never offloaded"
        if it.protected and _storage_id(t) in it.protected:
            return "parameter or buffer of the model: never offloaded"
        return None

    def _host(self, nbytes: int) -> tuple[torch.Tensor, ArenaBlock | None]:
        """``nbytes`` of host memory: an arena block, or fresh pageable memory when the arena is full."""
        block = self.arena.alloc(nbytes)
        if block is not None:
            return block.view, block
        return torch.empty(nbytes, dtype=torch.uint8), None

    # ------------------------------------------------------------------ pack

    def pack(self, it: IterationState, tensor: torch.Tensor) -> _Handle:
        """The pack hook: store ``tensor`` as the plan says and return its handle."""
        started = time.perf_counter()
        profiler = it.profiler
        stamp = profiler.stamp() if profiler is not None else None
        with self._lock:
            self._drain(profiler)
            key = it.next_key
            it.next_key += 1
            handle, record = self._pack(it, key, tensor, profiler)
            counters = self.counters
            counters.packed_tensors += 1
            counters.pack_s += time.perf_counter() - started
        if profiler is not None and record is not None:
            profiler.record_pack(**record, start=stamp, end=profiler.stamp())
        return handle

    def _pack(self, it: IterationState, key: int, tensor: torch.Tensor, profiler: Profiler | None) -> tuple[_Handle, dict[str, Any] | None]:
        counters = self.counters
        plan = it.plan
        reason = self._never_move(it, tensor)
        if reason is not None:
            # The plan's answer to a tensor that may not move is always to keep it where it is,
            # which is done by holding the tensor itself.
            nbytes = tensor.numel() * tensor.element_size()
            plan.resolve(key, tuple(tensor.shape), tensor.dtype, nbytes, never_moved=reason)
            counters.never_moved_tensors += 1
            record = None
            if profiler is not None:
                record = dict(key=key, shape=tuple(tensor.shape), dtype=_dtype_name(tensor.dtype), nbytes=nbytes, numel=tensor.numel(),
                              zeros=0, producer=profiler.producer(tensor), offloadable=False, reason=reason, module=profiler.module(tensor))
            return _Handle(key, None, tensor.detach()), record
        layout = Layout.of(tensor)
        dedupe_key = (_storage_id(tensor), tensor.storage_offset(), layout.shape, layout.stride, tensor.dtype, tensor._version)
        stored = self._dedupe.get(dedupe_key)
        producer = profiler.producer(tensor) if profiler is not None else ""
        zeros: Any = 0
        encoding_facts: Any = None
        if stored is not None:
            plan.resolve(key, layout.shape, layout.dtype, layout.nbytes, duplicate_of=stored.decision)
            counters.deduplicated_tensors += 1
            if profiler is not None:
                profiler.record_duplicate(key, stored.key)
        else:
            owner = self._kept_storages.get(dedupe_key[0])
            if owner is not None and (owner.action is not Action.KEEP or owner.tensor is None or owner.held_bytes < layout.nbytes):
                owner = None  # evicted since, or it counts a smaller view of the storage than this one
            decision = plan.resolve(key, layout.shape, layout.dtype, layout.nbytes, resident_bytes=counters.resident_bytes,
                                    shares_kept=owner is not None)
            if decision.budget_fallback:
                counters.budget_fallbacks += 1
            elif not decision.planned and plan.decisions:
                counters.unknown_keys += 1
            stored, zeros = self._store(key, tensor.detach(), layout, decision, count_zeros=profiler is not None, owner=owner)
            self._wait_for_budget(plan.budget_bytes)
            if profiler is not None:
                # Deferred like the zero count: what the encoding needs to predict its size.
                encoding_facts = value_range(tensor.detach())
            self._dedupe[dedupe_key] = stored
            counters.actions[stored.action.value] += 1
        it.stored_by_key[key] = weakref.ref(stored)
        record = None
        if profiler is not None:
            record = dict(key=key, shape=layout.shape, dtype=_dtype_name(layout.dtype), nbytes=layout.nbytes, numel=layout.numel,
                          zeros=zeros, producer=producer, offloadable=True, reason="", value_range=encoding_facts,
                          module=profiler.module(tensor))
        return _Handle(key, stored), record

    def _store(
        self, key: int, tensor: torch.Tensor, layout: Layout, decision: Decision, count_zeros: bool, owner: _Stored | None = None
    ) -> tuple[_Stored, Any]:
        """Carry out ``decision`` on ``tensor``; returns the stored data and its zero count (when asked).

        ``owner`` is a stored entry that already keeps ``tensor``'s storage (another view of it): a
        kept ``tensor`` then holds no bytes of its own and keeps ``owner`` alive instead, so that
        the storage is counted once, for as long as either needs it.
        """
        counters = self.counters
        action = decision.action
        stored = _Stored(key, decision, layout, self._released)
        # Deduplication keys on the storage's address: holding a weak reference to the storage
        # keeps that address from being reused by a new storage while this entry lives.
        stored.storage_ref = StorageWeakRef(tensor.untyped_storage())
        zeros: Any = 0
        if action is Action.KEEP:
            stored.tensor = tensor
            counters.kept_bytes += layout.nbytes
            if owner is None:
                stored.held_bytes = layout.nbytes
                counters.add_resident(layout.nbytes)
                self._kept_storages[_storage_id(tensor)] = stored
            else:
                stored.owner = owner
            if count_zeros:
                zeros = self._zeros(layout.compact(tensor), layout)
            return stored, zeros
        flat = layout.compact(tensor)
        if count_zeros and action is Action.SWAP:
            zeros = self._zeros(flat, layout)
        compress_launch = decision.compress_launch
        stored.decompress_launch = decision.decompress_launch
        if action.compresses and self.defer_sizes and not count_zeros and not decision.raw_unless_smaller:
            self._store_unsized(stored, flat, decision)
            counters.compressed_input_bytes += layout.nbytes
            if action.offloads:
                counters.offloaded_bytes += layout.nbytes
            return stored, zeros
        with self._on_side_stream(flat):
            self._store_on_stream(stored, flat, action, compress_launch)
            event = self._side_event()
        if event is not None:
            if action.offloads:
                # The source stays resident until its copy to the host has finished.
                counters.add_resident(layout.nbytes)
                self._inflight.append((event, layout.nbytes))
            else:
                stored.ready = event
        if action is Action.ZVC_KEEP and decision.raw_unless_smaller and stored.packed.compressed_nbytes >= layout.nbytes:  # type: ignore[union-attr]
            # The decision stores it compressed only where that holds fewer bytes (known once encoded).
            if count_zeros:
                zeros = layout.numel - stored.packed.nnz  # type: ignore[union-attr]
            stored.packed, stored.ready, stored.action, stored.tensor = None, None, Action.KEEP, tensor
            stored.held_bytes = layout.nbytes
            counters.kept_bytes += layout.nbytes
            counters.add_resident(layout.nbytes)
            return stored, zeros
        if action.compresses:
            packed = stored.packed
            assert packed is not None
            counters.compressed_input_bytes += layout.nbytes
            counters.compressed_bytes += packed.compressed_nbytes
            if count_zeros:
                zeros = layout.numel - packed.nnz
        if action.offloads:
            counters.offloaded_bytes += layout.nbytes
            counters.transferred_bytes += layout.nbytes if action is Action.SWAP else stored.packed.compressed_nbytes  # type: ignore[union-attr]
        else:
            stored.held_bytes = stored.packed.compressed_nbytes  # type: ignore[union-attr]
            counters.add_resident(stored.held_bytes)
        return stored, zeros

    def _wait_for_budget(self, budget_bytes: int | None) -> None:
        """Under a budget, wait for the oldest device-to-host copies while resident bytes pass it.

        Only sources of copies in flight, and compressions whose size is not read back yet, can
        be released by waiting (GPU); an event wait blocks this thread until that copy or
        compression finished, never the whole device.
        """
        if budget_bytes is None:
            return
        counters = self.counters
        while counters.resident_bytes > budget_bytes:
            if self._inflight:
                event, nbytes = self._inflight.pop(0)
                event.synchronize()
                counters.resident_bytes -= nbytes
            elif self._unsized:
                self._finish_unsized(self._unsized.popleft())  # its bytes join the copies in flight
            else:
                return
            counters.budget_waits += 1

    def _store_unsized(self, stored: _Stored, flat: torch.Tensor, decision: Decision) -> None:
        """Compress ``flat`` without the host waiting for its size (:func:`cswap.codecs.encode_unsized`).

        The workspace and the source stay resident until :meth:`_finish_unsized`, which a later
        hook runs once the size has arrived (or the budget, an unpack or a stats call needs it).
        """
        assert self._slots is not None
        slot = self._slots.take()
        while slot is None:  # every readback slot in flight: finish the oldest compression
            self._finish_unsized(self._unsized.popleft())
            slot = self._slots.take()
        narrow = getattr(torch, decision.encoded_dtype) if decision.encoded_dtype else None
        with self._on_side_stream(flat):
            with _torch_threads_kept():
                stored.unsized = encode_unsized(flat, self.backend, decision.compress_launch, narrow, slot)
        stored.source = flat
        stored.held_bytes = stored.unsized.workspace_nbytes + stored.layout.nbytes
        self.counters.add_resident(stored.held_bytes)
        self._unsized.append(stored)

    @contextmanager
    def _on_side_stream(self, source: torch.Tensor | None = None) -> Iterator[None]:
        """Run the block on the side stream after the compute stream's work so far (GPU); ``source``
        is then protected until the side stream is done with it. On CPU the block just runs."""
        side = self.side_stream
        if side is None:
            yield
            return
        # Captured here, outside the side stream's context: inside it, current_stream() is the side stream.
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(side):
            side.wait_stream(compute)
            yield
        if source is not None:
            source.record_stream(side)

    def _side_event(self) -> Any:
        """An event recorded on the side stream now (GPU), marking the work queued there so far; ``None`` on CPU."""
        if self.side_stream is None:
            return None
        event = torch.cuda.Event()
        event.record(self.side_stream)
        return event

    def _finish_unsized(self, stored: _Stored) -> None:
        """Read back the size of ``stored``'s compression, then cut it to its exact bytes (``zvc-keep``)
        or copy exactly those bytes to the host (``zvc-swap``)."""
        unsized, source = stored.unsized, stored.source
        assert unsized is not None and source is not None and self._slots is not None
        stored.unsized = stored.source = None
        counters = self.counters
        side = self.side_stream
        with contextlib.ExitStack() as stack:
            if side is not None:
                stack.enter_context(torch.cuda.stream(side))  # after the compression, in stream order
            try:
                packed = unsized.resolve(exact=stored.action is Action.ZVC_KEEP)
            except NarrowingMissed:  # the profile's narrow width no longer holds: encode exactly
                with _torch_threads_kept():
                    packed = encode(source, backend=self.backend, launch=stored.decision.compress_launch)
            self._slots.give(unsized.counts)
            counters.compressed_bytes += packed.compressed_nbytes
            if stored.action is Action.ZVC_SWAP:
                self._copy_packed_to_host(stored, packed)
                counters.transferred_bytes += packed.compressed_nbytes
            else:
                stored.packed = packed
            event = self._side_event()
        if stored.action is Action.ZVC_KEEP:
            stored.ready = event
            counters.add_resident(packed.compressed_nbytes - stored.held_bytes)
            stored.held_bytes = packed.compressed_nbytes
            return
        # The workspace and the source are released once the copy to the host has finished.
        if event is not None:
            self._inflight.append((event, stored.held_bytes))
        else:
            counters.resident_bytes -= stored.held_bytes
        stored.held_bytes = 0

    def _store_on_stream(self, stored: _Stored, flat: torch.Tensor, action: Action, launch: Any) -> None:
        """The copies and compression of one tensor, on the current stream."""
        if action is Action.SWAP:
            self._copy_to_host(stored, flat, non_blocking=self.cuda)
            return
        with _torch_threads_kept():
            packed = encode(flat, backend=self.backend, launch=launch)
        if action is Action.ZVC_KEEP:
            stored.packed = packed
            return
        self._copy_packed_to_host(stored, packed)

    def _copy_to_host(self, stored: _Stored, flat: torch.Tensor, non_blocking: bool) -> None:
        """Copy the compact ``flat`` into a host block of ``stored`` (on the current stream)."""
        host, stored.block = self._host(stored.layout.nbytes)
        stored.host = host.view(stored.layout.dtype)
        stored.host.copy_(flat, non_blocking=non_blocking)

    def _copy_packed_to_host(self, stored: _Stored, packed: Packed) -> None:
        """Copy the three buffers of ``packed`` into one host block (on the current stream)."""
        parts = (packed.bitmap, packed.offsets, packed.values)
        sizes = [p.numel() * p.element_size() for p in parts]
        starts = [0, aligned(sizes[0]), aligned(sizes[0]) + aligned(sizes[1])]
        host, stored.block = self._host(starts[2] + sizes[2])
        views = []
        for part, start, size in zip(parts, starts, sizes):
            view = host[start : start + size].view(part.dtype)
            view.copy_(part, non_blocking=self.cuda)
            views.append(view)
        stored.packed = replace(packed, bitmap=views[0], offsets=views[1], values=views[2])

    @staticmethod
    def _zeros(flat: torch.Tensor, layout: Layout) -> Any:
        """Elements of ``flat`` whose bits are all zero (a 0-d tensor on a GPU, an int on CPU)."""
        bits_type = _BITS_BY_ITEMSIZE.get(flat.element_size())
        if bits_type is None:
            return 0
        nonzero = torch.count_nonzero(flat.view(bits_type))
        # On a GPU the count stays on the device (read back with the trace); on CPU an int now.
        return layout.numel - nonzero if flat.is_cuda else layout.numel - int(nonzero)

    # ------------------------------------------------------------------ unpack

    def unpack(self, it: IterationState, handle: _Handle) -> torch.Tensor:
        """The unpack hook: the saved tensor's values, with its shape, dtype, strides and device."""
        started = time.perf_counter()
        profiler = it.profiler
        stamp = profiler.stamp() if profiler is not None else None
        with self._lock:
            self._drain(profiler)
            stored = handle.stored
            if stored is None:
                out = handle.tensor
            elif stored.action is Action.KEEP:
                out = stored.tensor
            else:
                out = self._materialize(stored)
                if profiler is not None:
                    profiler.record_rebuilt(handle.key, out.untyped_storage().nbytes())
            if stored is not None:
                stored.unpacked = True
            # a duplicate read first stands for the key that stored the data (the plan's event)
            self._prefetch_after(it, stored.key if stored is not None else handle.key)
            counters = self.counters
            counters.unpacks += 1
            counters.unpack_s += time.perf_counter() - started
        if profiler is not None:
            profiler.record_unpack(handle.key, stamp, profiler.stamp())
        assert out is not None
        return out

    def _materialize(self, stored: _Stored) -> torch.Tensor:
        """The rebuilt tensor of an offloaded or compressed ``stored``, on the device, ready for the compute stream."""
        counters = self.counters
        if stored.prefetched is not None:
            out, event = stored.prefetched
            stored.prefetched = None
            nbytes = stored.prefetched_bytes
            # From here the rebuilt tensor is tracked as handed out, not as held by the stored data.
            self._prefetched_bytes -= nbytes
            stored.prefetched_bytes = 0
            counters.prefetch_hits += 1
        else:
            cached = stored.last_out() if stored.last_out is not None else None
            if cached is not None:
                return cached
            out, event = self._fetch(stored)
            nbytes = out.untyped_storage().nbytes()
            counters.add_resident(nbytes)
        if event is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(event)
            out.record_stream(compute)
        self._handed_out.append((StorageWeakRef(out.untyped_storage()), nbytes, stored.key))
        stored.last_out = weakref.ref(out)
        return out

    def _fetch(self, stored: _Stored) -> tuple[torch.Tensor, Any]:
        """Issue the rebuild of ``stored`` (on the side stream on a GPU); returns it and its ready event."""
        if stored.unsized is not None:  # wanted back before its size was read: read it now
            self._unsized.remove(stored)
            self._finish_unsized(stored)
        side = self.side_stream
        if side is None:
            return self._rebuild(stored), None
        with torch.cuda.stream(side):
            if stored.ready is not None:
                side.wait_event(stored.ready)
            out = self._rebuild(stored)
            event = torch.cuda.Event()
            event.record(side)
        return out, event

    def _rebuild(self, stored: _Stored) -> torch.Tensor:
        layout = stored.layout
        flat, result = layout.allocate(self.device)
        if stored.action is Action.SWAP:
            assert stored.host is not None
            flat.copy_(stored.host, non_blocking=self.cuda)
        else:
            packed = stored.packed
            assert packed is not None
            if stored.action is Action.ZVC_SWAP and self.cuda:
                packed = packed.to(self.device, non_blocking=True)
            launch = stored.decompress_launch
            if launch is not None and getattr(launch, "chunk_words", packed.chunk_words) != packed.chunk_words:
                launch = replace(launch, chunk_words=packed.chunk_words)
            with _torch_threads_kept():
                decode(packed, flat, backend=self.backend, launch=launch, validate=False)
        return result if result is not None else layout.rebuild_from(flat)

    def _prefetch_after(self, it: IterationState, key: int) -> None:
        """Fetch the offloaded tensors that follow ``key`` in the profiled unpack order, within the budget."""
        position = it.unpack_position.get(key)
        plan = it.plan
        window = self.prefetch_bytes if plan.prefetch_bytes is None else min(plan.prefetch_bytes, self.prefetch_bytes)
        if position is None or window <= 0:
            return
        order = it.plan.unpack_order
        i = max(position + 1, it.prefetch_cursor)
        while i < len(order):
            ref = it.stored_by_key.get(order[i])
            stored = ref() if ref is not None else None
            if stored is None or not stored.action.offloads or stored.unpacked or stored.prefetched is not None:
                i += 1
                continue
            nbytes = stored.layout.nbytes
            if self._prefetched_bytes + nbytes > window:
                break
            if plan.budget_bytes is not None and self.counters.resident_bytes + nbytes > plan.budget_bytes:
                break
            out, event = self._fetch(stored)
            held = out.untyped_storage().nbytes()
            stored.prefetched = (out, event)
            stored.prefetched_bytes = held
            self._prefetched_bytes += held
            self.counters.add_resident(held)
            self.counters.prefetches += 1
            i += 1
        it.prefetch_cursor = i
