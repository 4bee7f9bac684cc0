"""One rank of the DDP test: Hugging Face GPT-2 (its config's defaults, dropout on, small sizes) in
``DistributedDataParallel``, trained with gradient accumulation (``no_sync`` on every micro-batch but
the last, as the Trainer and Lightning do) over left-padded batches whose length changes every
micro-batch, without cswap and under each case.

Run by :func:`tests.integrations.ranks.spawn_ranks` from ``test_ddp.py``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
import transformers
from torch.nn.parallel import DistributedDataParallel

import cswap
from tests.integrations.ranks import rank_session

#: Per step, each micro-batch's padded length: the later micro-batch of the first step is longer
#: than the profiled one, and the last step outgrows every earlier one.
LENGTHS = ((24, 40), (40, 17), (33, 33), (12, 48))
BATCH = 2
#: (policy, memory budget as a fraction of none's peak or None)
CASES = (("recompute", None), ("swap", 0.5), ("recompute", 0.5), ("capuchin", 0.5), ("ac-full", 0.5), ("cswap", 0.5))


def build() -> DistributedDataParallel:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64)
    return DistributedDataParallel(transformers.GPT2LMHeadModel(config))


def _batch(rank: int, step: int, micro: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * rank + 10 * step + micro)
    ids = torch.randint(3, 250, (BATCH, length), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, : length // 4] = 0
    return ids, mask


def train(rank: int, case: tuple[str, float | None] | None) -> tuple[list[dict[str, Any]], Any]:
    """Every step's gradients and, under cswap, its peak and the budget in force before and after it."""
    model = build()
    rt = None
    if case is not None:
        policy, budget = case
        rt = cswap.Runtime(policy, model=model, device="cpu", memory_budget=budget, disable_kv_cache=True)
    steps = []
    for step, lengths in enumerate(LENGTHS):
        in_force = rt.plan().budget_bytes if rt is not None else None
        torch.manual_seed(100 * rank + step)  # dropout differs by rank and step, not by run
        with rt.iteration() if rt is not None else contextlib.nullcontext():
            for micro, length in enumerate(lengths):
                ids, mask = _batch(rank, step, micro, length)
                sync = contextlib.nullcontext() if micro == len(lengths) - 1 else model.no_sync()
                with sync:
                    (model(input_ids=ids, attention_mask=mask, labels=ids).loss / len(lengths)).backward()
        seen: dict[str, Any] = {"grads": [p.grad.clone() for p in model.parameters()]}
        model.zero_grad(set_to_none=True)
        if rt is not None:
            seen.update(peak=rt.stats().iteration_peak_resident_bytes, in_force=in_force, after=rt.plan().budget_bytes)
        steps.append(seen)
    return steps, rt.stats() if rt is not None else None


def run(rank: int, port: int, out: str) -> None:
    with rank_session(rank, port, out):
        plain, _ = train(rank, None)
        report: dict[str, Any] = {}
        for case in CASES:
            steps, stats = train(rank, case)
            report[case] = {
                "equal": [all(torch.equal(a, b) for a, b in zip(p["grads"], s["grads"], strict=True)) for p, s in zip(plain, steps)],
                "peaks": [(s["peak"], s["in_force"], s["after"]) for s in steps],
                "recomputed": stats.actions["recompute"],
                "offloaded_bytes": stats.offloaded_bytes,
                "profiled": stats.profiled_iterations,
            }
        torch.save(report, Path(out) / f"rank{rank}.pt")
