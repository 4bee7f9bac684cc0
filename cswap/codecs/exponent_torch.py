"""Exponent coding reference backend in plain torch ops: defines the bytes the other backends write.

Every step is a tensor operation over all chunks at once (histograms by ``index_put_``, the table
order by a stable sort, fields placed by bit position), so it runs on any device; clarity wins over
speed here (:mod:`cswap.codecs.exponent_cpu` is the fast CPU path).

Example:
    >>> import torch
    >>> from cswap.codecs.exponent_layout import FLOAT_LAYOUTS
    >>> x = torch.tensor([1.0, 2.0, 1.0, -1.0], dtype=torch.bfloat16).view(torch.int16)
    >>> words, offsets = compress_bits(x, FLOAT_LAYOUTS[torch.bfloat16], 32, None)
    >>> offsets.tolist()
    [0, 4]
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from cswap.codecs.exponent_layout import FLOAT_LAYOUTS, HEADER_WORDS, TABLE_ENTRY_BITS, CodedFloats, FloatLayout
from cswap.codecs.launch import Launch

__all__ = ["available", "check_launch", "chunk_problems", "chunk_words_needed", "compress_bits", "decompress_bits", "offset_problems"]

_WORD_MASK = 0xFFFFFFFF


def available() -> bool:
    """Always: torch runs everywhere."""
    return True


def check_launch(launch: Launch | None) -> Launch | None:
    """The torch backend takes no launch parameters but honours ``chunk_words`` of any launch."""
    return launch


def _ceil_words(bits: torch.Tensor) -> torch.Tensor:
    return (bits + 31) // 32


class _Chunks(NamedTuple):
    """Per element: its chunk and index in it; per chunk: its element count."""

    chunk: torch.Tensor
    local: torch.Tensor
    sizes: torch.Tensor


def _chunks(numel: int, chunk_elements: int, device: torch.device) -> _Chunks:
    index = torch.arange(numel, dtype=torch.int64, device=device)
    n_chunks = -(-numel // chunk_elements)
    sizes = torch.full((n_chunks,), chunk_elements, dtype=torch.int64, device=device)
    if n_chunks:
        sizes[-1] = numel - (n_chunks - 1) * chunk_elements
    return _Chunks(index // chunk_elements, index % chunk_elements, sizes)


class _Sections(NamedTuple):
    """Per chunk: where each section starts, in words, and the chunk's total words."""

    table: torch.Tensor
    codes: torch.Tensor
    rest: torch.Tensor
    escapes: torch.Tensor
    total: torch.Tensor


def _sections(start: torch.Tensor, k: torch.Tensor, t: torch.Tensor, n_esc: torch.Tensor, sizes: torch.Tensor,
              layout: FloatLayout) -> _Sections:
    table = start + HEADER_WORDS
    codes = table + _ceil_words(((1 << k) - 1) * TABLE_ENTRY_BITS)
    rest = codes + _ceil_words(sizes * k)
    escapes = rest + _ceil_words(sizes * (layout.mantissa_bits + 1 - t))
    end = escapes + _ceil_words(n_esc * layout.exponent_bits)
    return _Sections(table, codes, rest, escapes, end - start)


def _write(words: torch.Tensor, bit: torch.Tensor, width: torch.Tensor | int, value: torch.Tensor) -> None:
    """OR fields of ``width`` bits at bit positions ``bit`` into int64 ``words`` (fields never overlap)."""
    word = bit >> 5
    shift = bit & 31
    words.index_add_(0, word, (value << shift) & _WORD_MASK)
    spill = (shift + width) > 32
    if bool(spill.any()):
        words.index_add_(0, word[spill] + 1, value[spill] >> (32 - shift[spill]))


def _padded(words: torch.Tensor) -> torch.Tensor:
    """The words as unsigned int64 and two zero words: a read of a section that ends the buffer (an
    escape section with no escapes) stays in bounds."""
    return torch.cat([words.long() & _WORD_MASK, torch.zeros(2, dtype=torch.int64, device=words.device)])


def _read(words: torch.Tensor, bit: torch.Tensor, width: torch.Tensor | int) -> torch.Tensor:
    """Fields of ``width`` bits at ``bit`` from :func:`_padded` words."""
    word = bit >> 5
    pair = words[word] | (words[word + 1] << 32)
    return (pair >> (bit & 31)) & ((torch.ones_like(bit) << width) - 1)


def _trailing_zeros(v: torch.Tensor) -> torch.Tensor:
    """Trailing zero bits of positive int64 values below 2**53."""
    return (v & -v).double().log2().round().long()


def _escape_rank(is_escape: torch.Tensor, chunk: torch.Tensor, n_esc: torch.Tensor) -> torch.Tensor:
    """Each element's rank among its chunk's escapes (meaningful where ``is_escape``)."""
    before_chunk = torch.cumsum(n_esc, 0) - n_esc
    return torch.cumsum(is_escape.long(), 0) - 1 - before_chunk[chunk]


class _Plan(NamedTuple):
    """Per chunk: the exponents in table order, the code width, the dropped bits, the escapes, the words."""

    order: torch.Tensor
    k: torch.Tensor
    t: torch.Tensor
    n_esc: torch.Tensor
    words: torch.Tensor


def _plan(u: torch.Tensor, chunk: torch.Tensor, sizes: torch.Tensor, layout: FloatLayout) -> _Plan:
    """Each chunk's table order, code width of fewest words, shared trailing zero bits and size."""
    device = u.device
    exp_bits, man_bits = layout.exponent_bits, layout.mantissa_bits
    n_chunks = sizes.numel()
    e = (u >> man_bits) & ((1 << exp_bits) - 1)
    counts = torch.zeros(n_chunks, 1 << exp_bits, dtype=torch.int64, device=device)
    counts.index_put_((chunk, e), torch.ones_like(e), accumulate=True)
    sorted_counts, order = counts.sort(dim=1, descending=True, stable=True)
    covered = torch.cat([torch.zeros(n_chunks, 1, dtype=torch.int64, device=device), sorted_counts.cumsum(1)], 1)
    ks = torch.arange(exp_bits, device=device)
    table_sizes = (1 << ks) - 1
    costs = (
        _ceil_words(table_sizes * TABLE_ENTRY_BITS)
        + _ceil_words(sizes[:, None] * ks)
        + _ceil_words((sizes[:, None] - covered[:, table_sizes]) * exp_bits)
    )
    k = costs.argmin(dim=1)
    n_esc = sizes - covered.gather(1, ((1 << k) - 1)[:, None])[:, 0]
    t = torch.full((n_chunks,), man_bits, dtype=torch.int64, device=device)
    t.scatter_reduce_(0, chunk, _trailing_zeros((u & ((1 << man_bits) - 1)) | (1 << man_bits)), reduce="amin")
    return _Plan(order, k, t, n_esc, _sections(torch.zeros_like(k), k, t, n_esc, sizes, layout).total)


def chunk_words_needed(flat_bits: torch.Tensor, layout: FloatLayout, chunk_words: int, launch: Launch | None) -> torch.Tensor:
    """Each chunk's size in words, without writing them (what :func:`compress_bits` would write)."""
    u = flat_bits.long() & ((1 << layout.width) - 1)
    chunk, _, sizes = _chunks(u.numel(), 32 * chunk_words, u.device)
    return _plan(u, chunk, sizes, layout).words


def compress_bits(
    flat_bits: torch.Tensor, layout: FloatLayout, chunk_words: int, launch: Launch | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(words, offsets)`` of a flat tensor of float bits (``layout.bits_dtype``).

    Args:
        flat_bits: contiguous 1-d int16 or int32 tensor, the element bits.
        layout: the float format's fields (:data:`~cswap.codecs.exponent_layout.FLOAT_LAYOUTS`).
        chunk_words: chunk size in units of 32 elements.
        launch: ignored.
    """
    device = flat_bits.device
    exp_bits, man_bits = layout.exponent_bits, layout.mantissa_bits
    u = flat_bits.long() & ((1 << layout.width) - 1)
    chunk, local, sizes = _chunks(u.numel(), 32 * chunk_words, device)
    n_chunks = sizes.numel()
    e = (u >> man_bits) & ((1 << exp_bits) - 1)
    rest = ((u >> (layout.width - 1)) << man_bits) | (u & ((1 << man_bits) - 1))
    plan = _plan(u, chunk, sizes, layout)
    order, k, t, n_esc = plan.order, plan.k, plan.t, plan.n_esc
    n_table = (1 << k) - 1

    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(1 << exp_bits, device=device).expand(n_chunks, -1).contiguous())
    element_rank = rank[chunk, e]
    is_escape = element_rank >= n_table[chunk]
    code = torch.where(is_escape, n_table[chunk], element_rank)

    sizes_words = plan.words
    offsets = torch.zeros(n_chunks + 1, dtype=torch.int64, device=device)
    torch.cumsum(sizes_words, 0, out=offsets[1:])
    start = offsets[:-1]
    at = _sections(start, k, t, n_esc, sizes, layout)
    words = torch.zeros(int(offsets[-1]) if n_chunks else 0, dtype=torch.int64, device=device)

    if n_chunks:
        _write(words, start * 32, 32, k | (t << 8))
        _write(words, (start + 1) * 32, 32, n_esc)
        slot = torch.arange((1 << (exp_bits - 1)) - 1, device=device).expand(n_chunks, -1)
        in_table = slot < n_table[:, None]
        table_bit = at.table[:, None] * 32 + slot * TABLE_ENTRY_BITS
        _write(words, table_bit[in_table], TABLE_ENTRY_BITS, order[:, : slot.shape[1]][in_table])
        coded = k[chunk] > 0
        _write(words, (at.codes[chunk] * 32 + local * k[chunk])[coded], k[chunk][coded], code[coded])
        rest_width = man_bits + 1 - t[chunk]
        _write(words, at.rest[chunk] * 32 + local * rest_width, rest_width, rest >> t[chunk])
        escape_rank = _escape_rank(is_escape, chunk, n_esc)
        _write(words, (at.escapes[chunk] * 32 + escape_rank * exp_bits)[is_escape], exp_bits, e[is_escape])
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32), offsets


def _headers(words: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    start = offsets[:-1]
    header = words.long()[start] & _WORD_MASK
    n_esc = words.long()[start + 1] & _WORD_MASK
    return header & 0xFF, (header >> 8) & 0xFF, n_esc


def decompress_bits(packed: CodedFloats, out_bits: torch.Tensor, launch: Launch | None) -> None:
    """Write the element bits of ``packed`` into the flat int16 or int32 tensor ``out_bits`` (buffers already valid)."""
    layout = FLOAT_LAYOUTS[packed.dtype]
    exp_bits, man_bits = layout.exponent_bits, layout.mantissa_bits
    device = packed.words.device
    chunk, local, sizes = _chunks(out_bits.numel(), packed.chunk_elements, device)
    k, t, n_esc = _headers(packed.words, packed.offsets)
    at = _sections(packed.offsets[:-1], k, t, n_esc, sizes, layout)
    words = _padded(packed.words)

    n_table = (1 << k) - 1
    code = _read(words, at.codes[chunk] * 32 + local * k[chunk], k[chunk])
    is_escape = code == n_table[chunk]
    escape_rank = _escape_rank(is_escape, chunk, n_esc)
    escaped = _read(words, at.escapes[chunk] * 32 + escape_rank.clamp(min=0) * exp_bits, exp_bits)
    tabled = _read(words, at.table[chunk] * 32 + code * TABLE_ENTRY_BITS, TABLE_ENTRY_BITS)
    e = torch.where(is_escape, escaped, tabled) & ((1 << exp_bits) - 1)
    rest_width = man_bits + 1 - t[chunk]
    rest = _read(words, at.rest[chunk] * 32 + local * rest_width, rest_width) << t[chunk]
    u = ((rest >> man_bits) << (layout.width - 1)) | (e << man_bits) | (rest & ((1 << man_bits) - 1))
    out_bits.copy_(torch.where(u >= 1 << (layout.width - 1), u - (1 << layout.width), u))


def offset_problems(words: torch.Tensor, offsets: torch.Tensor, numel: int, chunk_elements: int) -> list[str]:
    """What is wrong with the offsets of a coded tensor (empty when they rise from 0 by at least a
    header per chunk to the end of ``words``); the arguments are :func:`chunk_problems`'."""
    if -(-numel // chunk_elements) == 0:
        return [] if words.numel() == 0 else [f"an empty tensor has {words.numel()} words"]
    offsets = offsets.cpu()
    if int(offsets[0]) != 0 or bool((offsets.diff() < HEADER_WORDS).any()) or int(offsets[-1]) != words.numel():
        return [f"offsets must rise from 0 by at least {HEADER_WORDS} per chunk to the {words.numel()} words"]
    return []


def chunk_problems(
    words: torch.Tensor, offsets: torch.Tensor, numel: int, chunk_elements: int, dtype: torch.dtype
) -> list[str]:
    """What is wrong with the offsets, headers, tables and escape counts of a coded tensor (empty when valid).

    Args:
        words, offsets: the buffers, of the right dtypes and ranks.
        numel: elements of the original tensor.
        chunk_elements: elements per chunk.
        dtype: the original dtype.
    """
    words, offsets = words.cpu(), offsets.cpu()
    problems = offset_problems(words, offsets, numel, chunk_elements)
    if problems or numel == 0:
        return problems
    layout = FLOAT_LAYOUTS[dtype]
    k, t, n_esc = _headers(words, offsets)
    chunk, local, sizes = _chunks(numel, chunk_elements, offsets.device)
    bad = (k >= layout.exponent_bits) | (t > layout.mantissa_bits) | (n_esc > sizes)
    if bool(bad.any()):
        c = int(bad.nonzero()[0, 0])
        return [f"chunk {c} has header k={int(k[c])}, t={int(t[c])}, n_esc={int(n_esc[c])} out of range"]
    at = _sections(offsets[:-1], k, t, n_esc, sizes, layout)
    wrong = at.total != offsets.diff()
    if bool(wrong.any()):
        c = int(wrong.nonzero()[0, 0])
        return [f"chunk {c} spans {int(offsets.diff()[c])} words but its header needs {int(at.total[c])}"]
    padded = _padded(words)
    n_table = (1 << k) - 1
    slot = torch.arange(1 << (layout.exponent_bits - 1), dtype=torch.int64)
    in_table = slot[None, :] < n_table[:, None]
    entries = _read(padded, (at.table[:, None] * 32 + slot[None, :] * TABLE_ENTRY_BITS)[in_table], TABLE_ENTRY_BITS)
    if bool((entries >> layout.exponent_bits).any()):
        return [f"a table entry exceeds the {layout.exponent_bits} exponent bits of {dtype}"]
    code = _read(padded, at.codes[chunk] * 32 + local * k[chunk], k[chunk])
    counted = torch.zeros_like(n_esc).index_add_(0, chunk, (code == n_table[chunk]).long())
    wrong = counted != n_esc
    if bool(wrong.any()):
        c = int(wrong.nonzero()[0, 0])
        return [f"chunk {c} has {int(counted[c])} escape codes but its header says {int(n_esc[c])}"]
    return []
