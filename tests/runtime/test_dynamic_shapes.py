"""Shapes that change every step, as transformers and CNNs are trained: batches padded to their
longest sequence, bucketed lengths, micro-batches of different lengths, images at several
resolutions and a last partial batch. One plan serves every size up to the one it was made for, a
larger size of a profiled graph is planned from its profile (not profiled), the budget holds on
every iteration, a fractional budget's bytes never go down, and gradients stay bit-identical to
plain PyTorch."""

from __future__ import annotations

import itertools
import logging
import random
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import cswap
from tests.runtime.helpers import assert_bit_equal, causal_lm_steps

transformers = pytest.importorskip("transformers")

STEPS = 24


def gpt2() -> nn.Module:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=256, n_positions=128, n_embd=64, n_layer=2, n_head=2))


def llama() -> nn.Module:
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(config)


MODELS = {"gpt2": gpt2, "llama": llama}


def padded_batch(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask of sequences of ``lengths``, right-padded to the longest (what
    ``DataCollatorWithPadding`` gives)."""
    g = torch.Generator().manual_seed(seed)
    longest = max(lengths)
    ids = torch.randint(1, 256, (len(lengths), longest), generator=g)
    mask = torch.zeros(len(lengths), longest, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    return ids.masked_fill(mask == 0, 0), mask


def random_lengths(steps: int, batch: int = 4, low: int = 20, high: int = 120, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(low, high) for _ in range(batch)] for _ in range(steps)]


def lm_run(build, steps: list[list[list[int]]], runtime: cswap.Runtime | None = None, make=None, after_step=None,
           autocast: torch.dtype | None = None):
    """Train a causal LM, one list of micro-batches (each a list of lengths) per step; returns every
    step's gradients and, with a runtime, per step its peak, the budget in force and the profiles so
    far. ``after_step(rt)`` runs after each step; ``autocast``: the forward runs under CPU autocast
    to that dtype."""
    torch.manual_seed(0)
    model = build()
    model.train()
    rt = make(model) if make is not None else runtime
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    grads, seen = [], []
    for i, micro_batches in enumerate(steps):
        with torch.random.fork_rng():
            torch.manual_seed(i)
            ctx = rt.iteration() if rt is not None else _nothing()
            with ctx:
                for j, lengths in enumerate(micro_batches):
                    ids, mask = padded_batch(lengths, seed=100 * i + j)
                    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
                    (loss / len(micro_batches)).backward()
        grads.append([p.grad.detach().clone() for p in model.parameters() if p.grad is not None])
        optimizer.step()
        optimizer.zero_grad()
        if rt is not None:
            stats = rt.stats()
            seen.append((stats.iteration_peak_resident_bytes, stats.budget_bytes, stats.profiled_iterations))
            if after_step is not None:
                after_step(rt)
    return grads, seen, rt


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _flat(grads: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    return [g for step in grads for g in step]


def _check(seen: list[tuple[int, int | None, int]], max_profiles: int) -> None:
    budgets = [budget for _, budget, _ in seen]
    assert all(b is not None for b in budgets)
    for i, (peak, budget, _) in enumerate(seen):
        assert peak <= budget, f"step {i}: peak {peak:,d} B over the budget in force {budget:,d} B"
    assert all(a <= b for a, b in itertools.pairwise(budgets)), f"the budget's bytes went down: {budgets}"
    assert seen[-1][2] <= max_profiles, f"{seen[-1][2]} profiling iterations"


@pytest.fixture(scope="module")
def plain_padded() -> dict[str, list[list[torch.Tensor]]]:
    steps = [[lengths] for lengths in random_lengths(STEPS)]
    return {name: lm_run(build, steps)[0] for name, build in MODELS.items()}


@pytest.mark.parametrize("policy", ["cswap", "swap"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_padded_to_the_longest_at_a_fraction(name: str, policy: str, plain_padded, caplog: pytest.LogCaptureFixture) -> None:
    """Default options, budget 0.6 of none's peak: at most 3 profiles in 24 steps of random lengths,
    the fraction's bytes never go down and each rise is logged, every step within the cap."""
    steps = [[lengths] for lengths in random_lengths(STEPS)]
    with caplog.at_level(logging.INFO, logger="cswap.runtime"):
        grads, seen, rt = lm_run(MODELS[name], steps, make=lambda m: cswap.Runtime(policy, model=m, device="cpu", memory_budget=0.6))
    _check(seen, max_profiles=3)
    stats = rt.stats()
    assert stats.unprofiled_plans >= 1 and stats.structures <= 2, stats
    assert 0 < stats.planning_s < stats.iteration_s
    rises = [r.getMessage() for r in caplog.records if "rose from" in r.getMessage()]
    distinct = sorted({budget for _, budget, _ in seen})
    assert len(rises) == len(distinct) - 1, (rises, distinct)
    assert all("grew from" in r or "largest saved tensor" in r for r in rises)
    assert_bit_equal(_flat(plain_padded[name]), _flat(grads), "gradient")


@pytest.mark.parametrize(("policy", "fraction"), [("cswap", 0.5), ("swap", 0.5), ("recompute", 0.7)])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_micro_batches_of_different_lengths_under_one_cap_in_bytes(name: str, policy: str, fraction: float) -> None:
    """Accumulation 2, each micro-batch padded to its own longest: a budget in bytes (``fraction``
    of none's peak at the longest length) is one cap. recompute, which has no action of its own to
    fall back to at pack, holds it too at a length longer than any planned for, before a plan is made
    for it: it swaps what would pass the cap, and makes room before each region rebuilds."""
    lengths = random_lengths(2 * 12, seed=3)
    steps = [[lengths[2 * i], lengths[2 * i + 1]] for i in range(12)]
    plain, _, _ = lm_run(MODELS[name], steps)
    longest = [[[120] * 4]]  # none's peak at the longest length the data can have
    probe = lm_run(MODELS[name], longest, make=lambda m: cswap.Runtime("none", model=m, device="cpu", memory_budget=1.0))[2]
    cap = int(probe.stats().budget_bytes * fraction)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grads, seen, rt = lm_run(MODELS[name], steps, make=lambda m: cswap.Runtime(policy, model=m, device="cpu", memory_budget=cap,
                                                                                    disable_kv_cache=True))
    if policy == "recompute":
        assert rt.stats().actions["recompute"] > 0
        held = [str(w.message) for w in caught if "to hold the memory budget" in str(w.message)]
        assert len(held) == 1 and held[0].startswith("policy recompute swapped") and "longer sequence" in held[0], held
    _check(seen, max_profiles=3)
    assert {budget for _, budget, _ in seen} == {cap}
    assert_bit_equal(_flat(plain), _flat(grads), "gradient")


@pytest.mark.parametrize("policy", ["swap", "compress-swap", "cswap", "recompute"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_profile_plans_for_its_longest_micro_batch(name: str, policy: str) -> None:
    """Accumulation 2 whose profiled step's second micro-batch is the longer (40 then 96 tokens):
    the plan is made for 96 and 0.5 of none's peak resolves against it, to the very bytes of a run
    whose first micro-batch was the 96-token one; later steps at 96 follow that plan without
    outgrowing it or planning again, within the budget, with plain PyTorch's gradients."""
    rows = 4
    steps = [[[40] * rows, [96] * rows], [[96] * rows, [30] * rows], [[64] * rows, [96] * rows]]
    def make(model: nn.Module) -> cswap.Runtime:
        return cswap.Runtime(policy, model=model, device="cpu", memory_budget=0.5, disable_kv_cache=True)
    plain = lm_run(MODELS[name], steps)[0]
    grads, seen, rt = lm_run(MODELS[name], steps, make=make)
    longest_first = lm_run(MODELS[name], [list(reversed(steps[0]))], make=make)[1]
    assert seen[0][1] == longest_first[0][1], "the fraction did not resolve against the longest micro-batch's peak"
    stats = rt.stats()
    assert (stats.profiled_iterations, stats.unprofiled_plans, stats.outgrown_tensors) == (1, 0, 0), stats
    _check(seen, max_profiles=1)
    assert_bit_equal(_flat(plain), _flat(grads), "gradient")


@pytest.mark.parametrize("policy", ["none", "swap", "compress-keep", "cswap", "recompute"])
def test_a_micro_batch_without_padding_beside_a_padded_one_meets_all_of_nones_peak(policy: str) -> None:
    """Accumulation 2, one micro-batch with no padding (Llama then skips its attention mask: another
    graph) beside a padded one, in either order: ``memory_budget=1.0``, what plain PyTorch holds,
    is met. The profile records its first micro-batch and the fraction resolves against that graph;
    what the other held is that graph's, profiled where it comes first. Counted in the profile's
    peak, it was refused at the first step (2.97 MB needed where 2.71 MB resolved: 1.10 of none's peak). Once both graphs
    are profiled the cap is their larger none peak, which every step was within."""
    unpadded, padded = [64] * 4, [64, 40, 64, 64]
    steps = [[unpadded, padded], [padded, unpadded]] * 3
    plain = lm_run(llama, steps)[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grads, seen, rt = lm_run(llama, steps, make=lambda m: cswap.Runtime(policy, model=m, device="cpu", memory_budget=1.0,
                                                                           disable_kv_cache=True))
    held = [str(w.message) for w in caught if "to hold the memory budget" in str(w.message)]
    assert all("a micro-batch of another graph" in message for message in held), held
    stats = rt.stats()
    assert stats.structures == 2, stats
    budgets = [budget for _, budget, _ in seen]
    assert all(a <= b for a, b in itertools.pairwise(budgets)), budgets
    assert max(peak for peak, _, _ in seen) <= budgets[-1], (seen, budgets[-1])
    assert_bit_equal(_flat(plain), _flat(grads), "gradient")


@pytest.mark.parametrize("policy", ["cswap", "swap"])
def test_micro_batches_of_two_graphs_in_one_step_profile_each_graph_once(policy: str) -> None:
    """Accumulation 2 where either micro-batch may have no padding (Llama's other graph), in any
    order: each graph is profiled once, where it comes first in a step, and a step that mixes them
    after profiles nothing: each micro-batch follows its own graph's plan from the pack where the
    graphs part (by the first's, 20 to 40 packs a step were decided by the policy's default). The
    other graph's packs never count as sizes of the first's (which made its plan again for a length
    no batch had, and raised the budget's bytes by a quarter). Every step holds the budget,
    bit-identical to plain."""
    unpadded, padded = [48] * 4, [48, 30, 48, 48]
    steps = [[unpadded, padded], [padded, padded], [padded, unpadded], [unpadded, padded], [padded, unpadded],
             [padded, padded], [unpadded, unpadded], [padded, unpadded], [unpadded, padded], [padded, unpadded]]
    plain = lm_run(llama, steps)[0]
    unknown: list[int] = []
    grads, seen, rt = lm_run(llama, steps, make=lambda m: cswap.Runtime(policy, model=m, device="cpu", memory_budget=0.5,
                                                                       disable_kv_cache=True),
                             after_step=lambda rt: unknown.append(rt.stats().unknown_keys))
    stats = rt.stats()
    assert (stats.profiled_iterations, stats.structures) == (2, 2), [profiles for _, _, profiles in seen]
    assert len(set(unknown[2:])) == 1, f"packs no plan knew, by step: {unknown}"
    assert len({budget for _, budget, _ in seen[2:]}) == 1, seen  # both graphs profiled: the cap stays
    _check(seen, max_profiles=2)
    assert_bit_equal(_flat(plain), _flat(grads), "gradient")


def _mamba() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reference scan without mamba_ssm's kernels
        return transformers.MambaForCausalLM(transformers.MambaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2))


def test_a_graph_planned_within_a_larger_ones_cap_is_a_fraction_of_that_graphs_peak() -> None:
    """Mamba's reference scan (config defaults, two layers) saves one slice per token, so each length
    is another graph. A shorter one, profiled after a longer one set the cap, is planned within that
    cap, and :attr:`Runtime.resolved_budget` says the cap is 0.5 of the longer graph's ``none``
    peak, as it was resolved: it paired the cap with the shorter graph's peak, 0.989 of it."""
    torch.manual_seed(0)
    model = _mamba()
    rt = cswap.Runtime("swap", model=model, device="cpu", memory_budget=0.5)
    resolved = []
    for step, length in enumerate([48, 24, 24]):
        ids = torch.randint(3, 250, (2, length), generator=torch.Generator().manual_seed(step))
        with rt.iteration():
            model(input_ids=ids, labels=ids).loss.backward()
        resolved.append(rt.resolved_budget)
    assert rt.stats().structures == 2, rt.stats()
    first, last = resolved[0], resolved[-1]
    assert first is not None and last is not None and first.nbytes == last.nbytes == rt.stats().budget_bytes
    assert last.none_peak_bytes == first.none_peak_bytes and last.fraction_of_none == pytest.approx(0.5, abs=1e-6), last
    assert "0.5 of policy none's activation peak" in str(last) and last.given.fraction == 0.5


def test_a_loop_over_the_sequence_inside_a_region_is_planned_for_its_steps_at_a_longer_length() -> None:
    """Mamba's reference scan saves a few tensors of one shape per token, inside the mixer that
    ``recompute`` rebuilds in backward, so the boundary of the region is the same graph at every
    length. Planned for 40 tokens from the 24-token profile, the loop's tensors count 40/24 as many:
    the steps at 40 tokens hold the budget in force with nothing profiled again (counted at the
    profile's number, they passed it by 9%, and profiled again). The first 40-token step outgrows
    the 24-token plan, as any longer step does (a warning says so)."""
    lengths = [24, 40, 40, 40]

    def run(policy: str | None) -> tuple[list[list[torch.Tensor]], list[tuple[int, int | None]], cswap.Runtime | None]:
        torch.manual_seed(0)
        model = _mamba()
        rt = cswap.Runtime(policy, model=model, device="cpu", memory_budget=0.5) if policy else None
        grads, seen = [], []
        for step, length in enumerate(lengths):
            ids = torch.randint(3, 250, (2, length), generator=torch.Generator().manual_seed(step))
            in_force = rt.stats().budget_bytes if rt is not None else None
            with rt.iteration() if rt is not None else _nothing():
                model(input_ids=ids, labels=ids).loss.backward()
            grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
            model.zero_grad(set_to_none=True)
            if rt is not None:
                seen.append((rt.stats().iteration_peak_resident_bytes, in_force))
        return grads, seen, rt

    plain = run(None)[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grads, seen, rt = run("recompute")
    assert rt is not None and rt.stats().profiled_iterations == 1
    assert rt.plan().recompute_regions, rt.plan()
    for step, (peak, in_force) in enumerate(seen[2:], start=2):
        assert peak <= in_force, f"step {step}: {peak:,d} B past the budget in force, {in_force:,d} B"
    assert not [w for w in caught if "passed the memory budget in this iteration" in str(w.message)]
    assert_bit_equal(_flat(plain), _flat(grads), "gradient")


@pytest.mark.parametrize("policy", ["recompute", "compress-keep"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_budget_met_at_short_lengths_holds_past_the_policys_least_at_longer_ones(name: str, policy: str) -> None:
    """A cap in bytes (half of none's peak at the longest length) that the policy meets on short
    batches and cannot at the longest: training goes on where the plans met it before. Each longer
    graph is planned at the policy's least and holds the cap by swapping what would pass it, at
    pack and in backward (compress-keep's compressed copies too); one warning says so, and the plan
    says why. Gradients stay bit-identical."""
    short = [[lengths] for lengths in random_lengths(3, low=20, high=40, seed=5)]
    steps = [*short, [[120] * 4], [[70, 90, 110, 30]], [[120, 20, 60, 100]]]
    plain, _, _ = lm_run(MODELS[name], steps)
    probe = lm_run(MODELS[name], [[[120] * 4]], make=lambda m: cswap.Runtime("none", model=m, device="cpu", memory_budget=1.0))[2]
    cap = probe.stats().budget_bytes // 2
    plans = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grads, seen, rt = lm_run(MODELS[name], steps, make=lambda m: cswap.Runtime(policy, model=m, device="cpu", memory_budget=cap),
                                 after_step=lambda rt: plans.append(rt.plan()))
    _check(seen, max_profiles=2)
    past = [plan.planner["past_least"] for plan in plans if "past_least" in plan.planner]
    assert past and all(f"over the budget of {cap:,d} B it met before" in note for note in past), past
    assert "past_least" not in plans[0].planner
    held = [str(w.message) for w in caught if "to hold the memory budget" in str(w.message)]
    assert len(held) == 1 and held[0].startswith(f"policy {policy} swapped"), held
    assert rt.stats().budget_fallbacks + rt.stats().budget_evictions > 0
    assert_bit_equal(_flat(plain), _flat(grads), "gradient")


def test_under_a_host_budget_a_budget_past_the_least_is_refused() -> None:
    """With a host budget too, what a plan past its least lacks would be swapped past the host budget
    at every step: the run stops with the least instead (:class:`cswap.BudgetError`), as a policy
    that never met its budget does, and no step before passes the device cap."""
    short = [[lengths] for lengths in random_lengths(3, low=20, high=40, seed=5)]
    steps = [*short, [[120] * 4], [[70, 90, 110, 30]], [[120, 20, 60, 100]], [[80, 70, 60, 50]]]
    probe = lm_run(gpt2, [[[120] * 4]], make=lambda m: cswap.Runtime("none", model=m, device="cpu", memory_budget=1.0))[2]
    none_peak = probe.stats().budget_bytes
    seen: list[tuple[int, str | None]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(cswap.BudgetError) as refused:
            lm_run(gpt2, steps, make=lambda m: cswap.Runtime("recompute", model=m, device="cpu", memory_budget=none_peak // 2,
                                                              host_memory_budget=none_peak // 5),
                   after_step=lambda rt: seen.append((rt.stats().iteration_peak_resident_bytes, rt.plan().planner.get("past_least"))))
    assert refused.value.minimum_bytes > none_peak // 2
    assert seen and all(peak <= none_peak // 2 and note is None for peak, note in seen), seen


def bart_decoder() -> nn.Module:
    """BART as a causal LM (its decoder), whose one recompute region is the whole decoder."""
    config = transformers.BartConfig(vocab_size=256, d_model=64, decoder_layers=2, encoder_layers=2, decoder_attention_heads=4,
                                     encoder_attention_heads=4, decoder_ffn_dim=128, encoder_ffn_dim=128, max_position_embeddings=128)
    return transformers.BartForCausalLM(config)


def _bart_refused(steps: list[list[list[int]]]) -> tuple[cswap.BudgetError, int, list[tuple[int, str | None]]]:
    """Run ``steps`` on BART's decoder under recompute within half of none's peak at 112 tokens,
    until it raises BudgetError; returns the error, the cap, and per step done its peak and the
    plan's ``past_least`` note."""
    probe = lm_run(bart_decoder, [[[112] * 3]], make=lambda m: cswap.Runtime("none", model=m, device="cpu", memory_budget=1.0))[2]
    cap = probe.stats().budget_bytes // 2
    seen: list[tuple[int, str | None]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(cswap.BudgetError) as refused:
            lm_run(bart_decoder, steps, make=lambda m: cswap.Runtime("recompute", model=m, device="cpu", memory_budget=cap),
                   after_step=lambda rt: seen.append((rt.stats().iteration_peak_resident_bytes, rt.plan().planner.get("past_least"))))
    assert refused.value.minimum_bytes > cap == refused.value.budget_bytes
    return refused.value, cap, seen


def test_a_budget_no_swap_can_hold_past_the_least_is_refused() -> None:
    """recompute on BART's decoder rebuilds the whole decoder in backward, which no swap shrinks: at
    a length whose least is past a cap met at shorter ones, the run stops with the least
    (:class:`cswap.BudgetError`) instead of planning at it, and no step before passes the cap."""
    _, cap, seen = _bart_refused([[[40] * 3], [[40, 30, 20]], [[96, 60, 12]], [[112] * 3]])
    assert seen and all(peak <= cap and note is None for peak, note in seen), seen


def test_a_plan_past_its_least_whose_swaps_miss_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should the estimate that swaps hold a plan made past its least be wrong (forced here, on BART's
    whole-decoder rebuild), the first step at that plan's own sizes that passes the cap raises the
    BudgetError the plan was made instead of, rather than pass the cap at every step."""
    monkeypatch.setattr(cswap.Runtime, "_swaps_hold", lambda self, *args: True)
    _, cap, seen = _bart_refused([[[40, 30, 20]], [[96, 60, 12]], [[96, 50, 40]], [[96, 90, 12]], [[96, 60, 30]]])
    # the first step at 96 tokens grew past the 40-token plan and was held; the next, planned past
    # the least at 96, passed the cap and raised
    assert len(seen) == 2 and seen[-1][1] is not None and all(peak <= cap for peak, _ in seen), seen


def test_two_buckets_alternating_profile_at_most_twice() -> None:
    steps = [[[96] * 4] if i % 2 == 0 else [[128] * 4] for i in range(20)]
    plain, _, _ = lm_run(gpt2, steps)
    grads, seen, rt = lm_run(gpt2, steps, make=lambda m: cswap.Runtime("cswap", model=m, device="cpu", memory_budget=0.6))
    _check(seen, max_profiles=2)
    assert rt.stats().graph_changes == 0
    assert_bit_equal(_flat(plain), _flat(grads), "gradient")


class SmallCNN(nn.Module):
    """A ReLU CNN whose classifier pools globally, so any resolution runs."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        )
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


def _cnn_schedule() -> list[tuple[int, int]]:
    rng = random.Random(7)
    schedule = [(8, rng.choice([24, 32, 40])) for _ in range(17)]
    return [*schedule, (3, schedule[-1][1])]  # a last partial batch


def _cnn_run(make=None):
    torch.manual_seed(0)
    model = SmallCNN()
    rt = make(model) if make is not None else None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    grads, seen = [], []
    for batch, size in _cnn_schedule():
        x, y = torch.randn(batch, 3, size, size, generator=g), torch.randint(0, 10, (batch,), generator=g)
        with rt.iteration() if rt is not None else _nothing():
            F.cross_entropy(model(x), y).backward()
        grads.append([p.grad.detach().clone() for p in model.parameters()])
        optimizer.step()
        optimizer.zero_grad()
        if rt is not None:
            stats = rt.stats()
            seen.append((stats.iteration_peak_resident_bytes, stats.budget_bytes, stats.profiled_iterations))
    return grads, seen


@pytest.fixture(scope="module")
def plain_cnn() -> list[list[torch.Tensor]]:
    return _cnn_run()[0]


@pytest.mark.parametrize("policy", ["swap", "compress-swap", "cswap", "capuchin"])
def test_a_cnn_at_several_resolutions_with_a_last_partial_batch(policy: str, plain_cnn) -> None:
    cap = 1_600_000  # bytes: about 0.44 of none's peak at 40 x 40
    grads, seen = _cnn_run(lambda m: cswap.Runtime(policy, model=m, device="cpu", memory_budget=cap))
    _check(seen, max_profiles=3)
    assert_bit_equal(_flat(plain_cnn), _flat(grads), "gradient")


@pytest.mark.parametrize("host_budget", [None, 64])
def test_a_larger_batch_is_planned_again_under_a_host_budget_too(host_budget: int | None) -> None:
    """Batch 8, then 32: the plan is made again for 32 from the profile, with or without a host budget
    (under one, every swap falls back to a keep at pack, which once hid the larger batch)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    rt = cswap.Runtime("swap", model=model, device="cpu", min_bytes=0, memory_budget="1GiB", host_memory_budget=host_budget)
    g = torch.Generator().manual_seed(0)
    for batch in (8, 8, 32, 32, 8):
        x, y = torch.randn(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)
        with rt.iteration():
            F.cross_entropy(model(x), y).backward()
    stats = rt.stats()
    assert stats.profiled_iterations == 1 and stats.unprofiled_plans == 1, stats
    assert any(d.shape == (32, 256) for d in rt.plan().decisions.values())


@pytest.mark.parametrize(("policy", "planner"), [("swap", "budget_plan"), ("cswap", "plan_regions")])
def test_a_plan_made_without_a_profile_bounds_the_solver(monkeypatch: pytest.MonkeyPatch, policy: str, planner: str) -> None:
    """Training waits for a plan made at a larger size: its solves get the short limit and the
    looser gap, a profile's the defaults (the budget planner, and the region planner where the
    policy recomputes)."""
    import inspect

    import cswap.runtime
    from cswap.planner.milp import EXACT_REL_GAP
    from cswap.planner.solve import PROVING_REL_GAP, PROVING_TIME_LIMIT_S

    solving: list[tuple[float, float]] = []
    original = getattr(cswap.runtime, planner)
    signature = inspect.signature(original)

    def spy(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        solving.append((bound.arguments["time_limit_s"], bound.arguments["rel_gap"]))
        return original(*args, **kwargs)

    monkeypatch.setattr(cswap.runtime, planner, spy)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    rt = cswap.Runtime(policy, device="cpu", min_bytes=0, memory_budget="1GiB", model=model if policy == "cswap" else None)
    for batch in (8, 32):
        with rt.iteration():
            F.cross_entropy(model(torch.randn(batch, 64)), torch.zeros(batch, dtype=torch.long)).backward()
    assert solving == [(30.0, EXACT_REL_GAP), (PROVING_TIME_LIMIT_S, PROVING_REL_GAP)] and rt.stats().unprofiled_plans == 1


def gpt2_for_training() -> nn.Module:
    """GPT-2 with the key/value cache off, as trainers set it: its layers can be recomputed."""
    model = gpt2()
    model.config.use_cache = False
    return model


def test_a_longer_sequence_keeps_the_recompute_regions_chosen() -> None:
    """Planned without a profile at a longer length, the regions chosen at the profile stay where
    they still meet the budget (only the rest is planned again), and the budget holds."""
    steps = [[[40] * 4], [[40] * 4], [[80] * 4], [[80] * 4], [[60] * 4]]
    plain, _, _ = lm_run(gpt2_for_training, steps)

    def make(model: nn.Module) -> cswap.Runtime:
        return cswap.Runtime("recompute", model=model, device="cpu", memory_budget=0.7)

    # The regions this run chose at its profile (the choice weighs measured seconds, so it is this
    # run's own that must stay).
    regions: list[tuple[str, ...]] = []
    grads, seen, rt = lm_run(gpt2_for_training, steps, make=make, after_step=lambda rt: regions.append(rt.plan().recompute_regions))
    chosen = regions[1]
    _check(seen, max_profiles=1)
    assert rt.stats().unprofiled_plans == 1
    assert chosen and rt.plan().recompute_regions == chosen, (chosen, rt.plan().recompute_regions)
    assert rt.stats().actions["recompute"] > 0
    assert_bit_equal(_flat(plain), _flat(grads), "gradient")


@pytest.mark.parametrize("policy", ["swap", "cswap"])
def test_a_little_longer_sequence_carries_the_plan_and_a_much_longer_one_is_solved(policy: str) -> None:
    """A few tokens longer, the plan before is carried to the new sizes without a solve (it still
    holds the budget, and the bytes grew less than _CARRY_GROWTH); far longer, the solver plans
    again. A cap in bytes that the short lengths fit in whatever the plan (none's peak at 60
    tokens), so that carrying cannot hang on measured times. Every step within the cap, gradients
    bit-identical."""
    from cswap.runtime import _CARRY_GROWTH

    probe = lm_run(gpt2, [[[60] * 4]], make=lambda m: cswap.Runtime("none", model=m, device="cpu", memory_budget=1.0))[2]
    cap = probe.stats().budget_bytes
    steps = [[[40] * 4], [[41] * 4], [[42] * 4], [[42] * 4], [[100] * 4], [[100] * 4], [[60] * 4]]
    plain, _, _ = lm_run(gpt2, steps)
    statuses: list[str] = []
    grads, seen, rt = lm_run(gpt2, steps, make=lambda m: cswap.Runtime(policy, model=m, device="cpu", memory_budget=cap),
                             after_step=lambda rt: statuses.append(rt.plan().planner.get("status")))
    _check(seen, max_profiles=1)
    assert statuses[1] == statuses[2] == "carried", statuses  # 41 and 42 tokens: carried from the plan at 40
    assert statuses[4] not in ("carried", None), statuses  # 100 tokens: more than _CARRY_GROWTH times the bytes
    assert rt.stats().unprofiled_plans == 3
    assert _CARRY_GROWTH < (100 / 42)
    assert_bit_equal(_flat(plain), _flat(grads), "gradient")


@pytest.mark.parametrize("policy", ["recompute", "ac-full"])
def test_a_step_longer_than_any_planned_that_passes_the_budget_says_so(policy: str) -> None:
    """Mamba's reference scan (Hugging Face, config defaults, two layers) saves one slice per
    token: a recomputed mixer rebuilds all of them at once, so a 96-token step under a plan made
    for 40 tokens passes the budget (no plan moves what a rebuild holds). The runtime warns, once,
    naming what grew, and plans again for 96 tokens; gradients stay bit-identical. Silent before."""
    config = transformers.MambaConfig(vocab_size=256, hidden_size=128, num_hidden_layers=2)

    def build_mamba() -> nn.Module:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return transformers.MambaForCausalLM(config)

    plain, _, _ = causal_lm_steps(build_mamba, [40, 96, 64])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grads, steps, _ = causal_lm_steps(build_mamba, [40, 96, 64],
                                          lambda model: cswap.Runtime(policy, model=model, device="cpu", memory_budget=0.5))
    grown = [str(w.message) for w in caught if "larger than any planned for" in str(w.message)]
    assert len(grown) == 1 and "grew from [2, 256, 40, 16] to [2, 256, 96, 16]" in grown[0], grown
    assert steps[1][1] > steps[0][1]  # planned again for 96 tokens
    assert_bit_equal(plain, grads, what=f"mamba {policy} gradient")
