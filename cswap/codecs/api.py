"""The two calls every user of the codecs makes: :func:`compress` and :func:`decompress`.

Example:
    >>> import torch
    >>> from cswap.codecs import compress, decompress
    >>> t = torch.relu(torch.randn(4, 8))
    >>> packed = compress(t, backend="torch")
    >>> torch.equal(decompress(packed), t)
    True
"""

from __future__ import annotations

import inspect
from typing import Any
from collections.abc import Mapping

import torch

from cswap.codecs.format import Packed
from cswap.codecs.launch import Launch, launch_from_params
from cswap.codecs.registry import CODECS

__all__ = ["compress", "decompress", "default_backend"]


def default_backend(device: torch.device) -> str:
    """``cuda`` for CUDA tensors, ``cpu`` (Numba) otherwise."""
    return "cuda" if device.type == "cuda" else "cpu"


def _launch(backend: str, launch: Launch | Mapping[str, Any] | None) -> Launch | None:
    if isinstance(launch, Mapping):
        return launch_from_params(backend, launch)
    return launch


def compress(
    t: torch.Tensor,
    codec: str = "zvc",
    backend: str | None = None,
    launch: Launch | Mapping[str, Any] | None = None,
    out: Packed | None = None,
) -> Packed:
    """Compress ``t`` losslessly.

    Args:
        t: any tensor of a supported dtype; views and broadcasts are read as their contiguous copy.
        codec: a registered codec name (``cswap.codecs.CODECS.names()``).
        backend: ``torch``, ``cpu`` or ``cuda``; ``None`` picks ``cuda`` for CUDA tensors, else ``cpu``.
        launch: the backend's launch config (:class:`CpuLaunch`, :class:`CudaLaunch`, or their dict);
            ``None`` uses the backend's documented default.
        out: optional buffers to write into instead of allocating, on the device of ``t``, with
            room enough: :meth:`Packed.workspace` of the shape and dtype has room for any tensor of
            that shape. The result's buffers are then views of ``out``'s, overwritten by the next
            ``compress`` into the same ``out``. ``ValueError`` when a buffer is too small.

    Returns:
        A :class:`Packed` on the device of ``t``.

    Example:
        >>> compress(torch.zeros(1024)).ratio > 20
        True
        >>> ws = Packed.workspace((1024,), torch.float32)
        >>> compress(torch.ones(1024), out=ws).values.data_ptr() == ws.values.data_ptr()
        True
    """
    backend = backend or default_backend(t.device)
    chosen = CODECS.get(codec)
    if out is None:
        return chosen.compress(t, backend, _launch(backend, launch))
    if "out" not in inspect.signature(chosen.compress).parameters:
        raise ValueError(f"codec {codec!r} writes its own buffers: call compress() without out=")
    return chosen.compress(t, backend, _launch(backend, launch), out=out)


def decompress(
    packed: Packed,
    backend: str | None = None,
    out: torch.Tensor | None = None,
    launch: Launch | Mapping[str, Any] | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Rebuild the exact tensor that :func:`compress` was given (contiguous, same shape and dtype).

    Args:
        packed: the compressed tensor.
        backend: as for :func:`compress`, picked from ``packed.device`` when ``None``.
        out: optional contiguous tensor of the original shape and dtype to write into.
        launch: the backend's launch config, or ``None`` for its default.
        validate: check the buffers agree before decoding (``ValueError`` if not). Code that
            decodes its own fresh output may skip it to avoid a device sync.

    Example:
        >>> t = torch.tensor([0.0, -0.0, float("nan")])
        >>> decompress(compress(t)).view(torch.int32).equal(t.view(torch.int32))
        True
    """
    backend = backend or default_backend(packed.device)
    return CODECS.get(packed.codec).decompress(packed, backend, out, _launch(backend, launch), validate)
