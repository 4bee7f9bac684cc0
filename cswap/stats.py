"""What the runtime did: :class:`RuntimeStats` (cumulative) and :class:`EpochStats` (per epoch).

``print(rt.stats())`` shows a short table in human units; ``repr`` and :meth:`RuntimeStats.to_dict`
keep every field.

Example:
    >>> stats = RuntimeStats(policy="swap", epoch=0, iterations=2, profiled_iterations=1, packed_tensors=6,
    ...     deduplicated_tensors=0, never_moved_tensors=2, unknown_keys=0,
    ...     actions={"keep": 1, "swap": 3, "zvc-swap": 0, "zvc-keep": 0}, kept_bytes=1024,
    ...     offloaded_bytes=3 << 20, transferred_bytes=3 << 20, compressed_input_bytes=0, compressed_bytes=0,
    ...     resident_bytes=0, peak_resident_bytes=5 << 20, pack_s=0.001, unpack_s=0.002, unpacks=4,
    ...     prefetches=0, prefetch_hits=0, arena_bytes=4 << 20, arena_used_bytes=0, arena_misses=0, iteration_s=0.5)
    >>> print(stats)  # doctest: +NORMALIZE_WHITESPACE
    cswap stats: policy swap, epoch 0, 2 iterations (1 profiled)
      tensors      kept 1, offloaded 3 (swap 3, zvc-swap 0), compressed and kept 0, never moved 2
      kept         1.0 KiB
      offloaded    3.0 MiB, transferred 3.0 MiB
      compressed   0 B -> 0 B (ratio 1.00x)
      peak         5.0 MiB resident (now 0 B)
      host         0 B peak (now 0 B)
      host arena   4.0 MiB (0 misses)
      time         500.0 ms in iterations (250.0 ms each), pack hooks 1.0 ms, unpack hooks 2.0 ms, planning 0.000 s
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["EpochStats", "RuntimeStats", "human_bytes"]


def human_bytes(nbytes: float) -> str:
    """``nbytes`` in binary units with one decimal (``"1.5 MiB"``; plain bytes below 1 KiB).

    Example:
        >>> human_bytes(512), human_bytes(1536), human_bytes(3 * 2**30)
        ('512 B', '1.5 KiB', '3.0 GiB')
    """
    value = float(nbytes)
    if abs(value) < 1024:
        return f"{int(value)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def _seconds(seconds: float) -> str:
    return f"{seconds:.3f} s" if seconds >= 1 or seconds == 0 else f"{seconds * 1e3:.1f} ms"


@dataclass(frozen=True)
class EpochStats:
    """What happened in one epoch (the current one while it runs).

    Attributes:
        epoch: its index.
        iterations: iterations run in it (the first was the profiling one).
        packed_tensors: pack hook calls.
        offloaded_bytes, transferred_bytes, compressed_input_bytes, compressed_bytes: as in :class:`RuntimeStats`.
        peak_resident_bytes: the peak of resident bytes during the epoch.
        iteration_s: wall seconds spent inside ``rt.iteration()`` in the epoch.
        actions: tensors stored per action in the epoch.
    """

    epoch: int
    iterations: int
    packed_tensors: int
    offloaded_bytes: int
    transferred_bytes: int
    compressed_input_bytes: int
    compressed_bytes: int
    peak_resident_bytes: int
    iteration_s: float
    actions: Mapping[str, int]


@dataclass(frozen=True)
class RuntimeStats:
    """A snapshot of what the runtime did, cumulative since it was created.

    Attributes:
        policy: the policy.
        epoch: the current epoch.
        iterations: iterations run (``rt.iteration()`` blocks completed).
        profiled_iterations: of which profiling ones.
        packed_tensors: pack hook calls (tensors autograd saved through the runtime's hooks; the
            ``none`` policy installs hooks only in profiling iterations).
        deduplicated_tensors: packs of a storage and view already stored (``x * x``), stored once.
        never_moved_tensors: packs of parameters, buffers and tensors the runtime cannot move.
        unknown_keys: packs whose key was not in the plan (a changed graph): they got the default.
        actions: tensors stored per action (``keep``, ``swap``, ``zvc-swap``, ``zvc-keep``), and
            ``recompute``: tensors a recompute region dropped in forward and rebuilt in backward
            (counted per iteration that recomputed them; of profiling iterations, only ``ac-full``'s
            without a budget recompute: they run its fixed plan);
            deduplicated and never-moved packs not included. Profiling iterations are counted too:
            :attr:`profiled_actions` is their share.
        profiled_actions: of ``actions``, the tensors stored in profiling iterations, which store
            every tensor as the profiling mode says (``rt.trace().meta["mode"]``; under a budget, at
            the policy's smallest footprint: a recomputing policy swaps every one), not as the plan
            does but for ``ac-full`` without a budget, whose profile runs its plan, and for
            ``compress-keep``'s profiles once a plan met its budget, which follow the plan in force,
            and ``compress-keep``'s under a budget in bytes, which keeps what the budget has room
            for and compresses the oldest of those past it.
        profiled_offloaded_bytes: of ``offloaded_bytes``, the profiling iterations' share.
        recomputed_bytes: bytes of the tensors counted as ``recompute``: not held from forward to
            backward, rebuilt there (at their planned sizes). While rebuilt they count as resident.
        recompute_note: why the policy recomputes less than it could, when something kept modules
            from being recomputed (``""``: nothing did).
        kept_bytes: bytes of activations kept as they are.
        offloaded_bytes: bytes of activations moved to host memory (``swap`` and ``zvc-swap``,
            before compression).
        transferred_bytes: bytes copied device-to-host (compressed bytes for ``zvc-swap``).
        compressed_input_bytes: bytes of tensors compressed (``zvc-swap`` and ``zvc-keep``).
        compressed_bytes: their ZVC size.
        resident_bytes: activation bytes the runtime holds on the device now.
        peak_resident_bytes: the most resident bytes ever: kept tensors at full (compact) size,
            ``zvc-keep`` tensors at compressed size, sources of device-to-host copies until the
            copy finished (GPU), tensors rebuilt for backward from fetch or prefetch until
            their storage is freed, and those a recomputation saves from then until freed (not
            views of its region's own inputs: no new memory). A plan with recompute regions
            counts them from the event before the recomputation, and views of a region's keyword
            inputs too, so its peak may exceed this by what that event's node frees and those
            views (docs/recompute.md). Parameters and buffers are not counted. On CPU the "device"
            is host memory and the same rules apply (so CPU runs measure the same quantity).
        pack_s, unpack_s: wall seconds spent in the pack and unpack hooks.
        unpacks: unpack hook calls.
        prefetches: tensors fetched ahead of their unpack; prefetch_hits: of which used.
        arena_bytes: host arena capacity now.
        arena_used_bytes: host arena bytes held by live saved tensors now.
        arena_misses: host allocations that did not fit in the arena (they used fresh memory).
        host_pool_bytes: bytes of the plan's host pool, laid out before the iteration (included in
            ``arena_bytes``; 0: every host copy takes a first-fit block).
        host_pool_fallbacks: planned swaps whose pool slot was still held or too small, which took a
            first-fit block instead.
        iteration_s: wall seconds spent inside ``rt.iteration()`` (host time).
        budget_bytes: the memory budget in bytes (``None``: no budget, or a fraction not yet
            resolved by a profile); ``peak_resident_bytes`` stays within it.
        budget_fallbacks: packs whose planned keep would have passed the budget, stored with the
            policy's smallest-footprint action instead (``compress-keep``, which has no move of its
            own, swaps them uncompressed once its activations outgrow its plan).
        budget_waits: device-to-host copies that pack waited for to stay within the budget (GPU).
        iteration_peak_resident_bytes: the peak of resident bytes in the last iteration the hooks ran.
        evicted_tensors: kept tensors of profiling iterations swapped to the host when the device
            ran out of memory (Capuchin's passive mode, :mod:`cswap.execute.passive`); they are counted
            as ``swap`` in ``actions``.
        budget_evictions: kept tensors swapped to the host in backward because fetching another
            would have passed the budget (a graph that changed since its plan holds them longer).
        graph_changes: planned iterations that saved tensors their plan did not know (another
            graph: a saved tensor of another dtype or rank, or more of them) or passed a budget
            their plan was made within; each is followed by a profiling iteration, unless the
            graph is one profiled before (:attr:`structures`).
        outgrown_tensors: packs of a planned tensor larger than planned (a longer sequence, a larger
            batch): the planned action on its own size, within the budget at pack.
        unprofiled_plans: plans made without a profiling iteration: for a larger size of a graph
            already profiled, from that profile with the sizes the packs showed and the times
            scaled (:mod:`cswap.profile.shapes`).
        planning_s: wall seconds spent making plans, from profiles and without (part of
            ``iteration_s``: a plan is made when the iteration that asks for it ends).
        structures: the distinct graphs profiled (saved tensors' order, dtypes and ranks); each has
            one plan, made for the largest sizes seen, which serves every smaller one.
        host_bytes: bytes of saved tensors' host copies held now: a ``swap``'s raw bytes, a
            ``zvc-swap``'s (and a collected ``host-zvc-swap``'s) compressed bytes, as the executor
            counts them; the host arena's capacity, a cache reserved ahead, is ``arena_bytes``.
        host_peak_bytes: the most ``host_bytes`` ever (every iteration, profiling ones included).
        iteration_host_peak_bytes: the most ``host_bytes`` in the last iteration the hooks ran.
        host_budget_bytes: the host memory budget in bytes (``None``: none); ``host_peak_bytes``
            stays within it, but for a first profiling iteration under a device budget given as a
            fraction of ``none``'s peak (its bytes unknown then, it swaps every tensor).
        history: per epoch, oldest first, the current one last.
    """

    policy: str
    epoch: int
    iterations: int
    profiled_iterations: int
    packed_tensors: int
    deduplicated_tensors: int
    never_moved_tensors: int
    unknown_keys: int
    actions: Mapping[str, int]
    kept_bytes: int
    offloaded_bytes: int
    transferred_bytes: int
    compressed_input_bytes: int
    compressed_bytes: int
    resident_bytes: int
    peak_resident_bytes: int
    pack_s: float
    unpack_s: float
    unpacks: int
    prefetches: int
    prefetch_hits: int
    arena_bytes: int
    arena_used_bytes: int
    arena_misses: int
    iteration_s: float
    budget_bytes: int | None = None
    budget_fallbacks: int = 0
    budget_waits: int = 0
    iteration_peak_resident_bytes: int = 0
    evicted_tensors: int = 0
    budget_evictions: int = 0
    graph_changes: int = 0
    host_pool_bytes: int = 0
    host_pool_fallbacks: int = 0
    host_bytes: int = 0
    host_peak_bytes: int = 0
    iteration_host_peak_bytes: int = 0
    host_budget_bytes: int | None = None
    outgrown_tensors: int = 0
    unprofiled_plans: int = 0
    planning_s: float = 0.0
    structures: int = 0
    profiled_actions: Mapping[str, int] = field(default_factory=dict)
    profiled_offloaded_bytes: int = 0
    recomputed_bytes: int = 0
    recompute_note: str = ""
    history: tuple[EpochStats, ...] = field(default_factory=tuple)

    @property
    def compression_ratio(self) -> float:
        """``compressed_input_bytes / compressed_bytes`` (1.0 when nothing was compressed)."""
        return self.compressed_input_bytes / self.compressed_bytes if self.compressed_bytes else 1.0

    @property
    def mean_iteration_s(self) -> float:
        """Average wall seconds per iteration (0 before the first)."""
        return self.iteration_s / self.iterations if self.iterations else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        # asdict() would deep-copy the read-only action mappings, which cannot be copied.
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["actions"] = dict(self.actions)
        data["profiled_actions"] = dict(self.profiled_actions)
        data["history"] = [{**{f.name: getattr(e, f.name) for f in fields(e)}, "actions": dict(e.actions)} for e in self.history]
        data["compression_ratio"] = self.compression_ratio
        return data

    def __str__(self) -> str:
        actions = self.actions
        offloaded = actions.get("swap", 0) + actions.get("zvc-swap", 0)
        mean = f" ({_seconds(self.mean_iteration_s)} each)" if self.iterations else ""
        recomputed = actions.get("recompute", 0)
        shows_recompute = bool(recomputed or self.recompute_note)
        rows = [
            ("tensors", f"kept {actions.get('keep', 0)}, offloaded {offloaded} (swap {actions.get('swap', 0)}, "
                        f"zvc-swap {actions.get('zvc-swap', 0)}), compressed and kept {actions.get('zvc-keep', 0)}, "
                        + (f"recomputed {recomputed}, " if shows_recompute else "")
                        + f"never moved {self.never_moved_tensors}"
                        + (f", stored once {self.deduplicated_tensors}" if self.deduplicated_tensors else "")
                        + (f", not in the plan {self.unknown_keys}" if self.unknown_keys else "")
                        + (f", larger than planned {self.outgrown_tensors}" if self.outgrown_tensors else "")
                        + (f", swapped when out of memory {self.evicted_tensors}" if self.evicted_tensors else "")),
            *self._profiling_rows(),
            ("kept", human_bytes(self.kept_bytes)),
            ("offloaded", f"{human_bytes(self.offloaded_bytes)}"
                          + (f" ({human_bytes(self.profiled_offloaded_bytes)} while profiling)" if self._mixes_profiling() else "")
                          + f", transferred {human_bytes(self.transferred_bytes)}"),
            *([("recomputed", self._recomputed_text())] if shows_recompute else []),
            ("compressed", f"{human_bytes(self.compressed_input_bytes)} -> {human_bytes(self.compressed_bytes)} "
                           f"(ratio {self.compression_ratio:.2f}x)"),
            ("peak", f"{human_bytes(self.peak_resident_bytes)} resident"
                     + (f" of budget {human_bytes(self.budget_bytes)}" if self.budget_bytes is not None else "")
                     + f" (now {human_bytes(self.resident_bytes)})"
                     + (f", {self.budget_fallbacks} budget fallbacks" if self.budget_fallbacks else "")
                     + (f", {self.budget_waits} copy waits" if self.budget_waits else "")
                     + (f", {self.budget_evictions} kept tensors swapped in backward" if self.budget_evictions else "")
                     + (f", graph changed {self.graph_changes}x (profiled again)" if self.graph_changes else "")),
            ("host", f"{human_bytes(self.host_peak_bytes)} peak"
                     + (f" of host budget {human_bytes(self.host_budget_bytes)}" if self.host_budget_bytes is not None else "")
                     + f" (now {human_bytes(self.host_bytes)})"),
            ("host arena", f"{human_bytes(self.arena_bytes)} ({self.arena_misses} misses)"),
            ("time", f"{_seconds(self.iteration_s)} in iterations{mean}, pack hooks {_seconds(self.pack_s)}, "
                     f"unpack hooks {_seconds(self.unpack_s)}, planning {_seconds(self.planning_s)}"),
        ]
        planned = f", {self.unprofiled_plans} planned without a profile" if self.unprofiled_plans else ""
        title = (f"cswap stats: policy {self.policy}, epoch {self.epoch}, {self.iterations} iterations "
                 f"({self.profiled_iterations} profiled{planned})")
        return "\n".join([title, *(f"  {name:<12} {text}" for name, text in rows)])

    def _mixes_profiling(self) -> bool:
        """Whether the counts hold both profiling and planned iterations' tensors (when every
        iteration profiled, the title says so)."""
        return 0 < self.profiled_iterations < self.iterations and any(self.profiled_actions.values())

    def _profiling_rows(self) -> list[tuple[str, str]]:
        """The row saying which of the tensor counts come from profiling iterations, when mixed."""
        if not self._mixes_profiling():
            return []
        names = {"keep": "kept", "zvc-keep": "compressed and kept"}
        stored = ", ".join(f"{names.get(name, name)} {count}" for name, count in self.profiled_actions.items() if count)
        n = self.profiled_iterations
        return [("profiling", f"{n} profiling iteration{'s' if n > 1 else ''} stored {stored} of them "
                              "(as its profiling mode stores them: rt.trace().meta['mode'])")]

    def _recomputed_text(self) -> str:
        text = (f"{human_bytes(self.recomputed_bytes)} not held from forward to backward, rebuilt there"
                if self.actions.get("recompute", 0) else "nothing")
        return text + (f"; {self.recompute_note}" if self.recompute_note else "")
