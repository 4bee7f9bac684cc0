"""Under a memory budget ``min_bytes`` binds nothing: on a small GPT-2 whose every saved tensor is
below the default 256 KiB, the least budget with the default options is the least with
``min_bytes=0``, a run at it holds it with gradients bit-identical to plain PyTorch, and the
BudgetError names the event and the tensors that set it. Without a budget ``min_bytes`` keeps
every such tensor on the device, as before."""

from __future__ import annotations

import contextlib
import re
from typing import Any

import pytest
import torch

import cswap
from cswap.options import load_options
from cswap.planner.plan import Action
from tests.runtime.helpers import FAST_CODEC, SLOW_LINK, assert_bit_equal, one_thread_below_1mib

transformers = pytest.importorskip("transformers")

#: The default ``min_bytes`` (configs/default.yaml): every saved tensor of the GPT-2 below is smaller.
DEFAULT_MIN_BYTES = load_options().min_bytes

#: Token ids of the batches: 4 sequences of 24 tokens each, the labels too.
BATCHES = [torch.randint(0, 128, (4, 24), generator=torch.Generator().manual_seed(seed)) for seed in range(4)]


def _gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    model.train()
    return model


def _runtime(policy: str, model: torch.nn.Module, budget: float | int | None, **options: Any) -> cswap.Runtime:
    """A CPU runtime with the default ``min_bytes`` unless ``options`` give one."""
    defaults: dict[str, Any] = {"device": "cpu", "launch_lookup": one_thread_below_1mib, **SLOW_LINK}
    if policy == "cswap":
        defaults["time_model"] = FAST_CODEC
    return cswap.Runtime(policy, model=model, memory_budget=budget, **{**defaults, **options})


def _train(model: torch.nn.Module, rt: cswap.Runtime | None, steps: int) -> tuple[list[list[torch.Tensor]], list[int]]:
    """SGD over the first ``steps`` batches; every step's gradients, and with ``rt`` its peak.
    Dropout draws from the step's seed, so runs with and without the runtime see the same masks."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    grads, peaks = [], []
    for i, ids in enumerate(BATCHES[:steps]):
        with torch.random.fork_rng():
            torch.manual_seed(i)
            with rt.iteration() if rt is not None else contextlib.nullcontext():
                model(input_ids=ids, labels=ids).loss.backward()
        grads.append([p.grad.detach().clone() for p in model.parameters()])
        if rt is not None:
            peaks.append(rt.stats().iteration_peak_resident_bytes)
        optimizer.step()
        optimizer.zero_grad()
    return grads, peaks


def _budget_error(policy: str, **options: Any) -> tuple[cswap.BudgetError, cswap.Runtime]:
    """The error of a budget no policy meets (0.01 of ``none``'s peak), and its runtime."""
    model = _gpt2()
    rt = _runtime(policy, model, 0.01, **options)
    with pytest.raises(cswap.BudgetError) as raised:
        _train(model, rt, 1)
    return raised.value, rt


@pytest.fixture(scope="module")
def reference() -> list[list[torch.Tensor]]:
    return _train(_gpt2(), None, 3)[0]


@pytest.mark.parametrize("policy", ["swap", "cswap"])
def test_min_bytes_does_not_raise_the_least_budget(policy: str, reference: list[list[torch.Tensor]]) -> None:
    default, rt = _budget_error(policy)
    assert all(r.nbytes < DEFAULT_MIN_BYTES for r in rt.trace().tensors), "every saved tensor is below min_bytes"
    unrestricted, _ = _budget_error(policy, min_bytes=0)
    least = default.minimum_bytes
    assert abs(least - unrestricted.minimum_bytes) <= 0.01 * unrestricted.minimum_bytes
    assert default.minimum_fraction is not None and default.minimum_fraction < 0.5  # min_bytes once kept them all: 1.0

    # a fresh run at the stated least holds it, with plain PyTorch's gradients
    model = _gpt2()
    rt = _runtime(policy, model, least)
    grads, peaks = _train(model, rt, 3)
    assert rt.stats().budget_bytes == least
    assert max(peaks) <= least, f"{policy}: iteration peaks {peaks} over the least budget {least}"
    assert_bit_equal([g for step in reference for g in step], [g for step in grads for g in step], "gradient")
    moved = [d for d in rt.plan().rows().values() if d.action is not Action.KEEP]
    assert moved and all(d.nbytes < DEFAULT_MIN_BYTES for d in moved)  # tensors below min_bytes moved where the budget needs it


@pytest.mark.parametrize("policy", ["swap", "cswap"])
def test_the_budget_error_names_the_event_and_tensors_that_set_the_floor(policy: str) -> None:
    error, _ = _budget_error(policy)
    message = str(error)
    assert re.search(r"The floor is set at the (un)?pack of key \d+ \(event \d+\): whatever the plan does, [\d.]+ KiB stay "
                     r"resident there", message), message
    modules = {f"{name} ({type(module).__name__})" for name, module in _gpt2().named_modules() if name}
    named = re.findall(r"(?:: |; )([\w.]+ \(\w+\)) key \d+, float32 \[", message)
    assert named and set(named) <= modules, message
    assert "min_bytes" not in message and "already has every action" not in message


def test_without_a_budget_min_bytes_keeps_every_small_tensor() -> None:
    model = _gpt2()
    rt = _runtime("swap", model, None)
    _train(model, rt, 2)
    rows = list(rt.plan().rows().values())
    assert rows and all(d.action is Action.KEEP for d in rows)
    assert any(d.reason.startswith("below min_bytes") for d in rows)
