"""Policy ``capuchin`` under a budget: Capuchin's own greedy on the planner's options, not the solver.

Capuchin (Peng et al., ASPLOS'20) does not solve a program: it evicts tensors, hidden swaps first,
then by memory saving per second of overhead, until the bytes it must save (the peak of keeping
everything minus the budget) are saved (:func:`cswap.capuchin.plan_capuchin`). Here each tensor is
a candidate with its cheapest ``swap`` option (its exposed seconds) and its ``recompute`` option (a
region of its own: per-tensor recompute, as the planner models it). The greedy counts bytes, not
when they are held, so the plan's timeline is then checked against the budget; while it passes, the
overflow is added to the bytes to save and the greedy runs again (Capuchin's measured feedback),
a bounded number of times. A plan still over the budget raises :class:`cswap.budget.BudgetError`
carrying :func:`capuchin_minimum_bytes`: the least budget the greedy meets (found by bisection
between the least peak of its actions and the peak of keeping everything), so planning at it
succeeds.

Example:
    >>> from cswap.lifetime import lifetimes_from_orders
    >>> from cswap.planner.options import LinkModel, TensorSpec, build_problem
    >>> events = lifetimes_from_orders([0, 1, 2], [2, 1, 0])
    >>> specs = [TensorSpec(key=k, nbytes=1000, lifetime=lt, recompute_s=0.5) for k, lt in enumerate(events.lifetimes)]
    >>> problem = build_problem(specs, events, [0, 1, 2, 3, 4, 5], 2.5, LinkModel(1e-6, 1e-6, async_copies=False))
    >>> plan = plan_capuchin_budget(problem, 2000)
    >>> dict(plan.actions), plan.peak_bytes, plan.status
    ({0: 'recompute', 1: 'keep', 2: 'keep'}, 2000, 'capuchin')
"""

from __future__ import annotations

import time

from cswap.budget import BudgetError
from cswap.capuchin import Candidate, plan_capuchin
from cswap.planner.actions import KEEP, RECOMPUTE, SWAP
from cswap.planner.options import Option, PlanningProblem, TensorOptions
from cswap.planner.solve import BudgetPlan, _budget_plan, _least_peak

__all__ = ["CAPUCHIN_ROUNDS", "capuchin_minimum_bytes", "plan_capuchin_budget"]

#: How many times the greedy is rerun with the measured overflow added to the bytes to save.
CAPUCHIN_ROUNDS = 16


def _cheapest(tensor: TensorOptions, action: str, problem: PlanningProblem) -> Option | None:
    mine = [o for o in tensor.options if o.action == action]
    return min(mine, key=lambda o: (o.cost_s, int(problem.holds(o).sum()))) if mine else None


def plan_capuchin_budget(problem: PlanningProblem, budget_bytes: int, time_limit_s: float = 30.0) -> BudgetPlan:
    """Capuchin's plan of ``problem`` within ``budget_bytes`` (see the module docstring).

    Raises:
        BudgetError: no plan the greedy finds fits; it carries :func:`capuchin_minimum_bytes`.
        ValueError: a budget that is not positive.
    """
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
    plan = _greedy_plan(problem, int(budget_bytes))
    if plan is None:
        raise BudgetError(capuchin_minimum_bytes(problem, time_limit_s), "capuchin", int(budget_bytes))
    return plan


def capuchin_minimum_bytes(problem: PlanningProblem, time_limit_s: float = 30.0) -> int:
    """The least budget Capuchin's greedy meets on ``problem`` (bisection; the greedy meets the answer).

    Example:
        >>> from cswap.lifetime import lifetimes_from_orders
        >>> from cswap.planner.options import LinkModel, TensorSpec, build_problem
        >>> events = lifetimes_from_orders([0, 1, 2], [2, 1, 0])
        >>> specs = [TensorSpec(key=k, nbytes=1000, lifetime=lt, recompute_s=0.5) for k, lt in enumerate(events.lifetimes)]
        >>> capuchin_minimum_bytes(build_problem(specs, events, [0, 1, 2, 3, 4, 5], 2.5, LinkModel(1e-6, 1e-6, async_copies=False)))
        2000
    """
    low = _least_peak(problem, "capuchin", time_limit_s)
    keeps = [_cheapest(t, KEEP, problem) for t in problem.tensors]
    high = max(int(sum(problem.holds(o) for o in keeps if o is not None).max(initial=0)) if keeps else 0, 1)
    if low >= high or _greedy_plan(problem, max(low, 1)) is not None:
        return max(min(low, high), 1)
    while high - low > 1:  # the greedy fails at ``low`` and meets ``high``
        middle = (low + high) // 2
        if _greedy_plan(problem, middle) is None:
            low = middle
        else:
            high = middle
    return high


def _greedy_plan(problem: PlanningProblem, budget_bytes: int) -> BudgetPlan | None:
    started = time.perf_counter()
    keeps = [_cheapest(t, KEEP, problem) for t in problem.tensors]
    swaps = [_cheapest(t, SWAP, problem) for t in problem.tensors]
    recomputes = [_cheapest(t, RECOMPUTE, problem) for t in problem.tensors]
    candidates = [
        Candidate(
            key=position,
            nbytes=tensor.nbytes,
            swap_s=None if swap is None else swap.cost_s,
            region=None if recompute is None else f"tensor {tensor.key}",
            recompute_s=0.0 if recompute is None else recompute.cost_s,
        )
        for position, (tensor, swap, recompute) in enumerate(zip(problem.tensors, swaps, recomputes, strict=True))
        if swap is not None or recompute is not None
    ]
    kept_peak = int(sum(problem.holds(o) for o in keeps if o is not None).max(initial=0)) if keeps else 0
    to_save = max(kept_peak - int(budget_bytes), 0)
    for _ in range(CAPUCHIN_ROUNDS):
        try:
            chosen = plan_capuchin(candidates, to_save)
        except ValueError:
            break
        choice = []
        for position, keep in enumerate(keeps):
            action = chosen.actions.get(position, KEEP)
            option = {KEEP: keep, SWAP: swaps[position], RECOMPUTE: recomputes[position]}[action]
            assert option is not None  # the greedy only picks what a candidate offers
            choice.append(option)
        plan = _budget_plan(problem, "capuchin", budget_bytes, choice, status="capuchin", solve_s=time.perf_counter() - started)
        if plan.peak_bytes <= budget_bytes:
            return plan
        to_save += plan.peak_bytes - int(budget_bytes)
    return None
