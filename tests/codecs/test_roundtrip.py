"""Bit-exact round trips on every backend that runs here, and byte-identical buffers across backends."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numba
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cswap.codecs import CpuLaunch, Packed, compress, decompress, zvc_torch
from cswap.codecs.format import bits_dtype
from tests.codecs.zvc_cases import (
    BACKENDS,
    DTYPES,
    SIMULATOR,
    as_bytes,
    device_for,
    launch_for,
    tensor_from_bits,
)

MAX_DIM = 9 if SIMULATOR else 40
#: Hypothesis examples per test: the CUDA simulator runs each kernel thread in Python.
EXAMPLES = 6 if SIMULATOR else 40

shapes = st.one_of(
    st.just(()),
    st.lists(st.integers(0, MAX_DIM), min_size=1, max_size=3).map(tuple),
    st.integers(0, 4 * MAX_DIM * MAX_DIM).map(lambda n: (n,)),
)


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    """Any supported dtype and shape (0-d, empty, odd, multi-dim), any density, optional special values."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(shapes)
    density = draw(st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0)))
    special = draw(st.sampled_from([0.0, 0.3]))
    return tensor_from_bits(shape, dtype, density, draw(st.integers(0, 2**32 - 1)), special)


def _reference(t: torch.Tensor, chunk_words: int) -> tuple[torch.Tensor, ...]:
    """The torch backend's buffers, the specification of the bytes."""
    flat = t.contiguous().reshape(-1).view(bits_dtype(t.dtype))
    return zvc_torch.compress_bits(flat, chunk_words, None)


def _assert_same_buffers(packed: Packed, reference: tuple[torch.Tensor, ...]) -> None:
    for name, got, want in zip(("bitmap", "offsets", "values"), (packed.bitmap, packed.offsets, packed.values), reference):
        assert got.dtype == want.dtype, name
        assert torch.equal(got.cpu(), want.cpu()), f"{name} differs from the torch backend"


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=tensors(), chunk_words=st.sampled_from([1, 2, 3, 32]))
def test_round_trip_is_bit_exact(backend: str, t: torch.Tensor, chunk_words: int) -> None:
    t = t.to(device_for(backend))
    packed = compress(t, backend=backend, launch=launch_for(backend, chunk_words))
    packed.validate()
    restored = decompress(packed, backend=backend, launch=launch_for(backend, chunk_words))
    assert restored.shape == t.shape and restored.dtype == t.dtype and restored.device == t.device
    assert torch.equal(as_bytes(restored), as_bytes(t))
    assert packed.nnz == int((as_bytes(t).reshape(-1, packed.itemsize) != 0).any(dim=1).sum())


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=EXAMPLES // 2 + 1, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=tensors(), chunk_words=st.integers(1, 40))
def test_buffers_equal_the_torch_backend(backend: str, t: torch.Tensor, chunk_words: int) -> None:
    packed = compress(t.to(device_for(backend)), backend=backend, launch=launch_for(backend, chunk_words))
    _assert_same_buffers(packed, _reference(t, chunk_words))
    assert packed.chunk_words == chunk_words


@pytest.mark.parametrize(("writer", "reader"), list(itertools.product(BACKENDS, BACKENDS)))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", [1, 33, 300 if SIMULATOR else 3000])
def test_each_backend_decodes_the_others(writer: str, reader: str, dtype: torch.dtype, numel: int) -> None:
    t = tensor_from_bits((numel,), dtype, density=0.4, seed=numel, special_fraction=0.2)
    packed = compress(t.to(device_for(writer)), backend=writer)
    _assert_same_buffers(packed, _reference(t, packed.chunk_words))
    restored = decompress(packed.to(device_for(reader)), backend=reader)
    assert torch.equal(as_bytes(restored), as_bytes(t))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != torch.bool])
def test_special_values_survive(backend: str, dtype: torch.dtype) -> None:
    t = tensor_from_bits((7, 11), dtype, density=0.6, seed=7, special_fraction=1.0).to(device_for(backend))
    restored = decompress(compress(t, backend=backend), backend=backend)
    assert torch.equal(as_bytes(restored), as_bytes(t))
    if dtype.is_floating_point:
        # Bytes, not values, are compared because NaN != NaN and -0.0 == 0.0 would hide a wrong
        # payload or sign; make sure the input really holds both.
        values = t.cpu().float()
        assert torch.isnan(values).any()
        assert ((values == 0) & torch.signbit(values)).any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "make",
    [
        lambda t: t.t(),
        lambda t: t[::2, 1::3],
        lambda t: t[:, 5],
        lambda t: t[:1].expand(6, -1),
        lambda t: t[2, 3].expand(4, 5),
    ],
    ids=["transpose", "step slice", "column", "expand", "expand 0-d"],
)
def test_views_compress_as_their_contiguous_copy(backend: str, make: Callable[[torch.Tensor], torch.Tensor]) -> None:
    base = tensor_from_bits((12, 17), torch.float32, density=0.5, seed=3).to(device_for(backend))
    view = make(base)
    packed = compress(view, backend=backend)
    _assert_same_buffers(packed, _reference(view.contiguous().cpu(), packed.chunk_words))
    restored = decompress(packed, backend=backend)
    assert restored.shape == view.shape and restored.is_contiguous()
    assert torch.equal(as_bytes(restored), as_bytes(view))


@pytest.mark.parametrize("backend", BACKENDS)
def test_tensor_that_requires_grad(backend: str) -> None:
    t = torch.relu(torch.randn(50, requires_grad=True)).to(device_for(backend))
    restored = decompress(compress(t, backend=backend), backend=backend)
    assert not restored.requires_grad
    assert torch.equal(restored, t.detach())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8])
def test_decompress_into_out(backend: str, dtype: torch.dtype) -> None:
    t = tensor_from_bits((5, 70), dtype, density=0.3, seed=11).to(device_for(backend))
    out = torch.full_like(t, 1)
    result = decompress(compress(t, backend=backend), backend=backend, out=out)
    assert result.data_ptr() == out.data_ptr()
    assert torch.equal(as_bytes(out), as_bytes(t))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_compress_into_workspace_reuses_its_buffers(backend: str, dtype: torch.dtype) -> None:
    device = device_for(backend)
    big, small = ((8, 20), (5, 7)) if SIMULATOR else ((40, 50), (33, 7))
    workspace = Packed.workspace(big, dtype, device=device, chunk_words=4)
    for seed, density in enumerate([1.0, 0.0, 0.5, 0.9]):
        # The same workspace serves every tensor up to its shape's size, smaller ones included.
        shape = big if seed % 2 == 0 else small
        t = tensor_from_bits(shape, dtype, density, seed).to(device)
        packed = compress(t, backend=backend, launch=launch_for(backend, 4), out=workspace)
        for name in ("bitmap", "offsets", "values"):
            if getattr(packed, name).numel():  # an empty view has no data pointer
                assert getattr(packed, name).data_ptr() == getattr(workspace, name).data_ptr(), name
        _assert_same_buffers(packed, _reference(t.cpu(), 4))
        assert torch.equal(as_bytes(decompress(packed, backend=backend)), as_bytes(t))


def test_cpu_threads_give_the_same_bytes_and_are_restored() -> None:
    t = tensor_from_bits((100_000,), torch.float32, density=0.5, seed=5)
    before = numba.get_num_threads()
    one = compress(t, backend="cpu", launch=CpuLaunch(threads=1, chunk_words=8))
    assert numba.get_num_threads() == before
    every = compress(t, backend="cpu", launch=CpuLaunch(threads=None, chunk_words=8))
    _assert_same_buffers(one, (every.bitmap, every.offsets, every.values))
    restored = decompress(one, backend="cpu", launch={"threads": 1, "chunk_words": 8})
    assert numba.get_num_threads() == before
    assert torch.equal(as_bytes(restored), as_bytes(t))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", [1, 32, 1024, 1025, 70_001])
@pytest.mark.parametrize("density", [0.0, 0.5, 1.0])
def test_cpu_large_and_edge_sizes(dtype: torch.dtype, numel: int, density: float) -> None:
    t = tensor_from_bits((numel,), dtype, density, seed=numel)
    packed = compress(t, backend="cpu")
    _assert_same_buffers(packed, _reference(t, packed.chunk_words))
    assert torch.equal(as_bytes(decompress(packed, backend="cpu", validate=False)), as_bytes(t))


@st.composite
def word_patterns(draw: st.DrawFn) -> torch.Tensor:
    """Tensors built word by word from all-zero, all-nonzero and mixed 32-element runs.

    Random densities almost never give whole zero or whole nonzero words, which the CPU kernels
    copy or skip without the per-element loop; this mixes the three kinds at chunk edges too.
    """
    kinds = draw(st.lists(st.sampled_from(["zero", "full", "mixed", "one-first", "one-last"]), min_size=1, max_size=12))
    tail = draw(st.integers(0, 31))
    dtype = draw(st.sampled_from([torch.int8, torch.bfloat16, torch.float32, torch.float64]))
    seed = draw(st.integers(0, 2**16))
    dense = tensor_from_bits((32 * len(kinds) + tail,), dtype, 1.0, seed)
    mask = torch.zeros(dense.numel(), dtype=torch.bool)
    mixed = torch.rand(dense.numel(), generator=torch.Generator().manual_seed(seed)) < 0.5
    for w, kind in enumerate(kinds):
        word = slice(32 * w, 32 * w + 32)
        if kind == "full":
            mask[word] = True
        elif kind == "mixed":
            mask[word] = mixed[word]
        elif kind == "one-first":
            mask[32 * w] = True
        elif kind == "one-last":
            mask[32 * w + 31] = True
    mask[32 * len(kinds) :] = mixed[32 * len(kinds) :]
    return torch.where(mask, dense, torch.zeros((), dtype=dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=word_patterns(), chunk_words=st.sampled_from([1, 2, 3, 5]))
def test_zero_full_and_mixed_words(backend: str, t: torch.Tensor, chunk_words: int) -> None:
    launch = launch_for(backend, chunk_words)
    packed = compress(t.to(device_for(backend)), backend=backend, launch=launch)
    _assert_same_buffers(packed, _reference(t, chunk_words))
    restored = decompress(packed, backend=backend, launch=launch, validate=False)
    assert torch.equal(as_bytes(restored), as_bytes(t))
