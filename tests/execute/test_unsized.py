"""Compressions whose size is read back later: pack never waits for the device, and everything
still adds up (resident bytes, counters, the budget, gradients bit-identical to plain PyTorch).

On CPU the executor's ``defer_sizes=True`` runs the same state machine as a GPU does by default;
``Unsized.ready`` is held false to stand for a device that has not finished, so the tests see
exactly when the executor reads a size.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import cswap
from cswap.codecs import Unsized
from cswap.execute.executor import Executor
from cswap.models import build
from cswap.planner.plan import Action, Plan
from tests.runtime.helpers import assert_bit_equal, batches, runtime_for, train


class _Device:
    """Stands for the device: compressions are ``ready`` only once it has ``finished``; counts resolves."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.finished = False
        self.resolved = 0
        resolve = Unsized.resolve
        device = self

        def counted(unsized: Unsized, exact: bool = False) -> Any:
            device.resolved += 1
            return resolve(unsized, exact)

        monkeypatch.setattr(Unsized, "ready", lambda unsized: device.finished)
        monkeypatch.setattr(Unsized, "resolve", counted)


def _relu_chain(x: torch.Tensor) -> torch.Tensor:
    h = x
    for _ in range(4):
        h = torch.relu(h * 1.5 - 0.2)
    return h.sum()


@pytest.mark.parametrize("action", [Action.ZVC_SWAP, Action.ZVC_KEEP])
def test_pack_leaves_the_size_unread_until_a_later_hook_finds_it_ready(action: Action, monkeypatch: pytest.MonkeyPatch) -> None:
    device = _Device(monkeypatch)
    x = torch.randn(64, 256)
    expected_x = x.clone().requires_grad_()
    _relu_chain(expected_x).backward()

    executor = Executor(torch.device("cpu"), backend="cpu", prefetch_bytes=0, defer_sizes=True)
    it = executor.begin(Plan(policy="test", epoch=0, default_action=action))
    leaf = x.clone().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(*executor.hooks(it)):
        loss = _relu_chain(leaf * 1.0)
    counters = executor.counters
    packed = counters.actions[action.value]
    assert packed > 0 and device.resolved == 0 and len(executor.transfers.unsized) == packed
    assert counters.compressed_bytes == 0 and counters.compressed_input_bytes > 0
    # each compression holds its workspace (on a GPU its values sized by numel) and its source until resolved
    assert counters.resident_bytes == sum(s.unsized.workspace_nbytes + s.layout.nbytes for s in executor.transfers.unsized)
    device.finished = True
    loss.backward()  # the first unpack's hook finds them ready and finishes them, oldest first
    executor.end(it)
    assert device.resolved == packed and not executor.transfers.unsized
    assert_bit_equal([expected_x.grad], [leaf.grad], "gradient")
    assert 0 < counters.compressed_bytes < counters.compressed_input_bytes
    if action is Action.ZVC_SWAP:
        assert counters.transferred_bytes == counters.compressed_bytes
    del loss
    assert executor.snapshot().resident_bytes == 0


def test_an_unpack_before_the_size_arrived_reads_it_then(monkeypatch: pytest.MonkeyPatch) -> None:
    device = _Device(monkeypatch)  # never finished: only an unpack that needs the data waits
    executor = Executor(torch.device("cpu"), backend="cpu", prefetch_bytes=0, defer_sizes=True)
    it = executor.begin(Plan(policy="test", epoch=0, default_action=Action.ZVC_SWAP))
    x = torch.randn(4096).requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(*executor.hooks(it)):
        y = torch.relu(x * 1.0).square().sum()
    assert device.resolved == 0
    y.backward()
    executor.end(it)
    assert device.resolved == executor.counters.actions["zvc-swap"] and not executor.transfers.unsized
    assert torch.equal(x.grad, 2 * torch.relu(x.detach()) * (x.detach() > 0))


def test_the_budget_finishes_the_oldest_compressions_when_resident_bytes_pass_it(monkeypatch: pytest.MonkeyPatch) -> None:
    device = _Device(monkeypatch)
    executor = Executor(torch.device("cpu"), backend="cpu", prefetch_bytes=0, defer_sizes=True)
    budget = 3 * 64 * 256 * 4  # room for about one compression in flight (workspace and source)
    plan = Plan(policy="test", epoch=0, default_action=Action.ZVC_SWAP, budget_bytes=budget, fallback_action=Action.ZVC_SWAP)
    it = executor.begin(plan)
    leaf = torch.randn(64, 256).requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(*executor.hooks(it)):
        loss = _relu_chain(leaf * 1.0)
    counters = executor.counters
    assert counters.budget_waits > 0 and device.resolved > 0
    assert counters.resident_bytes <= budget  # after each pack's wait
    device.finished = True
    loss.backward()
    executor.end(it)
    assert not executor.transfers.unsized


def test_stats_read_every_size_so_the_counters_are_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    _Device(monkeypatch)
    executor = Executor(torch.device("cpu"), backend="cpu", prefetch_bytes=0, defer_sizes=True)
    it = executor.begin(Plan(policy="test", epoch=0, default_action=Action.ZVC_KEEP))
    leaf = torch.randn(2048).requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(*executor.hooks(it)):
        loss = torch.relu(leaf * 1.0).square().sum()
    snapshot = executor.snapshot()
    assert not executor.transfers.unsized and 0 < snapshot.compressed_bytes < snapshot.compressed_input_bytes
    assert snapshot.resident_bytes == snapshot.compressed_bytes  # the workspace and source are gone
    loss.backward()
    executor.end(it)


@pytest.mark.parametrize("policy", ["compress-swap", "compress-keep", "cswap"])
def test_training_with_sizes_read_later_is_bit_identical(policy: str) -> None:
    data = batches(3, (4, 3, 32, 32), 10)

    def model() -> torch.nn.Module:
        return build("vgg11", num_classes=10, width_mult=0.125)

    def deferring(m: torch.nn.Module) -> cswap.Runtime:
        rt = runtime_for(policy)(m)
        rt._executor = Executor(rt.device, rt.backend, rt.options.prefetch_bytes, rt.options.arena_slack, defer_sizes=True)
        return rt

    reference, _ = train(model, data, 2)
    grads, rt = train(model, data, 2, deferring)
    for expected, actual in zip(reference, grads, strict=True):
        assert_bit_equal(expected, actual, "gradient")
    stats = rt.stats()
    assert stats.compressed_bytes > 0 and stats.resident_bytes == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("policy", ["compress-swap", "compress-keep"])
def test_gpu_forward_of_a_planned_iteration_never_synchronises(policy: str) -> None:
    torch.manual_seed(0)
    model = build("vgg11", num_classes=10, width_mult=0.25).cuda()
    x, y = torch.randn(8, 3, 32, 32, device="cuda"), torch.randint(0, 10, (8,), device="cuda")
    rt = cswap.Runtime(policy, device="cuda", min_bytes=0, model=model)
    for _ in range(2):  # the profiling iteration reads its trace back; the planned one must not wait
        with rt.iteration():
            torch.cuda.set_sync_debug_mode("error")
            try:
                loss = torch.nn.functional.cross_entropy(model(x), y)
            finally:
                torch.cuda.set_sync_debug_mode(0)
            loss.backward()
    assert rt.stats().compressed_bytes > 0
