"""Policies and strategies side by side under one memory budget; ``cswap`` takes the fastest feasible plan.

:func:`run_side_by_side` plans every named policy under the budget (:func:`cswap.simulate.budgeted.run_budgets`)
and runs every named strategy (:class:`cswap.simulate.strategies.Strategies`) within it. ``cswap``
may use every action (keep, swap, zvc-swap, zvc-keep, recompute), and every strategy's plan is made
of them: a swap is a swap, a checkpointed layer is a recompute region of one module call, which
cswap's runtime recomputes as such (:mod:`cswap.planner.regions`), and a recomputed attention core
or knapsack choice is recompute per tensor, as cswap's planner prices it. So every strategy that
can run on the trace is a candidate for ``cswap``, named or not: where one fits the budget and
simulates faster than cswap's own plan, cswap takes it (its ``plan`` then says ``"<strategy> plan"``),
and the least budget cswap meets is the least of its own and theirs.

What the runtime can carry out is narrower than what the simulator prices: it recomputes module
calls only (:mod:`cswap.planner.regions`), so a checkpointed layer it runs as the strategy does,
but a tensor recomputed on its own (cswap's own planner's choice, the knapsack's, ``ilp-kro``'s)
only where a module call produces it, and not the eager attention core, which Hugging Face computes
in a function rather than a module. The simulator prices all of them as cswap's planner does.

Example:
    >>> from cswap.simulate import Simulator
    >>> from cswap.simulate.lmtrace import transformer_trace
    >>> sim = Simulator(transformer_trace("gpt2", seq_len=128, num_layers=2, attention="eager"), "h100-pcie5")
    >>> outcomes = run_side_by_side(sim, ("swap", "ac-full", "cswap"), budget=0.5)
    >>> feasible = [o for o in outcomes.values() if not o.infeasible]
    >>> all(outcomes["cswap"].result.iteration_s <= o.result.iteration_s for o in feasible)
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from cswap.budget import HostBudget, MemoryBudget, parse_budget, parse_host_budget
from cswap.planner import PlanningProblem
from cswap.simulate.budgeted import BudgetOutcome, budget_policies, none_peak_bytes, planning_problem, run_budgets
from cswap.simulate.engine import Simulator
from cswap.simulate.strategies import STRATEGIES, Strategies

__all__ = ["comparable_names", "run_side_by_side"]


def comparable_names() -> tuple[str, ...]:
    """Every policy that can be planned under a budget, then every strategy.

    Example:
        >>> comparable_names()[-2:]
        ('recompute-knapsack', 'ilp-kro')
    """
    return (*budget_policies(), *STRATEGIES)


def run_side_by_side(
    simulator: Simulator,
    names: Sequence[str],
    budget: MemoryBudget | int | float | str,
    time_limit_s: float = 30.0,
    problem: PlanningProblem | None = None,
    strategies: Strategies | None = None,
    host_budget: HostBudget | int | str | None = None,
) -> dict[str, BudgetOutcome]:
    """Every policy and strategy in ``names`` under ``budget`` (any form :func:`cswap.budget.parse_budget`
    reads; a fraction is of policy ``none``'s activation peak), in the order given.

    Args:
        simulator: the trace and hardware.
        names: policies (:func:`cswap.simulate.budgeted.budget_policies`) and strategies
            (:data:`cswap.simulate.strategies.STRATEGIES`).
        budget: the budget.
        time_limit_s: the solvers' time limit per solve.
        problem: :func:`cswap.simulate.budgeted.planning_problem` of ``simulator``, when the caller has it.
        strategies: the strategies on ``simulator``, when the caller has them (they keep their
            plans between budgets).
        host_budget: a host memory budget (:func:`cswap.budget.parse_host_budget`): the policies'
            plans hold it too; the strategies plan no host budget, so none may be named with one,
            and ``cswap`` takes no strategy's plan under one.

    Raises:
        ValueError: a bad budget, an unknown name (naming the known ones), or a strategy that
            cannot run on the trace (saying why).
    """
    parsed = parse_budget(budget)
    if parsed is None:
        raise ValueError("run_side_by_side needs a memory budget, got None")
    known = comparable_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown policies or strategies {unknown}: choose from {', '.join(known)}")
    strategies = strategies or Strategies(simulator, time_limit_s)
    host = parse_host_budget(host_budget)
    if host is not None and any(name in STRATEGIES for name in names):
        raise ValueError(f"strategies {[n for n in names if n in STRATEGIES]} plan no host memory budget: leave them out "
                         "under a host budget, or drop the host budget")
    for name in names:
        if name in STRATEGIES and strategies.unavailable(name) is not None:
            raise ValueError(f"strategy {name!r} cannot run on this trace: {strategies.unavailable(name)}")
    problem = problem or planning_problem(simulator)[0]
    budget_bytes = parsed.resolve(none_peak_bytes(problem))
    policies = [n for n in names if n not in STRATEGIES]
    outcomes = dict(run_budgets(simulator, policies, budget_bytes, time_limit_s, problem=problem, host_budget=host)) if policies else {}
    for name in names:
        if name in STRATEGIES:
            outcomes[name] = strategies.run(name, budget_bytes)
    if "cswap" in outcomes and host is None:
        outcomes["cswap"] = _fastest_for_cswap(outcomes["cswap"], strategies, budget_bytes)
    return {name: outcomes[name] for name in names}


def _fastest_for_cswap(own: BudgetOutcome, strategies: Strategies, budget_bytes: int) -> BudgetOutcome:
    """``cswap``'s outcome, or a strategy's plan where it fits and simulates faster (module docstring)."""
    best = own
    least = own.minimum_bytes
    for name in strategies.available():
        other = strategies.run(name, budget_bytes)
        least = min(least, other.minimum_bytes)
        if other.result is not None and (best.result is None or other.result.iteration_s < best.result.iteration_s):
            best = other
    if best is own:
        return replace(own, minimum_bytes=least)
    assert best.result is not None
    return BudgetOutcome(
        "cswap",
        budget_bytes,
        least,
        replace(best.result, policy="cswap", plan=f"{best.policy} plan"),
        best.plan,
        note=best.note,
    )
