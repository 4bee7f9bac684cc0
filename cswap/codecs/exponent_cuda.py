"""Exponent coding on the GPU: Numba CUDA kernels writing the bytes of :mod:`cswap.codecs.exponent_torch`.

One block per chunk (grid-stride over chunks), with the grid and block of ``compress`` and
``decompress`` in :class:`~cswap.codecs.launch.CudaLaunch`:

* ``plan``: the chunk's exponent histogram and shared trailing zero bits by shared-memory
  atomics; each bin's place in the table order by counting the present bins before it; then one
  thread picks the code width of fewest words from the counts in that order, and the block writes
  the table; the escape count and the chunk's size;
* between the kernels, torch's ``cumsum`` turns sizes into ``offsets`` on the same stream, and the
  host reads the total (one small copy, the only synchronisation of a compress) to size ``words``;
* ``write``: each thread builds whole words of the table, codes and rests from the fields that
  fall in them (no atomics, coalesced stores); then the escapes (2-5% of the elements, in almost
  every chunk), read back from the codes 32 elements to a thread: each segment's escape mask, a
  block-wide scan of their counts, and each thread ORs its segment's escaped exponents in at their
  ranks;
* ``decompress``: a chunk without escapes decodes one element per thread, consecutive threads on
  consecutive elements; a chunk with escapes first lays out the same masks and ranks, a tile of
  32-element segments (one per thread) at a time, and then decodes its elements just as coalesced,
  an escape's rank being its segment's plus the escapes below it in the mask.

No warp intrinsics: the same kernels run under Numba's CUDA simulator. Reads past ``words`` give
zeros, so a corrupt buffer decoded with ``validate=False`` decodes wrong but reads nothing out of
bounds. A launch the device refuses falls back to the defaults with one warning.

Example:
    >>> import torch
    >>> from cswap.codecs import compress
    >>> p = compress(torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16), codec="exponent")  # doctest: +SKIP
    >>> p.ratio > 1.3  # doctest: +SKIP
    True
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from numba import cuda, int64, uint32, uint64

from cswap.codecs import cuda_adapter
from cswap.codecs.cuda_launch import check_launch, with_fallback
from cswap.codecs.exponent_format import ExponentPacked
from cswap.codecs.exponent_layout import FLOAT_LAYOUTS, HEADER_WORDS, TABLE_ENTRY_BITS, FloatLayout
from cswap.codecs.launch import CudaLaunch

__all__ = ["available", "check_launch", "chunk_words_needed", "compress_bits", "decompress_bits"]

#: Shared scratch is sized for the largest block CudaLaunch allows and the widest exponent.
_MAX_BLOCK = 1024
_MAX_EXPONENTS = 256


def available() -> bool:
    """True where torch and Numba both see a GPU, or under ``NUMBA_ENABLE_CUDASIM=1``."""
    return cuda_adapter.simulator_enabled() or cuda_adapter.gpu_available()


@functools.cache
def _kernels() -> tuple[Any, Any, Any]:
    @cuda.jit(device=True)
    def words_for(fields, width):  # type: ignore[no-untyped-def]
        return (fields * width + 31) // 32

    @cuda.jit(device=True)
    def put(words, bit, field, width):  # type: ignore[no-untyped-def]
        w = bit >> 5
        shift = bit & 31
        cuda.atomic.or_(words, w, uint32((uint64(field) << uint64(shift)) & uint64(0xFFFFFFFF)))
        if shift + width > 32:
            cuda.atomic.or_(words, w + 1, uint32(uint64(field) >> uint64(32 - shift)))

    @cuda.jit(device=True)
    def get(words, bit, width):  # type: ignore[no-untyped-def]
        w = bit >> 5
        low = uint64(words[w]) if w < words.size else uint64(0)
        high = uint64(words[w + 1]) if w + 1 < words.size else uint64(0)
        return int64(((low | (high << uint64(32))) >> uint64(bit & 31)) & uint64((1 << width) - 1))

    @cuda.jit(device=True)
    def element(e, rest, width, man_bits):  # type: ignore[no-untyped-def]
        """An element's bits (signed, as the output's int type holds them) from its exponent ``e`` and
        its ``rest``: the sign above the mantissa, the low bits shifted back in."""
        u = ((rest >> man_bits) << (width - 1)) | (e << man_bits) | (rest & ((1 << man_bits) - 1))
        if u >= (1 << (width - 1)):
            u -= 1 << width
        return u

    @cuda.jit(device=True)
    def exclusive_scan(value, tid, nthreads, scratch):  # type: ignore[no-untyped-def]
        """Sum of ``value`` over threads below ``tid`` (block-uniform call: it holds barriers)."""
        scratch[tid] = value
        cuda.syncthreads()
        step = 1
        while step < nthreads:
            before = scratch[tid - step] if tid >= step else 0
            cuda.syncthreads()
            scratch[tid] += before
            cuda.syncthreads()
            step *= 2
        total = scratch[tid] - value
        cuda.syncthreads()
        return total

    @cuda.jit(device=True)
    def rank_escapes(words, codes, k, n_table, m, tile, tid, nthreads, masks, ranks, tile_total, before_tile):  # type: ignore[no-untyped-def]
        """Escapes of segments ``tile`` to ``tile + nthreads - 1`` (32 elements each) of a chunk of
        ``m`` elements: ``masks[i]`` has bit ``b`` set where element ``32 * (tile + i) + b`` holds the
        escape code, ``ranks[i]`` counts the escapes before that segment. Returns the escapes before
        the next tile. Block-uniform: it holds barriers; ``ranks`` may be the scan's scratch."""
        first = (tile + tid) * 32
        mask = int64(0)
        for b in range(min(32, m - first)):  # no iteration past the chunk's last segment
            if get(words, codes * 32 + (first + b) * k, k) == n_table:
                mask |= int64(1) << b
        masks[tid] = mask
        count = int64(cuda.popc(mask))
        before = exclusive_scan(count, tid, nthreads, ranks)
        ranks[tid] = before_tile + before
        if tid == nthreads - 1:
            tile_total[0] = before + count
        cuda.syncthreads()
        return before_tile + tile_total[0]

    @cuda.jit(device=True)
    def escape_rank(masks, ranks, j, tile):  # type: ignore[no-untyped-def]
        """The rank among the chunk's escapes of element ``j``, an escape of the tile laid out by ``rank_escapes``."""
        segment = (j >> 5) - tile
        return ranks[segment] + int64(cuda.popc(masks[segment] & ((int64(1) << (j & 31)) - 1)))

    @cuda.jit(device=True)
    def gathered_word(x, lo, w, bits, m, rest, code_of, value_mask, width, man_bits, man_mask, n_exp, t):  # type: ignore[no-untyped-def]
        """Word ``w`` of a section of ``m`` fields of ``bits`` bits (the elements' codes, or their
        rests where ``rest``), built from the fields that fall in it."""
        lo_bit = w * 32
        j = lo_bit // bits
        last = min((lo_bit + 31) // bits, m - 1)
        acc = uint64(0)
        while j <= last:
            u = int64(x[lo + j]) & value_mask
            if rest:
                field = uint64(((u >> (width - 1)) << (man_bits - t)) | ((u & man_mask) >> t))
            else:
                field = uint64(code_of[(u >> man_bits) & (n_exp - 1)])
            pos = j * bits - lo_bit
            acc |= (field << uint64(pos)) if pos >= 0 else (field >> uint64(-pos))
            j += 1
        return uint32(acc & uint64(0xFFFFFFFF))

    @cuda.jit
    def plan(x, n, width, exp_bits, man_bits, chunk, ks, ts, n_escs, tables, sizes):  # type: ignore[no-untyped-def]
        counts = cuda.shared.array(_MAX_EXPONENTS, dtype=np.int32)
        order = cuda.shared.array(_MAX_EXPONENTS, dtype=np.int32)
        present = cuda.shared.array(_MAX_EXPONENTS, dtype=np.int32)
        ordered_counts = cuda.shared.array(_MAX_EXPONENTS, dtype=np.int32)
        chosen_k = cuda.shared.array(1, dtype=np.int32)
        n_present = cuda.shared.array(1, dtype=np.int32)
        t_shared = cuda.shared.array(1, dtype=np.int32)
        tid = cuda.threadIdx.x
        nthreads = cuda.blockDim.x
        n_exp = 1 << exp_bits
        n_chunks = sizes.size
        for c in range(cuda.blockIdx.x, n_chunks, cuda.gridDim.x):
            lo = c * chunk
            m = min(chunk, n - lo)
            for b in range(tid, n_exp, nthreads):
                counts[b] = 0
            if tid == 0:
                t_shared[0] = man_bits
            cuda.syncthreads()
            t_mine = man_bits
            for i in range(lo + tid, lo + m, nthreads):
                u = int64(x[i]) & ((1 << width) - 1)
                cuda.atomic.add(counts, (u >> man_bits) & (n_exp - 1), 1)
                v = (u & ((1 << man_bits) - 1)) | (1 << man_bits)
                tz = 0
                while (v >> tz) & 1 == 0:
                    tz += 1
                t_mine = min(t_mine, tz)
            if t_mine < t_shared[0]:  # a stale read costs one atomic more; most threads skip theirs
                cuda.atomic.min(t_shared, 0, t_mine)
            cuda.syncthreads()
            # Rank the bins by (count descending, exponent ascending) comparing against the few
            # bins present only: a chunk holds a few dozen exponents of the 256 (or 32) there are.
            if tid == 0:
                n_present[0] = 0
            cuda.syncthreads()
            for b in range(tid, n_exp, nthreads):
                if counts[b] > 0:
                    present[cuda.atomic.add(n_present, 0, 1)] = b
            cuda.syncthreads()
            n_nz = n_present[0]
            for b in range(tid, n_exp, nthreads):
                count = counts[b]
                place = 0
                if count > 0:
                    for q in range(n_nz):
                        j = present[q]
                        if counts[j] > count or (counts[j] == count and j < b):
                            place += 1
                else:  # absent exponents follow every present one, in exponent order
                    for q in range(n_nz):
                        if present[q] < b:
                            place += 1
                    place = n_nz + b - place
                order[place] = b
            cuda.syncthreads()
            for q in range(tid, (1 << (exp_bits - 1)) - 1, nthreads):  # the widest table's; thread 0 sums them below
                ordered_counts[q] = counts[order[q]]
            cuda.syncthreads()
            if tid == 0:
                best_k = 0
                best = words_for(m, exp_bits)
                covered = 0
                best_covered = 0
                for k in range(1, exp_bits):
                    for j in range((1 << (k - 1)) - 1, (1 << k) - 1):
                        covered += ordered_counts[j]
                    cost = words_for((1 << k) - 1, TABLE_ENTRY_BITS) + words_for(m, k) + words_for(m - covered, exp_bits)
                    if cost < best:
                        best = cost
                        best_k = k
                        best_covered = covered
                chosen_k[0] = best_k
                t = t_shared[0]
                ks[c] = best_k
                ts[c] = t
                n_escs[c] = m - best_covered
                sizes[c] = (
                    HEADER_WORDS + words_for((1 << best_k) - 1, TABLE_ENTRY_BITS) + words_for(m, best_k)
                    + words_for(m, man_bits + 1 - t) + words_for(m - best_covered, exp_bits)
                )
            cuda.syncthreads()
            for j in range(tid, (1 << chosen_k[0]) - 1, nthreads):
                tables[c, j] = order[j]
            cuda.syncthreads()

    @cuda.jit
    def write(x, n, width, exp_bits, man_bits, chunk, ks, ts, n_escs, tables, offsets, words):  # type: ignore[no-untyped-def]
        code_of = cuda.shared.array(_MAX_EXPONENTS, dtype=np.int32)
        scratch = cuda.shared.array(_MAX_BLOCK, dtype=np.int64)
        masks = cuda.shared.array(_MAX_BLOCK, dtype=np.int64)
        tile_total = cuda.shared.array(1, dtype=np.int64)
        tid = cuda.threadIdx.x
        nthreads = cuda.blockDim.x
        n_exp = 1 << exp_bits
        value_mask = (int64(1) << width) - 1
        man_mask = (int64(1) << man_bits) - 1
        for c in range(cuda.blockIdx.x, offsets.size - 1, cuda.gridDim.x):
            lo = c * chunk
            m = min(chunk, n - lo)
            k = ks[c]
            t = ts[c]
            n_table = (1 << k) - 1
            start = offsets[c]
            table_at = start + HEADER_WORDS
            codes = table_at + words_for(n_table, TABLE_ENTRY_BITS)
            rest_bits = man_bits + 1 - t
            rests = codes + words_for(m, k)
            escapes = rests + words_for(m, rest_bits)
            for b in range(tid, n_exp, nthreads):
                code_of[b] = n_table
            cuda.syncthreads()
            for j in range(tid, n_table, nthreads):
                code_of[tables[c, j]] = j
            if tid == 0:
                words[start] = uint32(k | (t << 8))
                words[start + 1] = uint32(n_escs[c])
            # Each word is whole from one thread (no atomics; consecutive threads, consecutive words):
            # the table's 8-bit entries, four to a word; the escapes' words zeroed for their ORs below.
            for w in range(tid, codes - table_at, nthreads):
                acc = uint32(0)
                for q in range(32 // TABLE_ENTRY_BITS):
                    j = w * (32 // TABLE_ENTRY_BITS) + q
                    if j < n_table:
                        acc |= uint32(tables[c, j]) << uint32(q * TABLE_ENTRY_BITS)
                words[table_at + w] = acc
            for w in range(tid, words_for(n_escs[c], exp_bits), nthreads):
                words[escapes + w] = uint32(0)
            cuda.syncthreads()
            if k:
                for w in range(tid, rests - codes, nthreads):
                    words[codes + w] = gathered_word(x, lo, w, k, m, False, code_of, value_mask, width, man_bits, man_mask, n_exp, t)
            for w in range(tid, escapes - rests, nthreads):
                words[rests + w] = gathered_word(
                    x, lo, w, rest_bits, m, True, code_of, value_mask, width, man_bits, man_mask, n_exp, t
                )
            # Escapes (a few in almost every chunk): read back from the codes just written, a tile of 32-element
            # segments at a time, each thread ORs in its segment's escapes at their ranks.
            if n_escs[c]:
                cuda.syncthreads()
                before_tile = int64(0)
                for tile in range(0, (m + 31) // 32, nthreads):
                    after_tile = rank_escapes(words, codes, k, n_table, m, tile, tid, nthreads, masks, scratch, tile_total, before_tile)
                    mask = int64(masks[tid])
                    rank = int64(scratch[tid])
                    while mask:
                        low = mask & -mask
                        e = ((int64(x[lo + (tile + tid) * 32 + cuda.popc(low - 1)]) & value_mask) >> man_bits) & (n_exp - 1)
                        put(words, escapes * 32 + rank * exp_bits, e, exp_bits)
                        rank += 1
                        mask ^= low
                    before_tile = after_tile
                    cuda.syncthreads()
            cuda.syncthreads()

    @cuda.jit
    def decompress(words, offsets, n, width, exp_bits, man_bits, chunk, out):  # type: ignore[no-untyped-def]
        table = cuda.shared.array(_MAX_EXPONENTS, dtype=np.int32)
        scratch = cuda.shared.array(_MAX_BLOCK, dtype=np.int64)
        masks = cuda.shared.array(_MAX_BLOCK, dtype=np.int64)
        tile_total = cuda.shared.array(1, dtype=np.int64)
        tid = cuda.threadIdx.x
        nthreads = cuda.blockDim.x
        n_exp = 1 << exp_bits
        for c in range(cuda.blockIdx.x, offsets.size - 1, cuda.gridDim.x):
            lo = c * chunk
            m = min(chunk, n - lo)
            start = offsets[c]
            header = get(words, start * 32, 32)
            k = min(header & 0xFF, exp_bits - 1)
            t = min((header >> 8) & 0xFF, man_bits)
            n_table = (1 << k) - 1
            for j in range(tid, n_table, nthreads):
                table[j] = get(words, (start + HEADER_WORDS) * 32 + j * TABLE_ENTRY_BITS, TABLE_ENTRY_BITS) & (n_exp - 1)
            cuda.syncthreads()
            codes = start + HEADER_WORDS + words_for(n_table, TABLE_ENTRY_BITS)
            rests = codes + words_for(m, k)
            rest_bits = man_bits + 1 - t
            escapes = rests + words_for(m, rest_bits)
            if get(words, (start + 1) * 32, 32) == 0:
                # No escapes (a chunk of few exponents): an element needs nothing from its neighbours, so
                # consecutive threads take consecutive elements, reading and writing coalesced.
                for j in range(tid, m, nthreads):
                    e = int64(table[get(words, codes * 32 + j * k, k)])
                    out[lo + j] = element(e, get(words, rests * 32 + j * rest_bits, rest_bits) << t, width, man_bits)
            else:
                # An escape's exponent is at its rank among the chunk's escapes: per tile of 32-element
                # segments, each segment's escape mask and rank, then the elements coalesced again.
                before_tile = int64(0)
                for tile in range(0, (m + 31) // 32, nthreads):
                    after_tile = rank_escapes(words, codes, k, n_table, m, tile, tid, nthreads, masks, scratch, tile_total, before_tile)
                    for j in range(tile * 32 + tid, min((tile + nthreads) * 32, m), nthreads):
                        code = get(words, codes * 32 + j * k, k)
                        if code == n_table:
                            e = get(words, escapes * 32 + escape_rank(masks, scratch, j, tile) * exp_bits, exp_bits)
                        else:
                            e = int64(table[code])
                        out[lo + j] = element(e, get(words, rests * 32 + j * rest_bits, rest_bits) << t, width, man_bits)
                    before_tile = after_tile
                    cuda.syncthreads()
            cuda.syncthreads()

    return plan, write, decompress


def _plan(flat_bits: torch.Tensor, layout: FloatLayout, chunk_words: int, chosen: CudaLaunch) -> tuple[torch.Tensor, ...]:
    """The plan kernel: per chunk ``(k, t, n_esc, size in words)`` and the tables, on the device."""
    device = flat_bits.device
    n_chunks = -(-flat_bits.numel() // (32 * chunk_words))
    per_chunk = tuple(torch.empty(n_chunks, dtype=torch.int64, device=device) for _ in range(4))
    tables = torch.empty(n_chunks, (1 << (layout.exponent_bits - 1)) - 1, dtype=torch.int64, device=device)
    if n_chunks:
        ks, ts, n_escs, sizes = (cuda_adapter.as_array(a) for a in per_chunk)
        with cuda_adapter.launcher(device) as launcher:
            launcher(
                _kernels()[0], chosen.compress_grid, chosen.compress_block, cuda_adapter.as_array(flat_bits),
                *_fields(flat_bits, layout, chunk_words), ks, ts, n_escs, cuda_adapter.as_array(tables), sizes,
            )
    return (*per_chunk, tables)


def _fields(flat_bits: torch.Tensor, layout: FloatLayout, chunk_words: int) -> tuple[int, ...]:
    return (flat_bits.numel(), layout.width, layout.exponent_bits, layout.mantissa_bits, 32 * chunk_words)


def chunk_words_needed(flat_bits: torch.Tensor, layout: FloatLayout, chunk_words: int, launch: CudaLaunch | None) -> torch.Tensor:
    """Each chunk's size in words on the device, without writing them or waiting for them (the plan kernel alone)."""
    launch = check_launch(launch)
    cuda_adapter.check_tensor(flat_bits, "tensor to measure")
    return with_fallback(launch, launch.chunk_words, lambda chosen: _plan(flat_bits, layout, chunk_words, chosen)[3])


def compress_bits(
    flat_bits: torch.Tensor, layout: FloatLayout, chunk_words: int, launch: CudaLaunch | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(words, offsets)`` of a flat tensor of float bits on its GPU (on the CPU under the simulator)."""
    launch = check_launch(launch)
    cuda_adapter.check_tensor(flat_bits, "tensor to compress")
    device = flat_bits.device

    def run(chosen: CudaLaunch) -> tuple[torch.Tensor, torch.Tensor]:
        ks, ts, n_escs, sizes, tables = _plan(flat_bits, layout, chunk_words, chosen)
        offsets = torch.zeros(sizes.numel() + 1, dtype=torch.int64, device=device)
        if not sizes.numel():
            return torch.empty(0, dtype=torch.int32, device=device), offsets
        torch.cumsum(sizes, 0, out=offsets[1:])
        words = torch.empty(int(offsets[-1]), dtype=torch.int32, device=device)  # the kernel writes every word
        with cuda_adapter.launcher(device) as launcher:
            launcher(
                _kernels()[1], chosen.scatter_grid, chosen.scatter_block, cuda_adapter.as_array(flat_bits),
                *_fields(flat_bits, layout, chunk_words), *(cuda_adapter.as_array(a) for a in (ks, ts, n_escs, tables)),
                cuda_adapter.as_array(offsets), cuda_adapter.as_array(words, np.uint32),
            )
        return words, offsets

    return with_fallback(launch, launch.chunk_words, run)


def decompress_bits(packed: ExponentPacked, out_bits: torch.Tensor, launch: CudaLaunch | None) -> None:
    """Write the element bits of ``packed`` into the flat int16 or int32 tensor ``out_bits`` on the same device."""
    launch = check_launch(launch)
    for name, tensor in (("packed words", packed.words), ("packed offsets", packed.offsets), ("output", out_bits)):
        cuda_adapter.check_tensor(tensor, name)
    layout = FLOAT_LAYOUTS[packed.dtype]

    def run(chosen: CudaLaunch) -> None:
        with cuda_adapter.launcher(out_bits.device) as launcher:
            launcher(
                _kernels()[2], chosen.decompress_grid, chosen.decompress_block,
                cuda_adapter.as_array(packed.words.contiguous(), np.uint32), cuda_adapter.as_array(packed.offsets.contiguous()),
                out_bits.numel(), layout.width, layout.exponent_bits, layout.mantissa_bits, packed.chunk_elements,
                cuda_adapter.as_array(out_bits),
            )

    with_fallback(launch, launch.chunk_words, run)
