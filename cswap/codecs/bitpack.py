"""Bit-packing, format v1: one bit per element of a bool (or 0/1 ``uint8``) tensor, 8x smaller.

Dropout masks are saved for backward as bool tensors, one byte per element holding 0 or 1.

* ``words``: ``ceil(n / 32)`` uint32 words (stored as ``torch.int32``, same bits); element ``i`` is
  bit ``i % 32`` of word ``i // 32``, least significant bit first, set when the element is nonzero
  (the layout of ZVC's bitmap). Bits past the last element are zero.

A ``uint8`` tensor must hold only 0 and 1 (anything else is refused with ``ValueError``: ZVC
takes any bytes); it is rebuilt as ``uint8``, a bool tensor as bool.

Example:
    >>> import torch
    >>> from cswap.codecs import compress, decompress
    >>> mask = torch.rand(1000) > 0.1
    >>> p = compress(mask, codec="bitpack", backend="torch")
    >>> p.words.numel(), round(p.ratio, 2), torch.equal(decompress(p), mask)
    (32, 7.81, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

import torch

from cswap.codecs.encoded import BackendCodec, Encoded
from cswap.codecs.format import n_words_for
from cswap.codecs.launch import Launch

__all__ = ["BITPACK", "BITPACK_DTYPES", "BitPacked", "BitpackCodec", "bitpack_nbytes", "eight_byte_prefix"]

#: What bit-packing takes: bool, and uint8 holding only 0 and 1.
BITPACK_DTYPES: tuple[torch.dtype, ...] = (torch.bool, torch.uint8)


def bitpack_nbytes(numel: int) -> int:
    """Exact size of a bit-packed buffer of ``numel`` elements.

    Example:
        >>> bitpack_nbytes(1000)
        128
    """
    return 4 * n_words_for(numel)


def eight_byte_prefix(flat: torch.Tensor, multiple: int) -> torch.Tensor:
    """The first ``numel - numel % multiple`` bytes of the flat uint8 tensor ``flat`` as int64 (same
    memory), for a backend's 8-byte reads and stores; empty where that memory is not 8-byte aligned
    (a view at an odd offset) or holds no such bytes, and the backend goes a byte at a time.

    Example:
        >>> storage = torch.zeros(72, dtype=torch.uint8)
        >>> eight_byte_prefix(storage, 32).numel(), eight_byte_prefix(storage[3:], 8).numel()
        (8, 0)
    """
    whole = flat.numel() - flat.numel() % multiple
    if flat.data_ptr() % 8 or not whole:
        return torch.empty(0, dtype=torch.int64, device=flat.device)
    return flat[:whole].view(torch.int64)


@dataclass(frozen=True, kw_only=True)
class BitPacked(Encoded):
    """A bit-packed tensor.

    Args:
        words: int32 tensor of ``ceil(numel / 32)`` words (uint32 bit patterns).
        shape: the original tensor's shape.
        dtype: ``torch.bool`` or ``torch.uint8``.
    """

    buffer_names: ClassVar[tuple[str, ...]] = ("words",)
    codec: ClassVar[str] = "bitpack"

    words: torch.Tensor

    def validate(self) -> None:
        """Raise ``ValueError`` if the words disagree with the shape or set bits past the last element."""
        problems = self._buffer_problems({"words": (torch.int32, n_words_for(self.numel))})
        if self.dtype not in BITPACK_DTYPES:
            problems.append(f"dtype {self.dtype} is not one bit-packing writes")
        tail = self.numel % 32
        if not problems and tail and (int(self.words[-1]) & 0xFFFFFFFF) >> tail:
            problems.append(f"the last word has bits set past element {self.numel - 1}")
        self._raise_if(problems)


class BitpackCodec(BackendCodec):
    """Bit-packing with ``torch``, ``cpu`` (Numba) and ``cuda`` (Numba CUDA) backends writing identical words."""

    name = "bitpack"
    dtypes = BITPACK_DTYPES
    container = BitPacked
    backend_modules = MappingProxyType(
        {"torch": "cswap.codecs.bitpack_torch", "cpu": "cswap.codecs.bitpack_cpu", "cuda": "cswap.codecs.bitpack_cuda"}
    )

    def compress(self, t: torch.Tensor, backend: str, launch: Launch | None) -> BitPacked:
        """Pack ``t`` (any shape or view, read as its contiguous copy) one bit per element."""
        module, launch = self._start(t, backend, launch)
        flat = t.detach().contiguous().view(-1).view(torch.uint8)
        if t.dtype == torch.uint8 and flat.numel() and int(flat.max()) > 1:
            raise ValueError(
                f"codec 'bitpack' takes uint8 tensors of 0 and 1 only, this one holds {int(flat.max())}: "
                "compress it with codec='zvc'"
            )
        return BitPacked(words=module.pack(flat, launch), shape=tuple(t.shape), dtype=t.dtype)

    def decompress(
        self, packed: BitPacked, backend: str, out: torch.Tensor | None, launch: Launch | None, validate: bool
    ) -> torch.Tensor:
        """Rebuild the tensor of ``packed``, into ``out`` when given (same shape and dtype, contiguous)."""
        module, launch, out = self._start_decoding(packed, backend, out, launch, validate)
        if out.numel():
            module.unpack(packed.words, out.view(-1).view(torch.uint8), launch)
        return out


BITPACK = BitpackCodec()
