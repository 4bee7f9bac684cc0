"""What to recompute so the saved bytes fit: the knapsack of ``torch.compile``'s activation memory budget.

PyTorch's min-cut partitioner, given ``torch._functorch.config.activation_memory_budget``, chooses
which activations to save and which to recompute in backward: the least recompute seconds with the
saved bytes within the budget, a 0-1 knapsack over the activations (its ``ilp`` solver;
``greedy`` and ``dp`` approximate it). :func:`recompute_knapsack` solves that knapsack exactly with
SciPy's ``milp`` (HiGHS).

Example:
    >>> recompute_knapsack(recompute_s=[1.0, 2.0, 0.5], nbytes=[100, 100, 50], capacity_bytes=150)
    (True, False, False)
    >>> recompute_knapsack([1.0, 2.0], [100, 100], capacity_bytes=200)   # everything fits: nothing recomputed
    (False, False)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint

from cswap.planner import highs

__all__ = ["recompute_knapsack"]


def recompute_knapsack(
    recompute_s: Sequence[float], nbytes: Sequence[int], capacity_bytes: int, time_limit_s: float = 30.0
) -> tuple[bool, ...] | None:
    """Which tensors to recompute: the least total ``recompute_s`` with the bytes of the others
    at most ``capacity_bytes``.

    Args:
        recompute_s: per tensor, seconds recomputing it costs.
        nbytes: per tensor, the bytes saving it holds.
        capacity_bytes: the most the saved ones may hold together.
        time_limit_s: the solver's time limit.

    Returns:
        Per tensor, whether to recompute it; ``None`` when even recomputing all of them does not
        fit (a negative capacity).

    Raises:
        ValueError: sequences of different lengths.
    """
    if len(recompute_s) != len(nbytes):
        raise ValueError(f"need one size per tensor: {len(recompute_s)} times, {len(nbytes)} sizes")
    if capacity_bytes < 0:
        return None
    sizes = np.asarray(nbytes, dtype=float)
    if sizes.sum() <= capacity_bytes:
        return (False,) * len(sizes)
    # recompute at least what does not fit, in MiB so that HiGHS's coefficients stay near 1
    scale = 1.0 / 2**20
    constraint = LinearConstraint(sizes[np.newaxis, :] * scale, (sizes.sum() - capacity_bytes) * scale, np.inf)
    result = highs.solve(np.asarray(recompute_s, dtype=float), [constraint], np.ones(len(sizes)), Bounds(0, 1),
                         {"time_limit": time_limit_s, "mip_rel_gap": 1e-6})
    chosen = np.ones(len(sizes), dtype=bool) if result.x is None else result.x > 0.5
    if sizes[~chosen].sum() > capacity_bytes:  # the solver's tolerance let a few bytes through
        order = np.argsort(-sizes / np.maximum(np.asarray(recompute_s, dtype=float), 1e-12))
        for i in order:
            if sizes[~chosen].sum() <= capacity_bytes:
                break
            chosen[i] = True
    return tuple(bool(c) for c in chosen)
