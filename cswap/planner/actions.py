"""The actions, and the one table of policies: what each policy does with every saved tensor.

Action names are the values of :class:`cswap.planner.plan.Action` (and of the simulator's actions).
:data:`POLICY_TABLE` is the only place a policy is described; the runtime's options, the plan's
defaults, the budgeted and region planners, the simulator and the command line all read it.

=====================  ======================  ====================================  =========
policy                 actions under a budget  system it reproduces                  runtime
=====================  ======================  ====================================  =========
``none``               keep                    plain PyTorch                         yes
``swap``               keep, swap              vDNN                                  yes
``cpu-compress-swap``  keep, host-zvc-swap     vDNN++ (compression on the host CPU)  yes
``compress-swap``      keep, zvc-swap          cDMA (static compression)             yes
``cswap``              every action (*)        CSWAP's cost model, generalised       yes
``compress-keep``      keep, zvc-keep          FreeLunch                             yes
``recompute``          keep, recompute         checkpointing (Chen et al., MONeT)    yes
``capuchin``           keep, swap, recompute   Capuchin (its greedy, not the MILP)   yes
``ac-full``            (none: a fixed plan)    activation checkpointing per layer    yes
=====================  ======================  ====================================  =========

(*) ``host-zvc-swap`` only under a host memory budget: without one it is never planned (it moves
the same raw bytes as ``swap`` and adds the host codec's time), so plans without a host budget are
what they were.

``ac-full`` recomputes every repeated layer (the blocks of the model's largest list of identical
modules, as Hugging Face's ``gradient_checkpointing_enable()`` does) and keeps everything else,
whatever the budget: under one, the least budget it meets is its own peak
(:mod:`cswap.planner.regions`). It is the simulator's strategy of the same name, carried out.

Compression never stores more than the raw bytes, so a tensor ZVC would not shrink (or whose dtype
it cannot encode) gets no ``zvc`` option; a policy that swaps only compressed (``compress-swap``)
swaps such a tensor raw, as cDMA does (:func:`tensor_actions`), and ``compress-keep`` keeps it.

``cpu-compress-swap`` moves every tensor raw, as ``swap`` does, and compresses the host copies on
worker threads (:mod:`cswap.execute.hostcodec`): it saves host memory, not device memory. Under a
host budget the planner offers ``host-zvc-swap`` (priced with the ``cpu`` backend's codec times, its
host copy compressed once the worker is done) to ``cpu-compress-swap`` and to ``cswap``; without
one, or for a tensor ZVC cannot encode or would not shrink, it offers none, and a planned ``swap``
stands in for it (:func:`tensor_actions`) that ``cpu-compress-swap`` carries out as
``host-zvc-swap`` (:func:`carried_out`); the runtime keeps a tensor that would not shrink a raw swap.

Example:
    >>> sorted(allowed_actions("swap"))
    ['keep', 'swap']
    >>> single_mechanism_policies()
    ('swap', 'compress-swap', 'compress-keep', 'recompute')
    >>> POLICY_TABLE["compress-swap"].system, RUNTIME_POLICIES[-2:]
    ('cDMA', ('capuchin', 'ac-full'))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "ACTIONS",
    "HOST_ZVC_SWAP",
    "KEEP",
    "POLICY_ACTIONS",
    "POLICY_TABLE",
    "RECOMPUTE",
    "RECOMPUTING_POLICIES",
    "RUNTIME_POLICIES",
    "SWAP",
    "ZVC_KEEP",
    "ZVC_SWAP",
    "Policy",
    "allowed_actions",
    "carried_out",
    "compressed_on_host_if_it_shrinks",
    "single_mechanism_policies",
    "tensor_actions",
    "uncompressed",
]

KEEP = "keep"
SWAP = "swap"
ZVC_SWAP = "zvc-swap"
ZVC_KEEP = "zvc-keep"
RECOMPUTE = "recompute"
#: Swap in full, then compress the host copy on worker threads (vDNN++). Offered by the planner only
#: under a host budget (:func:`cswap.planner.problem.build_problem`), priced as a swap plus the host
#: codec; elsewhere a swap stands in for it (:func:`tensor_actions`).
HOST_ZVC_SWAP = "host-zvc-swap"

#: Every action the planner chooses among without a host budget (``host-zvc-swap`` joins them under one).
ACTIONS: tuple[str, ...] = (KEEP, SWAP, ZVC_SWAP, ZVC_KEEP, RECOMPUTE)


@dataclass(frozen=True)
class Policy:
    """One policy: the system it reproduces and what it does with each saved tensor.

    Attributes:
        name: what a user passes as ``policy=``.
        system: the system of the literature it reproduces.
        static_action: without a budget, what it does with every movable tensor (and with a key the
            plan does not know); ``cswap`` decides per tensor once profiled, this is before.
        reason: :attr:`static_action`'s reason, as a plan row prints it.
        budget_actions: the actions it may use under a memory budget (empty: it is not planned under one).
        profile_action: under a budget, how the profiling iteration stores each movable tensor: its
            smallest footprint, so the iteration fits any budget the policy can meet.
        fallback_action: under a budget, how a tensor that would pass it is moved instead (``None``:
            the policy has no moving action).
        region_planner: with recompute regions, the policy that plans the tensors outside them
            (``None``: it never recomputes regions).
        recomputes_without_budget: it recomputes even without a budget (so it needs ``model=``).
        in_runtime: :class:`cswap.Runtime` runs it (otherwise only the simulator does).
        checkpoints_layers: its recompute regions are every repeated layer, a fixed choice (not
            the region planner's), and it keeps everything else.
    """

    name: str
    system: str
    static_action: str
    reason: str
    budget_actions: frozenset[str] = frozenset()
    profile_action: str = KEEP
    fallback_action: str | None = None
    region_planner: str | None = None
    recomputes_without_budget: bool = False
    in_runtime: bool = True
    checkpoints_layers: bool = False


# Profiling a recomputing policy swaps every tensor (Capuchin's passive mode): it keeps nothing the
# plan might later drop, and its regions are not enabled yet.
_PASSIVE = SWAP

#: Every policy, in the order tables list them.
POLICY_TABLE: Mapping[str, Policy] = MappingProxyType({
    p.name: p
    for p in (
        Policy("none", "plain PyTorch", KEEP, "policy none: plain PyTorch", frozenset({KEEP})),
        Policy("swap", "vDNN", SWAP, "policy swap: offload every saved activation (vDNN)", frozenset({KEEP, SWAP}),
               profile_action=SWAP, fallback_action=SWAP),
        Policy("cpu-compress-swap", "vDNN++", HOST_ZVC_SWAP, "policy cpu-compress-swap: offload, then compress on the host (vDNN++)",
               frozenset({KEEP, HOST_ZVC_SWAP}), profile_action=HOST_ZVC_SWAP, fallback_action=HOST_ZVC_SWAP),
        Policy("compress-swap", "cDMA", ZVC_SWAP, "policy compress-swap: compress, then offload (cDMA)", frozenset({KEEP, ZVC_SWAP}),
               profile_action=ZVC_SWAP, fallback_action=ZVC_SWAP),
        # cswap may choose host-zvc-swap, which the planner offers only under a host budget.
        Policy("cswap", "CSWAP", SWAP, "policy cswap: not profiled yet, offload", frozenset({*ACTIONS, HOST_ZVC_SWAP}),
               profile_action=SWAP, fallback_action=SWAP, region_planner="cswap"),
        Policy("compress-keep", "FreeLunch", ZVC_KEEP, "policy compress-keep: compress and keep on the device (FreeLunch)",
               frozenset({KEEP, ZVC_KEEP}), profile_action=ZVC_KEEP),
        Policy("recompute", "checkpointing (Chen et al., MONeT)", KEEP, "policy recompute: not profiled yet, keep",
               frozenset({KEEP, RECOMPUTE}), profile_action=_PASSIVE, region_planner="none", recomputes_without_budget=True),
        Policy("capuchin", "Capuchin", KEEP, "policy capuchin: not profiled yet, keep", frozenset({KEEP, SWAP, RECOMPUTE}),
               profile_action=_PASSIVE, fallback_action=SWAP, region_planner="capuchin", recomputes_without_budget=True),
        Policy("ac-full", "activation checkpointing per layer (Chen et al.; Hugging Face)", KEEP,
               "policy ac-full: not profiled yet, keep", profile_action=_PASSIVE, region_planner="none",
               recomputes_without_budget=True, checkpoints_layers=True),
    )
})

#: The policies :class:`cswap.Runtime` runs.
RUNTIME_POLICIES: tuple[str, ...] = tuple(p.name for p in POLICY_TABLE.values() if p.in_runtime)

#: Policies that recompute without a budget (they need ``model=``).
RECOMPUTING_POLICIES: tuple[str, ...] = tuple(p.name for p in POLICY_TABLE.values() if p.recomputes_without_budget)

#: Policy -> the actions it may use under a budget.
POLICY_ACTIONS: Mapping[str, frozenset[str]] = MappingProxyType(
    {p.name: p.budget_actions for p in POLICY_TABLE.values() if p.budget_actions}
)


def uncompressed(action: str) -> str:
    """What ``action`` becomes for a tensor ZVC cannot encode: the same move, without compression.

    Example:
        >>> uncompressed(ZVC_SWAP), uncompressed(ZVC_KEEP), uncompressed(HOST_ZVC_SWAP), uncompressed(SWAP)
        ('swap', 'keep', 'swap', 'swap')
    """
    return {ZVC_SWAP: SWAP, HOST_ZVC_SWAP: SWAP, ZVC_KEEP: KEEP}.get(action, action)


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
    """The policies that add exactly one device mechanism to ``keep`` (``cpu-compress-swap`` is not
    one: on the device its ``host-zvc-swap`` is ``swap``'s mechanism)."""
    return tuple(p for p, actions in POLICY_ACTIONS.items() if len(actions) == 2 and HOST_ZVC_SWAP not in actions)


def tensor_actions(policy: str, offered: frozenset[str] | set[str]) -> frozenset[str]:
    """The actions ``policy`` may use on a tensor whose options have the actions ``offered``:
    its action set, plus a raw ``swap`` where it would swap compressed but no compressed swap is offered.

    Example:
        >>> sorted(tensor_actions("compress-swap", {"keep", "swap"}))   # ZVC would expand it
        ['keep', 'swap', 'zvc-swap']
        >>> sorted(tensor_actions("compress-swap", {"keep", "swap", "zvc-swap", "zvc-keep"}))
        ['keep', 'zvc-swap']
        >>> sorted(tensor_actions("cpu-compress-swap", {"keep", "swap", "zvc-swap"}))   # swap stands in
        ['host-zvc-swap', 'keep', 'swap']
        >>> sorted(tensor_actions("cpu-compress-swap", {"keep", "swap", "host-zvc-swap"}))   # under a host budget
        ['host-zvc-swap', 'keep']
    """
    allowed = allowed_actions(policy)
    if HOST_ZVC_SWAP in allowed and HOST_ZVC_SWAP not in offered:
        # No host-zvc-swap option (no host budget, or ZVC cannot shrink the tensor): on the device
        # it is a swap (the raw bytes out and back, the host codec off the device's path), which
        # stands in for it and is carried out as host-zvc-swap (carried_out).
        return allowed | {SWAP}
    if ZVC_SWAP in allowed and SWAP not in allowed and ZVC_SWAP not in offered:
        return allowed | {SWAP}
    return allowed


def carried_out(policy: str, planned: str) -> str:
    """What ``policy`` carries out for the planner's choice ``planned``: a policy that swaps only by
    compressing on the host carries a planned ``swap`` (the stand-in of :func:`tensor_actions`) out
    as ``host-zvc-swap``; a policy that may swap raw (``cswap``) carries it out as it is.

    Example:
        >>> carried_out("cpu-compress-swap", SWAP), carried_out("swap", SWAP), carried_out("cpu-compress-swap", KEEP)
        ('host-zvc-swap', 'swap', 'keep')
        >>> carried_out("cswap", SWAP), carried_out("cswap", HOST_ZVC_SWAP)
        ('swap', 'host-zvc-swap')
    """
    if planned == SWAP:
        actions = POLICY_ACTIONS.get(policy, frozenset())
        if HOST_ZVC_SWAP in actions and SWAP not in actions:
            return HOST_ZVC_SWAP
    return planned


def compressed_on_host_if_it_shrinks(action: str, nbytes: int, compressed_nbytes: float | None) -> str:
    """``action``, but a ``host-zvc-swap`` whose compression would not shrink its tensor of
    ``nbytes`` (``compressed_nbytes`` as profiled; ``None``: not known) is a raw ``swap``: its host
    copy would be compressed only for the result to be dropped. The runtime's plans and the
    simulator's both ask it.

    Example:
        >>> compressed_on_host_if_it_shrinks(HOST_ZVC_SWAP, 1024, 1160), compressed_on_host_if_it_shrinks(HOST_ZVC_SWAP, 1024, 300)
        ('swap', 'host-zvc-swap')
        >>> compressed_on_host_if_it_shrinks(ZVC_SWAP, 1024, 1160)
        'zvc-swap'
    """
    if action == HOST_ZVC_SWAP and (compressed_nbytes is None or compressed_nbytes >= nbytes):
        return SWAP
    return action
