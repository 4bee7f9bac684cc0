"""The planner's candidates: for each saved tensor, what each way of storing it holds and costs.

An :class:`Option` is one action carried out one way: the bytes it holds over the iteration's events
(see :mod:`cswap.planner.lifetime`) and its predicted seconds from the cost model. Per tensor:

* ``keep``: the raw bytes from pack to free; no cost.
* ``zvc-keep``: raw plus compressed at pack (while compressing), compressed until the unpack, then
  raw plus compressed until free (the stored data lives as long as autograd holds the saved
  tensor, beside the rebuilt one); costs ``Time_c + Time_dc``.
* ``swap`` / ``zvc-swap``: raw (plus compressed) at pack; then the stored bytes stay while the
  device-to-host copy is in flight (``Size/BW_d2h`` seconds from the pack, its exposed part
  ``max(Size/BW_d2h - Hidden_f, 0)`` costed as in ``T'``), or, in the **waiting** variant, pack
  waits for the copy (nothing stays; the whole copy is exposed: the stall the budget forces). In
  backward the copy back is issued ``d`` events before the unpack (``d`` in the prefetch
  distances; ``0``: on demand), so the stored bytes are held from there, and ``max(Size/BW_h2d -
  Hidden_b, 0)`` is exposed with ``Hidden_b`` the compute of those ``d`` events. Each copy also
  costs the spec's ``copy_latency_s`` (its launch and DMA setup), each way. ``zvc-swap``
  adds ``Time_c + Time_dc`` and moves the compressed bytes. On the host, the copy (raw, or the
  compressed bytes) is held from the pack to the free point (:attr:`Option.host_holds`), whatever
  the variant: the host budget bounds these.
* ``host-zvc-swap`` (vDNN++, offered only when ``actions`` names it: under a host budget): on the
  device exactly ``swap``'s holds, as the raw bytes cross the link both ways. On the host, the raw
  copy and the compressed bytes (the worker writes them beside it) from the pack to the first
  event after the copy and the host compression (``host_compress_s``) are done (where the
  executor collects the compression when the workers keep up; under a host budget a pack waits
  for it where its copy would pass the budget), then the compressed bytes to the free point.
  It costs ``swap``'s time, with the host decompression before the copy back exposed as
  ``max(host_decompress_s + Size/BW_h2d - Hidden_b, 0)``, and on a CPU device (no asynchronous
  copies) the host compression too, which shares the cores with the compute. So it is never
  cheaper than a swap: it is chosen only where the host budget binds.

* ``recompute``: the raw bytes at its pack only (the op writes them, then they are dropped), nothing
  until backward, then the raw bytes from the event before its unpack (the recomputed segment is
  resident while it runs) until it is freed; costs ``recompute_s``, the forward seconds of its
  producing op. This is a simplification of checkpointing: each tensor is rebuilt on its own from
  inputs that are kept, so neither the inputs' bytes during the re-run nor chains of recomputed
  tensors (one re-run rebuilding several) are modelled. A tensor without ``recompute_s`` (unknown
  forward time) gets no ``recompute`` option.

A **shared storage** (:class:`SharedStorage`): a later saved tensor that is another view of an earlier
one's storage, no larger, is held as that storage when both are kept, as the executor counts it: once,
until the later of the two is freed. Its keep then adds its ``credit_holds`` to the sum of the two
keeps (:meth:`PlanningProblem.shared_credit`); any other pair of options holds what each holds.

Compression never stores more than the raw bytes: where ZVC would not shrink a tensor, no ``zvc``
option is offered. Within one action, an option that holds no fewer bytes at every event and costs
no less than another is dropped.

Example:
    >>> from cswap.planner.lifetime import lifetimes_from_orders
    >>> events = lifetimes_from_orders([0, 1], [1, 0])
    >>> specs = [TensorSpec(key=k, nbytes=1000, lifetime=lt) for k, lt in enumerate(events.lifetimes)]
    >>> problem = build_problem(specs, events, event_times_s=[0.0, 1.0, 2.0, 3.0], backward_start_s=1.5,
    ...                         link=LinkModel(d2h_gbps=1e-6, h2d_gbps=1e-6))
    >>> sorted({o.action for t in problem.tensors for o in t.options})
    ['keep', 'swap']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cswap.planner.actions import HOST_ZVC_SWAP, KEEP, RECOMPUTE, SWAP, ZVC_KEEP, ZVC_SWAP
from cswap.planner.lifetime import EventTimeline, Lifetime, resident_bytes

__all__ = [
    "DEFAULT_PREFETCH_DISTANCES", "LinkModel", "Option", "PlanningProblem", "SharedStorage", "TensorOptions", "TensorSpec", "build_problem",
]

#: Backward events ahead of its unpack that a swapped tensor's copy back may be issued.
DEFAULT_PREFETCH_DISTANCES: tuple[int, ...] = (0, 1, 2, 4, 8)


@dataclass(frozen=True)
class LinkModel:
    """The host link as the planner sees it.

    Attributes:
        d2h_gbps, h2d_gbps: bandwidth each way, GB/s (1e9 bytes per second).
        async_copies: copies overlap compute (a GPU's copy engines); ``False`` (a CPU): copies
            finish inside pack and unpack, nothing is in flight or prefetched.
    """

    d2h_gbps: float
    h2d_gbps: float
    async_copies: bool = True

    def __post_init__(self) -> None:
        if not (self.d2h_gbps > 0 and self.h2d_gbps > 0):
            raise ValueError(f"link bandwidths must be positive, got d2h {self.d2h_gbps}, h2d {self.h2d_gbps} GB/s")


@dataclass(frozen=True)
class TensorSpec:
    """What the planner needs to know of one saved tensor.

    Attributes:
        key: the tensor's key in the plan (its ordinal in the pack sequence).
        nbytes: raw bytes.
        lifetime: its events.
        compressed_nbytes: exact size by ``codec``, or ``None`` when no codec can encode its dtype.
        codec: the codec that gives it the fewest bytes (:func:`cswap.planner.codec_choice.codec_for`).
        compress_s, decompress_s: predicted codec seconds on the device.
        host_compress_s, host_decompress_s: predicted seconds of the host codec (the ``cpu``
            backend, on the host copy): what ``host-zvc-swap`` adds.
        hidden_forward_s: compute a copy out issued at its pack can overlap (``Hidden_f``).
        rebuilt_nbytes: device bytes of the tensor rebuilt at its unpack (default ``nbytes``; more
            for a strided view rebuilt in a buffer spanning its strides).
        movable: ``False``: it may only be kept (below ``min_bytes``, or pinned).
        recompute_s: forward seconds of its producing op (what recomputing it costs), or ``None``
            when unknown: then it is never recomputed.
        copy_latency_s: fixed seconds each copy of it over the link costs whatever its size, added
            to the copy out and to the copy back, hidden or not (the runtime's problem under a
            budget sets :data:`cswap.planner.costmodel.COPY_LATENCY_S` on tensors below
            ``min_bytes``: moving many small tensors is not free).
        storage_nbytes: the bytes of the storage it is a view of, where more than ``nbytes``: what
            keeping it holds (a slice keeps all of a larger tensor), or ``None``.
    """

    key: int
    nbytes: int
    lifetime: Lifetime
    compressed_nbytes: int | None = None
    codec: str = "zvc"
    compress_s: float = 0.0
    decompress_s: float = 0.0
    hidden_forward_s: float = 0.0
    host_compress_s: float = 0.0
    host_decompress_s: float = 0.0
    movable: bool = True
    rebuilt_nbytes: int | None = None
    recompute_s: float | None = None
    copy_latency_s: float = 0.0
    storage_nbytes: int | None = None

    def __post_init__(self) -> None:
        if self.recompute_s is not None and not self.recompute_s >= 0:
            raise ValueError(f"tensor {self.key}: recompute_s must be >= 0 seconds or None, got {self.recompute_s}")
        if not self.copy_latency_s >= 0:
            raise ValueError(f"tensor {self.key}: copy_latency_s must be >= 0 seconds, got {self.copy_latency_s}")

    @property
    def kept_nbytes(self) -> int:
        """Device bytes keeping it holds: its storage's where larger than its own."""
        return max(self.nbytes, self.storage_nbytes or 0)

    @property
    def unpacked_nbytes(self) -> int:
        """Device bytes the tensor takes once rebuilt for backward."""
        return self.rebuilt_nbytes if self.rebuilt_nbytes is not None else self.nbytes


@dataclass(frozen=True)
class Option:
    """One way to store one tensor.

    Attributes:
        action: an action name (:data:`cswap.planner.actions.ACTIONS`).
        cost_s: predicted seconds it adds to the iteration.
        holds: ``(first_event, last_event, nbytes)`` segments of device memory it holds.
        wait_offload: pack waits for the copy out to finish.
        prefetch_distance: events before its unpack that the copy back is issued (swaps only).
        fetched_ahead: the hold of its copy back before the unpack, if it is fetched ahead.
        host_holds: ``(first_event, last_event, nbytes)`` segments of host memory it holds: a
            swap's host copy (raw for ``swap``, compressed for ``zvc-swap``) from its pack to its
            free point, as :func:`cswap.planner.hostpool.host_pool_of` lays it out; nothing for
            the actions that stay on the device.
    """

    action: str
    cost_s: float
    holds: tuple[tuple[int, int, int], ...]
    wait_offload: bool = False
    prefetch_distance: int | None = None
    fetched_ahead: tuple[int, int, int] | None = None
    host_holds: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True)
class TensorOptions:
    """The options of one tensor (``keep`` always among them), its lifetime, and its planned
    compressed size by ``codec`` (``None``: no codec can encode it)."""

    key: int
    nbytes: int
    options: tuple[Option, ...]
    lifetime: Lifetime | None = None
    compressed_nbytes: int | None = None
    codec: str = "zvc"

    @property
    def kept_nbytes(self) -> int:
        """Device bytes its ``keep`` holds: its storage's, for a slice of a larger one
        (:attr:`TensorSpec.kept_nbytes`)."""
        return max((nbytes for o in self.options if o.action == KEEP for _, _, nbytes in o.holds), default=0)


@dataclass(frozen=True)
class SharedStorage:
    """A saved tensor that is another view of an earlier saved tensor's storage, no larger.

    Kept both, the executor counts the storage once, as the owner's kept bytes, from the owner's
    pack until the later of the two is freed; the sum of the two keeps counts the view's kept bytes
    again while both live, and the owner's only to the owner's own free (kept bytes:
    :attr:`TensorSpec.kept_nbytes`, all of the storage for a slice of an activation).

    Attributes:
        owner_key: the earlier tensor, whose keep counts the storage.
        view_key: the later one.
        credit_holds: ``(first_event, last_event, nbytes)`` segments added to the two keeps' holds
            when both are kept: the view's bytes taken off while both live, and the owner's bytes
            beyond the view's added where the view outlives the owner.
    """

    owner_key: int
    view_key: int
    credit_holds: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class PlanningProblem:
    """Every tensor's options over one iteration's events.

    Attributes:
        tensors: per saved tensor.
        event_count: events of the timeline.
        forward_events: how many of them are packs.
        shared: the pairs of tensors that are views of one storage (:class:`SharedStorage`).
    """

    tensors: tuple[TensorOptions, ...]
    event_count: int
    forward_events: int
    shared: tuple[SharedStorage, ...] = ()

    def holds(self, option: Option) -> np.ndarray:
        """The bytes ``option`` holds at each event."""
        return resident_bytes(self.event_count, option.holds)

    def host_holds(self, option: Option) -> np.ndarray:
        """The host bytes ``option`` holds at each event."""
        return resident_bytes(self.event_count, option.host_holds)

    def shared_credit(self, actions: Mapping[int, str]) -> np.ndarray:
        """What the shared storages change in the resident bytes at each event when each tensor
        (by key) takes its action in ``actions``: the credit of every pair kept both (zero or
        less at every event but where a view outlives its owner).

        Example:
            >>> problem = PlanningProblem((), 4, 2, shared=(SharedStorage(0, 1, ((1, 2, -8),)),))
            >>> problem.shared_credit({0: "keep", 1: "keep"}).tolist(), problem.shared_credit({0: "swap", 1: "keep"}).tolist()
            ([0, -8, -8, 0], [0, 0, 0, 0])
        """
        segments = [s for pair in self.shared if actions.get(pair.owner_key) == KEEP == actions.get(pair.view_key)
                    for s in pair.credit_holds]
        return resident_bytes(self.event_count, segments)


def _seconds(nbytes: float, gbps: float) -> float:
    return nbytes / (gbps * 1e9)


def _segment(start: int, end: int, nbytes: int) -> list[tuple[int, int, int]]:
    return [(start, end, int(nbytes))] if start <= end and nbytes > 0 else []


def _keep_options(spec: TensorSpec, last_event: int) -> list[Option]:
    life = spec.lifetime
    options = [Option(KEEP, 0.0, tuple(_segment(life.pack, life.free, spec.kept_nbytes)))]
    compressed = spec.compressed_nbytes
    if not spec.movable or compressed is None or compressed >= spec.nbytes:
        return options
    raw = spec.nbytes
    if life.unpack is None:
        holds = _segment(life.pack, life.pack, raw + compressed) + _segment(life.pack + 1, life.free, compressed)
        return [*options, Option(ZVC_KEEP, spec.compress_s, tuple(holds))]
    holds = (
        _segment(life.pack, life.pack, raw + compressed)
        + _segment(life.pack + 1, life.unpack - 1, compressed)
        + _segment(life.unpack, life.free, spec.unpacked_nbytes + compressed)
    )
    return [*options, Option(ZVC_KEEP, spec.compress_s + spec.decompress_s, tuple(holds))]


def _recompute_option(spec: TensorSpec, forward_events: int) -> Option:
    life = spec.lifetime
    holds = _segment(life.pack, life.pack, spec.nbytes)
    if life.unpack is not None:
        holds += _segment(max(life.unpack - 1, forward_events, life.pack + 1), life.free, spec.nbytes)
    return Option(RECOMPUTE, float(spec.recompute_s or 0.0) if life.unpack is not None else 0.0, tuple(holds))


def _swap_options(
    spec: TensorSpec,
    action: str,
    events: EventTimeline,
    times: np.ndarray,
    backward_start_s: float,
    link: LinkModel,
    distances: Sequence[int],
) -> list[Option]:
    life = spec.lifetime
    raw = spec.nbytes
    compressing = action == ZVC_SWAP
    on_host = action == HOST_ZVC_SWAP  # raw over the link, compressed on the host
    stored = int(spec.compressed_nbytes) if compressing else raw
    codec_s = (spec.compress_s + (spec.decompress_s if life.unpack is not None else 0.0)) if compressing else 0.0
    if on_host and not link.async_copies:
        codec_s = spec.host_compress_s  # a CPU device: the worker threads share the compute's cores
    # Decompressed on the host before the copy back can start: it adds to the copy's own time.
    before_in_s = spec.host_decompress_s if on_host else 0.0
    at_pack = _segment(life.pack, life.pack, raw + (stored if compressing else 0))
    out_s = _seconds(stored, link.d2h_gbps)
    # each copy's fixed latency is paid by the hook that issues it, whatever the compute hides
    latency_s = spec.copy_latency_s
    forward = [(True, [], out_s + latency_s)]  # (waits, holds after the pack, exposed seconds)
    if link.async_copies:
        done_at = times[life.pack] + out_s
        first_after = int(np.searchsorted(times, done_at, side="left"))
        first_after = max(first_after, life.pack + 1)
        forward.append((False, [(life.pack + 1, first_after - 1)], max(out_s - spec.hidden_forward_s, 0.0) + latency_s))
    backward: list[tuple[int | None, list[tuple[int, int, int]], float, int, tuple[int, int, int] | None]] = []
    if life.unpack is None:
        backward.append((None, [], 0.0, events.event_count, None))
    else:
        in_s = before_in_s + _seconds(stored, link.h2d_gbps)
        rebuilt = spec.unpacked_nbytes
        at_unpack = _segment(life.unpack, life.unpack, rebuilt + (stored if compressing else 0)) + _segment(
            life.unpack + 1, life.free, rebuilt
        )
        seen: set[int] = set()
        for distance in distances if link.async_copies else (0,):
            fetch = max(life.unpack - distance, events.forward_events)
            if fetch in seen:
                continue
            seen.add(fetch)
            issued_s = backward_start_s if distance > 0 and life.unpack - distance < events.forward_events else times[fetch]
            hidden_s = times[life.unpack] - issued_s if distance > 0 else 0.0
            ahead = _segment(fetch, life.unpack - 1, stored)
            exposed_s = max(in_s - hidden_s, 0.0) + latency_s
            backward.append((life.unpack - fetch, ahead + at_unpack, exposed_s, fetch, ahead[0] if ahead else None))
    # The host copy is written at the pack and dies with the saved tensor's handle, at its free
    # point (never at the unpack: unpack may run again): the lifetime the host pool lays out.
    host = tuple(_segment(life.pack, life.free, stored))
    if on_host:
        # on a CPU device the copy is done inside the pack, which the event times already hold
        host = _host_compressed_holds(spec, times, out_s if link.async_copies else 0.0)
    options = []
    for waits, inflight, forward_s in forward:
        for distance, holds, backward_s, fetch, ahead_hold in backward:
            flying = [s for start, end in inflight for s in _segment(start, min(end, fetch - 1), stored)]
            options.append(
                Option(
                    action,
                    codec_s + forward_s + backward_s,
                    tuple(at_pack + flying + holds),
                    wait_offload=waits,
                    prefetch_distance=distance,
                    fetched_ahead=ahead_hold,
                    host_holds=host,
                )
            )
    return options


def _host_compressed_holds(spec: TensorSpec, times: np.ndarray, out_s: float) -> tuple[tuple[int, int, int], ...]:
    """``host-zvc-swap``'s host bytes as the executor counts them: from the pack, the raw copy and
    the room the worker writes the compressed buffers to, beside it, up to the first event once
    the copy and the compression are done, where the training thread collects them and frees the
    raw copy; then the compressed bytes to the free point."""
    life = spec.lifetime
    compressed = int(spec.compressed_nbytes or 0)
    done_s = times[life.pack] + out_s + spec.host_compress_s
    collected = max(int(np.searchsorted(times, done_s, side="left")), life.pack + 1)
    collected = min(collected, life.free)
    return tuple(_segment(life.pack, collected, spec.nbytes + compressed) + _segment(collected + 1, life.free, compressed))


def _prune(problem_events: int, options: list[Option]) -> tuple[Option, ...]:
    # within one action, drop an option that holds no fewer bytes anywhere and costs no less
    kept: list[Option] = []
    profiles = [resident_bytes(problem_events, o.holds) for o in options]
    for i, option in enumerate(options):
        dominated = False
        for j, other in enumerate(options):
            if i == j or other.action != option.action:
                continue
            no_worse = other.cost_s <= option.cost_s and bool(np.all(profiles[j] <= profiles[i]))
            strictly = other.cost_s < option.cost_s or bool(np.any(profiles[j] < profiles[i])) or j < i
            if no_worse and strictly:
                dominated = True
                break
        if not dominated:
            kept.append(option)
    return tuple(kept)


def build_problem(
    specs: Sequence[TensorSpec],
    events: EventTimeline,
    event_times_s: Sequence[float],
    backward_start_s: float,
    link: LinkModel,
    prefetch_distances: Sequence[int] = DEFAULT_PREFETCH_DISTANCES,
    actions: Sequence[str] = (KEEP, SWAP, ZVC_SWAP, ZVC_KEEP, RECOMPUTE),
    views: Mapping[int, int] | None = None,
) -> PlanningProblem:
    """Every tensor's options (see the module docstring).

    Args:
        specs: the saved tensors (their lifetimes index ``events``).
        events: the iteration's event timeline.
        event_times_s: when each event happens, seconds since forward began (non-decreasing).
        backward_start_s: when backward begins.
        link: the host link.
        prefetch_distances: the distances (in events) a copy back may be issued ahead of need.
        actions: which actions to build options for. ``host-zvc-swap`` is left out by default:
            it only pays under a host budget, and offering it elsewhere would only grow the program.
        views: view key -> owner key: a tensor that is another view of an earlier one's storage
            (:class:`SharedStorage`).

    Raises:
        ValueError: times that do not match the events, or a negative distance.
    """
    times = np.asarray(event_times_s, dtype=float)
    if times.shape != (events.event_count,) or np.any(np.diff(times) < 0):
        raise ValueError(f"need {events.event_count} non-decreasing event times, got {times.shape[0]}")
    if any(d < 0 for d in prefetch_distances):
        raise ValueError(f"prefetch distances must be >= 0, got {list(prefetch_distances)}")
    tensors = []
    for spec in specs:
        options = _keep_options(spec, events.event_count - 1)
        if ZVC_KEEP not in actions:
            options = [o for o in options if o.action != ZVC_KEEP]
        if spec.movable:
            for action in (SWAP, ZVC_SWAP, HOST_ZVC_SWAP):
                if action not in actions:
                    continue
                if action != SWAP and (spec.compressed_nbytes is None or spec.compressed_nbytes >= spec.nbytes):
                    continue  # compression would not shrink it (or cannot encode it)
                options += _swap_options(spec, action, events, times, backward_start_s, link, prefetch_distances)
            if RECOMPUTE in actions and spec.recompute_s is not None:
                options.append(_recompute_option(spec, events.forward_events))
        tensors.append(
            TensorOptions(key=spec.key, nbytes=spec.nbytes, options=_prune(events.event_count, options), lifetime=spec.lifetime,
                          compressed_nbytes=spec.compressed_nbytes, codec=spec.codec)
        )
    return PlanningProblem(tensors=tuple(tensors), event_count=events.event_count, forward_events=events.forward_events,
                           shared=_shared_storages(specs, views or {}))


def _shared_storages(specs: Sequence[TensorSpec], views: Mapping[int, int]) -> tuple[SharedStorage, ...]:
    by_key = {spec.key: spec for spec in specs}
    pairs = []
    for view_key, owner_key in views.items():
        view, owner = by_key.get(view_key), by_key.get(owner_key)
        if view is None or owner is None or view.kept_nbytes > owner.kept_nbytes:
            continue  # the executor counts a view larger than its owner's hold on its own
        first, last = max(owner.lifetime.pack, view.lifetime.pack), min(owner.lifetime.free, view.lifetime.free)
        if first > last:
            continue  # never alive together
        credit = ((first, last, -view.kept_nbytes),
                  *_segment(owner.lifetime.free + 1, view.lifetime.free, owner.kept_nbytes - view.kept_nbytes))
        pairs.append(SharedStorage(owner_key, view_key, credit))
    return tuple(pairs)
