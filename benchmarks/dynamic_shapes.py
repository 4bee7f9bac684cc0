"""What dynamic padding costs cswap: the same steps at a fixed length and padded to each batch's longest.

Per model (GPT-2 and Llama from their ``transformers`` config classes, defaults but the sizes), in
one process, each run in a fresh model from one seed: plain PyTorch and cswap (``--policy``,
``--memory-budget``, default options otherwise) over ``--steps`` steps of ``--batch`` sequences,

* **fixed**: every batch padded to ``--max-len`` tokens;
* **dynamic**: each batch padded to its longest, the lengths drawn between ``--min-len`` and
  ``--max-len`` (what ``DataCollatorWithPadding`` gives).

Each runtime row reports its seconds, its ratio to plain PyTorch on the same batches (and the
same without the seconds the last run spent planning, ``stats().planning_s``), how many
iterations profiled and how many plans it made without a profile, the budget's bytes at the
end, the iterations whose resident peak passed the cap then in force, and ``steady_over_plain``: the
median over the steps after a run's last profile or plan of that step's seconds over plain's same
step (what a long run pays once its shapes are planned); per model ``dynamic_over_fixed`` is the ratio of the two ratios (1.0: dynamic padding costs
cswap nothing more than a fixed length). Timings are medians over ``--repeats`` runs, taken in
alternation; the first run of each warms up and is dropped.

``--replan`` times what a new size costs when it is planned rather than profiled, on a 32-layer
Llama-3-8B traced on the meta device at ``--replan-from`` tokens: the runtime's steps at a larger
size (:func:`cswap.profile.shapes.grown_shapes` from the shapes the packs show,
:func:`cswap.profile.shapes.scaled_trace`, then the budget planner with the limits of a plan
made inside training, :data:`cswap.planner.solve.PROVING_TIME_LIMIT_S` and
:data:`~cswap.planner.solve.PROVING_REL_GAP`), against planning the trace of the larger size
itself as a profile's plan is made (the defaults); at ``--replan-near`` tokens, the plan carried
from ``--replan-from`` without a solve against the plan solved; and how many of the scaled shapes
are the true ones when only every ``k``-th tensor's shape is seen (the rest inferred, as inside
recompute regions).

Output: one JSON object per model, on its own line (``kind``: ``padding`` or ``replan``).

Example:
    $ python benchmarks/dynamic_shapes.py --steps 24 > benchmarks/results/cpu-$(date +%F)/dynamic-shapes.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cswap

__all__ = ["main", "measure"]


def _build(name: str, max_len: int) -> torch.nn.Module:
    import transformers

    if name == "gpt2-shipped":  # GPT-2 small as its authors ship the config (124M parameters)
        return transformers.GPT2LMHeadModel(transformers.GPT2Config())
    if name == "gpt2":
        config = transformers.GPT2Config(vocab_size=1000, n_positions=max_len, n_embd=128, n_layer=4, n_head=4)
        return transformers.GPT2LMHeadModel(config)
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_len)
    return transformers.LlamaForCausalLM(config)


def _batches(lengths: list[list[int]], seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for row_lengths in lengths:
        longest = max(row_lengths)
        ids = torch.randint(1, 1000, (len(row_lengths), longest), generator=g)
        mask = torch.zeros_like(ids)
        for row, n in enumerate(row_lengths):
            mask[row, :n] = 1
        out.append((ids.masked_fill(mask == 0, 0), mask))
    return out


@dataclass(frozen=True)
class Run:
    """One run of the steps: its seconds, per step too, and what the runtime did."""

    seconds: float
    step_s: tuple[float, ...]
    runtime: cswap.Runtime | None
    iterations_over_budget: int
    #: Index of the last step that profiled or planned (-1: none did).
    last_planning_step: int


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run(name: str, max_len: int, batches: list[tuple[torch.Tensor, torch.Tensor]], policy: str | None,
         budget: float, device: torch.device) -> Run:
    """The steps of one fresh model on ``batches``, plain (``policy`` None) or under the runtime."""
    torch.manual_seed(0)
    model = _build(name, max_len).to(device)
    # bf16 autocast on a GPU, as the Trainer's bf16=True runs; float32 on the CPU.
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    model.train()
    rt = cswap.Runtime(policy, model=model, memory_budget=budget, device=str(device)) if policy is not None else None
    batches = [(ids.to(device), mask.to(device)) for ids, mask in batches]
    _sync(device)
    over, last_planning, step_s, planned_before = 0, -1, [], (0, 0.0)
    started = time.perf_counter()
    for i, (ids, mask) in enumerate(batches):
        step_started = time.perf_counter()
        torch.manual_seed(i)
        labels = ids.masked_fill(mask == 0, -100)
        if rt is None:
            with autocast:
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
        else:
            with rt.iteration():
                with autocast:
                    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
                loss.backward()
            stats = rt.stats()
            over += bool(stats.budget_bytes) and stats.iteration_peak_resident_bytes > stats.budget_bytes
            planned = (stats.profiled_iterations + stats.unprofiled_plans, stats.planning_s)
            if planned != planned_before:
                last_planning, planned_before = i, planned
        model.zero_grad(set_to_none=True)
        _sync(device)
        step_s.append(time.perf_counter() - step_started)
    return Run(time.perf_counter() - started, tuple(step_s), rt, over, last_planning)


def measure(name: str, steps: int, batch: int, min_len: int, max_len: int, policy: str, budget: float, repeats: int,
            seed: int = 0, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The row of model ``name``: plain and ``policy`` at a fixed length and under dynamic padding
    (lengths drawn from ``seed``), on ``device``."""
    device = torch.device(device)
    rng = random.Random(seed)
    dynamic_lengths = [[rng.randint(min_len, max_len) for _ in range(batch)] for _ in range(steps)]
    data = {"fixed": _batches([[max_len] * batch for _ in range(steps)], 1), "dynamic": _batches(dynamic_lengths, 1)}
    seconds: dict[tuple[str, str], list[float]] = {}
    last: dict[str, cswap.Runtime] = {}
    over_budget: dict[str, int] = {}
    # Per shape, each timed run's step-by-step ratio to plain's steps after the run's last plan.
    steady: dict[str, list[float]] = {}
    for repeat in range(repeats + 1):
        for shape, batches in data.items():
            plain_run = _run(name, max_len, batches, None, budget, device)
            ours_run = _run(name, max_len, batches, policy, budget, device)
            assert ours_run.runtime is not None
            last[shape] = ours_run.runtime
            over_budget[shape] = over_budget.get(shape, 0) + ours_run.iterations_over_budget
            if repeat:
                seconds.setdefault((shape, "plain"), []).append(plain_run.seconds)
                seconds.setdefault((shape, policy), []).append(ours_run.seconds)
                after = range(ours_run.last_planning_step + 1, len(batches))
                steady.setdefault(shape, []).extend(ours_run.step_s[i] / plain_run.step_s[i] for i in after)
    row: dict[str, Any] = {"model": name, "device": device.type, "policy": policy, "memory_budget": budget, "steps": steps, "batch": batch,
                           "lengths": [min_len, max_len], "seed": seed, "first_length": max(dynamic_lengths[0])}
    for shape in data:
        plain = statistics.median(seconds[shape, "plain"])
        ours = statistics.median(seconds[shape, policy])
        stats = last[shape].stats()
        row[shape] = {"plain_s": plain, "cswap_s": ours, "over_plain": ours / plain, "planning_s": stats.planning_s,
                      "over_plain_without_planning": (ours - stats.planning_s) / plain,
                      "profiled_iterations": stats.profiled_iterations, "unprofiled_plans": stats.unprofiled_plans,
                      "structures": stats.structures, "budget_bytes": stats.budget_bytes,
                      "peak_resident_bytes": stats.peak_resident_bytes,
                      "iterations_over_budget": over_budget[shape],
                      # the median step after the last profile or plan, over plain's same step
                      "steady_over_plain": statistics.median(steady[shape]) if steady.get(shape) else None,
                      "steady_steps": len(steady.get(shape, []))}
    row["dynamic_over_fixed"] = row["dynamic"]["over_plain"] / row["fixed"]["over_plain"]
    row["dynamic_over_fixed_without_planning"] = (row["dynamic"]["over_plain_without_planning"]
                                                  / row["fixed"]["over_plain_without_planning"])
    return row


def replan(layers_model: str, from_len: int, to_len: int, near_len: int, policy: str, fraction: float,
           repeats: int) -> dict[str, Any]:
    """Seconds to plan ``layers_model`` at ``to_len`` tokens from its trace at ``from_len`` as the
    runtime does without a profile, against planning its own trace at ``to_len`` as a profile's plan
    is made; seconds to carry the plan at ``from_len`` to ``near_len`` (a little longer: the runtime
    carries a plan there, :func:`cswap.planner.solve.carry_plan`) against solving it; and the share
    of shapes inferred right from a subset."""
    from cswap.budget import MemoryBudget
    from cswap.planner.budgeted import NO_CODEC, budget_plan
    from cswap.planner.solve import PROVING_REL_GAP, PROVING_TIME_LIMIT_S
    from cswap.profile.shapes import grown_shapes, scaled_trace
    from cswap.simulate.lmtrace import transformer_trace

    def traced(seq_len: int) -> Any:
        return transformer_trace(layers_model, batch_size=1, seq_len=seq_len, hardware="h100-pcie5", dtype="bfloat16", attention="eager")

    small, large, near = traced(from_len), traced(to_len), traced(near_len)
    seen = {r.key: r.shape for r in large.tensors}

    def planned(trace: Any, proving: bool = False, carried: Any = None) -> Any:
        limits = dict(time_limit_s=PROVING_TIME_LIMIT_S, rel_gap=PROVING_REL_GAP) if proving else {}
        return budget_plan(trace, policy, MemoryBudget(fraction=fraction), NO_CODEC, "cuda", 0, epoch=0, carried=carried, **limits)

    def grown(to: Any) -> Any:
        return scaled_trace(small, grown_shapes(small, {r.key: r.shape for r in to.tensors}))

    def scaled_plan() -> Any:  # as the runtime plans a larger size: the solver's limits for a plan needed now
        return planned(grown(large), proving=True)

    start_plan = planned(small)[0]
    timings: dict[str, list[float]] = {"scaled": [], "own": [], "scale_only": [], "carried": [], "near_solved": []}
    for _ in range(repeats):
        started = time.perf_counter()
        scaled_trace(small, grown_shapes(small, seen))
        timings["scale_only"].append(time.perf_counter() - started)
        started = time.perf_counter()
        via_scaled = scaled_plan()
        timings["scaled"].append(time.perf_counter() - started)
        started = time.perf_counter()
        own = planned(large)
        timings["own"].append(time.perf_counter() - started)
        started = time.perf_counter()
        carried = planned(grown(near), proving=True, carried=start_plan.solution)
        timings["carried"].append(time.perf_counter() - started)
        started = time.perf_counter()
        near_solved = planned(grown(near), proving=True)
        timings["near_solved"].append(time.perf_counter() - started)
    truth = {r.key: r.shape for r in large.tensors}
    inferred = {}
    for every in (1, 4, 16):
        partial = {key: shape for key, shape in seen.items() if key % every == 0}
        guess = {**{r.key: r.shape for r in small.tensors}, **grown_shapes(small, partial)}
        inferred[f"every_{every}"] = sum(guess[k] == truth[k] for k in truth) / len(truth)
    return {"kind": "replan", "model": layers_model, "tensors": len(small.tensors), "from_len": from_len, "to_len": to_len,
            "policy": policy, "memory_budget": fraction, "scale_s": statistics.median(timings["scale_only"]),
            "plan_from_profile_s": statistics.median(timings["scaled"]), "plan_own_trace_s": statistics.median(timings["own"]),
            "budget_bytes_scaled": via_scaled[1], "budget_bytes_own": own[1], "shapes_right": inferred,
            "predicted_s_scaled": via_scaled[0].planner.get("predicted_s"), "predicted_s_own": own[0].planner.get("predicted_s"),
            "status_scaled": via_scaled[0].planner.get("status"), "status_own": own[0].planner.get("status"),
            "time_limit_s_scaled": PROVING_TIME_LIMIT_S, "rel_gap_scaled": PROVING_REL_GAP,
            "near_len": near_len, "carry_s": statistics.median(timings["carried"]),
            "near_solve_s": statistics.median(timings["near_solved"]), "status_carried": carried[0].planner.get("status"),
            "predicted_s_carried": carried[0].planner.get("predicted_s"), "predicted_s_near_solved": near_solved[0].planner.get("predicted_s")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2,llama",
                        help="comma-separated (gpt2, llama, gpt2-shipped: GPT2Config's defaults); empty for none")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--min-len", type=int, default=20)
    parser.add_argument("--max-len", type=int, default=120)
    parser.add_argument("--policy", default="cswap")
    parser.add_argument("--memory-budget", type=float, default=0.6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", default="0", help="comma-separated seeds of the dynamic lengths, a row each")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--replan", action="store_true", help="also time planning a 32-layer Llama at a new size")
    parser.add_argument("--replan-from", type=int, default=512)
    parser.add_argument("--replan-to", type=int, default=1024)
    parser.add_argument("--replan-near", type=int, default=544, help="a length the runtime carries the plan at --replan-from to")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    machine = {"machine": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
               "date": time.strftime("%Y-%m-%d")}
    models = [name for name in args.models.split(",") if name]
    if models:
        # The training runs on one thread, so that the ratios are not the scheduler's. Once torch is
        # set to one thread HiGHS runs many times slower in this process, even set back
        # (BENCHMARKS.md, "Dynamic shapes"): --replan is measured in a process of its own.
        torch.set_num_threads(1)
    for name in models:
        for seed in (int(s) for s in args.seeds.split(",")):
            row = measure(name, args.steps, args.batch, args.min_len, args.max_len, args.policy, args.memory_budget, args.repeats,
                          seed, args.device)
            print(json.dumps({"kind": "padding", **row, **machine}), flush=True)
    if args.replan:
        if models:
            parser.error("--replan runs alone (--models ''): the training runs set torch to one thread, which slows HiGHS")
        for policy in ("swap", "cswap"):
            print(json.dumps({**replan("llama-3-8b", args.replan_from, args.replan_to, args.replan_near, policy, 0.3, args.repeats),
                              **machine}), flush=True)


if __name__ == "__main__":
    main()
