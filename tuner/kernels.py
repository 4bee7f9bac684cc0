"""What is tuned: kernel names ``<codec>.<backend>.<op>``, their source hashes, dtype names and size buckets.

Every codec of :data:`cswap.tuner.space.TUNED_CODECS` has a kernel per backend and op
(``zvc.cpu.compress``, ``bitpack.cuda.decompress``, ``exponent.cpu.compress``, ...). The codec is the
first part of the name, and the name is part of every store key, so a config tuned for one codec
is never used for another; ZVC's names are those stores have always held.

A tuned config is only reused for the kernel source it was measured with: the hash of the backend
module's source is part of every store key, so editing a kernel retires its old configs.

Example:
    >>> parse_kernel("zvc.cpu.compress")
    ('cpu', 'compress')
    >>> split_kernel("exponent.cuda.decompress")
    ('exponent', 'cuda', 'decompress')
    >>> dtype_name(torch.bfloat16)
    'bfloat16'
    >>> default_dtype("bitpack"), default_dtype("exponent")
    ('bool', 'float32')
    >>> bucket_nbytes(12) == 16 * 2**20
    True
"""

from __future__ import annotations

import hashlib
import importlib
import inspect

import torch

from cswap.codecs.format import SUPPORTED_DTYPES
from cswap.tuner.space import BACKENDS, OPS, TUNED_CODECS, check_codec

__all__ = [
    "KERNELS",
    "bucket_nbytes",
    "codec_dtypes",
    "default_dtype",
    "dtype_name",
    "kernel_name",
    "kernel_source_hash",
    "parse_dtype",
    "parse_kernel",
    "split_kernel",
]

#: Every tunable kernel name, ZVC's first.
KERNELS: tuple[str, ...] = tuple(f"{c}.{b}.{op}" for c in TUNED_CODECS for b in BACKENDS for op in OPS)
# The modules whose source a codec backend's kernels are: the backend module, then what it builds
# its kernels from. ZVC's backend modules hash themselves (their own kernel_source_hash()).
_BACKEND_MODULES: dict[str, dict[str, tuple[str, ...]]] = {
    "zvc": {"cpu": ("cswap.codecs.zvc_cpu",), "cuda": ("cswap.codecs.zvc_cuda",)},
    "bitpack": {"cpu": ("cswap.codecs.bitpack_cpu", "cswap.codecs.intrinsics"), "cuda": ("cswap.codecs.bitpack_cuda",)},
    "exponent": {
        "cpu": ("cswap.codecs.exponent_cpu", "cswap.codecs.exponent_layout"),
        "cuda": ("cswap.codecs.exponent_cuda", "cswap.codecs.exponent_layout"),
    },
}


def kernel_name(backend: str, op: str, codec: str = "zvc") -> str:
    """``<codec>.<backend>.<op>``, checked against :data:`KERNELS`.

    Example:
        >>> kernel_name("cuda", "decompress")
        'zvc.cuda.decompress'
        >>> kernel_name("cpu", "compress", codec="bitpack")
        'bitpack.cpu.compress'
    """
    name = f"{codec}.{backend}.{op}"
    parse_kernel(name)
    return name


def split_kernel(name: str) -> tuple[str, str, str]:
    """``(codec, backend, op)`` of a kernel name; ``ValueError`` naming the valid ones otherwise."""
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r}: valid kernels are {', '.join(KERNELS)}")
    codec, backend, op = name.split(".")
    return codec, backend, op


def parse_kernel(name: str) -> tuple[str, str]:
    """``(backend, op)`` of a kernel name; ``ValueError`` naming the valid ones otherwise."""
    _, backend, op = split_kernel(name)
    return backend, op


def kernel_source_hash(backend: str, codec: str = "zvc") -> str:
    """The hex SHA-256 of a codec backend's kernel source.

    Uses the backend module's own ``kernel_source_hash()`` when it has one, else the SHA-256 of
    ``inspect.getsource`` of the modules its kernels are made of.

    Args:
        backend: ``cpu`` or ``cuda``.
        codec: ``zvc`` (default), ``bitpack`` or ``exponent``.

    Example:
        >>> len(kernel_source_hash("cpu")), kernel_source_hash("cpu") != kernel_source_hash("cpu", "bitpack")
        (64, True)
    """
    modules = _BACKEND_MODULES[check_codec(codec)]
    if backend not in modules:
        raise ValueError(f"no tunable kernels for backend {backend!r}: choose one of {', '.join(modules)}")
    first, *rest = (importlib.import_module(name) for name in modules[backend])
    own = getattr(first, "kernel_source_hash", None)
    if callable(own) and not rest:
        return str(own())
    return hashlib.sha256("".join(inspect.getsource(m) for m in (first, *rest)).encode()).hexdigest()


def codec_dtypes(codec: str) -> tuple[torch.dtype, ...]:
    """The dtypes ``codec`` takes (ZVC: every supported dtype).

    Example:
        >>> codec_dtypes("bitpack")
        (torch.bool, torch.uint8)
    """
    if check_codec(codec) == "bitpack":
        from cswap.codecs.bitpack import BITPACK_DTYPES

        return BITPACK_DTYPES
    if codec == "exponent":
        from cswap.codecs.exponent_layout import EXPONENT_DTYPES

        return EXPONENT_DTYPES
    return SUPPORTED_DTYPES


def default_dtype(codec: str) -> str:
    """The dtype a codec is tuned for when none is named: ``float32`` where it takes it, else its first dtype."""
    dtypes = codec_dtypes(codec)
    return "float32" if torch.float32 in dtypes else str(dtypes[0]).removeprefix("torch.")


def parse_dtype(dtype: torch.dtype | str, codec: str | None = None) -> torch.dtype:
    """A supported torch dtype from a dtype or its name (``"float32"`` or ``"torch.float32"``).

    Args:
        dtype: the dtype or its name.
        codec: also require that this codec takes it (``None``: any dtype a codec takes).

    Example:
        >>> parse_dtype("float16")
        torch.float16
        >>> parse_dtype("float32", codec="bitpack")
        Traceback (most recent call last):
        ...
        ValueError: codec 'bitpack' does not take dtype 'float32': choose one of bool, uint8
    """
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    else:
        resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype) or resolved not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise ValueError(f"unsupported dtype {dtype!r}: choose one of {names}")
    if codec is not None and resolved not in codec_dtypes(codec):
        names = ", ".join(str(d).removeprefix("torch.") for d in codec_dtypes(codec))
        raise ValueError(f"codec {codec!r} does not take dtype {str(resolved).removeprefix('torch.')!r}: choose one of {names}")
    return resolved


def dtype_name(dtype: torch.dtype | str, codec: str | None = None) -> str:
    """The store's name of a dtype: ``"float32"``, ``"bfloat16"``, ... (checked against ``codec``'s dtypes when given)."""
    return str(parse_dtype(dtype, codec)).removeprefix("torch.")


def bucket_nbytes(bucket: int) -> int:
    """The bytes of the representative tensor of a size bucket: ``4 ** bucket``, its lower edge.

    ``size_bucket(n)`` is ``floor(log4(n))``, so a bucket holds sizes in ``[4**b, 4**(b+1))`` and a
    size that is a power of 4 (1 MiB, 16 MiB, ...) is measured exactly.
    """
    if bucket < 0:
        raise ValueError(f"size bucket {bucket} is negative; buckets are floor(log4(nbytes)) >= 0")
    return 4**bucket
