"""The advisor: plans and their reasons per policy, T and T' behind each cswap decision, the logistic
decider, launch lookups, and re-planning each epoch from the new sparsity."""

from __future__ import annotations

import pytest
import torch

import cswap
from cswap.codecs import zvc_compressed_nbytes
from cswap.codecs.launch import CpuLaunch
from cswap.planner.advisor import Action, Advisor, Plan
from cswap.planner.costmodel import decide
from cswap.profile.codec_speed import CodecSpeed, OpSpeed
from cswap.profile.trace import TensorRecord, Trace

MIB = 1 << 20


def _record(key: int, nbytes: int = 4 * MIB, dtype: str = "float32", sparsity: float = 0.5, **fields) -> TensorRecord:
    itemsize = {"float32": 4, "bfloat16": 2, "int64": 8, "complex64": 8, "bool": 1}[dtype]
    fields.setdefault("unpack_at_s", 10.0 - key)
    return TensorRecord(key=key, shape=(nbytes // itemsize,), dtype=dtype, nbytes=nbytes, sparsity=sparsity, **fields)


TRACE = Trace(
    tensors=(
        _record(0, sparsity=0.9, hidden_forward_s=0.0, hidden_backward_s=0.0),
        _record(1, offloadable=False),  # a parameter
        _record(2, nbytes=1024),  # below min_bytes
        _record(3, dtype="complex64"),  # no ZVC encoding
        _record(4, dtype="int64", sparsity=0.0, hidden_forward_s=1.0, hidden_backward_s=1.0),
        _record(5, offloadable=False),  # a duplicate of 0
    ),
    meta={"not_offloadable": {"1": "leaf tensor that requires grad (a parameter): never offloaded"}, "duplicates": {"5": 0}},
)

CODEC = CodecSpeed(backend="cpu", compress=OpSpeed(1e-4, 1e-10, 0.0), decompress=OpSpeed(1e-4, 1e-10, 0.0))


def _actions(plan: Plan) -> list[str]:
    return [plan.decisions[k].action.value for k in sorted(plan.decisions)]


@pytest.mark.parametrize(
    "policy, actions, moved_reason",
    [
        ("none", ["keep", "keep", "keep", "keep", "keep", "keep"], "policy none: plain PyTorch"),
        ("swap", ["swap", "keep", "keep", "swap", "swap", "swap"], "policy swap: offload every saved activation (vDNN)"),
        ("compress-swap", ["zvc-swap", "keep", "keep", "swap", "zvc-swap", "zvc-swap"], "policy compress-swap: compress, then offload (cDMA)"),
        ("compress-keep", ["zvc-keep", "keep", "keep", "keep", "zvc-keep", "zvc-keep"], "policy compress-keep: compress and keep on the device (FreeLunch)"),
    ],
)
def test_static_policies_and_their_reasons(policy: str, actions: list[str], moved_reason: str) -> None:
    plan = Advisor(policy=policy, backend="cpu", min_bytes=4096).plan(TRACE, epoch=2)
    assert _actions(plan) == actions
    d = plan.decisions
    assert d[0].reason == moved_reason
    assert d[1].reason == "leaf tensor that requires grad (a parameter): never offloaded"
    assert d[2].reason == "below min_bytes (1,024 < 4,096 B)"
    if policy in ("compress-swap", "compress-keep"):
        assert "complex64 has no ZVC encoding" in d[3].reason
    assert d[5].reason == "duplicate of key 0: stored once"
    assert plan.epoch == 2 and plan.default_action is cswap.planner.advisor.DEFAULT_ACTIONS[policy]
    assert all(x.swap_s is None for x in d.values())  # T and T' only behind cswap decisions


def test_cswap_decisions_carry_t_and_t_prime() -> None:
    advisor = Advisor(policy="cswap", backend="cpu", min_bytes=4096, d2h_gbps=0.5, h2d_gbps=0.5, time_model=CODEC)
    plan = advisor.plan(TRACE, epoch=0)
    assert _actions(plan) == ["zvc-swap", "keep", "keep", "swap", "swap", "zvc-swap"]
    sparse, dense = plan.decisions[0], plan.decisions[4]
    expected = decide(4 * MIB, 0.9, 0.0, 0.0, 0.5, 0.5, CODEC.compress_s(4 * MIB, 0.1, 4, "cpu"), CODEC.decompress_s(4 * MIB, 0.1, 4, "cpu"))
    assert sparse.swap_s == pytest.approx(expected.swap_s) and sparse.compressed_swap_s == pytest.approx(expected.compressed_swap_s)
    assert sparse.compressed_swap_s < sparse.swap_s
    assert sparse.reason.startswith("T=") and "< T'=" in sparse.reason and "compressing saves" in sparse.reason
    # Dense and fully hidden (1 s each way): T' = 0, so a plain swap.
    assert dense.swap_s == 0.0 and dense.compressed_swap_s > 0
    assert ">= T'=" in dense.reason and "plain swap is no slower" in dense.reason
    assert "T=" in str(plan) and plan.to_dict()["decisions"][0]["compressed_swap_s"] == sparse.compressed_swap_s


@pytest.mark.parametrize(("exponent_s_per_byte", "chosen"), [(1e-12, "zvc-swap"), (1e-8, "swap")])
def test_cswap_prices_each_codec_at_its_own_speed(exponent_s_per_byte: float, chosen: str) -> None:
    """A dense bf16 tensor exponent coding shrinks to 0.7: compressed where the codec is fast, a plain
    swap where it is slower than the bytes it saves on the link (ZVC's speed does not decide it)."""
    exponent = OpSpeed(0.0, exponent_s_per_byte, 0.0)
    speed = CodecSpeed(backend="cpu", compress=OpSpeed(0.0, 1e-12, 0.0), decompress=OpSpeed(0.0, 1e-12, 0.0),
                       others=(("exponent", 2, exponent, exponent),))
    advisor = Advisor(policy="cswap", backend="cpu", min_bytes=0, d2h_gbps=1, h2d_gbps=1, time_model=speed)
    record = _record(0, dtype="bfloat16", sparsity=0.0, codec="exponent", codec_fraction=0.7)
    decision = advisor.plan(Trace(tensors=(record,)), 0).decisions[0]
    assert decision.action.value == chosen
    assert decision.compress_s == pytest.approx(exponent.seconds(4 * MIB, 1.0))
    if chosen == "zvc-swap":
        assert decision.codec == "exponent" and decision.compressed_nbytes == pytest.approx(0.7 * 4 * MIB, rel=0.01)


def test_paper_size_option_reaches_the_cost_model() -> None:
    exact = Advisor(policy="cswap", backend="cpu", min_bytes=0, d2h_gbps=1, h2d_gbps=1, time_model=CODEC)
    paper = Advisor(policy="cswap", backend="cpu", min_bytes=0, d2h_gbps=1, h2d_gbps=1, time_model=CODEC, paper_size=True)
    trace = Trace(tensors=(_record(0, sparsity=0.9),))
    assert paper.plan(trace, 0).decisions[0].compressed_nbytes == pytest.approx(0.1 * 4 * MIB)
    assert exact.plan(trace, 0).decisions[0].compressed_nbytes > 0.1 * 4 * MIB  # + bitmap and offsets


class Sparse:
    """A logistic decider stand-in: compress when more than half the elements are zero."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def should_compress(self, nbytes, sparsity, hidden_forward_s, hidden_backward_s, d2h_gbps, h2d_gbps) -> bool:
        self.calls.append((nbytes, sparsity, hidden_forward_s, hidden_backward_s, d2h_gbps, h2d_gbps))
        return sparsity > 0.5


def test_logistic_decider() -> None:
    decider = Sparse()
    advisor = Advisor(policy="cswap", backend="cpu", min_bytes=4096, d2h_gbps=2, h2d_gbps=3, time_model=CODEC,
                      decider="logistic", logistic_model=decider)
    plan = advisor.plan(TRACE, epoch=0)
    assert plan.decisions[0].action is Action.ZVC_SWAP and plan.decisions[4].action is Action.SWAP
    assert plan.decisions[0].reason.startswith("logistic decider: compress (cost model: T=")
    assert plan.decisions[4].reason.startswith("logistic decider: plain swap")
    assert (4 * MIB, 0.9, 0.0, 0.0, 2, 3) in decider.calls


def test_launch_lookup_feeds_compressed_decisions() -> None:
    calls: list[tuple] = []

    def lookup(backend, op, dtype, nbytes):
        calls.append((backend, op, dtype, nbytes))
        return CpuLaunch(threads=1, chunk_words=64 if op == "compress" else 32)

    plan = Advisor(policy="compress-swap", backend="cpu", min_bytes=4096, launch_lookup=lookup).plan(TRACE, 0)
    assert plan.decisions[0].compress_launch == CpuLaunch(threads=1, chunk_words=64)
    assert plan.decisions[0].decompress_launch == CpuLaunch(threads=1, chunk_words=32)
    assert ("cpu", "compress", torch.float32, 4 * MIB) in calls and ("cpu", "decompress", torch.int64, 4 * MIB) in calls
    assert len(calls) == len(set(calls))  # memoised per (op, dtype, size)
    assert plan.decisions[3].compress_launch is None  # swapped uncompressed


def test_failing_launch_lookup_falls_back_with_a_warning() -> None:
    def broken(backend, op, dtype, nbytes):
        raise ConnectionError("tuning service unreachable")

    with pytest.warns(UserWarning, match="tuning service unreachable.*default launch"):
        plan = Advisor(policy="compress-keep", backend="cpu", min_bytes=0, launch_lookup=broken).plan(TRACE, 0)
    assert plan.decisions[0].compress_launch is None and plan.decisions[0].action is Action.ZVC_KEEP


@pytest.mark.parametrize("narrow_dtype", (None, "int16"))
def test_narrowed_indices_are_costed_at_their_narrow_width(narrow_dtype: str | None) -> None:
    """Dense int64 indices: swapped plainly at full width, compressed when they narrow to int16."""
    free_codec = CodecSpeed(backend="cpu", compress=OpSpeed(0.0, 0.0, 0.0), decompress=OpSpeed(0.0, 0.0, 0.0))
    advisor = Advisor(policy="cswap", backend="cpu", min_bytes=0, time_model=free_codec, d2h_gbps=1, h2d_gbps=1)
    record = _record(0, dtype="int64", sparsity=0.0, narrow_dtype=narrow_dtype)
    plan = advisor.plan(Trace(tensors=(record,)), 0)
    decision = plan.decisions[0]
    numel = 4 * MIB // 8
    itemsize = 8 if narrow_dtype is None else 2
    assert decision.compressed_nbytes == zvc_compressed_nbytes(numel, numel, itemsize)
    assert decision.action is (Action.SWAP if narrow_dtype is None else Action.ZVC_SWAP)
    assert plan.host_bytes == (4 * MIB if narrow_dtype is None else decision.compressed_nbytes)
    assert decision.reason.endswith("(T costs it narrowed exactly to int16)") is (narrow_dtype is not None)


def test_unpack_order_host_bytes_and_guard() -> None:
    plan = Advisor(policy="swap", backend="cpu", min_bytes=4096).plan(TRACE, 0)
    assert plan.unpack_order == (5, 4, 3, 2, 1, 0)  # by first unpack time
    assert plan.host_bytes == 3 * 4 * MIB  # keys 0, 3, 4 swapped at full size; 5 is stored with 0
    assert plan.lookup(0, (MIB,), "float32") is plan.decisions[0]
    assert plan.lookup(0, (MIB, 1), "float32") is None  # another shape: the guard fails
    assert plan.lookup(0, (MIB,), "float16") is None
    assert plan.counts() == {"keep": 2, "swap": 4, "zvc-swap": 0, "zvc-keep": 0, "recompute": 0, "host-zvc-swap": 0}


def test_cswap_needs_a_time_model_and_bandwidths() -> None:
    with pytest.raises(ValueError, match="needs a time_model"):
        Advisor(policy="cswap", backend="cpu", min_bytes=0, d2h_gbps=1, h2d_gbps=1)
    with pytest.raises(ValueError, match="positive bandwidths"):
        Advisor(policy="cswap", backend="cpu", min_bytes=0, time_model=CODEC)
    with pytest.raises(ValueError, match="unknown policy 'fast'"):
        Advisor(policy="fast", backend="cpu", min_bytes=0)


def test_runtime_replans_each_epoch_from_the_new_sparsity() -> None:
    """Dense activations are swapped; when they turn sparse, the next epoch's plan compresses them.
    (float64: only ZVC takes it, so its sparsity alone decides.)"""
    rt = cswap.Runtime("cswap", device="cpu", min_bytes=0, d2h_gbps=0.05, h2d_gbps=0.05, time_model=CODEC)
    w = torch.randn(256, 256, dtype=torch.float64, requires_grad=True)
    base = torch.rand(64, 256, dtype=torch.float64) + 0.5
    actions = []
    for epoch, shift in enumerate((0.0, 0.0, -10.0)):  # epoch 0 profiles keeping all; 2 is all zeros
        rt.new_epoch()
        for _ in range(2):
            with rt.iteration():
                torch.relu(base + shift).mul(1.0).matmul(w).sum().backward()
        relu = next(t for t in rt.trace().tensors if t.shape == (64, 256))  # the activation matmul saves
        actions.append((epoch, rt.plan().epoch, relu.sparsity, rt.plan().decisions[relu.key].action))
    assert actions[1] == (1, 1, 0.0, Action.SWAP)
    assert actions[2] == (2, 2, 1.0, Action.ZVC_SWAP)
    assert rt.trace().epoch == 2


class CodecLookup:
    """A launch lookup that knows codecs, as the tuner's store-backed one does: one config per codec."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, backend, op, dtype, nbytes, codec="zvc"):
        self.calls.append((op, codec))
        return CpuLaunch(threads=2 if codec == "exponent" else 1, chunk_words=128)


class ZvcLookup:
    def __call__(self, backend, op, dtype, nbytes):
        return CpuLaunch(threads=1, chunk_words=64)


def test_each_codec_takes_the_launch_tuned_for_its_kernels() -> None:
    """Exponent coding runs with its own tuned config at the chunk its size was measured with;
    a lookup that knows ZVC alone leaves it at its defaults."""
    record = _record(0, dtype="bfloat16", sparsity=0.0, codec="exponent", codec_fraction=0.7)
    lookup = CodecLookup()
    decision = Advisor(policy="compress-swap", backend="cpu", min_bytes=0, launch_lookup=lookup).plan(Trace(tensors=(record,)), 0).decisions[0]
    assert decision.codec == "exponent"
    assert decision.compress_launch == CpuLaunch(threads=2, chunk_words=32)
    assert decision.decompress_launch == CpuLaunch(threads=2, chunk_words=32)
    assert ("compress", "exponent") in lookup.calls
    zvc_only = Advisor(policy="compress-swap", backend="cpu", min_bytes=0, launch_lookup=ZvcLookup()).plan(Trace(tensors=(record,)), 0)
    assert zvc_only.decisions[0].codec == "exponent" and zvc_only.decisions[0].compress_launch is None
    sparse = _record(1, sparsity=0.9)
    zvc = Advisor(policy="compress-swap", backend="cpu", min_bytes=0, launch_lookup=lookup).plan(Trace(tensors=(sparse,)), 0).decisions[1]
    assert zvc.codec == "zvc" and zvc.compress_launch == CpuLaunch(threads=1, chunk_words=128)
