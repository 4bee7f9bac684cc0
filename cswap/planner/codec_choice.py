"""Which codec a compressing action uses for one tensor: the one that gives it the fewest bytes.

ZVC's size follows from the profiled zero count (:meth:`cswap.codecs.Encoding.compressed_nbytes`);
the profile also measured the codec besides ZVC that takes the tensor's dtype
(:attr:`cswap.profile.trace.TensorRecord.codec`). Ties go to ZVC. Where a plan must hold for later
batches too (under a budget), a size that follows the data is planned with a margin: ZVC's at the
profiled sparsity less the margin, exponent coding's at the profiled size plus the margin's share
of the raw bytes (more exponents in a chunk than at the profile widen its codes or add escapes);
bit-packing's size is the element count's whatever the data.

Example:
    >>> from cswap.profile.trace import TensorRecord
    >>> r = TensorRecord(key=0, shape=(1024,), dtype="bfloat16", nbytes=2048, sparsity=0.0, codec="exponent", codec_fraction=0.72)
    >>> codec_for(r, zvc_nbytes=2180)
    ('exponent', 1475)
    >>> codec_for(r, zvc_nbytes=900)
    ('zvc', 900)
    >>> codec_for(r, zvc_nbytes=2180, margin=0.02)  # 2% of 2048 bytes more
    ('exponent', 1516)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping

from cswap.profile.trace import TensorRecord

__all__ = ["EXACT_SIZE_CODECS", "UNSEEN_DTYPES", "codec_for", "codecs_by_dtype"]

#: Codecs whose compressed size does not depend on the values (bit-packing: one bit per element).
EXACT_SIZE_CODECS = frozenset({"bitpack"})

#: Per codec besides ZVC, the dtypes of which it takes every value, so that a tensor no profile saw
#: may take it. Bit-packing takes a uint8 tensor only when it holds 0s and 1s, which nothing knows
#: of a tensor before it is packed.
UNSEEN_DTYPES: Mapping[str, frozenset[str]] = {
    "exponent": frozenset({"bfloat16", "float16", "float32"}),
    "bitpack": frozenset({"bool"}),
}


def codec_for(record: TensorRecord, zvc_nbytes: int, margin: float = 0.0) -> tuple[str, int]:
    """``(codec, compressed bytes)`` of the smaller of ZVC (``zvc_nbytes``, its margin already in) and
    the record's other codec, whose profiled size is planned ``margin`` of the record's raw bytes
    larger where it follows the data (not for :data:`EXACT_SIZE_CODECS`)."""
    other = record.codec_nbytes
    if record.codec is not None and other is not None:
        if record.codec not in EXACT_SIZE_CODECS:
            other += math.ceil(margin * record.nbytes)
        if other < zvc_nbytes:
            return record.codec, other
    return "zvc", zvc_nbytes


def codecs_by_dtype(coded: Iterable[tuple[str, int, str]]) -> dict[str, str]:
    """Per dtype, the codec that coded most of its bytes in a plan, for tensors of that dtype the
    plan does not know (a graph that changed since its profile): ZVC drops the zeros of a
    post-ReLU tensor, exponent coding a third of a dense bf16 one, and a plan shows which its model
    saves. Only a codec that takes every value of the dtype is named (:data:`UNSEEN_DTYPES`); a
    dtype left out takes ZVC.

    Args:
        coded: ``(dtype, nbytes, codec)`` of each tensor the plan sized by a codec.

    Example:
        >>> codecs_by_dtype([("bfloat16", 4096, "exponent"), ("bfloat16", 1024, "zvc"), ("bool", 512, "bitpack"),
        ...                  ("uint8", 512, "bitpack"), ("float32", 64, "zvc")])
        {'bfloat16': 'exponent', 'bool': 'bitpack'}
    """
    bytes_by: Counter[tuple[str, str]] = Counter()
    for dtype, nbytes, codec in coded:
        bytes_by[dtype, codec] += nbytes
    most: dict[str, tuple[int, str]] = {}
    for (dtype, codec), nbytes in bytes_by.items():
        # ties go to ZVC, as in codec_for
        if dtype not in most or (nbytes, codec == "zvc") > (most[dtype][0], most[dtype][1] == "zvc"):
            most[dtype] = (nbytes, codec)
    return {dtype: codec for dtype, (_, codec) in most.items() if dtype in UNSEEN_DTYPES.get(codec, ())}
