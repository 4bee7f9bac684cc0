"""A graph that changes between iterations (data-dependent depth and batch size): the budget holds
on every iteration under every policy that moves tensors, a changed graph is profiled again at the
next iteration (``stats().graph_changes``), a policy that cannot move what it holds says so, and
gradients stay bit-identical to plain PyTorch."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import cswap
from tests.runtime.helpers import assert_bit_equal, runtime_for

#: (depth, batch) per iteration: deeper, then a bigger batch, then shallower and smaller
SCHEDULE = [(2, 16), (2, 16), (6, 16), (6, 32), (2, 8), (4, 32), (6, 32), (6, 32)]


class DataDependentDepth(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(32, 64)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.1)) for _ in range(6)])
        self.out = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor, depth: int) -> torch.Tensor:
        h = F.relu(self.inp(x))
        for block in self.blocks[:depth]:
            h = block(h)
        return self.out(h)


def _train(runtime: cswap.Runtime | None, model: nn.Module,
           schedule: list[tuple[int, int]] = SCHEDULE) -> tuple[list[list[torch.Tensor]], list[tuple[int, int]]]:
    """Gradients per iteration, and per iteration (its peak, the budget then)."""
    g = torch.Generator().manual_seed(0)
    grads, peaks = [], []
    for i, (depth, batch) in enumerate(schedule):
        x, y = torch.randn(batch, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)
        with torch.random.fork_rng():
            torch.manual_seed(i)
            if runtime is None:
                F.cross_entropy(model(x, depth), y).backward()
            else:
                with runtime.iteration():
                    F.cross_entropy(model(x, depth), y).backward()
                stats = runtime.stats()
                peaks.append((stats.iteration_peak_resident_bytes, stats.budget_bytes))
        grads.append([p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()])
        model.zero_grad()
    return grads, peaks


@pytest.fixture(scope="module")
def plain() -> list[list[torch.Tensor]]:
    torch.manual_seed(0)
    return _train(None, DataDependentDepth())[0]


@pytest.mark.parametrize("policy", ["swap", "compress-swap", "cswap", "capuchin"])
def test_the_budget_holds_on_every_iteration_of_a_changing_graph(policy: str, plain: list[list[torch.Tensor]]) -> None:
    torch.manual_seed(0)
    model = DataDependentDepth()
    rt = runtime_for(policy, memory_budget=0.5, d2h_gbps=1.0, h2d_gbps=1.0)(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no iteration passes the budget, so none warns
        grads, peaks = _train(rt, model)
    for i, (peak, budget) in enumerate(peaks):
        assert peak <= budget, f"iteration {i} ({SCHEDULE[i]}): peak {peak} over the budget {budget}"
    stats = rt.stats()
    # Each depth is a graph of its own: depth 6 after 2 and depth 4 after 2 are not seen before, and
    # the next iteration profiles (depth 6 both times: the second profile finds it known). Depth 2
    # after 6 follows its own plan again, and batch 32 after 16 is planned from the profile.
    assert stats.graph_changes == 2 and stats.profiled_iterations == 3 and stats.structures == 2, stats
    assert stats.unprofiled_plans >= 1, stats
    assert_bit_equal([g for it in plain for g in it], [g for it in grads for g in it], "gradient")


#: Two graphs alternating (two branches), and a second graph every fourth step (an evaluation-like step).
RECURRING = {
    "alternating": [(2, 16) if i % 2 == 0 else (6, 16) for i in range(12)],
    "every fourth": [(6, 16) if i % 4 == 3 else (2, 16) for i in range(16)],
}


@pytest.mark.parametrize("schedule", sorted(RECURRING))
@pytest.mark.parametrize("policy", ["swap", "cswap"])
def test_a_graph_that_comes_back_is_profiled_once_not_the_one_after_it(policy: str, schedule: str) -> None:
    """The profile a new graph asks for comes at the next iteration; when that one is a known graph
    (the other branch came back first), the next profile waits for the interval at which the new
    graph came back, so it profiles the new graph, once: three profiles in all, then both plans serve."""
    steps = RECURRING[schedule]
    torch.manual_seed(0)
    want, _ = _train(None, DataDependentDepth(), steps)
    torch.manual_seed(0)
    model = DataDependentDepth()
    rt = runtime_for(policy, memory_budget=0.5, d2h_gbps=1.0, h2d_gbps=1.0)(model)
    grads, peaks = _train(rt, model, steps)
    stats = rt.stats()
    assert stats.structures == 2 and stats.profiled_iterations <= 3, stats
    assert all(peak <= budget for peak, budget in peaks), peaks
    assert_bit_equal([g for it in want for g in it], [g for it in grads for g in it], "gradient")


def test_a_policy_that_cannot_move_says_so_with_the_new_least_budget() -> None:
    """A budget in bytes that holds the shallow graph under ``none``: the deeper one passes it, the
    iteration that shows it warns, and the next profile raises with the deeper graph's least budget.
    (A fractional budget follows the graph: it resolves against each new profile.)"""
    g = torch.Generator().manual_seed(0)
    (depth, batch), deeper = SCHEDULE[0], SCHEDULE[2]
    x, y = torch.randn(batch, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)
    torch.manual_seed(0)
    model = DataDependentDepth()
    probe = runtime_for("none", memory_budget=1.0)(model)
    with probe.iteration():
        F.cross_entropy(model(x, depth), y).backward()
    budget = probe.stats().budget_bytes
    assert budget is not None
    rt = runtime_for("none", memory_budget=budget)(model)
    for _ in range(2):  # profiled, then planned: within its budget
        with rt.iteration():
            F.cross_entropy(model(x, depth), y).backward()
    x, y = torch.randn(deeper[1], 32, generator=g), torch.randint(0, 10, (deeper[1],), generator=g)
    with pytest.warns(UserWarning, match="passed the memory budget in this iteration"), rt.iteration():
        F.cross_entropy(model(x, deeper[0]), y).backward()  # the iteration that shows it
    with pytest.raises(cswap.BudgetError) as raised, rt.iteration():
        F.cross_entropy(model(x, deeper[0]), y).backward()  # profiled again: the new least budget
    assert raised.value.minimum_bytes > budget and rt.stats().graph_changes == 1


def test_iterations_that_keep_profiling_warn_once_with_what_to_do() -> None:
    """A graph of another kind every few steps (a depth never seen): the third profile it causes
    within ten iterations warns once, saying what changes and what to do; sizes alone never do."""
    torch.manual_seed(0)
    model = DataDependentDepth()
    rt = runtime_for("swap", memory_budget=0.5)(model)
    g = torch.Generator().manual_seed(0)
    caught = []
    for depth in (1, 2, 3, 4, 5, 6, 6, 6):
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with rt.iteration():
                F.cross_entropy(model(x, depth), y).backward()
        caught += [str(w.message) for w in seen if "iterations because the saved tensors changed" in str(w.message)]
    assert len(caught) == 1, caught
    assert "profiled 3 of the last" in caught[0] and "bucket" in caught[0] and "Sizes alone" in caught[0]
