"""Lossless codecs for activations: ZVC (zero-value compression), bit-packing and exponent coding, each in ``torch``, ``cpu`` and ``cuda`` backends.

The public names load lazily: :mod:`cswap.codecs.launch` (the launch configs the tuner and the
service read) imports without torch.

Example:
    >>> import torch
    >>> from cswap.codecs import compress, decompress
    >>> t = torch.relu(torch.randn(1000))
    >>> p = compress(t)
    >>> torch.equal(decompress(p), t), p.ratio > 1
    (True, True)
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    **dict.fromkeys(("compress", "decompress", "default_backend"), "cswap.codecs.api"),
    **dict.fromkeys(("SUPPORTED_DTYPES", "Packed", "bits_dtype", "zvc_compressed_nbytes"), "cswap.codecs.format"),
    **dict.fromkeys(("NarrowingMissed", "Unsized", "encode_unsized"), "cswap.codecs.deferred"),
    **dict.fromkeys(("Encoding", "decode", "encodable", "encode", "value_range"), "cswap.codecs.encoding"),
    **dict.fromkeys(("CUDA_KERNELS", "DEFAULT_CHUNK_WORDS", "CpuLaunch", "CudaLaunch", "Launch", "launch_from_params"),
                    "cswap.codecs.launch"),
    **dict.fromkeys(("NARROW_INTS", "narrowest_int", "narrowest_int_for_range"), "cswap.codecs.narrow"),
    **dict.fromkeys(("CODECS", "CodecRegistry"), "cswap.codecs.registry"),
    "alternative_codec": "cswap.codecs.choice",
    "alternative_nbytes": "cswap.codecs.choice",
}

__all__ = [*_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cswap.codecs' has no attribute {name!r}")
