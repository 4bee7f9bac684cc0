"""What the hooks do per saved tensor, and what they do once per plan instead.

The model's parameters are walked once per plan, not once per iteration; a contiguous, aligned
tensor is copied to the host with its own shape and strides and rebuilt by one copy, exactly; what
the executor tracks for stored data and for tensors handed back to backward is released when they
die, without scans, so its tables do not grow over iterations; and a rebuilt tensor someone keeps
counts as resident until its storage is freed.
"""

from __future__ import annotations

import gc

import pytest
import torch

from cswap.execute.executor import Executor
from cswap.execute.layout import Layout
from cswap.planner.plan import Action, Plan
from tests.execute.test_executor import make_runtime

DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool)


class _CountingParameters(torch.nn.Sequential):
    """A Sequential that counts how often its parameters are walked."""

    walks = 0

    def parameters(self, recurse: bool = True):  # type: ignore[override]
        type(self).walks += 1
        return super().parameters(recurse)


def _step(model: torch.nn.Module, x: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()


@pytest.mark.parametrize("policy", ("swap", "cswap", "compress-keep"))
def test_parameters_are_walked_once_per_plan(policy: str) -> None:
    torch.manual_seed(0)
    model = _CountingParameters(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    rt = make_runtime(policy, model=model)
    x = torch.randn(8, 16)
    for _ in range(6):
        with rt.iteration():
            _step(model, x)
    walks_over_six = _CountingParameters.walks
    for _ in range(4):
        with rt.iteration():
            _step(model, x)
    # zero_grad walks once per step; the executor only for the profiling plan and the plan made from it.
    assert _CountingParameters.walks - walks_over_six == 4
    assert rt.stats().profiled_iterations == 1


def _contiguous_cases(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    base = (torch.arange(4 * 1 * 64) % 7).to(dtype)
    itemsize = base.element_size()
    aligned_start = 64 // itemsize  # 64 bytes in: aligned, so rebuilt as a plain layout
    return {
        "row-major": base.view(4, 1, 64),
        "odd stride on a size-1 dim": base.as_strided((4, 1, 64), (64, 1000, 1)),
        "aligned slice": base[aligned_start : aligned_start + 64].view(8, 8),
        "misaligned slice": base[3 : 3 + 64].view(8, 8),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_contiguous_tensors_are_rebuilt_with_their_strides_and_alignment(dtype: torch.dtype) -> None:
    executor = Executor(torch.device("cpu"), backend="cpu", prefetch_bytes=0)
    it = executor.begin(Plan(policy="swap", epoch=0, default_action=Action.SWAP))
    for name, tensor in _contiguous_cases(dtype).items():
        layout = Layout.of(tensor)
        itemsize = tensor.element_size()
        assert layout.plain == (tensor.storage_offset() * itemsize % 64 == 0), name
        handle = executor.pack(it, tensor)
        assert handle.stored is not None and handle.stored.action is Action.SWAP, name
        rebuilt = executor.unpack(it, handle)
        assert rebuilt.data_ptr() != tensor.data_ptr(), name
        assert rebuilt.shape == tensor.shape and rebuilt.stride() == tensor.stride() and rebuilt.dtype == dtype, name
        assert rebuilt.storage_offset() * itemsize % 64 == tensor.storage_offset() * itemsize % 64, name
        assert torch.equal(rebuilt, tensor), name
    executor.end(it)


@pytest.mark.parametrize("policy", ("swap", "compress-swap", "cswap", "compress-keep"))
def test_tables_are_released_without_growing(policy: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU()) for _ in range(6)))
    rt = make_runtime(policy, model=model)
    x = torch.randn(8, 32)
    for _ in range(5):
        with rt.iteration():
            _step(model, x)
        gc.collect()
        executor = rt._executor
        executor.snapshot()  # drains what the dead handles and rebuilt tensors posted
        assert not executor._handed_out and not executor._dead_storages
        assert not executor._dedupe and not executor._released
        assert rt.stats().resident_bytes == 0
    actions = rt.stats().actions
    assert sum(actions.values()) > actions["keep"]  # it stored tensors other than by keeping them


def test_a_rebuilt_tensor_kept_by_the_user_counts_until_freed() -> None:
    rt = make_runtime("swap")
    x = torch.randn(1024, requires_grad=True)
    with rt.iteration():
        y = x.exp()  # saves its result: 4096 bytes
        kept = y.grad_fn._saved_result  # unpacked now: rebuilt from the host copy and handed out
        y.sum().backward()
    del y
    gc.collect()
    assert rt.stats().resident_bytes == 4096  # the stored copy is gone, the rebuilt tensor is not
    assert torch.equal(kept, x.exp().detach())
    del kept
    assert rt.stats().resident_bytes == 0
