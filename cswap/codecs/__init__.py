"""Lossless codecs for activations: ZVC (zero-value compression) in ``torch``, ``cpu`` and ``cuda`` backends.

Example:
    >>> import torch
    >>> from cswap.codecs import compress, decompress
    >>> t = torch.relu(torch.randn(1000))
    >>> p = compress(t)
    >>> torch.equal(decompress(p), t), p.ratio > 1
    (True, True)
"""

from cswap.codecs.api import compress, decompress, default_backend
from cswap.codecs.format import (
    DEFAULT_CHUNK_WORDS,
    SUPPORTED_DTYPES,
    Packed,
    bits_dtype,
    zvc_compressed_nbytes,
)
from cswap.codecs.deferred import NarrowingMissed, Unsized, encode_unsized
from cswap.codecs.encoding import Encoding, decode, encodable, encode, value_range
from cswap.codecs.launch import CUDA_KERNELS, CpuLaunch, CudaLaunch, Launch, launch_from_params
from cswap.codecs.narrow import NARROW_INTS, narrowest_int, narrowest_int_for_range
from cswap.codecs.registry import CODECS, CodecRegistry

__all__ = [
    "CODECS",
    "CUDA_KERNELS",
    "CodecRegistry",
    "CpuLaunch",
    "CudaLaunch",
    "DEFAULT_CHUNK_WORDS",
    "Encoding",
    "Launch",
    "NARROW_INTS",
    "NarrowingMissed",
    "Packed",
    "SUPPORTED_DTYPES",
    "Unsized",
    "bits_dtype",
    "compress",
    "decode",
    "decompress",
    "default_backend",
    "encodable",
    "encode",
    "encode_unsized",
    "launch_from_params",
    "narrowest_int",
    "narrowest_int_for_range",
    "value_range",
    "zvc_compressed_nbytes",
]
