"""One rank of the FSDP2 test: the same sharded model trained without and with cswap, per policy.

Run by ``torch.multiprocessing.spawn`` from ``test_fsdp2.py``; each rank writes what it saw to
``<out>/rank<r>.pt`` (:mod:`tests.integrations.ranks`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.distributed.fsdp import fully_shard

import cswap
from tests.integrations.ranks import rank_session
from tests.runtime.helpers import FAST_CODEC, SLOW_LINK

STEPS = 3
#: Activations one step of :func:`build` saves on a (8, 16) batch, float32: the first layer's input
#: (8x16), the ReLU's output (8x32, stored once though the ReLU and the second layer both save it)
#: and the second layer's output (8x4, saved by the square). The one weight saved (the second
#: layer's, for the gradient of its input) is FSDP's unsharded parameter and is not among them.
ACTIVATIONS_PER_STEP = 3
ACTIVATION_BYTES_PER_STEP = (8 * 16 + 8 * 32 + 8 * 4) * 4
PARAMETERS_SAVED_PER_STEP = 1


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def train(rank: int, policy: str | None) -> tuple[list[torch.Tensor], Any]:
    """``STEPS`` SGD steps on rank-specific batches; the local shards and the runtime's stats."""
    model = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rt = cswap.Runtime(policy, device="cpu", min_bytes=0, model=model, time_model=FAST_CODEC, **SLOW_LINK) if policy else None
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x = torch.randn(8, 16, generator=generator)
        if rt is None:
            model(x).square().mean().backward()
        else:
            with rt.iteration():
                model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    shards = [p.to_local().detach().clone() for p in model.parameters()]
    return shards, rt.stats() if rt is not None else None


def run(rank: int, port: int, out: str, policies: list[str]) -> None:
    with rank_session(rank, port, out):
        plain, _ = train(rank, None)
        report: dict[str, Any] = {"sharded": all(isinstance(p, torch.distributed.tensor.DTensor) for p in build().parameters())}
        for policy in policies:
            shards, stats = train(rank, policy)
            report[policy] = {
                "equal": [torch.equal(a, b) for a, b in zip(plain, shards, strict=True)],
                "offloaded_bytes": stats.offloaded_bytes,
                "compressed_input_bytes": stats.compressed_input_bytes,
                "never_moved_tensors": stats.never_moved_tensors,
                "kept_bytes": stats.kept_bytes,
                "actions": dict(stats.actions),
            }
        torch.save(report, Path(out) / f"rank{rank}.pt")
