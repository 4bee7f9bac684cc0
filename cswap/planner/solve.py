"""The planner's one verb per question: plan a policy within a budget, or find its least budget.

A policy is planned by the planner of the system it reproduces: ``capuchin`` by Capuchin's own
greedy (:mod:`cswap.planner.capuchin`), every other policy by the exact program over its actions
(:mod:`cswap.planner.milp`: SciPy's ``milp`` with a greedy alongside). A large problem whose layers
repeat (a transformer's) takes the fast path first (:mod:`cswap.planner.fastpath`): the same program
with repeated layers' decisions tied in blocks, which keeps the budget at every event; the exact
program answers when no tied plan fits, or always with ``exact=True``. Under a host budget every
policy but ``capuchin`` is planned by the exact program: the tied blocks do not carry host rows, and
a policy that may also swap raw compresses on the host only where no plan without host compressions
is as fast within both budgets. This module only chooses.

Example:
    >>> from cswap.planner.lifetime import lifetimes_from_orders
    >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
    >>> events = lifetimes_from_orders([0, 1], [1, 0])
    >>> specs = [TensorSpec(key=k, nbytes=1000, lifetime=lt) for k, lt in enumerate(events.lifetimes)]
    >>> problem = build_problem(specs, events, [0.0, 1.0, 2.0, 3.0], 1.5, LinkModel(1e-6, 1e-6, async_copies=False))
    >>> minimum_bytes(problem, "none"), minimum_bytes(problem, "swap")
    (2000, 1000)
    >>> result = plan_budget(problem, "swap", 1500)
    >>> sorted(result.actions.values()), result.peak_bytes <= 1500
    (['keep', 'swap'], True)
"""

from __future__ import annotations

import time

from dataclasses import replace

from cswap.budget import BudgetError
from cswap.planner.actions import HOST_ZVC_SWAP, POLICY_ACTIONS, SWAP
from cswap.planner.capuchin import capuchin_host_minimum_bytes, capuchin_minimum_bytes, plan_capuchin_budget
from cswap.planner.fastpath import least_peak_fast, repeated_layers
from cswap.planner.milp import EXACT_REL_GAP, BudgetPlan, budget_plan_of, host_timeline_of, least_host_peak, least_peak, solve_milp, timeline_of
from cswap.planner.problem import PlanningProblem
from cswap.planner.tied import plan_tied

__all__ = ["PROVING_REL_GAP", "PROVING_TIME_LIMIT_S", "carry_plan", "minimum_bytes", "minimum_host_bytes", "plan_budget"]

#: A time limit per solve for a plan needed now, inside training (a larger size of a profiled graph):
#: HiGHS finds the plan long before it proves it optimal to the gap asked (Llama-3-8B's 876 saved
#: tensors at 1024 tokens, swap at 0.3: the same plan at a 1 s limit, in 2.2 s, as at the default
#: 30 s, in 32 s; BENCHMARKS.md, "Dynamic shapes"). What it found by then stands.
PROVING_TIME_LIMIT_S = 1.0

#: The solver's relative gap for a plan needed now: it stops once its plan's predicted seconds are
#: within 0.5% of the optimum's, where proving the last 0.5% takes as long again. On GPT-2's
#: 98-tensor problems at the sizes dynamic padding brings (BENCHMARKS.md, "Dynamic shapes"), HiGHS
#: took 0.35 s for eight plans against 0.67 s at the exact gap, and seven of the eight were the
#: optimal plan; the eighth predicted 0.4% more. Where the plan runs for long, a profile's plan
#: is proven (:data:`~cswap.planner.milp.EXACT_REL_GAP`).
PROVING_REL_GAP = 5e-3


def minimum_bytes(problem: PlanningProblem, policy: str, time_limit_s: float = 30.0, exact: bool = False,
                  host_budget_bytes: int | None = None) -> int:
    """The least budget ``policy`` can meet on ``problem``; planning at it succeeds.

    ``capuchin``'s is the least its greedy meets (:func:`cswap.planner.capuchin.capuchin_minimum_bytes`);
    every other policy's is the least peak of its actions (:func:`cswap.planner.milp.least_peak`),
    found without the solver where a floor certifies it (:func:`cswap.planner.fastpath.least_peak_fast`;
    ``exact=True``: always by the solver). With ``host_budget_bytes``, the least device budget
    among the plans whose host copies stay within it (by the exact program: the floor knows no host).
    """
    if policy == "capuchin":
        return capuchin_minimum_bytes(problem, time_limit_s, host_budget_bytes)
    if exact or host_budget_bytes is not None:
        return least_peak(problem, policy, time_limit_s, host_budget_bytes)
    return least_peak_fast(problem, policy, time_limit_s)


def _without_host_compression(problem: PlanningProblem, policy: str) -> PlanningProblem | None:
    """``problem`` without its host compressions, for a policy that may swap raw instead (``None``:
    the policy does not).

    A host compression holds the device bytes of a raw swap and never costs less: the CPU's
    compression shares the compute's cores, and a GPU's host decompression precedes the copy back,
    where prefetching may hide it. Where it is hidden, a host compression ties with the raw swap, and
    the solver may take either; its worker threads still spend CPU time that the predicted seconds
    leave out. So a plan that compresses on the host gives way to one without host compressions
    that is as fast within both budgets: host compressions stay where the host budget binds.
    """
    if not {SWAP, HOST_ZVC_SWAP} <= POLICY_ACTIONS.get(policy, frozenset()):
        return None
    tensors = tuple(replace(t, options=tuple(o for o in t.options if o.action != HOST_ZVC_SWAP)) for t in problem.tensors)
    return replace(problem, tensors=tensors)


def minimum_host_bytes(problem: PlanningProblem, policy: str, budget_bytes: int, time_limit_s: float = 30.0) -> int | None:
    """The least host budget ``policy`` can meet on ``problem`` within ``budget_bytes`` on the device
    (``None``: it cannot meet that device budget at all); planning at both succeeds.

    Example:
        >>> from cswap.planner.lifetime import lifetimes_from_orders
        >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
        >>> events = lifetimes_from_orders([0, 1], [1, 0])
        >>> specs = [TensorSpec(key=k, nbytes=1000, lifetime=lt) for k, lt in enumerate(events.lifetimes)]
        >>> problem = build_problem(specs, events, [0.0, 1.0, 2.0, 3.0], 1.5, LinkModel(1e-6, 1e-6, async_copies=False))
        >>> minimum_host_bytes(problem, "swap", 1000), plan_budget(problem, "swap", 1000, host_budget_bytes=1000).host_peak_bytes
        (1000, 1000)
    """
    if policy == "capuchin":
        return capuchin_host_minimum_bytes(problem, budget_bytes, time_limit_s)
    return least_host_peak(problem, policy, budget_bytes, time_limit_s)


def plan_budget(
    problem: PlanningProblem,
    policy: str,
    budget_bytes: int,
    time_limit_s: float = 30.0,
    greedy: bool = True,
    exact: bool = False,
    host_budget_bytes: int | None = None,
    explain: bool = True,
    rel_gap: float = EXACT_REL_GAP,
) -> BudgetPlan:
    """The least-time plan of ``policy`` whose timeline stays within ``budget_bytes`` (and whose host
    copies stay within ``host_budget_bytes``).

    Args:
        problem: every tensor's options.
        policy: a policy with an action set (:data:`cswap.planner.actions.POLICY_ACTIONS`).
        budget_bytes: the budget.
        time_limit_s: the solver's time limit (per solve: the fast path's, then the exact one's).
        greedy: also run the solver's greedy (for its gap, and as the fallback); not for ``capuchin``.
        exact: skip the fast path (to measure its gap to the exact optimum).
        host_budget_bytes: the host memory budget (``None``: none).
        explain: a :class:`~cswap.budget.BudgetError` carries the least budgets (``False``: only
            that no plan fits, for a caller that tries several problems and catches it).
        rel_gap: the solver stops within this relative gap of the optimum (:data:`PROVING_REL_GAP`
            for a plan needed inside training).

    Raises:
        BudgetError: the policy cannot meet the budget; it carries :func:`minimum_bytes` (with a
            host budget also which budget binds and :func:`minimum_host_bytes`).
        ValueError: an unknown policy or a budget that is not positive.
    """
    if policy == "capuchin":
        return plan_capuchin_budget(problem, budget_bytes, time_limit_s, host_budget_bytes, explain)
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
    plan = _plan_budget(problem, policy, budget_bytes, time_limit_s, greedy, exact, host_budget_bytes, explain, rel_gap)
    raw = _without_host_compression(problem, policy) if HOST_ZVC_SWAP in plan.action_counts() else None
    if raw is not None:
        try:
            raw_plan = _plan_budget(raw, policy, budget_bytes, time_limit_s, greedy, exact, host_budget_bytes, False, rel_gap)
        except BudgetError:
            return plan  # the host budget binds: host compressions are wanted
        if raw_plan.predicted_s <= plan.predicted_s * (1.0 + 1e-9):
            return raw_plan
    return plan


def carry_plan(problem: PlanningProblem, policy: str, budget_bytes: int, previous: BudgetPlan,
               host_budget_bytes: int | None = None) -> BudgetPlan | None:
    """``previous`` (a plan of the same graph at smaller sizes) carried to ``problem``'s sizes: each
    tensor takes the option of the same action, wait and prefetch distance it took there (the
    action's cheapest where that one is not offered at these sizes), and the plan stands where
    that holds ``budget_bytes`` (and ``host_budget_bytes``) at every event; ``None`` where it does
    not, or where a tensor of ``problem`` had no decision there or its action is not offered.

    No solver runs: what a larger size of a planned graph costs when the plan still fits. The plan
    is feasible, not proven optimal (status ``carried``).

    Example:
        >>> from cswap.planner.lifetime import lifetimes_from_orders
        >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
        >>> events = lifetimes_from_orders([0, 1], [1, 0])
        >>> def problem(nbytes):
        ...     specs = [TensorSpec(key=k, nbytes=nbytes, lifetime=lt) for k, lt in enumerate(events.lifetimes)]
        ...     return build_problem(specs, events, [0.0, 1.0, 2.0, 3.0], 1.5, LinkModel(1e-6, 1e-6, async_copies=False))
        >>> small = plan_budget(problem(1000), "swap", 1500)
        >>> carried = carry_plan(problem(1200), "swap", 1800, small)
        >>> carried.status, carried.action_counts() == small.action_counts(), carry_plan(problem(1200), "swap", 1100, small)
        ('carried', True, None)
    """
    started = time.perf_counter()
    chosen = {t.key: (t.action, t.wait_offload, t.prefetch_distance) for t in previous.tensors}
    choice = []
    for tensor in problem.tensors:
        wanted = chosen.get(tensor.key)
        if wanted is None:
            return None
        option = next((o for o in tensor.options if (o.action, o.wait_offload, o.prefetch_distance) == wanted), None)
        if option is None:
            # pruned at these sizes, where another option of the action was as cheap in no more
            # memory: the action's cheapest (the budget check below decides)
            option = min((o for o in tensor.options if o.action == wanted[0]), key=lambda o: o.cost_s, default=None)
            if option is None:
                return None
        choice.append(option)
    if timeline_of(problem, choice).max(initial=0) > budget_bytes:
        return None
    if host_budget_bytes is not None and host_timeline_of(problem, choice).max(initial=0) > host_budget_bytes:
        return None
    return budget_plan_of(problem, policy, budget_bytes, choice, status="carried", solve_s=time.perf_counter() - started,
                          host_budget_bytes=host_budget_bytes)


def _plan_budget(problem: PlanningProblem, policy: str, budget_bytes: int, time_limit_s: float, greedy: bool, exact: bool,
                 host_budget_bytes: int | None, explain: bool, rel_gap: float) -> BudgetPlan:
    if host_budget_bytes is not None:
        # The tied fast path has no host rows (its blocks share decisions on the device timeline
        # only), so under a host budget the exact program plans, whatever the problem's size.
        return solve_milp(problem, policy, budget_bytes, time_limit_s, greedy, host_budget_bytes, explain, rel_gap)
    repeats = None if exact else repeated_layers(problem)
    if repeats is not None:
        plan = plan_tied(problem, policy, budget_bytes, repeats, time_limit_s, greedy, rel_gap=rel_gap)
        if plan is not None:
            return plan
        least = minimum_bytes(problem, policy, time_limit_s)
        if budget_bytes < least:
            raise BudgetError(least, policy, budget_bytes)
    return solve_milp(problem, policy, budget_bytes, time_limit_s, greedy, rel_gap=rel_gap)
