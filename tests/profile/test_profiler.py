"""The profiler: Hidden_f and Hidden_b exactly as cswap.profile.trace defines them, on a hand-timed iteration,
and a real profile's records (keys, sizes, sparsity, producers, order)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import cswap
from cswap.profile.profiler import Clock, Profiler
from cswap.profile.trace import Trace


class ManualClock(Clock):
    """Timestamps are the seconds the test passes in; time zero is 0."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))
        self.now = 0.0

    def start(self) -> None:
        self._start = 0.0

    def stamp(self) -> Any:
        return self.now


def hand_timed_trace() -> Trace:
    profiler = Profiler(torch.device("cpu"), epoch=3, policy="cswap", clock=ManualClock())
    profiler.begin()
    f32 = dict(shape=(10,), dtype="float32", nbytes=40, numel=10, producer="ReluBackward0")
    # key: (start, end, offloadable, zeros)
    packs = {0: (0.0, 0.1, True, 5), 1: (0.3, 0.35, False, 0), 2: (0.5, 0.6, True, 2), 3: (0.8, 0.82, True, 0), 4: (1.0, 1.1, True, 10)}
    for key, (start, end, offloadable, zeros) in packs.items():
        profiler.record_pack(key, zeros=zeros, offloadable=offloadable, reason="" if offloadable else "a parameter", start=start, end=end, **f32)
    profiler.record_duplicate(3, 0)  # key 3 packed key 0's storage again
    for key, start, end in ((4, 2.0, 2.1), (1, 2.2, 2.25), (2, 2.5, 2.6), (3, 2.7, 2.75), (0, 3.0, 3.2), (4, 3.3, 3.35)):
        profiler.record_unpack(key, start, end)  # the second unpack of 4 is ignored
    profiler.clock.now = 3.5
    profiler.end()
    return profiler.trace(d2h_gbps=12.0, h2d_gbps=13.0, device={"kind": "cpu"})


def test_hidden_times_follow_the_trace_definitions() -> None:
    trace = hand_timed_trace()
    r = {t.key: t for t in trace.tensors}
    # Forward: from the end of a pack to the start of the next offloadable pack (1 is a parameter,
    # 3 a duplicate: neither moves); the last one runs to the end of forward (the first unpack, 2.0).
    assert r[0].hidden_forward_s == pytest.approx(0.5 - 0.1)
    assert r[2].hidden_forward_s == pytest.approx(1.0 - 0.6)
    assert r[4].hidden_forward_s == pytest.approx(2.0 - 1.1)
    # Backward, in unpack order 4, 2, 0: from the end of the previous offloadable unpack; the first
    # from the start of backward. Key 0's data is first read through its duplicate 3 (at 2.7).
    assert r[4].hidden_backward_s == pytest.approx(0.0)
    assert r[2].hidden_backward_s == pytest.approx(2.5 - 2.1)
    assert r[0].hidden_backward_s == pytest.approx(2.7 - 2.6)
    for key in (1, 3):
        assert r[key].hidden_forward_s == r[key].hidden_backward_s == 0.0
        assert r[key].offloadable is False
    assert trace.forward_s == pytest.approx(2.0) and trace.backward_s == pytest.approx(1.5)


def test_records_carry_sizes_times_and_sparsity() -> None:
    trace = hand_timed_trace()
    r = {t.key: t for t in trace.tensors}
    assert [t.key for t in trace.tensors] == [0, 1, 2, 3, 4]
    assert (r[0].sparsity, r[2].sparsity, r[4].sparsity) == (0.5, 0.2, 1.0)
    assert r[3].sparsity == r[0].sparsity  # a duplicate has its original's data
    assert r[4].pack_s == pytest.approx(0.1) and r[4].unpack_s == pytest.approx(0.1)
    assert r[4].pack_at_s == 1.0 and r[4].unpack_at_s == 2.0  # the first unpack
    assert (trace.epoch, trace.policy, trace.d2h_gbps, trace.h2d_gbps) == (3, "cswap", 12.0, 13.0)
    assert trace.meta["not_offloadable"] == {"1": "a parameter", "3": "duplicate of key 0 (same storage and view): stored once"}
    assert Trace.from_dict(trace.to_dict()) == trace


def test_a_tensor_first_read_through_a_duplicate_is_rebuilt_then() -> None:
    trace = hand_timed_trace()
    r = {t.key: t for t in trace.tensors}
    # The data key 0 stored is rebuilt when its duplicate 3 is unpacked: that is key 0's backward event.
    assert r[0].unpack_at_s == 2.7 and r[0].unpack_order == 2
    assert r[3].unpack_at_s == 2.7 and r[3].unpack_order is None  # a duplicate has no event of its own
    assert [t.key for t in sorted((t for t in trace.tensors if t.unpack_order is not None), key=lambda t: t.unpack_order)] == [4, 2, 0]


def test_an_in_place_relu_read_first_by_its_pool_is_unpacked_by_the_pool() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(inplace=True), torch.nn.MaxPool2d(2),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 5))
    rt = cswap.Runtime("none", device="cpu", model=model, min_bytes=0, d2h_gbps=1.0, h2d_gbps=1.0)
    with rt.iteration():
        model(torch.randn(4, 3, 8, 8)).sum().backward()
    trace = rt.trace()
    duplicates = {int(k): v for k, v in trace.meta["duplicates"].items()}
    assert duplicates, "the pool saves the ReLU's output again"
    records = {t.key: t for t in trace.tensors}
    indices = next(t for t in trace.tensors if t.dtype == "int64")
    for duplicate, first in duplicates.items():
        # backward runs the pool first: it reads the ReLU's output (through the duplicate) with its indices
        assert records[first].unpack_at_s == records[duplicate].unpack_at_s <= indices.unpack_at_s
        assert records[first].unpack_order < indices.unpack_order


def test_never_unpacked_tensor_has_no_unpack_time() -> None:
    profiler = Profiler(torch.device("cpu"), epoch=0, policy="none", clock=ManualClock())
    profiler.begin()
    profiler.record_pack(0, (4,), "float32", 16, 4, 0, "", True, "", start=0.0, end=0.1)
    profiler.clock.now = 1.0
    profiler.end()
    record = profiler.trace(1.0, 1.0, {}).tensors[0]
    assert record.unpack_at_s is None and record.hidden_backward_s == 0.0
    assert record.hidden_forward_s == pytest.approx(0.9)  # no backward: forward runs to the end


class TickingClock(ManualClock):
    """Every timestamp is one second after the previous one, so times are whole, positive and exact."""

    def __init__(self, device: torch.device | None = None) -> None:
        super().__init__()

    def stamp(self) -> Any:
        self.now += 1.0
        return self.now


def test_real_profile_of_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cswap.profile.profiler.Clock", TickingClock)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 5))
    rt = cswap.Runtime("none", device="cpu", model=model, min_bytes=0, d2h_gbps=1.0, h2d_gbps=1.0)
    x = torch.randn(4, 3, 8, 8)
    with rt.iteration():
        model(x).sum().backward()
    trace = rt.trace()
    by_producer = {t.producer: t for t in trace.tensors}
    # The ReLU output is saved by the ReLU (labelled with the module running: "1") and by the pool.
    relu = by_producer["1:ReluBackward0"]
    expected = model[1](model[0](x)).detach()
    assert relu.shape == (4, 8, 8, 8) and relu.dtype == "float32" and relu.nbytes == expected.numel() * 4
    assert relu.sparsity == pytest.approx(float((expected == 0).float().mean()))
    assert {t.dtype for t in trace.tensors} >= {"float32", "int64"}  # the pool's indices
    indices = next(t for t in trace.tensors if t.dtype == "int64")
    assert indices.narrow_dtype == "int8"  # positions in an 8x8 plane: all below 64
    assert all(t.narrow_dtype is None for t in trace.tensors if t.dtype != "int64")
    assert trace.meta["mode"] == "keep-all" and trace.meta["model"] == "Sequential"
    assert all(t.unpack_at_s is not None for t in trace.tensors if t.offloadable)
    assert trace.forward_s >= 1 and trace.backward_s >= 1 and trace.forward_s == int(trace.forward_s)
    assert [t.key for t in trace.tensors] == list(range(len(trace.tensors)))


def test_saved_tensors_are_named_by_the_module_that_produced_them() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    rt = cswap.Runtime("swap", device="cpu", model=model, min_bytes=0, d2h_gbps=1.0, h2d_gbps=1.0)
    x = torch.randn(8, 16)
    for _ in range(2):
        with rt.iteration():
            model(x).sum().backward()
    trace = rt.trace()
    modules = {t.module for t in trace.tensors}
    # The ReLU saves its output while it runs; the next Linear saves that output as its input;
    # the Tanh saves its own output; weights are the Linears' parameters.
    assert {"1 (ReLU)", "3 (Tanh)"} <= modules
    relu_outputs = [t for t in trace.tensors if t.module == "1 (ReLU)" and t.offloadable]
    assert relu_outputs and all(t.shape == (8, 32) for t in relu_outputs)
    # the input x, made by no module, is named by the module that saves it; weights by their names
    assert [t.module for t in trace.tensors if t.key in (0, 3, 6)] == ["0 (Linear)", "2.weight", "4.weight"]
    assert "" not in modules
    rows = rt.plan().rows()
    assert {rows[t.key].module for t in trace.tensors} == modules
    assert "1 (ReLU)" in str(rt.plan()) and rt.plan().to_dict()["decisions"][0]["module"] == rows[0].module


def test_trace_module_field_round_trips_and_old_traces_load(tmp_path) -> None:
    from cswap.profile.trace import TensorRecord, Trace

    record = TensorRecord(key=0, shape=(4,), dtype="float32", nbytes=16, sparsity=0.0, module="features.3 (ReLU)")
    path = Trace(tensors=(record,)).to_json(tmp_path / "t.json")
    assert Trace.from_json(path).tensors[0].module == "features.3 (ReLU)"
    old = Trace(tensors=(record,)).to_dict()
    del old["tensors"][0]["module"]
    assert Trace.from_dict(old).tensors[0].module == ""


def test_another_view_of_a_saved_storage_names_the_first_and_the_simulator_counts_the_storage_once() -> None:
    from cswap.simulate import SimConfig, Simulator
    from cswap.simulate.validate import cpu_profile

    x = torch.randn(64, 32, requires_grad=True)
    rt = cswap.Runtime("none", device="cpu", min_bytes=0, d2h_gbps=1.0, h2d_gbps=1.0)
    with rt.iteration():
        y = x.exp()  # saves y: key 0
        z = y.t().sin()  # saves y.t(), another view of y's storage: key 1
        (z * z).sum().backward()  # saves z twice: key 2 and its duplicate, key 3
    trace = rt.trace()
    records = {t.key: t for t in trace.tensors}
    assert [records[k].view_of for k in range(4)] == [None, 0, None, None]
    assert trace.meta["duplicates"] == {"3": 2}
    assert Trace.from_dict(trace.to_dict()).tensors[1].view_of == 0
    measured = rt.stats().iteration_peak_resident_bytes
    assert measured == 2 * 64 * 32 * 4  # y's storage once, z's once
    assert Simulator(trace, cpu_profile(), SimConfig(min_bytes=0)).run("none").peak_bytes == measured
