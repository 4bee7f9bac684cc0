"""What users would pick instead of cswap, priced by the simulator: each a strategy under a memory budget.

Each strategy turns a trace into per-record actions, recompute regions and queue settings that the
simulator replays in the queue model (:meth:`cswap.simulate.engine.Simulator.run_plan`: the link's
two directions apart, roofline op times from the trace), and reports its peak, its iteration time
and the least budget it meets. A **fixed** strategy does the same whatever the budget: the least
budget it meets is its own peak. A **budgeted** one is planned for each budget.

======================  ========  ======================================================================
strategy                kind      what it does, and its source
======================  ========  ======================================================================
``ac-full``             fixed     checkpoint every transformer layer: keep its input, drop what it
                                  saves, run its forward again when backward reaches it (Chen et al.,
                                  *Training Deep Nets with Sublinear Memory Cost*, 2016;
                                  ``torch.utils.checkpoint`` per layer, as Hugging Face's
                                  ``gradient_checkpointing_enable()`` and torchtitan's ``full`` mode do)
``ac-selective``        fixed     recompute only the attention core (``Q K^T``, softmax, dropout,
                                  attention over ``V``) and keep the rest (Korthikanti et al., *Reducing
                                  Activation Recomputation in Large Transformer Models*, MLSys 2023;
                                  Megatron-LM's ``--recompute-granularity selective``)
``offload-all``         fixed     every activation of at least 1 KiB to pinned host memory on a side
                                  stream, up to 5 copies in flight before compute waits, each copied
                                  back when backward asks for it; the output projection and the loss
                                  stay (torchtune's ``OffloadActivations``, its ``NoOpManager`` around
                                  the output, and recipes that compute the loss outside the context)
``offload-all+ac``      fixed     ``ac-full``, and what is still saved (the layers' inputs, the rest
                                  of the model) offloaded as ``offload-all`` does (torchtune's
                                  ``enable_activation_checkpointing`` with ``enable_activation_offloading``)
``megatron-offload``    fixed     what the named modules of every layer save, offloaded once written
                                  and each module's copies back issued when backward starts the module
                                  after it (Megatron-LM's ``--fine-grained-activation-offloading
                                  --offload-modules qkv_linear core_attn attn_proj``, and ``mlp`` for
                                  the dense MLP; :data:`cswap.simulate.layers.MEGATRON_MODULES`)
``recompute-knapsack``  budgeted  which activations to recompute: the least recompute seconds with
                                  the saved bytes within the budget, a 0-1 knapsack
                                  (``torch._functorch.config.activation_memory_budget``;
                                  :mod:`cswap.simulate.knapsack`)
``ilp-kro``             budgeted  keep, recompute or swap each tensor, chosen by an exact integer
                                  program under the peak budget at every event (torchtitan's three
                                  choices: keep, activation checkpointing, CPU offload; Checkmate's
                                  exact program, Jain et al., MLSys 2020): cswap's planner without
                                  compression
======================  ========  ======================================================================

The checkpointing strategies need the trace's transformer layers (:mod:`cswap.simulate.layers`):
a layer's forward seconds come from its module call, and a checkpoint saves the layer's input from
its forward until its forward runs again (:meth:`Strategies.checkpointed` adds a record of it per
layer). Where an operator inside the layer saves that input too (GPT-2's first LayerNorm), it does
so again when the layer runs again, so while the layer runs again its input counts twice: one hidden
state, a few percent of a layer. With fused attention (``sdpa``) there is no ``s x s``
core to drop (FlashAttention recomputes it in its own backward): ``ac-selective`` keeps
everything, as ``none`` does.

Recompute in ``recompute-knapsack`` and ``ilp-kro`` is per tensor, priced by its producing op alone
(:mod:`cswap.planner.problem`): a lower bound on what re-running a segment costs.

Example:
    >>> from cswap.simulate import Simulator
    >>> from cswap.simulate.lmtrace import transformer_trace
    >>> sim = Simulator(transformer_trace("gpt2", seq_len=64, num_layers=2, attention="eager"), "h100-pcie5")
    >>> strategies = Strategies(sim)
    >>> none = sim.run("none")
    >>> full = strategies.result("ac-full")
    >>> full.peak_bytes < none.peak_bytes and full.iteration_s > none.iteration_s
    True
    >>> strategies.run("ac-full", budget_bytes=full.peak_bytes).infeasible, strategies.run("ac-full", full.peak_bytes - 1).infeasible
    (False, True)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from cswap.budget import BudgetError
from cswap.planner import PlanningProblem, minimum_bytes, plan_budget
from cswap.planner.actions import KEEP, RECOMPUTE, SWAP
from cswap.profile.trace import TensorRecord
from cswap.simulate.budgeted import BudgetOutcome, planning_problem, replay_plan
from cswap.simulate.engine import PolicyResult, Simulator
from cswap.simulate.knapsack import recompute_knapsack
from cswap.simulate.layers import Layer, attention_core_regions, megatron_records, module_path, transformer_layers
from cswap.simulate.metatrace import with_hidden_times
from cswap.simulate.policies import Action, RecomputeRegion

__all__ = [
    "MEGATRON_DEFAULT_MODULES",
    "STRATEGIES",
    "TORCHTUNE_FORWARD_STASH",
    "TORCHTUNE_MIN_OFFLOAD_BYTES",
    "Strategies",
    "Strategy",
    "StrategyPlan",
]

#: torchtune's ``min_offload_size``: smaller tensors stay on the device.
TORCHTUNE_MIN_OFFLOAD_BYTES = 1024
#: torchtune's ``max_fwd_stash_size``: copies out in flight before compute waits for the oldest.
TORCHTUNE_FORWARD_STASH = 5
#: The modules ``megatron-offload`` offloads (Megatron-LM's names; ``mlp`` for the dense MLP).
MEGATRON_DEFAULT_MODULES: tuple[str, ...] = ("qkv_linear", "core_attn", "attn_proj", "mlp")

# The output projection, which torchtune's recipes keep out of offloading (it is read back at once).
_OUTPUT_HEAD = re.compile(r"(?:^|\.)(?:lm_head|output|cls|score|classifier|qa_outputs)(?:\.|$)")


@dataclass(frozen=True)
class Strategy:
    """One strategy of the table in the module docstring.

    Attributes:
        name: what ``--policies`` takes.
        system: what it does, in a few words.
        source: the system or paper it reproduces.
        budgeted: planned for each budget (else fixed: the same plan whatever the budget).
        needs_layers: it needs the trace's transformer layers.
    """

    name: str
    system: str
    source: str
    budgeted: bool = False
    needs_layers: bool = False


#: Every strategy, in the order tables list them.
STRATEGIES: Mapping[str, Strategy] = MappingProxyType(
    {
        s.name: s
        for s in (
            Strategy(
                "ac-full",
                "checkpoint every transformer layer",
                "Chen et al. 2016; torch.utils.checkpoint per layer",
                needs_layers=True,
            ),
            Strategy(
                "ac-selective",
                "recompute the attention core",
                "Korthikanti et al., MLSys 2023 (Megatron-LM selective)",
                needs_layers=True,
            ),
            Strategy("offload-all", "every activation to pinned host memory", "torchtune OffloadActivations"),
            Strategy(
                "offload-all+ac",
                "checkpoint every layer, offload what is saved",
                "torchtune activation checkpointing + offloading",
                needs_layers=True,
            ),
            Strategy(
                "megatron-offload",
                "offload what named modules save",
                "Megatron-LM fine-grained activation offloading",
                needs_layers=True,
            ),
            Strategy(
                "recompute-knapsack",
                "recompute the least seconds that fit",
                "torch.compile activation_memory_budget",
                budgeted=True,
            ),
            Strategy(
                "ilp-kro",
                "keep, recompute or swap by an exact program",
                "torchtitan's choices, Checkmate's exact program",
                budgeted=True,
            ),
        )
    }
)


@dataclass(frozen=True)
class StrategyPlan:
    """What a fixed strategy does to a trace.

    Attributes:
        simulator: the trace it runs on (:meth:`Strategies.checkpointed` for the checkpointing ones).
        actions: per record of that trace.
        regions: records rebuilt together by running a module's forward again.
        fetch_after: per record, when its copy back may be issued (``None``: the simulator's prefetch).
        max_inflight_offloads: copies out in flight before compute waits (``None``: no limit).
        note: what the plan rests on, where a reader needs to know.
    """

    simulator: Simulator
    actions: tuple[Action, ...]
    regions: tuple[RecomputeRegion, ...] = ()
    fetch_after: tuple[int | None, ...] | None = None
    max_inflight_offloads: int | None = None
    note: str = ""


class Strategies:
    """The strategies on one simulator's trace: fixed plans built and simulated once, budgeted ones
    planned per budget.

    Args:
        simulator: the trace and hardware.
        time_limit_s: the solvers' time limit per solve.
        megatron_modules: the modules ``megatron-offload`` offloads.

    Example:
        >>> from cswap.simulate import Simulator, meta_trace
        >>> strategies = Strategies(Simulator(meta_trace("vgg11", 2, 32, width_mult=0.125), "v100-pcie3"))
        >>> strategies.available()
        ('offload-all', 'recompute-knapsack', 'ilp-kro')
        >>> strategies.unavailable("ac-full")
        'the trace has no transformer layers (module calls named h.N, layers.N, layer.N or blocks.N)'
    """

    def __init__(
        self, simulator: Simulator, time_limit_s: float = 30.0, megatron_modules: Sequence[str] = MEGATRON_DEFAULT_MODULES
    ) -> None:
        self.simulator = simulator
        self.time_limit_s = time_limit_s
        self.megatron_modules = tuple(megatron_modules)
        self.layers: tuple[Layer, ...] = transformer_layers(simulator.trace)
        self._checkpointed: tuple[Simulator, tuple[RecomputeRegion, ...]] | None = None
        self._results: dict[str, PolicyResult] = {}
        self._outcomes: dict[tuple[str, int], BudgetOutcome] = {}
        self._kro: tuple[PlanningProblem, int] | None = None
        self._knapsack_floor: PolicyResult | None = None

    # ------------------------------------------------------------------ which apply

    def unavailable(self, name: str) -> str | None:
        """Why strategy ``name`` cannot run on this trace, or ``None`` when it can.

        Raises:
            ValueError: an unknown strategy, naming the known ones.
        """
        if name not in STRATEGIES:
            raise ValueError(f"unknown strategy {name!r}: choose one of {', '.join(STRATEGIES)}")
        if STRATEGIES[name].needs_layers and not self.layers:
            return "the trace has no transformer layers (module calls named h.N, layers.N, layer.N or blocks.N)"
        if name == "ac-selective" and "attention_core_keys" not in self.simulator.trace.meta:
            return "the trace does not mark its attention core (only transformer traces do)"
        return None

    def available(self) -> tuple[str, ...]:
        """The strategies that can run on this trace, in table order."""
        return tuple(name for name in STRATEGIES if self.unavailable(name) is None)

    # ------------------------------------------------------------------ fixed plans

    def checkpointed(self) -> tuple[Simulator, tuple[RecomputeRegion, ...]]:
        """The trace as checkpointing every layer saves it, and each layer's region.

        Each layer's input, as the checkpoint saves it, is a record appended to the trace: saved
        when the layer's forward begins and read back when backward first reaches the layer (its
        forward, run again, reads it). The region of a layer is every record saved inside it but
        its keyword inputs (which the checkpoint holds as the trace does), rebuilt for the layer's
        forward seconds.
        """
        if self._checkpointed is not None:
            return self._checkpointed
        trace = self.simulator.trace
        records = list(trace.tensors)
        next_key = max((r.key for r in records), default=-1) + 1
        regions = []
        for layer in self.layers:
            if not layer.saved:
                continue
            regions.append(RecomputeRegion(layer.saved, layer.forward_s, layer.path))
            needed = [records[i].unpack_at_s for i in layer.saved if records[i].unpack_at_s is not None]
            if not (needed and layer.input_nbytes and layer.input_shape is not None and layer.input_dtype is not None):
                continue
            records.append(
                TensorRecord(
                    key=next_key,
                    shape=layer.input_shape,
                    dtype=layer.input_dtype,
                    nbytes=layer.input_nbytes,
                    sparsity=0.0,
                    producer=f"{layer.path}:CheckpointInput",
                    pack_at_s=layer.start_s,
                    unpack_at_s=min(needed),
                    module=f"{layer.path} (checkpoint input)",
                )
            )
            next_key += 1
        sim = self.simulator
        checkpointed = with_hidden_times(replace(trace, tensors=tuple(records)))
        self._checkpointed = (Simulator(checkpointed, sim.hardware, sim.config, sim.time_model), tuple(regions))
        return self._checkpointed

    def _torchtune_moves(self, simulator: Simulator, kept: set[int]) -> list[int]:
        """Records torchtune's offloading copies out: activations of at least 1 KiB, not the output
        projection's, not the loss's (saved outside every module), not in ``kept``."""
        moved = []
        for i, record in enumerate(simulator.trace.tensors):
            path = module_path(record.module)
            if not record.offloadable or record.nbytes < TORCHTUNE_MIN_OFFLOAD_BYTES or i in kept:
                continue
            if not path or _OUTPUT_HEAD.search(path):
                continue
            moved.append(i)
        return moved

    def plan(self, name: str) -> StrategyPlan:
        """The plan of fixed strategy ``name`` (module docstring).

        Raises:
            ValueError: an unknown or budgeted strategy, or one that cannot run on this trace.
        """
        reason = self.unavailable(name)
        if reason is not None:
            raise ValueError(f"strategy {name!r} cannot run on this trace: {reason}")
        if STRATEGIES[name].budgeted:
            raise ValueError(f"strategy {name!r} is planned per budget: use run({name!r}, budget_bytes)")
        sim = self.simulator
        if name in ("ac-full", "offload-all+ac"):
            sim, regions = self.checkpointed()
            actions = [Action.KEEP] * len(sim.costs)
            members = {i for region in regions for i in region.records}
            for i in members:
                actions[i] = Action.RECOMPUTE
            if name == "ac-full":
                return StrategyPlan(sim, tuple(actions), regions)
            for i in self._torchtune_moves(sim, members):
                actions[i] = Action.SWAP
            return StrategyPlan(sim, tuple(actions), regions, (None,) * len(actions), TORCHTUNE_FORWARD_STASH)
        if name == "ac-selective":
            regions = attention_core_regions(sim.trace)
            actions = [Action.KEEP] * len(sim.costs)
            for region in regions:
                for i in region.records:
                    actions[i] = Action.RECOMPUTE
            note = (
                ""
                if regions
                else "no s x s attention core is saved (fused attention recomputes it in its own backward): nothing to recompute"
            )
            return StrategyPlan(sim, tuple(actions), regions, note=note)
        if name == "offload-all":
            actions = [Action.KEEP] * len(sim.costs)
            for i in self._torchtune_moves(sim, set()):
                actions[i] = Action.SWAP
            return StrategyPlan(sim, tuple(actions), (), (None,) * len(actions), TORCHTUNE_FORWARD_STASH)
        # megatron-offload: each (layer, module) group is copied back when backward starts the group after it
        moved = megatron_records(sim.trace, self.megatron_modules)
        actions = [Action.KEEP] * len(sim.costs)
        for i in moved:
            actions[i] = Action.SWAP
        return StrategyPlan(sim, tuple(actions), (), self._group_prefetch(moved))

    def _group_prefetch(self, moved: Sequence[int]) -> tuple[int | None, ...]:
        """Per record, when its copy back may be issued: a group (the records one module of one layer
        saves) when backward first needs a record of the group it runs before; the first group when
        backward begins."""
        sim = self.simulator
        timeline = sim.timeline
        order = timeline.backward_order()
        position = {i: p for p, i in enumerate(order)}
        groups: dict[str, list[int]] = {}
        for i in moved:
            groups.setdefault(module_path(sim.trace.tensors[i].module), []).append(i)
        needed = [g for g in groups.values() if any(timeline.consumed_s[i] is not None for i in g)]
        needed.sort(key=lambda g: min(position[i] for i in g if i in position))
        fetch_after: list[int | None] = [None] * len(sim.costs)
        previous = -1
        for group in needed:
            for i in group:
                fetch_after[i] = previous
            previous = min(position[i] for i in group if i in position)
        return tuple(fetch_after)

    def result(self, name: str) -> PolicyResult:
        """Fixed strategy ``name`` simulated without a budget (its peak is the least budget it meets)."""
        if name not in self._results:
            self._results[name] = self.carry_out(name)
        return self._results[name]

    def carry_out(
        self, name: str, actions: Sequence[Action] | None = None, policy: str | None = None, label: str = "fixed"
    ) -> PolicyResult:
        """Fixed strategy ``name`` simulated on this trace (its regions, prefetch and copies in flight),
        reported as ``policy`` (default ``name``) with plan ``label``.

        ``actions``: per record of the strategy's trace (:attr:`StrategyPlan.simulator`), what to
        carry out instead of the plan's own: the actions it took on another trace of the same
        structure (:func:`cswap.simulate.seqlens.serve_plan`).

        Raises:
            ValueError: as :meth:`plan` raises, or ``actions`` of another length than the trace.
        """
        plan = self.plan(name)
        sim = plan.simulator
        if actions is not None and len(actions) != len(plan.actions):
            raise ValueError(
                f"strategy {name!r} saves {len(plan.actions)} tensors on this trace, but {len(actions)} actions were given"
            )
        params = sim.params if plan.max_inflight_offloads is None else replace(sim.params, max_inflight_offloads=plan.max_inflight_offloads)
        return sim.run_plan(
            plan.actions if actions is None else actions,
            policy=policy or name,
            plan=label,
            params=params,
            fetch_after=plan.fetch_after,
            regions=plan.regions,
        )

    # ------------------------------------------------------------------ under a budget

    def minimum_bytes(self, name: str) -> int:
        """The least budget strategy ``name`` meets on this trace, without planning for any budget: a
        fixed strategy's own peak, the knapsack's peak with everything it may recompute recomputed,
        ``ilp-kro``'s least from its program. ``run(name, b)`` is feasible for every ``b`` at least this.

        Raises:
            ValueError: an unknown strategy, or one that cannot run on this trace.

        Example:
            >>> from cswap.simulate import Simulator
            >>> from cswap.simulate.lmtrace import transformer_trace
            >>> strategies = Strategies(Simulator(transformer_trace("gpt2", seq_len=64, num_layers=2), "h100-pcie5"))
            >>> least = strategies.minimum_bytes("ac-full")
            >>> least == strategies.result("ac-full").peak_bytes, strategies.run("ac-full", least).infeasible
            (True, False)
        """
        reason = self.unavailable(name)
        if reason is not None:
            raise ValueError(f"strategy {name!r} cannot run on this trace: {reason}")
        if name == "recompute-knapsack":
            return self._knapsack_least().peak_bytes
        if name == "ilp-kro":
            return self._kro_problem()[1]
        return self.result(name).peak_bytes

    def run(self, name: str, budget_bytes: int) -> BudgetOutcome:
        """Strategy ``name`` within ``budget_bytes``: its simulated result when its peak fits, else
        infeasible with the least budget it meets.

        Raises:
            ValueError: an unknown strategy, one that cannot run on this trace, or a budget that is
                not positive.
        """
        if budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
        reason = self.unavailable(name)
        if reason is not None:
            raise ValueError(f"strategy {name!r} cannot run on this trace: {reason}")
        key = (name, int(budget_bytes))
        if key not in self._outcomes:
            if name == "recompute-knapsack":
                outcome = self._knapsack(int(budget_bytes))
            elif name == "ilp-kro":
                outcome = self._ilp_kro(int(budget_bytes))
            else:
                result = self.result(name)
                fits = result.peak_bytes <= budget_bytes
                outcome = BudgetOutcome(
                    name, int(budget_bytes), result.peak_bytes, result if fits else None, note=self.plan(name).note
                )
            self._outcomes[key] = outcome
        return self._outcomes[key]

    def _knapsack(self, budget_bytes: int) -> BudgetOutcome:
        """``recompute-knapsack``: the knapsack's capacity is the budget less what cannot be
        recomputed; a plan whose simulated peak passes the budget (a tensor rebuilt in backward
        while others are still held) is planned again to keep less than it did by the excess; after
        16 tries, everything that can be recomputed is."""
        sim = self.simulator
        candidates, counted = self._knapsack_candidates()
        # backward never reads them: dropped for free
        seconds = [0.0 if sim.timeline.consumed_s[i] is None else float(sim.costs[i].recompute_s or 0.0) for i in candidates]
        sizes = [sim.costs[i].nbytes for i in candidates]
        fixed = sum(sim.costs[i].nbytes for i in counted) - sum(sizes)

        def simulate(recomputed: Sequence[bool]) -> PolicyResult:
            return self._knapsack_plan(candidates, recomputed)

        floor = self._knapsack_least()
        if budget_bytes < floor.peak_bytes:
            return BudgetOutcome("recompute-knapsack", budget_bytes, floor.peak_bytes)
        capacity = budget_bytes - fixed
        for _ in range(16):
            chosen = recompute_knapsack(seconds, sizes, capacity, self.time_limit_s)
            if chosen is None:
                break
            result = simulate(chosen)
            if result.peak_bytes <= budget_bytes:
                return BudgetOutcome("recompute-knapsack", budget_bytes, floor.peak_bytes, result)
            # below what this plan keeps, by the excess: the next plan must keep less
            kept = sum(size for size, recomputed in zip(sizes, chosen) if not recomputed)
            capacity = min(capacity, kept) - (result.peak_bytes - budget_bytes)
        return BudgetOutcome("recompute-knapsack", budget_bytes, floor.peak_bytes, floor)

    def _knapsack_candidates(self) -> tuple[list[int], list[int]]:
        """The records the knapsack may drop (every one it may recompute, and those backward never
        reads), and the counted ones."""
        sim = self.simulator
        counted = [i for i, c in enumerate(sim.counted) if c]
        unused = {i for i in counted if sim.timeline.consumed_s[i] is None}
        return [i for i in counted if i in unused or sim.costs[i].recompute_s is not None], counted

    def _knapsack_plan(self, candidates: Sequence[int], recomputed: Sequence[bool]) -> PolicyResult:
        """The knapsack's choice among ``candidates`` simulated: each chosen one recomputed, the rest kept."""
        sim = self.simulator
        actions = [Action.KEEP] * len(sim.costs)
        for i, chosen in zip(candidates, recomputed, strict=True):
            if chosen:
                actions[i] = Action.RECOMPUTE
        return sim.run_plan(actions, policy="recompute-knapsack", plan="knapsack")

    def _knapsack_least(self) -> PolicyResult:
        """Everything the knapsack may drop dropped: its least footprint (simulated once)."""
        if self._knapsack_floor is None:
            candidates, _ = self._knapsack_candidates()
            self._knapsack_floor = self._knapsack_plan(candidates, [True] * len(candidates))
        return self._knapsack_floor

    def _kro_problem(self) -> tuple[PlanningProblem, int]:
        """``ilp-kro``'s problem (keep, recompute and swap offered) and its least budget, built once."""
        if self._kro is None:
            problem, _ = planning_problem(self.simulator, actions=(KEEP, SWAP, RECOMPUTE))
            self._kro = (problem, minimum_bytes(problem, "cswap", self.time_limit_s))
        return self._kro

    def _ilp_kro(self, budget_bytes: int) -> BudgetOutcome:
        """``ilp-kro``: cswap's exact program over a problem that offers only keep, recompute and swap."""
        problem, least = self._kro_problem()
        if budget_bytes < least:
            return BudgetOutcome("ilp-kro", budget_bytes, least)
        try:
            plan = plan_budget(problem, "cswap", budget_bytes, self.time_limit_s)
        except BudgetError as error:  # the solver's tolerance, at the edge: report what it measured
            return BudgetOutcome("ilp-kro", budget_bytes, error.minimum_bytes)
        plan = replace(plan, policy="ilp-kro")
        result = replay_plan(self.simulator, problem, plan, "ilp-kro", f"budget {plan.status}")
        return BudgetOutcome("ilp-kro", budget_bytes, least, result, plan)
