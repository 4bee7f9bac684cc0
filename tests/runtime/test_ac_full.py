"""Policy ``ac-full``: every repeated layer recomputed (activation checkpointing), the rest kept.

On tiny Hugging Face GPT-2 and Llama models (with ``use_cache=False``, as Hugging Face's own
gradient checkpointing sets it) and a ResNet, the gradients are bit-identical to plain PyTorch's and
the measured peak of saved activations is below ``none``'s. A layer that cannot be recomputed (a
key/value cache passed in) or a model without repeated layers gets a plan that recomputes nothing
and says why. Under a budget its fixed plan either holds the budget or is refused with its own
peak (or its profiling iteration's) as the least budget, which a fresh run then holds.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import cswap
from cswap import models
from cswap.budget import BudgetError
from cswap.planner.actions import POLICY_ACTIONS, RUNTIME_POLICIES
from tests.runtime.helpers import assert_bit_equal

transformers = pytest.importorskip("transformers")

VOCAB, SEQ_LEN = 256, 32


def _gpt2(use_cache: bool = False) -> nn.Module:
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ_LEN, n_embd=64, n_layer=3, n_head=4)
    config.use_cache = use_cache
    return transformers.GPT2LMHeadModel(config)


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=172, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ_LEN)
    config.use_cache = False
    return transformers.LlamaForCausalLM(config)


LANGUAGE_MODELS: dict[str, Callable[[], nn.Module]] = {"gpt2": _gpt2, "llama": _llama, "gpt2-cached": functools.partial(_gpt2, True)}
LAYERS = {"gpt2": tuple(f"transformer.h.{i}" for i in range(3)), "llama": tuple(f"model.layers.{i}" for i in range(3))}


@functools.cache
def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LANGUAGE_MODELS[name]().train()


def _lm_step(model: nn.Module) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    ids = torch.randint(0, VOCAB, (2, SEQ_LEN), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(7)  # the same dropout masks every call
    model(input_ids=ids, labels=ids).loss.backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _run(model: nn.Module, step: Callable[[nn.Module], list[torch.Tensor]], policy: str | None, iterations: int = 3,
         **options: object) -> tuple[list[torch.Tensor], cswap.Runtime | None]:
    """``iterations`` steps of a copy of ``model`` (under ``policy``, or plain PyTorch): the last gradients and the runtime."""
    model = copy.deepcopy(model)
    rt = cswap.Runtime(policy, device="cpu", model=model, **options) if policy else None
    grads: list[torch.Tensor] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(iterations):
            if rt is None:
                grads = step(model)
                continue
            with rt.iteration():
                grads = step(model)
    return grads, rt


def test_ac_full_is_a_runtime_policy_with_a_fixed_plan() -> None:
    assert "ac-full" in RUNTIME_POLICIES and "ac-full" not in POLICY_ACTIONS  # not planned for a budget
    with pytest.raises(ValueError, match="needs the model"):
        cswap.Runtime("ac-full", device="cpu")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_every_layer_recomputed_with_plain_gradients_below_nones_peak(name: str) -> None:
    plain, _ = _run(_model(name), _lm_step, None)
    grads, rt = _run(_model(name), _lm_step, "ac-full")
    _, none = _run(_model(name), _lm_step, "none", iterations=1)
    assert_bit_equal(plain, grads, what=f"{name} ac-full gradient")
    plan = rt.plan()
    assert plan.recompute_regions == LAYERS[name]
    assert plan.planner["layers"] == f"every layer recomputed: 3 layers, {LAYERS[name][0]} to {LAYERS[name][-1]}"
    stats = rt.stats()
    assert stats.actions["recompute"] > 0 and stats.actions["swap"] == stats.actions["zvc-swap"] == stats.actions["zvc-keep"] == 0
    # the planned iterations keep each layer's input and the head, not every layer's interior
    assert stats.iteration_peak_resident_bytes < 0.6 * none.stats().iteration_peak_resident_bytes
    assert stats.resident_bytes == 0


def test_a_layer_holding_a_key_value_cache_is_kept_and_the_plan_says_why() -> None:
    plain, _ = _run(_model("gpt2-cached"), _lm_step, None, iterations=2)
    grads, rt = _run(_model("gpt2-cached"), _lm_step, "ac-full", iterations=2)
    assert_bit_equal(plain, grads, what="gpt2 (use_cache) ac-full gradient")
    plan = rt.plan()
    assert plan.recompute_regions == () and rt.stats().actions["recompute"] == 0
    note = plan.planner["layers"]
    assert note.startswith("no layer recomputed, every tensor kept; 3 of 3 cannot be recomputed (transformer.h.0:")
    assert "config.use_cache = False" in note
    assert all(d.reason == f"policy ac-full: {note}" for d in plan.decisions.values())


def _image_step(model: nn.Module) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    generator = torch.Generator().manual_seed(2)
    images, labels = torch.randn(2, 3, 32, 32, generator=generator), torch.randint(0, 10, (2,), generator=generator)
    torch.manual_seed(7)
    nn.functional.cross_entropy(model(images), labels).backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_a_resnet_recomputes_its_blocks_and_a_vgg_without_any_keeps_everything() -> None:
    torch.manual_seed(0)
    resnet = models.build("resnet18", num_classes=10, width_mult=0.25).train()
    plain, _ = _run(resnet, _image_step, None)
    grads, rt = _run(resnet, _image_step, "ac-full")
    _, none = _run(resnet, _image_step, "none", iterations=1)
    assert_bit_equal(plain, grads, what="resnet18 ac-full gradient")
    assert rt.plan().recompute_regions == tuple(f"layer{stage}.{block}" for stage in range(1, 5) for block in range(2))
    assert rt.stats().iteration_peak_resident_bytes < none.stats().iteration_peak_resident_bytes
    vgg = models.build("vgg11", num_classes=10, width_mult=0.125).train()
    plain, _ = _run(vgg, _image_step, None, iterations=2)
    grads, rt = _run(vgg, _image_step, "ac-full", iterations=2)
    assert_bit_equal(plain, grads, what="vgg11 ac-full gradient")
    assert rt.plan().recompute_regions == () and rt.stats().actions["recompute"] == 0
    assert rt.plan().planner["layers"].startswith("the model has no repeated layers (no block class repeats")


def test_under_a_budget_its_own_peak_is_the_least_and_a_run_there_holds_it() -> None:
    plain, _ = _run(_model("llama"), _lm_step, None)
    with pytest.raises(BudgetError) as refused:
        _run(_model("llama"), _lm_step, "ac-full", memory_budget=0.05)
    least = refused.value.minimum_bytes
    _, free = _run(_model("llama"), _lm_step, "ac-full")
    # the fixed plan's own peak, or its profiling iteration's where that holds more (a run at a budget profiles within it)
    assert least >= free.plan().planner["minimum_bytes"] and refused.value.policy == "ac-full"
    grads, rt = _run(_model("llama"), _lm_step, "ac-full", memory_budget=least)
    assert_bit_equal(plain, grads, what="llama ac-full gradient at its least budget")
    assert rt.plan().recompute_regions == LAYERS["llama"]
    assert rt.stats().iteration_peak_resident_bytes <= least


def _shipped_llama() -> nn.Module:
    """A Llama as its config class builds it (the key/value cache on), small."""
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ_LEN)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).train()


def test_a_model_shipped_with_its_cache_on_warns_once_naming_the_layers_and_the_fix() -> None:
    model = _shipped_llama()
    assert model.config.use_cache is True
    rt = cswap.Runtime("ac-full", device="cpu", model=model)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            with rt.iteration():
                _lm_step(model)
    mine = [str(w.message) for w in seen if "cannot recompute" in str(w.message)]
    assert len(mine) == 1 and seen[[str(w.message) for w in seen].index(mine[0])].filename == __file__
    assert mine[0].startswith("policy ac-full cannot recompute some of the model's modules, whatever the budget: 2 of the "
                              "model's 2 repeated layers cannot be recomputed: 'model.layers.0', 'model.layers.1' (its input cache:")
    assert "Pass disable_kv_cache=True to cswap.Runtime" in mine[0]
    assert "set model.config.use_cache = False before training" in mine[0]
    stats, plan = rt.stats(), rt.plan()
    assert stats.actions["recompute"] == 0 and plan.recompute_regions == ()
    assert stats.recompute_note == plan.planner["not_recomputed"] and stats.recompute_note in mine[0]
    table = {line[2:14].strip(): line[15:] for line in str(stats).splitlines()[1:]}
    assert table["recomputed"] == f"nothing; {stats.recompute_note}"
    # with the cache off every layer is recomputed, with plain PyTorch's gradients, and nothing warns
    cached_off = _shipped_llama()
    cached_off.config.use_cache = False
    plain, _ = _run(cached_off, _lm_step, None)
    rt = cswap.Runtime("ac-full", device="cpu", model=cached_off)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            with rt.iteration():
                grads = _lm_step(cached_off)
    assert_bit_equal(plain, grads, what="llama (use_cache=False) ac-full gradient")
    assert not [w for w in seen if "cannot recompute" in str(w.message)]
    assert rt.plan().recompute_regions == ("model.layers.0", "model.layers.1") and rt.stats().actions["recompute"] > 0
    assert rt.stats().recompute_note == "" and "not_recomputed" not in rt.plan().planner


def test_disable_kv_cache_recomputes_a_model_shipped_with_its_cache_on_and_gives_the_setting_back() -> None:
    """With the option every decoder layer of a Llama as its config class builds it is recomputed,
    with the gradients of plain PyTorch on the same model (the cache on: a Llama's gradients do not
    depend on it); inside each iteration its config has the cache off, outside it what it had."""
    model = _shipped_llama()
    plain, _ = _run(model, _lm_step, None)
    seen: list[bool] = []
    layer = model.model.layers[0]
    forward = layer.forward

    def watched(*args: Any, **kwargs: Any) -> Any:  # (a hook of the user's would keep the layer from being recomputed)
        seen.append(model.config.use_cache)
        return forward(*args, **kwargs)

    layer.forward = watched
    rt = cswap.Runtime("ac-full", device="cpu", model=model, disable_kv_cache=True)
    assert rt.options.disable_kv_cache and model.config.use_cache is True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            with rt.iteration():
                grads = _lm_step(model)
            assert model.config.use_cache is True  # given back at the end of each iteration
    assert not [w for w in caught if "cannot recompute" in str(w.message)]
    assert seen and not any(seen)  # off in every forward (and every recomputation) of the run
    assert_bit_equal(plain, grads, what="llama (shipped, disable_kv_cache) ac-full gradient")
    stats, plan = rt.stats(), rt.plan()
    assert plan.recompute_regions == ("model.layers.0", "model.layers.1") and stats.actions["recompute"] > 0
    assert stats.recompute_note == "" and "not_recomputed" not in plan.planner
    # an iteration that raises gives the setting back too
    with pytest.raises(KeyboardInterrupt), rt.iteration():
        raise KeyboardInterrupt
    assert model.config.use_cache is True
    with pytest.raises(ValueError, match="no module of Linear has a config with use_cache"):
        cswap.Runtime("ac-full", device="cpu", model=nn.Linear(2, 2), disable_kv_cache=True)
    with pytest.raises(ValueError, match="must be true or false"):
        cswap.Runtime("ac-full", device="cpu", model=model, disable_kv_cache="yes")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("budget", [None, 0.6])
def test_the_plans_peak_is_the_peak_a_run_measures_and_the_node_before_the_recomputation(name: str, budget: float | None) -> None:
    """The plan counts the layers' rebuilt tensors from each layer's own backward on (a Llama's
    rotary embedding, whose view every layer saves and which is stored once, is first read by the
    last layer's backward: the first layer is not rebuilt there). The plan holds the last layer's
    from the event before its recomputation, the final norm's backward: what that frees (of the
    final norm's saves) is the plan's margin over the run."""
    plain, _ = _run(_model(name), _lm_step, None)
    grads, rt = _run(_model(name), _lm_step, "ac-full", memory_budget=budget)
    assert_bit_equal(plain, grads, what=f"{name} ac-full gradient")
    plan, stats = rt.plan(), rt.stats()
    assert plan.recompute_regions == LAYERS[name]
    norm = {"gpt2": "transformer.ln_f ", "llama": "model.norm "}[name]
    before = sum(d.nbytes for d in plan.rows().values() if d.module.startswith(norm))
    measured = stats.iteration_peak_resident_bytes
    if budget is None:  # planned from a profile that ran the layers recomputed: its peak is the one measured
        assert plan.planner["peak_bytes"] == measured == stats.history[0].peak_resident_bytes
    else:
        assert before > 0 and measured < plan.planner["peak_bytes"] <= measured + before


def _gpt2_four_layers() -> nn.Module:
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ_LEN, n_embd=64, n_layer=4, n_head=4, use_cache=False)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).train()


def _peaks(model: nn.Module, policy: str, iterations: int = 3) -> tuple[list[list[torch.Tensor]], list[int], cswap.Runtime]:
    """Every iteration's gradients and peak of resident bytes under ``policy``."""
    rt = cswap.Runtime(policy, device="cpu", model=model)
    grads, peaks = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(iterations):
            with rt.iteration():
                grads.append(_lm_step(model))
            peaks.append(rt.stats().iteration_peak_resident_bytes)
    return grads, peaks, rt


def test_the_first_iteration_already_recomputes_every_layer() -> None:
    """Without a budget ac-full's plan is fixed by the model: its profile runs it, so the first
    step holds what the later ones do, not what plain PyTorch holds."""
    plain = _lm_step(_gpt2_four_layers())  # every step sees the same batch and masks, and no update
    _, (none, *_), _ = _peaks(_gpt2_four_layers(), "none", iterations=1)
    grads, peaks, rt = _peaks(_gpt2_four_layers(), "ac-full")
    for step, got in enumerate(grads):
        assert_bit_equal(plain, got, what=f"step {step} gradient")
    assert peaks[0] <= 0.75 * none and peaks[0] == peaks[1] == peaks[2]
    stats = rt.stats()
    assert stats.profiled_iterations == 1 and stats.profiled_actions["recompute"] == stats.actions["recompute"] // 3 > 0
    assert rt.plan().recompute_regions == tuple(f"transformer.h.{i}" for i in range(4))
    assert rt.trace().meta["mode"] == "layers"


class _Doubling(nn.Module):
    """A block that doubles its input in place: recomputed, it would read the doubled values."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return self.linear(x).tanh() + 1


def test_a_layer_modifying_its_input_in_place_stops_the_first_step_and_is_kept_after() -> None:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), _Doubling(), _Doubling(), nn.Linear(16, 2))

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    reference = build()
    reference(x).sum().backward()
    model = build()
    rt = cswap.Runtime("ac-full", device="cpu", model=model)
    with pytest.raises(RuntimeError, match=r"layers '1', '2' from the first iteration .* modify their input in place"):
        with rt.iteration():
            model(x).sum().backward()
    model.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            with rt.iteration():
                model(x).sum().backward()
            assert_bit_equal([p.grad for p in reference.parameters()], [p.grad for p in model.parameters()], "gradient")
            model.zero_grad()
    assert rt.plan().recompute_regions == () and "2 of 2 cannot be recomputed (1: its forward modifies an input" in rt.plan().planner["layers"]
