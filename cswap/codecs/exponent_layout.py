"""The bit fields of the floats exponent coding takes, and the sizes of its sections in words.

The format itself: :mod:`cswap.codecs.exponent_format`.

Example:
    >>> import torch
    >>> exponent_chunk_words(numel=1024, k=3, t=0, n_esc=10, layout=FLOAT_LAYOUTS[torch.bfloat16])
    359
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

__all__ = [
    "EXPONENT_DTYPES",
    "FLOAT_LAYOUTS",
    "HEADER_WORDS",
    "TABLE_ENTRY_BITS",
    "CodedFloats",
    "FloatLayout",
    "exponent_chunk_words",
    "section_words",
]


class CodedFloats(Protocol):
    """What decoding reads of an :class:`~cswap.codecs.exponent_format.ExponentPacked` (the backends
    take this, so that the format, which checks buffers with them, is not imported back)."""

    words: torch.Tensor
    offsets: torch.Tensor
    dtype: torch.dtype
    chunk_elements: int


class FloatLayout(NamedTuple):
    """The bit fields of a float format: total width, exponent bits, mantissa bits, and its integer view."""

    width: int
    exponent_bits: int
    mantissa_bits: int
    bits_dtype: torch.dtype


#: The floats exponent coding takes, and their fields.
FLOAT_LAYOUTS: dict[torch.dtype, FloatLayout] = {
    torch.bfloat16: FloatLayout(16, 8, 7, torch.int16),
    torch.float16: FloatLayout(16, 5, 10, torch.int16),
    torch.float32: FloatLayout(32, 8, 23, torch.int32),
}

EXPONENT_DTYPES: tuple[torch.dtype, ...] = tuple(FLOAT_LAYOUTS)

#: Bits per table entry: one byte, whatever ``E``.
TABLE_ENTRY_BITS = 8
HEADER_WORDS = 2


def section_words(fields: int, width: int) -> int:
    """Words of a section of ``fields`` fields of ``width`` bits.

    Example:
        >>> section_words(1024, 3), section_words(7, 8), section_words(5, 0)
        (96, 2, 0)
    """
    return (fields * width + 31) // 32


def exponent_chunk_words(numel: int, k: int, t: int, n_esc: int, layout: FloatLayout) -> int:
    """Words of one chunk of ``numel`` elements with code width ``k``, ``t`` dropped bits and ``n_esc`` escapes."""
    return (
        HEADER_WORDS
        + section_words((1 << k) - 1, TABLE_ENTRY_BITS)
        + section_words(numel, k)
        + section_words(numel, layout.mantissa_bits + 1 - t)
        + section_words(n_esc, layout.exponent_bits)
    )
