"""The runtime on a real GPU: side stream, events, pinned arena and prefetch still give plain gradients,
also when the compute stream is slowed so that a missing wait would read unfinished data."""

from __future__ import annotations

import pytest
import torch

import cswap
from cswap import models
from cswap.options import POLICIES
from tests.runtime.helpers import assert_bit_equal, batches

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MODELS = ("vgg11", "resnet18", "mobilenet_v2", "googlenet")


def _train(name: str, policy: str | None, data, epochs: int = 2, sleep_cycles: int = 0, **options):
    torch.manual_seed(0)
    model = models.build(name, num_classes=10, width_mult=0.25).cuda().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    rt = cswap.Runtime(policy, device="cuda", min_bytes=0, model=model, **options) if policy else None
    grads = []
    for epoch in range(epochs):
        if rt is not None:
            rt.new_epoch()
        for i, (x, y) in enumerate(data):
            with torch.random.fork_rng(devices=[torch.cuda.current_device()]):
                torch.manual_seed(1000 * epoch + i)
                ctx = rt.iteration() if rt is not None else torch.enable_grad()
                with ctx:
                    loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
                    if sleep_cycles:
                        # Keep the compute stream busy: copies on the side stream that skipped their
                        # wait on it would read activations not written yet.
                        torch.cuda._sleep(sleep_cycles)
                    loss.backward()
            grads.append([p.grad.detach().clone() for p in model.parameters()])
            optimizer.step()
            optimizer.zero_grad()
    torch.cuda.synchronize()
    return grads, rt


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", MODELS)
def test_gradients_bit_identical_with_streams(name: str, policy: str) -> None:
    data = batches(2, (8, 3, 64, 64), classes=10)
    expected, _ = _train(name, None, data)
    got, rt = _train(name, policy, data, prefetch_bytes=8 << 20)
    for e, a in zip(expected, got):
        assert_bit_equal([t.cpu() for t in e], [t.cpu() for t in a], what=f"{name}/{policy} gradient")
    stats = rt.stats()
    if policy in ("swap", "compress-swap", "cswap"):
        assert stats.offloaded_bytes > 0 and stats.prefetch_hits > 0
        assert stats.arena_bytes > 0


@pytest.mark.parametrize("policy", ("swap", "compress-swap", "compress-keep"))
def test_slowed_compute_stream_still_matches(policy: str) -> None:
    data = batches(2, (8, 3, 64, 64), classes=10)
    expected, _ = _train("vgg11", None, data)
    got, _ = _train("vgg11", policy, data, sleep_cycles=50_000_000, prefetch_bytes=64 << 20)
    for e, a in zip(expected, got):
        assert_bit_equal([t.cpu() for t in e], [t.cpu() for t in a], what=f"vgg11/{policy} gradient")


def test_swap_lowers_peak_device_memory() -> None:
    data = batches(1, (32, 3, 64, 64), classes=10)
    peaks = {}
    for policy in ("none", "swap"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        _train("vgg11", policy, data, epochs=2, prefetch_bytes=0)
        peaks[policy] = torch.cuda.max_memory_allocated()
    assert peaks["swap"] < peaks["none"]


def test_arena_stops_growing_after_the_profile() -> None:
    torch.manual_seed(0)
    model = models.build("resnet18", num_classes=10, width_mult=0.25).cuda()
    rt = cswap.Runtime("swap", device="cuda", min_bytes=0, model=model)
    x = torch.randn(8, 3, 64, 64, device="cuda")
    snapshots = []
    for _ in range(3):
        with rt.iteration():
            model(x).sum().backward()
        torch.cuda.synchronize()
        snapshots.append(rt.stats())
    assert snapshots[1].arena_bytes == snapshots[2].arena_bytes > 0
    assert snapshots[1].arena_misses == snapshots[2].arena_misses
    assert snapshots[2].resident_bytes == 0 and snapshots[2].arena_used_bytes == 0


def test_profiling_that_runs_out_of_device_memory_swaps_on_demand() -> None:
    """Capuchin's passive mode on a real ``torch.OutOfMemoryError``: a keep-all profiling iteration
    that needs 16 tensors of 64 MiB on a device limited to 8 of them swaps and finishes."""
    tensor_bytes = 64 << 20
    x0 = torch.randn(tensor_bytes // 4, device="cuda")

    def loss_of(x: torch.Tensor) -> torch.Tensor:
        for _ in range(16):
            x = (x * 0.5).exp()  # exp saves its output: 16 x 64 MiB kept
        return x.sum()

    x = x0.clone().requires_grad_()
    loss_of(x).backward()
    expected = x.grad.clone()
    del x
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    allowed = torch.cuda.memory_reserved() + 8 * tensor_bytes
    rt = cswap.Runtime("none", device="cuda", min_bytes=0)
    assert rt.swaps_on_out_of_memory
    torch.cuda.set_per_process_memory_fraction(allowed / total)
    try:
        x = x0.clone().requires_grad_()
        with rt.iteration():
            loss_of(x).backward()
        torch.cuda.synchronize()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    stats = rt.stats()
    assert stats.evicted_tensors > 0 and rt.trace().meta["out_of_memory_retries"] > 0
    assert torch.equal(x.grad, expected)
