"""The host pool's layout: no two blocks alive at once share a byte, the pool never below the live
peak and never above first fit on the same requests, conflicts exactly the address overlaps, and a
plan's pool read off its profile."""

from __future__ import annotations

import copy
import random

import pytest
import torch

import cswap
from cswap.planner.hostpool import HostBlock, first_fit_high_water, host_pool_of, live_peak_bytes, place_blocks


def _random_blocks(seed: int, count: int) -> list[HostBlock]:
    rng = random.Random(seed)
    blocks = []
    for key in range(count):
        first = rng.randrange(0, 40)
        blocks.append(HostBlock(key, rng.choice((1, 64, 100, 1000, 4096, 65536)), first, first + rng.randrange(0, 30)))
    return blocks


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("count", (1, 5, 60))
def test_layout_is_sound_and_between_the_bounds(seed: int, count: int) -> None:
    blocks = _random_blocks(seed, count)
    layout = place_blocks(blocks)
    for a in blocks:
        start_a, size_a = layout.offsets[a.key], layout.sizes[a.key]
        assert start_a % 64 == 0 and size_a >= a.nbytes and size_a % 64 == 0
        overlapping_bytes = set()
        for b in blocks:
            if b.key == a.key:
                continue
            start_b, size_b = layout.offsets[b.key], layout.sizes[b.key]
            shares_bytes = start_a < start_b + size_b and start_b < start_a + size_a
            alive_together = a.first_event <= b.last_event and b.first_event <= a.last_event
            assert not (shares_bytes and alive_together), (a, b)
            if shares_bytes:
                overlapping_bytes.add(b.key)
        assert layout.conflicts[a.key] == tuple(sorted(overlapping_bytes))
    assert layout.lower_bound_bytes == live_peak_bytes(blocks) <= layout.pool_bytes
    assert live_peak_bytes(blocks) <= first_fit_high_water(blocks)
    assert layout.pool_bytes == max(layout.offsets[b.key] + layout.sizes[b.key] for b in blocks)


def test_greedy_by_size_beats_first_fit_where_first_fit_fragments() -> None:
    # A small block freed early leaves a hole first fit cannot use for the large one that follows.
    blocks = [HostBlock(0, 256, 0, 2), HostBlock(1, 256, 1, 5), HostBlock(2, 512, 3, 5)]
    assert (place_blocks(blocks).pool_bytes, live_peak_bytes(blocks), first_fit_high_water(blocks)) == (768, 768, 1024)


def test_bad_blocks_are_refused() -> None:
    with pytest.raises(ValueError, match="first_event <= last_event"):
        HostBlock(0, 64, 3, 2)
    with pytest.raises(ValueError, match="keys repeat"):
        place_blocks([HostBlock(0, 64, 0, 1), HostBlock(0, 64, 2, 3)])


def _profiled(policy: str, **options) -> cswap.Runtime:
    torch.manual_seed(0)
    block = (torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh())
    model = torch.nn.Sequential(*(torch.nn.Sequential(*(layer for layer in copy.deepcopy(block))) for _ in range(4)))
    rt = cswap.Runtime(policy, device="cpu", min_bytes=0, model=model, **options)
    with rt.iteration():
        model(torch.randn(32, 64)).sum().backward()
    return rt


def test_a_swap_plan_places_every_planned_swap_once() -> None:
    rt = _profiled("swap")
    plan, trace = rt.plan(), rt.trace()
    pool = plan.host_pool
    duplicates = {int(k) for k in trace.meta.get("duplicates", {})}
    swapped = {key for key, d in plan.decisions.items() if d.action.value == "swap" and key not in duplicates}
    assert pool is not None and set(pool.offsets) == swapped and swapped
    assert host_pool_of(trace, swapped) == pool
    assert pool.pool_bytes == pool.lower_bound_bytes  # forward packs, backward frees in reverse: a stack


def test_a_plan_numbered_with_recompute_regions_has_no_pool() -> None:
    rt = _profiled("recompute")
    assert rt.plan().recompute_regions and rt.plan().host_pool is None
