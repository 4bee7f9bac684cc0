"""``cswap calibrate``: labelling tensors with the cost model, leave-one-model-out accuracy, the command."""

from __future__ import annotations

import json
from pathlib import Path
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from cswap.cli import app
from cswap.commands.calibrate import HIDDEN_SCALES, decision_dataset, evaluate_decider, link_profiles
from cswap.device import fingerprint
from cswap.planner.costmodel import decide
from cswap.predictors import load_decider, load_time_model
from cswap.predictors.features import DECISION_FEATURES
from cswap.profile.trace import TensorRecord, Trace


def _codec_s(op: str, nbytes: int, density: float, itemsize: int) -> float:
    """A GPU-like codec: 25 us per call, 400 GB/s."""
    return 25e-6 + nbytes * (1 + density) / 400e9 * (1.2 if op == "compress" else 1.0)


def _trace(seed: int, n: int = 60) -> Trace:
    rng = np.random.default_rng(seed)
    records = []
    for key in range(n):
        numel = int(2 ** rng.uniform(8, 24))
        dtype = "float32" if key % 3 else "bfloat16"
        itemsize = 4 if dtype == "float32" else 2
        records.append(TensorRecord(
            key=key, shape=(numel,), dtype=dtype, nbytes=numel * itemsize, sparsity=float(rng.uniform(0, 1)),
            hidden_forward_s=float(rng.uniform(0, 2e-3)), hidden_backward_s=float(rng.uniform(0, 2e-3)),
            offloadable=key % 10 != 0,
        ))
    return Trace(tensors=tuple(records))


LINKS = {"pcie3": (12.0, 12.0), "pcie5": (50.0, 50.0), "slow": (1.0, 1.0)}


def test_labels_are_the_cost_model_verdicts() -> None:
    traces = {"a": _trace(0), "b": _trace(1)}
    data = decision_dataset(traces, _codec_s, LINKS, hidden_scales=(0.0, 1.0))
    offloadable = [r for t in traces.values() for r in t.tensors if r.offloadable]
    assert data.features.shape == (len(offloadable) * len(LINKS) * 2, len(DECISION_FEATURES))
    row = 0
    for group, trace in traces.items():
        for record in (r for r in trace.tensors if r.offloadable):
            itemsize = 4 if record.dtype == "float32" else 2
            for d2h, h2d in LINKS.values():
                for scale in (0.0, 1.0):
                    expected = decide(record.nbytes, record.sparsity, record.hidden_forward_s * scale,
                                      record.hidden_backward_s * scale, d2h, h2d,
                                      _codec_s("compress", record.nbytes, record.density, itemsize),
                                      _codec_s("decompress", record.nbytes, record.density, itemsize), itemsize=itemsize)
                    assert data.labels[row] == expected.compress
                    assert data.groups[row] == group
                    row += 1
    assert 0 < data.labels.mean() < 1


def test_leave_one_model_out_accuracy_is_high_on_held_out_models() -> None:
    traces = {name: _trace(seed) for seed, name in enumerate(["m1", "m2", "m3"])}
    data = decision_dataset(traces, _codec_s, LINKS, HIDDEN_SCALES)
    report = evaluate_decider(data)
    assert set(report["accuracy_by_model"]) == {"m1", "m2", "m3"}
    assert report["accuracy"] >= 0.95
    assert report["accuracy"] > report["baseline_accuracy"]
    assert report["balanced_accuracy"] >= 0.9
    assert report["test_samples"] == len(data.labels)
    assert report["accuracy_measured_link"] is None  # no link called "measured" here


def test_single_class_data_falls_back_to_the_majority() -> None:
    never = decision_dataset({"a": _trace(0), "b": _trace(1)}, lambda *args: 10.0, LINKS, (1.0,))
    assert not never.labels.any()
    report = evaluate_decider(never)
    assert report["accuracy"] == report["baseline_accuracy"] == 1.0


def test_a_trace_without_offloadable_tensors_is_an_error() -> None:
    frozen = Trace(tensors=(TensorRecord(key=0, shape=(4,), dtype="float32", nbytes=16, sparsity=0.5, offloadable=False),))
    with pytest.raises(ValueError, match="no offloadable tensor"):
        decision_dataset({"a": frozen}, _codec_s, LINKS)


def test_links_include_measured_profiles_and_slow_links() -> None:
    links = link_profiles(3.0, 4.0)
    assert links["measured"] == (3.0, 4.0)
    assert {"v100-pcie3", "a100-pcie4", "h100-pcie5"} <= set(links)
    assert min(d2h for d2h, _ in links.values()) < 1.0 < 250.0 < max(d2h for d2h, _ in links.values())  # down to NVLink-C2C


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory) -> tuple[dict, str]:
    home = tmp_path_factory.mktemp("cswap-home")
    result = CliRunner().invoke(app, ["calibrate", "--quick", "--json", "--backend", "cpu"], env={"CSWAP_HOME": str(home)})
    assert result.exit_code == 0, result.output
    assert result.stderr == ""  # --json in a pipe: nothing but the JSON, on stdout
    return json.loads(result.stdout), str(home)


def test_progress_on_a_terminal_is_a_bar_and_in_a_log_one_line_per_stage(tmp_path: Path) -> None:
    """A terminal gets a live bar through every stage; a log gets plain stage lines, never the bar."""
    from io import StringIO

    from rich.console import Console

    from cswap.commands.calibrate import QUICK_TRACE_MODELS, run_calibrate

    terminal, log = StringIO(), StringIO()
    run_calibrate("cpu", quick=True, store_path=tmp_path / "a.db",
                  console=Console(file=terminal, force_terminal=True, width=100))
    run_calibrate("cpu", quick=True, store_path=tmp_path / "b.db", console=Console(file=log, width=100))
    shown = terminal.getvalue()
    assert "measuring zvc/cpu at 48 points" in shown and "profiling squeezenet1_1 for the decider" in shown
    assert "━" in shown  # the bar itself
    assert [line for line in log.getvalue().splitlines() if line] == [
        "cswap calibrate: measuring zvc/cpu at 48 points",
        "cswap calibrate: fitting time models",
        *(f"cswap calibrate: profiling {name} for the decider" for name in QUICK_TRACE_MODELS),
    ]


def test_quick_json_has_the_documented_keys(quick_report: tuple[dict, str]) -> None:
    report, _ = quick_report
    assert {"backend", "codec", "device", "calibration", "time_models", "decision", "store", "stored", "wall_s"} <= set(report)
    assert report["backend"] == "cpu" and report["quick"] is True
    assert {(m["backend"], m["op"], m["itemsize"]) for m in report["time_models"]} == {
        ("cpu", op, w) for op in ("compress", "decompress") for w in (2, 4)
    }
    for model in report["time_models"]:
        assert math.isfinite(model["mape"]) and model["mape"] >= 0
        assert model["samples"] == 12 and model["heldout_samples"] == 3
    assert report["calibration"]["samples"] == 48
    # wall times are reported, never compared: a loaded machine can make any of them anything
    assert all(isinstance(seconds, float) and math.isfinite(seconds) for seconds in (report["calibration"]["wall_s"], report["wall_s"]))
    decision = report["decision"]
    assert 0.0 <= decision["accuracy"] <= 1.0 and 0.0 <= decision["baseline_accuracy"] <= 1.0
    assert decision["models"] == ["alexnet", "squeezenet1_1"] and decision["traces"] == "profiled"
    assert decision["test_samples"] == decision["tensors"] * len(decision["links_gbps"]) * len(HIDDEN_SCALES)
    assert report["stored"] == ["calibration-samples/cpu", "time-model/cpu", "decider/cpu"]


def test_quick_run_stores_what_the_runtime_loads(quick_report: tuple[dict, str], monkeypatch: pytest.MonkeyPatch) -> None:
    report, home = quick_report
    monkeypatch.setenv("CSWAP_HOME", home)
    fp = fingerprint("cpu")
    assert report["device"]["key"] == fp.key
    model = load_time_model(fp)
    assert model is not None and model.backends == ("cpu",)
    assert model.compress_s(1 << 16, 0.5, 4, "cpu") > 0
    decider = load_decider(fp)
    assert decider is not None and decider.meta["models"] == ["alexnet", "squeezenet1_1"]
    assert isinstance(decider.should_compress(1 << 20, 0.5, 0.0, 0.0, 12.0, 12.0), bool)


def test_unknown_backend_is_refused_before_measuring() -> None:
    result = CliRunner().invoke(app, ["calibrate", "--backend", "tpu", "--quick"])
    assert result.exit_code == 2
    assert "unknown backend 'tpu': choose one of cpu, cuda, torch" in result.output


def test_table_output_and_an_explicit_store(tmp_path) -> None:
    from cswap.tuner.store import ConfigStore

    path = tmp_path / "elsewhere.db"
    result = CliRunner().invoke(app, ["calibrate", "--quick", "--backend", "torch", "--store", str(path)])
    assert result.exit_code == 0, result.output
    assert "zvc/torch" in result.stdout and "MAPE" in result.stdout and "decider: accuracy" in result.stdout
    model = load_time_model(fingerprint("cpu"), ConfigStore(path))
    assert model is not None and model.backends == ("torch",)
    assert load_decider(fingerprint("cpu"), ConfigStore(path), backend="torch") is not None
