"""The executor's stream and event discipline: every copy, (de)compression and wait, in one place.

On a GPU all of a saved tensor's traffic runs on one side stream, so that it overlaps the compute
stream's kernels; on CPU the same calls run inline, with no stream and no event. The rules:

* **Order.** Work on the side stream first waits for the compute stream's work so far, captured
  *outside* the side stream's context (inside it ``current_stream()`` is the side stream, and
  ``wait_stream`` on itself would silently order nothing).
* **Lifetime.** A device tensor the side stream reads is ``record_stream``-ed to it, so the caching
  allocator does not hand its memory out before the read has run.
* **Copies in flight.** A device-to-host copy's source stays counted as resident until the event
  recorded after it has passed (:meth:`Transfers.settle`); under a budget, pack waits on the
  *oldest* such event while the resident bytes pass the budget (:meth:`Transfers.wait_for_budget`):
  an event wait blocks this host thread until that copy is done, never the whole device.
* **Deferred sizes.** A compression's size is not known on the host until the device has counted
  it. With ``defer_sizes`` (a GPU's default) pack does not wait for it: the compression is written
  into a workspace sized by ``numel`` (:func:`cswap.codecs.encode_unsized`), its count is read back
  asynchronously into a pinned readback slot (:class:`cswap.execute.readback.ReadbackSlots`), and a
  later hook that finds it arrived cuts a ``zvc-keep`` tensor to its exact bytes or copies exactly
  the compressed bytes of a ``zvc-swap`` one to the host (:meth:`Transfers.settle`). Only the
  budget's back-pressure, an unpack that needs the data and a stats call wait for one.
* **Host copies.** Host memory comes from the pinned :class:`~cswap.execute.arena.HostArena`,
  never allocated inside an iteration (pinning synchronises the device); a miss falls back to
  pageable memory and is counted by the arena.
* **Back to compute.** A rebuilt tensor is produced on the side stream; the compute stream waits on
  its event and the tensor is ``record_stream``-ed to the compute stream before backward reads it
  (:meth:`Transfers.hand_to_compute`).
* **Host compression** (``host-zvc-swap``, vDNN++). The raw copy goes to the host as a swap's
  does; a worker thread of :class:`~cswap.execute.hostcodec.HostCodec` compresses it once it has
  landed (after the copy's event on a GPU) into fresh buffers, and the raw block is freed here, on
  the training thread, when the result is collected (:meth:`Transfers.finish_host`, at the next
  settle or host store). A rebuild waits for a compression still running, decompresses into a
  staging block (pinned arena memory on a GPU) and copies that to the device like a swap. A tensor
  whose compression would not shrink keeps its raw copy and is rebuilt as a swap.
* **Threads.** Numba's OpenMP layer sets the calling thread's OpenMP thread count, which is also
  torch's: every codec call restores torch's count afterwards, so torch's reductions keep their
  order and gradients stay bit-identical.

Everything here runs under the executor's lock; this module decides nothing about *what* to store.

Example:
    >>> import collections
    >>> from cswap.execute.arena import HostArena
    >>> from cswap.execute.layout import Layout
    >>> from cswap.execute.stored import Counters, Stored
    >>> from cswap.planner.plan import Action, Decision
    >>> x = torch.randn(8)
    >>> decision = Decision(key=0, shape=(8,), dtype="float32", nbytes=32, sparsity=0.0, action=Action.SWAP, reason="swap")
    >>> entry = Stored(0, decision, Layout.of(x), collections.deque())
    >>> transfers = Transfers(torch.device("cpu"), "cpu", HostArena(pin_memory=False), Counters())
    >>> transfers.store(entry, x, Action.SWAP, None)
    >>> out, event, nbytes = transfers.fetch(entry)
    >>> torch.equal(out, x), event is None, nbytes
    (True, True, 32)
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch

from cswap.codecs import NarrowingMissed, decode, encode, encode_unsized
from cswap.codecs.format import Packed
from cswap.execute.arena import ArenaBlock, HostArena, aligned
from cswap.execute.hostcodec import HostCodec
from cswap.execute.readback import ReadbackSlots
from cswap.execute.stored import Counters, Stored
from cswap.planner.plan import Action, Decision

__all__ = ["Transfers", "torch_threads_kept"]

_SWAP = Action.SWAP


def _rebuilt_nbytes(stored: Stored, out: torch.Tensor) -> int:
    """The bytes ``out``, rebuilt from ``stored``, holds: a plain swap's is a copy of the tensor (no
    need to ask its storage, whose Python object the first ask creates); other rebuilds may hold more."""
    if stored.action is _SWAP and stored.layout.plain:
        return stored.layout.nbytes
    return out.untyped_storage().nbytes()


@contextmanager
def torch_threads_kept() -> Iterator[None]:
    """Restore torch's intra-op thread count after a codec call (see the module docstring)."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


class Transfers:
    """Copies, (de)compressions and their events for one executor.

    Args:
        device: the training device.
        backend: the ZVC codec backend.
        arena: the host arena copies go to.
        counters: the executor's counters (resident bytes, compressed and transferred bytes, waits).
        defer_sizes: compress without waiting for the size; default: on a GPU.
        host_codec: the worker threads of ``host-zvc-swap`` (default: :class:`HostCodec`'s, started
            at the first host compression).

    Attributes:
        side_stream: the stream all traffic runs on (``None`` on CPU).
        in_flight: ``(event, bytes)`` of device-to-host copies whose sources are still counted, oldest
            first; all run on the side stream, so they finish in this order.
        unsized: stored entries whose compressed size is not read back yet, oldest first.
        compressing: ``host-zvc-swap`` entries whose host compression is not collected yet, oldest first.
    """

    def __init__(self, device: torch.device, backend: str, arena: HostArena, counters: Counters,
                 defer_sizes: bool | None = None, host_codec: HostCodec | None = None) -> None:
        self.device = device
        self.backend = backend
        self.arena = arena
        self.counters = counters
        self.cuda = device.type == "cuda"
        self.side_stream = torch.cuda.Stream(device) if self.cuda else None
        self.defer_sizes = self.cuda if defer_sizes is None else defer_sizes
        self.in_flight: collections.deque[tuple[Any, int]] = collections.deque()
        self.unsized: collections.deque[Stored] = collections.deque()
        self._slots = ReadbackSlots(pin_memory=self.cuda) if self.defer_sizes else None
        self.host_codec = HostCodec() if host_codec is None else host_codec
        self.compressing: collections.deque[Stored] = collections.deque()
        self._staging: collections.deque[tuple[Any, ArenaBlock]] = collections.deque()  # (event, block) of H2D copies in flight

    def close(self) -> None:
        """Collect the host compressions still running and shut their worker threads down."""
        self.finish_host(wait=True)
        self.host_codec.close()

    # ------------------------------------------------------------------ settling

    def settle(self) -> None:
        """Finish the compressions whose size has arrived and stop counting the sources of finished copies."""
        if self.compressing or self._staging:
            self.finish_host(wait=False)
        while self.unsized and self.unsized[0].unsized.ready():  # type: ignore[union-attr]
            self._finish_unsized(self.unsized.popleft())
        in_flight = self.in_flight
        # One stream runs them in order: the first copy still running means the rest are too.
        while in_flight and in_flight[0][0].query():
            self.counters.resident_bytes -= in_flight.popleft()[1]

    def settle_all_sizes(self) -> None:
        """Read back every compressed size, and collect every host compression, now (exact counts;
        waiting is fine outside the hooks)."""
        while self.unsized:
            self._finish_unsized(self.unsized.popleft())
        self.finish_host(wait=True)

    def wait_for_budget(self, budget_bytes: int | None) -> None:
        """Under a budget, wait for the oldest device-to-host copies while resident bytes pass it.

        Only sources of copies in flight, and compressions whose size is not read back yet, can
        be released by waiting (GPU); an event wait blocks this thread until that copy or
        compression finished, never the whole device.
        """
        if budget_bytes is None:
            return
        counters = self.counters
        while counters.resident_bytes > budget_bytes:
            if self.in_flight:
                event, nbytes = self.in_flight.popleft()
                event.synchronize()
                counters.resident_bytes -= nbytes
            elif self.unsized:
                self._finish_unsized(self.unsized.popleft())  # its bytes join the copies in flight
            else:
                return
            counters.budget_waits += 1

    # ------------------------------------------------------------------ storing

    def store(self, stored: Stored, flat: torch.Tensor, action: Action, launch: Any, pool_key: int | None = None) -> None:
        """Copy ``flat`` to the host (``swap``), or compress it and keep or copy the result, on the side stream.

        ``flat`` is the compact form (:meth:`Layout.compact`); for a swap of a
        :attr:`~cswap.execute.layout.Layout.plain` layout, the tensor itself (:meth:`copy_to_host`,
        with ``pool_key``).

        A copy's source stays counted as resident until its event passes; a compression kept on
        the device is ready for a rebuild once ``stored.ready`` has passed.
        """
        if self.side_stream is None:
            self._store_on_stream(stored, flat, action, launch, pool_key)
            return
        with self._on_side_stream(flat):
            self._store_on_stream(stored, flat, action, launch, pool_key)
            event = self._side_event()
        if action.offloads:
            self.counters.add_resident(stored.layout.nbytes)
            self.in_flight.append((event, stored.layout.nbytes))
        else:
            stored.ready = event

    def store_unsized(self, stored: Stored, flat: torch.Tensor, decision: Decision) -> None:
        """Compress ``flat`` without the host waiting for its size (:func:`cswap.codecs.encode_unsized`).

        The workspace and the source stay resident until the size is read back (:meth:`settle`,
        or the budget, an unpack or a stats call needing it).
        """
        assert self._slots is not None
        slot = self._slots.take()
        while slot is None:  # every readback slot in flight: finish the oldest compression
            self._finish_unsized(self.unsized.popleft())
            slot = self._slots.take()
        narrow = getattr(torch, decision.encoded_dtype) if decision.encoded_dtype else None
        with self._on_side_stream(flat):
            with torch_threads_kept():
                stored.unsized = encode_unsized(flat, self.backend, decision.compress_launch, narrow, slot)
        stored.source = flat
        stored.held_bytes = stored.unsized.workspace_nbytes + stored.layout.nbytes
        self.counters.add_resident(stored.held_bytes)
        self.unsized.append(stored)

    def store_host_compressed(self, stored: Stored, source: torch.Tensor, reserve_bytes: int) -> None:
        """``host-zvc-swap``: copy ``source`` to the host as a swap does, then hand the host copy to a
        worker thread to compress (:class:`~cswap.execute.hostcodec.HostCodec`).

        The worker writes the compression beside the raw copy, so ``reserve_bytes`` more host
        bytes are counted from now until it is collected (:func:`cswap.planner.plan.host_reserve_bytes`).

        ``source`` is the compact form, or, for a :attr:`~cswap.execute.layout.Layout.plain`
        layout, the tensor itself. The raw copy never takes a pool slot: it is freed when its
        compression is collected, long before the slot's profiled lifetime ends.
        """
        if self.compressing:
            self.finish_host(wait=False)  # free the raw copies of compressions done since
        event = None
        if self.side_stream is None:
            self.copy_to_host(stored, source, non_blocking=False)
        else:
            with self._on_side_stream(source):
                self.copy_to_host(stored, source, non_blocking=True)
                event = self._side_event()
            self.counters.add_resident(stored.layout.nbytes)
            self.in_flight.append((event, stored.layout.nbytes))
        self._hold_host(stored, reserve_bytes)
        stored.host_reserved = reserve_bytes
        host = stored.host
        assert host is not None
        # Both forms of the host copy are contiguous: its flat view is the compact form.
        stored.compressing = self.host_codec.submit(host.view(-1), event, stored.decision.codec)
        self.compressing.append(stored)

    def finish_host(self, wait: bool) -> None:
        """Collect host compressions: each finished one (every one, with ``wait``) replaces its raw
        host copy, which is freed now, unless it would not shrink it; free the staging blocks of
        finished host-to-device copies (dead entries' host bytes are uncounted by the executor's
        drain, with the rest of what they held).

        Runs on the training thread, under the executor's lock (the arena and the counters are its).

        Raises:
            HostCompressionError: a worker failed (see :mod:`cswap.execute.hostcodec`).
        """
        pending = self.compressing
        if pending:
            done = [stored for stored in pending if wait or stored.compressing.done()]
            for stored in done:
                pending.remove(stored)
                self._finish_host_one(stored)
        staging = self._staging
        while staging and staging[0][0].query():
            self.arena.free(staging.popleft()[1])

    def make_host_room(self, limit_bytes: int) -> int:
        """Before a pack under a host budget: while the host bytes held pass ``limit_bytes``,
        collect the oldest host compression still pending (waiting for it), whose raw copy is then
        freed; returns the host bytes held. The planner counts a ``host-zvc-swap``'s raw copy only
        until its compression is done; this holds the run to that when the workers fall behind.

        Raises:
            HostCompressionError: a worker failed.
        """
        pending = self.compressing
        if pending:
            self.finish_host(wait=False)
        while pending and self.counters.host_bytes > limit_bytes:
            self._finish_host_one(pending.popleft())
        return self.counters.host_bytes

    def _finish_host_one(self, stored: Stored) -> None:
        """Collect ``stored``'s host compression (waiting for it)."""
        future, stored.compressing = stored.compressing, None
        packed = HostCodec.result(future, stored.key)
        counters = self.counters
        raw_nbytes = stored.layout.nbytes
        reserved, stored.host_reserved = stored.host_reserved, 0
        if packed.compressed_nbytes >= raw_nbytes:
            # ZVC would not shrink it: the raw copy stays, and the entry is a swap from here on.
            stored.action = Action.SWAP
            counters.actions[Action.HOST_ZVC_SWAP.value] -= 1
            counters.actions[Action.SWAP.value] += 1
            self._hold_host(stored, -reserved)
            return
        stored.packed = packed
        # The compression takes the room set aside for it at the pack (more, counted, if it came
        # out larger than planned); the raw copy is uncounted after, so both count for that moment.
        self._hold_host(stored, packed.compressed_nbytes - reserved)
        counters.add_host(-raw_nbytes)
        stored.host_nbytes -= raw_nbytes
        if stored.block is not None:
            self.arena.free(stored.block)  # type: ignore[arg-type]  # never a pool slot (store_host_compressed)
        stored.block = stored.host = None
        counters.host_compressed_tensors += 1
        counters.host_compressed_input_bytes += raw_nbytes
        counters.host_compressed_bytes += packed.compressed_nbytes

    def _hold_host(self, stored: Stored, nbytes: int) -> None:
        """Count ``nbytes`` more host bytes held by ``stored`` until it dies."""
        self.counters.add_host(nbytes)
        stored.host_nbytes += nbytes

    def copy_to_host(self, stored: Stored, source: torch.Tensor, non_blocking: bool, pool_key: int | None = None) -> None:
        """Copy ``source`` into a host block of ``stored`` (on the current stream).

        ``source`` is the compact form, or, for a :attr:`~cswap.execute.layout.Layout.plain`
        layout, the tensor itself: the host copy then has its shape and strides, so that the
        rebuild is one copy into a fresh tensor, and goes to planned ``pool_key``'s slot in the
        plan's host pool when it has one.
        """
        layout = stored.layout
        if layout.plain:
            host, stored.block = self.arena.alloc_tensor(layout.dtype, layout.shape, layout.stride, layout.nbytes, pool_key)
        else:
            host, stored.block = self.arena.alloc_tensor(layout.dtype, (layout.numel,), (1,), layout.nbytes)
        stored.host = host
        if source.shape != host.shape:
            source = source.view(host.shape)
        if non_blocking:
            host.copy_(source, non_blocking=True)
        else:
            host.copy_(source)  # without the keyword, which costs a small copy a quarter of its time
        self._hold_host(stored, layout.nbytes)

    # ------------------------------------------------------------------ fetching

    def fetch(self, stored: Stored) -> tuple[torch.Tensor, Any, int]:
        """Issue the rebuild of ``stored`` (on the side stream on a GPU); returns it, its ready event
        and the bytes it holds (a plain swap's are the tensor's own; other rebuilds may hold more)."""
        side = self.side_stream
        if side is None and stored.action is _SWAP and stored.layout.plain:
            # The rebuild most fetches on a CPU are, first: one copy of the host copy, which has
            # the tensor's shape and strides (an unsized or host compression is never a plain swap).
            return stored.host.clone(), None, stored.layout.nbytes  # type: ignore[union-attr]
        if stored.unsized is not None:  # wanted back before its size was read: read it now
            self.unsized.remove(stored)
            self._finish_unsized(stored)
        if stored.compressing is not None:  # wanted back before its host compression was collected
            self.compressing.remove(stored)
            self._finish_host_one(stored)
        if side is None:
            out = self._rebuild(stored)
            return out, None, _rebuilt_nbytes(stored, out)
        with torch.cuda.stream(side):
            if stored.ready is not None:
                side.wait_event(stored.ready)
            out = self._rebuild(stored)
            event = torch.cuda.Event()
            event.record(side)
        return out, event, _rebuilt_nbytes(stored, out)

    def hand_to_compute(self, out: torch.Tensor, event: Any) -> None:
        """Make the compute stream wait for ``out``'s rebuild (its ``event``) and keep its memory until it has read it."""
        if event is None:
            return
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(event)
        out.record_stream(compute)

    # ------------------------------------------------------------------ on the side stream

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

    def _store_on_stream(self, stored: Stored, flat: torch.Tensor, action: Action, launch: Any, pool_key: int | None = None) -> None:
        """The copies and compression of one tensor, on the current stream."""
        if action is Action.SWAP:
            self.copy_to_host(stored, flat, non_blocking=self.cuda, pool_key=pool_key)
            return
        with torch_threads_kept():
            packed = encode(flat, backend=self.backend, launch=launch, codec=stored.decision.codec)
        if action is Action.ZVC_KEEP:
            stored.packed = packed
            return
        self._copy_packed_to_host(stored, packed)

    def _finish_unsized(self, stored: Stored) -> None:
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
                with torch_threads_kept():
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
            self.in_flight.append((event, stored.held_bytes))
        else:
            counters.resident_bytes -= stored.held_bytes
        stored.held_bytes = 0

    def _host(self, nbytes: int) -> tuple[torch.Tensor, ArenaBlock | None]:
        """``nbytes`` of host memory: an arena block, or fresh pageable memory when the arena is full."""
        block = self.arena.alloc(nbytes)
        if block is not None:
            return self.arena.tensor(block, torch.uint8, (nbytes,)), block
        return torch.empty(nbytes, dtype=torch.uint8), None

    def evict_compressed(self, stored: Stored) -> None:
        """Move the compression ``stored`` keeps on the device (``zvc-keep``) to one host block now,
        the copy waited for: backward needs the room (it is rebuilt from there as a ``zvc-swap``)."""
        packed = stored.packed
        assert packed is not None
        if stored.ready is not None and self.cuda:
            torch.cuda.current_stream(self.device).wait_event(stored.ready)
        self._copy_packed_to_host(stored, packed, non_blocking=False)
        stored.ready = None

    def _copy_packed_to_host(self, stored: Stored, packed: Packed, non_blocking: bool = True) -> None:
        """Copy the buffers of ``packed`` (any codec's) into one host block (on the current stream;
        ``non_blocking``: without waiting for the copies, on a GPU)."""
        parts = packed.buffers()
        sizes = [p.numel() * p.element_size() for p in parts]
        starts = [0]
        for size in sizes[:-1]:
            starts.append(starts[-1] + aligned(size))
        host, stored.block = self._host(starts[-1] + sizes[-1])
        views = []
        for part, start, size in zip(parts, starts, sizes):
            view = host[start : start + size].view(part.dtype)
            view.copy_(part, non_blocking=self.cuda and non_blocking)
            views.append(view)
        stored.packed = replace(packed, **dict(zip(packed.buffer_names, views)))
        self._hold_host(stored, packed.compressed_nbytes)

    def _rebuild(self, stored: Stored) -> torch.Tensor:
        layout = stored.layout
        if stored.action is Action.SWAP and layout.plain:
            host = stored.host
            assert host is not None
            # The host copy has the tensor's shape and strides: one copy into a fresh tensor (on a
            # CPU, fetch makes it itself, without coming here).
            return host.to(self.device, non_blocking=True, copy=True)
        flat, result = layout.allocate(self.device)
        if stored.action is Action.HOST_ZVC_SWAP:
            self._decompress_on_host(stored, flat)
        elif stored.action is Action.SWAP:
            assert stored.host is not None
            flat.copy_(stored.host, non_blocking=self.cuda)
        else:
            packed = stored.packed
            assert packed is not None
            if stored.action is Action.ZVC_SWAP and self.cuda:
                packed = packed.to(self.device, non_blocking=True)
            launch = stored.decompress_launch
            chunk_words = getattr(packed, "chunk_words", None)  # bit-packing has no chunks
            if launch is not None and chunk_words is not None and getattr(launch, "chunk_words", chunk_words) != chunk_words:
                launch = replace(launch, chunk_words=chunk_words)
            with torch_threads_kept():
                decode(packed, flat, backend=self.backend, launch=launch, validate=False)
        return result if result is not None else layout.rebuild_from(flat)

    def _decompress_on_host(self, stored: Stored, flat: torch.Tensor) -> None:
        """Rebuild a host-compressed ``stored`` into ``flat``: decompress on this thread (on CPU
        straight into ``flat``; on a GPU into a pinned staging block, then one copy on the side stream)."""
        packed = stored.packed
        assert packed is not None
        if not self.cuda:
            with torch_threads_kept():
                decode(packed, flat, backend="cpu", validate=False)
            return
        nbytes = stored.layout.nbytes
        block = self.arena.alloc(nbytes)
        staging = self.arena.tensor(block, flat.dtype, (flat.numel(),)) if block is not None else torch.empty(flat.numel(), dtype=flat.dtype)
        with torch_threads_kept():
            decode(packed, staging, backend="cpu", validate=False)
        # From pageable memory (the arena was full) the copy returns once it has read the staging
        # tensor; from the arena, the block is reused only once the copy that reads it has run.
        flat.copy_(staging, non_blocking=True)
        if block is not None:
            event = torch.cuda.Event()
            event.record(self.side_stream)
            self._staging.append((event, block))
