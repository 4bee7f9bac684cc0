"""Policies as sets of actions: what a policy may do with each saved tensor under a memory budget.

Action names are the values of :class:`cswap.advisor.Action` (and of the simulator's actions).

=================  ==================================  =============================
policy             actions                             system it reproduces
=================  ==================================  =============================
``none``           keep                                plain PyTorch
``swap``           keep, swap                          vDNN
``compress-swap``  keep, zvc-swap                      cDMA (static compression)
``compress-keep``  keep, zvc-keep                      FreeLunch
``recompute``      keep, recompute                     checkpointing (Chen et al., Checkmate, MONeT)
``capuchin``       keep, swap, recompute               Capuchin (its greedy, not the MILP)
``cswap``          every action                        CSWAP's cost model, generalised
=================  ==================================  =============================

Compression never stores more than the raw bytes, so a tensor ZVC would not shrink (or whose dtype
it cannot encode) gets no ``zvc`` option; a policy that swaps only compressed (``compress-swap``)
swaps such a tensor raw, as cDMA does (:func:`tensor_actions`), and ``compress-keep`` keeps it.

Example:
    >>> sorted(allowed_actions("swap"))
    ['keep', 'swap']
    >>> single_mechanism_policies()
    ('swap', 'compress-swap', 'compress-keep', 'recompute')
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "ACTIONS",
    "KEEP",
    "POLICY_ACTIONS",
    "RECOMPUTE",
    "SWAP",
    "ZVC_KEEP",
    "ZVC_SWAP",
    "allowed_actions",
    "single_mechanism_policies",
    "tensor_actions",
]

KEEP = "keep"
SWAP = "swap"
ZVC_SWAP = "zvc-swap"
ZVC_KEEP = "zvc-keep"
RECOMPUTE = "recompute"

#: Every action the planner chooses among.
ACTIONS: tuple[str, ...] = (KEEP, SWAP, ZVC_SWAP, ZVC_KEEP, RECOMPUTE)

#: Policy -> the actions it may use under a budget.
POLICY_ACTIONS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "none": frozenset({KEEP}),
        "swap": frozenset({KEEP, SWAP}),
        "compress-swap": frozenset({KEEP, ZVC_SWAP}),
        "compress-keep": frozenset({KEEP, ZVC_KEEP}),
        "recompute": frozenset({KEEP, RECOMPUTE}),
        "capuchin": frozenset({KEEP, SWAP, RECOMPUTE}),
        "cswap": frozenset(ACTIONS),
    }
)


def allowed_actions(policy: str) -> frozenset[str]:
    """The actions ``policy`` may use.

    Raises:
        ValueError: an unknown policy, naming the known ones.
    """
    try:
        return POLICY_ACTIONS[policy]
    except KeyError:
        raise ValueError(
            f"policy {policy!r} has no action set for a memory budget: choose one of {', '.join(POLICY_ACTIONS)}"
        ) from None


def single_mechanism_policies() -> tuple[str, ...]:
    """The policies that add exactly one action to ``keep``."""
    return tuple(p for p, actions in POLICY_ACTIONS.items() if len(actions) == 2)


def tensor_actions(policy: str, offered: frozenset[str] | set[str]) -> frozenset[str]:
    """The actions ``policy`` may use on a tensor whose options have the actions ``offered``:
    its action set, plus a raw ``swap`` where it would swap compressed but ZVC cannot shrink the tensor.

    Example:
        >>> sorted(tensor_actions("compress-swap", {"keep", "swap"}))   # ZVC would expand it
        ['keep', 'swap', 'zvc-swap']
        >>> sorted(tensor_actions("compress-swap", {"keep", "swap", "zvc-swap", "zvc-keep"}))
        ['keep', 'zvc-swap']
    """
    allowed = allowed_actions(policy)
    if ZVC_SWAP in allowed and SWAP not in allowed and ZVC_SWAP not in offered:
        return allowed | {SWAP}
    return allowed
