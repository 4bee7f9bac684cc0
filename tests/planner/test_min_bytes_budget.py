"""Under a memory budget ``min_bytes`` binds nothing: the planner may move a tensor below it, each of
its copies priced with a fixed latency so that small tensors stay where the budget allows; the
plan's run-time fallback and the budget profile move one too; without a budget nothing changes."""

from __future__ import annotations

import pytest

from cswap.budget import MemoryBudget
from cswap.planner import minimum_bytes, plan_budget, problem_from_trace
from cswap.planner.budgeted import NO_CODEC, budget_plan
from cswap.planner.costmodel import COPY_LATENCY_S
from cswap.planner.lifetime import lifetimes_from_orders
from cswap.planner.plan import Action, Plan
from cswap.planner.problem import LinkModel, TensorSpec, build_problem
from cswap.profile.trace import TensorRecord, Trace

KIB = 1024


def _trace(sizes: list[int]) -> Trace:
    """Records of ``sizes`` bytes packed in order and unpacked in reverse, all alive at the end of
    forward; the last one named by its module."""
    n = len(sizes)
    recs = tuple(
        TensorRecord(key=k, shape=(nbytes // 4,), dtype="float32", nbytes=nbytes, sparsity=0.0, pack_at_s=0.1 * k,
                     unpack_at_s=1.0 + 0.1 * (n - 1 - k), module="head (Linear)" if k == n - 1 else "")
        for k, nbytes in enumerate(sizes)
    )
    return Trace(tensors=recs, d2h_gbps=10.0, h2d_gbps=10.0, forward_s=0.1 * n, backward_s=0.1 * n)


def test_each_copy_costs_its_latency_both_ways() -> None:
    events = lifetimes_from_orders([0, 1], [0, None])  # key 1 is never unpacked: one copy, out
    link = LinkModel(1.0, 1.0, async_copies=False)
    costs = []
    for latency in (0.0, COPY_LATENCY_S):
        specs = [TensorSpec(key=k, nbytes=4096, lifetime=lt, copy_latency_s=latency) for k, lt in enumerate(events.lifetimes)]
        problem = build_problem(specs, events, [0.0, 1.0, 2.0], 1.5, link)
        costs.append({(t.key, o.action, o.wait_offload, o.prefetch_distance): o.cost_s
                      for t in problem.tensors for o in t.options})
    free, priced = costs
    assert free.keys() == priced.keys()
    for option, seconds in free.items():
        copies = 0 if option[1] == "keep" else (2 if option[0] == 0 else 1)
        assert priced[option] == pytest.approx(seconds + copies * COPY_LATENCY_S)
    with pytest.raises(ValueError, match="copy_latency_s must be >= 0"):
        TensorSpec(key=0, nbytes=1, lifetime=events.lifetimes[0], copy_latency_s=-1.0)


def test_the_copies_of_records_below_the_threshold_cost_the_latency() -> None:
    trace = _trace([4 * KIB, 64 * KIB])
    plain, priced = (problem_from_trace(trace, NO_CODEC, "cpu", copy_latency_below=below) for below in (0, 8 * KIB))
    for key, copies in ((0, 2), (1, 0)):  # key 0 is below 8 KiB and unpacked: a copy out and one back
        before = [o.cost_s for o in plain.tensors[key].options]
        after = [o.cost_s for o in priced.tensors[key].options]
        added = [copies * COPY_LATENCY_S if o.action != "keep" else 0.0 for o in priced.tensors[key].options]
        assert after == pytest.approx([b + a for b, a in zip(before, added)])


def test_a_budget_that_does_not_bind_keeps_small_tensors_and_one_that_binds_moves_the_fewest() -> None:
    # moving key 0 or keys 1 to 3 frees the same bytes at the peak (the pack of key 4): one copy each way, not three
    problem = problem_from_trace(_trace([3 * KIB, KIB, KIB, KIB, KIB]), NO_CODEC, "cpu", copy_latency_below=1 << 18)
    none_peak = minimum_bytes(problem, "none")
    assert set(plan_budget(problem, "swap", none_peak).actions.values()) == {"keep"}
    planned = plan_budget(problem, "swap", none_peak - 3 * KIB)
    assert [planned.actions[k] for k in range(5)] == ["swap", "keep", "keep", "keep", "keep"]


def test_min_bytes_does_not_raise_the_least_budget_and_the_error_names_the_floor() -> None:
    trace = _trace([4 * KIB, 8 * KIB, 16 * KIB])
    unrestricted, default = (budget_plan(trace, "swap", MemoryBudget(nbytes=1024), NO_CODEC, "cpu", min_bytes, epoch=0)[2]
                             for min_bytes in (0, 1 << 18))
    assert default is not None and unrestricted is not None
    assert default.minimum_bytes == unrestricted.minimum_bytes == 16 * KIB  # at least the tensor packed or in use
    message = str(default)
    assert "The floor is set at the pack of key 2 (event 2)" in message
    assert "head (Linear) key 2, float32 [4096], 16.0 KiB held" in message
    assert "min_bytes" not in message
    plan, _, error = budget_plan(trace, "swap", MemoryBudget(nbytes=16 * KIB), NO_CODEC, "cpu", 1 << 18, epoch=0)
    assert error is None and plan.counts()["swap"] >= 1 and all(d.nbytes < 1 << 18 for d in plan.decisions.values())


def test_a_budget_fallback_moves_a_tensor_below_min_bytes_and_no_budget_keeps_it() -> None:
    budgeted = Plan("swap", 0, Action.SWAP, min_bytes=1024, budget_bytes=100, fallback_action=Action.SWAP)
    fits = budgeted.resolve(0, (8,), "float32", 32, resident_bytes=60)
    passes = budgeted.resolve(1, (8,), "float32", 32, resident_bytes=80)
    assert fits.action is Action.KEEP and fits.reason == "below min_bytes (32 < 1,024 B)"  # kept where the budget allows
    assert passes.action is Action.SWAP and passes.budget_fallback and "budget fallback" in passes.reason
    unbudgeted = Plan("swap", 0, Action.SWAP, min_bytes=1024)
    assert unbudgeted.resolve(1, (8,), "float32", 32, resident_bytes=10**9).action is Action.KEEP


def test_a_budget_profile_stores_tensors_below_min_bytes_at_the_smallest_footprint() -> None:
    """A fraction of none's peak not resolved yet: the profiling plan under a budget takes every
    tensor below min_bytes at the policy's profile action, as the planner's replay of it assumes."""
    import cswap

    rt = cswap.Runtime("swap", device="cpu", min_bytes=1024, memory_budget=0.5)
    profiling, mode = rt._profiling_plan(rt.plan())
    action = profiling.default_action
    assert mode == "budget" and action is Action.SWAP
    small = profiling.resolve(0, (8,), "float32", 32)
    assert small.action is action and small.raw_unless_smaller
    complex_keep = profiling.resolve(1, (8,), "complex64", 64)
    assert complex_keep.action is Action.SWAP  # the encoding binds nothing on a raw copy


def test_a_keep_first_profile_under_a_fraction_stores_tensors_below_min_bytes_past_its_budget_compressed() -> None:
    """compress-keep's first profile under a fraction keeps each tensor while the fraction of the
    most held so far leaves room (IterationState.budget_bytes) and past it stores it at its
    smallest coding, a tensor below min_bytes too, as the planner's replay of it assumes."""
    import cswap

    rt = cswap.Runtime("compress-keep", device="cpu", min_bytes=1024, memory_budget=0.5)
    profiling, mode = rt._profiling_plan(rt.plan())
    assert mode == "keep-first" and profiling.default_action is Action.KEEP and profiling.min_bytes == 0
    assert profiling.budget_bytes is None and profiling.provisional_budget == cswap.MemoryBudget(fraction=0.5)
    assert profiling.resolve(0, (8,), "float32", 32, resident_bytes=60, budget_bytes=100).action is Action.KEEP
    small = profiling.resolve(1, (8,), "float32", 32, resident_bytes=80, budget_bytes=100)
    assert small.action is Action.ZVC_KEEP and small.raw_unless_smaller and small.budget_fallback
    complex_keep = profiling.resolve(2, (8,), "complex64", 64, resident_bytes=80, budget_bytes=100)
    assert complex_keep.action is Action.KEEP  # the encoding still binds: no codec takes it
