"""The plan is the only decision: Plan.resolve covers every pack, the executor carries it out, and
rt.plan()'s rows are what the executor did, also for keys the profile never saw."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import cswap
from cswap.codecs.launch import CpuLaunch
from cswap.execute.executor import Executor
from cswap.execute.stored import Stored
from cswap.planner.plan import Action, Decision, LaunchCache, Plan
from tests.runtime.helpers import FAST_CODEC, SLOW_LINK, one_thread_below_1mib

MIN_BYTES = 4096


class Mixed(nn.Module):
    """Saves parameters (the Linears' weights), tensors below MIN_BYTES, a complex tensor (no ZVC
    encoding) and, with ``extra``, more tensors that shift every later key (a changed graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
        self.head = nn.Linear(256, 4)

    def forward(self, x: torch.Tensor, extra: bool = False) -> torch.Tensor:
        h = self.features(x)
        if extra:
            h = torch.tanh(h) * h.sigmoid()
        small = h[:, :8].sigmoid()  # 1 KiB: below MIN_BYTES
        z = torch.complex(h, h.flip(1)).abs()  # abs saves its complex64 input
        return self.head(h + z) + small.sum(1, keepdim=True)


def _executed(monkeypatch: pytest.MonkeyPatch) -> dict[int, Action]:
    """Per key, the action the executor carried out in the latest iteration (whichever pack hook
    took it: a planned iteration's lean one or the general one)."""
    done: dict[int, Action] = {}
    original = Executor.hooks

    def spy(self: Executor, it: Any) -> Any:
        pack, unpack = original(self, it)

        def spied(tensor: torch.Tensor) -> Any:
            key = it.next_key
            handle = pack(tensor)
            if key == 0:
                done.clear()
            if isinstance(handle, torch.Tensor):  # a parameter the planned pack keeps is its own handle
                stored = None
            else:
                stored = handle if isinstance(handle, Stored) else handle.stored
            # A never-moved tensor is held as it is: kept.
            done[key] = stored.action if stored is not None else Action.KEEP
            return handle

        return spied, unpack

    monkeypatch.setattr(Executor, "hooks", spy)
    return done


def _step(rt: cswap.Runtime, model: nn.Module, x: torch.Tensor, extra: bool) -> list[torch.Tensor]:
    with rt.iteration():
        model(x, extra).square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return grads


def _plain(model: nn.Module, x: torch.Tensor, extra: bool) -> list[torch.Tensor]:
    model(x, extra).square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return grads


@pytest.mark.parametrize("policy", ["swap", "compress-swap", "cswap", "compress-keep"])
def test_every_executed_action_is_the_plan_row_for_its_key(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = Mixed()
    options: dict[str, Any] = {"device": "cpu", "min_bytes": MIN_BYTES, "model": model, "launch_lookup": one_thread_below_1mib, **SLOW_LINK}
    if policy == "cswap":
        options["time_model"] = FAST_CODEC
    rt = cswap.Runtime(policy, **options)
    done = _executed(monkeypatch)
    x = torch.randn(32, 64)
    reasons: set[str] = set()
    # profile, follow, change the graph (its unknown keys are decided at run time, then it is
    # profiled again), follow the new plan, change back (to the first graph's plan, kept), follow it
    for extra in (False, False, True, True, True, False, False):
        profiled, changes, plan = rt.stats().profiled_iterations, rt.stats().graph_changes, rt.plan()
        grads = _step(rt, model, x, extra)
        for expected, got in zip(_plain(model, x, extra), grads, strict=True):
            assert torch.equal(expected, got)
        rows = rt.plan().rows()
        if rt.stats().profiled_iterations > profiled or rt.plan() is not plan:
            continue  # a profiling iteration ran before the plan it made existed, or ran under the plan before
        assert done and set(done) <= set(rows)
        for key, action in done.items():
            assert rows[key].action is action, (key, rows[key])
            reasons.add(rows[key].reason)
        if rt.stats().graph_changes > changes:
            assert any(not rows[key].planned for key in done)  # the graph its plan was not made for
        else:
            assert all(rows[key].planned for key in done)
    # to the extra graph; back to the first is a graph profiled before, whose plan is taken again
    assert rt.stats().graph_changes == 1 and rt.stats().structures == 2
    assert any(r.startswith("below min_bytes") for r in reasons)
    assert any("parameter" in r for r in reasons)
    if policy != "swap":
        assert any("complex64 has no ZVC encoding" in r for r in reasons)
    assert rt.stats().unknown_keys > 0


def test_resolve_covers_every_case_and_rows_show_it() -> None:
    asked: list[tuple[str, str, torch.dtype, int]] = []

    def lookup(backend: str, op: str, dtype: torch.dtype, nbytes: int) -> CpuLaunch:
        asked.append((backend, op, dtype, nbytes))
        return CpuLaunch(threads=1)

    planned = Decision(key=0, shape=(1024,), dtype="float32", nbytes=4096, sparsity=0.5, action=Action.ZVC_SWAP, reason="planned")
    plan = Plan(policy="compress-swap", epoch=0, default_action=Action.ZVC_SWAP, decisions={0: planned}, min_bytes=1024,
                launches=LaunchCache("cpu", lookup))
    assert plan.resolve(0, (1024,), torch.float32, 4096) is planned
    # A changed graph: the same key with another shape gets the policy's default, with its launch configs.
    moved = plan.resolve(0, (2048,), torch.float32, 8192)
    assert (moved.action, moved.planned, moved.compress_launch) == (Action.ZVC_SWAP, False, CpuLaunch(threads=1))
    assert asked == [("cpu", "compress", torch.float32, 8192), ("cpu", "decompress", torch.float32, 8192)]
    assert plan.rows()[0] is moved
    assert plan.resolve(1, (8,), torch.float32, 32).reason == "below min_bytes (32 < 1,024 B)"
    complex_row = plan.resolve(2, (1024,), torch.complex64, 8192)
    assert (complex_row.action, complex_row.reason) == (Action.SWAP, "dtype complex64 has no ZVC encoding: swap uncompressed")
    param = plan.resolve(3, (1024,), torch.float32, 4096, never_moved="parameter or buffer of the model: never offloaded")
    assert (param.action, param.reason) == (Action.KEEP, "parameter or buffer of the model: never offloaded")
    duplicate = plan.resolve(4, (1024,), torch.float32, 4096, duplicate_of=complex_row)
    assert (duplicate.action, duplicate.reason) == (Action.SWAP, "duplicate of key 2: stored once")
    assert [d.action.value for d in plan.rows().values()] == ["zvc-swap", "keep", "swap", "keep", "swap"]
    assert plan.to_dict()["decisions"][3]["reason"] == param.reason
    # The profiled graph again: the planned decision is the row again.
    assert plan.resolve(0, (1024,), torch.float32, 4096) is planned
    assert plan.rows()[0] is planned


@pytest.mark.parametrize("action", (Action.KEEP, Action.ZVC_KEEP, Action.SWAP))
@pytest.mark.parametrize("budget_bytes", (None, 8192))
@pytest.mark.parametrize("slack_bytes", (None, 0, 1500, -1))
@pytest.mark.parametrize("expected_bytes", (None, 2000))
def test_the_keep_limit_is_where_resolve_starts_to_fall_back(action: Action, budget_bytes: int | None, slack_bytes: int | None,
                                                             expected_bytes: int | None) -> None:
    # The planned pack hook compares the resident bytes with the limit made once per plan,
    # instead of resolving: both must agree at every resident count, on both sides of each bound.
    planned = Decision(key=0, shape=(1024,), dtype="float32", nbytes=4096, sparsity=0.0, action=action, reason="planned",
                       compressed_nbytes=3000.0, planned=True, slack_bytes=slack_bytes)
    plan = Plan(policy="cswap", epoch=0, default_action=Action.SWAP, decisions={0: planned}, budget_bytes=budget_bytes,
                fallback_action=Action.SWAP, expected_bytes={} if expected_bytes is None else {0: expected_bytes})
    limit = plan.keep_limit_bytes(planned)
    if budget_bytes is None or action is Action.SWAP:
        assert limit is None
    held = 3000 if action is Action.ZVC_KEEP else 4096  # a zvc-keep holds its compressed bytes
    for resident in (0, 1998, 1999, 2000, 3500, 3501, 4096, 4097, 5192, 5193, 8192, 9000):
        drift = resident - expected_bytes if expected_bytes is not None else 0
        rule = budget_bytes is None or action is Action.SWAP or (
            resident + held <= budget_bytes and (slack_bytes is None or drift <= slack_bytes))
        stands = plan.resolve(0, (1024,), torch.float32, 4096, resident_bytes=resident) is planned
        assert stands == rule == (limit is None or resident <= limit) == plan.keeps_within_budget(planned, resident), resident


@pytest.mark.parametrize("planned_action", (Action.KEEP, Action.ZVC_KEEP, Action.SWAP))
def test_a_planned_decision_under_a_budget_is_still_checked_against_it(planned_action: Action) -> None:
    planned = Decision(key=0, shape=(1024,), dtype="float32", nbytes=4096, sparsity=0.0, action=planned_action, reason="planned",
                       compressed_nbytes=4096.0, planned=True)
    plan = Plan(policy="cswap", epoch=0, default_action=Action.SWAP, decisions={0: planned}, budget_bytes=8192,
                fallback_action=Action.SWAP)
    assert plan.resolve(0, (1024,), torch.float32, 4096, resident_bytes=0) is planned  # room for it
    late = plan.resolve(0, (1024,), torch.float32, 4096, resident_bytes=6000)
    if planned_action is Action.SWAP:
        assert late is planned  # it leaves the device: the budget cannot object
    else:
        assert (late.action, late.budget_fallback, late.planned) == (Action.SWAP, True, False)
        assert plan.rows()[0] is late
    assert plan.resolve(0, (1024,), "float32", 4096) is planned  # a dtype given by name matches too
    assert plan.rows()[0] is planned


def test_a_decision_made_at_run_time_encodes_by_the_planned_codec_with_its_launches() -> None:
    """A longer sequence than profiled (an outgrown key) and a budget fallback to a compressing
    action take the codec the profile sized the tensor with, and that codec's own launch configs:
    ZVC's would run an exponent coder with ZVC's tuning, and ZVC on a dense float moves more bytes
    than the tensor has."""

    def lookup(backend: str, op: str, dtype: torch.dtype, nbytes: int, codec: str = "zvc") -> CpuLaunch:
        return CpuLaunch(threads=2 if codec == "exponent" else 1)

    coded = Decision(key=0, shape=(4, 64), dtype="bfloat16", nbytes=512, sparsity=0.0, action=Action.ZVC_SWAP, reason="planned",
                     codec="exponent")
    kept = Decision(key=1, shape=(4, 64), dtype="bfloat16", nbytes=512, sparsity=0.0, action=Action.KEEP, reason="planned",
                    codec="exponent")
    plan = Plan(policy="compress-swap", epoch=0, default_action=Action.ZVC_SWAP, decisions={0: coded, 1: kept}, budget_bytes=1024,
                fallback_action=Action.ZVC_SWAP, launches=LaunchCache("cpu", lookup))
    longer = plan.resolve(0, (4, 96), torch.bfloat16, 768)
    assert (longer.outgrown, longer.codec, longer.compress_launch, longer.decompress_launch) == (
        True, "exponent", CpuLaunch(threads=2), CpuLaunch(threads=2))
    fallback = plan.resolve(1, (4, 64), torch.bfloat16, 512, resident_bytes=1000)
    assert (fallback.action, fallback.budget_fallback, fallback.codec, fallback.compress_launch) == (
        Action.ZVC_SWAP, True, "exponent", CpuLaunch(threads=2))


@pytest.mark.parametrize(("dtype", "codec"), [("bfloat16", "exponent"), ("bool", "bitpack"), ("uint8", "zvc"), ("float64", "zvc")])
@pytest.mark.parametrize("budget_bytes", [None, 1 << 20])
def test_a_key_the_plan_does_not_know_takes_the_codec_its_dtype_took(dtype: str, codec: str, budget_bytes: int | None) -> None:
    """A tensor no profile saw (a changed graph) is compressed by the codec most of its dtype's
    planned bytes took, with that codec's launches, where that codec takes every value of the
    dtype; otherwise by ZVC (bit-packing takes a uint8 tensor only when it holds 0s and 1s)."""

    asked: list[tuple[str, str]] = []

    def lookup(backend: str, op: str, dtype: torch.dtype, nbytes: int, codec: str = "zvc") -> CpuLaunch:
        asked.append((op, codec))
        return CpuLaunch(threads=1)

    plan = Plan(policy="compress-swap", epoch=0, default_action=Action.ZVC_SWAP, launches=LaunchCache("cpu", lookup),
                budget_bytes=budget_bytes, fallback_action=Action.ZVC_SWAP if budget_bytes else None,
                unseen_codecs={"bfloat16": "exponent", "bool": "bitpack"})
    unseen = plan.resolve(7, (4, 64), getattr(torch, dtype), 512)
    assert (unseen.planned, unseen.action, unseen.codec, unseen.compress_launch) == (False, Action.ZVC_SWAP, codec, CpuLaunch(threads=1))
    assert asked == [("compress", codec), ("decompress", codec)]
    assert plan.rows()[7].codec == codec and plan.to_dict()["unseen_codecs"] == {"bfloat16": "exponent", "bool": "bitpack"}


def test_the_codec_an_unseen_key_takes_follows_the_profile() -> None:
    """The advisor and the budget planner name, per dtype, the codec that coded most of its bytes:
    exponent coding for dense bf16, bit-packing for bool masks, ZVC for a sparse post-ReLU float."""
    from cswap.budget import MemoryBudget
    from cswap.planner.advisor import Advisor
    from cswap.planner.budgeted import budget_plan
    from cswap.profile.trace import TensorRecord, Trace

    itemsize = {"bfloat16": 2, "bool": 1, "float32": 4}
    facts = [("bfloat16", 1 << 16, 0.0, "exponent", 0.7), ("bool", 1 << 14, 0.1, "bitpack", 0.125),
             ("float32", 1 << 16, 0.6, "exponent", 0.8), ("bfloat16", 1 << 12, 0.9, "exponent", 0.6)]
    records = tuple(
        TensorRecord(key=k, shape=(nbytes // itemsize[dtype],), dtype=dtype, nbytes=nbytes, sparsity=sparsity, codec=codec,
                     codec_fraction=fraction, pack_at_s=0.1 * k, unpack_at_s=1.0 + 0.1 * (len(facts) - 1 - k))
        for k, (dtype, nbytes, sparsity, codec, fraction) in enumerate(facts)
    )
    trace = Trace(tensors=records, d2h_gbps=10.0, h2d_gbps=10.0, forward_s=0.4, backward_s=0.4)
    want = {"bfloat16": "exponent", "bool": "bitpack"}  # the sparse float32 takes ZVC, the default
    assert dict(Advisor("compress-swap", "cpu", 0).plan(trace, 1).unseen_codecs) == want
    plan, _, error = budget_plan(trace, "compress-swap", MemoryBudget(nbytes=140_000), FAST_CODEC, "cpu", 0, epoch=1)
    assert error is None and dict(plan.unseen_codecs) == want
    unseen = plan.resolve(9, (64,), torch.bfloat16, 128, resident_bytes=140_000)  # the budget is full: it falls back, coded
    assert (unseen.action, unseen.codec) == (Action.ZVC_SWAP, "exponent")
