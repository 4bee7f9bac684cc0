"""The policies the simulator compares, and what each does with every saved tensor.

=====================  ============  =========================================================
policy                 seed system   action per offloaded tensor
=====================  ============  =========================================================
``none``               PyTorch       keep
``swap``               vDNN          swap (full-size copy out, copy back before use)
``cpu-compress-swap``  vDNN++        swap in full, compress on the host after the copy out;
                                     decompress on the host before the copy back
``compress-swap``      cDMA          compress on the device, swap the compressed buffers
``cswap``              CSWAP         swap or compress-swap, chosen per tensor by the cost model
``compress-keep``      FreeLunch     compress on the device and keep it there
=====================  ============  =========================================================

Offloaded tensors are chosen as the runtime chooses them: activations (offloadable records) of at
least ``min_bytes``; parameters never. As in the runtime, the static compressing policies compress
every offloaded tensor whose dtype ZVC encodes, dense ones included (a dense tensor grows by its
bitmap and offsets): knowing which ones to leave alone is what ``cswap`` adds.

Example:
    >>> Action.ZVC_SWAP.transfers, Action.ZVC_KEEP.transfers
    (True, False)
    >>> "cswap" in POLICIES
    True
"""

from __future__ import annotations

import math

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

import torch

from cswap.codecs.encoding import Encoding
from cswap.codecs.format import DEFAULT_CHUNK_WORDS, SUPPORTED_DTYPES
from cswap.planner.actions import POLICY_TABLE, compressed_on_host_if_it_shrinks, uncompressed
from cswap.planner.codec_choice import codec_for
from cswap.planner.costmodel import TimeModel, codec_seconds, paper_compressed_nbytes, zvc_nbytes_for
from cswap.profile.trace import Trace

__all__ = ["Action", "POLICIES", "RecomputeRegion", "TensorCost", "candidates", "on_host_if_shrinks", "resolve_policies", "static_plan",
           "tensor_costs"]

#: Every policy the simulator knows, from plain PyTorch to FreeLunch: those of
#: :data:`cswap.planner.actions.POLICY_TABLE` that move tensors without recompute regions.
POLICIES: tuple[str, ...] = tuple(name for name, policy in POLICY_TABLE.items() if not policy.recomputes_without_budget)


class Action(str, Enum):
    """What happens to one saved tensor."""

    KEEP = "keep"
    SWAP = "swap"
    ZVC_SWAP = "zvc-swap"
    HOST_ZVC_SWAP = "host-zvc-swap"
    ZVC_KEEP = "zvc-keep"
    RECOMPUTE = "recompute"

    @property
    def transfers(self) -> bool:
        """Whether the tensor crosses the host link."""
        return self in (Action.SWAP, Action.ZVC_SWAP, Action.HOST_ZVC_SWAP)

    @property
    def device_codec(self) -> bool:
        """Whether the device compresses and decompresses it."""
        return self in (Action.ZVC_SWAP, Action.ZVC_KEEP)


@dataclass(frozen=True)
class RecomputeRegion:
    """Records dropped in forward and rebuilt together by running one piece of forward again in
    backward, as activation checkpointing does with a module call: when backward first needs one of
    them, compute runs ``forward_s`` again and all of them are resident from then until each one's
    own use ends.

    Attributes:
        records: indices of the records (trace order); each takes :attr:`Action.RECOMPUTE`.
        forward_s: seconds the piece of forward takes again.
        label: what it runs again (a module path).

    Example:
        >>> RecomputeRegion((3, 4, 5), forward_s=1e-3, label="transformer.h.0").records
        (3, 4, 5)
    """

    records: tuple[int, ...]
    forward_s: float
    label: str = ""

    def __post_init__(self) -> None:
        if not self.records:
            raise ValueError(f"recompute region {self.label!r} has no records")
        if not self.forward_s >= 0:
            raise ValueError(f"recompute region {self.label!r}: forward_s must be >= 0 seconds, got {self.forward_s}")


@dataclass(frozen=True)
class TensorCost:
    """Sizes and codec seconds of one record.

    Attributes:
        nbytes: uncompressed bytes.
        compressed_nbytes: its ZVC size (or the paper's ``Size*(1-Sparsity)``).
        sparsity: fraction of zeros.
        itemsize: bytes per element.
        compress_s, decompress_s: on the device.
        host_compress_s, host_decompress_s: on the host CPU.
        compressible: ZVC encodes its dtype.
        recompute_s: forward seconds of its producing op (what recomputing it in backward costs), or
            ``None`` when unknown (then it is never recomputed).
        storage_nbytes: its storage's bytes where more than ``nbytes`` (a slice of an activation:
            keeping it holds all of them), or ``None``.
    """

    nbytes: int
    compressed_nbytes: float
    sparsity: float
    itemsize: int
    compress_s: float
    decompress_s: float
    host_compress_s: float
    host_decompress_s: float
    compressible: bool = True
    recompute_s: float | None = None
    storage_nbytes: int | None = None

    @property
    def kept_nbytes(self) -> int:
        """Device bytes keeping it holds: its storage's where larger than its own."""
        return max(self.nbytes, self.storage_nbytes or 0)

    @property
    def shrinks(self) -> bool:
        """Whether compression makes it smaller."""
        return self.compressed_nbytes < self.nbytes

    def transfer_nbytes(self, action: Action) -> float:
        """Bytes that cross the link under ``action`` (host compression happens after the copy)."""
        return self.compressed_nbytes if action is Action.ZVC_SWAP else float(self.nbytes) if action.transfers else 0.0

    def resident_nbytes(self, action: Action) -> float:
        """Bytes it holds on the device between production and the end of its swap-out (or its use):
        kept, its storage's (:attr:`kept_nbytes`)."""
        if action.device_codec:
            return self.compressed_nbytes
        return float(self.kept_nbytes) if action is Action.KEEP else float(self.nbytes)


def _dtype(name: str) -> torch.dtype:
    torch_dtype = getattr(torch, name, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"trace record has unknown dtype {name!r}; expected a torch dtype name such as float32")
    return torch_dtype


def tensor_costs(
    trace: Trace,
    time_model: TimeModel,
    device_backend: str = "cuda",
    host_backend: str = "cpu",
    paper_size: bool = False,
    chunk_words: int = DEFAULT_CHUNK_WORDS,
) -> tuple[TensorCost, ...]:
    """The :class:`TensorCost` of every record of ``trace``.

    Args:
        trace: the iteration.
        time_model: (de)compression seconds (a profile's :class:`HardwareTimeModel` or a calibrated predictor).
        device_backend, host_backend: the codec backends asked of ``time_model`` for device and host work.
        paper_size: size compressed tensors as ``Size*(1-Sparsity)`` (the paper) instead of exact ZVC.
        chunk_words: ZVC chunk size for the exact size.
    """
    costs = []
    for record in trace.tensors:
        dtype = _dtype(record.dtype)
        itemsize = dtype.itemsize
        if paper_size:
            compressed = paper_compressed_nbytes(record.nbytes, record.sparsity)
        elif record.narrow_dtype:
            # the codec stores a profiled small-valued int64 narrower before ZVC (cswap.codecs.encoding)
            encoding = Encoding.named(record.dtype, record.narrow_dtype)
            compressed = float(encoding.compressed_nbytes(record.nbytes // itemsize, record.sparsity, chunk_words))
        else:
            compressed = float(zvc_nbytes_for(record.nbytes, record.sparsity, itemsize, chunk_words))
        codec, smallest = codec_for(record, math.ceil(compressed))
        if paper_size:
            codec = "zvc"
        elif codec != "zvc":  # the codec besides ZVC that the profile says gives fewer bytes, at its own speed
            compressed = float(smallest)

        def seconds(op: Literal["compress", "decompress"], backend: str) -> float:
            return codec_seconds(time_model, op, record.nbytes, record.density, itemsize, backend, codec)

        costs.append(
            TensorCost(
                nbytes=record.nbytes,
                compressed_nbytes=compressed,
                sparsity=record.sparsity,
                itemsize=itemsize,
                compress_s=seconds("compress", device_backend),
                decompress_s=seconds("decompress", device_backend),
                host_compress_s=seconds("compress", host_backend),
                host_decompress_s=seconds("decompress", host_backend),
                compressible=dtype in SUPPORTED_DTYPES,
                storage_nbytes=record.storage_nbytes,
            )
        )
    return tuple(costs)


def candidates(trace: Trace, min_bytes: int) -> list[int]:
    """Indices of the records a policy may move: offloadable activations of at least ``min_bytes``."""
    if min_bytes < 0:
        raise ValueError(f"min_bytes must be >= 0, got {min_bytes}")
    return [i for i, r in enumerate(trace.tensors) if r.offloadable and r.nbytes >= min_bytes]


def static_plan(policy: str, count: int, moved: Sequence[int], costs: Sequence[TensorCost]) -> tuple[Action, ...]:
    """The actions of every policy but ``cswap`` (which needs the cost model: see :mod:`cswap.simulate.engine`).

    Args:
        policy: one of :data:`POLICIES` except ``cswap``.
        count: number of records.
        moved: indices from :func:`candidates`.
        costs: per record, from :func:`tensor_costs`.
    """
    if policy not in _STATIC:
        raise ValueError(f"no static plan for policy {policy!r}: choose one of {', '.join(_STATIC)}")
    compressed, plain = _STATIC[policy]
    actions = [Action.KEEP] * count
    for i in moved:
        actions[i] = on_host_if_shrinks(compressed if costs[i].compressible else plain, costs[i])
    return tuple(actions)


def on_host_if_shrinks(action: Action, cost: TensorCost) -> Action:
    """``action``, but a host compression that would not shrink its tensor is a raw ``swap``, as the
    runtime plans it (:func:`cswap.planner.actions.compressed_on_host_if_it_shrinks`).

    Example:
        >>> dense = TensorCost(nbytes=1024, compressed_nbytes=1160.0, sparsity=0.0, itemsize=4, compress_s=0.0, decompress_s=0.0,
        ...                    host_compress_s=0.0, host_decompress_s=0.0)
        >>> on_host_if_shrinks(Action.HOST_ZVC_SWAP, dense).value, on_host_if_shrinks(Action.ZVC_SWAP, dense).value
        ('swap', 'zvc-swap')
    """
    return Action(compressed_on_host_if_it_shrinks(action.value, cost.nbytes, cost.compressed_nbytes))


# policy -> (action of a tensor ZVC encodes, action of one it does not); cswap decides per tensor
_STATIC: dict[str, tuple[Action, Action]] = {
    name: (Action(POLICY_TABLE[name].static_action), Action(uncompressed(POLICY_TABLE[name].static_action)))
    for name in POLICIES
    if name != "cswap"
}


def resolve_policies(policies: str | Sequence[str]) -> tuple[str, ...]:
    """``"all"``, a comma-separated string or a sequence -> a tuple of known policies.

    Raises:
        ValueError: an unknown policy, naming the valid ones.

    Example:
        >>> resolve_policies("swap,cswap")
        ('swap', 'cswap')
    """
    if isinstance(policies, str):
        policies = POLICIES if policies.strip() == "all" else [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise ValueError(f"unknown policies {unknown or '(none given)'}: choose from {', '.join(POLICIES)} or 'all'")
    return tuple(dict.fromkeys(policies))
