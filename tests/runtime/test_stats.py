"""Stats: resident bytes and their peak (exact, on hand-sized chains), bytes per action, the host arena's
reuse across iterations, buffers released when their handles die, and the per-epoch history."""

from __future__ import annotations

import gc

import pytest
import torch

import cswap
from cswap.codecs import compress

N = 64 * 1024  # elements per tensor: 256 KiB of float32
NBYTES = 4 * N


def chain_runtime(policy: str, **options) -> cswap.Runtime:
    return cswap.Runtime(policy, device="cpu", min_bytes=0, d2h_gbps=1.0, h2d_gbps=1.0, **options)


def run_chain(rt: cswap.Runtime, x: torch.Tensor, links: int = 3) -> None:
    """``x.exp().exp().exp().sum()``: each exp saves its result, one tensor of NBYTES per link."""
    with rt.iteration():
        y = x
        for _ in range(links):
            y = y.exp()
        y.sum().backward()


def small_input() -> torch.Tensor:
    return (torch.rand(N) * 0.1).requires_grad_()


def test_none_holds_every_saved_tensor_at_once() -> None:
    rt = chain_runtime("none")
    run_chain(rt, small_input())
    stats = rt.stats()
    assert stats.peak_resident_bytes == 3 * NBYTES
    assert stats.kept_bytes == 3 * NBYTES
    assert stats.resident_bytes == 0


def test_swap_without_prefetch_holds_one_tensor_at_a_time() -> None:
    rt = chain_runtime("swap", prefetch_bytes=0)
    run_chain(rt, small_input())
    stats = rt.stats()
    # Forward keeps nothing; backward rebuilds one tensor, which autograd frees before the next.
    assert stats.peak_resident_bytes == NBYTES
    assert stats.offloaded_bytes == stats.transferred_bytes == 3 * NBYTES
    assert stats.prefetches == 0


@pytest.mark.parametrize("budget, peak, prefetches", [(NBYTES, 2 * NBYTES, 2), (10 * NBYTES, 3 * NBYTES, 2)])
def test_prefetch_budget_bounds_what_is_fetched_ahead(budget: int, peak: int, prefetches: int) -> None:
    rt = chain_runtime("swap", prefetch_bytes=budget)
    x = small_input()
    run_chain(rt, x)  # profiles the unpack order
    first = rt.stats()
    run_chain(rt, x)
    stats = rt.stats()
    assert stats.peak_resident_bytes == peak
    assert stats.prefetches - first.prefetches == prefetches
    assert stats.prefetch_hits == stats.prefetches


def test_compress_keep_holds_compressed_sizes() -> None:
    rt = chain_runtime("compress-keep", prefetch_bytes=0)
    x = torch.zeros(N, requires_grad=True)  # relu(x - 1) chains are all zeros: tiny compressed tensors
    with rt.iteration():
        a = torch.relu(x - 1.0)
        b = torch.relu(a - 1.0)
        (b * 2.0).sum().backward()
    compressed = compress(torch.zeros(N)).compressed_nbytes
    stats = rt.stats()
    assert stats.compressed_input_bytes == 2 * NBYTES
    assert stats.compressed_bytes == 2 * compressed
    # Both compressed tensors, plus b rebuilt for its ReLU's backward.
    assert stats.peak_resident_bytes == 2 * compressed + NBYTES
    assert stats.compression_ratio == pytest.approx(NBYTES / compressed)


def test_host_arena_is_reused_across_iterations() -> None:
    rt = chain_runtime("swap")
    x = small_input()
    run_chain(rt, x)
    first = rt.stats()
    # The first iteration had no profile to size the arena from: its copies went to fresh memory.
    assert first.arena_misses == 3
    run_chain(rt, x)
    second = rt.stats()
    run_chain(rt, x)
    third = rt.stats()
    assert second.arena_bytes >= 3 * NBYTES
    assert third.arena_bytes == second.arena_bytes  # no growth once sized
    assert third.arena_misses == second.arena_misses == first.arena_misses
    assert third.arena_used_bytes == 0


def test_buffers_live_until_the_graph_dies() -> None:
    rt = chain_runtime("swap")
    x = small_input()
    run_chain(rt, x)  # sizes the arena
    with rt.iteration():
        y = x.exp().exp()
        loss = y.sum()
        loss.backward(retain_graph=True)
    held = rt.stats()
    assert held.arena_used_bytes >= 2 * NBYTES  # the retained graph still holds its handles
    del loss, y
    gc.collect()
    released = rt.stats()
    assert released.arena_used_bytes == 0
    assert released.resident_bytes == 0


def test_per_epoch_history() -> None:
    rt = chain_runtime("compress-swap")
    x = small_input()
    for epoch in range(2):
        rt.new_epoch()
        for _ in range(epoch + 1):
            run_chain(rt, x)
    stats = rt.stats()
    assert [e.epoch for e in stats.history] == [0, 1]
    assert [e.iterations for e in stats.history] == [1, 2]
    assert [e.packed_tensors for e in stats.history] == [3, 6]
    assert sum(e.compressed_input_bytes for e in stats.history) == stats.compressed_input_bytes
    assert stats.iterations == 3 and stats.profiled_iterations == 2 and stats.epoch == 1
    assert stats.to_dict()["history"][1]["actions"]["zvc-swap"] == 6


def test_new_epoch_before_any_iteration_stays_at_epoch_zero() -> None:
    rt = chain_runtime("swap")
    rt.new_epoch()
    rt.new_epoch()
    run_chain(rt, small_input())
    assert rt.epoch == 0 and rt.trace().epoch == 0


def test_printed_stats_are_a_short_table_in_human_units() -> None:
    rt = chain_runtime("compress-swap")
    x = torch.zeros(N, requires_grad=True)  # exp(0) = 1 everywhere: dense, so ZVC cannot shrink it
    run_chain(rt, x)
    stats = rt.stats()
    lines = str(stats).splitlines()
    assert lines[0] == "cswap stats: policy compress-swap, epoch 0, 1 iterations (1 profiled)"
    table = {line[2:14].strip(): line[15:] for line in lines[1:]}
    assert table["tensors"] == "kept 0, offloaded 3 (swap 0, zvc-swap 3), compressed and kept 0, never moved 0"
    assert table["offloaded"].startswith("768.0 KiB, transferred ")
    ratio = stats.compressed_input_bytes / stats.compressed_bytes
    assert table["compressed"] == f"768.0 KiB -> {stats.compressed_bytes / 1024:.1f} KiB (ratio {ratio:.2f}x)"
    assert table["peak"].endswith(" resident (now 0 B)")
    assert table["host"] == f"{stats.host_peak_bytes / 1024:.1f} KiB peak (now 0 B)"
    assert "mappingproxy" not in str(stats) and len(lines) == 9
    # repr and to_dict stay complete.
    assert "history=(EpochStats(" in repr(stats) and stats.to_dict()["history"][0]["actions"]["zvc-swap"] == 3


def test_human_bytes() -> None:
    from cswap.stats import human_bytes

    assert [human_bytes(n) for n in (0, 1023, 1024, 5 * 2**20 + 2**19, 2**40)] == ["0 B", "1023 B", "1.0 KiB", "5.5 MiB", "1.0 TiB"]


def test_recomputed_tensors_and_the_profiling_share_are_in_the_stats_and_the_table() -> None:
    from tests.execute.test_recompute import SmallCNN
    from tests.runtime.helpers import assert_bit_equal, batches, runtime_for, train

    data = batches(4, (4, 3, 8, 8), 10)
    plain, _ = train(SmallCNN, data, 1)
    first: list[cswap.RuntimeStats] = []

    def runtime(model: torch.nn.Module) -> cswap.Runtime:
        rt = runtime_for("recompute", memory_budget=0.7)(model)
        original = rt.iteration

        def iteration():  # the stats after the profiling iteration, before any planned one
            if rt.stats().iterations == 1 and not first:
                first.append(rt.stats())
            return original()

        rt.iteration = iteration  # type: ignore[method-assign]
        return rt

    grads, rt = train(SmallCNN, data, 1, runtime)
    assert_bit_equal([g for it in plain for g in it], [g for it in grads for g in it], "gradient")
    stats, plan = rt.stats(), rt.plan()
    planned = stats.iterations - stats.profiled_iterations
    assert planned == 3 and plan.recomputed
    # every planned iteration dropped and rebuilt the tensors the plan recomputes, at their bytes
    assert stats.actions["recompute"] == planned * len(plan.recomputed)
    assert stats.recomputed_bytes == planned * sum(d.nbytes for d in plan.recomputed.values()) > 0
    # the profiling iteration's share is what it alone stored: under a budget it swapped every tensor
    profiled = {name: count for name, count in first[0].actions.items() if count}
    assert {name: count for name, count in stats.profiled_actions.items() if count} == profiled
    assert profiled == {"swap": first[0].actions["swap"]} and first[0].actions["swap"] > 0
    assert stats.profiled_offloaded_bytes == first[0].offloaded_bytes > 0
    table = {line[2:14].strip(): line[15:] for line in str(stats).splitlines()[1:]}
    assert f"recomputed {stats.actions['recompute']}, " in table["tensors"]
    assert table["profiling"] == (f"1 profiling iteration stored swap {profiled['swap']} of them "
                                  "(as its profiling mode stores them: rt.trace().meta['mode'])")
    assert table["recomputed"] == f"{cswap.stats.human_bytes(stats.recomputed_bytes)} not held from forward to backward, rebuilt there"
    assert table["offloaded"].startswith(
        f"{cswap.stats.human_bytes(stats.offloaded_bytes)} ({cswap.stats.human_bytes(stats.profiled_offloaded_bytes)} while profiling)")
