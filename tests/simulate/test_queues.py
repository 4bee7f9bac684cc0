"""The queue model on hand-built traces with hand-computed answers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cswap.simulate import SimConfig, Simulator
from cswap.simulate.policies import Action, TensorCost
from cswap.simulate.queues import QueueParams, run_queues
from cswap.simulate.timeline import Timeline
from tests.simulate.conftest import make_profile, make_trace

NO_MIN = SimConfig(min_bytes=0)


def test_one_transfer_hidden(gb):
    # 0.5 s out during 1 s of forward, 0.5 s in during the 1 s of backward before it is needed
    trace = make_trace([(gb // 2, 0.0, 1.0)], forward_s=1.0, backward_s=2.0)
    result = Simulator(trace, make_profile(), NO_MIN).run("swap")
    assert result.queue.iteration_s == pytest.approx(3.0)
    assert result.queue.exposed_transfer_s == pytest.approx(0.0)
    assert result.formula.iteration_s == pytest.approx(3.0)
    assert result.peak_bytes == gb // 2
    assert result.transferred_bytes == gb // 2


def test_one_transfer_exposed(gb):
    # out: [0, 2] although forward ends at 1; in: starts at 2 (source ready), needed at 1 + 1 = 2, back at 4
    trace = make_trace([(2 * gb, 0.0, 1.0)], forward_s=1.0, backward_s=2.0)
    result = Simulator(trace, make_profile(), NO_MIN).run("swap")
    assert result.queue.iteration_s == pytest.approx(5.0)
    assert result.queue.exposed_transfer_s == pytest.approx(2.0)
    assert result.queue.compute_s == pytest.approx(3.0)
    # T' = max(2 - 1, 0) + max(2 - 1, 0)
    assert result.formula.exposed_transfer_s == pytest.approx(2.0)


def test_transfers_pile_up_beyond_the_per_tensor_formula(gb):
    # Three 1 GB tensors, out during a 5 s forward (hidden). Backward (2 s) needs them at 1.0, 1.1
    # and 1.2 with two prefetches in flight: Z in [5,6] and Y in [6,7] from the start, X in [7,8]
    # once Z is used at 6.0. Y is needed at 6.1 (waits 0.9), X at 7.1 (waits 0.9): 1.8 exposed.
    # The formula gives each its own window (Z 1.0, Y 1.1, X 1.2 - 1.0 = 0.2): only X's 0.8 shows.
    trace = make_trace([(gb, 0.0, 1.2), (gb, 1.0, 1.1), (gb, 2.0, 1.0)], forward_s=5.0, backward_s=2.0)
    result = Simulator(trace, make_profile(), SimConfig(min_bytes=0, prefetch_depth=2)).run("swap")
    assert result.queue.exposed_transfer_s == pytest.approx(1.8)
    assert result.queue.iteration_s == pytest.approx(8.8)
    assert result.formula.exposed_transfer_s == pytest.approx(0.8)
    assert result.formula.iteration_s == pytest.approx(7.8)


def test_an_unbounded_queue_uses_slack_the_formula_does_not(gb):
    # A (2 GB) at 0 with 1 s until B: the formula charges A's extra second; the queue sends B after
    # A and both land before forward ends at 3.0, and backward's windows hide both swap-ins.
    trace = make_trace([(2 * gb, 0.0, 3.0), (gb, 1.0, 1.0)], forward_s=3.0, backward_s=4.0)
    result = Simulator(trace, make_profile(), NO_MIN).run("swap")
    assert result.formula.exposed_transfer_s == pytest.approx(1.0)
    assert result.queue.exposed_transfer_s == pytest.approx(0.0)


def test_bounded_inflight_makes_forward_wait(gb):
    # With one swap-out in flight at most, producing B at 0.5 waits for A until 1.0 (0.5 s), then B
    # goes out [1, 2] and forward (ending at 1.5 + 0.5 = 2.0) waits for nothing more.
    trace = make_trace([(gb, 0.0, 2.0), (gb, 0.5, 1.0)], forward_s=1.5, backward_s=3.0)
    result = Simulator(trace, make_profile(), SimConfig(min_bytes=0, max_inflight_offloads=1)).run("swap")
    assert result.formula.exposed_transfer_s == pytest.approx(0.5)
    # backward: B in [2, 3] from t=2 (backward start), needed at 3 -> no wait; A in [3, 4], needed at 4
    assert result.queue.exposed_transfer_s == pytest.approx(0.5)
    assert result.queue.iteration_s == pytest.approx(5.0)


def test_compress_keep_costs_codec_time_and_holds_compressed_bytes(gb):
    timeline = Timeline(forward_s=1.0, backward_s=1.0, produced_s=(0.0,), consumed_s=(0.5,))
    cost = TensorCost(gb, gb / 4, 0.75, 4, compress_s=0.25, decompress_s=0.125, host_compress_s=0.0, host_decompress_s=0.0)
    out = run_queues(timeline, [cost], [Action.ZVC_KEEP], QueueParams(1.0, 1.0))
    assert out.iteration_s == pytest.approx(2.375)
    assert out.codec_s == pytest.approx(0.375)
    assert out.exposed_transfer_s == 0.0
    # during compression both the tensor and its compressed form exist
    assert out.peak_bytes == gb + gb // 4


def test_host_compression_sits_in_the_swap_path(gb):
    # out [0, 1] then host compression [1, 3]; in: host decompression [3, 4] then copy [4, 5];
    # backward needs it at 1 + 1 = 2 -> waits 3 s.
    timeline = Timeline(forward_s=1.0, backward_s=2.0, produced_s=(0.0,), consumed_s=(1.0,))
    cost = TensorCost(gb, gb / 2, 0.5, 4, compress_s=0.0, decompress_s=0.0, host_compress_s=2.0, host_decompress_s=1.0)
    out = run_queues(timeline, [cost], [Action.HOST_ZVC_SWAP], QueueParams(1.0, 1.0))
    assert out.exposed_transfer_s == pytest.approx(3.0)
    assert out.host_codec_s == pytest.approx(3.0)
    assert out.iteration_s == pytest.approx(6.0)


def test_synchronous_copies_add_everything(gb):
    trace = make_trace([(gb, 0.0, 1.0), (gb // 2, 0.5, 0.5)], forward_s=1.0, backward_s=2.0)
    result = Simulator(trace, make_profile(async_copies=False), NO_MIN).run("swap")
    assert result.queue.exposed_transfer_s == pytest.approx(3.0)
    assert result.queue.iteration_s == pytest.approx(6.0)
    assert result.formula.iteration_s == pytest.approx(6.0)


def test_prefetch_depth_hides_a_burst(gb):
    # Two tensors needed back to back at the end of backward: depth 1 fetches the second only when
    # the first is used, depth 2 fetches both at the start.
    trace = make_trace([(gb, 0.0, 2.5), (gb, 0.0, 2.4)], forward_s=2.0, backward_s=3.0)
    shallow = Simulator(trace, make_profile(), SimConfig(min_bytes=0, prefetch_depth=1)).run("swap")
    deep = Simulator(trace, make_profile(), SimConfig(min_bytes=0, prefetch_depth=2)).run("swap")
    assert shallow.queue.exposed_transfer_s == pytest.approx(0.9)
    assert deep.queue.exposed_transfer_s == pytest.approx(0.0)


@pytest.mark.parametrize("policy", ["none", "swap", "compress-keep"])
def test_hook_overheads_are_charged_only_with_hooks(gb, policy):
    trace = make_trace([(gb // 100, 0.0, 1.0), (gb // 100, 0.5, 0.5), (gb // 100, 0.7, None)], forward_s=1.0, backward_s=2.0)
    profile = make_profile(async_copies=False, hook_overhead_s=0.01, move_overhead_s=0.001, iteration_overhead_s=0.1)
    result = Simulator(trace, profile, NO_MIN).run(policy)
    # three packs and two unpacks (the third tensor is never used), every tensor moved or compressed
    expected = 0.0 if policy == "none" else 0.1 + 0.011 * (3 + 2)
    assert result.queue.overhead_s == pytest.approx(expected)
    total = result.queue.compute_s + result.queue.exposed_transfer_s + result.queue.codec_s + result.queue.overhead_s
    assert result.queue.iteration_s == pytest.approx(total)
    assert result.formula.overhead_s == pytest.approx(expected)


def test_min_bytes_keeps_small_tensors(gb):
    trace = make_trace([(gb, 0.0, 1.0), (1000, 0.5, 0.5)], forward_s=1.0, backward_s=2.0)
    result = Simulator(trace, make_profile(), SimConfig(min_bytes=10_000)).run("swap")
    assert result.actions == (Action.SWAP, Action.KEEP)


@pytest.mark.parametrize(
    "params, match",
    [
        (dict(d2h_gbps=0.0, h2d_gbps=1.0), "bandwidths must be positive"),
        (dict(d2h_gbps=1.0, h2d_gbps=1.0, prefetch_depth=0), "prefetch_depth"),
        (dict(d2h_gbps=1.0, h2d_gbps=1.0, max_inflight_offloads=0), "max_inflight_offloads"),
    ],
)
def test_bad_queue_params(params, match):
    with pytest.raises(ValueError, match=match):
        QueueParams(**params)


def test_actions_must_match_records(gb):
    timeline = Timeline(forward_s=1.0, backward_s=1.0, produced_s=(0.0,), consumed_s=(0.5,))
    with pytest.raises(ValueError, match="one cost and one action per record"):
        run_queues(timeline, [], [Action.SWAP], QueueParams(1.0, 1.0))


def _views_timeline() -> tuple[Timeline, list[TensorCost]]:
    # A (1 MB) produced at 0, a C of 1 MB at 0.25 and B, another view of A's storage, at 0.5;
    # backward needs B at 0.25, C at 0.5 and A last, at 0.75
    timeline = Timeline(forward_s=1.0, backward_s=1.0, produced_s=(0.0, 0.25, 0.5), consumed_s=(0.75, 0.5, 0.25))
    cost = TensorCost(1_000_000, 1_000_000, 0.0, 4, 0.0, 0.0, 0.0, 0.0)
    return timeline, [cost, cost, cost]


@pytest.mark.parametrize(("actions", "peak_bytes"), [
    # kept with its owner: the storage counts once, until A (the last of the two) is used
    ((Action.KEEP, Action.KEEP, Action.KEEP), 2_000_000),
    # its owner swapped (on a CPU profile, copied at pack): B holds the storage, once
    ((Action.SWAP, Action.KEEP, Action.KEEP), 2_000_000),
    # itself swapped: the storage is A's; back in backward, B's copy is a storage of its own
    ((Action.KEEP, Action.KEEP, Action.SWAP), 3_000_000),
])
def test_a_kept_view_of_a_kept_storage_counts_it_once(actions, peak_bytes):
    timeline, costs = _views_timeline()
    params = QueueParams(1.0, 1.0, async_copies=False)
    views = (None, None, 0)
    assert run_queues(timeline, costs, actions, params, views=views).peak_bytes == peak_bytes
    assert run_queues(timeline, costs, (Action.KEEP,) * 3, params).peak_bytes == 3_000_000  # unknown: counted twice


def test_a_shared_storage_lives_until_the_last_of_its_views_is_used():
    # D (2 MB, swapped) is produced first; A (1 MB) and B, a view of A's storage, are kept. Backward
    # uses A at 0.25, fetches D for 0.5 and uses B last: A's storage, held by B, is still there
    timeline = Timeline(forward_s=1.0, backward_s=1.0, produced_s=(0.0, 0.25, 0.5), consumed_s=(0.5, 0.25, 0.75))
    costs = [TensorCost(n, n, 0.0, 4, 0.0, 0.0, 0.0, 0.0) for n in (2_000_000, 1_000_000, 1_000_000)]
    params = QueueParams(1.0, 1.0, async_copies=False)
    actions = (Action.SWAP, Action.KEEP, Action.KEEP)
    assert run_queues(timeline, costs, actions, params, views=(None, None, 1)).peak_bytes == 3_000_000
    # B used before D comes back too: the storage is gone, D alone
    early = Timeline(forward_s=1.0, backward_s=1.0, produced_s=(0.0, 0.25, 0.5), consumed_s=(0.75, 0.25, 0.5))
    assert run_queues(early, costs, actions, params, views=(None, None, 1)).peak_bytes == 2_000_000
    with pytest.raises(ValueError, match="one view per record"):
        run_queues(timeline, costs, actions, params, views=(None,))


@pytest.mark.parametrize(("actions", "peak_bytes"), [
    # A and B, slices of one 3 MB projection, kept: it counts once, whole, beside C
    ((Action.KEEP, Action.KEEP, Action.KEEP), 4_000_000),
    # A swapped: B keeps the whole projection
    ((Action.SWAP, Action.KEEP, Action.KEEP), 4_000_000),
    # both swapped: C alone, then each slice back on its own
    ((Action.SWAP, Action.KEEP, Action.SWAP), 2_000_000),
])
def test_a_kept_slice_of_an_activation_holds_its_whole_storage(actions, peak_bytes):
    timeline, costs = _views_timeline()
    sliced = replace(costs[0], storage_nbytes=3_000_000)
    params = QueueParams(1.0, 1.0, async_copies=False)
    assert run_queues(timeline, [sliced, costs[1], sliced], actions, params, views=(None, None, 0)).peak_bytes == peak_bytes
