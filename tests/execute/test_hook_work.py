"""What the hooks do per saved tensor, and what they do once per plan instead.

The model's parameters are walked once per plan, not once per iteration; a contiguous, aligned
tensor is copied to the host with its own shape and strides and rebuilt by one copy, exactly; what
the executor tracks for stored data and for tensors handed back to backward is released when they
die, without scans, so its tables do not grow over iterations; and a rebuilt tensor someone keeps
counts as resident until its storage is freed. Once planned, an iteration's lean hooks do what the
general ones do, fetch a tensor saved twice once, and never take a new storage for a dead one.
"""

from __future__ import annotations

import functools
import gc
import threading
import weakref

import pytest
import torch

from cswap.execute.executor import Executor
from cswap.execute.streams import Transfers
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


# ------------------------------------------------------------------ the planned iteration's hooks


def _blocks(count: int = 4, width: int = 32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU()) for _ in range(count)))


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


_COUNTED = ("packed_tensors", "deduplicated_tensors", "never_moved_tensors", "kept_bytes", "offloaded_bytes", "transferred_bytes",
            "unknown_keys", "budget_fallbacks")


@pytest.mark.parametrize(("policy", "budget"), (("swap", None), ("cswap", None), ("swap", 0.5), ("cswap", 0.5), ("none", None)))
def test_the_planned_hooks_do_what_the_general_ones_do(policy: str, budget: float | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under one plan, an iteration with the lean hooks stores every tensor as one with the
    general hooks does: the same actions and plan rows, the same counts and bytes, the same peak
    of resident bytes, and plain PyTorch's gradients."""
    x = torch.randn(8, 32)
    plain = _blocks()
    _step(plain, x)
    model = _blocks()
    rt = make_runtime(policy, model=model, memory_budget=budget)
    for _ in range(2):
        with rt.iteration():
            _step(model, x)
    plan = rt.plan()

    def iteration() -> tuple[dict[str, object], dict[int, tuple[str, bool]]]:
        before = rt.stats()
        with rt.iteration():
            _step(model, x)
        after = rt.stats()
        assert rt.plan() is plan
        for got, want in zip(_grads(model), _grads(plain)):
            assert torch.equal(got, want)
        delta: dict[str, object] = {name: getattr(after, name) - getattr(before, name) for name in _COUNTED}
        delta["actions"] = {action: after.actions[action] - before.actions[action] for action in after.actions}
        delta["iteration_peak_resident_bytes"] = after.iteration_peak_resident_bytes
        return delta, {key: (d.action.value, d.planned) for key, d in plan.rows().items()}

    general_packs = []
    with monkeypatch.context() as patch:
        original = Executor.pack
        patch.setattr(Executor, "pack", lambda self, it, tensor: general_packs.append(1) or original(self, it, tensor))
        lean = iteration()
    if policy == "swap":
        assert not general_packs  # every pack of a swap plan takes the lean path (compressions do not)
    with monkeypatch.context() as patch:
        patch.setattr(Executor, "hooks", lambda self, it: (functools.partial(self.pack, it), functools.partial(self.unpack, it)))
        general = iteration()
    assert lean == general
    assert lean[0]["packed_tensors"] == 3 * 4 - 1 or policy == "none"  # weight view, input, ReLU output per block


class _CountingLock:
    """An ``RLock`` that counts how often it is taken."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.taken = 0

    def acquire(self, *args: object) -> bool:
        self.taken += 1
        return self._lock.acquire(*args)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> _CountingLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@pytest.mark.parametrize("budget", (None, 0.5))
def test_a_cpu_runtime_locks_its_hooks_only_once_a_tensor_of_another_device_is_saved(budget: float | None) -> None:
    """On a CPU runtime every hook runs on the calling thread, so the planned hooks take no lock;
    a tensor saved on another device may have its unpacks run on that device's thread as well, so
    from then on the planned unpacks of stored tensors take it, and gradients stay plain PyTorch's.
    A swap plan, whose every pack takes the planned path (a compression's takes the general one,
    which locks)."""
    x = torch.randn(8, 32)
    plain = _blocks()
    _step(plain, x)
    model = _blocks()
    rt = make_runtime("swap", model=model, memory_budget=budget)
    for _ in range(2):
        with rt.iteration():
            _step(model, x)

    def iteration(other_device: bool) -> tuple[int, int]:
        lock = rt._executor._lock = _CountingLock()  # type: ignore[assignment]
        before = rt.stats()
        with rt.iteration():
            model.zero_grad(set_to_none=True)
            roots = [model(x).sum()]
            if other_device:  # saved last, so that the model's packs keep their planned keys
                roots.append(torch.ones(4, device="meta", requires_grad=True).exp().sum())
            torch.autograd.backward(roots)
        for got, want in zip(_grads(model), _grads(plain)):
            assert torch.equal(got, want)
        after = rt.stats()
        stored = (after.packed_tensors - before.packed_tensors) - (after.never_moved_tensors - before.never_moved_tensors)
        return lock.taken, stored

    taken_alone, stored = iteration(other_device=False)
    assert stored >= 8 and taken_alone < 8  # the iteration's begin and end, never per saved tensor
    taken, _ = iteration(other_device=True)
    assert taken - taken_alone >= stored  # every unpack of a stored tensor (the meta one's pack too)


def test_a_deduplicated_swap_is_rebuilt_once_per_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ReLU's output is saved twice (by the ReLU and by the next Linear) and read twice in
    backward, with the first rebuilt copy freed between: it is fetched from the host once."""
    model = _blocks(count=6)
    x = torch.randn(8, 32)
    rt = make_runtime("swap", model=model)
    for _ in range(2):
        with rt.iteration():
            _step(model, x)
    fetches = []
    original = Transfers.fetch
    monkeypatch.setattr(Transfers, "fetch", lambda self, stored: fetches.append(stored.key) or original(self, stored))
    before = rt.stats()
    with rt.iteration():
        _step(model, x)
    after = rt.stats()
    stored = after.actions["swap"] - before.actions["swap"]
    assert after.deduplicated_tensors - before.deduplicated_tensors >= 5  # every ReLU output but the last
    assert len(fetches) == len(set(fetches)) == stored


@pytest.mark.parametrize("planned", (False, True), ids=("profiling", "planned"))
def test_an_entry_of_another_storage_is_not_taken_for_a_duplicate(planned: bool) -> None:
    """Deduplication keys on the storage's address, which a new storage may take once a swapped
    tensor's storage has died (a swap does not keep it alive): an entry whose storage is not this
    tensor's, found under its key, is not taken for it; the tensor is stored anew."""
    x = torch.randn(64, requires_grad=True)
    rt = make_runtime("swap")

    def fn(inject: bool) -> torch.Tensor:
        a = x * 2
        first = a.sin()  # stores a
        c = x * 3
        if inject:  # as if c's storage had taken a's address after a died
            executor = rt._executor
            (entry,) = [ref() for ref in executor._dedupe.values()]
            key = (c.untyped_storage()._cdata, c.storage_offset(), tuple(c.shape), tuple(c.stride()), c.dtype, c._version)
            executor._dedupe[key] = weakref.ref(entry)
        return first.sum() + c.sin().sum()

    fn(inject=False).backward()
    want = x.grad.clone()
    for _ in range(2 if planned else 0):
        with rt.iteration():
            fn(inject=False).backward()
    x.grad = None
    before = rt.stats()
    with rt.iteration():
        fn(inject=True).backward()
    after = rt.stats()
    assert after.deduplicated_tensors == before.deduplicated_tensors
    assert after.actions["swap"] - before.actions["swap"] == 2
    assert torch.equal(x.grad, want)
