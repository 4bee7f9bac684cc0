"""Packed.validate: per-chunk popcounts exact for any chunk size, memory proportional to the tensor."""

from __future__ import annotations

import pytest
import torch

from cswap.codecs import compress
from cswap.codecs.format import MAX_CHUNK_WORDS, Packed
from cswap.codecs.popcount import chunk_popcounts, chunk_popcounts_torch
from tests.codecs.zvc_cases import tensor_from_bits


def _reference_counts(bitmap: torch.Tensor, chunk_words: int) -> list[int]:
    per_word = [bin(int(w) & 0xFFFFFFFF).count("1") for w in bitmap.tolist()]
    return [sum(per_word[i : i + chunk_words]) for i in range(0, len(per_word), chunk_words)]


@pytest.mark.parametrize("count", [chunk_popcounts, chunk_popcounts_torch], ids=["numba", "torch"])
@pytest.mark.parametrize("n_words", [0, 1, 31, 32, 33, 100])
@pytest.mark.parametrize("chunk_words", [1, 3, 32, MAX_CHUNK_WORDS])
def test_chunk_popcounts_match_a_bit_by_bit_count(count: object, n_words: int, chunk_words: int) -> None:
    generator = torch.Generator().manual_seed(n_words * 7 + chunk_words)
    bitmap = torch.randint(-(2**31), 2**31, (n_words,), generator=generator, dtype=torch.int64).to(torch.int32)
    bitmap[:1] = -1  # all 32 bits, the sign bit included
    assert count(bitmap, chunk_words).tolist() == _reference_counts(bitmap, chunk_words)  # type: ignore[operator]


@pytest.mark.parametrize("count", [chunk_popcounts, chunk_popcounts_torch], ids=["numba", "torch"])
def test_chunk_popcounts_leave_the_bitmap_untouched(count: object) -> None:
    bitmap = torch.tensor([-1, 5, 0], dtype=torch.int32)
    count(bitmap, 2)  # type: ignore[operator]
    assert bitmap.tolist() == [-1, 5, 0]


def _largest_allocation_bytes(fn: object) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()  # type: ignore[operator]
    return max((e.cpu_memory_usage for e in prof.events()), default=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
@pytest.mark.parametrize("count", [chunk_popcounts, chunk_popcounts_torch], ids=["numba", "torch"])
def test_validation_memory_is_a_fraction_of_the_tensor(dtype: torch.dtype, count: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most one int64 per 32-element word (1/16 of a float32 tensor); never 8 bytes per element."""
    import cswap.codecs.popcount

    monkeypatch.setattr(cswap.codecs.popcount, "chunk_popcounts", count)
    packed = compress(tensor_from_bits((1 << 18,), dtype, density=0.5, seed=3), backend="torch")
    largest = _largest_allocation_bytes(packed.validate)
    assert largest <= packed.numel // 4


def test_a_huge_chunk_words_is_refused_by_name_before_any_allocation() -> None:
    packed = compress(torch.ones(64), backend="torch")
    huge = Packed(packed.bitmap, torch.tensor([0, 64]), packed.values, packed.shape, packed.dtype, chunk_words=2**33)
    with pytest.raises(ValueError, match=r"corrupt ZVC buffer: chunk_words is 8589934592, must be an int between 1 and MAX_CHUNK_WORDS = 65536"):
        huge.validate()
