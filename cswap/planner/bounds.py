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

from dataclasses import dataclass

import numpy as np

from cswap.planner.actions import KEEP, tensor_actions
from cswap.planner.lifetime import resident_bytes
from cswap.planner.problem import Option, PlanningProblem, SharedStorage, TensorOptions

__all__ = ["floor_levels", "floor_shares", "least_footprint_choice", "least_footprint_peak", "peak_floor", "policy_options"]


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


def floor_levels(problem: PlanningProblem, policy: str) -> np.ndarray:
    """Per event, the bytes no plan of ``policy`` holds fewer than there: every tensor at the least
    of its options there, a storage's views where keeping them with its first view holds less
    (:func:`_shared_groups`). :func:`peak_floor` is their most."""
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
        floor = floor + sum(group.change for group in _shared_groups(problem, policy))
    return floor


def peak_floor(problem: PlanningProblem, policy: str) -> int:
    """The largest, over events, of the bytes every tensor holds at least there under ``policy``
    (:func:`floor_levels`): no plan of the policy peaks lower."""
    return int(floor_levels(problem, policy).max(initial=0))


def floor_shares(problem: PlanningProblem, policy: str, event: int) -> dict[int, int]:
    """Per tensor key, its bytes in :func:`floor_levels` at ``event`` (they sum to it): the least its
    options hold there, or, in a storage kept whole there, its keep with its credit (none, for a
    view while its storage's first view lives).

    Example:
        >>> from cswap.planner.problem import Option, SharedStorage, TensorOptions
        >>> def tensor(key, keep, smaller):  # a keep, and a compressed keep of ``smaller`` bytes
        ...     return TensorOptions(key=key, nbytes=keep, options=(Option("keep", 0.0, ((0, 1, keep),)),
        ...                                                         Option("zvc-keep", 1.0, ((0, 1, smaller),))))
        >>> views = [SharedStorage(0, k, ((0, 1, -600),)) for k in (1, 2)]
        >>> problem = PlanningProblem((tensor(0, 600, 400), tensor(1, 600, 400), tensor(2, 600, 400)), 2, 1, shared=tuple(views))
        >>> floor_shares(problem, "compress-keep", 0), peak_floor(problem, "compress-keep")
        ({0: 600, 1: 0, 2: 0}, 600)

    Three views of one 600-byte storage: compressed apart they hold 1,200 bytes, kept they hold it once.
    """
    shares = {t.key: min(_held_at(o, event) for o in policy_options(t, policy)) for t in problem.tensors}
    for group in _shared_groups(problem, policy):
        if group.change[event] < 0:
            shares.update(group.kept_shares(event))
    return shares


@dataclass(frozen=True)
class _SharedGroup:
    """The saved tensors that are views of one storage under ``policy``: its first view (the owner,
    :attr:`~cswap.planner.problem.SharedStorage.owner_key`) and the later ones.

    Attributes:
        kept: per tensor key, what it holds at each event when the owner is kept: the owner its
            keep, each view the less of its least and its keep with its credit.
        change: per event, what keeping the storage whole takes off the sum of their least holds
            (zero, or less where it holds less).
    """

    kept: dict[int, np.ndarray]
    change: np.ndarray

    def kept_shares(self, event: int) -> dict[int, int]:
        return {key: int(held[event]) for key, held in self.kept.items()}


def _shared_groups(problem: PlanningProblem, policy: str) -> list[_SharedGroup]:
    """Each storage's views (:class:`_SharedGroup`) whose owner ``policy`` may keep.

    A view's credit applies only while its owner is kept (:meth:`PlanningProblem.shared_credit`),
    and every view of a storage is a view of one owner, so at each event a storage's views hold at
    least the less of their least holds apart and their holds with the owner kept. Taken pair by
    pair instead, a storage of many views counted its owner once per view: three views of 600
    bytes, each compressed to 400, gave a floor of 800 where keeping them holds 600, a floor above
    the least plan.
    """
    index = {t.key: t for t in problem.tensors}
    by_owner: dict[int, list[SharedStorage]] = {}
    for pair in problem.shared:
        if pair.owner_key in index and pair.view_key in index:
            by_owner.setdefault(pair.owner_key, []).append(pair)
    groups = []
    for owner_key, pairs in by_owner.items():
        owner_options = policy_options(index[owner_key], policy)
        owner_keep = next((o for o in owner_options if o.action == KEEP), None)
        if owner_keep is None:
            continue
        apart = np.min([problem.holds(o) for o in owner_options], axis=0)
        kept = {owner_key: problem.holds(owner_keep)}
        for pair in pairs:
            view_options = policy_options(index[pair.view_key], policy)
            least = np.min([problem.holds(o) for o in view_options], axis=0)
            apart = apart + least
            view_keep = next((o for o in view_options if o.action == KEEP), None)
            kept[pair.view_key] = least if view_keep is None else np.minimum(
                least, problem.holds(view_keep) + resident_bytes(problem.event_count, pair.credit_holds))
        together = sum(kept.values())
        groups.append(_SharedGroup(kept, np.minimum(apart, together) - apart))
    return groups


def _held_at(option: Option, event: int) -> int:
    return sum(nbytes for start, end, nbytes in option.holds if start <= event <= end)


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
