"""Recomputing policies on models as their authors ship them: Hugging Face GPT-2, Llama and T5 with
their default configs (the key/value cache on) and padding masks, Wav2Vec2 with SpecAugment,
RecurrentGemma (whose recurrence keeps its state in an attribute), a torchvision-style DenseNet and
ViT, a spectrally normalised GAN discriminator in both of torch's forms, and a CNN under ``torch.compile``. Every run completes with
gradients bit-identical to plain PyTorch; the regions that cannot be recomputed safely are never
enabled, and say why."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import torch

import cswap
from cswap.execute.recompute import RecomputeRegions
from cswap.profile.regions import profile_regions
from tests.runtime.helpers import assert_bit_equal
from tests.zoo import ZOO

STEPS = 3
SLOW_LINK = {"d2h_gbps": 1e-5, "h2d_gbps": 1e-5}  # copies never hide: the planners recompute where they can


def _train(name: str, runtime: dict | None) -> tuple[list[list[torch.Tensor]], cswap.Runtime | None]:
    torch.manual_seed(0)
    model, make_step = ZOO[name]()
    model.train()
    step = make_step(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    rt = cswap.Runtime(model=model, min_bytes=0, **SLOW_LINK, **runtime) if runtime is not None else None
    grads = []
    for i in range(STEPS):
        with torch.random.fork_rng():
            torch.manual_seed(100 + i)
            np.random.seed(100 + i)  # Wav2Vec2's SpecAugment draws from NumPy's, as a user's data pipeline would seed it
            random.seed(100 + i)
            if rt is None:
                step()
            else:
                with rt.iteration():
                    step()
        grads.append([p.grad.detach().clone() for p in model.parameters() if p.grad is not None])
        optimizer.step()
        optimizer.zero_grad()
    return grads, rt


@pytest.fixture(scope="module")
def plain() -> dict[str, list[list[torch.Tensor]]]:
    return {}


@pytest.mark.parametrize("name", list(ZOO))
@pytest.mark.parametrize(("policy", "budget"), [("recompute", None), ("recompute", 0.5), ("capuchin", 0.5), ("cswap", 0.5)])
def test_recomputing_policies_train_bit_identically(plain: dict, name: str, policy: str, budget: float | None) -> None:
    if name not in plain:
        plain[name] = _train(name, None)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the models' own notices
        try:
            grads, rt = _train(name, {"policy": policy, "memory_budget": budget})
        except cswap.BudgetError as error:  # below what the policy meets here: train at its least
            grads, rt = _train(name, {"policy": policy, "memory_budget": error.minimum_bytes})
    assert rt is not None
    stats = rt.stats()
    assert stats.iterations == STEPS
    if stats.budget_bytes is not None:
        assert stats.peak_resident_bytes <= stats.budget_bytes
    if policy == "recompute" and name != "compiled-cnn":
        assert stats.actions["recompute"] > 0, f"{name}: nothing was recomputed"
    assert_bit_equal([g for it in plain[name] for g in it], [g for it in grads for g in it], "gradient")


@pytest.mark.parametrize(
    ("name", "unsafe", "why"),
    [
        ("densenet", ["block1.denselayer1", "block1.denselayer2", "block1.denselayer3"], "is a mutable object"),
        ("vit", ["layers.0.self_attention", "layers.1.self_attention"], "one tensor as several inputs"),
        ("spectral-norm-hook", ["0.0", "1.0", "3"], "a forward pre-hook on it saves tensors for backward"),
    ],
)
def test_regions_that_cannot_run_twice_are_found_while_profiling(name: str, unsafe: list[str], why: str) -> None:
    torch.manual_seed(0)
    model, make_step = ZOO[name]()
    profile = profile_regions(model, make_step(model))
    for path in unsafe:
        assert why in (profile.ineligible.get(path) or ""), f"{path}: {profile.ineligible.get(path)}"
        assert path not in profile.candidates
    assert profile.candidates, "the model's other regions stay candidates"


def test_no_region_inside_a_compiled_graph_is_a_candidate() -> None:
    """Modules traced into a ``torch.compile`` graph run there, not through their hooks: recomputing
    one would not reach the compiled code. Only the compiled module's own call may be recomputed."""
    torch.manual_seed(0)
    model, make_step = ZOO["compiled-cnn"]()
    profile = profile_regions(model, make_step(model))
    assert profile.candidates == ("",)
    for path, facts in profile.regions.items():
        if path.startswith("_orig_mod"):
            assert "torch.compile graph" in (facts.ineligible or "")


@pytest.mark.parametrize("region", ["wav2vec2", "", "wav2vec2.encoder.layers.0"])
def test_a_region_drawing_spec_augment_masks_recomputes_the_same_masks(region: str) -> None:
    """Wav2Vec2 draws its SpecAugment masks from NumPy's global generator in its base model's
    forward, which torch's checkpoint does not put back: recomputed, that region drew other masks
    and gave other gradients, silently. The profile sees the model draw, and the regions put the
    generators' states back for each recomputed call that drew, and after it."""

    def run(recompute: bool) -> tuple[list[torch.Tensor], tuple[object, ...]]:
        torch.manual_seed(0)
        model, make_step = ZOO["wav2vec2"]()
        model.train()
        step = make_step(model)
        if recompute:
            np.random.seed(1)  # the profile's step draws too
            profile = profile_regions(model, step)
            assert profile.draws_host_random
            model.zero_grad()
            regions = RecomputeRegions.of(model)
            regions.replay_host_random(profile.regions)
            regions.enable([region])
        torch.manual_seed(2)
        np.random.seed(2)
        random.seed(2)
        step()
        assert not recompute or regions.take_recomputations() == {region: 1}
        return [p.grad.clone() for p in model.parameters() if p.grad is not None], (np.random.rand(), random.random())

    plain_grads, plain_next = run(False)
    grads, next_draws = run(True)
    assert_bit_equal(plain_grads, grads, "gradient")
    assert next_draws == plain_next, "the generators go on as plain PyTorch leaves them"


@pytest.mark.parametrize(("name", "layer"), [("gpt2", "transformer.h.0"), ("llama", "model.layers.0"), ("t5", "decoder.block.0")])
def test_a_layer_given_the_key_value_cache_is_not_recomputed_until_the_cache_is_off(name: str, layer: str) -> None:
    """The default config passes each decoder layer the cache, which a recomputation would append to
    a second time: the layer is never enabled. With ``use_cache=False`` (what Hugging Face's gradient
    checkpointing sets) it is a candidate. cswap leaves the config alone: the cache changes the
    bits of some models' gradients (T5's), and plain PyTorch is the reference."""
    for use_cache in (True, False):
        torch.manual_seed(0)
        model, make_step = ZOO[name]()
        if not use_cache:  # as the config class builds it, else with the cache off everywhere
            for config in {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values():
                config.use_cache = False
        profile = profile_regions(model, make_step(model))
        if use_cache:
            assert "Cache is a mutable object" in profile.ineligible[layer] and "use_cache = False" in profile.ineligible[layer]
        else:
            assert layer in profile.candidates


class _Moody(torch.nn.Module):
    """Saves a tensor of another dtype when ``mood`` changed between its forward and backward: a
    region the profile cannot see is unsafe, until torch refuses its recomputation."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)
        self.mood = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        return h.double().exp().float() if self.mood else h.exp()


def test_a_region_torch_refuses_is_excluded_and_the_next_iteration_trains() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), _Moody(), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 4))
    x = torch.randn(32, 64)
    rt = cswap.Runtime("recompute", model=model, min_bytes=0)
    with rt.iteration():  # profiling: nothing recomputed yet
        model(x).sum().backward()
    assert "1" in rt.plan().recompute_regions
    with pytest.raises(RuntimeError, match=r"cswap recomputed the modules .*'1'.* not recomputed again") as raised:
        with rt.iteration():
            loss = model(x).sum()
            model[1].mood = True  # the recomputation now takes the other branch
            loss.backward()
    assert isinstance(raised.value.__cause__, torch.utils.checkpoint.CheckpointError)
    model[1].mood = False
    model.zero_grad()
    with rt.iteration():  # profiles again, and plans without the refused region
        model(x).sum().backward()
    with rt.iteration():
        model(x).sum().backward()
    assert "1" not in rt.plan().recompute_regions
    assert rt.stats().iterations == 3 and rt.stats().profiled_iterations == 2  # the refused step is not counted


def test_a_compiled_model_says_in_its_plan_and_stats_that_its_modules_are_not_recomputed() -> None:
    """Under a budget that recomputing the compiled call as a whole does not help, nothing is
    recomputed: each row of a tensor saved in the compiled graph, the plan and the stats say why."""
    plain, _ = _train("compiled-cnn", None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        grads, rt = _train("compiled-cnn", {"policy": "recompute", "memory_budget": 1.0})
    assert_bit_equal([g for it in plain for g in it], [g for it in grads for g in it], "gradient")
    stats, plan = rt.stats(), rt.plan()
    assert stats.actions["recompute"] == 0 and plan.recompute_regions == ()
    note = ("the modules inside the torch.compile graph of the model run in the compiled code, not through their hooks, so "
            "none of them is recomputed")
    assert stats.recompute_note.startswith(note) and plan.planner["not_recomputed"] == stats.recompute_note
    table = {line[2:14].strip(): line[15:] for line in str(stats).splitlines()[1:]}
    assert table["recomputed"] == f"nothing; {stats.recompute_note}"
    why = "not recomputed: saved inside the torch.compile graph of the model, whose modules run in the compiled code"
    inside = [d for d in plan.rows().values() if d.reason.endswith(why)]
    # every activation the compiled graph saved (the loss's and the labels' are outside it)
    assert inside and all(d.action.value == "keep" for d in inside)
    assert sum(d.nbytes for d in inside) > sum(d.nbytes for d in plan.rows().values() if why not in d.reason)
    assert sum(note in str(w.message) for w in seen) == 1
