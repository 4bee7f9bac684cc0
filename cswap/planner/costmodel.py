"""The CSWAP cost model: is compress-then-swap (T) cheaper than a plain swap (T') for one tensor?

From the CSWAP paper, with ``Size`` in bytes, bandwidths in bytes per second and times in seconds::

    T' = max(Size/BW_d2h - Hidden_f, 0) + max(Size/BW_h2d - Hidden_b, 0)       swap, no compression
    T  = Time_c + Time_dc + O_f + O_b                                          swap, compressed
    O_f = max(Size*(1-Sparsity)/BW_d2h - Hidden_f, 0);  O_b likewise with BW_h2d and Hidden_b
    compress  iff  T < T'

``Hidden_f`` and ``Hidden_b`` are the compute a transfer of the tensor can overlap in forward and in
backward (see :class:`cswap.profile.trace.TensorRecord`). The paper sizes the compressed transfer as
``Size*(1-Sparsity)``, ignoring the bitmap and offsets; :func:`decide` uses the codec's exact
``compressed_nbytes`` unless ``paper_size=True``.

Example:
    >>> d = decide(nbytes=100e6, sparsity=0.9, hidden_forward_s=0.001, hidden_backward_s=0.001,
    ...            d2h_gbps=10, h2d_gbps=10, compress_s=0.001, decompress_s=0.001, paper_size=True)
    >>> round(d.swap_s, 4), round(d.compressed_swap_s, 4), d.compress
    (0.018, 0.002, True)
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from cswap.codecs.encoding import Encoding
from cswap.codecs.format import DEFAULT_CHUNK_WORDS, zvc_compressed_nbytes

__all__ = [
    "COPY_LATENCY_S",
    "CostDecision",
    "TimeModel",
    "codec_seconds",
    "compressed_swap_s",
    "decide",
    "exposed_transfer_s",
    "paper_compressed_nbytes",
    "swap_s",
    "takes_codec",
    "zvc_nbytes_for",
]


#: Seconds each copy over the host link costs whatever its size, one way: the copy's launch and its
#: DMA setup (a ``cudaMemcpyAsync``, an event recorded, a host block taken) and the pack or unpack
#: hook that issues it. The saved-tensor hooks alone cost 3.5 to 8 us per tensor on the host
#: (BENCHMARKS.md, "The hooks' cost per saved tensor"), and a launch with its setup is another few
#: us, so 10 us. Bandwidth alone prices a small copy as nearly free; with this term, moving many
#: small tensors is not, and a budget planner keeps them where the budget allows (the runtime's
#: budget planners price it on tensors below ``min_bytes``, where it is most of what a copy costs:
#: 10 us is the time 256 KiB takes on a 26 GB/s link). A swap pays it both ways: once for the copy
#: out at its pack, once for the copy back before its unpack.
COPY_LATENCY_S = 10e-6


@runtime_checkable
class TimeModel(Protocol):
    """Predicts (de)compression seconds of one tensor; the predictors package provides calibrated ones.

    Args (of both methods):
        nbytes: uncompressed size in bytes.
        density: fraction of nonzero elements (1 - sparsity).
        itemsize: bytes per element (1, 2, 4 or 8).
        backend: codec backend (``cpu``, ``cuda``, ``torch``).

    A model may also take a ``codec`` keyword (``"zvc"`` by default) and price each registered codec
    at its own speed, as :class:`cswap.profile.codec_speed.CodecSpeed` and the calibrated predictors
    do; :func:`codec_seconds` asks it that way, and raising ``ValueError`` for a codec means "not
    measured".
    """

    def compress_s(self, nbytes: int, density: float, itemsize: int, backend: str) -> float: ...

    def decompress_s(self, nbytes: int, density: float, itemsize: int, backend: str) -> float: ...


def takes_codec(fn: object) -> bool:
    """Whether the callable ``fn`` (a time model's method, a launch lookup) takes a ``codec`` keyword.

    Example:
        >>> takes_codec(lambda backend, op, dtype, nbytes, codec="zvc": None), takes_codec(len)
        (True, False)
    """
    # a plan prices every saved tensor: read each method's signature once, not per tensor
    function = getattr(fn, "__func__", None)
    return _signature_takes_codec(function) if function is not None else _signature_takes_codec.__wrapped__(fn)


@functools.lru_cache(maxsize=256)
def _signature_takes_codec(function: object) -> bool:
    try:
        return "codec" in inspect.signature(function).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def codec_seconds(
    time_model: TimeModel,
    op: Literal["compress", "decompress"],
    nbytes: int,
    density: float,
    itemsize: int,
    backend: str,
    codec: str = "zvc",
) -> float:
    """Seconds of ``op`` on one tensor by ``codec``, from ``time_model``.

    A codec other than ZVC is priced at its own speed where the model takes a ``codec`` keyword and
    knows that codec; otherwise as ZVC's on a dense tensor (a pass over every element), the
    approximation a ZVC-only model allows. The codecs differ by far more than that (exponent coding
    compressed at 14 GB/s on an H200, BENCHMARKS.md "GPU suite", and 40 times slower than ZVC's
    dense pass on a 2-core host), so the runtime's own model
    (:func:`cswap.profile.codec_speed.codec_speed`) times every codec.

    Args:
        time_model: the :class:`TimeModel`.
        op: ``"compress"`` or ``"decompress"``.
        nbytes, density, itemsize, backend: as :class:`TimeModel` takes them.
        codec: the codec's registry name.

    Example:
        >>> class Flat:
        ...     def compress_s(self, nbytes, density, itemsize, backend): return nbytes * density
        ...     def decompress_s(self, nbytes, density, itemsize, backend): return 0.0
        >>> codec_seconds(Flat(), "compress", 1000, 0.5, 2, "cuda"), codec_seconds(Flat(), "compress", 1000, 0.5, 2, "cuda", "exponent")
        (500.0, 1000.0)
    """
    method = getattr(time_model, f"{op}_s")
    if codec == "zvc":
        return float(method(nbytes, density, itemsize, backend))
    if takes_codec(method):
        try:
            return float(method(nbytes, density, itemsize, backend, codec=codec))
        except ValueError:
            pass  # not measured for this codec: the dense-ZVC approximation below
    return float(method(nbytes, 1.0, itemsize, backend))


def exposed_transfer_s(nbytes: float, gbps: float, hidden_s: float) -> float:
    """Seconds of a transfer of ``nbytes`` at ``gbps`` (1e9 B/s) that ``hidden_s`` of compute cannot hide."""
    if gbps <= 0:
        raise ValueError(f"bandwidth must be positive, got {gbps} GB/s")
    return max(nbytes / (gbps * 1e9) - hidden_s, 0.0)


def swap_s(nbytes: float, d2h_gbps: float, h2d_gbps: float, hidden_forward_s: float, hidden_backward_s: float) -> float:
    """T': the exposed time of swapping the tensor out in forward and back in for backward."""
    return exposed_transfer_s(nbytes, d2h_gbps, hidden_forward_s) + exposed_transfer_s(nbytes, h2d_gbps, hidden_backward_s)


def compressed_swap_s(
    compressed_nbytes: float,
    compress_s: float,
    decompress_s: float,
    d2h_gbps: float,
    h2d_gbps: float,
    hidden_forward_s: float,
    hidden_backward_s: float,
) -> float:
    """T: (de)compression time plus the exposed transfer of the compressed bytes (O_f + O_b)."""
    overhead_forward = exposed_transfer_s(compressed_nbytes, d2h_gbps, hidden_forward_s)
    overhead_backward = exposed_transfer_s(compressed_nbytes, h2d_gbps, hidden_backward_s)
    return compress_s + decompress_s + overhead_forward + overhead_backward


def paper_compressed_nbytes(nbytes: float, sparsity: float) -> float:
    """The paper's compressed size, ``Size * (1 - Sparsity)`` (no bitmap, no offsets)."""
    return nbytes * (1.0 - sparsity)


def zvc_nbytes_for(nbytes: int, sparsity: float, itemsize: int, chunk_words: int = DEFAULT_CHUNK_WORDS) -> int:
    """The exact ZVC size of a tensor of ``nbytes`` whose fraction ``sparsity`` of elements is zero."""
    numel = nbytes // itemsize
    nnz = round(numel * (1.0 - sparsity))
    return zvc_compressed_nbytes(numel, nnz, itemsize, chunk_words)


@dataclass(frozen=True)
class CostDecision:
    """T and T' for one tensor and the decision they give.

    Attributes:
        compress: ``compressed_swap_s < swap_s``.
        swap_s: T', exposed seconds of a plain swap.
        compressed_swap_s: T, seconds of compress-then-swap.
        compressed_nbytes: the size the transfer in T was costed at.
    """

    compress: bool
    swap_s: float
    compressed_swap_s: float
    compressed_nbytes: float

    @property
    def saving_s(self) -> float:
        """T' - T: what compression saves (negative when it costs)."""
        return self.swap_s - self.compressed_swap_s


def decide(
    nbytes: float,
    sparsity: float,
    hidden_forward_s: float,
    hidden_backward_s: float,
    d2h_gbps: float,
    h2d_gbps: float,
    compress_s: float,
    decompress_s: float,
    itemsize: int = 4,
    paper_size: bool = False,
    chunk_words: int = DEFAULT_CHUNK_WORDS,
    encoding: Encoding | None = None,
    compressed_nbytes: float | None = None,
) -> CostDecision:
    """Apply the cost model to one tensor.

    Args:
        nbytes: uncompressed size.
        sparsity: fraction of zero elements (bit-pattern zeros).
        hidden_forward_s: compute a swap-out can overlap (``Hidden_f``).
        hidden_backward_s: compute a swap-in can overlap (``Hidden_b``).
        d2h_gbps, h2d_gbps: measured transfer bandwidths.
        compress_s, decompress_s: predicted codec times (``Time_c``, ``Time_dc``).
        itemsize: bytes per element, for the exact ZVC size.
        paper_size: cost the compressed transfer as ``Size*(1-Sparsity)`` as the paper does.
        chunk_words: the ZVC chunk size, for the exact size.
        encoding: how the codec encodes the tensor (:class:`cswap.codecs.Encoding`), which
            predicts the exact size; ``None``: ZVC of ``itemsize``-byte elements as they are.
        compressed_nbytes: the size another codec gives it, which then replaces ZVC's.
    """
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity must be in [0, 1], got {sparsity}")
    if compressed_nbytes is not None:
        compressed = float(compressed_nbytes)
    elif paper_size:
        compressed = paper_compressed_nbytes(nbytes, sparsity)
    elif encoding is not None:
        compressed = float(encoding.compressed_nbytes(int(nbytes) // encoding.dtype.itemsize, sparsity, chunk_words))
    else:
        compressed = float(zvc_nbytes_for(int(nbytes), sparsity, itemsize, chunk_words))
    t_swap = swap_s(nbytes, d2h_gbps, h2d_gbps, hidden_forward_s, hidden_backward_s)
    t_compressed = compressed_swap_s(compressed, compress_s, decompress_s, d2h_gbps, h2d_gbps, hidden_forward_s, hidden_backward_s)
    return CostDecision(compress=t_compressed < t_swap, swap_s=t_swap, compressed_swap_s=t_compressed, compressed_nbytes=compressed)
