"""Every policy on every model: parameter gradients bit-identical to plain PyTorch across two epochs."""

from __future__ import annotations

import pytest
import torch

from cswap import models
from cswap.options import POLICIES
from cswap.profile.regions import repeated_layers
from tests.runtime.helpers import assert_bit_equal, batches, runtime_for, train

EPOCHS = 2
ITERATIONS = 2
BATCH = batches(ITERATIONS, (2, 3, 32, 32), classes=10)


def _build(name: str):
    return lambda: models.build(name, num_classes=10, width_mult=0.125)


@pytest.fixture(scope="module")
def reference() -> dict[str, list[list[torch.Tensor]]]:
    """Plain PyTorch gradients per model, computed once and shared by the policies."""
    cache: dict[str, list[list[torch.Tensor]]] = {}
    return cache


def _reference(cache: dict[str, list[list[torch.Tensor]]], name: str) -> list[list[torch.Tensor]]:
    if name not in cache:
        cache[name], _ = train(_build(name), BATCH, EPOCHS)
    return cache[name]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_gradients_bit_identical(reference, name: str, policy: str) -> None:
    expected = _reference(reference, name)
    grads, rt = train(_build(name), BATCH, EPOCHS, runtime_for(policy))
    for iteration, (e, a) in enumerate(zip(expected, grads)):
        assert_bit_equal(e, a, what=f"{name}/{policy} iteration {iteration} gradient")
    stats = rt.stats()
    assert stats.iterations == EPOCHS * ITERATIONS
    assert stats.profiled_iterations == EPOCHS
    assert stats.never_moved_tensors > 0  # the weights autograd saved stayed put
    planned = stats.actions
    if policy == "swap":
        assert planned["swap"] > 0 and planned["zvc-swap"] == planned["zvc-keep"] == 0
    elif policy == "compress-swap":
        assert planned["zvc-swap"] > 0 and planned["swap"] == planned["zvc-keep"] == 0
    elif policy == "compress-keep":
        assert planned["zvc-keep"] > 0 and planned["swap"] == planned["zvc-swap"] == 0
    elif policy == "recompute":
        # Without a budget: every region that frees memory is recomputed, the rest kept.
        assert planned["recompute"] > 0 and planned["swap"] == planned["zvc-swap"] == planned["zvc-keep"] == 0
        assert rt.plan().recompute_regions and stats.unknown_keys == 0
    elif policy == "capuchin":
        # Without a budget: its least footprint, which swapping reaches without recomputing.
        assert planned["swap"] > 0 and planned["zvc-swap"] == planned["zvc-keep"] == 0
        assert stats.unknown_keys == 0
    elif policy == "ac-full":
        # Every repeated block recomputed (a ResNet's, GoogLeNet's inception blocks); a plain stack of
        # ops (AlexNet, VGG) has none, and the plan keeps everything and says so.
        layers = repeated_layers(rt.options.model)
        assert rt.plan().recompute_regions == layers and planned["swap"] == planned["zvc-swap"] == planned["zvc-keep"] == 0
        assert (planned["recompute"] > 0) == bool(layers) == (name not in ("alexnet", "vgg11", "vgg16", "vgg19"))
        if not layers:
            assert rt.plan().planner["layers"].startswith("the model has no repeated layers")
    elif policy == "cpu-compress-swap":
        # Every tensor moved raw, its host copy compressed (a dense one stays a raw swap).
        assert planned["host-zvc-swap"] > 0 and planned["zvc-swap"] == planned["zvc-keep"] == 0
        assert stats.unknown_keys == 0
    elif policy == "cswap":
        # The first epoch profiles keeping everything; the second follows the cost model, which on
        # this slow link compresses the sparse tensors.
        assert planned["zvc-swap"] > 0
        assert rt.trace().epoch == 1
    else:
        assert planned["swap"] == planned["zvc-swap"] == planned["zvc-keep"] == 0
        # No hooks outside profiling: only the two profiling iterations packed anything.
        assert stats.packed_tensors == 2 * len(rt.trace().tensors)
    assert stats.resident_bytes == 0  # every saved tensor was released after its backward
