"""The memory-budget planner's figures: how long it takes, how far the greedy is from the MILP, and
what each policy costs under a budget in the simulator.

Every line printed is one JSON object with a ``kind``:

* ``header``: machine, date, settings.
* ``solve``: ResNet-50 at 224x224, batch 64, V100 PCIe 3, every saved tensor (``min_bytes`` 0), per
  policy and budget (fraction of ``none``'s peak): tensors, MILP variables (options) and memory
  rows (events), the solver's seconds (median of ``--repeats``), its status, the greedy's
  predicted seconds and its gap to the MILP's objective (``greedy_gap = greedy / milp - 1``).
* ``table``: the paper's setting (batch 64, 224x224, V100 PCIe 3, the runtime's ``min_bytes``):
  per model, budget and policy, the simulated iteration seconds and peak bytes, or ``infeasible``
  with ``minimum_bytes``.
* ``margin``: per model and budget, cswap's margin over the best single-mechanism policy that meets
  the budget (``margin = best / cswap - 1``, and which it is) and over ``capuchin``
  (``capuchin_margin = capuchin / cswap - 1``; ``None`` where either cannot meet the budget).

Usage:
    python benchmarks/planner.py
    python benchmarks/planner.py --repeats 1 --fractions 0.5 --solve-policies cswap
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from typing import Any

import scipy

from cswap.planner import minimum_bytes, plan_budget, single_mechanism_policies, tensor_actions
from cswap.simulate import SimConfig, Simulator, meta_trace
from cswap.simulate.budgeted import budget_policies, planning_problem, run_budgets


def emit(kind: str, **fields: Any) -> None:
    print(json.dumps({"kind": kind, **fields}), flush=True)


def solve_rows(fractions: list[float], repeats: int, time_limit_s: float, policies: list[str]) -> None:
    trace = meta_trace("resnet50", 64, 224, "v100-pcie3")
    simulator = Simulator(trace, "v100-pcie3", SimConfig(min_bytes=0))
    started = time.perf_counter()
    problem, _ = planning_problem(simulator)
    build_s = time.perf_counter() - started
    none_peak = minimum_bytes(problem, "none")
    for policy in policies:
        started = time.perf_counter()
        least = minimum_bytes(problem, policy, time_limit_s)
        least_s = time.perf_counter() - started
        for fraction in fractions:
            budget = int(fraction * none_peak)
            if budget < least:
                emit(
                    "solve",
                    model="resnet50",
                    policy=policy,
                    fraction=fraction,
                    budget_bytes=budget,
                    infeasible=True,
                    minimum_bytes=least,
                )
                continue
            seconds, plan = [], None
            for _ in range(repeats):
                started = time.perf_counter()
                plan = plan_budget(problem, policy, budget, time_limit_s)
                seconds.append(time.perf_counter() - started)
            assert plan is not None
            options = sum(
                1 for t in problem.tensors for o in t.options if o.action in tensor_actions(policy, {x.action for x in t.options})
            )
            emit(
                "solve",
                model="resnet50",
                policy=policy,
                fraction=fraction,
                budget_bytes=budget,
                tensors=len(problem.tensors),
                options=options,
                events=problem.event_count,
                build_problem_s=build_s,
                minimum_bytes=least,
                minimum_s=least_s,
                plan_s=statistics.median(seconds),
                status=plan.status,
                milp_s=plan.predicted_s,
                greedy_s=plan.greedy_s,
                greedy_gap=None if plan.greedy_s is None or plan.predicted_s == 0 else plan.greedy_s / plan.predicted_s - 1,
                peak_bytes=plan.peak_bytes,
            )


def table_rows(models: list[str], fractions: list[float], time_limit_s: float) -> None:
    singles = single_mechanism_policies()
    for model in models:
        simulator = Simulator(meta_trace(model, 64, 224, "v100-pcie3"), "v100-pcie3")
        problem, _ = planning_problem(simulator)
        for fraction in fractions:
            outcomes = run_budgets(simulator, budget_policies(), fraction, time_limit_s, problem=problem)
            budget = next(iter(outcomes.values())).budget_bytes
            for policy, outcome in outcomes.items():
                if outcome.infeasible:
                    emit(
                        "table",
                        model=model,
                        fraction=fraction,
                        budget_bytes=budget,
                        policy=policy,
                        infeasible=True,
                        minimum_bytes=outcome.minimum_bytes,
                    )
                else:
                    emit(
                        "table",
                        model=model,
                        fraction=fraction,
                        budget_bytes=budget,
                        policy=policy,
                        infeasible=False,
                        iteration_s=outcome.result.iteration_s,
                        peak_bytes=outcome.result.peak_bytes,
                        minimum_bytes=outcome.minimum_bytes,
                        actions=outcome.result.action_counts(),
                        plan=outcome.result.plan,
                    )
            feasible = {p: o.result.iteration_s for p, o in outcomes.items() if not o.infeasible}
            best = min((p for p in singles if p in feasible), key=lambda p: feasible[p], default=None)
            emit(
                "margin",
                model=model,
                fraction=fraction,
                budget_bytes=budget,
                cswap_s=feasible.get("cswap"),
                best_single=best,
                best_single_s=None if best is None else feasible[best],
                margin=None if best is None or "cswap" not in feasible else feasible[best] / feasible["cswap"] - 1,
                capuchin_s=feasible.get("capuchin"),
                capuchin_margin=(
                    feasible["capuchin"] / feasible["cswap"] - 1 if "capuchin" in feasible and "cswap" in feasible else None
                ),
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fractions", default="0.5,0.25,0.1", help="budgets as fractions of none's peak")
    parser.add_argument("--solve-policies", default="swap,compress-swap,recompute,capuchin,cswap", help="policies timed in 'solve' rows")
    parser.add_argument("--models", default="vgg16,resnet50")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    fractions = [float(f) for f in args.fractions.split(",")]
    emit(
        "header",
        machine=platform.processor() or platform.machine(),
        cores=os.cpu_count(),
        python=platform.python_version(),
        scipy=scipy.__version__,
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        load_average=os.getloadavg()[0],
        hardware_profile="v100-pcie3",
        batch_size=64,
        resolution=224,
    )
    solve_rows(fractions, args.repeats, args.time_limit, args.solve_policies.split(","))
    table_rows(args.models.split(","), fractions, args.time_limit)


if __name__ == "__main__":
    main()
