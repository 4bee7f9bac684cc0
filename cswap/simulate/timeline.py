"""The compute timeline of one iteration, as the simulator replays it.

A :class:`Timeline` says, in seconds of pure compute, when each saved tensor is produced in forward
and first needed in backward, and how long forward and backward compute last. It is read from a
:class:`~cswap.profile.trace.Trace`: the hooks' own time (``pack_s``, ``unpack_s``: profiling overhead, or
the swaps of a passive profile) is taken out, so the timeline is the compute the policies then
add their transfers and codec work to. A tensor saved twice (the profiler's ``meta["duplicates"]``)
is stored once, so its record is needed at the earliest unpack of any of its copies.

Example:
    >>> from cswap.profile.trace import TensorRecord, Trace
    >>> recs = (TensorRecord(key=0, shape=(4,), dtype="float32", nbytes=16, sparsity=0.0, pack_at_s=0.5, unpack_at_s=2.5),)
    >>> tl = Timeline.from_trace(Trace(tensors=recs, forward_s=1.0, backward_s=2.0))
    >>> tl.produced_s, tl.consumed_s, tl.forward_s, tl.backward_s
    ((0.5,), (1.5,), 1.0, 2.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cswap.profile.trace import Trace

__all__ = ["Timeline", "hidden_windows"]


@dataclass(frozen=True)
class Timeline:
    """Compute-only times of one iteration.

    Attributes:
        forward_s, backward_s: compute seconds of forward and of backward.
        produced_s: per record (trace order), forward compute before it is produced.
        consumed_s: per record, backward compute before it is first needed, or ``None``.
        unpack_rank: per record, its place among backward's first unpacks, which orders records
            needed at the same ``consumed_s`` (``None``: by record index). A profile's hook calls
            can outlast the compute between them, so records a few hooks apart share a time.
    """

    forward_s: float
    backward_s: float
    produced_s: tuple[float, ...]
    consumed_s: tuple[float | None, ...]
    unpack_rank: tuple[int | None, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.produced_s) != len(self.consumed_s):
            raise ValueError("produced_s and consumed_s must have one entry per record")
        if self.unpack_rank is not None and len(self.unpack_rank) != len(self.consumed_s):
            raise ValueError("unpack_rank must have one entry per record")
        if self.forward_s < 0 or self.backward_s < 0:
            raise ValueError(f"compute times must be >= 0, got forward {self.forward_s}, backward {self.backward_s}")

    def __len__(self) -> int:
        return len(self.produced_s)

    @property
    def compute_s(self) -> float:
        """Forward plus backward compute."""
        return self.forward_s + self.backward_s

    def forward_order(self) -> list[int]:
        """Record indices in production order."""
        return sorted(range(len(self)), key=lambda i: (self.produced_s[i], i))

    def backward_order(self) -> list[int]:
        """Indices of the records backward needs, in the order it needs them."""
        return sorted((i for i, at in enumerate(self.consumed_s) if at is not None), key=self.backward_key)

    def backward_key(self, i: int) -> tuple[float, int, int]:
        """What orders record ``i`` (one backward needs) among the others in backward."""
        rank = self.unpack_rank[i] if self.unpack_rank is not None else None
        return (self.consumed_s[i] or 0.0, i if rank is None else rank, i)

    @classmethod
    def from_trace(cls, trace: Trace, strip_hooks: bool = True, hook_residual_s: float = 0.0) -> Timeline:
        """Read the timeline of ``trace``.

        Args:
            trace: a profiled or simulated trace.
            strip_hooks: take the hooks' own seconds out of the timestamps (see module docstring).
            hook_residual_s: with ``strip_hooks``, also take out this much per hook call: the cost
                of calling into and out of a hook, which its own timing cannot see.
        """
        residual = hook_residual_s if strip_hooks else 0.0
        records = trace.tensors
        count = len(records)
        produced = [0.0] * count
        hooks_s = 0.0
        for i in sorted(range(count), key=lambda i: (records[i].pack_at_s, i)):
            produced[i] = max(records[i].pack_at_s - hooks_s, 0.0)
            if strip_hooks:
                hooks_s += records[i].pack_s + residual
        forward_s = max(trace.forward_s - hooks_s, max(produced, default=0.0))

        index_of = {r.key: i for i, r in enumerate(records)}
        duplicates = [(index_of.get(int(d)), index_of.get(int(f))) for d, f in (trace.meta.get("duplicates") or {}).items()]
        duplicates = [(d, f) for d, f in duplicates if d is not None and f is not None]
        # the first unpack of a duplicated storage is one hook call that both records carry
        shared_call = {d for d, f in duplicates
                       if (records[d].unpack_at_s, records[d].unpack_s) == (records[f].unpack_at_s, records[f].unpack_s)}

        consumed: list[float | None] = [None] * count
        rank: list[int | None] = [None] * count
        hooks_s = 0.0
        previous = 0.0
        needed = [i for i in range(count) if records[i].unpack_at_s is not None]
        for position, i in enumerate(sorted(needed, key=lambda i: (records[i].unpack_at_s, i))):
            # never before the record unpacked before it: taking hook time out must not reorder backward
            consumed[i] = previous = max(records[i].unpack_at_s - trace.forward_s - hooks_s, previous)
            rank[i] = position
            if strip_hooks and i not in shared_call:
                hooks_s += records[i].unpack_s + residual
        backward_s = max(trace.backward_s - hooks_s, max((c for c in consumed if c is not None), default=0.0))

        for d, f in duplicates:
            if consumed[d] is None:
                continue
            if consumed[f] is None or (consumed[d], rank[d]) < (consumed[f], rank[f]):
                consumed[f], rank[f] = consumed[d], rank[d]
        return cls(forward_s=forward_s, backward_s=backward_s, produced_s=tuple(produced), consumed_s=tuple(consumed),
                   unpack_rank=tuple(rank))


def hidden_windows(timeline: Timeline, moved: Sequence[int], prefetch_depth: int = 1) -> tuple[dict[int, float], dict[int, float]]:
    """``Hidden_f`` and ``Hidden_b`` of each moved record, over the records actually moved.

    ``Hidden_f``: forward compute from its production to the next moved record's (the last: to the
    end of forward). ``Hidden_b``: backward compute from the point its prefetch is issued (the use
    of the moved record ``prefetch_depth`` places earlier in backward order, or the start of
    backward) to its own use. With ``prefetch_depth=1`` these are the definitions of
    :mod:`cswap.profile.trace` restricted to ``moved``.

    Returns:
        ``(hidden_forward_s, hidden_backward_s)``, dicts keyed by record index.
    """
    if prefetch_depth < 1:
        raise ValueError(f"prefetch_depth must be >= 1, got {prefetch_depth}")
    forward = sorted(moved, key=lambda i: (timeline.produced_s[i], i))
    hidden_f = {}
    for position, i in enumerate(forward):
        end = timeline.produced_s[forward[position + 1]] if position + 1 < len(forward) else timeline.forward_s
        hidden_f[i] = max(end - timeline.produced_s[i], 0.0)
    backward = sorted((i for i in moved if timeline.consumed_s[i] is not None), key=timeline.backward_key)
    hidden_b = {}
    for position, i in enumerate(backward):
        issued = timeline.consumed_s[backward[position - prefetch_depth]] if position >= prefetch_depth else 0.0
        hidden_b[i] = max(timeline.consumed_s[i] - issued, 0.0)
    return hidden_f, hidden_b
