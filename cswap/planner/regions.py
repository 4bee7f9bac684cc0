"""The runtime's plan with recompute regions: which modules to recompute, and the rest within the budget.

The planner (:mod:`cswap.planner`) prices ``recompute`` per tensor, but the runtime can only
recompute what torch's checkpointing can cut out of an eager model: a module call
(:mod:`cswap.execute.recompute`). Enabling a region drops every tensor saved inside it and holds its
positional inputs instead, which shifts the ordinals of the packs after it. So the runtime plans
in two parts:

1. **Regions.** The candidates are the regions that free memory on their own
   (:class:`~cswap.profile.regions.RegionFacts` ``freed_bytes > 0``), ranked by bytes freed per
   second of forward they run again (Capuchin's memory saving per second, MSPS). Regions are
   added in that order, skipping a region nested in (or around) one already chosen, while the
   rest of the policy cannot meet the budget, each only when it lowers the least budget: a
   region's tensors are resident again from the start of its recomputation in backward to their
   own free, so a region rebuilt at the peak of backward (the last block, the whole model) saves
   nothing there. ``capuchin`` and ``cswap`` then try the next
   :data:`TIME_TRIALS` candidates and keep one when the predicted time (the plan of the rest plus
   the regions' forward seconds) drops: a cheap layer recomputed beats its bytes crossing a slow link.
   A trial whose regions alone run longer again than the best plan so far predicts cannot win (the
   rest's predicted seconds are never below 0), and is not solved.
2. **The rest.** The tensors the regions do not free are planned by the policy's other actions
   (:data:`BASE_POLICIES`: ``recompute`` keeps them, ``capuchin`` swaps by Capuchin's own greedy,
   ``cswap`` solves the MILP) on the profile with the freed tensors taken out.

The :class:`~cswap.planner.plan.Plan` it returns is keyed by the ordinals the packs get with the regions
enabled (:meth:`~cswap.profile.regions.RegionProfile.sequence`): a region's input takes the
decision of the profiled tensor it shares memory with, and ``plan.recomputed`` lists the dropped
tensors by their profiled keys.

Without a budget, ``recompute`` and ``capuchin`` plan at their least footprint: every candidate
region that frees memory, the rest at the least peak their actions reach.

``ac-full`` (activation checkpointing) does not choose: its regions are every repeated layer of the
model that ran with grad and can be recomputed (:func:`layer_regions`), the rest kept, with a
budget or without; under one, the least budget it meets is that plan's peak. A model without
repeated layers gets a plan that recomputes nothing and says why (``plan.planner["layers"]``).

Example:
    >>> import itertools, types
    >>> import torch
    >>> from torch import nn
    >>> from cswap.budget import MemoryBudget
    >>> from cswap.profile.trace import TensorRecord, Trace
    >>> from cswap.profile.regions import profile_regions
    >>> def block(): return nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64))
    >>> model = nn.Sequential(nn.Linear(8, 64), block(), block(), nn.Linear(64, 2))
    >>> x = torch.randn(4, 8)
    >>> ticks = itertools.count()  # a clock that ticks once per stamp: the choice does not hang on timing
    >>> clock = types.SimpleNamespace(start=lambda: None, stamp=lambda: next(ticks), synchronize=lambda: None, seconds=float)
    >>> profile = profile_regions(model, lambda: model(x).sum().backward(), clock=clock)
    >>> recs = tuple(TensorRecord(key=s.key, shape=s.shape, dtype=s.dtype, nbytes=s.storage_bytes, sparsity=0.0,
    ...              offloadable=s.movable, pack_at_s=0.1 * s.key, unpack_at_s=5.0 - 0.1 * s.key) for s in profile.saves)
    >>> trace = Trace(tensors=recs, d2h_gbps=10.0, h2d_gbps=10.0, forward_s=3.0, backward_s=1.0)
    >>> chosen = plan_regions(trace, profile, "recompute", MemoryBudget(fraction=0.7), NO_CODEC, "cpu", 0, epoch=0)
    >>> chosen.plan.recompute_regions, sorted(chosen.plan.recomputed), chosen.error
    (('1',), [3, 4, 6, 7], None)

The first block is recomputed: its interior is not held through the second block's backward, and
it is rebuilt only once that has freed its own. Recomputing the second block would not lower the
peak (it is rebuilt at the very start of backward), nor would the whole model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import torch

from cswap.budget import BudgetError, MemoryBudget
from cswap.planner import BudgetPlan, PlanningProblem, minimum_bytes, plan_budget, problem_from_trace, timeline_of
from cswap.planner.actions import POLICY_TABLE
from cswap.planner.budgeted import (
    FALLBACK_ACTIONS,
    NO_CODEC,
    PASSIVE_ACTION,
    SPARSITY_MARGIN,
    floor_note,
    host_budget_error,
    host_codec_model,
    profiled_device_peak,
    plan_from_budget,
    profile_action,
    with_profile_leasts,
)
from cswap.planner.costmodel import TimeModel
from cswap.planner.milp import EXACT_REL_GAP
from cswap.planner.solve import carry_plan
from cswap.planner.plan import Action, Decision, LaunchCache, Plan
from cswap.profile.regions import InputRecord, RegionProfile
from cswap.profile.regions import nested_pair
from cswap.profile.trace import Trace
from cswap.stats import human_bytes

__all__ = ["BASE_POLICIES", "GROW_WIDTH", "NO_CODEC", "TIME_TRIALS", "RegionPlan", "fixed_layers_plan", "layer_regions", "not_recomputed", "plan_regions"]

#: Per recomputing policy, the policy whose actions plan the tensors no region frees.
BASE_POLICIES: Mapping[str, str] = MappingProxyType(
    {name: policy.region_planner for name, policy in POLICY_TABLE.items() if policy.region_planner is not None}
)

#: How many more candidate regions ``capuchin`` and ``cswap`` try for time once the budget is met.
TIME_TRIALS = 4

#: How many addable candidates (in their ranked order) each step of the region choice prices by
#: the least budget they give; the one that lowers it most per forward second is added.
GROW_WIDTH = 16


@dataclass(frozen=True)
class RegionPlan:
    """The runtime's plan with recompute regions.

    Attributes:
        plan: the executor's plan (keyed by the ordinals with ``plan.recompute_regions`` enabled).
        budget_bytes: the budget in bytes (without a budget: the least footprint planned at).
        error: the :class:`~cswap.budget.BudgetError` to raise when the budget cannot be met.
        region_keys: per enabled region, the profiled keys it drops and rebuilds.
    """

    plan: Plan
    budget_bytes: int
    error: BudgetError | None = None
    region_keys: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


class _Planning:
    """Problems and least budgets per set of enabled regions, each built once."""

    def __init__(self, trace: Trace, profile: RegionProfile, base: str, time_model: TimeModel, backend: str, min_bytes: int,
                 host_budget_bytes: int | None = None, host_time_model: TimeModel | None = None, budgeted: bool = False,
                 time_limit_s: float = 30.0, rel_gap: float = EXACT_REL_GAP) -> None:
        self.trace = trace
        self.time_limit_s = time_limit_s
        self.rel_gap = rel_gap
        self._solved: dict[tuple[tuple[str, ...], int], BudgetPlan | None] = {}
        self.host_budget_bytes = host_budget_bytes
        # under a host budget, the host codec that prices host-zvc-swap for the rest (None: not offered)
        self.host_codec = host_codec_model(base, host_budget_bytes, time_model, backend, host_time_model)
        self.profile = profile
        self.base = base
        self.time_model = time_model
        self.backend = backend
        self.min_bytes = min_bytes
        self.budgeted = budgeted  # under a budget min_bytes binds nothing: small tensors move, their copies priced
        self._storages = {s.key: s.storage for s in profile.saves}
        self._memo: dict[tuple[str, ...], tuple[PlanningProblem, int]] = {}
        self._duplicates: dict[int, list[int]] | None = None  # per stored key, the keys stored once with it
        self._unpack_at = {r.key: r.unpack_at_s for r in trace.tensors}

    def freed(self, regions: tuple[str, ...]) -> frozenset[int]:
        return frozenset(self.profile.freed_keys(regions)) if regions else frozenset()

    def _rebuilt_bytes(self, groups: list[tuple[int, ...]]) -> dict[int, int]:
        """Per rebuilt key, the bytes its recomputation holds: its storage's, counted at the group's
        first key on that storage (torch rebuilds a view together with the storage it is cut from)."""
        held: dict[int, int] = {}
        for group in groups:
            seen: set[int] = set()
            for key in group:
                save = self.profile.saves[key]
                held[key] = 0 if save.storage in seen else save.storage_bytes
                seen.add(save.storage)
        return held

    def _own_unpacks(self, path: str, group: tuple[int, ...]) -> tuple[int, ...]:
        """The keys of ``group`` (``path``'s rebuilt keys) whose first unpack is the region's own. A
        save of the same storage and view outside the region (a rotary embedding's view, saved by
        every layer) is stored once, as a duplicate of the first (``trace.meta["duplicates"]``), and
        the first's unpack is whichever handle backward read first: where that was the duplicate
        outside, another layer's backward, the recomputation does not start there."""
        if self._duplicates is None:
            self._duplicates = {}
            for duplicate, first in self.trace.meta.get("duplicates", {}).items():
                self._duplicates.setdefault(int(first), []).append(int(duplicate))
        inside = set(self.profile.regions[path].keys)
        unpack = self._unpack_at

        def borrowed(key: int) -> bool:
            own = unpack.get(key)
            return own is not None and any(d not in inside and unpack.get(d) is not None and unpack[d] <= own  # type: ignore[operator]
                                           for d in self._duplicates.get(key, ()))  # type: ignore[union-attr]

        return tuple(k for k in group if not borrowed(k))

    def _input_keys(self, path: str, freed: frozenset[int]) -> tuple[int, ...]:
        """The kept keys whose data is a positional input of ``path``'s calls."""
        storages = self._input_storages(path, keyword=False)
        return tuple(k for k, storage in self._storages.items() if storage in storages and k not in freed)

    def _input_storages(self, path: str, keyword: bool) -> set[int]:
        """Storages of the tensor inputs of ``path``'s calls (positional only unless ``keyword``)."""
        return {i.storage for c in self.profile.calls if c.path == path for i in c.inputs if keyword or not i.keyword}

    def _copy_bytes(self, path: str, freed: frozenset[int]) -> int:
        """Bytes ``path``'s recomputation saves again while the original stays held by a save
        outside it (a block's output, saved by its last ReLU and by the next block): a second copy."""
        inputs = self._input_storages(path, keyword=True)
        copies: dict[int, int] = {}
        for key in self.profile.regions[path].keys:
            save = self.profile.saves[key]
            if key not in freed and save.movable and save.storage not in inputs:
                copies[save.storage] = save.storage_bytes
        return sum(copies.values())

    def extra_bytes(self, regions: tuple[str, ...]) -> int:
        """Bytes of region inputs that no kept profiled tensor covers: held for the whole iteration."""
        sharers = _sharers(self.profile, self.freed(regions))
        extra: dict[int, int] = {}
        for pack in self.profile.sequence(regions):
            if pack.key is None:
                for inp in self.profile.calls[pack.call].inputs:  # type: ignore[index]
                    if inp.name == pack.input and not inp.keyword and inp.movable and _covering(sharers, inp) is None:
                        extra[inp.storage] = inp.storage_bytes
        return sum(extra.values())

    def problem(self, regions: tuple[str, ...]) -> tuple[PlanningProblem, int]:
        """The problem with ``regions`` enabled, and the extra held bytes.

        The tensors a region frees are not held between forward and backward; they are held again
        from the start of the region's recomputation in backward to their own free (the whole
        recomputed region is resident while its backward runs), and may only be kept then.
        """
        if regions not in self._memo:
            freed = self.freed(regions)
            groups = [tuple(k for k in self.profile.regions[p].keys if k in freed) for p in regions]
            problem = problem_from_trace(self.trace, self.time_model, self.backend, min_bytes=0 if self.budgeted else self.min_bytes,
                                         copy_latency_below=self.min_bytes if self.budgeted else 0,
                                         sparsity_margin=SPARSITY_MARGIN, rebuilt_together=groups,
                                         rebuilt_from=[self._input_keys(p, freed) for p in regions], storage_of=self._storages,
                                         rebuilt_copies=[self._copy_bytes(p, freed) for p in regions],
                                         rebuilt_bytes=self._rebuilt_bytes(groups), host_time_model=self.host_codec,
                                         rebuilt_starts=[self._own_unpacks(p, g) for p, g in zip(regions, groups)])
            self._memo[regions] = (problem, self.extra_bytes(regions))
        return self._memo[regions]

    def least(self, regions: tuple[str, ...], host: bool = False) -> int:
        """The least device budget with ``regions`` enabled (within the host budget with ``host``: the
        region choice ranks by the device alone, which the floor certifies without a solver, and the
        host budget is held where the rest is planned)."""
        problem, extra = self.problem(regions)
        if self.base == "none":  # one option per tensor: the peak of keeping them all, no solver needed
            keeps = [next(o for o in t.options if o.action == "keep") for t in problem.tensors]
            return int(timeline_of(problem, keeps).max(initial=0)) + extra
        return minimum_bytes(problem, self.base, self.time_limit_s, host_budget_bytes=self.host_budget_bytes if host else None) + extra

    def solve(self, regions: tuple[str, ...], budget_bytes: int) -> BudgetPlan | None:
        """The rest's plan with ``regions`` enabled, within ``budget_bytes`` (``None``: none fits),
        solved once per pair (the choice of regions tries the one it then plans)."""
        memo_key = (regions, budget_bytes)
        if memo_key not in self._solved:
            self._solved[memo_key] = self._solve(regions, budget_bytes)
        return self._solved[memo_key]

    def _solve(self, regions: tuple[str, ...], budget_bytes: int) -> BudgetPlan | None:
        problem, extra = self.problem(regions)
        if budget_bytes - extra <= 0:
            return None
        try:
            return plan_budget(problem, self.base, budget_bytes - extra, self.time_limit_s, host_budget_bytes=self.host_budget_bytes,
                               explain=False, rel_gap=self.rel_gap)
        except BudgetError:
            return None

    def carry(self, regions: tuple[str, ...], budget_bytes: int, carried: BudgetPlan) -> BudgetPlan | None:
        """``carried`` (the rest's plan with ``regions`` at smaller sizes) at these sizes, where it
        holds the budgets (:func:`cswap.planner.solve.carry_plan`); ``None`` otherwise."""
        problem, extra = self.problem(regions)
        if budget_bytes - extra <= 0:
            return None
        return carry_plan(problem, self.base, budget_bytes - extra, carried, self.host_budget_bytes)

    def seconds(self, regions: tuple[str, ...], planned: BudgetPlan) -> float:
        return planned.predicted_s + _forward_s(self, regions)


def _candidates(profile: RegionProfile, by_time: bool = True) -> list[str]:
    """Regions that free memory alone: best bytes per forward second first (``by_time``), or most
    bytes first (an order no timing noise changes)."""
    grad_paths = {c.path for c in profile.calls if c.grad_enabled}
    chosen = [p for p in profile.candidates if p in grad_paths and profile.regions[p].freed_bytes > 0]

    def rank(path: str) -> tuple[float, int, str]:
        facts = profile.regions[path]
        per_second = facts.freed_bytes / facts.forward_s if facts.forward_s > 0 else float("inf")
        return (-per_second if by_time else 0.0, -facts.freed_bytes, path)

    return sorted(chosen, key=rank)


def _addable(planning: _Planning, regions: tuple[str, ...], path: str) -> tuple[str, ...] | None:
    """``regions`` with ``path`` added, or ``None`` when it nests with one or frees nothing more."""
    if nested_pair((*regions, path)) is not None:
        return None
    grown = tuple(sorted((*regions, path)))
    profile = planning.profile
    if regions and profile.freed_bytes(grown) <= profile.freed_bytes(regions):
        return None
    return grown


def _grow(planning: _Planning, order: list[str], target: int, by_time: bool) -> tuple[tuple[str, ...], list[str]]:
    """Regions added one at a time while the rest cannot meet ``target``: at each step, among the
    first :data:`GROW_WIDTH` addable candidates of ``order``, the one that lowers the least budget
    most per second of forward it runs again (``by_time``) or most (bytes alone). A region that
    lowers nothing is never added (one rebuilt whole at the peak of backward). Returns the regions
    and the candidates left, in ``order``."""
    regions: tuple[str, ...] = ()
    least = planning.least(regions)
    left = list(order)
    while least > target:
        best: tuple[float, str, tuple[str, ...], int] | None = None
        tried = 0
        for path in left:
            grown = _addable(planning, regions, path)
            if grown is None:
                continue
            tried += 1
            gain = least - planning.least(grown)
            if gain > 0:
                seconds = planning.profile.regions[path].forward_s
                if not by_time:
                    rate = float(gain)
                else:
                    rate = gain / seconds if seconds > 0 else float("inf")
                if best is None or rate > best[0]:
                    best = (rate, path, grown, least - gain)
            if tried >= GROW_WIDTH:
                break
        if best is None:
            break
        _, path, regions, least = best
        left = [p for p in left if p != path and nested_pair((*regions, p)) is None]
    return regions, left


def _least_footprint(planning: _Planning) -> tuple[str, ...]:
    """The regions of the policy's least footprint, chosen by bytes alone (no timing noise moves it),
    so that a run at the budget it gives chooses the same. A policy that swaps reaches about its
    least without any region (swapping empties the device but for the tensors in use), so only
    ``recompute`` searches; ``capuchin`` and ``cswap`` choose regions for time (:func:`_choose`)."""
    if planning.base != "none":
        return ()
    return _grow(planning, _candidates(planning.profile, by_time=False), 0, by_time=False)[0]


def _forward_s(planning: _Planning, regions: tuple[str, ...]) -> float:
    """The forward seconds ``regions`` run again: the least time a plan with them can predict."""
    return sum(planning.profile.regions[p].forward_s for p in regions)


def _choose(planning: _Planning, budget_bytes: int, time_trials: int) -> tuple[str, ...]:
    """The regions to enable within ``budget_bytes`` (module docstring, part 1)."""
    regions, rest = _grow(planning, _candidates(planning.profile), budget_bytes, by_time=True)
    if planning.least(regions) > budget_bytes:
        return _least_footprint(planning)  # another nesting choice fits where this one did not
    best = planning.solve(regions, budget_bytes)
    if best is None:
        return regions
    best_s = planning.seconds(regions, best)
    for path in rest:
        if time_trials <= 0:
            break
        grown = _addable(planning, regions, path)
        if grown is None:
            continue
        time_trials -= 1
        if _forward_s(planning, grown) >= best_s:
            continue  # the rest's predicted seconds are never below 0: this trial cannot win, so it is not solved
        trial = planning.solve(grown, budget_bytes)
        if trial is not None and planning.seconds(grown, trial) < best_s:
            regions, best_s = grown, planning.seconds(grown, trial)
    return regions


def layer_regions(profile: RegionProfile) -> tuple[tuple[str, ...], str]:
    """``ac-full``'s regions: the model's repeated layers (:attr:`RegionProfile.layers`) that ran with
    grad, saved something and can be recomputed; and what the plan says of them, in words.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from cswap.profile.regions import profile_regions
        >>> block = lambda: nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        >>> model = nn.Sequential(nn.Linear(4, 8), block(), block(), nn.Linear(8, 1))
        >>> x = torch.randn(2, 4)
        >>> layer_regions(profile_regions(model, lambda: model(x).sum().backward()))
        (('1', '2'), 'every layer recomputed: 2 layers, 1 to 2')
        >>> flat = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        >>> layer_regions(profile_regions(flat, lambda: flat(x).sum().backward()))[1].startswith("the model has no repeated layers")
        True
    """
    ran = {c.path for c in profile.calls if c.grad_enabled}
    layers = [p for p in profile.layers if p in ran and profile.regions[p].keys]
    refused = {p: profile.regions[p].ineligible for p in layers if profile.regions[p].ineligible is not None}
    chosen = tuple(p for p in layers if p not in refused)
    return chosen, _layers_note(layers, chosen, refused)  # type: ignore[arg-type]


def _layers_note(layers: Sequence[str], chosen: Sequence[str], refused: Mapping[str, str]) -> str:
    """What ``ac-full``'s plan says of the repeated ``layers`` that ran with grad and saved tensors:
    ``chosen`` recomputed, ``refused`` not (path -> why)."""
    if not layers:
        return ("the model has no repeated layers (no block class repeats in an nn.ModuleList or nn.Sequential) that "
                "ran with grad and saved tensors: nothing recomputed, every tensor kept")
    note = (f"every layer recomputed: {len(chosen)} layers, {chosen[0]} to {chosen[-1]}" if chosen
            else "no layer recomputed, every tensor kept")
    if refused:
        first, why = next(iter(refused.items()))
        note += f"; {len(refused)} of {len(layers)} cannot be recomputed ({first}: {why})"
    return note


def not_recomputed(profile: RegionProfile) -> tuple[str, dict[int, str]]:
    """What keeps modules that save tensors out of recomputation, whatever the policy chooses: the
    modules of a ``torch.compile`` graph (they run in the compiled code, not through their hooks)
    and the model's repeated layers that cannot be recomputed (a Hugging Face layer handed its
    key/value cache). Returns it in words (``""``: nothing), as the plan's
    ``planner["not_recomputed"]``, the runtime's warning and ``stats().recompute_note`` say it, and
    per profiled key saved inside such a module, why it is not recomputed.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from cswap.profile.regions import profile_regions
        >>> block = lambda: nn.Sequential(nn.ReLU(inplace=True), nn.Linear(8, 8))  # modifies its input
        >>> model = nn.Sequential(nn.Linear(4, 8), block(), block(), nn.Linear(8, 1))
        >>> note, keys = not_recomputed(profile_regions(model, lambda: model(torch.randn(2, 4)).sum().backward()))
        >>> note.startswith("2 of the model's 2 repeated layers cannot be recomputed: '1', '2' (its forward modifies an input")
        True
        >>> keys[2]
        "not recomputed: saved inside layer '1', which cannot be recomputed (planner['not_recomputed'])"
    """
    notes: list[str] = []
    keys: dict[int, str] = {}
    paths_of_calls = [c.path for c in profile.calls]
    for compiled in profile.compiled:
        graph = "" if compiled == "_orig_mod" else compiled.removesuffix("._orig_mod")
        name = repr(graph) if graph else "the model"
        inside = [s.key for s in profile.saves
                  if any(paths_of_calls[i] == graph or paths_of_calls[i].startswith(f"{graph}.") for i in s.calls)]
        why = f"not recomputed: saved inside the torch.compile graph of {name}, whose modules run in the compiled code"
        keys.update(dict.fromkeys(inside, why))
        notes.append(_compiled_note(compiled, len(inside)))
    ran = {c.path for c in profile.calls if c.grad_enabled}
    layers = [p for p in profile.layers if p in ran and profile.regions[p].keys]
    refused = {p: profile.regions[p].ineligible for p in layers if profile.regions[p].ineligible is not None}
    if refused:
        notes.append(_refused_note(layers, refused))  # type: ignore[arg-type]
        for path in refused:
            keys.update({key: _in_refused_layer(path) for key in profile.regions[path].keys if key not in keys})
    return "; ".join(notes), keys


def _compiled_note(compiled: str, saved: int | None = None) -> str:
    """The modules of the ``torch.compile`` graph at ``compiled`` (:func:`cswap.profile.rerun.compiled_paths`) in words."""
    graph = "" if compiled == "_orig_mod" else compiled.removesuffix("._orig_mod")
    name = repr(graph) if graph else "the model"
    count = f"{saved} saved tensors; " if saved is not None else ""
    return (f"the modules inside the torch.compile graph of {name} run in the compiled code, not through their hooks, so "
            f"none of them is recomputed ({count}only the compiled call as a whole can be)")


def _refused_note(layers: Sequence[str], refused: Mapping[str, str]) -> str:
    """The repeated ``layers`` that cannot be recomputed (``refused``: path -> why), grouped by why."""
    grouped: dict[str, list[str]] = {}
    for path in layers:
        if path in refused:
            grouped.setdefault(refused[path], []).append(path)
    words = "; ".join(f"{_listed(paths)} ({why})" for why, paths in grouped.items())
    return f"{sum(len(paths) for paths in grouped.values())} of the model's {len(layers)} repeated layers cannot be recomputed: {words}"


def _in_refused_layer(path: str) -> str:
    return f"not recomputed: saved inside layer {path!r}, which cannot be recomputed (planner['not_recomputed'])"


def fixed_layers_plan(
    trace: Trace,
    policy: str,
    epoch: int,
    layers: Sequence[str],
    recomputed: Sequence[str],
    refused: Mapping[str, str],
    rebuilt: Mapping[str, Sequence[tuple[tuple[int, ...], str, int]]],
    peak_bytes: int,
    compiled: Sequence[str] = (),
    min_bytes: int = 0,
    launches: LaunchCache | None = None,
) -> tuple[Plan, dict[str, tuple[int, ...]]]:
    """``ac-full``'s plan from a profile that ran with its layers already recomputed (without a
    budget its plan is fixed by the model's structure, so its first iteration runs it): every
    tensor ``trace`` holds (packed with the regions enabled, so keyed as the plan's iterations pack)
    kept, the layers that were recomputed as its regions, and per region the tensors its
    recomputation rebuilt (``rebuilt``: shape, dtype and new bytes each) as ``plan.recomputed``,
    keyed after the trace's keys. Returns the plan and per region those keys.

    Args:
        trace: the profile, with the regions enabled.
        policy: the policy (``ac-full``).
        epoch: the epoch the plan is for.
        layers: the model's repeated layers that ran with grad (module order).
        recomputed: those recomputed in the profile's backward.
        refused: the layers that cannot be recomputed, and why.
        rebuilt: per recomputed layer, what its recomputation saved.
        peak_bytes: the profile's measured peak: this plan's peak (``planner["peak_bytes"]``).
        compiled: the paths of ``torch.compile`` graphs in the model (their modules are never layers).
        min_bytes, launches: the plan's rules for tensors it does not know.

    Example:
        >>> from cswap.profile.trace import TensorRecord, Trace
        >>> trace = Trace(tensors=(TensorRecord(key=0, shape=(4,), dtype="float32", nbytes=16, sparsity=0.0),),
        ...               d2h_gbps=1.0, h2d_gbps=1.0)
        >>> plan, keys = fixed_layers_plan(trace, "ac-full", 0, ("0", "1"), ("0", "1"), {},
        ...                                {"0": [((4,), "float32", 16)], "1": [((4,), "float32", 16)]}, 48)
        >>> plan.recompute_regions, keys, plan.planner["layers"], plan.counts()["recompute"]
        (('0', '1'), {'0': (1,), '1': (2,)}, 'every layer recomputed: 2 layers, 0 to 1', 2)
    """
    layer_refusals = {p: refused[p] for p in layers if p in refused}
    chosen = tuple(p for p in layers if p in recomputed and p not in refused)
    note = _layers_note(layers, chosen, layer_refusals)
    notes = [_compiled_note(c) for c in compiled]
    if layer_refusals:
        notes.append(_refused_note(layers, layer_refusals))
    left_out = "; ".join(notes)
    kept_reasons: Mapping[str, str] = trace.meta.get("not_offloadable", {})
    duplicates: Mapping[str, int] = trace.meta.get("duplicates", {})
    decisions: dict[int, Decision] = {}
    for record in trace.tensors:
        first = duplicates.get(str(record.key))
        if not chosen:
            reason = f"policy {policy}: {note}"
        elif first is not None:
            reason = f"duplicate of key {first}: stored once"
        elif not record.offloadable:
            reason = kept_reasons.get(str(record.key), "not offloadable")
        else:
            inside = next((p for p in layer_refusals if record.module == p or record.module.startswith((f"{p}.", f"{p} "))), None)
            reason = f"policy {policy}: kept (outside the recomputed layers)" + (f"; {_in_refused_layer(inside)}" if inside else "")
        decisions[record.key] = Decision(key=record.key, shape=tuple(record.shape), dtype=record.dtype, nbytes=record.nbytes,
                                         sparsity=record.sparsity, action=Action.KEEP, reason=reason, module=record.module,
                                         encoded_dtype=record.narrow_dtype)
    region_keys: dict[str, tuple[int, ...]] = {}
    dropped: dict[int, Decision] = {}
    key = max(decisions, default=-1) + 1
    for path in chosen:
        mine = []
        for shape, dtype, nbytes in rebuilt.get(path, ()):
            dropped[key] = Decision(key=key, shape=tuple(shape), dtype=dtype, nbytes=nbytes, sparsity=0.0, action=Action.RECOMPUTE,
                                    module=path, reason=f"recomputed by region {path!r} (as its recomputation rebuilt it when profiled)")
            mine.append(key)
            key += 1
        region_keys[path] = tuple(mine)
    unpacked = sorted((r for r in trace.tensors if r.unpack_at_s is not None), key=lambda r: (r.unpack_at_s, r.key))
    planner: dict[str, Any] = {"status": "fixed", "peak_bytes": peak_bytes, "minimum_bytes": peak_bytes, "layers": note,
                               "profiled": "with the layers recomputed: the plan's peak is the profile's measured one"}
    if left_out:
        planner["not_recomputed"] = left_out
    plan = Plan(policy=policy, epoch=epoch, default_action=Action.KEEP, decisions=decisions, min_bytes=min_bytes,
                unpack_order=tuple(r.key for r in unpacked), default_reason=POLICY_TABLE[policy].reason, launches=launches,
                d2h_gbps=trace.d2h_gbps, h2d_gbps=trace.h2d_gbps, planner=MappingProxyType(planner), recompute_regions=chosen,
                recomputed=dropped)
    return plan, region_keys


def _listed(paths: list[str]) -> str:
    """Module paths in words, the first and last of a long run."""
    if len(paths) <= 4:
        return ", ".join(repr(p) for p in paths)
    return f"{paths[0]!r}, {paths[1]!r}, ... {paths[-1]!r} ({len(paths)} layers)"


def _compact_bytes(shape: tuple[int, ...], dtype: str) -> int:
    itemsize = getattr(torch, dtype).itemsize
    return math.prod(shape) * itemsize


def _sharers(profile: RegionProfile, freed: frozenset[int]) -> dict[int, tuple[int, int]]:
    """Per storage, the first profiled key still saved that shares it, and that save's bytes."""
    sharers: dict[int, tuple[int, int]] = {}
    for s in profile.saves:
        if s.key not in freed:
            sharers.setdefault(s.storage, (s.key, _compact_bytes(s.shape, s.dtype)))
    return sharers


def _covering(sharers: dict[int, tuple[int, int]], inp: InputRecord) -> int | None:
    """The profiled key whose plan a region input follows: one sharing its storage that is at least
    as large (a smaller view, such as a pooler's first token, leaves the rest unplanned)."""
    found = sharers.get(inp.storage)
    if found is None or found[1] < _compact_bytes(inp.shape, inp.dtype):
        return None
    return found[0]


def _rekeyed(plan: Plan, profile: RegionProfile, regions: tuple[str, ...], freed: frozenset[int]) -> tuple[Plan, dict[str, tuple[int, ...]]]:
    """``plan`` (keyed by profiled keys) keyed by the pack ordinals with ``regions`` enabled."""
    sharers = _sharers(profile, freed)
    decisions: dict[int, Decision] = {}
    expected: dict[int, int] = {}
    ordinal_of: dict[int, int] = {}
    # The region inputs no kept tensor covers, by storage: the plan's budget left room for them
    # beside its own tensors (_Planning.extra_bytes), and from their packs on they are resident.
    uncovered: dict[int, int] = {}
    uncovered_bytes = 0
    for ordinal, pack in enumerate(profile.sequence(regions)):
        source = pack.key
        if source is not None:
            decision = replace(plan.decisions[source], key=ordinal)
        else:
            inp = next(i for i in profile.calls[pack.call].inputs if i.name == pack.input and not i.keyword)  # type: ignore[index]
            shape_facts = dict(key=ordinal, shape=inp.shape, dtype=inp.dtype, nbytes=_compact_bytes(inp.shape, inp.dtype), module=f"{pack.region or 'model'} (input)")
            source = _covering(sharers, inp)
            if source is None and inp.movable and inp.storage not in uncovered:
                uncovered[inp.storage] = inp.storage_bytes
                uncovered_bytes += inp.storage_bytes
            if source is not None and source in plan.decisions:
                decision = replace(plan.decisions[source], **shape_facts,
                                   reason=f"input {pack.input} of recompute region {pack.region!r}, as key {source}: {plan.decisions[source].reason}")
            else:
                decision = Decision(**shape_facts, sparsity=0.0, action=Action.KEEP,
                                    reason=f"input {pack.input} of recompute region {pack.region!r}: held for its recomputation")
        decisions[ordinal] = decision
        if source is not None:
            ordinal_of.setdefault(source, ordinal)
            # a region input's pack comes later than its source's: the bytes expected there are not its own
            if pack.key is not None and source in plan.expected_bytes:
                expected[ordinal] = plan.expected_bytes[source] + uncovered_bytes
    region_keys: dict[str, tuple[int, ...]] = {}
    recomputed: dict[int, Decision] = {}
    for path in regions:
        facts = profile.regions[path]
        mine = tuple(k for k in facts.keys if k in freed)
        region_keys[path] = mine
        for key in mine:
            base = plan.decisions[key]
            recomputed[key] = replace(base, action=Action.RECOMPUTE, predicted_s=None, slack_bytes=None, compress_launch=None,
                                      decompress_launch=None, compressed_nbytes=None,
                                      reason=f"recomputed by region {path!r} ({facts.forward_s * 1e3:.3f} ms of forward again)")
    unpack_order = tuple(dict.fromkeys(ordinal_of[k] for k in plan.unpack_order if k in ordinal_of))
    rekeyed = replace(plan, decisions=decisions, expected_bytes=expected, unpack_order=unpack_order,
                      recompute_regions=regions, recomputed=recomputed)
    return rekeyed, region_keys


def _floor_words(planning: _Planning, regions: tuple[str, ...], least: int, profiled_peak_bytes: int) -> str:
    """What sets the least budget ``least`` of ``regions`` enabled, for a BudgetError: the floor of
    the rest (:func:`cswap.planner.budgeted.floor_note`), beside the regions' inputs, or the
    profiling iteration's peak where that is higher."""
    problem, extra = planning.problem(regions)
    words = floor_note(planning.trace, problem, planning.base, least - extra, extra)
    if profiled_peak_bytes > least:
        words += (f" The plans need {human_bytes(least)}, but a run at the budget profiles first, with no region and storing "
                  f"every tensor as {PASSIVE_ACTION.value}, and that iteration reaches {human_bytes(profiled_peak_bytes)}.")
    return words.strip()


def _still_fit(planning: _Planning, regions: tuple[str, ...], budget_bytes: int) -> bool:
    """Whether ``regions`` can all be recomputed in this profile and the budget met with them."""
    candidates = set(planning.profile.candidates)
    return all(path in candidates for path in regions) and planning.least(regions, host=True) <= budget_bytes


def plan_regions(
    trace: Trace,
    profile: RegionProfile,
    policy: str,
    budget: MemoryBudget | None,
    time_model: TimeModel,
    backend: str,
    min_bytes: int,
    epoch: int,
    launches: LaunchCache | None = None,
    profiled_peak_bytes: int | None = 0,
    time_trials: int = TIME_TRIALS,
    host_budget_bytes: int | None = None,
    profiled_host_peak_bytes: int = 0,
    host_time_model: TimeModel | None = None,
    time_limit_s: float = 30.0,
    regions_hint: tuple[str, ...] | None = None,
    rel_gap: float = EXACT_REL_GAP,
    carried: BudgetPlan | None = None,
) -> RegionPlan:
    """The plan of recomputing ``policy`` from a profiling iteration (module docstring).

    Args:
        trace: the profile of saved tensors (keys are the outer pack ordinals, as in ``profile``).
        profile: the same iteration's recompute regions (:class:`~cswap.profile.regions.RegionTracer`).
        policy: ``recompute``, ``capuchin``, ``cswap`` or ``ac-full``.
        budget: the memory budget (a fraction resolves against policy ``none``'s peak), or ``None``.
        time_model: predicts codec seconds.
        backend: the codec backend.
        min_bytes: without a budget, tensors below this are only kept; under one it binds nothing
            (the rest may move them, each copy priced with its latency).
        epoch: the epoch the plan is for.
        launches: the codec launch configs.
        profiled_peak_bytes: the resident peak of the profiling iteration (the least budget is at
            least this); ``None``: the profile ran before a fraction of ``none``'s peak was
            resolved, and its peak is replayed
            (:func:`cswap.planner.budgeted.profiled_device_peak`).
        time_trials: candidate regions tried for time once the budget is met (``capuchin``, ``cswap``).
        host_budget_bytes: the host memory budget (``None``: none): the rest's host copies stay
            within it; a recomputed region holds nothing on the host.
        profiled_host_peak_bytes: the host bytes the profiling iteration held (0: it ran before the budget was known).
        host_time_model: the host codec's time model: under a host budget ``cswap``'s rest is
            offered ``host-zvc-swap`` (:func:`cswap.planner.budgeted.host_codec_model`).
        time_limit_s: the solver's time limit per solve (:data:`cswap.planner.solve.PROVING_TIME_LIMIT_S`
            for a plan needed inside training).
        regions_hint: regions chosen before for this model (a plan at a smaller size of the same
            graph): kept where they all ran and the budget can be met with them, so that only the
            rest is planned again; else chosen anew.
        rel_gap: the solver's relative gap per solve (:data:`cswap.planner.solve.PROVING_REL_GAP`
            for a plan needed inside training).
        carried: the rest's solution in the plan of ``regions_hint`` (:attr:`Plan.solution`): where
            those regions are kept, carried to these sizes without a solve where it holds the
            budgets (:func:`cswap.planner.solve.carry_plan`), else the rest is planned anew.

    Raises:
        ValueError: ``policy`` does not recompute.
    """
    if policy not in BASE_POLICIES:
        raise ValueError(f"policy {policy!r} does not recompute: choose one of {', '.join(BASE_POLICIES)}")
    launches = launches if launches is not None else LaunchCache(backend, None)
    # under a budget min_bytes binds nothing (cswap.planner.budgeted): the rest may move small tensors too
    planning = _Planning(trace, profile, BASE_POLICIES[policy], time_model, backend, min_bytes, host_budget_bytes, host_time_model,
                         budgeted=budget is not None, time_limit_s=time_limit_s, rel_gap=rel_gap)
    full, _ = planning.problem(())
    budget_bytes: int | None = None
    none_bytes = minimum_bytes(full, "none") if budget is not None else None
    if budget is not None:
        budget_bytes = budget.resolve(max(none_bytes, 1)) if budget.relative else budget.resolve()
    if budget_bytes is not None:  # the profile runs without regions
        profiled_peak_bytes = profiled_device_peak(full, policy, budget_bytes, host_budget_bytes, profiled_peak_bytes)
    profiled_peak_bytes = profiled_peak_bytes or 0
    fixed = POLICY_TABLE[policy].checkpoints_layers
    left_out, left_out_keys = not_recomputed(profile)
    smallest, layers_note = layer_regions(profile) if fixed else (_least_footprint(planning), "")
    smallest_bytes = max(planning.least(smallest, host=True), 1)
    least = max(smallest_bytes, profiled_peak_bytes)  # a run at a budget profiles first, within it
    if budget_bytes is None:
        regions, target, least = smallest, smallest_bytes, smallest_bytes
    elif budget_bytes < least:
        regions, target = smallest, budget_bytes
    elif fixed:
        regions, target = smallest, budget_bytes
    elif regions_hint is not None and _still_fit(planning, regions_hint, budget_bytes):
        regions, target = regions_hint, budget_bytes
    else:
        regions, target = _choose(planning, budget_bytes, time_trials if policy != "recompute" else 0), budget_bytes
    planned = planning.carry(regions, target, carried) if carried is not None and regions == regions_hint else None
    if planned is None:
        planned = planning.solve(regions, target)
    if planned is None and target >= least and regions != smallest:
        regions = smallest  # its least is the policy's least, which the budget meets
        planned = planning.solve(regions, target)
    problem, extra = planning.problem(regions)
    rules: dict[str, Any] = dict(policy=policy, epoch=epoch, min_bytes=min_bytes, launches=launches, budget_bytes=target,
                                 fallback_action=FALLBACK_ACTIONS[policy], d2h_gbps=trace.d2h_gbps, h2d_gbps=trace.h2d_gbps)
    profile_passed = host_budget_bytes is not None and profiled_host_peak_bytes > host_budget_bytes
    if target < least or planned is None or profile_passed:
        # (a profile that passed the host budget: the plan fits, but a run at these budgets does not hold both)
        reason = f"budget {target:,d} B below this policy's least {least:,d} B: {PASSIVE_ACTION.value} (passive)"
        if layers_note:
            reason += f" ({layers_note})"
        plan = Plan(**rules, default_action=PASSIVE_ACTION, prefetch_bytes=0, default_reason=reason,
                    planner=MappingProxyType({"not_recomputed": left_out} if left_out else {}))
        none_peak = minimum_bytes(full, "none") or None
        if host_budget_bytes is None or budget_bytes is None:
            # cswap has every action: the floor says what binds, and no other policy lowers it
            why = _floor_words(planning, smallest, smallest_bytes, profiled_peak_bytes)
            if left_out:
                why += f" Not recomputed whatever the budget: {left_out}."
            error = BudgetError(least, policy, target, why, none_peak_bytes=none_peak, advice="" if policy == "cswap" else None)
        else:
            least = max(least, target + 1) if target >= least else least  # no plan at the edge, or its profile passed
            alone = max(planning.least(smallest), profiled_peak_bytes)
            rest, extra_bytes = planning.problem(smallest)  # region inputs held throughout: device bytes beside the rest's
            error = host_budget_error(rest, BASE_POLICIES[policy], target - extra_bytes, host_budget_bytes, alone - extra_bytes,
                                      least - extra_bytes, profiled_host_peak_bytes, none_peak)
            error = BudgetError(error.minimum_bytes + extra_bytes, policy, target, none_peak_bytes=none_peak,
                                host_budget_bytes=host_budget_bytes, host_minimum_bytes=error.host_minimum_bytes, binding=error.binding)
            # the profile runs without regions, swapping (compressing on the host where the policy may)
            error = with_profile_leasts(error, full, profile_action(policy, host_budget_bytes))
        return RegionPlan(plan, target, error)
    plan = plan_from_budget(trace, problem, planned, rules, PASSIVE_ACTION if rules["fallback_action"] else Action.KEEP, least,
                            none_bytes)
    if left_out:  # each tensor no region can rebuild says why (those recomputed say it when rekeyed)
        plan = replace(plan, planner=MappingProxyType({**plan.planner, "not_recomputed": left_out}),
                       decisions={k: replace(d, reason=f"{d.reason}; {left_out_keys[k]}") if k in left_out_keys else d
                                  for k, d in plan.decisions.items()})
    if extra:
        plan = replace(plan, planner=MappingProxyType({**plan.planner, "region_input_bytes": extra}))
    if layers_note:
        plan = replace(plan, planner=MappingProxyType({**plan.planner, "layers": layers_note}))
        if not regions:  # nothing to rebuild: each kept tensor's row says why ac-full keeps it
            plan = replace(plan, decisions={k: replace(d, reason=f"policy {policy}: {layers_note}") for k, d in plan.decisions.items()})
    if not regions:
        return RegionPlan(plan, target)
    plan, region_keys = _rekeyed(plan, profile, regions, planning.freed(regions))
    return RegionPlan(plan, target, None, MappingProxyType(region_keys))

