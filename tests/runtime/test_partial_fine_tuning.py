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
from tests.runtime.test_dynamic_shapes import padded_batch

transformers = pytest.importorskip("transformers")

# per step, two micro-batches, each the lengths of its sequences (padded to the longest)
STEPS = [[[40, 25, 33], [96, 60, 12]], [[112, 100, 7], [34, 34, 20]], [[64, 9, 50], [80, 80, 79]]]
BUDGET = 0.8
# compress-keep's first profile under a fraction compresses every tensor before the fraction's bytes
# are known, and may pass them by up to 11% (README, "memory budget")
_FIRST_PROFILE_MARGIN = {("compress-keep", 0): 1.11}


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


def _train(build, policy: str | None) -> tuple[list[list[torch.Tensor | None]], cswap.Runtime | None, list[tuple[int, int, int]]]:
    """Every step's gradients (``None`` for a parameter without one), the runtime and the steps
    whose peak passed the budget in force at their end."""
    torch.manual_seed(0)
    model = build().train()
    rt = cswap.Runtime(policy, model=model, device="cpu", memory_budget=BUDGET) if policy is not None else None
    grads, over = [], []
    for i, micro_batches in enumerate(STEPS):
        model.zero_grad(set_to_none=True)
        with torch.random.fork_rng():
            torch.manual_seed(i)
            with rt.iteration() if rt is not None else torch.enable_grad():
                for j, lengths in enumerate(micro_batches):
                    ids, mask = padded_batch(lengths, seed=100 * i + j)
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
                    (loss / len(micro_batches)).backward()
        grads.append([None if p.grad is None else p.grad.detach().clone() for p in model.parameters()])
        if rt is not None:
            stats = rt.stats()
            if stats.iteration_peak_resident_bytes > stats.budget_bytes * _FIRST_PROFILE_MARGIN.get((policy, i), 1.0):
                over.append((i, stats.iteration_peak_resident_bytes, stats.budget_bytes))
    return grads, rt, over


@pytest.fixture(scope="module")
def plain() -> dict[str, list[list[torch.Tensor | None]]]:
    return {name: _train(build, None)[0] for name, build in MODELS.items()}


@pytest.mark.parametrize("policy", [p for p in RUNTIME_POLICIES if p != "none"])
@pytest.mark.parametrize("name", MODELS)
def test_a_few_trained_parameters_of_a_frozen_model(plain, name: str, policy: str) -> None:
    grads, rt, over = _train(MODELS[name], policy)
    assert not over, f"{policy} passed the budget: (step, peak, budget) {over}"
    stats = rt.stats()  # type: ignore[union-attr]
    assert acted(stats, policy), stats.actions
    assert stats.profiled_iterations == 1, stats
    for step, (expected, got) in enumerate(zip(plain[name], grads, strict=True)):
        trained = [e is not None for e in expected]
        assert [g is not None for g in got] == trained, f"step {step}: another set of parameters has gradients"
        assert 0 < sum(trained) < len(trained)
        assert_bit_equal([e for e in expected if e is not None], [g for g in got if g is not None], f"step {step} gradient")
