"""Host memory for offloaded tensors: the planned pool against first fit and against the lower bound.

Per trace and plan, the blocks are the host copies the plan's swaps write, each alive from its
pack to its free point (:func:`cswap.planner.hostpool.host_pool_of`'s rule). Three figures:

* ``pool_bytes``: the pool :func:`~cswap.planner.hostpool.place_blocks` lays out before the iteration;
* ``first_fit_bytes``: the high-water mark of a first-fit allocator serving the same requests in
  event order (what the host arena does at run time, before its slack);
* ``lower_bound_bytes``: the most bytes alive at one event.

Traces: meta traces at the CSWAP paper's setting (VGG-16 and ResNet-50, batch 64, 224x224, V100 on
PCIe 3) and a transformer (GPT-2 preset, bf16, 1024 tokens, A100 profile), each with every
offloadable tensor swapped (policy ``swap``) and with the ``swap`` plan the budget planner makes at
0.5 and 0.25 of ``none``'s peak (only some tensors move, so lifetimes interleave); and the runtime's
own traces on this CPU (VGG-16 and ResNet-50 at width 0.25, batch 16, 32x32; GPT-2 as shipped,
batch 2 x 32 tokens, with one and two micro-batches, without a budget and at 0.5), where the arena the
runtime really reserved is reported beside them (``arena_bytes``: the pool plus first-fit room,
with the arena's slack).

Output: one JSON line per trace and plan.

Example:
    $ python benchmarks/host_pool.py > benchmarks/results/cpu-$(date +%F)/host-pool.jsonl
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import torch

import cswap
from cswap.planner.hostpool import HostBlock, first_fit_high_water, place_blocks
from cswap.planner.lifetime import lifetimes_from_trace
from cswap.profile.trace import Trace

__all__ = ["main", "measure"]


def measure(label: str, trace: Trace, swapped: set[int] | None) -> dict[str, object]:
    """The three figures for ``trace`` with the records of keys ``swapped`` offloaded (``None``: all offloadable)."""
    duplicates = {int(k) for k in (trace.meta.get("duplicates") or {})}
    timeline = lifetimes_from_trace(trace)
    blocks = [
        HostBlock(record.key, record.nbytes, lifetime.pack, lifetime.free)
        for record, lifetime in zip(trace.tensors, timeline.lifetimes, strict=True)
        if lifetime is not None and record.key not in duplicates and (swapped is None or record.key in swapped)
    ]
    started = time.perf_counter()
    layout = place_blocks(blocks)
    place_s = time.perf_counter() - started
    first_fit = first_fit_high_water(blocks)
    bound = layout.lower_bound_bytes
    return {
        "trace": label,
        "blocks": len(blocks),
        "pool_bytes": layout.pool_bytes,
        "first_fit_bytes": first_fit,
        "lower_bound_bytes": bound,
        "pool_over_bound": round(layout.pool_bytes / bound - 1.0, 5) if bound else 0.0,
        "first_fit_over_bound": round(first_fit / bound - 1.0, 5) if bound else 0.0,
        "place_s": round(place_s, 4),
        "date": time.strftime("%Y-%m-%d"),
    }


def _budget_swaps(trace: Trace, hardware: str, fraction: float) -> set[int]:
    from cswap.simulate import SimConfig, Simulator
    from cswap.simulate.budgeted import run_budgets

    simulator = Simulator(trace, hardware, SimConfig())
    outcome = run_budgets(simulator, ("swap",), budget=fraction)["swap"]
    if outcome.infeasible:
        return set()
    return {trace.tensors[i].key for i, action in enumerate(outcome.result.actions) if action.value == "swap"}


def _runtime_rows(name: str) -> list[dict[str, object]]:
    from cswap import models

    torch.manual_seed(0)
    model = models.build(name, num_classes=10, width_mult=0.25).train()
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    rt = cswap.Runtime("swap", device="cpu", model=model)
    for _ in range(3):
        with rt.iteration():
            torch.nn.functional.cross_entropy(model(x), y).backward()
    plan = rt.plan()
    swapped = {key for key, d in plan.decisions.items() if d.action.value == "swap"}
    row = measure(f"{name} runtime (CPU, width 0.25, batch 16, 32x32), swap", rt.trace(), swapped)
    stats = rt.stats()
    row.update(arena_bytes=stats.arena_bytes, host_pool_bytes=stats.host_pool_bytes, host_pool_fallbacks=stats.host_pool_fallbacks)
    return [row]


def _gpt2_rows() -> list[dict[str, object]]:
    """GPT-2 as shipped (``GPT2Config()``: 124M parameters, dropout 0.1), batch 2 x 32 tokens, with
    one micro-batch per iteration and with two (gradient accumulation), without a budget and at half
    of ``none``'s peak; skipped without ``transformers``."""
    try:
        import transformers
    except ImportError:
        return []
    rows = []
    for micro_batches in (1, 2):
        for budget in (None, 0.5):
            torch.manual_seed(0)
            model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).train()
            ids = torch.randint(0, model.config.vocab_size, (2 * micro_batches, 32))
            rt = cswap.Runtime("swap", device="cpu", model=model, memory_budget=budget)
            for _ in range(3):
                with rt.iteration():
                    for chunk in ids.chunk(micro_batches):
                        model(input_ids=chunk, labels=chunk).loss.backward()
            plan = rt.plan()
            swapped = {key for key, d in plan.decisions.items() if d.action.value == "swap"}
            label = (f"gpt2 runtime (CPU, GPT2Config(), batch 2 x 32 tokens, {micro_batches} micro-batch"
                     f"{'es' if micro_batches > 1 else ''}), swap{'' if budget is None else f' at {budget}'}")
            row = measure(label, rt.trace(), swapped)
            stats = rt.stats()
            row.update(arena_bytes=stats.arena_bytes, host_pool_bytes=stats.host_pool_bytes,
                       host_pool_fallbacks=stats.host_pool_fallbacks)
            rows.append(row)
    return rows


def main() -> None:
    from cswap.simulate import meta_trace
    from cswap.simulate.lmtrace import transformer_trace

    warnings.simplefilter("ignore")
    traces = {
        "vgg16 meta (batch 64, 224, v100-pcie3)": (meta_trace("vgg16", 64, 224, "v100-pcie3"), "v100-pcie3"),
        "resnet50 meta (batch 64, 224, v100-pcie3)": (meta_trace("resnet50", 64, 224, "v100-pcie3"), "v100-pcie3"),
        "gpt2 meta (bf16, 1024 tokens, a100-pcie4)": (transformer_trace("gpt2", 1, 1024, "a100-pcie4"), "a100-pcie4"),
    }
    for label, (trace, hardware) in traces.items():
        print(json.dumps(measure(f"{label}, swap", trace, None)), flush=True)
        for fraction in (0.5, 0.25):
            swapped = _budget_swaps(trace, hardware, fraction)
            if swapped:
                print(json.dumps(measure(f"{label}, swap at {fraction}", trace, swapped)), flush=True)
    for name in ("vgg16", "resnet50"):
        for row in _runtime_rows(name):
            print(json.dumps(row), flush=True)
    for row in _gpt2_rows():
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
