"""Mixed precision: under ``torch.autocast`` the saved activations are bfloat16 or float16, and every
policy still gives plain PyTorch's gradients bit for bit (ZVC reads 2-byte elements as int16)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cswap import models
from cswap.options import POLICIES
from tests.runtime.helpers import assert_bit_equal, batches, runtime_for, train

DATA = batches(2, (2, 3, 32, 32), classes=10)
HALF_DTYPES = (torch.bfloat16, torch.float16)
MODELS = ("resnet18", "vgg11")


class Autocast(nn.Module):
    """``model`` run under CPU autocast to ``dtype``; logits returned in float32 for the loss."""

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.model = model
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=self.dtype):
            return self.model(x).float()


def _build(name: str, dtype: torch.dtype):
    return lambda: Autocast(models.build(name, num_classes=10, width_mult=0.125), dtype)


@pytest.fixture(scope="module")
def reference() -> dict[tuple[str, torch.dtype], list[list[torch.Tensor]]]:
    return {(name, dtype): train(_build(name, dtype), DATA, epochs=2)[0] for name in MODELS for dtype in HALF_DTYPES}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("name", MODELS)
def test_autocast_gradients_bit_identical(reference, name: str, dtype: torch.dtype, policy: str) -> None:
    grads, rt = train(_build(name, dtype), DATA, epochs=2, runtime=runtime_for(policy))
    for iteration, (expected, got) in enumerate(zip(reference[(name, dtype)], grads)):
        assert_bit_equal(expected, got, what=f"{name}/{dtype}/{policy} iteration {iteration} gradient")
    half = str(dtype).removeprefix("torch.")
    assert any(t.dtype == half for t in rt.trace().tensors if t.offloadable)
    stats = rt.stats()
    if policy in ("compress-swap", "compress-keep"):
        compressing = "zvc-swap" if policy == "compress-swap" else "zvc-keep"
        assert stats.actions[compressing] > 0 and stats.compressed_input_bytes > 0
    assert stats.resident_bytes == 0
