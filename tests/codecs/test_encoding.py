"""The one encoding step: exact int64 narrowing then ZVC, its inverse, and its size prediction from
what the profiler records."""

from __future__ import annotations

import pytest
import torch

from cswap.codecs import Encoding, compress, decode, encode, value_range

CASES = [
    (torch.tensor([0, 3, 0, 127, -128] * 300), torch.int8),
    (torch.tensor([0, 1000, 0, -5] * 300), torch.int16),
    (torch.tensor([0, 2**20, 7, 0] * 300), torch.int32),
    (torch.tensor([0, 2**40, 7, 0] * 300), torch.int64),
    (torch.relu(torch.randn(1200, generator=torch.Generator().manual_seed(0))), torch.float32),
    (torch.tensor([0, 1, 0, 1] * 300, dtype=torch.int32), torch.int32),
]


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize(("t", "encoded_dtype"), CASES, ids=lambda c: str(c) if isinstance(c, torch.dtype) else "")
def test_encode_decode_is_exact_and_predicted(t: torch.Tensor, encoded_dtype: torch.dtype, backend: str) -> None:
    packed = encode(t, backend=backend)
    assert packed.dtype == encoded_dtype
    out = decode(packed, torch.empty_like(t), backend=backend, validate=True)
    assert out.dtype == t.dtype and torch.equal(out.view(-1).view(torch.uint8), t.view(-1).view(torch.uint8))
    # The prediction from what the profiler records equals the size on the wire.
    recorded = value_range(t)
    encoding = Encoding.of(t.dtype, None if recorded is None else tuple(recorded.tolist()))
    assert encoding.encoded_dtype == encoded_dtype and encoding.narrowed is (encoded_dtype != t.dtype)
    sparsity = float((t == 0).sum()) / t.numel()
    assert encoding.compressed_nbytes(t.numel(), sparsity, packed.chunk_words) == packed.compressed_nbytes


def test_narrowed_bytes_are_the_narrow_tensors_zvc() -> None:
    t = torch.tensor([0, 1000, 0, -5] * 300)
    packed, direct = encode(t, backend="cpu"), compress(t.to(torch.int16), backend="cpu")
    for name in ("bitmap", "offsets", "values"):
        assert torch.equal(getattr(packed, name), getattr(direct, name))


def test_named_encoding_reads_a_traces_names_and_rejects_unknown_dtypes() -> None:
    assert Encoding.named("int64", "int16") == Encoding(torch.int64, torch.int16)
    assert Encoding.named("float32", None).encoded_name is None
    assert Encoding.of(torch.float32, (0, 1)).encoded_dtype == torch.float32  # only int64 narrows
    with pytest.raises(TypeError, match=r"cannot encode dtype 'complex64'.*supported dtypes are"):
        Encoding.of("complex64")
