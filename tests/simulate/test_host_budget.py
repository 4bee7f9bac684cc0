"""``cswap simulate`` under a host memory budget beside the device budget: every feasible plan holds
both, an infeasible policy names the budget that binds, and its least host budget plans."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cswap.cli import app
from cswap.simulate import SimConfig, Simulator, meta_trace
from cswap.simulate.budgeted import planning_problem, run_budgets

POLICIES = ("swap", "compress-swap", "cswap", "capuchin")


@pytest.fixture(scope="module")
def simulator() -> Simulator:
    return Simulator(meta_trace("resnet18", 4, 32, width_mult=0.25), "v100-pcie3", SimConfig(min_bytes=0))


def test_both_budgets_held_or_the_binding_one_named(simulator: Simulator) -> None:
    problem, _ = planning_problem(simulator)
    free = run_budgets(simulator, POLICIES, 0.3, problem=problem)
    for policy in POLICIES:
        outcome = free[policy]
        assert not outcome.infeasible, f"{policy} cannot meet 0.3 of none's peak on this trace"
        host = max(outcome.plan.host_peak_bytes // 2, 1)
        held = run_budgets(simulator, (policy,), outcome.budget_bytes, problem=problem, host_budget=host)[policy]
        if held.infeasible:
            assert held.binding in ("device", "host") and held.host_budget_bytes == host
            row = held.to_dict()
            assert row["binding"] == held.binding and row["host_minimum_bytes"] == held.host_minimum_bytes
            if held.binding == "host":
                assert held.host_minimum_bytes > host
                host = held.host_minimum_bytes
                held = run_budgets(simulator, (policy,), outcome.budget_bytes, problem=problem, host_budget=host)[policy]
                assert not held.infeasible, f"{policy}: its least host budget {host} did not plan"
            else:
                continue
        assert held.plan.host_peak_bytes <= host and max(held.plan.host_timeline_bytes) <= host
        assert held.result.peak_bytes <= outcome.budget_bytes and held.to_dict()["planned_host_peak_bytes"] <= host


def test_cli_host_budget_json_skips_the_strategies() -> None:
    result = CliRunner().invoke(app, ["simulate", "--model", "vgg11", "--batch-size", "4", "--resolution", "32", "--memory-budget", "0.3",
                                      "--host-memory-budget", "2MiB", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["host_budget_bytes"] == 2 << 20
    assert set(report["skipped"]) >= {"offload-all", "ilp-kro"} and set(report["skipped"].values()) == {"it plans no host memory budget"}
    for name, row in report["policies"].items():
        assert row["host_budget_bytes"] == 2 << 20
        if row["infeasible"]:
            assert row["binding"] in ("device", "host"), name
        else:
            assert row["planned_host_peak_bytes"] <= 2 << 20 and row["peak_bytes"] <= report["budget_bytes"], name


def test_cli_host_budget_needs_a_device_budget() -> None:
    result = CliRunner().invoke(app, ["simulate", "--model", "vgg11", "--host-memory-budget", "2MiB"])
    assert result.exit_code != 0 and "add --memory-budget" in " ".join(result.output.split())
