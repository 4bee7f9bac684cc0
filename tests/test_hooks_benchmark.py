"""The baselines of ``benchmarks/hooks.py`` do the work they stand for: a figure against a
baseline that skipped its copies, or stored a tensor wrongly, would measure nothing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "hooks.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hooks_benchmark_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _grads(model: torch.nn.Module, x: torch.Tensor, bench: ModuleType, context: object | None) -> list[torch.Tensor]:
    if context is None:
        bench._step(model, x)
    else:
        with context():  # type: ignore[operator]
            bench._step(model, x)
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("baseline", ["copying offload", "keyed floor", "essential swap"])
@pytest.mark.parametrize("blocks, width, batch", [(3, 8, 2), (5, 32, 8)])
def test_a_baseline_copies_every_stored_tensor_and_gives_plain_gradients(bench: ModuleType, baseline: str, blocks: int,
                                                                         width: int, batch: int) -> None:
    model, x = bench.Workload("t", blocks=blocks, width=width, batch=batch).build()
    plain = _grads(model, x, bench, None)
    if baseline == "keyed floor":
        floor = bench.KeyedFloor(model, x)
        context = floor
        # a Linear's input is the ReLU output before it: stored once, the second save found; the
        # first Linear's weight is not saved (its input needs no gradient), the others' are
        kinds = [kind for kind, _ in floor.kinds]
        assert kinds.count("param") == blocks - 1 and kinds.count("store") == blocks + 1 and kinds.count("dup") == blocks - 1
    elif baseline == "essential swap":
        context = bench.EssentialSwap(model, x)
    else:
        context = bench.copying_offload
    copies: list[int] = []
    original = torch.Tensor.copy_

    def counted(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        copies.append(1)
        return original(self, *args, **kwargs)

    torch.Tensor.copy_ = counted  # type: ignore[method-assign]
    try:
        grads = _grads(model, x, bench, context)
    finally:
        torch.Tensor.copy_ = original  # type: ignore[method-assign]
    assert all(torch.equal(a, b) for a, b in zip(plain, grads))
    expected = 3 * blocks - 1 if baseline == "copying offload" else blocks + 1  # every saved tensor, or every stored one
    assert len(copies) == expected, f"{baseline}: {len(copies)} copies to the host, expected {expected}"
    if baseline == "essential swap":
        # every stored tensor on the host at once at the end of forward, all released after backward
        assert context.peak_host_bytes == (blocks + 1) * batch * width * 4
        assert (context.host_bytes, context.resident_bytes, context.held) == (0, 0, set())
