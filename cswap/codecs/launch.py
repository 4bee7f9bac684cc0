"""Launch configurations of the codec backends: what the tuner searches and the store keeps.

Every backend takes one frozen dataclass: :class:`CpuLaunch` (threads and chunk size) or
:class:`CudaLaunch` (grid and block of each kernel, and the chunk size). ``chunk_words`` is part of
the format (it sets the offsets table), so two backends give identical bytes only for the same one.

Example:
    >>> launch = CudaLaunch(compress_block=512)
    >>> launch.to_params()["compress_block"]
    512
    >>> CudaLaunch.from_params({"compress_block": 2000})
    Traceback (most recent call last):
    ...
    ValueError: invalid CUDA launch config: compress_block is 2000, must be a multiple of 32 between 32 and 1024
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Mapping

if TYPE_CHECKING:
    import torch

__all__ = [
    "CUDA_KERNELS",
    "DEFAULT_CHUNK_WORDS",
    "MAX_CHUNK_WORDS",
    "CpuLaunch",
    "CudaLaunch",
    "Launch",
    "LaunchLookup",
    "check_chunk_words",
    "launch_from_params",
]

#: Words per chunk in the offsets table: 32 words are 1024 elements, one CUDA block of 1024
#: threads, and cost 8 bytes of offsets per 1024 elements (under 0.1% of a float32 tensor).
DEFAULT_CHUNK_WORDS = 32

#: The largest chunk: 65536 words are 2 Mi elements per offsets entry, four times the tuner's
#: largest choice. Bounding it keeps every per-chunk buffer (a CUDA block's work, the torch
#: backend's padding) proportional to the tensor rather than to an arbitrary integer.
MAX_CHUNK_WORDS = 1 << 16


def check_chunk_words(chunk_words: object) -> str | None:
    """What is wrong with ``chunk_words`` as a chunk size, or ``None`` when it is valid.

    Example:
        >>> check_chunk_words(32) is None
        True
        >>> check_chunk_words(2**33)
        'chunk_words is 8589934592, must be an int between 1 and MAX_CHUNK_WORDS = 65536'
    """
    if isinstance(chunk_words, bool) or not isinstance(chunk_words, int) or not 1 <= chunk_words <= MAX_CHUNK_WORDS:
        return f"chunk_words is {chunk_words!r}, must be an int between 1 and MAX_CHUNK_WORDS = {MAX_CHUNK_WORDS}"
    return None

#: The CUDA kernels whose launch is configurable; each has ``<kernel>_grid`` and ``<kernel>_block``.
CUDA_KERNELS: tuple[str, ...] = ("compress", "scan", "scatter", "decompress")


def _check_chunk_words(chunk_words: int, where: str) -> None:
    problem = check_chunk_words(chunk_words)
    if problem:
        raise ValueError(f"invalid {where} launch config: {problem}")


@dataclass(frozen=True)
class CpuLaunch:
    """Launch parameters of the Numba CPU backend.

    Args:
        threads: worker threads (``None``: Numba's default, all cores).
        chunk_words: bitmap words per offsets chunk, also the unit of parallel work.
    """

    threads: int | None = None
    chunk_words: int = DEFAULT_CHUNK_WORDS

    def __post_init__(self) -> None:
        _check_chunk_words(self.chunk_words, "CPU")
        if self.threads is not None and (not isinstance(self.threads, int) or not 1 <= self.threads <= (os.cpu_count() or 1)):
            raise ValueError(
                f"invalid CPU launch config: threads is {self.threads!r}, must be between 1 and {os.cpu_count()} (the cores here)"
            )

    def to_params(self) -> dict[str, Any]:
        """Plain dict for the store and the tuner."""
        return asdict(self)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CpuLaunch:
        """Build from a dict, rejecting unknown keys by name."""
        return cls(**_known(cls, params, "CPU"))


@dataclass(frozen=True)
class CudaLaunch:
    """Grid and block of each Numba CUDA kernel (grid-stride loops make any grid >= 1 correct).

    The defaults are a safe, reasonably fast choice on any GPU: 256 threads per block, and a grid
    large enough to fill the device (kernels loop when the grid is smaller than the work).

    Args:
        compress_grid, compress_block: the bitmap + per-chunk count kernel.
        scan_grid, scan_block: the exclusive scan of chunk counts into offsets.
        scatter_grid, scatter_block: the kernel that writes the nonzero values.
        decompress_grid, decompress_block: the single decompression kernel.
        chunk_words: bitmap words per offsets chunk.
    """

    compress_grid: int = 1024
    compress_block: int = 256
    scan_grid: int = 1
    scan_block: int = 1024
    scatter_grid: int = 1024
    scatter_block: int = 256
    decompress_grid: int = 1024
    decompress_block: int = 256
    chunk_words: int = DEFAULT_CHUNK_WORDS

    def __post_init__(self) -> None:
        _check_chunk_words(self.chunk_words, "CUDA")
        for kernel in CUDA_KERNELS:
            grid = getattr(self, f"{kernel}_grid")
            block = getattr(self, f"{kernel}_block")
            if not isinstance(block, int) or block % 32 or not 32 <= block <= 1024:
                raise ValueError(
                    f"invalid CUDA launch config: {kernel}_block is {block!r}, must be a multiple of 32 between 32 and 1024"
                )
            if not isinstance(grid, int) or not 1 <= grid <= 2**31 - 1:
                raise ValueError(f"invalid CUDA launch config: {kernel}_grid is {grid!r}, must be between 1 and 2**31-1")

    def to_params(self) -> dict[str, Any]:
        """Plain dict for the store and the tuner."""
        return asdict(self)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CudaLaunch:
        """Build from a dict, rejecting unknown keys by name."""
        return cls(**_known(cls, params, "CUDA"))


Launch = CpuLaunch | CudaLaunch

#: ``launch_lookup(backend, op, dtype, nbytes)``: the launch config to use for one tensor, or ``None``
#: (``dtype`` is a ``torch.dtype``).
LaunchLookup = Callable[[str, str, "torch.dtype", int], "Launch | None"]


def _known(cls: type, params: Mapping[str, Any], where: str) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(params) - names)
    if unknown:
        raise ValueError(f"invalid {where} launch config: unknown keys {unknown}; valid keys are {sorted(names)}")
    return {k: (int(v) if v is not None else None) for k, v in params.items()}


def launch_from_params(backend: str, params: Mapping[str, Any] | None) -> Launch | None:
    """The launch dataclass of ``backend`` (``cpu`` or ``cuda``) from a dict; ``None`` for other backends.

    Example:
        >>> launch_from_params("cpu", {"threads": 1})
        CpuLaunch(threads=1, chunk_words=32)
    """
    if params is None:
        return None
    if backend == "cpu":
        return CpuLaunch.from_params(params)
    if backend == "cuda":
        return CudaLaunch.from_params(params)
    return None
