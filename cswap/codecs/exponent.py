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

import torch

from cswap.codecs.encoded import BackendModules, check_codec_dtype, output_tensor
from cswap.codecs.exponent_format import ExponentPacked
from cswap.codecs.exponent_layout import EXPONENT_DTYPES, FLOAT_LAYOUTS
from cswap.codecs.launch import DEFAULT_CHUNK_WORDS, Launch

__all__ = ["EXPONENT", "ExponentCodec"]


class ExponentCodec:
    """Exponent coding of bf16, fp16 and fp32 with ``torch``, ``cpu`` (Numba) and ``cuda`` (Numba CUDA) backends."""

    name = "exponent"
    dtypes = EXPONENT_DTYPES

    def __init__(self) -> None:
        self._modules = BackendModules(
            self.name,
            {
                "torch": "cswap.codecs.exponent_torch",
                "cpu": "cswap.codecs.exponent_cpu",
                "cuda": "cswap.codecs.exponent_cuda",
            },
        )
        self.backends = self._modules.backends

    def available_backends(self) -> tuple[str, ...]:
        """Backends that can run on this machine."""
        return self._modules.available()

    def compress(self, t: torch.Tensor, backend: str, launch: Launch | None) -> ExponentPacked:
        """Code ``t`` (any shape or view, read as its contiguous copy); chunks of ``launch.chunk_words * 32`` elements."""
        check_codec_dtype(self.name, t.dtype, self.dtypes)
        module = self._modules.module(backend)
        launch = module.check_launch(launch)
        chunk_words = getattr(launch, "chunk_words", DEFAULT_CHUNK_WORDS)
        layout = FLOAT_LAYOUTS[t.dtype]
        flat_bits = t.detach().contiguous().view(-1).view(layout.bits_dtype)
        words, offsets = module.compress_bits(flat_bits, layout, chunk_words, launch)
        return ExponentPacked(words=words, offsets=offsets, shape=tuple(t.shape), dtype=t.dtype, chunk_words=chunk_words)

    def decompress(
        self, packed: ExponentPacked, backend: str, out: torch.Tensor | None, launch: Launch | None, validate: bool
    ) -> torch.Tensor:
        """Rebuild the tensor of ``packed``, into ``out`` when given (same shape and dtype, contiguous)."""
        if not isinstance(packed, ExponentPacked):
            raise ValueError(f"codec 'exponent' decodes an ExponentPacked, got {type(packed).__name__}")
        module = self._modules.module(backend)
        launch = module.check_launch(launch)
        if validate:
            packed.validate()
        out = output_tensor(packed.shape, packed.dtype, packed.device, out)
        if out.numel():
            module.decompress_bits(packed, out.view(-1).view(FLOAT_LAYOUTS[packed.dtype].bits_dtype), launch)
        return out


EXPONENT = ExponentCodec()
