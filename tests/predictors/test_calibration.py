"""Calibration: the plan, the measurements, tuned launch configs, the samples document."""

from __future__ import annotations

import json

import pytest
import torch

from cswap.device import fingerprint
from cswap.predictors.calibration import CalibrationPlan, Sample, calibrate, log_sizes, samples_from_dict, samples_to_dict
from cswap.tuner.kernels import kernel_source_hash
from cswap.tuner.store import ConfigStore, TuningRun, size_bucket

TINY = dict(sizes_bytes=(4096, 16384), densities=(1.0, 0.5, 0.1), passes=2, min_passes=1, refine_rounds=0,
            min_time_s=1e-4, max_units=2)


def test_log_sizes_are_log_spaced_multiples_of_256() -> None:
    sizes = log_sizes(4096, 64 << 20, 15)
    assert sizes == tuple(4096 << k for k in range(15))
    odd = log_sizes(4096, 1 << 20, 7)
    assert all(s % 256 == 0 for s in odd) and list(odd) == sorted(set(odd))
    with pytest.raises(ValueError, match="need count >= 2"):
        log_sizes(4096, 1 << 20, 1)


def test_default_plans_cover_the_documented_grid() -> None:
    cpu = CalibrationPlan.default("cpu")
    assert (cpu.sizes_bytes[0], cpu.sizes_bytes[-1]) == (4 << 10, 64 << 20)
    ratios = [b / a for a, b in zip(cpu.sizes_bytes, cpu.sizes_bytes[1:])]
    assert max(ratios) < 2 and max(ratios) / min(ratios) < 1.05  # log-spaced (up to rounding to 256 B)
    assert not any(s & (s - 1) == 0 for s in cpu.sizes_bytes[1:-1])  # off the powers of two
    assert CalibrationPlan.default("cuda").sizes_bytes[-1] == 256 << 20
    assert cpu.dtypes == ("bfloat16", "float32") and min(cpu.densities) == 0.01 and max(cpu.densities) == 1.0
    assert cpu.n_points == 16 * 5 * 2 * 2
    quick = CalibrationPlan.quick("cpu")
    assert max(quick.sizes_bytes) <= 256 << 10 and quick.n_points < cpu.n_points / 4


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"backend": "tpu"}, "unknown backend 'tpu'"),
        ({"sizes_bytes": (4000,)}, "multiples of 256"),
        ({"sizes_bytes": ()}, "multiples of 256"),
        ({"densities": (0.0,)}, r"densities must lie in \(0, 1\]"),
        ({"densities": (1.5,)}, r"densities must lie in \(0, 1\]"),
        ({"dtypes": ("int8",)}, r"unknown dtypes \['int8'\]"),
        ({"ops": ("encode",)}, r"unknown ops \['encode'\]"),
        ({"passes": 1, "min_passes": 2}, "min_passes <= passes"),
        ({"budget_s": 0.0}, "budget_s must be positive"),
        ({"refine_ratio": 1.0}, "refine_ratio must be > 1"),
    ],
)
def test_bad_plans_raise(changes: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CalibrationPlan(backend="cpu", sizes_bytes=(4096,)).with_(**changes)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_calibrate_measures_every_point(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every point is run; its seconds come from an injected timer that counts the calls (1 ms, 2 ms, ...)."""
    calls: list[int] = []

    def time_call_s(call, device) -> float:
        call()
        calls.append(len(calls) + 1)
        return calls[-1] * 1e-3

    monkeypatch.setattr("cswap.predictors.calibration.time_call_s", time_call_s)
    plan = CalibrationPlan(backend=backend, **TINY)
    steps: list[tuple[int, int]] = []
    run = calibrate(plan, on_step=lambda done, total: steps.append((done, total)))
    assert len(run.samples) == plan.n_points
    assert {(s.dtype, s.itemsize) for s in run.samples} == {("bfloat16", 2), ("float32", 4)}
    assert {(s.nbytes, s.op) for s in run.samples} == {(n, op) for n in plan.sizes_bytes for op in plan.ops}
    for sample in run.samples:
        nominal = min(plan.densities, key=lambda d: abs(d - sample.density))
        assert abs(sample.density - nominal) < 0.05
        assert sample.time_s == min(sample.times_s) > 0
        assert len(sample.times_s) >= 2  # the warm-up timing and at least one pass
        assert all(round(t * 1e3) in calls for t in sample.times_s)
        assert sample.launch_match == "default"
        if backend == "cpu":
            assert set(sample.launch) == {"threads", "chunk_words"}
        else:
            assert sample.launch == {}
    assert run.fingerprint == fingerprint("cpu").to_dict()
    assert [done for done, _ in steps] == list(range(1, len(steps) + 1))
    assert steps[-1][0] == steps[-1][1]


def test_a_spent_budget_stops_after_the_minimum_passes() -> None:
    plan = CalibrationPlan(backend="torch", **{**TINY, "passes": 5, "min_passes": 1, "budget_s": 1e-3})
    steps: list[tuple[int, int]] = []
    calibrate(plan, on_step=lambda done, total: steps.append((done, total)))
    assert steps[-1] == (2 * plan.n_points, 2 * plan.n_points)  # warm-up and one pass


def test_tuned_launch_configs_are_used(tmp_path) -> None:
    store = ConfigStore(tmp_path / "store.db")
    fp = fingerprint("cpu").to_dict()
    tuned = {"threads": 1, "chunk_words": 64}
    store.record_run(TuningRun(fingerprint=fp, kernel="zvc.cpu.compress", source_hash=kernel_source_hash("cpu"),
                               dtype="float32", bucket=size_bucket(4096), method="grid", best_params=tuned, best_time_s=1e-4))
    plan = CalibrationPlan(backend="cpu", **{**TINY, "sizes_bytes": (4096,)})
    run = calibrate(plan, fingerprint=fp, store=store)
    for sample in run.samples:
        if (sample.op, sample.dtype) == ("compress", "float32"):
            assert (sample.launch, sample.launch_match) == (tuned, "exact")
        else:
            assert sample.launch_match == "default" and sample.launch["chunk_words"] == 32


def test_samples_document_round_trips() -> None:
    run = calibrate(CalibrationPlan(backend="torch", **{**TINY, "ops": ("compress",)}))
    document = json.loads(json.dumps(run.to_dict()))
    assert samples_from_dict(document) == run.samples
    assert document["plan"]["sizes_bytes"] == [4096, 16384]
    assert samples_to_dict(run.samples, run.fingerprint)["samples"] == document["samples"]


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.update(format="other"), "not a calibration-samples document"),
        (lambda d: d.update(version=9), "version 9 is not supported"),
        (lambda d: d.update(samples={}), "no 'samples' list"),
        (lambda d: d["samples"][0].update(time_s=-1.0), "time_s must be positive"),
        (lambda d: d["samples"][0].update(op="encode"), "op='encode'"),
        (lambda d: d["samples"][0].update(colour="red"), r"unknown fields \['colour'\]"),
        (lambda d: d["samples"][0].pop("nbytes"), r"missing fields \['nbytes'\]"),
    ],
)
def test_malformed_samples_raise(mutate, match: str) -> None:
    sample = Sample("cpu", "zvc", "compress", "float32", 4, 4096, 0.5, 1e-4, (1e-4, 2e-4))
    document = samples_to_dict([sample], fingerprint("cpu").to_dict())
    mutate(document)
    with pytest.raises(ValueError, match=match):
        samples_from_dict(document)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_cuda_without_a_gpu_names_the_fix() -> None:
    with pytest.raises(RuntimeError, match="torch sees no GPU.*--backend cpu"):
        calibrate(CalibrationPlan(backend="cuda", **TINY))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_calibration_measures_on_the_gpu() -> None:
    run = calibrate(CalibrationPlan(backend="cuda", **TINY))
    assert len(run.samples) == CalibrationPlan(backend="cuda", **TINY).n_points
    assert all(s.time_s > 0 and set(s.launch) >= {"compress_grid", "compress_block"} for s in run.samples)
