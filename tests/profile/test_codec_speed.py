"""The fallback time model: a measured, cached, linear model of codec seconds."""

from __future__ import annotations

import json
from dataclasses import astuple

import pytest
import torch

import cswap
from cswap.device import fingerprint
from cswap.paths import cswap_home
from cswap.profile.codec_speed import CodecSpeed, OpSpeed, cache_path, codec_speed, kernels_digest, measure_codec_speed


def test_op_speed_is_linear_in_bytes_and_nonzeros() -> None:
    op = OpSpeed(fixed_s=1e-5, s_per_byte=1e-9, s_per_nonzero_byte=2e-9)
    assert op.seconds(1_000_000, 0.25) == pytest.approx(1e-5 + 1e-3 + 0.5e-3)
    assert op.dense_gbps == pytest.approx(1 / 3)


class FakeClock:
    """Seconds that advance only when a (wrapped) codec call says how long it took."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


#: Seconds per byte each fake codec call "takes" beyond ZVC's 1e-9 (compress) on the injected clock.
OTHER_RATES = {("exponent", 2): (60e-9, 12e-9), ("exponent", 4): (30e-9, 8e-9), ("bitpack", 1): (0.2e-9, 0.5e-9)}


def test_measurement_fits_the_seconds_its_clock_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each call "takes" a known linear time on an injected clock, per codec and width; the fit
    recovers each one's coefficients."""
    import cswap.profile.codec_speed as module

    clock = FakeClock()
    real_compress, real_decompress = module.compress, module.decompress

    def compress(tensor, codec="zvc", **kwargs):
        rate = 1e-9 if codec == "zvc" else OTHER_RATES[codec, tensor.element_size()][0]
        clock.now_s += 1e-5 + rate * tensor.nbytes
        return real_compress(tensor, codec=codec, **kwargs)

    def decompress(packed, *, out, **kwargs):
        if packed.codec == "zvc":
            clock.now_s += 2e-5 + 0.5e-9 * out.nbytes + 2e-9 * out.nbytes * packed.density
        else:
            clock.now_s += 2e-5 + OTHER_RATES[packed.codec, out.element_size()][1] * out.nbytes
        return real_decompress(packed, out=out, **kwargs)

    monkeypatch.setattr(module, "compress", compress)
    monkeypatch.setattr(module, "decompress", decompress)
    speed = measure_codec_speed("cpu", "cpu", sizes=(64 << 10, 256 << 10, 1 << 20), repeats=2, clock=clock)
    assert speed.backend == "cpu" and speed.device_key == fingerprint("cpu").key
    assert astuple(speed.compress) == pytest.approx((1e-5, 1e-9, 0.0), rel=1e-6, abs=1e-15)
    assert astuple(speed.decompress) == pytest.approx((2e-5, 0.5e-9, 2e-9), rel=1e-6, abs=1e-15)
    for op in ("compress_s", "decompress_s"):
        small = getattr(speed, op)(64 << 10, 0.5, 4, "cpu")
        large = getattr(speed, op)(16 << 20, 0.5, 4, "cpu")
        assert 0 < small < large
    assert {(codec, width) for codec, width, *_ in speed.others} == set(OTHER_RATES)
    for (codec, width), (compress_rate, decompress_rate) in OTHER_RATES.items():
        nbytes = 8 << 20
        # whatever the density asked for: these codecs pass over every element
        assert speed.compress_s(nbytes, 0.3, width, "cpu", codec=codec) == pytest.approx(1e-5 + compress_rate * nbytes, rel=1e-4)
        assert speed.decompress_s(nbytes, 0.3, width, "cpu", codec=codec) == pytest.approx(2e-5 + decompress_rate * nbytes, rel=1e-4)


def test_a_codec_not_timed_is_refused_by_name() -> None:
    speed = CodecSpeed(backend="cpu", compress=OpSpeed(0, 1e-9, 0), decompress=OpSpeed(0, 1e-9, 0),
                       others=(("bitpack", 1, OpSpeed(0, 1e-10, 0), OpSpeed(0, 1e-10, 0)),))
    with pytest.raises(ValueError, match="codec 'exponent' was not timed on backend 'cpu' \\(timed: zvc, bitpack\\)"):
        speed.compress_s(100, 1.0, 2, "cpu", codec="exponent")


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
    path = cache_path("cpu", "torch")
    assert path.parent == cswap_home() and fingerprint("cpu").key in path.name
    assert json.loads(path.read_text())["backend"] == "torch"
    assert codec_speed("cpu", "torch") == first  # read back, not re-measured


def test_a_speed_measured_with_other_kernels_is_measured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    import cswap.profile.codec_speed as module

    measured = CodecSpeed(backend="cpu", compress=OpSpeed(1e-3, 1e-9, 0.0), decompress=OpSpeed(2e-3, 1e-9, 0.0))
    monkeypatch.setattr(module, "measure_codec_speed", lambda device, backend, **kwargs: measured)
    stale = CodecSpeed(backend="cpu", compress=OpSpeed(9.0, 9.0, 0.0), decompress=OpSpeed(9.0, 9.0, 0.0))
    path = cache_path("cpu", "cpu")
    older = path.with_name(path.name.replace(kernels_digest("cpu"), "0" * 12))  # the kernels before an edit
    older.write_text(json.dumps(stale.to_dict()))
    assert codec_speed("cpu", "cpu") == measured
    assert CodecSpeed.from_dict(json.loads(path.read_text())) == measured


def test_asking_for_another_backend_is_an_error() -> None:
    speed = CodecSpeed(backend="cpu", compress=OpSpeed(0, 0, 0), decompress=OpSpeed(0, 0, 0))
    with pytest.raises(ValueError, match="measured for backend 'cpu', not 'cuda'"):
        speed.compress_s(100, 0.5, 4, "cuda")


def test_round_trip_and_version_check() -> None:
    speed = CodecSpeed(backend="cpu", compress=OpSpeed(1, 2, 3), decompress=OpSpeed(4, 5, 6), device_key="k",
                       others=(("exponent", 2, OpSpeed(7, 8, 0), OpSpeed(9, 10, 0)),))
    assert CodecSpeed.from_dict(speed.to_dict()) == speed
    with pytest.raises(ValueError, match="format"):
        CodecSpeed.from_dict({**speed.to_dict(), "version": 99})


def test_cswap_runtime_measures_it_when_no_time_model_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    import cswap.profile.codec_speed as module

    measured = CodecSpeed(backend="cpu", compress=OpSpeed(1e-3, 1e-9, 0.0), decompress=OpSpeed(2e-3, 1e-9, 0.0))
    calls: list[tuple[str, str]] = []

    def measure(device, backend, **kwargs) -> CodecSpeed:
        calls.append((str(device), backend))
        return measured

    monkeypatch.setattr(module, "measure_codec_speed", measure)
    rt = cswap.Runtime("cswap", device="cpu", min_bytes=0, d2h_gbps=10.0, h2d_gbps=10.0)
    x = torch.randn(256, 256, requires_grad=True)
    with rt.iteration():
        torch.relu(x * 1.0).sum().backward()
    assert calls == [("cpu", "cpu")]
    cached = cache_path("cpu", "cpu")
    assert CodecSpeed.from_dict(json.loads(cached.read_text())) == measured
    decisions = [d for d in rt.plan().decisions.values() if d.compress_s is not None]
    assert decisions and all(d.compress_s >= 1e-3 and d.decompress_s >= 2e-3 and d.swap_s is not None for d in decisions)
