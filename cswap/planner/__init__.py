"""The memory-budget planner: per saved tensor, the action that keeps the budget at the least predicted time.

* :mod:`~cswap.planner.actions`: the actions, and the one table of policies and their actions;
* :mod:`~cswap.planner.problem`: each tensor's options (bytes held per event, predicted seconds);
* :mod:`~cswap.planner.from_trace`: the problem from a profiled trace (what the runtime calls);
* :mod:`~cswap.planner.solve`: plan a policy within a budget, or find its least budget, by
  :mod:`~cswap.planner.milp` (SciPy ``milp``, HiGHS, with a greedy alongside) or Capuchin's greedy
  (:mod:`~cswap.planner.capuchin`);
* :mod:`~cswap.planner.fastpath`: for a large problem whose layers repeat
  (:mod:`~cswap.planner.repeats`), the same program with blocks of layers tied
  (:mod:`~cswap.planner.tied`), and the least budget certified by its floor
  (:mod:`~cswap.planner.bounds`).

Its public names load lazily, so that a light module of the package (the policy table in
:mod:`~cswap.planner.actions`) imports without torch or SciPy.

Example:
    >>> from cswap.planner import LinkModel, TensorSpec, build_problem, minimum_bytes, plan_budget
    >>> from cswap.planner.lifetime import lifetimes_from_orders
    >>> events = lifetimes_from_orders([0, 1, 2], [2, 1, 0])
    >>> specs = [TensorSpec(key=k, nbytes=100, lifetime=lt) for k, lt in enumerate(events.lifetimes)]
    >>> problem = build_problem(specs, events, [0, 1, 2, 3, 4, 5], 2.5, LinkModel(1e-7, 1e-7))
    >>> minimum_bytes(problem, "none"), minimum_bytes(problem, "swap")
    (300, 100)
    >>> plan_budget(problem, "cswap", 200).peak_bytes <= 200
    True
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    **dict.fromkeys(("ACTIONS", "POLICY_ACTIONS", "allowed_actions", "single_mechanism_policies", "tensor_actions"),
                    "cswap.planner.actions"),
    "problem_from_trace": "cswap.planner.from_trace",
    **dict.fromkeys(("DEFAULT_PREFETCH_DISTANCES", "LinkModel", "Option", "PlanningProblem", "TensorOptions", "TensorSpec",
                     "build_problem"), "cswap.planner.problem"),
    **dict.fromkeys(("BudgetPlan", "PlannedTensor", "timeline_of"), "cswap.planner.milp"),
    **dict.fromkeys(("minimum_bytes", "plan_budget"), "cswap.planner.solve"),
}

__all__ = [*_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cswap.planner' has no attribute {name!r}")
