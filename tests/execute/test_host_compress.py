"""``host-zvc-swap`` (policy ``cpu-compress-swap``, vDNN++): host copies compressed on worker threads.

Gradients are bit-identical to plain PyTorch for every dtype the encoding takes (bf16, fp16,
float32, int64 index masks, bool) and for views the layout stores compactly; the host holds fewer
bytes than ``swap``'s raw copies on a ReLU model; a tensor that does not compress stays a raw swap;
a worker's failure is raised, never trained through; the worker threads stop with their owner.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from dataclasses import replace
from typing import Any

import pytest
import torch

from cswap.execute import hostcodec
from cswap.execute.executor import Executor
from cswap.execute.hostcodec import HostCodec, HostCompressionError
from cswap.planner.plan import Action, Plan, host_reserve_bytes
from tests.runtime.helpers import assert_bit_equal, batches, runtime_for, train

POLICY = "cpu-compress-swap"


def _executor() -> Executor:
    return Executor(torch.device("cpu"), backend="cpu", prefetch_bytes=1 << 20)


def _plan() -> Plan:
    return Plan(policy=POLICY, epoch=0, default_action=Action.HOST_ZVC_SWAP)


def _hooks(executor: Executor | None) -> Any:
    """``executor``'s hooks for one iteration of the host-compressing plan, or none (plain PyTorch)."""
    if executor is None:
        return contextlib.nullcontext()
    return torch.autograd.graph.saved_tensors_hooks(*executor.hooks(executor.begin(_plan())))


def _run(executor: Executor | None, leaf: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A step that saves ``leaf``'s views (through ``mul``) and an int64 ``index`` (through ``gather``);
    returns the leaf's gradient and the loss."""
    leaf = leaf.detach().requires_grad_(True)
    with _hooks(executor):
        y = torch.relu(leaf * 1.5)
        loss = sum((view * view.detach() * 0.5).float().sum() for view in _saved_views_of(y))
        loss = loss + torch.gather(y.float().flatten(1), 1, index).sum()
    loss.backward()
    return leaf.grad, loss.detach()


def _saved_views_of(y: torch.Tensor) -> list[torch.Tensor]:
    """``y`` as itself, transposed (a dense non-contiguous view), sliced (gaps gathered out) and
    broadcast (stored once)."""
    return [y, y.transpose(0, -1), y[..., ::2], y[..., :1].expand(y.shape)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(4, 37), (8, 16, 33), (2, 3, 64, 5)], ids=str)
def test_gradients_bit_identical_for_each_dtype_and_view(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(0)
    leaf = torch.randn(shape, generator=g).to(dtype)
    flat = 1
    for size in shape[1:]:
        flat *= size
    # Mostly zeros: a sparse int64 index mask, which the encoding narrows before ZVC.
    index = (torch.rand(shape[0], flat, generator=g) < 0.2).long() * torch.randint(0, flat, (shape[0], flat), generator=g)
    expected = _run(None, leaf, index)
    executor = _executor()
    actual = _run(executor, leaf, index)
    assert_bit_equal(expected, actual, f"{dtype} {shape}")
    counters = executor.snapshot()
    stored = counters.packed_tensors - counters.never_moved_tensors - counters.deduplicated_tensors
    assert counters.actions["host-zvc-swap"] + counters.actions["swap"] == stored
    assert counters.host_compressed_tensors >= 2  # at least the ReLU output and the index mask shrank
    assert counters.host_compressed_bytes < counters.host_compressed_input_bytes
    executor.close()


def test_bool_mask_and_int64_indices_of_a_cnn_round_trip() -> None:
    # max_pool2d saves int64 indices; the comparison mask of a threshold is bool.
    executor = _executor()
    x = torch.randn(4, 8, 16, 16)
    out = {}
    for name, ex in (("plain", None), ("host", executor)):
        leaf = x.clone().requires_grad_(True)
        with _hooks(ex):
            y = torch.nn.functional.max_pool2d(torch.relu(leaf), 2, return_indices=False)
            y = torch.where(y > 0.5, y, torch.zeros_like(y))
            (y * y).sum().backward()
        out[name] = leaf.grad
    assert torch.equal(out["plain"], out["host"])
    assert executor.snapshot().host_compressed_tensors >= 1
    executor.close()


def _cnn() -> torch.nn.Module:
    from cswap.models import build

    return build("vgg11", num_classes=10, width_mult=0.125)


def test_cnn_gradients_bit_identical_and_fewer_host_bytes_than_swap() -> None:
    data = batches(3, (8, 3, 32, 32), 10)
    plain, _ = train(_cnn, data, 1)
    held = {}
    for policy in ("swap", POLICY):
        grads, rt = train(_cnn, data, 1, runtime_for(policy, prefetch_bytes=0))
        assert_bit_equal([g for it in plain for g in it], [g for it in grads for g in it], f"{policy} gradient")
        executor = rt._executor
        model = _cnn()
        # One more forward, stopped before backward: what the host holds for every saved tensor at
        # once, all compressions collected (snapshot waits for them).
        with rt.iteration():
            loss = torch.nn.functional.cross_entropy(model(data[0][0]), data[0][1])
            held[policy] = executor.snapshot().host_bytes
            loss.backward()
        if policy == POLICY:
            counters = executor.snapshot()
            assert counters.actions["host-zvc-swap"] > 0 and counters.host_compressed_tensors > 0
            assert counters.host_bytes == 0  # every entry's host bytes were released with it
    assert held[POLICY] < 0.8 * held["swap"], held


def test_tiny_gpt2_with_dropout_bit_identical() -> None:
    transformers = pytest.importorskip("transformers")

    def build() -> torch.nn.Module:
        config = transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2)  # dropout 0.1
        return _LanguageModel(transformers.GPT2LMHeadModel(config))

    g = torch.Generator().manual_seed(3)
    data = [(torch.randint(0, 96, (4, 32), generator=g), torch.randint(0, 96, (4, 32), generator=g)) for _ in range(3)]
    loss = lambda logits, y: torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())  # noqa: E731
    plain, _ = train(build, data, 1, loss_fn=loss)
    grads, rt = train(build, data, 1, runtime_for(POLICY), loss_fn=loss)
    assert_bit_equal([g for it in plain for g in it], [g for it in grads for g in it], "gpt2 gradient")
    assert rt.stats().actions["host-zvc-swap"] > 0


class _LanguageModel(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, use_cache=False).logits


def test_a_tensor_that_does_not_compress_stays_a_raw_swap() -> None:
    executor = _executor()
    dense = torch.randn(64, 64).add_(10.0)  # no zero anywhere: ZVC would only add its bitmap
    with _hooks(executor):
        leaf = dense.clone().requires_grad_(True)
        (leaf.exp() * 1.0).sum().backward()
    assert torch.equal(leaf.grad, dense.exp())
    counters = executor.snapshot()
    assert counters.actions["host-zvc-swap"] == 0 and counters.actions["swap"] == 1
    assert counters.host_compressed_tensors == 0
    executor.close()


def test_a_dtype_the_encoding_cannot_take_is_swapped_raw() -> None:
    plan = _plan()
    decision = plan.resolve(0, (64,), torch.complex64, 512)
    assert decision.action is Action.SWAP and "no ZVC encoding" in decision.reason


def test_a_worker_error_is_raised_not_trained_through(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(raw: torch.Tensor, event: object, launch: object, codec: str) -> None:
        raise MemoryError("no room for the values buffer")

    monkeypatch.setattr(hostcodec, "_compress", broken)
    executor = _executor()
    leaf = torch.randn(256, requires_grad=True)
    with pytest.raises(HostCompressionError, match="key 0 failed in its worker thread: MemoryError: no room"):
        with _hooks(executor):
            torch.relu(leaf).exp().sum().backward()
    executor.close()


def test_the_worker_threads_stop_with_their_owner() -> None:
    def workers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("cswap-host-zvc")]

    gc.collect()
    before = len(workers())
    rt = runtime_for(POLICY)(torch.nn.Linear(8, 8))
    leaf = torch.randn(32, 8, requires_grad=True)
    for _ in range(2):
        with rt.iteration():
            torch.relu(leaf).exp().sum().backward()
    codec = rt._executor.transfers.host_codec
    assert codec.running and codec.submitted > 0
    pool = codec._pool
    del rt, codec
    gc.collect()
    assert pool._shutdown  # the finaliser shut it down with the runtime
    for thread in workers()[before:]:
        thread.join(timeout=5)
    assert len(workers()) <= before
    explicit = HostCodec(workers=1)
    explicit.submit(torch.zeros(64), None).result()
    explicit.close()
    assert not explicit.running
    with pytest.raises(ValueError, match="at least one worker"):
        HostCodec(workers=0)


def test_budget_held_and_gradients_bit_identical() -> None:
    data = batches(3, (8, 3, 32, 32), 10)
    plain, _ = train(_cnn, data, 1)
    grads, rt = train(_cnn, data, 1, runtime_for(POLICY, memory_budget=0.5))
    assert_bit_equal([g for it in plain for g in it], [g for it in grads for g in it], "gradient under a budget")
    stats = rt.stats()
    assert stats.peak_resident_bytes <= stats.budget_bytes
    assert stats.actions["host-zvc-swap"] > 0
    # the budget plan's swaps are carried out as host-zvc-swap where ZVC shrinks them, else raw
    assert all(d.compressed_nbytes is not None and d.compressed_nbytes < d.nbytes
               for d in rt.plan().decisions.values() if d.action is Action.HOST_ZVC_SWAP)


@pytest.mark.parametrize("memory_budget", [None, 0.5])
def test_a_tensor_zvc_would_not_shrink_as_profiled_is_planned_a_raw_swap(memory_budget: float | None) -> None:
    # ResNet-18's batch-norm outputs are dense: compressing their host copies would be dropped, so
    # the plan moves them raw and sets no room aside; the ReLU outputs are compressed on the host.
    from cswap.models import build

    def resnet() -> torch.nn.Module:
        return build("resnet18", num_classes=10, width_mult=0.125)

    data = batches(2, (4, 3, 32, 32), 10)
    plain, _ = train(resnet, data, 1)
    grads, rt = train(resnet, data, 1, runtime_for(POLICY, memory_budget=memory_budget))
    assert_bit_equal([g for it in plain for g in it], [g for it in grads for g in it], "gradient")
    decisions = list(rt.plan().decisions.values())
    host, raw = ([d for d in decisions if d.action is a] for a in (Action.HOST_ZVC_SWAP, Action.SWAP))
    assert host and raw
    assert all(d.compressed_nbytes is not None and d.compressed_nbytes < d.nbytes for d in host)
    assert all(d.compressed_nbytes is None or d.compressed_nbytes >= d.nbytes for d in raw)
    assert rt.stats().actions["host-zvc-swap"] > 0 and rt.stats().actions["swap"] > 0


def _two_relus_under_a_host_budget(host_budget_bytes: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """Two ReLU outputs of one raw size, host-compressed under ``host_budget_bytes``: the
    executor's counters, the leaf's gradient and plain PyTorch's."""
    executor = _executor()
    x = torch.randn(256, 256)
    plan = replace(_plan(), host_budget_bytes=host_budget_bytes, host_meter=executor.transfers)
    with torch.autograd.graph.saved_tensors_hooks(*executor.hooks(executor.begin(plan))):
        leaf = x.clone().requires_grad_(True)
        torch.relu(torch.relu(leaf) * 2.0).sum().backward()
    expected = x.clone().requires_grad_(True)
    torch.relu(torch.relu(expected) * 2.0).sum().backward()
    counters = executor.snapshot()
    executor.close()
    return counters, leaf.grad, expected.grad


def test_a_pack_under_a_host_budget_first_collects_the_pending_host_compressions() -> None:
    # The profile sizes nothing, so each pack sets aside ZVC's most beside its raw copy; the host
    # budget holds one such pack beside the other's compression (about 0.53 raw): the second pack
    # fits only once the first compression is collected and its raw copy freed, which it waits for.
    raw = 256 * 256 * 4
    room = host_reserve_bytes(raw)
    budget = raw + room + int(0.6 * raw)
    assert 2 * (raw + room) > budget
    counters, grad, expected = _two_relus_under_a_host_budget(budget)
    assert torch.equal(grad, expected)
    assert counters.actions["host-zvc-swap"] == 2 and counters.budget_fallbacks == 0 and counters.host_compressed_tensors == 2
    assert counters.peak_host_bytes <= budget


@pytest.mark.parametrize(("raw_fraction", "compressed"), [(0.5, 0), (1.6, 0), (2.2, 1), (3.0, 2), (5.0, 2)])
def test_the_host_peak_counts_a_compression_beside_its_raw_copy_and_holds_the_host_budget(raw_fraction: float, compressed: int) -> None:
    # A worker writes the compression beside the raw copy: both are host memory until it is
    # collected, and the host budget holds them; what does not fit stays on the device. One pack
    # takes about 2.03 raw (its copy and ZVC's most), a collected compression about 0.53.
    raw = 256 * 256 * 4
    budget = int(raw_fraction * raw)
    counters, grad, expected = _two_relus_under_a_host_budget(budget)
    assert torch.equal(grad, expected)
    assert counters.peak_host_bytes <= budget, f"host peak {counters.peak_host_bytes} over the {budget} B host budget"
    assert counters.actions["host-zvc-swap"] == compressed and counters.actions["keep"] == 2 - compressed
    assert counters.budget_fallbacks == 2 - compressed and counters.host_compressed_tensors == compressed
