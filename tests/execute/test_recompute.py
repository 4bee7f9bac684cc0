"""Recompute regions: gradients, parameters and buffers bit-identical to plain PyTorch after SGD steps.

Each case trains a freshly seeded model for a few steps twice, once plainly and once with some
regions recomputed (optionally under an outer ``save_on_cpu`` hook pair), and compares every
step's gradients and the final ``state_dict`` (batch-norm statistics included) with ``torch.equal``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.distributed._composable import checkpoint

from cswap.execute.recompute import RecomputeRegions, running_stat_modules
from cswap.profile.regions import nested_pair

STEPS = 3


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.3)),
            nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2)),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(8 * 4 * 4, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def train(
    build: Callable[[], nn.Module], loss: Callable[[nn.Module], torch.Tensor], enabled: Iterable[str] | None,
    outer: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> tuple[list[list[torch.Tensor]], dict[str, torch.Tensor]]:
    """Gradients per step and the final state of ``STEPS`` SGD steps, with ``enabled`` regions recomputed."""
    torch.manual_seed(0)
    model = build()
    model.train()
    if enabled is not None:
        RecomputeRegions(model).enable(enabled)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    torch.manual_seed(1)
    grads = []
    for _ in range(STEPS):
        with outer():
            loss(model).backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        opt.step()
        opt.zero_grad()
    return grads, {k: v.clone() for k, v in model.state_dict().items()}


def assert_same_training(plain: Any, recomputed: Any) -> None:
    (plain_grads, plain_state), (grads, state) = plain, recomputed
    for step, (expected, actual) in enumerate(zip(plain_grads, grads, strict=True)):
        assert len(expected) == len(actual)
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert torch.equal(e, a), f"step {step}: gradient {i} differs from plain PyTorch"
    assert list(plain_state) == list(state)
    for name in plain_state:
        assert torch.equal(plain_state[name], state[name]), f"{name} differs from plain PyTorch"


OUTERS = {"no outer hooks": nullcontext, "save_on_cpu": torch.autograd.graph.save_on_cpu}

CNN_X = torch.randn(4, 3, 8, 8)
CNN_Y = torch.randint(0, 10, (4,))


def cnn_loss(model: nn.Module) -> torch.Tensor:
    return nn.functional.cross_entropy(model(CNN_X), CNN_Y)


CNN_REGIONS = [
    [""], ["features"], ["features.0"], ["features.0", "features.1"], ["features.0.1"], ["features.0.3", "features.1.1"],
    ["features.1.3", "head"], ["head.1"], ["features.0.0", "features.0.2", "features.1.0"],
]


@pytest.mark.parametrize("outer", sorted(OUTERS))
@pytest.mark.parametrize("enabled", CNN_REGIONS, ids=lambda e: "+".join(p or "<model>" for p in e))
def test_cnn_with_dropout_and_batch_norm_trains_bit_identically(enabled: list[str], outer: str) -> None:
    plain = train(SmallCNN, cnn_loss, None)
    assert_same_training(plain, train(SmallCNN, cnn_loss, enabled, OUTERS[outer]))


def test_without_restoring_the_statistics_batch_norm_would_count_twice() -> None:
    """What the recompute context prevents: torch's checkpoint alone updates running stats again."""
    def bare() -> nn.Module:
        model = SmallCNN()
        checkpoint(model.features[0], preserve_rng_state=True)
        return model

    plain_state = train(SmallCNN, cnn_loss, None)[1]
    bare_state = train(bare, cnn_loss, None)[1]
    assert not torch.equal(plain_state["features.0.1.running_mean"], bare_state["features.0.1.running_mean"])
    assert int(bare_state["features.0.1.num_batches_tracked"]) == 2 * STEPS


# ---------------------------------------------------------------------------------------------- HF


def gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    return transformers.GPT2LMHeadModel(config)


def bert() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100)
    return transformers.BertForMaskedLM(config)


IDS = torch.randint(0, 100, (2, 12))
MASK = torch.ones(2, 12, dtype=torch.long)
MASK[1, 8:] = 0


def hf_loss(model: nn.Module) -> torch.Tensor:
    # No KV cache: recomputing a block runs its forward again with the same cache object, which
    # would append the keys twice (as for HF's own gradient checkpointing, training uses no cache).
    return model(IDS, attention_mask=MASK, labels=IDS, use_cache=False).loss


HF_REGIONS = {
    "gpt2": [["transformer.h.0"], ["transformer.h.0", "transformer.h.1"], ["transformer.h.1.attn", "transformer.h.0.mlp"],
             ["transformer.h.0.ln_1", "transformer.h.1.mlp.act"], ["transformer"]],
    "bert": [["bert.encoder.layer.0"], ["bert.encoder.layer.1.attention", "bert.encoder.layer.0.output"],
             ["bert.embeddings"], ["bert.encoder"], ["bert.encoder.layer.0.intermediate", "cls"]],
}
HF_CASES = [(name, enabled, outer) for name, sets in HF_REGIONS.items() for enabled in sets for outer in sorted(OUTERS)]


@pytest.mark.parametrize(("name", "enabled", "outer"), HF_CASES, ids=lambda v: "+".join(v) if isinstance(v, list) else v)
def test_hf_models_with_dropout_and_masks_train_bit_identically(name: str, enabled: list[str], outer: str) -> None:
    build = gpt2 if name == "gpt2" else bert
    model = build()
    assert model.config.hidden_dropout_prob if name == "bert" else model.config.resid_pdrop  # dropout is on
    plain = train(build, hf_loss, None)
    assert_same_training(plain, train(build, hf_loss, enabled, OUTERS[outer]))


# ------------------------------------------------------------------------------------- the controls


def test_enable_refuses_a_module_with_its_ancestor() -> None:
    regions = RecomputeRegions(SmallCNN())
    with pytest.raises(ValueError, match=r"'features\.0' and 'features\.0\.1' are nested"):
        regions.enable(["features.0.1", "features.0"])
    with pytest.raises(ValueError, match=r"'' and 'head' are nested"):
        regions.enable(["", "head"])
    assert regions.enabled == ()


def test_enable_refuses_unknown_paths() -> None:
    with pytest.raises(ValueError, match=r"unknown recompute regions \['nope'\]"):
        RecomputeRegions(SmallCNN()).enable(["nope"])


def test_enable_replaces_the_previous_set_and_disable_all_clears_it() -> None:
    regions = RecomputeRegions(SmallCNN())
    regions.enable(["head", "features.0"])
    assert regions.enabled == ("features.0", "head")
    regions.enable(["features.1"])
    assert regions.enabled == ("features.1",)
    regions.disable_all()
    assert regions.enabled == ()


def test_attaching_keeps_names_and_a_disabled_model_trains_as_before() -> None:
    model = SmallCNN()
    names = list(model.state_dict())
    regions = RecomputeRegions(model)
    assert list(model.state_dict()) == names
    assert regions.paths[:3] == ("", "features", "features.0")
    assert_same_training(train(SmallCNN, cnn_loss, None), train(SmallCNN, cnn_loss, []))


def test_enable_again_keeps_the_set_and_checks_it_after_a_refusal() -> None:
    regions = RecomputeRegions(SmallCNN())
    regions.enable(["head", "features.0"])
    regions.enable(["features.0", "head"])  # the plan's set, asked for again each iteration
    assert regions.enabled == ("features.0", "head")
    regions.mark_ineligible({"head": "refused by torch"})
    with pytest.raises(ValueError, match=r"cannot be recomputed: \{'head': 'refused by torch'\}"):
        regions.enable(["features.0", "head"])


def _nested_by_every_pair(paths: list[str]) -> bool:
    return any(outer != inner and (outer == "" or inner.startswith(outer + ".")) for outer in paths for inner in paths)


@pytest.mark.parametrize("paths", [
    ["a", "ab", "a.b"], ["a.b", "a.c"], ["", "x"], [""], [], ["a-b", "a", "a.0"], ["a-b.0", "a"], ["h.1", "h.10", "h.1.attn"],
    ["h.1", "h.10", "h.11.mlp"], ["enc.layer.0.attention.self", "enc.layer.0.attention"], ["b.0", "b.0"],
])
def test_nested_pair_finds_an_ancestor_exactly_when_one_is_there(paths: list[str]) -> None:
    pair = nested_pair(paths)
    assert (pair is not None) == _nested_by_every_pair(paths)
    if pair is not None:
        outer, inner = pair
        assert outer in paths and inner in paths and (outer == "" or inner.startswith(outer + "."))


def test_helpers() -> None:
    assert nested_pair(["a", "ab", "a.b"]) == ("a", "a.b")
    assert nested_pair(["a.b", "a.c"]) is None
    assert len(running_stat_modules(SmallCNN())) == 2
    assert running_stat_modules(nn.BatchNorm1d(3, track_running_stats=False)) == []


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(x) + mask)  # the add saves nothing: torch never checks the mask


def test_a_keyword_input_modified_after_the_forward_is_refused() -> None:
    def run(recompute: bool) -> torch.Tensor:
        torch.manual_seed(0)
        block = Masked()
        if recompute:
            RecomputeRegions(block).enable([""])
        x = torch.randn(3, 4, requires_grad=True)
        mask = torch.zeros(3, 4)
        y = block(x, mask=mask)
        mask.add_(5.0)
        y.sum().backward()
        return x.grad

    assert run(False) is not None  # plain PyTorch does not need the mask in backward
    with pytest.raises(RuntimeError, match=r"recompute region '': its input keyword argument 'mask' was modified in place"):
        run(True)


def test_torch_refuses_a_positional_input_modified_after_the_forward() -> None:
    block = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    RecomputeRegions(block).enable([""])
    h = torch.randn(3, 4, requires_grad=True) * 1.0
    y = block(h)
    h.add_(1.0)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation"):
        (y * 2).sum().backward()


def test_torch_refuses_an_in_place_region_in_backward() -> None:
    """Why profiles mark such regions ineligible: ReLU(inplace=True) bumps the saved input's version."""
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 2))
    RecomputeRegions(model).enable(["1"])
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation"):
        model(torch.randn(3, 4)).sum().backward()


def test_a_module_called_twice_recomputes_each_call() -> None:
    def build() -> nn.Module:
        shared = nn.Linear(6, 6)
        return nn.Sequential(shared, nn.Dropout(0.5), nn.Tanh(), shared)

    x = torch.randn(5, 6)

    def loss(model: nn.Module) -> torch.Tensor:
        return model(x).square().sum()

    assert_same_training(train(build, loss, None), train(build, loss, ["0"]))


def test_a_second_backward_through_an_enabled_region_fails_in_torch() -> None:
    """torch 2.13's composable checkpoint cannot re-enter its recompute context (documented limit)."""
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    RecomputeRegions(model).enable(["1"])
    y = model(torch.randn(3, 4)).sum()
    y.backward(retain_graph=True)
    with pytest.raises(AttributeError):
        y.backward()


# ------------------------------------------------------------------ under cswap's own outer hooks


@pytest.mark.parametrize("policy", ["swap", "compress-swap"])
@pytest.mark.parametrize("enabled", [["features.0"], ["features.0.1", "features.1.2"], [""]], ids=lambda e: "+".join(p or "<model>" for p in e))
def test_regions_under_the_runtime_train_bit_identically(enabled: list[str], policy: str) -> None:
    """The runtime's hooks stay outermost: they store the inputs checkpoint saves (and may swap them)."""
    import cswap

    runtime = cswap.Runtime(policy=policy, min_bytes=0, d2h_gbps=10.0, h2d_gbps=10.0)
    plain = train(SmallCNN, cnn_loss, None)
    assert_same_training(plain, train(SmallCNN, cnn_loss, enabled, runtime.iteration))
    assert runtime.stats().offloaded_bytes > 0


def test_a_block_with_an_interior_in_place_relu_trains_bit_identically() -> None:
    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(6, 8), nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Dropout(0.3), nn.Linear(8, 8)), nn.Linear(8, 2))

    x = torch.randn(5, 6)

    def loss(model: nn.Module) -> torch.Tensor:
        return model(x).square().sum()

    assert_same_training(train(build, loss, None), train(build, loss, ["1"]))


def test_a_second_set_of_regions_on_one_model_is_refused() -> None:
    model = SmallCNN()
    RecomputeRegions(model)
    with pytest.raises(ValueError, match=r"module '' already has torch's composable checkpoint.*one RecomputeRegions per model"):
        RecomputeRegions(model)


def test_regions_under_cpu_autocast_train_bit_identically() -> None:
    """Checkpoint records the autocast state at the region's entry and recomputes under it."""
    def autocast() -> AbstractContextManager[Any]:
        return torch.autocast("cpu", dtype=torch.bfloat16)

    plain = train(SmallCNN, cnn_loss, None, autocast)
    assert_same_training(plain, train(SmallCNN, cnn_loss, ["features.0", "head"], autocast))


def test_enabled_regions_are_inert_without_grad() -> None:
    torch.manual_seed(0)
    model = SmallCNN().eval()
    expected = model(CNN_X)
    RecomputeRegions(model).enable(["features.0", "head"])
    with torch.no_grad():
        assert torch.equal(model(CNN_X), expected)


class _Rebuilt:
    """A :class:`~cswap.execute.recompute.RecomputeListener` that keeps a weak reference to each storage it is told of."""

    def __init__(self) -> None:
        self.told: list[tuple[tuple[int, ...], StorageWeakRef]] = []

    def rebuilt(self, tensor: torch.Tensor) -> None:
        self.told.append((tuple(tensor.shape), StorageWeakRef(tensor.untyped_storage())))


class _TakesItsInputAnyhow(nn.Module):
    """Linear and Tanh, its input given positionally, by keyword, or inside a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 6)
        self.tanh = nn.Tanh()

    def forward(self, x: torch.Tensor | None = None, pair: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        return self.tanh(self.linear(x if pair is None else pair[0]))


CALLS = {
    "positional": lambda model, x: model(x),
    "keyword": lambda model, x: model(x=x),
    "in a tuple": lambda model, x: model(None, (x,)),
}


@pytest.mark.parametrize("call", CALLS)
def test_the_listener_is_told_of_what_a_recomputation_saves_except_the_calls_inputs(call: str) -> None:
    torch.manual_seed(0)
    model = _TakesItsInputAnyhow()
    regions = RecomputeRegions(model)
    listener = _Rebuilt()
    regions.listener = listener
    regions.enable([""])
    x = torch.randn(4, 8, requires_grad=True)
    CALLS[call](model, x).sum().backward()
    regions.disable_all()
    # Linear saves its input (the call's input: not told) and its weight; Tanh saves its output
    weight = StorageWeakRef(model.linear.weight.untyped_storage())
    assert sorted(shape for shape, _ in listener.told) == [(4, 6), (8, 6)]
    assert [ref for shape, ref in listener.told if shape == (8, 6)] == [weight]
    assert all(ref != StorageWeakRef(x.untyped_storage()) for _, ref in listener.told)
    # torch dropped the rebuilt output once its node had used it
    assert [ref.expired() for shape, ref in listener.told if shape == (4, 6)] == [True]


class _RecomputingToo(_Rebuilt):
    """A listener that is also told when each recomputation begins: it logs both, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []

    def recomputing(self, path: str) -> None:
        self.log.append(f"begins {path}")

    def rebuilt(self, tensor: torch.Tensor) -> None:
        super().rebuilt(tensor)
        self.log.append(f"rebuilt {tuple(tensor.shape)}")


def test_a_listener_is_told_of_each_recomputation_before_it_saves_anything() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(_TakesItsInputAnyhow(), _TakesItsInputAnyhow().requires_grad_(False))
    model[1].linear = nn.Linear(6, 6)
    regions = RecomputeRegions(model)
    listener = _RecomputingToo()
    regions.listener = listener
    regions.enable(["0", "1"])
    model(torch.randn(4, 8, requires_grad=True)).sum().backward()
    regions.disable_all()
    # backward recomputes the second region first; each region's weight and Tanh output after it begins
    assert listener.log[0] == "begins 1" and listener.log.index("begins 0") == 3, listener.log
    assert sorted(listener.log[1:3]) == ["rebuilt (4, 6)", "rebuilt (6, 6)"]
    assert sorted(listener.log[4:]) == ["rebuilt (4, 6)", "rebuilt (8, 6)"]  # the weight, transposed


class TiedLanguageModel(nn.Module):
    """Embeddings, a body, and a head whose weight is the embeddings' (as HF language models tie them)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.body = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Sequential(nn.Tanh(), nn.Linear(8, 16, bias=False))
        self.head[1].weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(ids)))


@pytest.mark.parametrize("region", ["head", "body"])
def test_rebuilt_tensors_are_freed_before_backward_reaches_a_tied_weights_other_use(region: str) -> None:
    # the head's weight is the embeddings': its gradient exists only at the very end, but what the
    # region rebuilt is freed as soon as its own nodes have run
    torch.manual_seed(0)
    model = TiedLanguageModel()
    regions = RecomputeRegions(model)
    listener = _Rebuilt()
    regions.listener = listener
    regions.enable([region])
    embedded = model.embed(torch.tensor([[1, 2, 3]]))
    alive_then: list[bool] = []
    weights = [StorageWeakRef(p.untyped_storage()) for p in model.parameters()]
    embedded.register_hook(lambda grad: alive_then.extend(not ref.expired() for _, ref in listener.told if ref not in weights))
    model.head(model.body(embedded * 2)).sum().backward()
    regions.disable_all()
    assert listener.told and alive_then and not any(alive_then)


class _Recurrence(nn.Module):
    """Keeps its last output in a plain attribute and starts its next call from it, as
    RecurrentGemma's RG-LRU does (its caller resets it to ``None`` before each sequence)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((4,), 0.5))
        self.state: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = torch.zeros_like(x) if self.state is None else self.state
        y = torch.tanh(x * self.scale + start)
        self.state = y
        return y


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.rec = _Recurrence()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rec.state = None  # a new sequence
        return self.rec(self.proj(x)) + x


def _stateful_model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), _Block(), nn.Linear(4, 2))


def _stateful_run(build: Callable[[], nn.Module], enabled: list[str] | None, replay: list[str], guard: bool = False,
                  ) -> tuple[list[torch.Tensor], nn.Module, RecomputeRegions]:
    """Every step's gradients of ``build``'s model with ``enabled`` recomputed, the state of the
    modules at ``replay`` put back for each recomputation; the model and its regions."""
    torch.manual_seed(0)
    model = build()
    regions = RecomputeRegions(model)
    regions.replay_module_state(replay)
    if enabled is not None:
        regions.enable(enabled)
    regions.guard(guard)
    grads = []
    for step in range(STEPS):
        model(torch.randn(3, 4, generator=torch.Generator().manual_seed(step))).square().sum().backward()
        grads += [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
    regions.guard(False)
    return grads, model, regions


def _stateful_grads(enabled: list[str] | None, replay: bool = True, guard: bool = False) -> tuple[list[torch.Tensor], tuple[str, ...]]:
    grads, _, regions = _stateful_run(_stateful_model, enabled, ["1.rec"] if replay else [], guard)
    return grads, regions.keeps_state


@pytest.mark.parametrize("enabled", [["1.rec"], ["1"], [""], ["1.proj", "1.rec"]])
def test_a_module_keeping_state_between_calls_recomputes_from_the_state_its_forward_saw(enabled: list[str]) -> None:
    plain, _ = _stateful_grads(None)
    grads, kept = _stateful_grads(enabled)
    assert kept == ("1.rec",)
    assert all(torch.equal(a, b) for a, b in zip(plain, grads, strict=True))


def test_without_putting_the_state_back_the_recomputation_gives_other_gradients() -> None:
    plain, _ = _stateful_grads(None)
    grads, kept = _stateful_grads(["1.rec"], replay=False)
    assert kept == ()
    assert not all(torch.equal(a, b) for a, b in zip(plain, grads, strict=True))


def test_a_guarded_call_that_changes_a_modules_state_puts_it_back_from_then_on() -> None:
    plain, _ = _stateful_grads(None)
    grads, kept = _stateful_grads(["1"], replay=False, guard=True)
    assert kept == ("1.rec",)  # the block's own attributes did not change: only the recurrence's
    assert all(torch.equal(a, b) for a, b in zip(plain, grads, strict=True))


class _PowerIteration(nn.Module):
    """Updates a buffer in place each training forward and scales by it, as a spectral norm's power iteration does."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("u", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.u.copy_(torch.nn.functional.normalize(self.linear.weight @ self.u, dim=0))
        return torch.tanh(self.linear(x) * self.u)


@pytest.mark.parametrize("replay", [True, False])
def test_a_buffer_its_forward_updates_is_put_back_for_the_recomputation(replay: bool) -> None:
    def run(enabled: list[str] | None) -> tuple[list[torch.Tensor], torch.Tensor]:
        grads, model, _ = _stateful_run(lambda: nn.Sequential(nn.Linear(4, 4), _PowerIteration(), nn.Linear(4, 2)), enabled,
                                        ["1"] if replay else [])
        return grads, model[1].u.clone()

    (plain, plain_u), (grads, u) = run(None), run(["1"])
    same = all(torch.equal(a, b) for a, b in zip(plain, grads, strict=True)) and torch.equal(plain_u, u)
    assert same is replay  # without it the recomputation iterates once more and scales by another vector
