"""The queue model: one compute stream and one copy engine each way, replayed event by event.

Resources, each a FIFO queue:

* the **compute stream** runs the timeline's compute and, in this model, the device codec: ZVC
  kernels are memory-bound and fill every SM with grid-stride loops, so on a side stream they would
  time-slice the same SMs and delay compute by as much; putting them on the compute stream says
  so directly, and is what the paper's ``T`` charges (``Time_c + Time_dc`` in full);
* the **D2H engine** and the **H2D engine** (full duplex); with ``async_copies=False`` (a CPU)
  copies run on the compute stream instead;
* the **host CPU** for host-side (de)compression (``cpu-compress-swap``).

Forward: a tensor is produced when compute reaches its point; a compressed one is compressed
right away on the compute stream; its swap-out is queued on the D2H engine as soon as it (or its
compressed form) exists. Compute does not wait for swap-outs unless ``max_inflight_offloads`` is
set, in which case it waits, before queuing another, until fewer are in flight, and at the end of
forward until all are done (vDNN's per-layer synchronisation when it is 1). A host-compressed
tensor is compressed by the host after its copy has landed.

Backward: swap-ins are queued in the order backward needs tensors, ``prefetch_depth`` ahead (and
within ``prefetch_bytes``): the first ones when backward starts, the next each time one is used.
A swap-in starts when it is issued, its swap-out (and host compression) is done and the engine is
free; a host-compressed tensor is decompressed on the host first. Compute waits for a tensor that
is not back, then decompresses it on the compute stream. The iteration ends when compute and every
queue are done.

Runtime overhead (CPU profiles): with hooks installed (every policy but ``none``) compute waits
``iteration_overhead_s`` once and ``hook_overhead_s`` at every pack and every first unpack, plus
``move_overhead_s`` at those of a tensor that is not kept as it is.

Memory budget (``budget_bytes``): the queue model enforces it as the runtime does. Bytes are
counted from the moment they are asked for (a swap-in from when it is issued). Before a pack holds
a tensor that would take the count past the budget, compute waits for the oldest swap-outs in
flight to finish; a swap-in is issued ahead of need only within the budget (else when its tensor
is needed, after the previous operator's tensors are freed). The wait is exposed transfer time.

Recompute regions (activation checkpointing): the records of a :class:`RecomputeRegion` are
dropped once written in forward; when backward first needs one of them, compute runs the region's
forward seconds again and all of them are held from then until each one's own use ends. A record
recomputed outside every region is rebuilt alone, for its producing op's seconds, when it is needed.

Memory: a tensor occupies the device from production until its swap-out ends (compressed size
after compression), again from the start of its swap-in (and full size from the start of its
decompression), until the backward operator that uses it ends, i.e. until compute reaches the
next use. Kept tensors stay from production to use. Only offloadable records are counted. A kept
record that is another view of a kept record's storage, no larger than it (``views``), holds no
bytes of its own: that storage is counted once, until the last of the two is used.

Example:
    >>> from cswap.simulate.timeline import Timeline
    >>> from cswap.simulate.policies import Action, RecomputeRegion, TensorCost
    >>> tl = Timeline(forward_s=1.0, backward_s=1.0, produced_s=(0.0,), consumed_s=(1.0,))
    >>> cost = TensorCost(2_000_000_000, 1e9, 0.5, 4, 0.0, 0.0, 0.0, 0.0)
    >>> out = run_queues(tl, [cost], [Action.SWAP], QueueParams(d2h_gbps=1.0, h2d_gbps=1.0))
    >>> out.iteration_s, out.exposed_transfer_s    # 2 s each way against 1 s of compute each side
    (4.0, 2.0)
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from cswap.simulate.policies import Action, RecomputeRegion, TensorCost
from cswap.simulate.timeline import Timeline

__all__ = ["QueueOutcome", "QueueParams", "run_queues"]


@dataclass(frozen=True)
class QueueParams:
    """How the queues run.

    Args:
        d2h_gbps, h2d_gbps: link bandwidth each way, GB/s.
        async_copies: copies on copy engines (``False``: on the compute stream).
        prefetch_depth: swap-ins issued ahead of need, in tensors (>= 1).
        prefetch_bytes: also cap the bytes fetched ahead of need (``None``: no cap); the next
            tensor is always fetched once nothing else is outstanding.
        max_inflight_offloads: cap on swap-outs in flight before compute waits (``None``: none).
        hook_overhead_s: compute-stream seconds per pack and per first unpack (hooks installed).
        move_overhead_s: extra seconds per pack and first unpack of a tensor not kept as it is.
        iteration_overhead_s: compute-stream seconds once per iteration (hooks installed).
        budget_bytes: the memory budget to enforce (module docstring), or ``None``.
    """

    d2h_gbps: float
    h2d_gbps: float
    async_copies: bool = True
    prefetch_depth: int = 1
    prefetch_bytes: int | None = None
    max_inflight_offloads: int | None = None
    hook_overhead_s: float = 0.0
    move_overhead_s: float = 0.0
    iteration_overhead_s: float = 0.0
    budget_bytes: int | None = None

    def __post_init__(self) -> None:
        if not (self.d2h_gbps > 0 and self.h2d_gbps > 0):
            raise ValueError(f"link bandwidths must be positive, got d2h {self.d2h_gbps}, h2d {self.h2d_gbps} GB/s")
        if self.prefetch_depth < 1:
            raise ValueError(f"prefetch_depth must be >= 1, got {self.prefetch_depth}")
        if self.prefetch_bytes is not None and self.prefetch_bytes < 0:
            raise ValueError(f"prefetch_bytes must be >= 0 or None, got {self.prefetch_bytes}")
        if self.max_inflight_offloads is not None and self.max_inflight_offloads < 1:
            raise ValueError(f"max_inflight_offloads must be >= 1 or None, got {self.max_inflight_offloads}")
        if self.budget_bytes is not None and self.budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be positive or None, got {self.budget_bytes}")


@dataclass(frozen=True)
class QueueOutcome:
    """What the queue model gives for one plan.

    ``iteration_s == compute_s + exposed_transfer_s + codec_s + overhead_s``.

    Attributes:
        iteration_s: forward + backward wall time.
        compute_s: the timeline's compute.
        exposed_transfer_s: time compute waited for copies (and host codec work behind them), plus
            the tail after compute while queues drain.
        codec_s: device (de)compression and recomputation (extra forward work in backward) on the compute stream.
        overhead_s: the runtime's own hook and iteration work on the compute stream.
        host_codec_s: busy time of the host codec (not on the compute stream; hurts only through waits).
        peak_bytes: peak device bytes of saved activations (resident, compressed, or being copied).
        forward_end_s: when forward compute ended.
        recompute_s: the part of ``codec_s`` that is recomputation, so a report can show the codec's
            seconds and the recomputation's apart.
    """

    iteration_s: float
    compute_s: float
    exposed_transfer_s: float
    codec_s: float
    overhead_s: float
    host_codec_s: float
    peak_bytes: int
    forward_end_s: float
    recompute_s: float = 0.0


def _held_nbytes(cost: TensorCost, action: Action) -> float:
    """What a record holds on the device while it is alive on it: kept, its storage's bytes."""
    return float(cost.kept_nbytes) if action is Action.KEEP else float(cost.nbytes)


def _seconds(nbytes: float, gbps: float) -> float:
    return nbytes / (gbps * 1e9)


def _peak(events: list[tuple[float, float]]) -> int:
    # at equal times frees go first: a buffer released as another is allocated is a hand-over
    level = peak = 0.0
    for _, delta in sorted(events):
        level += delta
        peak = max(peak, level)
    return int(round(peak))


def _shared_storages(
    views: Sequence[int | None] | None, actions: Sequence[Action], costs: Sequence[TensorCost], counted: Sequence[bool]
) -> dict[int, int]:
    """Per kept record that is another view of a kept record's storage and no larger, that record
    (the runtime's executor counts such a storage once)."""
    if views is None:
        return {}
    if len(views) != len(actions):
        raise ValueError(f"need one view per record: {len(actions)} records, {len(views)} views")
    return {
        i: owner for i, owner in enumerate(views)
        if owner is not None and owner != i and counted[i] and counted[owner]
        and actions[i] is Action.KEEP and actions[owner] is Action.KEEP and costs[owner].kept_nbytes >= costs[i].kept_nbytes
    }


def _region_of(
    regions: Sequence[RecomputeRegion], actions: Sequence[Action], timeline: Timeline
) -> dict[int, tuple[int, tuple[int, ...], RecomputeRegion]]:
    """Per region record backward needs: (the region's first such record, all of them, the region)."""
    found: dict[int, tuple[int, tuple[int, ...], RecomputeRegion]] = {}
    seen: set[int] = set()
    for region in regions:
        for i in region.records:
            if i in seen:
                raise ValueError(f"record {i} lies in two recompute regions")
            seen.add(i)
            if actions[i] is not Action.RECOMPUTE:
                raise ValueError(f"record {i} of recompute region {region.label!r} has action {actions[i].value}, not recompute")
        needed = sorted((i for i in region.records if timeline.consumed_s[i] is not None), key=timeline.backward_key)
        for i in needed:
            found[i] = (needed[0], tuple(needed), region)
    return found


def run_queues(
    timeline: Timeline,
    costs: Sequence[TensorCost],
    actions: Sequence[Action],
    params: QueueParams,
    counted: Sequence[bool] | None = None,
    hooked: bool = False,
    fetch_after: Sequence[int | None] | None = None,
    regions: Sequence[RecomputeRegion] = (),
    views: Sequence[int | None] | None = None,
) -> QueueOutcome:
    """Replay one iteration under ``actions`` (one per record) and return its times and peak memory.

    Args:
        timeline: compute times.
        costs: per record sizes and codec seconds.
        actions: per record.
        params: link and prefetch settings.
        counted: per record, whether it counts towards ``peak_bytes`` (default: all).
        hooked: the runtime's hooks are installed (every policy but ``none``): charge ``params``'
            hook and iteration overheads.
        fetch_after: a plan's prefetch schedule: per record, the position in backward order from
            which its swap-in may be issued (-1: when forward ends; ``None``: when needed). It
            replaces ``prefetch_depth`` and ``prefetch_bytes``.
        regions: records rebuilt together (module docstring); each of them takes ``recompute``.
        views: per record, the record whose storage it is another view of, or ``None``
            (:attr:`cswap.profile.trace.TensorRecord.view_of`, as record indices).

    Raises:
        ValueError: lengths that do not match, or a region record that is not recomputed or lies
            in two regions.
    """
    count = len(timeline)
    if not len(costs) == len(actions) == count:
        raise ValueError(f"need one cost and one action per record: {count} records, {len(costs)} costs, {len(actions)} actions")
    counted = [True] * count if counted is None else list(counted)
    region_of = _region_of(regions, actions, timeline)
    shared = _shared_storages(views, actions, costs, counted)
    alive = Counter(shared.values())  # per owner, the records still holding its storage: its views and itself
    for owner in alive:
        alive[owner] += 1
    events: list[tuple[float, float]] = []

    # bytes asked for so far (a hold counts from when it is asked for, a release from when it is
    # done), the budget's view; ``pending`` are releases at the end of swap-outs still in flight
    level = 0.0
    pending: list[tuple[float, float]] = []
    budget = params.budget_bytes

    def hold(at: float, nbytes: float, i: int, asked: bool = True) -> None:
        nonlocal level
        if counted[i] and nbytes:
            events.append((at, nbytes))
            if asked:
                level += nbytes

    def release(at: float, nbytes: float, i: int, later: bool = False) -> None:
        nonlocal level
        if counted[i] and nbytes:
            events.append((at, -nbytes))
            if later:
                heapq.heappush(pending, (at, nbytes))
            else:
                level -= nbytes

    def let_go(at: float, i: int, nbytes: float) -> None:
        """Record ``i`` is done with: a storage kept by several views goes with the last of them."""
        owner = shared.get(i, i)
        if owner not in alive:
            release(at, nbytes, i)
            return
        alive[owner] -= 1
        if not alive[owner]:
            release(at, costs[owner].kept_nbytes, owner)

    def settle(at: float) -> None:
        nonlocal level
        while pending and pending[0][0] <= at:
            level -= heapq.heappop(pending)[1]

    def make_room(at: float, nbytes: float, i: int) -> float:
        """Wait for swap-outs in flight until ``nbytes`` more fit the budget; returns the new time."""
        nonlocal level
        settle(at)
        if budget is None or not counted[i]:
            return at
        while pending and level + nbytes > budget:
            done, freed = heapq.heappop(pending)
            at = max(at, done)
            level -= freed
        return at

    exposed = codec = host_codec = recompute = 0.0
    d2h_free = h2d_free = host_free = 0.0
    on_host = [0.0] * count  # when the host copy (after host compression) is complete
    inflight: deque[float] = deque()

    overhead = params.iteration_overhead_s if hooked else 0.0

    def hook_s(action: Action) -> float:
        if not hooked:
            return 0.0
        return params.hook_overhead_s + (params.move_overhead_s if action is not Action.KEEP else 0.0)

    # ------------------------------------------------------------------ forward
    t = shift = overhead
    for i in timeline.forward_order():
        action, cost = actions[i], costs[i]
        # never before the record packed before it: two records one op saves at one time would
        # otherwise round apart by the shift, the second a step before the first
        t = max(timeline.produced_s[i] + shift, t)
        # a shared storage is held by the view that owns it; a kept slice of an activation holds all of it
        held = 0.0 if i in shared else _held_nbytes(cost, action)
        need = held + (cost.compressed_nbytes if action.device_codec else 0.0)
        waited = make_room(t, need, i)
        exposed += waited - t
        t = waited
        hold(t, held, i)
        hook = hook_s(action)
        t += hook
        overhead += hook
        if action is Action.RECOMPUTE:
            release(t, cost.nbytes, i)  # dropped once written; rebuilt in backward
        if action.device_codec:
            hold(t, cost.compressed_nbytes, i)
            t += cost.compress_s
            codec += cost.compress_s
            release(t, cost.nbytes, i)
        if action.transfers:
            nbytes = cost.transfer_nbytes(action)
            duration = _seconds(nbytes, params.d2h_gbps)
            if params.async_copies:
                limit = params.max_inflight_offloads
                while inflight and inflight[0] <= t:
                    inflight.popleft()
                while limit is not None and len(inflight) >= limit:
                    done = inflight.popleft()
                    if done > t:
                        exposed += done - t
                        t = done
                start = max(t, d2h_free)
                end = d2h_free = start + duration
                inflight.append(end)
            else:
                end = t = t + duration
                exposed += duration
            release(end, cost.resident_nbytes(action), i, later=params.async_copies)
            if action is Action.HOST_ZVC_SWAP:
                start = max(end, host_free)
                on_host[i] = host_free = start + cost.host_compress_s
                host_codec += cost.host_compress_s
            else:
                on_host[i] = end
        shift = t - timeline.produced_s[i]
    forward_end = timeline.forward_s + shift
    if params.async_copies and params.max_inflight_offloads is not None and inflight and inflight[-1] > forward_end:
        exposed += inflight[-1] - forward_end
        forward_end = inflight[-1]

    # ------------------------------------------------------------------ backward
    order = timeline.backward_order()
    fetches = [i for i in order if actions[i].transfers]
    ready: dict[int, float] = {}
    outstanding: deque[int] = deque()
    outstanding_nbytes = 0.0
    unissued = list(fetches)
    position = -1  # where backward is in ``order``; -1: it has not started

    def issue(at: float, needed: int | None = None) -> float:
        """Issue swap-ins ahead of need; ``needed``: the record compute wants now, issued at any rate."""
        nonlocal outstanding_nbytes, h2d_free, host_free, host_codec
        for j in list(unissued):
            cost, action = costs[j], actions[j]
            forced = j == needed
            if not forced and fetch_after is not None:
                allowed = fetch_after[j]
                if allowed is None or allowed > position:
                    continue
            elif not forced:
                if len(outstanding) >= params.prefetch_depth:
                    return at
                if params.prefetch_bytes is not None and outstanding and outstanding_nbytes + cost.nbytes > params.prefetch_bytes:
                    return at
            incoming = cost.transfer_nbytes(action) if action is Action.ZVC_SWAP else cost.nbytes
            settle(at)
            if budget is not None and counted[j] and level + incoming > budget:
                if not forced:
                    if fetch_after is not None:
                        continue
                    return at
                at = make_room(at, incoming, j)
            source_ready = max(at, on_host[j])
            if action is Action.HOST_ZVC_SWAP:
                source_ready = host_free = max(source_ready, host_free) + cost.host_decompress_s
                host_codec += cost.host_decompress_s
            start = max(source_ready, h2d_free)
            ready[j] = h2d_free = start + _seconds(cost.transfer_nbytes(action), params.h2d_gbps)
            hold(start, incoming, j)
            outstanding.append(j)
            outstanding_nbytes += cost.nbytes
            unissued.remove(j)
        return at

    shift = forward_end
    if params.async_copies:
        issue(forward_end)
    finished: list[int] = []
    for position, i in enumerate(order):  # noqa: B007 (issue() above reads position)
        action, cost = actions[i], costs[i]
        t = max(timeline.consumed_s[i] + shift, t)
        for j in finished:
            let_go(t, j, _held_nbytes(costs[j], actions[j]))
        finished.clear()
        hook = hook_s(action)
        t += hook
        overhead += hook
        if budget is not None and params.async_copies:
            issue(t)  # what the budget held back may fit now that the last operator's tensors are gone
        if action.transfers:
            if params.async_copies:
                if i not in ready:
                    issued = issue(t, needed=i)
                    exposed += issued - t
                    t = issued
                if ready[i] > t:
                    exposed += ready[i] - t
                    t = ready[i]
                outstanding.remove(i)
                outstanding_nbytes -= cost.nbytes
            else:
                start = max(t, on_host[i])
                if action is Action.HOST_ZVC_SWAP:
                    start = max(start, host_free) + cost.host_decompress_s
                    host_free = start
                    host_codec += cost.host_decompress_s
                nbytes = cost.transfer_nbytes(action)
                start = make_room(start, nbytes if action is Action.ZVC_SWAP else cost.nbytes, i)
                hold(start, nbytes if action is Action.ZVC_SWAP else cost.nbytes, i)
                end = start + _seconds(nbytes, params.h2d_gbps)
                exposed += end - t
                t = end
        if action is Action.RECOMPUTE and timeline.consumed_s[i] is not None:
            if i not in region_of:
                t = make_room(t, cost.nbytes, i)
                hold(t, cost.nbytes, i)
                t += cost.recompute_s or 0.0
                recompute += cost.recompute_s or 0.0
            elif region_of[i][0] == i:  # the region's first record backward needs: run it again
                _, members, region = region_of[i]
                t = make_room(t, sum(costs[j].nbytes for j in members), i)
                for j in members:
                    hold(t, costs[j].nbytes, j)
                t += region.forward_s
                recompute += region.forward_s
        if action.device_codec:
            hold(t, cost.nbytes, i)
            t += cost.decompress_s
            codec += cost.decompress_s
            release(t, cost.compressed_nbytes, i)
        finished.append(i)
        shift = t - timeline.consumed_s[i]
        if params.async_copies and action.transfers:
            issue(t)
    backward_end = timeline.backward_s + shift
    for j in finished:
        let_go(backward_end, j, _held_nbytes(costs[j], actions[j]))
    for i in range(count):  # kept tensors backward never asked for live until the graph is freed
        if timeline.consumed_s[i] is None and not actions[i].transfers and actions[i] is not Action.RECOMPUTE:
            let_go(backward_end, i, costs[i].resident_nbytes(actions[i]))
    end = max(backward_end, d2h_free, h2d_free, host_free)
    exposed += end - backward_end
    return QueueOutcome(
        iteration_s=end,
        compute_s=timeline.compute_s,
        exposed_transfer_s=exposed,
        codec_s=codec + recompute,
        overhead_s=overhead,
        host_codec_s=host_codec,
        peak_bytes=_peak(events),
        forward_end_s=forward_end,
        recompute_s=recompute,
    )
