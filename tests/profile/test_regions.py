"""Recompute facts: keys, bytes and seconds per region, and the outer pack sequence with regions enabled.

Bytes are hand-computed from the shapes (float32 = 4 bytes); seconds come from a clock that ticks
once per stamp, so a leaf module's call lasts exactly one tick.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from cswap.execute.recompute import RecomputeRegions
from cswap.profile.regions import RegionProfile, nested_pair, profile_regions
from cswap.profile.shapes import SizeMap

B = 3
F32 = 4


class TickClock:
    """One second per stamp."""

    def __init__(self) -> None:
        self.now = 0

    def start(self) -> None:
        self.now = 0

    def stamp(self) -> int:
        self.now += 1
        return self.now

    def synchronize(self) -> None:
        pass

    def seconds(self, stamp: int) -> float:
        return float(stamp)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU()), nn.Linear(8, 2))


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, 2),
    )


MLP_X = torch.randn(B, 4)
CNN_X = torch.randn(2, 3, 8, 8)


def profile_of(model: nn.Module, x: torch.Tensor, clock: Any = None) -> RegionProfile:
    return profile_regions(model, lambda: model(x).sum().backward(), clock=clock)


# The MLP's saves: 0 x; 1 a (input of 1.0), 2 W1.t; 3 b (ReLU result); 4 b, 5 W2.t; 6 c; 7 c, 8 W3.t.
X_BYTES, ACT_BYTES = B * 4 * F32, B * 8 * F32

MLP_FACTS = {
    # path: (keys, freed, input, recompute, forward seconds)
    "": (tuple(range(9)), 3 * ACT_BYTES, X_BYTES, 3 * ACT_BYTES, 15.0),
    "0": ((0,), 0, X_BYTES, 0, 1.0),
    "1": ((1, 2, 3, 4, 5, 6), ACT_BYTES, ACT_BYTES, 2 * ACT_BYTES, 9.0),
    "1.0": ((1, 2), 0, ACT_BYTES, 0, 1.0),
    "1.1": ((3,), -ACT_BYTES, ACT_BYTES, ACT_BYTES, 1.0),  # a ReLU keeps its input, saved by nobody else
    "1.2": ((4, 5), 0, ACT_BYTES, 0, 1.0),
    "1.3": ((6,), -ACT_BYTES, ACT_BYTES, ACT_BYTES, 1.0),
    "2": ((7, 8), 0, ACT_BYTES, 0, 1.0),
}


@pytest.mark.parametrize("path", sorted(MLP_FACTS))
def test_mlp_facts_per_region(path: str) -> None:
    profile = profile_of(mlp(), MLP_X, TickClock())
    facts = profile.regions[path]
    keys, freed, inputs, recompute, seconds = MLP_FACTS[path]
    assert (facts.keys, facts.freed_bytes, facts.input_bytes, facts.recompute_bytes, facts.forward_s) == (keys, freed, inputs, recompute, seconds)
    assert facts.closure_bytes == 0 and facts.calls == 1 and facts.ineligible is None


def test_mlp_profile_totals_and_candidates() -> None:
    profile = profile_of(mlp(), MLP_X)
    assert len(profile.saves) == 9
    assert [s.movable for s in profile.saves] == [True, True, False, True, True, False, True, True, False]
    assert profile.held_bytes() == X_BYTES + 3 * ACT_BYTES
    assert profile.candidates == ("", "0", "1", "1.0", "1.1", "1.2", "1.3", "2")
    # Two lone ReLUs keep their inputs (the outputs of 1.0 and 1.2, saved by nobody else).
    assert profile.freed_bytes(["1.1", "1.3"]) == -2 * ACT_BYTES


# CNN: x 2x3x8x8; activations 2x4x8x8; batch norm's save_mean/save_invstd (4,) each; pool indices int64 2x4x4x4.
ACT, X, STAT, IDX, FLAT = 2 * 4 * 8 * 8 * F32, 2 * 3 * 8 * 8 * F32, 4 * F32, 2 * 4 * 4 * 4 * 8, 2 * 64 * F32
CNN_FACTS = {
    "": (ACT + 2 * STAT + ACT + ACT + IDX + FLAT, X),
    "0": (0, X),
    "1": (2 * STAT, ACT),  # batch norm: frees its statistics; its input stays (checkpoint holds it)
    "2": (-ACT, ACT),  # ReLU alone: its result stays (the next conv saves it) and it keeps its input
    "5": (IDX, ACT),  # max pool: frees its indices; its input is the ReLU result, held anyway
    "7": (0, FLAT),
}


@pytest.mark.parametrize("path", sorted(CNN_FACTS))
def test_cnn_freed_and_input_bytes(path: str) -> None:
    facts = profile_of(cnn(), CNN_X).regions[path]
    assert (facts.freed_bytes, facts.input_bytes) == CNN_FACTS[path]


def test_flatten_saves_nothing_so_is_no_candidate() -> None:
    profile = profile_of(cnn(), CNN_X)
    assert profile.regions["6"].keys == ()
    assert "6" not in profile.candidates


def _observed(model: nn.Module, x: torch.Tensor, enabled: list[str]) -> tuple[list[tuple[tuple[int, ...], str]], int]:
    """Run with ``enabled`` regions under a recording outer hook: the packs' shapes and held bytes."""
    regions = RecomputeRegions(model)
    regions.enable(enabled)
    protected = {StorageWeakRef(t.untyped_storage()).cdata for t in [*model.parameters(), *model.buffers()]}
    seen: list[tuple[tuple[int, ...], str]] = []
    held: dict[int, int] = {}
    refs: list[StorageWeakRef] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        ref = StorageWeakRef(t.untyped_storage())
        refs.append(ref)
        seen.append((tuple(t.shape), str(t.dtype).removeprefix("torch.")))
        if ref.cdata not in protected and not (t.is_leaf and t.requires_grad):
            held[ref.cdata] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum().backward()
    regions.disable_all()
    return seen, sum(held.values())


SEQUENCE_CASES = [
    ("mlp", []), ("mlp", [""]), ("mlp", ["1"]), ("mlp", ["1.1", "1.3"]), ("mlp", ["0", "1.0", "2"]),
    ("cnn", ["1"]), ("cnn", ["0", "2", "5"]), ("cnn", ["1", "3", "7"]), ("cnn", [""]),
]


@pytest.mark.parametrize(("name", "enabled"), SEQUENCE_CASES)
def test_sequence_and_held_bytes_match_a_run_with_regions_enabled(name: str, enabled: list[str]) -> None:
    build, x = (mlp, MLP_X) if name == "mlp" else (cnn, CNN_X)
    profile = profile_of(build(), x)
    predicted = []
    for pack in profile.sequence(enabled):
        if pack.key is not None:
            s = profile.saves[pack.key]
        else:
            (s,) = [i for i in profile.calls[pack.call].inputs if i.name == pack.input]
        predicted.append((s.shape, s.dtype))
    seen, held = _observed(build(), x, enabled)
    assert seen == predicted
    assert held == profile.held_bytes(enabled)


@pytest.mark.parametrize(
    ("enabled", "keys"),
    [([], ()), (["1"], (3, 4)), ([""], (1, 3, 4, 6, 7)), (["1.1"], ()), (["0", "1.0", "2"], ())],
)
def test_freed_keys(enabled: list[str], keys: tuple[int, ...]) -> None:
    profile = profile_of(mlp(), MLP_X)
    assert profile.freed_keys(enabled) == keys
    # Their storages are exactly the freed bytes unless the regions hold new inputs (a lone ReLU).
    freed = {profile.saves[k].storage: profile.saves[k].storage_bytes for k in keys}
    if enabled != ["1.1"]:
        assert sum(freed.values()) == profile.freed_bytes(enabled)


def test_region_inputs_are_mapped_to_their_region_and_position() -> None:
    profile = profile_of(mlp(), MLP_X)
    sequence = profile.sequence(["1"])
    assert [p.key for p in sequence] == [0, None, 7, 8]
    assert (sequence[1].region, sequence[1].input) == ("1", "0")


def test_sequence_refuses_nested_and_unknown_regions() -> None:
    profile = profile_of(mlp(), MLP_X)
    with pytest.raises(ValueError, match=r"'1' and '1\.2' are nested"):
        profile.sequence(["1", "1.2"])
    with pytest.raises(ValueError, match=r"did not run"):
        profile.sequence(["9"])


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return torch.tanh(self.proj(x)) * mask


def test_keyword_inputs_are_counted_as_closure_bytes() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4))
    block = Masked()
    model.append(block)
    mask = torch.ones(B, 4)
    x = torch.randn(B, 4)
    profile = profile_regions(model, lambda: block(model[0](x), mask=mask).sum().backward())
    facts = profile.regions["1"]
    assert (facts.input_bytes, facts.closure_bytes) == (B * 4 * F32, B * 4 * F32)


def test_an_in_place_module_is_ineligible() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 2))
    profile = profile_of(model, MLP_X)
    assert "1" not in profile.candidates
    assert "modifies an input in place" in profile.ineligible["1"]
    regions = RecomputeRegions(model)
    regions.mark_ineligible(profile.ineligible)
    with pytest.raises(ValueError, match=r"cannot be recomputed.*in place"):
        regions.enable(["1"])


class _NoisyFeatures(nn.Module):
    """Masks features with NumPy's global generator or Python's, as SpecAugment and LayerDrop do."""

    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.source == "numpy":
            return x * torch.from_numpy(np.random.rand(x.shape[-1]) > 0.5).to(x.dtype)
        return x * (0.5 if random.random() < 0.5 else 1.0)


@pytest.mark.parametrize("source", ["numpy", "python", "torch only"])
def test_the_profile_tells_whether_the_model_drew_from_the_host_generators(source: str) -> None:
    """Only a model seen drawing from them has its regions read the host generators' states (tens
    of microseconds a call): one that draws from torch's alone costs nothing more."""
    layers: list[nn.Module] = [nn.Linear(4, 8), nn.Tanh()]
    if source != "torch only":
        layers.insert(1, _NoisyFeatures(source))
    profile = profile_of(nn.Sequential(*layers, nn.Dropout(0.5), nn.Linear(8, 2)), MLP_X)
    assert profile.draws_host_random is (source != "torch only")
    assert profile.scaled({}, SizeMap.learn([])).draws_host_random is profile.draws_host_random


class _Scaled(nn.Module):
    """Scales by a tensor it holds in a plain attribute; who changes it, and when, is the case."""

    def __init__(self, case: str) -> None:
        super().__init__()
        self.case = case
        self.factor: torch.Tensor | None = torch.full((8,), 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.factor
        if self.case == "by its call":
            self.factor = y.detach().mean(0)  # the next call starts from what this one left
        return y


class _Caller(nn.Module):
    def __init__(self, case: str) -> None:
        super().__init__()
        self.inner = _Scaled(case)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        if self.inner.case == "by its caller after the call":
            self.inner.factor = None
        return y


@pytest.mark.parametrize("case", ["by its call", "by its caller after the call", "never"])
def test_the_profile_names_the_modules_whose_tensor_attributes_change(case: str) -> None:
    """A recomputation reads a module's plain attributes as they are in backward: the profile names
    the modules whose tensor attributes changed while it ran, so their regions put them back."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), _Caller(case), nn.Tanh(), nn.Linear(8, 2))
    profile = profile_of(model, MLP_X)
    expected = () if case == "never" else ("1.inner",)
    assert profile.keeps_state == expected
    assert profile.scaled({0: (2 * B, 4)}, SizeMap.learn([])).keeps_state == expected


class _Counted(nn.Module):
    """Updates a buffer in place each training call and reads it, as a spectral norm's power iteration does."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.seen.mul_(0.5)
        return x * self.seen


def test_the_profile_names_a_module_whose_forward_updates_a_buffer_but_not_running_statistics() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), _Counted(), nn.BatchNorm1d(8), nn.Linear(8, 2))
    assert profile_of(model, MLP_X).keeps_state == ("1",)


def test_the_regions_holding_a_module_with_a_users_hook_are_left_out() -> None:
    model = mlp()
    model[1][1].register_forward_hook(lambda module, args, output: None)
    profile = profile_of(model, MLP_X)
    for path in ("", "1", "1.1"):
        assert "a forward hook on '1.1' (" in (profile.ineligible.get(path) or ""), path
    assert {"0", "1.0", "1.2", "1.3", "2"} <= set(profile.regions) and not {"0", "1.0", "1.2", "1.3", "2"} & set(profile.ineligible)


def test_profiling_refuses_enabled_regions() -> None:
    model = mlp()
    RecomputeRegions(model).enable(["1"])
    with pytest.raises(ValueError, match=r"region '1' is enabled: profile with nothing enabled"):
        profile_of(model, MLP_X)


def test_a_module_called_twice_sums_its_calls() -> None:
    torch.manual_seed(0)
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.Tanh(), shared)
    profile = profile_regions(model, lambda: model(MLP_X).sum().backward(), clock=TickClock())
    facts = profile.regions["0"]
    assert facts.calls == 2 and facts.forward_s == 2.0
    assert facts.input_bytes == X_BYTES + B * 4 * F32


class _Twice(nn.Module):
    """A block called twice, one call under no_grad, and a residual: regions whose calls differ."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            skip = self.block(x)
        h = self.block(x) + skip
        return self.head(self.block(h) * h)


def _gpt2() -> tuple[nn.Module, Any]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16))
    ids = torch.randint(0, 50257, (2, 8))
    return model, lambda: model(ids, labels=ids).loss.backward()


@pytest.mark.parametrize("name", ["mlp", "cnn", "twice", "gpt2"])
def test_each_regions_freed_bytes_is_the_pack_sequences(name: str) -> None:
    # freed_bytes sizes regions without building the pack sequence: the bytes the sequence holds
    if name == "gpt2":
        model, step = _gpt2()
    else:
        model, x = {"mlp": (mlp(), MLP_X), "cnn": (cnn(), CNN_X), "twice": (_Twice(), torch.randn(B, 8))}[name]
        step = lambda: model(x).sum().backward()  # noqa: E731
    profile = profile_regions(model, step)
    eligible = [path for path, facts in profile.regions.items() if facts.ineligible is None]
    assert len(eligible) >= 3
    held = profile.held_bytes(())
    for path in eligible:
        assert profile.regions[path].freed_bytes == profile.freed_bytes([path]) == held - profile.held_bytes([path]), path
    # and for sets of regions, grown one region at a time as the planner grows them
    chosen: list[str] = []
    for path in eligible:
        if path and nested_pair([*chosen, path]) is None:
            chosen.append(path)
            assert profile.freed_bytes(chosen) == held - profile.held_bytes(chosen), chosen
    assert len(chosen) >= 2


class _Scan(nn.Module):
    """A loop over the sequence saving ``[batch, width]`` products per step (and its weight, a
    parameter), after a batch norm whose statistics are ``[width]`` whatever the length."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(8)
        self.weight = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.transpose(1, 2)).transpose(1, 2)
        state = torch.zeros_like(x[:, 0])
        for step in range(x.shape[1]):
            state = state * torch.sigmoid(x[:, step]) + x[:, step] * self.weight
        return state


@pytest.mark.parametrize("longer", [16, 40])
def test_a_loop_over_the_sequence_counts_its_steps_at_a_longer_length(longer: int) -> None:
    model = nn.Sequential(_Scan())
    profile = profile_regions(model, lambda: model(torch.randn(2, 12, 8)).sum().backward())
    packed = {save.key: save for save in profile.saves}
    grown = {key: (2, 8, longer) for key, save in packed.items() if save.shape == (2, 8, 12)}
    assert grown, "the scan's input was not saved"
    counts = profile.count_growth(grown, SizeMap.learn([((2, 12, 8), (2, longer, 8))]))
    steps = [key for key, save in packed.items() if save.shape == (2, 8)]
    assert len(steps) >= 12 and set(counts) == set(steps)  # the [8] statistics of the norm are no loop
    assert all(count == longer / 12 for count in counts.values())
    scaled = profile.scaled(grown, SizeMap.learn([((2, 12, 8), (2, longer, 8))]), counts)
    by_key = {save.key: save for save in scaled.saves}
    assert all(by_key[key].storage_bytes == math.ceil(packed[key].storage_bytes * longer / 12) for key in steps)
