"""Every policy under one memory budget: planned by :mod:`cswap.planner`, replayed by the queue model.

:func:`planning_problem` reads a :class:`~cswap.simulate.engine.Simulator`'s trace into the
planner's problem: one event per pack and per first unpack of an offloadable record (times from
the compute timeline), each record's exact ZVC size and codec seconds, the link, and which records
may move (``min_bytes``). :func:`run_budget` plans a policy within the budget and simulates the plan
in the queue model with the budget enforced (:mod:`cswap.simulate.queues`), prefetching as far ahead
as the plan does. ``cswap``'s action set contains every other policy's, so its plan is checked in
the queue model against their plans and the fastest is kept, as without a budget. A host budget
(``host_budget_bytes``) bounds the host copies the plan holds at every event too
(:mod:`cswap.planner.milp`); an outcome that cannot meet both says which binds and the least of each.

Example:
    >>> from cswap.simulate import SimConfig, Simulator, meta_trace
    >>> sim = Simulator(meta_trace("vgg11", 2, 32, width_mult=0.125), "v100-pcie3", SimConfig(min_bytes=0))
    >>> outcomes = run_budgets(sim, ("none", "swap", "cswap"), budget=0.5)
    >>> outcomes["none"].infeasible, outcomes["swap"].result.peak_bytes <= outcomes["swap"].budget_bytes
    (True, True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from cswap.budget import BudgetError, HostBudget, MemoryBudget, parse_budget, parse_host_budget
from cswap.planner.actions import ACTIONS, carried_out
from cswap.planner.lifetime import lifetimes_from_orders
from cswap.planner import (
    DEFAULT_PREFETCH_DISTANCES,
    POLICY_ACTIONS,
    BudgetPlan,
    LinkModel,
    PlanningProblem,
    TensorSpec,
    build_problem,
    minimum_bytes,
    plan_budget,
)
from cswap.simulate.engine import PolicyResult, Simulator
from cswap.simulate.policies import Action, on_host_if_shrinks
from cswap.simulate.timeline import hidden_windows

__all__ = ["BudgetOutcome", "budget_policies", "none_peak_bytes", "planning_problem", "replay_plan", "run_budget", "run_budgets"]


@dataclass(frozen=True)
class BudgetOutcome:
    """One policy under a budget: a simulated plan, or the least budget it could meet.

    Attributes:
        policy: the policy (or strategy: :mod:`cswap.simulate.strategies`).
        budget_bytes: the budget.
        minimum_bytes: the least budget the policy can meet.
        result: the queue model's result of the plan (``None`` when infeasible).
        plan: the planner's plan (``None`` when infeasible, and for a strategy the planner did not plan).
        note: what the figures rest on, where a reader needs to know (a strategy's).
        host_budget_bytes: the host memory budget (``None``: none).
        host_minimum_bytes: when infeasible under a host budget, the least host budget the policy
            meets within the device budget (``None``: none does, or no host budget).
        binding: when infeasible under a host budget, ``"device"`` or ``"host"``: the budget that binds.
    """

    policy: str
    budget_bytes: int
    minimum_bytes: int
    result: PolicyResult | None = None
    plan: BudgetPlan | None = None
    note: str = ""
    host_budget_bytes: int | None = None
    host_minimum_bytes: int | None = None
    binding: str = ""

    @property
    def infeasible(self) -> bool:
        """The policy cannot meet the budget."""
        return self.result is None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the result's figures plus the plan's (when the planner made it), or
        ``infeasible`` with ``minimum_bytes``; and the ``note``, when there is one."""
        noted: dict[str, Any] = {"note": self.note} if self.note else {}
        if self.host_budget_bytes is not None:
            noted["host_budget_bytes"] = self.host_budget_bytes
        if self.result is None:
            if self.host_budget_bytes is not None:
                noted.update({"host_minimum_bytes": self.host_minimum_bytes, "binding": self.binding})
            return {"infeasible": True, "minimum_bytes": self.minimum_bytes, **noted}
        row = self.result.to_dict()
        row.update({"infeasible": False, "minimum_bytes": self.minimum_bytes, **noted})
        if self.plan is None:
            return row
        if self.host_budget_bytes is not None:
            row["planned_host_peak_bytes"] = self.plan.host_peak_bytes
        row.update(
            {
                "predicted_s": self.plan.predicted_s,
                "planned_peak_bytes": self.plan.peak_bytes,
                "binding_event": self.plan.binding_event,
                "slack_bytes": self.plan.slack_bytes,
                "solver_status": self.plan.status,
                "solve_s": self.plan.solve_s,
                "greedy_gap_s": self.plan.greedy_gap_s,
                "prefetch_window_bytes": self.plan.prefetch_window_bytes,
            }
        )
        return row


def budget_policies() -> tuple[str, ...]:
    """The policies that can be planned under a budget."""
    return tuple(POLICY_ACTIONS)


def planning_problem(
    simulator: Simulator,
    prefetch_distances: Sequence[int] = DEFAULT_PREFETCH_DISTANCES,
    actions: Sequence[str] = ACTIONS,
) -> tuple[PlanningProblem, tuple[int, ...]]:
    """The planner's problem for ``simulator``'s trace, and the record index of each of its tensors.

    ``actions``: the actions to offer options for (all of them by default).
    """
    timeline, costs = simulator.timeline, simulator.costs
    records = tuple(i for i, counted in enumerate(simulator.counted) if counted)
    forward = sorted(records, key=lambda i: (timeline.produced_s[i], i))
    backward = sorted((i for i in records if timeline.consumed_s[i] is not None), key=timeline.backward_key)
    pack_rank = {i: r for r, i in enumerate(forward)}
    unpack_rank = {i: r for r, i in enumerate(backward)}
    events = lifetimes_from_orders([pack_rank[i] for i in records], [unpack_rank.get(i) for i in records])
    times = [timeline.produced_s[i] for i in forward] + [timeline.forward_s + timeline.consumed_s[i] for i in backward]
    hidden_f, _ = hidden_windows(timeline, simulator.moved, 1)
    movable = set(simulator.moved)
    specs = []
    for position, i in enumerate(records):
        cost = costs[i]
        used = timeline.consumed_s[i] is not None
        specs.append(
            TensorSpec(
                key=i,
                nbytes=cost.nbytes,
                lifetime=events.lifetimes[position],
                compressed_nbytes=math.ceil(cost.compressed_nbytes) if cost.compressible else None,
                compress_s=cost.compress_s,
                decompress_s=cost.decompress_s if used else 0.0,
                hidden_forward_s=hidden_f.get(i, 0.0),
                movable=i in movable,
                recompute_s=cost.recompute_s if i in movable else None,
                storage_nbytes=cost.storage_nbytes,
            )
        )
    link = simulator.hardware.link
    model = LinkModel(d2h_gbps=link.d2h_gbps, h2d_gbps=link.h2d_gbps, async_copies=link.async_copies)
    # a kept view of a kept storage is held once, as the queue model and the runtime hold it
    views = {i: simulator.views[i] for i in records if simulator.views[i] is not None}
    problem = build_problem(specs, events, times, timeline.forward_s, model, prefetch_distances, actions, views)
    return problem, records


def none_peak_bytes(problem: PlanningProblem) -> int:
    """Policy ``none``'s activation peak: every tensor kept."""
    return minimum_bytes(problem, "none")


def replay_plan(
    simulator: Simulator,
    problem: PlanningProblem,
    plan: BudgetPlan,
    policy: str,
    label: str,
    actions: Sequence[Action] | None = None,
) -> PolicyResult:
    """The queue model's result of a planner's ``plan`` for ``problem`` (of ``simulator``'s trace),
    with its budget enforced and its prefetch schedule, reported as ``policy`` with plan ``label``.

    ``actions``: per record, what to carry out instead of what ``plan`` gives on this trace: the
    actions a plan made on another trace of the same structure was carried out with there (its
    prefetch distances and budget hold as planned; :func:`cswap.simulate.seqlens.serve_plan`).
    """
    order = simulator.timeline.backward_order()
    position = {i: p for p, i in enumerate(order)}
    unpacked = [i for i in order if simulator.counted[i]]  # the record of each backward event
    if actions is not None and len(actions) != len(simulator.costs):
        raise ValueError(f"need one action per trace record: {len(simulator.costs)} records, {len(actions)} actions")
    carried = [Action.KEEP] * len(simulator.costs) if actions is None else [Action(a) for a in actions]
    fetch_after: list[int | None] = [None] * len(simulator.costs)
    for options, tensor in zip(problem.tensors, plan.tensors, strict=True):
        if actions is None:  # cpu-compress-swap's swaps compress on the host, where that shrinks them
            carried[tensor.key] = on_host_if_shrinks(Action(carried_out(policy, tensor.action)), simulator.costs[tensor.key])
        lifetime = options.lifetime
        if not tensor.prefetch_distance or lifetime is None or lifetime.unpack is None:
            continue
        fetch = max(lifetime.unpack - tensor.prefetch_distance, problem.forward_events)
        fetch_after[tensor.key] = -1 if fetch == problem.forward_events else position[unpacked[fetch - problem.forward_events]]
    params = replace(simulator.params, budget_bytes=plan.budget_bytes)
    return simulator.run_plan(carried, policy=policy, plan=label, params=params, fetch_after=fetch_after)


def run_budget(
    simulator: Simulator,
    policy: str,
    budget_bytes: int,
    problem: PlanningProblem | None = None,
    time_limit_s: float = 30.0,
    minimums: dict[str, int] | None = None,
    plans: dict[str, BudgetPlan] | None = None,
    host_budget_bytes: int | None = None,
) -> BudgetOutcome:
    """Plan ``policy`` within ``budget_bytes`` and simulate the plan (see the module docstring).

    Args:
        simulator: the trace and profile.
        policy: a policy with an action set.
        budget_bytes: the budget.
        problem: :func:`planning_problem` of ``simulator``, when the caller has it already.
        time_limit_s: the solver's time limit per solve.
        minimums, plans: caches shared between calls on the same problem and budget: each
            policy's least budget, and the plans made so far (``cswap`` checks against them).
        host_budget_bytes: the host memory budget (``None``: none); an infeasible outcome then
            carries the binding budget and the least host budget.
    """
    problem = problem or planning_problem(simulator)[0]
    minimums = {} if minimums is None else minimums
    plans = {} if plans is None else plans

    def least(name: str) -> int:
        if name not in minimums:
            minimums[name] = minimum_bytes(problem, name, time_limit_s, host_budget_bytes=host_budget_bytes)
        return minimums[name]

    def planned(name: str) -> BudgetPlan:
        if name not in plans:
            plans[name] = plan_budget(problem, name, budget_bytes, time_limit_s, host_budget_bytes=host_budget_bytes)
        return plans[name]

    if host_budget_bytes is not None:
        try:
            planned(policy)
        except BudgetError as error:  # it names the budget that binds, with the least of each
            return BudgetOutcome(policy, budget_bytes, error.minimum_bytes, host_budget_bytes=host_budget_bytes,
                                 host_minimum_bytes=error.host_minimum_bytes, binding=error.binding)
    if budget_bytes < least(policy):
        return BudgetOutcome(policy, budget_bytes, least(policy))
    try:
        plan = planned(policy)
    except BudgetError as error:  # the solver's tolerance, at the edge: report what it measured
        return BudgetOutcome(policy, budget_bytes, error.minimum_bytes)
    best = replay_plan(simulator, problem, plan, policy, f"budget {plan.status}")
    host = {"host_budget_bytes": host_budget_bytes}
    best_plan = plan
    if policy == "cswap":
        for other in POLICY_ACTIONS:
            if other == policy or budget_bytes < least(other):
                continue
            try:
                candidate = planned(other)
            except BudgetError:  # capuchin's greedy may miss a budget its actions could meet
                continue
            result = replay_plan(simulator, problem, candidate, policy, f"budget {other} plan")
            if result.iteration_s < best.iteration_s:
                best, best_plan = result, candidate
    return BudgetOutcome(policy, budget_bytes, least(policy), best, best_plan, **host)


def run_budgets(
    simulator: Simulator,
    policies: Sequence[str],
    budget: MemoryBudget | int | float | str,
    time_limit_s: float = 30.0,
    problem: PlanningProblem | None = None,
    host_budget: HostBudget | int | str | None = None,
) -> dict[str, BudgetOutcome]:
    """Every policy in ``policies`` under the same ``budget`` (any form :func:`cswap.budget.parse_budget` reads).

    ``problem``: :func:`planning_problem` of ``simulator``, when the caller has it already.
    ``host_budget``: a host memory budget (any form :func:`cswap.budget.parse_host_budget` reads).

    Example:
        >>> from cswap.simulate import SimConfig, Simulator, meta_trace
        >>> sim = Simulator(meta_trace("vgg11", 2, 32, width_mult=0.125), "v100-pcie3", SimConfig(min_bytes=0))
        >>> free = run_budgets(sim, ("swap",), budget=0.5)["swap"].plan.host_peak_bytes
        >>> held = run_budgets(sim, ("swap",), budget=0.5, host_budget=free // 2)["swap"]
        >>> held.infeasible, held.binding, held.host_minimum_bytes <= free
        (True, 'host', True)

    Raises:
        ValueError: a bad budget, or a policy without an action set (naming those with one).
    """
    parsed = parse_budget(budget)
    if parsed is None:
        raise ValueError("run_budgets needs a memory budget, got None")
    unknown = [p for p in policies if p not in POLICY_ACTIONS]
    if unknown:
        raise ValueError(f"policies {unknown} cannot be planned under a memory budget: choose from {', '.join(POLICY_ACTIONS)}")
    problem = problem or planning_problem(simulator)[0]
    minimums: dict[str, int] = {"none": none_peak_bytes(problem)}
    budget_bytes = parsed.resolve(minimums["none"])
    plans: dict[str, BudgetPlan] = {}
    # cswap last: it checks its plan against the others' in the queue model
    ordered = sorted(policies, key=lambda p: p == "cswap")
    host = parse_host_budget(host_budget)
    host_bytes = None if host is None else host.resolve()
    if host_bytes is not None:
        minimums = {}  # least budgets within the host budget: none's is its peak all the same
    outcomes = {p: run_budget(simulator, p, budget_bytes, problem, time_limit_s, minimums, plans, host_bytes) for p in ordered}
    return {policy: outcomes[policy] for policy in policies}
