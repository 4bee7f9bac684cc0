"""Recompute regions: drop a module's saved tensors in forward and rebuild them in backward.

Built on PyTorch's own non-reentrant checkpointing in its composable per-module form
(``torch.distributed._composable.checkpoint``): hooks on the module, so the model's code, its
structure and its parameter names stay as they are, and keyword arguments (attention masks) work.
The RNG state is stashed at the region's entry and restored for the recomputation, so dropout
draws the same mask and gradients are bit-identical. Torch stashes its own generators; Python's and
NumPy's global ones, which some models draw from in forward (the SpecAugment masks of Wav2Vec2,
HuBERT and WavLM come from ``np.random``), are stashed here for the regions of a model seen drawing
from them, and put back for the recomputation of each call that drew. So is the state a module
keeps from one call to the next, in plain tensor attributes (RecurrentGemma's recurrence starts from
the state its last call left there) or in buffers its forward updates (a spectral norm's vectors),
for the regions holding a module seen changing it. A region holding a module with a user's forward
hook is never recomputed: the hook would run again in backward.

Granularity: one region is one ``nn.Module`` call. That is the smallest unit torch checkpoints
cleanly in an eager model the user did not write: a module is the only boundary that exists
without editing the model's ``forward`` (an op-level policy, selective activation checkpointing,
still needs a function to wrap, and a per-op cut inside an HF block would need its source).
Leaf modules (a ``ReLU``, a ``BatchNorm2d``, a ``Linear``) are regions too, so the choice goes down
to single ops wherever the model is built from modules.

A region's hooks are attached the first time it is enabled (:meth:`RecomputeRegions.enable`), and
from then on turned on and off through the composable API's ``enable_hook`` flag: a module never
recomputed runs with no hook of ours (a hook on every module would cost each call several
microseconds, a third of the step of a model of many small modules). The recomputation runs under a
context that puts back the batch-norm running statistics the recomputed forward updates a second
time, and that refuses to recompute from a keyword input modified in place since the forward.

Example:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    >>> regions = RecomputeRegions(model)
    >>> regions.enable(["1"])
    >>> model(torch.randn(3, 4)).sum().backward()
    >>> regions.enabled
    ('1',)
    >>> regions.disable_all(); regions.enabled
    ()
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed._composable import checkpoint
from torch.utils._pytree import tree_leaves

from cswap.profile.regions import MODIFIES_INPUT, REENTRANT, call_refusal, hook_refusal, nested_pair
from cswap.profile.rerun import HostRandomState, ModuleState, mutable_kind

__all__ = ["ModifiedInputError", "RecomputeListener", "RecomputeRegions", "running_stat_modules"]


def running_stat_modules(module: nn.Module) -> list[nn.Module]:
    """The normalisation modules under ``module`` (itself included) that keep running statistics."""
    return [
        m for m in module.modules()
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats and m.running_mean is not None
    ]


@dataclass
class _Call:
    """The tensor inputs of one enabled call and their versions when it began, the host
    generators' states then, while its forward may have drawn from them (``None``: it did not),
    and the state of the modules in the region that keep some (``None``: none does)."""

    path: str
    inputs: list[tuple[str, torch.Tensor, int]]
    host_random: HostRandomState | None = None
    module_state: ModuleState | None = None
    watching_state: bool = False  # guarded: every module's state, to see whether the call changes it


class ModifiedInputError(RuntimeError):
    """A guarded region's call modified a positional input in place
    (:meth:`RecomputeRegions.guard`): recomputing it would read the modified values."""


class RecomputeListener(Protocol):
    """Told of every tensor a region's recomputation saves for backward, except the call's own inputs
    (positional and keyword, views of them included), so that new memory can be counted while it lives.
    Parameters and buffers are not filtered out here: the listener knows them. A listener that also
    has ``rebuilt_in(path, tensor)`` is told through it instead, with the region's path; one that has
    ``recomputing(path)`` is told when a recomputation of the region at ``path`` begins, before it
    saves anything (room can be made for it then)."""

    def rebuilt(self, tensor: torch.Tensor) -> None: ...


def _storage_key(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage()._cdata
    except (NotImplementedError, RuntimeError):  # a tensor without storage (sparse, some subclasses)
        return None


class _RebuiltWatch:
    """Sits on top of torch's recomputation hook for one recomputation and tells ``listener`` of each
    tensor saved in new memory before handing it on.

    torch stores each recomputed tensor until its node unpacks it, then drops it: the listener sees
    the storage and can follow it to its free. The call's inputs are named by the region's forward
    pre-hook (:meth:`exclude`) before its forward saves anything.
    """

    def __init__(self, listener: RecomputeListener, path: str = "") -> None:
        self.listener = listener
        self.path = path
        self._rebuilt_in = getattr(listener, "rebuilt_in", None)
        self.inputs: set[int] = set()
        self._inner_pack: Any = None
        self._pushed = False

    def exclude(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # Flattening is a pytree walk; a call whose inputs are all positional tensors (most
        # regions' calls, once per recomputation) needs none.
        plain = not kwargs and all(isinstance(arg, torch.Tensor) for arg in args)
        for leaf in args if plain else tree_leaves((args, kwargs)):
            if isinstance(leaf, torch.Tensor):
                key = _storage_key(leaf)
                if key is not None:
                    self.inputs.add(key)

    def _pack(self, tensor: torch.Tensor) -> Any:
        key = _storage_key(tensor)
        if key is not None and key not in self.inputs:
            if self._rebuilt_in is not None:
                self._rebuilt_in(self.path, tensor)
            else:
                self.listener.rebuilt(tensor)
        return self._inner_pack(tensor)

    def __enter__(self) -> None:
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if hooks is None:  # nothing would be saved: torch recomputes under its own hook
            return
        self._inner_pack, inner_unpack = hooks
        torch._C._autograd._push_saved_tensors_default_hooks(self._pack, inner_unpack)
        self._pushed = True

    def __exit__(self, *exc: object) -> None:
        if self._pushed:
            torch._C._autograd._pop_saved_tensors_default_hooks()
            self._pushed = False


class _RecomputeContext:
    """The context of one region call's recomputation (re-entrant: a second backward re-enters it).

    On entry it checks that no keyword tensor input changed since the forward (torch checks the
    positional ones itself; keyword ones are held by reference and would silently give other values) and
    snapshots the running statistics; on exit it puts them back, so the recomputed forward leaves
    every buffer as the original forward left it. While it runs, a listener set on the regions is
    told of each tensor the recomputation saves (:class:`_RebuiltWatch`).
    """

    def __init__(self, call: _Call, region: _Region, counts: Counter[str], regions: RecomputeRegions) -> None:
        self.call = call
        self.region = region
        self.counts = counts
        self.regions = regions
        self._saved: list[list[torch.Tensor]] = []
        self._watches: list[_RebuiltWatch | None] = []
        self._host_before: list[HostRandomState | None] = []
        self._state_before: list[ModuleState | None] = []

    def __enter__(self) -> None:
        self.counts[self.call.path] += 1
        for name, tensor, version in self.call.inputs:
            if tensor._version != version:
                raise RuntimeError(
                    f"recompute region {self.call.path!r}: its input {name} was modified in place after the forward "
                    f"(version {version} -> {tensor._version}), so recomputing it would give other values; "
                    "stop recomputing this region or stop modifying the tensor in place"
                )
        drawn = self.call.host_random
        self._host_before.append(HostRandomState.now() if drawn is not None else None)
        if drawn is not None:  # the same numbers again; backward's own draws then go on as they were
            drawn.restore()
        state = self.call.module_state  # the state as the forward found it, then back as it is
        self._state_before.append(ModuleState.now(state.modules) if state is not None else None)
        if state is not None:
            state.restore()
        norms = self.region.norms
        self._saved.append([b.detach().clone() for m in norms for b in m.buffers(recurse=False)] if norms else [])
        listener = self.regions.listener
        recomputing = getattr(listener, "recomputing", None)
        if recomputing is not None:
            recomputing(self.call.path)
        watch = _RebuiltWatch(listener, self.call.path) if listener is not None else None
        if watch is not None:
            watch.__enter__()
            self.region.watches.append(watch)
        self._watches.append(watch)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        watch = self._watches.pop()
        if watch is not None:
            watch.__exit__()
            self.region.watches.remove(watch)
        before = self._host_before.pop()
        if before is not None:
            before.restore()
        state = self._state_before.pop()
        if state is not None:
            state.restore()
        saved = self._saved.pop()
        if not saved:  # no running statistics in the region: nothing to put back
            return
        with torch.no_grad():
            buffers = [b for m in self.region.norms for b in m.buffers(recurse=False)]
            for buffer, value in zip(buffers, saved, strict=True):
                buffer.copy_(value)


@dataclass
class _Region:
    path: str
    module: nn.Module
    norms: list[nn.Module]
    pending: _Call | None = None
    calls: list[_Call] = field(default_factory=list)
    # per call whose forward runs checkpointed: its args, and the call (told whether it drew from the host generators)
    open: list[tuple[tuple[Any, ...], _Call]] = field(default_factory=list)
    watches: list[_RebuiltWatch] = field(default_factory=list)
    attached: bool = False  # its hooks are on the module (they cannot be removed)
    # while guarding, per open call: its args, and its positional inputs' versions (None: left out)
    guarded: list[tuple[tuple[Any, ...], list[tuple[torch.Tensor, int]] | None]] = field(default_factory=list)
    stateful: tuple[nn.Module, ...] | None = None  # the modules in it that keep state (None: not worked out yet)


class RecomputeRegions:
    """Every submodule of ``model`` as a recompute region, disabled; each is attached when first enabled.

    Args:
        model: the model; its submodules get checkpoint hooks (its code and names are untouched).
        preserve_rng_state: stash and restore the RNG state so dropout is bit-identical (default).

    Attributes:
        paths: every module path (``""`` is the model itself), in ``named_modules`` order.

    Raises:
        ValueError: a module of ``model`` already has composable checkpoint hooks (use :meth:`of`).

    Limits (torch 2.13): a region whose forward modifies its input in place (``ReLU(inplace=True)``)
    fails in backward ("modified by an inplace operation"): :func:`cswap.profile.regions.profile_regions`
    marks it ineligible. A second backward through an enabled region (``retain_graph=True``) fails in
    torch's composable checkpoint (its recompute context cannot be re-entered). Hooks cannot be
    removed: after :meth:`disable_all`, a module that was ever enabled keeps a flag check per call,
    and the model itself carries torch's checkpoint state (where :meth:`of` finds the regions).

    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    >>> RecomputeRegions(model).paths
    ('', '0', '1')
    """

    def __init__(self, model: nn.Module, *, preserve_rng_state: bool = True) -> None:
        self.model = model
        self._regions: dict[str, _Region] = {}
        self._ineligible: dict[str, str] = {}
        self._recomputations: Counter[str] = Counter()
        self._enabled: tuple[str, ...] = ()  # the paths enable() last turned on, sorted
        self._guarding = False
        self._refused: dict[str, str] = {}  # calls the guard left out, per path: why
        self._modified: dict[str, str] = {}  # calls that modified a positional input in place
        self._host_random: set[str] = set()  # regions whose calls draw from Python's or NumPy's generator
        self._stateful: set[str] = set()  # modules that keep state between calls (tensor attributes, updated buffers)
        #: Told of each tensor a recomputation saves (set per iteration).
        self.listener: RecomputeListener | None = None
        for path, module in model.named_modules():
            if checkpoint.state(module) is not None:
                raise ValueError(
                    f"module {path!r} already has torch's composable checkpoint (a RecomputeRegions of this model exists, "
                    "or the model applies checkpoint itself): make one RecomputeRegions per model and reuse it"
                )
        self._preserve_rng_state = preserve_rng_state
        for path, module in model.named_modules():
            if path not in self._regions:
                self._regions[path] = _Region(path, module, running_stat_modules(module))
        self.paths: tuple[str, ...] = tuple(self._regions)
        self._path_of = {id(region.module): path for path, region in self._regions.items()}
        # Kept with the model (on torch's checkpoint state of its root, attached now), so that every
        # runtime of this model finds these regions (:meth:`of`) instead of attaching a second set.
        self._attach(self._regions[""])
        checkpoint.state(model).cswap_regions = self

    def _attach(self, region: _Region) -> None:
        """Put ``region``'s hooks on its module, disabled (once: they cannot be removed)."""
        if region.attached:
            return
        module = region.module
        if checkpoint.state(module) is not None:
            raise ValueError(
                f"module {region.path!r} has torch's composable checkpoint applied by another than these regions: "
                "make one RecomputeRegions per model and reuse it (RecomputeRegions.of)"
            )
        # Registered before checkpoint's own pre-hook, so it runs first and the context
        # function, called from checkpoint's hook, finds this call's inputs.
        module.register_forward_pre_hook(self._remember(region), with_kwargs=True)
        checkpoint(module, preserve_rng_state=self._preserve_rng_state, context_fn=self._contexts(region))
        # after checkpoint's own forward hook: a call the guard left out is checkpointed again after it
        module.register_forward_hook(self._after_call(region), always_call=True)
        checkpoint.state(module).enable_hook = False
        region.attached = True

    @classmethod
    def of(cls, model: nn.Module) -> RecomputeRegions:
        """The regions attached to ``model``, attached now when it has none.

        Several runtimes of one model (a benchmark comparing policies) share them: each enables
        its own set for its iterations.

        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> RecomputeRegions.of(model) is RecomputeRegions.of(model)
        True
        """
        state = checkpoint.state(model)
        found = getattr(state, "cswap_regions", None) if state is not None else None
        if isinstance(found, cls) and found.model is model:
            return found
        return cls(model)

    # ------------------------------------------------------------------ hooks

    def _remember(self, region: _Region) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            state = checkpoint.state(module)
            if not state.enable_hook:
                if region.watches:  # the recomputation calls the module again: these are its inputs
                    region.watches[-1].exclude(args, kwargs)
                return
            if self._guarding and torch.is_grad_enabled():
                why = self._refusal(region, args, kwargs)
                if why is not None:  # this call runs as it is, not checkpointed
                    self._refused.setdefault(region.path, why)
                    state.enable_hook = False
                    region.guarded.append((args, None))
                    return
                region.guarded.append((args, [(a, a._version) for a in args if isinstance(a, torch.Tensor)]))
            # Keyword inputs only: checkpoint holds them by reference (so this costs no memory) and
            # never checks them; positional ones are saved tensors that torch version-checks itself,
            # and holding them here would keep resident what an outer hook may have swapped out.
            inputs = [(f"keyword argument {k!r}", v, v._version) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
            # Python's and NumPy's generators are read only where the call may draw from them (a
            # region named to replay them, or any while guarding: ac-full's profile), at the cost of
            # two reads of their states per call.
            watched = self._preserve_rng_state and (self._guarding or region.path in self._host_random)
            call = _Call(region.path, inputs, HostRandomState.now() if watched else None)
            if self._guarding:
                call.module_state, call.watching_state = ModuleState.now(module.modules()), True
            elif self._stateful_modules(region):
                call.module_state = ModuleState.now(region.stateful)  # type: ignore[arg-type]
            region.pending = call
            if watched or call.watching_state:
                region.open.append((args, call))

        return hook

    def _after_call(self, region: _Region) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if region.open and region.open[-1][0] is args:
                call = region.open.pop()[1]
                if call.host_random is not None:
                    if call.host_random.same_as(HostRandomState.now()):
                        call.host_random = None  # nothing drawn: the recomputation need not put the states back
                    else:
                        self._host_random.add(region.path)
                if call.watching_state and call.module_state is not None:
                    changed = call.module_state.changed()
                    if changed:
                        self.replay_module_state(self._path_of[id(m)] for m in changed)
                    elif not self._stateful_modules(region):
                        call.module_state = None  # nothing to put back for its recomputation
            guarded = region.guarded
            if not guarded or guarded[-1][0] is not args:
                return
            _, versions = guarded.pop()
            if versions is None:
                checkpoint.state(module).enable_hook = True
            elif any(t._version != v for t, v in versions) and output is not None:
                # its recomputation would read the modified input, and with saved-tensor hooks outside
                # torch does not check: stop before a backward that would give other gradients
                self._modified.setdefault(region.path, MODIFIES_INPUT)
                raise ModifiedInputError(f"recompute region {region.path!r}: {MODIFIES_INPUT}")

        return hook

    @staticmethod
    def _refusal(region: _Region, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """Why this call of ``region`` cannot be recomputed: a user's hook on a module in it
        (:func:`cswap.profile.regions.hook_refusal`), or its inputs (:func:`cswap.profile.regions.call_refusal`)."""
        if any(versions is not None for _, versions in region.guarded):
            return REENTRANT
        hooked = hook_refusal(region.module, region.path)
        if hooked is not None:
            return hooked
        positional = [id(a) for a in args if isinstance(a, torch.Tensor)]
        mutable = next((f"{name}: {kind}" for name, value in (*enumerate(args), *kwargs.items())
                        if (kind := mutable_kind(value)) is not None), None)
        return call_refusal(mutable, len(set(positional)) < len(positional))

    def _contexts(self, region: _Region) -> Any:
        def context_fn() -> tuple[Any, Any]:
            call, region.pending = region.pending, None
            if call is None:  # a hook ran out of order: no input check, still restore the statistics
                call = _Call(region.path, [])
            return nullcontext(), _RecomputeContext(call, region, self._recomputations, self)

        return context_fn

    # ------------------------------------------------------------------ control

    def guard(self, on: bool) -> None:
        """While on, an enabled region's call whose inputs show it cannot be recomputed (a mutable
        object such as a key/value cache, one tensor as several inputs, a call of itself), or that
        holds a module with a user's hook, runs as it is, not checkpointed, and a call that modified
        a positional input in place raises :class:`ModifiedInputError` when it returns (its
        recomputation would read the modified values, which no check outside the hooks catches): a
        profile that runs with regions enabled before any profile said which are safe.
        :meth:`take_refusals` says which and why. A call that draws from Python's or NumPy's global
        generator is recomputed with their states put back, and so is every later call of its
        region (:meth:`replay_host_random`); one that changes a module's state, likewise
        (:meth:`replay_module_state`).

        >>> class Cached(torch.nn.Module):
        ...     def __init__(self): super().__init__(); self.linear = torch.nn.Linear(2, 2)
        ...     def forward(self, x, cache): cache.append(x); return self.linear(x).tanh()
        >>> model = torch.nn.Sequential(Cached()); regions = RecomputeRegions(model)
        >>> regions.enable(["0"]); regions.guard(True)
        >>> _ = model[0](torch.ones(1, 2, requires_grad=True), []).sum().backward()
        >>> regions.guard(False); refused, _ = regions.take_refusals()
        >>> refused["0"].startswith("its input 1: list is a mutable object"), regions.take_recomputations()
        (True, {})
        """
        self._guarding = on
        if not on:
            for region in self._regions.values():
                for _, versions in region.guarded:
                    if versions is None and region.attached:
                        checkpoint.state(region.module).enable_hook = True
                region.guarded.clear()

    def take_refusals(self) -> tuple[dict[str, str], dict[str, str]]:
        """Since the last call, per path: the calls :meth:`guard` left out, and those that modified a
        positional input in place, with why; resets them."""
        refused, modified = dict(self._refused), dict(self._modified)
        self._refused.clear()
        self._modified.clear()
        return refused, modified

    def mark_ineligible(self, reasons: dict[str, str]) -> None:
        """Refuse to enable these paths from now on (path -> why), e.g. from a profile's findings."""
        self._ineligible.update(reasons)
        self._enabled = ()  # the next enable checks its paths again

    @property
    def ineligible(self) -> Mapping[str, str]:
        """The paths :meth:`enable` refuses, and why."""
        return MappingProxyType(self._ineligible)

    def replay_host_random(self, paths: Iterable[str]) -> None:
        """Recompute each call of these regions that drew from Python's or NumPy's global random
        generator with their states as its forward found them (and put back after), as torch does
        with its own. Each call of these regions reads the states when it begins and ends (tens of
        microseconds): the runtime names them all where a profile saw the model draw
        (:attr:`cswap.profile.regions.RegionProfile.draws_host_random`). A region is added by itself
        when a guarded call of it draws (:meth:`guard`).

        >>> import numpy as np
        >>> class Masked(torch.nn.Module):
        ...     def forward(self, x): return torch.tanh(x * torch.from_numpy(np.random.rand(*x.shape) > 0.5))
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), Masked())
        >>> regions = RecomputeRegions(model); regions.replay_host_random(["1"]); regions.enable(["1"])
        >>> model(torch.randn(2, 4)).sum().backward(); regions.draws_host_random
        ('1',)
        """
        self._host_random.update(paths)

    def replay_module_state(self, paths: Iterable[str]) -> None:
        """Recompute each call of a region holding one of these modules with the modules' state as
        its forward found it, and put back after: the tensors in plain attributes and the buffers
        (running statistics excepted) a module keeps for its next call, which torch's checkpoint
        does not stash (:class:`cswap.profile.rerun.ModuleState`). Each call of such
        a region reads those attributes when it begins. The runtime names the modules a profile saw
        change theirs (:attr:`cswap.profile.regions.RegionProfile.keeps_state`); a module is added
        by itself when a guarded call changes it (:meth:`guard`).

        >>> class Running(torch.nn.Module):
        ...     def __init__(self): super().__init__(); self.last = None
        ...     def forward(self, x):
        ...         y = torch.tanh(x if self.last is None else x * self.last); self.last = y.detach(); return y
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), Running())
        >>> regions = RecomputeRegions(model); regions.replay_module_state(["1"]); regions.enable(["1"])
        >>> model(torch.ones(1, 2)).sum().backward(); regions.keeps_state
        ('1',)
        """
        self._stateful.update(paths)
        for region in self._regions.values():
            region.stateful = None

    @property
    def keeps_state(self) -> tuple[str, ...]:
        """The modules whose state a recomputation puts back, in module order."""
        return tuple(p for p in self._regions if p in self._stateful)

    def _stateful_modules(self, region: _Region) -> tuple[nn.Module, ...]:
        """The modules in ``region`` (itself included) whose state its recomputation puts back."""
        if region.stateful is None:
            region.stateful = tuple(m for p, m in region.module.named_modules(prefix=region.path) if p in self._stateful)
        return region.stateful

    @property
    def draws_host_random(self) -> tuple[str, ...]:
        """The regions recomputed with Python's and NumPy's generators put back, in module order."""
        return tuple(p for p in self._regions if p in self._host_random)

    def enable(self, paths: Iterable[str]) -> None:
        """Recompute exactly ``paths`` from the next forward on (every other region is disabled).

        Raises:
            ValueError: an unknown path, an ineligible one, or a module together with one of its
                ancestors (nested regions would recompute the inner one twice).
        """
        chosen = tuple(sorted(set(paths)))
        if chosen == self._enabled:
            # Every planned iteration asks for its plan's regions: the same ones, already checked
            # and enabled. Only a call a failed forward left half made is dropped, as disable_all does.
            for path in chosen:
                self._regions[path].pending = None
                self._regions[path].open.clear()
            return
        unknown = [p for p in chosen if p not in self._regions]
        if unknown:
            raise ValueError(f"unknown recompute regions {unknown}: choose module paths of the model (see RecomputeRegions.paths)")
        refused = {p: self._ineligible[p] for p in chosen if p in self._ineligible}
        if refused:
            raise ValueError(f"regions that cannot be recomputed: {refused}")
        pair = nested_pair(chosen)
        if pair is not None:
            outer, inner = pair
            raise ValueError(
                f"recompute regions {outer!r} and {inner!r} are nested ({outer!r} contains {inner!r}): "
                "enable one of them, not both"
            )
        self.disable_all()
        for path in chosen:
            region = self._regions[path]
            self._attach(region)
            checkpoint.state(region.module).enable_hook = True
        self._enabled = chosen

    def disable_all(self) -> None:
        """Recompute nothing from the next forward on."""
        self._enabled = ()
        for region in self._regions.values():
            if region.attached:
                checkpoint.state(region.module).enable_hook = False
                region.pending = None
                region.open.clear()

    def take_recomputations(self) -> dict[str, int]:
        """Per region path, how many of its calls were recomputed since the last call; resets the counts.

        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        >>> regions = RecomputeRegions(model); regions.enable(["1"])
        >>> model(torch.randn(3, 4)).sum().backward()
        >>> regions.take_recomputations(), regions.take_recomputations()
        ({'1': 1}, {})
        """
        counts = dict(self._recomputations)
        self._recomputations.clear()  # in place: contexts made in forward hold this counter
        return counts

    @property
    def enabled(self) -> tuple[str, ...]:
        """The enabled paths, in module order."""
        return tuple(p for p, r in self._regions.items() if r.attached and checkpoint.state(r.module).enable_hook)
