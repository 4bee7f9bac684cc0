"""The advisor: a profiled :class:`~cswap.trace.Trace` and a policy in, a :class:`Plan` out.

A plan holds one :class:`Decision` per saved-tensor key: the :class:`Action` and why, the codec
launch configs, and for the ``cswap`` policy the cost model's T and T' behind the choice. Keys are
ordinals in the iteration's pack sequence, guarded by shape and dtype; a key the plan does not know
(a graph that changed) gets the policy's :attr:`Plan.default_action`.

Policies:

* ``none``: keep everything (plain PyTorch).
* ``swap`` (vDNN): offload every saved activation.
* ``compress-swap`` (cDMA): ZVC-compress every saved activation, then offload it.
* ``cswap`` (CSWAP): per tensor, compress-then-swap iff T < T' (:func:`cswap.costmodel.decide`), or
  as a logistic decider says; otherwise a plain swap.
* ``compress-keep`` (FreeLunch): ZVC-compress and keep on the device, no transfer.

Under every policy, tensors below ``min_bytes``, parameters and buffers stay where they are, and a
dtype ZVC cannot encode is swapped (or kept) uncompressed.

Example:
    >>> from cswap.trace import Trace, TensorRecord
    >>> rec = TensorRecord(key=0, shape=(1024, 1024), dtype="float32", nbytes=4 << 20, sparsity=0.5)
    >>> advisor = Advisor(policy="swap", backend="cpu", min_bytes=1024)
    >>> plan = advisor.plan(Trace(tensors=(rec,)), epoch=0)
    >>> plan.decisions[0].action, plan.decisions[0].reason
    (<Action.SWAP: 'swap'>, 'policy swap: offload every saved activation (vDNN)')
"""

from __future__ import annotations

import enum
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import torch

from cswap.codecs.format import SUPPORTED_DTYPES, DEFAULT_CHUNK_WORDS
from cswap.codecs.launch import Launch
from cswap.costmodel import decide, zvc_nbytes_for
from cswap.options import POLICIES, LaunchLookup
from cswap.trace import Trace

__all__ = ["DEFAULT_ACTIONS", "POLICIES", "Action", "Advisor", "Decision", "Plan", "zvc_supported"]


class Action(str, enum.Enum):
    """What the executor does with one saved tensor."""

    KEEP = "keep"
    SWAP = "swap"
    ZVC_SWAP = "zvc-swap"
    ZVC_KEEP = "zvc-keep"

    @property
    def offloads(self) -> bool:
        """Moves the tensor to host memory."""
        return self in (Action.SWAP, Action.ZVC_SWAP)

    @property
    def compresses(self) -> bool:
        """ZVC-compresses the tensor."""
        return self in (Action.ZVC_SWAP, Action.ZVC_KEEP)

    def __str__(self) -> str:
        return self.value


#: The action of each policy for a tensor the plan does not know.
DEFAULT_ACTIONS: Mapping[str, Action] = MappingProxyType(
    {
        "none": Action.KEEP,
        "swap": Action.SWAP,
        "compress-swap": Action.ZVC_SWAP,
        "cswap": Action.SWAP,
        "compress-keep": Action.ZVC_KEEP,
    }
)

_POLICY_REASONS: Mapping[str, str] = MappingProxyType(
    {
        "none": "policy none: plain PyTorch",
        "swap": "policy swap: offload every saved activation (vDNN)",
        "compress-swap": "policy compress-swap: compress, then offload (cDMA)",
        "compress-keep": "policy compress-keep: compress and keep on the device (FreeLunch)",
        "cswap": "policy cswap: not profiled yet, offload",
    }
)

_DTYPE_NAMES = {str(d).removeprefix("torch."): d for d in SUPPORTED_DTYPES}


def zvc_supported(dtype: torch.dtype | str) -> bool:
    """Whether ZVC can encode ``dtype`` (a dtype or its name without ``torch.``)."""
    if isinstance(dtype, str):
        return dtype in _DTYPE_NAMES
    return dtype in SUPPORTED_DTYPES


@dataclass(frozen=True)
class Decision:
    """The plan for one saved-tensor key.

    Attributes:
        key: ordinal in the pack sequence.
        shape, dtype: the guard: a tensor with this key but another shape or dtype gets the default.
        nbytes: compact bytes of the tensor when profiled.
        sparsity: its fraction of zero elements when profiled.
        action: what the executor does.
        reason: why, in words.
        swap_s: T', exposed seconds of a plain swap (``cswap`` decisions only).
        compressed_swap_s: T, seconds of compress-then-swap (``cswap`` decisions only).
        compress_s, decompress_s: the predicted codec seconds behind T.
        compressed_nbytes: the compressed size T was costed at.
        compress_launch, decompress_launch: the codec launch configs (``None``: the backend default).
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

    def matches(self, shape: tuple[int, ...], dtype: str) -> bool:
        """Whether a tensor of ``shape`` and ``dtype`` passes this decision's guard."""
        return self.shape == shape and self.dtype == dtype

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (launch configs as their parameters)."""
        return {
            "key": self.key,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "nbytes": self.nbytes,
            "sparsity": self.sparsity,
            "action": self.action.value,
            "reason": self.reason,
            "swap_s": self.swap_s,
            "compressed_swap_s": self.compressed_swap_s,
            "compress_s": self.compress_s,
            "decompress_s": self.decompress_s,
            "compressed_nbytes": self.compressed_nbytes,
            "compress_launch": self.compress_launch.to_params() if self.compress_launch else None,
            "decompress_launch": self.decompress_launch.to_params() if self.decompress_launch else None,
        }


@dataclass(frozen=True)
class Plan:
    """An action per saved-tensor key, for the iterations of one epoch.

    Attributes:
        policy: the policy that made it.
        epoch: the epoch it was made for.
        default_action: the action for a key the plan does not know.
        decisions: per key, in pack order.
        unpack_order: keys in the order backward first asked for them when profiled (for prefetch).
        host_bytes: host memory the offloaded tensors need at once (compressed sizes estimated from
            the profiled sparsity), for sizing the host arena.
        d2h_gbps, h2d_gbps: the bandwidths the cost model used (0 when it was not used).
    """

    policy: str
    epoch: int
    default_action: Action
    decisions: Mapping[int, Decision] = field(default_factory=dict)
    unpack_order: tuple[int, ...] = ()
    host_bytes: int = 0
    d2h_gbps: float = 0.0
    h2d_gbps: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "decisions", MappingProxyType(dict(self.decisions)))

    def lookup(self, key: int, shape: tuple[int, ...], dtype: str) -> Decision | None:
        """The decision for ``key`` if its guard matches ``shape`` and ``dtype``, else ``None``."""
        decision = self.decisions.get(key)
        if decision is None or not decision.matches(shape, dtype):
            return None
        return decision

    def counts(self) -> dict[str, int]:
        """Decisions per action name."""
        counted = Counter(d.action.value for d in self.decisions.values())
        return {action.value: counted.get(action.value, 0) for action in Action}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "policy": self.policy,
            "epoch": self.epoch,
            "default_action": self.default_action.value,
            "decisions": [d.to_dict() for d in self.decisions.values()],
            "unpack_order": list(self.unpack_order),
            "host_bytes": self.host_bytes,
            "d2h_gbps": self.d2h_gbps,
            "h2d_gbps": self.h2d_gbps,
        }

    def __str__(self) -> str:
        lines = [f"Plan(policy={self.policy}, epoch={self.epoch}, default={self.default_action.value}, {self.counts()})"]
        for d in self.decisions.values():
            cost = ""
            if d.swap_s is not None and d.compressed_swap_s is not None:
                cost = f"  T={d.compressed_swap_s * 1e3:.3f} ms  T'={d.swap_s * 1e3:.3f} ms"
            lines.append(f"  {d.key:4d} {d.dtype:>8} {str(list(d.shape)):>20} {d.nbytes:>11,d} B  {d.action.value:8}{cost}  {d.reason}")
        return "\n".join(lines)


def _itemsize(dtype_name: str) -> int:
    return _DTYPE_NAMES[dtype_name].itemsize


def _encoded(record: Any) -> tuple[int, int]:
    """Bytes and bytes per element of ``record`` as ZVC encodes it: int64 tensors that fit a
    narrower int are narrowed exactly before compression (see :mod:`cswap.codecs.narrow`)."""
    itemsize = _itemsize(record.dtype)
    narrow = record.narrow_dtype
    if narrow is None:
        return record.nbytes, itemsize
    encoded_itemsize = _itemsize(narrow)
    return record.nbytes // itemsize * encoded_itemsize, encoded_itemsize


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


@dataclass(frozen=True)
class Advisor:
    """Makes plans for one policy on one device.

    Args:
        policy: one of :data:`POLICIES`.
        backend: the codec backend the executor uses (for time predictions and launch lookups).
        min_bytes: tensors below this stay.
        d2h_gbps, h2d_gbps: bandwidths for the cost model (``cswap`` only).
        time_model: predicts codec seconds (``cswap`` only; required there).
        decider: ``cost-model`` or ``logistic``.
        logistic_model: the logistic decider's model (``decider="logistic"``).
        paper_size: cost compressed transfers as ``Size*(1-Sparsity)``.
        launch_lookup: ``(backend, op, dtype, nbytes) -> Launch | None`` for compressed tensors.
    """

    policy: str
    backend: str
    min_bytes: int
    d2h_gbps: float = 0.0
    h2d_gbps: float = 0.0
    time_model: Any = None
    decider: str = "cost-model"
    logistic_model: Any = None
    paper_size: bool = False
    launch_lookup: LaunchLookup | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}: choose one of {', '.join(POLICIES)}")
        if self.policy == "cswap":
            if self.time_model is None:
                raise ValueError("the cswap policy needs a time_model (cswap.costmodel.TimeModel)")
            if self.d2h_gbps <= 0 or self.h2d_gbps <= 0:
                raise ValueError(f"the cswap policy needs positive bandwidths, got d2h={self.d2h_gbps} h2d={self.h2d_gbps} GB/s")

    @property
    def default_action(self) -> Action:
        """The action for tensors the plan does not know."""
        return DEFAULT_ACTIONS[self.policy]

    def plan(self, trace: Trace | None, epoch: int) -> Plan:
        """The plan for ``epoch`` from ``trace`` (``None``: no profile yet, every key gets the default).

        Args:
            trace: the epoch's profile.
            epoch: the epoch the plan is for.
        """
        if trace is None:
            return Plan(policy=self.policy, epoch=epoch, default_action=self.default_action)
        kept_reasons: Mapping[str, str] = trace.meta.get("not_offloadable", {})
        decisions: dict[int, Decision] = {}
        launch_memo: dict[tuple[str, str, int], Launch | None] = {}
        host_bytes = 0
        duplicates: Mapping[str, int] = trace.meta.get("duplicates", {})
        for record in trace.tensors:
            base = dict(key=record.key, shape=tuple(record.shape), dtype=record.dtype, nbytes=record.nbytes, sparsity=record.sparsity)
            first = duplicates.get(str(record.key))
            if first is not None and first in decisions:
                # Stored once with its first pack; should it ever not be a duplicate, treat it alike.
                decisions[record.key] = replace(decisions[first], **base, reason=f"duplicate of key {first}: stored once")
                continue
            if not record.offloadable:
                reason = kept_reasons.get(str(record.key), "not offloadable")
                decisions[record.key] = Decision(**base, action=Action.KEEP, reason=reason)
                continue
            if record.nbytes < self.min_bytes:
                reason = f"below min_bytes ({record.nbytes:,d} < {self.min_bytes:,d} B)"
                decisions[record.key] = Decision(**base, action=Action.KEEP, reason=reason)
                continue
            decision = self._decide(record, base, launch_memo)
            decisions[record.key] = decision
            if decision.action is Action.SWAP:
                host_bytes += record.nbytes
            elif decision.action is Action.ZVC_SWAP:
                encoded_nbytes, encoded_itemsize = _encoded(record)
                host_bytes += zvc_nbytes_for(encoded_nbytes, record.sparsity, encoded_itemsize, self._chunk_words(decision))
        unpacked = sorted((r for r in trace.tensors if r.unpack_at_s is not None), key=lambda r: (r.unpack_at_s, r.key))
        return Plan(
            policy=self.policy,
            epoch=epoch,
            default_action=self.default_action,
            decisions=decisions,
            unpack_order=tuple(r.key for r in unpacked),
            host_bytes=host_bytes,
            d2h_gbps=self.d2h_gbps,
            h2d_gbps=self.h2d_gbps,
        )

    @staticmethod
    def _chunk_words(decision: Decision) -> int:
        return getattr(decision.compress_launch, "chunk_words", DEFAULT_CHUNK_WORDS)

    def _decide(self, record: Any, base: dict[str, Any], launch_memo: dict[tuple[str, str, int], Launch | None]) -> Decision:
        supported = zvc_supported(record.dtype)
        if self.policy in ("none", "swap"):
            return Decision(**base, action=DEFAULT_ACTIONS[self.policy], reason=_POLICY_REASONS[self.policy])
        if not supported:
            action = Action.SWAP if self.policy != "compress-keep" else Action.KEEP
            return Decision(**base, action=action, reason=f"dtype {record.dtype} has no ZVC encoding: {action.value} uncompressed")
        launches = self._launches(record, launch_memo)
        if self.policy in ("compress-swap", "compress-keep"):
            return Decision(**base, action=DEFAULT_ACTIONS[self.policy], reason=_POLICY_REASONS[self.policy], **launches)
        return self._cost_decision(record, base, launches)

    def _cost_decision(self, record: Any, base: dict[str, Any], launches: dict[str, Launch | None]) -> Decision:
        itemsize = _itemsize(record.dtype)
        encoded_nbytes, encoded_itemsize = _encoded(record)
        compress_s = float(self.time_model.compress_s(encoded_nbytes, record.density, encoded_itemsize, self.backend))
        decompress_s = float(self.time_model.decompress_s(encoded_nbytes, record.density, encoded_itemsize, self.backend))
        cost = decide(
            nbytes=record.nbytes,
            sparsity=record.sparsity,
            hidden_forward_s=record.hidden_forward_s,
            hidden_backward_s=record.hidden_backward_s,
            d2h_gbps=self.d2h_gbps,
            h2d_gbps=self.h2d_gbps,
            compress_s=compress_s,
            decompress_s=decompress_s,
            itemsize=itemsize,
            encoded_itemsize=encoded_itemsize,
            paper_size=self.paper_size,
            chunk_words=getattr(launches["compress_launch"], "chunk_words", DEFAULT_CHUNK_WORDS),
        )
        t, t_prime = cost.compressed_swap_s, cost.swap_s
        if self.decider == "logistic":
            compress = bool(
                self.logistic_model.should_compress(
                    record.nbytes, record.sparsity, record.hidden_forward_s, record.hidden_backward_s, self.d2h_gbps, self.h2d_gbps
                )
            )
            verdict = "compress" if compress else "plain swap"
            reason = f"logistic decider: {verdict} (cost model: T={_ms(t)}, T'={_ms(t_prime)})"
        else:
            compress = cost.compress
            if compress:
                reason = f"T={_ms(t)} < T'={_ms(t_prime)}: compressing saves {_ms(t_prime - t)}"
            else:
                reason = f"T={_ms(t)} >= T'={_ms(t_prime)}: a plain swap is no slower"
        if record.narrow_dtype is not None:
            reason += f" (T costs it narrowed exactly to {record.narrow_dtype})"
        return Decision(
            **base,
            action=Action.ZVC_SWAP if compress else Action.SWAP,
            reason=reason,
            swap_s=t_prime,
            compressed_swap_s=t,
            compress_s=compress_s,
            decompress_s=decompress_s,
            compressed_nbytes=cost.compressed_nbytes,
            **(launches if compress else {}),
        )

    def _launches(self, record: Any, memo: dict[tuple[str, str, int], Launch | None]) -> dict[str, Launch | None]:
        if self.launch_lookup is None:
            return {"compress_launch": None, "decompress_launch": None}
        dtype = _DTYPE_NAMES[record.dtype]
        found: dict[str, Launch | None] = {}
        for op in ("compress", "decompress"):
            memo_key = (op, record.dtype, record.nbytes)
            if memo_key not in memo:
                try:
                    memo[memo_key] = self.launch_lookup(self.backend, op, dtype, record.nbytes)
                except Exception as error:  # a failing store or service must not stop training
                    warnings.warn(
                        f"launch_lookup({self.backend!r}, {op!r}, {dtype}, {record.nbytes}) failed: {error}; "
                        "using the backend's default launch",
                        stacklevel=3,
                    )
                    memo[memo_key] = None
            found[f"{op}_launch"] = memo[memo_key]
        return found
