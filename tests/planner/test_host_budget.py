"""The host memory budget in the planner: host copies' bytes per option, a second row per event, and
a BudgetError that names the budget that binds with the least of each, which planning then meets."""

from __future__ import annotations

import pytest

from cswap.budget import HOST_AUTO_SHARE, BudgetError, HostBudget, host_memory_limit_bytes, parse_host_budget
from cswap.planner import LinkModel, TensorSpec, build_problem, minimum_bytes, plan_budget
from cswap.planner.lifetime import lifetimes_from_orders
from cswap.planner.actions import ACTIONS, HOST_ZVC_SWAP, KEEP, SWAP, carried_out
from cswap.planner.milp import host_timeline_of, timeline_of
from cswap.planner.solve import minimum_host_bytes

SIZES = (4000, 3000, 2000, 1000, 500)
COMPRESSED = (1500, 2900, 400, 900, 100)


def _problem(recompute: bool = False):  # type: ignore[no-untyped-def]
    n = len(SIZES)
    events = lifetimes_from_orders(list(range(n)), list(reversed(range(n))))
    specs = [TensorSpec(key=k, nbytes=SIZES[k], lifetime=lt, compressed_nbytes=COMPRESSED[k], compress_s=1e-4, decompress_s=1e-4,
                        recompute_s=2e-3 if recompute else None) for k, lt in enumerate(events.lifetimes)]
    times = [float(e) for e in range(events.event_count)]
    return build_problem(specs, events, times, n - 0.5, LinkModel(1.0, 1.0, async_copies=False))


def test_host_holds_are_the_stored_bytes_from_pack_to_free() -> None:
    problem = _problem()
    for tensor in problem.tensors:
        life = tensor.lifetime
        for option in tensor.options:
            expected = {"swap": SIZES[tensor.key], "zvc-swap": COMPRESSED[tensor.key]}.get(option.action)
            if expected is None:
                assert option.host_holds == ()
            else:
                assert option.host_holds == ((life.pack, life.free, expected),)


@pytest.mark.parametrize("policy", ["swap", "compress-swap", "cswap"])
def test_a_plan_holds_both_budgets_at_every_event(policy: str) -> None:
    problem = _problem()
    free = plan_budget(problem, policy, 6000)
    host_budget = free.host_peak_bytes // 2
    try:
        plan = plan_budget(problem, policy, 6000, host_budget_bytes=host_budget)
    except BudgetError as error:
        assert error.binding == "host" and error.host_budget_bytes == host_budget
        plan = plan_budget(problem, policy, 6000, host_budget_bytes=error.host_minimum_bytes)
        host_budget = error.host_minimum_bytes
        assert host_budget > free.host_peak_bytes // 2
    choice = [next(o for o in t.options if o.action == p.action and o.prefetch_distance == p.prefetch_distance
                   and o.wait_offload == p.wait_offload) for t, p in zip(problem.tensors, plan.tensors)]
    assert max(plan.timeline_bytes) <= 6000 and plan.peak_bytes <= 6000
    assert max(host_timeline_of(problem, choice)) == plan.host_peak_bytes <= host_budget
    assert plan.host_budget_bytes == host_budget and len(plan.host_timeline_bytes) == problem.event_count


def test_the_host_budget_binds_and_its_minimum_is_met() -> None:
    problem = _problem()
    with pytest.raises(BudgetError) as caught:
        plan_budget(problem, "swap", 6000, host_budget_bytes=1000)
    error = caught.value
    # swap alone meets 6000 on the device; with 1000 on the host it needs more on the device
    assert error.binding == "host" and minimum_bytes(problem, "swap") <= 6000
    assert error.minimum_bytes == minimum_bytes(problem, "swap", host_budget_bytes=1000) > 6000
    assert error.host_minimum_bytes == minimum_host_bytes(problem, "swap", 6000) > 1000
    assert "the host budget binds" in str(error) and f"host budget to at least {error.host_minimum_bytes} bytes" in str(error)
    assert f"device budget to at least {error.minimum_bytes} bytes" in str(error)
    # each minimum, with the other budget as given, plans
    assert plan_budget(problem, "swap", 6000, host_budget_bytes=error.host_minimum_bytes).host_peak_bytes <= error.host_minimum_bytes
    assert plan_budget(problem, "swap", error.minimum_bytes, host_budget_bytes=1000).peak_bytes <= error.minimum_bytes


def test_the_device_budget_binds_when_it_cannot_be_met_alone() -> None:
    problem = _problem()
    least = minimum_bytes(problem, "swap")
    with pytest.raises(BudgetError) as caught:
        plan_budget(problem, "swap", least - 1, host_budget_bytes=10**9)
    assert caught.value.binding == "device" and caught.value.minimum_bytes == least
    assert "the device budget binds" in str(caught.value)


def test_capuchin_under_a_host_budget() -> None:
    problem = _problem(recompute=True)
    free = plan_budget(problem, "capuchin", 6000)
    assert free.host_peak_bytes > 0
    try:
        plan = plan_budget(problem, "capuchin", 6000, host_budget_bytes=free.host_peak_bytes // 2)
        assert plan.host_peak_bytes <= free.host_peak_bytes // 2 and plan.peak_bytes <= 6000
    except BudgetError as error:
        assert error.host_minimum_bytes is not None
        plan = plan_budget(problem, "capuchin", 6000, host_budget_bytes=error.host_minimum_bytes)
        assert plan.host_peak_bytes <= error.host_minimum_bytes and plan.peak_bytes <= 6000


def test_budget_error_pickles_with_its_host_fields() -> None:
    import pickle

    error = BudgetError(2000, "swap", 1000, host_budget_bytes=500, host_minimum_bytes=800, binding="host")
    again = pickle.loads(pickle.dumps(error))
    assert (again.binding, again.host_budget_bytes, again.host_minimum_bytes, str(again)) == ("host", 500, 800, str(error))


@pytest.mark.parametrize("value, nbytes", [("8GiB", 8 << 30), ("512 MB", 512 * 10**6), (4096, 4096), ("3e9", 3 * 10**9)])
def test_host_budget_forms(value: object, nbytes: int) -> None:
    assert parse_host_budget(value) == HostBudget(nbytes=nbytes)


@pytest.mark.parametrize("value, message", [(0.5, "not a fraction"), ("0.5", "not a fraction"), (0, "bytes must be positive"),
                                            ("2 parsecs", "unknown unit"), (True, "a bool")])
def test_bad_host_budgets_say_the_forms(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        parse_host_budget(value)
    assert str(caught.value).startswith("host memory budget") and "'auto'" in str(caught.value)


def test_auto_takes_a_share_of_the_cgroup_limit_else_available_ram(tmp_path) -> None:  # type: ignore[no-untyped-def]
    limit = tmp_path / "memory.max"
    limit.write_text("8589934592\n")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemAvailable:   1000000 kB\n")
    assert host_memory_limit_bytes((str(limit),), str(meminfo)) == (8 << 30, f"cgroup limit ({limit})")
    limit.write_text("max\n")  # no cgroup limit: the RAM available now
    assert host_memory_limit_bytes((str(limit),), str(meminfo)) == (1000000 * 1024, f"available RAM ({meminfo})")
    budget = parse_host_budget("auto", limit=(8 << 30, "cgroup limit"))
    assert budget == HostBudget(nbytes=int(HOST_AUTO_SHARE * (8 << 30)), auto=True, source="cgroup limit")
    assert "'auto'" in str(budget)


# host-zvc-swap: eight nested tensors of 1000 bytes that ZVC shrinks to 250, a device codec slow
# enough that compressing on the device never pays here, and a fast host codec.
NESTED = 8


# On a CPU device the host codec shares the cores (it costs); on a GPU, with copies of 1 us and
# events a second apart, prefetching hides the host decompression, so a host compression ties with
# a raw swap in predicted time.
LINKS = {"cpu": LinkModel(1.0, 1.0, async_copies=False), "gpu": LinkModel(1e-3, 1e-3, async_copies=True)}


def _nested_problem(host_codec: bool = True, link: str = "cpu"):  # type: ignore[no-untyped-def]
    events = lifetimes_from_orders(list(range(NESTED)), list(reversed(range(NESTED))))
    specs = [TensorSpec(key=k, nbytes=1000, lifetime=lt, compressed_nbytes=250, compress_s=0.5, decompress_s=0.5,
                        host_compress_s=1e-3, host_decompress_s=1e-3) for k, lt in enumerate(events.lifetimes)]
    times = [float(e) for e in range(events.event_count)]
    actions = (*ACTIONS, HOST_ZVC_SWAP) if host_codec else ACTIONS
    return build_problem(specs, events, times, NESTED - 0.5, LINKS[link], actions=actions)


def _chosen(problem, plan):  # type: ignore[no-untyped-def]
    return [next(o for o in t.options if o.action == p.action and o.prefetch_distance == p.prefetch_distance
                 and o.wait_offload == p.wait_offload) for t, p in zip(problem.tensors, plan.tensors)]


def test_host_zvc_swap_is_offered_only_when_asked_and_where_zvc_shrinks_the_tensor() -> None:
    assert not any(o.action == HOST_ZVC_SWAP for t in _nested_problem(host_codec=False).tensors for o in t.options)
    events = lifetimes_from_orders([0, 1], [1, 0])
    specs = [TensorSpec(key=0, nbytes=1000, lifetime=events.lifetimes[0], compressed_nbytes=1100),  # ZVC would expand it
             TensorSpec(key=1, nbytes=1000, lifetime=events.lifetimes[1])]  # no encoding
    problem = build_problem(specs, events, [0.0, 1.0, 2.0, 3.0], 1.5, LinkModel(1.0, 1.0, async_copies=False),
                            actions=(*ACTIONS, HOST_ZVC_SWAP))
    assert not any(o.action == HOST_ZVC_SWAP for t in problem.tensors for o in t.options)


def test_host_zvc_swap_holds_swaps_device_bytes_and_costs_the_host_codec_more() -> None:
    problem = _nested_problem()
    for tensor in problem.tensors:
        life = tensor.lifetime
        swaps = {(o.wait_offload, o.prefetch_distance): o for o in tensor.options if o.action == SWAP}
        hosts = [o for o in tensor.options if o.action == HOST_ZVC_SWAP]
        assert hosts
        for option in hosts:
            twin = swaps[(option.wait_offload, option.prefetch_distance)]
            assert option.holds == twin.holds  # the raw bytes cross the link both ways
            # a CPU device: the host compression shares the cores, the decompression precedes the copy back
            assert option.cost_s == pytest.approx(twin.cost_s + 2e-3)
            # the raw copy and the room its compression is written to until it is collected at
            # the next event, then the compressed bytes
            segments = ((life.pack, life.pack + 1, 1250), (life.pack + 2, life.free, 250))
            assert option.host_holds == tuple(s for s in segments if s[0] <= s[1])


@pytest.mark.parametrize("link", sorted(LINKS))
def test_cswap_compresses_on_the_host_only_where_the_host_budget_binds(link: str) -> None:
    problem = _nested_problem(link=link)
    free = plan_budget(problem, "cswap", 3000)
    # a raw swap is cheaper (CPU) or as fast (GPU): no host compression without a host budget that binds
    assert HOST_ZVC_SWAP not in free.action_counts() and free.host_peak_bytes == 5000
    loose = plan_budget(problem, "cswap", 3000, host_budget_bytes=10**9)
    assert HOST_ZVC_SWAP not in loose.action_counts() and loose.predicted_s == pytest.approx(free.predicted_s)
    without = plan_budget(_nested_problem(host_codec=False, link=link), "cswap", 3000, host_budget_bytes=10**9)
    assert loose.actions == without.actions
    for host_budget in (4000, 3000, 2500):
        plan = plan_budget(problem, "cswap", 3000, host_budget_bytes=host_budget)
        assert plan.action_counts().get(HOST_ZVC_SWAP, 0) >= 2, plan.action_counts()
        choice = _chosen(problem, plan)
        assert max(timeline_of(problem, choice)) <= 3000 and max(host_timeline_of(problem, choice)) <= host_budget
        if link == "cpu":
            assert plan.predicted_s > free.predicted_s
        else:  # hidden on a GPU: where the host budget binds, cheaper than the device codec (0.5 s a tensor)
            device_codec = plan_budget(_nested_problem(host_codec=False, link=link), "cswap", 3000, host_budget_bytes=host_budget)
            assert plan.predicted_s < device_codec.predicted_s
    # swap alone cannot meet these host budgets at 3000 on the device
    with pytest.raises(BudgetError) as caught:
        plan_budget(problem, "swap", 3000, host_budget_bytes=4000)
    assert caught.value.binding == "host"


def test_cpu_compress_swap_plans_host_zvc_swap_under_a_host_budget() -> None:
    problem = _nested_problem()
    plan = plan_budget(problem, "cpu-compress-swap", 3000, host_budget_bytes=3000)
    assert set(plan.action_counts()) == {KEEP, HOST_ZVC_SWAP}
    assert plan.peak_bytes <= 3000 and plan.host_peak_bytes <= 3000
    assert {carried_out("cpu-compress-swap", a) for a in plan.actions.values()} == {KEEP, HOST_ZVC_SWAP}
    assert carried_out("cswap", SWAP) == SWAP
