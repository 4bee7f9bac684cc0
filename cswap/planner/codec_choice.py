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

from cswap.profile.trace import TensorRecord

__all__ = ["EXACT_SIZE_CODECS", "codec_for"]

#: Codecs whose compressed size does not depend on the values (bit-packing: one bit per element).
EXACT_SIZE_CODECS = frozenset({"bitpack"})


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
