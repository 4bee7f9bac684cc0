"""Every codec's time is calibrated like ZVC's: plans on its dtypes, its tuned configs, its own fitted rows, kept beside the others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cswap.cli import app
from cswap.commands.calibrate import run_calibrate
from cswap.device import fingerprint
from cswap.predictors import fit_time_models, load_samples, load_time_model
from cswap.predictors.calibration import CODEC_DTYPES, CalibrationPlan, calibrate
from cswap.tuner.kernels import kernel_source_hash
from cswap.tuner.store import ConfigStore, TuningRun, size_bucket

TINY = dict(sizes_bytes=(4096, 8192, 16384), densities=(1.0, 0.5), passes=1, min_passes=1, refine_rounds=0,
            min_time_s=1e-4, max_units=2)


def test_plans_take_each_codecs_dtypes() -> None:
    assert CalibrationPlan.default("cpu").dtypes == ("bfloat16", "float32")  # ZVC's, as before
    assert CalibrationPlan.default("cpu", "bitpack").dtypes == ("bool",)
    assert CalibrationPlan.quick("cpu", "exponent").dtypes == CODEC_DTYPES["exponent"] == ("bfloat16", "float32")
    assert CalibrationPlan(backend="cpu", sizes_bytes=(4096,), codec="bitpack", dtypes=("uint8",)).n_points == 10
    with pytest.raises(ValueError, match=r"codec 'bitpack' does not take dtypes \['float32'\]: it takes bool, uint8"):
        CalibrationPlan(backend="cpu", sizes_bytes=(4096,), codec="bitpack", dtypes=("float32",))
    with pytest.raises(ValueError, match="unknown codec 'lz4'"):
        CalibrationPlan(backend="cpu", sizes_bytes=(4096,), codec="lz4")


@pytest.mark.parametrize("codec", ["bitpack", "exponent"])
def test_calibration_measures_the_codec_with_its_own_tuned_configs(tmp_path: Path, codec: str) -> None:
    store = ConfigStore(tmp_path / "store.db")
    fp = fingerprint("cpu").to_dict()
    dtype = CODEC_DTYPES[codec][-1]
    ours = {"threads": 1} if codec == "bitpack" else {"threads": 1, "chunk_words": 64}
    for kernel, params in ((f"{codec}.cpu.compress", ours), ("zvc.cpu.decompress", {"threads": 1, "chunk_words": 128})):
        owner = kernel.split(".")[0]
        store.record_run(TuningRun(fingerprint=fp, kernel=kernel, source_hash=kernel_source_hash("cpu", owner),
                                   dtype=dtype if owner == codec else "float32", bucket=size_bucket(4096),
                                   method="grid", best_params=params, best_time_s=1e-4))
    run = calibrate(CalibrationPlan(backend="cpu", codec=codec, **TINY), fingerprint=fp, store=store)
    assert {s.codec for s in run.samples} == {codec} and {s.dtype for s in run.samples} == set(CODEC_DTYPES[codec])
    assert len(run.samples) == run.plan.n_points
    for sample in run.samples:
        tuned = (sample.op, sample.dtype, size_bucket(sample.nbytes)) == ("compress", dtype, size_bucket(4096))
        assert sample.launch_match == ("exact" if tuned else "default")  # ZVC's decompress config is not ours
        if tuned:
            assert {k: sample.launch[k] for k in ours} == ours
        assert sample.time_s > 0 and 0.45 <= sample.density <= 1.0
    model, reports = fit_time_models(run.samples)
    widths = {torch.bool: 1, torch.bfloat16: 2, torch.float32: 4}
    expected = {("cpu", codec, op, widths[getattr(torch, d)]) for op in ("compress", "decompress") for d in CODEC_DTYPES[codec]}
    assert set(model.models) == {r.key for r in reports} == expected
    assert model.compress_s(1 << 20, 1.0, expected.pop()[3], "cpu", codec) > 0


def test_calibrating_new_codecs_keeps_zvcs_models(tmp_path: Path) -> None:
    store_path = tmp_path / "store.db"
    zvc = run_calibrate("cpu", quick=True, store_path=store_path, show_progress=False)
    assert zvc["codec"] == "zvc" and zvc["decision"] is not None
    report = run_calibrate("cpu", quick=True, store_path=store_path, show_progress=False, codec="bitpack,exponent")
    assert report["codecs"] == ["bitpack", "exponent"] and report["decision"] is None  # the decider is ZVC's
    assert report["stored"] == ["calibration-samples/cpu/bitpack", "calibration-samples/cpu/exponent", "time-model/cpu"]
    assert {(m["codec"], m["op"], m["itemsize"]) for m in report["time_models"]} == {
        (codec, op, width) for op in ("compress", "decompress") for codec, widths in (("bitpack", (1,)), ("exponent", (2, 4)))
        for width in widths
    }
    assert {codec: part["dtypes"] for codec, part in report["calibration"]["by_codec"].items()} == {
        "bitpack": ["bool"], "exponent": ["bfloat16", "float32"]}
    store = ConfigStore(store_path)
    fp = fingerprint("cpu")
    model = load_time_model(fp, store)
    assert model is not None
    assert {key[1:] for key in model.models} == {
        (codec, op, width) for op in ("compress", "decompress")
        for codec, widths in (("zvc", (2, 4)), ("bitpack", (1,)), ("exponent", (2, 4))) for width in widths
    }
    for codec, itemsize in (("zvc", 4), ("bitpack", 1), ("exponent", 2)):
        assert model.decompress_s(1 << 20, 0.5, itemsize, "cpu", codec) > 0
    for codec in ("zvc", "bitpack", "exponent"):
        samples = load_samples(fp, "cpu", store, codec=codec)
        assert samples is not None and {s["codec"] for s in samples["samples"]} == {codec}
    # Calibrating ZVC again replaces ZVC's rows and keeps the others.
    run_calibrate("cpu", quick=True, store_path=store_path, show_progress=False)
    assert {key[1] for key in load_time_model(fp, store).models} == {"zvc", "bitpack", "exponent"}


def test_cswap_calibrate_codec_json(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["calibrate", "--quick", "--json", "--backend", "cpu", "--codec", "bitpack",
                                      "--store", str(tmp_path / "s.db")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["codec"], report["calibration"]["samples"]) == ("bitpack", 24)
    assert [(m["codec"], m["op"]) for m in report["time_models"]] == [("bitpack", "compress"), ("bitpack", "decompress")]
    result = CliRunner().invoke(app, ["calibrate", "--quick", "--backend", "cpu", "--codec", "lz4"])
    assert result.exit_code == 2 and "no tunable kernels for codec 'lz4'" in result.stderr
