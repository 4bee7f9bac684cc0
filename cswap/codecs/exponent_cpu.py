"""Exponent coding on the CPU with Numba: parallel over chunks, writing the bytes of :mod:`cswap.codecs.exponent_torch`.

Compression is two parallel passes over the chunks with a prefix sum between them:

1. each chunk's exponent histogram, its table order (by count, then value), the code width of
   fewest words, the shared trailing zero bits of the mantissas, and so its size in words; the
   table is kept for pass 2;
2. after the serial prefix sum of sizes into ``offsets``, each chunk's header, table, codes, rest
   and escapes, written through a 64-bit bit accumulator.

Decompression is one parallel pass: each chunk reads its header, table and sections with the same
accumulator. It checks every chunk's header against its span in ``offsets`` and counts escapes
against the header before reading one, so even a corrupt buffer decoded with ``validate=False``
raises ``ValueError`` instead of reading out of bounds.

Example:
    >>> import torch
    >>> from cswap.codecs.exponent_layout import FLOAT_LAYOUTS
    >>> x = torch.tensor([1.0, 2.0, 1.0, -1.0], dtype=torch.bfloat16).view(torch.int16)
    >>> words, offsets = compress_bits(x, FLOAT_LAYOUTS[torch.bfloat16], 32, None)
    >>> offsets.tolist()
    [0, 4]
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from cswap.codecs.cpu_launch import check_launch, require_cpu, threads, threads_for
from cswap.codecs.exponent_format import ExponentPacked
from cswap.codecs.exponent_layout import FLOAT_LAYOUTS, HEADER_WORDS, TABLE_ENTRY_BITS, FloatLayout
from cswap.codecs.intrinsics import low_bit as _low_bit
from cswap.codecs.launch import CpuLaunch

__all__ = ["available", "check_launch", "chunk_words_needed", "compress_bits", "decompress_bits"]

_WORD = np.uint64(0xFFFFFFFF)


def available() -> bool:
    """Always: Numba's CPU JIT runs wherever cswap installs."""
    return True


@njit(cache=True, inline="always")
def _section_words(fields: int, width: int) -> int:
    return (fields * width + 31) // 32


@njit(cache=True, inline="always")
def _chunk_total(m: int, k: int, t: int, n_esc: int, exp_bits: int, man_bits: int) -> int:
    return (
        HEADER_WORDS
        + _section_words((1 << k) - 1, TABLE_ENTRY_BITS)
        + _section_words(m, k)
        + _section_words(m, man_bits + 1 - t)
        + _section_words(n_esc, exp_bits)
    )


@njit(parallel=True, cache=True, nogil=True)
def _plan_chunks(x, width, exp_bits, man_bits, chunk, ks, ts, n_escs, tables, sizes):  # type: ignore[no-untyped-def]
    """Pass 1: per chunk its code width, dropped bits, escapes, table and size in words."""
    n = x.size
    n_chunks = sizes.size
    n_exp = 1 << exp_bits
    value_mask = (1 << width) - 1
    for c in prange(n_chunks):
        lo = c * chunk
        m = min(chunk, n - lo)
        counts = np.zeros(n_exp, np.int64)
        t = man_bits
        for i in range(lo, lo + m):
            u = np.int64(x[i]) & value_mask
            counts[(u >> man_bits) & (n_exp - 1)] += 1
            t = min(t, _low_bit((u & ((1 << man_bits) - 1)) | (1 << man_bits)))
        keys = np.empty(n_exp, np.int64)
        for e in range(n_exp):
            keys[e] = (chunk - counts[e]) * n_exp + e  # unique: most frequent first, then smaller value
        order = np.argsort(keys)
        best_k = 0
        best = _section_words(m, exp_bits)
        covered = 0
        for k in range(1, exp_bits):
            for j in range((1 << (k - 1)) - 1, (1 << k) - 1):
                covered += counts[order[j]]
            cost = _section_words((1 << k) - 1, TABLE_ENTRY_BITS) + _section_words(m, k) + _section_words(m - covered, exp_bits)
            if cost < best:
                best = cost
                best_k = k
        n_table = (1 << best_k) - 1
        kept = 0
        for j in range(n_table):
            tables[c, j] = order[j]
            kept += counts[order[j]]
        ks[c] = best_k
        ts[c] = t
        n_escs[c] = m - kept
        sizes[c] = _chunk_total(m, best_k, t, m - kept, exp_bits, man_bits)


@njit(cache=True, inline="always")
def _put(words, state, field, bits):  # type: ignore[no-untyped-def]
    """Append ``bits`` bits of ``field`` to the stream whose (next word, accumulator, bits held) are ``state``."""
    w, acc, filled = state
    acc |= np.uint64(field) << np.uint64(filled)
    filled += bits
    if filled >= 32:
        words[w] = np.uint32(acc & _WORD)
        w += 1
        acc >>= np.uint64(32)
        filled -= 32
    return (w, acc, filled)


@njit(cache=True, inline="always")
def _flush(words, state):  # type: ignore[no-untyped-def]
    """The next word after the stream, its last partial word written."""
    w, acc, filled = state
    if filled:
        words[w] = np.uint32(acc & _WORD)
        w += 1
    return w


@njit(cache=True, nogil=True)
def _write_chunk(x, lo, m, width, exp_bits, man_bits, k, t, n_esc, table, w, words):  # type: ignore[no-untyped-def]
    """One chunk's words from ``words[w]`` on."""
    n_exp = 1 << exp_bits
    value_mask = (1 << width) - 1
    n_table = (1 << k) - 1
    words[w] = np.uint32(k | (t << 8))
    words[w + 1] = np.uint32(n_esc)
    state = (w + HEADER_WORDS, np.uint64(0), 0)
    code_of = np.full(n_exp, n_table, np.int64)
    for j in range(n_table):
        code_of[table[j]] = j
        state = _put(words, state, table[j], TABLE_ENTRY_BITS)
    state = (_flush(words, state), np.uint64(0), 0)
    if k:
        for i in range(lo, lo + m):
            state = _put(words, state, code_of[((np.int64(x[i]) & value_mask) >> man_bits) & (n_exp - 1)], k)
        state = (_flush(words, state), np.uint64(0), 0)
    rest_bits = man_bits + 1 - t
    man_mask = (1 << man_bits) - 1
    for i in range(lo, lo + m):
        u = np.int64(x[i]) & value_mask
        state = _put(words, state, ((u >> (width - 1)) << (man_bits - t)) | ((u & man_mask) >> t), rest_bits)
    state = (_flush(words, state), np.uint64(0), 0)
    if n_esc:
        for i in range(lo, lo + m):
            e = ((np.int64(x[i]) & value_mask) >> man_bits) & (n_exp - 1)
            if code_of[e] == n_table:
                state = _put(words, state, e, exp_bits)
        _flush(words, state)


@njit(parallel=True, cache=True, nogil=True)
def _write_chunks(x, width, exp_bits, man_bits, chunk, ks, ts, n_escs, tables, offsets, words):  # type: ignore[no-untyped-def]
    """Pass 2: every chunk's words from ``offsets[c]`` on."""
    n = x.size
    for c in prange(offsets.size - 1):
        lo = c * chunk
        _write_chunk(
            x, lo, min(chunk, n - lo), width, exp_bits, man_bits, ks[c], ts[c], n_escs[c], tables[c], offsets[c], words
        )


@njit(cache=True, inline="always")
def _take(words, state, width):  # type: ignore[no-untyped-def]
    """The next ``width`` bits of the stream whose (next word, accumulator, bits held) are ``state``."""
    w, acc, held = state
    while held < width:
        acc |= np.uint64(words[w]) << np.uint64(held)
        w += 1
        held += 32
    value = np.int64(acc & np.uint64((1 << width) - 1))
    if width:
        acc >>= np.uint64(width)
    return value, (w, acc, held - width)


@njit(cache=True, nogil=True)
def _decode_chunk(words, w0, span, lo, m, width, exp_bits, man_bits, out):  # type: ignore[no-untyped-def]
    """Decode one chunk into ``out[lo:lo + m]``; False when its header or escape count is inconsistent."""
    n_exp = 1 << exp_bits
    k = np.int64(words[w0] & np.uint32(0xFF))
    t = np.int64((words[w0] >> np.uint32(8)) & np.uint32(0xFF))
    n_esc = np.int64(words[w0 + 1])
    if k >= exp_bits or t > man_bits or n_esc > m or _chunk_total(m, k, t, n_esc, exp_bits, man_bits) != span:
        return False
    n_table = (1 << k) - 1
    table = np.empty(max(n_table, 1), np.int64)
    state = (w0 + HEADER_WORDS, np.uint64(0), 0)
    for j in range(n_table):
        entry, state = _take(words, state, TABLE_ENTRY_BITS)
        table[j] = entry & (n_exp - 1)
    code_w = w0 + HEADER_WORDS + _section_words(n_table, TABLE_ENTRY_BITS)
    rest_w = code_w + _section_words(m, k)
    codes = (code_w, np.uint64(0), 0)
    rests = (rest_w, np.uint64(0), 0)
    escapes = (rest_w + _section_words(m, man_bits + 1 - t), np.uint64(0), 0)
    seen = 0
    for i in range(lo, lo + m):
        code, codes = _take(words, codes, k)
        if code == n_table:
            if seen == n_esc:
                return False
            seen += 1
            e, escapes = _take(words, escapes, exp_bits)
        else:
            e = table[code]
        rest, rests = _take(words, rests, man_bits + 1 - t)
        rest <<= t
        out[i] = ((rest >> man_bits) << (width - 1)) | (e << man_bits) | (rest & ((1 << man_bits) - 1))
    return seen == n_esc


@njit(parallel=True, cache=True, nogil=True)
def _decompress(words, offsets, width, exp_bits, man_bits, chunk, out):  # type: ignore[no-untyped-def]
    """Fill ``out``; returns the number of chunks whose header disagrees with ``offsets`` or its codes."""
    n = out.size
    bad = 0
    for c in prange(offsets.size - 1):
        lo = c * chunk
        w0 = offsets[c]
        span = offsets[c + 1] - w0
        if span < HEADER_WORDS or w0 < 0 or offsets[c + 1] > words.size:
            bad += 1
        elif not _decode_chunk(words, w0, span, lo, min(chunk, n - lo), width, exp_bits, man_bits, out):
            bad += 1
    return bad


def _plan(flat_bits: torch.Tensor, layout: FloatLayout, chunk_words: int, launch: CpuLaunch) -> tuple[np.ndarray, ...]:
    """Pass 1: per chunk its code width, dropped bits, escapes, table and size in words."""
    x = flat_bits.numpy()
    chunk = 32 * chunk_words
    n_chunks = -(-x.size // chunk)
    planned = (
        np.empty(n_chunks, np.int64), np.empty(n_chunks, np.int64), np.empty(n_chunks, np.int64),
        np.empty((n_chunks, (1 << (layout.exponent_bits - 1)) - 1), np.int64), np.empty(n_chunks, np.int64),
    )
    with threads(threads_for(launch, x.nbytes)):
        _plan_chunks(x, layout.width, layout.exponent_bits, layout.mantissa_bits, chunk, *planned)
    return planned


def chunk_words_needed(flat_bits: torch.Tensor, layout: FloatLayout, chunk_words: int, launch: CpuLaunch | None) -> torch.Tensor:
    """Each chunk's size in words, without writing them (pass 1 alone)."""
    require_cpu("the tensor", flat_bits)
    return torch.from_numpy(_plan(flat_bits, layout, chunk_words, check_launch(launch))[4])


def compress_bits(
    flat_bits: torch.Tensor, layout: FloatLayout, chunk_words: int, launch: CpuLaunch | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(words, offsets)`` of a flat tensor of float bits, identical to :func:`cswap.codecs.exponent_torch.compress_bits`."""
    require_cpu("the tensor", flat_bits)
    launch = check_launch(launch)
    ks, ts, n_escs, tables, sizes = _plan(flat_bits, layout, chunk_words, launch)
    offsets = torch.zeros(sizes.size + 1, dtype=torch.int64)
    np.cumsum(sizes, out=offsets.numpy()[1:])
    words = torch.empty(int(offsets[-1]), dtype=torch.int32)
    x = flat_bits.numpy()
    with threads(threads_for(launch, x.nbytes)):
        _write_chunks(
            x, layout.width, layout.exponent_bits, layout.mantissa_bits, 32 * chunk_words,
            ks, ts, n_escs, tables, offsets.numpy(), words.numpy().view(np.uint32),
        )
    return words, offsets


def decompress_bits(packed: ExponentPacked, out_bits: torch.Tensor, launch: CpuLaunch | None) -> None:
    """Write the element bits of ``packed`` into the flat int16 or int32 tensor ``out_bits``."""
    for name, tensor in (("packed.words", packed.words), ("packed.offsets", packed.offsets), ("out", out_bits)):
        require_cpu(name, tensor)
    launch = check_launch(launch)
    layout = FLOAT_LAYOUTS[packed.dtype]
    with threads(threads_for(launch, out_bits.numel() * out_bits.element_size())):
        bad = _decompress(
            packed.words.contiguous().numpy().view(np.uint32), packed.offsets.contiguous().numpy(),
            layout.width, layout.exponent_bits, layout.mantissa_bits, packed.chunk_elements, out_bits.numpy(),
        )
    if bad:
        raise ValueError(
            f"corrupt exponent buffer: {bad} chunk(s) disagree with their offsets or escape counts. "
            "It was truncated or modified after compress(); compress the tensor again."
        )
