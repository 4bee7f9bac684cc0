"""Shape families: one profile stands for every iteration of the same structure at other sizes.

Transformers are trained with dynamic padding, variable lengths and a last partial batch, so the
saved tensors of two steps differ in size but not in kind. A profile's **structure** is what stays:
per pack, in order, the dtype and the rank of the saved tensor. Two iterations of one structure
differ only in sizes, and a plan made at sizes no smaller than an iteration's serves it (every
tensor holds no more than planned). A larger iteration is planned from the profile it shares a
structure with, its sizes taken from the packs (:func:`grown_shapes`) and its times scaled from the
profile by bytes (:func:`scaled_trace`), instead of being profiled again.

Sizes the packs do not show (tensors saved inside a recompute region, which are never packed
outside it) are inferred from those they do: a size that changed in the packs seen (a sequence
length 59 that became 112) changes alike in every other shape, and so does a multiple of it (the
``4 * 59`` rows of a flattened batch) (:class:`SizeMap`).

Example:
    >>> from cswap.profile.trace import TensorRecord, Trace
    >>> recs = (TensorRecord(key=0, shape=(4, 59, 8), dtype="float32", nbytes=7552, sparsity=0.0, pack_s=1e-3),
    ...         TensorRecord(key=1, shape=(236, 8), dtype="float32", nbytes=7552, sparsity=0.0, pack_s=1e-3))
    >>> trace = Trace(tensors=recs)
    >>> structure_of(trace)
    (('float32', 3), ('float32', 2))
    >>> shapes = grown_shapes(trace, {0: (4, 112, 8)})
    >>> shapes
    {0: (4, 112, 8), 1: (448, 8)}
    >>> big = scaled_trace(trace, shapes)
    >>> [r.nbytes for r in big.tensors], round(big.tensors[1].pack_s * 1e3, 3)
    ([14336, 14336], 1.898)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from cswap.profile.trace import TensorRecord, Trace

__all__ = ["SizeMap", "Structure", "fits", "grown_shapes", "larger", "merged", "scaled_trace", "structure_of"]

#: Per pack, in order: the saved tensor's dtype name and rank.
Structure = tuple[tuple[str, int], ...]


def structure_of(trace: Trace) -> Structure:
    """The structure of a profiled iteration: ``(dtype, rank)`` of each saved tensor, in pack order."""
    return tuple((r.dtype, len(r.shape)) for r in trace.tensors)


def fits(shape: tuple[int, ...], planned: tuple[int, ...]) -> bool:
    """Whether a tensor of ``shape`` is no larger than ``planned`` in any dimension (same rank).

    Example:
        >>> fits((4, 59, 8), (4, 112, 8)), fits((4, 120, 8), (4, 112, 8)), fits((4, 8), (4, 8, 1))
        (True, False, False)
    """
    return len(shape) == len(planned) and all(a <= b for a, b in zip(shape, planned))


def larger(shape: tuple[int, ...], than: tuple[int, ...]) -> bool:
    """Whether ``shape`` (of ``than``'s rank) is larger than ``than`` in some dimension."""
    return any(a > b for a, b in zip(shape, than))


def merged(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The elementwise largest of two shapes of one rank: the least shape both fit."""
    return tuple(max(x, y) for x, y in zip(a, b))


@dataclass(frozen=True)
class SizeMap:
    """What each size of a profile became, learnt from shapes seen at both sizes.

    Attributes:
        grown: per profiled size that grew, its new size (the largest seen, where several were).
        still: sizes seen unchanged somewhere (a hidden width that happens to equal the old length).
        sequences: sizes that grew behind a leading size that did not (``[batch, sequence, ...]``):
            a sequence as it is, never a flattened batch of sequences.

    Example:
        >>> sizes = SizeMap.learn([((4, 59, 64), (4, 112, 64))])
        >>> sizes.size(59), sizes.size(236), sizes.size(64), sizes.size(7)
        (112, 448, 64, 7)

    Where only a flattened batch of sequences was seen (a loss's logits, when recompute regions
    cover the rest of the model), the sequence it is made of grows with it:

        >>> sizes = SizeMap.learn([((80, 256), (224, 256))])
        >>> sizes.size(40), sizes.size(2), sizes.size(256)
        (112, 2, 256)

    A size seen growing behind a batch that did not is a sequence, not a flattened batch of them:
    its divisors and those of its batch's multiples stay (attention scores' batch x heads, a
    head's width):

        >>> sizes = SizeMap.learn([((3, 96, 128), (3, 120, 128)), ((288, 128), (360, 128))])
        >>> sizes.size(12), sizes.size(32), sizes.size(96)
        (12, 32, 120)
    """

    grown: Mapping[int, int]
    still: frozenset[int]
    sequences: frozenset[int] = frozenset()

    @classmethod
    def learn(cls, pairs: Iterable[tuple[tuple[int, ...], tuple[int, ...]]]) -> SizeMap:
        """From ``(profiled shape, new shape)`` pairs of one rank."""
        grown: dict[int, int] = {}
        still: set[int] = set()
        sequences: set[int] = set()
        for old, new in pairs:
            for a, b in zip(old, new):
                if b > a:
                    grown[a] = max(grown.get(a, b), b)
                elif b == a:
                    still.add(a)
            if len(old) > 1 and old[0] == new[0]:
                sequences.update(a for a, b in zip(old[1:], new[1:]) if b > a)
        return cls(grown, frozenset(still), frozenset(sequences))

    def size(self, old: int) -> int:
        """What a size ``old`` of a shape the packs did not show becomes: its own growth where one
        was seen; else, where ``old`` is a multiple of a size that grew (a flattened batch of
        sequences) and was never seen unchanged, that multiple of the new size; else, where a size
        that grew, and is neither a sequence seen behind a batch that did not (:attr:`sequences`)
        nor a batch of one, is ``old`` times a smaller factor (the batch of that flattened batch of
        sequences) that divides its new size, the new size over that factor; else ``old``. A size
        both grown and seen unchanged grows (a shape inferred too large costs plan quality, and
        raises a fraction's bytes with ``none``'s peak; it never passes a budget)."""
        new = self.grown.get(old)
        if new is not None:
            return new
        if old in self.still:
            return old
        for base in sorted(self.grown, reverse=True):
            if base > 1 and old % base == 0 and old // base < base:
                return old // base * self.grown[base]
        for base in sorted(self.grown, reverse=True):
            # a factor of a flattened batch of sequences that grew: the sequence (the batch, the
            # smaller factor, stays). Not of a sequence seen as one, or a batch of one, whose
            # divisors are other sizes: BERT's [batch x heads, sequence, sequence] scores at 3 x 4
            # and 96 tokens took 12 for 8 sequences of 12, its head width 32 in [3 x 96, ...] for 9
            # of 32, and none's peak at 120 tokens for 11% more than it is.
            if any(base % seq == 0 and base // seq < seq for seq in self.sequences):
                continue
            factor = base // old if old > 1 and base % old == 0 else 0
            if 1 < factor < old and self.grown[base] % factor == 0:
                return self.grown[base] // factor
        return old


def grown_shapes(trace: Trace, seen: Mapping[int, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
    """Per key of ``trace`` whose tensor grows, its new shape: the shape ``seen`` at pack where it is
    larger than profiled, else inferred from the sizes that grew (:class:`SizeMap`), the sizes of
    what is never moved (the model's parameters: its widths) taken as unchanged.

    Args:
        trace: the profile.
        seen: per key, the shape packed at the new sizes (keys not packed, or not larger, may be
            missing); a shape of another rank than the profile's is ignored.
    """
    pairs = [(r.shape, seen[r.key]) for r in trace.tensors if r.key in seen and len(seen[r.key]) == len(r.shape)]
    # What is never moved (the model's parameters) keeps its sizes, the widths a sequence's
    # multiples could be taken for: OPT's and DistilBERT's 3072-wide feed-forward, inside recomputed
    # layers, is 32 x 96 tokens, and grew with them (none's peak at 120 tokens came out 18% high).
    pairs += [(r.shape, r.shape) for r in trace.tensors if not r.offloadable and r.key not in seen]
    sizes = SizeMap.learn(pairs)
    shapes: dict[int, tuple[int, ...]] = {}
    for record in trace.tensors:
        packed = seen.get(record.key)
        if packed is not None and len(packed) == len(record.shape):
            new = merged(record.shape, packed)
        else:
            new = merged(record.shape, tuple(sizes.size(s) for s in record.shape))
        if new != record.shape:
            shapes[record.key] = new
    return shapes


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _growth(record: TensorRecord, shape: tuple[int, ...]) -> float:
    old = _numel(record.shape)
    return _numel(shape) / old if old else 1.0


def _scaled_record(record: TensorRecord, shape: tuple[int, ...], storage_growth: float = 1.0, count: float = 1.0) -> TensorRecord:
    """``record`` at ``shape``: its bytes and what they cost (copies, codecs, the producing op's
    compute) scaled by its growth, and by ``count`` (a tensor of one shape saved that many times
    more), its storage's by ``storage_growth`` where that is more; its timestamps as they are."""
    ratio = _growth(record, shape) * count
    rebuilt = None if record.rebuilt_nbytes is None else math.ceil(record.rebuilt_nbytes * ratio)
    storage = None if record.storage_nbytes is None else math.ceil(record.storage_nbytes * max(ratio, storage_growth))
    return replace(
        record, shape=shape, nbytes=math.ceil(record.nbytes * ratio), storage_nbytes=storage, pack_s=record.pack_s * ratio,
        unpack_s=record.unpack_s * ratio, hidden_forward_s=record.hidden_forward_s * ratio,
        hidden_backward_s=record.hidden_backward_s * ratio, flops=record.flops * ratio, rebuilt_nbytes=rebuilt,
        recompute_s=None if record.recompute_s is None else record.recompute_s * ratio,
    )


def scaled_trace(trace: Trace, shapes: Mapping[int, tuple[int, ...]], counts: Mapping[int, float] | None = None) -> Trace:
    """``trace`` as if profiled with the tensors of ``shapes`` (per key; the rest as profiled), and
    each key of ``counts`` at its shape counted that many times more (one step of a loop over the
    sequence, inside a region that rebuilds every step:
    :meth:`cswap.profile.regions.RegionProfile.count_growth`).

    Bytes scale with the elements, and so do the times that follow them: a tensor's pack and
    unpack, the compute that hides its copies and its producer's recomputation. The iteration's
    clock (forward, backward, every timestamp) scales by the bytes of all the saved tensors, so
    that the order of events, which the lifetimes are made of, stays the profile's. The sparsity
    is the profile's.
    """
    if not shapes:
        return trace
    before = sum(r.nbytes for r in trace.tensors)
    growth = {r.key: _growth(r, shapes[r.key]) for r in trace.tensors if r.key in shapes}
    # A slice's storage grows as the tensor it was cut from does, whether the slice grows (a
    # sequence's share of a fused projection) or not (one step of a scan over the sequence).
    counts = {key: count for key, count in (counts or {}).items() if key not in shapes}
    records = [_scaled_record(r, shapes.get(r.key, r.shape), growth.get(r.view_of, 1.0) if r.view_of is not None else 1.0,
                              counts.get(r.key, 1.0))
               if r.key in shapes or r.key in counts or (r.storage_nbytes is not None and r.view_of in growth) else r
               for r in trace.tensors]
    after = sum(r.nbytes for r in records)
    clock = after / before if before else 1.0
    records = [replace(r, pack_at_s=r.pack_at_s * clock, unpack_at_s=None if r.unpack_at_s is None else r.unpack_at_s * clock)
               for r in records]
    meta = {**trace.meta, "planned_at": "sizes scaled from the profile"}
    return replace(trace, tensors=tuple(records), forward_s=trace.forward_s * clock, backward_s=trace.backward_s * clock, meta=meta)
