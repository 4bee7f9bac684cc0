"""What every Numba CPU backend does with its launch: check it, run on its thread count, refuse device tensors.

Example:
    >>> check_launch(None)
    CpuLaunch(threads=None, chunk_words=32)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numba
import torch

from cswap.codecs.launch import CpuLaunch

__all__ = ["check_launch", "require_cpu", "threads"]


def check_launch(launch: object) -> CpuLaunch:
    """The launch to use: ``CpuLaunch()`` for ``None``, the given :class:`CpuLaunch`, else ``ValueError``.

    Example:
        >>> check_launch(CpuLaunch(threads=1)).threads
        1
    """
    if launch is None:
        return CpuLaunch()
    if isinstance(launch, CpuLaunch):
        return launch
    raise ValueError(
        f"backend 'cpu' takes a CpuLaunch(threads=..., chunk_words=...), got {type(launch).__name__}: {launch!r}. "
        "Pass a CpuLaunch, its dict, or None for the default."
    )


@contextmanager
def threads(count: int | None) -> Iterator[None]:
    """Run Numba's parallel loops on ``count`` workers (at most NUMBA_NUM_THREADS), then restore."""
    if count is None:
        yield
        return
    previous = numba.get_num_threads()
    numba.set_num_threads(min(count, numba.config.NUMBA_NUM_THREADS))
    try:
        yield
    finally:
        numba.set_num_threads(previous)


def require_cpu(what: str, tensor: torch.Tensor) -> None:
    """``ValueError`` naming ``what`` when ``tensor`` is not on the CPU."""
    if tensor.device.type != "cpu":
        raise ValueError(
            f"backend 'cpu' works on CPU tensors, but {what} is on {tensor.device}: "
            "move it with .cpu() or use backend='cuda'"
        )
