"""The largest batch that trains under each policy on this GPU (or an emulated smaller one).

A batch "trains" when two iterations (the profiling one and a planned one) of forward, backward
and an SGD step finish without running out of device memory. The search doubles the batch until
it fails, then bisects between the last success and the first failure.
``torch.cuda.set_per_process_memory_fraction`` caps the allocator so a large GPU can stand in for
a smaller one (``memory_limit_bytes``).

Example:
    >>> largest_fitting(lambda batch: batch <= 37, start=1, ceiling=1024)
    37
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Sequence

import torch
from torch import nn

from cswap import models
from cswap.runtime import Runtime

__all__ = ["batch_fits", "largest_fitting", "max_batch", "parse_bytes"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``"16GiB"`` -> 17179869184; decimal (GB) and binary (GiB) units.

    Example:
        >>> parse_bytes("1.5 MiB")
        1572864
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size: write e.g. 16GiB, 12GB or 500MiB")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def largest_fitting(fits: Callable[[int], bool], start: int = 1, ceiling: int = 1 << 16) -> int:
    """The largest batch in ``[start, ceiling]`` for which ``fits`` holds (0 if ``start`` fails).

    Assumes ``fits`` is monotone: a batch that fails means every larger one fails.
    """
    if not fits(start):
        return 0
    good, bad = start, None
    while bad is None:
        trial = min(good * 2, ceiling)
        if trial == good:
            return good
        if fits(trial):
            good = trial
        else:
            bad = trial
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good


def batch_fits(model: nn.Module, policy: str, batch_size: int, resolution: int, device: torch.device) -> bool:
    """Whether two training iterations at ``batch_size`` finish without a CUDA out-of-memory error.

    Every policy but ``none`` profiles swapping every tensor (Capuchin's passive mode), so the
    profiling iteration fits wherever the plan it leads to does.
    """
    runtime = Runtime(policy=policy, model=model, device=str(device), passive_profile=policy != "none")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    try:
        images = torch.randn(batch_size, 3, resolution, resolution, device=device)
        labels = torch.randint(0, 1000, (batch_size,), device=device)
        for _ in range(2):
            with runtime.iteration():
                loss_fn(model(images), labels).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        optimizer.zero_grad(set_to_none=True)
        del optimizer, runtime
        gc.collect()
        torch.cuda.empty_cache()


def max_batch(
    model_name: str,
    policies: Sequence[str],
    memory_limit_bytes: int | None = None,
    resolution: int | None = None,
    ceiling: int = 4096,
    device: str = "cuda",
) -> dict[str, int]:
    """Largest batch per policy for ``model_name`` on the GPU.

    Args:
        model_name: a name from ``cswap.models.MODEL_NAMES``.
        policies: runtime policies to compare.
        memory_limit_bytes: emulate a GPU with this much memory (``None``: the whole device).
        resolution: input size (default: the model's, 224).
        ceiling: the largest batch tried.
        device: the CUDA device.

    Raises:
        RuntimeError: no GPU (the search measures real device memory).
    """
    if not torch.cuda.is_available():
        raise RuntimeError(
            "cswap max-batch measures device memory and needs a GPU; torch sees none here "
            "(torch.cuda.is_available() is False). Use `cswap simulate` to estimate peak memory without one."
        )
    cuda = torch.device(device)
    total = torch.cuda.get_device_properties(cuda).total_memory
    if memory_limit_bytes is not None:
        if memory_limit_bytes > total:
            raise ValueError(f"--memory-limit {memory_limit_bytes} B exceeds the GPU's {total} B")
        torch.cuda.set_per_process_memory_fraction(memory_limit_bytes / total, cuda)
    resolution = resolution or models.input_size(model_name)
    model = models.build(model_name, num_classes=1000).to(cuda).train()
    try:
        return {
            policy: largest_fitting(lambda b, p=policy: batch_fits(model, p, b, resolution, cuda), ceiling=ceiling)
            for policy in policies
        }
    finally:
        if memory_limit_bytes is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, cuda)
