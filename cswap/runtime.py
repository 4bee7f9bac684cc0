# Longer than the ~500-line guide on purpose: the public class owns one iteration's lifecycle
# (profile, plan, follow the plan, count), and its steps swap one plan and one set of counters under
# one lock; the stages themselves live in cswap.profile, cswap.planner and cswap.execute.
"""``cswap.Runtime``: the public entry point that ties the profiler, the advisor and the executor together.

Example:
    >>> import torch, cswap
    >>> model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> rt = cswap.Runtime(policy="compress-swap", min_bytes=0, model=model, d2h_gbps=10.0, h2d_gbps=10.0)
    >>> for epoch in range(2):
    ...     rt.new_epoch()
    ...     for _ in range(2):
    ...         with rt.iteration():
    ...             model(torch.randn(8, 64)).square().mean().backward()
    ...         opt.step(); opt.zero_grad()
    >>> stats = rt.stats()
    >>> stats.iterations, stats.profiled_iterations, stats.actions["zvc-swap"] > 0
    (4, 2, True)
    >>> rt.trace().epoch, rt.plan().policy
    (1, 'compress-swap')
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import math
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, NamedTuple

import torch
from torch.utils.checkpoint import CheckpointError

from cswap.budget import BudgetError, MemoryBudget, ResolvedBudget, format_bytes, warn_if_over_device
from cswap.codecs.api import default_backend
from cswap.device import bandwidth, fingerprint, resolve_device
from cswap.execute.executor import Counters, Executor, IterationState, RegionRebuild, merged_seen
from cswap.execute.passive import SwapOnOutOfMemory
from cswap.execute.recompute import RecomputeRegions
from cswap.options import RECOMPUTING_POLICIES, LaunchLookup, RuntimeOptions, cache_configs, file_defaults, load_options
from cswap.paths import shipped_configs_dir
from cswap.planner.actions import HOST_ZVC_SWAP, POLICY_ACTIONS, ZVC_KEEP, ZVC_SWAP
from cswap.planner.advisor import Advisor
from cswap.planner.budgeted import FALLBACK_ACTIONS, KEEP_FIRST_POLICIES, NO_CODEC, PROFILE_ACTIONS, budget_plan, profile_action
from cswap.planner.plan import DEFAULT_ACTIONS, POLICY_REASONS, Action, LaunchCache, Plan
from cswap.planner.regions import fixed_layers_plan, plan_regions
from cswap.planner.milp import EXACT_REL_GAP, BudgetPlan
from cswap.planner.from_trace import problem_from_trace
from cswap.planner.solve import PROVING_REL_GAP, PROVING_TIME_LIMIT_S, minimum_bytes
from cswap.profile.profiler import Profiler
from cswap.profile.layers import LayersProfile
from cswap.profile.regions import RegionProfile, RegionTracer
from cswap.profile.shapes import SizeMap, Structure, grown_shapes, merged, scaled_trace, structure_of
from cswap.profile.trace import Trace
from cswap.stats import EpochStats, RuntimeStats

__all__ = ["EpochStats", "Runtime", "RuntimeStats"]


logger = logging.getLogger(__name__)

class _Solving(NamedTuple):
    """How long the solver may take per solve, and the relative gap at which it stops."""

    time_limit_s: float
    rel_gap: float


#: A plan made from a profile: the planners' defaults (proven optimal, 30 s per solve).
_PROFILED_SOLVING = _Solving(30.0, EXACT_REL_GAP)
#: A plan made without a profile, which training waits for (:data:`cswap.planner.solve.PROVING_TIME_LIMIT_S`
#: and :data:`~cswap.planner.solve.PROVING_REL_GAP`).
_PROVING_SOLVING = _Solving(PROVING_TIME_LIMIT_S, PROVING_REL_GAP)

#: A plan at a larger size of a planned structure carries the plan before it, without a solve, where
#: that still holds the budgets (:func:`cswap.planner.solve.carry_plan`) and the saved bytes are at
#: most this many times those of the last plan the solver made: carried choices stay close to a
#: solved optimum (on GPT-2 under dynamic padding, each carried plan predicted within 0.8% of the
#: solver's at its sizes; BENCHMARKS.md, "Dynamic shapes"), and a larger growth is solved anew.
_CARRY_GROWTH = 1.25

#: Iterations looked back over, and how many of them profiling because the graph changed, before
#: the runtime warns that it keeps profiling.
_PROFILE_WINDOW, _PROFILES_WARNED = 10, 3


@dataclass
class _Family:
    """One structure the model showed (:mod:`cswap.profile.shapes`): its profile, the sizes its plan
    is made for (the largest seen per tensor), and that plan, which serves every smaller size.

    Attributes:
        structure: the profile's structure (per profiled key, dtype and rank).
        trace: the profile, at its own sizes.
        regions: the profile's recompute regions, when the runtime recomputes.
        shapes: per profiled key, the shape the plan is made for.
        plan: the plan.
        plan_structure: per pack ordinal of ``plan`` (recompute regions enabled), dtype and rank.
        region_keys: per recompute region, the profiled keys it rebuilds.
        layers: for ac-full profiled with its layers recomputed, what they did (``regions`` is then
            ``None``: the trace's keys are the plan's own).
        met_budget: a plan of this structure met the memory budget (a policy that holds it past
            drift or growth then swaps at pack what would pass it: :data:`_HOLD_FALLBACK`).
        sparsity_drift: per profiled key, how far its sparsity fell since the profile of this
            structure before, for a policy in :data:`_DRIFT_POLICIES`: its plan takes each tensor's
            sparsity as falling that much again by the next profile (the margin the run has seen).
        solved_bytes: the saved bytes (at ``shapes``) of the last plan of this structure the solver
            made rather than carried (:data:`_CARRY_GROWTH`).
    """

    structure: Structure
    trace: Trace
    regions: RegionProfile | None
    shapes: tuple[tuple[int, ...], ...]
    plan: Plan | None = None
    plan_structure: Structure = ()
    region_keys: dict[str, tuple[int, ...]] = field(default_factory=dict)
    layers: LayersProfile | None = None
    met_budget: bool = False
    sparsity_drift: dict[int, float] = field(default_factory=dict)
    solved_bytes: int = 0


#: What a keep or zvc-keep that would pass the memory budget becomes, once a plan met it, for a
#: policy that has nothing of its own to fall back to at pack (:data:`_HELD_POLICIES`). Two things
#: pass a budget its plan met: a longer sequence than any planned for, whose tensors grow before the
#: iteration ends and its plan can be made again for them (recompute can no longer choose regions
#: for a forward already under way: without this, Gemma 2 at 96 tokens under a plan for 40 passes a
#: budget in bytes by 19%), and, for compress-keep, activations denser than at the profile (a ReLU
#: CNN under SGD needed 1.4% more than its stated least, margin included, by the fourth epoch).
#: Moving such a tensor to the host uncompressed is the one way left to hold the budget; the rest
#: stays on the device.
_HOLD_FALLBACK = Action.SWAP

#: The policies with a budget but no fallback of their own (compress-keep, recompute): they fall
#: back to :data:`_HOLD_FALLBACK` once a plan met their budget.
_HELD_POLICIES: tuple[str, ...] = tuple(name for name, actions in POLICY_ACTIONS.items()
                                        if len(actions) > 1 and FALLBACK_ACTIONS[name] is None)

#: The policies among :data:`_HELD_POLICIES` whose profile compresses every tensor (compress-keep):
#: their compressed sizes follow the data, which their plans allow for (``sparsity_drift``).
_DRIFT_POLICIES: tuple[str, ...] = tuple(name for name in _HELD_POLICIES if PROFILE_ACTIONS[name].compresses)

#: The shipped defaults file's options: the defaults :class:`Runtime`'s signature shows.
_DEFAULTS = file_defaults(shipped_configs_dir() / "default.yaml")

_EPOCH_FIELDS = ("packed_tensors", "offloaded_bytes", "transferred_bytes", "compressed_input_bytes", "compressed_bytes")

#: The stats that are the executor's counters as they stand.
_COUNTED_FIELDS = (
    "packed_tensors", "deduplicated_tensors", "never_moved_tensors", "unknown_keys", "kept_bytes", "offloaded_bytes",
    "transferred_bytes", "compressed_input_bytes", "compressed_bytes", "resident_bytes", "peak_resident_bytes", "pack_s",
    "unpack_s", "unpacks", "prefetches", "prefetch_hits", "budget_fallbacks", "budget_waits", "iteration_peak_resident_bytes",
    "evicted_tensors", "budget_evictions", "outgrown_tensors", "recomputed_bytes",
)


class Runtime:
    """Compressed swapping of saved activations for PyTorch training.

    Wrap each forward + backward in :meth:`iteration`; call :meth:`new_epoch` at the start of each
    epoch so the next iteration re-profiles and the plan follows the activations' new sparsity.

    Args:
        policy: ``none``, ``swap``, ``cpu-compress-swap`` (swap, then compress the host copies on
            worker threads), ``compress-swap``, ``cswap``, ``compress-keep``, ``recompute``,
            ``capuchin`` or ``ac-full`` (the last three recompute modules in backward and need
            ``model``; ``ac-full`` recomputes every repeated layer; ``cswap`` recomputes too under a
            ``memory_budget`` when given ``model``: :mod:`cswap.planner.regions`).
        device, backend, min_bytes, prefetch_bytes, decider, paper_size, passive_profile,
            arena_slack, d2h_gbps, h2d_gbps, model, time_model, launch_lookup, logistic_model,
            disable_kv_cache: the options, documented on :class:`cswap.options.RuntimeOptions`
            (``disable_kv_cache=True``: a Hugging Face model's ``config.use_cache`` is off inside
            each iteration, so that its decoder layers can be recomputed). The defaults shown are
            ``configs/default.yaml``'s (``$CSWAP_RUNTIME_CONFIG`` names another file, read at
            each call for the options left at their default).
        memory_budget: the most bytes of saved activations on the device: ``None`` (no budget),
            int bytes, a string with a unit (``"512MiB"``, ``"2GiB"``) or a float in (0, 1], that
            fraction of policy ``none``'s activation peak from the profile. The policy's actions
            are then planned per tensor within it (:mod:`cswap.planner.budgeted`). The first profile
            logs what it resolved to (:attr:`resolved_budget`: bytes, and the fraction of ``none``'s
            peak; ``GB`` is 10^9 bytes, ``GiB`` 2^30), and a budget above the device's memory (the
            GPU's total memory; on CPU the host's physical memory, where the activations live)
            warns with a ``UserWarning``: it could never bind.
        host_memory_budget: the most bytes of saved activations' host copies (raw for ``swap``,
            compressed for ``zvc-swap``) held on the host at once: ``None`` (no host budget), int
            bytes, a string with a unit (``"8GiB"``), or ``"auto"`` (:data:`cswap.budget.HOST_AUTO_SHARE`
            of the cgroup's memory limit when one is set, else of the available RAM). Under a
            ``memory_budget`` the plan holds both at every event of the profiled timeline, or
            :class:`cswap.BudgetError` names the budget that binds and the least of each. At pack, a
            swap whose host copy would pass it is kept instead where the device budget leaves room
            (the profiling iteration's, and without a ``memory_budget``, every iteration's rule).
            :meth:`stats` reports ``host_peak_bytes`` against it.

    Raises:
        TypeError: an unknown option (the message lists the valid ones).
        ValueError: an unknown policy (the message lists the choices), a bad memory budget or
            another bad value.
        cswap.BudgetError: from the ``rt.iteration()`` block of a profiling iteration whose profile
            shows the policy cannot meet the budget (that iteration's gradients are complete); its
            ``minimum_bytes`` is the least budget the policy meets on this model.

    Example:
        >>> rt = Runtime("swap", device="cpu", min_bytes=0)
        >>> x = torch.randn(32, requires_grad=True)
        >>> with rt.iteration():
        ...     x.exp().sum().backward()
        >>> rt.stats().actions["swap"], torch.equal(x.grad, x.exp().detach())
        (1, True)
    """

    def __init__(
        self,
        policy: str = _DEFAULTS["policy"],
        *,
        device: str = _DEFAULTS["device"],
        backend: str = _DEFAULTS["backend"],
        min_bytes: int = _DEFAULTS["min_bytes"],
        prefetch_bytes: int = _DEFAULTS["prefetch_bytes"],
        decider: str = _DEFAULTS["decider"],
        paper_size: bool = _DEFAULTS["paper_size"],
        passive_profile: bool = _DEFAULTS["passive_profile"],
        arena_slack: float = _DEFAULTS["arena_slack"],
        d2h_gbps: float | None = _DEFAULTS["d2h_gbps"],
        h2d_gbps: float | None = _DEFAULTS["h2d_gbps"],
        model: torch.nn.Module | None = None,
        time_model: Any = None,
        launch_lookup: LaunchLookup | None = None,
        logistic_model: Any = None,
        memory_budget: int | str | float | None = None,
        host_memory_budget: int | str | None = None,
        disable_kv_cache: bool = False,
        **unknown: Any,
    ) -> None:
        given = dict(
            policy=_DEFAULTS["policy"] if policy is None else policy, device=device, backend=backend, min_bytes=min_bytes, prefetch_bytes=prefetch_bytes, decider=decider,
            paper_size=paper_size, passive_profile=passive_profile, arena_slack=arena_slack, d2h_gbps=d2h_gbps, h2d_gbps=h2d_gbps,
        )
        # A keyword left at the shipped default takes the defaults file's value at call time
        # ($CSWAP_RUNTIME_CONFIG may name another file); `unknown` exists only so that a misspelt
        # option's error lists the valid ones.
        overrides = {name: value for name, value in given.items() if value != _DEFAULTS[name] or type(value) is not type(_DEFAULTS[name])}
        objects = dict(model=model, time_model=time_model, launch_lookup=launch_lookup, logistic_model=logistic_model,
                       memory_budget=memory_budget, host_memory_budget=host_memory_budget)
        overrides.update({name: value for name, value in objects.items() if value is not None})
        overrides["disable_kv_cache"] = disable_kv_cache
        self._options = load_options(**overrides, **unknown)
        opts = self._options
        if opts.policy in RECOMPUTING_POLICIES and opts.model is None:
            raise ValueError(
                f"policy {opts.policy!r} recomputes modules in backward and needs the model: "
                f"cswap.Runtime(policy={opts.policy!r}, model=model)"
            )
        device = resolve_device(None if opts.device == "auto" else opts.device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self._device = device
        self._backend = default_backend(device) if opts.backend == "auto" else opts.backend
        if self._backend == "cuda" and device.type != "cuda":
            raise ValueError(f"backend 'cuda' compresses GPU tensors but the device is {device}: use backend='cpu' or 'auto'")
        if self._backend == "cpu" and device.type == "cuda":
            raise ValueError(f"backend 'cpu' compresses host tensors but the device is {device}: use backend='cuda' or 'auto'")
        self._executor = Executor(device, self._backend, opts.prefetch_bytes, opts.arena_slack)
        self._lock = threading.Lock()
        self._active_thread: int | None = None
        self._epoch = 0
        self._needs_profile = True
        self._trace: Trace | None = None
        self._plan = Plan(
            policy=opts.policy,
            epoch=0,
            default_action=DEFAULT_ACTIONS[opts.policy],
            min_bytes=opts.min_bytes,
            default_reason=POLICY_REASONS[opts.policy],
            launches=LaunchCache(self._backend, opts.launch_lookup),
        )
        budget = opts.memory_budget
        # A fraction of none's peak is known only from a profile; bytes hold from the first pack.
        self._budget_bytes: int | None = None if budget is None or budget.relative else budget.resolve()
        self._budget_error: BudgetError | None = None
        if self._budget_bytes is not None:
            self._plan = replace(self._plan, budget_bytes=self._budget_bytes, fallback_action=FALLBACK_ACTIONS[opts.policy])
            warn_if_over_device(self._budget_bytes, fingerprint(device).memory_bytes, str(device))
        # Under a host budget the plan reads the host bytes the executor counts at pack, collecting
        # pending host compressions first where it needs the room (a swap that would still pass
        # it is kept instead).
        self._host_meter = self._executor.transfers
        host = opts.host_memory_budget
        self._host_budget_bytes: int | None = None if host is None else host.resolve()
        if self._host_budget_bytes is not None:
            # From the first pack, as the device budget in bytes: a fraction of none's peak is not
            # known before the first profile, which then holds the host budget alone (a swap whose
            # copy would pass it is kept, as without a device budget: at most what plain PyTorch holds).
            self._plan = replace(self._plan, host_budget_bytes=self._host_budget_bytes, host_meter=self._host_meter)
        self._resolved_budget: ResolvedBudget | None = None
        self._bandwidths: tuple[float, float] | None = None
        self._time_model: Any = opts.time_model
        self._host_time_model: Any = None  # the host codec's, measured when a host budget needs it (GPU)
        self._fingerprint: dict[str, Any] | None = None
        self._iterations = 0
        self._profiled = 0
        self._profiled_actions: dict[str, int] = {}  # tensors stored per action in profiling iterations
        self._profiled_offloaded_bytes = 0
        self._warned_unsaved = False
        self._warned_not_recomputed = False
        self._warned_held = False
        self._warned_grown = False
        self._met_budget = False  # a plan of this run met the memory budget (_held_past_growth)
        self._held_error: BudgetError | None = None  # what the plan in force, past its least, would have raised
        # The configs whose key/value cache each iteration turns off (disable_kv_cache).
        self._cache_configs = cache_configs(opts.model) if opts.disable_kv_cache else ()
        self._graph_changes = 0
        self._iteration_s = 0.0
        self._history: list[EpochStats] = []
        self._epoch_iterations = 0
        self._epoch_iteration_s = 0.0
        self._epoch_start = replace(self._executor.counters, actions=dict(self._executor.counters.actions))
        # Recompute regions are attached to the model at the first profiling iteration that needs them.
        self._regions: RecomputeRegions | None = None
        self._region_keys: dict[str, tuple[int, ...]] = {}
        # Per structure the model showed, its profile and the plan for the largest sizes seen.
        self._families: dict[Structure, _Family] = {}
        self._family: _Family | None = None
        self._unprofiled_plans = 0
        self._planning_s = 0.0  # seconds spent making plans (inside the iterations that made them)
        # Per iteration of the last few, whether it profiled because the graph changed.
        self._changed_profiles: collections.deque[bool] = collections.deque(maxlen=_PROFILE_WINDOW)
        self._warned_profiling = False
        self._graph_profile = False  # the next profile is for a changed graph
        self._unknown_profile = False  # ... one that saved tensors its plan did not know
        # Iterations that showed a structure never profiled, and whether the last profile meant for
        # one found a known structure instead: then the next one waits for the interval at which the
        # new structure came back (an evaluation step every n iterations, two branches alternating).
        self._unknown_seen_at: collections.deque[int] = collections.deque(maxlen=2)
        self._missed_unknown = False
        self._profile_not_before = 0

    # ------------------------------------------------------------------ properties

    @property
    def options(self) -> RuntimeOptions:
        """The validated options."""
        return self._options

    @property
    def policy(self) -> str:
        """The policy."""
        return self._options.policy

    @property
    def device(self) -> torch.device:
        """The training device."""
        return self._device

    @property
    def backend(self) -> str:
        """The ZVC codec backend."""
        return self._backend

    @property
    def epoch(self) -> int:
        """The current epoch (0-based)."""
        return self._epoch

    @property
    def resolved_budget(self) -> ResolvedBudget | None:
        """What the memory budget came to at the last profile it was met on, with the policy
        ``none`` peak a fraction is of: the largest seen, whose graph set the cap in force (``None``
        without a budget, or before it is resolved)."""
        return self._resolved_budget

    def __repr__(self) -> str:
        return f"Runtime(policy={self.policy!r}, device={str(self._device)!r}, backend={self._backend!r}, epoch={self._epoch})"

    # ------------------------------------------------------------------ the training loop

    def new_epoch(self) -> None:
        """Start a new epoch: its first iteration re-profiles and the plan is remade from it.

        Calling it before any iteration of the current epoch ran only re-arms profiling (so the
        usual ``for epoch ...: rt.new_epoch(); ...`` loop starts at epoch 0).
        """
        with self._lock:
            if self._epoch_iterations:
                self._history.append(self._epoch_stats())
                self._epoch += 1
                self._epoch_iterations = 0
                self._epoch_iteration_s = 0.0
                counters = self._executor.counters
                self._epoch_start = replace(counters, actions=dict(counters.actions))
                self._executor.new_epoch()
            self._profile_next()

    @contextmanager
    def iteration(self) -> Iterator[None]:
        """One forward + backward under the runtime's saved-tensor hooks.

        The first iteration (and the first after :meth:`new_epoch`) profiles. Iterations of one
        runtime cannot nest or overlap (``RuntimeError``); the hooks apply to the entering thread only.

        Example:
            >>> rt = Runtime("none", device="cpu")
            >>> with rt.iteration():
            ...     torch.ones(2, requires_grad=True).exp().sum().backward()
        """
        with self._lock:
            if self._active_thread is not None:
                raise RuntimeError(
                    "rt.iteration() is already active"
                    + (" in this thread" if self._active_thread == threading.get_ident() else " in another thread")
                    + ": iterations of one Runtime cannot nest or overlap; use one Runtime per training loop"
                )
            self._active_thread = threading.get_ident()
            profiling = self._needs_profile and self._iterations >= self._profile_not_before
        started = time.perf_counter()
        # Off for the forward and backward only: generation, evaluation and save_pretrained between
        # iterations, and whatever follows the run, see the value the user set.
        cached = [(config, config.use_cache) for config in self._cache_configs]
        for config, _ in cached:
            config.use_cache = False
        try:
            if not profiling and self.policy == "none" and self._options.memory_budget is None and self._host_budget_bytes is None:
                yield
            else:
                yield from self._hooked(profiling)
        finally:
            for config, value in cached:
                config.use_cache = value
            with self._lock:
                self._active_thread = None
        elapsed = time.perf_counter() - started
        with self._lock:
            self._iterations += 1
            self._epoch_iterations += 1
            self._iteration_s += elapsed
            self._epoch_iteration_s += elapsed
            if profiling:
                self._profiled += 1
            self._changed_profiles.append(profiling and self._graph_profile)
            if profiling:
                self._graph_profile = self._unknown_profile = False
            keeps_profiling = not self._warned_profiling and sum(self._changed_profiles) >= _PROFILES_WARNED
            self._warned_profiling = self._warned_profiling or keeps_profiling
            error, self._budget_error = self._budget_error, None
        if keeps_profiling:
            warnings.warn(
                f"cswap profiled {sum(self._changed_profiles)} of the last {len(self._changed_profiles)} iterations because the "
                "saved tensors changed in kind, not only in size: another number of saved tensors, or another dtype or rank "
                "among them (an input that switches a branch on and off, a batch without padding that takes another "
                "attention path, an evaluation step inside rt.iteration()). Sizes alone (padding to the longest sequence, "
                "a last partial batch) never profile again. Keep such steps out of rt.iteration(), or make the graph one: "
                "pad every batch (a collator's pad_to_multiple_of), or bucket lengths into a few buckets. Each graph is "
                "profiled once and its plan kept (stats().structures).",
                stacklevel=3,
            )
        if error is not None:
            raise error

    @property
    def recomputes(self) -> bool:
        """Whether this runtime may recompute modules: policies ``recompute``, ``capuchin`` and
        ``ac-full``, and ``cswap`` under a memory budget when given ``model``."""
        opts = self._options
        return self.policy in RECOMPUTING_POLICIES or (self.policy == "cswap" and opts.memory_budget is not None and opts.model is not None)

    @property
    def swaps_on_out_of_memory(self) -> bool:
        """Whether profiling iterations run in Capuchin's passive mode on a real out-of-memory error
        (:class:`cswap.execute.passive.SwapOnOutOfMemory`): on a GPU device. An op that runs out of device
        memory then swaps the iteration's kept tensors to the host and runs again, so a profile
        that keeps tensors to measure them works wherever the plan made from it fits."""
        return self._device.type == "cuda"

    def _recompute_regions(self) -> RecomputeRegions:
        if self._regions is None:
            assert self._options.model is not None  # the options refuse a recomputing policy without one
            self._regions = RecomputeRegions.of(self._options.model)
        return self._regions

    def _region_rebuilds(self, plan: Plan, region_keys: dict[str, tuple[int, ...]] | None = None,
                         profile: RegionProfile | None = None) -> dict[str, RegionRebuild]:
        """Per recompute region of ``plan``, the shape and bytes of each storage it rebuilds at the
        sizes ``plan`` was made for (``region_keys``: the profiled keys each rebuilds, and
        ``profile``: the region profile they are keys of; default: those of the plan in force).

        A storage saved twice in a region (a ``tanh``'s output, which the ``Linear`` after it saves
        too) is rebuilt once, as the planner counts it: counted per save, recomputations made room
        they did not need, swapping kept tensors out in backward."""
        if not plan.recompute_regions:
            return {}
        recomputed = plan.recomputed
        keys = self._region_keys if region_keys is None else region_keys
        if profile is None and self._family is not None:
            profile = self._family.regions
        saves = profile.saves if profile is not None else ()  # by key
        rebuilds: dict[str, RegionRebuild] = {}
        for path in plan.recompute_regions:
            largest: dict[object, tuple[tuple[int, ...], int]] = {}  # per storage, its largest save
            for key in keys.get(path, ()):
                decision = recomputed.get(key)
                if decision is None:
                    continue
                storage = saves[key].storage if key < len(saves) else ("key", key)
                if storage not in largest or decision.nbytes > largest[storage][1]:
                    largest[storage] = (decision.shape, decision.nbytes)
            rebuilds[path] = tuple(largest.values())
        return rebuilds

    def _region_bytes(self, plan: Plan, region_keys: dict[str, tuple[int, ...]] | None = None,
                      profile: RegionProfile | None = None) -> dict[str, int]:
        """Per recompute region of ``plan``, the bytes it rebuilds at the sizes ``plan`` was made for."""
        return {path: sum(nbytes for _, nbytes in rebuild) for path, rebuild in self._region_rebuilds(plan, region_keys, profile).items()}

    def _profiling_plan(self, plan: Plan) -> tuple[Plan, str]:
        """The plan a profiling iteration follows, and its mode (see :meth:`_profile_mode`)."""
        mode = self._profile_mode()
        # Profiling runs with no region enabled, so its packs are numbered as the model saves them
        # (but for ac-full's layers, enabled in its profile: LayersProfile).
        plan = replace(plan, recompute_regions=(), recomputed={})
        forced = {"keep-all": Action.KEEP, "layers": Action.KEEP, "passive": Action.SWAP,
                  "budget": Action.KEEP if self._profile_keeps_all else profile_action(self.policy, self._host_budget_bytes)}.get(mode)
        if forced is not None:
            # Profiling modes that move every tensor alike: a plan with no per-key decisions
            # (the current one's unpack order still drives prefetch).
            reason = f"profiling ({mode}): {forced.value} every tensor"
            plan = replace(plan, decisions={}, default_action=forced, default_reason=reason)
        if mode == "keep-first":
            smallest = profile_action(self.policy)
            reason = f"profiling ({mode}): keep each tensor while the budget leaves room, {smallest.value} past it"
            budget = self._options.memory_budget
            # a fraction not resolved yet holds against the none's peak the profile has seen so far
            provisional = budget if self._budget_bytes is None else None
            plan = replace(plan, decisions={}, default_action=Action.KEEP, default_reason=reason, budget_bytes=self._budget_bytes,
                           fallback_action=smallest, provisional_budget=provisional)
        if mode in ("budget", "keep-first"):
            # Under a budget min_bytes binds nothing: the profile stores a small tensor at the
            # policy's smallest footprint like any other, as the planner's replay of it assumes.
            plan = replace(plan, prefetch_bytes=0, raw_unless_smaller=True, min_bytes=0)
        return plan, mode

    @property
    def _profile_keeps_all(self) -> bool:
        """Whether a profiling iteration under the budget keeps every tensor, as plain PyTorch does:
        under all of ``none``'s peak (``memory_budget=1.0``), which keeping every tensor holds on any
        graph. Storing each at the policy's least footprint may hold more: a compressed copy beside
        what backward rebuilds from it, or beside a tensor alive anyway."""
        budget = self._options.memory_budget
        return budget is not None and budget.relative and budget.fraction is not None and budget.fraction >= 1.0

    def _hooked(self, profiling: bool) -> Iterator[None]:
        executor = self._executor
        profiler = None
        tracer = None
        plan = self._plan
        regions = self._recompute_regions() if self.recomputes else None
        model = self._options.model
        layers = None  # ac-full's layers, enabled while profiling: what they did
        if profiling:
            plan, mode = self._profiling_plan(plan)
            meta = {"mode": mode, "backend": self._backend, "min_bytes": self._options.min_bytes}
            if model is not None:
                meta["model"] = type(model).__name__
            profiler = Profiler(self._device, self._epoch, self.policy, model=model, meta=meta)
            if regions is not None and mode == "layers":
                layers = LayersProfile.candidates(regions.model, regions.ineligible)
            elif regions is not None:
                regions.disable_all()
                tracer = RegionTracer(regions.model)
        it = executor.begin(plan, profiler, model)
        family = self._family
        if profiler is None and family is not None and family.plan is plan:
            # A micro-batch of another graph profiled before (one without padding beside padded
            # ones) follows that graph's plan from the pack where it parts from this one. Regions
            # are enabled for the iteration: only plans that recompute the same ones can serve.
            it.structure = family.plan_structure
            it.alternates = tuple((other.plan_structure, other.plan) for other in self._families.values()
                                  if other is not family and other.plan is not None
                                  and other.plan.recompute_regions == plan.recompute_regions)
        unknown_before = executor.counters.unknown_keys
        swapped_before = executor.counters.budget_fallbacks + executor.counters.budget_evictions
        # what a profiling iteration stores is told apart from what the plans store (stats())
        profiled_from = (dict(executor.counters.actions), executor.counters.offloaded_bytes) if profiling else None
        if profiler is not None:
            it.on_backward_end.append(profiler.end)
        if tracer is not None:
            it.on_backward_end.append(tracer.stop)
        if profiler is None and regions is not None:
            regions.enable(plan.recompute_regions)
            regions.listener = executor.rebuilt_listener(it, self._region_rebuilds(plan))
        if layers is not None:
            assert regions is not None
            regions.enable(layers.enabled)
            regions.guard(True)
            regions.listener = layers.recorder(executor.rebuilt_listener(it), it.protected)
        pack, unpack = executor.hooks(it)
        if tracer is not None:
            pack = self._traced(pack, tracer)
            tracer.__enter__()
        passive = None
        if profiler is not None:
            if self.swaps_on_out_of_memory:
                passive = SwapOnOutOfMemory(functools.partial(executor.evict_kept, it))
            profiler.begin()
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack), passive or contextlib.nullcontext():
                yield
        except BaseException as error:
            if profiler is not None:
                profiler.remove_hooks()
            enabled = regions.enabled if regions is not None else ()
            modified = self._after_layers(regions, layers)[1] if regions is not None and layers is not None else {}
            self._after_regions(tracer, regions, count=False)
            executor.end(it)
            self._count_profiled(profiled_from)
            if modified:
                raise self._modified_inputs(modified, error) from error
            if enabled and isinstance(error, CheckpointError):
                raise self._exclude_regions(enabled, error) from error
            raise
        if profiler is not None:
            profiler.end()
        if layers is not None:
            assert regions is not None
            refused, modified = self._after_layers(regions, layers)
            layers.refused.update({**refused, **modified})
            layers.recomputed = tuple(self._after_regions(tracer, regions, count=False))
            self._executor.count_recomputed(layers.tensors(), layers.nbytes())
        else:
            self._after_regions(tracer, regions, count=not profiling)
        executor.end(it)
        self._count_profiled(profiled_from)
        if profiler is None:
            counters = executor.counters  # read as they stand: a snapshot would settle deferred sizes on a GPU
            self._after_planned(it, counters.unknown_keys > unknown_before, counters.iteration_peak_resident_bytes,
                                counters.iteration_peak_host_bytes)
        if profiler is not None:
            profiler.meta["micro_batches"] = it.micro_batches
            if passive is not None and passive.retries:
                profiler.meta["out_of_memory_retries"] = passive.retries
            self._finish_profile(profiler, tracer, layers, it.seen, it.first_peaks)
        if self.policy in _HELD_POLICIES:
            # what fell back to the host (a keep-first profile falls back on the device: not a swap)
            swapped = executor.counters.budget_fallbacks + executor.counters.budget_evictions - swapped_before if it.makes_room else 0
            self._warn_held(swapped, it.plan.budget_bytes)

    def _count_profiled(self, start: tuple[dict[str, int], int] | None) -> None:
        """Add what a profiling iteration stored, per action and offloaded bytes, to the profiling
        iterations' share of the counters; ``start`` is what they held when it began (``None``: not
        a profiling iteration)."""
        if start is None:
            return
        actions, offloaded = start
        counters = self._executor.counters
        with self._lock:
            for name, count in counters.actions.items():
                self._profiled_actions[name] = self._profiled_actions.get(name, 0) + count - actions.get(name, 0)
            self._profiled_offloaded_bytes += counters.offloaded_bytes - offloaded

    def _check_graph(self, unknown: bool, peak_bytes: int, host_peak_bytes: int = 0) -> None:
        """After a planned iteration: if it saved tensors its plan did not know, or passed the budget
        (the policy had no way to move what a changed graph holds longer) or the host budget, plan
        anew from the next iteration's profile, which raises :class:`BudgetError` with the new least
        budget if the policy cannot hold this graph. A plan made past its least
        (:meth:`_past_least`) that passed the budget at its own sizes raises, at this iteration's
        end, the error it was made instead of."""
        budget = self._budget_bytes
        over = budget is not None and peak_bytes > budget
        host_budget = self._host_budget_bytes if self._options.memory_budget is not None else None
        over_host = host_budget is not None and host_peak_bytes > host_budget
        if not (unknown or over or over_host):
            return
        if over and not unknown and self._held_error is not None:
            # A plan made past its least passed the budget at its own sizes: the swaps that were to
            # hold it (_swaps_hold's estimate) did not, and the policy cannot hold this graph.
            with self._lock:
                self._budget_error, self._held_error = self._held_error, None
            return
        if over:
            warnings.warn(
                f"policy {self.policy} passed the memory budget in this iteration ({peak_bytes:,d} B > {budget:,d} B): the saved "
                "tensors are not those its plan was made for; the next iteration profiles again",
                stacklevel=4,
            )
        if over_host:
            warnings.warn(
                f"policy {self.policy} passed the host memory budget in this iteration ({host_peak_bytes:,d} B > {host_budget:,d} B "
                "on the host): the saved tensors are not those its plan was made for; the next iteration profiles again",
                stacklevel=4,
            )
        with self._lock:
            self._graph_changes += 1
            self._needs_profile = True
            self._graph_profile = True
            self._unknown_profile = unknown

    def _profile_next(self) -> None:
        """Profile at the next iteration, not where a new structure was awaited (the caller holds the lock)."""
        self._needs_profile = True
        self._profile_not_before = 0

    def _exclude_regions(self, paths: tuple[str, ...], error: BaseException) -> RuntimeError:
        """After torch refused a recomputation: never enable ``paths`` again and plan anew at the next
        iteration; returns the error that says so."""
        why = f"torch refused its recomputation ({' '.join(str(error).split())[:300]})"
        self._recompute_regions().mark_ineligible(dict.fromkeys(paths, why))
        with self._lock:
            self._profile_next()
        return RuntimeError(
            f"cswap recomputed the modules {', '.join(repr(p) for p in paths)} in backward and torch refused the recomputed "
            f"values: {type(error).__name__}. They are not recomputed again; the next iteration profiles and plans "
            "without them. This step's backward did not finish: run it again."
        )

    @staticmethod
    def _traced(pack: Any, tracer: RegionTracer) -> Any:
        def traced_pack(tensor: torch.Tensor) -> Any:
            tracer.record(tensor)
            return pack(tensor)

        return traced_pack

    def _after_layers(self, regions: RecomputeRegions, layers: LayersProfile) -> tuple[dict[str, str], dict[str, str]]:
        """After a profile that ran with ac-full's ``layers`` enabled: the layers whose calls could not
        be recomputed are never enabled again; returns them, with why, and apart those that modified
        an input in place, with the layers of their class (the forward stopped at the first one)."""
        regions.guard(False)
        refused, modified = regions.take_refusals()
        if modified:
            kinds = {type(regions.model.get_submodule(p)): why for p, why in modified.items()}
            for path in layers.enabled:
                why = kinds.get(type(regions.model.get_submodule(path)))
                if why is not None:
                    modified.setdefault(path, why)
        regions.mark_ineligible({**refused, **modified})
        return refused, modified

    def _modified_inputs(self, paths: dict[str, str], error: BaseException) -> RuntimeError:
        """The error after a profile with ac-full's layers enabled in which ``paths`` modified their
        input in place: they are not recomputed again, and the next iteration profiles without them."""
        with self._lock:
            self._profile_next()
        return RuntimeError(
            f"cswap recomputes the layers {', '.join(repr(p) for p in paths)} from the first iteration (policy "
            f"{self.policy}: its plan is fixed by the model) and they modify their input in place, so a recomputation "
            "would read other values: they are not recomputed again, and the next iteration profiles without them. "
            "This step's forward stopped there: run it again."
        )

    def _after_regions(self, tracer: RegionTracer | None, regions: RecomputeRegions | None, count: bool) -> dict[str, int]:
        """Stop tracing and recomputing after an iteration; count the tensors its regions rebuilt.
        Returns how often each region was recomputed."""
        if tracer is not None:
            tracer.__exit__(None, None, None)
        if regions is None:
            return {}
        regions.disable_all()
        regions.listener = None
        self._executor.release_rebuilt()  # whatever still holds a rebuilt tensor now, it is not this backward
        recomputed = regions.take_recomputations()
        if count:
            keys = [key for path in recomputed for key in self._region_keys.get(path, ())]
            dropped = self._plan.recomputed
            self._executor.count_recomputed(len(keys), sum(dropped[key].nbytes for key in keys if key in dropped))
        return recomputed

    def _profile_mode(self) -> str:
        """``passive`` (swap all), ``keep-all``, ``budget`` (each policy's smallest footprint; for a
        recomputing policy Capuchin's passive mode, :data:`cswap.planner.budgeted.PASSIVE_ACTION`),
        ``keep-first`` (compress-keep under a budget in bytes, or a fraction not resolved yet, held
        against the ``none`` peak seen so far: keep each tensor while the budget leaves room, the
        smallest footprint past it), or ``plan`` (follow the current plan while recording)."""
        if self._options.memory_budget is not None:
            if self.policy in _DRIFT_POLICIES and self._met_budget:
                # Profiled again once a plan met the budget (a new epoch, an iteration that passed
                # the budget, a graph never profiled): storing every tensor compressed, or the
                # newest past the budget, holds more than the plan, and backward, which reads them
                # back beside their compressed copies, has nothing left to move once the data is
                # denser or the graph larger. The plan in force holds the budget, swapping at pack
                # what would pass it (_HOLD_FALLBACK) and in backward what a read needs room for.
                # The profile measures every tensor either way.
                return "plan"
            if self.policy in KEEP_FIRST_POLICIES and not self._profile_keeps_all and (
                    self._budget_bytes is not None or self._plan.budget_bytes is None):
                # every float32 tensor of a Llama compressed held 1.05 of none's peak, a budget
                # plain PyTorch meets refused; before a fraction's bytes are known, compressing
                # every tensor passed 0.8 of none's peak by 10% (bf16 Llama with adapters)
                return "keep-first"
            return "budget"
        if self._options.passive_profile:
            return "passive"
        if self.policy == "ac-full":  # its plan is fixed by the model: the profile runs it (LayersProfile)
            return "passive" if self._memory_short() else "layers"
        if self.policy in ("none", *RECOMPUTING_POLICIES) or (self.policy == "cswap" and self._trace is None):
            return "passive" if self._memory_short() else "keep-all"
        return "plan"

    def _memory_short(self) -> bool:
        """Whether free device memory is below what keeping every saved tensor needed last time."""
        if self._device.type != "cuda" or self._trace is None:
            return False
        need = sum(r.nbytes for r in self._trace.tensors if r.offloadable)
        free, _ = torch.cuda.mem_get_info(self._device)
        cached = torch.cuda.memory_reserved(self._device) - torch.cuda.memory_allocated(self._device)
        return free + cached < need

    def _finish_profile(self, profiler: Profiler, tracer: RegionTracer | None, layers: LayersProfile | None,
                        later: Mapping[int, tuple[tuple[int, ...], str]], first_peaks: tuple[int, int] | None = None) -> None:
        """Plan from the profile just taken. ``later``: per key, the largest shape and the dtype the
        iteration's later micro-batches packed (:attr:`IterationState.seen`), which the profile did
        not record: where they are of the profiled graph and larger, the plan is made for them.
        ``first_peaks``: the iteration's resident and host peaks when the profiled micro-batch ended
        (:attr:`IterationState.first_peaks`), the profile's own where the later ones were another graph."""
        d2h, h2d = self._bandwidth()
        trace = profiler.trace(d2h, h2d, self._device_dict())
        budget = self._options.memory_budget
        if budget is not None and budget.relative and not any(r.offloadable for r in trace.tensors):
            # A fraction of nothing is no budget: wait for an iteration that saves activations.
            if not self._warned_unsaved:
                self._warned_unsaved = True
                warnings.warn(
                    f"the profiling iteration saved no activation for backward (a forward under torch.no_grad()?), so the "
                    f"memory budget of {budget.fraction} of policy none's peak cannot be resolved yet: the next iteration profiles again",
                    stacklevel=2,
                )
            return
        # its own peak (a graph that changed is profiled again in the middle of an epoch)
        profiled = self._executor.snapshot()
        profiled_peak: int | None = profiled.iteration_peak_resident_bytes
        profiled_host_peak = profiled.iteration_peak_host_bytes
        if first_peaks is not None and budget is not None and budget.relative and _another_graph(trace, later):
            # A later micro-batch was another graph (Llama's without padding, whose mask it skips,
            # beside a padded one): the fraction resolves against this one's none peak, and what
            # the other held is that graph's, profiled where it comes first. Counted here, all of
            # none's peak was refused at the first step.
            profiled_peak, profiled_host_peak = first_peaks
        if (budget is not None and budget.relative and self._plan.budget_bytes is None and not self._profile_keeps_all
                and (self._host_budget_bytes is not None or self.policy in KEEP_FIRST_POLICIES)):
            # The first profile under a fraction of none's peak ran before it was known, keeping what
            # the host budget had no room for (compress-keep's keeping first within the fraction of
            # the none's peak seen so far, at most the bytes it resolves to): its peaks are not those
            # of a profile at the budget. The planner replays the device's; the host budget holds
            # from the plan made from it on.
            profiled_peak, profiled_host_peak = None, 0
        profile = None
        if tracer is not None:
            regions = self._recompute_regions()
            profile = tracer.profile().excluding(regions.ineligible)  # with those torch refused before
            trace = profile.with_recompute_seconds(trace)
            regions.mark_ineligible(profile.ineligible)
            if profile.draws_host_random:
                regions.replay_host_random(profile.regions)
            regions.replay_module_state(profile.keeps_state)
        structure = structure_of(trace)
        shapes = tuple(r.shape for r in trace.tensors)
        known = self._families.get(structure)
        self._missed_unknown = self._graph_profile and self._unknown_profile and known is not None
        self._profile_not_before = 0
        later_shapes = _later_shapes(trace, later)
        if later_shapes:
            # Gradient accumulation over micro-batches of different lengths: the profile recorded the
            # first; planned for it, a fraction resolves against the shorter one and the next step
            # outgrows the plan (BERT under recompute at 0.5, 40 then 96 tokens: the 112-token step
            # after passed the cap then in force, half of none's peak at 40 tokens, by 75%).
            shapes = tuple(later_shapes.get(r.key, shape) for r, shape in zip(trace.tensors, shapes))
        if known is not None:  # profiled again (a new epoch): its plan stays made for the largest sizes seen
            shapes = tuple(merged(a, b) for a, b in zip(known.shapes, shapes))
        # The graph whose plan met the budget, at no larger sizes: what changed is the data.
        drifted = known is not None and known.met_budget and shapes == known.shapes
        family = _Family(structure, trace, profile, shapes, layers=layers)
        if drifted and self.policy in _DRIFT_POLICIES:
            assert known is not None
            family.sparsity_drift = _sparsity_drift(known.trace, trace)
        if layers is not None:
            layers.peak_bytes = self._executor.snapshot().iteration_peak_resident_bytes
        self._families[structure] = family
        self._plan_family(family, profiled_peak, profiled_host_peak, drifted=drifted)

    def _plan_family(self, family: _Family, profiled_peak: int | None = 0, profiled_host_peak: int = 0,
                     cause: str = "", profiled: bool = True, drifted: bool = False) -> None:
        """Plan ``family`` at its sizes and follow the plan from the next iteration: from its profile
        as it is, or, where the sizes are larger than profiled, from the profile scaled to them
        (:func:`cswap.profile.shapes.scaled_trace`). ``cause`` names what made the sizes grow. A plan
        made without a profiling iteration (``profiled=False``) gives the solver
        :data:`~cswap.planner.solve.PROVING_TIME_LIMIT_S` per solve and stops at
        :data:`~cswap.planner.solve.PROVING_REL_GAP`: training waits for it.
        ``drifted``: the profile is of a graph whose plan met the budget, at sizes already planned
        (:meth:`_past_least`)."""
        started = time.perf_counter()
        budget = self._options.memory_budget
        held_error = None
        trace, profile = family.trace, family.regions
        if family.sparsity_drift:
            trace = _drifted(trace, family.sparsity_drift)
        grown = {r.key: shape for r, shape in zip(trace.tensors, family.shapes) if shape != r.shape}
        if grown:
            counts: dict[int, float] = {}
            if profile is not None:
                sizes = SizeMap.learn((r.shape, shape) for r, shape in zip(family.trace.tensors, family.shapes))
                counts = profile.count_growth(grown, sizes)
                profile = profile.scaled(grown, sizes, counts)
            trace = scaled_trace(trace, grown, counts)
        solving = _PROFILED_SOLVING if profiled else _PROVING_SOLVING
        # Without a profile the regions chosen before stay where they still meet the budget, and only
        # the rest is planned again: choosing regions tries several plans.
        hint = family.plan.recompute_regions if not profiled and family.plan is not None else None
        saved_bytes = sum(r.nbytes for r in trace.tensors)
        carried = (family.plan.solution if cause and not profiled and family.plan is not None
                   and saved_bytes <= _CARRY_GROWTH * family.solved_bytes else None)
        if family.layers is not None:  # ac-full profiled with its layers recomputed: its plan is what ran
            seen = family.layers
            plan, region_keys = fixed_layers_plan(trace, self.policy, self._epoch, seen.layers(), seen.recomputed, seen.refused,
                                                  seen.rebuilt, seen.peak_bytes, seen.compiled, self._options.min_bytes,
                                                  self._plan.launches)
            budget_bytes, error = None, None
        else:
            holds_drift = drifted and self.policy in _DRIFT_POLICIES
            if profiled and budget is not None and trace.meta.get("mode") == "plan":
                # The profile followed a plan that met the budget, swapping what would have passed
                # it: its peak binds nothing (the first profile's, keeping first, did).
                profiled_peak = 0
            plan, budget_bytes, error, region_keys = self._planned(trace, profile, profiled_peak, profiled_host_peak, solving,
                                                                   hint, carried)
            if error is not None and budget_bytes is not None and (holds_drift or self._held_past_growth(error)):
                refused = error
                plan, region_keys, error = self._past_least(error, budget_bytes, trace, profile, profiled_host_peak, solving,
                                                            hint, denser=holds_drift)
                held_error = refused if error is None and not holds_drift else None
        if budget is not None and error is None and self.policy in _HELD_POLICIES:
            plan = replace(plan, fallback_action=_HOLD_FALLBACK)
            family.met_budget = self._met_budget = True
        if plan.host_pool is None:
            plan = plan.with_host_pool(trace)
        if self._host_budget_bytes is not None:
            plan = replace(plan, host_budget_bytes=self._host_budget_bytes, host_meter=self._host_meter)
        if budget is not None and error is None and budget_bytes is not None:
            none_peak = plan.planner.get("none_peak_bytes")
            if (budget.relative and none_peak is not None and budget.resolve(max(none_peak, 1)) != budget_bytes
                    and self._resolved_budget is not None):
                # planned within the cap a larger graph set: the fraction is of that graph's peak
                none_peak = self._resolved_budget.none_peak_bytes
            resolved = ResolvedBudget(budget, budget_bytes, none_peak)
            if self._resolved_budget is None:  # said once, at the start of training
                logger.info("%s", resolved)
                if budget.relative:
                    warn_if_over_device(budget_bytes, self._device_dict()["memory_bytes"], str(self._device), stacklevel=5)
            self._resolved_budget = resolved
        if budget is not None and budget.relative and budget_bytes is not None and self._budget_bytes is not None \
                and budget_bytes > self._budget_bytes:
            logger.info("memory budget %s of policy none's peak rose from %s to %s: %s", budget.fraction,
                        format_bytes(self._budget_bytes), format_bytes(budget_bytes), cause or _largest(trace))
        self._warn_not_recomputed(plan)
        decisions = plan.decisions
        with self._lock:
            if budget is not None:
                self._budget_bytes = budget_bytes
                self._budget_error = error
                self._held_error = held_error
            self._trace = family.trace
            self._plan = plan
            self._region_keys = region_keys
            self._needs_profile = False
            family.plan = plan
            if plan.planner.get("status") != "carried":
                family.solved_bytes = saved_bytes
            family.region_keys = region_keys
            family.plan_structure = (tuple((d.dtype, len(d.shape)) for _, d in sorted(decisions.items()))
                                     if decisions else family.structure)
            self._family = family
            self._planning_s += time.perf_counter() - started

    def _held_past_growth(self, error: BudgetError) -> bool:
        """Whether a policy that holds its budget by swapping (:data:`_HELD_POLICIES`) holds it past
        ``error``, the device budget refused at sizes it was never met at: a plan of this run met the
        budget before, at other sizes (a longer sequence or a larger batch now), of this graph or
        another (a batch that takes another path is profiled anew). Not under a host budget: what
        the plan lacks would be swapped past it at every step (a Llama's by 1.7x), where a step that
        outgrew its plan passes it once."""
        return (self.policy in _HELD_POLICIES and error.binding == "device" and self._met_budget
                and self._host_budget_bytes is None)

    def _past_least(self, error: BudgetError, budget_bytes: int, trace: Trace, profile: RegionProfile | None,
                    profiled_host_peak: int, solving: _Solving, regions_hint: tuple[str, ...] | None = None,
                    denser: bool = False) -> tuple[Plan, dict[str, tuple[int, ...]], BudgetError | None]:
        """The plan of a graph whose least (``error`` gives it) is past ``budget_bytes``, a budget this
        run met before: its compressed sizes grew since (``denser``: a profile of a graph whose plan
        met it) or its tensors did (a longer sequence than any plan that met it). The plan is made at
        that least and carried out within the budget by :data:`_HOLD_FALLBACK`: at pack, each keep
        whose lifetime would pass the budget is swapped to the host uncompressed, and backward swaps a
        kept tensor to read another or to rebuild a region. The run goes on instead of stopping at a
        budget it met before; :meth:`_warn_held` says so. Returns ``error`` with the plan it came with
        when no plan meets even that least, or, for larger tensors, where swaps cannot hold the
        budget (:meth:`_swaps_hold`; denser data at the same sizes passes its least by its drift)."""
        least = error.minimum_bytes
        plan, _, again, region_keys = self._planned_within(MemoryBudget(nbytes=least), trace, profile, 0, profiled_host_peak,
                                                           solving, regions_hint)
        if again is not None or (not denser and not self._swaps_hold(trace, plan, region_keys, budget_bytes, profile)):
            return plan, region_keys, error
        why = ("its activations are denser now" if denser
               else "its saved tensors are larger than at the sizes it met it at: a longer sequence or a larger batch")
        note = (f"these saved tensors need {least:,d} B under policy {self.policy}, {least - budget_bytes:,d} B over the "
                f"budget of {budget_bytes:,d} B it met before ({why}): planned at that least, each keep whose lifetime would "
                "pass the budget is swapped to the host uncompressed")
        # Each keep's slack is what the resident bytes may run over the plan's and still meet the
        # budget over its lifetime: the plan's at its least, less what the budget lacks.
        over = least - budget_bytes
        decisions = {key: d if d.slack_bytes is None else replace(d, slack_bytes=d.slack_bytes - over)
                     for key, d in plan.decisions.items()}
        plan = replace(plan, decisions=decisions, budget_bytes=budget_bytes, binding=note,
                       planner=MappingProxyType({**plan.planner, "past_least": note}))
        return plan, region_keys, None

    def _swaps_hold(self, trace: Trace, plan: Plan, region_keys: dict[str, tuple[int, ...]], budget_bytes: int,
                    profile: RegionProfile | None) -> bool:
        """Whether swapping kept tensors can hold ``budget_bytes`` under ``plan``, made at a least past
        it: what backward reads at once (the least policy ``swap`` holds ``trace`` at; twice that
        for a policy that keeps tensors compressed, whose compressed copy stays beside the one
        read), with the largest of the plan's region rebuilds beside it, is within it. A rebuild's
        tensors are not the executor's to move: a plan that recomputes a whole decoder holds all of
        its activations at once in backward, whatever is swapped (BART's, at 112 tokens, passed
        half of ``none``'s peak by 91%)."""
        problem = problem_from_trace(trace, NO_CODEC, self._backend, min_bytes=0)
        read = minimum_bytes(problem, "swap", PROVING_TIME_LIMIT_S) * (2 if ZVC_KEEP in POLICY_ACTIONS[self.policy] else 1)
        rebuilt = max(self._region_bytes(plan, region_keys, profile).values(), default=0)
        return read + rebuilt <= budget_bytes

    def _warn_held(self, swapped: int, budget_bytes: int | None) -> None:
        """Warn once, at the first iteration of a policy in :data:`_HELD_POLICIES` that swapped
        tensors to hold its budget of ``budget_bytes`` (``swapped`` of them: at pack, or in backward
        to make room for a rebuilt one) or whose plan was made past its least (:meth:`_past_least`),
        that it did and why."""
        note = self._plan.planner.get("past_least", "")
        if self._warned_held or not (swapped or note):
            return
        self._warned_held = True
        why = ("larger than those its plan was made for (a longer sequence or a larger batch, which the next iteration's plan "
               "is made for, or a micro-batch of another graph, such as one without padding beside padded ones, planned once a "
               "profile has seen it first)"
               + (" or denser than at its profile (compressed sizes follow the data)" if self.policy in _DRIFT_POLICIES else ""))
        warnings.warn(
            f"policy {self.policy} swapped {swapped} saved tensor{'s' if swapped != 1 else ''} to the host, uncompressed, in this "
            f"iteration to hold the memory budget of {budget_bytes or 0:,d} B: keeping them would have passed it, the activations "
            f"being {why}. The rest stays on the device; "
            "stats().budget_fallbacks counts the swaps at pack (rt.plan()'s rows name them), stats().budget_evictions those in "
            "backward, made to read a tensor back"
            + (f". {note[0].upper()}{note[1:]}" if note else "")
            + ". A larger budget keeps every tensor on the device.",
            stacklevel=4,
        )

    def _warn_not_recomputed(self, plan: Plan) -> None:
        """Warn once, at the first plan that says so, that modules are left out of recomputation
        whatever the policy chooses (:func:`cswap.planner.regions.not_recomputed`), and how to let
        them in where cswap knows how: a Hugging Face model's key/value cache off for training."""
        note = plan.planner.get("not_recomputed", "")
        if not note or self._warned_not_recomputed:
            return
        self._warned_not_recomputed = True
        fix = ""
        if "use_cache" in note and self._cache_configs:
            fix = (" disable_kv_cache=True turned model.config.use_cache off for this iteration, so the forward gave them a "
                   "cache itself: call the model with use_cache=False and no past_key_values.")
        elif "use_cache" in note and _uses_cache(self._options.model):
            fix = (" Pass disable_kv_cache=True to cswap.Runtime, which turns model.config.use_cache off inside each "
                   "iteration and back after (as Hugging Face's gradient checkpointing turns it off for training), or set "
                   "model.config.use_cache = False before training and back for generation; the layers can then be recomputed.")
        warnings.warn(f"policy {self.policy} cannot recompute some of the model's modules, whatever the budget: {note}.{fix} "
                      "rt.plan().planner['not_recomputed'] and rt.stats().recompute_note keep this.", stacklevel=7)

    def _planned(self, trace: Trace, profile: RegionProfile | None, profiled_peak: int | None, profiled_host_peak: int,
                 solving: _Solving, regions_hint: tuple[str, ...] | None = None, carried: BudgetPlan | None = None,
                 ) -> tuple[Plan, int | None, BudgetError | None, dict[str, tuple[int, ...]]]:
        """The plan of ``trace`` (and ``profile``'s regions), the budget's bytes and the error when the
        policy cannot meet it. A fraction of ``none``'s peak never resolves below what it resolved to
        before: a smaller graph or shorter sequence keeps the cap a larger one set."""
        budget = self._options.memory_budget
        floor = self._budget_bytes if budget is not None and budget.relative else None
        plan, budget_bytes, error, region_keys = self._planned_within(budget, trace, profile, profiled_peak, profiled_host_peak,
                                                                      solving, regions_hint, carried)
        if floor is not None and budget_bytes is not None and budget_bytes < floor:
            plan, budget_bytes, error, region_keys = self._planned_within(MemoryBudget(nbytes=floor), trace, profile, profiled_peak,
                                                                          profiled_host_peak, solving, regions_hint, carried)
        return plan, budget_bytes, error, region_keys

    def _planned_within(self, budget: MemoryBudget | None, trace: Trace, profile: RegionProfile | None, profiled_peak: int | None,
                        profiled_host_peak: int, solving: _Solving, regions_hint: tuple[str, ...] | None = None,
                        carried: BudgetPlan | None = None,
                        ) -> tuple[Plan, int | None, BudgetError | None, dict[str, tuple[int, ...]]]:
        error = None
        budget_bytes = None
        region_keys: dict[str, tuple[int, ...]] = {}
        # Without a device budget there is no plan to hold the host budget in: the pack's rule does.
        host_budget = self._host_budget_bytes if budget is not None else None
        if profile is not None:
            time_model = self._codec_time_model() if self.policy == "cswap" else NO_CODEC
            chosen = plan_regions(trace, profile, self.policy, budget, time_model, self._backend, self._options.min_bytes,
                                  self._epoch, self._plan.launches, profiled_peak, host_budget_bytes=host_budget,
                                  profiled_host_peak_bytes=profiled_host_peak, host_time_model=self._host_codec_time_model(host_budget),
                                  time_limit_s=solving.time_limit_s, regions_hint=regions_hint, rel_gap=solving.rel_gap,
                                  carried=carried)
            plan, error, region_keys = chosen.plan, chosen.error, dict(chosen.region_keys)
            budget_bytes = chosen.budget_bytes if budget is not None else None
        elif budget is None:
            plan = self._advisor().plan(trace, self._epoch)
        else:
            compresses = bool(POLICY_ACTIONS[self.policy] & {ZVC_SWAP, ZVC_KEEP})
            time_model = self._codec_time_model() if compresses else NO_CODEC
            plan, budget_bytes, error = budget_plan(trace, self.policy, budget, time_model, self._backend, self._options.min_bytes,
                                                    self._epoch, self._plan.launches, profiled_peak, host_budget,
                                                    profiled_host_peak, self._host_codec_time_model(host_budget), solving.time_limit_s,
                                                    solving.rel_gap, carried, trace.meta.get("mode") == "keep-first")
        return plan, budget_bytes, error, region_keys

    def _after_planned(self, it: IterationState, unknown: bool, peak_bytes: int, host_peak_bytes: int = 0) -> None:
        """After a planned iteration: follow the plan of the structure it showed, planned again (not
        profiled) where its sizes grew past those planned; profile a structure never seen, and, as
        :meth:`_check_graph`, an iteration that passed a budget its plan was made within."""
        family = self._family
        if family is None or family.plan is not self._plan:
            self._check_graph(unknown, peak_bytes, host_peak_bytes)
            return
        # Each micro-batch on its own: a later one may be another graph profiled before (one without
        # padding beside padded ones), which then needs no profile. The first decides the plan.
        micro_batches = it.micro_batches_seen()
        shown_by_micro_batch = [self._structure_shown(family, seen, packs) for seen, packs in micro_batches]
        shown = shown_by_micro_batch[0]
        if shown is None or None in shown_by_micro_batch:
            self._unknown_seen_at.append(self._iterations)
            self._check_graph(True, peak_bytes, host_peak_bytes)
            if self._missed_unknown and len(self._unknown_seen_at) == 2:
                # the last profile came too soon and met a known structure: profile where this one
                # should come back, at the interval it came back at
                self._profile_not_before = self._iterations + self._unknown_seen_at[1] - self._unknown_seen_at[0]
            return
        switched = shown is not family
        if switched:
            with self._lock:  # a structure profiled before: its plan, at no cost
                self._family, self._plan, self._region_keys, self._trace = shown, shown.plan, shown.region_keys, shown.trace
                shown.plan.resolved_table().clear()  # what was decided at run time when it last served is not this graph's
        seen = merged_seen(micro_batch_seen for (micro_batch_seen, _), of in zip(micro_batches, shown_by_micro_batch, strict=True)
                           if of is shown)
        grown = self._grown(shown, seen)
        if grown is not None:
            shown.shapes, cause = grown
            self._warn_grown_past(peak_bytes, it.plan.budget_bytes, cause)
            self._unprofiled_plans += 1
            self._plan_family(shown, cause=cause, profiled=False)
        elif switched and self._below_the_cap(shown):
            # made before a larger graph raised the cap: planned again within the cap in force
            self._unprofiled_plans += 1
            self._plan_family(shown, profiled=False)
        elif not switched:
            self._check_graph(False, peak_bytes, host_peak_bytes)

    def _warn_grown_past(self, peak_bytes: int, budget_bytes: int | None, cause: str) -> None:
        """Warn, once, that an iteration larger than any planned for passed the budget its plan was
        made within: what a plan cannot move grew with it (a recomputed region rebuilds all it saves
        at once, and a scan's grows with the sequence). The plan is made again for its sizes."""
        if budget_bytes is None or peak_bytes <= budget_bytes or self._warned_grown:
            return
        self._warned_grown = True
        warnings.warn(
            f"policy {self.policy} passed the memory budget in an iteration larger than any planned for ({peak_bytes:,d} B > "
            f"{budget_bytes:,d} B; {cause}): what its plan could not move grew with it. Its plan is made again for these sizes; "
            "to hold every step, let the first profiled batch be the longest (a collator's max_length padding once, or "
            "the longest batch first), or leave the budget room",
            stacklevel=6,
        )

    def _below_the_cap(self, family: _Family) -> bool:
        """Whether ``family``'s plan was made within fewer bytes than a fractional budget's cap in force."""
        budget, plan = self._options.memory_budget, family.plan
        return (budget is not None and budget.relative and self._budget_bytes is not None and plan is not None
                and plan.budget_bytes is not None and plan.budget_bytes < self._budget_bytes)

    def _structure_shown(self, family: _Family, seen: Mapping[int, tuple[tuple[int, ...], str]], packs: int) -> _Family | None:
        """The family whose plan's packs have the dtypes and ranks a micro-batch showed under
        ``family``'s plan (``family`` when it is this one, or it packed fewer of the same); ``None``
        for a structure never profiled. ``seen``: per key, the shape and dtype of each pack the plan
        did not serve (:meth:`IterationState.see`); ``packs``: how many it made."""
        planned = family.plan_structure
        shown = tuple(
            (seen[k][1], len(seen[k][0])) if k in seen else (planned[k] if k < len(planned) else ("", -1))
            for k in range(packs)
        )
        if shown == planned[: len(shown)]:
            return family
        serving = [other for other in self._families.values() if other.plan_structure[: len(shown)] == shown]
        return min(serving, key=lambda other: len(other.plan_structure), default=None)

    def _grown(self, family: _Family, seen: Mapping[int, tuple[tuple[int, ...], str]]) -> tuple[tuple[tuple[int, ...], ...], str] | None:
        """The sizes ``family``'s plan must be made for after its micro-batches packed ``seen`` (as
        :meth:`_structure_shown` takes it), and which tensor grew most, when one was larger than
        planned; else ``None``."""
        plan = family.plan
        if not seen or plan is None:
            return None
        by_key: dict[int, tuple[int, ...]] = {}
        if plan.recompute_regions and family.regions is not None:
            sequence = family.regions.sequence(plan.recompute_regions)
            for ordinal, (shape, _) in seen.items():
                if ordinal < len(sequence) and sequence[ordinal].key is not None:
                    by_key[sequence[ordinal].key] = shape  # type: ignore[index]
        else:
            by_key = {key: shape for key, (shape, _) in seen.items()}
        current = replace(family.trace, tensors=tuple(replace(r, shape=shape) for r, shape in zip(family.trace.tensors, family.shapes)))
        grown = grown_shapes(current, by_key)
        if not grown:
            return None
        shapes = tuple(grown.get(k, shape) for k, shape in enumerate(family.shapes))
        key = max(grown, key=lambda k: math.prod(grown[k]) - math.prod(family.shapes[k]))
        record = family.trace.tensors[key]
        what = f"key {key}" + (f" ({record.module})" if record.module else "")
        return shapes, f"{what} grew from {list(family.shapes[key])} to {list(grown[key])}"

    def _bandwidth(self) -> tuple[float, float]:
        if self._bandwidths is None:
            d2h, h2d = self._options.d2h_gbps, self._options.h2d_gbps
            if d2h is None or h2d is None:
                measured = bandwidth(self._device)
                d2h = d2h if d2h is not None else measured.d2h_gbps
                h2d = h2d if h2d is not None else measured.h2d_gbps
            self._bandwidths = (float(d2h), float(h2d))
        return self._bandwidths

    def _device_dict(self) -> dict[str, Any]:
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self._device).to_dict()
        return self._fingerprint

    def _advisor(self) -> Advisor:
        opts = self._options
        d2h, h2d = self._bandwidth()
        time_model = self._codec_time_model() if self.policy == "cswap" else None
        return Advisor(
            policy=opts.policy,
            backend=self._backend,
            min_bytes=opts.min_bytes,
            d2h_gbps=d2h,
            h2d_gbps=h2d,
            time_model=time_model,
            decider=opts.decider,
            logistic_model=opts.logistic_model,
            paper_size=opts.paper_size,
            launch_lookup=opts.launch_lookup,
        )

    def _host_codec_time_model(self, host_budget_bytes: int | None) -> Any:
        """The host codec's time model (the ``cpu`` backend's) that prices ``host-zvc-swap``, or
        ``None`` where it is not offered: measured only under a host budget, for a policy that may
        compress on the host. On a CPU device it is the device codec's own."""
        if host_budget_bytes is None or HOST_ZVC_SWAP not in POLICY_ACTIONS.get(self.policy, frozenset()):
            return None
        if self._backend == "cpu":
            return self._codec_time_model()
        if self._host_time_model is None:
            from cswap.profile.codec_speed import codec_speed

            self._host_time_model = codec_speed(torch.device("cpu"), "cpu")
        return self._host_time_model

    def _codec_time_model(self) -> Any:
        if self._time_model is None:
            from cswap.profile.codec_speed import codec_speed  # measured only when the cost model needs it

            self._time_model = codec_speed(self._device, self._backend)
        return self._time_model

    # ------------------------------------------------------------------ what it did

    def plan(self) -> Plan:
        """The current plan: per saved-tensor key the action, its reason, and for ``cswap`` T and T'.

        Its :meth:`~cswap.planner.plan.Plan.rows` (what ``print`` and ``to_dict`` show) are what the executor
        last did with each key, including keys the profile did not plan.
        """
        return self._plan

    def trace(self) -> Trace:
        """The last profile.

        Raises:
            RuntimeError: no iteration has been profiled yet.
        """
        if self._trace is None:
            raise RuntimeError("no iteration has been profiled yet: run one `with rt.iteration():` block first")
        return self._trace

    def _epoch_stats(self, counters: Counters | None = None) -> EpochStats:
        counters = counters or self._executor.snapshot()
        start = self._epoch_start
        return EpochStats(
            epoch=self._epoch,
            iterations=self._epoch_iterations,
            **{name: getattr(counters, name) - getattr(start, name) for name in _EPOCH_FIELDS},
            peak_resident_bytes=counters.epoch_peak_resident_bytes,
            iteration_s=self._epoch_iteration_s,
            actions=MappingProxyType({k: v - start.actions.get(k, 0) for k, v in counters.actions.items()}),
        )

    def stats(self) -> RuntimeStats:
        """A snapshot of the counters (safe to call any time, from any thread)."""
        with self._lock:
            counters: Counters = self._executor.snapshot()
            arena = self._executor.arena
            return RuntimeStats(
                policy=self.policy,
                epoch=self._epoch,
                iterations=self._iterations,
                profiled_iterations=self._profiled,
                **{name: getattr(counters, name) for name in _COUNTED_FIELDS},
                actions=MappingProxyType(dict(counters.actions)),
                arena_bytes=arena.capacity_bytes,
                arena_used_bytes=arena.held_bytes,
                arena_misses=arena.misses,
                host_pool_bytes=arena.pool_bytes,
                host_pool_fallbacks=arena.pool_fallbacks,
                iteration_s=self._iteration_s,
                budget_bytes=self._budget_bytes,
                host_bytes=counters.host_bytes,
                host_peak_bytes=counters.peak_host_bytes,
                iteration_host_peak_bytes=counters.iteration_peak_host_bytes,
                host_budget_bytes=self._host_budget_bytes,
                graph_changes=self._graph_changes,
                unprofiled_plans=self._unprofiled_plans,
                planning_s=self._planning_s,
                structures=len(self._families),
                recompute_note=self._plan.planner.get("not_recomputed", ""),
                profiled_actions=MappingProxyType({name: self._profiled_actions.get(name, 0) for name in counters.actions}),
                profiled_offloaded_bytes=self._profiled_offloaded_bytes,
                history=(*self._history, self._epoch_stats(counters)),
            )


def _later_shapes(trace: Trace, later: Mapping[int, tuple[tuple[int, ...], str]]) -> dict[int, tuple[int, ...]]:
    """Per key of ``trace`` (a profile of an iteration's first micro-batch) that its later
    micro-batches packed larger, the size to plan for (:func:`~cswap.profile.shapes.grown_shapes`);
    nothing when they packed another graph (another dtype or rank at a key, or more packs), which
    the next iteration tells apart as it would any other.

    Example:
        >>> from cswap.profile.trace import TensorRecord
        >>> record = TensorRecord(key=0, shape=(2, 40, 8), dtype="float32", nbytes=2560, sparsity=0.0)
        >>> trace = Trace(tensors=(record,))
        >>> _later_shapes(trace, {0: ((2, 96, 8), "float32")})
        {0: (2, 96, 8)}
        >>> _later_shapes(trace, {0: ((2, 96), "float32")})
        {}
    """
    if not later or _another_graph(trace, later):
        return {}
    return grown_shapes(trace, {key: shape for key, (shape, _) in later.items()})


def _another_graph(trace: Trace, later: Mapping[int, tuple[tuple[int, ...], str]]) -> bool:
    """Whether an iteration's later micro-batches (``later``, as :func:`_later_shapes` takes it)
    packed another graph than ``trace``'s: another dtype or rank at a key, or more packs.

    Example:
        >>> from cswap.profile.trace import TensorRecord
        >>> trace = Trace(tensors=(TensorRecord(key=0, shape=(2, 40, 8), dtype="float32", nbytes=2560, sparsity=0.0),))
        >>> _another_graph(trace, {0: ((2, 96, 8), "float32")}), _another_graph(trace, {1: ((2, 96, 8), "float32")})
        (False, True)
    """
    structure = structure_of(trace)
    return any(key >= len(structure) or structure[key] != (dtype, len(shape)) for key, (shape, dtype) in later.items())


def _sparsity_drift(before: Trace, now: Trace) -> dict[int, float]:
    """Per key of ``now`` (a later profile of ``before``'s structure), how far its sparsity fell
    since ``before``; keys whose sparsity held or rose are left out."""
    was = {r.key: r.sparsity for r in before.tensors}
    return {r.key: was[r.key] - r.sparsity for r in now.tensors if r.offloadable and was.get(r.key, 0.0) > r.sparsity}


def _drifted(trace: Trace, drift: dict[int, float]) -> Trace:
    """``trace`` with each tensor's sparsity lowered by its ``drift``: what the next profile will
    see if the activations keep growing denser at the pace they did."""
    return replace(trace, tensors=tuple(replace(r, sparsity=max(r.sparsity - drift[r.key], 0.0)) if r.key in drift else r
                                        for r in trace.tensors))


def _uses_cache(model: torch.nn.Module | None) -> bool:
    """Whether ``model`` or a module of it has a Hugging Face config with the key/value cache on."""
    return any(config.use_cache for config in cache_configs(model))


def _largest(trace: Trace) -> str:
    """The largest tensor of ``trace``, in words: what set a new peak."""
    record = max(trace.tensors, key=lambda r: r.nbytes, default=None)
    if record is None:
        return "no saved tensor"
    return f"largest saved tensor key {record.key}" + (f" ({record.module})" if record.module else "") + f" {list(record.shape)}"
