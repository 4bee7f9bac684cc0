"""Exact narrowing of int64 tensors before ZVC: the narrowest int that holds every value."""

from __future__ import annotations

import pytest
import torch

from cswap.codecs import NARROW_INTS, compress, decompress, narrowest_int, narrowest_int_for_range, zvc_compressed_nbytes


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([0], torch.int8),
        ([-128, 127], torch.int8),
        ([128], torch.int16),
        ([-129], torch.int16),
        ([-(2**15), 2**15 - 1], torch.int16),
        ([-32769], torch.int32),
        ([2**31 - 1, -(2**31)], torch.int32),
        ([2**31], None),
        ([-(2**31) - 1], None),
        ([], torch.int8),
    ],
)
def test_narrowest_int(values: list[int], expected: torch.dtype | None) -> None:
    t = torch.tensor(values, dtype=torch.int64)
    assert narrowest_int(t) == expected
    if values:
        assert narrowest_int_for_range(min(values), max(values)) == expected


@pytest.mark.parametrize("dtype", NARROW_INTS, ids=str)
def test_narrowed_max_pool_indices_round_trip(dtype: torch.dtype) -> None:
    """Narrow, ZVC, decompress, widen: the same int64 indices, at the narrow width's size."""
    side = {torch.int8: 8, torch.int16: 64, torch.int32: 512}[dtype]
    torch.manual_seed(0)
    _, indices = torch.nn.functional.max_pool2d(torch.randn(2, 3, side, side), 2, return_indices=True)
    narrow = narrowest_int(indices)
    assert narrow == dtype
    packed = compress(indices.flatten().to(narrow), backend="torch")
    widened = decompress(packed, backend="torch").to(torch.int64).view_as(indices)
    assert torch.equal(widened, indices)
    nnz = int(torch.count_nonzero(indices))
    assert packed.compressed_nbytes == zvc_compressed_nbytes(indices.numel(), nnz, dtype.itemsize)
