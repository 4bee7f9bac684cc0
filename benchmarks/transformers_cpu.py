"""Small Hugging Face transformers on this CPU under every policy at a budget, against the simulator.

GPT-2, Llama and BERT from their config classes with the library's defaults (dropout on), two
layers, hidden 256, sequence 256, micro-batch 2, vocabulary 2048. Per model: one runtime per policy
at ``--fraction`` of ``none``'s activation peak, warmed up past its profile, then ``--rounds``
interleaved timed iterations; the simulator is given the runtime's own profile of the model (a
warmed-up ``none`` runtime profiles it once a round, between the timed iterations; the per-record
medians of those profiles, as :func:`cswap.simulate.validate.validate` takes them) and
this machine's CPU profile (:func:`cswap.simulate.validate.cpu_profile`, measured now, with the
runtime's overheads) and plans and simulates every policy under the same budget.

Output: one JSON line per model and policy: measured median iteration seconds and peak resident
bytes, the simulated ones, and ``simulated / measured - 1`` for each; a policy that cannot meet the
budget gives its least budget (as a fraction of ``none``'s peak) in the runtime and in the simulator.

Example:
    $ python benchmarks/transformers_cpu.py --rounds 9 > benchmarks/results/cpu-$(date +%F)/transformers-cpu.jsonl
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import torch
import transformers
from torch import nn

import cswap
from cswap.budget import BudgetError
from cswap.planner import POLICY_ACTIONS
from cswap.planner.actions import RUNTIME_POLICIES
from cswap.simulate import SimConfig, Simulator
from cswap.simulate.budgeted import run_budgets
from cswap.simulate.validate import cpu_profile, measure_runtime_overheads, median_trace, thread_limit

__all__ = ["MODELS", "main", "measure"]

VOCAB = 2048
#: The policies both the runtime and the simulator plan under a budget (ac-full's layers are fixed).
POLICIES: tuple[str, ...] = tuple(p for p in RUNTIME_POLICIES if p in POLICY_ACTIONS)


def _gpt2(seq_len: int) -> nn.Module:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_positions=seq_len, n_embd=256, n_layer=2, n_head=4))


def _llama(seq_len: int) -> nn.Module:
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=seq_len)
    return transformers.LlamaForCausalLM(config)


def _bert(seq_len: int) -> nn.Module:
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=1024, max_position_embeddings=seq_len)
    return transformers.BertForMaskedLM(config)


MODELS: dict[str, Callable[[int], nn.Module]] = {"gpt2": _gpt2, "llama": _llama, "bert": _bert}


def _step(model: nn.Module, ids: torch.Tensor) -> float:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    started = time.perf_counter()
    model(input_ids=ids, labels=ids).loss.backward()
    return time.perf_counter() - started


def measure(name: str, fraction: float, rounds: int, seq_len: int, batch: int, profile) -> list[dict[str, object]]:
    """Measured and simulated iteration seconds and peaks of every runtime policy on ``name``."""
    torch.manual_seed(0)
    base = MODELS[name](seq_len).train()
    ids = torch.randint(0, VOCAB, (batch, seq_len), generator=torch.Generator().manual_seed(1))
    runs: dict[str, tuple[nn.Module, cswap.Runtime]] = {}
    refused: dict[str, BudgetError] = {}
    for policy in POLICIES:
        model = copy.deepcopy(base)
        rt = cswap.Runtime(policy, device="cpu", model=model, memory_budget=fraction)
        try:
            for _ in range(3):
                with rt.iteration():
                    _step(model, ids)
        except BudgetError as error:
            refused[policy] = error
            continue
        runs[policy] = (model, rt)
    profiler_model = copy.deepcopy(base)
    profiler = cswap.Runtime("none", device="cpu", model=profiler_model)
    for _ in range(3):  # its profile, then warm-up as the others had
        with profiler.iteration():
            _step(profiler_model, ids)
    times: dict[str, list[float]] = {policy: [] for policy in runs}
    traces = []
    for _ in range(rounds):
        for policy, (model, rt) in runs.items():
            started = time.perf_counter()
            with rt.iteration():
                _step(model, ids)
            times[policy].append(time.perf_counter() - started)
        # one iteration's profile alone swings the simulated time of a 100 ms iteration by 2x
        profiler.new_epoch()
        with profiler.iteration():
            _step(profiler_model, ids)
        traces.append(profiler.trace())
    simulator = Simulator(median_trace(traces), profile, SimConfig(min_bytes=profiler.options.min_bytes))
    outcomes = run_budgets(simulator, POLICIES, budget=fraction)
    rows = []
    for policy in POLICIES:
        outcome = outcomes[policy]
        none_peak = outcome.budget_bytes / fraction
        row: dict[str, object] = {"model": name, "policy": policy, "fraction": fraction, "seq_len": seq_len, "batch": batch}
        if policy in runs:
            stats = runs[policy][1].stats()
            row.update(measured_s=round(statistics.median(times[policy]), 5), measured_peak_bytes=stats.iteration_peak_resident_bytes)
        else:
            row.update(measured_least_fraction=round(refused[policy].minimum_fraction or 0.0, 3))
        if outcome.infeasible:
            row.update(simulated_least_fraction=round(outcome.minimum_bytes / none_peak, 3))
        else:
            row.update(simulated_s=round(outcome.result.iteration_s, 5), simulated_peak_bytes=int(outcome.result.peak_bytes))
        if "measured_s" in row and "simulated_s" in row:
            row.update(time_error=round(row["simulated_s"] / row["measured_s"] - 1.0, 3),
                       peak_error=round(row["simulated_peak_bytes"] / row["measured_peak_bytes"] - 1.0, 4))
        row.update(cpus=os.cpu_count(), torch=torch.__version__, transformers=transformers.__version__, date=time.strftime("%Y-%m-%d"))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--fraction", type=float, default=0.4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    with thread_limit(1):
        overheads = measure_runtime_overheads()
        profile = cpu_profile(measure=True, overheads=overheads)
        for name in args.models.split(","):
            for row in measure(name, args.fraction, args.rounds, args.seq_len, args.batch, profile):
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
