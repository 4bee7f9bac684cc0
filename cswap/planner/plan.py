"""The plan: the one place that decides what happens to each saved tensor.

The advisor (:mod:`cswap.planner.advisor`) fills a :class:`Plan` with one :class:`Decision` per profiled
key; at run time the executor asks :meth:`Plan.resolve` for every pack and carries the answer out,
deciding nothing itself. :meth:`Plan.resolve` covers every case: a planned key whose guard holds,
a key the plan does not know (a changed graph), a tensor below ``min_bytes``, a dtype the encoding
cannot compress, a tensor that must never move (parameters, buffers, other devices, subclasses,
non-strided layouts: the executor states the fact, the plan turns it into a decision), a second
pack of data already stored, and the codec launch configs. Decisions made at run time for keys the
profile did not plan are recorded on the plan, so :meth:`Plan.rows` (and ``rt.plan()``'s printout
and ``to_dict``) say exactly what the executor last did with each key.

Example:
    >>> plan = Plan(policy="swap", epoch=0, default_action=Action.SWAP, min_bytes=1024)
    >>> plan.resolve(0, (8,), "float32", 32).reason
    'below min_bytes (32 < 1,024 B)'
    >>> plan.resolve(1, (4096,), "complex64", 32768).action
    <Action.SWAP: 'swap'>
    >>> [(d.key, d.action.value) for d in plan.rows().values()]
    [(0, 'keep'), (1, 'swap')]
"""

from __future__ import annotations

import enum
import math
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import torch

from cswap.budget import MemoryBudget
from cswap.codecs.encoding import dtype_named, encodable
from cswap.planner.hostpool import PoolLayout, host_pool_of
from cswap.profile.trace import Trace
from cswap.codecs.launch import DEFAULT_CHUNK_WORDS, Launch, LaunchLookup
from cswap.planner.actions import POLICY_TABLE, RUNTIME_POLICIES
from cswap.planner.costmodel import takes_codec

__all__ = ["DEFAULT_ACTIONS", "DTYPE_NAMES", "POLICY_REASONS", "Action", "Decision", "LaunchCache", "Plan", "constrained",
           "host_bytes_at_pack", "host_reserve_bytes", "serves_shape", "unsized_compression_bytes"]



def unsized_compression_bytes(nbytes: int) -> int:
    """The bytes a ZVC compression of a tensor of ``nbytes`` is taken to hold before its size is
    known: at least ZVC's most (no zero) in any dtype at the default chunk of 32 words: the raw
    bytes, a bitmap of at most an eighth (one-byte elements), offsets under a sixty-fourth, and
    256 for rounding and the host pool's alignment.

    Example:
        >>> unsized_compression_bytes(4096)
        4928
    """
    return nbytes + nbytes // 8 + nbytes // 64 + 256


def host_reserve_bytes(nbytes: int, compressed_nbytes: float | None = None) -> int:
    """The host bytes a ``host-zvc-swap`` of a tensor of ``nbytes`` sets aside for its compressed
    buffers while the worker compresses the raw copy (they are allocated beside it): the planned
    ``compressed_nbytes``, or :func:`unsized_compression_bytes` when it is not known yet.

    Example:
        >>> host_reserve_bytes(4096), host_reserve_bytes(4096, compressed_nbytes=2200)
        (4928, 2200)
    """
    if compressed_nbytes is not None and compressed_nbytes < nbytes:
        return int(compressed_nbytes)
    return unsized_compression_bytes(nbytes)


def host_bytes_at_pack(action: Action, nbytes: int, compressed_nbytes: float | None = None) -> int:
    """The host bytes a pack carrying out ``action`` on a tensor of ``nbytes`` takes at once: a
    swap's raw copy, a ``zvc-swap``'s compressed buffers (ZVC's most while not sized), or a
    ``host-zvc-swap``'s raw copy with the room its compression is written to
    (:func:`host_reserve_bytes`); 0 for an action that leaves nothing on the host. The pack's host
    check and the planner's replay of a profile (:func:`cswap.planner.budgeted.profile_peaks`) both
    ask it, so they decide alike.

    Example:
        >>> host_bytes_at_pack(Action.SWAP, 4096), host_bytes_at_pack(Action.HOST_ZVC_SWAP, 4096, compressed_nbytes=2200)
        (4096, 6296)
    """
    if action is Action.HOST_ZVC_SWAP:
        return nbytes + host_reserve_bytes(nbytes, compressed_nbytes)
    if action is Action.ZVC_SWAP:
        if compressed_nbytes is not None:
            return int(compressed_nbytes)
        return unsized_compression_bytes(nbytes)
    return nbytes if action.offloads else 0


class Action(str, enum.Enum):
    """What happens to one saved tensor.

    The executor carries out every action but ``recompute``: a recomputed tensor is never packed
    (its module runs as a recompute region, :mod:`cswap.execute.recompute`, and rebuilds it in backward).
    """

    KEEP = "keep"
    SWAP = "swap"
    ZVC_SWAP = "zvc-swap"
    ZVC_KEEP = "zvc-keep"
    RECOMPUTE = "recompute"
    HOST_ZVC_SWAP = "host-zvc-swap"

    @property
    def offloads(self) -> bool:
        """Moves the tensor to host memory."""
        return self in (Action.SWAP, Action.ZVC_SWAP, Action.HOST_ZVC_SWAP)

    @property
    def compresses(self) -> bool:
        """ZVC-compresses the tensor on the device (``host-zvc-swap`` moves it raw and compresses
        its host copy: the device sees a swap, with no codec launch and no compressed size)."""
        return self in (Action.ZVC_SWAP, Action.ZVC_KEEP)

    def __str__(self) -> str:
        return self.value


#: The action of each runtime policy for a tensor the plan does not know (:data:`POLICY_TABLE`).
DEFAULT_ACTIONS: Mapping[str, Action] = MappingProxyType(
    {name: Action(POLICY_TABLE[name].static_action) for name in RUNTIME_POLICIES}
)

#: Why each policy's default action is taken, in words.
POLICY_REASONS: Mapping[str, str] = MappingProxyType({name: POLICY_TABLE[name].reason for name in RUNTIME_POLICIES})


def serves_shape(planned_shape: Sequence[int], shape: Sequence[int]) -> bool:
    """Whether a decision planned for ``planned_shape`` serves a tensor of ``shape``: the same shape,
    or the same rank and no dimension larger (a plan serves every size up to the one it was made
    for: a shorter sequence, a smaller batch). The one size rule of :meth:`Decision.matches` and of
    the executor's planned pack hook.

    Example:
        >>> serves_shape((4, 112, 8), (4, 59, 8)), serves_shape((4, 112, 8), (4, 120, 8)), serves_shape((4, 112, 8), (4, 112))
        (True, False, False)
    """
    return planned_shape == shape or (len(planned_shape) == len(shape) and all(a <= b for a, b in zip(shape, planned_shape)))


def _dtype_name(dtype: torch.dtype | str) -> str:
    if isinstance(dtype, str):
        return dtype
    name = DTYPE_NAMES.get(dtype)
    return name if name is not None else str(dtype).removeprefix("torch.")


# The pack hook names a dtype per saved tensor: looked up, not formatted.
#: Each torch dtype's name as plans and traces spell it (``torch.bfloat16`` -> ``"bfloat16"``).
DTYPE_NAMES: Mapping[torch.dtype, str] = MappingProxyType(
    {value: name for name, value in vars(torch).items() if isinstance(value, torch.dtype) and str(value) == f"torch.{name}"}
)


def constrained(action: Action, nbytes: int, dtype: torch.dtype | str, min_bytes: int) -> tuple[Action, str | None]:
    """The rules every policy's choice obeys: a tensor below ``min_bytes`` stays, and a dtype the
    encoding cannot compress is moved (or kept) uncompressed. Returns the action and, when a rule
    changed it, why. Under a memory budget ``min_bytes`` binds nothing: a plan asks with 0 where
    the budget needs a tensor moved (:meth:`Plan._within_budget`).

    Example:
        >>> constrained(Action.ZVC_KEEP, 4096, "complex64", 0)
        (<Action.KEEP: 'keep'>, 'dtype complex64 has no ZVC encoding: keep uncompressed')
        >>> constrained(Action.SWAP, 4096, "float32", 8192), constrained(Action.SWAP, 4096, "float32", 0)
        ((<Action.KEEP: 'keep'>, 'below min_bytes (4,096 < 8,192 B)'), (<Action.SWAP: 'swap'>, None))
    """
    if nbytes < min_bytes:
        return Action.KEEP, f"below min_bytes ({nbytes:,d} < {min_bytes:,d} B)"
    if (action.compresses or action is Action.HOST_ZVC_SWAP) and not encodable(dtype):
        action = Action.SWAP if action.offloads else Action.KEEP
        return action, f"dtype {_dtype_name(dtype)} has no ZVC encoding: {action.value} uncompressed"
    return action, None


class LaunchCache:
    """The codec launch configs of compressed tensors, looked up once per ``(op, dtype, nbytes)``.

    Args:
        backend: the codec backend.
        lookup: ``(backend, op, dtype, nbytes) -> Launch | None``, or ``None`` for the backend defaults.

    Example:
        >>> LaunchCache("cpu", None).launches("float32", 4096)
        {'compress_launch': None, 'decompress_launch': None}
    """

    def __init__(self, backend: str, lookup: LaunchLookup | None) -> None:
        self.backend = backend
        self.lookup = lookup
        self._memo: dict[tuple[str, str, int, str], Launch | None] = {}

    def launches(self, dtype: str, nbytes: int, codec: str = "zvc") -> dict[str, Launch | None]:
        """``{"compress_launch": ..., "decompress_launch": ...}`` for a tensor of ``dtype`` and ``nbytes``.

        A codec besides ZVC gets the configs tuned for its own kernels where the lookup takes a
        ``codec`` keyword (as :meth:`cswap.training.kernelconfigs.KernelConfigs.launch_lookup` does),
        with the default chunk, at which the profile measured its size; otherwise its defaults
        (ZVC's configs would run its kernels with ZVC's chunks). A failing lookup (a store or
        service down) warns and falls back to the backend's default.
        """
        found: dict[str, Launch | None] = {}
        for op in ("compress", "decompress"):
            memo_key = (op, dtype, nbytes, codec)
            if memo_key not in self._memo:
                self._memo[memo_key] = self._look_up(op, dtype, nbytes, codec)
            found[f"{op}_launch"] = self._memo[memo_key]
        return found

    def _look_up(self, op: str, dtype: str, nbytes: int, codec: str) -> Launch | None:
        if self.lookup is None:
            return None
        if codec != "zvc" and not takes_codec(self.lookup):
            return None
        torch_dtype = dtype_named(dtype)
        try:
            launch = self.lookup(self.backend, op, torch_dtype, nbytes, **({"codec": codec} if codec != "zvc" else {}))
        except Exception as error:  # a failing store or service must not stop training
            warnings.warn(
                f"launch_lookup({self.backend!r}, {op!r}, {torch_dtype}, {nbytes}) failed: {error}; "
                "using the backend's default launch",
                stacklevel=4,
            )
            return None
        if codec != "zvc" and launch is not None and getattr(launch, "chunk_words", DEFAULT_CHUNK_WORDS) != DEFAULT_CHUNK_WORDS:
            launch = replace(launch, chunk_words=DEFAULT_CHUNK_WORDS)
        return launch


@dataclass(frozen=True)
class Decision:
    """What happens to one saved-tensor key.

    Attributes:
        key: ordinal in the pack sequence.
        shape, dtype: the guard: a tensor with this key but another shape or dtype gets the default.
        nbytes: compact bytes of the tensor (also part of the guard).
        sparsity: its fraction of zero elements when profiled (0 for a decision made at run time).
        action: what the executor does.
        reason: why, in words.
        swap_s: T', exposed seconds of a plain swap (``cswap`` decisions only).
        compressed_swap_s: T, seconds of compress-then-swap (``cswap`` decisions only).
        compress_s, decompress_s: the predicted codec seconds behind T.
        compressed_nbytes: the compressed size T was costed at.
        compress_launch, decompress_launch: the codec launch configs (``None``: the backend default).
        module: the module that produced the tensor (``features.3 (ReLU)``), when known.
        planned: made from the profile; False for a decision :meth:`Plan.resolve` made at run time.
        predicted_s: the seconds the memory-budget planner predicts this action adds (budget plans only).
        slack_bytes: the budget minus the planned resident bytes at the fullest event of this
            tensor's lifetime (budget plans only).
        budget_fallback: the planned action would have passed the budget at pack, so the policy's
            smallest-footprint action was taken instead.
        raw_unless_smaller: a ``zvc-keep`` that keeps the tensor raw when its encoding turns out no
            smaller (profiling under a budget, before sizes are known).
        encoded_dtype: the narrower dtype the profile found an int64 tensor fits (``"int16"``), so
            an encoding that does not wait for the device can narrow it the same way; ``None``
            otherwise.
        outgrown: made at run time for a tensor larger than its key's planned one (same dtype and
            rank): the planned action, on the tensor's own size, within the budget.
        codec: the codec a compressing action uses (``"zvc"``, ``"bitpack"``, ``"exponent"``: see
            :mod:`cswap.planner.codec_choice`); in a budget plan's other rows, the one a budget
            fallback to a compressing action takes (the profile's fewest bytes).
    """

    key: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    sparsity: float
    action: Action
    reason: str
    swap_s: float | None = None
    compressed_swap_s: float | None = None
    compress_s: float | None = None
    decompress_s: float | None = None
    compressed_nbytes: float | None = None
    compress_launch: Launch | None = None
    decompress_launch: Launch | None = None
    module: str = ""
    planned: bool = True
    predicted_s: float | None = None
    slack_bytes: int | None = None
    budget_fallback: bool = False
    raw_unless_smaller: bool = False
    encoded_dtype: str | None = None
    outgrown: bool = False
    codec: str = "zvc"

    def matches(self, shape: tuple[int, ...], dtype: str, nbytes: int | None = None) -> bool:
        """Whether a tensor of ``shape``, ``dtype`` (and ``nbytes``, when given) passes this decision's
        guard: the planned dtype and rank, no dimension larger and no more bytes than planned (a
        plan serves every size up to the one it was made for: a shorter sequence, a smaller batch).

        Example:
            >>> d = Decision(key=0, shape=(4, 112, 8), dtype="float32", nbytes=14336, sparsity=0.0, action=Action.SWAP, reason="")
            >>> d.matches((4, 59, 8), "float32", 7552), d.matches((4, 120, 8), "float32"), d.matches((4, 59, 8), "bfloat16")
            (True, False, False)
        """
        if self.dtype != dtype or (nbytes is not None and nbytes > self.nbytes):
            return False
        return serves_shape(self.shape, shape)

    def outgrown_by(self, shape: tuple[int, ...], dtype: str) -> bool:
        """Whether a tensor of ``shape`` and ``dtype`` has this decision's structure (dtype and rank)
        but is larger than planned in some dimension: a larger size of the planned iteration."""
        return self.dtype == dtype and len(self.shape) == len(shape) and any(a > b for a, b in zip(shape, self.shape))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (launch configs as their parameters)."""
        return {
            "key": self.key,
            "module": self.module,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "nbytes": self.nbytes,
            "sparsity": self.sparsity,
            "action": self.action.value,
            "reason": self.reason,
            "planned": self.planned,
            "predicted_s": self.predicted_s,
            "slack_bytes": self.slack_bytes,
            "budget_fallback": self.budget_fallback,
            "outgrown": self.outgrown,
            "swap_s": self.swap_s,
            "compressed_swap_s": self.compressed_swap_s,
            "compress_s": self.compress_s,
            "decompress_s": self.decompress_s,
            "compressed_nbytes": self.compressed_nbytes,
            "codec": self.codec,
            "compress_launch": self.compress_launch.to_params() if self.compress_launch else None,
            "decompress_launch": self.decompress_launch.to_params() if self.decompress_launch else None,
        }


@dataclass(frozen=True)
class Plan:
    """An action per saved-tensor key, for the iterations of one epoch, and the rules for the rest.

    Attributes:
        policy: the policy that made it.
        epoch: the epoch it was made for.
        default_action: the policy's action for a key the plan does not know.
        decisions: per key, in pack order, as planned from the profile.
        unpack_order: keys in the order backward first asked for them when profiled (for prefetch).
        host_bytes: host memory the offloaded tensors need at once (compressed sizes estimated from
            the profiled sparsity), for sizing the host arena.
        d2h_gbps, h2d_gbps: the bandwidths the cost model used (0 when it was not used).
        min_bytes: tensors below this stay, whatever the action.
        default_reason: the reason given with ``default_action`` (``""``: "not in the plan").
        launches: the launch configs of compressed tensors the plan did not know.
        budget_bytes: the memory budget in bytes (``None``: no budget).
        fallback_action: the policy's smallest-footprint action, taken instead of a keep or
            zvc-keep that would pass the budget at pack (``None``: no fallback).
        prefetch_bytes: the most bytes backward may fetch ahead of need under this plan
            (``None``: the runtime's ``prefetch_bytes``).
        binding: which constraint binds, in words (budget plans).
        planner: the budget planner's summary: status, predicted seconds, peak and slack bytes,
            the greedy's gap (budget plans).
        raw_unless_smaller: decisions made here for ``zvc-keep`` keep a tensor raw when its
            encoding is no smaller (profiling under a budget).
        expected_bytes: per planned key, the resident bytes the budget plan expects just before
            its pack; more than that by over the decision's ``slack_bytes`` means a kept tensor
            would pass the budget later in its lifetime, so it falls back (budget plans).
        recompute_regions: module paths run as recompute regions in the plan's iterations; with
            any, ``decisions`` are keyed by the ordinals the packs get with those regions enabled.
        recomputed: per profiled key, the decision of a tensor the regions drop and rebuild (never
            packed, so not among ``decisions``).
        host_pool: where each planned swap's host copy lives, laid out before the iteration from
            the profile's lifetimes (:func:`cswap.planner.hostpool.host_pool_of`; ``None``: every
            host copy takes a first-fit block).
        host_budget_bytes: the host memory budget in bytes (``None``: none): a swap whose host
            copy would take the host bytes held (``host_meter``) past it is kept instead, where the
            device budget leaves room (a profiling iteration, before sizes are known; a graph
            that changed since its plan).
        host_meter: what counts the host bytes saved tensors hold now: an object whose
            ``make_host_room(limit_bytes)`` frees what it can down to ``limit_bytes`` and returns
            the bytes held (the executor's :class:`cswap.execute.streams.Transfers`); ``None``: 0.
        unseen_codecs: per dtype, the codec a compressing decision made here takes for a key the
            plan does not know: the one most of the dtype's planned bytes were sized by
            (:func:`cswap.planner.codec_choice.codecs_by_dtype`); ZVC for a dtype not named.
        provisional_budget: a fraction of ``none``'s peak that no profile has resolved to bytes yet
            (the first profiling iteration under it): the device budget at a pack is then that
            fraction of the most bytes the iteration's saved tensors have held so far, counted as
            plain PyTorch holds them (the executor's ``IterationState.budget_bytes``). That is a
            lower bound of ``none``'s peak, so what the fraction resolves to holds from the first
            pack; ``budget_bytes`` stays ``None`` meanwhile.
        solution: the budget planner's solution the plan was made from
            (:class:`~cswap.planner.milp.BudgetPlan`, keyed by profiled keys), which a plan at a
            larger size of the same graph may carry (:func:`cswap.planner.solve.carry_plan`);
            ``None`` for a plan made otherwise.
    """

    policy: str
    epoch: int
    default_action: Action
    decisions: Mapping[int, Decision] = field(default_factory=dict)
    unpack_order: tuple[int, ...] = ()
    host_bytes: int = 0
    d2h_gbps: float = 0.0
    h2d_gbps: float = 0.0
    min_bytes: int = 0
    default_reason: str = ""
    launches: LaunchCache | None = field(default=None, compare=False, repr=False)
    budget_bytes: int | None = None
    fallback_action: Action | None = None
    prefetch_bytes: int | None = None
    binding: str = ""
    planner: Mapping[str, Any] = field(default_factory=dict)
    expected_bytes: Mapping[int, int] = field(default_factory=dict)
    raw_unless_smaller: bool = False
    recompute_regions: tuple[str, ...] = ()
    recomputed: Mapping[int, Decision] = field(default_factory=dict)
    host_pool: PoolLayout | None = field(default=None, compare=False, repr=False)
    host_budget_bytes: int | None = None
    host_meter: Any = field(default=None, compare=False, repr=False)
    unseen_codecs: Mapping[str, str] = field(default_factory=dict)
    provisional_budget: MemoryBudget | None = None
    solution: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "decisions", MappingProxyType(dict(self.decisions)))
        object.__setattr__(self, "recomputed", MappingProxyType(dict(self.recomputed)))
        object.__setattr__(self, "unseen_codecs", MappingProxyType(dict(self.unseen_codecs)))
        # Run-time decisions that differ from the planned ones, latest per key (see rows()).
        object.__setattr__(self, "_resolved", {})
        # The pack hook reads decisions once per saved tensor: a plain dict, not the read-only proxy.
        object.__setattr__(self, "_decisions_table", dict(self.decisions))
        # Each iteration's prefetch looks keys up in the unpack order: made once per plan.
        object.__setattr__(self, "_unpack_positions", {key: i for i, key in enumerate(self.unpack_order)})

    def with_host_pool(self, trace: Trace) -> Plan:
        """This plan with its swaps' host copies laid out in a pool from its profile ``trace``
        (:func:`cswap.planner.hostpool.host_pool_of`). A plan with recompute regions numbers its
        packs with the regions enabled, not as profiled: it stays without a pool (first fit)."""
        if self.recompute_regions:
            return self
        swapped = {key for key, decision in self.decisions.items() if decision.action is Action.SWAP}
        return replace(self, host_pool=host_pool_of(trace, swapped))

    def decision_table(self) -> dict[int, Decision]:
        """:attr:`decisions` as the plain dict the pack hook reads once per saved tensor (not a
        copy: treat it as read-only)."""
        return self._decisions_table  # type: ignore[attr-defined,no-any-return]

    def unpack_positions(self) -> dict[int, int]:
        """Each key's position in :attr:`unpack_order`, as the plain dict the prefetch reads once per
        unpack (not a copy: treat it as read-only)."""
        return self._unpack_positions  # type: ignore[attr-defined,no-any-return]

    def knows(self, key: int, shape: tuple[int, ...], dtype: torch.dtype | str) -> bool:
        """Whether ``key`` is planned for a tensor of this dtype and rank (its guard may still refuse
        one larger than planned: :meth:`Decision.outgrown_by`)."""
        planned = self._decisions_table.get(key)  # type: ignore[attr-defined]
        return planned is not None and planned.dtype == _dtype_name(dtype) and len(planned.shape) == len(shape)

    def lookup(self, key: int, shape: tuple[int, ...], dtype: str) -> Decision | None:
        """The planned decision for ``key`` if its guard matches ``shape`` and ``dtype``, else ``None``."""
        decision = self.decisions.get(key)
        if decision is None or not decision.matches(shape, dtype):
            return None
        return decision

    def resolve(
        self,
        key: int,
        shape: tuple[int, ...],
        dtype: torch.dtype | str,
        nbytes: int,
        *,
        never_moved: str | None = None,
        duplicate_of: Decision | None = None,
        resident_bytes: int = 0,
        shares_kept: bool = False,
        budget_bytes: int | None = None,
        kept_nbytes: int | None = None,
    ) -> Decision:
        """The complete decision for one pack; the executor carries it out as it is.

        Args:
            key: the pack's ordinal in the iteration.
            shape, dtype, nbytes: the tensor's shape, dtype and compact bytes.
            never_moved: why the tensor must stay where it is (a parameter, another device...), if so.
            duplicate_of: the decision of the pack whose data this one shares (stored once).
            resident_bytes: what the executor holds on the device now; under a budget, a keep or
                zvc-keep that would take it past ``budget_bytes`` becomes ``fallback_action``.
            shares_kept: another pack already keeps this tensor's storage (another view of it), so
                keeping this one too adds nothing and the budget does not make it fall back.
            budget_bytes: the device budget at this pack where it moves with the iteration
                (:attr:`provisional_budget`); ``None``: :attr:`budget_bytes`.
            kept_nbytes: what keeping the tensor holds where more than ``nbytes``: its storage's
                bytes, for a view of a larger one (``None``: ``nbytes``).

        Returns:
            The planned :class:`Decision` when its guard holds and the facts agree with it; else a
            decision made now from the policy's default and the rules (:func:`constrained`), with
            its launch configs. Either way it is recorded, so :meth:`rows` shows it.
        """
        planned = self._decisions_table.get(key)  # type: ignore[attr-defined]
        outgrown = None
        if planned is not None and not planned.matches(shape, _dtype_name(dtype), nbytes):
            if planned.outgrown_by(shape, _dtype_name(dtype)):
                outgrown = planned
            planned = None
        if planned is not None and (
            (never_moved is not None and planned.action is Action.KEEP and planned.reason == never_moved)
            or (duplicate_of is not None and planned.action is duplicate_of.action)
            or (
                never_moved is None
                and duplicate_of is None
                and (self.budget_bytes is None or planned.action.offloads or planned.action is self.fallback_action)
                and (self.host_budget_bytes is None or not planned.action.offloads)
            )
        ):
            # The pack hook's common case, decided without building anything: the planned
            # decision, whose guard holds, and no budget check can change it.
            resolved: dict[int, Decision] = self._resolved  # type: ignore[attr-defined]
            if resolved:
                resolved.pop(key, None)
            return planned
        name = _dtype_name(dtype)
        module = planned.module if planned is not None else ""
        facts: dict[str, Any] = dict(key=key, shape=shape, dtype=name, nbytes=nbytes, sparsity=0.0, module=module, planned=False)
        if never_moved is not None:
            if planned is not None and planned.action is Action.KEEP and planned.reason == never_moved:
                decision = planned
            else:
                decision = Decision(**facts, action=Action.KEEP, reason=never_moved)
        elif duplicate_of is not None:
            if planned is not None and planned.action is duplicate_of.action:
                decision = planned
            else:
                decision = Decision(**facts, action=duplicate_of.action, reason=f"duplicate of key {duplicate_of.key}: stored once")
        elif planned is not None:
            decision = planned
        elif outgrown is not None:
            decision = self._outgrown(outgrown, shape, name, nbytes)
        else:
            action, why = constrained(self.default_action, nbytes, name, self.min_bytes)
            reason = why or self.default_reason or f"key {key} ({name} {list(shape)}) not in the plan: policy {self.policy}'s default"
            # the codec its dtype took in the plan, also the one a budget fallback to compressing takes
            codec = self.unseen_codecs.get(name, "zvc")
            launches = self.launches.launches(name, nbytes, codec) if action.compresses and self.launches is not None else {}
            decision = Decision(**facts, action=action, reason=reason, raw_unless_smaller=self.raw_unless_smaller, codec=codec,
                                **launches)
        if never_moved is None and duplicate_of is None and not (shares_kept and decision.action is Action.KEEP):
            decision = self._within_budget(decision, resident_bytes, self.budget_bytes if budget_bytes is None else budget_bytes,
                                           kept_nbytes)
        resolved = self._resolved  # type: ignore[attr-defined]
        if decision is planned:
            resolved.pop(key, None)
        else:
            resolved[key] = decision
        return decision

    def _outgrown(self, planned: Decision, shape: tuple[int, ...], dtype: str, nbytes: int) -> Decision:
        """The decision for a tensor larger than ``planned`` (same dtype and rank): the planned action
        on the tensor's own size, the budget checked at pack as for any decision made at run time."""
        launches = self.launches.launches(dtype, nbytes, planned.codec) if planned.action.compresses and self.launches is not None else {}
        reason = (f"larger than planned ({list(shape)}, planned {list(planned.shape)}): its planned {planned.action.value}, "
                  "within the budget at pack")
        return replace(planned, shape=tuple(shape), nbytes=nbytes, reason=reason, planned=False, outgrown=True,
                       compressed_nbytes=None, predicted_s=None, slack_bytes=None, **launches)

    def _within_budget(self, decision: Decision, resident_bytes: int, budget_bytes: int | None,
                       kept_nbytes: int | None = None) -> Decision:
        """``decision``, or the fallback action when keeping it (``kept_nbytes`` as :meth:`resolve`'s)
        would pass the device budget ``budget_bytes`` now, or a keep when its host copy would pass
        the host budget (:meth:`_within_host_budget`)."""
        decision = self._within_device_budget(decision, resident_bytes, budget_bytes, kept_nbytes)
        if self.host_budget_bytes is not None and decision.action.offloads:
            decision = self._within_host_budget(decision, resident_bytes, budget_bytes, kept_nbytes)
        return decision

    def _within_host_budget(self, decision: Decision, resident_bytes: int, budget_bytes: int | None,
                            kept_nbytes: int | None = None) -> Decision:
        """``decision``, or a keep when its host copy would take the host bytes held past the host
        budget and keeping it leaves the device budget held. Where neither fits, the device budget
        comes first (a device out of memory stops training; the host copy is counted, and the
        plan made from this profile says which budget binds). The meter first frees what it can
        (pending host compressions' raw copies), down to what the copy needs."""
        meter = self.host_meter
        size = host_bytes_at_pack(decision.action, decision.nbytes, decision.compressed_nbytes)
        assert self.host_budget_bytes is not None
        held = 0 if meter is None else int(meter.make_host_room(self.host_budget_bytes - size))
        if held + size <= self.host_budget_bytes:
            return decision
        if budget_bytes is not None and resident_bytes + max(decision.nbytes, kept_nbytes or 0) > budget_bytes:
            return decision
        reason = (f"host budget fallback: {held:,d} B on the host at pack, its {decision.action.value} copy of {size:,d} B would "
                  f"pass the {self.host_budget_bytes:,d} B host budget; keep instead")
        return replace(decision, action=Action.KEEP, reason=reason, planned=False, budget_fallback=True, compress_launch=None,
                       decompress_launch=None)

    @property
    def swaps_stand(self) -> bool:
        """Whether :meth:`resolve` returns a planned swap whose guard holds as it is, whatever is
        held when it is packed (the pack hook then takes it without asking): not under a host
        budget, which may turn it into a keep."""
        return self.host_budget_bytes is None

    def resolved_table(self) -> dict[int, Decision]:
        """The decisions :meth:`resolve` made instead of the planned ones, by key, as the plain dict
        :meth:`rows` merges (not a copy). A pack hook that took a key's planned decision as it is,
        without calling :meth:`resolve`, pops the key from it, as :meth:`resolve` does."""
        return self._resolved  # type: ignore[attr-defined,no-any-return]

    def keeps_within_budget(self, decision: Decision, resident_bytes: int, budget_bytes: int | None = None,
                            kept_nbytes: int | None = None) -> bool:
        """Whether ``decision`` stands under the device budget with ``resident_bytes`` held now: it
        moves the tensor, the policy has nothing to fall back to, or keeping it stays within the
        budget and within the slack the plan left it (:meth:`resolve`'s rule). ``budget_bytes``,
        ``kept_nbytes``: as :meth:`resolve`'s."""
        limit = self.keep_limit_bytes(decision, budget_bytes, kept_nbytes)
        return limit is None or resident_bytes <= limit

    def keep_limit_bytes(self, decision: Decision, budget_bytes: int | None = None, kept_nbytes: int | None = None) -> float | None:
        """The most resident bytes at which ``decision`` stands under the device budget
        (:meth:`keeps_within_budget`; ``budget_bytes``, ``kept_nbytes`` as :meth:`resolve`'s); ``None`` when it
        stands whatever is held. A pack hook that keeps this decision's tensor works it out once
        per plan and compares, instead of asking.

        Example:
            >>> plan = Plan("swap", 0, Action.SWAP, budget_bytes=100, fallback_action=Action.SWAP, expected_bytes={3: 40})
            >>> keep = Decision(key=3, shape=(4,), dtype="float32", nbytes=16, sparsity=0.0,
            ...                 action=Action.KEEP, reason="fits", slack_bytes=10)
            >>> plan.keep_limit_bytes(keep), plan.keeps_within_budget(keep, 50), plan.keeps_within_budget(keep, 51)
            (50, True, False)
        """
        budget = self.budget_bytes if budget_bytes is None else budget_bytes
        fallback = self.fallback_action
        if budget is None or fallback is None or decision.action.offloads or decision.action is fallback:
            return None
        held, expected = self._keep_facts(decision, kept_nbytes)
        limit: float = budget - held
        slack = decision.slack_bytes
        if slack is not None:  # the resident bytes may run over what the plan expected by the slack
            limit = min(limit, expected + slack if expected is not None else (math.inf if slack >= 0 else -math.inf))
        return limit

    def _keep_facts(self, decision: Decision, kept_nbytes: int | None = None) -> tuple[int, int | None]:
        """What keeping ``decision``'s tensor holds on the device (``kept_nbytes`` as :meth:`resolve`'s),
        and the resident bytes the plan expected before its pack (``None``: no expectation)."""
        held = max(decision.nbytes, kept_nbytes or 0)
        if decision.action is Action.ZVC_KEEP and decision.compressed_nbytes is not None:
            held = min(held, int(decision.compressed_nbytes))
        return held, self.expected_bytes.get(decision.key) if decision.planned else None

    def _within_device_budget(self, decision: Decision, resident_bytes: int, budget_bytes: int | None,
                              kept_nbytes: int | None = None) -> Decision:
        """``decision``, or the fallback action when keeping it (``kept_nbytes`` as :meth:`resolve`'s)
        would pass the device budget now (``budget_bytes``, as :meth:`resolve` resolved it: ``None``,
        no budget), a tensor below ``min_bytes`` too.

        Example:
            >>> plan = Plan("swap", 0, Action.SWAP, min_bytes=1024, budget_bytes=100, fallback_action=Action.SWAP)
            >>> fits = plan.resolve(0, (8,), "float32", 32, resident_bytes=60)
            >>> passes = plan.resolve(1, (8,), "float32", 32, resident_bytes=80)
            >>> fits.action, passes.action
            (<Action.KEEP: 'keep'>, <Action.SWAP: 'swap'>)
        """
        if self.keeps_within_budget(decision, resident_bytes, budget_bytes, kept_nbytes):
            return decision
        fallback = self.fallback_action
        assert fallback is not None and budget_bytes is not None
        held, expected = self._keep_facts(decision, kept_nbytes)
        drift = resident_bytes - expected if expected is not None else 0
        # min_bytes binds nothing under a budget: a tensor below it is kept while the budget allows
        # (the keep above), and moved when keeping it would pass the budget
        action, why = constrained(fallback, decision.nbytes, decision.dtype, 0)
        if action is decision.action or (why is not None and not action.offloads):
            return decision  # the rules leave nothing smaller (no encoding, nothing to fall back to)
        launches = self.launches.launches(decision.dtype, decision.nbytes, decision.codec) if action.compresses and self.launches is not None else {}
        reason = (f"budget fallback: {resident_bytes:,d} B resident at pack ({drift:+,d} B over the plan), "
                  f"{decision.action.value} of {held:,d} B would pass the {budget_bytes:,d} B budget; {action.value} instead")
        return replace(decision, action=action, reason=reason, planned=False, budget_fallback=True, **launches)

    def rows(self) -> Mapping[int, Decision]:
        """Per key, in key order, what the executor last did: the planned decision, or the one
        :meth:`resolve` made instead at run time (a changed graph, a key never profiled)."""
        merged = {**self.decisions, **dict(self._resolved)}  # type: ignore[attr-defined]
        return MappingProxyType(dict(sorted(merged.items())))

    def counts(self) -> dict[str, int]:
        """Rows per action name (recomputed tensors included)."""
        counted = Counter(d.action.value for d in (*self.rows().values(), *self.recomputed.values()))
        return {action.value: counted.get(action.value, 0) for action in Action}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``decisions`` are the :meth:`rows`)."""
        return {
            "policy": self.policy,
            "epoch": self.epoch,
            "default_action": self.default_action.value,
            "min_bytes": self.min_bytes,
            "decisions": [d.to_dict() for d in self.rows().values()],
            "unpack_order": list(self.unpack_order),
            "host_bytes": self.host_bytes,
            "d2h_gbps": self.d2h_gbps,
            "h2d_gbps": self.h2d_gbps,
            "budget_bytes": self.budget_bytes,
            "host_budget_bytes": self.host_budget_bytes,
            "prefetch_bytes": self.prefetch_bytes,
            "binding": self.binding,
            "planner": dict(self.planner),
            "recompute_regions": list(self.recompute_regions),
            "recomputed": [d.to_dict() for d in self.recomputed.values()],
            "unseen_codecs": dict(self.unseen_codecs),
        }

    def __str__(self) -> str:
        lines = [f"Plan(policy={self.policy}, epoch={self.epoch}, default={self.default_action.value}, {self.counts()})"]
        if self.budget_bytes is not None:
            lines.append(f"  budget {self.budget_bytes:,d} B" + (f"; binds: {self.binding}" if self.binding else ""))
        if self.recompute_regions:
            lines.append(f"  recompute regions: {', '.join(repr(p) for p in self.recompute_regions)}; "
                         "packs are numbered as they run with them (recomputed tensors last, by profiled key)")
            # the ledger (stats()) counts rebuilt tensors from the recomputation itself: say where the plan differs
            lines.append("  rebuilt tensors are planned from the event before their region's first unpack, beside what that "
                         "event's node frees, and views of a region's keyword inputs at their storage's bytes; a run holds "
                         "them from its recomputation, after that node, and those views in no new memory (stats() counts so)")
        rows = [*self.rows().values(), *self.recomputed.values()]
        width = max((len(d.module) for d in rows), default=0)
        for d in rows:
            cost = ""
            if d.swap_s is not None and d.compressed_swap_s is not None:
                cost = f"  T={d.compressed_swap_s * 1e3:.3f} ms  T'={d.swap_s * 1e3:.3f} ms"
            if d.predicted_s is not None:
                cost += f"  predicted {d.predicted_s * 1e3:.3f} ms"
            if d.slack_bytes is not None:
                cost += f"  slack {d.slack_bytes:,d} B"
            module = f"  {d.module:<{width}}" if width else ""
            lines.append(f"  {d.key:4d}{module} {d.dtype:>8} {list(d.shape)!s:>20} {d.nbytes:>11,d} B  {d.action.value:8}{cost}  {d.reason}")
        return "\n".join(lines)
