"""The executor in detail: exact deduplication counts, every kind of view rebuilt with its strides,
compact broadcasts, integer/bool/complex saves, reordered unpacks, inner hooks and no_grad regions,
min_bytes, parameters and buffers, runtimes in threads, nesting and failed iterations.

``test_corner_cases.py`` checks the same facts for gradient equality under every policy."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import cswap
from cswap.codecs import zvc_compressed_nbytes
from cswap.execute.executor import Executor
from cswap.planner.actions import RUNTIME_POLICIES
from cswap.planner.plan import Action, Decision, Plan
from tests.runtime.helpers import assert_bit_equal, one_thread_below_1mib

MOVING_POLICIES = ("swap", "compress-swap", "cswap", "compress-keep")
ALL_POLICIES = ("none", *MOVING_POLICIES)


def make_runtime(policy: str, **options) -> cswap.Runtime:
    defaults = {"device": "cpu", "min_bytes": 0, "d2h_gbps": 0.01, "h2d_gbps": 0.01, "launch_lookup": one_thread_below_1mib}
    if policy == "cswap":
        from tests.runtime.helpers import FAST_CODEC

        defaults["time_model"] = FAST_CODEC
    return cswap.Runtime(policy, **{**defaults, **options})


def leaves(*shapes: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).requires_grad_() for shape in shapes]


def grads(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], rt: cswap.Runtime | None, iterations: int = 2) -> list[torch.Tensor]:
    """Gradients of ``fn(*inputs).backward()`` accumulated over ``iterations`` (the first one profiles)."""
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    for _ in range(iterations):
        if rt is None:
            fn(*inputs).backward()
        else:
            with rt.iteration():
                fn(*inputs).backward()
    return [t.grad for t in inputs]


def check_same_as_plain(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], policy: str, **options) -> cswap.Runtime:
    rt = make_runtime(policy, **options)
    assert_bit_equal(grads(fn, inputs, None), grads(fn, inputs, rt), what=f"{policy} gradient")
    return rt


# ---------------------------------------------------------------------------------- duplicates


@pytest.mark.parametrize("policy", MOVING_POLICIES)
def test_same_tensor_saved_three_times_is_stored_once(policy: str) -> None:
    def fn(x):
        y = x.exp()  # exp saves its result y; y * y saves y twice more
        return (y * y).sum()

    rt = check_same_as_plain(fn, leaves((64, 64)), policy, prefetch_bytes=0)
    stats = rt.stats()
    assert stats.packed_tensors == 6  # 3 per iteration
    assert stats.deduplicated_tensors == 4  # 2 per iteration
    assert sum(stats.actions.values()) == 2
    assert rt.trace().meta["duplicates"] == {"1": 0, "2": 0}


@pytest.mark.parametrize("policy", MOVING_POLICIES)
def test_another_view_at_the_same_place_is_stored_on_its_own(policy: str) -> None:
    # y and its flat view share storage, offset and version; only a save of the same view is a duplicate
    def fn(x):
        y = x.exp()  # saves y
        flat = y.view(-1)
        return (flat * flat).sum()  # saves flat twice

    rt = check_same_as_plain(fn, leaves((32, 32)), policy, prefetch_bytes=0)
    stats = rt.stats()
    assert stats.packed_tensors == 6  # 3 per iteration
    assert stats.deduplicated_tensors == 2  # 1 per iteration
    assert sum(stats.actions.values()) == 4


def test_duplicate_keys_follow_their_first_key_in_the_plan() -> None:
    rt = make_runtime("compress-swap")
    x = leaves((32, 32))[0]
    with rt.iteration():
        y = x.exp()
        (y * y).sum().backward()
    plan = rt.plan()
    assert plan.decisions[1].action is plan.decisions[0].action
    assert plan.decisions[1].reason == "duplicate of key 0: stored once"


# ---------------------------------------------------------------------------------- views


def _transpose(a, b):
    return (a.t() @ b).sum()


def _strided_slice(a, b):
    return (a[:, ::2] * b[:, :32]).sum()


def _broadcast(a, b):
    return (a[:1].expand(64, 64) * b).sum()


def _channels_last(a, b):
    x = a.view(4, 4, 16, 16).contiguous(memory_format=torch.channels_last)
    w = b[:8, :36].reshape(8, 4, 3, 3)
    return F.conv2d(x, w, padding=1).relu().sum()


def _overlapping(a, b):
    windows = a.reshape(-1)[:640].unfold(0, 64, 32)  # rows overlap by half
    return (windows * b[: windows.shape[0]]).sum()


VIEWS = {"transpose": _transpose, "strided-slice": _strided_slice, "broadcast": _broadcast, "channels-last": _channels_last, "overlapping": _overlapping}


@pytest.mark.parametrize("policy", MOVING_POLICIES)
@pytest.mark.parametrize("view", VIEWS)
def test_views_give_plain_gradients(view: str, policy: str) -> None:
    check_same_as_plain(VIEWS[view], leaves((64, 64), (64, 64)), policy)


@pytest.mark.parametrize("policy", ("swap", "compress-swap", "compress-keep"))
def test_unpacked_views_keep_shape_strides_and_values(policy: str) -> None:
    rt = make_runtime(policy)
    base = leaves((64, 96))[0] * 1.0  # not a leaf: its views are activations, not parameters
    cases = {
        "transpose": base.t(),
        "strided-slice": base[:, ::3],
        "offset-slice": base[3:, 5:],
        "broadcast": base[:1].expand(64, 96),
        "permuted": base.view(8, 8, 96).permute(2, 0, 1),
    }
    with rt.iteration():
        for name, view in cases.items():
            other = torch.ones_like(view, requires_grad=True)
            unpacked = (view * other).grad_fn._saved_self
            assert unpacked.shape == view.shape and unpacked.dtype == view.dtype, name
            assert unpacked.stride() == view.stride(), name
            assert torch.equal(unpacked, view), name
    stats = rt.stats()
    assert stats.packed_tensors == 2 * len(cases)
    assert stats.never_moved_tensors == len(cases)  # the leaves ``other``
    assert sum(stats.actions.values()) == len(cases)


def test_broadcast_is_stored_compactly() -> None:
    rt = make_runtime("swap")
    row = torch.randn(1, 1024)
    weight = torch.randn(256, 1024, requires_grad=True)
    with rt.iteration():
        (row.expand(256, 1024) * weight).sum().backward()
    assert rt.stats().offloaded_bytes == 1024 * 4  # the row, not 256 copies of it
    assert rt.trace().tensors[0].nbytes == 1024 * 4


# ---------------------------------------------------------------------------------- dtypes


def _integer_and_bool_saves(x, w):
    index = (x.detach().abs() * 10).long() % 64  # int64 index saved by gather
    picked = torch.gather(w, 1, index)
    mask = x > 0  # bool mask saved by where
    kept = torch.where(mask, picked * x, torch.zeros(()))
    pooled = F.max_pool2d(kept.view(1, 1, 64, 64), 2)  # int64 indices saved by max_pool2d
    return pooled.sum() + F.embedding(index[:4, :4], w).sum()


class _SparseTimesDense(torch.nn.Module):
    """A linear layer, then a product with a sparse buffer, which autograd saves and which has no storage."""

    def __init__(self, layout: torch.layout) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(1)
        self.linear = torch.nn.Linear(8, 8)
        dense = torch.randn(16, 16, generator=generator)
        dense[dense < 0.5] = 0
        self.register_buffer("matrix", dense.to_sparse_csr() if layout is torch.sparse_csr else dense.to_sparse())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(self.matrix, self.linear(x).exp()).sum()


@pytest.mark.filterwarnings("ignore:Sparse")
@pytest.mark.parametrize("layout", (torch.sparse_csr, torch.sparse_coo), ids=str)
@pytest.mark.parametrize("policy", RUNTIME_POLICIES)
def test_sparse_saved_tensors_stay_where_they_are(policy: str, layout: torch.layout) -> None:
    model = _SparseTimesDense(layout)
    x = leaves((16, 8))[0]

    def fn(inputs: torch.Tensor) -> torch.Tensor:
        return model(inputs)

    rt = check_same_as_plain(fn, [x], policy, model=model)
    assert rt.stats().never_moved_tensors >= 1


@pytest.mark.parametrize("policy", ("compress-swap", "compress-keep", "swap"))
def test_int_and_bool_tensors_round_trip(policy: str) -> None:
    rt = check_same_as_plain(_integer_and_bool_saves, leaves((64, 64), (64, 64)), policy)
    dtypes = {record.dtype for record in rt.trace().tensors}
    assert {"int64", "bool", "float32"} <= dtypes
    if policy != "swap":
        assert rt.stats().compressed_bytes > 0


def test_dtype_without_zvc_encoding_is_swapped_uncompressed() -> None:
    rt = make_runtime("compress-swap")
    z = torch.randn(64, 64, dtype=torch.complex64, requires_grad=True)
    plain = torch.randn(64, 64, dtype=torch.complex64)
    with rt.iteration():
        (z * plain).abs().sum().backward()
    expected = torch.autograd.grad((z * plain).abs().sum(), z)[0]
    assert torch.equal(z.grad, expected)
    assert rt.stats().actions["swap"] > 0
    decisions = [d for d in rt.plan().decisions.values() if d.dtype == "complex64"]
    assert decisions and all("no ZVC encoding" in d.reason for d in decisions)


class _SavesInt64(torch.autograd.Function):
    """Saves an int64 tensor for backward and returns, as the gradient, the values it got back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(codes)
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (codes,) = ctx.saved_tensors
        return grad * codes.to(grad.dtype), None


@pytest.mark.parametrize("policy", ("compress-swap", "compress-keep"))
@pytest.mark.parametrize(
    ("largest", "itemsize"),
    [(100, 1), (2**15 - 1, 2), (-(2**15) - 1, 4), (2**31 - 1, 4), (2**31, 8), (-(2**40), 8)],
    ids=("int8", "int16", "int32-below", "int32", "needs-int64", "needs-int64-negative"),
)
def test_int64_narrowed_only_when_exact(policy: str, largest: int, itemsize: int) -> None:
    codes = torch.arange(-48, 48, dtype=torch.int64).repeat(4096 // 96 + 1)[:4096]
    codes[::2] = 0
    codes[5] = largest  # the one value that decides the width
    rt = make_runtime(policy)
    x = leaves((4096,))[0]
    with rt.iteration():
        _SavesInt64.apply(x * 1.0, codes).sum().backward()
    assert torch.equal(x.grad, codes.to(torch.float32))
    nnz = int((codes != 0).sum())
    stats = rt.stats()
    assert stats.compressed_input_bytes == 4096 * 8
    assert stats.compressed_bytes == zvc_compressed_nbytes(4096, nnz, itemsize)


class _SavesAsGiven(torch.autograd.Function):
    """Saves the tensors it is given for backward and hands what backward got back to ``seen``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, seen: list[torch.Tensor], *saved: torch.Tensor) -> torch.Tensor:
        ctx.seen = seen
        ctx.save_for_backward(*saved)
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        ctx.seen.extend(t.clone() for t in ctx.saved_tensors)
        return (grad, None, *(None for _ in ctx.saved_tensors))


# Budgets for the four tensors below (16 KiB of bf16, 32 KiB of float32, 8 KiB of bool, 8 KiB of
# int32) and what compress-keep's profile stores raw under each: room for none (each falls back to
# its smallest coding at pack); room for the first three raw (the fourth makes it compress the
# oldest two, and keeps the mask and itself raw); room for all.
_KEEP_FIRST_BUDGETS = {"none raw": (1, {"zvc-keep": 3, "keep": 1}), "the first three raw": (57344 + 512, {"zvc-keep": 2, "keep": 2}),
                       "all raw": (1 << 30, {"keep": 4})}


@pytest.mark.parametrize("room", _KEEP_FIRST_BUDGETS)
@pytest.mark.parametrize("backend", ("cpu", "torch"))
def test_a_compress_keep_profile_stores_each_tensor_by_its_smallest_coding(backend: str, room: str) -> None:
    """Under a budget in bytes, compress-keep's profiling iteration keeps each tensor while the
    budget has room, and past it compresses the oldest it kept, then the new one, each by the codec
    that gives it the fewest bytes, raw where none shrinks it: the plans made from it choose alike
    (ZVC alone shrinks no dense bf16 activation). Gradients are those saved, bit for bit."""
    from cswap.codecs import CODECS
    from cswap.codecs.bitpack import bitpack_nbytes

    g = torch.Generator().manual_seed(3)
    dense_bf16 = torch.randn(8192, generator=g).to(torch.bfloat16)  # exponent coding wins
    sparse_fp32 = torch.randn(8192, generator=g).clamp(min=1.0)  # mostly equal non-zeros; ZVC wins
    sparse_fp32[sparse_fp32 == 1.0] = 0
    mask = torch.rand(8192, generator=g) > 0.1  # bit-packing
    noise = torch.randint(-(2**31), 2**31 - 1, (2048,), generator=g, dtype=torch.int32)  # nothing shrinks it: raw
    saved = [dense_bf16, sparse_fp32, mask, noise]
    from dataclasses import replace

    from tests.runtime.helpers import FAST_CODEC

    budget, actions = _KEEP_FIRST_BUDGETS[room]
    no_timing = replace(FAST_CODEC, backend=backend)  # the plan is not what is tested: skip timing the codecs
    rt = make_runtime("compress-keep", backend=backend, memory_budget=budget, time_model=no_timing)
    x = leaves((16,))[0]
    seen: list[torch.Tensor] = []
    try:
        with rt.iteration():
            _SavesAsGiven.apply(x * 1.0, seen, *saved).sum().backward()
    except cswap.BudgetError:
        # backward reads all four at once, so no plan compresses less than the profile did: the
        # profile ran all the same
        assert budget < 1 << 30
    for want, got in zip(saved, seen, strict=True):
        assert_bit_equal([want], [got], what=f"{want.dtype} saved tensor")
    exponent = int(CODECS.get("exponent").compressed_nbytes(dense_bf16, backend))
    zvc = zvc_compressed_nbytes(8192, int((sparse_fp32 != 0).sum()), 4)
    assert exponent < 8192 * 2 and zvc < 8192 * 4
    stats = rt.stats()
    coded = {"zvc-keep": 3, "keep": 1}, {"zvc-keep": 2, "keep": 2}
    assert {action: n for action, n in stats.actions.items() if n} == actions
    if actions == coded[0]:
        assert stats.compressed_input_bytes == 8192 * 2 + 8192 * 4 + 8192
        assert stats.compressed_bytes == exponent + zvc + bitpack_nbytes(8192)
    elif actions == coded[1]:  # the oldest two compressed once the fourth came
        assert stats.compressed_input_bytes == 8192 * 2 + 8192 * 4
        assert stats.compressed_bytes == exponent + zvc
    else:
        assert stats.compressed_input_bytes == 0


# ---------------------------------------------------------------------------------- unpacks


@pytest.mark.parametrize("policy", MOVING_POLICIES)
def test_unpack_order_is_free(policy: str) -> None:
    def fn(x, w):
        a = torch.sigmoid(x @ w)
        b = torch.tanh(x * 3.0)
        # Backward through b's branch first, then a's: the reverse of the pack order.
        (gx_b,) = torch.autograd.grad(b.sum(), x, retain_graph=True)
        return a.sum() + (gx_b.detach() * b).sum()

    check_same_as_plain(fn, leaves((32, 32), (32, 32)), policy)


# ---------------------------------------------------------------------------------- nesting and regions


@pytest.mark.parametrize("policy", MOVING_POLICIES)
def test_inner_save_on_cpu_wins(policy: str) -> None:
    def fn(x, w):
        h = torch.tanh(x)
        with torch.autograd.graph.save_on_cpu():
            h = torch.sigmoid(h @ w)
        return h.sum()

    rt = check_same_as_plain(fn, leaves((32, 64), (64, 64)), policy)
    assert rt.stats().packed_tensors == 2  # only tanh's result, once per iteration


def test_no_grad_region_packs_nothing() -> None:
    rt = make_runtime("swap")
    x = leaves((64, 64))[0]
    with rt.iteration():
        with torch.no_grad():
            y = torch.tanh(x) @ x
        (y * x).sum().backward()
    assert rt.stats().packed_tensors == 1  # y, saved by the multiplication


# ---------------------------------------------------------------------------------- what never moves


def test_tensors_below_min_bytes_stay() -> None:
    rt = make_runtime("swap", min_bytes=16 * 1024)
    small, large = leaves((8, 8), (64, 64))
    with rt.iteration():
        (small.exp().sum() + large.exp().sum()).backward()
    stats = rt.stats()
    assert stats.actions == {"keep": 1, "swap": 1, "zvc-swap": 0, "zvc-keep": 0, "recompute": 0, "host-zvc-swap": 0}
    assert stats.kept_bytes == 8 * 8 * 4 and stats.offloaded_bytes == 64 * 64 * 4
    reasons = [d.reason for d in rt.plan().decisions.values()]
    assert any(reason.startswith("below min_bytes") for reason in reasons)


@pytest.mark.parametrize("with_model", (True, False))
@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_planned_parameters_give_plain_double_backward_gradients(policy: str, with_model: bool) -> None:
    # a planned pack keeps a parameter (and a view of one, a Linear's weight.t()) as its own handle;
    # a gradient of a gradient flows through those saves
    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(3))

    def run(model: torch.nn.Module, rt: cswap.Runtime | None) -> list[torch.Tensor]:
        inputs = x.clone().requires_grad_()
        for _ in range(3):  # a profiling iteration, then planned ones
            model.zero_grad()
            inputs.grad = None
            with rt.iteration() if rt is not None else torch.enable_grad():
                (g,) = torch.autograd.grad(model(inputs).sum(), inputs, create_graph=True)
                g.pow(2).sum().backward()
        return [inputs.grad, *(p.grad for p in model.parameters() if p.grad is not None)]

    plain = run(build(), None)
    model = build()
    rt = make_runtime(policy, model=model if with_model else None)
    assert_bit_equal(plain, run(model, rt), what=f"{policy} double-backward gradient")
    assert rt.stats().never_moved_tensors > 0


@pytest.mark.parametrize("with_model", (True, False))
def test_parameters_and_buffers_never_offloaded(with_model: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4))
    rt = make_runtime("swap", model=model if with_model else None)
    x = torch.randn(2, 3, 8, 8)
    with rt.iteration():
        model(x).sum().backward()
    parameter_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    buffer_storages = {b.untyped_storage().data_ptr() for b in model.buffers()}
    trace = rt.trace()
    reasons = trace.meta["not_offloadable"]
    assert any("parameter" in reason for reason in reasons.values())
    if with_model:
        assert any("parameter or buffer of the model" in reason for reason in reasons.values())
        assert "Sequential" == trace.meta["model"]
        assert any(record.producer.startswith("4:") for record in trace.tensors)  # the Linear's input
    assert parameter_storages and buffer_storages
    assert rt.stats().never_moved_tensors >= 3  # conv weight, bn weight, linear weight (its transposed view)


# ---------------------------------------------------------------------------------- threads


def test_two_runtimes_in_two_threads() -> None:
    inputs = leaves((32, 64), (64, 64))

    def fn(x, w):
        return torch.tanh(torch.relu(x @ w) @ w).sum()

    expected = grads(fn, inputs, None, iterations=3)
    results: dict[str, list[torch.Tensor]] = {}
    errors: list[BaseException] = []

    def worker(policy: str) -> None:
        try:
            results[policy] = grads(fn, inputs, make_runtime(policy), iterations=3)
        except BaseException as error:  # re-raised in the main thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(policy,)) for policy in ("swap", "compress-keep")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for policy, got in results.items():
        assert_bit_equal(expected, got, what=f"{policy} gradient")


def test_iterations_cannot_nest_or_overlap() -> None:
    rt = make_runtime("swap")
    with rt.iteration():
        with pytest.raises(RuntimeError, match="cannot nest or overlap"):
            with rt.iteration():
                pass
    with rt.iteration():  # the runtime is usable afterwards
        leaves((4, 4))[0].exp().sum().backward()


def test_failed_iteration_keeps_profiling_armed() -> None:
    rt = make_runtime("cswap")
    with pytest.raises(ZeroDivisionError):
        with rt.iteration():
            leaves((4, 4))[0].exp().sum()
            raise ZeroDivisionError
    with pytest.raises(RuntimeError, match="no iteration has been profiled"):
        rt.trace()
    with rt.iteration():
        leaves((64, 64))[0].exp().sum().backward()
    assert rt.trace().epoch == 0


def _keeping_executor(budget_bytes: int | None = None) -> tuple[Executor, Callable[[torch.Tensor], Any]]:
    executor = Executor(torch.device("cpu"), backend="cpu", prefetch_bytes=0)
    plan = Plan(policy="swap", epoch=0, default_action=Action.KEEP, budget_bytes=budget_bytes,
                fallback_action=Action.SWAP if budget_bytes is not None else None)
    pack, _ = executor.hooks(executor.begin(plan))
    return executor, pack


def test_two_views_of_one_kept_storage_count_once_while_either_lives() -> None:
    executor, pack = _keeping_executor()
    base = torch.randn(4, 16, 32)  # 8192 B, saved as a Linear's 2-D input and as a region's input
    first = pack(base.view(64, 32))
    second = pack(base)
    assert executor.snapshot().resident_bytes == 8192 and executor.snapshot().actions["keep"] == 2
    del first  # the storage lives on in the second view: still counted
    assert executor.snapshot().resident_bytes == 8192
    del second
    assert executor.snapshot().resident_bytes == 0


def test_a_kept_slice_counts_all_of_its_storage_once() -> None:
    """Keeping a slice of an activation keeps the whole tensor it is a slice of: a pooler's first
    token (512 B compact) holds all 8192 B of the hidden states, which a later save of the whole
    adds nothing to."""
    executor, pack = _keeping_executor()
    base = torch.randn(4, 16, 32, requires_grad=True) * 1
    first = pack(base[:, 0])
    assert executor.snapshot().resident_bytes == 8192
    handles = [first, pack(base)]
    assert executor.snapshot().resident_bytes == 8192
    del first, handles
    assert executor.snapshot().resident_bytes == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_slices_of_a_fused_projection_count_its_storage_once(dtype: torch.dtype) -> None:
    """q, k and v split from one fused projection, as attention saves them on a GPU: kept, they
    hold the projection once, three times the bytes of each; each slice swapped holds nothing."""
    executor, pack = _keeping_executor()
    qkv = torch.randn(2, 8, 3 * 64).to(dtype).requires_grad_() * 1
    q, k, v = qkv.split(64, dim=-1)
    handles = [pack(q), pack(k), pack(v)]
    assert executor.snapshot().resident_bytes == qkv.nbytes == 3 * q.numel() * q.element_size()
    del handles
    assert executor.snapshot().resident_bytes == 0


def test_keeping_a_second_view_of_a_kept_storage_never_falls_back_under_a_budget() -> None:
    executor, pack = _keeping_executor(budget_bytes=8192 + 100)
    base = torch.randn(4, 16, 32)
    handles = [pack(base.view(64, 32)), pack(base)]
    assert executor.snapshot().actions["keep"] == 2 and executor.snapshot().budget_fallbacks == 0
    handles.append(pack(torch.randn(4, 16, 32)))  # new memory: it would pass the budget
    counters = executor.snapshot()
    assert counters.actions["swap"] == 1 and counters.budget_fallbacks == 1 and counters.resident_bytes == 8192


def test_a_batch_cut_from_data_held_in_memory_counts_its_own_bytes() -> None:
    """A slice of data that needs no gradient (a batch of a dataset held on the device) holds
    nothing the dataset does not hold anyway: its own bytes count, as a tensor of its own would."""
    executor, pack = _keeping_executor()
    dataset = torch.randn(100, 3, 8, 8)
    handles = [pack(dataset[:4])]
    assert executor.snapshot().resident_bytes == 4 * 3 * 8 * 8 * 4
    del handles


def test_a_slice_whose_storage_would_pass_the_budget_falls_back() -> None:
    """Its own 2048 B fit a 4196 B budget; the 6144 B it keeps do not."""
    executor, pack = _keeping_executor(budget_bytes=4096 + 100)
    qkv = torch.randn(8, 3 * 64, requires_grad=True) * 1
    handles = [pack(qkv[:, :64])]
    counters = executor.snapshot()
    assert counters.actions["swap"] == 1 and counters.budget_fallbacks == 1 and counters.resident_bytes == 0
    handles.append(pack(torch.randn(8, 64)))  # 2048 B of its own storage: kept
    assert executor.snapshot().resident_bytes == 2048 and executor.snapshot().actions["keep"] == 1
    del handles


def _provisional(fraction: float | None) -> tuple[Executor, Any, Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]]:
    """An executor following compress-keep's first profile: keep first, each tensor's smallest
    coding past the budget; under ``fraction`` of none's peak not resolved yet (``None``: no budget)."""
    executor = Executor(torch.device("cpu"), backend="cpu", prefetch_bytes=0)
    plan = Plan(policy="compress-keep", epoch=0, default_action=Action.KEEP, fallback_action=Action.ZVC_KEEP, raw_unless_smaller=True,
                provisional_budget=None if fraction is None else cswap.MemoryBudget(fraction=fraction))
    it = executor.begin(plan)
    pack, unpack = executor.hooks(it)
    return executor, it, pack, unpack


def _saves(seed: int) -> list[torch.Tensor]:
    """What a transformer block saves, in small: a dropout mask, half-zero activations, a dense one."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(64, 64, generator=g)
    return [torch.rand(64, 64, generator=g) > 0.1, torch.relu(torch.randn(64, 64, generator=g)), dense, dense.to(torch.bfloat16)]


@pytest.mark.parametrize("fraction", [0.9, 0.75])
def test_a_fraction_not_resolved_yet_holds_against_the_most_plain_pytorch_held_so_far(fraction: float) -> None:
    """Before a fraction of none's peak has bytes, each pack's budget is that fraction of the most
    the saved tensors have held at once as plain PyTorch holds them, a lower bound of none's peak:
    resident bytes stay within it at every pack, the tensors read back bit for bit. The budget
    never falls when tensors die, as none's peak does not."""
    executor, it, pack, unpack = _provisional(fraction)
    saved, handles, plain = [], [], 0
    for tensor in _saves(0) + _saves(1):
        handles.append(pack(tensor))
        saved.append(tensor)
        plain += tensor.numel() * tensor.element_size()
        assert it.plain_peak_bytes == plain
        assert it.budget_bytes == math.floor(fraction * plain)
        assert executor.counters.resident_bytes <= it.budget_bytes, (executor.counters.resident_bytes, it.budget_bytes)
    assert executor.counters.actions["zvc-keep"] > 0
    assert_bit_equal(saved, [unpack(h) for h in handles], "read back")
    peak = it.plain_peak_bytes
    del handles[:4], saved[:4]
    handles.append(pack(torch.zeros(8, 8)))  # packed after the first block's tensors died
    assert it.plain_peak_bytes == peak and it.budget_bytes == math.floor(fraction * peak)
    assert executor.counters.resident_bytes <= it.budget_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_fraction_not_resolved_yet_counts_a_storage_saved_as_several_views_once(dtype: torch.dtype) -> None:
    """A scan saves one slice of a storage per step (Mamba's reference path, Falcon-H1's): plain
    PyTorch holds the whole storage once, as none's peak counts it, from its first view until its
    last view dies, and a later save of the whole adds nothing; a new storage counts on its own.
    Counted per view, the budget rose past the fraction of none's peak (Falcon-H1's first profile
    held 0.5 of 1.06 of it: 4% over the bytes it then resolved to)."""
    executor, it, pack, unpack = _provisional(0.5)
    g = torch.Generator().manual_seed(0)
    scan = torch.randn(8, 64, 32, generator=g).to(dtype).requires_grad_() * 1  # a step per row of the second dimension
    storage = scan.numel() * scan.element_size()
    slices = [scan[:, step] for step in range(16)]
    handles = [pack(view) for view in slices]
    assert it.plain_peak_bytes == storage and it.budget_bytes == storage // 2
    whole = pack(scan)
    assert it.plain_peak_bytes == storage
    other = torch.randn(8, 32, generator=g).to(dtype)
    handles.append(pack(other))
    assert it.plain_peak_bytes == storage + other.numel() * other.element_size()
    assert_bit_equal([*slices, scan, other], [unpack(h) for h in [*handles[:16], whole, handles[16]]], "read back")
    del handles[1:], whole
    executor.snapshot()  # drains the releases: the first view alone still holds the storage
    assert executor._plain_bytes == storage
    del handles
    executor.snapshot()
    assert executor._plain_bytes == 0 and not executor._plain_storages


def test_a_fraction_compressing_cannot_hold_stores_every_tensor_by_its_smallest_coding() -> None:
    executor, it, pack, unpack = _provisional(0.3)
    saved = _saves(0)
    handles = [pack(tensor) for tensor in saved]
    raw = sum(t.numel() * t.element_size() for t in saved)
    assert it.budget_bytes == math.floor(0.3 * raw) < executor.counters.resident_bytes < raw
    assert executor.counters.actions["zvc-keep"] == len(saved) and executor.counters.actions["keep"] == 0
    assert_bit_equal(saved, [unpack(h) for h in handles], "read back")


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_a_fraction_compressing_what_it_kept_leaves_a_complex_tensor_raw(dtype: torch.dtype) -> None:
    """DeepSeek-V2 saves its rotary frequencies as a complex tensor, which no codec takes: kept first,
    it stays raw when a newer tensor needs room, and the others are compressed (ZVC raised
    ``TypeError`` on it, and the step plain PyTorch runs failed)."""
    executor, it, pack, unpack = _provisional(0.3)
    g = torch.Generator().manual_seed(0)
    frequencies = torch.polar(torch.ones(64, 32, dtype=torch.float64), torch.rand(64, 32, generator=g, dtype=torch.float64)).to(dtype)
    saved = _saves(0)
    handles = [pack(frequencies), *(pack(tensor) for tensor in saved)]
    assert executor.counters.actions["keep"] == 1 and executor.counters.actions["zvc-keep"] == len(saved)
    assert it.compacts and executor.counters.resident_bytes < sum(t.numel() * t.element_size() for t in [frequencies, *saved])
    back = [unpack(h) for h in handles]
    assert torch.equal(torch.view_as_real(back[0]), torch.view_as_real(frequencies))
    assert_bit_equal(saved, back[1:], "read back")


def test_without_a_budget_the_keep_first_profile_keeps_every_tensor() -> None:
    executor, it, pack, _ = _provisional(None)
    handles = [pack(tensor) for tensor in _saves(0)]
    assert it.budget_bytes is None and it.plain_peak_bytes == 0 and not it.compacts
    assert executor.counters.actions["keep"] == len(handles) and executor.counters.actions["zvc-keep"] == 0


def test_counting_a_rebuilt_tensor_first_takes_off_the_rebuilt_ones_that_died() -> None:
    # One layer's rebuilt tensors die in its backward; the next layer's recomputation counts its own
    # with no pack or fetch between (a plan with nothing to prefetch): the peak is not both at once.
    executor = Executor(torch.device("cpu"), backend="cpu", prefetch_bytes=0)
    it = executor.begin(Plan(policy="none", epoch=0, default_action=Action.KEEP))
    counters = executor.counters
    first, second = torch.randn(64), torch.randn(1000)  # two storages alive at once: two addresses
    executor.hold_rebuilt(it, first)
    del first
    executor.hold_rebuilt(it, second)
    assert counters.resident_bytes == counters.peak_resident_bytes == 4000


def test_a_rebuilt_storage_is_counted_until_it_dies_even_when_a_new_one_takes_its_address_first() -> None:
    # A recomputation's saved storage is counted resident until its death is drained; a new one
    # may take the dead one's address before that, and must neither be taken for it nor leave
    # the dead one's bytes counted.
    executor = Executor(torch.device("cpu"), backend="cpu", prefetch_bytes=0)
    it = executor.begin(Plan(policy="none", epoch=0, default_action=Action.KEEP))
    counters = executor.counters
    reused = 0
    for _ in range(20):
        first = torch.randn(64)
        address = first.untyped_storage()._cdata
        executor.hold_rebuilt(it, first)
        executor.hold_rebuilt(it, first[8:])  # another view of the same storage: counted once
        assert counters.resident_bytes == 256
        del first
        second = torch.randn(64)
        reused += second.untyped_storage()._cdata == address
        executor.hold_rebuilt(it, second)  # before any drain
        assert counters.resident_bytes in (256, 512)  # the dead one's bytes taken off now if its address is reused
        executor._drain()
        assert counters.resident_bytes == 256
        del second
        executor._drain()
        assert counters.resident_bytes == 0
    assert reused, "no new storage took a dead one's address: the case under test never happened"
    executor.hold_rebuilt(it, kept := torch.randn(16))
    executor.release_rebuilt()  # the iteration is over: what still holds it is not its backward
    assert counters.resident_bytes == 0
    del kept
    executor._drain()  # its death, told after the release, takes nothing twice
    assert counters.resident_bytes == 0


def test_room_is_made_for_what_a_rebuild_spans_not_only_its_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compressed slice (``a[:, 0]`` of a ``4 x 16 x 32`` tensor, 512 bytes) is rebuilt with its
    strides, spanning 6,272 bytes: under a budget with a fallback that moves tensors, the room made
    before its rebuild is for those bytes, or the rebuild passes a budget the room was made within."""
    from cswap.execute.layout import Layout

    executor = Executor(torch.device("cpu"), backend="cpu", prefetch_bytes=0)
    plan = Plan("compress-keep", 0, Action.ZVC_KEEP, budget_bytes=1 << 30, fallback_action=Action.SWAP)
    it = executor.begin(plan)
    asked: list[int] = []
    monkeypatch.setattr(executor, "_make_room", lambda it, nbytes: asked.append(nbytes))
    x = torch.randn(4, 16, 32, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(*executor.hooks(it)):
        sliced = x.tanh()[:, 0]
        (sliced * sliced).sum().backward()
    executor.end(it)
    spanned = Layout.of(torch.zeros(4, 16, 32)[:, 0]).rebuilt_nbytes
    assert spanned == 6272 and spanned in asked and 512 not in asked, asked
    plain = x.detach().clone().requires_grad_()
    plain_sliced = plain.tanh()[:, 0]
    (plain_sliced * plain_sliced).sum().backward()
    assert_bit_equal([plain.grad], [x.grad], "gradient")


def test_backward_makes_room_by_moving_a_compressed_keep_to_the_host() -> None:
    """Under a budget whose fallback swaps (compress-keep once a plan met it), a rebuild that would
    pass the budget first moves the compressed buffers kept on the device, saved first first, to the
    host: they are read back from there as zvc-swap, bit for bit, and the budget holds."""
    def chain(x: torch.Tensor) -> torch.Tensor:
        h = x
        for scale in (1.0, 1.5, 1.3, 1.2):
            h = F.relu(h * scale - 0.1)
        return (h * h).sum()

    x = torch.randn(8192, generator=torch.Generator().manual_seed(3)).requires_grad_()
    plain = x.detach().clone().requires_grad_()
    chain(plain).backward()

    def run(budget_bytes: int | None) -> tuple[Executor, torch.Tensor, int]:
        executor = Executor(torch.device("cpu"), backend="cpu", prefetch_bytes=0)
        plan = Plan("compress-keep", 0, Action.ZVC_KEEP, budget_bytes=budget_bytes, fallback_action=Action.SWAP)
        it = executor.begin(plan)
        leaf = x.detach().clone().requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(*executor.hooks(it)):
            loss = chain(leaf)
        forward_bytes = executor.counters.resident_bytes
        loss.backward()
        executor.end(it)
        return executor, leaf.grad, forward_bytes

    free, grad, forward_bytes = run(None)
    assert free.counters.actions["zvc-keep"] == 4 and free.counters.budget_evictions == 0
    assert_bit_equal([plain.grad], [grad], "gradient")
    budget = forward_bytes + x.nbytes // 4  # the compressed keeps, and room for a quarter of a rebuild
    assert free.counters.iteration_peak_resident_bytes > budget
    held, grad, _ = run(budget)
    counters = held.counters
    assert counters.budget_evictions > 0 and counters.actions["zvc-swap"] == counters.budget_evictions, dict(counters.actions)
    assert counters.iteration_peak_resident_bytes <= budget
    assert_bit_equal([plain.grad], [grad], "gradient")


@pytest.mark.parametrize("grown_length", [12, 16])
def test_a_rebuild_past_its_planned_sizes_makes_room_for_its_grown_scores(grown_length: int) -> None:
    """A step at a longer sequence than planned: before a region rebuilds, kept tensors move to the
    host until the rebuild fits at the sizes the packs grew to. An attention's scores, rebuilt
    inside the region and never packed outside it, grow with the square of the sequence, past the
    growth of any pack (a BERT's passed the budget by 1.5% at 112 tokens, planned at 96, when the
    rebuild was taken to grow as much as the packs)."""
    planned_length, width = 8, 16
    planned = (2, planned_length, width)
    plan_nbytes = 2 * planned_length * width * 4
    decisions = {k: Decision(key=k, shape=planned, dtype="float32", nbytes=plan_nbytes, sparsity=0.0, action=Action.KEEP,
                             reason="fits", planned=True) for k in range(4)}
    scores = (2, 4, planned_length, planned_length)
    rebuild = ((scores, 4 * math.prod(scores)),)
    grown_scores_bytes = 4 * 2 * 4 * grown_length * grown_length
    kept_bytes = 4 * 2 * grown_length * width * 4
    budget = kept_bytes + grown_scores_bytes - 1  # one kept tensor must move for the grown scores
    executor = Executor(torch.device("cpu"), backend="cpu", prefetch_bytes=0)
    plan = Plan("recompute", 0, Action.KEEP, decisions=decisions, budget_bytes=budget, fallback_action=Action.SWAP)
    it = executor.begin(plan)
    pack, unpack = executor.hooks(it)
    handles = [pack(torch.randn(2, grown_length, width)) for _ in range(4)]
    assert executor.counters.resident_bytes == kept_bytes and it.growth == grown_length / planned_length
    linear = math.ceil(rebuild[0][1] * it.growth)
    assert executor.counters.resident_bytes + linear <= budget < executor.counters.resident_bytes + grown_scores_bytes
    executor.make_room_to_recompute(it, rebuild)
    assert executor.counters.resident_bytes + grown_scores_bytes <= budget
    assert executor.counters.budget_evictions >= 1
    for handle in handles:
        unpack(handle)
    executor.end(it)
