"""The autograd corner cases of docs/architecture.md's "facts that bite", under every policy: gradients stay exact."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import cswap
from cswap.options import POLICIES, RECOMPUTING_POLICIES
from tests.runtime.helpers import FAST_CODEC, SLOW_LINK, bits, one_thread_below_1mib

#: The corner cases are functions of tensors, not modules: the policies that recompute modules are
#: checked on models in tests/runtime/test_runtime_recompute.py.
POLICIES = tuple(p for p in POLICIES if p not in RECOMPUTING_POLICIES)
MOVING = tuple(p for p in POLICIES if p != "none")


def make_runtime(policy: str, **options: object) -> cswap.Runtime:
    defaults: dict[str, object] = {"device": "cpu", "min_bytes": 0, "launch_lookup": one_thread_below_1mib, **SLOW_LINK}
    if policy == "cswap":
        defaults["time_model"] = FAST_CODEC
    defaults.update(options)
    return cswap.Runtime(policy, **defaults)


def leaf(*shape: int, seed: int = 0, relu: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g)
    return (t.relu() if relu else t).requires_grad_()


def grads_of(fn: Callable[[list[torch.Tensor]], torch.Tensor], inputs: list[torch.Tensor],
             rt: cswap.Runtime | None, iterations: int = 2) -> list[list[torch.Tensor]]:
    """Run ``fn`` forward and backward ``iterations`` times (the first profiles); every iteration's grads.

    ``fn`` gets activations (``x * 1.0``), not the leaves: leaves that require grad are parameters
    to the runtime, which never moves them.
    """
    out = []
    for _ in range(iterations):
        xs = [x.detach().clone().requires_grad_() for x in inputs]
        if rt is None:
            fn([x * 1.0 for x in xs]).backward()
        else:
            with rt.iteration():
                fn([x * 1.0 for x in xs]).backward()
        out.append([x.grad for x in xs])
    return out


def assert_same(expected: list[list[torch.Tensor]], actual: list[list[torch.Tensor]]) -> None:
    for it_e, it_a in zip(expected, actual, strict=True):
        for e, a in zip(it_e, it_a, strict=True):
            assert e.shape == a.shape and e.dtype == a.dtype
            assert torch.equal(bits(e), bits(a))


CASES: dict[str, tuple[Callable[[list[torch.Tensor]], torch.Tensor], list[torch.Tensor]]] = {
    # The same storage saved twice by one op: stored once.
    "x*x": (lambda xs: (xs[0] * xs[0]).sum(), [leaf(64, 33)]),
    # A transposed (non-contiguous) view saved by matmul, and a strided slice saved by exp.
    "views": (lambda xs: (xs[0].t() @ xs[1]).exp()[:, ::2].exp().sum(), [leaf(40, 24, relu=False), leaf(40, 16, seed=1, relu=False)]),
    # A stride-0 broadcast saved by mul.
    "broadcast": (lambda xs: (xs[0].expand(16, -1) * xs[1]).sum(), [leaf(1, 50), leaf(16, 50, seed=2)]),
    # Integer and boolean tensors saved: gather's index, where's mask, max_pool's indices.
    "int-and-bool": (
        lambda xs: torch.gather(xs[0], 1, (xs[0].detach() * 7).long().clamp(0, 29)).sum()
        + torch.where(xs[0] > 0.5, xs[0], 0.0).pow(2).sum()
        + torch.nn.functional.max_pool2d(xs[0].view(1, 1, 30, 30), 2).sum(),
        [leaf(30, 30)],
    ),
    # Checkpointing inside the iteration: its own hooks win inside, the runtime's outside.
    "checkpoint": (
        lambda xs: checkpoint(lambda a: (a.relu() * 3).exp(), xs[0] @ xs[1], use_reentrant=False).sum(),
        [leaf(32, 32, relu=False), leaf(32, 32, seed=3, relu=False)],
    ),
    # A no_grad region in the middle of the forward.
    "no-grad": (lambda xs: (xs[0].exp() * _frozen(xs[0])).sum(), [leaf(128)]),
    # An inner saved_tensors_hooks (torch's save_on_cpu) takes over inside its block.
    "nested-hooks": (lambda xs: _nested(xs[0]), [leaf(64, 64)]),
}


def _frozen(x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return (x * 2).relu()


def _nested(x: torch.Tensor) -> torch.Tensor:
    y = x.exp()
    with torch.autograd.graph.save_on_cpu():
        z = y.sin()
    return (z * y).sum()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", CASES)
def test_corner_case_gradients_exact(case: str, policy: str) -> None:
    fn, inputs = CASES[case]
    expected = grads_of(fn, inputs, None)
    rt = make_runtime(policy)
    assert_same(expected, grads_of(fn, inputs, rt))
    if policy != "none":
        assert sum(rt.stats().actions.values()) > 0


@pytest.mark.parametrize("policy", MOVING)
def test_same_storage_saved_twice_is_stored_once(policy: str) -> None:
    rt = make_runtime(policy)
    fn, inputs = CASES["x*x"]
    grads_of(fn, inputs, rt)
    assert rt.stats().deduplicated_tensors >= 1


@pytest.mark.parametrize("policy", POLICIES)
def test_retain_graph_two_backwards(policy: str) -> None:
    def run(rt: cswap.Runtime | None) -> list[torch.Tensor]:
        x = leaf(256, seed=4).detach().requires_grad_()
        context = rt.iteration() if rt is not None else torch.enable_grad()
        with context:
            h = x * 1.0
            y = (h.exp() * h.sigmoid()).sum()
            y.backward(retain_graph=True)
            first = x.grad.clone()
            y.backward()
        return [first, x.grad]

    assert_same([run(None)], [run(make_runtime(policy))])


@pytest.mark.parametrize("policy", POLICIES)
def test_double_backward(policy: str) -> None:
    def run(rt: cswap.Runtime | None) -> list[torch.Tensor]:
        x = leaf(200, seed=5, relu=False).detach().requires_grad_()
        context = rt.iteration() if rt is not None else torch.enable_grad()
        with context:
            h = x * 1.0
            (g,) = torch.autograd.grad((h.tanh() * h).sum(), x, create_graph=True)
            g.pow(2).sum().backward()
        return [g.detach(), x.grad]

    assert_same([run(None)], [run(make_runtime(policy))])


@pytest.mark.parametrize("policy", MOVING)
def test_unpack_twice_returns_the_same_data(policy: str) -> None:
    rt = make_runtime(policy)
    x = leaf(1000, seed=6)
    with rt.iteration():
        y = (x * 1.0).exp()
        first = y.grad_fn._saved_result.clone()
        second = y.grad_fn._saved_result
        y.sum().backward()
    assert torch.equal(bits(first), bits(second))
    assert torch.equal(bits(first), bits(x.detach().exp()))
    assert torch.equal(x.grad, x.detach().exp())


@pytest.mark.parametrize("policy", MOVING)
def test_graph_change_falls_back_to_the_default_action(policy: str) -> None:
    rt = make_runtime(policy)
    x = leaf(4096, seed=7)
    with rt.iteration():
        (x * 1.0).exp().sum().backward()
    x.grad = None
    (x * 3).view(64, 64).exp().sin().sum().backward()
    expected = x.grad
    x.grad = None
    with rt.iteration():
        (x * 3).view(64, 64).exp().sin().sum().backward()  # another shape under the profiled key
    assert torch.equal(bits(x.grad), bits(expected))
    assert rt.stats().unknown_keys >= 1


@pytest.mark.parametrize("policy", MOVING)
def test_tensor_below_min_bytes_stays(policy: str) -> None:
    rt = make_runtime(policy, min_bytes=1 << 20)
    fn, inputs = CASES["x*x"]
    assert_same(grads_of(fn, inputs, None), grads_of(fn, inputs, rt))
    actions = rt.stats().actions
    assert actions["keep"] > 0
    assert actions["swap"] == actions["zvc-swap"] == actions["zvc-keep"] == 0


@pytest.mark.parametrize("policy", MOVING)
def test_hooks_are_thread_local(policy: str) -> None:
    rt = make_runtime(policy)
    other_grads: list[torch.Tensor] = []

    def other_thread() -> None:
        y = leaf(2048, seed=8)
        (y * 1.0).exp().sum().backward()
        other_grads.append(y.grad)

    x = leaf(2048, seed=9)
    with rt.iteration():
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        packed_before = rt.stats().packed_tensors
        (x * 1.0).exp().sum().backward()
    assert packed_before == 0  # the other thread's autograd never reached the runtime's hooks
    assert torch.equal(other_grads[0], leaf(2048, seed=8).detach().exp())
    assert torch.equal(x.grad, x.detach().exp())


def test_unknown_option_names_it() -> None:
    with pytest.raises(TypeError, match="min_byte.*min_bytes"):
        cswap.Runtime("swap", min_byte=0)


def test_unknown_policy_names_the_choices() -> None:
    with pytest.raises(ValueError, match="fast.*compress-keep"):
        cswap.Runtime("fast")


def test_malformed_defaults_file_names_the_file_and_key(tmp_path, monkeypatch) -> None:
    shipped = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"
    bad = tmp_path / "defaults.yaml"
    bad.write_text(re.sub(r"min_bytes: \d+", "min_bytes: -5", shipped.read_text()))
    monkeypatch.setenv("CSWAP_RUNTIME_CONFIG", str(bad))
    with pytest.raises(ValueError, match=r"defaults\.yaml.*min_bytes"):
        cswap.Runtime("swap")
