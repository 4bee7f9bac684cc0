# Longer than the ~500-line guide on purpose: pack, unpack, prefetch and the release queue share one
# lock and one set of counters, and the locking discipline is easiest to check when it is in one
# file; the stream and event work it calls is cswap.execute.streams.
"""The executor: ``saved_tensors_hooks`` that keep, swap, compress-then-swap or compress-and-keep each tensor.

Every tensor autograd saves inside ``rt.iteration()`` passes through :meth:`Executor.pack`, which
returns a :class:`Handle`; backward gives the handle back to :meth:`Executor.unpack` for the data.
How the facts of saved-tensor hooks are handled:

* **Repeated unpack** (``retain_graph``, ``grad_fn._saved_*``) rebuilds the same values each time
  from what the handle holds; nothing is freed in unpack. Buffers are released when the last
  handle referring to them dies (Python reference counting), in any order.
* **The same storage and view packed twice** (``x * x``) is stored once: handles are deduplicated
  by storage, offset, shape, stride, dtype and version.
* **Views** (transposes, slices, ``expand`` broadcasts) are stored compactly and rebuilt with the
  original strides (:class:`cswap.execute.layout.Layout`).
* **Parameters and buffers** (of ``model=``, leaves that require grad, and their views) and tensors
  on another device, of a tensor subclass or of a non-strided layout are never moved.
* **Thread-locality and nesting** come from ``saved_tensors_hooks`` itself: the hooks apply only
  in the thread that entered the iteration (and autograd's engine threads working for it), and an
  inner ``saved_tensors_hooks`` (``save_on_cpu``, non-reentrant checkpoint) wins inside it.

Every copy, (de)compression, stream switch and event wait is :class:`~cswap.execute.streams.Transfers`'
(the stream discipline, deferred compressed sizes and the budget's back-pressure); the host copies
go to a pinned :class:`~cswap.execute.arena.HostArena` that is grown only between iterations.
During backward, each unpack prefetches the next offloaded tensors in the profiled unpack order, up
to ``prefetch_bytes`` fetched ahead. On CPU the same code runs without streams: swapping copies
into the (unpinned) arena, compression uses the ``cpu`` backend. Profiling iterations, which read
their trace back anyway, encode with exact sizes.

The executor decides nothing: for every pack it states the facts (key, shape, dtype, compact bytes,
whether the tensor may move at all, whether its data is already stored) and carries out the
:class:`~cswap.planner.plan.Decision` that :meth:`cswap.planner.plan.Plan.resolve` returns, launch configs included.
Compression is the codecs' one encoding step (:func:`cswap.codecs.encode`: exact integer narrowing,
then ZVC) and its inverse (:func:`cswap.codecs.decode`).

Resident bytes (:attr:`Counters.resident_bytes`) count what the saved-tensor machinery holds on the
device: kept tensors at their compact size, compress-keep tensors at their compressed size,
compressions whose size is not read back yet at their workspace plus their source, tensors a
recompute region's recomputation saved for backward until their storage is freed
(:meth:`Executor.hold_rebuilt`), sources of device-to-host copies not yet finished (GPU only; CPU
copies finish inside pack), and tensors rebuilt for backward from the moment they are fetched (or
prefetched) until their storage is freed. Two kept views of one storage count it once. Parameters
and buffers are not counted. Releases are applied before every count that can grow (each pack,
fetch and prefetch; a planned unpack that adds nothing lets them wait, in batches), so the peak is
exact at the moments memory grows.

Example:
    >>> import torch
    >>> from cswap.planner.advisor import Action, Plan
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
import functools
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import torch

from cswap.codecs import alternative_nbytes, encodable, value_range, zvc_compressed_nbytes
from cswap.execute.arena import ALIGN_BYTES, ArenaBlock, HostArena, PoolSlot
from cswap.execute.layout import Layout
from cswap.execute.stored import Counters, Handle, PlainStorage, Stored
from cswap.execute.streams import Transfers, torch_threads_kept
from cswap.planner.plan import DTYPE_NAMES, Action, Decision, Plan, host_reserve_bytes, serves_shape
from cswap.profile.profiler import Profiler
from cswap.profile.shapes import SizeMap, merged

__all__ = ["Counters", "Executor", "IterationState", "RegionRebuild", "merged_seen", "see_largest"]

_BITS_BY_ITEMSIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_SWAP = Action.SWAP.value
_OFFLOADING = frozenset(action for action in Action if action.offloads)  # read per prefetch candidate: no property call
_KEEP = Action.KEEP.value
_LEAF_REASON = "leaf tensor that requires grad (a parameter): never offloaded"
_VIEW_REASON = "view of a leaf tensor that requires grad (a parameter): never offloaded"
_DTYPES_BY_NAME = {name: dtype for dtype, name in DTYPE_NAMES.items()}
_DRAIN_BATCH = 64  # releases a planned unpack that counts nothing lets wait before it drains them


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _same_view(stored: Stored, storage: torch.UntypedStorage, stride: tuple[int, ...], shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    """Whether ``stored``, found by a pack's storage, offset and version, stores this very view: its
    storage is alive as that object (a dead one's address may be taken by a new one), with the same
    stride, shape and dtype (not another view at the same offset)."""
    layout = stored.layout
    return stored.storage_ref() is storage and layout.stride == stride and layout.shape == shape and layout.dtype is dtype


def _kept_nbytes(tensor: torch.Tensor, storage: torch.UntypedStorage, nbytes: int) -> int:
    """What keeping ``tensor`` (``nbytes`` of its own) holds: all of its storage where that is larger
    and autograd tracks it, a slice of an activation (GPT-NeoX's values are a third of its fused
    projection). A slice of data that needs no gradient (a batch cut from a dataset held in memory)
    counts its own bytes: what holds the rest holds it anyway."""
    return max(nbytes, storage.nbytes()) if tensor.requires_grad else nbytes


def _storage_id(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class _RebuiltRef(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to a storage a recomputation saved, with its id and the bytes it counts."""

    __slots__ = ("sid", "nbytes")

    def __new__(cls, storage: torch.UntypedStorage, died: Callable[[Any], None], sid: int, nbytes: int) -> _RebuiltRef:
        return super().__new__(cls, storage, died)

    def __init__(self, storage: torch.UntypedStorage, died: Callable[[Any], None], sid: int, nbytes: int) -> None:
        super().__init__(storage, died)
        self.sid = sid
        self.nbytes = nbytes


def see_largest(seen: dict[int, tuple[tuple[int, ...], str]], key: int, shape: tuple[int, ...], dtype: str) -> None:
    """Record in ``seen`` that ``key`` packed ``shape`` and ``dtype``: the largest per dimension
    where it packed that dtype and rank before, else this one.

    Example:
        >>> seen = {}
        >>> see_largest(seen, 0, (2, 40), "float32"); see_largest(seen, 0, (4, 17), "float32"); seen
        {0: ((4, 40), 'float32')}
    """
    known = seen.get(key)
    if known is not None and known[1] == dtype and len(known[0]) == len(shape):
        shape = tuple(max(a, b) for a, b in zip(known[0], shape))
    seen[key] = (tuple(shape), dtype)


def merged_seen(seen: Iterable[Mapping[int, tuple[tuple[int, ...], str]]]) -> dict[int, tuple[tuple[int, ...], str]]:
    """Several micro-batches' records of :func:`see_largest` as one.

    Example:
        >>> merged_seen([{0: ((2, 40), "float32")}, {0: ((4, 17), "float32"), 1: ((3,), "int64")}])
        {0: ((4, 40), 'float32'), 1: ((3,), 'int64')}
    """
    merged: dict[int, tuple[tuple[int, ...], str]] = {}
    for micro_batch in seen:
        for key, (shape, dtype) in micro_batch.items():
            see_largest(merged, key, shape, dtype)
    return merged


class IterationState:
    """Per-iteration state of the hooks.

    An iteration may hold several micro-batches (gradient accumulation: forward, backward, forward,
    backward, ... inside one ``rt.iteration()``). Each is a repetition of the first: its packs are
    numbered from 0 again, so one plan, made from the first micro-batch's profile, serves them all,
    and a profiling iteration records the first only (the profile a budget resolves against is one
    micro-batch's, which is what plain PyTorch holds at once), with :attr:`seen` the later ones'
    shapes, for which the runtime plans where they are larger.

    Args:
        plan: the plan that decides every pack (:meth:`Plan.resolve`).
        profiler: records the iteration's first micro-batch when it is a profiling one.
        protected: storage ids of the model's parameters and buffers.
        prefetch_window_bytes: the most bytes of offloaded tensors fetched ahead of their unpack.

    Attributes:
        micro_batches: micro-batches begun so far (a forward after a finished backward begins one).
        on_backward_end: called once, when the first micro-batch's backward has finished (the
            profiling iteration's recorders stop there).
        budget_bytes: the device budget in force (:attr:`Plan.budget_bytes`; under a
            :attr:`Plan.provisional_budget`, its fraction of :attr:`plain_peak_bytes`, raised at
            each pack).
        plain_peak_bytes: under a provisional budget, the most bytes the iteration's saved tensors
            have held at once so far, as plain PyTorch holds them (none's peak, once all are packed).
        first_peaks: a profiling iteration's resident and host peaks when its first micro-batch's
            backward ended (``None`` before, and in a planned iteration): the profile's own, where
            later micro-batches pack another graph.
    """

    def __init__(self, plan: Plan, profiler: Profiler | None, protected: frozenset[int], prefetch_window_bytes: int = 0) -> None:
        self.profiler = profiler
        self.protected = protected
        self.layouts: dict[int, Layout] = {}  # per key, the layout of its contiguous aligned tensor (see Executor.begin)
        self.next_key = 0
        self.stored_by_key: dict[int, weakref.ref[Stored]] = {}
        self.prefetch_cursor = 0
        self.prefetch_window_bytes = prefetch_window_bytes
        self._serve(plan)
        # The plans of other graphs profiled before, each with its packs' dtypes and ranks, and the
        # structure of this one (the runtime's): a micro-batch that parts from this plan's
        # structure where another's goes on follows that one to its end (follow_another_graph).
        self.alternates: tuple[tuple[tuple[tuple[str, int], ...], Plan], ...] = ()
        self.structure: tuple[tuple[str, int], ...] = ()
        self._own_plan: Plan | None = None  # this iteration's plan while a micro-batch follows another
        self._parted = False  # this micro-batch parted from the plan it began with
        self.micro_batches = 1
        self.on_backward_end: list[Callable[[], None]] = []
        self._backward_watched = False  # a callback at the end of this micro-batch's backward is queued
        self._backward_ended = False
        # A tensor saved on another device than the runtime's: autograd may run unpacks on that
        # device's thread too, so on a CPU runtime the planned hooks take the lock from then on.
        self.other_device = False
        # What the runtime needs to tell a larger size of the planned structure from another
        # structure: per micro-batch, in order, the last the one running, per key the shape and
        # dtype of each pack the planned hooks left to the general pack (every pack the plan does
        # not serve goes there), and the packs of those finished: a later micro-batch may pack
        # another graph (one without padding beside padded ones), which the runtime tells apart
        # on its own (micro_batches_seen; seen merges them).
        self._seen_by_micro_batch: list[dict[int, tuple[tuple[int, ...], str]]] = [{}]
        self._packs_by_micro_batch: list[int] = []
        # The most a pack outgrew its planned bytes by, as a ratio (1.0: none did), and per planned
        # shape that grew the largest it became: a region's recomputation grows as its sizes do
        # (Executor.make_room_to_recompute).
        self.growth = 1.0
        self.outgrown: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.plain_peak_bytes = 0
        self.first_peaks: tuple[int, int] | None = None
        self.owners: set[int] = set()
        self.kept_in_order: collections.deque[int] = collections.deque()  # keys kept raw, in pack order, while it compacts

    def _serve(self, plan: Plan) -> None:
        """Decide the packs from here by ``plan``."""
        self.plan = plan
        self.decisions = plan.decision_table()
        self.unpack_position = plan.unpack_positions()
        self.prefetch_end = len(plan.unpack_order)  # the cursor's end: nothing is fetched ahead past it
        # whether a fetch may first move kept tensors to the host to stay within the budget (_make_room)
        fallback = plan.fallback_action
        self.makes_room = plan.budget_bytes is not None and fallback is not None and fallback.offloads
        self.budget_bytes = plan.budget_bytes
        # A plan whose fallback keeps on the device, compressed (compress-keep's keep-first profile),
        # compresses what it kept, oldest first, before a tensor would pass the budget
        # (Executor._compact_kept); keys of entries another view's entry leans on stay raw.
        budgeted = plan.budget_bytes is not None or plan.provisional_budget is not None
        self.compacts = budgeted and fallback is not None and fallback.compresses and not fallback.offloads

    def follow_another_graph(self, key: int, dtype: str, rank: int) -> None:
        """At the first pack of this micro-batch that parts from the plan's structure (another dtype
        or rank at ``key``, or a key past its end), follow for the rest of the micro-batch the plan
        of :attr:`alternates` whose packs so far were this micro-batch's (the shortest, where
        several are); with none, the plan it began with. Every pack before ``key`` had the dtype
        and rank the plan planned (the plan served it, or this is the first to part)."""
        if self._parted:
            return
        self._parted = True
        shown = (*self.structure[:key], (dtype, rank))
        if len(shown) != key + 1:
            return
        others = [(structure, plan) for structure, plan in self.alternates if structure[: key + 1] == shown]
        if others:
            self._own_plan = self.plan
            self._serve(min(others, key=lambda other: len(other[0]))[1])

    def see(self, key: int, shape: tuple[int, ...], dtype: str) -> None:
        """Record that ``key`` packed a tensor of ``shape`` and ``dtype`` in the running micro-batch
        (:meth:`micro_batches_seen`, :attr:`seen`)."""
        see_largest(self._seen_by_micro_batch[-1], key, shape, dtype)

    @property
    def seen(self) -> dict[int, tuple[tuple[int, ...], str]]:
        """What :meth:`see` recorded over every micro-batch: per key, the largest shape per
        dimension where its dtype and rank held (a profile plans for the later ones' sizes)."""
        return merged_seen(self._seen_by_micro_batch)

    def micro_batches_seen(self) -> list[tuple[dict[int, tuple[tuple[int, ...], str]], int]]:
        """Per micro-batch begun, in order: what :meth:`see` recorded in it, and how many packs it made."""
        return list(zip(self._seen_by_micro_batch, [*self._packs_by_micro_batch, self.next_key], strict=True))

    def _all_unpacked(self) -> bool:
        """Every tensor this micro-batch stored that is still alive has been read back."""
        for ref in self.stored_by_key.values():
            stored = ref()
            if stored is not None and not stored.unpacked:
                return False
        return True

    def backward_ended(self) -> None:
        """The backward this micro-batch's unpacks ran in has finished: if it read back everything the
        micro-batch stored (not a nested ``torch.autograd.grad`` inside forward), the micro-batch is over."""
        self._backward_watched = False
        if self._backward_ended or not self._all_unpacked():
            return
        self._backward_ended = True
        if self.micro_batches == 1:
            for listener in self.on_backward_end:
                listener()

    def next_micro_batch(self) -> bool:
        """Begin a new micro-batch if the last one's backward has ended (called by a pack outside
        backward); returns whether it did."""
        if not self._backward_ended:
            return False
        self.micro_batches += 1
        if self._own_plan is not None:
            self._serve(self._own_plan)
            self._own_plan = None
        self._parted = False
        self._packs_by_micro_batch.append(self.next_key)
        self._seen_by_micro_batch.append({})
        self.next_key = 0
        self.stored_by_key = {}
        self.kept_in_order.clear()
        self.prefetch_cursor = 0
        self.profiler = None
        self._backward_ended = False
        return True


#: Per tensor a recompute region rebuilds, its shape and bytes at the sizes the plan was made for.
RegionRebuild = tuple[tuple[tuple[int, ...], int], ...]


def _grown_rebuild_bytes(rebuild: RegionRebuild, growth: float, outgrown: Mapping[tuple[int, ...], tuple[int, ...]]) -> int:
    """What ``rebuild`` holds at the sizes the packs grew to: each tensor's shape mapped as the
    packs' shapes grew (:class:`~cswap.profile.shapes.SizeMap`: an attention's scores grow with the
    square of the sequence, which the packs outside the region grow with), and no less than the
    planned bytes grown as much as the packs' most (``growth``).

    Example:
        >>> scores = (((2, 4, 96, 96), 147456),)
        >>> _grown_rebuild_bytes(scores, 112 / 96, {(2, 96, 64): (2, 112, 64)})
        200704
    """
    planned = sum(nbytes for _, nbytes in rebuild)
    grown = math.ceil(planned * max(growth, 1.0))
    if not outgrown:
        return grown
    sizes = SizeMap.learn(outgrown.items())
    mapped = sum(math.ceil(nbytes * math.prod(sizes.size(s) for s in shape) / max(math.prod(shape), 1)) for shape, nbytes in rebuild)
    return max(grown, mapped)


class _RebuiltBytes:
    """Counts the tensors a region's recomputation saves as resident until they are freed, and
    makes room for them first where the iteration outgrew its plan (``region_rebuilds``: per region
    path, the shape and bytes of each tensor the plan has it rebuild)."""

    def __init__(self, executor: Executor, it: IterationState, region_rebuilds: Mapping[str, RegionRebuild]) -> None:
        self.executor = executor
        self.it = it
        self.region_rebuilds = region_rebuilds

    def recomputing(self, path: str) -> None:
        self.executor.make_room_to_recompute(self.it, self.region_rebuilds.get(path, ()))

    def rebuilt(self, tensor: torch.Tensor) -> None:
        self.executor.hold_rebuilt(self.it, tensor)


class Executor:
    """Applies a plan to saved tensors.

    Args:
        device: the training device (``cuda:N`` with an index, or ``cpu``).
        backend: the ZVC codec backend.
        prefetch_bytes: the most bytes of offloaded tensors fetched ahead of their unpack.
        arena_slack: extra host-arena room over the need, as a fraction.
        defer_sizes: compress without waiting for the size (:mod:`cswap.execute.streams`); default: on a GPU.
    """

    def __init__(self, device: torch.device, backend: str, prefetch_bytes: int, arena_slack: float = 0.25,
                 defer_sizes: bool | None = None) -> None:
        self.device = device
        self._on_cpu = device.type == "cpu"
        self.prefetch_bytes = prefetch_bytes
        self.arena_slack = arena_slack
        self.arena = HostArena(pin_memory=device.type == "cuda")
        self.counters = Counters()
        self.transfers = Transfers(device, backend, self.arena, self.counters, defer_sizes)
        self._lock = threading.RLock()
        # (storage, offset, version) -> the entry storing a view there (a match also has its shape,
        # stride and dtype); a dead entry's key is dropped when its release is drained (no
        # callback per entry).
        self._dedupe: dict[tuple[Any, ...], weakref.ref[Stored]] = {}
        # storage id -> the kept entry counting that storage's bytes (a plain dict of weak references,
        # read once per planned keep: dead ones are swept when an iteration begins)
        self._kept_storages: dict[int, weakref.ref[Stored]] = {}
        self._released: collections.deque[tuple[int, ArenaBlock | PoolSlot | None, int, int, Any, int, PlainStorage | None]] = (
            collections.deque())
        # Under a provisional budget, the bytes plain PyTorch would hold for the entries alive, which
        # the budget is a fraction of (IterationState.budget_bytes): each storage once (Stored.plain),
        # as none's peak counts it. Counted per view, Falcon-H1's first profile held 0.5 of 1.06 of
        # none's peak: 4% over the budget the fraction then resolved to.
        self._plain_bytes = 0
        self._plain_storages: dict[int, PlainStorage] = {}  # storage id -> its count, for its later views
        # A rebuilt tensor handed to backward counts until its storage dies; the storage's weak
        # reference posts itself to _dead_storages then (no scan of what is still alive).
        self._handed_out: dict[weakref.ref[torch.UntypedStorage], tuple[int, int]] = {}  # -> (bytes, key)
        self._dead_storages: collections.deque[weakref.ref[torch.UntypedStorage]] = collections.deque()
        self._storage_died = self._dead_storages.append
        self._prefetched_bytes = 0
        # What recomputations saved, counted until each storage dies, told the same way as a
        # handed-out tensor's, to its own queue: storage id -> its reference.
        self._rebuilt: dict[int, _RebuiltRef] = {}
        self._dead_rebuilt: collections.deque[_RebuiltRef] = collections.deque()
        self._rebuilt_died = self._dead_rebuilt.append
        self._protected: tuple[Plan, weakref.ref[torch.nn.Module], frozenset[int]] | None = None
        self._layouts: tuple[Plan | None, dict[int, Layout]] = (None, {})
        self._steps_cache: tuple[Plan | None, list[Any]] = (None, [])
        self._arena_plan: Plan | None = None
        self._arena_profiling = False  # the last iteration begun was a profiling one
        self._profiling_bytes = 0  # the most host bytes a profiling iteration took in first-fit blocks

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
            arena = self.arena
            pool = plan.host_pool
            used = arena.peak_used_bytes + arena.missed_bytes  # by the iteration before this one
            if self._arena_profiling:
                self._profiling_bytes = max(self._profiling_bytes, used)
            # What first-fit blocks will need besides the pool: the plan's estimate, what the last
            # iteration of this same plan used, and for a profiling iteration (it moves every
            # tensor) what the last profiling one used; a profile's use says nothing of a plan's.
            need = max(plan.host_bytes - (pool.lower_bound_bytes if pool is not None else 0), 0)
            if plan is self._arena_plan:
                need = max(need, used)
            if profiler is not None:
                need = max(need, self._profiling_bytes)
            arena.plan_pool(pool, int(need * (1.0 + self.arena_slack)))
            self._arena_plan = plan
            self._arena_profiling = profiler is not None
            arena.reset_peak()
            kept = self._kept_storages
            for storage_id in [sid for sid, ref in kept.items() if ref() is None]:
                del kept[storage_id]
            self.counters.iteration_peak_resident_bytes = self.counters.resident_bytes
            self.counters.iteration_peak_host_bytes = self.counters.host_bytes
        window = self.prefetch_bytes if plan.prefetch_bytes is None else min(plan.prefetch_bytes, self.prefetch_bytes)
        it = IterationState(plan, profiler, self._protected_storages(plan, model), window)
        if self._layouts[0] is not plan:
            self._layouts = (plan, {})
        it.layouts = self._layouts[1]  # a planned key's tensor has the same layout every iteration
        if profiler is not None:
            it.on_backward_end.append(functools.partial(self._note_first_peaks, it))
        return it

    def _note_first_peaks(self, it: IterationState) -> None:
        counters = self.counters
        it.first_peaks = (counters.iteration_peak_resident_bytes, counters.iteration_peak_host_bytes)

    def _protected_storages(self, plan: Plan, model: torch.nn.Module | None) -> frozenset[int]:
        """The storage ids of ``model``'s parameters and buffers, walked once per plan and model.

        A walk visits every module, which costs a large model milliseconds per iteration; a new
        plan (every profiling iteration makes one) walks again, so parameters moved or replaced
        between epochs are seen.
        """
        if model is None:
            return frozenset()
        cached = self._protected
        if cached is not None and cached[0] is plan and cached[1]() is model:
            return cached[2]
        protected = frozenset(_storage_id(t) for t in (*model.parameters(), *model.buffers()) if t.layout is torch.strided)
        self._protected = (plan, weakref.ref(model), protected)
        return protected

    def end(self, it: IterationState) -> None:
        """Finish an iteration (the state stops recording; later unpacks still work)."""
        with self._lock:
            self._drain(it.profiler)
            it.profiler = None

    def hooks(self, it: IterationState) -> tuple[Callable[[torch.Tensor], Handle], Callable[[Handle], torch.Tensor]]:
        """``(pack, unpack)`` for ``torch.autograd.graph.saved_tensors_hooks``: for an iteration
        that is not profiled, a pack that carries out what the plan already says with nothing built
        (:meth:`_planned_hooks`), else :meth:`pack`."""
        if it.profiler is not None or not it.decisions:
            return functools.partial(self.pack, it), functools.partial(self.unpack, it)
        return self._planned_hooks(it)

    def _planned_hooks(self, it: IterationState) -> tuple[Callable[[torch.Tensor], Handle | Stored], Callable[[Handle | Stored], torch.Tensor]]:
        """The pack and unpack hooks of a planned iteration.

        It takes what most packs are once planned, with the plan's answer known in advance: a
        parameter the plan keeps where it is, a contiguous aligned tensor the plan keeps or swaps
        (copied to its pool slot), and a second save of data already stored. Anything else, and
        every pack whose facts differ from the plan's guard, goes to :meth:`pack`. It applies the
        general path's rules, each defined once: the guard's size rule
        (:func:`~cswap.planner.plan.serves_shape`), :meth:`_never_move`'s reason (the plan's
        answer holds only for the reason it was planned with), the match of a stored view
        (:func:`_same_view`), the budget's keep limit (:meth:`Plan.keep_limit_bytes`), and it
        stores through :meth:`_keep` and :meth:`_swap_plain` as :meth:`_store` does. What it
        saves is building the decision: :meth:`Plan.resolve`'s answer for these is always the
        planned one (a swap holds nothing on the device, so the budget never changes it), and
        this runs once per saved tensor, where every attribute read and call is host time the
        device waits for. The unpack is
        :meth:`unpack` without the profiler, for the handles this pack returns (a :class:`Stored`
        entry is its own handle). Both take the executor's lock only where threads can meet: on a
        GPU, or once the iteration saved a tensor on another device (:attr:`IterationState.other_device`).
        """
        general = functools.partial(self.pack, it)
        steps = self._steps(it.plan)
        n_steps = len(steps)
        layouts = it.layouts
        dedupe = self._dedupe
        counters = self.counters
        actions = counters.actions
        lock = self._lock
        # On a GPU, autograd runs the unpacks of a graph's CPU parts on the calling thread and
        # those of its GPU parts on the device's thread, at once; on a CPU runtime every hook runs
        # on one thread unless the graph saved a tensor on another device (IterationState.other_device).
        threads_meet = not self._on_cpu
        drain = self._drain
        transfers = self.transfers
        never_move, keep_tensor, swap_plain = self._never_move, self._keep, self._swap_plain
        released, dead, rebuilt = self._released, self._dead_storages, self._dead_rebuilt
        in_flight, unsized = transfers.in_flight, transfers.unsized
        stored_by_key = it.stored_by_key
        budget = it.plan.budget_bytes
        kept_storages = self._kept_storages
        resolved = it.plan.resolved_table()
        perf_counter = time.perf_counter
        grad_enabled = torch.is_grad_enabled
        new_ref = weakref.ref
        keep, strided = Action.KEEP, torch.strided

        def pack(tensor: torch.Tensor) -> Handle:
            started = perf_counter()
            key = it.next_key
            step = steps[key] if key < n_steps else None
            if step is None or it._backward_ended or it._own_plan is not None:
                return general(tensor)
            planned, shape, dtype, reason, action, keep_limit = step
            if tensor.dtype is not dtype:
                return general(tensor)
            size = tensor.shape
            if size != shape:
                # A smaller size of the planned tensor (a shorter sequence, a smaller batch) follows
                # the plan (Decision.matches's rule); its own shape is what is stored.
                if not serves_shape(shape, size):
                    return general(tensor)
                shape = size
            if tensor.layout is not strided:  # a sparse layout has no storage to ask for
                return general(tensor)
            storage = tensor.untyped_storage()
            storage_id = storage._cdata
            if never_move(it, tensor, storage_id) != reason:
                # the plan's answer holds only for the reason it was planned with (None: it may move)
                return general(tensor)
            if reason is not None:
                # Nothing here is shared with another thread: the counters are the forward's, as
                # the unpacks' are backward's, and a micro-batch's forward never overlaps a backward.
                it.next_key = key + 1
                if resolved:  # what Plan.resolve records for a planned decision
                    resolved.pop(key, None)
                counters.never_moved_tensors += 1
                counters.packed_tensors += 1
                counters.pack_s += perf_counter() - started
                # The tensor is its own handle, as autograd holds a saved input without hooks:
                # autograd detaches what an unpack returns, and a parameter (or a view of one) is
                # an input of the operation that saves it, so holding it makes no reference cycle.
                return tensor
            offset = tensor.storage_offset()
            if not tensor.is_contiguous() or offset * tensor.element_size() % ALIGN_BYTES:  # Layout.plain's terms
                return general(tensor)
            stride = tensor.stride()
            dedupe_key = (storage_id, offset, tensor._version)
            locking = threads_meet or it.other_device
            if locking:
                lock.acquire()
            try:
                if released or dead or rebuilt or in_flight or unsized:  # what _releases_pending asks
                    drain()
                ref = dedupe.get(dedupe_key)
                stored = ref() if ref is not None else None
                if stored is not None and _same_view(stored, storage, stride, shape, dtype):
                    if stored.action is not action:
                        return general(tensor)
                    stored.handles += 1
                    counters.deduplicated_tensors += 1
                else:
                    layout = layouts.get(key)
                    if layout is None or stride != layout.stride or shape != layout.shape:  # size-1 dimensions may stride anyhow
                        layout = layouts[key] = Layout.of(tensor)
                    nbytes = layout.nbytes
                    if nbytes > planned.nbytes:
                        return general(tensor)
                    if action is keep:
                        # Another view of a kept storage counts it already (the general path shares
                        # it), and a slice of a larger storage holds all of it; a keep that would
                        # pass the budget falls back there too.
                        kept_ref = kept_storages.get(storage_id)
                        if (kept_ref is not None and kept_ref() is not None) or _kept_nbytes(tensor, storage, nbytes) > nbytes or (
                                keep_limit is not None and counters.resident_bytes > keep_limit):
                            return general(tensor)
                    stored = Stored(key, planned, layout, released)
                    stored.storage_ref = new_ref(storage)
                    ref = new_ref(stored)
                    if action is keep:
                        keep_tensor(stored, tensor.detach(), nbytes, storage_id)
                        actions[_KEEP] += 1
                    else:
                        # pack hooks run with grad mode off, so the copy needs no detached view
                        # (checked, as a caller may differ)
                        swap_plain(stored, tensor.detach() if grad_enabled() else tensor, key)
                        actions[_SWAP] += 1
                    stored.dedupe_key = dedupe_key
                    dedupe[dedupe_key] = ref
                    if action is not keep and budget is not None:
                        transfers.wait_for_budget(budget)
                it.next_key = key + 1
                stored_by_key[key] = ref
                if resolved:  # what Plan.resolve records for a planned decision
                    resolved.pop(key, None)
                counters.packed_tensors += 1
                counters.pack_s += perf_counter() - started
            finally:
                if locking:
                    lock.release()
            # The entry is its own handle: an unpack reads the data it holds and prefetches after
            # the key that stored it, whichever of its handles asks.
            return stored

        general_unpack = functools.partial(self.unpack, it)
        materialize = self._materialize
        prefetch_after = self._prefetch_after
        stored_type, handle_type = Stored, Handle
        watch_backward = self._watch_backward

        def unpack(handle: Handle | Stored | torch.Tensor) -> torch.Tensor:
            kind = type(handle)
            if kind is not stored_type and kind is not handle_type:  # a parameter or a view of one, kept as it is
                if not it._backward_watched:
                    with lock:
                        watch_backward(it)
                counters.unpacks += 1  # one thread's counter: backward's (the packs of its forward are done)
                return handle  # type: ignore[return-value]
            if kind is not stored_type and handle.stored is not None:  # type: ignore[union-attr]
                return general_unpack(handle)
            started = perf_counter()
            # Releases are drained where bytes are about to be counted or compared (a fetch, a
            # prefetch) and else in batches: an unpack that adds nothing leaves the counts as
            # exact at every moment they can grow, and the next pack, which drains first.
            locking = threads_meet or it.other_device
            if locking:
                lock.acquire()
            try:
                if kind is not stored_type:  # a tensor that never moves
                    out = handle.tensor  # type: ignore[union-attr]
                    key = handle.key
                else:
                    stored = handle
                    key = stored.key  # type: ignore[union-attr]
                    if stored.action is keep:  # type: ignore[union-attr]
                        out = stored.tensor  # type: ignore[union-attr]
                    else:
                        out = stored.held_out  # type: ignore[union-attr]
                        if out is None:
                            if stored.prefetched is None and (released or dead or rebuilt or in_flight or unsized):  # type: ignore[union-attr]
                                drain()
                            out = materialize(stored, it)  # type: ignore[arg-type]
                        stored.unpacks += 1  # type: ignore[union-attr]
                        stored.held_out = out if stored.unpacks < stored.handles else None  # type: ignore[union-attr]
                    stored.unpacked = True  # type: ignore[union-attr]
                if not it._backward_watched:
                    watch_backward(it)
                if it.prefetch_cursor < it.prefetch_end:
                    if released or dead or rebuilt or in_flight or unsized:
                        drain()
                    prefetch_after(it, key)
                elif len(released) >= _DRAIN_BATCH or len(dead) >= _DRAIN_BATCH:
                    drain()
                counters.unpacks += 1
                counters.unpack_s += perf_counter() - started
            finally:
                if locking:
                    lock.release()
            return out  # type: ignore[return-value]

        return pack, unpack

    def _steps(self, plan: Plan) -> list[tuple[Decision, torch.Size, torch.dtype, str | None, Action, float | None] | None]:
        """Per key, what the planned pack hook checks and does, made once per plan: the decision,
        its guard as the shape and dtype objects a tensor reports, for a parameter or a view of
        one the reason it is kept, the action, and for a keep the most resident bytes at which it
        stands under the budget (:meth:`Plan.keep_limit_bytes`); ``None`` for a key the plan does
        not decide or whose action the hook leaves to :meth:`pack` (anything but a keep, or a swap
        that stands as planned: :attr:`Plan.swaps_stand`)."""
        cached = self._steps_cache
        if cached[0] is plan:
            return cached[1]
        decisions = plan.decision_table()
        fast = (Action.KEEP, Action.SWAP) if plan.swaps_stand else (Action.KEEP,)
        steps: list[tuple[Decision, torch.Size, torch.dtype, str | None, Action, float | None] | None] = [None] * (max(decisions, default=-1) + 1)
        for key, decision in decisions.items():
            dtype = _DTYPES_BY_NAME.get(decision.dtype)
            if key < 0 or dtype is None or decision.action not in fast:
                continue
            reason = decision.reason if decision.action is Action.KEEP and decision.reason in (_LEAF_REASON, _VIEW_REASON) else None
            steps[key] = (decision, torch.Size(decision.shape), dtype, reason, decision.action, plan.keep_limit_bytes(decision))
        self._steps_cache = (plan, steps)
        return steps

    def close(self) -> None:
        """Collect the host compressions still running and stop their worker threads (they also
        stop when the executor is garbage-collected)."""
        with self._lock:
            self.transfers.close()

    def snapshot(self) -> Counters:
        """A copy of the counters, after applying pending releases."""
        with self._lock:
            self.transfers.settle_all_sizes()
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
            # bytes are about to be counted: what died since (the last layer's rebuilt tensors, freed
            # by its backward) is taken off first, or the peak would count both
            if self._releases_pending():
                self._drain(it.profiler)
            known = self._rebuilt.get(sid)
            if known is not None:
                if known() is not None:
                    return
                # its storage died, and a new one took its address before the death was drained
                self.counters.resident_bytes -= known.nbytes
            nbytes = storage.nbytes()
            self._rebuilt[sid] = _RebuiltRef(storage, self._rebuilt_died, sid, nbytes)
            self.counters.add_resident(nbytes)

    def rebuilt_listener(self, it: IterationState, region_rebuilds: Mapping[str, RegionRebuild] | None = None) -> _RebuiltBytes:
        """The :class:`cswap.execute.recompute.RecomputeListener` that counts, in ``it``, what a region's
        recomputation saves (:meth:`hold_rebuilt`); ``region_rebuilds``, per region path, the shape
        and bytes of each tensor the plan has that region rebuild (:meth:`make_room_to_recompute`)."""
        return _RebuiltBytes(self, it, region_rebuilds or {})

    def make_room_to_recompute(self, it: IterationState, rebuild: RegionRebuild) -> None:
        """Before a region rebuilds the tensors of ``rebuild`` (their shapes and bytes as planned),
        move kept tensors to the host while the rebuild, at the sizes the iteration's packs grew to
        (a longer sequence than planned), would pass the budget (:meth:`_make_room`).

        A plan that met the budget made room for every rebuild at its sizes, and nothing moves; one
        made at a least past the budget (``Runtime._past_least``) has its rebuilds make room.
        """
        if not rebuild or not it.makes_room:
            return
        with self._lock:
            self._make_room(it, _grown_rebuild_bytes(rebuild, it.growth, it.outgrown))

    def release_rebuilt(self) -> None:
        """Stop counting the rebuilt storages still alive: the iteration is over, and what holds them
        now is not its backward."""
        with self._lock:
            self._release_rebuilt()

    def _release_rebuilt(self) -> None:
        self.counters.resident_bytes -= sum(ref.nbytes for ref in self._rebuilt.values())
        self._rebuilt.clear()  # deaths told later find their entry gone: nothing is taken twice

    def count_recomputed(self, tensors: int, nbytes: int = 0) -> None:
        """Count ``tensors`` saved tensors of ``nbytes`` in all that recompute regions dropped and
        rebuilt (never packed here)."""
        with self._lock:
            self.counters.actions[Action.RECOMPUTE.value] += tensors
            self.counters.recomputed_bytes += nbytes

    def evict_kept(self, it: IterationState) -> int:
        """Swap every tensor of ``it`` that is kept on the device and not yet unpacked to host memory.

        Capuchin's passive mode (:class:`cswap.execute.passive.SwapOnOutOfMemory`) calls it when the
        device ran out of memory. The copies are synchronous: the device is full, and the freed
        memory is what the op that failed needs next. An evicted tensor is then counted as
        swapped (``actions``, offloaded and transferred bytes) and in ``evicted_tensors``.

        Returns:
            how many tensors it moved (their memory is freed unless something else holds them).
        """
        moved = 0
        with self._lock:
            for ref in list(it.stored_by_key.values()):
                stored = ref()
                if stored is None or stored.action is not Action.KEEP or stored.unpacked or stored.tensor is None:
                    continue
                if self._evict(stored):
                    self.counters.evicted_tensors += 1
                    moved += 1
        return moved

    def new_epoch(self) -> None:
        """Start a new per-epoch peak."""
        with self._lock:
            self.counters.epoch_peak_resident_bytes = self.counters.resident_bytes

    # ------------------------------------------------------------------ bookkeeping

    def _releases_pending(self) -> bool:
        """Whether :meth:`_drain` has anything to look at (the hooks skip it otherwise)."""
        transfers = self.transfers
        return bool(self._released or self._dead_storages or self._dead_rebuilt or transfers.in_flight or transfers.unsized)

    def _drain(self, profiler: Profiler | None = None) -> None:
        """Apply releases posted by dead handles, finished copies and freed rebuilt tensors.

        A profiling iteration's ``profiler`` learns which keys' stored data or rebuilt tensors
        were seen dead here (their lifetimes end at the last unpack before this hook).
        """
        counters = self.counters
        self.transfers.settle()
        freed: list[int] = []
        released, dedupe, free = self._released, self._dedupe, self.arena.free
        while released:
            key, block, held, prefetched, dedupe_key, host, plain = released.popleft()
            if block is not None:
                free(block)
            if dedupe_key is not None:
                ref = dedupe.get(dedupe_key)
                if ref is not None and ref() is None:
                    del dedupe[dedupe_key]
            if held:
                counters.resident_bytes -= held
                self._prefetched_bytes -= prefetched
            counters.host_bytes -= host
            if plain is not None:
                plain.entries -= 1
                if not plain.entries:
                    self._plain_bytes -= plain.nbytes
                    if self._plain_storages.get(plain.storage_id) is plain:
                        del self._plain_storages[plain.storage_id]
            if profiler is not None:
                freed.append(key)
        dead = self._dead_storages
        while dead:
            entry = self._handed_out.pop(dead.popleft(), None)
            if entry is not None:
                counters.resident_bytes -= entry[0]
                if profiler is not None:
                    freed.append(entry[1])
        dead_rebuilt, rebuilt = self._dead_rebuilt, self._rebuilt
        while dead_rebuilt:
            ref = dead_rebuilt.popleft()
            if rebuilt.get(ref.sid) is ref:
                del rebuilt[ref.sid]
                counters.resident_bytes -= ref.nbytes
        if profiler is not None and freed:
            profiler.record_free(freed)

    def _never_move(self, it: IterationState, t: torch.Tensor, storage_id: int) -> str | None:
        """Why ``t`` (whose storage is ``storage_id``) must stay where it is, or ``None``."""
        if type(t) not in _PLAIN_TYPES:
            return f"tensor subclass {type(t).__name__}: kept"
        if t.layout is not torch.strided:
            return f"layout {t.layout}: kept"
        if not (t.is_cpu if self._on_cpu else t.device == self.device):
            it.other_device = True
            return f"on {t.device}, not the runtime's {self.device}: kept"
        if t.numel() == 0:
            return "empty tensor: kept"
        if t.requires_grad and t.is_leaf:
            return _LEAF_REASON
        base = t._base
        if base is not None and base.requires_grad and base.is_leaf:
            return _VIEW_REASON
        if storage_id in it.protected:
            return "parameter or buffer of the model: never offloaded"
        return None

    # ------------------------------------------------------------------ pack

    def pack(self, it: IterationState, tensor: torch.Tensor) -> Handle:
        """The pack hook: store ``tensor`` as the plan says and return its handle."""
        started = time.perf_counter()
        if it._backward_ended and torch._C._current_graph_task_id() == -1:  # the next micro-batch's first pack
            with self._lock:
                self._drain(it.profiler)
                it.next_micro_batch()
                self._release_rebuilt()  # what still holds them is not the next micro-batch's backward
        profiler = it.profiler
        stamp = profiler.stamp() if profiler is not None else None
        with self._lock:
            if profiler is not None or self._releases_pending():
                self._drain(profiler)
            key = it.next_key
            it.next_key = key + 1
            handle, record = self._pack(it, key, tensor, profiler)
            counters = self.counters
            counters.packed_tensors += 1
            counters.pack_s += time.perf_counter() - started
        if profiler is not None and record is not None:
            profiler.record_pack(**record, start=stamp, end=profiler.stamp())
        return handle

    def _pack(self, it: IterationState, key: int, tensor: torch.Tensor, profiler: Profiler | None) -> tuple[Handle, dict[str, Any] | None]:
        counters = self.counters
        if it.alternates and not it._parted:
            planned, dtype = it.decisions.get(key), _dtype_name(tensor.dtype)
            if planned is None or planned.dtype != dtype or len(planned.shape) != tensor.dim():
                it.follow_another_graph(key, dtype, tensor.dim())
        plan = it.plan
        # A sparse or other non-strided tensor has no storage to ask for (it is never moved)
        storage = tensor.untyped_storage() if tensor.layout is torch.strided else None
        storage_id = storage._cdata if storage is not None else -1
        reason = self._never_move(it, tensor, storage_id)
        if reason is not None:
            # The plan's answer to a tensor that may not move is always to keep it where it is,
            # which is done by holding the tensor itself.
            nbytes = tensor.numel() * tensor.element_size()
            plan.resolve(key, tuple(tensor.shape), tensor.dtype, nbytes, never_moved=reason)
            if profiler is None:
                it.see(key, tuple(tensor.shape), _dtype_name(tensor.dtype))
            counters.never_moved_tensors += 1
            record = None
            if profiler is not None:
                record = dict(key=key, shape=tuple(tensor.shape), dtype=_dtype_name(tensor.dtype), nbytes=nbytes, numel=tensor.numel(),
                              zeros=0, producer=profiler.producer(tensor), offloadable=False, reason=reason, module=profiler.module(tensor))
            return Handle(key, None, tensor.detach()), record
        layout = Layout.of(tensor)
        dedupe_key = (storage_id, tensor.storage_offset(), tensor._version)
        ref = self._dedupe.get(dedupe_key)
        stored = ref() if ref is not None else None
        if stored is not None and not _same_view(stored, storage, layout.stride, layout.shape, layout.dtype):
            stored = None
        producer = profiler.producer(tensor) if profiler is not None else ""
        zeros: Any = 0
        encoding_facts: Any = None
        coded: Any = None
        held = layout.nbytes
        if stored is not None:
            plan.resolve(key, layout.shape, layout.dtype, layout.nbytes, duplicate_of=stored.decision)
            stored.handles += 1
            counters.deduplicated_tensors += 1
            if profiler is not None:
                profiler.record_duplicate(key, stored.key)
        else:
            assert storage is not None  # a tensor without one is never moved
            held = _kept_nbytes(tensor, storage, layout.nbytes)
            kept = self._kept_storages.get(storage_id)
            owner = kept() if kept is not None else None
            if owner is not None and (owner.action is not Action.KEEP or owner.tensor is None or owner.held_bytes < held):
                owner = None  # evicted since, or it counts a smaller view of the storage than this one
            provisional = plan.provisional_budget
            counts_plain = provisional is not None
            counted = self._plain_storages.get(storage_id) if counts_plain else None
            if counted is not None and not counted.holds(storage, held):
                counted = None  # a larger view counts on its own, as the planner's does, and so does a new storage
            if counts_plain:
                new_bytes = 0 if counted is not None else held  # another view of a storage counted: none
                it.plain_peak_bytes = max(it.plain_peak_bytes, self._plain_bytes + new_bytes)
                it.budget_bytes = provisional.resolve(it.plain_peak_bytes)  # type: ignore[union-attr]
            if it.compacts and owner is None and counters.resident_bytes + held > it.budget_bytes:  # type: ignore[operator]
                self._compact_kept(it, held)
            decision = plan.resolve(key, layout.shape, layout.dtype, layout.nbytes, resident_bytes=counters.resident_bytes,
                                    shares_kept=owner is not None, budget_bytes=it.budget_bytes, kept_nbytes=held)
            if decision.budget_fallback:
                counters.budget_fallbacks += 1
            if decision.outgrown:
                counters.outgrown_tensors += 1
                planned = plan.decisions.get(key)
                if planned is not None and planned.nbytes:
                    it.growth = max(it.growth, layout.nbytes / planned.nbytes)
                    if len(planned.shape) == len(layout.shape):
                        it.outgrown[planned.shape] = merged(it.outgrown.get(planned.shape, layout.shape), layout.shape)
            elif plan.decisions and not decision.planned and not plan.knows(key, layout.shape, layout.dtype):
                # counted whether or not the budget then made it fall back
                counters.unknown_keys += 1
            # A profile's zvc-keep (every micro-batch's, not only the one profiled) takes the smallest coding
            smallest = decision.action is Action.ZVC_KEEP and decision.raw_unless_smaller
            if profiler is not None or smallest:
                # The size of the codec besides ZVC that takes its dtype (deferred like the zero
                # count, unless the store needs it now).
                with torch_threads_kept():  # a Numba call may leave torch's thread count changed
                    coded = alternative_nbytes(tensor.detach(), self.transfers.backend)
            if smallest:
                decision = self._smallest_coding(plan, decision, layout, tensor, coded)
            stored, zeros = self._store(key, tensor.detach(), layout, decision, count_zeros=profiler is not None, owner=owner,
                                        storage=storage, kept_nbytes=held)
            if counts_plain:
                stored.plain = self._count_plain(storage_id, storage, held, counted)
            if owner is not None:
                it.owners.add(owner.key)
            elif it.compacts and decision.action is Action.KEEP and stored.action is Action.KEEP and encodable(layout.dtype):
                # a fallback no codec shrank stays raw, and no codec takes a complex tensor: nothing to try
                it.kept_in_order.append(key)
            if it.budget_bytes is not None:
                self.transfers.wait_for_budget(it.budget_bytes)
            if profiler is not None:
                encoding_facts = value_range(tensor.detach())  # what the encoding needs to predict its size
            stored.dedupe_key = dedupe_key
            self._dedupe[dedupe_key] = weakref.ref(stored)
            counters.actions[stored.action.value] += 1
        if profiler is None:
            it.see(key, layout.shape, _dtype_name(layout.dtype))
        it.stored_by_key[key] = weakref.ref(stored)
        record = None
        if profiler is not None:
            record = dict(key=key, shape=layout.shape, dtype=_dtype_name(layout.dtype), nbytes=layout.nbytes, numel=layout.numel,
                          zeros=zeros, producer=producer, offloadable=True, reason="", value_range=encoding_facts,
                          module=profiler.module(tensor), coded=coded, storage=storage,
                          storage_nbytes=held if held > layout.nbytes else None)
        return Handle(key, stored), record

    def _count_plain(self, storage_id: int, storage: torch.UntypedStorage, nbytes: int, counted: PlainStorage | None) -> PlainStorage:
        """Count an entry's view of ``nbytes`` of ``storage`` as plain PyTorch holds it: in ``counted``,
        the count of a storage it is another view of, or as a new storage."""
        if counted is not None:
            counted.entries += 1
            return counted
        plain = PlainStorage(storage_id, nbytes, storage)
        known = self._plain_storages.get(storage_id)
        if known is None or not known.holds(storage, 0):  # a storage's first view is what its later ones compare with
            self._plain_storages[storage_id] = plain
        self._plain_bytes += nbytes
        return plain

    def _compact_kept(self, it: IterationState, nbytes: int) -> None:
        """Compress tensors ``it`` keeps raw on the device, saved first first, while keeping
        ``nbytes`` more would pass the budget: each by the codec that gives it the fewest bytes, as
        the profile's ``zvc-keep`` stores a tensor (one no codec shrinks stays raw).

        Those saved first are read last in backward, where the least is held beside them: a
        profile that compresses the oldest past the budget holds about the budgets its plans do,
        where one that compresses each newer tensor instead rebuilds those at backward's start,
        beside their compressed copies (on the tests' float32 Llama, the replays,
        :func:`cswap.planner.budgeted.keep_first_least`, hold from 0.93 of ``none``'s peak and
        only at all of it).
        """
        budget = it.budget_bytes
        assert budget is not None
        counters, waiting = self.counters, it.kept_in_order
        while waiting and counters.resident_bytes + nbytes > budget:
            key = waiting.popleft()
            ref = it.stored_by_key.get(key)
            stored = ref() if ref is not None else None
            if (stored is None or stored.action is not Action.KEEP or stored.unpacked or stored.tensor is None
                    or stored.owner is not None or key in it.owners):
                continue
            self._compress_kept(it.plan, stored)

    def _compress_kept(self, plan: Plan, stored: Stored) -> None:
        """Store a kept ``stored`` compressed on the device from now on, where that holds fewer bytes."""
        layout, tensor = stored.layout, stored.tensor
        assert tensor is not None
        with torch_threads_kept():
            coded = alternative_nbytes(tensor, self.transfers.backend)
        keep = stored.decision
        reason = f"{keep.reason}; compressed later in the profile, to keep a newer tensor within the budget"
        decision = self._smallest_coding(plan, replace(keep, action=Action.ZVC_KEEP, reason=reason, raw_unless_smaller=True),
                                         layout, tensor, coded)
        stored.decision = decision
        self.transfers.store(stored, layout.compact(tensor), Action.ZVC_KEEP, decision.compress_launch)
        packed = stored.packed
        assert packed is not None
        if packed.compressed_nbytes >= layout.nbytes:  # no codec shrinks it: it stays as it was
            stored.packed, stored.ready, stored.decision = None, None, keep
            return
        counters = self.counters
        stored.action, stored.tensor, stored.decompress_launch = Action.ZVC_KEEP, None, decision.decompress_launch
        counters.add_resident(packed.compressed_nbytes - stored.held_bytes)
        stored.held_bytes = packed.compressed_nbytes
        counters.kept_bytes -= layout.nbytes
        counters.compressed_input_bytes += layout.nbytes
        counters.compressed_bytes += packed.compressed_nbytes
        counters.actions[Action.KEEP.value] -= 1
        counters.actions[Action.ZVC_KEEP.value] += 1

    def _smallest_coding(self, plan: Plan, decision: Decision, layout: Layout, tensor: torch.Tensor, coded: Any) -> Decision:
        """A profile's ``zvc-keep`` ``decision``, which keeps a tensor raw unless its encoding is
        smaller, with the codec besides ZVC (``coded``: its name and the size it gives ``tensor``,
        or ``None``) where that gives fewer bytes than ZVC and than the raw tensor: the choice the
        plans made from this profile make (:func:`cswap.planner.codec_choice.codec_for`). The
        profile then peaks where those plans can, where ZVC alone would keep every dense float
        raw. Where ZVC gives no more bytes, the decision takes ZVC, whichever codec it named."""
        if coded is not None:
            codec, size = coded
            other_bytes = int(size)  # a profile may wait for the device
            if other_bytes < layout.nbytes:
                nonzero = layout.numel - int(self._zeros(layout.compact(tensor), layout))
                # ties go to ZVC, as the planner's
                if zvc_compressed_nbytes(layout.numel, nonzero, layout.itemsize) > other_bytes:
                    return self._coded_by(plan, decision, codec, compressed_nbytes=other_bytes)
        return decision if decision.codec == "zvc" else self._coded_by(plan, decision, "zvc")

    @staticmethod
    def _coded_by(plan: Plan, decision: Decision, codec: str, **facts: Any) -> Decision:
        """``decision`` encoding by ``codec``, with that codec's launch configs."""
        launches: dict[str, Any] = {"compress_launch": None, "decompress_launch": None}
        if plan.launches is not None:
            launches.update(plan.launches.launches(decision.dtype, decision.nbytes, codec))
        return replace(decision, codec=codec, **facts, **launches)

    def _store(
        self, key: int, tensor: torch.Tensor, layout: Layout, decision: Decision, count_zeros: bool, owner: Stored | None = None,
        storage: torch.UntypedStorage | None = None, kept_nbytes: int | None = None,
    ) -> tuple[Stored, Any]:
        """Carry out ``decision`` on ``tensor``; returns the stored data and its zero count (when asked).

        ``owner`` is a stored entry that already keeps ``tensor``'s storage (another view of it): a
        kept ``tensor`` then holds no bytes of its own and keeps ``owner`` alive instead, so that
        the storage is counted once, for as long as either needs it. ``kept_nbytes``: what keeping
        it holds where more than its own bytes (its storage's, for a view of a larger one).
        """
        counters = self.counters
        action = decision.action
        stored = Stored(key, decision, layout, self._released)
        stored.storage_ref = weakref.ref(tensor.untyped_storage() if storage is None else storage)
        zeros: Any = 0
        if action is Action.KEEP:
            if owner is None:
                self._keep(stored, tensor, max(layout.nbytes, kept_nbytes or 0), _storage_id(tensor))
            else:
                stored.tensor = tensor
                counters.kept_bytes += layout.nbytes
                stored.owner = owner
            if count_zeros:
                zeros = self._zeros(layout.compact(tensor), layout)
            return stored, zeros
        if action is Action.HOST_ZVC_SWAP:
            # Moved raw like a swap; a worker compresses the host copy (cswap.execute.hostcodec).
            if count_zeros:
                zeros = self._zeros(layout.compact(tensor), layout)
            self.transfers.store_host_compressed(stored, tensor if layout.plain else layout.compact(tensor),
                                                 host_reserve_bytes(decision.nbytes, decision.compressed_nbytes))
            counters.offloaded_bytes += layout.nbytes
            counters.transferred_bytes += layout.nbytes
            return stored, zeros
        if action is Action.SWAP and layout.plain and not count_zeros:
            self._swap_plain(stored, tensor, key if decision.planned else None)  # its slot in the plan's host pool, if it has one
            return stored, zeros
        flat = layout.compact(tensor)
        if count_zeros and action is Action.SWAP:
            zeros = self._zeros(flat, layout)
        compress_launch = decision.compress_launch
        stored.decompress_launch = decision.decompress_launch
        if action.compresses and self.transfers.defer_sizes and not count_zeros and not decision.raw_unless_smaller and decision.codec == "zvc":
            self.transfers.store_unsized(stored, flat, decision)
            counters.compressed_input_bytes += layout.nbytes
            if action.offloads:
                counters.offloaded_bytes += layout.nbytes
            return stored, zeros
        self.transfers.store(stored, flat, action, compress_launch)
        if action is Action.ZVC_KEEP and decision.raw_unless_smaller and stored.packed.compressed_nbytes >= layout.nbytes:  # type: ignore[union-attr]
            # The decision stores it compressed only where that holds fewer bytes (known once encoded).
            if count_zeros:
                zeros = self._zeros_of(stored.packed, flat, layout)
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
                zeros = self._zeros_of(packed, flat, layout)
        if action.offloads:
            counters.offloaded_bytes += layout.nbytes
            counters.transferred_bytes += layout.nbytes if action is Action.SWAP else stored.packed.compressed_nbytes  # type: ignore[union-attr]
        else:
            stored.held_bytes = stored.packed.compressed_nbytes  # type: ignore[union-attr]
            counters.add_resident(stored.held_bytes)
        return stored, zeros

    def _keep(self, stored: Stored, tensor: torch.Tensor, nbytes: int, storage_id: int) -> None:
        """Hold ``tensor`` (detached) as ``stored``'s data, counting its storage's ``nbytes`` resident
        until ``stored`` dies, as the entry that counts storage ``storage_id``."""
        stored.tensor = tensor
        stored.held_bytes = nbytes
        counters = self.counters
        counters.kept_bytes += stored.layout.nbytes
        counters.add_resident(nbytes)
        self._kept_storages[storage_id] = weakref.ref(stored)

    def _swap_plain(self, stored: Stored, tensor: torch.Tensor, pool_key: int | None) -> None:
        """The common swap, off every Python layer it can: ``tensor`` (a plain layout, detached or
        packed with grad mode off) copied to the host as it is, to planned ``pool_key``'s slot in the
        plan's host pool if it has one; one host view and one copy (on a GPU, on the side stream
        with its event)."""
        transfers = self.transfers
        if transfers.side_stream is None:
            transfers.copy_to_host(stored, tensor, non_blocking=False, pool_key=pool_key)
        else:
            # the entry holds its source until the copy is done: detached, so that no graph is held with it
            transfers.store(stored, tensor.detach(), Action.SWAP, None, pool_key=pool_key)
        nbytes = stored.layout.nbytes
        counters = self.counters
        counters.offloaded_bytes += nbytes
        counters.transferred_bytes += nbytes

    @classmethod
    def _zeros_of(cls, packed: Any, flat: torch.Tensor, layout: Layout) -> Any:
        """Zero elements of ``flat`` as its compression tells them (ZVC counts them), else counted."""
        nnz = getattr(packed, "nnz", None)
        return layout.numel - nnz if nnz is not None else cls._zeros(flat, layout)

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

    def unpack(self, it: IterationState, handle: Handle | Stored) -> torch.Tensor:
        """The unpack hook: the saved tensor's values, with its shape, dtype, strides and device."""
        started = time.perf_counter()
        profiler = it.profiler
        stamp = profiler.stamp() if profiler is not None else None
        if type(handle) is Stored:  # a planned pack's swap is its own handle
            handle = Handle(handle.key, handle)
        with self._lock:
            if profiler is not None or self._releases_pending():
                self._drain(profiler)
            stored = handle.stored
            if stored is None:
                out = handle.tensor
            elif stored.action is Action.KEEP:
                out = stored.tensor
            else:
                out = self._materialize(stored, it)
                stored.unpacks += 1
                stored.held_out = out if stored.unpacks < stored.handles else None
                if profiler is not None:
                    profiler.record_rebuilt(handle.key, out.untyped_storage().nbytes())
            if stored is not None:
                stored.unpacked = True
            if not it._backward_watched:
                self._watch_backward(it)
            if it.prefetch_cursor < it.prefetch_end:
                # a duplicate read first stands for the key that stored the data (the plan's event)
                self._prefetch_after(it, stored.key if stored is not None else handle.key)
            counters = self.counters
            counters.unpacks += 1
            counters.unpack_s += time.perf_counter() - started
        if profiler is not None:
            profiler.record_unpack(handle.key, stamp, profiler.stamp())
        assert out is not None
        return out

    def _watch_backward(self, it: IterationState) -> None:
        """Be told when the backward running this unpack finishes: the micro-batch may be over
        (:meth:`IterationState.backward_ended`)."""
        if torch._C._current_graph_task_id() != -1:
            torch.autograd.Variable._execution_engine.queue_callback(functools.partial(self._backward_ended, it))
            it._backward_watched = True

    def _backward_ended(self, it: IterationState) -> None:
        with self._lock:
            it.backward_ended()

    def _materialize(self, stored: Stored, it: IterationState) -> torch.Tensor:
        """The rebuilt tensor of an offloaded or compressed ``stored``, on the device, ready for the compute stream."""
        held = stored.held_out
        if held is not None:
            return held
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
            if it.makes_room:  # room for what the rebuild holds, its strides' span (not only its data)
                self._make_room(it, stored.layout.rebuilt_nbytes)
            out, event, nbytes = self.transfers.fetch(stored)
            counters.add_resident(nbytes)
        if event is not None:
            self.transfers.hand_to_compute(out, event)
        # A storage's Python object lives as long as the storage (torch preserves it), so a weak
        # reference to it is told exactly when the storage is freed.
        self._handed_out[weakref.ref(out.untyped_storage(), self._storage_died)] = (nbytes, stored.key)
        stored.last_out = weakref.ref(out)
        return out

    def _make_room(self, it: IterationState, nbytes: int) -> None:
        """Under a budget whose policy moves tensors to the host, move kept ones not yet read back there,
        those saved first (read last in backward) first, while fetching ``nbytes`` would pass it: a
        raw keep as a swap, a compressed keep's buffers as they are (read back as a ``zvc-swap``).

        The plan keeps a tensor only where its profiled lifetime leaves room; a graph that changed
        since (deeper, another batch) holds its kept tensors longer, and backward must still fetch
        what it reads. The copies are synchronous: the room is needed now.
        """
        budget = it.plan.budget_bytes
        if not it.makes_room or budget is None:
            return
        counters = self.counters
        if counters.resident_bytes + nbytes <= budget:
            return
        for key in sorted(it.stored_by_key):
            stored = it.stored_by_key[key]()
            if stored is None or stored.unpacked or stored.owner is not None:
                continue
            if stored.action is Action.KEEP and stored.tensor is not None:
                moved = self._evict(stored)
            elif stored.action is Action.ZVC_KEEP and stored.packed is not None and stored.unsized is None:
                self._evict_compressed(stored)
                moved = True
            else:
                continue
            if moved:
                counters.budget_evictions += 1
                if counters.resident_bytes + nbytes <= budget:
                    return

    def _evict(self, stored: Stored) -> bool:
        """Swap a kept ``stored`` to host memory now; whether it moved."""
        layout = stored.layout
        try:
            flat = stored.tensor if layout.plain else layout.compact(stored.tensor)
        except torch.OutOfMemoryError:  # a strided view needs a gathered copy: no room for it
            return False
        self.transfers.copy_to_host(stored, flat, non_blocking=False)
        stored.tensor = None
        self.counters.kept_bytes -= layout.nbytes
        self._count_moved_out(stored, Action.SWAP, layout.nbytes)
        return True

    def _evict_compressed(self, stored: Stored) -> None:
        """Move the compression a ``zvc-keep`` ``stored`` holds on the device to host memory now (a
        ``zvc-swap`` from here)."""
        packed = stored.packed
        assert packed is not None
        self.transfers.evict_compressed(stored)
        self._count_moved_out(stored, Action.ZVC_SWAP, packed.compressed_nbytes)

    def _count_moved_out(self, stored: Stored, action: Action, transferred_bytes: int) -> None:
        """Count a kept ``stored`` (raw or compressed) that backward moved to the host, as ``action``
        from now on, having copied ``transferred_bytes``."""
        counters = self.counters
        counters.add_resident(-stored.held_bytes)
        stored.held_bytes = 0
        counters.offloaded_bytes += stored.layout.nbytes
        counters.transferred_bytes += transferred_bytes
        counters.actions[stored.action.value] -= 1
        counters.actions[action.value] += 1
        stored.action = action

    def _prefetch_after(self, it: IterationState, key: int) -> None:
        """Fetch the offloaded tensors that follow ``key`` in the profiled unpack order, within the budget."""
        position = it.unpack_position.get(key)
        window = it.prefetch_window_bytes
        if position is None or window <= 0:
            return
        plan = it.plan
        order = plan.unpack_order
        end = it.prefetch_end
        stored_of = it.stored_by_key.get
        budget = plan.budget_bytes
        counters = self.counters
        fetch, add_resident = self.transfers.fetch, counters.add_resident
        i = max(position + 1, it.prefetch_cursor)
        while i < end:
            ref = stored_of(order[i])
            stored = ref() if ref is not None else None
            if stored is None or stored.action not in _OFFLOADING or stored.unpacked or stored.prefetched is not None:
                i += 1
                continue
            nbytes = stored.layout.nbytes
            if self._prefetched_bytes + nbytes > window:
                break
            if budget is not None and counters.resident_bytes + nbytes > budget:
                break
            out, event, held = fetch(stored)
            stored.prefetched = (out, event)
            stored.prefetched_bytes = held
            self._prefetched_bytes += held
            add_resident(held)
            counters.prefetches += 1
            i += 1
        it.prefetch_cursor = i
