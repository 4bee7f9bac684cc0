"""``cswap simulate``: the JSON report, the table, the plot and the errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cswap.cli import app
from cswap.simulate import POLICIES, meta_trace

SMALL = ["--model", "vgg11", "--batch-size", "2", "--resolution", "32", "--min-bytes", "0"]
KEYS = ("iteration_s", "compute_s", "exposed_transfer_s", "codec_s", "peak_bytes", "formula_iteration_s")


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def test_json_has_every_policy_and_key(runner):
    result = runner.invoke(app, ["simulate", *SMALL, "--hardware", "a100-pcie4", "--policies", "all", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert tuple(report["policies"]) == POLICIES
    assert report["hardware"] == "a100-pcie4" and report["model"] == "vgg11" and report["batch_size"] == 2
    for row in report["policies"].values():
        for key in KEYS:
            assert isinstance(row[key], (int, float)), key
    assert report["policies"]["none"]["exposed_transfer_s"] == 0.0
    assert report["policies"]["cswap"]["iteration_s"] <= report["policies"]["swap"]["iteration_s"]


def test_table_and_plot(runner, tmp_path):
    plot = tmp_path / "out" / "bars.png"
    result = runner.invoke(app, ["simulate", *SMALL, "--policies", "none,swap,cswap", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert "vgg11 batch 2 on v100-pcie3" in result.output and "cswap" in result.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_file(runner, tmp_path):
    path = meta_trace("alexnet", batch_size=2, resolution=64, width_mult=0.25).to_json(tmp_path / "t.json")
    result = runner.invoke(app, ["simulate", "--trace", str(path), "--hardware", "h100-pcie5", "--policies", "swap", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["trace"] == str(path) and report["model"] == "alexnet" and list(report["policies"]) == ["swap"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--hardware", "tpu-v9"], "unknown hardware 'tpu-v9': choose one of a100-pcie4, gh200-c2c, h100-pcie5, h100-sxm, v100-pcie3"),
        (["--model", "lenet"], "unknown model 'lenet': choose one of alexnet"),
        (["--policies", "swap,vdnn"], "unknown policies ['vdnn']"),
    ],
)
def test_errors_name_the_valid_choices(runner, args, message):
    result = runner.invoke(app, ["simulate", "--batch-size", "2", "--resolution", "32", *args])
    assert result.exit_code == 2
    flat = " ".join(result.output.replace("│", " ").split())
    assert message in flat


def test_missing_trace_file(runner, tmp_path):
    result = runner.invoke(app, ["simulate", "--trace", str(tmp_path / "nope.json")])
    assert result.exit_code == 2
    assert "cannot read trace" in " ".join(result.output.replace("│", " ").split())


def test_a_profiled_runtime_trace(runner, tmp_path):
    import torch

    import cswap
    from cswap import models
    from cswap.simulate.timeline import Timeline

    torch.manual_seed(0)
    model = models.build("resnet18", num_classes=10, width_mult=0.125)
    rt = cswap.Runtime("none", device="cpu", d2h_gbps=1.0, h2d_gbps=1.0)
    with rt.iteration():
        model(torch.randn(2, 3, 32, 32)).sum().backward()
    path = rt.trace().to_json(tmp_path / "profiled.json")
    result = runner.invoke(app, ["simulate", "--trace", str(path), "--hardware", "v100-pcie3", "--min-bytes", "0", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    compute = Timeline.from_trace(rt.trace()).compute_s
    for row in report["policies"].values():
        assert row["compute_s"] == pytest.approx(compute)
    assert report["policies"]["none"]["iteration_s"] == pytest.approx(compute)
    assert report["policies"]["swap"]["transferred_bytes"] > 0
