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

from cswap.planner.actions import KEEP, tensor_actions
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
    no plan of the policy peaks lower. A shared storage's pair holds at least the less of its two
    least holds and its two keeps less their credit (:class:`~cswap.planner.problem.SharedStorage`)."""
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
    floor = floor[:-1]
    if problem.shared:
        floor = floor + _shared_floor(problem, policy)
    return int(floor.max(initial=0))


def _shared_floor(problem: PlanningProblem, policy: str) -> np.ndarray:
    """What the shared storages take off the sum of each tensor's least holds, event by event (<= 0)."""
    index = {t.key: t for t in problem.tensors}
    change = np.zeros(problem.event_count, dtype=np.int64)
    for pair in problem.shared:
        owner, view = index.get(pair.owner_key), index.get(pair.view_key)
        if owner is None or view is None:
            continue
        options = policy_options(owner, policy), policy_options(view, policy)
        keeps = [next((o for o in each if o.action == KEEP), None) for each in options]
        if keeps[0] is None or keeps[1] is None:
            continue
        apart = sum(np.min([problem.holds(o) for o in each], axis=0) for each in options)
        together = problem.holds(keeps[0]) + problem.holds(keeps[1]) + resident_bytes(problem.event_count, pair.credit_holds)
        change += np.minimum(apart, together) - apart
    return change


def _area(option: Option) -> int:
    return sum((end - start + 1) * nbytes for start, end, nbytes in option.holds)


def least_footprint_choice(problem: PlanningProblem, policy: str) -> list[Option]:
    """Per tensor (problem order), its option of ``policy`` holding the fewest byte-events, then the cheapest."""
    return [min(policy_options(t, policy), key=lambda o: (_area(o), o.cost_s)) for t in problem.tensors]


def least_footprint_peak(problem: PlanningProblem, policy: str) -> int:
    """The peak of :func:`least_footprint_choice`: a budget ``policy`` can meet."""
    choice = least_footprint_choice(problem, policy)
    level = resident_bytes(problem.event_count, [s for option in choice for s in option.holds])
    if problem.shared:
        level = level + problem.shared_credit({t.key: o.action for t, o in zip(problem.tensors, choice, strict=True)})
    return int(level.max(initial=0))
