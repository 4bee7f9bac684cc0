# Longer than the ~500-line guide on purpose: each CUDA kernel sits next to the simulator twin that
# must write identical bytes, so a change to one is made where the other is in view.
"""ZVC backend on the GPU: Numba CUDA kernels that write the same bytes as :mod:`cswap.codecs.zvc_torch`.

Compression is three kernels, decompression one; each takes its grid and block from
:class:`~cswap.codecs.launch.CudaLaunch` and loops grid-stride, so any grid >= 1 is correct:

* ``compress``: one warp per chunk of ``chunk_words`` bitmap words. Each lane reads one element
  per word (coalesced), a warp ballot turns the 32 "nonzero" flags into the bitmap word, and the
  popcounts add up to the chunk's count, written to ``offsets[chunk + 1]``. No global atomics.
* ``scan``: an in-place inclusive scan of those counts, which turns ``offsets`` into the prefix
  sums of the format. With ``scan_grid == 1`` one block walks the counts tile by tile with a
  carry; with more blocks, a reduce pass (``scan_reduce``) sums each block's segment first and
  the apply pass (``scan_apply``) starts each segment from the sum of those before it.
* ``scatter``: one warp per chunk again; lane ``l`` of word ``w`` writes its element, if nonzero,
  to ``offsets[chunk] + popcount(earlier words of the chunk) + popcount(bits of w below l)``.
* ``decompress``: the same position arithmetic in reverse, zeros where the bit is clear.

Between the scan and the scatter the host reads ``offsets[-1]`` (the number of nonzeros) to size
``values``: one small device-to-host copy, the only synchronisation of a compress. Decompress
does not synchronise.

The two warp-level steps (forming bitmap words, the warp scan) have two implementations with one
contract: intrinsics (``ballot_sync``, ``shfl_up_sync``) on a real GPU, and twins without them for
Numba's CUDA simulator, which has none (each lane forms the words itself; the scan goes through
shared memory). Everything else is the same code, and the twins also run on a GPU, where the tests
compare both. All kernels run on torch's current stream (see :mod:`cswap.codecs.cuda_adapter`);
nothing is compiled before the first call.

Example:
    >>> import torch
    >>> from cswap.codecs import CudaLaunch, compress, decompress
    >>> t = torch.relu(torch.randn(1 << 20, device="cuda"))  # doctest: +SKIP
    >>> p = compress(t, backend="cuda", launch=CudaLaunch(compress_block=512))  # doctest: +SKIP
    >>> torch.equal(decompress(p, backend="cuda"), t)  # doctest: +SKIP
    True
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import sys
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from numba import cuda, int64, uint32

from cswap.codecs import cuda_adapter
from cswap.codecs.format import Packed, n_chunks_for, n_words_for, out_buffer
from cswap.codecs.cuda_launch import check_launch, with_fallback
from cswap.codecs.launch import CUDA_KERNELS, CudaLaunch, Launch

__all__ = [
    "CUDA_KERNELS",
    "Kernels",
    "available",
    "check_launch",
    "compress_bits",
    "compress_bits_unsized",
    "decompress_bits",
    "kernel_source_hash",
    "kernels",
    "uses_warp_intrinsics",
]

_T = TypeVar("_T")

_FULL_MASK = 0xFFFFFFFF
#: The scan twin's shared scratch is sized for the largest block CudaLaunch allows.
_MAX_BLOCK = 1024
_MAX_WARPS = 32


# --- warp-level steps: intrinsics for the GPU, twins without them for the simulator ---------------
# Each pair has one contract and is called by all 32 lanes of a warp together.
#
# ``words4(x, n, i, live1, live2, live3, lane)``: the bitmap words of the four consecutive words
# whose element for this lane is ``x[i]``, ``x[i + 32]``, ``x[i + 64]``, ``x[i + 96]`` (word ``k``
# counts only if ``live<k>``, and only elements below ``n``), returned in every lane. The intrinsic
# form loads one element per lane and ballots; the twin has each lane read all 32 elements itself.
#
# ``warp_scan(value, lane, tid, scratch)``: inclusive prefix sum of ``value`` over lanes 0..lane.
# The twin goes through ``scratch`` (shared, one slot per thread) and holds block barriers, so its
# call sites must be block-uniform.


def _words4_intrinsic(
    x: Any, n: int, i: int, live1: bool, live2: bool, live3: bool, lane: int
) -> tuple[int, int, int, int]:
    # Four independent loads per lane are in flight before the first ballot.
    f0 = i < n and x[i] != 0
    f1 = live1 and i + 32 < n and x[i + 32] != 0
    f2 = live2 and i + 64 < n and x[i + 64] != 0
    f3 = live3 and i + 96 < n and x[i + 96] != 0
    return (
        uint32(cuda.ballot_sync(_FULL_MASK, f0)),
        uint32(cuda.ballot_sync(_FULL_MASK, f1)),
        uint32(cuda.ballot_sync(_FULL_MASK, f2)),
        uint32(cuda.ballot_sync(_FULL_MASK, f3)),
    )


def _words4_serial(
    x: Any, n: int, i: int, live1: bool, live2: bool, live3: bool, lane: int
) -> tuple[int, int, int, int]:
    start = i - lane
    w0 = uint32(0)
    w1 = uint32(0)
    w2 = uint32(0)
    w3 = uint32(0)
    for bit in range(32):
        e = start + bit
        mask = uint32(1) << uint32(bit)
        if e < n and x[e] != 0:
            w0 = uint32(w0 | mask)
        if live1 and e + 32 < n and x[e + 32] != 0:
            w1 = uint32(w1 | mask)
        if live2 and e + 64 < n and x[e + 64] != 0:
            w2 = uint32(w2 | mask)
        if live3 and e + 96 < n and x[e + 96] != 0:
            w3 = uint32(w3 | mask)
    return w0, w1, w2, w3


def _warp_scan_intrinsic(value: int, lane: int, tid: int, scratch: Any) -> int:
    offset = 1
    while offset < 32:
        other = cuda.shfl_up_sync(_FULL_MASK, value, offset)
        if lane >= offset:
            value += other
        offset *= 2
    return value


def _warp_scan_shared(value: int, lane: int, tid: int, scratch: Any) -> int:
    scratch[tid] = value
    cuda.syncthreads()
    base = tid - lane
    total = int64(0)
    for k in range(lane + 1):
        total += scratch[base + k]
    cuda.syncthreads()
    return total


@dataclass(frozen=True)
class Kernels:
    """The compiled-on-first-call kernels of one variant (see :func:`kernels`).

    Args:
        compress: bitmap words and per-chunk counts.
        scan_reduce: per-block segment sums, the first pass of a multi-block scan.
        scan_apply: the in-place scan of the counts into offsets.
        scatter: nonzero values to their positions.
        decompress: the whole decompression.
        warp_intrinsics: whether the warp-level steps use intrinsics (GPU only) or shared memory.
    """

    compress: Any
    scan_reduce: Any
    scan_apply: Any
    scatter: Any
    decompress: Any
    warp_intrinsics: bool


@functools.cache
def kernels(warp_intrinsics: bool) -> Kernels:
    """The kernel set with or without warp intrinsics, built once per process (compiled on first call).

    Args:
        warp_intrinsics: ``True`` for ``ballot_sync``/``shfl_up_sync`` (a real GPU only), ``False``
            for their shared-memory twins, which also run on a GPU and give identical output.

    Example:
        >>> kernels(uses_warp_intrinsics()).warp_intrinsics == uses_warp_intrinsics()
        True
    """
    device = cuda.jit(device=True)
    if warp_intrinsics:
        words4 = device(_words4_intrinsic)
        warp_scan = device(_warp_scan_intrinsic)
    else:
        words4 = device(_words4_serial)
        warp_scan = device(_warp_scan_shared)
    # Only the scan twin uses scratch; the intrinsic kernels keep their shared memory (and occupancy).
    scan_scratch_words = 1 if warp_intrinsics else _MAX_BLOCK

    @device
    def block_scan(value, lane, tid, warp_sums, warp_excl, scratch):  # type: ignore[no-untyped-def]
        # Inclusive scan over the block: within warps, then over the warps' totals. Every warp
        # scans the totals (cheap, and keeps the twins' barriers uniform); warp 0 publishes them.
        n_warps = int64(cuda.blockDim.x) // 32
        warp = tid // 32
        inclusive = warp_scan(value, lane, tid, scratch)
        if lane == 31:
            warp_sums[warp] = inclusive
        cuda.syncthreads()
        warp_total = warp_sums[lane] if lane < n_warps else int64(0)
        warp_inclusive = warp_scan(warp_total, lane, tid, scratch)
        if warp == 0 and lane < n_warps:
            warp_excl[lane] = warp_inclusive - warp_total
        cuda.syncthreads()
        inclusive += warp_excl[warp]
        block_total = warp_excl[n_warps - 1] + warp_sums[n_warps - 1]
        cuda.syncthreads()
        return inclusive, block_total

    @cuda.jit
    def compress(x, n, n_words, n_chunks, chunk_words, bitmap, offsets):  # type: ignore[no-untyped-def]
        tid = int64(cuda.threadIdx.x)
        lane = tid % 32
        warps_per_block = int64(cuda.blockDim.x) // 32
        warp = int64(cuda.blockIdx.x) * warps_per_block + tid // 32
        total_warps = int64(cuda.gridDim.x) * warps_per_block
        for chunk in range(warp, n_chunks, total_warps):
            word0 = chunk * chunk_words
            count = int64(0)
            for j in range(0, chunk_words, 4):
                w = word0 + j
                b0, b1, b2, b3 = words4(
                    x, n, w * 32 + lane, j + 1 < chunk_words, j + 2 < chunk_words, j + 3 < chunk_words, lane
                )
                count += int64(cuda.popc(b0)) + int64(cuda.popc(b1)) + int64(cuda.popc(b2)) + int64(cuda.popc(b3))
                # Lanes 0-3 store the four words: one 16-byte store instead of four 4-byte ones.
                if lane < 4 and j + lane < chunk_words and w + lane < n_words:
                    bitmap[w + lane] = b0 if lane == 0 else (b1 if lane == 1 else (b2 if lane == 2 else b3))
            if lane == 0:
                offsets[chunk + 1] = count

    @cuda.jit
    def scan_reduce(offsets, m, segment, block_sums):  # type: ignore[no-untyped-def]
        warp_sums = cuda.shared.array(_MAX_WARPS, int64)
        warp_excl = cuda.shared.array(_MAX_WARPS, int64)
        scratch = cuda.shared.array(scan_scratch_words, int64)
        tid = int64(cuda.threadIdx.x)
        block = int64(cuda.blockIdx.x)
        start = block * segment
        stop = min(start + segment, m)
        partial = int64(0)
        for k in range(start + tid, stop, int64(cuda.blockDim.x)):
            partial += offsets[k + 1]
        _, total = block_scan(partial, tid % 32, tid, warp_sums, warp_excl, scratch)
        if tid == 0:
            block_sums[block] = total

    @cuda.jit
    def scan_apply(offsets, m, segment, block_sums):  # type: ignore[no-untyped-def]
        warp_sums = cuda.shared.array(_MAX_WARPS, int64)
        warp_excl = cuda.shared.array(_MAX_WARPS, int64)
        scratch = cuda.shared.array(scan_scratch_words, int64)
        tid = int64(cuda.threadIdx.x)
        lane = tid % 32
        block = int64(cuda.blockIdx.x)
        threads = int64(cuda.blockDim.x)
        carry = int64(0)
        if block > 0:  # block-uniform; block 0 starts at zero without the barriers
            partial = int64(0)
            for k in range(tid, block, threads):
                partial += block_sums[k]
            _, carry = block_scan(partial, lane, tid, warp_sums, warp_excl, scratch)
        start = block * segment
        stop = min(start + segment, m)
        for base in range(start, stop, threads):
            k = base + tid
            count = offsets[k + 1] if k < stop else int64(0)
            inclusive, tile_total = block_scan(count, lane, tid, warp_sums, warp_excl, scratch)
            if k < stop:
                offsets[k + 1] = carry + inclusive
            carry += tile_total
        if block == 0 and tid == 0:
            offsets[0] = 0

    @cuda.jit
    def scatter(x, n, n_words, n_chunks, chunk_words, bitmap, offsets, values):  # type: ignore[no-untyped-def]
        tid = int64(cuda.threadIdx.x)
        lane = tid % 32
        below = (int64(1) << lane) - 1
        warps_per_block = int64(cuda.blockDim.x) // 32
        warp = int64(cuda.blockIdx.x) * warps_per_block + tid // 32
        total_warps = int64(cuda.gridDim.x) * warps_per_block
        for chunk in range(warp, n_chunks, total_warps):
            position = offsets[chunk]
            word0 = chunk * chunk_words
            stop = min(word0 + chunk_words, n_words)
            for w in range(word0, stop, 4):
                i = w * 32 + lane
                m0 = int64(bitmap[w])
                m1 = int64(bitmap[w + 1]) if w + 1 < stop else int64(0)
                m2 = int64(bitmap[w + 2]) if w + 2 < stop else int64(0)
                m3 = int64(bitmap[w + 3]) if w + 3 < stop else int64(0)
                if (m0 >> lane) & 1:
                    values[position + int64(cuda.popc(m0 & below))] = x[i]
                position += int64(cuda.popc(m0))
                if (m1 >> lane) & 1:
                    values[position + int64(cuda.popc(m1 & below))] = x[i + 32]
                position += int64(cuda.popc(m1))
                if (m2 >> lane) & 1:
                    values[position + int64(cuda.popc(m2 & below))] = x[i + 64]
                position += int64(cuda.popc(m2))
                if (m3 >> lane) & 1:
                    values[position + int64(cuda.popc(m3 & below))] = x[i + 96]
                position += int64(cuda.popc(m3))

    @cuda.jit
    def decompress(values, n, n_words, n_chunks, chunk_words, bitmap, offsets, out):  # type: ignore[no-untyped-def]
        tid = int64(cuda.threadIdx.x)
        lane = tid % 32
        below = (int64(1) << lane) - 1
        warps_per_block = int64(cuda.blockDim.x) // 32
        warp = int64(cuda.blockIdx.x) * warps_per_block + tid // 32
        total_warps = int64(cuda.gridDim.x) * warps_per_block
        for chunk in range(warp, n_chunks, total_warps):
            position = offsets[chunk]
            word0 = chunk * chunk_words
            stop = min(word0 + chunk_words, n_words)
            for w in range(word0, stop, 4):
                i = w * 32 + lane
                m0 = int64(bitmap[w])
                m1 = int64(bitmap[w + 1]) if w + 1 < stop else int64(0)
                m2 = int64(bitmap[w + 2]) if w + 2 < stop else int64(0)
                m3 = int64(bitmap[w + 3]) if w + 3 < stop else int64(0)
                v0 = values[position + int64(cuda.popc(m0 & below))] if (m0 >> lane) & 1 else 0
                position += int64(cuda.popc(m0))
                v1 = values[position + int64(cuda.popc(m1 & below))] if (m1 >> lane) & 1 else 0
                position += int64(cuda.popc(m1))
                v2 = values[position + int64(cuda.popc(m2 & below))] if (m2 >> lane) & 1 else 0
                position += int64(cuda.popc(m2))
                v3 = values[position + int64(cuda.popc(m3 & below))] if (m3 >> lane) & 1 else 0
                position += int64(cuda.popc(m3))
                # Words past this chunk's last one belong to the next chunk's warp: never write them.
                if i < n:
                    out[i] = v0
                if w + 1 < stop and i + 32 < n:
                    out[i + 32] = v1
                if w + 2 < stop and i + 64 < n:
                    out[i + 64] = v2
                if w + 3 < stop and i + 96 < n:
                    out[i + 96] = v3

    return Kernels(
        compress=compress,
        scan_reduce=scan_reduce,
        scan_apply=scan_apply,
        scatter=scatter,
        decompress=decompress,
        warp_intrinsics=warp_intrinsics,
    )


# --- backend interface ----------------------------------------------------------------------------


def available() -> bool:
    """True on a machine where torch and Numba both see a GPU, or under ``NUMBA_ENABLE_CUDASIM=1``.

    Example:
        >>> isinstance(available(), bool)
        True
    """
    return cuda_adapter.simulator_enabled() or cuda_adapter.gpu_available()


def uses_warp_intrinsics() -> bool:
    """Whether :func:`compress_bits` and :func:`decompress_bits` use the intrinsic kernels here.

    False under the simulator, which has no warp intrinsics.
    """
    return not cuda_adapter.simulator_enabled()


@functools.cache
def kernel_source_hash() -> str:
    """SHA-256 (hex) of this module's source: tuned launch configs keyed by it expire when kernels change.

    Example:
        >>> len(kernel_source_hash())
        64
    """
    source = inspect.getsource(sys.modules[__name__])
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def compress_bits(
    flat_bits: torch.Tensor,
    chunk_words: int,
    launch: Launch | None,
    out: Packed | None = None,
    *,
    warp_intrinsics: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bitmap, offsets and values of a flat integer tensor, computed on its GPU.

    Args:
        flat_bits: contiguous 1-d tensor of the element bits (``uint8``, ``int16``, ``int32`` or
            ``int64``) on a CUDA device (on the CPU under the simulator).
        chunk_words: bitmap words per offsets chunk.
        launch: grid and block of each kernel; ``None`` for :class:`CudaLaunch` defaults. A launch the
            device refuses falls back to the defaults with one warning per configuration.
        out: optional buffers to write into (on the same device, e.g. :meth:`Packed.workspace`); the
            results are then views of their first elements. ``ValueError`` if one is too small.
        warp_intrinsics: force the kernel variant (see :func:`kernels`); ``None`` picks
            :func:`uses_warp_intrinsics`. Both give identical bytes.

    Returns:
        ``(bitmap, offsets, values)`` on the device of ``flat_bits``, byte-identical to
        :func:`cswap.codecs.zvc_torch.compress_bits`.
    """
    launch = check_launch(launch)
    cuda_adapter.check_tensor(flat_bits, "tensor to compress")
    flat_bits = flat_bits.detach().reshape(-1).contiguous()
    warp_intrinsics = _variant(warp_intrinsics)
    return with_fallback(
        launch, chunk_words, lambda chosen: _compress(flat_bits, chunk_words, chosen, warp_intrinsics, out)
    )


def compress_bits_unsized(
    flat_bits: torch.Tensor, chunk_words: int, launch: Launch | None, *, warp_intrinsics: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As :func:`compress_bits`, without waiting for the nonzero count: ``values`` is a workspace of
    ``numel`` elements whose first ``offsets[-1]`` hold the nonzeros (the rest is not written).

    Nothing here reads the device from the host: the kernels are queued on the current stream, and
    the count stays in ``offsets[-1]`` for the caller to read back when it needs it
    (:func:`cswap.codecs.deferred.encode_unsized`).
    """
    launch = check_launch(launch)
    cuda_adapter.check_tensor(flat_bits, "tensor to compress")
    flat_bits = flat_bits.detach().reshape(-1).contiguous()
    warp_intrinsics = _variant(warp_intrinsics)
    return with_fallback(
        launch, chunk_words, lambda chosen: _compress(flat_bits, chunk_words, chosen, warp_intrinsics, None, exact=False)
    )


def decompress_bits(
    packed: Packed, out_bits: torch.Tensor, launch: Launch | None, *, warp_intrinsics: bool | None = None
) -> None:
    """Write the element bits of ``packed`` into ``out_bits`` (flat, contiguous, on the same device).

    Trusts the buffers (the codec validates them first unless told not to). ``launch.chunk_words`` is
    ignored: the chunking is the one ``packed`` was written with. ``warp_intrinsics`` as for
    :func:`compress_bits`.
    """
    launch = check_launch(launch)
    for name, tensor in (
        ("bitmap", packed.bitmap),
        ("offsets", packed.offsets),
        ("values", packed.values),
        ("output", out_bits),
    ):
        cuda_adapter.check_tensor(tensor, f"Packed {name}" if name != "output" else "output tensor")
    if out_bits.device != packed.device:
        raise ValueError(
            f"the output tensor is on {out_bits.device} but the Packed is on {packed.device}: "
            "move one of them (Packed.to(device)) so both are on the same GPU"
        )
    warp_intrinsics = _variant(warp_intrinsics)
    with_fallback(
        launch, packed.chunk_words, lambda chosen: _decompress(packed, out_bits, chosen, warp_intrinsics)
    )


# --- host side of the kernels ---------------------------------------------------------------------


def _variant(warp_intrinsics: bool | None) -> bool:
    if warp_intrinsics is None:
        return uses_warp_intrinsics()
    if warp_intrinsics and cuda_adapter.simulator_enabled():
        raise ValueError(
            "warp_intrinsics=True cannot run under the CUDA simulator, which has no warp intrinsics: "
            "pass None (or False) there"
        )
    return bool(warp_intrinsics)


def _grid(requested: int, block: int, n_chunks: int) -> int:
    """Blocks to launch: as requested, but never more than there are chunks for their warps."""
    warps_per_block = block // 32
    return max(1, min(requested, -(-n_chunks // warps_per_block)))


def _compress(
    flat_bits: torch.Tensor, chunk_words: int, launch: CudaLaunch, warp_intrinsics: bool, out: Packed | None, exact: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    numel = flat_bits.numel()
    device = flat_bits.device
    n_words = n_words_for(numel)
    n_chunks = n_chunks_for(numel, chunk_words)

    def buffer(name: str, needed: int, dtype: torch.dtype) -> torch.Tensor:
        if out is None:
            return torch.empty(needed, dtype=dtype, device=device)
        return out_buffer(f"out.{name}", getattr(out, name), needed, dtype, device)

    bitmap = buffer("bitmap", n_words, torch.int32)
    offsets = buffer("offsets", n_chunks + 1, torch.int64)
    if numel == 0:
        offsets.zero_()
        return bitmap, offsets, buffer("values", 0, flat_bits.dtype)
    # Without ``exact`` the values go to a workspace of numel elements, so nothing waits for the count.
    k = kernels(warp_intrinsics)
    with cuda_adapter.launcher(device) as run:
        x = cuda_adapter.as_array(flat_bits)
        bitmap_words = cuda_adapter.as_array(bitmap, np.uint32)
        offsets_array = cuda_adapter.as_array(offsets)
        grid = _grid(launch.compress_grid, launch.compress_block, n_chunks)
        run(
            k.compress,
            grid,
            launch.compress_block,
            x,
            numel,
            n_words,
            n_chunks,
            chunk_words,
            bitmap_words,
            offsets_array,
        )
        _scan(run, k, offsets, n_chunks, launch)
        if exact:
            # The one synchronisation of an exact compress: values must be sized before the scatter fills it.
            nnz = int(offsets[-1])
            values = buffer("values", nnz, flat_bits.dtype)
        else:
            nnz, values = numel, buffer("values", numel, flat_bits.dtype)
        if nnz:
            grid = _grid(launch.scatter_grid, launch.scatter_block, n_chunks)
            run(
                k.scatter,
                grid,
                launch.scatter_block,
                x,
                numel,
                n_words,
                n_chunks,
                chunk_words,
                bitmap_words,
                offsets_array,
                cuda_adapter.as_array(values),
            )
    return bitmap, offsets, values


def _scan(run: cuda_adapter.Launcher, k: Kernels, offsets: torch.Tensor, n_chunks: int, launch: CudaLaunch) -> None:
    """Turn the chunk counts in ``offsets[1:]`` into prefix sums, and set ``offsets[0] = 0``."""
    block = launch.scan_block
    grid = max(1, min(launch.scan_grid, -(-n_chunks // block)))
    segment = -(-n_chunks // grid)
    block_sums = torch.empty(grid, dtype=torch.int64, device=offsets.device)
    offsets_array = cuda_adapter.as_array(offsets)
    sums_array = cuda_adapter.as_array(block_sums)
    if grid > 1:
        run(k.scan_reduce, grid, block, offsets_array, n_chunks, segment, sums_array)
    run(k.scan_apply, grid, block, offsets_array, n_chunks, segment, sums_array)


def _decompress(packed: Packed, out_bits: torch.Tensor, launch: CudaLaunch, warp_intrinsics: bool) -> None:
    numel = out_bits.numel()
    if numel == 0:
        return
    if packed.nnz == 0:
        out_bits.zero_()
        return
    chunk_words = packed.chunk_words
    n_words = n_words_for(numel)
    n_chunks = n_chunks_for(numel, chunk_words)
    k = kernels(warp_intrinsics)
    with cuda_adapter.launcher(out_bits.device) as run:
        run(
            k.decompress,
            _grid(launch.decompress_grid, launch.decompress_block, n_chunks),
            launch.decompress_block,
            cuda_adapter.as_array(packed.values.contiguous()),
            numel,
            n_words,
            n_chunks,
            chunk_words,
            cuda_adapter.as_array(packed.bitmap.contiguous(), np.uint32),
            cuda_adapter.as_array(packed.offsets.contiguous()),
            cuda_adapter.as_array(out_bits),
        )

