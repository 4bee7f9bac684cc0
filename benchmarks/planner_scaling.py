"""How the memory-budget planner's time grows with the saved-tensor count: the exact MILP against
the fast path, from ResNet-50's 212 saved tensors to an 80-layer transformer.

Every problem is planned twice per policy and budget: ``exact`` (``plan_budget(..., exact=True)``
and ``minimum_bytes(..., exact=True)``: the one MILP over every tensor) and ``fast`` (the default:
repeated layers tied in blocks, the least peak certified by its floor). Every line printed is one
JSON object with a ``kind``:

* ``header``: machine, date, settings.
* ``problem``: per model, its saved tensors, events and options, and the seconds to trace it on the
  meta device and to build the problem.
* ``solve``: per model, policy, budget (a fraction of ``none``'s peak) and method: ``minimum_s``
  (``minimum_bytes``), ``plan_s`` (``plan_budget``, median of ``--repeats``), ``total_s`` (both),
  the plan's status, its predicted added seconds and peak; or ``infeasible`` with ``minimum_bytes``.
* ``gap``: per model, policy and budget where both planned: ``gap = fast / exact - 1`` of the
  predicted added seconds, whether the exact MILP proved its plan optimal (``exact_proved``: its
  dual bound within 1e-6 of the plan), and ``speedup = exact total_s / fast total_s``.

Usage:
    python benchmarks/planner_scaling.py > benchmarks/results/cpu-2026-11-24/planner-scaling.jsonl
    python benchmarks/planner_scaling.py --layers 1,4 --policies swap --fractions 0.5
    python benchmarks/planner_scaling.py --plot benchmarks/results/cpu-2026-11-24/planner-scaling.jsonl docs/planner-scaling.png
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import scipy

from cswap.budget import BudgetError
from cswap.planner import PlanningProblem, minimum_bytes, plan_budget, tensor_actions
from cswap.simulate import SimConfig, Simulator, meta_trace
from cswap.simulate.budgeted import planning_problem
from cswap.simulate.lmtrace import transformer_trace

METHODS = ("exact", "fast")


def emit(kind: str, **fields: Any) -> None:
    print(json.dumps({"kind": kind, **fields}), flush=True)


def problems(args: argparse.Namespace) -> list[tuple[str, int | None, PlanningProblem]]:
    """(model, layers, problem) per point of the curve, each announced by a ``problem`` line."""
    points: list[tuple[str, int | None]] = [("resnet50", None)] if args.resnet else []
    points += [(args.model, int(n)) for n in args.layers.split(",") if n]
    built = []
    for model, layers in points:
        started = time.perf_counter()
        if layers is None:
            trace = meta_trace(model, 64, 224, args.hardware)
        else:
            trace = transformer_trace(model, batch_size=args.batch_size, seq_len=args.seq_len, hardware=args.hardware,
                                      dtype=args.dtype, attention=args.attention, num_layers=layers)
        trace_s = time.perf_counter() - started
        started = time.perf_counter()
        problem, _ = planning_problem(Simulator(trace, args.hardware, SimConfig(min_bytes=0)))
        emit(
            "problem",
            model=model,
            layers=layers,
            tensors=len(problem.tensors),
            events=problem.event_count,
            options=sum(len(t.options) for t in problem.tensors),
            trace_s=trace_s,
            build_problem_s=time.perf_counter() - started,
        )
        built.append((model, layers, problem))
    return built


def solve(model: str, layers: int | None, problem: PlanningProblem, policy: str, fractions: list[float], method: str,
          args: argparse.Namespace) -> dict[float, dict[str, Any]]:
    """One ``solve`` line per budget; returns them by fraction."""
    exact = method == "exact"
    none_peak = minimum_bytes(problem, "none")
    started = time.perf_counter()
    least = minimum_bytes(problem, policy, args.time_limit, exact=exact)
    minimum_s = time.perf_counter() - started
    common = dict(model=model, layers=layers, tensors=len(problem.tensors), events=problem.event_count, policy=policy, method=method)
    options = sum(1 for t in problem.tensors for o in t.options if o.action in tensor_actions(policy, {x.action for x in t.options}))
    rows = {}
    for fraction in fractions:
        budget = int(fraction * none_peak)
        if budget < least:
            row = dict(common, fraction=fraction, budget_bytes=budget, infeasible=True, minimum_bytes=least, minimum_s=minimum_s)
            emit("solve", **row)
            rows[fraction] = row
            continue
        seconds, plan = [], None
        for _ in range(args.repeats):
            started = time.perf_counter()
            try:
                plan = plan_budget(problem, policy, budget, args.time_limit, exact=exact)
            except BudgetError as error:  # the solver's tolerance at the edge of the least budget
                plan = error
            seconds.append(time.perf_counter() - started)
        if isinstance(plan, BudgetError):
            row = dict(common, fraction=fraction, budget_bytes=budget, infeasible=True, minimum_bytes=plan.minimum_bytes,
                       minimum_s=minimum_s)
        else:
            assert plan is not None and plan.peak_bytes <= budget
            row = dict(
                common,
                fraction=fraction,
                budget_bytes=budget,
                infeasible=False,
                options=options,
                minimum_bytes=least,
                minimum_s=minimum_s,
                plan_s=statistics.median(seconds),
                total_s=minimum_s + statistics.median(seconds),
                status=plan.status,
                predicted_s=plan.predicted_s,
                bound_s=plan.bound_s,
                peak_bytes=plan.peak_bytes,
            )
        emit("solve", **row)
        rows[fraction] = row
    return rows


def plot(source: Path, target: Path) -> None:
    """Plan plus least-budget seconds against saved tensors, exact and fast, one line per policy and budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    header = next(r for r in rows if r["kind"] == "header")
    solved = [r for r in rows if r["kind"] == "solve" and not r["infeasible"]]
    figure, axis = plt.subplots(figsize=(7.5, 4.5))
    styles = {"exact": ("tab:red", "o", "exact MILP (before)"), "fast": ("tab:blue", "s", "fast path (after)")}
    layered = [r for r in solved if r["layers"] is not None]
    for method, (colour, marker, label) in styles.items():
        lines = sorted({(r["policy"], r["fraction"]) for r in layered if r["method"] == method})
        for i, (policy, fraction) in enumerate(lines):
            points = sorted((r["tensors"], r["total_s"]) for r in layered if r["method"] == method and (r["policy"], r["fraction"]) == (policy, fraction))
            axis.plot(*zip(*points), color=colour, marker=marker, alpha=0.45, linewidth=1, label=label if i == 0 else None)
        others = [(r["tensors"], r["total_s"]) for r in solved if r["layers"] is None and r["method"] == method]
        if others:
            axis.scatter(*zip(*others), color=colour, marker="x", alpha=0.7, label=f"{label.split(' (')[0]}, {solved[0]['model'] if solved[0]['layers'] is None else 'CNN'}")
    axis.axhline(2.0, color="grey", linestyle=":", linewidth=1)
    axis.axhline(10.0, color="grey", linestyle="--", linewidth=1)
    axis.text(215, 2.2, "2 s (32 layers' target)", fontsize=8, color="grey")
    axis.text(215, 11, "10 s (80 layers' target)", fontsize=8, color="grey")
    axis.set_xscale("log")
    axis.set_yscale("log")
    marks = sorted({(r["tensors"], r["layers"]) for r in layered})
    top = axis.secondary_xaxis("top")
    top.set_xticks([t for t, _ in marks], [f"{n}" for _, n in marks], fontsize=8)
    top.minorticks_off()
    top.set_xlabel("layers", fontsize=8)
    axis.set_xlabel(f"saved tensors in the problem ({header['model']}'s shape at {header['seq_len']} tokens)")
    axis.set_ylabel("minimum_bytes + plan_budget, s")
    axis.set_title(f"Planner time, cswap/swap/recompute at 0.5/0.25/0.1 of none's peak\n"
                   f"{header['cores']} cores, {header['date'][:10]}, simulated on {header['hardware_profile']}", fontsize=10)
    axis.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    figure.savefig(target, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3-8b", help="transformer preset whose layer count is varied")
    parser.add_argument("--layers", default="1,2,4,8,16,32,80")
    parser.add_argument("--no-resnet", dest="resnet", action="store_false", help="leave out ResNet-50 (batch 64, 224x224)")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attention", default="sdpa")
    parser.add_argument("--hardware", default="h100-pcie5")
    parser.add_argument("--policies", default="cswap,swap,recompute")
    parser.add_argument("--fractions", default="0.5,0.25,0.1", help="budgets as fractions of none's peak")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=60.0, help="the solver's limit per solve, seconds")
    parser.add_argument("--plot", nargs=2, metavar=("JSONL", "PNG"), help="draw the curve from a run's lines, and do nothing else")
    args = parser.parse_args()
    if args.plot:
        plot(Path(args.plot[0]), Path(args.plot[1]))
        return
    fractions = [float(f) for f in args.fractions.split(",")]
    emit(
        "header",
        machine=platform.processor() or platform.machine(),
        cores=os.cpu_count(),
        python=platform.python_version(),
        scipy=scipy.__version__,
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        load_average=os.getloadavg()[0],
        hardware_profile=args.hardware,
        model=args.model,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        dtype=args.dtype,
        attention=args.attention,
        time_limit_s=args.time_limit,
        min_bytes=0,
    )
    for model, layers, problem in problems(args):
        for policy in args.policies.split(","):
            by_method = {method: solve(model, layers, problem, policy, fractions, method, args) for method in args.methods.split(",")}
            if set(by_method) != set(METHODS):
                continue
            for fraction in fractions:
                exact, fast = by_method["exact"][fraction], by_method["fast"][fraction]
                if exact["infeasible"] or fast["infeasible"]:
                    continue
                emit(
                    "gap",
                    model=model,
                    layers=layers,
                    tensors=len(problem.tensors),
                    policy=policy,
                    fraction=fraction,
                    exact_status=exact["status"],
                    fast_status=fast["status"],
                    exact_s=exact["predicted_s"],
                    exact_proved=exact["bound_s"] is not None and exact["predicted_s"] - exact["bound_s"] <= 1e-6 * exact["predicted_s"] + 1e-12,
                    fast_s=fast["predicted_s"],
                    gap=fast["predicted_s"] / exact["predicted_s"] - 1 if exact["predicted_s"] > 0 else 0.0,
                    speedup=exact["total_s"] / fast["total_s"],
                )
    emit("footer", load_average=os.getloadavg()[0])


if __name__ == "__main__":
    main()
