"""Bit-packing and exponent coding: bit-exact round trips, identical buffers on every backend, refusals.

The ``cuda`` backend runs here only under Numba's CUDA simulator, in a child pytest over this file
(``test_simulator_child``), on small tensors; on a GPU it runs in the parent.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cswap.codecs import CODECS, CpuLaunch, CudaLaunch, compress, decompress
from cswap.codecs.bitpack import BitPacked
from cswap.codecs.exponent_format import ExponentPacked
from cswap.codecs.exponent_layout import FLOAT_LAYOUTS
from tests.codecs.simulator_child import run_under_simulator
from tests.codecs.zvc_cases import SPECIAL_BITS, as_bytes, tensor_from_bits

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
GPU = not SIMULATOR and torch.cuda.is_available()
BACKENDS = ("torch", "cpu", "cuda") if (SIMULATOR or GPU) else ("torch", "cpu")
FLOATS = (torch.bfloat16, torch.float16, torch.float32)
MAX_NUMEL = 300 if SIMULATOR else 5000
EXAMPLES = 5 if SIMULATOR else 40
# On a GPU every test here also runs the cuda backend on the device: the GPU suite's `-m gpu` selects them.
pytestmark = [pytest.mark.gpu] if GPU else []


def _device(backend: str) -> str:
    return "cuda" if backend == "cuda" and GPU else "cpu"


def _launch(backend: str, chunk_words: int) -> CpuLaunch | CudaLaunch | None:
    if backend == "cuda":
        # Small blocks and grids: the simulator runs each CUDA thread as a Python thread.
        small = {"compress_grid": 2, "compress_block": 64, "scatter_grid": 3, "scatter_block": 32}
        return CudaLaunch(**small, decompress_grid=2, decompress_block=64, chunk_words=chunk_words)
    return CpuLaunch(chunk_words=chunk_words)


def _activation_like(numel: int, dtype: torch.dtype, seed: int, special_fraction: float) -> torch.Tensor:
    """Gaussian values (a compressible exponent) with exact special bit patterns sprinkled in."""
    generator = torch.Generator().manual_seed(seed)
    t = torch.randn(numel, generator=generator).to(dtype)
    bits = t.view(FLOAT_LAYOUTS[dtype].bits_dtype)
    rng = np.random.default_rng(seed)
    specials = np.array(SPECIAL_BITS[dtype.itemsize], dtype=np.uint64).astype(np.int64)
    where = np.flatnonzero(rng.random(numel) < special_fraction)
    width = 8 * dtype.itemsize
    chosen = rng.choice(specials, size=where.size) if where.size else np.empty(0, np.int64)
    signed = np.where(chosen >= 1 << (width - 1), chosen - (1 << width), chosen)
    bits[torch.from_numpy(where)] = torch.from_numpy(signed).to(bits.dtype)
    return t


@st.composite
def float_tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(FLOATS))
    numel = draw(st.integers(0, MAX_NUMEL))
    seed = draw(st.integers(0, 2**31))
    if draw(st.booleans()):
        t = _activation_like(numel, dtype, seed, draw(st.sampled_from([0.0, 0.05, 0.5])))
    else:
        t = tensor_from_bits((numel,), dtype, draw(st.sampled_from([0.0, 0.5, 1.0])), seed, 0.2)
    if draw(st.booleans()) and numel >= 6:  # a strided view, read as its contiguous copy
        t = t[: numel - numel % 6].view(-1, 2, 3).transpose(1, 2)
    return t


@st.composite
def masks(draw: st.DrawFn) -> torch.Tensor:
    numel = draw(st.integers(0, MAX_NUMEL))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    mask = torch.rand(numel, generator=generator) < draw(st.sampled_from([0.0, 0.1, 0.9, 1.0]))
    return mask.to(draw(st.sampled_from([torch.bool, torch.uint8])))


def _check_round_trip(codec: str, t: torch.Tensor, chunk_words: int) -> None:
    reference = compress(t, codec=codec, backend="torch", launch=CpuLaunch(chunk_words=chunk_words))
    reference.validate()
    for backend in BACKENDS:
        packed = compress(t.to(_device(backend)), codec=codec, backend=backend, launch=_launch(backend, chunk_words))
        for name, got, want in zip(packed.buffer_names, packed.buffers(), reference.buffers()):
            assert got.dtype == want.dtype and torch.equal(got.cpu(), want.cpu()), f"{backend}: {name} differs from torch"
        restored = decompress(packed, backend=backend, launch=_launch(backend, chunk_words))
        assert restored.shape == t.shape and restored.dtype == t.dtype
        assert torch.equal(as_bytes(restored), as_bytes(t)), f"{backend} did not round-trip"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=float_tensors(), chunk_words=st.sampled_from([1, 2, 32]))
def test_exponent_round_trip_is_bit_exact_and_backends_agree(t: torch.Tensor, chunk_words: int) -> None:
    _check_round_trip("exponent", t, chunk_words)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=masks())
def test_bitpack_round_trip_is_bit_exact_and_backends_agree(t: torch.Tensor) -> None:
    _check_round_trip("bitpack", t, 32)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_every_special_value_survives(dtype: torch.dtype) -> None:
    width = 8 * dtype.itemsize
    patterns = np.array(SPECIAL_BITS[dtype.itemsize] + (0,), dtype=np.int64)
    signed = np.where(patterns >= 1 << (width - 1), patterns - (1 << width), patterns)
    t = torch.from_numpy(np.tile(signed, 40)).to(FLOAT_LAYOUTS[dtype].bits_dtype).view(dtype)
    _check_round_trip("exponent", t, 1)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_chunks_with_and_without_escapes_decode_side_by_side(dtype: torch.dtype) -> None:
    """A chunk of one exponent has no escapes (the decoder's coalesced path) and the next, of every
    exponent, has many (its path by ranks): both round-trip, every backend writing the same bytes."""
    chunk = 32  # elements in a chunk of one word
    steady = torch.full((chunk,), 1.5)
    spread = torch.tensor([2.0 ** (e * e % 7 - 3) * (-1) ** e for e in range(chunk)])  # 4 exponents, unevenly
    t = torch.cat([steady, spread, steady]).to(dtype)
    packed = compress(t, codec="exponent", backend="torch", launch=CpuLaunch(chunk_words=1))
    words, offsets = packed.words.view(torch.int32), packed.offsets
    escapes = [int(words[int(offsets[c]) + 1]) for c in range(offsets.numel() - 1)]
    assert escapes[0] == escapes[2] == 0 and 0 < escapes[1] < chunk, escapes
    _check_round_trip("exponent", t, 1)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_a_table_longer_than_a_chunks_exponents_is_filled_with_the_absent_ones_in_value_order(dtype: torch.dtype) -> None:
    """Two exponents, half the chunk each: a 2-bit code (three table entries, no escapes) is
    cheapest, so the table holds both, the more frequent first, then the smallest exponent the
    chunk lacks (0); every backend writes those bytes."""
    t = torch.tensor([1.5] * 20 + [-3.0] * 12).to(dtype)  # exponents of 1 and 2: 20 and 12 of them
    packed = compress(t, codec="exponent", backend="torch", launch=CpuLaunch(chunk_words=1))
    words = packed.words.view(torch.int32)
    assert int(words[0]) & 0xFF == 2 and int(words[1]) == 0  # k = 2, no escapes
    bias = (1 << (FLOAT_LAYOUTS[dtype].exponent_bits - 1)) - 1
    assert [(int(words[2]) >> (8 * j)) & 0xFF for j in range(3)] == [bias, bias + 1, 0]
    _check_round_trip("exponent", t, 1)


@pytest.mark.skipif(not (SIMULATOR or GPU), reason="the cuda backend runs in the simulator child or on a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_escapes_are_ranked_across_tiles_of_segments(dtype: torch.dtype) -> None:
    """A chunk of more 32-element segments than a block has threads is ranked a tile at a time:
    with 32 threads and 2048-element chunks, the escapes of the second tile follow the first's,
    and a last chunk ends in a partial segment. The kernels write and read the reference's bytes."""
    t = _activation_like(2048 + 700, dtype, seed=7, special_fraction=0.02)
    reference = compress(t, codec="exponent", backend="torch", launch=CpuLaunch(chunk_words=64))
    words, offsets = reference.words, reference.offsets
    escapes = [int(words[int(offsets[c]) + 1]) for c in range(offsets.numel() - 1)]
    assert len(escapes) == 2 and min(escapes) >= 10, escapes  # the specials escape, spread over both tiles
    launch = CudaLaunch(compress_grid=2, compress_block=32, scatter_grid=2, scatter_block=32,
                        decompress_grid=2, decompress_block=32, chunk_words=64)
    packed = compress(t.to(_device("cuda")), codec="exponent", backend="cuda", launch=launch)
    for name, got, want in zip(packed.buffer_names, packed.buffers(), reference.buffers()):
        assert torch.equal(got.cpu(), want), f"{name} differs from torch"
    restored = decompress(packed, backend="cuda", launch=launch)
    assert torch.equal(as_bytes(restored.cpu()), as_bytes(t))


@pytest.mark.parametrize(("dtype", "least"), [(torch.bfloat16, 1.35), (torch.float16, 1.1), (torch.float32, 1.15)], ids=str)
def test_gaussian_floats_shrink(dtype: torch.dtype, least: float) -> None:
    t = torch.randn(64 * 1024, generator=torch.Generator().manual_seed(0)).to(dtype)
    assert compress(t, codec="exponent", backend="cpu").ratio >= least


def test_float32_upcasts_of_bf16_drop_their_zero_low_half() -> None:
    upcast = torch.randn(64 * 1024, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16).float()
    packed = compress(upcast, codec="exponent", backend="cpu")
    assert packed.ratio > 2.7  # sign + 7 mantissa bits + a ~3-bit code of 32 bits
    assert torch.equal(decompress(packed).view(torch.int32), upcast.view(torch.int32))


def test_bitpack_is_one_bit_per_element() -> None:
    mask = torch.rand(1 << 16, generator=torch.Generator().manual_seed(0)) > 0.1
    packed = compress(mask, codec="bitpack", backend="cpu")
    assert packed.compressed_nbytes == (1 << 16) // 8 and packed.ratio == 8.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_bitpack_sets_the_bit_of_any_nonzero_byte_of_a_bool(backend: str) -> None:
    """A bool whose byte is not 0 or 1 (a uint8 tensor viewed as bool) is true, as ``!= 0`` reads it,
    on the whole-word paths too; it comes back as a plain True."""
    raw = torch.arange(256, dtype=torch.uint8).roll(7)
    packed = compress(raw.view(torch.bool).to(_device(backend)), codec="bitpack", backend=backend, launch=_launch(backend, 32))
    assert torch.equal(packed.buffers()[0].cpu(), compress(raw.view(torch.bool), codec="bitpack", backend="torch").buffers()[0])
    restored = decompress(packed, backend=backend, launch=_launch(backend, 32))
    assert torch.equal(restored.cpu(), raw != 0)


@pytest.mark.parametrize("offset_bytes", [0, 3, 8])
@pytest.mark.parametrize("backend", BACKENDS)
def test_bitpack_unpacks_into_an_out_at_any_byte_offset(backend: str, offset_bytes: int) -> None:
    """Whole words unpack eight bytes at a time where the output is 8-byte aligned, one at a time
    where it is not; either way the mask comes back, the partial last word too."""
    mask = torch.rand(5 * 32 + 7, generator=torch.Generator().manual_seed(offset_bytes)) > 0.5
    device = _device(backend)
    packed = compress(mask.to(device), codec="bitpack", backend=backend, launch=_launch(backend, 32))
    storage = torch.zeros(mask.numel() + offset_bytes, dtype=torch.bool, device=device)
    restored = decompress(packed, backend=backend, out=storage[offset_bytes:], launch=_launch(backend, 32))
    assert torch.equal(restored.cpu(), mask) and not storage[:offset_bytes].any()


@pytest.mark.parametrize(
    ("codec", "dtype", "names"),
    [("exponent", torch.int32, "bfloat16, float16, float32"), ("exponent", torch.float64, "bfloat16"), ("bitpack", torch.float32, "bool, uint8")],
)
def test_a_dtype_the_codec_cannot_take_is_refused_by_name(codec: str, dtype: torch.dtype, names: str) -> None:
    with pytest.raises(ValueError, match=rf"codec '{codec}' cannot compress {dtype}: it takes {names}"):
        compress(torch.zeros(8, dtype=dtype), codec=codec)


def test_bitpack_refuses_uint8_beyond_one() -> None:
    with pytest.raises(ValueError, match="0 and 1 only, this one holds 7: compress it with codec='zvc'"):
        compress(torch.tensor([0, 1, 7], dtype=torch.uint8), codec="bitpack")


@pytest.mark.parametrize("codec", ["bitpack", "exponent"])
def test_out_buffers_are_refused_with_the_fix(codec: str) -> None:
    from cswap.codecs import Packed

    with pytest.raises(ValueError, match=rf"codec '{codec}' writes its own buffers: call compress\(\) without out="):
        compress(torch.zeros(8), codec=codec, out=Packed.workspace((8,), torch.float32))


def _coded() -> ExponentPacked:
    return compress(torch.randn(3000, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16), codec="exponent", backend="torch")


def _flip(words: torch.Tensor, index: int, value: int) -> torch.Tensor:
    changed = words.clone()
    changed[index] = value
    return changed


@pytest.mark.parametrize(
    ("corrupt", "problem"),
    [
        (lambda p: replace(p, words=p.words[:-1]), "offsets must rise"),
        (lambda p: replace(p, offsets=p.offsets[:-1]), "offsets has"),
        (lambda p: replace(p, words=_flip(p.words, 0, 9)), "header k=9"),
        (lambda p: replace(p, words=_flip(p.words, 1, int(p.words[1]) + 4)), "spans"),
        (lambda p: replace(p, words=p.words.to(torch.int64)), "expected 1-d torch.int32"),
        (lambda p: replace(p, chunk_words=0), "chunk_words is 0"),
    ],
    ids=["truncated", "offsets", "code-width", "escape-count", "dtype", "chunking"],
)
@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_corrupt_exponent_buffers_are_refused(corrupt, problem: str, backend: str) -> None:
    with pytest.raises(ValueError, match=rf"corrupt exponent buffer: .*{re.escape(problem)}.*compress the tensor again"):
        decompress(corrupt(_coded()), backend=backend)


def test_escape_codes_that_disagree_with_the_header_are_refused_even_unvalidated() -> None:
    packed = _coded()
    header_k = int(packed.words[0]) & 0xFF
    assert header_k > 0
    code_start = 2 + (8 * ((1 << header_k) - 1) + 31) // 32
    # All-ones codes: every element of the first word escapes, more than the header counts.
    broken = replace(packed, words=_flip(packed.words, code_start, -1))
    with pytest.raises(ValueError, match="escape codes but its header says"):
        broken.validate()
    with pytest.raises(ValueError, match="corrupt exponent buffer: 1 chunk"):
        decompress(broken, backend="cpu", validate=False)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_the_cpu_check_of_chunks_finds_every_fault_the_reference_names(dtype: torch.dtype) -> None:
    """:meth:`ExponentPacked.validate` checks a buffer on the CPU with Numba and asks the reference
    for the message only when it finds a fault: on single-word corruptions of every section
    (headers, tables, codes, escapes) the two agree on which buffers are valid."""
    from cswap.codecs.exponent_cpu import chunks_valid
    from cswap.codecs.exponent_torch import chunk_problems

    t = torch.cat([_activation_like(3000, dtype, 3, 0.05), torch.full((100,), 1.5).to(dtype)])
    packed = compress(t, codec="exponent", backend="torch", launch=CpuLaunch(chunk_words=2))
    generator = torch.Generator().manual_seed(0)
    verdicts = set()
    for _ in range(300):
        index = int(torch.randint(packed.words.numel(), (1,), generator=generator))
        value = int(torch.randint(-(2**31), 2**31, (1,), generator=generator)) if _ % 2 else int(packed.words[index]) ^ 1
        words = _flip(packed.words, index, value)
        valid = chunks_valid(words, packed.offsets, packed.numel, packed.chunk_elements, dtype)
        assert valid == (not chunk_problems(words, packed.offsets, packed.numel, packed.chunk_elements, dtype)), index
        verdicts.add(valid)
        if not valid:
            with pytest.raises(ValueError, match="corrupt exponent buffer"):
                replace(packed, words=words).validate()
    assert verdicts == {True, False}  # flips the checks cannot see (a mantissa bit) and flips they can


def test_corrupt_bitpack_is_refused() -> None:
    packed = compress(torch.ones(40, dtype=torch.bool), codec="bitpack")
    with pytest.raises(ValueError, match="corrupt bitpack buffer: the last word has bits set past element 39"):
        decompress(replace(packed, words=_flip(packed.words, 1, -1)))
    with pytest.raises(ValueError, match="words has 1 elements, shape"):
        decompress(replace(packed, words=packed.words[:1]))
    assert isinstance(packed, BitPacked)


def test_registry_lists_the_codecs() -> None:
    assert CODECS.names() == ("zvc", "bitpack", "exponent")


@pytest.mark.skipif(SIMULATOR or GPU, reason="this test starts the simulator child")
def test_simulator_child() -> None:
    """Run this file under NUMBA_ENABLE_CUDASIM=1: the cuda backend must write the torch backend's bytes."""
    run_under_simulator(__file__, least_passed=20)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU: large tensors, the kernels' grid-stride loops and default launches")
@pytest.mark.parametrize("chunk_words", [32, 256])
@pytest.mark.parametrize("numel", [(1 << 20) + 7, 5_000_003])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_gpu_large_tensors_write_the_reference_bytes(dtype: torch.dtype, numel: int, chunk_words: int) -> None:
    """Exponent coding of millions of elements on the device, with the default launch and 1024-thread
    blocks: the torch reference's bytes (computed on the host), and a bit-exact round trip."""
    t = _activation_like(numel, dtype, seed=numel, special_fraction=0.001).cuda()
    reference = compress(t.cpu(), codec="exponent", backend="torch", launch=CpuLaunch(chunk_words=chunk_words))
    for launch in (CudaLaunch(chunk_words=chunk_words),
                   CudaLaunch(compress_block=1024, scatter_block=1024, decompress_block=1024, chunk_words=chunk_words)):
        packed = compress(t, codec="exponent", backend="cuda", launch=launch)
        for name, got, want in zip(packed.buffer_names, packed.buffers(), reference.buffers()):
            assert torch.equal(got.cpu(), want), f"{name} differs from torch ({launch})"
        assert torch.equal(as_bytes(decompress(packed, backend="cuda", launch=launch).cpu()), as_bytes(t.cpu()))


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("numel", [(1 << 20) + 7, 5_000_003])
def test_gpu_large_masks_write_the_reference_bytes(numel: int) -> None:
    mask = torch.rand(numel, generator=torch.Generator().manual_seed(numel)) >= 0.1
    reference = compress(mask, codec="bitpack", backend="torch")
    packed = compress(mask.cuda(), codec="bitpack", backend="cuda")
    assert torch.equal(packed.buffers()[0].cpu(), reference.buffers()[0])
    assert torch.equal(decompress(packed, backend="cuda").cpu(), mask)
