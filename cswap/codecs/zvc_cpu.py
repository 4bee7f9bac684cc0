"""ZVC on the CPU with Numba: parallel per chunk, branch-free inner loops, reusable output buffers.

Compression is three steps over the flat element bits ``x``:

1. parallel over chunks: the bitmap words (one 32-lane vector compare each) and each chunk's
   nonzero count (popcount);
2. serial: the prefix sum of the counts into ``offsets`` (4096 entries for 16 MiB of float32);
3. parallel over chunks: the nonzero values. All-zero and all-nonzero words are skipped or copied
   whole; dense mixed words are compacted without a branch per element (every element is written
   at the current position, which advances only past a nonzero), sparse ones by walking their
   set bits.

Decompression is one parallel pass per chunk, starting at the chunk's ``offsets`` entry: a full
word is copied, any other is zeroed and its values placed at its set bits. It checks each chunk's
bitmap popcount against its offsets step before reading ``values``, so even a corrupt
:class:`~cswap.codecs.format.Packed` decoded with ``validate=False`` raises ``ValueError`` instead
of reading out of bounds.

The kernels are generic over the element width; Numba compiles one specialisation per width
(uint8, int16, int32, int64) and caches it on disk (``cache=True``), so only the first run on a
machine pays the compile time. ``CpuLaunch.threads`` sets Numba's thread count for the call.

Fresh output buffers can cost as much as the compression itself (allocation and first-touch page
faults of ``values``), so :func:`compress_bits` can write into a caller's buffers (``out``, see
:meth:`cswap.codecs.format.Packed.workspace`) and return views of them.

Example:
    >>> import torch
    >>> from cswap.codecs import zvc_cpu
    >>> bitmap, offsets, values = zvc_cpu.compress_bits(torch.tensor([0, 5, 0, 7], dtype=torch.int32), 32, None)
    >>> bitmap.tolist(), offsets.tolist(), values.tolist()
    ([10], [0, 2], [5, 7])
"""

from __future__ import annotations

import hashlib
import inspect
import sys

import numpy as np
import torch
from numba import njit, prange

from cswap.codecs import intrinsics
from cswap.codecs.format import Packed, check_chunk_words, n_chunks_for, n_words_for, out_buffer
from cswap.codecs.intrinsics import low_bit as _low_bit
from cswap.codecs.intrinsics import nonzero_mask32 as _nonzero_mask32
from cswap.codecs.intrinsics import popcount as _popcount
from cswap.codecs.cpu_launch import check_launch, require_cpu, threads, threads_for
from cswap.codecs.launch import CpuLaunch

__all__ = ["available", "check_launch", "compress_bits", "decompress_bits", "kernel_source_hash"]


def available() -> bool:
    """Always: Numba's CPU JIT runs wherever cswap installs."""
    return True


def kernel_source_hash() -> str:
    """sha256 hex of the kernels' source (this module and its intrinsics): tuned CPU configs are void
    once the kernels change.

    Example:
        >>> len(kernel_source_hash())
        64
    """
    sources = (inspect.getsource(sys.modules[__name__]), inspect.getsource(intrinsics))
    return hashlib.sha256("".join(sources).encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# Kernels. ``x``/``out`` are the element bits (uint8, int16, int32 or int64), ``bitmap`` is uint32.
# The bit operations Numba cannot express (a 32-lane "!= 0" as one bitmap word, popcount,
# trailing-zero count) are LLVM intrinsics in :mod:`cswap.codecs.intrinsics`.

_FULL_WORD = 0xFFFFFFFF
#: Mixed words with fewer nonzeros than this are compacted by walking their set bits, denser ones
#: by the branch-free loop (whose cost does not fall with the count).
_SPARSE_WORD_BITS = 8


@njit(cache=True)
def _word(bitmap: np.ndarray, w: int, numel: int) -> np.uint32:
    """Bitmap word ``w`` with any bits past element ``numel - 1`` cleared."""
    word = bitmap[w]
    tail = numel - w * 32
    if tail < 32:
        word &= np.uint32((1 << tail) - 1)
    return word


@njit(cache=True)
def _last_word(bitmap: np.ndarray, w0: int, w1: int, numel: int) -> int:
    """The last word in ``[w0, w1)`` with a bit set (below ``numel``), or -1."""
    for w in range(w1 - 1, w0 - 1, -1):
        if _word(bitmap, w, numel) != 0:
            return w
    return -1


@njit(parallel=True, cache=True, nogil=True)
def _bitmap_offsets(x: np.ndarray, bitmap: np.ndarray, offsets: np.ndarray, chunk_words: int) -> int:
    """Steps 1 and 2: bitmap words, per-chunk counts, their prefix sum; returns the nonzero count."""
    numel = x.size
    n_words = bitmap.size
    n_chunks = offsets.size - 1
    full_words = numel // 32
    for c in prange(n_chunks):
        w0 = c * chunk_words
        w1 = min(w0 + chunk_words, n_words)
        total = 0
        for w in range(w0, min(w1, full_words)):
            word = _nonzero_mask32(x, w * 32)
            bitmap[w] = word
            total += _popcount(word)
        if w1 > full_words:  # the partial last word
            row = x[full_words * 32 :]
            word = np.uint32(0)
            for j in range(row.size):
                word |= np.uint32(row[j] != 0) << np.uint32(j)
            bitmap[full_words] = word
            total += _popcount(word)
        offsets[c + 1] = total
    offsets[0] = 0
    for c in range(n_chunks):
        offsets[c + 1] += offsets[c]
    return offsets[n_chunks]


@njit(parallel=True, cache=True, nogil=True)
def _scatter(x: np.ndarray, bitmap: np.ndarray, offsets: np.ndarray, values: np.ndarray, chunk_words: int) -> None:
    """Step 3: each chunk's nonzero values, in order, into ``values[offsets[c]:offsets[c + 1]]``."""
    numel = x.size
    n_words = bitmap.size
    n_chunks = offsets.size - 1
    for c in prange(n_chunks):
        w0 = c * chunk_words
        last = _last_word(bitmap, w0, min(w0 + chunk_words, n_words), numel)
        if last < 0:
            continue
        dst = values[offsets[c] : offsets[c + 1]]
        pos = 0
        # Slices indexed from 0 spare Numba's negative-index wraparound on every access.
        for w in range(w0, last + 1):
            word = _word(bitmap, w, numel)
            if word == 0:
                continue
            src = x[w * 32 : w * 32 + 32]
            out = dst[pos:]
            if word == _FULL_WORD:
                for j in range(32):
                    out[j] = src[j]
                pos += 32
            elif w == last or _popcount(word) < _SPARSE_WORD_BITS:
                q = 0
                while word:
                    out[q] = src[_low_bit(word)]
                    q += 1
                    word &= word - np.uint32(1)
                pos += q
            else:
                # Branch-free: every element is written at ``q``, which advances only past a
                # nonzero (a zero is overwritten by the next value). A later word of this chunk
                # holds a value, so even the write after this word's last value stays in ``dst``.
                q = 0
                for j in range(32):
                    v = src[j]
                    out[q] = v
                    q += v != 0
                pos += q


@njit(parallel=True, cache=True, nogil=True)
def _decompress(bitmap: np.ndarray, offsets: np.ndarray, values: np.ndarray, out: np.ndarray, chunk_words: int) -> int:
    """Fill ``out`` from the three buffers; returns the number of chunks whose offsets disagree with the bitmap."""
    numel = out.size
    n_words = bitmap.size
    n_chunks = offsets.size - 1
    n_values = values.size
    bad = 0
    for c in prange(n_chunks):
        w0 = c * chunk_words
        w1 = min(w0 + chunk_words, n_words)
        chunk = out[w0 * 32 : min(w1 * 32, numel)]
        count = 0
        for w in range(w0, w1):
            count += _popcount(_word(bitmap, w, numel))
        start = offsets[c]
        stop = offsets[c + 1]
        # Checked before any read, so inconsistent buffers cannot make this chunk read out of bounds.
        if start < 0 or stop > n_values or stop - start != count:
            bad += 1
            chunk[:] = 0
            continue
        src = values[start:stop]
        pos = 0
        for w in range(w0, w1):
            word = _word(bitmap, w, numel)
            dst = chunk[(w - w0) * 32 : (w - w0) * 32 + 32]
            vals = src[pos:]
            if word == _FULL_WORD:
                for j in range(32):
                    dst[j] = vals[j]
                pos += 32
                continue
            # Zero the word (vectorised), then place its values by walking the set bits: cheaper
            # than a per-element select, whose loads and stores do not vectorise.
            for j in range(dst.size):
                dst[j] = 0
            q = 0
            while word:
                dst[_low_bit(word)] = vals[q]
                q += 1
                word &= word - np.uint32(1)
            pos += q
    return bad


# --------------------------------------------------------------------------------------------


def compress_bits(
    flat_bits: torch.Tensor, chunk_words: int, launch: CpuLaunch | None, out: Packed | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bitmap, offsets and values of a flat integer tensor, byte-identical to the ``torch`` backend.

    Args:
        flat_bits: contiguous 1-d CPU tensor of uint8, int16, int32 or int64 (the element bits).
        chunk_words: bitmap words per offsets chunk.
        launch: threads to use (``None``: the default :class:`CpuLaunch`).
        out: optional buffers to write into (``bitmap``, ``offsets`` and ``values`` with at least
            the needed number of elements, e.g. :meth:`Packed.workspace`); the results are then
            views of them, valid until the buffers are written again.

    Returns:
        ``(bitmap int32, offsets int64, values of flat_bits.dtype)``.

    Example:
        >>> b, o, v = compress_bits(torch.tensor([0, 3], dtype=torch.int16), 32, None)
        >>> v.tolist()
        [3]
    """
    launch = check_launch(launch)
    require_cpu("the tensor", flat_bits)
    numel = flat_bits.numel()
    n_words = n_words_for(numel)
    n_chunks = n_chunks_for(numel, chunk_words)
    if out is None:
        bitmap = torch.empty(n_words, dtype=torch.int32)
        offsets = torch.empty(n_chunks + 1, dtype=torch.int64)
    else:
        bitmap = out_buffer("out.bitmap", out.bitmap, n_words, torch.int32, flat_bits.device)
        offsets = out_buffer("out.offsets", out.offsets, n_chunks + 1, torch.int64, flat_bits.device)
    x = flat_bits.numpy()
    with threads(threads_for(launch, x.nbytes)):
        nnz = int(_bitmap_offsets(x, bitmap.numpy().view(np.uint32), offsets.numpy(), chunk_words))
        if out is None:
            values = torch.empty(nnz, dtype=flat_bits.dtype)
        else:
            values = out_buffer("out.values", out.values, nnz, flat_bits.dtype, flat_bits.device)
        if nnz:
            _scatter(x, bitmap.numpy().view(np.uint32), offsets.numpy(), values.numpy(), chunk_words)
    return bitmap, offsets, values


def decompress_bits(packed: Packed, out_bits: torch.Tensor, launch: CpuLaunch | None) -> None:
    """Write the element bits of ``packed`` into the flat, contiguous CPU tensor ``out_bits``.

    Buffer lengths and dtypes are checked here and each chunk's popcount against its offsets in
    the kernel, so inconsistent buffers raise ``ValueError`` rather than read out of bounds.

    Example:
        >>> b, o, v = compress_bits(torch.tensor([0, 3], dtype=torch.int16), 32, None)
        >>> out = torch.empty(2, dtype=torch.int16)
        >>> decompress_bits(Packed(b, o, v, (2,), torch.int16), out, None); out.tolist()
        [0, 3]
    """
    launch = check_launch(launch)
    for name in ("bitmap", "offsets", "values"):
        require_cpu(f"packed.{name}", getattr(packed, name))
    require_cpu("out", out_bits)
    chunk_problem = check_chunk_words(packed.chunk_words)
    if chunk_problem:
        raise ValueError(f"corrupt ZVC buffer: {chunk_problem}. Compress the tensor again.")
    numel = out_bits.numel()
    n_words = n_words_for(numel)
    n_chunks = n_chunks_for(numel, packed.chunk_words)
    problems = []
    for name, tensor, dtype, length in (
        ("bitmap", packed.bitmap, torch.int32, n_words),
        ("offsets", packed.offsets, torch.int64, n_chunks + 1),
        ("values", packed.values, out_bits.dtype, None),
    ):
        if tensor.dtype != dtype or tensor.dim() != 1 or (length is not None and tensor.numel() != length):
            want = f"{dtype} x {length}" if length is not None else f"1-d {dtype}"
            problems.append(f"{name} is {tensor.dtype} of shape {tuple(tensor.shape)}, expected {want}")
    if not problems and (int(packed.offsets[0]) != 0 or int(packed.offsets[-1]) != packed.values.numel()):
        problems.append(
            f"offsets run from {int(packed.offsets[0])} to {int(packed.offsets[-1])}, "
            f"expected 0 to {packed.values.numel()} (the values held)"
        )
    if problems:
        raise ValueError("corrupt ZVC buffer: " + "; ".join(problems) + ". Compress the tensor again.")
    bitmap = packed.bitmap.contiguous().numpy().view(np.uint32)
    offsets = packed.offsets.contiguous().numpy()
    values = packed.values.contiguous().numpy()
    with threads(threads_for(launch, out_bits.numel() * out_bits.element_size())):
        bad = int(_decompress(bitmap, offsets, values, out_bits.numpy(), packed.chunk_words))
    if bad:
        raise ValueError(
            f"corrupt ZVC buffer: in {bad} of {n_chunks} chunks the bitmap popcount disagrees with the offsets "
            "or the offsets point past the values. The Packed was truncated or modified after compress(); "
            "compress the tensor again."
        )
