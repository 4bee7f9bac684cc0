"""Capuchin's passive mode on a real out-of-memory error: swap what is kept, then run the op again.

A profiling iteration that keeps every saved tensor (to measure them as they are) may not fit on
the device, although the plan made from it would. :class:`SwapOnOutOfMemory` is a
``TorchDispatchMode`` that catches :class:`torch.OutOfMemoryError` from any ATen op of the
iteration, forward and backward, asks its ``evict`` callback to move saved tensors off the device
(:meth:`cswap.execute.executor.Executor.evict_kept`), and runs the op again; only when nothing is left to
evict does the error reach the caller. A failed op is safe to run again: the mode sits below
autograd, so the retry records nothing twice, and ATen ops allocate their outputs (where the error
comes from) before they write or draw random numbers.

Example:
    >>> import torch
    >>> evicted = []
    >>> failures = iter([True])
    >>> def evict() -> int:
    ...     evicted.append("kept tensors")
    ...     return 1
    >>> lib = torch.library.Library("cswap_passive_doc", "DEF")
    >>> _ = lib.define("grow(Tensor x) -> Tensor")
    >>> def grow(x):
    ...     if next(failures, False):
    ...         raise torch.OutOfMemoryError("out of memory")
    ...     return x * 2
    >>> lib.impl("grow", grow, "CPU")
    >>> with SwapOnOutOfMemory(evict) as mode:
    ...     out = torch.ops.cswap_passive_doc.grow(torch.ones(2))
    >>> out.tolist(), evicted, mode.retries
    ([2.0, 2.0], ['kept tensors'], 1)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SwapOnOutOfMemory"]


class SwapOnOutOfMemory(TorchDispatchMode):
    """Run every ATen op; on :class:`torch.OutOfMemoryError` evict, then run it again.

    Args:
        evict: moves saved tensors off the device; returns how many it moved (0: nothing left,
            and the error is raised).

    Attributes:
        retries: ops run again after an eviction.
    """

    def __init__(self, evict: Callable[[], int]) -> None:
        super().__init__()
        self._evict = evict
        self.retries = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        while True:
            try:
                return func(*args, **kwargs)
            except torch.OutOfMemoryError:
                if not self._evict():
                    raise
                self.retries += 1
