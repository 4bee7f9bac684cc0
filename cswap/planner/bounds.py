"""The least any plan of a policy can hold: a floor under its peak, and a plan that often meets it.

At each event every tensor holds at least what the smallest of its options holds there; the sum over
tensors, at the event where it is largest, is a floor no plan of the policy goes below
(:func:`peak_floor`). Taking each tensor at its smallest-footprint option (fewest byte-events, then
cheapest) gives a plan; where that plan's peak equals the floor it is the least peak the policy can
meet, found without a solver (:func:`least_footprint_peak`). When a policy has one option that holds
least at every event (``swap``'s waiting copy fetched on demand), it does.

Example:
    >>> from cswap.planner.lifetime import lifetimes_from_orders
    >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
    >>> events = lifetimes_from_orders([0, 1, 2], [2, 1, 0])
    >>> specs = [TensorSpec(key=k, nbytes=n, lifetime=lt) for k, (n, lt) in enumerate(zip([4000, 1000, 2000], events.lifetimes))]
    >>> problem = build_problem(specs, events, [0, 1, 2, 3, 4, 5], 2.5, LinkModel(1e-6, 1e-6, async_copies=False))
    >>> peak_floor(problem, "none"), peak_floor(problem, "swap"), least_footprint_peak(problem, "swap")
    (7000, 4000, 4000)
"""

from __future__ import annotations

import numpy as np

from cswap.planner.actions import tensor_actions
from cswap.planner.lifetime import resident_bytes
from cswap.planner.problem import Option, PlanningProblem, TensorOptions

__all__ = ["least_footprint_choice", "least_footprint_peak", "peak_floor", "policy_options"]


def policy_options(tensor: TensorOptions, policy: str) -> tuple[Option, ...]:
    """The options of ``tensor`` that ``policy`` may use.

    Raises:
        ValueError: the tensor has none (or the policy is unknown).
    """
    allowed = tensor_actions(policy, {o.action for o in tensor.options})
    chosen = tuple(o for o in tensor.options if o.action in allowed)
    if not chosen:
        raise ValueError(f"tensor {tensor.key} has no option under policy {policy!r}")
    return chosen


def peak_floor(problem: PlanningProblem, policy: str) -> int:
    """The largest, over events, of the bytes every tensor holds at least there under ``policy``:
    no plan of the policy peaks lower."""
    floor = np.zeros(problem.event_count + 1, dtype=np.int64)
    for tensor in problem.tensors:
        options = policy_options(tensor, policy)
        segments = [s for o in options for s in o.holds]
        if not segments:
            continue
        low, high = min(s[0] for s in segments), max(s[1] for s in segments)
        delta = np.zeros((len(options), high - low + 2), dtype=np.int64)
        for row, option in enumerate(options):
            for start, end, nbytes in option.holds:
                delta[row, start - low] += nbytes
                delta[row, end - low + 1] -= nbytes
        floor[low : high + 1] += np.cumsum(delta, axis=1)[:, :-1].min(axis=0)
    return int(floor[:-1].max(initial=0))


def _area(option: Option) -> int:
    return sum((end - start + 1) * nbytes for start, end, nbytes in option.holds)


def least_footprint_choice(problem: PlanningProblem, policy: str) -> list[Option]:
    """Per tensor (problem order), its option of ``policy`` holding the fewest byte-events, then the cheapest."""
    return [min(policy_options(t, policy), key=lambda o: (_area(o), o.cost_s)) for t in problem.tensors]


def least_footprint_peak(problem: PlanningProblem, policy: str) -> int:
    """The peak of :func:`least_footprint_choice`: a budget ``policy`` can meet."""
    segments = [s for option in least_footprint_choice(problem, policy) for s in option.holds]
    return int(resident_bytes(problem.event_count, segments).max(initial=0))
