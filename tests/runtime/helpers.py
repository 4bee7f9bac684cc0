"""Helpers of the runtime tests: deterministic training runs with and without cswap, exact comparisons."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

import cswap
from cswap.codecs.launch import CpuLaunch, Launch
from cswap.profile.codec_speed import CodecSpeed, OpSpeed

#: A codec so fast and a link so slow that the cost model compresses every sparse tensor and swaps
#: the dense ones: cswap runs exercise both paths.
FAST_CODEC = CodecSpeed(backend="cpu", compress=OpSpeed(1e-7, 0.0, 0.0), decompress=OpSpeed(1e-7, 0.0, 0.0))
SLOW_LINK = {"d2h_gbps": 0.01, "h2d_gbps": 0.01}

Batch = tuple[torch.Tensor, torch.Tensor]


def one_thread_below_1mib(backend: str, op: str, dtype: torch.dtype, nbytes: int) -> Launch | None:
    """A launch lookup like a tuned CPU store's: one thread for small tensors, where waking a
    thread team costs more than the work."""
    return CpuLaunch(threads=1) if backend == "cpu" and nbytes < (1 << 20) else None


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` (NaN-safe, -0.0-sensitive comparisons)."""
    return t.detach().contiguous().view(-1).view(torch.uint8)


def assert_bit_equal(expected: Sequence[torch.Tensor], actual: Sequence[torch.Tensor], what: str = "tensor") -> None:
    """Every tensor of ``actual`` has exactly the bytes, shape and dtype of ``expected``'s."""
    assert len(expected) == len(actual), f"{len(actual)} {what}s, expected {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, actual)):
        assert e.shape == a.shape and e.dtype == a.dtype, f"{what} {i}: {a.dtype}{tuple(a.shape)} vs {e.dtype}{tuple(e.shape)}"
        assert torch.equal(bits(e), bits(a)), f"{what} {i} differs from plain PyTorch"


def train(
    build: Callable[[], torch.nn.Module],
    batches: Sequence[Batch],
    epochs: int,
    runtime: Callable[[torch.nn.Module], Any] | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.nn.functional.cross_entropy,
    trained: list[torch.nn.Module] | None = None,
    micro_batches: int = 1,
) -> tuple[list[list[torch.Tensor]], Any]:
    """SGD over ``batches`` for ``epochs``; returns every iteration's parameter gradients and the runtime.
    The trained model is appended to ``trained`` when given (for its final ``state_dict``). With
    ``micro_batches`` > 1 each batch is split into that many, each with its own forward and backward
    (gradient accumulation), all inside one iteration.

    Dropout draws from a per-iteration seed, so runs with and without the runtime see the same masks.
    """
    torch.manual_seed(0)
    model = build()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rt = runtime(model) if runtime is not None else None
    if trained is not None:
        trained.append(model)
    grads: list[list[torch.Tensor]] = []
    for epoch in range(epochs):
        if rt is not None:
            rt.new_epoch()
        for i, (x, y) in enumerate(batches):
            with torch.random.fork_rng():
                torch.manual_seed(1000 * epoch + i)
                with rt.iteration() if rt is not None else contextlib.nullcontext():
                    for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True):
                        (loss_fn(model(xs), ys) / micro_batches).backward()
            grads.append([p.grad.detach().clone() for p in model.parameters()])
            optimizer.step()
            optimizer.zero_grad()
    return grads, rt


def batches(n: int, shape: tuple[int, ...], classes: int, seed: int = 1) -> list[Batch]:
    """``n`` random (input, label) batches."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g), torch.randint(0, classes, (shape[0],), generator=g)) for _ in range(n)]


def runtime_for(policy: str, **options: Any) -> Callable[[torch.nn.Module], cswap.Runtime]:
    """A factory of a CPU runtime that offloads everything (``min_bytes=0``)."""
    defaults: dict[str, Any] = {"device": "cpu", "min_bytes": 0, "launch_lookup": one_thread_below_1mib, **SLOW_LINK}
    if policy == "cswap":
        defaults["time_model"] = FAST_CODEC
    defaults.update(options)
    return lambda model: cswap.Runtime(policy, model=model, **defaults)


def causal_lm_steps(
    build: Callable[[], torch.nn.Module], lengths: Sequence[int], rt_for: Callable[[torch.nn.Module], cswap.Runtime] | None = None,
) -> tuple[list[torch.Tensor], list[tuple[int, int | None]], cswap.Runtime | None]:
    """Train a causal LM ``build`` makes one step per length of ``lengths`` (two rows of tokens,
    seeded by the step), under the runtime ``rt_for`` makes for it (``None``: plain PyTorch).

    Returns:
        every step's gradients in order; per step, the runtime's peak resident bytes in it and its
        plan's budget after it (empty without a runtime); the runtime.
    """
    model = build()
    rt = rt_for(model) if rt_for is not None else None
    grads: list[torch.Tensor] = []
    steps: list[tuple[int, int | None]] = []
    for step, length in enumerate(lengths):
        ids = torch.randint(3, 250, (2, length), generator=torch.Generator().manual_seed(step))
        with rt.iteration() if rt is not None else contextlib.nullcontext():
            model(input_ids=ids, labels=ids).loss.backward()
        grads += [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad(set_to_none=True)
        if rt is not None:
            steps.append((rt.stats().iteration_peak_resident_bytes, rt.plan().budget_bytes))
    return grads, steps, rt
