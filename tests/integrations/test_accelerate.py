"""The Accelerate recipe: ``with rt.iteration():`` around the forward and ``accelerator.backward``,
inside ``accelerator.accumulate(model)``. The weights end bit-identical to the same loop without
cswap, under every policy, and the runtime moves the activations."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import cswap
from cswap.options import POLICIES
from tests.integrations.conftest import acted, offload_everything

accelerate = pytest.importorskip("accelerate")

SAMPLES, BATCH, ACCUMULATION, EPOCHS = 16, 4, 2, 2


def _train(policy: str | None) -> tuple[list[torch.Tensor], cswap.Runtime | None]:
    accelerate.state.AcceleratorState._reset_state()  # an Accelerator is process-wide state
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(5)
    data = torch.utils.data.TensorDataset(torch.randn(SAMPLES, 32, generator=g), torch.randint(0, 4, (SAMPLES,), generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    rt = cswap.Runtime(policy, model=model, device="cpu", **offload_everything(policy)) if policy else None
    for _ in range(EPOCHS):
        if rt is not None:
            rt.new_epoch()
        for x, y in loader:
            with accelerator.accumulate(model):
                if rt is None:
                    accelerator.backward(nn.functional.cross_entropy(model(x), y))
                else:
                    with rt.iteration():  # the recipe: forward and backward inside one iteration
                        accelerator.backward(nn.functional.cross_entropy(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()], rt


@pytest.fixture(scope="module")
def plain() -> list[torch.Tensor]:
    return _train(None)[0]


@pytest.mark.parametrize("policy", POLICIES)
def test_accelerate_recipe_weights_bit_identical(plain, policy: str) -> None:
    weights, rt = _train(policy)
    for i, (expected, got) in enumerate(zip(plain, weights, strict=True)):
        assert torch.equal(expected, got), f"{policy}: parameter {i} differs from the loop without cswap"
    stats = rt.stats()
    assert stats.iterations == EPOCHS * SAMPLES // BATCH and stats.profiled_iterations == EPOCHS
    assert acted(stats, policy)
    assert stats.resident_bytes == 0
