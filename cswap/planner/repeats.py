"""Find the layers that repeat in a planning problem: the same tensors, saved in the same order, layer after layer.

A transformer saves the same tensors in every layer: in pack order, tensor ``i`` and tensor ``i +
period`` have the same bytes and are offered the same actions, for as many layers as the model has.
:func:`find_repeats` finds the longest such run. Each tensor's **signature** is its raw bytes, the
actions its options offer and whether backward unpacks it; the period is the one whose run of equal
signatures ``period`` apart covers the most tensors (the shortest such period, so a run of 32
layers is not read as 16 pairs of layers). Nothing else need repeat: event times, costs and how many
prefetch distances survive pruning may differ from layer to layer (near the end of forward they do),
and the planner that ties layers together (:mod:`cswap.planner.tied`) measures every layer's own
bytes and seconds.

Example:
    >>> from cswap.planner.lifetime import lifetimes_from_orders
    >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
    >>> sizes = [7] + [100, 300, 200] * 4 + [50]           # a stem, four layers of three, a head
    >>> events = lifetimes_from_orders(list(range(14)), list(range(13, -1, -1)))
    >>> specs = [TensorSpec(key=k, nbytes=n, lifetime=lt) for k, (n, lt) in enumerate(zip(sizes, events.lifetimes))]
    >>> problem = build_problem(specs, events, list(range(28)), 13.5, LinkModel(1e-6, 1e-6))
    >>> found = find_repeats(problem)
    >>> found.period, found.layers, found.first, found.layer_of(problem.tensors[4].lifetime.pack)
    (3, 4, 1, 1)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cswap.planner.problem import PlanningProblem, TensorOptions

__all__ = ["RepeatedLayers", "find_repeats"]


@dataclass(frozen=True)
class RepeatedLayers:
    """A run of layers that save the same tensors.

    Attributes:
        order: the problem's tensor indices in pack order.
        first: where in ``order`` the first repeated layer begins.
        period: tensors per layer.
        layers: how many layers repeat.
    """

    order: tuple[int, ...]
    first: int
    period: int
    layers: int

    @property
    def covered(self) -> int:
        """Tensors inside the repeated layers."""
        return self.period * self.layers

    def layer_of(self, rank: int) -> int | None:
        """The repeated layer of the tensor at ``rank`` in pack order, or ``None`` outside the run."""
        offset = rank - self.first
        return offset // self.period if 0 <= offset < self.covered else None

    def tensors_of(self, layer: int) -> tuple[int, ...]:
        """The problem's tensor indices of ``layer``, by their position in the layer."""
        start = self.first + layer * self.period
        return self.order[start : start + self.period]


def _signature(tensor: TensorOptions) -> tuple[object, ...]:
    unpacked = tensor.lifetime is not None and tensor.lifetime.unpack is not None
    return (tensor.nbytes, tensor.kept_nbytes, tuple(sorted({o.action for o in tensor.options})), unpacked)


def find_repeats(problem: PlanningProblem, min_layers: int = 2) -> RepeatedLayers | None:
    """The longest run of repeated layers in ``problem`` (see the module docstring).

    Args:
        problem: every tensor's options (each with its lifetime).
        min_layers: the fewest layers a run must have.

    Returns:
        The run, or ``None`` when no period repeats ``min_layers`` times (or a tensor has no lifetime).
    """
    tensors = problem.tensors
    if any(t.lifetime is None for t in tensors) or len(tensors) < 2 * max(min_layers, 1):
        return None
    order = sorted(range(len(tensors)), key=lambda i: (tensors[i].lifetime.pack, i))  # type: ignore[union-attr]
    ids: dict[tuple[object, ...], int] = {}
    signatures = np.array([ids.setdefault(_signature(tensors[i]), len(ids)) for i in order], dtype=np.int64)
    count = len(order)
    best: tuple[int, int, int] | None = None  # (covered, period, first)
    for period in range(1, count // max(min_layers, 1) + 1):
        same = np.concatenate([[0], (signatures[:-period] == signatures[period:]).astype(np.int8), [0]])
        edges = np.diff(same)
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        if starts.size == 0:
            continue
        longest = int(np.argmax(ends - starts))
        layers = (int(ends[longest] - starts[longest]) + period) // period
        if layers >= min_layers and (best is None or layers * period > best[0]):
            best = (layers * period, period, int(starts[longest]))
    if best is None:
        return None
    covered, period, first = best
    return RepeatedLayers(order=tuple(order), first=first, period=period, layers=covered // period)
