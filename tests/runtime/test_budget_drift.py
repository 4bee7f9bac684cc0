"""compress-keep past the least it stated: activations that grow denser every epoch make every
compressed copy larger than at the profile the budget was met at. The run keeps its budget at every
iteration and goes on, with gradients bit-identical to plain PyTorch."""

from __future__ import annotations

import warnings

import pytest
import torch

import cswap
from tests.runtime.helpers import assert_bit_equal, batches, runtime_for

DATA = batches(3, (4, 3, 32, 32), 10, seed=0)
EPOCHS = 5

#: How much both convolutions' biases rise before each epoch: every ReLU output grows denser, by
#: more than the stated least's margin (1%) within two epochs.
BIAS_RISE = 0.05


def _cnn() -> torch.nn.Module:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 16 * 16, 10),
    )
    with torch.no_grad():  # sparse ReLU outputs to start from
        model[0].bias.fill_(-0.5)
        model[2].bias.fill_(-0.3)
    return model


def _train(budget: int | None, epochs: int) -> tuple[list[list[torch.Tensor]], cswap.Runtime | None, list[int]]:
    """SGD on a ReLU CNN whose activations grow denser every epoch; every iteration's gradients,
    the runtime (``budget=None``: plain PyTorch) and every iteration's peak of resident bytes."""
    torch.manual_seed(0)
    model = _cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rt = runtime_for("compress-keep", memory_budget=budget)(model) if budget is not None else None
    grads, peaks = [], []
    for epoch in range(epochs):
        if rt is not None:
            rt.new_epoch()
        with torch.no_grad():
            model[0].bias += BIAS_RISE
            model[2].bias += BIAS_RISE
        for i, (x, y) in enumerate(DATA):
            with torch.random.fork_rng():
                torch.manual_seed(1000 * epoch + i)
                if rt is None:
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                else:
                    with rt.iteration():
                        torch.nn.functional.cross_entropy(model(x), y).backward()
                    peaks.append(rt.stats().iteration_peak_resident_bytes)
            grads.append([p.grad.detach().clone() for p in model.parameters()])
            optimizer.step()
            optimizer.zero_grad()
    return grads, rt, peaks


def test_compress_keep_holds_its_stated_least_while_the_activations_grow_denser() -> None:
    with pytest.raises(cswap.BudgetError) as raised:
        _train(1, 1)
    least = raised.value.minimum_bytes
    assert "It includes a 1% margin" in str(raised.value)
    reference, _, _ = _train(None, EPOCHS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grads, rt, peaks = _train(least, EPOCHS)
    assert rt is not None
    said = [str(w.message) for w in caught if "uncompressed" in str(w.message)]
    assert len(said) == 1 and "to hold the memory budget" in said[0], said  # once
    assert not [w for w in caught if "passed the memory budget" in str(w.message)]

    assert len(peaks) == EPOCHS * len(DATA)
    assert max(peaks) <= least, f"peaks {peaks} over the budget {least}"
    stats = rt.stats()
    assert stats.profiled_iterations == EPOCHS and stats.budget_bytes == least and stats.graph_changes == 0
    # The data drifted past the margin: the last profile needs more than the stated least to keep
    # every tensor on the device, and the run swapped what would have passed it.
    planner = rt.plan().planner
    assert "past_least" in planner and planner["minimum_bytes"] > least, dict(planner)
    assert stats.budget_fallbacks > 0 and stats.actions["swap"] >= stats.budget_fallbacks
    assert rt.trace().meta["mode"] == "plan"  # a later profile follows the plan that met the budget
    assert_bit_equal([g for it in reference for g in it], [g for it in grads for g in it], "gradient")
