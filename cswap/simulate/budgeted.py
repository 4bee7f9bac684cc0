"""Every policy under one memory budget: planned by :mod:`cswap.planner`, replayed by the queue model.

:func:`planning_problem` reads a :class:`~cswap.simulate.engine.Simulator`'s trace into the
planner's problem: one event per pack and per first unpack of an offloadable record (times from
the compute timeline), each record's exact ZVC size and codec seconds, the link, and which records
may move (``min_bytes``). :func:`run_budget` plans a policy within the budget and simulates the plan
in the queue model with the budget enforced (:mod:`cswap.simulate.queues`), prefetching as far ahead
as the plan does. ``cswap``'s action set contains every other policy's, so its plan is checked in
the queue model against their plans and the fastest is kept, as without a budget.

Example:
    >>> from cswap.simulate import Simulator, meta_trace
    >>> sim = Simulator(meta_trace("vgg11", 2, 32, width_mult=0.125), "v100-pcie3")
    >>> outcomes = run_budgets(sim, ("none", "swap", "cswap"), budget=0.5)
    >>> outcomes["none"].infeasible, outcomes["swap"].result.peak_bytes <= outcomes["swap"].budget_bytes
    (True, True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from cswap.budget import BudgetError, MemoryBudget, parse_budget
from cswap.lifetime import lifetimes_from_orders
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
from cswap.simulate.policies import Action
from cswap.simulate.timeline import hidden_windows

__all__ = ["BudgetOutcome", "budget_policies", "none_peak_bytes", "planning_problem", "run_budget", "run_budgets"]


@dataclass(frozen=True)
class BudgetOutcome:
    """One policy under a budget: a simulated plan, or the least budget it could meet.

    Attributes:
        policy: the policy.
        budget_bytes: the budget.
        minimum_bytes: the least budget the policy can meet.
        result: the queue model's result of the plan (``None`` when infeasible).
        plan: the planner's plan (``None`` when infeasible).
    """

    policy: str
    budget_bytes: int
    minimum_bytes: int
    result: PolicyResult | None = None
    plan: BudgetPlan | None = None

    @property
    def infeasible(self) -> bool:
        """The policy cannot meet the budget."""
        return self.result is None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the result's figures plus the plan's, or ``infeasible`` with ``minimum_bytes``."""
        if self.result is None or self.plan is None:
            return {"infeasible": True, "minimum_bytes": self.minimum_bytes}
        row = self.result.to_dict()
        row.update(
            {
                "infeasible": False,
                "minimum_bytes": self.minimum_bytes,
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


def planning_problem(simulator: Simulator, prefetch_distances: Sequence[int] = DEFAULT_PREFETCH_DISTANCES) -> tuple[PlanningProblem, tuple[int, ...]]:
    """The planner's problem for ``simulator``'s trace, and the record index of each of its tensors."""
    timeline, costs = simulator.timeline, simulator.costs
    records = tuple(i for i, counted in enumerate(simulator.counted) if counted)
    forward = sorted(records, key=lambda i: (timeline.produced_s[i], i))
    backward = sorted((i for i in records if timeline.consumed_s[i] is not None), key=lambda i: (timeline.consumed_s[i], i))
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
                compressed_nbytes=int(math.ceil(cost.compressed_nbytes)) if cost.compressible else None,
                compress_s=cost.compress_s,
                decompress_s=cost.decompress_s if used else 0.0,
                hidden_forward_s=hidden_f.get(i, 0.0),
                movable=i in movable,
            )
        )
    link = simulator.hardware.link
    model = LinkModel(d2h_gbps=link.d2h_gbps, h2d_gbps=link.h2d_gbps, async_copies=link.async_copies)
    problem = build_problem(specs, events, times, timeline.forward_s, model, prefetch_distances)
    return problem, records


def none_peak_bytes(problem: PlanningProblem) -> int:
    """Policy ``none``'s activation peak: every tensor kept."""
    return minimum_bytes(problem, "none")


def _simulate_plan(simulator: Simulator, problem: PlanningProblem, plan: BudgetPlan, policy: str, label: str) -> PolicyResult:
    order = simulator.timeline.backward_order()
    position = {i: p for p, i in enumerate(order)}
    unpacked = [i for i in order if simulator.counted[i]]  # the record of each backward event
    actions = [Action.KEEP] * len(simulator.costs)
    fetch_after: list[int | None] = [None] * len(simulator.costs)
    for options, tensor in zip(problem.tensors, plan.tensors):
        actions[tensor.key] = Action(tensor.action)
        lifetime = options.lifetime
        if not tensor.prefetch_distance or lifetime is None or lifetime.unpack is None:
            continue
        fetch = max(lifetime.unpack - tensor.prefetch_distance, problem.forward_events)
        fetch_after[tensor.key] = -1 if fetch == problem.forward_events else position[unpacked[fetch - problem.forward_events]]
    params = replace(simulator.params, budget_bytes=plan.budget_bytes)
    return simulator.run_plan(actions, policy=policy, plan=label, params=params, fetch_after=fetch_after)


def run_budget(
    simulator: Simulator,
    policy: str,
    budget_bytes: int,
    problem: PlanningProblem | None = None,
    time_limit_s: float = 30.0,
) -> BudgetOutcome:
    """Plan ``policy`` within ``budget_bytes`` and simulate the plan (see the module docstring)."""
    problem = problem or planning_problem(simulator)[0]
    least = minimum_bytes(problem, policy, time_limit_s)
    if budget_bytes < least:
        return BudgetOutcome(policy, budget_bytes, least)
    try:
        plan = plan_budget(problem, policy, budget_bytes, time_limit_s)
    except BudgetError as error:  # the solver's tolerance, at the edge: report what it measured
        return BudgetOutcome(policy, budget_bytes, error.minimum_bytes)
    best = _simulate_plan(simulator, problem, plan, policy, f"budget {plan.status}")
    best_plan = plan
    if policy == "cswap":
        for other in ("none", "swap", "compress-swap", "compress-keep"):
            if budget_bytes < minimum_bytes(problem, other, time_limit_s):
                continue
            candidate = plan_budget(problem, other, budget_bytes, time_limit_s, greedy=False)
            result = _simulate_plan(simulator, problem, candidate, policy, f"budget {other} plan")
            if result.iteration_s < best.iteration_s:
                best, best_plan = result, candidate
    return BudgetOutcome(policy, budget_bytes, least, best, best_plan)


def run_budgets(
    simulator: Simulator,
    policies: Sequence[str],
    budget: MemoryBudget | int | float | str,
    time_limit_s: float = 30.0,
) -> dict[str, BudgetOutcome]:
    """Every policy in ``policies`` under the same ``budget`` (any form :func:`cswap.budget.parse_budget` reads).

    Raises:
        ValueError: a bad budget, or a policy without an action set (naming those with one).
    """
    parsed = parse_budget(budget)
    if parsed is None:
        raise ValueError("run_budgets needs a memory budget, got None")
    unknown = [p for p in policies if p not in POLICY_ACTIONS]
    if unknown:
        raise ValueError(f"policies {unknown} cannot be planned under a memory budget: choose from {', '.join(POLICY_ACTIONS)}")
    problem, _ = planning_problem(simulator)
    budget_bytes = parsed.resolve(none_peak_bytes(problem))
    return {policy: run_budget(simulator, policy, budget_bytes, problem, time_limit_s) for policy in policies}
