"""What users would pick instead of cswap, side by side under one memory budget, in the simulator.

Per model (a meta trace of one training iteration, bfloat16, micro-batch 1) and hardware profile:
every policy planned under each budget (a fraction of ``none``'s activation peak) and every strategy
of :mod:`cswap.simulate.strategies` run within it (:func:`cswap.simulate.versus.run_side_by_side`),
replayed by the queue model.

Every line printed is one JSON object with a ``kind``:

* ``header``: machine, date, versions, settings.
* ``config``: per model and hardware: the trace (layers, sequence, attention, saved bytes), policy
  ``none``'s peak and iteration, seconds spent, and what ZVC could do with the saved bytes
  (``zvc_saving``: the fraction of them compressing every tensor would save; ``sparse_fraction``:
  the fraction of them in tensors with any zeros).
* ``fixed``: per fixed strategy, without a budget: its peak (the least budget it meets), as a
  fraction of ``none``'s too, and its iteration time.
* ``budget``: per model, hardware, budget and policy or strategy: iteration seconds, peak bytes and
  the plan, or ``infeasible`` with ``minimum_bytes``.
* ``check``: per model, hardware and budget: cswap within the budget and no slower than every
  feasible strategy and policy (``ok``), the plan it took, its margin over the fastest feasible
  strategy (``margin = best / cswap - 1``), and the actions of its plan (``zvc`` ones are compression).
* ``conservative``: per model, hardware and budget, cswap without per-tensor recompute: its exact
  program over keep, swap, zvc-swap and zvc-keep, or a fixed strategy's plan where one fits and is
  faster (recompute then only re-runs whole layers or attention cores, priced at their forward
  seconds). Per-tensor recompute prices a tensor as its producing op alone, from inputs assumed at
  hand: a lower bound, which cswap, ``recompute-knapsack`` and ``ilp-kro`` share.
* ``curve``: cswap and the strategies at more budgets, for the figure (``--plot``).

Usage:
    python benchmarks/anchors.py > benchmarks/results/cpu-2026-11-27/anchors.jsonl
    python benchmarks/anchors.py --models gpt2-xl:eager:1024 --hardware h100-pcie5 --fractions 0.5
    python benchmarks/anchors.py --plot docs/anchors.png --curve-fractions 0.05,0.1,0.2,0.3,0.5,0.75,1.0
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from collections.abc import Sequence
from typing import Any

import scipy
import torch

from cswap.budget import BudgetError
from cswap.planner import PlanningProblem, minimum_bytes, plan_budget
from cswap.planner.actions import KEEP, SWAP, ZVC_KEEP, ZVC_SWAP
from cswap.simulate import SimConfig, Simulator
from cswap.simulate.policies import Action
from cswap.simulate.budgeted import budget_policies, none_peak_bytes, planning_problem, replay_plan
from cswap.simulate.compressibility import DEFAULT_COMPRESSIBILITY, load_compressibility
from cswap.simulate.lmtrace import transformer_trace
from cswap.simulate.metatrace import SparsityModel
from cswap.simulate.strategies import STRATEGIES, Strategies
from cswap.simulate.versus import run_side_by_side

__all__ = ["main"]

DEFAULT_MODELS = "llama-3-8b:sdpa:4096,gpt2-xl:eager:1024,gpt2-xl:sdpa:1024"
# Strategies that recompute only whole module calls (a layer, an attention core), priced at their
# forward seconds; and the policies and strategies that recompute nothing.
REGION_STRATEGIES = ("ac-full", "ac-selective", "offload-all+ac")
NO_RECOMPUTE = ("none", "swap", "compress-swap", "compress-keep", "offload-all", "megatron-offload")


def emit(kind: str, **fields: Any) -> None:
    print(json.dumps({"kind": kind, **fields}), flush=True)


def _row(outcome: Any) -> dict[str, Any]:
    if outcome.infeasible:
        return {"infeasible": True, "minimum_bytes": outcome.minimum_bytes, "note": outcome.note}
    result = outcome.result
    return {
        "infeasible": False,
        "minimum_bytes": outcome.minimum_bytes,
        "iteration_s": result.iteration_s,
        "peak_bytes": result.peak_bytes,
        "exposed_transfer_s": result.queue.exposed_transfer_s,
        "codec_s": result.queue.codec_s,
        "plan": result.plan,
        "actions": {k: v for k, v in result.action_counts().items() if v},
        "note": outcome.note,
    }


def run_config(
    model: str,
    attention: str,
    seq_len: int,
    hardware: str,
    fractions: Sequence[float],
    curve: Sequence[float],
    layers: int | None,
    time_limit_s: float,
    compressibility: str = DEFAULT_COMPRESSIBILITY,
) -> dict[str, Any]:
    """Every policy and strategy of one model on one profile; returns what the figure needs."""
    started = time.perf_counter()
    coded = None if compressibility == "none" else load_compressibility(compressibility)
    trace = transformer_trace(model, batch_size=1, seq_len=seq_len, hardware=hardware, attention=attention, num_layers=layers,
                              sparsity=SparsityModel(compressibility=coded))
    simulator = Simulator(trace, hardware, SimConfig())
    strategies = Strategies(simulator, time_limit_s)
    problem, _ = planning_problem(simulator)
    none_peak = none_peak_bytes(problem)
    none = simulator.run("none")
    saved = [(r, c) for r, c in zip(trace.tensors, simulator.costs) if r.offloadable]
    saved_bytes = sum(r.nbytes for r, _ in saved)
    where = {"model": model, "attention": attention, "seq_len": seq_len, "hardware": hardware}
    emit(
        "config",
        **where,
        layers=trace.meta.get("num_layers"),
        dtype=trace.meta.get("dtype"),
        records=len(trace.tensors),
        saved_bytes=saved_bytes,
        none_peak_bytes=none_peak,
        none_iteration_s=none.iteration_s,
        forward_s=simulator.timeline.forward_s,
        zvc_saving=sum(max(r.nbytes - c.compressed_nbytes, 0.0) for r, c in saved if c.compressible) / saved_bytes,
        sparse_fraction=sum(r.nbytes for r, _ in saved if r.sparsity > 0) / saved_bytes,
        trace_s=time.perf_counter() - started,
    )
    for name in strategies.available():
        if STRATEGIES[name].budgeted:
            continue
        result = strategies.result(name)
        emit(
            "fixed",
            **where,
            strategy=name,
            peak_bytes=result.peak_bytes,
            peak_fraction=result.peak_bytes / none_peak,
            iteration_s=result.iteration_s,
            x_none=result.iteration_s / none.iteration_s,
            note=strategies.plan(name).note,
        )
    names = (*budget_policies(), *strategies.available())
    no_recompute, _ = planning_problem(simulator, actions=(KEEP, SWAP, ZVC_SWAP, ZVC_KEEP))
    no_recompute_least = minimum_bytes(no_recompute, "cswap", time_limit_s)
    for fraction in fractions:
        started = time.perf_counter()
        outcomes = run_side_by_side(simulator, names, fraction, time_limit_s, problem=problem, strategies=strategies)
        budget = outcomes["cswap"].budget_bytes
        for name, outcome in outcomes.items():
            emit(
                "budget",
                **where,
                fraction=fraction,
                budget_bytes=budget,
                name=name,
                strategy=name in STRATEGIES,
                x_none=None if outcome.infeasible else outcome.result.iteration_s / none.iteration_s,
                **_row(outcome),
            )
        cswap = outcomes["cswap"]
        feasible = {n: o for n, o in outcomes.items() if not o.infeasible}
        best = (
            min((o.result.iteration_s, n) for n, o in feasible.items() if n in STRATEGIES)
            if any(n in STRATEGIES for n in feasible)
            else None
        )
        ok = cswap.infeasible == (not feasible) and (
            cswap.infeasible
            or (
                cswap.result.peak_bytes <= budget
                and all(cswap.result.iteration_s <= o.result.iteration_s for o in feasible.values())
            )
        )
        emit(
            "check",
            **where,
            fraction=fraction,
            budget_bytes=budget,
            ok=ok,
            cswap_plan=None if cswap.infeasible else cswap.result.plan,
            cswap_s=None if cswap.infeasible else cswap.result.iteration_s,
            best_strategy=None if best is None else best[1],
            best_strategy_s=None if best is None else best[0],
            margin=None if best is None or cswap.infeasible else best[0] / cswap.result.iteration_s - 1,
            cswap_actions=None if cswap.infeasible else {k: v for k, v in cswap.result.action_counts().items() if v},
            seconds=time.perf_counter() - started,
        )
        emit(
            "conservative",
            **where,
            fraction=fraction,
            budget_bytes=budget,
            **conservative(simulator, no_recompute, no_recompute_least, outcomes, budget, time_limit_s),
        )
    points: dict[str, list[tuple[float, float]]] = {}
    for fraction in curve:
        outcomes = run_side_by_side(
            simulator, ("cswap", *strategies.available()), fraction, time_limit_s, problem=problem, strategies=strategies
        )
        for name, outcome in outcomes.items():
            if not outcome.infeasible:
                points.setdefault(name, []).append((fraction, outcome.result.iteration_s / none.iteration_s))
                emit("curve", **where, fraction=fraction, name=name, x_none=outcome.result.iteration_s / none.iteration_s)
    fixed = {
        n: (strategies.result(n).peak_bytes / none_peak, strategies.result(n).iteration_s / none.iteration_s)
        for n in strategies.available()
        if not STRATEGIES[n].budgeted
    }
    return {"where": where, "points": points, "fixed": fixed}


def conservative(
    simulator: Simulator,
    problem: PlanningProblem,
    least: int,
    outcomes: dict[str, Any],
    budget_bytes: int,
    time_limit_s: float,
) -> dict[str, Any]:
    """cswap without per-tensor recompute within ``budget_bytes`` (module docstring): the fastest of
    its program over ``problem`` (which offers no recompute; ``least`` is its least budget) and the
    feasible ``outcomes`` that recompute no tensor on its own: its iteration seconds and where its
    plan comes from, or ``infeasible`` with the least budget."""
    best: tuple[float, str, dict[str, int]] | None = None
    if budget_bytes >= least:
        try:
            plan = plan_budget(problem, "cswap", budget_bytes, time_limit_s)
            result = replay_plan(simulator, problem, plan, "cswap", "no tensor recompute")
            best = (result.iteration_s, "cswap's program without recompute", result.action_counts())
        except BudgetError:
            pass
    regions = {f"{name} plan" for name in REGION_STRATEGIES}
    for name, outcome in outcomes.items():
        if name in REGION_STRATEGIES or name in NO_RECOMPUTE:
            least = min(least, outcome.minimum_bytes)
        result = outcome.result
        if result is None:
            continue
        alone = Action.RECOMPUTE in result.actions and name not in REGION_STRATEGIES and result.plan not in regions
        if not alone and (best is None or result.iteration_s < best[0]):
            best = (result.iteration_s, f"{name}'s plan" if name != "cswap" else result.plan, result.action_counts())
    if best is None:
        return {"infeasible": True, "minimum_bytes": least}
    return {
        "infeasible": False,
        "minimum_bytes": least,
        "iteration_s": best[0],
        "plan": best[1],
        "actions": {k: v for k, v in best[2].items() if v},
    }


def plot(panels: list[dict[str, Any]], path: str) -> None:
    """Iteration time (over none's) against the budget (a fraction of none's peak), a panel per
    model and hardware: cswap and the budgeted strategies as lines, a fixed strategy as a marker
    at its own peak with a dashed line to the right (it meets every budget above)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys((p["where"]["model"], p["where"]["attention"]) for p in panels))
    hardware = list(dict.fromkeys(p["where"]["hardware"] for p in panels))
    fig, axes = plt.subplots(len(models), len(hardware), figsize=(5.2 * len(hardware), 3.6 * len(models)), squeeze=False)
    colors = dict(zip(("cswap", *STRATEGIES), ("black", *plt.rcParams["axes.prop_cycle"].by_key()["color"])))
    for panel in panels:
        where = panel["where"]
        ax = axes[models.index((where["model"], where["attention"]))][hardware.index(where["hardware"])]
        for name, points in panel["points"].items():
            if name in panel["fixed"]:
                continue
            xs, ys = zip(*sorted(points))
            ax.plot(
                xs,
                ys,
                marker="o",
                markersize=4,
                color=colors[name],
                linewidth=2.5 if name == "cswap" else 1.2,
                label=name,
                zorder=3 if name == "cswap" else 2,
            )
        for name, (peak, x_none) in panel["fixed"].items():
            if peak > 1.0:
                continue
            ax.plot([peak], [x_none], marker="D", markersize=6, color=colors[name], label=name, linestyle="none")
            ax.plot([peak, 1.0], [x_none, x_none], linestyle="--", linewidth=0.9, color=colors[name])
        ax.axhline(1.0, color="grey", linewidth=0.6)
        ax.set_xlim(0, 1.02)
        ax.set_title(f"{where['model']} ({where['attention']}, seq {where['seq_len']}) on {where['hardware']}", fontsize=9)
        ax.set_xlabel("budget (fraction of none's activation peak)", fontsize=8)
        ax.set_ylabel("iteration time / none's", fontsize=8)
        ax.tick_params(labelsize=7)
    handles = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=min(len(handles), 8), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help="model:attention:seq_len, comma separated")
    parser.add_argument("--hardware", default="h100-pcie5,gh200-c2c")
    parser.add_argument("--fractions", default="0.5,0.25,0.1")
    parser.add_argument("--curve-fractions", default="", help="more budgets for the figure (cswap and the strategies)")
    parser.add_argument("--layers", type=int, default=None, help="transformer layers, replacing the presets'")
    parser.add_argument("--time-limit", type=float, default=30.0, help="solver seconds per solve")
    parser.add_argument("--plot", default=None, help="write the time-against-budget figure here")
    parser.add_argument("--compressibility", default=DEFAULT_COMPRESSIBILITY,
                        help="what the codecs besides ZVC give each kind of tensor (configs/compressibility/), or 'none'")
    args = parser.parse_args(argv)
    fractions = [float(f) for f in args.fractions.split(",") if f]
    curve = sorted({*fractions, *(float(f) for f in args.curve_fractions.split(",") if f)}) if args.plot else []
    emit(
        "header",
        date=datetime.date.today().isoformat(),
        machine=platform.processor() or platform.machine(),
        cpus=os.cpu_count(),
        python=platform.python_version(),
        torch=torch.__version__,
        scipy=scipy.__version__,
        models=args.models,
        hardware=args.hardware,
        fractions=fractions,
        curve_fractions=curve,
        layers=args.layers,
        time_limit_s=args.time_limit,
        compressibility=args.compressibility,
        batch_size=1,
        dtype="bfloat16",
    )
    panels = []
    for spec in args.models.split(","):
        model, attention, seq_len = spec.split(":")
        for hardware in args.hardware.split(","):
            panels.append(run_config(model, attention, int(seq_len), hardware, fractions, curve, args.layers, args.time_limit,
                                     args.compressibility))
    if args.plot:
        plot(panels, args.plot)


if __name__ == "__main__":
    main()
