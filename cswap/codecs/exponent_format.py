"""Exponent coding, format v1: the layout every backend writes, and the container that holds it.

The exponent of the floats a trained network saves carries 2.5-4 bits of information out of 8;
sign and mantissa are close to random. So each chunk codes its exponents with a small table of the
most frequent ones and fixed-width codes (escapes for the rest), and stores sign and mantissa as
they are, less any low mantissa bits that are zero in every element of the chunk (a float32 that
is a bf16 value upcast drops 16 of them). Lossless for every bit pattern: -0.0, NaN payloads,
infinities and subnormals come back as they went in.

An element of ``W`` bits (:data:`FLOAT_LAYOUTS`) is a sign bit, ``E`` exponent bits and ``M``
mantissa bits, read as an unsigned integer ``u``: exponent ``e = (u >> M) & (2**E - 1)``, rest
``r = (u >> (W - 1)) << M | (u & (2**M - 1))`` (``R = M + 1`` bits).

The tensor is cut into chunks of ``C = 32 * chunk_words`` elements (the last may be shorter: ``m``
elements), each coded on its own, so chunks decode in parallel. For each chunk:

* the exponents sorted by count, most frequent first, ties by smaller value;
* code width ``k`` in ``0 .. E - 1``, table size ``N = 2**k - 1`` (the first ``N`` exponents of that
  order), chosen to need the fewest words for table, codes and escapes (ties: the smaller ``k``);
* ``t``: the trailing zero bits of ``mantissa | 2**M`` shared by every element (``t <= M``).

Its words, from ``offsets[c]`` on, each section starting on a word:

1. two header words: ``k | t << 8``, then ``n_esc``;
2. table: ``N`` fields of 8 bits, the exponents in that order;
3. codes: ``m`` fields of ``k`` bits: the table index of the element's exponent, or ``N`` (all
   ones) for an exponent not in the table (an escape);
4. rest: ``m`` fields of ``R - t`` bits: ``r >> t``;
5. escapes: ``n_esc`` fields of ``E`` bits: the escaped exponents, in element order.

A section of fields of width ``w`` puts field ``j`` at bits ``j*w .. j*w + w - 1``, bit ``b`` of the
section being bit ``b % 32`` of its word ``b // 32``; bits past the last field are zero.
``offsets`` holds the ``n_chunks + 1`` int64 prefix sums of chunk sizes in words; ``words`` all
chunks' words as int32 (uint32 bit patterns).

Example:
    >>> import torch
    >>> exponent_chunk_words(numel=1024, k=3, t=0, n_esc=10, layout=FLOAT_LAYOUTS[torch.bfloat16])
    359
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from cswap.codecs.encoded import Encoded
from cswap.codecs.exponent_layout import EXPONENT_DTYPES, FLOAT_LAYOUTS, FloatLayout, exponent_chunk_words, section_words
from cswap.codecs.launch import DEFAULT_CHUNK_WORDS, check_chunk_words

__all__ = ["EXPONENT_DTYPES", "FLOAT_LAYOUTS", "ExponentPacked", "FloatLayout", "exponent_chunk_words", "section_words"]


@dataclass(frozen=True, kw_only=True)
class ExponentPacked(Encoded):
    """An exponent-coded float tensor.

    Args:
        words: int32 tensor, all chunks' words.
        offsets: int64 tensor of ``n_chunks + 1`` word offsets.
        shape: the original tensor's shape.
        dtype: ``bfloat16``, ``float16`` or ``float32``.
        chunk_words: ``C / 32``, the chunk size in 32-element units.
    """

    buffer_names: ClassVar[tuple[str, ...]] = ("words", "offsets")
    codec: ClassVar[str] = "exponent"

    words: torch.Tensor
    offsets: torch.Tensor
    chunk_words: int = DEFAULT_CHUNK_WORDS

    @property
    def chunk_elements(self) -> int:
        """Elements per chunk (the last may hold fewer)."""
        return 32 * self.chunk_words

    @property
    def n_chunks(self) -> int:
        """Chunks of the tensor."""
        return -(-self.numel // self.chunk_elements)

    def validate(self) -> None:
        """Raise ``ValueError`` if the buffers disagree with each other or with the shape.

        Checks the buffers' dtypes and lengths, the offsets, every chunk's header against its
        size, every table entry, and that each chunk's escape codes match its escape count, so
        that decoding reads nothing out of bounds afterwards.
        """
        chunk_problem = check_chunk_words(self.chunk_words)
        if chunk_problem:
            self._raise_if([chunk_problem])
        if self.dtype not in FLOAT_LAYOUTS:
            self._raise_if([f"dtype {self.dtype} is not one exponent coding writes"])
        self._raise_if(self._buffer_problems({"words": (torch.int32, -1), "offsets": (torch.int64, self.n_chunks + 1)}))
        # Imported here: the checks decode with the reference backend, which imports this module.
        from cswap.codecs.exponent_torch import chunk_problems, offset_problems

        if self.words.device.type == "cpu" and not offset_problems(self.words, self.offsets, self.numel, self.chunk_elements):
            from cswap.codecs.exponent_cpu import chunks_valid

            # the chunks' checks in parallel Numba; the reference names the fault when there is one
            if chunks_valid(self.words, self.offsets, self.numel, self.chunk_elements, self.dtype):
                return
        self._raise_if(chunk_problems(self.words, self.offsets, self.numel, self.chunk_elements, self.dtype))
