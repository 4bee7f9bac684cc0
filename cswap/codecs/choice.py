"""Which codec besides ZVC takes a tensor, and the exact size it would give, measured without compressing.

ZVC takes every dtype and shrinks what has zeros; a bool mask packs to one bit per element and a
float's exponent codes to a third fewer bits whatever its zeros. The profiler records both sizes
and the planner weighs them per tensor.

Example:
    >>> import torch
    >>> alternative_nbytes(torch.ones(64, dtype=torch.bool), "cpu")
    ('bitpack', 8)
    >>> name, size = alternative_nbytes(torch.randn(4096, dtype=torch.bfloat16), "cpu")
    >>> name, int(size) < 8192 * 0.8
    ('exponent', True)
    >>> alternative_nbytes(torch.arange(4), "cpu") is None
    True
"""

from __future__ import annotations

from typing import Any

import torch

from cswap.codecs.bitpack import bitpack_nbytes
from cswap.codecs.exponent_layout import EXPONENT_DTYPES
from cswap.codecs.registry import CODECS

__all__ = ["alternative_codec", "alternative_nbytes"]


def alternative_codec(dtype: torch.dtype) -> str | None:
    """The codec other than ZVC that takes ``dtype`` (``bitpack`` for bool, ``exponent`` for the
    float dtypes it codes), or ``None``.

    Example:
        >>> alternative_codec(torch.bool), alternative_codec(torch.bfloat16), alternative_codec(torch.int64)
        ('bitpack', 'exponent', None)
    """
    if dtype == torch.bool:
        return "bitpack"
    if dtype in EXPONENT_DTYPES:
        return "exponent"
    return None


def alternative_nbytes(t: torch.Tensor, backend: str, launch: Any = None) -> tuple[str, Any] | None:
    """The codec other than ZVC that takes ``t``'s dtype and the size it gives ``t`` (an int, or a 0-d
    tensor on ``t``'s device that nothing waits for), or ``None`` when no other codec takes it.

    Args:
        t: the tensor, any layout.
        backend: the codec backend that would compress it.
        launch: that backend's launch config, or ``None`` for its default.
    """
    codec = alternative_codec(t.dtype)
    if codec == "bitpack":
        return codec, bitpack_nbytes(t.numel())
    if codec == "exponent":
        return codec, CODECS.get(codec).compressed_nbytes(t, backend, launch)
    return None
