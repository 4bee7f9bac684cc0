"""Lifetimes over an iteration's events and the resident-bytes timeline."""

from __future__ import annotations

import pytest

from cswap.planner.lifetime import Lifetime, lifetimes_from_orders, lifetimes_from_trace, resident_bytes
from cswap.profile.trace import TensorRecord, Trace


def record(key: int, pack_at_s: float, unpack_at_s: float | None, **fields) -> TensorRecord:
    return TensorRecord(
        key=key, shape=(4,), dtype="float32", nbytes=16, sparsity=0.0, pack_at_s=pack_at_s, unpack_at_s=unpack_at_s, **fields
    )


def test_orders_give_events():
    events = lifetimes_from_orders([0, 1, 2], [1, None, 0], [1, None, 1])
    assert (events.forward_events, events.event_count) == (3, 5)
    assert events.lifetimes == (Lifetime(0, 4, 4), Lifetime(1, None, 4), Lifetime(2, 3, 4))


@pytest.mark.parametrize(
    "pack, unpack, free, message",
    [
        ([0, 0], [0, 1], None, "pack_order must be a permutation of 0..1"),
        ([0, 1], [0, 2], None, "the unpack orders must be a permutation of 0..1"),
        ([0, 1], [1, 0], [0, 0], "tensor 0 is freed at unpack rank 0, before its own unpack at rank 1"),
        ([0, 1], [1], None, "need one pack, unpack and free order per tensor"),
    ],
)
def test_bad_orders(pack, unpack, free, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        lifetimes_from_orders(pack, unpack, free)


def test_trace_defaults_unpack_in_reverse_pack_order_and_free_after_use():
    # unpack times tie: backward unpacks in reverse pack order; a parameter is left out
    recs = (
        record(0, 0.0, 5.0),
        record(1, 1.0, 5.0),
        TensorRecord(
            key=2, shape=(4,), dtype="float32", nbytes=16, sparsity=0.0, offloadable=False, pack_at_s=1.5, unpack_at_s=4.0
        ),
        record(3, 2.0, None),
    )
    events = lifetimes_from_trace(Trace(tensors=recs))
    assert events.lifetimes == (Lifetime(0, 4, 4), Lifetime(1, 3, 3), None, Lifetime(2, None, 4))


def test_trace_orders_follow_unpack_times_then_recorded_orders():
    by_time = (record(0, 0.0, 9.0), record(1, 1.0, 7.0), record(2, 2.0, 8.0))
    assert [lt.unpack for lt in lifetimes_from_trace(Trace(tensors=by_time)).lifetimes] == [5, 3, 4]
    recorded = (
        record(0, 0.0, 9.0, unpack_order=0, free_order=2),
        record(1, 1.0, 7.0, unpack_order=1),
        record(2, 2.0, 8.0, unpack_order=2),
    )
    assert lifetimes_from_trace(Trace(tensors=recorded)).lifetimes == (Lifetime(0, 3, 5), Lifetime(1, 4, 4), Lifetime(2, 5, 5))


def test_old_trace_dicts_still_load():
    old = {"key": 0, "shape": [4], "dtype": "float32", "nbytes": 16, "sparsity": 0.0}
    rec = TensorRecord.from_dict(old)
    assert rec.unpack_order is None and rec.free_order is None
    assert TensorRecord.from_dict({**old, "unpack_order": 3, "free_order": 4}).free_order == 4


def test_resident_bytes_adds_holds():
    assert resident_bytes(5, [(0, 4, 10), (1, 1, 5), (3, 4, 7)]).tolist() == [10, 15, 10, 17, 17]
    assert resident_bytes(3, []).tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match=r"hold \(2, 5\) is outside events 0..3"):
        resident_bytes(4, [(2, 5, 1)])
