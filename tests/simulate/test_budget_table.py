"""``cswap simulate``'s table under a budget: what "x none" is over, the codec and recomputation
columns, what "formula ms" is, the plan labels' legend, and the title when nothing fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cswap.cli import app
from cswap.commands.simulate import _notes, _plan_kind, _PLAN_LABELS, run_simulate
from cswap.simulate.policies import Action, TensorCost
from cswap.simulate.queues import QueueParams, run_queues
from cswap.simulate.timeline import Timeline

pytest.importorskip("transformers")

GPT2 = ["--model", "gpt2", "--seq-len", "256", "--layers", "2"]
POLICIES = "none,swap,compress-swap,recompute,recompute-knapsack,cswap"


def _rows(output: str) -> dict[str, list[str]]:
    """The table's cells per policy, by column name."""
    lines = [line for line in output.splitlines() if line.startswith(("┃", "│"))]
    header = [cell.strip() for cell in lines[0].strip("┃").split("┃")]
    rows = {}
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "250"})


@pytest.fixture(scope="module")
def budgeted(runner) -> tuple[dict, str]:
    """The JSON report and the table of a budget that none does not fit (0.7 of its peak)."""
    args = ["simulate", *GPT2, "--memory-budget", "0.7", "--policies", POLICIES]
    table = runner.invoke(app, args)
    report = runner.invoke(app, [*args, "--json"])
    assert table.exit_code == 0 and report.exit_code == 0, table.output + report.output
    return json.loads(report.output), table.output


def test_x_none_is_over_none_without_a_budget_when_none_does_not_fit(runner, budgeted) -> None:
    report, output = budgeted
    assert report["policies"]["none"]["infeasible"]
    free = json.loads(runner.invoke(app, ["simulate", *GPT2, "--policies", "none", "--json"]).output)
    assert report["none_iteration_s"] == pytest.approx(free["policies"]["none"]["iteration_s"], rel=1e-12)
    rows = _rows(output)
    for name in ("swap", "recompute", "cswap"):
        expected = report["policies"][name]["iteration_s"] / report["none_iteration_s"]
        assert rows[name]["x none"] == f"{expected:.2f}"
    assert f'"x none" is over none without a budget, {report["none_iteration_s"] * 1e3:.1f} ms' in output
    assert f"none needs {report['none_peak_bytes'] / 1e9:.2f} GB, over the budget" in output


def test_codec_and_recomputation_have_a_column_each(budgeted) -> None:
    report, output = budgeted
    rows = _rows(output)
    recomputed = report["policies"]["recompute"]
    assert recomputed["recompute_s"] > 0 and recomputed["actions"]["recompute"] > 0
    for name in ("swap", "compress-swap", "recompute", "recompute-knapsack", "cswap"):
        row = report["policies"][name]
        assert rows[name]["codec ms"] == f"{(row['codec_s'] - row['recompute_s']) * 1e3:.1f}"
        assert rows[name]["recomp ms"] == f"{row['recompute_s'] * 1e3:.1f}"
    assert rows["recompute"]["codec ms"] == "0.0" and rows["recompute"]["recomp ms"] != "0.0"
    assert report["policies"]["swap"]["recompute_s"] == 0.0


def test_the_queue_model_counts_recomputation_apart_from_the_codec() -> None:
    timeline = Timeline(forward_s=1.0, backward_s=1.0, produced_s=(0.0, 0.5), consumed_s=(0.5, 0.25))
    rebuilt = TensorCost(1000, 1000.0, 0.0, 4, 0.0, 0.0, 0.0, 0.0, recompute_s=0.3)
    packed = TensorCost(1000, 500.0, 0.5, 4, compress_s=0.25, decompress_s=0.125, host_compress_s=0.0, host_decompress_s=0.0)
    out = run_queues(timeline, [rebuilt, packed], [Action.RECOMPUTE, Action.ZVC_KEEP], QueueParams(1.0, 1.0))
    assert out.recompute_s == pytest.approx(0.3)
    assert out.codec_s == pytest.approx(0.3 + 0.25 + 0.125)
    assert out.iteration_s == pytest.approx(2.0 + 0.675)


def test_formula_ms_is_what_the_help_says() -> None:
    # the per-tensor formula holds compute while a copy overruns its own window: with one swap-out in
    # flight at most the queue model does the same, without a cap it lets the copy run on
    capped = run_simulate(model="vgg16", policies="swap", max_inflight_offloads=1)["policies"]["swap"]
    free = run_simulate(model="vgg16", policies="swap")["policies"]["swap"]
    assert capped["formula_iteration_s"] == pytest.approx(capped["iteration_s"], rel=1e-9)
    assert free["formula_iteration_s"] == pytest.approx(capped["formula_iteration_s"], rel=1e-12)
    assert free["formula_iteration_s"] > 1.02 * free["iteration_s"]
    result = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["simulate", "--help"])
    flat = " ".join(result.output.replace("│", " ").split())
    assert "time lost to queuing" not in flat
    assert "the gap to \"iter ms\" goes both ways" in flat
    assert "without a budget and with --max-inflight 1, swap's two are equal" in flat


@pytest.mark.parametrize(
    "label",
    ["static", "cost-model", "swap", "ranked 3/9", "budget optimal", "budget time-limit", "budget greedy", "budget tied",
     "budget tied-time-limit", "budget tied-greedy", "budget capuchin", "budget swap plan", "ac-full plan", "fixed", "knapsack"],
)
def test_every_plan_label_has_a_legend_line(label) -> None:
    report = {"policies": {"p": {"infeasible": False, "plan": label, "iteration_s": 1.0}}, "budget_bytes": 1}
    key, name = _plan_kind(label)
    assert key in _PLAN_LABELS
    assert f"  {name}: {_PLAN_LABELS[key]}" in _notes(report)


def test_the_legend_names_the_labels_shown(budgeted) -> None:
    report, output = budgeted
    labels = {row["plan"] for row in report["policies"].values() if not row["infeasible"]}
    assert labels >= {"knapsack"} and any(label.startswith("budget ") for label in labels)
    for label in labels:
        assert f"  {_plan_kind(label)[1]}: " in output


def test_the_readme_explains_the_plan_labels() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for label in ("`budget tied`", "`budget <policy> plan`", "`fixed`", "`knapsack`", "`budget optimal`"):
        assert label in readme


def test_nothing_fits_shows_the_compute_and_says_so(runner) -> None:
    result = runner.invoke(app, ["simulate", *GPT2, "--memory-budget", "0.1", "--policies", "none,swap,recompute"])
    assert result.exit_code == 0, result.output
    report = json.loads(runner.invoke(app, ["simulate", *GPT2, "--memory-budget", "0.1", "--policies", "none,swap,recompute", "--json"]).output)
    assert all(row["infeasible"] for row in report["policies"].values())
    assert report["compute_s"] == pytest.approx(report["none_iteration_s"]) and report["compute_s"] > 0
    flat = " ".join(result.output.split())
    assert f"{report['compute_s'] * 1e3:.1f} ms compute" in flat and " 0.0 ms compute" not in flat
    least = min(row["minimum_bytes"] for row in report["policies"].values())
    assert f"Nothing fits in {report['budget_bytes'] / 1e9:.2f} GB: the least any needs is {least / 1e9:.2f} GB" in flat


def test_nothing_fits_names_the_tensors_min_bytes_keeps_and_the_flag_that_moves_them(runner) -> None:
    """GPT-2 at 64 tokens saves tensors below the default min_bytes: the simulator keeps them on the
    device whatever the budget (the runtime may move them under one), and says so where nothing
    fits; with --min-bytes 0 they are planned and swap's least falls."""
    args = ["simulate", "--model", "gpt2", "--seq-len", "64", "--batch-size", "1", "--memory-budget", "0.05", "--policies", "swap"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(runner.invoke(app, [*args, "--json"]).output)
    assert report["policies"]["swap"]["infeasible"] and report["pinned_bytes"] > 0
    flat = " ".join(result.output.split())
    assert f"{report['pinned_bytes'] / 1e9:.3f} GB of saved tensors are below --min-bytes (262,144 B)" in flat
    assert "--min-bytes 0 lets the planner move them" in flat
    moved = json.loads(runner.invoke(app, [*args, "--min-bytes", "0", "--json"]).output)
    assert moved["pinned_bytes"] == 0 and "--min-bytes" not in runner.invoke(app, [*args, "--min-bytes", "0"]).output
    assert moved["policies"]["swap"]["minimum_bytes"] < report["policies"]["swap"]["minimum_bytes"]
