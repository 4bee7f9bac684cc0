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

__all__ = ["SERIAL_BELOW_BYTES", "check_launch", "require_cpu", "threads", "threads_for"]

#: Tensors smaller than this run on one thread when the launch leaves the count to Numba. Numba's
#: OpenMP layer shares its runtime with torch's intra-op threads, which spin for a while after every
#: torch op; a parallel region started then waits for them to yield the cores. Measured on a 2-core
#: host (2026-11-27): ZVC of 8 MiB took 1.1 ms on one thread and 13-15 ms on two (1.2 ms on two with
#: ``OMP_WAIT_POLICY=passive``, 1.2 ms with Numba's workqueue layer), and a 640-element tensor 30 us
#: against 12 ms. One thread ZVC-codes 16 MiB in about 2.3 ms, so below that parallelism has little
#: to win and a scheduler slice to lose; a tuned launch (``cswap tune``) names its own count.
SERIAL_BELOW_BYTES = 16 * 1024 * 1024


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


def threads_for(launch: CpuLaunch, nbytes: int) -> int | None:
    """The worker count for a tensor of ``nbytes``: the launch's, else one below :data:`SERIAL_BELOW_BYTES`.

    Example:
        >>> threads_for(CpuLaunch(), 1000), threads_for(CpuLaunch(), 1 << 25), threads_for(CpuLaunch(threads=2), 1000)
        (1, None, 2)
    """
    if launch.threads is not None:
        return launch.threads
    return 1 if nbytes < SERIAL_BELOW_BYTES else None


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
