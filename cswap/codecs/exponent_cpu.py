"""Exponent coding on the CPU with Numba: parallel over chunks, writing the bytes of :mod:`cswap.codecs.exponent_torch`.

Compression is two parallel passes over the chunks with a prefix sum between them:

1. each chunk's exponent histogram, its table order (by count, then value: only the exponents the
   chunk holds are sorted), the code width of fewest words, the shared trailing zero bits of the
   mantissas (of their OR), and so its size in words; the table is kept for pass 2;
2. after the serial prefix sum of sizes into ``offsets``, each chunk's header and table, then one
   read of its elements writes its codes, rest and escapes, each section through its own 64-bit
   accumulator.

Each thread takes runs of consecutive chunks and allocates its scratch once per run.

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
from numba import get_num_threads, njit, prange

from cswap.codecs.cpu_launch import check_launch, require_cpu, threads, threads_for
from cswap.codecs.exponent_layout import FLOAT_LAYOUTS, HEADER_WORDS, TABLE_ENTRY_BITS, CodedFloats, FloatLayout
from cswap.codecs.intrinsics import low_bit as _low_bit
from cswap.codecs.launch import CpuLaunch

__all__ = ["available", "check_launch", "chunk_words_needed", "chunks_valid", "compress_bits", "decompress_bits"]

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


def _blocks(n_chunks: int) -> int:
    """Runs of consecutive chunks the parallel passes hand out (under the launch's thread count): a
    few per thread, so that each run allocates its scratch once and the threads still balance."""
    return min(n_chunks, 8 * get_num_threads())


@njit(cache=True, nogil=True)
def _plan_chunk(x, lo, m, width, exp_bits, man_bits, chunk, counts, keys, table):  # type: ignore[no-untyped-def]
    """One chunk's ``(k, t, n_esc, words)``, its table in ``table``; ``counts`` and ``keys`` are scratch."""
    n_exp = 1 << exp_bits
    value_mask = (1 << width) - 1
    man_mask = (1 << man_bits) - 1
    counts[:] = 0
    mantissas = 0
    for i in range(lo, lo + m):
        u = np.int64(x[i]) & value_mask
        counts[(u >> man_bits) & (n_exp - 1)] += 1
        mantissas |= u
    # the fewest trailing zeros of any mantissa (with its implicit bit) are those of their OR
    t = _low_bit((mantissas & man_mask) | (1 << man_bits))
    # table order: most frequent first, then smaller value; the exponents a chunk holds are few,
    # so only they are sorted and the absent ones follow in value order
    distinct = 0
    for e in range(n_exp):
        if counts[e]:
            keys[distinct] = (chunk - counts[e]) * n_exp + e
            distinct += 1
    present = keys[:distinct]
    present.sort()
    best_k = 0
    best = _section_words(m, exp_bits)
    covered = 0
    for k in range(1, exp_bits):
        for j in range((1 << (k - 1)) - 1, min((1 << k) - 1, distinct)):
            covered += counts[present[j] & (n_exp - 1)]
        cost = _section_words((1 << k) - 1, TABLE_ENTRY_BITS) + _section_words(m, k) + _section_words(m - covered, exp_bits)
        if cost < best:
            best = cost
            best_k = k
    n_table = (1 << best_k) - 1
    kept = 0
    j = 0
    while j < min(n_table, distinct):
        e = present[j] & (n_exp - 1)
        table[j] = e
        kept += counts[e]
        j += 1
    e = 0
    while j < n_table:
        if not counts[e]:
            table[j] = e
            j += 1
        e += 1
    return best_k, t, m - kept, _chunk_total(m, best_k, t, m - kept, exp_bits, man_bits)


@njit(parallel=True, cache=True, nogil=True)
def _plan_chunks(x, width, exp_bits, man_bits, chunk, ks, ts, n_escs, tables, sizes, blocks):  # type: ignore[no-untyped-def]
    """Pass 1: per chunk its code width, dropped bits, escapes, table and size in words; ``blocks``
    runs of consecutive chunks, one at a time per thread."""
    n = x.size
    n_chunks = sizes.size
    n_exp = 1 << exp_bits
    for b in prange(blocks):
        counts = np.empty(n_exp, np.int64)
        keys = np.empty(n_exp, np.int64)
        for c in range(b * n_chunks // blocks, (b + 1) * n_chunks // blocks):
            lo = c * chunk
            ks[c], ts[c], n_escs[c], sizes[c] = _plan_chunk(
                x, lo, min(chunk, n - lo), width, exp_bits, man_bits, chunk, counts, keys, tables[c]
            )


@njit(cache=True, nogil=True)
def _write_chunk(x, lo, m, width, exp_bits, man_bits, k, t, n_esc, table, w, words, code_of):  # type: ignore[no-untyped-def]
    """One chunk's words from ``words[w]`` on; ``code_of`` is scratch."""
    n_exp = 1 << exp_bits
    value_mask = (1 << width) - 1
    n_table = (1 << k) - 1
    words[w] = np.uint32(k | (t << 8))
    words[w + 1] = np.uint32(n_esc)
    w += HEADER_WORDS
    code_of[:] = n_table
    # Each section is one run of fields through a 64-bit accumulator, flushed to a word boundary.
    # The appends are written out: a helper returning the (word, accumulator, bits) state measured
    # 2.4x slower on the whole compression.
    acc = np.uint64(0)
    filled = 0
    for j in range(n_table):
        code_of[table[j]] = j
        acc |= np.uint64(table[j]) << np.uint64(filled)
        filled += TABLE_ENTRY_BITS
        if filled >= 32:
            words[w] = np.uint32(acc & _WORD)
            w += 1
            acc >>= np.uint64(32)
            filled -= 32
    if filled:
        words[w] = np.uint32(acc & _WORD)
        w += 1
    # one read of the chunk writes its three sections, each through its own accumulator
    rest_bits = man_bits + 1 - t
    man_mask = (1 << man_bits) - 1
    code_w = w
    rest_w = code_w + _section_words(m, k)
    esc_w = rest_w + _section_words(m, rest_bits)
    code_acc = rest_acc = esc_acc = np.uint64(0)
    code_bits = rest_held = esc_bits = 0
    for i in range(lo, lo + m):
        u = np.int64(x[i]) & value_mask
        e = (u >> man_bits) & (n_exp - 1)
        code = code_of[e]
        if k:
            code_acc |= np.uint64(code) << np.uint64(code_bits)
            code_bits += k
            if code_bits >= 32:
                words[code_w] = np.uint32(code_acc & _WORD)
                code_w += 1
                code_acc >>= np.uint64(32)
                code_bits -= 32
        rest_acc |= np.uint64(((u >> (width - 1)) << (man_bits - t)) | ((u & man_mask) >> t)) << np.uint64(rest_held)
        rest_held += rest_bits
        if rest_held >= 32:
            words[rest_w] = np.uint32(rest_acc & _WORD)
            rest_w += 1
            rest_acc >>= np.uint64(32)
            rest_held -= 32
        if code == n_table:
            esc_acc |= np.uint64(e) << np.uint64(esc_bits)
            esc_bits += exp_bits
            if esc_bits >= 32:
                words[esc_w] = np.uint32(esc_acc & _WORD)
                esc_w += 1
                esc_acc >>= np.uint64(32)
                esc_bits -= 32
    if code_bits:
        words[code_w] = np.uint32(code_acc & _WORD)
    if rest_held:
        words[rest_w] = np.uint32(rest_acc & _WORD)
    if esc_bits:
        words[esc_w] = np.uint32(esc_acc & _WORD)


@njit(parallel=True, cache=True, nogil=True)
def _write_chunks(x, width, exp_bits, man_bits, chunk, ks, ts, n_escs, tables, offsets, words, blocks):  # type: ignore[no-untyped-def]
    """Pass 2: every chunk's words from ``offsets[c]`` on, in ``blocks`` runs of consecutive chunks."""
    n = x.size
    n_chunks = offsets.size - 1
    for b in prange(blocks):
        code_of = np.empty(1 << exp_bits, np.int64)
        for c in range(b * n_chunks // blocks, (b + 1) * n_chunks // blocks):
            lo = c * chunk
            _write_chunk(
                x, lo, min(chunk, n - lo), width, exp_bits, man_bits, ks[c], ts[c], n_escs[c], tables[c], offsets[c], words, code_of
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


@njit(cache=True, inline="always")
def _header(words, w0, span, m, exp_bits, man_bits):  # type: ignore[no-untyped-def]
    """A chunk's ``(k, t, n_esc)`` from its header at ``words[w0]``, and whether they are in range
    and need exactly its ``span`` of words."""
    k = np.int64(words[w0] & np.uint32(0xFF))
    t = np.int64((words[w0] >> np.uint32(8)) & np.uint32(0xFF))
    n_esc = np.int64(words[w0 + 1])
    fits = k < exp_bits and t <= man_bits and n_esc <= m and _chunk_total(m, k, t, n_esc, exp_bits, man_bits) == span
    return k, t, n_esc, fits


@njit(cache=True, nogil=True)
def _decode_chunk(words, w0, span, lo, m, width, exp_bits, man_bits, out):  # type: ignore[no-untyped-def]
    """Decode one chunk into ``out[lo:lo + m]``; False when its header or escape count is inconsistent."""
    n_exp = 1 << exp_bits
    k, t, n_esc, fits = _header(words, w0, span, m, exp_bits, man_bits)
    if not fits:
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


@njit(cache=True, nogil=True)
def _chunk_faulty(words, w0, span, m, exp_bits, man_bits):  # type: ignore[no-untyped-def]
    """Whether one chunk fails a check: its header's ranges, the span it needs, a table entry past
    the exponent bits, or escape codes that disagree with its escape count."""
    k, _, n_esc, fits = _header(words, w0, span, m, exp_bits, man_bits)
    if not fits:
        return True
    n_table = (1 << k) - 1
    state = (w0 + HEADER_WORDS, np.uint64(0), 0)
    for _ in range(n_table):
        entry, state = _take(words, state, TABLE_ENTRY_BITS)
        if entry >> exp_bits:
            return True
    if not k:
        return n_esc != m  # no table: every exponent is an escape
    escapes = 0
    state = (w0 + HEADER_WORDS + _section_words(n_table, TABLE_ENTRY_BITS), np.uint64(0), 0)
    for _ in range(m):
        code, state = _take(words, state, k)
        if code == n_table:
            escapes += 1
    return escapes != n_esc


@njit(parallel=True, cache=True, nogil=True)
def _faulty_chunks(words, offsets, exp_bits, man_bits, chunk, numel):  # type: ignore[no-untyped-def]
    """How many chunks fail a check of :func:`cswap.codecs.exponent_torch.chunk_problems` (the
    offsets are checked before)."""
    bad = 0
    for c in prange(offsets.size - 1):
        if _chunk_faulty(words, offsets[c], offsets[c + 1] - offsets[c], min(chunk, numel - c * chunk), exp_bits, man_bits):
            bad += 1
    return bad


def chunks_valid(words: torch.Tensor, offsets: torch.Tensor, numel: int, chunk_elements: int, dtype: torch.dtype) -> bool:
    """Whether every chunk of a coded tensor on the CPU passes the reference's checks, whose offsets
    already rise from 0 by at least a header per chunk to the end of ``words`` (the checks of
    :func:`cswap.codecs.exponent_torch.chunk_problems` past its offsets, in parallel, at the speed
    of a decode; that function names the fault when this finds one)."""
    layout = FLOAT_LAYOUTS[dtype]
    n_chunks = offsets.numel() - 1
    with threads(threads_for(CpuLaunch(), numel * layout.width // 8)):
        bad = _faulty_chunks(
            words.contiguous().numpy().view(np.uint32), offsets.contiguous().numpy(), layout.exponent_bits,
            layout.mantissa_bits, chunk_elements, numel,
        ) if n_chunks > 0 else 0
    return bad == 0


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
        _plan_chunks(x, layout.width, layout.exponent_bits, layout.mantissa_bits, chunk, *planned, _blocks(n_chunks))
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
            ks, ts, n_escs, tables, offsets.numpy(), words.numpy().view(np.uint32), _blocks(sizes.size),
        )
    return words, offsets


def decompress_bits(packed: CodedFloats, out_bits: torch.Tensor, launch: CpuLaunch | None) -> None:
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
