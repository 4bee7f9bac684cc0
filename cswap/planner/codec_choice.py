"""Which codec a compressing action uses for one tensor: the one that gives it the fewest bytes.

ZVC's size follows from the profiled zero count (:meth:`cswap.codecs.Encoding.compressed_nbytes`);
the profile also measured the codec besides ZVC that takes the tensor's dtype
(:attr:`cswap.profile.trace.TensorRecord.codec`). Ties go to ZVC.

Example:
    >>> from cswap.profile.trace import TensorRecord
    >>> r = TensorRecord(key=0, shape=(1024,), dtype="bfloat16", nbytes=2048, sparsity=0.0, codec="exponent", codec_fraction=0.72)
    >>> codec_for(r, zvc_nbytes=2180)
    ('exponent', 1475)
    >>> codec_for(r, zvc_nbytes=900)
    ('zvc', 900)
"""

from __future__ import annotations

from cswap.profile.trace import TensorRecord

__all__ = ["codec_for"]


def codec_for(record: TensorRecord, zvc_nbytes: int) -> tuple[str, int]:
    """``(codec, compressed bytes)`` of the smaller of ZVC (``zvc_nbytes``) and the record's other codec."""
    other = record.codec_nbytes
    if record.codec is not None and other is not None and other < zvc_nbytes:
        return record.codec, other
    return "zvc", zvc_nbytes
