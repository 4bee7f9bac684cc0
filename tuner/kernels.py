"""What is tuned: kernel names ``zvc.<backend>.<op>``, their source hashes, dtype names and size buckets.

A tuned config is only reused for the kernel source it was measured with: the hash of the backend
module's source is part of every store key, so editing a kernel retires its old configs.

Example:
    >>> parse_kernel("zvc.cpu.compress")
    ('cpu', 'compress')
    >>> dtype_name(torch.bfloat16)
    'bfloat16'
    >>> bucket_nbytes(12) == 16 * 2**20
    True
"""

from __future__ import annotations

import hashlib
import importlib
import inspect

import torch

from cswap.codecs.format import SUPPORTED_DTYPES
from cswap.tuner.space import BACKENDS, OPS

__all__ = [
    "KERNELS",
    "bucket_nbytes",
    "dtype_name",
    "kernel_name",
    "kernel_source_hash",
    "parse_dtype",
    "parse_kernel",
]

_CODEC = "zvc"
#: Every tunable kernel name.
KERNELS: tuple[str, ...] = tuple(f"{_CODEC}.{b}.{op}" for b in BACKENDS for op in OPS)
_BACKEND_MODULES = {"cpu": "cswap.codecs.zvc_cpu", "cuda": "cswap.codecs.zvc_cuda"}


def kernel_name(backend: str, op: str) -> str:
    """``zvc.<backend>.<op>``, checked against :data:`KERNELS`.

    Example:
        >>> kernel_name("cuda", "decompress")
        'zvc.cuda.decompress'
    """
    name = f"{_CODEC}.{backend}.{op}"
    parse_kernel(name)
    return name


def parse_kernel(name: str) -> tuple[str, str]:
    """``(backend, op)`` of a kernel name; ``ValueError`` naming the valid ones otherwise."""
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r}: valid kernels are {', '.join(KERNELS)}")
    _, backend, op = name.split(".")
    return backend, op


def kernel_source_hash(backend: str) -> str:
    """The hex SHA-256 of the backend's kernel source.

    Uses the backend module's own ``kernel_source_hash()`` when it has one, else the SHA-256 of
    ``inspect.getsource`` of the module.

    Args:
        backend: ``cpu`` or ``cuda``.

    Example:
        >>> len(kernel_source_hash("cpu"))
        64
    """
    if backend not in _BACKEND_MODULES:
        raise ValueError(f"no tunable kernels for backend {backend!r}: choose one of {', '.join(_BACKEND_MODULES)}")
    module = importlib.import_module(_BACKEND_MODULES[backend])
    own = getattr(module, "kernel_source_hash", None)
    if callable(own):
        return str(own())
    return hashlib.sha256(inspect.getsource(module).encode()).hexdigest()


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A supported torch dtype from a dtype or its name (``"float32"`` or ``"torch.float32"``).

    Example:
        >>> parse_dtype("float16")
        torch.float16
    """
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    else:
        resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype) or resolved not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise ValueError(f"unsupported dtype {dtype!r}: choose one of {names}")
    return resolved


def dtype_name(dtype: torch.dtype | str) -> str:
    """The store's name of a dtype: ``"float32"``, ``"bfloat16"``, ..."""
    return str(parse_dtype(dtype)).removeprefix("torch.")


def bucket_nbytes(bucket: int) -> int:
    """The bytes of the representative tensor of a size bucket: ``4 ** bucket``, its lower edge.

    ``size_bucket(n)`` is ``floor(log4(n))``, so a bucket holds sizes in ``[4**b, 4**(b+1))`` and a
    size that is a power of 4 (1 MiB, 16 MiB, ...) is measured exactly.
    """
    if bucket < 0:
        raise ValueError(f"size bucket {bucket} is negative; buckets are floor(log4(nbytes)) >= 0")
    return 4**bucket
