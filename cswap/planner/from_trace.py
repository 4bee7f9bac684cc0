"""The planner's problem from a profiled :class:`~cswap.profile.trace.Trace`, as the runtime plans it.

Each offloadable record becomes a :class:`~cswap.planner.problem.TensorSpec`: its lifetime from
:func:`cswap.planner.lifetime.lifetimes_from_trace`, its exact ZVC size from the codecs' encoding
(:class:`cswap.codecs.encoding.Encoding`: an int64 record with a ``narrow_dtype`` is sized and
timed at that width, as the encoding narrows it first), its codec
seconds from a :class:`~cswap.planner.costmodel.TimeModel`, and its ``hidden_forward_s``; a record
that is another view of an earlier one's storage (``view_of``) shares it
(:class:`~cswap.planner.problem.SharedStorage`). Events happen
at the records' ``pack_at_s`` and ``unpack_at_s``; records below ``min_bytes`` may only be kept, and
the copies of records below ``copy_latency_below`` each cost a fixed latency
(:data:`~cswap.planner.costmodel.COPY_LATENCY_S`). Under a budget the runtime's planners pass
``min_bytes=0, copy_latency_below=min_bytes``: a small tensor may move where the budget needs it,
and its copies' latency keeps it where the budget allows.
With a ``host_time_model`` (under a host budget), each spec also has the host codec's seconds (the
``cpu`` backend's) and the problem offers ``host-zvc-swap``.
Parameters and buffers are not part of the problem (their bytes are not activations).

Example:
    >>> from cswap.profile.trace import TensorRecord, Trace
    >>> recs = tuple(TensorRecord(key=k, shape=(1024,), dtype="float32", nbytes=4096, sparsity=0.5,
    ...                           pack_at_s=0.1 * k, unpack_at_s=1.0 - 0.1 * k) for k in range(3))
    >>> trace = Trace(tensors=recs, d2h_gbps=10.0, h2d_gbps=10.0, forward_s=0.5, backward_s=0.6)
    >>> class Free:
    ...     def compress_s(self, nbytes, density, itemsize, backend): return 0.0
    ...     def decompress_s(self, nbytes, density, itemsize, backend): return 0.0
    >>> problem = problem_from_trace(trace, Free(), backend="cpu")
    >>> [t.key for t in problem.tensors], problem.event_count
    ([0, 1, 2], 6)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import torch

from cswap.codecs.encoding import Encoding, encodable
from cswap.codecs.format import DEFAULT_CHUNK_WORDS
from cswap.planner.codec_choice import codec_for
from cswap.planner.actions import ACTIONS, HOST_ZVC_SWAP
from cswap.planner.costmodel import COPY_LATENCY_S, TimeModel, codec_seconds
from cswap.planner.lifetime import Lifetime, lifetimes_from_trace
from cswap.planner.problem import DEFAULT_PREFETCH_DISTANCES, LinkModel, PlanningProblem, TensorSpec, build_problem
from cswap.profile.trace import TensorRecord, Trace

__all__ = ["HOST_BACKEND", "problem_from_trace"]

#: The backend the host codec of ``host-zvc-swap`` runs (:mod:`cswap.execute.hostcodec`).
HOST_BACKEND = "cpu"


def _encoding(record: TensorRecord) -> Encoding | None:
    """How the codec encodes ``record``'s tensor, or ``None`` when ZVC cannot encode its dtype."""
    if not encodable(record.dtype):
        dtype = getattr(torch, record.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"trace record has unknown dtype {record.dtype!r}; expected a torch dtype name such as float32")
        return None
    return Encoding.named(record.dtype, record.narrow_dtype)


def _spec(  # type: ignore[no-untyped-def]
    record: TensorRecord, lifetime, time_model: TimeModel, backend: str, min_bytes: int, chunk_words: int, sparsity_margin: float,
    host_time_model: TimeModel | None = None, copy_latency_below: int = 0,
) -> TensorSpec:
    encoding = _encoding(record)
    latency_s = COPY_LATENCY_S if record.nbytes < copy_latency_below else 0.0
    used = record.unpack_at_s is not None or record.unpack_order is not None
    if encoding is None:
        return TensorSpec(key=record.key, nbytes=record.nbytes, lifetime=lifetime, hidden_forward_s=record.hidden_forward_s,
                          movable=record.nbytes >= min_bytes, rebuilt_nbytes=record.rebuilt_nbytes, copy_latency_s=latency_s,
                          storage_nbytes=record.storage_nbytes)
    numel = record.nbytes // encoding.dtype.itemsize
    encoded_nbytes = numel * encoding.encoded_itemsize
    sparsity = max(record.sparsity - sparsity_margin, 0.0)
    codec, compressed_nbytes = codec_for(record, encoding.compressed_nbytes(numel, sparsity, chunk_words), sparsity_margin)
    density = 1.0 - sparsity
    itemsize = encoding.encoded_itemsize

    def seconds(model: TimeModel, op: Literal["compress", "decompress"], on: str) -> float:
        return codec_seconds(model, op, encoded_nbytes, density, itemsize, on, codec)

    host: dict[str, float] = {}
    if host_time_model is not None:
        host["host_compress_s"] = seconds(host_time_model, "compress", HOST_BACKEND)
        host["host_decompress_s"] = seconds(host_time_model, "decompress", HOST_BACKEND) if used else 0.0
    return TensorSpec(
        key=record.key,
        nbytes=record.nbytes,
        lifetime=lifetime,
        compressed_nbytes=compressed_nbytes,
        codec=codec,
        compress_s=seconds(time_model, "compress", backend),
        decompress_s=seconds(time_model, "decompress", backend) if used else 0.0,
        hidden_forward_s=record.hidden_forward_s,
        movable=record.nbytes >= min_bytes,
        rebuilt_nbytes=record.rebuilt_nbytes,
        copy_latency_s=latency_s,
        storage_nbytes=record.storage_nbytes,
        **host,
    )


def _rebuilt_at(life: Mapping[int, Lifetime | None], forward_events: int, event_count: int, groups: Sequence[Sequence[int]],
                storage_of: Mapping[int, int], starts: Sequence[Sequence[int]] = ()) -> dict[int, tuple[int, int] | None]:
    """Per key of ``groups``, the events its group's recomputation holds it over (``None``: the group
    is never unpacked, so never recomputed).

    A recomputation rebuilds its whole group at once, at the event before the group's first
    unpack (of the keys ``starts`` names for it, when given: a key whose data a save outside the
    region shares was first unpacked there, not in the region's backward). The run rebuilds it a
    little later, once that event's node has run and freed what it alone read: the plan holds
    those bytes beside the group, which a run never does. torch then drops each
    rebuilt tensor once its node has used it, so a key is held to its own free, or to the latest
    free of the group's keys that share its storage (``storage_of``); a key backward never unpacks
    is held to the last event, as its saved slot lives until the graph is freed."""
    spans: dict[int, tuple[int, int] | None] = {}
    for index, group in enumerate(groups):
        lives = {k: life[k] for k in group if life.get(k) is not None}
        unpacks = [lt.unpack for lt in lives.values() if lt.unpack is not None]  # type: ignore[union-attr]
        if not unpacks:
            spans.update(dict.fromkeys(group))
            continue
        own = set(starts[index]) if index < len(starts) else set()
        own_unpacks = [lt.unpack for k, lt in lives.items() if k in own and lt.unpack is not None]  # type: ignore[union-attr]
        start = max(min(own_unpacks or unpacks) - 1, forward_events)
        ends = {k: (lt.free if lt.unpack is not None else event_count - 1) for k, lt in lives.items()}  # type: ignore[union-attr]
        storage_end: dict[int, int] = {}
        for key, end in ends.items():
            storage = storage_of.get(key, -1 - key)
            storage_end[storage] = max(storage_end.get(storage, end), end)
        for key in group:
            spans[key] = (start, max(storage_end[storage_of.get(key, -1 - key)], start)) if key in ends else None
    return spans


def _first_unpacks(life: Mapping[int, Lifetime | None], groups: Sequence[Sequence[int]], inputs: Sequence[Sequence[int]],
                   starts: Sequence[Sequence[int]] = ()) -> dict[int, int]:
    """Per region-input key, the earliest first unpack of the groups whose recomputation reads it
    (of each group's ``starts`` keys, when given; see :func:`_rebuilt_at`)."""
    early: dict[int, int] = {}
    for index, (group, keys) in enumerate(zip(groups, inputs)):
        own = set(starts[index]) if index < len(starts) and starts[index] else set(group)
        unpacks = [life[k].unpack for k in group if k in own and life.get(k) is not None and life[k].unpack is not None]  # type: ignore[union-attr]
        if not unpacks:
            unpacks = [life[k].unpack for k in group if life.get(k) is not None and life[k].unpack is not None]  # type: ignore[union-attr]
        if not unpacks:
            continue
        for key in keys:
            early[key] = min(early.get(key, min(unpacks)), min(unpacks))  # type: ignore[type-var]
    return early


def problem_from_trace(
    trace: Trace,
    time_model: TimeModel,
    backend: str,
    link: LinkModel | None = None,
    min_bytes: int = 0,
    chunk_words: int = DEFAULT_CHUNK_WORDS,
    prefetch_distances: Sequence[int] = DEFAULT_PREFETCH_DISTANCES,
    sparsity_margin: float = 0.0,
    rebuilt_together: Sequence[Sequence[int]] = (),
    rebuilt_from: Sequence[Sequence[int]] = (),
    storage_of: Mapping[int, int] | None = None,
    rebuilt_copies: Sequence[int] = (),
    rebuilt_bytes: Mapping[int, int] | None = None,
    host_time_model: TimeModel | None = None,
    copy_latency_below: int = 0,
    rebuilt_starts: Sequence[Sequence[int]] = (),
) -> PlanningProblem:
    """Every offloadable record's options, keyed by the record's key.

    Args:
        trace: a profiled iteration.
        time_model: predicts codec seconds.
        backend: the codec backend asked of ``time_model`` (``cpu``, ``cuda``).
        link: the host link; default: the trace's measured bandwidths, copies asynchronous on a
            CUDA device (``trace.device["kind"]``) and inside pack and unpack otherwise.
        min_bytes: records smaller than this may only be kept.
        chunk_words: the ZVC chunk size, for exact sizes.
        prefetch_distances: how far ahead (events) a swap-in may be issued.
        sparsity_margin: compressed sizes are taken at each record's sparsity less this much (and
            another codec's size that follows the data, this share of the raw bytes larger:
            :func:`cswap.planner.codec_choice.codec_for`), so a plan holds when later batches are
            a little denser than the profiled one.
        rebuilt_together: groups of keys a recompute region drops after their pack and rebuilds
            all at once in backward: each such tensor is held (keep only) from the event before the
            group's first unpack to its own free (to the last event if backward never unpacks it),
            and not at all between forward and backward.
        rebuilt_from: per group of ``rebuilt_together``, the keys whose data is that region's
            input: the recomputation reads it, so it is first unpacked when the group's first is.
        storage_of: key -> an id of its storage: rebuilt keys sharing one are held until the
            last of them is freed.
        rebuilt_copies: per group of ``rebuilt_together``, bytes its recomputation saves again while
            the original stays held elsewhere: held from the group's recomputation to its last
            free, as a tensor keyed ``-1 - group index`` that is only kept.
        rebuilt_bytes: key -> bytes a rebuilt key holds while it lives (default: the record's
            bytes). A recomputed view holds its whole storage (one of three heads of a packed
            projection holds all three), and keys sharing a storage hold it once.
        rebuilt_starts: per group of ``rebuilt_together``, the keys whose first unpack is the
            region's own (default, or empty: every key of the group): the recomputation starts at
            the event before the earliest of them. A key sharing its data with a save outside the
            region (a view saved again, stored once) has the unpack of whichever came first.
        host_time_model: predicts the host codec's seconds (asked for backend ``cpu``); given, the
            problem offers ``host-zvc-swap`` (the runtime gives it only under a host budget, so
            a plan without one is what it was).
        copy_latency_below: each copy of a record smaller than this costs
            :data:`~cswap.planner.costmodel.COPY_LATENCY_S` more, each way: for its bytes the
            link's time is next to nothing, and its fixed cost is what moving it costs (under a
            budget the runtime passes its ``min_bytes``, with ``min_bytes=0``; a larger record is
            priced by its bytes alone, as before).

    Raises:
        ValueError: no link given and the trace has no bandwidths, or an unknown dtype.
    """
    if link is None:
        if not (trace.d2h_gbps > 0 and trace.h2d_gbps > 0):
            raise ValueError(
                f"the trace has no link bandwidths (d2h {trace.d2h_gbps}, h2d {trace.h2d_gbps} GB/s): pass link=LinkModel(...)"
            )
        link = LinkModel(trace.d2h_gbps, trace.h2d_gbps, async_copies=trace.device.get("kind") == "cuda")
    events = lifetimes_from_trace(trace)
    life = {r.key: lt for r, lt in zip(trace.tensors, events.lifetimes, strict=True)}
    rebuilt_at = _rebuilt_at(life, events.forward_events, events.event_count, rebuilt_together, storage_of or {}, rebuilt_starts)
    first_unpack = _first_unpacks(life, rebuilt_together, rebuilt_from, rebuilt_starts)
    times = np.zeros(events.event_count)
    specs = []
    for record, lifetime in zip(trace.tensors, events.lifetimes, strict=True):
        if lifetime is None:
            continue
        if record.key in rebuilt_at:
            span = rebuilt_at[record.key]
            if span is not None:
                nbytes = record.nbytes if rebuilt_bytes is None else rebuilt_bytes.get(record.key, record.nbytes)
                specs.append(TensorSpec(key=record.key, nbytes=nbytes, lifetime=Lifetime(span[0], None, span[1]), movable=False))
        else:
            early = first_unpack.get(record.key)
            if early is not None and lifetime.unpack is not None and record.key not in rebuilt_at and early < lifetime.unpack:
                lifetime = Lifetime(lifetime.pack, max(early, lifetime.pack + 1), lifetime.free)
            specs.append(_spec(record, lifetime, time_model, backend, min_bytes, chunk_words, sparsity_margin, host_time_model,
                               copy_latency_below))
        times[lifetime.pack] = record.pack_at_s
        if lifetime.unpack is not None:
            times[lifetime.unpack] = record.unpack_at_s if record.unpack_at_s is not None else trace.forward_s
    for index, (group, nbytes) in enumerate(zip(rebuilt_together, rebuilt_copies)):
        spans = [rebuilt_at[k] for k in group if rebuilt_at.get(k) is not None]
        if nbytes > 0 and spans:
            copy_life = Lifetime(spans[0][0], None, max(end for _, end in spans))  # type: ignore[index]
            specs.append(TensorSpec(key=-1 - index, nbytes=int(nbytes), lifetime=copy_life, movable=False))
    times[events.forward_events :] = np.maximum(times[events.forward_events :], trace.forward_s)
    times = np.maximum.accumulate(times)  # recorded orders may disagree with clock ties
    last_pack_s = float(times[events.forward_events - 1]) if events.forward_events else 0.0
    first_unpack_s = float(times[events.forward_events]) if events.event_count > events.forward_events else float("inf")
    backward_start_s = min(max(trace.forward_s, last_pack_s), first_unpack_s)
    actions = ACTIONS if host_time_model is None else (*ACTIONS, HOST_ZVC_SWAP)
    # a recomputed key's hold is its region's (storage_of), not a keep's
    views = {r.key: r.view_of for r in trace.tensors if r.view_of is not None and r.key not in rebuilt_at and r.view_of not in rebuilt_at}
    return build_problem(specs, events, times.tolist(), backward_start_s, link, prefetch_distances, actions, views)
