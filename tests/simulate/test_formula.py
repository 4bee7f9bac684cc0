"""The per-tensor formula: it is cswap.planner.costmodel's T and T', and the queue model agrees with it where it should."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cswap.planner import costmodel
from cswap.profile.trace import TensorRecord, Trace
from cswap.simulate import SimConfig, Simulator, meta_trace
from cswap.simulate.policies import Action
from tests.simulate.conftest import make_profile


def _itemsize(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


@pytest.fixture(scope="module")
def trace():
    return meta_trace("vgg11", batch_size=4, resolution=32, hardware="v100-pcie3", width_mult=0.25)


@pytest.mark.parametrize("paper_size", [False, True])
@pytest.mark.parametrize("hardware", ["v100-pcie3", "h100-pcie5"])
def test_formula_is_the_cost_model_summed(trace, paper_size, hardware):
    sim = Simulator(trace, hardware, SimConfig(min_bytes=0, paper_size=paper_size))
    link = sim.hardware.link
    time_model = sim.hardware.time_model()
    moved = [r for r in trace.tensors if r.offloadable]
    assert moved and all(r.unpack_at_s is not None for r in moved)

    swap = sim.run("swap")
    expected_swap = sum(
        costmodel.swap_s(r.nbytes, link.d2h_gbps, link.h2d_gbps, r.hidden_forward_s, r.hidden_backward_s) for r in moved
    )
    assert swap.formula.exposed_transfer_s == pytest.approx(expected_swap, rel=1e-9)
    assert swap.formula.iteration_s == pytest.approx(trace.forward_s + trace.backward_s + expected_swap, rel=1e-9)

    compressed = sim.run("compress-swap")
    expected = 0.0
    assert {r.dtype for r in moved} == {"float32", "int64"}  # max-pool indices are saved too
    for r in moved:
        itemsize = _itemsize(r.dtype)
        size = (
            costmodel.paper_compressed_nbytes(r.nbytes, r.sparsity)
            if paper_size
            else costmodel.zvc_nbytes_for(r.nbytes, r.sparsity, itemsize)
        )
        expected += costmodel.compressed_swap_s(
            size,
            time_model.compress_s(r.nbytes, r.density, itemsize, "cuda"),
            time_model.decompress_s(r.nbytes, r.density, itemsize, "cuda"),
            link.d2h_gbps,
            link.h2d_gbps,
            r.hidden_forward_s,
            r.hidden_backward_s,
        )
    assert compressed.formula.exposed_transfer_s + compressed.formula.codec_s == pytest.approx(expected, rel=1e-9)


def test_cost_model_plan_follows_decide(trace):
    sim = Simulator(trace, "v100-pcie3", SimConfig(min_bytes=0))
    link = sim.hardware.link
    time_model = sim.hardware.time_model()
    for record, action in zip(trace.tensors, sim.cost_model_plan()):
        if not record.offloadable:
            assert action is Action.KEEP
            continue
        decision = costmodel.decide(
            record.nbytes,
            record.sparsity,
            record.hidden_forward_s,
            record.hidden_backward_s,
            link.d2h_gbps,
            link.h2d_gbps,
            time_model.compress_s(record.nbytes, record.density, _itemsize(record.dtype), "cuda"),
            time_model.decompress_s(record.nbytes, record.density, _itemsize(record.dtype), "cuda"),
            itemsize=_itemsize(record.dtype),
        )
        assert action is (Action.ZVC_SWAP if decision.compress else Action.SWAP)


@st.composite
def traces(draw):
    count = draw(st.integers(1, 8))
    forward_s = draw(st.floats(0.1, 5.0))
    backward_s = draw(st.floats(0.1, 10.0))
    produced = sorted(draw(st.lists(st.floats(0.0, forward_s), min_size=count, max_size=count)))
    records = []
    for key, at in enumerate(produced):
        nbytes = draw(st.integers(1, 3_000)) * 1_000_000
        used = draw(st.booleans()) or key == 0
        records.append(
            TensorRecord(
                key=key,
                shape=(nbytes // 4,),
                dtype="float32",
                nbytes=nbytes,
                sparsity=draw(st.floats(0.0, 1.0)),
                pack_at_s=at,
                unpack_at_s=forward_s + draw(st.floats(0.0, backward_s)) if used else None,
            )
        )
    return Trace(tensors=tuple(records), forward_s=forward_s, backward_s=backward_s)


@settings(max_examples=60, deadline=None)
@given(trace=traces(), gbps=st.floats(0.5, 20.0))
def test_synchronised_queue_equals_the_formula_for_plain_swaps(trace, gbps):
    # With one swap-out in flight (vDNN's per-layer sync) and one prefetch ahead, every copy has
    # exactly the window the per-tensor formula gives it: the two models must agree.
    config = SimConfig(min_bytes=0, prefetch_depth=1, max_inflight_offloads=1)
    result = Simulator(trace, make_profile(gbps=gbps), config).run("swap")
    assert result.queue.iteration_s == pytest.approx(result.formula.iteration_s, rel=1e-9, abs=1e-12)
