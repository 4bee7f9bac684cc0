"""What recomputing a region saves and costs, from one sample forward+backward with nothing enabled.

Keys are ordinals in the OUTER pack sequence (the one an outer ``saved_tensors_hooks`` pair, such
as the runtime's, sees) of the iteration with no region enabled. Inside an enabled region
checkpoint's own hooks are the innermost, so the outer hooks stop seeing the region's saves;
instead, at the region's entry, checkpoint saves each positional tensor input once through the
outer hooks (so the runtime may keep or swap them), and holds keyword tensor inputs by reference.
:meth:`RegionProfile.sequence` gives the outer sequence for any set of enabled regions, mapping
each new ordinal to a profiled key or to a region input.

Bytes are those of distinct storages (a view shares its base's memory), counting only tensors a
runtime may move: parameters, buffers and leaves that require grad are resident anyway.

Example:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    >>> x = torch.randn(3, 4)
    >>> profile = profile_regions(model, lambda: model(x).sum().backward())
    >>> facts = profile.regions["1"]
    >>> facts.keys, facts.freed_bytes, facts.input_bytes  # Tanh's output stays (the next Linear saves it)
    ((1,), -96, 96)
    >>> [p.key if p.key is not None else f"input of {p.region!r}" for p in profile.sequence(["1"])]
    [0, "input of '1'", 2, 3]
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed._composable import checkpoint
from torch.multiprocessing.reductions import StorageWeakRef

from cswap.profile.profiler import Clock
from cswap.profile.rerun import HostRandomState, ModuleState, compiled_paths, foreign_hooks, global_foreign_hooks, mutable_kind
from cswap.profile.shapes import SizeMap, merged
from cswap.profile.trace import Trace

__all__ = [
    "HOOK_SAVES",
    "MODIFIES_INPUT",
    "REENTRANT",
    "CallRecord",
    "InputRecord",
    "OuterPack",
    "RegionFacts",
    "RegionProfile",
    "RegionTracer",
    "SavedRecord",
    "Stamps",
    "call_refusal",
    "hook_refusal",
    "nested_pair",
    "profile_regions",
    "repeated_layers",
]


def nested_pair(paths: Iterable[str]) -> tuple[str, str] | None:
    """The first (ancestor, descendant) pair among module ``paths``, or ``None``.

    ``""`` is the root module, an ancestor of every other path.

    >>> nested_pair(["layer1", "layer1.0.conv1"]), nested_pair(["a.1", "a.10"])
    (('layer1', 'layer1.0.conv1'), None)
    """
    ordered = sorted(set(paths))
    present = set(ordered)
    if "" in present and len(ordered) > 1:
        return "", ordered[1]
    # Module names never hold a dot, so a path's ancestors are exactly its dotted prefixes: one
    # look-up per level, where comparing every pair costs a planner that grows a set of hundreds
    # of layers one region at a time a cube of its size.
    for inner in ordered:
        parts = inner.split(".")
        for depth in range(1, len(parts)):
            outer = ".".join(parts[:depth])
            if outer in present:
                return outer, inner
    return None


def repeated_layers(model: nn.Module) -> tuple[str, ...]:
    """The paths of ``model``'s layers, outermost only, in module order: every module of the block
    class that repeats most within one list (an ``nn.ModuleList`` or ``nn.Sequential``; a block is a
    module with submodules, so a list of single ops, a ``Conv2d`` after a ``ReLU``, holds no layers,
    and a pooling op between blocks does not break a list). A transformer's ``h`` or ``layers``, a
    ResNet's bottlenecks, GoogLeNet's inception blocks. Empty when no block class repeats in a list.

    Every module of that class counts, wherever it sits (a ResNet's four stages are four lists of one
    block class): what ``apply_activation_checkpointing`` wraps when given the layer class, and what
    Hugging Face's ``gradient_checkpointing_enable()`` wraps in a transformer. Blocks that are plain
    ``nn.Sequential`` say nothing by their class: then only the winning list's blocks are layers.

    Example:
        >>> block = lambda: nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ModuleList([block(), block(), block()]), nn.ReLU(), block())
        >>> repeated_layers(model)
        ('1.0', '1.1', '1.2')
        >>> repeated_layers(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)))
        ()
    """
    best: tuple[int, str, type[nn.Module]] | None = None
    for path, container in model.named_modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        # single ops (a ReLU, a pooling op) are what layers are made of, not layers
        counts = Counter(type(child) for child in container.children() if next(child.children(), None) is not None)
        if not counts:
            continue
        kind, count = counts.most_common(1)[0]
        if count >= 2 and (best is None or count > best[0]):
            best = (count, path, kind)
    if best is None:
        return ()
    _, container_path, kind = best
    if kind in (nn.Sequential, nn.ModuleList):
        prefix = f"{container_path}." if container_path else ""
        children = model.get_submodule(container_path).named_children()
        return tuple(f"{prefix}{name}" for name, child in children if type(child) is kind)
    paths = [path for path, module in model.named_modules() if type(module) is kind and path]
    return tuple(p for p in paths if not any(o != p and p.startswith(o + ".") for o in paths))


class Stamps(Protocol):
    """A clock as :class:`cswap.profile.profiler.Clock` is one: ``start``, ``stamp``, ``synchronize``, ``seconds``."""

    def start(self) -> None: ...
    def stamp(self) -> Any: ...
    def synchronize(self) -> None: ...
    def seconds(self, stamp: Any) -> float: ...


@dataclass(frozen=True)
class SavedRecord:
    """One pack through the outer hooks with nothing enabled.

    Attributes:
        key: its ordinal.
        shape, dtype: the saved tensor's.
        storage: an id of its storage, equal for tensors sharing memory.
        storage_bytes: that storage's bytes.
        movable: not a parameter, buffer or leaf that requires grad.
        calls: indices of the module calls running when it was saved, outermost first.
    """

    key: int
    shape: tuple[int, ...]
    dtype: str
    storage: int
    storage_bytes: int
    movable: bool
    calls: tuple[int, ...]


@dataclass(frozen=True)
class InputRecord:
    """A tensor input of a module call.

    Attributes:
        name: the position (``"0"``) or the keyword.
        keyword: passed by keyword (checkpoint holds it by reference, unseen by outer hooks).
        shape, dtype, storage, storage_bytes, movable: as in :class:`SavedRecord`.
    """

    name: str
    keyword: bool
    shape: tuple[int, ...]
    dtype: str
    storage: int
    storage_bytes: int
    movable: bool


@dataclass(frozen=True)
class CallRecord:
    """One call of a module's forward.

    Attributes:
        index: its order of entry in the iteration.
        path: the module's path (``""`` for the model).
        first_key: the ordinal the next pack got when it began.
        grad_enabled: grad mode at entry (without it checkpoint saves nothing).
        forward_s: seconds from its entry to its exit (the forward it would run again).
        inputs: its tensor inputs, positional first.
        modifies_input: an input's version changed during the call (e.g. ``ReLU(inplace=True)``).
        reentrant: the module was already running when it was called.
        mutable_input: the first input that is a mutable object other than a tensor (a list, a
            dict, a key/value cache), as ``"name: type"``; ``None`` when there is none.
        repeated_input: one tensor object was passed as several positional inputs (``attn(x, x, x)``).
        hook_saves: a forward pre-hook registered on the module before any of the regions' saved a
            tensor for backward (the older ``spectral_norm`` and ``weight_norm``): outside the
            region's checkpoint in the forward, inside it when recomputed.
    """

    index: int
    path: str
    first_key: int
    grad_enabled: bool
    forward_s: float
    inputs: tuple[InputRecord, ...]
    modifies_input: bool
    reentrant: bool
    mutable_input: str | None = None
    repeated_input: bool = False
    hook_saves: bool = False


@dataclass(frozen=True)
class OuterPack:
    """One ordinal of the outer pack sequence with some regions enabled.

    Attributes:
        key: the profiled key it is, or ``None`` for a region's input.
        region: for a region's input, the region's path.
        call: for a region's input, the :class:`CallRecord` index.
        input: for a region's input, its position (``"0"``).
    """

    key: int | None
    region: str | None = None
    call: int | None = None
    input: str | None = None


@dataclass(frozen=True)
class RegionFacts:
    """What recomputing one region (all its calls) does, alone.

    Attributes:
        path: the module path.
        keys: profiled keys of the tensors saved inside it.
        freed_bytes: bytes no longer held between its forward and its backward; negative when the
            input it keeps was not saved before and its saves stay held by others (a lone ``Tanh``).
        input_bytes: bytes of its positional tensor inputs (held through the outer hooks).
        closure_bytes: bytes of its keyword tensor inputs (held by reference, resident).
        recompute_bytes: bytes its recomputation allocates and holds until its backward is done
            (its saved tensors other than its inputs, parameters and buffers).
        forward_s: the forward seconds it runs again in backward (the recompute cost).
        calls: forward calls in the iteration.
        ineligible: why it cannot be recomputed, or ``None``.
    """

    path: str
    keys: tuple[int, ...]
    freed_bytes: int
    input_bytes: int
    closure_bytes: int
    recompute_bytes: int
    forward_s: float
    calls: int
    ineligible: str | None


def _distinct_bytes(items: Iterable[SavedRecord | InputRecord]) -> int:
    sizes = {item.storage: item.storage_bytes for item in items if item.movable}
    return sum(sizes.values())


@dataclass(frozen=True)
class RegionProfile:
    """The outer saves and module calls of one iteration, and the facts per region.

    Attributes:
        saves: every outer pack, by key.
        calls: every module call, in order of entry.
        regions: per module path that ran, its :class:`RegionFacts`.
        layers: the model's repeated layers (:func:`repeated_layers`), whether or not they ran.
        compiled: the paths whose module runs as a ``torch.compile`` graph
            (:func:`cswap.profile.rerun.compiled_paths`): the modules under them are never recorded.
        draws_host_random: the forward and backward drew from Python's or NumPy's global random
            generator, which torch's checkpoint does not put back for a recomputation: the regions
            that recompute then put their states back
            (:meth:`cswap.execute.recompute.RecomputeRegions.replay_host_random`). Which module drew
            is not told apart: reading the states around every call would cost each tens of
            microseconds, and inflate the forward times measured for recomputing.
        keeps_state: the paths of the modules whose state (tensors in plain attributes, buffers
            other than running statistics: :class:`cswap.profile.rerun.ModuleState`) changed while
            the iteration ran, in a call, in its pre-hooks or by its caller: state a call leaves for
            the next one (RecurrentGemma's recurrence, a spectral norm's vectors), which the regions
            holding them put back for a recomputation
            (:meth:`cswap.execute.recompute.RecomputeRegions.replay_module_state`).
    """

    saves: tuple[SavedRecord, ...]
    calls: tuple[CallRecord, ...]
    regions: Mapping[str, RegionFacts]
    layers: tuple[str, ...] = ()
    compiled: tuple[str, ...] = ()
    draws_host_random: bool = False
    keeps_state: tuple[str, ...] = ()

    @property
    def candidates(self) -> tuple[str, ...]:
        """Paths worth recomputing: they save tensors and can be recomputed."""
        return tuple(p for p, f in self.regions.items() if f.keys and f.ineligible is None)

    @property
    def ineligible(self) -> dict[str, str]:
        """Paths that save tensors but cannot be recomputed, with the reason."""
        return {p: f.ineligible for p, f in self.regions.items() if f.keys and f.ineligible is not None}

    def excluding(self, reasons: Mapping[str, str]) -> RegionProfile:
        """This profile with the regions in ``reasons`` (path -> why) ineligible too, as a runtime that
        saw torch refuse their recomputation marks them."""
        known = {path: why for path, why in reasons.items() if path in self.regions and self.regions[path].ineligible is None}
        if not known:
            return self
        regions = {path: replace(facts, freed_bytes=0, ineligible=known[path]) if path in known else facts
                   for path, facts in self.regions.items()}
        return replace(self, regions=MappingProxyType(regions))

    def with_recompute_seconds(self, trace: Trace) -> Trace:
        """``trace`` with each record's ``recompute_s``: the forward seconds of the innermost module call
        that saved it (what recomputing its producer costs; the simulator and planner price it)."""
        innermost = {s.key: self.calls[s.calls[-1]].forward_s for s in self.saves if s.calls}
        return replace(trace, tensors=tuple(replace(r, recompute_s=innermost.get(r.key, r.recompute_s)) for r in trace.tensors))

    def count_growth(self, shapes: Mapping[int, tuple[int, ...]], sizes: SizeMap) -> dict[int, float]:
        """Per key saved at its profiled shape by a loop inside a module call whose inputs grow
        (with ``shapes`` and ``sizes`` as :meth:`scaled` takes them), how many times more of it to
        expect. A loop over the sequence saves tensors of one shape at every step (Mamba's reference
        scan: 24 then 40 per layer, several each), and a region recomputing it rebuilds them all:
        counted at the profile's number, a plan made for the longer sequence passed its budget by
        9%. A loop is told by repetition: a shape and dtype the call saved at least as many times
        as a size of its inputs that grows (the steps), which grows the count as that size does.
        Once or twice (a scalar, batch norm's statistics) is no loop; a parameter is never moved.

        >>> slices = tuple(SavedRecord(k, (2, 16), "float32", k, 128, True, (0,)) for k in range(24))
        >>> call = CallRecord(0, "scan", 0, True, 1e-3, (InputRecord("0", False, (2, 24, 16), "float32", 99, 3072, True),),
        ...                   False, False)
        >>> profile = RegionProfile(saves=(*slices, SavedRecord(24, (2, 24, 16), "float32", 24, 3072, True, (0,))),
        ...                         calls=(call,), regions={})
        >>> counts = profile.count_growth({24: (2, 40, 16)}, SizeMap.learn([((2, 24, 16), (2, 40, 16))]))
        >>> len(counts), round(counts[0], 3)
        (24, 1.667)
        """
        if not shapes:
            return {}
        grown_sizes: dict[int, dict[int, int]] = {}  # per call, each size of its inputs that grows, and what to
        for call in self.calls:
            grown = {old: sizes.size(old) for inp in call.inputs for old in inp.shape if sizes.size(old) > old}
            if grown:
                grown_sizes[call.index] = grown
        repeats: dict[tuple[int, tuple[int, ...], str], list[int]] = {}
        for save in self.saves:
            if save.movable and save.key not in shapes and save.calls and save.calls[-1] in grown_sizes:
                repeats.setdefault((save.calls[-1], save.shape, save.dtype), []).append(save.key)
        counts = {}
        for (call, _, _), keys in repeats.items():
            steps = [old for old in grown_sizes[call] if old <= len(keys)]
            if steps:
                old = max(steps)
                counts.update(dict.fromkeys(keys, grown_sizes[call][old] / old))
        return counts

    def scaled(self, shapes: Mapping[int, tuple[int, ...]], sizes: SizeMap, counts: Mapping[int, float] | None = None) -> RegionProfile:
        """This profile with the saves of ``shapes`` (per key) at those shapes, the calls' inputs
        at the sizes ``sizes`` infers, each storage's bytes and each call's seconds grown as its
        tensors, and every region's facts worked out again (the regions refused stay refused).
        ``counts``: per key at its profiled shape, how many times its bytes to count
        (:meth:`count_growth`). :func:`cswap.profile.shapes.scaled_trace` does the same to the trace."""
        if not shapes:
            return self
        growth: dict[int, float] = {}
        saves = []
        for save in self.saves:
            shape = shapes.get(save.key)
            ratio = math.prod(shape) / max(math.prod(save.shape), 1) if shape is not None else (counts or {}).get(save.key)
            if ratio is not None:
                growth[save.storage] = max(growth.get(save.storage, 1.0), ratio)
        for save in self.saves:
            ratio = growth.get(save.storage, 1.0)
            saves.append(replace(save, shape=shapes.get(save.key, save.shape), storage_bytes=math.ceil(save.storage_bytes * ratio)))
        calls = []
        for call in self.calls:
            inputs = []
            for inp in call.inputs:
                shape = tuple(sizes.size(s) for s in inp.shape)
                ratio = growth.get(inp.storage, math.prod(shape) / max(math.prod(inp.shape), 1))
                inputs.append(replace(inp, shape=merged(inp.shape, shape), storage_bytes=math.ceil(inp.storage_bytes * ratio)))
            ratio = max((new.storage_bytes / max(old.storage_bytes, 1) for new, old in zip(inputs, call.inputs)), default=1.0)
            calls.append(replace(call, inputs=tuple(inputs), forward_s=call.forward_s * ratio))
        reasons = {path: facts.ineligible for path, facts in self.regions.items()}
        return _with_facts(tuple(saves), tuple(calls), reasons, self.layers, self.compiled, self.draws_host_random, self.keeps_state)

    def _enabled(self, enabled: Iterable[str]) -> set[str]:
        """``enabled`` as a set, checked: regions that ran, none inside another."""
        paths = set(enabled)
        missing = sorted(paths - set(self.regions))
        if missing:
            raise ValueError(f"regions {missing} did not run in the profiled iteration: choose among RegionProfile.regions")
        pair = nested_pair(paths)
        if pair is not None:
            raise ValueError(f"recompute regions {pair[0]!r} and {pair[1]!r} are nested: enable one of them, not both")
        return paths

    def sequence(self, enabled: Iterable[str]) -> tuple[OuterPack, ...]:
        """The outer pack sequence when ``enabled`` regions are recomputed (index = new ordinal).

        Raises:
            ValueError: nested regions, or a path that did not run.
        """
        paths = self._enabled(enabled)
        active = {c.index for c in self.calls if c.path in paths and c.grad_enabled}
        events: list[tuple[int, int, int, OuterPack]] = []
        for c in self.calls:
            if c.index in active:
                for inp in c.inputs:
                    if not inp.keyword:
                        events.append((c.first_key, 0, c.index, OuterPack(None, c.path, c.index, inp.name)))
        for s in self.saves:
            if not active.intersection(s.calls):
                events.append((s.key, 1, 0, OuterPack(s.key)))
        events.sort(key=lambda e: e[:3])
        return tuple(e[3] for e in events)

    def held_bytes(self, enabled: Iterable[str] = ()) -> int:
        """Bytes of movable tensors the outer hooks hold over the iteration with ``enabled`` regions."""
        items: list[SavedRecord | InputRecord] = []
        for pack in self.sequence(enabled):
            if pack.key is not None:
                items.append(self.saves[pack.key])
            else:
                call = self.calls[pack.call]  # type: ignore[index]
                items.extend(i for i in call.inputs if i.name == pack.input and not i.keyword)
        return _distinct_bytes(items)

    def freed_keys(self, enabled: Iterable[str]) -> tuple[int, ...]:
        """Movable profiled keys whose memory is no longer held when ``enabled`` regions are recomputed.

        Keys that share a storage (a tensor saved twice, a view and its base) come together and
        free that storage's bytes once.
        """
        sequence = self.sequence(enabled)
        held = {self.saves[p.key].storage for p in sequence if p.key is not None}
        held |= {i.storage for p in sequence if p.key is None for i in self.calls[p.call].inputs if i.name == p.input and not i.keyword}  # type: ignore[index]
        return tuple(s.key for s in self.saves if s.movable and s.storage not in held)

    def freed_bytes(self, enabled: Iterable[str]) -> int:
        """Bytes the outer hooks no longer hold when ``enabled`` regions are recomputed: what
        :meth:`held_bytes` tells apart, from the storages whose every movable save the regions'
        grad-enabled calls drop and the positional inputs those calls add in their place, without
        building the pack sequence (asked once per region, that made a profile quadratic in the
        model's modules).

        Raises:
            ValueError: nested regions, or a path that did not run.
        """
        paths = self._enabled(enabled)
        by_call, by_path, held, holders = self._index
        active = [c for path in paths for c in by_path[path] if c.grad_enabled]
        dropped = {s.key: s for c in active for s in by_call.get(c.index, ()) if s.movable}
        gone = {storage for storage, n in Counter(s.storage for s in dropped.values()).items() if n == holders[storage]}
        inputs = {i.storage: i.storage_bytes for c in active for i in c.inputs if not i.keyword and i.movable}
        added = sum(nbytes for storage, nbytes in inputs.items() if storage not in held or storage in gone)
        return sum(held[storage] for storage in gone) - added

    @functools.cached_property
    def _index(self) -> tuple[dict[int, list[SavedRecord]], dict[str, list[CallRecord]], dict[int, int], Counter[int]]:
        """The saves by the index of each call running when it was made; the calls by path; the
        bytes of every storage a movable save holds; how many movable saves hold each."""
        by_call: dict[int, list[SavedRecord]] = {}
        for record in self.saves:
            for index in record.calls:
                by_call.setdefault(index, []).append(record)
        by_path: dict[str, list[CallRecord]] = {}
        for call in self.calls:
            by_path.setdefault(call.path, []).append(call)
        held = {s.storage: s.storage_bytes for s in self.saves if s.movable}
        return by_call, by_path, held, Counter(s.storage for s in self.saves if s.movable)


class RegionTracer:
    """Records module calls and outer packs; the pack hook of the caller calls :meth:`record`.

    Use it as a context manager around one forward+backward with nothing enabled, either with its
    own identity hooks (:meth:`pack`, :meth:`unpack`, as :func:`profile_regions` does) or from
    another pack hook (the runtime's profiling iteration), then read :meth:`profile`.

    Args:
        model: the model whose submodules are the regions.
        clock: the timestamps (default a :class:`cswap.profile.profiler.Clock` of the model's device).
    """

    def __init__(self, model: nn.Module, clock: Stamps | None = None) -> None:
        self.model = model
        first = next(model.parameters(), None)
        self.clock: Stamps = clock if clock is not None else Clock(first.device if first is not None else torch.device("cpu"))
        self._protected = {StorageWeakRef(t.untyped_storage()).cdata for t in [*model.parameters(), *model.buffers()]
                           if t.layout is torch.strided}
        self._refs: list[StorageWeakRef] = []  # keep storage ids unique while the profile is built
        self._saves: list[SavedRecord] = []
        self._calls: list[dict[str, Any]] = []
        self._stack: list[int] = []
        self._handles: list[Any] = []
        self._stopped = False
        self._compiled = compiled_paths(model)
        self._layers = repeated_layers(model)
        self._host_random: HostRandomState | None = None  # as the forward found them
        self._drew_host_random = False
        # per module called, its path and its state as last seen (entering or leaving a call)
        self._seen_states: dict[int, tuple[str, ModuleState]] = {}
        self._keeps_state: set[str] = set()
        self._packs_before_hooks: dict[int, int] = {}  # per module running, the saves when its first pre-hook ran

    def __enter__(self) -> RegionTracer:
        for path, module in self.model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._before_hooks(path), prepend=True))
            self._handles.append(module.register_forward_pre_hook(self._enter(path), with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._leave, always_call=True))
        self._host_random = HostRandomState.now()
        self.clock.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop recording: later module calls and packs (another micro-batch's) are not this profile's."""
        if not self._stopped and self._host_random is not None:
            self._drew_host_random = not self._host_random.same_as(HostRandomState.now())
        if not self._stopped:  # what changed after a module's last call (its caller reset it) counts too
            for path, seen in self._seen_states.values():
                if seen.changed():
                    self._keeps_state.add(path)
            self._seen_states.clear()  # (they hold tensors)
        self._stopped = True
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _storage(self, t: torch.Tensor) -> tuple[int, int]:
        if t.layout is not torch.strided:  # sparse: no storage, and never moved; an id no storage has
            return -id(t), 0
        ref = StorageWeakRef(t.untyped_storage())
        self._refs.append(ref)
        return ref.cdata, t.untyped_storage().nbytes()

    def _movable(self, t: torch.Tensor, storage: int) -> bool:
        base = t._base
        return t.layout is torch.strided and not ((t.is_leaf and t.requires_grad) or (base is not None and base.is_leaf and base.requires_grad) or storage in self._protected)

    def _input(self, name: str, keyword: bool, t: torch.Tensor) -> tuple[InputRecord, torch.Tensor, int]:
        storage, nbytes = self._storage(t)
        record = InputRecord(name, keyword, tuple(t.shape), str(t.dtype).removeprefix("torch."), storage, nbytes, self._movable(t, storage))
        return record, t, t._version

    def _watch_state(self, module: nn.Module, path: str | None = None) -> None:
        """Note whether ``module``'s state changed since it was last seen, and see it now
        (``path``: its path, when it may not have been seen yet)."""
        seen = self._seen_states.get(id(module))
        if seen is not None:
            path = seen[0]
            if seen[1].changed():
                self._keeps_state.add(path)
        if path is not None:
            self._seen_states[id(module)] = (path, ModuleState.now([module], copies=False))

    def _before_hooks(self, path: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            if torch.compiler.is_compiling():
                return
            self._packs_before_hooks[id(module)] = len(self._saves)
            if not self._stopped:  # before its own pre-hooks, which may set its state (the older spectral_norm)
                self._watch_state(module, path)

        return hook

    def _enter(self, path: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if torch.compiler.is_compiling():
                return  # traced into a compiled graph, the call is not this module's to recompute (nor recorded)
            # The pre-hooks that ran before this one (registered before the regions', which come
            # before it) saved what the region's checkpoint would not see in forward but would rerun
            hook_saves = len(self._saves) > self._packs_before_hooks.pop(id(module), len(self._saves))
            inputs = [self._input(str(i), False, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
            inputs += [self._input(k, True, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
            reentrant = any(self._calls[i]["path"] == path for i in self._stack)
            mutable = next((f"{name}: {kind}" for name, value in (*enumerate(args), *kwargs.items())
                            if (kind := mutable_kind(value)) is not None), None)
            self._stack.append(len(self._calls))
            positional = [id(a) for a in args if isinstance(a, torch.Tensor)]
            self._calls.append(dict(path=path, first_key=len(self._saves), grad_enabled=torch.is_grad_enabled(),
                                    inputs=inputs, reentrant=reentrant, mutable=mutable, repeated=len(set(positional)) < len(positional),
                                    hook_saves=hook_saves, start=self.clock.stamp(), end=None))

        return hook

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._stack and not torch.compiler.is_compiling():
            call = self._calls[self._stack.pop()]
            call["end"] = self.clock.stamp()
            # Decide now and drop the tensors: holding every module's inputs to the end of the
            # iteration would keep all activations alive.
            call["modifies_input"] = any(t._version != v for _, t, v in call["inputs"])
            call["inputs"] = [(record, None, v) for record, _, v in call["inputs"]]
            self._watch_state(module)

    def record(self, t: torch.Tensor) -> None:
        """Record the next outer pack (call from a pack hook, once per pack)."""
        if self._stopped:
            return
        storage, nbytes = self._storage(t)
        self._saves.append(SavedRecord(len(self._saves), tuple(t.shape), str(t.dtype).removeprefix("torch."), storage, nbytes,
                                       self._movable(t, storage), tuple(self._stack)))

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """An identity pack hook that records."""
        self.record(t)
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        """The identity unpack hook."""
        return t

    def profile(self) -> RegionProfile:
        """The :class:`RegionProfile` of what was recorded."""
        self.clock.synchronize()
        seconds = self.clock.seconds
        calls = tuple(
            CallRecord(
                index=i, path=c["path"], first_key=c["first_key"], grad_enabled=c["grad_enabled"],
                forward_s=(seconds(c["end"]) - seconds(c["start"])) if c["end"] is not None else 0.0,
                inputs=tuple(r for r, _, _ in c["inputs"]),
                modifies_input=c.get("modifies_input", False),
                reentrant=c["reentrant"],
                mutable_input=c["mutable"],
                repeated_input=c["repeated"],
                hook_saves=c["hook_saves"],
            )
            for i, c in enumerate(self._calls)
        )
        saves = tuple(self._saves)
        by_path: dict[str, list[CallRecord]] = {}
        for call in calls:
            by_path.setdefault(call.path, []).append(call)
        reasons = {path: self._ineligible(path, mine) or hook_refusal(self.model.get_submodule(path), path)
                   for path, mine in by_path.items()}
        return _with_facts(saves, calls, reasons, self._layers, self._compiled, self._drew_host_random, tuple(sorted(self._keeps_state)))

    def _ineligible(self, path: str, mine: list[CallRecord]) -> str | None:
        """Why the module at ``path``, called as ``mine``, cannot be recomputed, or ``None``."""
        compiled = next((c for c in self._compiled if path == c or path.startswith(f"{c}.")), None)
        if compiled is not None:
            return (f"it runs inside the torch.compile graph of {compiled or 'the model'!r}, traced with its "
                    "checkpoint hooks as they were then: enabling it later would not reach the compiled code")
        if any(c.modifies_input for c in mine):
            return MODIFIES_INPUT if not any(c.reentrant for c in mine) else REENTRANT
        if any(c.hook_saves for c in mine):
            return HOOK_SAVES
        return call_refusal(next((c.mutable_input for c in mine if c.mutable_input), None), any(c.repeated_input for c in mine),
                            any(c.reentrant for c in mine))


#: Why a module whose forward modifies an input in place cannot be recomputed.
MODIFIES_INPUT = ("its forward modifies an input in place (e.g. ReLU(inplace=True)): the input checkpoint "
                  "saved would fail torch's version check in backward")

def hook_refusal(module: nn.Module, path: str = "") -> str | None:
    """Why the region of ``module`` (at ``path``) is not recomputed: a module in it (itself
    included) has a foreign hook (:func:`cswap.profile.rerun.foreign_hooks`), or one is registered
    for every module (:func:`cswap.profile.rerun.global_foreign_hooks`); ``None`` when none is.

    Example:
        >>> block = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
        >>> hook_refusal(block, "h.0") is None
        True
        >>> handle = block[1].register_forward_hook(print)
        >>> hook_refusal(block, "h.0").startswith("a forward hook on 'h.0.1' (builtins.print)")
        True
    """
    everywhere = global_foreign_hooks()
    if everywhere:
        return (f"a forward hook registered for every module ({everywhere[0]}) would run again for each module recomputed "
                "in backward, where plain PyTorch runs it once: no region is recomputed while it is registered")
    for where, inner in module.named_modules(prefix=path):
        hooks = foreign_hooks(inner)
        if hooks:
            return (f"a forward hook on {where or 'the model'!r} ({hooks[0]}) would run again when it is recomputed in "
                    "backward, where plain PyTorch runs it once: the regions that hold the module are left out")
    return None


#: Why a module whose pre-hooks save tensors for backward cannot be recomputed.
HOOK_SAVES = ("a forward pre-hook on it saves tensors for backward (the older spectral_norm or weight_norm): it runs "
              "before the region's checkpoint in the forward and inside it when recomputed, so torch would refuse the "
              "recomputed values; the parametrizations form (torch.nn.utils.parametrizations) can be recomputed")

#: Why a module whose forward calls itself cannot be recomputed.
REENTRANT = "its forward calls itself: one checkpoint state per module cannot hold two open calls"


def call_refusal(mutable_input: str | None, repeated_input: bool, reentrant: bool = False) -> str | None:
    """Why a module call cannot be recomputed, from what its inputs show before it runs (``None``:
    nothing does): it calls itself, it is given one tensor as several inputs, or a mutable object
    (``mutable_input``, as ``"name: type"``). The profile's reason, and the one recompute regions
    give for a call they leave out (:meth:`cswap.execute.recompute.RecomputeRegions.guard`).

    Example:
        >>> call_refusal("cache: DynamicCache", False).startswith("its input cache: DynamicCache is a mutable object")
        True
        >>> call_refusal(None, False) is None
        True
    """
    if reentrant:
        return REENTRANT
    if repeated_input:
        return ("it is called with one tensor as several inputs (attention(x, x, x)): the recomputation gets "
                "them as separate tensors, and code that tests `query is key` (nn.MultiheadAttention) takes another path")
    if mutable_input is not None:
        return (f"its input {mutable_input} is a mutable object, held by reference until backward: what the forward "
                "after the call appends to it (a list of features, a key/value cache) the recomputation would read; "
                "for a Hugging Face model, config.use_cache = False for training makes its layers recomputable")
    return None


def _with_facts(saves: tuple[SavedRecord, ...], calls: tuple[CallRecord, ...], reasons: Mapping[str, str | None],
                layers: tuple[str, ...], compiled: tuple[str, ...] = (), draws_host_random: bool = False,
                keeps_state: tuple[str, ...] = ()) -> RegionProfile:
    """The :class:`RegionProfile` of ``saves`` and ``calls``, each region's facts worked out from
    them, with ``reasons`` (per path: why it cannot be recomputed, or ``None``)."""
    partial = RegionProfile(saves, calls, MappingProxyType({c.path: None for c in calls}))  # type: ignore[dict-item]
    saves_by_call, calls_by_path = partial._index[:2]
    regions: dict[str, RegionFacts] = {}
    for path in partial.regions:
        mine = calls_by_path[path]
        inside = sorted({s.key: s for c in mine for s in saves_by_call.get(c.index, ())}.values(), key=lambda s: s.key)
        inputs = [i for c in mine for i in c.inputs]
        input_storages = {i.storage for i in inputs}
        reason = reasons.get(path)
        regions[path] = RegionFacts(
            path=path,
            keys=tuple(s.key for s in inside),
            freed_bytes=0 if reason else partial.freed_bytes([path]),
            input_bytes=_distinct_bytes(i for i in inputs if not i.keyword),
            closure_bytes=_distinct_bytes(i for i in inputs if i.keyword),
            recompute_bytes=_distinct_bytes(s for s in inside if s.storage not in input_storages),
            forward_s=sum(c.forward_s for c in mine),
            calls=len(mine),
            ineligible=reason,
        )
    return RegionProfile(saves, calls, MappingProxyType(regions), layers, compiled, draws_host_random, keeps_state)


def profile_regions(model: nn.Module, step: Callable[[], Any], *, clock: Stamps | None = None) -> RegionProfile:
    """Run ``step`` (one forward+backward of ``model``) once, recording every region's facts.

    Args:
        model: the model.
        step: runs one forward and backward; it is a real training step (buffers update).
        clock: the timestamps (inject one for deterministic tests).

    Raises:
        ValueError: a region of ``model`` is enabled (profile with nothing enabled).
    """
    for path, module in model.named_modules():
        state = checkpoint.state(module)  # None when checkpoint was never applied
        if state is not None and state.enable_hook:
            raise ValueError(f"recompute region {path!r} is enabled: profile with nothing enabled (RecomputeRegions.disable_all())")
    with RegionTracer(model, clock) as tracer, torch.autograd.graph.saved_tensors_hooks(tracer.pack, tracer.unpack):
        step()
    return tracer.profile()
