"""The memory-budget planner: per saved tensor, the action that keeps the budget at the least predicted time.

* :mod:`~cswap.planner.actions`: policies as sets of actions;
* :mod:`~cswap.planner.options`: each tensor's options (bytes held per event, predicted seconds);
* :mod:`~cswap.planner.from_trace`: the problem from a profiled trace (what the runtime calls);
* :mod:`~cswap.planner.solve`: the MILP (SciPy ``milp``, HiGHS) with a greedy alongside, and the
  least budget a policy can meet.

Example:
    >>> from cswap.lifetime import lifetimes_from_orders
    >>> events = lifetimes_from_orders([0, 1, 2], [2, 1, 0])
    >>> specs = [TensorSpec(key=k, nbytes=100, lifetime=lt) for k, lt in enumerate(events.lifetimes)]
    >>> problem = build_problem(specs, events, [0, 1, 2, 3, 4, 5], 2.5, LinkModel(1e-7, 1e-7))
    >>> minimum_bytes(problem, "none"), minimum_bytes(problem, "swap")
    (300, 100)
    >>> plan_budget(problem, "cswap", 200).peak_bytes <= 200
    True
"""

from __future__ import annotations

from cswap.planner.actions import ACTIONS, POLICY_ACTIONS, allowed_actions, single_mechanism_policies, tensor_actions
from cswap.planner.from_trace import problem_from_trace
from cswap.planner.options import (
    DEFAULT_PREFETCH_DISTANCES,
    LinkModel,
    Option,
    PlanningProblem,
    TensorOptions,
    TensorSpec,
    build_problem,
)
from cswap.planner.solve import BudgetPlan, PlannedTensor, minimum_bytes, plan_budget, timeline_of

__all__ = [
    "ACTIONS",
    "DEFAULT_PREFETCH_DISTANCES",
    "POLICY_ACTIONS",
    "BudgetPlan",
    "LinkModel",
    "Option",
    "PlannedTensor",
    "PlanningProblem",
    "TensorOptions",
    "TensorSpec",
    "allowed_actions",
    "build_problem",
    "minimum_bytes",
    "plan_budget",
    "problem_from_trace",
    "single_mechanism_policies",
    "tensor_actions",
    "timeline_of",
]
