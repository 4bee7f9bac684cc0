"""Capuchin's passive mode on a real out-of-memory error (:mod:`cswap.execute.passive`).

A device with too little memory is modelled by an op that raises :class:`torch.OutOfMemoryError`
whenever the runtime holds more than a limit on the device: it sits after every block of a CNN
with dropout and batch norm, in forward and in backward. A profiling iteration that keeps every
tensor then runs out of memory; in passive mode it swaps the kept tensors and goes on, and every
gradient stays bit-identical to plain PyTorch.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

import cswap
from cswap.execute.executor import Executor
from cswap.execute.passive import SwapOnOutOfMemory
from cswap.planner.plan import Action, Plan
from tests.runtime.helpers import assert_bit_equal, batches

BATCHES = batches(3, (4, 3, 8, 8), 10)


class DeviceLimit:
    """The memory of a small device: ``limit_bytes`` of saved activations held by ``runtime``."""

    def __init__(self) -> None:
        self.runtime: cswap.Runtime | None = None
        self.limit_bytes: int | None = None
        self.failures = 0

    def check(self, x: torch.Tensor) -> None:
        if self.runtime is None or self.limit_bytes is None:
            return
        if self.runtime.stats().resident_bytes + x.nbytes > self.limit_bytes:
            self.failures += 1
            raise torch.OutOfMemoryError(f"out of memory: tried to allocate {x.nbytes} bytes over a limit of {self.limit_bytes}")


LIMIT = DeviceLimit()


@torch.library.custom_op("cswap_test_passive::allocate", mutates_args=())
def allocate(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` that needs room on the device (:data:`LIMIT`)."""
    LIMIT.check(x)
    return x.clone()


@allocate.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


allocate.register_autograd(lambda ctx, grad: allocate(grad))


class Allocate(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return allocate(x)


class GuardedCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.3), Allocate()),
            nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), Allocate(), nn.MaxPool2d(2)),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(8 * 4 * 4, 10), Allocate())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@pytest.fixture
def passive_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Passive mode on this CPU "device" (the runtime turns it on for GPUs only)."""
    monkeypatch.setattr(cswap.Runtime, "swaps_on_out_of_memory", property(lambda self: True))


@pytest.fixture(autouse=True)
def no_limit() -> Any:
    yield
    LIMIT.runtime, LIMIT.limit_bytes, LIMIT.failures = None, None, 0


def _train(policy: str | None, limit_bytes: int | None = None) -> tuple[list[list[torch.Tensor]], cswap.Runtime | None, int]:
    """Three SGD steps; with a runtime, the first (profiling) one on a device of ``limit_bytes``.
    Returns the gradients, the runtime and the profiling iteration's peak of resident bytes."""
    torch.manual_seed(0)
    model = GuardedCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rt = None
    if policy is not None:
        rt = cswap.Runtime(policy, model=model, device="cpu", min_bytes=0, d2h_gbps=1.0, h2d_gbps=1.0)
        LIMIT.runtime, LIMIT.limit_bytes = rt, limit_bytes
    grads = []
    profiled_peak_bytes = 0
    for i, (x, y) in enumerate(BATCHES):
        with torch.random.fork_rng():
            torch.manual_seed(i)
            if rt is None:
                nn.functional.cross_entropy(model(x), y).backward()
            else:
                with rt.iteration():
                    nn.functional.cross_entropy(model(x), y).backward()
                LIMIT.limit_bytes = None  # the plan made from the profile is what must fit from here on
                profiled_peak_bytes = profiled_peak_bytes or rt.stats().iteration_peak_resident_bytes
        grads.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
        optimizer.zero_grad()
    return grads, rt, profiled_peak_bytes


def _keep_all_peak(policy: str) -> int:
    _, _, peak_bytes = _train(policy)
    assert peak_bytes > 0
    return peak_bytes


@pytest.mark.parametrize("policy", ["none", "recompute", "capuchin", "cswap"])
def test_profiling_that_runs_out_of_memory_swaps_and_matches_plain(policy: str, passive_on_cpu: None) -> None:
    plain, _, _ = _train(None)
    keep_all_bytes = _keep_all_peak(policy)
    grads, rt, peak_bytes = _train(policy, keep_all_bytes // 2)
    assert rt is not None
    stats = rt.stats()
    assert LIMIT.failures > 0 and stats.evicted_tensors > 0
    assert stats.actions["swap"] >= stats.evicted_tensors
    assert rt.trace().meta["out_of_memory_retries"] == LIMIT.failures
    assert peak_bytes < keep_all_bytes
    for expected, actual in zip(plain, grads):
        assert_bit_equal(expected, actual, "gradient")
    assert "swapped when out of memory" in str(stats)


def test_without_passive_mode_the_error_reaches_the_caller_and_the_runtime_goes_on() -> None:
    limit_bytes = _keep_all_peak("none") // 2
    torch.manual_seed(0)
    model = GuardedCNN()
    rt = cswap.Runtime("none", model=model, device="cpu", min_bytes=0)
    assert not rt.swaps_on_out_of_memory  # a CPU device
    LIMIT.runtime, LIMIT.limit_bytes = rt, limit_bytes
    x, y = BATCHES[0]
    with pytest.raises(torch.OutOfMemoryError, match="tried to allocate"):
        with rt.iteration():
            nn.functional.cross_entropy(model(x), y).backward()
    assert rt.stats().evicted_tensors == 0
    LIMIT.limit_bytes = None
    with rt.iteration():
        nn.functional.cross_entropy(model(x), y).backward()
    assert rt.stats().resident_bytes == 0


def test_an_error_that_eviction_cannot_help_is_raised(passive_on_cpu: None) -> None:
    torch.manual_seed(0)
    model = GuardedCNN()
    rt = cswap.Runtime("none", model=model, device="cpu", min_bytes=0)
    LIMIT.runtime, LIMIT.limit_bytes = rt, 1  # not even the first output fits, with nothing kept
    x, y = BATCHES[0]
    with pytest.raises(torch.OutOfMemoryError):
        with rt.iteration():
            nn.functional.cross_entropy(model(x), y).backward()
    # The first block's tensors were swapped and the op ran again; then nothing was left to swap.
    assert LIMIT.failures == 2 and rt.stats().evicted_tensors > 0


def test_evict_kept_swaps_only_kept_tensors_not_yet_unpacked() -> None:
    executor = Executor(torch.device("cpu"), backend="cpu", prefetch_bytes=0)
    it = executor.begin(Plan(policy="none", epoch=0, default_action=Action.KEEP))
    x = torch.randn(4, 16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(*executor.hooks(it)):
        hidden = x.exp()
        out = (hidden.sin() * hidden).sum()
    resident = executor.snapshot().resident_bytes
    assert resident > 0
    moved = executor.evict_kept(it)
    counters = executor.snapshot()
    assert moved == counters.evicted_tensors == counters.actions["swap"] > 0
    assert counters.resident_bytes == 0 and counters.offloaded_bytes == resident == counters.transferred_bytes
    assert executor.evict_kept(it) == 0
    out.backward()
    executor.end(it)
    expected = x.detach().exp()
    assert torch.equal(x.grad, (expected.cos() * expected + expected.sin()) * expected)


def test_evict_kept_moves_every_view_of_a_kept_storage_so_that_it_is_freed() -> None:
    executor = Executor(torch.device("cpu"), backend="cpu", prefetch_bytes=0)
    it = executor.begin(Plan(policy="none", epoch=0, default_action=Action.KEEP))
    pack, unpack = executor.hooks(it)
    base = torch.randn(4, 16, 32)
    first, second = pack(base.view(64, 32)), pack(base)  # one storage, counted once
    assert executor.snapshot().resident_bytes == base.nbytes
    storage = StorageWeakRef(base.untyped_storage())
    expected = base.clone()
    del base
    assert executor.evict_kept(it) == 2  # moving only one would leave the storage held by the other
    assert storage.expired() and executor.snapshot().resident_bytes == 0
    assert torch.equal(unpack(first), expected.view(64, 32)) and torch.equal(unpack(second), expected)


def test_the_mode_retries_until_eviction_frees_nothing() -> None:
    calls: list[int] = []

    def evict() -> int:
        calls.append(1)
        return 1 if len(calls) < 3 else 0

    lib = torch.library.Library("cswap_test_passive_always", "DEF")
    lib.define("fail(Tensor x) -> Tensor")
    lib.impl("fail", lambda x: (_ for _ in ()).throw(torch.OutOfMemoryError("never fits")), "CPU")
    with SwapOnOutOfMemory(evict) as mode, pytest.raises(torch.OutOfMemoryError, match="never fits"):
        torch.ops.cswap_test_passive_always.fail(torch.ones(1))
    assert len(calls) == 3 and mode.retries == 2


def test_running_out_of_memory_in_backward_swaps_what_backward_has_not_read(passive_on_cpu: None) -> None:
    plain, _, _ = _train(None)
    torch.manual_seed(0)
    model = GuardedCNN()
    rt = cswap.Runtime("none", model=model, device="cpu", min_bytes=0, d2h_gbps=1.0, h2d_gbps=1.0)
    x, y = BATCHES[0]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        with rt.iteration():
            loss = nn.functional.cross_entropy(model(x), y)
            kept_bytes = rt.stats().resident_bytes
            LIMIT.runtime, LIMIT.limit_bytes = rt, kept_bytes // 2  # forward fitted; backward does not
            loss.backward()
    stats = rt.stats()
    assert LIMIT.failures > 0 and 0 < stats.evicted_tensors < stats.packed_tensors
    assert_bit_equal(plain[0], [p.grad for p in model.parameters()], "gradient")
