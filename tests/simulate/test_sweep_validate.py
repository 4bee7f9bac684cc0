"""The sparsity x bandwidth sweep, the figures, and the CPU validation harness."""

from __future__ import annotations

from typing import ClassVar

from types import SimpleNamespace

import numpy as np
import pytest

from cswap.profile.trace import TensorRecord, Trace
from cswap.simulate.hardware import load_hardware
from cswap.simulate.plot import plot_sweep
from cswap.simulate.policies import Action
from cswap.simulate.sweep import SweepResult, sweep, with_link
from cswap.simulate.validate import RuntimeOverheads, median_trace, runtime_actions, validate


def test_sweep_finds_where_compression_pays(tmp_path):
    result = sweep(
        "vgg11", "v100-pcie3", batch_size=8, resolution=32, width_mult=0.25,
        sparsities=(0.0, 0.5, 0.9), bandwidths_gbps=(2.0, 12.0, 450.0),
    )
    speedup = result.speedup()
    assert speedup.shape == (3, 3)
    # dense activations never gain from compression; at 0.9 sparsity a slow link gains most
    assert np.all(speedup[0] <= 1.0)
    assert speedup[2, 0] > 1.0 and speedup[2, 0] >= speedup[2, 2]
    assert np.all(result.cswap_speedup() >= 1.0 - 1e-12)
    assert np.all(result.cswap_s <= np.minimum(result.swap_s, result.compress_swap_s) * (1 + 1e-12))
    even = result.break_even()
    assert even[0] is not None and 0.0 < even[0] <= 0.9
    rows = result.rows()
    assert len(rows) == 9 and {"sparsity", "link_gbps", "compress_swap_speedup", "cswap_speedup"} <= set(rows[0])
    path = plot_sweep(result.sparsities, result.bandwidths_gbps, speedup, tmp_path / "sweep.png", break_even=even)
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_break_even_interpolates():
    grid = np.array([[0.5], [1.0], [2.0]])
    ones = np.ones((3, 1))
    result = SweepResult("m", "h", 1, 1, (0.0, 0.5, 0.9), (10.0,), swap_s=grid, compress_swap_s=ones, cswap_s=ones, none_s=ones)
    assert result.break_even() == [pytest.approx(0.5)]
    never = SweepResult("m", "h", 1, 1, (0.0, 0.5), (10.0,), swap_s=np.array([[0.5], [0.9]]), compress_swap_s=np.ones((2, 1)),
                        cswap_s=np.ones((2, 1)), none_s=np.ones((2, 1)))
    assert never.break_even() == [None]
    between = SweepResult("m", "h", 1, 1, (0.0, 1.0), (10.0,), swap_s=np.array([[0.5], [1.5]]), compress_swap_s=np.ones((2, 1)),
                          cswap_s=np.ones((2, 1)), none_s=np.ones((2, 1)))
    assert between.break_even() == [pytest.approx(0.5)]


def test_with_link():
    profile = with_link(load_hardware("a100-pcie4"), 7.5)
    assert profile.link.h2d_gbps == profile.link.d2h_gbps == 7.5
    assert profile.device == load_hardware("a100-pcie4").device


def _rec(key, pack_at, unpack_at, offloadable=True):
    return TensorRecord(key=key, shape=(4,), dtype="float32", nbytes=16, sparsity=0.5, pack_at_s=pack_at,
                        unpack_at_s=unpack_at, offloadable=offloadable)


def test_median_trace():
    a = Trace(tensors=(_rec(0, 1.0, 5.0), _rec(1, 2.0, None)), forward_s=3.0, backward_s=3.0)
    b = Trace(tensors=(_rec(0, 3.0, 7.0), _rec(1, 2.0, None)), forward_s=5.0, backward_s=1.0)
    c = Trace(tensors=(_rec(0, 2.0, 6.0), _rec(1, 2.0, None)), forward_s=4.0, backward_s=2.0)
    m = median_trace([a, b, c])
    assert (m.tensors[0].pack_at_s, m.tensors[0].unpack_at_s, m.tensors[1].unpack_at_s) == (2.0, 6.0, None)
    assert (m.forward_s, m.backward_s, m.meta["median_of"]) == (4.0, 2.0, 3)
    with pytest.raises(ValueError, match="differ in their saved tensors"):
        median_trace([a, Trace(tensors=(_rec(0, 1.0, 5.0),))])
    with pytest.raises(ValueError, match="at least one trace"):
        median_trace([])


def test_runtime_plan_mapping_keeps_duplicates_with_their_first():
    class Decision:
        def __init__(self, action):
            self.action = action

    class Plan:
        decisions: ClassVar[dict[int, Decision]] = {0: Decision(Action.SWAP), 1: Decision(Action.SWAP), 2: Decision(Action.ZVC_KEEP)}

    trace = Trace(tensors=(_rec(0, 0.0, 2.0), _rec(1, 0.0, 1.0, offloadable=False), _rec(2, 0.5, 1.5), _rec(3, 0.6, 1.6)),
                  meta={"duplicates": {"1": 0}})
    assert runtime_actions(trace, Plan()) == (Action.SWAP, Action.KEEP, Action.ZVC_KEEP, Action.KEEP)


def test_validate_runs_the_runtime_and_simulates_its_plans(monkeypatch):
    ticks = iter(range(1, 10**9))  # a clock that moves 1 ms per reading: measured times are positive and exact
    monkeypatch.setattr("cswap.simulate.validate.time", SimpleNamespace(perf_counter=lambda: next(ticks) * 1e-3))
    rows = validate(
        models=("vgg11",), policies=("none", "swap", "compress-keep"), batch_size=2, resolution=32, width_mult=0.125,
        iterations=2, min_bytes=0, overheads=RuntimeOverheads(0.0, 0.0, 0.0, 0.0),
    )
    assert [r.policy for r in rows] == ["none", "swap", "compress-keep"]
    for row in rows:
        assert row.measured_s > 0 and row.simulated_s > 0 and np.isfinite(row.error)
        assert row.plan_matches, f"the simulator's {row.policy} plan differs from the runtime's"
    with pytest.raises(ValueError, match="not runtime policies"):
        validate(models=("vgg11",), policies=("recompute",))  # the runtime's only: the simulator has no regions
