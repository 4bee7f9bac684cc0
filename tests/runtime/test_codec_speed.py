"""The fallback time model: a measured, cached, linear model of codec seconds."""

from __future__ import annotations

import json

import pytest
import torch

import cswap
from cswap.codec_speed import CodecSpeed, OpSpeed, codec_speed, measure_codec_speed
from cswap.device import fingerprint
from cswap.paths import cswap_home


def test_op_speed_is_linear_in_bytes_and_nonzeros() -> None:
    op = OpSpeed(fixed_s=1e-5, s_per_byte=1e-9, s_per_nonzero_byte=2e-9)
    assert op.seconds(1_000_000, 0.25) == pytest.approx(1e-5 + 1e-3 + 0.5e-3)
    assert op.dense_gbps == pytest.approx(1 / 3)


def test_measured_model_is_positive_and_grows_with_size() -> None:
    speed = measure_codec_speed("cpu", "cpu", sizes=(64 << 10, 1 << 20), repeats=2)
    assert speed.backend == "cpu" and speed.device_key == fingerprint("cpu").key
    for op in ("compress_s", "decompress_s"):
        small = getattr(speed, op)(64 << 10, 0.5, 4, "cpu")
        large = getattr(speed, op)(16 << 20, 0.5, 4, "cpu")
        assert 0 < small < large


def test_measurement_leaves_torch_threads_alone() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        measure_codec_speed("cpu", "cpu", sizes=(64 << 10,), densities=(0.5,), repeats=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_cached_per_fingerprint_and_backend() -> None:
    first = codec_speed("cpu", "torch")
    path = cswap_home() / f"codec-speed-{fingerprint('cpu').key}-torch.json"
    assert json.loads(path.read_text())["backend"] == "torch"
    assert codec_speed("cpu", "torch") == first  # read back, not re-measured


def test_asking_for_another_backend_is_an_error() -> None:
    speed = CodecSpeed(backend="cpu", compress=OpSpeed(0, 0, 0), decompress=OpSpeed(0, 0, 0))
    with pytest.raises(ValueError, match="measured for backend 'cpu', not 'cuda'"):
        speed.compress_s(100, 0.5, 4, "cuda")


def test_round_trip_and_version_check() -> None:
    speed = CodecSpeed(backend="cpu", compress=OpSpeed(1, 2, 3), decompress=OpSpeed(4, 5, 6), device_key="k")
    assert CodecSpeed.from_dict(speed.to_dict()) == speed
    with pytest.raises(ValueError, match="format"):
        CodecSpeed.from_dict({**speed.to_dict(), "version": 99})


def test_cswap_runtime_measures_it_when_no_time_model_is_given() -> None:
    rt = cswap.Runtime("cswap", device="cpu", min_bytes=0, d2h_gbps=10.0, h2d_gbps=10.0)
    x = torch.randn(256, 256, requires_grad=True)
    with rt.iteration():
        torch.relu(x * 1.0).sum().backward()
    assert (cswap_home() / f"codec-speed-{fingerprint('cpu').key}-cpu.json").exists()
    decisions = [d for d in rt.plan().decisions.values() if d.compress_s is not None]
    assert decisions and all(d.compress_s > 0 and d.swap_s is not None for d in decisions)
