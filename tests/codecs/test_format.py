"""The ZVC v1 layout as the format defines it, and the properties of :class:`Packed`."""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from cswap.codecs import Packed, compress, decompress, zvc_compressed_nbytes
from cswap.codecs.format import bits_dtype
from tests.codecs.zvc_cases import BACKENDS, DTYPES, as_bytes, device_for, itemsize, launch_for, tensor_from_bits


def _as_int32(word: int) -> int:
    """A uint32 bit pattern as the int32 the bitmap stores."""
    return word - (1 << 32) if word >= 1 << 31 else word


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_layout_follows_the_format(backend: str, dtype: torch.dtype) -> None:
    """Element i is bit i % 32 of word i // 32, LSB first; offsets count per chunk; values in order."""
    nonzero = [0, 1, 31, 32, 63, 70, 100]
    t = torch.zeros(101, dtype=dtype)
    t[nonzero] = torch.arange(1, len(nonzero) + 1).to(dtype)
    packed = compress(t.to(device_for(backend)), backend=backend, launch=launch_for(backend, 1))
    words = [0, 0, 0, 0]
    for i in nonzero:
        words[i // 32] |= 1 << (i % 32)
    assert packed.bitmap.cpu().tolist() == [_as_int32(w) for w in words]
    # chunk_words=1: one chunk per word, offsets are the running popcount of the words.
    assert packed.offsets.cpu().tolist() == [0, 3, 5, 6, 7]
    assert torch.equal(packed.values.cpu(), t[nonzero].view(bits_dtype(dtype)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("numel", "chunk_words"), [(0, 32), (1, 1), (33, 1), (1000, 3), (4096, 32), (5000, 7)])
def test_compressed_nbytes_matches_the_formula(backend: str, dtype: torch.dtype, numel: int, chunk_words: int) -> None:
    t = tensor_from_bits((numel,), dtype, density=0.3, seed=numel).to(device_for(backend))
    packed = compress(t, backend=backend, launch=launch_for(backend, chunk_words))
    assert packed.compressed_nbytes == zvc_compressed_nbytes(numel, packed.nnz, itemsize(dtype), chunk_words)
    assert packed.original_nbytes == numel * itemsize(dtype)
    assert packed.numel == numel and packed.itemsize == itemsize(dtype)
    assert packed.ratio == pytest.approx(packed.original_nbytes / packed.compressed_nbytes)
    assert packed.density == (packed.nnz / numel if numel else 0.0)


@pytest.mark.parametrize(
    ("numel", "nnz", "size", "chunk_words", "expected"),
    [
        (0, 0, 4, 32, 8),  # only offsets[0]
        (1, 1, 4, 32, 4 + 16 + 4),
        (32, 0, 2, 1, 4 + 16),
        (33, 33, 8, 1, 8 + 24 + 264),
        (1024, 512, 4, 32, 128 + 16 + 2048),
        (1025, 0, 1, 32, 132 + 24),
    ],
)
def test_zvc_compressed_nbytes_by_hand(numel: int, nnz: int, size: int, chunk_words: int, expected: int) -> None:
    assert zvc_compressed_nbytes(numel, nnz, size, chunk_words) == expected


@pytest.mark.parametrize("density", [0.0, 0.1, 0.5, 1.0])
def test_ratio_tracks_sparsity(density: float) -> None:
    t = tensor_from_bits((64, 1024), torch.float32, density, seed=9)
    packed = compress(t)
    words, chunks = math.ceil(t.numel() / 32), math.ceil(t.numel() / 32 / 32)
    assert packed.compressed_nbytes == 4 * words + 8 * (chunks + 1) + 4 * packed.nnz
    assert packed.ratio == pytest.approx(t.numel() * 4 / packed.compressed_nbytes)
    if density == 0.0:
        assert packed.ratio > 25  # bitmap and offsets only: 1/32 + 8/4096 of the input
    if density == 1.0:
        assert packed.ratio < 1  # dense data grows by the bitmap and offsets


@pytest.mark.parametrize("backend", BACKENDS)
def test_to_moves_buffers_and_keeps_metadata(backend: str) -> None:
    t = tensor_from_bits((3, 50), torch.float16, density=0.5, seed=4)
    packed = compress(t.to(device_for(backend)), backend=backend, launch=launch_for(backend, 2))
    moved = packed.to("cpu")
    assert moved.device == torch.device("cpu")
    assert (moved.shape, moved.dtype, moved.chunk_words, moved.codec) == ((3, 50), torch.float16, 2, "zvc")
    for name in ("bitmap", "offsets", "values"):
        assert torch.equal(getattr(moved, name), getattr(packed, name).cpu())
    assert torch.equal(as_bytes(decompress(moved, backend="cpu")), as_bytes(t))
    meta = packed.to("meta")
    assert meta.device == torch.device("meta") and meta.values.shape == packed.values.shape


def test_validate_accepts_fresh_output_and_counts_on_request() -> None:
    packed = compress(tensor_from_bits((2000,), torch.int32, density=0.5, seed=8))
    packed.validate()
    flipped = replace(packed, bitmap=packed.bitmap ^ torch.nn.functional.one_hot(torch.tensor(5), packed.bitmap.numel()).to(torch.int32))
    flipped.validate(check_counts=False)  # lengths and offsets alone are still consistent
    with pytest.raises(ValueError, match=r"chunk 0 has \d+ set bits in the bitmap but \d+ values in offsets"):
        flipped.validate()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk_words", [1, 32])
def test_workspace_has_room_for_any_tensor_of_its_shape(dtype: torch.dtype, chunk_words: int) -> None:
    workspace = Packed.workspace((7, 100), dtype, chunk_words=chunk_words)
    assert workspace.bitmap.numel() == math.ceil(700 / 32) and workspace.bitmap.dtype == torch.int32
    assert workspace.offsets.numel() == math.ceil(math.ceil(700 / 32) / chunk_words) + 1
    assert workspace.values.numel() == 700 and workspace.values.dtype == bits_dtype(dtype)
    assert (workspace.shape, workspace.dtype, workspace.chunk_words) == ((7, 100), dtype, chunk_words)


def test_cpu_kernel_source_hash_follows_the_source() -> None:
    from cswap.codecs import intrinsics, zvc_cpu

    source = Path(zvc_cpu.__file__).read_text() + Path(intrinsics.__file__).read_text()
    assert zvc_cpu.kernel_source_hash() == hashlib.sha256(source.encode()).hexdigest()
