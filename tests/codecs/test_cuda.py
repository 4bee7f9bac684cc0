"""The ``cuda`` ZVC backend: byte-identical to the torch reference, under Numba's CUDA simulator and on a GPU.

Numba reads ``NUMBA_ENABLE_CUDASIM`` once, at its first import, and other tests in a normal run use
Numba's CPU JIT, so the kernel tests cannot run in that process without a GPU. They run:

* in a child pytest over this file with ``NUMBA_ENABLE_CUDASIM=1`` (``test_simulator_suite``), on
  small CPU tensors, with the kernels' simulator twins;
* directly, on CUDA tensors, when a GPU is present (plus the ``gpu``-marked tests below, which
  cover the warp-intrinsic kernels, streams and large sizes).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from cswap.codecs import (
    SUPPORTED_DTYPES,
    NarrowingMissed,
    CpuLaunch,
    CudaLaunch,
    Packed,
    bits_dtype,
    compress,
    decompress,
    encode,
    encode_unsized,
)
from cswap.codecs import cuda_launch, zvc_cuda, zvc_torch
from tests.codecs.simulator_child import run_under_simulator

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
GPU = not SIMULATOR and torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"

kernels_run_here = pytest.mark.skipif(
    not (SIMULATOR or GPU), reason="needs a GPU; without one it runs in the simulator child of test_simulator_suite"
)
simulator_only = pytest.mark.skipif(not SIMULATOR, reason="runs in the simulator child of test_simulator_suite")


def gpu_only(test: Callable[..., None]) -> Callable[..., None]:
    """Mark ``test`` as needing a real GPU (deselected in the simulator child, skipped without a GPU)."""
    return pytest.mark.gpu(pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")(test))


#: Small blocks keep the simulator (one Python thread per CUDA thread) fast.
SMALL = CudaLaunch(
    compress_grid=4,
    compress_block=64,
    scan_grid=1,
    scan_block=64,
    scatter_grid=4,
    scatter_block=64,
    decompress_grid=4,
    decompress_block=64,
)


@pytest.fixture(autouse=True, scope="module")
def _fast_simulator_barriers() -> Iterator[None]:
    """The simulator's barriers are polled by a thread under the GIL; a short switch interval speeds them up."""
    if not SIMULATOR:
        yield
        return
    before = sys.getswitchinterval()
    sys.setswitchinterval(5e-5)
    yield
    sys.setswitchinterval(before)


def sparse_tensor(numel: int, dtype: torch.dtype, density: float = 0.5, seed: int = 0) -> torch.Tensor:
    """Random bit patterns (NaN payloads, -0.0, denormals) with about ``1 - density`` of the elements all-zero."""
    g = torch.Generator().manual_seed(seed)
    bits = bits_dtype(dtype)
    itemsize = torch.empty((), dtype=bits).element_size()
    raw = torch.randint(0, 256, (numel * itemsize,), dtype=torch.uint8, generator=g).view(bits)
    raw[torch.rand(numel, generator=g) >= density] = 0
    if dtype == torch.bool:
        raw = (raw != 0).to(torch.uint8)
    return raw.view(dtype).to(DEVICE)


def launch(**overrides: int) -> CudaLaunch:
    """:data:`SMALL` with some fields changed."""
    return CudaLaunch.from_params({**SMALL.to_params(), **overrides})


def assert_same_packed(got: Packed, want: Packed) -> None:
    assert (got.shape, got.dtype, got.chunk_words) == (want.shape, want.dtype, want.chunk_words)
    for name in ("bitmap", "offsets", "values"):
        g, w = getattr(got, name).cpu(), getattr(want, name).cpu()
        assert g.dtype == w.dtype, name
        assert torch.equal(g, w), f"{name} differs: {g.tolist()[:16]} vs {w.tolist()[:16]}"


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got.cpu().contiguous().view(torch.uint8), want.cpu().contiguous().view(torch.uint8))


def round_trip_matches_reference(t: torch.Tensor, cuda_launch: CudaLaunch) -> Packed:
    packed = compress(t, backend="cuda", launch=cuda_launch)
    assert packed.device == t.device
    assert_same_packed(packed, compress(t, backend="torch", launch=cuda_launch))
    assert_bits_equal(decompress(packed, backend="cuda", launch=cuda_launch), t)
    return packed


# --- the kernels against the reference (simulator child, or a GPU) -----------------------------------


@kernels_run_here
@pytest.mark.parametrize("numel", [1, 33, 777])
@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
def test_matches_torch_reference_for_every_dtype(dtype: torch.dtype, numel: int) -> None:
    round_trip_matches_reference(sparse_tensor(numel, dtype, seed=numel), SMALL)


@kernels_run_here
def test_special_float_bit_patterns_survive() -> None:
    t = torch.tensor([0.0, -0.0, float("nan"), 1e-45, -float("inf"), 0.0, 2.5], device=DEVICE)
    packed = round_trip_matches_reference(t, SMALL)
    assert packed.nnz == 5  # -0.0 and the denormal are nonzero bit patterns


@kernels_run_here
def test_empty_tensor() -> None:
    t = torch.empty(0, 3, device=DEVICE)
    packed = round_trip_matches_reference(t, SMALL)
    assert packed.offsets.tolist() == [0] and packed.nnz == 0 and packed.bitmap.numel() == 0


@kernels_run_here
@pytest.mark.parametrize("density", [0.0, 1.0, 0.03])
def test_all_zero_all_nonzero_and_very_sparse(density: float) -> None:
    t = sparse_tensor(777, torch.float32, density=density, seed=3)
    packed = round_trip_matches_reference(t, SMALL)
    if density in (0.0, 1.0):
        assert packed.nnz == round(777 * density)


@contextlib.contextmanager
def host_reads_refused() -> Iterator[None]:
    """Any read of a tensor's value by the host (``item``, ``tolist``, ``int``, ``bool``) raises inside the block."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the host read a device value")

    names = ("item", "tolist", "__int__", "__bool__", "__index__", "__float__")
    saved = {name: getattr(torch.Tensor, name) for name in names}
    try:
        for name in names:
            setattr(torch.Tensor, name, refuse)
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


@kernels_run_here
@pytest.mark.parametrize("numel", [0, 1, 777])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_unsized_encoding_reads_nothing_back_until_resolved_and_matches_the_exact_one(dtype: torch.dtype, numel: int) -> None:
    t = sparse_tensor(numel, dtype, seed=numel + 5)
    counts = torch.zeros(2, dtype=torch.int64, pin_memory=GPU)
    with host_reads_refused():
        pending = encode_unsized(t, backend="cuda", launch=SMALL, counts=counts)
    assert pending.values.numel() == numel  # a workspace, not the exact size
    exact = encode(t, backend="cuda", launch=SMALL)
    for cut in (False, True):
        got = pending.resolve(exact=cut)
        for name in ("bitmap", "offsets", "values"):
            assert torch.equal(getattr(got, name), getattr(exact, name)), name
        assert got.compressed_nbytes == exact.compressed_nbytes


@kernels_run_here
@pytest.mark.parametrize(("narrow_to", "high", "held"), [(torch.int8, 100, True), (torch.int16, 30_000, True), (torch.int8, 300, False)])
def test_unsized_narrowing_is_checked_on_the_device(narrow_to: torch.dtype, high: int, held: bool) -> None:
    g = torch.Generator().manual_seed(high)
    t = (torch.randint(0, high + 1, (900,), generator=g) * (torch.rand(900, generator=g) < 0.5)).to(DEVICE)
    t[7] = high
    with host_reads_refused():
        pending = encode_unsized(t, backend="cuda", launch=SMALL, narrow_to=narrow_to)
    if not held:
        with pytest.raises(NarrowingMissed, match="the int64 tensor does not fit int8: encode it exactly"):
            pending.resolve()
        return
    got, exact = pending.resolve(exact=True), encode(t, backend="cuda", launch=SMALL)
    assert got.dtype == exact.dtype == narrow_to
    assert torch.equal(got.values, exact.values) and torch.equal(got.bitmap, exact.bitmap)


@kernels_run_here
@pytest.mark.parametrize("action", ["zvc-swap", "zvc-keep"])
def test_the_executor_trains_on_unsized_cuda_encodings(action: str) -> None:
    from cswap.execute.executor import Executor
    from cswap.planner.plan import Action, Plan

    x = sparse_tensor(700, torch.float32, seed=11)
    expected = x.clone().requires_grad_()
    torch.relu(expected * 2.0).square().sum().backward()
    executor = Executor(torch.device(DEVICE), backend="cuda", prefetch_bytes=0, defer_sizes=True)
    plan = Plan(policy="test", epoch=0, default_action=Action(action), launches=None)
    it = executor.begin(plan)
    leaf = x.clone().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(*executor.hooks(it)):
        loss = torch.relu(leaf * 2.0).square().sum()
    loss.backward()
    executor.end(it)
    assert torch.equal(leaf.grad.view(torch.int32), expected.grad.view(torch.int32))  # bits: NaN patterns too
    counters = executor.snapshot()
    assert 0 < counters.compressed_bytes < counters.compressed_input_bytes and counters.resident_bytes == 0


@kernels_run_here
@pytest.mark.parametrize("chunk_words", [1, 2, 3, 5, 32, 33])
@pytest.mark.parametrize("dtype", [torch.int8, torch.float64], ids=str)
def test_chunk_words(chunk_words: int, dtype: torch.dtype) -> None:
    # At least two chunks, the last one partial, and a partial last word.
    t = sparse_tensor(700 + 37 * chunk_words, dtype, seed=chunk_words)
    packed = round_trip_matches_reference(t, launch(chunk_words=chunk_words))
    assert packed.chunk_words == chunk_words


# Each case names why it is there; numel and chunk_words give more chunks than the launch has warps.
LAUNCH_CASES = {
    "grid1-block32-everywhere": (
        1500,
        launch(
            compress_grid=1,
            compress_block=32,
            scan_grid=1,
            scan_block=32,
            scatter_grid=1,
            scatter_block=32,
            decompress_grid=1,
            decompress_block=32,
            chunk_words=1,
        ),
    ),
    "odd-grids-and-blocks": (
        3001,
        launch(
            compress_grid=3,
            compress_block=96,
            scatter_grid=2,
            scatter_block=160,
            decompress_grid=5,
            decompress_block=32,
            chunk_words=3,
        ),
    ),
    # 188 chunks: 3 scan blocks of 63, so both the carry between blocks and between tiles count.
    "multi-block-scan": (6000, launch(scan_grid=3, scan_block=32, chunk_words=1)),
    "scan-grid-above-work": (700, launch(scan_grid=1000, scan_block=32, chunk_words=1)),
    "huge-grids": (900, launch(compress_grid=2**31 - 1, scatter_grid=100000, decompress_grid=77, chunk_words=2)),
    "defaults": (1100, CudaLaunch()),
}


@kernels_run_here
@pytest.mark.parametrize("case", list(LAUNCH_CASES))
def test_launch_configs(case: str) -> None:
    numel, cuda_launch = LAUNCH_CASES[case]
    round_trip_matches_reference(sparse_tensor(numel, torch.float16, density=0.4, seed=numel), cuda_launch)


@kernels_run_here
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.int32, torch.float64], ids=str)
def test_decodes_torch_output_and_torch_decodes_its_output(dtype: torch.dtype) -> None:
    t = sparse_tensor(1234, dtype, seed=7).view(2, 617)
    from_torch = compress(t, backend="torch", launch=SMALL)
    assert_bits_equal(decompress(from_torch, backend="cuda", launch=SMALL), t)
    from_cuda = compress(t, backend="cuda", launch=SMALL)
    assert_bits_equal(decompress(from_cuda, backend="torch"), t)


@kernels_run_here
def test_views_and_out_parameter() -> None:
    base = sparse_tensor(64 * 20, torch.float32, seed=11).view(64, 20)
    t = base.t()[3:, ::2]  # non-contiguous: compressed as its contiguous copy
    packed = round_trip_matches_reference(t, SMALL)
    out = torch.full(t.shape, 7.0, device=DEVICE)
    result = decompress(packed, backend="cuda", out=out, launch=SMALL)
    assert result is out
    assert_bits_equal(out, t.contiguous())


@kernels_run_here
def test_decompress_uses_the_packed_chunking_not_the_launch() -> None:
    t = sparse_tensor(900, torch.float32, seed=5)
    packed = compress(t, backend="cuda", launch=launch(chunk_words=3))
    assert_bits_equal(decompress(packed, backend="cuda", launch=launch(chunk_words=7)), t)


@kernels_run_here
def test_compress_into_caller_buffers() -> None:
    workspace = Packed.workspace((40, 25), torch.bfloat16, device=DEVICE, chunk_words=SMALL.chunk_words)
    for seed in (1, 2):  # the second compress overwrites the first's buffers
        t = sparse_tensor(1000, torch.bfloat16, seed=seed).view(40, 25)
        packed = compress(t, backend="cuda", launch=SMALL, out=workspace)
        assert packed.values.data_ptr() == workspace.values.data_ptr()
        assert packed.bitmap.data_ptr() == workspace.bitmap.data_ptr()
        assert_same_packed(packed, compress(t, backend="torch", launch=SMALL))
        assert_bits_equal(decompress(packed, backend="cuda", launch=SMALL), t)


@kernels_run_here
def test_too_small_out_buffer_raises() -> None:
    t = sparse_tensor(1000, torch.float32, density=0.9)
    small = Packed.workspace((100,), torch.float32, device=DEVICE, chunk_words=SMALL.chunk_words)
    workspace = Packed.workspace((1000,), torch.float32, device=DEVICE, chunk_words=SMALL.chunk_words)
    too_few_values = Packed(workspace.bitmap, workspace.offsets, small.values, (1000,), torch.float32)
    with pytest.raises(ValueError, match=r"out.values holds 100 elements but this tensor needs \d+"):
        compress(t, backend="cuda", launch=SMALL, out=too_few_values)
    with pytest.raises(ValueError, match="out.bitmap holds 4 elements but this tensor needs 32"):
        compress(t, backend="cuda", launch=SMALL, out=small)


def _drop_last_value(p: Packed) -> Packed:
    return Packed(p.bitmap, p.offsets, p.values[:-1], p.shape, p.dtype, p.chunk_words)


def _flip_bitmap_bit(p: Packed) -> Packed:
    bitmap = p.bitmap.clone()
    bitmap[0] ^= 1 << 3
    return Packed(bitmap, p.offsets, p.values, p.shape, p.dtype, p.chunk_words)


def _shift_offsets(p: Packed) -> Packed:
    offsets = p.offsets.clone()
    offsets[1] += 1
    return Packed(p.bitmap, offsets, p.values, p.shape, p.dtype, p.chunk_words)


@kernels_run_here
@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (_drop_last_value, "offsets end at"),
        (_flip_bitmap_bit, "set bits in the bitmap"),
        (_shift_offsets, "corrupt ZVC buffer"),
    ],
    ids=["truncated-values", "flipped-bitmap-bit", "shifted-offsets"],
)
def test_corrupt_packed_raises(corrupt: Callable[[Packed], Packed], message: str) -> None:
    packed = compress(sparse_tensor(3000, torch.float32, seed=2), backend="cuda", launch=launch(chunk_words=4))
    with pytest.raises(ValueError, match=message):
        decompress(corrupt(packed), backend="cuda", launch=SMALL)


@simulator_only
def test_simulated_threads_of_a_block_share_its_shared_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: this compress once read nnz = 700473598347376 in the simulator child.

    Numba's simulator created a ``cuda.shared.array`` with an unlocked check-then-insert, so a thread
    switch there gave two threads of one block different arrays, and the scan read uninitialised
    slots. A thread switch is forced at that point (every ``np.empty``) so the race, if back, shows
    up in every run rather than once in hundreds.
    """
    t = sparse_tensor(3000, torch.float32, seed=2)
    cuda_launch = launch(chunk_words=4)
    want = compress(t, backend="torch", launch=cuda_launch)
    real_empty = np.empty

    def empty_after_a_thread_switch(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(1e-4)
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(np, "empty", empty_after_a_thread_switch)
    for _ in range(4):
        assert_same_packed(compress(t, backend="cuda", launch=cuda_launch), want)


# --- a launch the device refuses falls back to the defaults ------------------------------------------


@pytest.fixture
def refuse_block_64(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """Make every launch with 64 threads per block fail as the driver does; record the launches."""
    from numba.cuda.cudadrv.driver import CudaAPIError

    from cswap.codecs import cuda_adapter

    launched: list[tuple[str, int]] = []
    real_call = cuda_adapter.Launcher.__call__

    def call(self, kernel, grid, block, *args):  # type: ignore[no-untyped-def]
        launched.append((getattr(kernel, "__name__", "?"), block))
        if block == 64:
            raise CudaAPIError(701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested for launch")
        return real_call(self, kernel, grid, block, *args)

    monkeypatch.setattr(cuda_adapter.Launcher, "__call__", call)
    cuda_launch._refused_launches.cache_clear()
    yield launched
    cuda_launch._refused_launches.cache_clear()


@kernels_run_here
def test_refused_launch_falls_back_to_defaults_with_one_warning(refuse_block_64: list[tuple[str, int]]) -> None:
    refused = launch(compress_block=64, scatter_block=64, decompress_block=64, chunk_words=8)
    t = sparse_tensor(700, torch.float32, seed=9)
    want = compress(t, backend="torch", launch=refused)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        packed = compress(t, backend="cuda", launch=refused)
        restored = decompress(packed, backend="cuda", launch=refused)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert "refused CUDA launch config" in messages[0] and "'compress_block': 64" in messages[0]
    assert "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES" in messages[0]
    assert_same_packed(packed, want)  # the fallback keeps the requested chunking (8 words)
    assert_bits_equal(restored, t)
    # Only the first call tried the refused config; the decompress went straight to the defaults.
    assert sum(1 for _, block in refuse_block_64 if block == 64) == 1


@kernels_run_here
def test_refused_default_launch_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    from numba.cuda.cudadrv.driver import CudaAPIError

    from cswap.codecs import cuda_adapter

    def refuse(self, kernel, grid, block, *args):  # type: ignore[no-untyped-def]
        raise CudaAPIError(1, "CUDA_ERROR_INVALID_VALUE")

    monkeypatch.setattr(cuda_adapter.Launcher, "__call__", refuse)
    with pytest.raises(CudaAPIError, match="CUDA_ERROR_INVALID_VALUE"):
        compress(sparse_tensor(100, torch.float32), backend="cuda")


# --- simulator specifics ------------------------------------------------------------------------------


@simulator_only
def test_simulator_uses_the_twin_kernels_and_refuses_intrinsics() -> None:
    assert zvc_cuda.available()
    assert not zvc_cuda.uses_warp_intrinsics()
    with pytest.raises(ValueError, match="no warp intrinsics"):
        zvc_cuda.compress_bits(torch.zeros(4, dtype=torch.int32), 32, None, warp_intrinsics=True)


# --- no kernels needed: run in every process -----------------------------------------------------------


def test_check_launch() -> None:
    assert zvc_cuda.check_launch(None) == CudaLaunch()
    custom = CudaLaunch(scan_grid=3)
    assert zvc_cuda.check_launch(custom) is custom
    with pytest.raises(ValueError, match="backend 'cuda' takes a CudaLaunch.*got CpuLaunch"):
        zvc_cuda.check_launch(CpuLaunch())
    with pytest.raises(ValueError, match="compress_block is 48, must be a multiple of 32"):
        compress(torch.zeros(4), backend="cuda", launch={"compress_block": 48})


def test_kernel_source_hash_is_the_sha256_of_the_module_source() -> None:
    digest = zvc_cuda.kernel_source_hash()
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    source = Path(inspect.getsourcefile(zvc_cuda)).read_text(encoding="utf-8")  # type: ignore[arg-type]
    assert digest == hashlib.sha256(source.encode("utf-8")).hexdigest()


def test_kernel_names_match_the_launch_fields() -> None:
    assert zvc_cuda.CUDA_KERNELS == ("compress", "scan", "scatter", "decompress")
    fields = CudaLaunch().to_params()
    for name in zvc_cuda.CUDA_KERNELS:
        assert f"{name}_grid" in fields and f"{name}_block" in fields


def test_available_matches_the_machine() -> None:
    assert zvc_cuda.available() is (SIMULATOR or GPU)


@pytest.mark.skipif(SIMULATOR, reason="the simulator accepts CPU tensors")
def test_cpu_tensor_is_rejected_with_a_fix() -> None:
    with pytest.raises(ValueError, match=r"needs CUDA tensors.*\.cuda\(\), or use backend='cpu'"):
        compress(torch.ones(10), backend="cuda")


@pytest.mark.skipif(SIMULATOR, reason="this test starts the simulator child")
def test_simulator_suite() -> None:
    """Run this file under NUMBA_ENABLE_CUDASIM=1 in a child pytest: every kernel test must pass there.
    Only the tests that need the parent process (or a GPU) may skip in the child."""
    run_under_simulator(__file__, 60, 2, "-m", "not gpu")


# --- real GPU: warp intrinsics, streams, large tensors --------------------------------------------------


@gpu_only
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.float32, torch.int64], ids=str)
@pytest.mark.parametrize("numel", [(1 << 20) + 7, 5_000_003])
@pytest.mark.parametrize("warp_intrinsics", [True, False], ids=["intrinsics", "twin"])
def test_gpu_intrinsic_and_twin_kernels_match_reference(
    dtype: torch.dtype, numel: int, warp_intrinsics: bool
) -> None:
    flat = sparse_tensor(numel, dtype, density=0.3, seed=numel).view(bits_dtype(dtype))
    cuda_launch = CudaLaunch(compress_block=512, scan_grid=16, scan_block=256, decompress_block=1024)
    got = zvc_cuda.compress_bits(flat, 32, cuda_launch, warp_intrinsics=warp_intrinsics)
    want = zvc_torch.compress_bits(flat, 32, None)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    packed = Packed(*got, shape=(numel,), dtype=dtype, chunk_words=32)
    out = torch.empty_like(flat)
    zvc_cuda.decompress_bits(packed, out, cuda_launch, warp_intrinsics=warp_intrinsics)
    assert torch.equal(out, flat)


@gpu_only
@pytest.mark.parametrize("narrow_to", [None, torch.int16])
def test_gpu_unsized_encoding_never_synchronises(narrow_to: torch.dtype | None) -> None:
    t = torch.relu(torch.randn(1 << 20, device="cuda")) if narrow_to is None else torch.randint(0, 1000, (1 << 20,), device="cuda")
    counts = torch.zeros(2, dtype=torch.int64, pin_memory=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        pending = encode_unsized(t, backend="cuda", counts=counts, narrow_to=narrow_to)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    got, exact = pending.resolve(exact=True), encode(t, backend="cuda")
    assert got.dtype == exact.dtype and torch.equal(got.values, exact.values) and torch.equal(got.bitmap, exact.bitmap)


@gpu_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_gpu_runs_on_the_current_side_stream(dtype: torch.dtype) -> None:
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        # Produced, compressed and decompressed on the side stream with no host sync between them
        # (besides compress's read of the nonzero count): a kernel on the wrong stream would race.
        t = torch.relu(torch.randn(1 << 22, device="cuda", dtype=dtype))
        packed = compress(t, backend="cuda")
        restored = decompress(packed, backend="cuda", validate=False)
    side.synchronize()
    assert_bits_equal(restored, t)
    assert_same_packed(packed, compress(t, backend="torch"))


@gpu_only
def test_gpu_many_chunks_multi_block_scan_and_grad_tensor() -> None:
    t = torch.relu(torch.randn(1 << 22, device="cuda")).requires_grad_()
    cuda_launch = CudaLaunch(scan_grid=64, scan_block=1024, compress_grid=80, chunk_words=1)
    packed = compress(t, backend="cuda", launch=cuda_launch)
    assert_same_packed(packed, compress(t, backend="torch", launch=cuda_launch))
    assert_bits_equal(decompress(packed, backend="cuda", launch=cuda_launch), t.detach())


@gpu_only
def test_gpu_rejects_cpu_tensors_and_mixed_devices() -> None:
    with pytest.raises(ValueError, match="backend='cpu'"):
        compress(torch.ones(100), backend="cuda")
    packed = compress(torch.ones(100, device="cuda"), backend="cuda")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        zvc_cuda.decompress_bits(packed, torch.empty(100), None)
