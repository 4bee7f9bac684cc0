"""benchmarks/gpu_suite.py on the CPU: every step recorded with a status, GPU-only steps named as skipped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from torch import device as torch_device

from tests.scripts import load_benchmark

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_suite.py"


def _suite() -> ModuleType:
    return load_benchmark("gpu_suite")


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("suite")
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--scale", "smoke", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads((out / "suite.json").read_text()), (out / "summary.md").read_text()


def test_every_step_has_a_status(cpu_run: tuple[dict, str]) -> None:
    report, _ = cpu_run
    suite = _suite()
    assert list(report["steps"]) == list(suite.STEPS)
    for name, step in report["steps"].items():
        assert step["status"] in {"ok", "skipped", "failed"}, name
        assert step["needs_gpu"] == (name in suite.GPU_ONLY)
    assert report["device"] == "cpu" and report["scale"] == "smoke"


def test_cpu_capable_steps_ran_and_gpu_steps_say_why_not(cpu_run: tuple[dict, str]) -> None:
    report, summary = cpu_run
    steps = report["steps"]
    for name in ("lossless_traffic", "transformers", "codec_traffic", "tuning", "training", "simulator"):
        assert steps[name]["status"] == "ok", steps[name].get("error")
    for name in ("gpu_tests", "max_batch"):
        assert steps[name]["status"] == "skipped"
        assert steps[name]["reason"].startswith("needs a GPU")
    assert report["skipped_for_no_gpu"] == ["gpu_tests", "max_batch"]
    assert "Skipped here because they need a GPU: `gpu_tests`, `max_batch`." in summary


def test_codec_rows_cover_both_dtypes_sparsities_and_ops(cpu_run: tuple[dict, str]) -> None:
    rows = cpu_run[0]["steps"]["codec_traffic"]["result"]["rows"]
    assert {(r["op"], r["dtype"], r["sparsity"]) for r in rows} == {
        (op, dtype, sparsity) for op in ("compress", "decompress") for dtype in ("fp32", "bf16") for sparsity in (0.5, 0.9)
    }
    assert {r["backend"] for r in rows} == {"cpu"}


def test_training_has_every_policy_and_marks_the_rest_skipped(cpu_run: tuple[dict, str]) -> None:
    from cswap.options import POLICIES

    result = cpu_run[0]["steps"]["training"]["result"]
    for model in ("vgg16", "resnet50"):
        assert {r["policy"] for r in result["records"] if r["model"] == model} >= {"plain", "save_on_cpu", *POLICIES}
    skipped = result["skipped_configs"]
    assert skipped["offload_activations"].startswith("needs a GPU")
    suite = _suite()
    if not suite.runtime_takes_memory_budget():
        assert {f"{p}+budget" for p in POLICIES} <= set(skipped)
        return
    budgeted = [r for r in result["records"] if r["policy"].endswith("+budget")]
    assert {r["policy"] for r in budgeted} == {f"{p}+budget" for p in POLICIES}
    for r in budgeted:
        # Either the peak held the budget, or the policy said it cannot and how much it needs.
        if r.get("infeasible"):
            assert r["minimum_bytes"] > r["memory_budget_bytes"], r
        else:
            assert r["peak_within_budget"] is True, r


def test_a_failing_step_is_recorded_and_a_missing_package_skips() -> None:
    suite = _suite()

    def broken() -> dict:
        raise RuntimeError("kernel exploded")

    def missing() -> dict:
        raise ModuleNotFoundError("No module named 'torchtune'")

    failed = suite.run_step("x", broken, needs_gpu=False)
    assert failed["status"] == "failed" and failed["error"] == "RuntimeError: kernel exploded"
    skipped = suite.run_step("y", missing, needs_gpu=False)
    assert skipped["status"] == "skipped" and "torchtune" in skipped["reason"]


def test_junit_results_are_counted_and_failures_named(tmp_path: Path) -> None:
    xml = tmp_path / "gpu.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest" tests="4" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.codecs.test_cuda" name="test_roundtrip"/>'
        '<testcase classname="tests.codecs.test_cuda" name="test_race"><failure message="boom"/></testcase>'
        '<testcase classname="tests.runtime.test_gpu" name="test_sync"><skipped/></testcase>'
        '<testcase classname="tests.runtime.test_gpu" name="test_stream"/>'
        "</testsuite></testsuites>"
    )
    result = _suite().parse_junit(xml)
    assert result == {"tests": 4, "failures": 1, "errors": 0, "skipped": 1, "passed": 2,
                      "failed_tests": ["tests.codecs.test_cuda::test_race"]}


def test_past_the_deadline_no_step_starts_and_each_says_how_to_run_it(tmp_path: Path) -> None:
    suite = _suite()
    report = suite.run_suite(torch_device("cpu"), "smoke", tmp_path, only=("codec_traffic", "simulator"), deadline_s=0.0)
    steps = report["steps"]
    for name in ("codec_traffic", "simulator"):
        assert steps[name]["status"] == "skipped"
        assert steps[name]["reason"] == f"not reached: the suite's 0 s deadline passed first (run it alone: --only {name})"
    assert steps["tuning"]["reason"] == "not selected (--only)"
    assert report["complete"] is True
    written = json.loads((tmp_path / "suite.json").read_text())
    assert written["steps"] == json.loads(json.dumps(steps)) and written["deadline_s"] == 0.0
    assert "(run it alone: --only simulator)" in (tmp_path / "summary.md").read_text()


def test_the_training_step_starts_no_model_past_the_deadline() -> None:
    suite = _suite()
    passed = suite.Deadline(start=0.0, limit_s=0.0)
    result = suite.step_training(torch_device("cpu"), suite.SCALES["smoke"], passed)
    assert result["records"] == []
    for model in suite.SCALES["smoke"].train_models:
        assert result["skipped_configs"][model] == passed.reason("training")


def test_a_step_cut_short_leaves_the_steps_before_it_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    suite = _suite()

    def killed(scale: object) -> dict:
        raise KeyboardInterrupt  # the device call's time limit, as the process sees it

    monkeypatch.setattr(suite, "step_simulator", killed)
    with pytest.raises(KeyboardInterrupt):
        suite.run_suite(torch_device("cpu"), "smoke", tmp_path, only=("codec_traffic", "simulator"))
    written = json.loads((tmp_path / "suite.json").read_text())
    assert written["complete"] is False and written["steps"]["codec_traffic"]["status"] == "ok"
    assert written["steps"]["simulator"]["reason"] == "not reached: the suite stopped before it"
    assert "**Incomplete**" in (tmp_path / "summary.md").read_text()


def test_lossless_codecs_shrink_their_tensors_and_say_whether_nvcomp_ran(cpu_run: tuple[dict, str]) -> None:
    report, summary = cpu_run
    rows = report["steps"]["lossless_traffic"]["result"]["rows"]
    ratios = {(row["codec"], row["kind"]): row["ratio"] for row in rows}
    assert ratios[("bitpack", "bool")] == pytest.approx(8.0, rel=0.01)
    assert ratios[("exponent", "bf16")] > 1.3 and ratios[("exponent", "fp32-upcast")] > 2.5
    assert all(row["nvcomp"] == "needs a GPU" and row["seconds"] > 0 for row in rows)
    assert "## Lossless codecs (cpu backend)" in summary


def test_dynamic_padding_rows_profile_once_and_hold_the_budget(cpu_run: tuple[dict, str]) -> None:
    report, summary = cpu_run
    (row,) = report["steps"]["transformers"]["result"]["rows"]
    for shape in ("fixed", "dynamic"):
        assert row[shape]["profiled_iterations"] == 1, shape
        assert row[shape]["iterations_over_budget"] == 0, shape
    assert "## Dynamic padding" in summary
