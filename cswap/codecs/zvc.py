"""The ZVC codec: dtype and shape handling shared by all backends, dispatch to the backend kernels.

Backends only ever see a flat, contiguous tensor of integers of the element width (see
:func:`cswap.codecs.format.bits_dtype`); this module makes that view, validates input, and rebuilds
the original shape and dtype.

A backend module provides:

* ``available() -> bool``: whether it can run here.
* ``check_launch(launch) -> Launch``: the launch to use (its default for ``None``), or ``ValueError``.
* ``compress_bits(flat_bits, chunk_words, launch) -> (bitmap, offsets, values)``; a backend that
  can write into a caller's buffers also takes ``out: Packed`` and returns views of them (see
  :func:`cswap.codecs.format.out_buffer`); for the others :meth:`ZvcCodec.compress` copies into ``out``.
* ``decompress_bits(packed, out_bits, launch) -> None``: fill ``out_bits`` (flat, contiguous).

Example:
    >>> import torch
    >>> from cswap.codecs.zvc import ZVC
    >>> p = ZVC.compress(torch.zeros(100), "torch", None)
    >>> p.nnz
    0
"""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType

import torch

from cswap.codecs.format import DEFAULT_CHUNK_WORDS, Packed, bits_dtype, check_dtype, out_buffer
from cswap.codecs.encoded import output_tensor
from cswap.codecs.launch import Launch
from cswap.codecs.registry import check_backend

__all__ = ["ZVC", "ZvcCodec"]

_BACKEND_MODULES = {
    "torch": "cswap.codecs.zvc_torch",
    "cpu": "cswap.codecs.zvc_cpu",
    "cuda": "cswap.codecs.zvc_cuda",
}


class ZvcCodec:
    """Zero-value compression (format v1) with ``torch``, ``cpu`` (Numba) and ``cuda`` (Numba CUDA) backends."""

    name = "zvc"
    backends: tuple[str, ...] = tuple(_BACKEND_MODULES)

    def backend_module(self, backend: str) -> ModuleType:
        """The module implementing ``backend``; ``ValueError`` naming the choices for an unknown one."""
        check_backend(self, backend)
        return importlib.import_module(_BACKEND_MODULES[backend])

    def available_backends(self) -> tuple[str, ...]:
        """Backends that can run on this machine."""
        return tuple(b for b in self.backends if self.backend_module(b).available())

    def compress(self, t: torch.Tensor, backend: str, launch: Launch | None, out: Packed | None = None) -> Packed:
        """Compress ``t`` (any shape, view or broadcast; read as its contiguous copy).

        With ``out`` (buffers with room enough, e.g. :meth:`Packed.workspace`) the result's buffers
        are views of ``out``'s, valid until ``out`` is written again.
        """
        check_dtype(t.dtype)
        module = self.backend_module(backend)
        launch = module.check_launch(launch)
        chunk_words = getattr(launch, "chunk_words", DEFAULT_CHUNK_WORDS)
        flat_bits = t.detach().contiguous().view(-1).view(bits_dtype(t.dtype))
        if out is None:
            bitmap, offsets, values = module.compress_bits(flat_bits, chunk_words, launch)
        elif _takes_out(module):
            bitmap, offsets, values = module.compress_bits(flat_bits, chunk_words, launch, out=out)
        else:
            fresh = module.compress_bits(flat_bits, chunk_words, launch)
            bitmap, offsets, values = (
                out_buffer(f"out.{name}", getattr(out, name), src.numel(), src.dtype, src.device).copy_(src)
                for name, src in zip(("bitmap", "offsets", "values"), fresh)
            )
        return Packed(
            bitmap=bitmap,
            offsets=offsets,
            values=values,
            shape=tuple(t.shape),
            dtype=t.dtype,
            chunk_words=chunk_words,
            codec=self.name,
        )

    def decompress(
        self,
        packed: Packed,
        backend: str,
        out: torch.Tensor | None,
        launch: Launch | None,
        validate: bool,
    ) -> torch.Tensor:
        """Rebuild the tensor of ``packed``, into ``out`` when given (same shape and dtype, contiguous)."""
        if packed.codec != self.name:
            raise ValueError(f"this Packed was written by codec {packed.codec!r}, not {self.name!r}")
        module = self.backend_module(backend)
        launch = module.check_launch(launch)
        if validate:
            packed.validate()
        out = output_tensor(packed.shape, packed.dtype, packed.device, out)
        if out.numel():
            module.decompress_bits(packed, out.view(-1).view(bits_dtype(packed.dtype)), launch)
        return out


ZVC = ZvcCodec()


def _takes_out(module: ModuleType) -> bool:
    """Whether the backend's ``compress_bits`` writes into caller buffers itself."""
    return "out" in inspect.signature(module.compress_bits).parameters
