"""Device memory over one training iteration, measured under each policy side by side.

For each policy a fresh :class:`cswap.Runtime` trains a copy of the model for two iterations on
the same batch; the second (planned) iteration is sampled at every leaf module's forward and at
every gradient of a module output in backward. On CUDA a sample is
``torch.cuda.memory_allocated``; on CPU it is the runtime's resident activation bytes
(``stats().resident_bytes``). Policy ``none`` installs hooks only while profiling, and its
profiling iteration keeps everything exactly as plain PyTorch does, so it is sampled there.

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> lines = measure_memory_timeline(model, torch.randn(4, 8), torch.tensor([0, 1, 0, 1]), ("none", "swap"),
    ...                                 torch.device("cpu"), min_bytes=0)
    >>> sorted(lines)
    ['none', 'swap']
"""

from __future__ import annotations

import copy
import time
from typing import Any
from collections.abc import Callable, Sequence

import torch
from torch import nn

from cswap.runtime import Runtime

__all__ = ["MemorySample", "measure_memory_timeline"]

#: (seconds since the iteration started, bytes).
MemorySample = tuple[float, int]


def _sampler(runtime: Runtime, device: torch.device, start: list[float], samples: list[MemorySample]) -> Callable[[], None]:
    def sample() -> None:
        if device.type == "cuda":
            nbytes = torch.cuda.memory_allocated(device)
        else:
            nbytes = runtime.stats().resident_bytes
        samples.append((time.perf_counter() - start[0], int(nbytes)))

    return sample


def _install(model: nn.Module, sample: Callable[[], None], armed: list[bool]) -> list[Any]:
    def forward_hook(module: nn.Module, inputs: Any, output: Any) -> None:
        if not armed[0]:
            return
        sample()
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: sample())

    return [m.register_forward_hook(forward_hook) for m in model.modules() if not list(m.children())]


def measure_memory_timeline(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    policies: Sequence[str],
    device: torch.device,
    **runtime_options: Any,
) -> dict[str, list[MemorySample]]:
    """Sample device memory through one iteration under each policy.

    Args:
        model: the model (copied per policy; the original is not touched).
        images, labels: one batch on ``device``.
        policies: runtime policies to compare.
        device: where training runs.
        runtime_options: passed to every :class:`Runtime` (``min_bytes``, ``launch_lookup``...).

    Returns:
        Policy -> samples ``(seconds since the iteration began, bytes)``.
    """
    loss_fn = nn.CrossEntropyLoss()
    lines: dict[str, list[MemorySample]] = {}
    for policy in policies:
        replica = copy.deepcopy(model).to(device).train()
        runtime = Runtime(policy=policy, model=replica, device=str(device), **runtime_options)
        samples: list[MemorySample] = []
        start = [0.0]
        armed = [False]
        handles = _install(replica, _sampler(runtime, device, start, samples), armed)
        try:
            for iteration in range(2):
                armed[0] = iteration == (0 if policy == "none" else 1)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start[0] = time.perf_counter()
                with runtime.iteration():
                    loss_fn(replica(images), labels).backward()
                replica.zero_grad(set_to_none=True)
        finally:
            for handle in handles:
                handle.remove()
        lines[policy] = samples
    return lines
