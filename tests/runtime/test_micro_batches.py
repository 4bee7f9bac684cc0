"""Gradient accumulation inside one ``rt.iteration()``: k forward/backward pairs are k repetitions
of one micro-batch, not one long forward. A fractional budget resolves against one micro-batch's
peak (what plain PyTorch holds at once), every policy's least budget is the same for k = 1, 2 and
4, the budget holds, and gradients stay bit-identical to plain PyTorch accumulating the same way."""

from __future__ import annotations

import pytest
import torch

import cswap
from cswap.models import build
from cswap.planner.actions import RUNTIME_POLICIES
from tests.runtime.helpers import assert_bit_equal, batches, runtime_for, train

COUNTS = (1, 2, 4)
#: per count of micro-batches of 4 samples each: a profiling and 2 following iterations, whose
#: first micro-batches are the same samples whatever the count
DATA = {k: [(x[: 4 * k], y[: 4 * k]) for x, y in batches(3, (4 * max(COUNTS), 3, 32, 32), 10)] for k in COUNTS}


def _cnn() -> torch.nn.Module:
    return build("vgg11", num_classes=10, width_mult=0.125)


def _least(policy: str, micro_batches: int) -> int:
    with pytest.raises(cswap.BudgetError) as raised:
        train(_cnn, DATA[micro_batches][:1], 1, runtime_for(policy, memory_budget=1), micro_batches=micro_batches)
    return raised.value.minimum_bytes


@pytest.fixture(scope="module")
def plain() -> dict[int, list[list[torch.Tensor]]]:
    return {k: train(_cnn, DATA[k], 1, micro_batches=k)[0] for k in COUNTS}


@pytest.mark.parametrize("policy", RUNTIME_POLICIES)
def test_every_policy_plans_one_micro_batch(policy: str, plain: dict[int, list[list[torch.Tensor]]]) -> None:
    least = {k: _least(policy, k) for k in COUNTS}
    # Equal, but for compressed sizes: the least budget also covers the profiling iteration's own
    # peak, and the other micro-batches' samples compress a little differently from the first's.
    assert all(abs(least[k] - least[1]) <= 0.01 * least[1] for k in COUNTS), least
    budgets = {}
    for k in COUNTS:
        # half of none's peak, or the policy's least where that is more
        budget: float | int = 0.5 if least[k] <= 0.5 * _none_peak(k) else least[k]
        grads, rt = train(_cnn, DATA[k], 1, runtime_for(policy, memory_budget=budget), micro_batches=k)
        stats = rt.stats()
        assert rt.trace().meta["micro_batches"] == k
        assert stats.peak_resident_bytes <= stats.budget_bytes, f"{policy}, {k} micro-batches: over the budget"
        assert stats.unknown_keys == 0
        assert_bit_equal([g for it in plain[k] for g in it], [g for it in grads for g in it], "gradient")
        budgets[k] = (budget, stats.budget_bytes)
    if all(budget == 0.5 for budget, _ in budgets.values()):
        assert budgets[2] == budgets[1] and budgets[4] == budgets[1], budgets


def _none_peak(micro_batches: int) -> int:
    _, rt = train(_cnn, DATA[micro_batches][:1], 1, runtime_for("none", memory_budget=1.0), micro_batches=micro_batches)
    return rt.stats().peak_resident_bytes


def test_the_peak_of_none_is_one_micro_batchs() -> None:
    # Micro-batches of 4 samples: plain PyTorch frees each one's activations in its backward.
    peaks = {k: _none_peak(k) for k in COUNTS}
    assert peaks[2] == peaks[1] and peaks[4] == peaks[1], peaks
