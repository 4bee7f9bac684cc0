"""Small Hugging Face transformers under every policy at 0.4 of ``none``'s peak, against the simulator.

GPT-2 (dropout, GELU), Llama (RMSNorm, SiLU-gated MLP, grouped-query attention, RoPE) and BERT are
built from their config classes with the library's defaults, only the sizes made small (two layers,
hidden 256). Under each runtime policy the budget is held, with gradients bit-identical to plain
PyTorch, or the policy raises a :class:`~cswap.budget.BudgetError` whose least budget a fresh run
then holds. The simulator replays the runtime's own plan on the runtime's own profile, with this
machine's CPU profile: its peak is the runtime's measured one, within 1% (each plan follows the
timings it was made from, so only the same plan can be compared). Given a ``none`` profile of the
model, the simulator also plans the same policies under the same budget: where it can meet it, its
plan holds it.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import replace
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

import cswap
from cswap.budget import BudgetError
from cswap.planner.actions import RUNTIME_POLICIES
from tests.runtime.helpers import assert_bit_equal

transformers = pytest.importorskip("transformers")

FRACTION = 0.4
SEQ_LEN = 128
VOCAB = 2048


def _gpt2() -> nn.Module:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ_LEN, n_embd=256, n_layer=2, n_head=4))


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ_LEN)
    return transformers.LlamaForCausalLM(config)


def _bert() -> nn.Module:
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=1024, max_position_embeddings=SEQ_LEN)
    return transformers.BertForMaskedLM(config)


MODELS: dict[str, Callable[[], nn.Module]] = {"gpt2": _gpt2, "llama": _llama, "bert": _bert}


@functools.cache
def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MODELS[name]().train()


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ_LEN), generator=torch.Generator().manual_seed(1))


def _step(model: nn.Module) -> list[torch.Tensor]:
    """One forward and backward with the model's own loss; the same dropout masks every call."""
    model.zero_grad(set_to_none=True)
    ids = _ids()
    torch.manual_seed(7)
    model(input_ids=ids, labels=ids).loss.backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


@functools.cache
def _plain(name: str) -> tuple[torch.Tensor, ...]:
    return tuple(_step(copy.deepcopy(_model(name))))


def _train(name: str, policy: str, budget: float | int, iterations: int = 3) -> tuple[cswap.Runtime, list[torch.Tensor]]:
    """``iterations`` steps of ``name`` under ``policy`` and ``budget``: the runtime and the last gradients."""
    model = copy.deepcopy(_model(name))
    rt = cswap.Runtime(policy, device="cpu", model=model, memory_budget=budget)
    grads: list[torch.Tensor] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(iterations):
            with rt.iteration():
                grads = _step(model)
    return rt, grads


@functools.cache
def _simulated(name: str) -> dict[str, object]:
    """Every budget policy planned and simulated at :data:`FRACTION` on the runtime's profile of ``name``."""
    from cswap.simulate import SimConfig, Simulator
    from cswap.simulate.budgeted import budget_policies, run_budgets
    from cswap.simulate.validate import cpu_profile

    model = copy.deepcopy(_model(name))
    rt = cswap.Runtime("none", device="cpu", model=model)
    with rt.iteration():
        _step(model)
    simulator = Simulator(rt.trace(), cpu_profile(), SimConfig(min_bytes=rt.options.min_bytes))
    return dict(run_budgets(simulator, budget_policies(), budget=FRACTION))


@pytest.mark.parametrize("policy", RUNTIME_POLICIES)
@pytest.mark.parametrize("name", MODELS)
def test_budget_held_or_honestly_refused_and_peak_as_simulated(name: str, policy: str) -> None:
    from cswap.simulate import SimConfig, Simulator
    from cswap.simulate.validate import cpu_profile, runtime_actions

    try:
        rt, grads = _train(name, policy, FRACTION)
    except BudgetError as error:
        # Honest: a fresh run at the least budget it names holds it, gradients unchanged.
        assert error.minimum_fraction is not None and error.minimum_fraction > FRACTION
        rt, grads = _train(name, policy, error.minimum_bytes)
        assert rt.stats().iteration_peak_resident_bytes <= error.minimum_bytes
        assert_bit_equal(_plain(name), grads, what=f"{name} {policy} gradient at its least budget")
        return
    assert rt.resolved_budget is not None
    budget_bytes = rt.resolved_budget.nbytes
    assert rt.resolved_budget.fraction_of_none == pytest.approx(FRACTION, abs=1e-3)
    measured = rt.stats().iteration_peak_resident_bytes
    assert measured <= budget_bytes
    assert_bit_equal(_plain(name), grads, what=f"{name} {policy} gradient")
    trace = rt.trace()
    simulator = Simulator(trace, cpu_profile(), SimConfig(min_bytes=rt.options.min_bytes))
    replayed = simulator.run_plan(runtime_actions(trace, rt.plan()), policy=policy, plan="runtime",
                                  params=replace(simulator.params, budget_bytes=budget_bytes)).peak_bytes
    assert abs(measured / replayed - 1.0) <= 0.01, f"measured peak {measured:,d} B, its plan simulated {replayed:,d} B"
    outcome = _simulated(name).get(policy)  # ac-full is a fixed plan, not one of the simulator's budget policies
    if outcome is not None and not outcome.infeasible:
        assert outcome.result.peak_bytes <= outcome.budget_bytes


@pytest.mark.parametrize("name", MODELS)
def test_nones_least_budget_is_the_peak_it_measures(name: str) -> None:
    """Llama's attention output and its ``o_proj`` input are views of one storage, which the runtime
    counts once; the planners (the runtime's and the simulator's) count it once too, so ``none``'s
    least budget, what a fractional budget is a fraction of, is the peak ``none`` measures, to the byte."""
    rt, _ = _train(name, "none", 1.0, iterations=2)
    measured = rt.stats().iteration_peak_resident_bytes
    shared = [r for r in rt.trace().tensors if r.view_of is not None and r.offloadable]
    assert shared or name != "llama"
    assert rt.resolved_budget is not None and rt.resolved_budget.nbytes == measured
    with pytest.raises(BudgetError) as raised:
        _train(name, "none", measured - 1, iterations=1)
    assert raised.value.minimum_bytes == measured
    # the simulator's planner and its queue model, on the same profile, say the same
    from cswap.simulate import SimConfig, Simulator
    from cswap.simulate.budgeted import none_peak_bytes, planning_problem
    from cswap.simulate.validate import cpu_profile

    simulator = Simulator(rt.trace(), cpu_profile(), SimConfig(min_bytes=rt.options.min_bytes))
    assert none_peak_bytes(planning_problem(simulator)[0]) == simulator.run("none").peak_bytes == measured


@pytest.mark.parametrize("policy", RUNTIME_POLICIES)
@pytest.mark.parametrize("name", MODELS)
def test_all_of_nones_peak_is_met_by_every_policy(name: str, policy: str) -> None:
    """``memory_budget=1.0`` is what plain PyTorch holds: every policy meets it, every iteration
    within it, the profile's included. A profile storing each tensor at the policy's least
    footprint does not: ``compress-keep``'s, exponent-coding every float32 tensor of Llama, held
    1.05 of ``none``'s peak (the loss's float32 log-probabilities, compressed, beside what backward
    rebuilds from them); at all of ``none``'s peak the profile keeps every tensor instead."""
    rt, grads = _train(name, policy, 1.0)
    assert rt.resolved_budget is not None
    stats = rt.stats()
    assert stats.peak_resident_bytes <= rt.resolved_budget.nbytes, stats
    assert_bit_equal(_plain(name), grads, what=f"{name} {policy} gradient")


@pytest.mark.parametrize("fraction", [0.95, 0.9, 0.5])
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_fraction_is_met_or_refused_as_its_bytes_are(name: str, fraction: float) -> None:
    """``compress-keep``'s first profile under a fraction runs before its bytes are known: it keeps
    what fits first within the fraction of the most the saved tensors have held so far (compressing
    every tensor held 1.05 of ``none``'s peak on the fp32 Llama). The least a fraction is refused
    with is the least of the same budget in bytes, so a fraction the bytes meet is met, every
    iteration within it, the first too, gradients bit-identical."""
    budget_bytes = int(_none_peak(name) * fraction)
    outcomes = []
    for budget in (fraction, budget_bytes):
        try:
            rt, grads = _train(name, "compress-keep", budget)
        except BudgetError as error:
            outcomes.append(("refused", error.minimum_bytes))
            continue
        assert rt.resolved_budget is not None and rt.resolved_budget.nbytes == budget_bytes
        assert rt.stats().peak_resident_bytes <= budget_bytes
        assert_bit_equal(_plain(name), grads, what=f"{name} compress-keep gradient at {budget}")
        outcomes.append(("met", budget_bytes))
    assert outcomes[0] == outcomes[1], f"as a fraction {outcomes[0]}, in bytes {outcomes[1]}"


@functools.cache
def _none_peak(name: str) -> int:
    rt, _ = _train(name, "none", 1.0, iterations=1)
    assert rt.resolved_budget is not None
    return rt.resolved_budget.nbytes


@pytest.mark.parametrize("fraction", [1.0, 0.95, 0.9])
@pytest.mark.parametrize("name", MODELS)
def test_compress_keep_in_bytes_keeps_what_fits_and_compresses_the_oldest(name: str, fraction: float) -> None:
    """Under a budget in bytes, ``compress-keep``'s profile keeps each tensor while the budget has
    room and compresses the oldest it kept past it, so plain PyTorch's peak, which keeping every
    tensor holds, is met (the fp32 Llama's profile compressing every tensor held 1.05 of it), and
    the budgets below it are met or refused with a least that a fresh run then holds. The profile's
    peak is the planner's replay of it (:func:`cswap.planner.budgeted.profile_peaks`), within 1%."""
    from cswap.planner.budgeted import NO_CODEC, SPARSITY_MARGIN, problem_from_trace, profile_peaks
    from cswap.planner.plan import Action

    budget = int(_none_peak(name) * fraction)
    try:
        rt, grads = _train(name, "compress-keep", budget, iterations=1)
    except BudgetError as error:
        assert fraction < 1.0 and error.minimum_bytes > budget
        rt, grads = _train(name, "compress-keep", error.minimum_bytes)
        assert rt.stats().peak_resident_bytes <= error.minimum_bytes
        assert_bit_equal(_plain(name), grads, what=f"{name} compress-keep gradient at its least budget")
        return
    assert rt.trace().meta["mode"] == "keep-first"
    measured = rt.stats().iteration_peak_resident_bytes
    assert measured <= budget
    problem = problem_from_trace(rt.trace(), NO_CODEC, "cpu", min_bytes=0, sparsity_margin=SPARSITY_MARGIN)
    replayed = profile_peaks(problem, Action.ZVC_KEEP, budget, None, keeps_first=True)[0]
    assert abs(measured / replayed - 1.0) <= 0.01, f"the profile measured {measured:,d} B, its replay {replayed:,d} B"
    assert_bit_equal(_plain(name), grads, what=f"{name} compress-keep profile gradient")
    rt, grads = _train(name, "compress-keep", budget, iterations=3)
    assert rt.stats().peak_resident_bytes <= budget
    assert_bit_equal(_plain(name), grads, what=f"{name} compress-keep gradient")
