"""The memory-budget planner: options, the MILP against brute force, the least budget, the greedy."""

from __future__ import annotations

import itertools
import os
from dataclasses import replace

import numpy as np
import pytest

from cswap.budget import BudgetError
from cswap.planner.advisor import Action as AdvisorAction
from cswap.planner.lifetime import Lifetime, lifetimes_from_orders
from cswap.planner import (
    ACTIONS,
    POLICY_ACTIONS,
    LinkModel,
    TensorSpec,
    allowed_actions,
    build_problem,
    minimum_bytes,
    plan_budget,
    single_mechanism_policies,
    tensor_actions,
    timeline_of,
)
from cswap.planner.actions import HOST_ZVC_SWAP, KEEP, RECOMPUTE, SWAP, ZVC_KEEP, ZVC_SWAP
from cswap.planner.bounds import floor_levels, floor_shares, least_footprint_peak, peak_floor

POLICIES = tuple(POLICY_ACTIONS)
MB = 1_000_000


def random_problem(seed: int, count: int = 4, async_copies: bool = True, views: int = 0, sliced: bool = False):
    """A small problem whose copies span events: 1 MB moves in 1 ms, events 1 ms apart; with
    ``views``, tensors 1 to ``views`` are other views of tensor 0's storage (as large, or half as
    large on odd seeds); ``sliced``: each of them, tensor 0 too, a slice of one larger storage
    that holds them side by side (q, k and v of a fused projection), which keeping any holds."""
    rng = np.random.default_rng(seed)
    pack = list(range(count))
    unpack = [int(u) for u in rng.permutation(count)]
    if seed % 2:
        unpack[int(rng.integers(count))] = None
        unpack = [
            None if u is None else r for r, u in zip(_ranks([u if u is not None else 99 for u in unpack]), unpack, strict=True)
        ]
    events = lifetimes_from_orders(pack, unpack)
    specs = []
    for key, lifetime in enumerate(events.lifetimes):
        nbytes = int(rng.integers(1, 5)) * MB
        compressed = int(nbytes * rng.choice([0.3, 0.6, 1.2]))  # 1.2: ZVC would expand it
        specs.append(
            TensorSpec(
                key=key,
                nbytes=nbytes,
                lifetime=lifetime,
                compressed_nbytes=compressed,
                compress_s=float(rng.uniform(0.0, 2e-3)),
                decompress_s=float(rng.uniform(0.0, 2e-3)),
                hidden_forward_s=1e-3,
                recompute_s=None if key == 0 and seed % 3 == 0 else float(rng.uniform(0.0, 3e-3)),
            )
        )
    for key in range(1, views + 1):
        specs[key] = replace(specs[key], nbytes=specs[0].nbytes // (1 + seed % 2),
                             compressed_nbytes=specs[0].compressed_nbytes // (1 + seed % 2))
    if sliced:
        storage = sum(spec.nbytes for spec in specs[: views + 1])
        specs[: views + 1] = [replace(spec, storage_nbytes=storage) for spec in specs[: views + 1]]
    times = [1e-3 * e for e in range(events.event_count)]
    link = LinkModel(d2h_gbps=1.0, h2d_gbps=1.0, async_copies=async_copies)
    return build_problem(specs, events, times, times[events.forward_events] - 0.5e-3, link, prefetch_distances=(0, 1, 2),
                         views={key: 0 for key in range(1, views + 1)} or None)


def _ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0] * len(values)
    for rank, i in enumerate(order):
        ranks[i] = rank
    return ranks


def brute_force(problem, policy, budget_bytes=None):
    """(least cost within the budget or None, least peak) over every combination of options."""
    per_tensor = [
        [(o.cost_s, problem.holds(o), (t.key, o.action)) for o in t.options if o.action in tensor_actions(policy, {o.action for o in t.options})]
        for t in problem.tensors
    ]
    best_cost, best_peak = None, None
    for combo in itertools.product(*per_tensor):
        peak = int((sum(h for _, h, _ in combo) + problem.shared_credit(dict(a for _, _, a in combo))).max())
        cost = sum(c for c, _, _ in combo)
        best_peak = peak if best_peak is None else min(best_peak, peak)
        if budget_bytes is not None and peak <= budget_bytes and (best_cost is None or cost < best_cost):
            best_cost = cost
    return best_cost, best_peak


def test_action_sets():
    assert POLICY_ACTIONS["none"] == {KEEP}
    assert POLICY_ACTIONS["swap"] == {KEEP, SWAP}
    assert POLICY_ACTIONS["compress-swap"] == {KEEP, ZVC_SWAP}
    assert POLICY_ACTIONS["compress-keep"] == {KEEP, ZVC_KEEP}
    assert POLICY_ACTIONS["recompute"] == {KEEP, RECOMPUTE}
    assert POLICY_ACTIONS["capuchin"] == {KEEP, SWAP, RECOMPUTE}
    # cswap may also compress on the host, which the planner offers only under a host budget
    assert POLICY_ACTIONS["cswap"] == {*ACTIONS, HOST_ZVC_SWAP} and RECOMPUTE in ACTIONS and HOST_ZVC_SWAP not in ACTIONS
    assert single_mechanism_policies() == ("swap", "compress-swap", "compress-keep", "recompute")
    # the executor's vocabulary; recompute is carried out by recompute regions (torch checkpointing)
    assert {a for a in ACTIONS if a != RECOMPUTE} <= {a.value for a in AdvisorAction}
    with pytest.raises(ValueError, match="policy 'vdnn' has no action set for a memory budget: choose one of none, swap"):
        allowed_actions("vdnn")


@pytest.mark.parametrize("ratio, zvc", [(0.5, True), (0.999, True), (1.0, False), (1.3, False)])
def test_compression_never_stores_more_than_raw(ratio, zvc):
    events = lifetimes_from_orders([0], [0])
    spec = TensorSpec(key=0, nbytes=1000, lifetime=events.lifetimes[0], compressed_nbytes=int(1000 * ratio))
    problem = build_problem([spec], events, [0.0, 1.0], 0.5, LinkModel(1.0, 1.0))
    actions = {o.action for o in problem.tensors[0].options}
    assert actions == ({KEEP, SWAP, ZVC_SWAP, ZVC_KEEP} if zvc else {KEEP, SWAP})


@pytest.mark.parametrize("policy, action", [("compress-swap", SWAP), ("compress-keep", KEEP), ("cswap", SWAP)])
def test_a_tensor_zvc_would_expand_is_swapped_raw_or_kept(policy, action):
    # a dense tensor (ZVC 10% larger) and a sparse one, both alive at the peak; the budget fits one
    events = lifetimes_from_orders([0, 1], [1, 0])
    dense = TensorSpec(key=0, nbytes=1000, lifetime=events.lifetimes[0], compressed_nbytes=1100)
    sparse = TensorSpec(key=1, nbytes=1000, lifetime=events.lifetimes[1], compressed_nbytes=100)
    problem = build_problem([dense, sparse], events, [0.0, 1.0, 2.0, 3.0], 1.5, LinkModel(1e-6, 1e-6, async_copies=False))
    assert {o.action for o in problem.tensors[0].options} == {KEEP, SWAP}
    budget = minimum_bytes(problem, policy) if policy == "compress-keep" else 1100
    plan = plan_budget(problem, policy, budget)
    assert plan.actions[0] == action and plan.peak_bytes <= budget
    assert (SWAP in tensor_actions(policy, {KEEP, SWAP})) == (policy != "compress-keep")


def test_dtype_zvc_cannot_encode_and_pinned_tensors():
    events = lifetimes_from_orders([0, 1], [1, 0])
    specs = [
        TensorSpec(key=0, nbytes=1000, lifetime=events.lifetimes[0], compressed_nbytes=None),
        TensorSpec(key=1, nbytes=1000, lifetime=events.lifetimes[1], compressed_nbytes=10, movable=False),
    ]
    problem = build_problem(specs, events, [0.0, 1.0, 2.0, 3.0], 1.5, LinkModel(1.0, 1.0))
    assert {o.action for o in problem.tensors[0].options} == {KEEP, SWAP}
    assert {o.action for o in problem.tensors[1].options} == {KEEP}


def test_holds_of_each_action_on_a_cpu_link():
    # one tensor packed at event 0 and unpacked at event 3, freed at 4; copies finish inside pack
    events = lifetimes_from_orders([0, 1], [1, 0], [1, 1])
    spec = TensorSpec(key=0, nbytes=100, lifetime=events.lifetimes[0], compressed_nbytes=40, compress_s=1.0, decompress_s=2.0)
    other = TensorSpec(key=1, nbytes=1, lifetime=events.lifetimes[1], movable=False)
    problem = build_problem([spec, other], events, [0, 1, 2, 3], 1.5, LinkModel(1e-9, 1e-9, async_copies=False))
    holds = {
        o.action: (problem.holds(o).tolist(), o.cost_s, o.wait_offload, o.prefetch_distance) for o in problem.tensors[0].options
    }
    assert holds[KEEP] == ([100, 100, 100, 100], 0.0, False, None)
    assert holds[ZVC_KEEP] == ([140, 40, 40, 140], 3.0, False, None)
    assert holds[SWAP] == ([100, 0, 0, 100], pytest.approx(200.0), True, 0)  # 100 B at 1 B/s each way
    assert holds[ZVC_SWAP] == ([140, 0, 0, 140], pytest.approx(3.0 + 80.0), True, 0)


def test_async_copy_stays_while_in_flight_and_prefetch_hides_the_copy_back():
    # 1 MB at 1 GB/s takes 1 ms; events 0.4 ms apart: the copy out spans the next two packs
    count = 4
    events = lifetimes_from_orders(list(range(count)), [3, 2, 1, 0])
    specs = [TensorSpec(key=k, nbytes=MB, lifetime=lt, hidden_forward_s=0.4e-3) for k, lt in enumerate(events.lifetimes)]
    times = [0.4e-3 * e for e in range(events.event_count)]
    problem = build_problem(specs, events, times, 1.5e-3, LinkModel(1.0, 1.0), prefetch_distances=(0, 2))
    swaps = [o for o in problem.tensors[0].options if o.action == SWAP]
    flying = next(o for o in swaps if not o.wait_offload and o.prefetch_distance == 0)
    waiting = next(o for o in swaps if o.wait_offload and o.prefetch_distance == 0)
    early = next(o for o in swaps if not o.wait_offload and o.prefetch_distance == 2)
    assert problem.holds(flying).tolist() == [MB, MB, MB, 0, 0, 0, 0, MB]
    assert problem.holds(waiting).tolist() == [MB, 0, 0, 0, 0, 0, 0, MB]
    assert problem.holds(early).tolist() == [MB, MB, MB, 0, 0, MB, MB, MB]
    assert flying.cost_s == pytest.approx((1e-3 - 0.4e-3) + 1e-3)
    assert waiting.cost_s == pytest.approx(1e-3 + 1e-3)
    assert early.cost_s == pytest.approx((1e-3 - 0.4e-3) + (1e-3 - 0.8e-3))
    assert early.fetched_ahead == (5, 6, MB)
    # a budget that only fits tensor 0 fetched two events ahead: it is fetched with tensor 2's unpack
    budget = minimum_bytes(problem, "swap")
    planned = plan_budget(problem, "swap", budget).tensors
    assert all(t.fetch_with is None for t in planned if not t.prefetch_distance)
    for tensor in planned:
        if tensor.prefetch_distance:
            own = problem.tensors[tensor.key].lifetime.unpack
            fetch_event = max(own - tensor.prefetch_distance, problem.forward_events)
            assert problem.tensors[tensor.fetch_with].lifetime.unpack == fetch_event
    # with room for two: tensor 0 flies out and is fetched two events early, with tensor 2's unpack
    roomy = plan_budget(problem, "swap", 2 * MB)
    first = roomy.tensors[0]
    assert (first.action, first.wait_offload, first.prefetch_distance, first.fetch_with) == (SWAP, False, 2, 2)
    assert roomy.prefetch_window_bytes == MB and roomy.peak_bytes == 2 * MB


@pytest.mark.parametrize("views, sliced", [(False, False), (True, False), (2, True)])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy", POLICIES)
def test_minimum_is_the_least_peak_and_is_feasible(seed, policy, views, sliced):
    problem = random_problem(seed, views=views, sliced=sliced)
    least = minimum_bytes(problem, policy)
    if policy == "capuchin":  # its greedy's least budget: never below what its actions allow
        assert least >= brute_force(problem, policy)[1]
    else:
        assert least == brute_force(problem, policy)[1]
    plan = plan_budget(problem, policy, least)
    assert plan.peak_bytes <= least
    with pytest.raises(BudgetError) as caught:
        plan_budget(problem, policy, least - 1)
    assert caught.value.minimum_bytes == least and caught.value.policy == policy
    assert f"Raise the budget to at least {least} bytes" in str(caught.value)


# seeds whose view is freed after its owner: kept both, the owner's whole storage stays to the view's free
OUTLIVING_VIEWS = [seed for seed in range(300) if len(random_problem(seed, views=True).shared[0].credit_holds) > 1]


@pytest.mark.parametrize("fraction", [0.6, 0.75, 0.9])
@pytest.mark.parametrize("policy", ["swap", "compress-swap", "cswap"])
def test_the_greedy_counts_a_view_kept_past_its_owner_in_exact_bytes(policy, fraction):
    """The greedy (the solver's fallback, taken when cheaper) prices a shared storage as the solver
    does: its plan, and so the plan returned, holds the budget in exact bytes, and is never cheaper
    than the optimum. Counting each kept view alone, it kept a view past its owner's free at the
    view's bytes, not the storage's, and returned plans 11% over the budget as cheaper than optimal."""
    assert len(OUTLIVING_VIEWS) > 40
    for seed in OUTLIVING_VIEWS:
        problem = random_problem(seed, views=True)
        budget = max(int(minimum_bytes(problem, "none") * fraction), minimum_bytes(problem, policy))
        best, _ = brute_force(problem, policy, budget)
        plan = plan_budget(problem, policy, budget, exact=True)
        assert plan.peak_bytes <= budget, (seed, plan.status, plan.peak_bytes, budget)
        assert plan.predicted_s == pytest.approx(best, rel=1e-9, abs=1e-12), (seed, plan.status)
        assert plan.greedy_s is None or plan.greedy_s >= best - 1e-12, (seed, plan.greedy_s, best)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "capuchin"])
def test_a_shared_storage_is_counted_once_kept_both_and_the_floor_stays_below_the_least(seed, policy):
    """Tensor 1 views tensor 0's storage: kept both, the storage is held once (to the later free);
    the floor the fast path certifies a least with never passes the least, nor does a plan's peak."""
    problem = random_problem(seed, views=True)
    (pair,) = problem.shared
    owner, view = problem.tensors[0], problem.tensors[1]
    both = max(owner.lifetime.pack, view.lifetime.pack), min(owner.lifetime.free, view.lifetime.free)
    assert pair.credit_holds[0] == (*both, -view.nbytes)
    assert pair.credit_holds[1:] == (((owner.lifetime.free + 1, view.lifetime.free, owner.nbytes - view.nbytes),)
                                     if view.lifetime.free > owner.lifetime.free and view.nbytes < owner.nbytes else ())
    least = brute_force(problem, policy)[1]
    assert peak_floor(problem, policy) <= least <= least_footprint_peak(problem, policy)
    kept = timeline_of(problem, [next(o for o in t.options if o.action == KEEP) for t in problem.tensors])
    alone = sum(problem.holds(next(o for o in t.options if o.action == KEEP)) for t in problem.tensors)
    assert (kept - alone).min() == -view.nbytes and kept.max() == minimum_bytes(problem, "none")


@pytest.mark.parametrize("sliced", [False, True])
@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "capuchin"])
def test_a_storage_saved_as_several_views_keeps_the_floor_below_the_least(seed, policy, sliced):
    """Tensors 1, 2 and 3 view tensor 0's storage: the floor under every plan stays below the least
    peak (brute force over every choice) and is met by it where the fast path certifies it, and
    the floor's shares at each event sum to it. Taken pair by pair, each view's pair counted the
    first view's least again: the floor passed the least on four of these seeds under
    ``compress-keep`` (2.2 MB over 2.0 MB) and on one under ``recompute``."""
    problem = random_problem(seed, count=5, views=3, sliced=sliced)
    assert {pair.owner_key for pair in problem.shared} <= {0} and len(problem.shared) >= 2
    least = brute_force(problem, policy)[1]
    assert peak_floor(problem, policy) <= least <= least_footprint_peak(problem, policy)
    assert minimum_bytes(problem, policy) == least
    levels = floor_levels(problem, policy)
    for event in range(problem.event_count):
        assert sum(floor_shares(problem, policy, event).values()) == levels[event], event


@pytest.mark.parametrize("seed", range(6))
def test_slices_of_one_storage_hold_all_of_it_while_any_is_kept(seed):
    """q, k and v sliced from one fused projection: keeping any of them holds the whole projection,
    once while tensor 0 is kept beside the others; swapping all three frees it. Counted by their
    own bytes, none's peak came to a third of the projection where plain PyTorch holds all of it."""
    problem = random_problem(seed, views=2, sliced=True)
    storage = sum(t.nbytes for t in problem.tensors[:3])
    keeps = [next(o for o in t.options if o.action == KEEP) for t in problem.tensors]
    assert [max(nbytes for _, _, nbytes in keep.holds) for keep in keeps[:3]] == [storage] * 3
    assert all(pair.credit_holds[0][2] == -storage for pair in problem.shared)
    kept = timeline_of(problem, keeps)
    life = [problem.tensors[k].lifetime for k in range(3)]
    rest = sum(problem.holds(keep) for keep in keeps[3:])
    group = kept - rest
    for event in range(problem.event_count):
        alive = [lt.pack <= event <= lt.free for lt in life]
        # the owner's hold with views alive without it: each counts the storage (never less than held)
        assert group[event] >= (storage if any(alive) else 0), event
        if alive[0] or sum(alive) <= 1:
            assert group[event] == (storage if any(alive) else 0), event
    assert minimum_bytes(problem, "none") == int(kept.max())


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fraction", [0.5, 0.75, 1.0])
@pytest.mark.parametrize("policy", ["swap", "compress-swap", "compress-keep", "cswap"])
@pytest.mark.parametrize("views, sliced", [(False, False), (True, False), (2, True)])
def test_milp_is_optimal_and_the_greedy_is_no_better(seed, fraction, policy, views, sliced):
    problem = random_problem(seed, views=views, sliced=sliced)
    none_peak = minimum_bytes(problem, "none")
    budget = max(int(none_peak * fraction), minimum_bytes(problem, policy))
    best, _ = brute_force(problem, policy, budget)
    plan = plan_budget(problem, policy, budget)
    assert plan.predicted_s == pytest.approx(best, abs=1e-12)
    assert plan.status == "optimal"
    assert plan.greedy_s is None or plan.greedy_s >= plan.predicted_s - 1e-12
    assert plan.greedy_gap_s is None or plan.greedy_gap_s >= -1e-12
    chosen = []
    for tensor, planned in zip(problem.tensors, plan.tensors, strict=True):
        option = next(
            o
            for o in tensor.options
            if o.action == planned.action
            and o.cost_s == planned.cost_s
            and o.wait_offload == planned.wait_offload
            and o.prefetch_distance == planned.prefetch_distance
        )
        chosen.append(option)
    line = timeline_of(problem, chosen)
    assert plan.timeline_bytes == tuple(line.tolist()) and plan.peak_bytes == int(line.max()) <= budget
    assert plan.slack_bytes == budget - line[plan.binding_event] == budget - int(line.max())
    for tensor, planned in zip(problem.tensors, plan.tensors, strict=True):
        assert planned.action in tensor_actions(policy, {o.action for o in tensor.options})
        if planned.action == SWAP and policy == "compress-swap":  # only where ZVC cannot shrink it
            assert ZVC_SWAP not in {o.action for o in tensor.options}


@pytest.mark.parametrize("seed", range(4))
def test_cswap_is_never_slower_than_a_subset_policy(seed):
    problem = random_problem(seed, count=5)
    none_peak = minimum_bytes(problem, "none")
    for fraction in (0.4, 0.6, 0.8):
        budget = int(none_peak * fraction)
        cswap = (
            plan_budget(problem, "cswap", max(budget, minimum_bytes(problem, "cswap")))
            if budget >= minimum_bytes(problem, "cswap")
            else None
        )
        for policy in single_mechanism_policies():
            if budget < minimum_bytes(problem, policy):
                continue
            assert cswap is not None and cswap.predicted_s <= plan_budget(problem, policy, budget).predicted_s + 1e-12


def test_budget_at_none_peak_keeps_everything_for_free():
    problem = random_problem(3)
    plan = plan_budget(problem, "cswap", minimum_bytes(problem, "none"))
    assert plan.predicted_s == 0.0 and set(plan.actions.values()) == {KEEP}


def test_greedy_is_the_fallback_when_the_solver_has_no_time(monkeypatch):
    import cswap.planner.milp as solve

    class NoSolution:
        x = None
        status = 1
        mip_dual_bound = float("nan")

    problem = random_problem(2, count=5)
    budget = minimum_bytes(problem, "swap") + MB
    monkeypatch.setattr(solve, "_milp", lambda *args, **kwargs: NoSolution())
    plan = plan_budget(problem, "swap", budget)
    assert plan.status == "greedy" and plan.peak_bytes <= budget and plan.greedy_gap_s is None
    assert plan.predicted_s == plan.greedy_s


def test_bad_arguments():
    problem = random_problem(0)
    with pytest.raises(ValueError, match="budget_bytes must be positive, got 0"):
        plan_budget(problem, "swap", 0)
    events = lifetimes_from_orders([0], [0])
    spec = TensorSpec(key=0, nbytes=1, lifetime=events.lifetimes[0])
    with pytest.raises(ValueError, match="need 2 non-decreasing event times"):
        build_problem([spec], events, [1.0, 0.0], 0.5, LinkModel(1.0, 1.0))
    with pytest.raises(ValueError, match="prefetch distances must be >= 0"):
        build_problem([spec], events, [0.0, 1.0], 0.5, LinkModel(1.0, 1.0), prefetch_distances=(-1,))
    with pytest.raises(ValueError, match="link bandwidths must be positive"):
        LinkModel(0.0, 1.0)
    with pytest.raises(ValueError, match="inconsistent lifetime"):
        Lifetime(pack=2, unpack=1, free=3)


class _Codec:
    """Codec seconds proportional to bytes (1 GB/s), for traces."""

    def compress_s(self, nbytes, density, itemsize, backend):
        return nbytes / 1e9

    def decompress_s(self, nbytes, density, itemsize, backend):
        return nbytes / 1e9


def test_problem_from_a_profiled_trace_plans_within_budget():
    import torch

    import cswap
    from cswap import models
    from cswap.planner import problem_from_trace

    torch.manual_seed(0)
    model = models.build("resnet18", num_classes=10, width_mult=0.125)
    rt = cswap.Runtime("none", device="cpu", d2h_gbps=1.0, h2d_gbps=1.0)
    with rt.iteration():
        model(torch.randn(2, 3, 32, 32)).sum().backward()
    trace = rt.trace()
    problem = problem_from_trace(trace, _Codec(), backend="cpu", min_bytes=1024)
    activations = [r for r in trace.tensors if r.offloadable]
    assert [t.key for t in problem.tensors] == [r.key for r in activations]
    assert problem.event_count == len(activations) + sum(r.unpack_at_s is not None for r in activations)
    for tensor, record in zip(problem.tensors, activations, strict=True):
        assert tensor.nbytes == record.nbytes
        assert ({o.action for o in tensor.options} == {KEEP}) == (record.nbytes < 1024)
        assert all(not o.prefetch_distance for o in tensor.options)  # a CPU: copies finish inside pack and unpack
    none_peak = minimum_bytes(problem, "none")
    for policy in ("swap", "cswap"):
        budget = max(none_peak // 2, minimum_bytes(problem, policy))
        assert plan_budget(problem, policy, budget).peak_bytes <= budget


def test_problem_from_trace_sizes_narrowed_int64_at_their_width():
    from cswap.planner import problem_from_trace
    from cswap.profile.trace import TensorRecord, Trace

    wide = TensorRecord(key=0, shape=(4096,), dtype="int64", nbytes=32768, sparsity=0.0, pack_at_s=0.0, unpack_at_s=2.0)
    narrow = TensorRecord(
        key=1, shape=(4096,), dtype="int64", nbytes=32768, sparsity=0.0, pack_at_s=1.0, unpack_at_s=1.5, narrow_dtype="int16"
    )
    problem = problem_from_trace(
        Trace(tensors=(wide, narrow), forward_s=1.2, backward_s=1.0), _Codec(), "cpu", link=LinkModel(1.0, 1.0)
    )
    zvc = [{o.action for o in t.options} for t in problem.tensors]
    assert ZVC_KEEP not in zvc[0] and ZVC_KEEP in zvc[1]  # dense int64 expands; narrowed to int16 it shrinks
    keep = next(o for o in problem.tensors[1].options if o.action == ZVC_KEEP)
    assert keep.cost_s == pytest.approx(2 * 8192 / 1e9)  # timed at the int16 width
    with pytest.raises(ValueError, match="the trace has no link bandwidths"):
        problem_from_trace(Trace(tensors=(wide,)), _Codec(), "cpu")


def test_minimum_without_the_solver_is_still_met(monkeypatch):
    import cswap.planner.milp as solve

    problem = random_problem(4, count=5)
    exact = minimum_bytes(problem, "cswap")

    class NoSolution:
        x = None
        status = 1

    real = solve._milp
    monkeypatch.setattr(solve, "_milp", lambda *args, **kwargs: NoSolution())
    fallback = minimum_bytes(problem, "cswap")
    monkeypatch.setattr(solve, "_milp", real)
    assert fallback >= exact
    assert plan_budget(problem, "cswap", fallback).peak_bytes <= fallback


def test_recompute_option_holds_nothing_between_pack_and_the_event_before_use():
    events = lifetimes_from_orders([0, 1, 2], [2, 1, 0])  # tensor 0: pack 0, unpack 5; tensor 2: pack 2, unpack 3
    specs = [TensorSpec(key=k, nbytes=MB, lifetime=lt, recompute_s=0.25 * (k + 1)) for k, lt in enumerate(events.lifetimes)]
    problem = build_problem(specs, events, [0, 1, 2, 3, 4, 5], 2.5, LinkModel(1.0, 1.0))
    options = [{o.action: o for o in t.options}[RECOMPUTE] for t in problem.tensors]
    assert [o.holds for o in options] == [((0, 0, MB), (4, 5, MB)), ((1, 1, MB), (3, 4, MB)), ((2, 2, MB), (3, 3, MB))]
    assert [o.cost_s for o in options] == [0.25, 0.5, 0.75]
    assert minimum_bytes(problem, "recompute") == 2 * MB  # event 2: tensor 1 (kept or rebuilt at 3) and 2's pack
    plan = plan_budget(problem, "recompute", 2 * MB)
    assert dict(plan.actions) == {0: RECOMPUTE, 1: KEEP, 2: KEEP} and plan.predicted_s == 0.25
    unknown = build_problem([replace(s, recompute_s=None) for s in specs], events, [0, 1, 2, 3, 4, 5], 2.5, LinkModel(1.0, 1.0))
    assert all(o.action != RECOMPUTE for t in unknown.tensors for o in t.options)
    with pytest.raises(ValueError, match="tensor 0: recompute_s must be >= 0 seconds or None, got -1.0"):
        TensorSpec(key=0, nbytes=MB, lifetime=events.lifetimes[0], recompute_s=-1.0)


def test_capuchin_is_planned_by_its_greedy_not_the_solver():
    # two tensors live through event 2; hidden swaps first, then the best bytes per second:
    # recomputing tensor 0 (1 MB for 1 ms) beats swapping tensor 1 (exposed 2 ms at 1 GB/s, no overlap)
    events = lifetimes_from_orders([0, 1, 2], [2, 1, 0])
    specs = [TensorSpec(key=k, nbytes=MB, lifetime=lt, recompute_s=1e-3 * (1 + 9 * k)) for k, lt in enumerate(events.lifetimes)]
    problem = build_problem(specs, events, [0, 1, 2, 3, 4, 5], 2.5, LinkModel(1.0, 1.0, async_copies=False))
    plan = plan_budget(problem, "capuchin", 2 * MB)
    assert plan.status == "capuchin" and dict(plan.actions) == {0: RECOMPUTE, 1: KEEP, 2: KEEP}
    assert plan.peak_bytes <= 2 * MB and plan.predicted_s == pytest.approx(1e-3)
    least = minimum_bytes(problem, "capuchin")
    assert plan_budget(problem, "capuchin", least).peak_bytes <= least
    with pytest.raises(BudgetError, match=f"Raise the budget to at least {least} bytes"):
        plan_budget(problem, "capuchin", least - 1)


def test_native_prints_during_a_solve_go_to_stderr_not_stdout(capfd: pytest.CaptureFixture[str]) -> None:
    # HiGHS writes a stray debug line to file descriptor 1 whatever its options say; --json output must stay clean
    from cswap.planner.highs import stdout_to_stderr

    with stdout_to_stderr():
        os.write(1, b"native noise\n")
        os.write(1, b"HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();\n")
        os.write(1, b"more noise\n")
    print("json line")
    captured = capfd.readouterr()
    assert captured.out == "json line\n"
    assert captured.err == "native noise\nmore noise\n"  # everything else kept, in order; HiGHS's debug line dropped


def _held_events(problem, key):
    """The events at which ``key`` holds bytes when kept (a rebuilt tensor has no other option)."""
    tensor = next(t for t in problem.tensors if t.key == key)
    option = next(o for o in tensor.options if o.action == KEEP)
    return [event for event, nbytes in enumerate(problem.holds(option).tolist()) if nbytes]


@pytest.mark.parametrize("shared", [False, True])
def test_a_region_rebuilds_its_group_at_once_and_each_tensor_lives_to_its_own_free(shared):
    from cswap.planner import problem_from_trace
    from cswap.profile.trace import TensorRecord, Trace

    # keys 0-3 packed in order; backward reads 3, 2, then 0; key 1 is never read
    unpack_order = {0: 2, 2: 1, 3: 0}
    records = tuple(TensorRecord(key=k, shape=(256,), dtype="float32", nbytes=1024, sparsity=0.0, pack_at_s=0.1 * k,
                                 unpack_at_s=1.0 + unpack_order[k] if k in unpack_order else None,
                                 unpack_order=unpack_order.get(k)) for k in range(4))
    trace = Trace(tensors=records, d2h_gbps=1.0, h2d_gbps=1.0, forward_s=0.5, backward_s=3.0)
    storage_of = {0: 7, 2: 7} if shared else {}  # 0 and 2: views of one storage
    problem = problem_from_trace(trace, _Codec(), "cpu", rebuilt_together=[(0, 1, 2)], storage_of=storage_of)
    # events 0-3 pack keys 0-3; events 4, 5, 6 unpack keys 3, 2, 0; the region is rebuilt at event 4,
    # the event before its first unpack (key 2's at 5)
    assert _held_events(problem, 2) == ([4, 5, 6] if shared else [4, 5])
    assert _held_events(problem, 0) == [4, 5, 6]
    assert _held_events(problem, 1) == [4, 5, 6]  # never read: held until the graph goes
    assert _held_events(problem, 3) == [3, 4]  # not in the region: its own pack to its free
    assert all(len(t.options) == 1 for t in problem.tensors if t.key != 3)  # rebuilt: kept, nothing else


def test_a_second_copy_a_recomputation_saves_is_held_over_its_groups_backward():
    from cswap.planner.budgeted import _event_names
    from cswap.planner import problem_from_trace
    from cswap.profile.trace import TensorRecord, Trace

    unpack_order = {0: 2, 1: 1, 2: 0}
    records = tuple(TensorRecord(key=k, shape=(256,), dtype="float32", nbytes=1024, sparsity=0.0, pack_at_s=0.1 * k,
                                 unpack_at_s=1.0 + unpack_order[k], unpack_order=unpack_order[k]) for k in range(3))
    trace = Trace(tensors=records, d2h_gbps=1.0, h2d_gbps=1.0, forward_s=0.5, backward_s=3.0)
    problem = problem_from_trace(trace, _Codec(), "cpu", rebuilt_together=[(0, 1)], rebuilt_copies=[512])
    # events 0-2 pack, 3-5 unpack keys 2, 1, 0: the group is rebuilt at event 3 and last freed at 5
    assert _held_events(problem, -1) == [3, 4, 5]
    (copy,) = [t for t in problem.tensors if t.key == -1]
    assert copy.nbytes == 512 and [o.action for o in copy.options] == [KEEP]
    names = _event_names(problem)  # what a plan's binding line calls an event: never a rebuilt "pack"
    assert names == {2: "pack of key 2", 3: "unpack of key 2"}  # keys 0 and 1 are dropped: no pack or unpack of theirs
    without = problem_from_trace(trace, _Codec(), "cpu", rebuilt_together=[(0, 1)])
    assert all(t.key >= 0 for t in without.tensors)


def test_a_recomputation_starts_at_its_own_first_unpack_not_one_a_shared_save_borrowed():
    from cswap.planner import problem_from_trace
    from cswap.profile.trace import TensorRecord, Trace

    # keys 0-3 packed in order; backward reads 0 first (its data, saved again by a later layer and
    # stored once, was read there), then 3 (outside the region), then 2, then 1
    unpack_order = {0: 0, 3: 1, 2: 2, 1: 3}
    records = tuple(TensorRecord(key=k, shape=(256,), dtype="float32", nbytes=1024, sparsity=0.0, pack_at_s=0.1 * k,
                                 unpack_at_s=1.0 + unpack_order[k], unpack_order=unpack_order[k]) for k in range(4))
    trace = Trace(tensors=records, d2h_gbps=1.0, h2d_gbps=1.0, forward_s=0.5, backward_s=3.0)
    # events 0-3 pack, 4-7 unpack keys 0, 3, 2, 1
    borrowed = problem_from_trace(trace, _Codec(), "cpu", rebuilt_together=[(0, 1, 2)])
    assert _held_events(borrowed, 1) == [4, 5, 6, 7]  # from key 0's unpack on, at the start of backward
    own = problem_from_trace(trace, _Codec(), "cpu", rebuilt_together=[(0, 1, 2)], rebuilt_starts=[(1, 2)])
    assert _held_events(own, 1) == [5, 6, 7] and _held_events(own, 2) == [5, 6]  # the event before key 2's unpack


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy", ["swap", "compress-swap", "cswap"])
def test_a_carried_plan_takes_the_same_options_and_stands_only_within_the_budget(seed: int, policy: str) -> None:
    from cswap.planner.solve import carry_plan

    problem = random_problem(seed)
    least = minimum_bytes(problem, policy)
    roomy = plan_budget(problem, policy, int(least * 1.3))
    carried = carry_plan(problem, policy, int(least * 1.3), roomy)
    assert carried is not None and carried.status == "carried"
    assert [(t.action, t.wait_offload, t.prefetch_distance) for t in carried.tensors] == \
        [(t.action, t.wait_offload, t.prefetch_distance) for t in roomy.tensors]
    assert carried.predicted_s == pytest.approx(roomy.predicted_s) and carried.peak_bytes == roomy.peak_bytes
    assert carry_plan(problem, policy, roomy.peak_bytes - 1, roomy) is None  # it would pass the budget
    assert carry_plan(problem, policy, int(least * 1.3), replace(roomy, tensors=roomy.tensors[1:])) is None  # a key it never planned


@pytest.mark.parametrize("count", [6, 10])
@pytest.mark.parametrize("seed", range(44, 60))
def test_capuchin_meets_every_budget_above_its_least(seed, count):
    """Capuchin's greedy evicts the best bytes per second first, whether or not they are alive at the
    peak: a larger budget asks it for fewer bytes, and its feedback rounds could leave the budget
    passed where a smaller one was met (a run at 0.5 of a BERT's peak was refused, its least 0.06).
    Every budget from the least it states up to ``none``'s peak is met."""
    problem = random_problem(seed, count)
    least, top = minimum_bytes(problem, "capuchin"), minimum_bytes(problem, "none")
    for budget in sorted({least + (top - least) * i // 8 for i in range(9)}):
        assert plan_budget(problem, "capuchin", budget).peak_bytes <= budget
