"""Hardware profiles: the shipped ones load, bad ones fail naming the file and the key."""

from __future__ import annotations

import pytest
import yaml

from cswap.simulate.formula import formula_times
from cswap.simulate.hardware import HARDWARE_ENV, HardwareError, hardware_dir, hardware_names, load_hardware
from cswap.simulate.policies import Action, TensorCost
from cswap.simulate.queues import QueueParams, run_queues
from cswap.simulate.timeline import Timeline

SHIPPED = ("a100-pcie4", "gh200-c2c", "h100-pcie5", "h100-sxm", "v100-pcie3")


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_load_and_cite_sources(name):
    profile = load_hardware(name)
    assert profile.name == name
    assert profile.sources and all(source.strip() for source in profile.sources)
    assert profile.link.async_copies
    assert 0 < profile.device.compute_efficiency <= 1


def test_shipped_names_and_links():
    assert set(SHIPPED) <= set(hardware_names())
    rates = {name: load_hardware(name).link.h2d_gbps for name in SHIPPED}
    assert rates["v100-pcie3"] < rates["a100-pcie4"] < rates["h100-pcie5"] == rates["h100-sxm"] < rates["gh200-c2c"]


def test_h100_profiles_are_the_sxm_module_and_the_pcie_card():
    sxm, pcie = load_hardware("h100-sxm"), load_hardware("h100-pcie5")
    # HBM GB/s, then dense TF32 and BF16 TFLOP/s
    assert (sxm.device.memory_gbps, *map(sxm.device.peak_tflops.get, ("float32", "bfloat16"))) == (3350, 494.7, 989.4)
    assert (pcie.device.memory_gbps, *map(pcie.device.peak_tflops.get, ("float32", "bfloat16"))) == (2000, 378.0, 756.5)
    # the same PCIe 5.0 x16 host link: 64 GB/s nominal per direction, about 55 GB/s measured
    assert sxm.link == pcie.link and sxm.link.h2d_gbps == sxm.link.d2h_gbps == 55.0


def test_gh200_link_is_measured_and_slower_device_to_host():
    link = load_hardware("gh200-c2c").link
    assert (link.h2d_gbps, link.d2h_gbps) == (342.0, 295.0)  # nvbandwidth's copy-engine figures, not 450 nominal


def test_a_swap_on_gh200_pays_each_direction_at_its_own_rate():
    link = load_hardware("gh200-c2c").link
    nbytes = 8 << 30
    cost = TensorCost(nbytes, nbytes, 0.0, 4, 0.0, 0.0, 0.0, 0.0)
    one = Timeline(forward_s=0.0, backward_s=0.0, produced_s=(0.0,), consumed_s=(0.0,))
    out_s, in_s = nbytes / (link.d2h_gbps * 1e9), nbytes / (link.h2d_gbps * 1e9)
    # with nothing to hide behind, the per-tensor formula charges the way out and the way back
    _, exposed_s, _ = formula_times(one, [cost], [Action.SWAP], {0: 0.0}, {0: 0.0}, link.d2h_gbps, link.h2d_gbps)
    assert exposed_s == pytest.approx(out_s + in_s, rel=1e-12)
    assert exposed_s == pytest.approx(0.054235, rel=1e-4) and exposed_s > 2 * nbytes / 342e9
    # four swaps at once: the swap-ins run behind the swap-outs, so the slower device-to-host
    # engine bounds the iteration: four ways out, then one way back
    four = Timeline(forward_s=0.0, backward_s=0.0, produced_s=(0.0,) * 4, consumed_s=(0.0,) * 4)
    queued = run_queues(four, [cost] * 4, [Action.SWAP] * 4, QueueParams(d2h_gbps=link.d2h_gbps, h2d_gbps=link.h2d_gbps))
    assert queued.iteration_s == pytest.approx(4 * out_s + in_s, rel=1e-12)
    assert queued.iteration_s > 4 * in_s + out_s  # what it would be were host-to-device the slower direction


def test_profile_object_and_path_load(tmp_path):
    profile = load_hardware("v100-pcie3")
    assert load_hardware(profile) is profile
    assert load_hardware(hardware_dir() / "v100-pcie3.yaml") == profile


def test_roofline_and_codec_model():
    profile = load_hardware("v100-pcie3")
    flops = 1e12
    assert profile.op_s(flops, 0) == pytest.approx(flops / (15.7e12 * profile.device.compute_efficiency) + 5e-6)
    assert profile.op_s(0, 630e9) == pytest.approx(1.0 + 5e-6)  # 630 GB/s = 70% of 900
    model = profile.time_model()
    # 1 MB at density 0.5: ZVC is 4 * 2^18/32 bitmap bytes + offsets + half the values
    nbytes = 1 << 20
    compressed = 4 * (nbytes // 4 // 32) + 8 * (nbytes // 4 // 32 // 32 + 1) + nbytes // 2
    expected = (nbytes + compressed) / 405e9 + 2.5e-5
    assert model.compress_s(nbytes, 0.5, 4, "cuda") == pytest.approx(expected)
    with pytest.raises(ValueError, match="unknown codec backend 'npu'"):
        model.compress_s(nbytes, 0.5, 4, "npu")


@pytest.mark.parametrize(("name", "bf16_efficiency"), [("h100-sxm", 0.432), ("h100-pcie5", 0.432), ("gh200-c2c", 0.432), ("a100-pcie4", 0.659)])
def test_tensor_core_dtypes_have_their_own_efficiency(name: str, bf16_efficiency: float) -> None:
    profile = load_hardware(name)
    flops = 1e12
    for dtype in ("bfloat16", "float16"):
        peak = profile.device.peak_tflops[dtype] * 1e12
        assert profile.op_s(flops, 0, dtype) == pytest.approx(flops / (peak * bf16_efficiency) + profile.device.op_overhead_s)
    tf32 = profile.device.peak_tflops["float32"] * 1e12
    assert profile.op_s(flops, 0, "float32") == pytest.approx(flops / (tf32 * profile.device.compute_efficiency) + profile.device.op_overhead_s)


@pytest.mark.parametrize(("anchor", "hardware"), [("torchtitan-h100", "h100-sxm"), ("torchtitan-a100", "a100-pcie4")])
def test_shipped_efficiency_reproduces_its_published_throughput(anchor: str, hardware: str) -> None:
    """The calibration holds: the simulated Llama 8B iteration runs at the published tokens/s (within 1%)."""
    from tests.scripts import load_benchmark

    module = load_benchmark("compute_efficiency")
    published = module.ANCHORS[anchor]
    assert module.tokens_per_s(published, load_hardware(hardware)) == pytest.approx(published.tokens_per_s, rel=0.01)


@pytest.mark.parametrize("name", ["h100-sxm", "h100-pcie5", "gh200-c2c"])
def test_other_codecs_are_priced_at_their_measured_rates(name: str) -> None:
    from cswap.planner.costmodel import codec_seconds

    profile = load_hardware(name)
    model = profile.time_model()
    nbytes = 1 << 30
    exponent = profile.device_codecs["exponent"]
    assert model.compress_s(nbytes, 1.0, 2, "cuda", codec="exponent") == pytest.approx(nbytes / 14.4e9 + exponent.compress_overhead_s)
    assert model.decompress_s(nbytes, 1.0, 2, "cpu", codec="bitpack") == pytest.approx(nbytes / 17.7e9 + 2e-5)
    # exponent coding on the device is slower than ZVC's dense pass there, and the planners see it
    assert codec_seconds(model, "compress", nbytes, 1.0, 2, "cuda", "exponent") > 10 * model.compress_s(nbytes, 1.0, 2, "cuda")


def test_a_codec_without_a_rate_is_zvc_on_a_dense_tensor() -> None:
    from cswap.planner.costmodel import codec_seconds

    model = load_hardware("v100-pcie3").time_model()
    with pytest.raises(ValueError, match="profile 'v100-pcie3' gives no speed for codec 'exponent' on backend 'cuda'"):
        model.compress_s(1 << 20, 1.0, 2, "cuda", codec="exponent")
    assert codec_seconds(model, "compress", 1 << 20, 0.5, 2, "cuda", "exponent") == model.compress_s(1 << 20, 1.0, 2, "cuda")


def _write(tmp_path, data, name="bad.yaml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def _good() -> dict:
    return yaml.safe_load((hardware_dir() / "v100-pcie3.yaml").read_text())


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d["link"].pop("h2d_gbps"), r"link\.h2d_gbps: Field required"),
        (lambda d: d["link"].update(d2h_gbps=-1), r"link\.d2h_gbps: Input should be greater than 0"),
        (lambda d: d["device"].update(compute_efficiency=1.5), r"device\.compute_efficiency: Input should be less than or equal to 1"),
        (lambda d: d["device"].update(compute_efficiency_by_dtype={"bfloat16": 0.0}),
         r"device\.compute_efficiency_by_dtype: .*every efficiency must be in \(0, 1\], got \{'bfloat16': 0\.0\}"),
        (lambda d: d["device"].update(peak_tflops={"float16": 100}), r"device\.peak_tflops: .*needs a 'float32' entry"),
        (lambda d: d["device"].update(kind="tpu"), r"device\.kind: Input should be 'cuda' or 'cpu'"),
        (lambda d: d.update(colour="green"), r"colour: Extra inputs are not permitted"),
        (lambda d: d.update(sources=[]), r"sources: .*at least 1"),
        (lambda d: d["host_codec"].update(compress_gbps="fast"), r"host_codec\.compress_gbps: Input should be a valid number"),
    ],
)
def test_invalid_profiles_name_file_and_key(tmp_path, edit, match):
    data = _good()
    edit(data)
    path = _write(tmp_path, data)
    with pytest.raises(HardwareError, match=match) as info:
        load_hardware(path)
    assert str(path) in str(info.value)


def test_malformed_files(tmp_path):
    with pytest.raises(HardwareError, match="is not valid YAML"):
        load_hardware(_write(tmp_path, "device: [unclosed\n"))
    with pytest.raises(HardwareError, match="must be a mapping with keys name, device, link"):
        load_hardware(_write(tmp_path, "- just\n- a list\n"))


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(HardwareError, match="unknown hardware 'tpu-v9': choose one of a100-pcie4, gh200-c2c, h100-pcie5, h100-sxm, v100-pcie3"):
        load_hardware("tpu-v9")


def test_profile_directory_from_the_environment(tmp_path, monkeypatch):
    data = _good()
    data["name"] = "mine"
    _write(tmp_path, data, "mine.yaml")
    monkeypatch.setenv(HARDWARE_ENV, str(tmp_path))
    assert hardware_names() == ("mine",)
    assert load_hardware("mine").name == "mine"
    with pytest.raises(HardwareError, match="choose one of mine"):
        load_hardware("v100-pcie3")


def test_profiles_are_frozen():
    profile = load_hardware("v100-pcie3")
    with pytest.raises(Exception, match="frozen"):
        profile.link.h2d_gbps = 100.0


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
def test_a_cpu_profile_prices_each_codec_at_the_width_it_was_timed(itemsize: int) -> None:
    """Exponent coding of bf16 runs at half fp32's bytes per second on a CPU: the profile made from
    the runtime's timings keeps each width's rate, a width not timed taking the nearest one's."""
    from cswap.profile.codec_speed import CodecSpeed, OpSpeed
    from cswap.simulate.validate import _other_codec_rates

    zvc = OpSpeed(1e-5, 1e-10, 0.0)
    timed = {2: (OpSpeed(0.0, 6e-9, 0.0), OpSpeed(8e-6, 1.4e-9, 0.0)), 4: (OpSpeed(0.0, 3e-9, 0.0), OpSpeed(2e-5, 0.8e-9, 0.0))}
    speed = CodecSpeed("cpu", zvc, zvc, others=tuple(("exponent", w, c, d) for w, (c, d) in timed.items()))
    rates = _other_codec_rates(speed, call_s=1e-6)
    profile = load_hardware("v100-pcie3").model_copy(update={"host_codecs": rates})
    nearest = min(timed, key=lambda w: (abs(w - itemsize), w))
    compress, decompress = timed[nearest]
    model = profile.time_model()
    nbytes = 1 << 20
    assert model.compress_s(nbytes, 1.0, itemsize, "cpu", codec="exponent") == pytest.approx(compress.seconds(nbytes, 1.0) + 1e-6)
    assert model.decompress_s(nbytes, 1.0, itemsize, "cpu", codec="exponent") == pytest.approx(decompress.seconds(nbytes, 1.0) + 1e-6)
