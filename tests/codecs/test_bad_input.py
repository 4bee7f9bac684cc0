"""Every kind of bad input raises a clear error naming the problem, on every backend, and never crashes."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from cswap.codecs import CpuLaunch, CudaLaunch, Packed, compress, decompress
from tests.codecs.zvc_cases import BACKENDS, as_bytes, device_for, tensor_from_bits

# 3000 elements: 94 bitmap words, 3 chunks of 32 words, a last word with 24 elements.
NUMEL = 3000


@pytest.fixture(scope="module")
def original() -> torch.Tensor:
    return tensor_from_bits((NUMEL,), torch.float32, density=0.5, seed=1)


@pytest.fixture(scope="module")
def packed(original: torch.Tensor) -> Packed:
    return compress(original, backend="torch")


def _set_bit_past_end(p: Packed) -> Packed:
    bitmap = p.bitmap.clone()
    bitmap[-1] |= 1 << 30
    return replace(p, bitmap=bitmap)


def _bump(p: Packed, index: int, delta: int) -> Packed:
    offsets = p.offsets.clone()
    offsets[index] += delta
    return replace(p, offsets=offsets)


#: Corruptions that leave buffers inconsistent: every backend must refuse them.
CORRUPTIONS: dict[str, Callable[[Packed], Packed]] = {
    "values shorter than the popcount": lambda p: replace(p, values=p.values[:-1]),
    "values longer than the popcount": lambda p: replace(p, values=torch.cat([p.values, p.values[:1]])),
    "values empty": lambda p: replace(p, values=p.values[:0]),
    "offsets one entry short": lambda p: replace(p, offsets=p.offsets[:-1]),
    "offsets one entry long": lambda p: replace(p, offsets=torch.cat([p.offsets, p.offsets[-1:]])),
    "offsets shifted between chunks": lambda p: _bump(p, 1, 1),
    "offsets not starting at 0": lambda p: replace(p, offsets=p.offsets + 1, values=torch.cat([p.values, p.values[:1]])),
    "offsets ending past values": lambda p: _bump(p, -1, 5),
    "offsets decreasing": lambda p: _bump(p, 2, -(int(p.offsets[2]) + 1)),
    "bitmap one word short": lambda p: replace(p, bitmap=p.bitmap[:-1]),
    "bitmap one word long": lambda p: replace(p, bitmap=torch.cat([p.bitmap, p.bitmap[:1]])),
    "bitmap bit flipped": lambda p: replace(p, bitmap=p.bitmap ^ torch.tensor([1] + [0] * (p.bitmap.numel() - 1), dtype=torch.int32)),
    "bitmap bit set past the end": _set_bit_past_end,
    "bitmap of the wrong dtype": lambda p: replace(p, bitmap=p.bitmap.to(torch.int64)),
    "values of the wrong dtype": lambda p: replace(p, values=p.values.to(torch.int64)),
    "offsets of the wrong dtype": lambda p: replace(p, offsets=p.offsets.to(torch.int32)),
    "2-d values": lambda p: replace(p, values=p.values.reshape(1, -1)),
    "chunk_words 0": lambda p: replace(p, chunk_words=0),
    "chunk_words changed": lambda p: replace(p, chunk_words=p.chunk_words * 2),
    # Past MAX_CHUNK_WORDS: refused by name before any buffer is sized from it (64 GiB once).
    "chunk_words 2**33": lambda p: replace(p, chunk_words=2**33),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_packed_is_refused(backend: str, corruption: str, packed: Packed) -> None:
    bad = CORRUPTIONS[corruption](packed).to(device_for(backend))
    with pytest.raises(ValueError, match="corrupt ZVC buffer"):
        decompress(bad, backend=backend)


@pytest.mark.parametrize("corruption", [c for c in CORRUPTIONS if c != "bitmap bit set past the end"])
def test_cpu_backend_refuses_corruption_even_without_validation(corruption: str, packed: Packed) -> None:
    """The Numba kernel checks each chunk's popcount against its offsets before it reads values."""
    bad = CORRUPTIONS[corruption](packed)
    with pytest.raises(ValueError, match="corrupt ZVC buffer"):
        decompress(bad, backend="cpu", validate=False)


def test_cpu_backend_ignores_bits_past_the_end_without_validation(packed: Packed, original: torch.Tensor) -> None:
    restored = decompress(_set_bit_past_end(packed), backend="cpu", validate=False)
    assert torch.equal(as_bytes(restored), as_bytes(original))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "dtype",
    [torch.complex64, torch.complex128, torch.uint16, torch.uint32, torch.float8_e4m3fn],
    ids=str,
)
def test_unsupported_dtype_names_it_and_the_choices(backend: str, dtype: torch.dtype) -> None:
    t = torch.zeros(4, dtype=dtype)
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(TypeError, match=rf"dtype torch\.{name}: supported dtypes are bool, uint8, .*bfloat16.*float64"):
        compress(t, backend=backend)


def test_unknown_codec_names_it_and_the_choices(packed: Packed) -> None:
    with pytest.raises(ValueError, match=r"unknown codec 'lz4': choose one of zvc"):
        compress(torch.zeros(3), codec="lz4")
    with pytest.raises(ValueError, match=r"unknown codec 'lz4': choose one of zvc"):
        decompress(replace(packed, codec="lz4"))


@pytest.mark.parametrize("call", ["compress", "decompress"])
def test_unknown_backend_names_it_and_the_choices(call: str, packed: Packed) -> None:
    with pytest.raises(ValueError, match=r"unknown backend 'metal' for codec 'zvc': choose one of torch, cpu, cuda"):
        if call == "compress":
            compress(torch.zeros(3), backend="metal")
        else:
            decompress(packed, backend="metal")


def test_cpu_backend_refuses_tensors_off_the_cpu() -> None:
    with pytest.raises(ValueError, match=r"backend 'cpu' works on CPU tensors.*meta.*\.cpu\(\)"):
        compress(torch.empty(8, device="meta"), backend="cpu")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: CudaLaunch(compress_block=1000), r"compress_block is 1000, must be a multiple of 32 between 32 and 1024"),
        (lambda: CudaLaunch(scatter_block=2048), r"scatter_block is 2048"),
        (lambda: CudaLaunch(decompress_block=16), r"decompress_block is 16"),
        (lambda: CudaLaunch(scan_grid=0), r"scan_grid is 0, must be between 1"),
        (lambda: CudaLaunch(compress_grid=-3), r"compress_grid is -3"),
        (lambda: CudaLaunch(chunk_words=0), r"chunk_words is 0, must be an int between 1 and MAX_CHUNK_WORDS = 65536"),
        (lambda: CudaLaunch.from_params({"compress_blocks": 256}), r"unknown keys \['compress_blocks'\]"),
        (lambda: CpuLaunch(threads=0), r"threads is 0, must be between 1 and"),
        (lambda: CpuLaunch(threads=(os.cpu_count() or 1) + 1), r"threads is \d+, must be between 1 and"),
        (lambda: CpuLaunch(chunk_words=-1), r"chunk_words is -1"),
        (lambda: CpuLaunch(chunk_words=2**33), r"chunk_words is 8589934592, must be an int between 1 and MAX_CHUNK_WORDS = 65536"),
        (lambda: CudaLaunch(chunk_words=2**16 + 1), r"chunk_words is 65537, must be an int between 1 and MAX_CHUNK_WORDS"),
        (lambda: CudaLaunch.from_params({"chunk_words": 2**33}), r"invalid CUDA launch config: chunk_words is 8589934592"),
        (lambda: CpuLaunch.from_params({"threads": 1, "blocks": 2}), r"unknown keys \['blocks'\]; valid keys are"),
    ],
)
def test_invalid_launch_config(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("call", ["compress", "decompress"])
@pytest.mark.parametrize(
    ("launch", "message"),
    [
        (CudaLaunch(), r"backend 'cpu' takes a CpuLaunch.*got CudaLaunch"),
        ("threads=2", r"backend 'cpu' takes a CpuLaunch.*got str"),
        ({"threads": 0}, r"threads is 0"),
        ({"thread": 1}, r"unknown keys \['thread'\]"),
    ],
)
def test_cpu_backend_refuses_other_launches(call: str, launch: object, message: str, packed: Packed) -> None:
    with pytest.raises(ValueError, match=message):
        if call == "compress":
            compress(torch.ones(4), backend="cpu", launch=launch)
        else:
            decompress(packed, backend="cpu", launch=launch)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "make_out",
    [
        lambda t: torch.empty(t.numel() + 1, dtype=t.dtype),
        lambda t: torch.empty(t.shape[::-1], dtype=t.dtype),
        lambda t: torch.empty(t.shape, dtype=torch.int32),
        lambda t: torch.empty(t.shape[::-1], dtype=t.dtype).t(),
    ],
    ids=["wrong size", "wrong shape", "wrong dtype", "not contiguous"],
)
def test_decompress_out_must_match(backend: str, make_out: Callable[[torch.Tensor], torch.Tensor]) -> None:
    t = tensor_from_bits((30, 40), torch.float32, density=0.5, seed=2).to(device_for(backend))
    out = make_out(t).to(t.device)
    with pytest.raises(ValueError, match=r"out must be a contiguous torch.float32 tensor of shape \(30, 40\)"):
        decompress(compress(t, backend=backend), backend=backend, out=out)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("chunk_words", "make_workspace", "message"),
    [
        (32, lambda d: Packed.workspace((10, 10), torch.float32, device=d), r"out.bitmap holds 4 elements but this tensor needs 7"),
        (1, lambda d: Packed.workspace((200,), torch.float32, device=d), r"out.offsets holds 2 elements but this tensor needs 8"),
        (
            32,
            lambda d: replace(Packed.workspace((200,), torch.float32, device=d), values=torch.empty(100, dtype=torch.int32, device=d)),
            r"out.values holds 100 elements but this tensor needs 200",
        ),
        (32, lambda d: Packed.workspace((200,), torch.float64, device=d), r"out.values must be a contiguous 1-d torch.int32 tensor, got torch.int64"),
        (32, lambda d: Packed.workspace((200,), torch.float32, device="meta"), r"out.bitmap is on meta but the tensor is on"),
    ],
    ids=["bitmap too small", "offsets too small", "values too small", "wrong dtype", "wrong device"],
)
def test_compress_out_must_have_room(backend: str, chunk_words: int, make_workspace: Callable[[torch.device], Packed], message: str) -> None:
    device = device_for(backend)
    launch = CudaLaunch(chunk_words=chunk_words) if backend == "cuda" else CpuLaunch(chunk_words=chunk_words)
    with pytest.raises(ValueError, match=message):
        compress(torch.ones(200, device=device), backend=backend, launch=launch, out=make_workspace(device))


def test_decompress_refuses_another_codecs_packed(packed: Packed) -> None:
    from cswap.codecs.zvc import ZVC

    with pytest.raises(ValueError, match=r"written by codec 'lz4', not 'zvc'"):
        ZVC.decompress(replace(packed, codec="lz4"), "cpu", None, None, True)
