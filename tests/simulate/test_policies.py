"""The policies: static plans, and cswap never slower than swap or compress-swap."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cswap.codecs import zvc_compressed_nbytes
from cswap.codecs.format import DEFAULT_CHUNK_WORDS
from cswap.profile.trace import TensorRecord, Trace
from cswap.simulate import POLICIES, Action, SimConfig, Simulator, SparsityModel, meta_trace, simulate, simulate_policies
from cswap.simulate.policies import resolve_policies
from tests.simulate.conftest import make_profile, make_trace


@st.composite
def random_traces(draw):
    """Traces with random sizes, sparsities, timings and unpack orders (some tensors never unpacked)."""
    count = draw(st.integers(1, 12))
    forward_s = draw(st.floats(1e-4, 2.0))
    backward_s = draw(st.floats(1e-4, 4.0))
    produced = sorted(draw(st.lists(st.floats(0.0, forward_s), min_size=count, max_size=count)))
    records = []
    for key, at in enumerate(produced):
        dtype, itemsize = draw(st.sampled_from([("float32", 4), ("float16", 2), ("int64", 8), ("bool", 1)]))
        numel = draw(st.integers(1, 50_000_000 // itemsize))
        records.append(
            TensorRecord(
                key=key,
                shape=(numel,),
                dtype=dtype,
                nbytes=numel * itemsize,
                sparsity=draw(st.floats(0.0, 1.0)),
                offloadable=draw(st.booleans()) or key == 0,
                pack_at_s=at,
                unpack_at_s=None if draw(st.integers(0, 9)) == 0 else forward_s + draw(st.floats(0.0, backward_s)),
            )
        )
    return Trace(tensors=tuple(records), forward_s=forward_s, backward_s=backward_s)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trace=random_traces(),
    gbps=st.floats(0.5, 500.0),
    codec_gbps=st.floats(1.0, 5000.0),
    depth=st.integers(1, 3),
    inflight=st.none() | st.integers(1, 3),
    async_copies=st.booleans(),
    min_bytes=st.sampled_from([0, 1 << 18, 1 << 22]),
)
def test_cswap_never_slower_than_swap_or_compress_swap(trace, gbps, codec_gbps, depth, inflight, async_copies, min_bytes):
    profile = make_profile(gbps=gbps, codec_gbps=codec_gbps, async_copies=async_copies)
    config = SimConfig(min_bytes=min_bytes, prefetch_depth=depth, max_inflight_offloads=inflight)
    results = simulate_policies(trace, profile, "swap,compress-swap,cswap", config)
    best = min(results["swap"].iteration_s, results["compress-swap"].iteration_s)
    assert results["cswap"].iteration_s <= best * (1 + 1e-12)
    for result in results.values():
        q = result.queue
        assert q.iteration_s == pytest.approx(q.compute_s + q.exposed_transfer_s + q.codec_s + q.overhead_s, rel=1e-9, abs=1e-15)
        assert q.exposed_transfer_s >= -1e-12 and q.codec_s >= 0
        assert result.peak_bytes >= 0


@pytest.mark.parametrize("model", ["alexnet", "vgg11", "resnet18", "squeezenet1_1"])
@pytest.mark.parametrize("hardware", ["v100-pcie3", "a100-pcie4", "h100-pcie5", "gh200-c2c"])
@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.9])
def test_cswap_never_slower_on_models(model, hardware, sparsity, meta_cache):
    trace = meta_cache(model, sparsity)
    results = simulate_policies(trace, hardware, "swap,compress-swap,cswap", SimConfig(min_bytes=0))
    assert results["cswap"].iteration_s <= min(results["swap"].iteration_s, results["compress-swap"].iteration_s) * (1 + 1e-12)


@pytest.fixture(scope="module")
def meta_cache():
    cache = {}

    def get(model, sparsity):
        if (model, sparsity) not in cache:
            cache[model, sparsity] = meta_trace(
                model, batch_size=8, resolution=64, hardware="v100-pcie3", sparsity=SparsityModel(relu=sparsity), width_mult=0.25
            )
        return cache[model, sparsity]

    return get


def test_static_plans(gb):
    trace = make_trace([(gb, 0.0, 1.0), (gb // 2, 0.5, 0.5)], forward_s=1.0, backward_s=2.0, sparsity=0.0)
    sim = Simulator(trace, make_profile(), SimConfig(min_bytes=0))
    assert sim.plan("none") == (Action.KEEP, Action.KEEP)
    assert sim.plan("swap") == (Action.SWAP, Action.SWAP)
    # dense tensors are compressed too: knowing which to skip is cswap's job
    assert sim.plan("compress-swap") == (Action.ZVC_SWAP, Action.ZVC_SWAP)
    # a host compression that would not shrink is dropped, so the runtime moves those raw
    assert sim.plan("cpu-compress-swap") == (Action.SWAP, Action.SWAP)
    assert sim.plan("compress-keep") == (Action.ZVC_KEEP, Action.ZVC_KEEP)
    # and cswap leaves dense ones alone: T >= T' whatever the windows
    assert sim.plan("cswap") == (Action.SWAP, Action.SWAP)


@pytest.mark.parametrize("sparsity, action", [(0.0, Action.SWAP), (0.5, Action.HOST_ZVC_SWAP), (0.9, Action.HOST_ZVC_SWAP)])
def test_cpu_compress_swap_holds_on_the_host_what_the_runtime_holds(gb, sparsity, action):
    trace = make_trace([(gb, 0.0, 1.0), (gb // 2, 0.5, 0.5)], forward_s=1.0, backward_s=2.0, sparsity=sparsity)
    sim = Simulator(trace, make_profile(), SimConfig(min_bytes=0))
    result = sim.run("cpu-compress-swap")
    assert result.actions == (action, action)
    held = [c.compressed_nbytes if action is Action.HOST_ZVC_SWAP else c.nbytes for c in sim.costs]
    assert result.host_bytes == pytest.approx(sum(held))
    assert (result.host_bytes < 1.5 * gb) == (action is Action.HOST_ZVC_SWAP)


def test_cswap_compresses_sparse_tensors_on_a_slow_link(gb):
    trace = make_trace([(gb, 0.0, 1.0)], forward_s=0.1, backward_s=1.1, sparsity=0.9)
    result = simulate(trace, make_profile(gbps=1.0, codec_gbps=100.0), "cswap", SimConfig(min_bytes=0))
    assert result.actions == (Action.ZVC_SWAP,)
    assert result.plan == "cost-model"
    assert result.transferred_bytes == pytest.approx(0.1 * gb + gb / 32 + 8 * (gb // 4 // 1024 + 1), rel=1e-6)


def test_cswap_verification_overrides_a_plan_the_queue_punishes(gb):
    # Three 0.9-sparse 1 GB tensors needed in a burst with two prefetches in flight. The cost model
    # gives Z and Y windows of 1.0 and 1.1 s for 1 s copies ("hidden": plain swap) and compresses
    # only X; in the queue Y's copy waits behind Z's and stalls backward. Compressing all three wins.
    trace = make_trace([(gb, 0.0, 1.2), (gb, 1.0, 1.1), (gb, 2.0, 1.0)], forward_s=5.0, backward_s=2.0, sparsity=0.9)
    sim = Simulator(trace, make_profile(gbps=1.0, codec_gbps=100.0), SimConfig(min_bytes=0, prefetch_depth=2))
    assert sim.cost_model_plan() == (Action.ZVC_SWAP, Action.SWAP, Action.SWAP)
    plain = sim.run_plan(sim.cost_model_plan(), policy="cswap")
    checked = sim.run("cswap")
    assert checked.plan == "compress-swap"
    assert checked.actions == (Action.ZVC_SWAP,) * 3
    assert checked.iteration_s < plain.iteration_s - 0.5
    assert checked.iteration_s == sim.run("compress-swap").iteration_s
    unchecked = Simulator(trace, sim.hardware, SimConfig(min_bytes=0, prefetch_depth=2, verify_cswap=False)).run("cswap")
    assert unchecked.plan == "cost-model" and unchecked.iteration_s == plain.iteration_s


def test_results_to_dict_keys(gb):
    trace = make_trace([(gb, 0.0, 1.0)], forward_s=1.0, backward_s=2.0, sparsity=0.5)
    result = simulate(trace, make_profile(), "compress-swap", SimConfig(min_bytes=0))
    data = result.to_dict()
    for key in ("iteration_s", "compute_s", "exposed_transfer_s", "codec_s", "peak_bytes", "formula_iteration_s", "plan"):
        assert key in data
    assert data["actions"]["zvc-swap"] == 1 and sum(data["actions"].values()) == 1


def test_resolve_policies():
    assert resolve_policies("all") == POLICIES
    assert resolve_policies(" swap , cswap,swap") == ("swap", "cswap")
    with pytest.raises(ValueError, match=r"unknown policies \['vdnn'\]: choose from none, swap"):
        resolve_policies("swap,vdnn")
    with pytest.raises(ValueError, match="unknown policy 'fast'"):
        Simulator(make_trace([(1000, 0.0, 0.5)], 1.0, 1.0), make_profile()).run("fast")


def test_config_validation():
    with pytest.raises(ValueError, match="min_bytes must be >= 0"):
        SimConfig(min_bytes=-1)
    with pytest.raises(ValueError, match="verify_steps must be >= 1"):
        SimConfig(verify_steps=0)


def test_min_bytes_default_is_the_runtimes():
    from cswap.options import load_options
    from cswap.simulate import DEFAULT_MIN_BYTES

    assert SimConfig().min_bytes == DEFAULT_MIN_BYTES == load_options().min_bytes


@pytest.mark.parametrize("narrow, itemsize", [(None, 8), ("int16", 2), ("int8", 1)])
def test_a_narrowed_record_is_sized_as_the_codec_encodes_it(narrow, itemsize):
    # max-pool indices: int64 whose profiled range fits a narrower integer, stored narrowed before ZVC
    numel = 4096
    record = TensorRecord(key=0, shape=(numel,), dtype="int64", nbytes=8 * numel, sparsity=0.0, pack_at_s=0.0, unpack_at_s=1.5,
                          narrow_dtype=narrow)
    trace = Trace(tensors=(record,), forward_s=1.0, backward_s=1.0, d2h_gbps=1.0, h2d_gbps=1.0)
    sim = Simulator(trace, make_profile(), SimConfig(min_bytes=0))
    expected = zvc_compressed_nbytes(numel, numel, itemsize, DEFAULT_CHUNK_WORDS)
    assert sim.costs[0].compressed_nbytes == expected
    # with no zeros, ZVC shrinks it only narrowed (its bitmap comes on top of every value)
    assert sim.plan("cpu-compress-swap") == ((Action.HOST_ZVC_SWAP,) if narrow else (Action.SWAP,))
