"""The planned host pool at run time: once a plan is made, every planned swap goes to its slot, no
host memory is allocated inside an iteration, gradients stay bit-identical; a slot still held (a
graph kept across iterations) or a key the plan did not place falls back to first fit, counted,
with the right values."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import cswap.execute.arena as arena_module
from tests.execute.test_executor import make_runtime
from tests.runtime.helpers import assert_bit_equal


def _model() -> torch.nn.Module:
    """Tanh layers in float64, which only ZVC takes and does not shrink: ``cswap`` swaps them raw."""
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh()) for _ in range(5))).double()


def _grads(model: torch.nn.Module, x: torch.Tensor, micro_batches: int = 1) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    for part in x.chunk(micro_batches):
        model(part).pow(2).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


class _Allocations:
    """Counts the host buffers the arena creates between an iteration's begin and its end (the
    hooks' time); laying the arena out in ``begin`` is before the iteration."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, executor) -> None:
        self.inside = False
        self.chunks_inside = 0
        chunk_init, begin, end = arena_module._Chunk.__init__, executor.begin, executor.end

        def counted(chunk, nbytes: int, pin_memory: bool) -> None:
            self.chunks_inside += self.inside
            chunk_init(chunk, nbytes, pin_memory)

        def begun(*args, **kwargs):
            state = begin(*args, **kwargs)
            self.inside = True
            return state

        def ended(*args, **kwargs):
            self.inside = False
            return end(*args, **kwargs)

        monkeypatch.setattr(arena_module._Chunk, "__init__", counted)
        monkeypatch.setattr(executor, "begin", begun)
        monkeypatch.setattr(executor, "end", ended)


@pytest.mark.parametrize("micro_batches", (1, 2))
@pytest.mark.parametrize("policy", ("swap", "cswap"))
def test_planned_swaps_take_their_slots_and_nothing_is_allocated_inside_iterations(
    policy: str, micro_batches: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model()
    x = torch.randn(32, 64, dtype=torch.float64)
    expected = _grads(model, x, micro_batches)
    rt = make_runtime(policy, model=model)
    allocations = _Allocations(monkeypatch, rt._executor)
    with rt.iteration():  # the profile
        _grads(model, x, micro_batches)
    planned_swaps = sum(1 for d in rt.plan().decisions.values() if d.action.value == "swap")
    assert planned_swaps and rt.plan().host_pool is not None
    before = rt.stats()
    for _ in range(3):
        with rt.iteration():
            got = _grads(model, x, micro_batches)
        assert_bit_equal(expected, got, what=f"{policy} gradient")
    after = rt.stats()
    arena = rt._executor.arena
    assert allocations.chunks_inside == 0 and after.arena_misses == before.arena_misses
    assert after.host_pool_bytes == rt.plan().host_pool.pool_bytes > 0
    assert after.host_pool_fallbacks == 0
    assert arena.pool_hits >= 3 * micro_batches * (planned_swaps - len(rt.trace().meta.get("duplicates", {})))
    assert after.arena_used_bytes == 0 and after.resident_bytes == 0


def test_a_slot_still_held_falls_back_to_first_fit_with_the_right_values() -> None:
    model = _model()
    x = torch.randn(32, 64, dtype=torch.float64)
    expected = _grads(model, x)
    rt = make_runtime("swap", model=model)
    for _ in range(2):
        with rt.iteration():
            _grads(model, x)
    model.zero_grad(set_to_none=True)
    with rt.iteration():
        kept = model(x).pow(2).sum()  # its graph, and every slot its swaps took, stay alive
    fallbacks = rt.stats().host_pool_fallbacks
    with rt.iteration():
        got = _grads(model, x)  # the same keys: their slots are held, so first fit
    assert rt.stats().host_pool_fallbacks > fallbacks
    assert_bit_equal(expected, got, what="gradient beside a kept graph")
    kept.backward()  # the kept graph's copies were never overwritten
    assert_bit_equal(expected, [p.grad - g for p, g in zip(model.parameters(), got)], what="the kept graph's gradient")


def test_a_later_profile_finds_the_room_the_first_one_needed() -> None:
    model = _model()
    x = torch.randn(32, 64, dtype=torch.float64)
    rt = make_runtime("swap", model=model)
    for epoch in range(3):
        rt.new_epoch()
        for _ in range(2):
            with rt.iteration():
                _grads(model, x)
        if epoch == 0:
            misses = rt.stats().arena_misses  # the first profile sizes the arena
    assert rt.stats().arena_misses == misses and rt.stats().profiled_iterations == 3


@pytest.mark.parametrize("first_taken", (0, 1))
def test_a_slot_is_not_taken_while_a_key_sharing_its_bytes_holds_them(first_taken: int) -> None:
    from cswap.execute.arena import HostArena
    from cswap.planner.hostpool import PoolLayout

    # keys 0 and 1 share bytes (lifetimes apart in the profile); key 2 has a slot of its own
    layout = PoolLayout(offsets={0: 0, 1: 0, 2: 64}, sizes={0: 64, 1: 64, 2: 64}, pool_bytes=128, lower_bound_bytes=128,
                        conflicts={0: (1,), 1: (0,), 2: ()})
    arena = HostArena(pin_memory=False)
    arena.plan_pool(layout, 0)
    shape, stride = (4, 4), (4, 1)
    other = 1 - first_taken
    view, slot = arena.alloc_tensor(torch.float32, shape, stride, 64, first_taken)
    assert slot is not None and view.data_ptr() == arena._pool.chunk.buffer.data_ptr()

    def take(key: int, dtype: torch.dtype = torch.float32, size: tuple[int, ...] = shape) -> tuple[torch.Tensor, Any] | None:
        return arena._pool.take(key, dtype, size, stride, 64)

    assert arena.alloc_tensor(torch.float32, shape, stride, 64, other)[1] is None  # the shared bytes are held: first fit
    assert take(first_taken) is None  # held by itself
    assert arena.alloc_tensor(torch.float32, shape, stride, 64, 2)[1] is not None  # bytes of its own
    arena.free(slot)
    again = take(first_taken)
    assert again is not None and again[0] is view and again[1] == slot  # the view made before, not a new one
    arena.free(again[1])
    other_dtype = take(first_taken, torch.float64, (2, 4))
    assert other_dtype is not None and other_dtype[0].dtype == torch.float64  # another dtype: a view of its own
    arena.free(other_dtype[1])
    taken = arena.alloc_tensor(torch.float32, shape, stride, 64, other)
    assert taken[1] is not None and taken[0].data_ptr() == view.data_ptr()  # its bytes are free again
    assert take(first_taken) is None  # now the other holds them
