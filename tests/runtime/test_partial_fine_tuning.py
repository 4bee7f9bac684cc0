"""Fine-tunes that train a few parameters of a frozen model, as most fine-tuning does: low-rank
adapters beside a frozen Llama's attention projections (what PEFT's LoRA adds) and GPT-2 with only
its biases and layer norms trained (BitFit). Autograd then saves fewer tensors, and a frozen layer's
input may not require grad at all; every policy holds its budget on every step, with batches padded
to their longest and two micro-batches per step under autocast, and the gradients of the trained
parameters are bit-identical to plain PyTorch's while the frozen ones get none."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import cswap
from cswap.planner.actions import RUNTIME_POLICIES
from tests.integrations.conftest import acted
from tests.runtime.helpers import assert_bit_equal
from tests.runtime.test_dynamic_shapes import lm_run

transformers = pytest.importorskip("transformers")

# per step, two micro-batches, each the lengths of its sequences (padded to the longest)
STEPS = [[[40, 25, 33], [96, 60, 12]], [[112, 100, 7], [34, 34, 20]], [[64, 9, 50], [80, 80, 79]]]
BUDGET = 0.8


class LowRankAdapter(nn.Module):
    """``base(x) + x A^T B^T`` with ``base`` frozen and rank-``rank`` ``A``, ``B`` trained."""

    def __init__(self, base: nn.Linear, rank: int = 4) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.down = nn.Parameter(torch.randn(rank, base.in_features) * 0.02)
        self.up = nn.Parameter(torch.randn(base.out_features, rank) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.down.t()) @ self.up.t()


def llama_with_adapters() -> nn.Module:
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, use_cache=False)
    model = transformers.LlamaForCausalLM(config).requires_grad_(False)
    for layer in model.model.layers:
        layer.self_attn.q_proj = LowRankAdapter(layer.self_attn.q_proj)
        layer.self_attn.v_proj = LowRankAdapter(layer.self_attn.v_proj)
    return model


def gpt2_bitfit() -> nn.Module:
    config = transformers.GPT2Config(vocab_size=256, n_positions=128, n_embd=64, n_layer=2, n_head=2, use_cache=False)
    model = transformers.GPT2LMHeadModel(config)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.endswith("bias") or ".ln_" in name)
    return model


MODELS = {"llama-lora": llama_with_adapters, "gpt2-bitfit": gpt2_bitfit}


def _train(build, policy: str | None) -> tuple[list[list[torch.Tensor]], list[tuple[int, int | None, int]], cswap.Runtime | None]:
    """Every step's gradients (of the parameters that have one), per step its peak, the budget in
    force and the profiles so far, and the runtime."""
    make = (lambda model: cswap.Runtime(policy, model=model, device="cpu", memory_budget=BUDGET)) if policy is not None else None
    return lm_run(build, STEPS, make=make, autocast=torch.bfloat16)


@pytest.fixture(scope="module")
def plain() -> dict[str, list[list[torch.Tensor]]]:
    return {name: _train(build, None)[0] for name, build in MODELS.items()}


@pytest.mark.parametrize("policy", [p for p in RUNTIME_POLICIES if p != "none"])
@pytest.mark.parametrize("name", MODELS)
def test_a_few_trained_parameters_of_a_frozen_model(plain, name: str, policy: str) -> None:
    grads, seen, rt = _train(MODELS[name], policy)
    # the first step too, which runs before the fraction's bytes are known (compressing every tensor
    # there would pass them by 10.2% on the Llama with adapters)
    over = [(step, peak, budget) for step, (peak, budget, _) in enumerate(seen) if peak > budget]  # type: ignore[operator]
    assert not over, f"{policy} passed the budget: (step, peak, budget) {over}"
    stats = rt.stats()  # type: ignore[union-attr]
    assert acted(stats, policy), stats.actions
    assert stats.profiled_iterations == 1, stats
    parameters = list(rt.options.model.parameters())  # type: ignore[union-attr]
    trained = sum(p.requires_grad for p in parameters)
    assert 0 < trained < len(parameters)
    for step, (expected, got) in enumerate(zip(plain[name], grads, strict=True)):
        # a frozen parameter never gets a gradient: as many as are trained means every trained one has one
        assert len(expected) == len(got) == trained, f"step {step}: {len(got)} gradients, {trained} trained parameters"
        assert_bit_equal(expected, got, f"step {step} gradient")
