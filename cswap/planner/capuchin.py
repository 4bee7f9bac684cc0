"""Capuchin (Peng et al., ASPLOS'20): swap or recompute per tensor, greedily, within a budget.

Capuchin prefers swapping, since a transfer can overlap compute while a recomputation always costs
its time: it first takes the tensors whose swap is fully hidden (no exposed transfer time). When
those do not save enough, it weighs each remaining option by its memory saving per second of
overhead (the paper's MSPS): a swap saves the tensor's bytes for its exposed transfer seconds; a
recomputation saves the bytes of its region's tensors not already chosen for the region's forward
seconds (one re-run rebuilds them all). It takes the best option, updates the others (a region
whose tensors were partly swapped saves less by recomputing) and stops as soon as enough is saved.

Policy ``capuchin`` under a budget runs that greedy (:func:`plan_capuchin`) on the planner's
options, not the solver (:func:`plan_capuchin_budget`): it evicts until the bytes it must save (the
peak of keeping everything minus the budget) are saved. Here each tensor is a candidate with its cheapest ``swap`` option (its exposed seconds) and its ``recompute`` option (a
region of its own: per-tensor recompute, as the planner models it). The greedy counts bytes, not
when they are held, so the plan's timeline is then checked against the budget; while it passes, the
overflow is added to the bytes to save and the greedy runs again (Capuchin's measured feedback),
a bounded number of times. A plan still over the budget raises :class:`cswap.budget.BudgetError`
carrying :func:`capuchin_minimum_bytes`: the least budget the greedy meets (found by bisection
between the least peak of its actions and the peak of keeping everything), so planning at it
succeeds.

Under a host budget the greedy is the same (Capuchin knows no host limit): its plan must also keep
its host copies within the budget, or :class:`~cswap.budget.BudgetError` names the budget that
binds, with the least device budget whose greedy plan fits the host budget and the host peak of the
greedy's plan at the device budget (:func:`capuchin_host_minimum_bytes`).

Example:
    >>> plan = plan_capuchin([
    ...     Candidate(key=0, nbytes=400, swap_s=0.0),
    ...     Candidate(key=1, nbytes=300, swap_s=0.03, region="relu", recompute_s=0.001),
    ...     Candidate(key=2, nbytes=500, swap_s=0.05),
    ... ], bytes_to_save=600)
    >>> dict(plan.actions), plan.saved_bytes, round(plan.overhead_s, 6)
    ({0: 'swap', 1: 'recompute'}, 700, 0.001)

    >>> from cswap.planner.lifetime import lifetimes_from_orders
    >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
    >>> events = lifetimes_from_orders([0, 1, 2], [2, 1, 0])
    >>> specs = [TensorSpec(key=k, nbytes=1000, lifetime=lt, recompute_s=0.5) for k, lt in enumerate(events.lifetimes)]
    >>> problem = build_problem(specs, events, [0, 1, 2, 3, 4, 5], 2.5, LinkModel(1e-6, 1e-6, async_copies=False))
    >>> plan = plan_capuchin_budget(problem, 2000)
    >>> dict(plan.actions), plan.peak_bytes, plan.status
    ({0: 'recompute', 1: 'keep', 2: 'keep'}, 2000, 'capuchin')
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from cswap.budget import BudgetError
from cswap.planner.actions import KEEP, RECOMPUTE, SWAP
from cswap.planner.fastpath import least_peak_fast
from cswap.planner.milp import BudgetPlan, budget_plan_of
from cswap.planner.problem import Option, PlanningProblem, TensorOptions

__all__ = [
    "CAPUCHIN_ROUNDS",
    "Candidate",
    "CapuchinPlan",
    "capuchin_host_minimum_bytes",
    "capuchin_minimum_bytes",
    "plan_capuchin",
    "plan_capuchin_budget",
]


@dataclass(frozen=True)
class Candidate:
    """One saved tensor the plan may evict.

    Attributes:
        key: the tensor's key.
        nbytes: bytes evicting it saves.
        swap_s: exposed transfer seconds if swapped (0.0 when the copy hides behind compute);
            ``None`` when it cannot be swapped.
        region: the recompute region that rebuilds it, or ``None`` when it cannot be recomputed.
        recompute_s: that region's forward seconds (equal for every tensor of a region).
    """

    key: int
    nbytes: int
    swap_s: float | None = None
    region: str | None = None
    recompute_s: float = 0.0


@dataclass(frozen=True)
class CapuchinPlan:
    """The chosen evictions.

    Attributes:
        actions: key -> ``"swap"`` or ``"recompute"`` (keys not listed are kept), in choice order.
        regions: the recomputed regions, in choice order.
        saved_bytes: bytes the evictions save.
        overhead_s: predicted extra seconds: exposed swap seconds plus the recomputed regions' forward seconds.
    """

    actions: Mapping[int, str]
    regions: tuple[str, ...]
    saved_bytes: int
    overhead_s: float


def _check(candidates: Sequence[Candidate], bytes_to_save: int) -> dict[str, float]:
    if bytes_to_save < 0:
        raise ValueError(f"bytes_to_save must be >= 0 (peak minus budget), got {bytes_to_save}")
    keys = [c.key for c in candidates]
    if len(set(keys)) != len(keys):
        raise ValueError("candidate keys must be unique: each saved tensor appears once")
    costs: dict[str, float] = {}
    for c in candidates:
        if c.nbytes < 0 or (c.swap_s is not None and c.swap_s < 0) or c.recompute_s < 0:
            raise ValueError(f"candidate {c.key}: bytes and seconds must be >= 0, got {c}")
        if c.region is not None:
            if costs.setdefault(c.region, c.recompute_s) != c.recompute_s:
                raise ValueError(f"region {c.region!r}: its tensors give different recompute_s ({costs[c.region]} and {c.recompute_s}); "
                                 "give every tensor of a region the region's forward seconds")
    return costs


def _per_second(saved: int, seconds: float) -> float:
    return float("inf") if seconds == 0 else saved / seconds


def plan_capuchin(candidates: Sequence[Candidate], bytes_to_save: int) -> CapuchinPlan:
    """Choose swap or recompute per tensor until ``bytes_to_save`` are saved, as Capuchin does.

    Args:
        candidates: the tensors that may be evicted.
        bytes_to_save: peak minus budget.

    Ties go to the larger saving, then to swapping, then to the lower key (or region name).

    Raises:
        ValueError: bad candidates, or all of them together save less than ``bytes_to_save``
            (the message gives the most they can save).
    """
    region_s = _check(candidates, bytes_to_save)
    left = {c.key: c for c in candidates}
    actions: dict[int, str] = {}
    regions: list[str] = []
    saved = 0
    overhead_s = 0.0

    # Phase 1: swaps whose transfer hides entirely behind compute, largest first.
    for c in sorted((c for c in candidates if c.swap_s == 0.0), key=lambda c: (-c.nbytes, c.key)):
        if saved >= bytes_to_save:
            break
        actions[c.key] = "swap"
        saved += c.nbytes
        del left[c.key]

    # Phase 2: the best memory saving per second of overhead, one option at a time.
    while saved < bytes_to_save:
        options: list[tuple[float, int, int, str, str | int]] = []
        for c in left.values():
            if c.swap_s is not None:
                options.append((_per_second(c.nbytes, c.swap_s), c.nbytes, 1, str(c.key).zfill(20), c.key))
        by_region: dict[str, int] = {}
        for c in left.values():
            if c.region is not None and c.region not in regions:
                by_region[c.region] = by_region.get(c.region, 0) + c.nbytes
        for region, nbytes in by_region.items():
            options.append((_per_second(nbytes, region_s[region]), nbytes, 0, region, region))
        if not options:
            raise ValueError(
                f"the candidates can save at most {saved} bytes, {bytes_to_save} asked: raise the budget, "
                "or allow more tensors to be swapped or recomputed"
            )
        best = min(options, key=lambda o: (-o[0], -o[1], -o[2], o[3]))
        choice = best[4]
        if isinstance(choice, int):
            c = left.pop(choice)
            actions[c.key] = "swap"
            saved += c.nbytes
            overhead_s += c.swap_s or 0.0
        else:
            regions.append(choice)
            overhead_s += region_s[choice]
            for c in [c for c in left.values() if c.region == choice]:
                actions[c.key] = "recompute"
                saved += c.nbytes
                del left[c.key]
    return CapuchinPlan(MappingProxyType(actions), tuple(regions), saved, overhead_s)


#: How many times the greedy is rerun with the measured overflow added to the bytes to save, before
#: it asks for twice as many each time (:func:`_greedy_plan`).
CAPUCHIN_ROUNDS = 16


def _cheapest(tensor: TensorOptions, action: str, problem: PlanningProblem) -> Option | None:
    mine = [o for o in tensor.options if o.action == action]
    return min(mine, key=lambda o: (o.cost_s, int(problem.holds(o).sum()))) if mine else None


def plan_capuchin_budget(problem: PlanningProblem, budget_bytes: int, time_limit_s: float = 30.0,
                         host_budget_bytes: int | None = None, explain: bool = True) -> BudgetPlan:
    """Capuchin's plan of ``problem`` within ``budget_bytes`` (and ``host_budget_bytes``; see the module docstring).

    Raises:
        BudgetError: no plan the greedy finds fits; it carries :func:`capuchin_minimum_bytes` (and,
            with a host budget, which budget binds and :func:`capuchin_host_minimum_bytes`).
        ValueError: a budget that is not positive.
    """
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
    plan = _greedy_plan(problem, int(budget_bytes))
    if host_budget_bytes is None:
        if plan is None:
            raise BudgetError(capuchin_minimum_bytes(problem, time_limit_s), "capuchin", int(budget_bytes))
        return plan
    if plan is not None and plan.host_peak_bytes <= host_budget_bytes:
        return replace(plan, host_budget_bytes=int(host_budget_bytes))
    if not explain:  # the caller only asks whether a plan fits (cswap.planner.solve.plan_budget)
        raise BudgetError(int(budget_bytes) + 1, "capuchin", int(budget_bytes), host_budget_bytes=host_budget_bytes)
    least = capuchin_minimum_bytes(problem, time_limit_s, host_budget_bytes)
    binding = "device" if plan is None else "host"
    host_least = capuchin_host_minimum_bytes(problem, int(budget_bytes) if plan is not None else least, time_limit_s)
    raise BudgetError(least, "capuchin", int(budget_bytes), host_budget_bytes=host_budget_bytes, host_minimum_bytes=host_least,
                      binding=binding)


def capuchin_host_minimum_bytes(problem: PlanningProblem, budget_bytes: int, time_limit_s: float = 30.0) -> int | None:
    """The host peak of Capuchin's greedy plan within ``budget_bytes`` (``None``: the greedy meets no
    plan there): the least host budget a run at that device budget meets, the greedy being what it is."""
    plan = _greedy_plan(problem, max(int(budget_bytes), 1))
    return None if plan is None else plan.host_peak_bytes


def capuchin_minimum_bytes(problem: PlanningProblem, time_limit_s: float = 30.0, host_budget_bytes: int | None = None) -> int:
    """The least budget Capuchin's greedy meets on ``problem`` (bisection; the greedy meets the answer);
    with ``host_budget_bytes``, the least whose greedy plan also keeps its host copies within it.

    Example:
        >>> from cswap.planner.lifetime import lifetimes_from_orders
        >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
        >>> events = lifetimes_from_orders([0, 1, 2], [2, 1, 0])
        >>> specs = [TensorSpec(key=k, nbytes=1000, lifetime=lt, recompute_s=0.5) for k, lt in enumerate(events.lifetimes)]
        >>> capuchin_minimum_bytes(build_problem(specs, events, [0, 1, 2, 3, 4, 5], 2.5, LinkModel(1e-6, 1e-6, async_copies=False)))
        2000
    """
    low = least_peak_fast(problem, "capuchin", time_limit_s)
    keeps = [_cheapest(t, KEEP, problem) for t in problem.tensors]
    high = max(int(sum(problem.holds(o) for o in keeps if o is not None).max(initial=0)) if keeps else 0, 1)

    def meets(budget: int) -> bool:  # keeping everything (at ``high``) holds nothing on the host
        plan = _greedy_plan(problem, budget)
        return plan is not None and (host_budget_bytes is None or plan.host_peak_bytes <= host_budget_bytes)

    if low >= high or meets(max(low, 1)):
        return max(min(low, high), 1)
    while high - low > 1:  # the greedy fails at ``low`` and meets ``high``
        middle = (low + high) // 2
        if not meets(middle):
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
    evictable = sum(c.nbytes for c in candidates)
    round_number = 0
    while True:
        chosen = plan_capuchin(candidates, min(to_save, evictable))
        choice = []
        for position, keep in enumerate(keeps):
            action = chosen.actions.get(position, KEEP)
            option = {KEEP: keep, SWAP: swaps[position], RECOMPUTE: recomputes[position]}[action]
            assert option is not None  # the greedy only picks what a candidate offers
            choice.append(option)
        plan = budget_plan_of(problem, "capuchin", budget_bytes, choice, status="capuchin", solve_s=time.perf_counter() - started)
        if plan.peak_bytes <= budget_bytes:
            return plan
        if to_save >= evictable:
            return None  # every candidate evicted, and still over
        # Capuchin's feedback asks for the overflow more. Where its rounds leave the budget passed
        # (what it evicts first is not alive at the peak: a larger budget asks for fewer bytes and
        # can fail where a smaller one met), it asks for twice as much each round, up to every
        # candidate, so that a budget above the least it meets is met too.
        overflow = plan.peak_bytes - int(budget_bytes)
        to_save = to_save + overflow if round_number < CAPUCHIN_ROUNDS else max(to_save + overflow, 2 * to_save)
        round_number += 1
