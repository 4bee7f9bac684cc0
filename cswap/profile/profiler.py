"""The profiler: records one iteration's saved tensors and the compute around them as a :class:`Trace`.

The executor calls it from its hooks during a profiling iteration (the first of each epoch): per
saved tensor its key, shape, dtype, compact bytes, bit-pattern zero count, producer, and when its
pack and first unpack hooks ran. :meth:`Profiler.trace` then derives ``Hidden_f`` and ``Hidden_b``
exactly as :mod:`cswap.profile.trace` defines them, taking "the start of backward" to be the first unpack
hook of the iteration (the first moment backward needs a saved tensor, and so the first moment a
prefetch can be issued) and "the end of forward" likewise.

Timestamps come from ``time.perf_counter`` on CPU and from CUDA events on the compute stream on a
GPU; events and zero counts stay on the device until :meth:`Profiler.trace` (one synchronisation).

The producer of a tensor is the ``grad_fn`` name of the tensor itself (the op that made it, e.g.
``ReluBackward0``; empty for inputs). With ``model=`` the profiler also registers forward hooks on
every submodule for the profiling iteration only, and prefixes the innermost running module's
name: ``features.3:ReluBackward0`` is the ReLU output saved while ``features.3`` ran (the conv
that consumes it). The autograd node being built inside the pack hook is not exposed by PyTorch,
and a dispatch mode that would see it costs more than the whole profile.

Example:
    >>> import torch
    >>> profiler = Profiler(torch.device("cpu"), epoch=0, policy="none")
    >>> profiler.begin()
    >>> t0 = profiler.stamp()
    >>> profiler.record_pack(0, (4,), "float32", 16, 4, torch.tensor(2), "", True, "", t0, profiler.stamp())
    >>> profiler.record_unpack(0, profiler.stamp(), profiler.stamp())
    >>> profiler.end()
    >>> trace = profiler.trace(d2h_gbps=10.0, h2d_gbps=10.0, device={"kind": "cpu"})
    >>> trace.tensors[0].sparsity
    0.5
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from torch.multiprocessing.reductions import StorageWeakRef

from cswap.codecs.encoding import Encoding
from cswap.profile.trace import Trace, TensorRecord

__all__ = ["Clock", "Profiler", "producer_name"]


class Clock:
    """Seconds since :meth:`start`: ``perf_counter`` on CPU, CUDA events on a GPU.

    Args:
        device: the training device.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._start: Any = None

    def start(self) -> None:
        """Set time zero."""
        self._start = self.stamp()

    def stamp(self) -> Any:
        """A timestamp now (on the current stream on a GPU)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def synchronize(self) -> None:
        """Wait until every GPU timestamp is known (no-op on CPU)."""
        if self.cuda:
            torch.cuda.synchronize()

    def seconds(self, stamp: Any) -> float:
        """Seconds from :meth:`start` to ``stamp``; on a GPU only after :meth:`synchronize`."""
        if self.cuda:
            return self._start.elapsed_time(stamp) / 1e3
        return stamp - self._start


def producer_name(t: torch.Tensor) -> str:
    """The ``grad_fn`` name of ``t`` (``"ReluBackward0"``), or ``""`` for a tensor without one."""
    grad_fn = t.grad_fn
    return grad_fn.name() if grad_fn is not None else ""


@dataclass
class _Pack:
    key: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    numel: int
    zeros: Any  # int, or a 0-d device tensor until the trace is built
    producer: str
    offloadable: bool
    start: Any
    end: Any
    value_range: Any = None  # what the encoding needs (cswap.codecs.value_range): a tensor until the trace is built
    module: str = ""
    coded: Any = None  # (codec, size) of the codec besides ZVC that takes it; the size a tensor until the trace is built


class Profiler:
    """Collects one profiling iteration; the executor calls it under its lock.

    Args:
        device: the training device.
        epoch: the epoch being profiled.
        policy: the runtime's policy.
        model: optional module whose submodule names label producers.
        meta: extra context stored in the trace's ``meta``.
        clock: the timestamps' source (default :class:`Clock` of ``device``).
    """

    def __init__(
        self,
        device: torch.device,
        epoch: int,
        policy: str,
        model: torch.nn.Module | None = None,
        meta: dict[str, Any] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.device = device
        self.epoch = epoch
        self.policy = policy
        self.model = model
        self.meta = dict(meta or {})
        self.clock = clock if clock is not None else Clock(device)
        self._packs: dict[int, _Pack] = {}
        self._unpacks: dict[int, tuple[Any, Any]] = {}
        # keys of the planner's backward events (first unpacks of stored tensors, through any handle) in order
        self._events: list[int] = []
        # key -> events seen before its storage was seen dead, minus one (-1: in forward)
        self._frees: dict[int, int] = {}
        self._rebuilt: dict[int, int] = {}
        self._reasons: dict[int, str] = {}
        self._duplicates: dict[int, int] = {}
        # storage id -> (weak storage, key) of the first offloadable pack of each storage, and the
        # key of each later pack of another view of it -> that first key
        self._storages: dict[int, tuple[StorageWeakRef, int]] = {}
        self._views: dict[int, int] = {}
        self._storage_nbytes: dict[int, int] = {}  # per key whose storage is larger than its view, that storage's bytes
        self._hooks: list[Any] = []
        self._modules = threading.local()
        # storage id -> (weak storage, label) of each module's last output, to name producers.
        self._outputs: dict[int, tuple[StorageWeakRef, str]] = {}
        # storage id -> name of each parameter and buffer of the model (they live all iteration).
        self._parameters: dict[int, str] = {}
        self._end: Any = None

    # ------------------------------------------------------------------ lifetime

    def begin(self) -> None:
        """Start the clock and, with a model, the module hooks."""
        if self.model is not None:
            for name, tensor in (*self.model.named_parameters(), *self.model.named_buffers()):
                if tensor.layout == torch.strided:
                    self._parameters.setdefault(tensor.untyped_storage()._cdata, name)
            for name, module in self.model.named_modules():
                label = f"{name} ({type(module).__name__})" if name else type(module).__name__
                self._hooks.append(module.register_forward_pre_hook(self._enter(label)))
                self._hooks.append(module.register_forward_hook(self._leave(label)))
        self.clock.start()

    def end(self) -> None:
        """Stop the clock and remove the module hooks; the first call's time is the iteration's end
        (with several micro-batches, the first one's backward ends the profile)."""
        if self._end is None:
            self._end = self.clock.stamp()
        self.remove_hooks()

    def remove_hooks(self) -> None:
        """Remove the module hooks (also when the iteration failed)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()

    def _stack(self) -> list[str]:
        stack = getattr(self._modules, "stack", None)
        if stack is None:
            stack = self._modules.stack = []
        return stack

    def _enter(self, name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:
            if not torch.compiler.is_compiling():  # as _leave
                self._stack().append(name)

        return hook

    def _leave(self, label: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if torch.compiler.is_compiling():
                # Traced into a compiled graph: its outputs there are fake tensors, whose storages a
                # weak reference cannot hold (the compiled graph's own outputs are seen as they run).
                return
            stack = self._stack()
            if stack:
                stack.pop()
            for out in output if isinstance(output, (tuple, list)) else (output,):
                if isinstance(out, torch.Tensor) and out.layout == torch.strided:
                    storage = out.untyped_storage()
                    self._outputs[storage._cdata] = (StorageWeakRef(storage), label)

        return hook

    # ------------------------------------------------------------------ records

    def stamp(self) -> Any:
        """A timestamp now."""
        return self.clock.stamp()

    def producer(self, t: torch.Tensor) -> str:
        """``<module>:<grad_fn name>`` with a model and a running module, else the ``grad_fn`` name."""
        name = producer_name(t)
        stack = self._stack() if self.model is not None else None
        return f"{stack[-1].split(' ')[0]}:{name}" if stack else name

    def module(self, t: torch.Tensor) -> str:
        """Where ``t`` comes from in the model, as plots and plan tables name it; ``""`` only without a model.

        In order: the module whose output (or a view of it) ``t`` is, once that module has returned,
        as ``path (Type)`` (``features.3 (ReLU)``); a parameter or buffer (or a view of one) by its
        name (``features.0.weight``); the innermost module running now, which saves it (the model's
        input saved by its first layer, a dropout mask, pooling indices, or a module's own result
        before it returns); outside every module (a loss on the model's output), the autograd node
        that made it (``LogSoftmaxBackward0``), or ``outside the model`` for a tensor none made (the
        targets).
        """
        if self.model is None:
            return ""
        storage = t.untyped_storage()._cdata if t.layout == torch.strided else None
        if storage is not None and t.grad_fn is not None:
            found = self._outputs.get(storage)
            if found is not None and not found[0].expired():
                return found[1]
        if storage in self._parameters:
            return self._parameters[storage]
        stack = self._stack()
        if stack:
            return stack[-1]
        return producer_name(t) or "outside the model"

    def record_pack(
        self,
        key: int,
        shape: tuple[int, ...],
        dtype: str,
        nbytes: int,
        numel: int,
        zeros: Any,
        producer: str,
        offloadable: bool,
        reason: str,
        start: Any,
        end: Any,
        *,
        value_range: Any = None,
        module: str = "",
        coded: Any = None,
        storage: Any = None,
        storage_nbytes: int | None = None,
    ) -> None:
        """One pack hook call.

        Args:
            key: the tensor's ordinal in the pack sequence.
            shape, dtype: its shape and dtype name.
            nbytes, numel: bytes and elements of its compact form.
            zeros: elements whose bits are all zero (an int or a 0-d tensor).
            producer: see :meth:`producer`.
            offloadable: whether the runtime may move it.
            reason: why not, when it may not.
            start, end: :meth:`stamp` at the hook's start and end.
            value_range: what the encoding needs to predict its size (:func:`cswap.codecs.value_range`),
                which gives the record's ``narrow_dtype``; None when it needs nothing.
            module: see :meth:`module`.
            coded: ``(codec, size)`` from :func:`cswap.codecs.alternative_nbytes` (the size an int or
                a 0-d tensor), or ``None``: no codec besides ZVC takes it.
            storage: the tensor's untyped storage (``None``: not known), to find the records that
                are other views of one storage (a record's ``view_of``).
            storage_nbytes: what keeping it holds where more than ``nbytes``: its storage's bytes
                (a record's ``storage_nbytes``), or ``None``.
        """
        self._packs[key] = _Pack(key, shape, dtype, nbytes, numel, zeros, producer, offloadable, start, end, value_range, module, coded)
        if not offloadable:
            self._reasons[key] = reason
        elif storage is not None and key not in self._duplicates:
            if storage_nbytes is not None:
                self._storage_nbytes[key] = storage_nbytes
            seen = self._storages.get(storage._cdata)
            if seen is not None and not seen[0].expired():
                self._views[key] = seen[1]
            else:
                self._storages[storage._cdata] = (StorageWeakRef(storage), key)

    def record_duplicate(self, key: int, first_key: int) -> None:
        """``key`` packed the same storage and view as ``first_key``: it is stored once."""
        self._duplicates[key] = first_key

    def record_free(self, keys: list[int]) -> None:
        """The executor saw the stored data or rebuilt tensor of ``keys`` dead at this hook: each
        was last alive at the previous first unpack (the latest sighting per key counts)."""
        rank = len(self._events) - 1
        for key in keys:
            self._frees[key] = rank

    def record_rebuilt(self, key: int, nbytes: int) -> None:
        """The first unpack of ``key`` (or of a duplicate of it) rebuilt it into ``nbytes`` of storage."""
        self._rebuilt.setdefault(self._duplicates.get(key, key), nbytes)

    def record_unpack(self, key: int, start: Any, end: Any) -> None:
        """An unpack hook call; only the first per key is kept.

        A stored tensor's backward event is the first unpack of any of its handles: a duplicate
        unpacked before the key that stored it (an in-place ReLU's output, read first by the max
        pool after it) already rebuilds the data.
        """
        source = self._duplicates.get(key, key)
        if source not in self._unpacks:
            packed = self._packs.get(source)
            if packed is not None and packed.offloadable:
                self._events.append(source)
            self._unpacks[source] = (start, end)
        self._unpacks.setdefault(key, (start, end))

    # ------------------------------------------------------------------ the trace

    def trace(self, d2h_gbps: float, h2d_gbps: float, device: dict[str, Any]) -> Trace:
        """The :class:`Trace` of the iteration (call after :meth:`end`).

        Args:
            d2h_gbps, h2d_gbps: the bandwidths to store with it.
            device: the device fingerprint as a dict.
        """
        self.clock.synchronize()
        seconds = self.clock.seconds
        end_s = seconds(self._end) if self._end is not None else 0.0
        packs = sorted(self._packs.values(), key=lambda p: p.key)
        pack_at = {p.key: (seconds(p.start), seconds(p.end)) for p in packs}
        unpack_at = {key: (seconds(s), seconds(e)) for key, (s, e) in self._unpacks.items()}
        backward_start = min((s for s, _ in unpack_at.values()), default=end_s)
        zeros = self._zero_counts(packs)
        coded = self._coded_sizes(packs)
        narrow = self._encoded_dtypes(packs)

        def offloadable(p: _Pack) -> bool:
            return p.offloadable and p.key not in self._duplicates

        hidden_f: dict[int, float] = {}
        movable = [p for p in packs if offloadable(p)]
        for i, p in enumerate(movable):
            started, ended = pack_at[p.key]
            phase_end = backward_start if started < backward_start else end_s
            following = movable[i + 1] if i + 1 < len(movable) else None
            boundary = min(pack_at[following.key][0], phase_end) if following is not None else phase_end
            hidden_f[p.key] = max(boundary - ended, 0.0)

        hidden_b: dict[int, float] = {}
        previous_end = backward_start
        for key in sorted((p.key for p in movable if p.key in unpack_at), key=lambda k: unpack_at[k]):
            started, ended = unpack_at[key]
            hidden_b[key] = max(started - previous_end, 0.0)
            previous_end = ended

        # ranks among first unpacks, in the order the hooks ran (dicts keep insertion order)
        unpack_rank = {key: rank for rank, key in enumerate(self._events)}
        last_rank = len(unpack_rank) - 1
        records = []
        for p in packs:
            source = self._packs.get(self._duplicates.get(p.key, p.key), p)
            sparsity = zeros[source.key] / source.numel if source.numel else 0.0
            unpacked = unpack_at.get(p.key)
            rank = unpack_rank.get(p.key)
            free = self._frees.get(source.key)
            if rank is not None:
                free = max(rank, last_rank if free is None else free)
            elif free is not None and free < 0:
                free = None  # died in forward: its last event is its own (no later unpack bounds it)
            records.append(
                TensorRecord(
                    key=p.key,
                    shape=p.shape,
                    dtype=p.dtype,
                    nbytes=p.nbytes,
                    sparsity=min(max(sparsity, 0.0), 1.0),
                    narrow_dtype=narrow.get(source.key),
                    producer=p.producer,
                    module=p.module,
                    offloadable=offloadable(p),
                    pack_s=pack_at[p.key][1] - pack_at[p.key][0],
                    unpack_s=(unpacked[1] - unpacked[0]) if unpacked else 0.0,
                    pack_at_s=pack_at[p.key][0],
                    unpack_at_s=unpacked[0] if unpacked else None,
                    hidden_forward_s=hidden_f.get(p.key, 0.0),
                    hidden_backward_s=hidden_b.get(p.key, 0.0),
                    unpack_order=rank,
                    free_order=free,
                    view_of=self._views.get(p.key),
                    storage_nbytes=self._storage_nbytes.get(p.key),
                    rebuilt_nbytes=self._rebuilt.get(p.key) if self._rebuilt.get(p.key, p.nbytes) != p.nbytes else None,
                    **coded.get(source.key, {}),
                )
            )
        reasons = {str(k): v for k, v in self._reasons.items()}
        reasons.update({str(k): f"duplicate of key {first} (same storage and view): stored once" for k, first in self._duplicates.items()})
        meta = {**self.meta, "not_offloadable": reasons, "duplicates": {str(k): v for k, v in self._duplicates.items()}}
        return Trace(
            tensors=tuple(records),
            device=device,
            d2h_gbps=d2h_gbps,
            h2d_gbps=h2d_gbps,
            forward_s=backward_start,
            backward_s=max(end_s - backward_start, 0.0),
            epoch=self.epoch,
            policy=self.policy,
            meta=meta,
        )

    @staticmethod
    def _encoded_dtypes(packs: list[_Pack]) -> dict[int, str]:
        """Per tensor the encoding stores narrower, the encoded dtype's name (one transfer for all ranges)."""
        ranged = [p for p in packs if p.value_range is not None]
        if not ranged:
            return {}
        ranges = torch.stack([p.value_range.reshape(2) for p in ranged]).cpu().tolist()
        found = {}
        for p, (low, high) in zip(ranged, ranges, strict=True):
            encoded = Encoding.of(p.dtype, (low, high)).encoded_name
            if encoded is not None:
                found[p.key] = encoded
        return found

    @staticmethod
    def _coded_sizes(packs: list[_Pack]) -> dict[int, dict[str, Any]]:
        """Per tensor another codec takes, the record's ``codec`` and ``codec_fraction`` (one transfer for all sizes)."""
        coded = [p for p in packs if p.coded is not None and p.nbytes]
        sizes = [size for _, size in (p.coded for p in coded)]
        on_device = [i for i, size in enumerate(sizes) if isinstance(size, torch.Tensor)]
        if on_device:
            values = torch.stack([sizes[i].reshape(()).to(torch.int64) for i in on_device]).cpu().tolist()
            for i, value in zip(on_device, values, strict=True):
                sizes[i] = value
        return {p.key: {"codec": p.coded[0], "codec_fraction": int(size) / p.nbytes} for p, size in zip(coded, sizes, strict=True)}

    def _zero_counts(self, packs: list[_Pack]) -> dict[int, int]:
        """Zero counts as ints, moving any device tensors to the host in one transfer."""
        on_device = [p for p in packs if isinstance(p.zeros, torch.Tensor)]
        counts = {p.key: int(p.zeros) for p in packs if not isinstance(p.zeros, torch.Tensor)}
        if on_device:
            values = torch.stack([p.zeros.reshape(()).to(torch.int64) for p in on_device]).cpu().tolist()
            counts.update({p.key: int(v) for p, v in zip(on_device, values)})
        return counts
