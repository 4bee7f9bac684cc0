"""The planner's fast path for large problems: tie repeated layers, and certify the least peak by its floor.

The exact program (:mod:`cswap.planner.milp`) has one binary per tensor and option and one row per
event; on a transformer of 32 layers and more HiGHS spends most of its time proving optimality among
layers that are nearly interchangeable. A problem of at least :data:`FAST_PATH_MIN_TENSORS` tensors
whose pack order repeats a layer at least :data:`FAST_PATH_MIN_LAYERS` times
(:func:`repeated_layers`) is planned by :func:`cswap.planner.tied.plan_tied` first
(:func:`cswap.planner.solve.plan_budget` chooses): the same program with the decisions of blocks of
layers tied, which keeps the budget at every event and is checked there in exact bytes. When no
tied plan fits, the exact program is the answer.

The least peak (:func:`least_peak_fast`) needs no solver when taking each tensor at its
smallest-footprint option peaks at the floor no plan goes below
(:mod:`cswap.planner.bounds`): that peak is then the exact least peak. Otherwise a tied plan that
meets the floor is, and failing that the exact program decides.

Example:
    >>> from cswap.planner.lifetime import lifetimes_from_orders
    >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
    >>> events = lifetimes_from_orders([0, 1, 2], [2, 1, 0])
    >>> specs = [TensorSpec(key=k, nbytes=n, lifetime=lt) for k, (n, lt) in enumerate(zip([4000, 1000, 2000], events.lifetimes))]
    >>> problem = build_problem(specs, events, [0, 1, 2, 3, 4, 5], 2.5, LinkModel(1e-6, 1e-6, async_copies=False))
    >>> repeated_layers(problem) is None, least_peak_fast(problem, "swap")
    (True, 4000)
"""

from __future__ import annotations

from cswap.planner.bounds import least_footprint_peak, peak_floor
from cswap.planner.milp import least_peak
from cswap.planner.problem import PlanningProblem
from cswap.planner.repeats import RepeatedLayers, find_repeats
from cswap.planner.tied import DEFAULT_BLOCKS, DEFAULT_EDGE_LAYERS, tied_least_peak

__all__ = ["FAST_PATH_MIN_LAYERS", "FAST_PATH_MIN_TENSORS", "least_peak_fast", "repeated_layers"]

#: Problems with fewer tensors are solved exactly: the exact program takes under a second there
#: (ResNet-50's 212 saved tensors).
FAST_PATH_MIN_TENSORS = 256
#: The fewest repeated layers worth tying: both edges planned layer by layer, and one block of two
#: layers among those between (fewer, and every block would hold one layer: the exact program).
FAST_PATH_MIN_LAYERS = 2 * DEFAULT_EDGE_LAYERS + DEFAULT_BLOCKS + 1


def repeated_layers(problem: PlanningProblem, min_tensors: int | None = None) -> RepeatedLayers | None:
    """The repeated layers the fast path ties, or ``None`` when it does not apply (a problem of fewer
    than ``min_tensors`` tensors, default :data:`FAST_PATH_MIN_TENSORS`, or fewer than
    :data:`FAST_PATH_MIN_LAYERS` repeated layers)."""
    if len(problem.tensors) < (FAST_PATH_MIN_TENSORS if min_tensors is None else min_tensors):
        return None
    return find_repeats(problem, FAST_PATH_MIN_LAYERS)


def least_peak_fast(problem: PlanningProblem, policy: str, time_limit_s: float = 30.0) -> int:
    """The least peak of ``policy``'s plans, as :func:`cswap.planner.milp.least_peak` gives it, found
    without the exact program where the floor certifies it (see the module docstring)."""
    floor = peak_floor(problem, policy)
    met = least_footprint_peak(problem, policy)
    if met == floor:
        return met
    repeats = repeated_layers(problem)
    tied = tied_least_peak(problem, policy, repeats, time_limit_s, floor) if repeats is not None else None
    if tied is not None and tied <= floor:
        return tied
    # each is a peak some plan meets: the tied one by the fast path, the exact one by the program
    return min(least_peak(problem, policy, time_limit_s), *([tied] if tied is not None else []), met)
