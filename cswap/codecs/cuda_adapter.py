"""Hand torch tensors to Numba CUDA kernels, on a real GPU or under Numba's CUDA simulator.

On a GPU, tensors travel as zero-copy device arrays (``numba.cuda.as_cuda_array``) and kernels are
enqueued on torch's current stream of the tensor's device, so they order with the torch work around
them without any synchronisation. Under ``NUMBA_ENABLE_CUDASIM=1`` (CI has no GPU) neither exists:
tensors must live on the CPU, travel as NumPy views of their memory (writes land in the tensor),
and kernels run without a stream.

Example:
    >>> import torch
    >>> from cswap.codecs import cuda_adapter
    >>> t = torch.zeros(4, dtype=torch.int32, device="cuda")  # doctest: +SKIP
    >>> with cuda_adapter.launcher(t.device) as launch:  # doctest: +SKIP
    ...     launch(kernel, 1, 32, cuda_adapter.as_array(t))
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "Launcher",
    "as_array",
    "check_tensor",
    "gpu_available",
    "launch_errors",
    "launcher",
    "simulator_enabled",
]

_LOW_OCCUPANCY_WARNING = r"Grid size \d+ will likely result in GPU under-utilization"


def _restore_numpy_aliases() -> None:
    """Give NumPy back ``row_stack`` (an alias of ``vstack`` that recent NumPy releases removed) when it lacks it.

    numba-cuda registers an overload for ``np.row_stack`` when its CUDA target first compiles; on a
    NumPy without the alias that raises ``AttributeError`` and no kernel compiles at all.
    """
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack  # type: ignore[attr-defined]


_restore_numpy_aliases()


def simulator_enabled() -> bool:
    """Whether Numba runs CUDA kernels in its simulator (``NUMBA_ENABLE_CUDASIM=1``).

    Numba reads the variable once, when it is first imported; its own config is the truth after
    that, the environment before.

    Example:
        >>> isinstance(simulator_enabled(), bool)
        True
    """
    import numba

    config = getattr(numba, "config", None)
    if config is not None and hasattr(config, "ENABLE_CUDASIM"):
        return bool(config.ENABLE_CUDASIM)
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def gpu_available() -> bool:
    """Whether both torch and Numba can use a real CUDA device here (never raises).

    Example:
        >>> isinstance(gpu_available(), bool)
        True
    """
    if simulator_enabled():
        return False
    try:
        from numba import cuda

        return bool(torch.cuda.is_available() and cuda.is_available())
    except Exception:  # a broken driver install must read as "no GPU", not crash an import
        return False


def launch_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean "this launch configuration cannot run here" rather than "the data is bad".

    ``CudaAPIError`` covers launches refused by the driver (too many threads, registers or shared
    memory for the block); ``LinkerError`` covers kernels that fail to link for the device.
    """
    from numba.cuda.cudadrv.driver import CudaAPIError, LinkerError

    return (CudaAPIError, LinkerError)


def check_tensor(t: torch.Tensor, name: str = "tensor") -> None:
    """Raise ``ValueError`` unless ``t`` lives where the kernels can read it.

    On a GPU that is a CUDA device; under the simulator, the CPU.

    Args:
        t: the tensor the kernels will read or write.
        name: what to call it in the error message.
    """
    if simulator_enabled():
        if t.device.type != "cpu":
            raise ValueError(
                f"backend 'cuda' under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) runs on CPU tensors, "
                f"but the {name} is on {t.device}: move it with .cpu() or unset NUMBA_ENABLE_CUDASIM"
            )
    elif t.device.type != "cuda":
        raise ValueError(
            f"backend 'cuda' needs CUDA tensors, but the {name} is on {t.device}: "
            "move it to the GPU with .cuda(), or use backend='cpu' (or 'torch') for host tensors"
        )


def as_array(t: torch.Tensor, dtype: np.dtype | type | None = None) -> Any:
    """A kernel argument that shares ``t``'s memory, so the kernel's writes land in ``t``.

    Args:
        t: the tensor; ``detach()`` is applied because Numba refuses tensors that require grad.
        dtype: reinterpret the elements as this NumPy dtype of the same width (e.g. ``np.uint32``
            for the int32 bitmap, so popcounts see unsigned words).

    Returns:
        A Numba device array on a GPU, a NumPy array under the simulator.
    """
    t = t.detach()
    if simulator_enabled():
        array = t.numpy()
    else:
        from numba import cuda

        # No sync on import: the kernels run on torch's current stream, already ordered after t's producers.
        array = cuda.as_cuda_array(t, sync=False)
    return array if dtype is None else array.view(dtype)


@dataclass(frozen=True)
class Launcher:
    """Launches kernels with a given grid and block on one stream (``None`` under the simulator).

    Args:
        stream: a Numba stream wrapping torch's current stream, or ``None``.
    """

    stream: Any

    def __call__(self, kernel: Any, grid: int, block: int, *args: Any) -> None:
        """Run ``kernel[grid, block, stream](*args)``."""
        if self.stream is None:
            kernel[grid, block](*args)
            return
        # Small grids are deliberate here (a small tensor, the single-block scan): Numba's
        # low-occupancy warning would fire on every call, so it is silenced for these launches only.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_LOW_OCCUPANCY_WARNING)
            kernel[grid, block, self.stream](*args)


@contextmanager
def launcher(device: torch.device) -> Iterator[Launcher]:
    """Make ``device`` Numba's current device and yield a :class:`Launcher` on torch's current stream.

    Capture happens here, at entry: inside a ``torch.cuda.stream(s)`` block the kernels go on ``s``.

    Args:
        device: the device of the tensors the kernels will touch.
    """
    if simulator_enabled():
        _thread_safe_simulator_shared_arrays()
        yield Launcher(stream=None)
        return
    from numba import cuda

    index = device.index if device.index is not None else torch.cuda.current_device()
    with cuda.gpus[index]:
        stream = cuda.external_stream(torch.cuda.current_stream(index).cuda_stream)
        yield Launcher(stream=stream)


@functools.cache
def _thread_safe_simulator_shared_arrays() -> None:
    """Make the simulator hand every thread of a block the same ``cuda.shared.array``.

    Numba's simulator runs a block's threads as Python threads, and its ``FakeCUDAShared.array``
    looks the array up by call site and, if missing, creates and stores one: an unlocked
    check-then-insert. When the interpreter switches threads between the two, two threads each
    create their own "shared" array, and a thread then reads slots the others never wrote to its
    copy: uninitialised ``np.empty`` memory. That is what gave the scan garbage offsets (and nnz)
    now and then; on a GPU shared memory is one per block, so the kernels need no change.
    ``dict.setdefault`` is atomic under the GIL, so every thread ends up with the first array stored.
    """
    try:
        from numba.core import types
        from numba.cuda.simulator.kernelapi import FakeCUDAShared
        from numba.np import numpy_support
    except ImportError:  # a Numba without this simulator layout: leave it as it is
        return
    racy_array = FakeCUDAShared.array

    def array(self: Any, shape: Any, dtype: Any) -> Any:
        if shape == 0 or not isinstance(getattr(self, "_allocations", None), dict):
            return racy_array(self, shape, dtype)  # dynamic shared memory is allocated up front: no race
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)
        # Keyed by call site, as Numba does (one shared array per line of kernel source).
        key = (caller.f_code.co_filename, caller.f_lineno)
        found = self._allocations.get(key)
        if found is not None:
            return found
        return self._allocations.setdefault(key, np.empty(shape, dtype))

    FakeCUDAShared.array = array
