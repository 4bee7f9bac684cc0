"""The least memory budget each policy states on small Hugging Face transformers, as a fraction of
``none``'s peak and in bytes, and whether a fresh run at the least in bytes holds it.

The models of :mod:`benchmarks.transformers_cpu` (GPT-2, Llama and BERT from their config classes
with the library's defaults, two layers, hidden 256, vocabulary 2048), in bf16 and fp32, sequence
``--seq-len``, micro-batch ``--batch``, on this CPU. Per model, dtype and policy: a runtime at
``--fraction`` of ``none``'s peak given as a fraction (its first profile runs before the budget's
bytes are known) and one at the same budget in bytes (known from the start); each that refuses
states its least budget, and a fresh run at the least in bytes trains three iterations, which
must stay within it with gradients bit-identical to plain PyTorch. ``compress-keep``'s profile
keeps what fits and compresses the oldest it kept past it: in bytes against the budget, under a
fraction (whose bytes it does not know yet) against the fraction of the most the saved tensors
have held so far.

Output: one JSON line per model, dtype and policy: ``none``'s measured peak in bytes, the least
fraction stated under a fraction and under bytes (``null``: the budget was met), and for the
least in bytes the peak a fresh run measured, whether it held, and whether its gradients matched.

Example:
    $ python benchmarks/least_budgets.py > benchmarks/results/cpu-$(date +%F)/least-budgets.jsonl
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch
import transformers
from torch import nn

import cswap
from cswap.budget import BudgetError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.transformers_cpu import MODELS, VOCAB

__all__ = ["measure", "main"]

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _grads(model: nn.Module, ids: torch.Tensor, rt: cswap.Runtime | None, iterations: int) -> list[torch.Tensor]:
    """The last of ``iterations`` steps' gradients (the same batch and dropout masks each step)."""
    grads: list[torch.Tensor] = []
    for _ in range(iterations):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        if rt is None:
            model(input_ids=ids, labels=ids).loss.backward()
        else:
            with rt.iteration():
                model(input_ids=ids, labels=ids).loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return grads


def _least(base: nn.Module, ids: torch.Tensor, policy: str, budget: float | int) -> int | None:
    """The least budget ``policy`` states at ``budget`` in bytes, or ``None`` when it meets it."""
    model = copy.deepcopy(base)
    try:
        _grads(model, ids, cswap.Runtime(policy, device="cpu", model=model, memory_budget=budget), 2)
    except BudgetError as error:
        return error.minimum_bytes
    return None


def measure(name: str, dtype: str, policies: list[str], fraction: float, seq_len: int, batch: int) -> list[dict[str, object]]:
    """The rows of model ``name`` in ``dtype``, one per policy."""
    torch.manual_seed(0)
    base = MODELS[name](seq_len).train().to(_DTYPES[dtype])
    ids = torch.randint(0, VOCAB, (batch, seq_len), generator=torch.Generator().manual_seed(1))
    plain = _grads(copy.deepcopy(base), ids, None, 1)
    model = copy.deepcopy(base)
    probe = cswap.Runtime("none", device="cpu", model=model, memory_budget=1.0)
    _grads(model, ids, probe, 1)
    assert probe.resolved_budget is not None
    none_bytes = probe.resolved_budget.nbytes
    rows = []
    for policy in policies:
        as_fraction = _least(base, ids, policy, fraction)
        in_bytes = _least(base, ids, policy, int(fraction * none_bytes))
        row: dict[str, object] = {"model": name, "dtype": dtype, "policy": policy, "fraction": fraction, "seq_len": seq_len,
                                  "batch": batch, "none_peak_bytes": none_bytes,
                                  "least_fraction_as_fraction": None if as_fraction is None else round(as_fraction / none_bytes, 4),
                                  "least_fraction_in_bytes": None if in_bytes is None else round(in_bytes / none_bytes, 4)}
        if in_bytes is not None:
            model = copy.deepcopy(base)
            rt = cswap.Runtime(policy, device="cpu", model=model, memory_budget=in_bytes)
            grads = _grads(model, ids, rt, 3)
            peak = rt.stats().peak_resident_bytes
            row.update(least_bytes=in_bytes, peak_at_least_bytes=peak, held=peak <= in_bytes,
                       gradients_bit_identical=all(torch.equal(a, b) for a, b in zip(plain, grads, strict=True)))
        row.update(cpus=os.cpu_count(), torch=torch.__version__, transformers=transformers.__version__, date=time.strftime("%Y-%m-%d"))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--dtypes", default=",".join(_DTYPES))
    parser.add_argument("--policies", default="compress-keep")
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    for name in args.models.split(","):
        for dtype in args.dtypes.split(","):
            for row in measure(name, dtype, args.policies.split(","), args.fraction, args.seq_len, args.batch):
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
