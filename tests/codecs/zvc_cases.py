"""Shared cases for the codec tests: backends that run here, tensors built from bit patterns, byte views.

Tensors are built from raw bits (NumPy unsigned integers viewed as the dtype), so NaN payloads,
``-0.0``, infinities and denormals are exact inputs rather than whatever arithmetic produces.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from cswap.codecs import SUPPORTED_DTYPES, CpuLaunch, CudaLaunch, Launch
from cswap.codecs.zvc import ZVC

__all__ = [
    "BACKENDS",
    "DTYPES",
    "SIMULATOR",
    "SPECIAL_BITS",
    "as_bytes",
    "device_for",
    "itemsize",
    "launch_for",
    "tensor_from_bits",
]

#: Under the CUDA simulator every kernel launch is slow: tests shrink their tensors.
SIMULATOR: bool = os.environ.get("NUMBA_ENABLE_CUDASIM", "") == "1"

BACKENDS: tuple[str, ...] = ZVC.available_backends()
DTYPES: tuple[torch.dtype, ...] = SUPPORTED_DTYPES

_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SIGNED = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}
_TORCH_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

#: Nonzero bit patterns that must survive exactly, by element width: negative zero, quiet and
#: signalling NaNs with payloads, infinities, the smallest and largest denormals (as floats), and
#: the integer extremes (as integers).
SPECIAL_BITS: dict[int, tuple[int, ...]] = {
    1: (0x80, 0xFF, 0x01, 0x7F),
    2: (0x8000, 0x7E01, 0xFC01, 0x7C00, 0xFC00, 0x0001, 0x83FF, 0x7FC1, 0xFF81, 0x7F80, 0x807F, 0xFFFF),
    4: (0x80000000, 0x7FC00001, 0xFFC12345, 0x7F800001, 0x7F800000, 0xFF800000, 0x00000001, 0x807FFFFF, 0xFFFFFFFF),
    8: (
        0x8000000000000000,
        0x7FF8000000000001,
        0xFFF0000000000001,
        0x7FF0000000000000,
        0xFFF0000000000000,
        0x0000000000000001,
        0x800FFFFFFFFFFFFF,
        0xFFFFFFFFFFFFFFFF,
    ),
}


def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype``."""
    return torch.empty((), dtype=dtype).element_size()


def tensor_from_bits(
    shape: tuple[int, ...], dtype: torch.dtype, density: float, seed: int, special_fraction: float = 0.0
) -> torch.Tensor:
    """A tensor of random bit patterns with about ``density`` of them nonzero.

    Args:
        shape: the tensor's shape (``()`` for a 0-d tensor).
        dtype: any supported dtype; ``bool`` gets only 0 and 1.
        density: probability that an element is nonzero.
        seed: NumPy generator seed.
        special_fraction: probability that a nonzero element is one of :data:`SPECIAL_BITS`.
    """
    rng = np.random.default_rng(seed)
    numel = math.prod(shape)
    width = itemsize(dtype)
    unsigned = _UNSIGNED[width]
    if dtype == torch.bool:
        bits = np.ones(numel, dtype=np.uint8)
    else:
        bits = rng.integers(1, np.iinfo(unsigned).max, size=numel, dtype=unsigned, endpoint=True)
        specials = np.array(SPECIAL_BITS[width], dtype=unsigned)
        use_special = rng.random(numel) < special_fraction
        bits[use_special] = rng.choice(specials, size=int(use_special.sum()))
    bits[rng.random(numel) >= density] = 0
    flat = torch.from_numpy(bits.view(_SIGNED[width]).copy()).view(_TORCH_BITS[width]).view(dtype)
    return flat.reshape(shape)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes in logical order, on the CPU (works for 0-d tensors and bool)."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    if flat.numel() == 0:  # an empty tensor may carry stride 0, which view(dtype) refuses
        return torch.empty(0, dtype=torch.uint8)
    return flat.view(torch.uint8)


def device_for(backend: str) -> torch.device:
    """Where ``backend`` wants its tensors: the GPU for ``cuda`` on a GPU machine, else the CPU."""
    if backend == "cuda" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def launch_for(backend: str, chunk_words: int) -> Launch | None:
    """The backend's default launch with ``chunk_words`` (the torch backend reads it from any launch)."""
    if backend == "cuda":
        return CudaLaunch(chunk_words=chunk_words)
    return CpuLaunch(chunk_words=chunk_words)
