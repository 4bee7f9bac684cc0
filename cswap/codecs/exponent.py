"""The exponent codec: float dtype handling shared by all backends, dispatch to the backend kernels.

Format and layout: :mod:`cswap.codecs.exponent_format`. Backends see a flat, contiguous tensor of
the element bits (int16 or int32) and provide:

* ``available() -> bool`` and ``check_launch(launch) -> Launch``;
* ``compress_bits(flat_bits, layout, chunk_words, launch) -> (words, offsets)``;
* ``decompress_bits(packed, out_bits, launch) -> None``.

Example:
    >>> import torch
    >>> from cswap.codecs import compress, decompress
    >>> t = torch.randn(4096, dtype=torch.bfloat16)
    >>> p = compress(t, codec="exponent", backend="torch")
    >>> p.ratio > 1.3, torch.equal(decompress(p).view(torch.int16), t.view(torch.int16))
    (True, True)
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from cswap.codecs.encoded import BackendCodec
from cswap.codecs.exponent_format import ExponentPacked
from cswap.codecs.exponent_layout import EXPONENT_DTYPES, FLOAT_LAYOUTS
from cswap.codecs.launch import DEFAULT_CHUNK_WORDS, Launch

__all__ = ["EXPONENT", "ExponentCodec"]


class ExponentCodec(BackendCodec):
    """Exponent coding of bf16, fp16 and fp32 with ``torch``, ``cpu`` (Numba) and ``cuda`` (Numba CUDA) backends."""

    name = "exponent"
    dtypes = EXPONENT_DTYPES
    container = ExponentPacked
    backend_modules = MappingProxyType(
        {"torch": "cswap.codecs.exponent_torch", "cpu": "cswap.codecs.exponent_cpu", "cuda": "cswap.codecs.exponent_cuda"}
    )

    def compress(self, t: torch.Tensor, backend: str, launch: Launch | None) -> ExponentPacked:
        """Code ``t`` (any shape or view, read as its contiguous copy); chunks of ``launch.chunk_words * 32`` elements."""
        module, launch = self._start(t, backend, launch)
        chunk_words = getattr(launch, "chunk_words", DEFAULT_CHUNK_WORDS)
        layout = FLOAT_LAYOUTS[t.dtype]
        flat_bits = t.detach().contiguous().view(-1).view(layout.bits_dtype)
        words, offsets = module.compress_bits(flat_bits, layout, chunk_words, launch)
        return ExponentPacked(words=words, offsets=offsets, shape=tuple(t.shape), dtype=t.dtype, chunk_words=chunk_words)

    def compressed_nbytes(self, t: torch.Tensor, backend: str, launch: Launch | None = None) -> torch.Tensor:
        """The exact size :meth:`compress` would give ``t``, as a 0-d int64 tensor on ``t``'s device
        (on a GPU nothing waits for it: only the first of the two kernels runs).

        Example:
            >>> t = torch.randn(4096, dtype=torch.bfloat16)
            >>> int(EXPONENT.compressed_nbytes(t, "cpu")) == EXPONENT.compress(t, "cpu", None).compressed_nbytes
            True
        """
        module, launch = self._start(t, backend, launch)
        chunk_words = getattr(launch, "chunk_words", DEFAULT_CHUNK_WORDS)
        layout = FLOAT_LAYOUTS[t.dtype]
        words = module.chunk_words_needed(t.detach().contiguous().view(-1).view(layout.bits_dtype), layout, chunk_words, launch)
        return 4 * words.sum() + 8 * (words.numel() + 1)

    def decompress(
        self, packed: ExponentPacked, backend: str, out: torch.Tensor | None, launch: Launch | None, validate: bool
    ) -> torch.Tensor:
        """Rebuild the tensor of ``packed``, into ``out`` when given (same shape and dtype, contiguous)."""
        module, launch, out = self._start_decoding(packed, backend, out, launch, validate)
        if out.numel():
            module.decompress_bits(packed, out.view(-1).view(FLOAT_LAYOUTS[packed.dtype].bits_dtype), launch)
        return out


EXPONENT = ExponentCodec()
