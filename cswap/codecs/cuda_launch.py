"""What every Numba CUDA backend does with its launch: check it, and fall back when the device refuses it.

A launch config tuned on one GPU may not run on another (too many threads, registers or shared
memory per block). The kernels then run with :class:`~cswap.codecs.launch.CudaLaunch` defaults,
and one warning per refused config says so, so that training goes on.

Example:
    >>> check_launch(None) == CudaLaunch()
    True
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import TypeVar

from cswap.codecs import cuda_adapter
from cswap.codecs.launch import CudaLaunch, Launch

__all__ = ["check_launch", "with_fallback"]

_T = TypeVar("_T")


def check_launch(launch: Launch | None) -> CudaLaunch:
    """The launch to use: :class:`CudaLaunch` defaults for ``None``, ``ValueError`` for other types.

    Example:
        >>> check_launch(None) == CudaLaunch()
        True
    """
    if launch is None:
        return CudaLaunch()
    if not isinstance(launch, CudaLaunch):
        raise ValueError(
            f"backend 'cuda' takes a CudaLaunch (grid and block of each kernel), got {type(launch).__name__}: "
            "pass CudaLaunch(...), its to_params() dict, or None for the default"
        )
    return launch


class _RefusedLaunches:
    """Launch configs the device refused in this process; each is warned about once, then skipped."""

    def __init__(self) -> None:
        self._refused: set[CudaLaunch] = set()
        self._lock = threading.Lock()

    def __contains__(self, launch: CudaLaunch) -> bool:
        with self._lock:
            return launch in self._refused

    def add(self, launch: CudaLaunch, fallback: CudaLaunch, error: BaseException) -> None:
        with self._lock:
            if launch in self._refused:
                return
            self._refused.add(launch)
        warnings.warn(
            f"the GPU refused CUDA launch config {launch.to_params()} ({type(error).__name__}: {error}); "
            f"using the default config {fallback.to_params()} instead for the rest of this process. "
            "Re-tune the kernels for this device (cswap tune) to replace the stored config.",
            RuntimeWarning,
            stacklevel=6,  # the caller of cswap.codecs.compress / decompress
        )


@functools.cache
def _refused_launches() -> _RefusedLaunches:
    return _RefusedLaunches()


def with_fallback(launch: CudaLaunch, chunk_words: int, run: Callable[[CudaLaunch], _T]) -> _T:
    """``run(launch)``; if the device refuses it, ``run`` again with the defaults (same chunking).

    Every kernel rewrites its whole output, so a rerun after a partial failure is still exact.
    """
    fallback = CudaLaunch(chunk_words=chunk_words)
    refused = _refused_launches()
    if launch == fallback:
        return run(launch)
    if launch in refused:
        return run(fallback)
    try:
        return run(launch)
    except cuda_adapter.launch_errors() as error:
        refused.add(launch, fallback, error)
        return run(fallback)
