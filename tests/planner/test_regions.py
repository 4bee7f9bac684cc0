"""The region choice's time trials (:func:`cswap.planner.regions._choose`): a trial whose regions
alone run longer again than the best plan so far predicts is not solved, and the choice is the one
solving every trial gives."""

from __future__ import annotations

import itertools
import types

import pytest
from torch import nn
import torch

from cswap.planner import regions as regions_module
from cswap.planner.regions import NO_CODEC, TIME_TRIALS, _candidates, _grow, _Planning
from cswap.profile.regions import profile_regions
from cswap.profile.trace import TensorRecord, Trace


def _planning(link_gbps: float, seconds_per_tick: float) -> tuple[_Planning, int]:
    """Four tanh blocks, a clock that ticks once per stamp (``seconds_per_tick`` each), each op a
    second to recompute on its own, and a budget at a fifth of the saved bytes."""
    def block() -> nn.Module:
        return nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), *(block() for _ in range(4)), nn.Linear(64, 2))
    x = torch.randn(16, 8)
    ticks = itertools.count()
    clock = types.SimpleNamespace(start=lambda: None, stamp=lambda: next(ticks) * seconds_per_tick, synchronize=lambda: None,
                                  seconds=float)
    profile = profile_regions(model, lambda: model(x).sum().backward(), clock=clock)
    records = tuple(TensorRecord(key=s.key, shape=s.shape, dtype=s.dtype, nbytes=s.storage_bytes, sparsity=0.0,
                                 offloadable=s.movable, pack_at_s=1e-4 * s.key, unpack_at_s=1.0 - 1e-4 * s.key,
                                 recompute_s=1.0)
                    for s in profile.saves)
    trace = Trace(tensors=records, d2h_gbps=link_gbps, h2d_gbps=link_gbps, forward_s=0.5, backward_s=0.5)
    planning = _Planning(trace, profile, "cswap", NO_CODEC, "cpu", 0, budgeted=True)
    return planning, int(0.2 * sum(r.nbytes for r in records))


def _every_trial(planning: _Planning, budget_bytes: int) -> tuple[tuple[str, ...], dict[tuple[str, ...], float]]:
    """The choice as it is made when every trial is solved, and each trial's seconds."""
    chosen, rest = _grow(planning, _candidates(planning.profile), budget_bytes, by_time=True)
    best = planning.solve(chosen, budget_bytes)
    assert best is not None
    best_s, seconds, trials = planning.seconds(chosen, best), {}, TIME_TRIALS
    for path in rest:
        if trials <= 0:
            break
        grown = regions_module._addable(planning, chosen, path)
        if grown is None:
            continue
        trials -= 1
        trial = planning.solve(grown, budget_bytes)
        if trial is not None:
            seconds[grown] = planning.seconds(grown, trial)
            if seconds[grown] < best_s:
                chosen, best_s = grown, seconds[grown]
    return chosen, seconds


@pytest.mark.parametrize(("link_gbps", "seconds_per_tick", "skips"), [
    (1e-6, 1e-9, False),  # copies cost far more than any region's forward: every trial is solved (the first wins)
    (1e3, 1.0, True),  # regions' forwards cost more than the best plan predicts: no trial is solved
])
def test_a_trial_that_cannot_win_is_not_solved_and_the_choice_is_unchanged(monkeypatch: pytest.MonkeyPatch, link_gbps: float,
                                                                            seconds_per_tick: float, skips: bool) -> None:
    planning, budget_bytes = _planning(link_gbps, seconds_per_tick)
    solved: list[tuple[str, ...]] = []
    solve = _Planning._solve
    monkeypatch.setattr(_Planning, "_solve", lambda self, regions, budget: solved.append(regions) or solve(self, regions, budget))
    chosen = regions_module._choose(planning, budget_bytes, TIME_TRIALS)
    first = _grow(planning, _candidates(planning.profile), budget_bytes, by_time=True)[0]
    trials_solved = [r for r in solved if r != first]
    reference, seconds = _every_trial(_planning(link_gbps, seconds_per_tick)[0], budget_bytes)
    assert chosen == reference
    assert seconds, "the case must offer trials"
    if skips:
        assert trials_solved == [] and len(seconds) == TIME_TRIALS
    else:
        assert sorted(trials_solved) == sorted(seconds)
