"""What docs/integrations.md says about composing cswap with checkpointing and with a user's own
saved-tensor hooks: only the innermost hooks apply, and gradients stay bit-identical either way."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import cswap

#: Saves (pack calls) of one iteration of :func:`_run` without checkpointing: the first block, 2
#: (its input, its ReLU's output; the weight is not saved as the input needs no grad); the second
#: block, 6 (each linear's input and weight, each ReLU's output); the loss's square, 1.
PLAIN_PACKS = 9
SECOND_BLOCK_PACKS = 6


def _blocks() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    first = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU())
    second = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU())
    return first, second


def _run(middle: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor], outer: Callable[[], object] | None = None) -> tuple[list[torch.Tensor], int]:
    """One swap-all iteration; the parameter gradients and the runtime's packs."""
    first, second = _blocks()
    model = torch.nn.Sequential(first, second)
    rt = cswap.Runtime("swap", device="cpu", min_bytes=0, model=model, d2h_gbps=1.0, h2d_gbps=1.0)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    with (outer() if outer is not None else _nothing()), rt.iteration():
        middle(second, first(x)).square().mean().backward()
    return [p.grad for p in model.parameters()], rt.stats().packed_tensors


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _plain_grads() -> list[torch.Tensor]:
    first, second = _blocks()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    second(first(x)).square().mean().backward()
    return [p.grad for p in (*first.parameters(), *second.parameters())]


def _assert_same(expected: list[torch.Tensor], got: list[torch.Tensor]) -> None:
    assert all(torch.equal(e, g) for e, g in zip(expected, got, strict=True)), "gradients differ from plain PyTorch"


def test_without_checkpointing_cswap_sees_every_save() -> None:
    grads, packs = _run(lambda block, h: block(h))
    _assert_same(_plain_grads(), grads)
    assert packs == PLAIN_PACKS


def test_a_non_reentrant_checkpoint_wins_inside_its_region() -> None:
    grads, packs = _run(lambda block, h: checkpoint(block, h, use_reentrant=False))
    _assert_same(_plain_grads(), grads)
    # The first block's two saves, the checkpoint's input, the square's input: none from inside.
    assert packs == 4


def test_a_reentrant_checkpoint_recomputes_through_cswaps_hooks() -> None:
    grads, packs = _run(lambda block, h: checkpoint(block, h, use_reentrant=True))
    _assert_same(_plain_grads(), grads)
    # Forward saves the region's input only; backward's recomputation saves the region again, through cswap.
    assert packs == PLAIN_PACKS + 1


@pytest.mark.parametrize("where", ["inside", "around"])
def test_only_the_innermost_saved_tensors_hooks_apply(where: str) -> None:
    seen: list[torch.Size] = []

    def user_hooks() -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t.shape) or t, lambda t: t)

    if where == "inside":
        def middle(block: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
            with user_hooks():
                return block(h)

        grads, packs = _run(middle)
        assert (len(seen), packs) == (SECOND_BLOCK_PACKS, PLAIN_PACKS - SECOND_BLOCK_PACKS)
    else:
        grads, packs = _run(lambda block, h: block(h), outer=user_hooks)
        assert (len(seen), packs) == (0, PLAIN_PACKS)
    _assert_same(_plain_grads(), grads)
