"""The runtime's fifth action: policies ``recompute`` and ``capuchin``, and ``cswap`` with recompute
under a budget, on a CNN with dropout and batch norm, on HF GPT-2 and BERT with dropout, and on
layers that draw from Python's and NumPy's global random generators.

Every case trains next to plain PyTorch and compares every iteration's gradients and the final
``state_dict`` (batch-norm statistics included) byte for byte; the plan's numbering of the packs
with regions enabled is checked against the packs a real run makes.
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import cswap
from cswap.budget import MemoryBudget
from cswap.execute.executor import Executor
from cswap.execute.recompute import RecomputeRegions, nested_pair
from cswap.models import build as build_model
from cswap.planner.plan import Action
from cswap.planner.regions import NO_CODEC, plan_regions
from cswap.profile.codec_speed import CodecSpeed, OpSpeed
from cswap.profile.regions import profile_regions
from cswap.profile.trace import TensorRecord, Trace
from tests.runtime.helpers import assert_bit_equal, batches, runtime_for, train
from tests.execute.test_recompute import IDS, MASK, SmallCNN, bert, gpt2

#: A link so slow that recomputing a region costs less than moving its bytes.
CRAWLING_LINK = {"d2h_gbps": 1e-5, "h2d_gbps": 1e-5}
#: Codecs so slow that recomputing a region costs less than compressing its bytes: with the helpers'
#: free codec, ``cswap`` may meet the budget by compressed keeps alone, and whether it then
#: recomputes at all rests on measured forward times.
CRAWLING_CODEC = CodecSpeed(backend="cpu", compress=OpSpeed(1e-2, 1e-6, 0.0), decompress=OpSpeed(1e-2, 1e-6, 0.0))

CNN_BATCHES = batches(4, (4, 3, 8, 8), 10)
HF_BATCHES = [(IDS, IDS)] * 3


class LanguageModel(nn.Module):
    """An HF model whose forward returns its masked-LM loss (no KV cache: training recomputes blocks)."""

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        self.hf = hf

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.hf(ids, attention_mask=MASK, labels=ids, use_cache=False).loss


def _loss_is_output(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return output


MODELS: dict[str, tuple[Callable[[], nn.Module], Any, Any]] = {
    "cnn": (SmallCNN, CNN_BATCHES, nn.functional.cross_entropy),
    "gpt2": (lambda: LanguageModel(gpt2()), HF_BATCHES, _loss_is_output),
    "bert": (lambda: LanguageModel(bert()), HF_BATCHES, _loss_is_output),
}

#: (policy, budget as a fraction of none's peak or None, the runtime's link and codec speeds)
CASES = [
    ("recompute", None, {}),
    ("recompute", 0.5, {}),
    ("capuchin", 0.5, CRAWLING_LINK),
    ("cswap", 0.5, {**CRAWLING_LINK, "time_model": CRAWLING_CODEC}),
]


@pytest.fixture(scope="module")
def references() -> dict[str, tuple[list[list[torch.Tensor]], dict[str, torch.Tensor]]]:
    """Per model, plain PyTorch's gradients of every iteration and its final state."""
    found = {}
    for name, (build, data, loss_fn) in MODELS.items():
        trained: list[nn.Module] = []
        grads, _ = train(build, data, 1, loss_fn=loss_fn, trained=trained)
        found[name] = (grads, trained[0].state_dict())
    return found


def _train(name: str, policy: str, budget: Any, link: dict[str, Any]) -> tuple[list[list[torch.Tensor]], cswap.Runtime]:
    build, data, loss_fn = MODELS[name]
    options = dict(link)
    if budget is not None:
        options["memory_budget"] = budget
    return train(build, data, 1, runtime_for(policy, **options), loss_fn=loss_fn)


def _assert_same_as_plain(reference: Any, grads: list[list[torch.Tensor]], rt: cswap.Runtime) -> None:
    plain_grads, plain_state = reference
    assert_bit_equal([g for it in plain_grads for g in it], [g for it in grads for g in it], "gradient")
    state = rt.options.model.state_dict()
    assert list(state) == list(plain_state)
    assert_bit_equal(list(plain_state.values()), list(state.values()), "state_dict entry")


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize(("policy", "fraction", "link"), CASES, ids=[f"{p}-{f}" for p, f, _ in CASES])
def test_recomputing_policies_train_bit_identically(name: str, policy: str, fraction: float | None, link: dict[str, Any],
                                                    references: Any) -> None:
    try:
        grads, rt = _train(name, policy, fraction, link)
    except cswap.BudgetError as error:
        assert error.policy == policy and error.minimum_bytes > error.budget_bytes
        # the least it says is honest: a run at it holds
        grads, rt = _train(name, policy, error.minimum_bytes, link)
    _assert_same_as_plain(references[name], grads, rt)
    stats, plan = rt.stats(), rt.plan()
    planned_iterations = stats.iterations - stats.profiled_iterations
    # every planned iteration rebuilt every tensor the plan drops, and packed nothing it did not know
    # the plan in the message: whether it recomputes rests on the forward times its profile measured
    seen = f"{plan}\nprofiled {stats.profiled_iterations} of {stats.iterations}; planner {dict(plan.planner)}"
    assert plan.recompute_regions and nested_pair(plan.recompute_regions) is None, seen
    assert stats.actions["recompute"] == planned_iterations * len(plan.recomputed) > 0
    assert plan.counts()["recompute"] == len(plan.recomputed)
    assert all(d.action is Action.RECOMPUTE for d in plan.recomputed.values())
    assert stats.unknown_keys == 0
    if stats.budget_bytes is not None:
        assert stats.peak_resident_bytes <= stats.budget_bytes


def test_without_a_budget_recompute_plans_its_least_footprint() -> None:
    _, keep = train(SmallCNN, CNN_BATCHES, 1, runtime_for("none"))
    _, recompute = train(SmallCNN, CNN_BATCHES, 1, runtime_for("recompute"))
    stats = recompute.stats()
    assert stats.budget_bytes is None and stats.actions["recompute"] > 0
    assert recompute.plan().budget_bytes == recompute.plan().planner["minimum_bytes"]
    # the last iteration followed the plan: it held less than keeping everything
    assert stats.iteration_peak_resident_bytes < keep.stats().iteration_peak_resident_bytes


def test_the_profile_prices_recomputing_each_tensor_by_its_module_forward() -> None:
    _, rt = train(SmallCNN, CNN_BATCHES[:1], 1, runtime_for("recompute"))
    records = [r for r in rt.trace().tensors if r.offloadable]
    # every tensor saved while a module ran (its producer names the module; the loss's do not)
    inside = [r for r in records if ":" in r.producer]
    assert inside and len(inside) < len(records)
    assert all(r.recompute_s is not None and r.recompute_s > 0 for r in inside)


def test_tensors_a_region_rebuilds_count_as_resident_while_they_live(monkeypatch: pytest.MonkeyPatch) -> None:
    _, counted = train(SmallCNN, CNN_BATCHES, 1, runtime_for("recompute"))
    told: list[int] = []
    with monkeypatch.context() as patched:
        patched.setattr(Executor, "hold_rebuilt", lambda self, it, tensor: told.append(tensor.untyped_storage().nbytes()))
        _, uncounted = train(SmallCNN, CNN_BATCHES, 1, runtime_for("recompute"))
    assert counted.plan().recompute_regions == uncounted.plan().recompute_regions
    assert told and max(told) > 0
    # the last (planned) iteration's peak holds a region's rebuilt tensors on top of what the hooks keep
    assert counted.stats().iteration_peak_resident_bytes >= uncounted.stats().iteration_peak_resident_bytes + 1
    assert counted.stats().iteration_peak_resident_bytes <= counted.plan().planner["peak_bytes"]
    assert counted.stats().resident_bytes == 0  # every rebuilt storage was freed, and seen freed


def test_a_recomputing_policy_needs_the_model() -> None:
    with pytest.raises(ValueError, match=r"needs the model: cswap.Runtime\(policy='capuchin', model=model\)"):
        cswap.Runtime("capuchin", device="cpu")


def test_cswap_without_a_model_plans_no_recompute() -> None:
    rt = cswap.Runtime("cswap", device="cpu", memory_budget="1MiB")
    assert not rt.recomputes


@pytest.mark.parametrize("policy", ["recompute", "capuchin"])
def test_profiling_under_a_budget_swaps_every_tensor_as_capuchins_passive_mode(policy: str) -> None:
    _, none = train(SmallCNN, CNN_BATCHES[:1], 1, runtime_for("none"))
    budget = none.stats().peak_resident_bytes  # every policy meets it; the profile must still swap
    _, rt = train(SmallCNN, CNN_BATCHES[:1], 1, runtime_for(policy, memory_budget=budget))
    stats = rt.stats()
    assert stats.profiled_iterations == stats.iterations == 1
    assert stats.actions["swap"] == stats.packed_tensors - stats.deduplicated_tensors - stats.never_moved_tensors > 0
    assert stats.actions["keep"] == 0 and stats.peak_resident_bytes <= budget


def _trace_of(profile: Any) -> Trace:
    records = tuple(
        TensorRecord(key=s.key, shape=s.shape, dtype=s.dtype, nbytes=s.storage_bytes, sparsity=0.0, offloadable=s.movable,
                     pack_at_s=0.01 * s.key, unpack_at_s=2.0 - 0.01 * s.key)
        for s in profile.saves
    )
    return Trace(tensors=records, d2h_gbps=10.0, h2d_gbps=10.0, forward_s=1.0, backward_s=1.0)


@pytest.mark.parametrize("fraction", [None, 0.6, 0.3])
def test_the_plan_numbers_packs_as_a_run_with_its_regions_makes_them(fraction: float | None) -> None:
    torch.manual_seed(0)
    model = SmallCNN()
    x, y = CNN_BATCHES[0]
    regions = RecomputeRegions(model)

    def step() -> None:
        nn.functional.cross_entropy(model(x), y).backward()

    profile = profile_regions(model, step)
    budget = None if fraction is None else MemoryBudget(fraction=fraction)
    chosen = plan_regions(_trace_of(profile), profile, "recompute", budget, NO_CODEC, "cpu", 0, epoch=0)
    if chosen.error is not None:
        chosen = plan_regions(_trace_of(profile), profile, "recompute", MemoryBudget(nbytes=chosen.error.minimum_bytes), NO_CODEC, "cpu", 0,
                              epoch=0)
    plan = chosen.plan
    assert chosen.error is None and plan.recompute_regions
    seen: list[tuple[tuple[int, ...], str]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen.append((tuple(t.shape), str(t.dtype).removeprefix("torch.")))
        return t

    regions.enable(plan.recompute_regions)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    assert sorted(plan.decisions) == list(range(len(seen)))
    assert [(d.shape, d.dtype) for d in plan.decisions.values()] == seen
    dropped = {k for keys in chosen.region_keys.values() for k in keys}
    assert dropped == set(plan.recomputed)
    assert set(plan.unpack_order) <= set(plan.decisions)


def test_plan_regions_refuses_a_policy_that_does_not_recompute() -> None:
    with pytest.raises(ValueError, match="does not recompute: choose one of cswap, recompute, capuchin"):
        plan_regions(Trace(tensors=()), None, "swap", None, NO_CODEC, "cpu", 0, epoch=0)  # type: ignore[arg-type]


def test_plan_printout_and_dict_list_the_recomputed_tensors() -> None:
    _, rt = train(SmallCNN, CNN_BATCHES[:2], 1, runtime_for("recompute"))
    plan = rt.plan()
    text = str(plan)
    assert "recompute regions: " in text and text.count("recomputed by region") == len(plan.recomputed)
    data = plan.to_dict()
    assert data["recompute_regions"] == list(plan.recompute_regions)
    assert [d["key"] for d in data["recomputed"]] == sorted(plan.recomputed)


#: Region sets whose runs once counted more than their plan: VGG-11's pools (an in-place ReLU's
#: output saved again by the pool, which reads it first) and BERT's prediction head (its decoder
#: weight is the word embeddings').
FORCED = [
    ("vgg11", ("features.5",), "cswap", 0.35, {}),
    ("vgg11", ("classifier",), "cswap", 0.35, {}),
    ("vgg11", ("features.10", "features.15", "features.5"), "cswap", 0.4, {}),
    ("bert", ("hf.bert.encoder.layer.0.attention.self", "hf.bert.encoder.layer.0.output", "hf.bert.encoder.layer.1", "hf.cls.predictions"),
     "capuchin", 0.6, {}),
    ("bert", ("hf.cls.predictions",), "cswap", 0.6, CRAWLING_LINK),
    # a block's output is saved by its last ReLU and by the next block: recomputing the block saves
    # a second copy of it, which the plan must hold beside what the region dropped
    ("resnet18", ("layer1",), "cswap", 0.4, {}),
    ("resnet18", ("layer1",), "cswap", 0.6, {}),
]


def _vgg11() -> nn.Module:
    return build_model("vgg11", num_classes=10, width_mult=0.125)


def _resnet18() -> nn.Module:
    return build_model("resnet18", num_classes=10, width_mult=0.25)


_CNNS: dict[str, Callable[[], nn.Module]] = {"vgg11": _vgg11, "resnet18": _resnet18}


@pytest.mark.parametrize(("name", "regions", "policy", "fraction", "link"), FORCED, ids=[f"{n}-{p}-{f}-{r[-1]}" for n, r, p, f, _ in FORCED])
def test_a_run_with_any_region_choice_holds_its_plan(name: str, regions: tuple[str, ...], policy: str, fraction: float,
                                                     link: dict[str, float], monkeypatch: pytest.MonkeyPatch) -> None:
    # The choice among regions depends on measured seconds; forcing one pins a case where the
    # runtime's count (rebuilt tensors included) and the plan's timeline once disagreed.
    if name in ("vgg11", "resnet18"):
        build, data, loss_fn = _CNNS[name], batches(4, (4, 3, 32, 32), 10), nn.functional.cross_entropy
    else:
        build, data, loss_fn = MODELS[name]
    _, none = train(build, data[:1], 1, runtime_for("none", memory_budget=1.0), loss_fn=loss_fn)
    budget = int(fraction * none.stats().peak_resident_bytes)
    plain, _ = train(build, data, 1, loss_fn=loss_fn)
    monkeypatch.setattr("cswap.planner.regions._choose", lambda planning, budget_bytes, trials: regions)
    grads, rt = train(build, data, 1, runtime_for(policy, memory_budget=budget, **link), loss_fn=loss_fn)
    stats = rt.stats()
    assert rt.plan().recompute_regions == tuple(sorted(regions)) and stats.actions["recompute"] > 0
    assert stats.peak_resident_bytes <= stats.budget_bytes == budget
    assert_bit_equal([g for it in plain for g in it], [g for it in grads for g in it], "gradient")


def test_a_region_choice_the_budget_cannot_hold_gives_way_to_the_least_footprint(monkeypatch: pytest.MonkeyPatch) -> None:
    _, none = train(SmallCNN, CNN_BATCHES[:1], 1, runtime_for("none", memory_budget=1.0))
    budget = int(0.7 * none.stats().peak_resident_bytes)
    _, least = train(SmallCNN, CNN_BATCHES, 1, runtime_for("recompute", memory_budget=budget))
    plain, _ = train(SmallCNN, CNN_BATCHES, 1)
    monkeypatch.setattr("cswap.planner.regions._choose", lambda planning, budget_bytes, trials: ())  # keeps everything: too much
    grads, rt = train(SmallCNN, CNN_BATCHES, 1, runtime_for("recompute", memory_budget=budget))
    assert rt.plan().recompute_regions == least.plan().recompute_regions != ()
    assert rt.stats().peak_resident_bytes <= rt.stats().budget_bytes == budget
    assert_bit_equal([g for it in plain for g in it], [g for it in grads for g in it], "gradient")


class ResidualBlock(nn.Module):
    """A residual MLP block whose input is saved only inside it, by the product with a feature mask.

    The mask comes from torch's generator, or with ``host`` from NumPy's, as SpecAugment draws it,
    and the update is then halved now and then by Python's, as a LayerDrop by ``random.random()``
    does: draws torch's checkpoint does not put back for a recomputation."""

    def __init__(self, width: int, host: bool = False) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.host = host

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.host:
            keep = (torch.rand(x.shape[-1]) > 0.2).to(x.dtype)
            return x + self.down(torch.tanh(self.up(x * keep)))
        keep = torch.from_numpy(np.random.rand(x.shape[-1]) > 0.2).to(x.dtype)
        return x + self.down(torch.tanh(self.up(x * keep))) * (1.0 if random.random() > 0.3 else 0.5)


def _residual_mlp(host: bool = False) -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), *(ResidualBlock(32, host) for _ in range(3)), nn.Linear(32, 10))


RESIDUAL_BATCHES = batches(3, (16, 8), 10)
#: CASES and ac-full's, whose profile runs its layers recomputed (guarded) or traced
ALL_RECOMPUTING_CASES = [*CASES, ("ac-full", None, {}), ("ac-full", 0.5, {})]


@pytest.mark.parametrize(("policy", "fraction", "link"), ALL_RECOMPUTING_CASES, ids=[f"{p}-{f}" for p, f, _ in ALL_RECOMPUTING_CASES])
def test_layers_drawing_from_the_host_generators_recompute_the_same_draws(policy: str, fraction: float | None,
                                                                          link: dict[str, Any]) -> None:
    """Every recomputed block draws again what its forward drew, from the generators' states as the
    forward found them (seen in the profile, or by ``ac-full``'s guarded profile), and both
    generators go on after each iteration as plain PyTorch leaves them."""

    def run(runtime: Callable[[nn.Module], Any] | None) -> tuple[list[list[torch.Tensor]], Any, tuple[float, float]]:
        np.random.seed(0)
        random.seed(0)
        grads, rt = train(functools.partial(_residual_mlp, host=True), RESIDUAL_BATCHES, 2, runtime)
        return grads, rt, (np.random.rand(), random.random())

    plain, _, plain_next = run(None)
    options = dict(link, **({"memory_budget": fraction} if fraction is not None else {}))
    try:
        grads, rt, next_draws = run(runtime_for(policy, **options))
    except cswap.BudgetError as error:
        grads, rt, next_draws = run(runtime_for(policy, **{**options, "memory_budget": error.minimum_bytes}))
    assert rt.stats().actions["recompute"] > 0 and rt.plan().recompute_regions
    assert_bit_equal([g for it in plain for g in it], [g for it in grads for g in it], "gradient")
    assert next_draws == plain_next


@pytest.mark.parametrize(("policy", "budget", "link"), [("recompute", "least", {}), ("capuchin", 0.5, CRAWLING_LINK),
                                                        ("cswap", 0.5, {**CRAWLING_LINK, "time_model": CRAWLING_CODEC})])
def test_a_recomputing_plan_holds_its_budget_without_a_swap_it_did_not_plan(policy: str, budget: float | str,
                                                                           link: dict[str, Any]) -> None:
    """The plan leaves room beside its tensors for the regions' inputs it holds for their
    recomputation, and each region rebuilds a storage saved twice in it (``tanh``'s output, which the
    ``Linear`` after it saves too) once: counted at run time as the planner counts them, a run swaps
    nothing at pack nor in backward that its plan did not, down to the least a ``BudgetError``
    states. Counted otherwise, the keeps after the regions' inputs fell back to swaps there (+4 KiB
    over the plan), and every recomputation swapped kept tensors out, synchronously, to make room
    for bytes it never held."""

    if budget == "least":
        with pytest.raises(cswap.BudgetError) as raised:
            train(_residual_mlp, RESIDUAL_BATCHES, 1, runtime_for(policy, memory_budget=1, **link))
        budget = raised.value.minimum_bytes
    _, rt = train(_residual_mlp, RESIDUAL_BATCHES, 2, runtime_for(policy, memory_budget=budget, **link))
    stats = rt.stats()
    assert rt.plan().recompute_regions and stats.actions["recompute"] > 0
    assert (stats.budget_fallbacks, stats.budget_evictions) == (0, 0)
    assert stats.budget_bytes is not None and stats.peak_resident_bytes <= stats.budget_bytes


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


def _blocks_under_a_hook(policy: str | None, fraction: float | None,
                         hook: Callable[[nn.Module, list[float]], Any]) -> tuple[list[torch.Tensor], int, Any]:
    """Three steps of four residual blocks with ``hook(model, seen)`` registered (it returns the
    handle, removed after): the gradients, how many outputs the hook saw, and the runtime (none
    without a ``policy``)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), *[_Block() for _ in range(4)], nn.Linear(64, 2))
    seen: list[float] = []
    handle = hook(model, seen)
    try:
        rt = cswap.Runtime(policy, model=model, min_bytes=0, memory_budget=fraction, **CRAWLING_LINK) if policy else None
        grads = []
        for step in range(3):
            x = torch.randn(32, 8, generator=torch.Generator().manual_seed(step))
            with rt.iteration() if rt is not None else contextlib.nullcontext():
                model(x).square().sum().backward()
            grads += [p.grad.clone() for p in model.parameters()]
            model.zero_grad()
    finally:
        handle.remove()
    return grads, len(seen), rt


@pytest.mark.parametrize(("policy", "fraction"), [("recompute", 0.6), ("ac-full", None), ("capuchin", 0.6), ("cswap", 0.3)])
def test_a_users_forward_hook_runs_once_a_step_as_in_plain_pytorch(policy: str, fraction: float | None) -> None:
    """A hook that collects features (statistics, a feature-matching loss) would run again in
    backward inside a recomputed region: the regions holding its module are left out, and say why."""

    def hook(model: nn.Module, seen: list[float]) -> Any:
        return model[2].act.register_forward_hook(lambda module, args, output: seen.append(float(output.detach().mean())))

    plain, plain_calls, _ = _blocks_under_a_hook(None, None, hook)
    with pytest.warns(UserWarning, match=r"'2' \(a forward hook on '2.act'"):
        grads, calls, rt = _blocks_under_a_hook(policy, fraction, hook)
    assert calls == plain_calls == 3
    assert rt.stats().actions["recompute"] > 0  # the other layers still are
    assert_bit_equal(plain, grads, "gradient")


@pytest.mark.parametrize(("policy", "fraction"), [("recompute", None), ("ac-full", None), ("cswap", 0.3)])
def test_a_forward_hook_for_every_module_runs_once_a_step_as_in_plain_pytorch(policy: str, fraction: float | None) -> None:
    """A hook registered for every module (``register_module_forward_hook``: activation statistics
    over the whole model) would run again for each module recomputed in backward: no region is
    recomputed while it is registered, and the warning names it."""

    def hook(model: nn.Module, seen: list[float]) -> Any:
        def on_gelu(module: nn.Module, args: Any, output: Any) -> None:
            if isinstance(module, nn.GELU):
                seen.append(float(output.detach().mean()))

        return torch.nn.modules.module.register_module_forward_hook(on_gelu)

    plain, plain_calls, _ = _blocks_under_a_hook(None, None, hook)
    with pytest.warns(UserWarning, match=r"a forward hook registered for every module \(.*on_gelu\)"):
        grads, calls, rt = _blocks_under_a_hook(policy, fraction, hook)
    assert calls == plain_calls == 3 * 4
    assert rt.stats().actions["recompute"] == 0
    assert_bit_equal(plain, grads, "gradient")
