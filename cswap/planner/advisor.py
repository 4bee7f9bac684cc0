"""The advisor: a profiled :class:`~cswap.profile.trace.Trace` and a policy in, a :class:`Plan` out.

A plan holds one :class:`Decision` per saved-tensor key: the :class:`Action` and why, the codec
launch configs, and for the ``cswap`` policy the cost model's T and T' behind the choice. Keys are
ordinals in the iteration's pack sequence, guarded by shape and dtype; a key the plan does not know
(a graph that changed) gets the policy's :attr:`Plan.default_action`; :meth:`Plan.resolve` is
where every pack's decision is made (:mod:`cswap.planner.plan`).

Policies:

* ``none``: keep everything (plain PyTorch).
* ``swap`` (vDNN): offload every saved activation.
* ``compress-swap`` (cDMA): ZVC-compress every saved activation, then offload it.
* ``cswap`` (CSWAP): per tensor, compress-then-swap iff T < T' (:func:`cswap.planner.costmodel.decide`), or
  as a logistic decider says; otherwise a plain swap.
* ``compress-keep`` (FreeLunch): ZVC-compress and keep on the device, no transfer.

Under every policy, tensors below ``min_bytes``, parameters and buffers stay where they are, and a
dtype ZVC cannot encode is swapped (or kept) uncompressed.

Example:
    >>> from cswap.profile.trace import Trace, TensorRecord
    >>> rec = TensorRecord(key=0, shape=(1024, 1024), dtype="float32", nbytes=4 << 20, sparsity=0.5)
    >>> advisor = Advisor(policy="swap", backend="cpu", min_bytes=1024)
    >>> plan = advisor.plan(Trace(tensors=(rec,)), epoch=0)
    >>> plan.decisions[0].action, plan.decisions[0].reason
    (<Action.SWAP: 'swap'>, 'policy swap: offload every saved activation (vDNN)')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import torch

from cswap.codecs.encoding import Encoding, encodable
from cswap.codecs.format import DEFAULT_CHUNK_WORDS
from cswap.codecs.launch import Launch
from cswap.codecs.launch import LaunchLookup
from cswap.planner.actions import HOST_ZVC_SWAP, compressed_on_host_if_it_shrinks
from cswap.planner.actions import RUNTIME_POLICIES as POLICIES
from cswap.planner.codec_choice import codec_for, codecs_by_dtype
from cswap.planner.costmodel import codec_seconds, decide
from cswap.planner.plan import DEFAULT_ACTIONS, POLICY_REASONS, Action, Decision, LaunchCache, Plan, constrained
from cswap.profile.trace import Trace

__all__ = ["DEFAULT_ACTIONS", "POLICIES", "Action", "Advisor", "Decision", "Plan", "zvc_supported"]


def zvc_supported(dtype: torch.dtype | str) -> bool:
    """Whether ZVC can encode ``dtype`` (a dtype or its name without ``torch.``)."""
    return encodable(dtype)


#: What each policy would do with a tensor before the rules (:func:`cswap.planner.plan.constrained`) apply.
_WANTED: Mapping[str, Action] = MappingProxyType({**DEFAULT_ACTIONS, "cswap": Action.ZVC_SWAP})


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
                raise ValueError("the cswap policy needs a time_model (cswap.planner.costmodel.TimeModel)")
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
        launches = LaunchCache(self.backend, self.launch_lookup)
        rules: dict[str, Any] = dict(policy=self.policy, epoch=epoch, default_action=self.default_action, min_bytes=self.min_bytes,
                                     launches=launches, d2h_gbps=self.d2h_gbps, h2d_gbps=self.h2d_gbps)
        if trace is None:
            return Plan(**rules, default_reason=POLICY_REASONS[self.policy])
        kept_reasons: Mapping[str, str] = trace.meta.get("not_offloadable", {})
        decisions: dict[int, Decision] = {}
        host_bytes = 0
        duplicates: Mapping[str, int] = trace.meta.get("duplicates", {})
        for record in trace.tensors:
            base = dict(key=record.key, shape=tuple(record.shape), dtype=record.dtype, nbytes=record.nbytes, sparsity=record.sparsity,
                        module=record.module, encoded_dtype=record.narrow_dtype)
            first = duplicates.get(str(record.key))
            if first is not None and first in decisions:
                # Stored once with its first pack; should it ever not be a duplicate, treat it alike.
                decisions[record.key] = replace(decisions[first], **base, reason=f"duplicate of key {first}: stored once")
                continue
            if not record.offloadable:
                reason = kept_reasons.get(str(record.key), "not offloadable")
                decisions[record.key] = Decision(**base, action=Action.KEEP, reason=reason)
                continue
            action, reason = constrained(_WANTED[self.policy], record.nbytes, record.dtype, self.min_bytes)
            if reason is not None:
                decisions[record.key] = Decision(**base, action=action, reason=reason)
                continue
            decision = self._decide(record, base, launches)
            decisions[record.key] = decision
            if decision.action is Action.SWAP:
                host_bytes += record.nbytes
            elif decision.action is Action.ZVC_SWAP:
                host_bytes += self._compressed(record, self._chunk_words(decision))[1]
            # host-zvc-swap adds nothing: its compressed buffers live outside the arena, and its raw
            # copies only until their compression is collected (the executor sizes the arena for
            # those from the last iteration's use).
        unpacked = sorted((r for r in trace.tensors if r.unpack_at_s is not None), key=lambda r: (r.unpack_at_s, r.key))
        coded = ((r.dtype, r.nbytes, self._compressed(r, DEFAULT_CHUNK_WORDS)[0]) for r in trace.tensors if r.offloadable and encodable(r.dtype))
        return Plan(**rules, decisions=decisions, unpack_order=tuple(r.key for r in unpacked), host_bytes=host_bytes,
                    unseen_codecs=codecs_by_dtype(coded))

    @staticmethod
    def _encoding(record: Any) -> Encoding:
        """How the codec encodes ``record``'s tensor (narrower than its dtype when profiled so)."""
        return Encoding.named(record.dtype, record.narrow_dtype)

    def _compressed(self, record: Any, chunk_words: int) -> tuple[str, int]:
        """The codec that gives ``record``'s tensor the fewest bytes, and that size."""
        return codec_for(record, self._encoding(record).compressed_nbytes(self._numel(record), record.sparsity, chunk_words))

    @staticmethod
    def _numel(record: Any) -> int:
        return record.nbytes // Encoding.named(record.dtype, None).dtype.itemsize

    @staticmethod
    def _chunk_words(decision: Decision) -> int:
        return getattr(decision.compress_launch, "chunk_words", DEFAULT_CHUNK_WORDS)

    def _decide(self, record: Any, base: dict[str, Any], launch_cache: LaunchCache) -> Decision:
        if self.policy == "cpu-compress-swap":  # host compression takes the cpu backend's default launch
            codec, compressed = self._compressed(record, DEFAULT_CHUNK_WORDS)
            # a host copy no codec would shrink is moved raw, with no room set aside for a compression
            action = Action(compressed_on_host_if_it_shrinks(HOST_ZVC_SWAP, record.nbytes, compressed))
            reason = POLICY_REASONS[self.policy] if action is Action.HOST_ZVC_SWAP else (
                f"policy cpu-compress-swap: no codec would shrink it as profiled ({compressed:,d} B against {record.nbytes:,d} B): a raw swap")
            return Decision(**base, action=action, reason=reason, compressed_nbytes=compressed, codec=codec)
        if self.policy in ("none", "swap"):
            return Decision(**base, action=DEFAULT_ACTIONS[self.policy], reason=POLICY_REASONS[self.policy])
        launches = launch_cache.launches(record.dtype, record.nbytes)
        if self.policy in ("compress-swap", "compress-keep"):
            codec, compressed = self._compressed(record, getattr(launches["compress_launch"], "chunk_words", DEFAULT_CHUNK_WORDS))
            # each codec runs with the launches tuned for its own kernels
            extra = {"compressed_nbytes": compressed} if codec != "zvc" else {}
            return Decision(**base, action=DEFAULT_ACTIONS[self.policy], reason=POLICY_REASONS[self.policy], codec=codec,
                            **launch_cache.launches(record.dtype, record.nbytes, codec), **extra)
        return self._cost_decision(record, base, launches, launch_cache)

    def _cost_decision(self, record: Any, base: dict[str, Any], launches: dict[str, Launch | None], launch_cache: LaunchCache) -> Decision:
        encoding = self._encoding(record)
        encoded_nbytes = self._numel(record) * encoding.encoded_itemsize
        chunk_words = getattr(launches["compress_launch"], "chunk_words", DEFAULT_CHUNK_WORDS)
        codec, compressed = self._compressed(record, chunk_words)
        # The paper's size model knows ZVC alone; otherwise each codec at its own speed.
        timed_codec = "zvc" if self.paper_size else codec
        compress_s, decompress_s = (
            codec_seconds(self.time_model, op, encoded_nbytes, record.density, encoding.encoded_itemsize, self.backend, timed_codec)
            for op in ("compress", "decompress")
        )
        cost = decide(
            nbytes=record.nbytes,
            sparsity=record.sparsity,
            hidden_forward_s=record.hidden_forward_s,
            hidden_backward_s=record.hidden_backward_s,
            d2h_gbps=self.d2h_gbps,
            h2d_gbps=self.h2d_gbps,
            compress_s=compress_s,
            decompress_s=decompress_s,
            itemsize=encoding.dtype.itemsize,
            encoding=encoding,
            paper_size=self.paper_size,
            chunk_words=chunk_words,
            compressed_nbytes=compressed if codec != "zvc" and not self.paper_size else None,
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
        if encoding.narrowed:
            reason += f" (T costs it narrowed exactly to {encoding.encoded_name})"
        return Decision(
            **base,
            action=Action.ZVC_SWAP if compress else Action.SWAP,
            reason=reason,
            swap_s=t_prime,
            compressed_swap_s=t,
            compress_s=compress_s,
            decompress_s=decompress_s,
            compressed_nbytes=cost.compressed_nbytes,
            codec=codec if compress and not self.paper_size else "zvc",
            **(launch_cache.launches(record.dtype, record.nbytes, timed_codec) if compress else {}),
        )
