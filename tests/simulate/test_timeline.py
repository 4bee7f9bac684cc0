"""Reading a profiled trace: hook time taken out, duplicates folded, hidden windows."""

from __future__ import annotations

import pytest

from cswap.profile.trace import TensorRecord, Trace
from cswap.simulate.timeline import Timeline, hidden_windows


def _record(key, pack_at, unpack_at, pack_s=0.0, unpack_s=0.0, offloadable=True):
    return TensorRecord(
        key=key, shape=(4,), dtype="float32", nbytes=16, sparsity=0.0, offloadable=offloadable,
        pack_at_s=pack_at, unpack_at_s=unpack_at, pack_s=pack_s, unpack_s=unpack_s,
    )


def test_hook_time_is_taken_out():
    # packs at 1.0 and 2.5 took 0.5 s each; unpacks at 4.5 and 6.0 (forward ended at 4.0) took 0.25 s
    trace = Trace(
        tensors=(_record(0, 1.0, 6.0, pack_s=0.5, unpack_s=0.25), _record(1, 2.5, 4.5, pack_s=0.5, unpack_s=0.25)),
        forward_s=4.0,
        backward_s=3.0,
    )
    timeline = Timeline.from_trace(trace)
    assert timeline.produced_s == (1.0, 2.0)
    assert timeline.forward_s == 3.0
    assert timeline.consumed_s == (1.75, 0.5)
    assert timeline.backward_s == 2.5
    raw = Timeline.from_trace(trace, strip_hooks=False)
    assert raw.produced_s == (1.0, 2.5) and raw.forward_s == 4.0 and raw.backward_s == 3.0


def test_duplicates_are_needed_at_the_earliest_unpack():
    trace = Trace(
        tensors=(_record(0, 0.0, 3.0), _record(1, 0.5, 2.0, offloadable=False)),
        forward_s=1.0,
        backward_s=3.0,
        meta={"duplicates": {"1": 0}},
    )
    assert Timeline.from_trace(trace).consumed_s == (1.0, 1.0)


def test_orders_and_hidden_windows():
    timeline = Timeline(forward_s=4.0, backward_s=6.0, produced_s=(0.0, 1.0, 3.0), consumed_s=(5.0, None, 2.0))
    assert timeline.forward_order() == [0, 1, 2]
    assert timeline.backward_order() == [2, 0]
    hidden_f, hidden_b = hidden_windows(timeline, [0, 2])
    assert hidden_f == {0: 3.0, 2: 1.0}
    assert hidden_b == {2: 2.0, 0: 3.0}
    _, deep = hidden_windows(timeline, [0, 2], prefetch_depth=2)
    assert deep == {2: 2.0, 0: 5.0}
    with pytest.raises(ValueError, match="prefetch_depth must be >= 1"):
        hidden_windows(timeline, [0], prefetch_depth=0)


def test_timeline_validation():
    with pytest.raises(ValueError, match="one entry per record"):
        Timeline(forward_s=1.0, backward_s=1.0, produced_s=(0.0,), consumed_s=())
    with pytest.raises(ValueError, match="compute times must be >= 0"):
        Timeline(forward_s=-1.0, backward_s=1.0, produced_s=(), consumed_s=())


def test_a_duplicates_shared_unpack_call_is_taken_out_once_and_backward_keeps_the_hooks_order():
    # record 2 packed the storage and view of record 1: the first unpack of either is one hook call
    # (0.5 s at 2.0) that both records carry; records 0 and 3 are unpacked after it, 0 last
    trace = Trace(
        tensors=(
            _record(0, 0.0, 2.75, unpack_s=0.0),
            _record(1, 0.25, 2.0, unpack_s=0.5),
            _record(2, 0.5, 2.0, unpack_s=0.5, offloadable=False),
            _record(3, 0.75, 2.5, unpack_s=0.0),
        ),
        forward_s=2.0,
        backward_s=1.0,
        meta={"duplicates": {"2": 1}},
    )
    timeline = Timeline.from_trace(trace)
    assert timeline.consumed_s == (0.25, 0.0, 0.0, 0.0)
    assert timeline.backward_s == 0.5
    assert timeline.backward_order() == [1, 2, 3, 0]


def test_backward_keeps_the_hooks_order_where_taking_hook_time_out_would_reorder_it():
    # record 2's unpack hook timed 1.0 s, yet record 1's began 0.5 s after it (the hook's end was
    # read after work that overlapped the next): stripped, record 1 would fall before record 2
    trace = Trace(
        tensors=(_record(0, 0.0, 1.75), _record(1, 0.5, 0.75), _record(2, 1.0, 0.25, unpack_s=1.0)),
        forward_s=0.0,
        backward_s=2.0,
    )
    timeline = Timeline.from_trace(trace)
    assert timeline.backward_order() == [2, 1, 0]
    assert timeline.consumed_s == (0.75, 0.25, 0.25)
    assert Timeline.from_trace(trace, strip_hooks=False).backward_order() == [2, 1, 0]
