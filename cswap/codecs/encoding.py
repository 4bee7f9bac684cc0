"""How a saved tensor is encoded: exact integer narrowing, then ZVC; its inverse; and its predicted size.

ZVC drops only all-zero elements, so it cannot shrink a dense int64 index tensor (max-pool, gather
and embedding indices). Those usually hold small values, so the one encoding step first narrows an
int64 tensor to the narrowest of int8, int16 and int32 that holds every value (exact), then
ZVC-compresses it; :func:`decode` decompresses and widens back. Every other dtype goes to ZVC as it is.

What the profiler records for the encoding, :func:`value_range` (a min/max pair, kept on the device
until the trace is built), is what :meth:`Encoding.of` turns into the encoded dtype, and
:meth:`Encoding.compressed_nbytes` predicts the exact encoded size. Callers above the codecs (the
profiler, the advisor, the cost model) ask this module; none of them knows about integer widths.

Example:
    >>> import torch
    >>> t = torch.tensor([0, 5, 1000, 7] * 256)
    >>> packed = encode(t, backend="torch")
    >>> packed.dtype, packed.compressed_nbytes == Encoding.of(t.dtype, (0, 1000)).compressed_nbytes(t.numel(), 0.25)
    (torch.int16, True)
    >>> out = torch.empty_like(t)
    >>> torch.equal(decode(packed, out, backend="torch"), t)
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cswap.codecs.api import compress, decompress
from cswap.codecs.format import DEFAULT_CHUNK_WORDS, SUPPORTED_DTYPES, Packed, zvc_compressed_nbytes
from cswap.codecs.narrow import narrowest_int, narrowest_int_for_range

__all__ = ["Encoding", "decode", "dtype_named", "encodable", "encode", "value_range"]

_BY_NAME = {str(d).removeprefix("torch."): d for d in SUPPORTED_DTYPES}


def dtype_named(name: str | torch.dtype) -> torch.dtype:
    """The dtype of ``name`` (``"float32"``, with or without ``torch.``); a dtype passes through.

    Raises:
        TypeError: a dtype ZVC cannot encode, naming the supported ones.

    Example:
        >>> dtype_named("int64")
        torch.int64
    """
    if isinstance(name, torch.dtype):
        return name
    found = _BY_NAME.get(name.removeprefix("torch."))
    if found is None:
        raise TypeError(f"ZVC cannot encode dtype {name!r}: supported dtypes are {', '.join(_BY_NAME)}")
    return found


def encodable(dtype: torch.dtype | str) -> bool:
    """Whether the encoding supports ``dtype`` (a dtype, or its name without ``torch.``).

    Example:
        >>> encodable("float32"), encodable(torch.complex64)
        (True, False)
    """
    if isinstance(dtype, str):
        return dtype.removeprefix("torch.") in _BY_NAME
    return dtype in SUPPORTED_DTYPES


def _narrows(dtype: torch.dtype) -> bool:
    return dtype == torch.int64


def value_range(t: torch.Tensor) -> torch.Tensor | None:
    """What the encoding needs to know of ``t`` beyond its zeros: a 2-element ``(min, max)`` tensor
    on ``t``'s device for an int64 tensor (read back later, in one transfer), else ``None``.

    Example:
        >>> value_range(torch.tensor([3, -2, 9])).tolist(), value_range(torch.ones(2))
        ([-2, 9], None)
    """
    if not _narrows(t.dtype) or t.numel() == 0:
        return None
    return torch.stack(torch.aminmax(t))


@dataclass(frozen=True)
class Encoding:
    """How a tensor of ``dtype`` is encoded: its elements as ``encoded_dtype``, then ZVC.

    Attributes:
        dtype: the tensor's dtype.
        encoded_dtype: the dtype ZVC compresses (narrower than ``dtype`` for a narrowed int64).

    Example:
        >>> e = Encoding.of("int64", (0, 63))
        >>> e.encoded_dtype, e.narrowed, e.compressed_nbytes(numel=1024, sparsity=0.0)
        (torch.int8, True, 1168)
    """

    dtype: torch.dtype
    encoded_dtype: torch.dtype

    @classmethod
    def of(cls, dtype: torch.dtype | str, value_range: tuple[int, int] | None = None) -> Encoding:
        """The encoding of a tensor of ``dtype`` whose smallest and largest values are ``value_range``
        (as :func:`value_range` recorded them; ``None``: not known, so not narrowed)."""
        dtype = dtype_named(dtype)
        encoded = dtype
        if value_range is not None and _narrows(dtype):
            encoded = narrowest_int_for_range(int(value_range[0]), int(value_range[1])) or dtype
        return cls(dtype, encoded)

    @classmethod
    def named(cls, dtype: str, encoded_dtype: str | None) -> Encoding:
        """From names as a trace stores them (``encoded_dtype`` ``None``: the tensor's own dtype)."""
        source = dtype_named(dtype)
        return cls(source, dtype_named(encoded_dtype) if encoded_dtype else source)

    @property
    def narrowed(self) -> bool:
        """Whether the elements are stored narrower than the tensor's dtype."""
        return self.encoded_dtype != self.dtype

    @property
    def encoded_name(self) -> str | None:
        """The encoded dtype's name when narrowed, else ``None`` (how a trace stores it)."""
        return str(self.encoded_dtype).removeprefix("torch.") if self.narrowed else None

    @property
    def encoded_itemsize(self) -> int:
        """Bytes per element as ZVC reads them."""
        return self.encoded_dtype.itemsize

    def compressed_nbytes(self, numel: int, sparsity: float, chunk_words: int = DEFAULT_CHUNK_WORDS) -> int:
        """The exact encoded size of ``numel`` elements of which the fraction ``sparsity`` is zero."""
        nnz = round(numel * (1.0 - sparsity))
        return zvc_compressed_nbytes(numel, nnz, self.encoded_itemsize, chunk_words)


def encode(t: torch.Tensor, backend: str | None = None, launch: Any = None, codec: str = "zvc") -> Packed:
    """Narrow ``t`` exactly when it is an int64 tensor of small values, then ZVC-compress it (or
    compress it with ``codec``, which takes it as it is).

    One pass over ``t`` for the range (and, on a GPU, one synchronisation, like the compressor's).
    The result's ``dtype`` is the encoded one; :func:`decode` widens back to its ``out``'s dtype.

    Args:
        t: the tensor (contiguous 1-d in the runtime).
        backend, launch: as for :func:`cswap.codecs.compress`.
        codec: a registered codec; only ``zvc`` narrows.
    """
    if codec != "zvc":
        return compress(t, codec=codec, backend=backend, launch=launch)  # type: ignore[return-value]
    if _narrows(t.dtype):
        narrow = narrowest_int(t)
        if narrow is not None:
            t = t.to(narrow)
    return compress(t, backend=backend, launch=launch)


def decode(packed: Packed, out: torch.Tensor, backend: str | None = None, launch: Any = None, validate: bool = False) -> torch.Tensor:
    """The inverse of :func:`encode`: decompress into ``out`` (of the original dtype), widening a
    narrowed tensor back; returns ``out``.

    Args:
        packed: what :func:`encode` returned.
        out: a contiguous tensor of the original numel and dtype.
        backend, launch, validate: as for :func:`cswap.codecs.decompress`.
    """
    if packed.dtype == out.dtype:
        decompress(packed, backend=backend, out=out, launch=launch, validate=validate)
        return out
    narrow = torch.empty(out.shape, dtype=packed.dtype, device=out.device)
    decompress(packed, backend=backend, out=narrow, launch=launch, validate=validate)
    out.copy_(narrow)
    return out
