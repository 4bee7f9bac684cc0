"""Capuchin's greedy plan on hand-computed cases."""

from __future__ import annotations

import pytest

from cswap.planner.capuchin import Candidate, plan_capuchin


def test_hidden_swaps_come_first_largest_first_and_stop_when_enough() -> None:
    plan = plan_capuchin([
        Candidate(0, 100, swap_s=0.0), Candidate(1, 300, swap_s=0.0), Candidate(2, 200, swap_s=0.0),
        Candidate(3, 1000, region="r", recompute_s=0.0001),
    ], bytes_to_save=450)
    assert list(plan.actions.items()) == [(1, "swap"), (2, "swap")]
    assert (plan.saved_bytes, plan.overhead_s, plan.regions) == (500, 0.0, ())


def test_recompute_wins_when_it_saves_more_per_second() -> None:
    # swap: 1000 B / 0.01 s = 1e5 B/s; recompute r: (1000 + 500) B / 0.005 s = 3e5 B/s.
    plan = plan_capuchin([
        Candidate(0, 1000, swap_s=0.01, region="r", recompute_s=0.005),
        Candidate(1, 500, swap_s=0.02, region="r", recompute_s=0.005),
    ], bytes_to_save=1200)
    assert dict(plan.actions) == {0: "recompute", 1: "recompute"}
    assert (plan.regions, plan.saved_bytes, plan.overhead_s) == (("r",), 1500, 0.005)


def test_swap_wins_when_the_region_is_expensive() -> None:
    # swap 0: 1000/0.01 = 1e5; swap 1: 500/0.01 = 5e4; recompute r: 1500/0.1 = 1.5e4.
    plan = plan_capuchin([
        Candidate(0, 1000, swap_s=0.01, region="r", recompute_s=0.1),
        Candidate(1, 500, swap_s=0.01, region="r", recompute_s=0.1),
    ], bytes_to_save=1200)
    assert list(plan.actions.items()) == [(0, "swap"), (1, "swap")]
    assert plan.saved_bytes == 1500 and plan.overhead_s == pytest.approx(0.02)


def test_a_partly_swapped_region_saves_less_by_recomputing() -> None:
    # First: swap 0 (100/0.001 = 1e5) beats r (200/0.01 = 2e4) and swap 1 (100/0.004 = 2.5e4).
    # Then r saves only 100 B: 1e4 B/s, so swap 1 (2.5e4) wins.
    plan = plan_capuchin([
        Candidate(0, 100, swap_s=0.001, region="r", recompute_s=0.01),
        Candidate(1, 100, swap_s=0.004, region="r", recompute_s=0.01),
    ], bytes_to_save=200)
    assert list(plan.actions.items()) == [(0, "swap"), (1, "swap")]
    assert plan.overhead_s == pytest.approx(0.005)


def test_regions_are_chosen_one_at_a_time() -> None:
    # a: 600/0.002 = 3e5; b: 400/0.004 = 1e5; unswappable tensors.
    candidates = [Candidate(0, 600, region="a", recompute_s=0.002), Candidate(1, 400, region="b", recompute_s=0.004)]
    one = plan_capuchin(candidates, bytes_to_save=500)
    assert (dict(one.actions), one.regions, one.overhead_s) == ({0: "recompute"}, ("a",), 0.002)
    both = plan_capuchin(candidates, bytes_to_save=700)
    assert both.regions == ("a", "b") and both.overhead_s == pytest.approx(0.006)


def test_a_free_recomputation_is_taken_first() -> None:
    plan = plan_capuchin([Candidate(0, 10, swap_s=0.001), Candidate(1, 10, region="r", recompute_s=0.0)], bytes_to_save=10)
    assert dict(plan.actions) == {1: "recompute"} and plan.overhead_s == 0.0


def test_nothing_to_save_is_an_empty_plan() -> None:
    plan = plan_capuchin([Candidate(0, 10, swap_s=0.5)], bytes_to_save=0)
    assert (dict(plan.actions), plan.saved_bytes, plan.overhead_s) == ({}, 0, 0.0)


def test_infeasible_says_how_much_can_be_saved() -> None:
    with pytest.raises(ValueError, match=r"can save at most 30 bytes, 100 asked"):
        plan_capuchin([Candidate(0, 10, swap_s=0.1), Candidate(1, 20, region="r", recompute_s=0.1), Candidate(2, 50)], bytes_to_save=100)


@pytest.mark.parametrize(
    ("candidates", "message"),
    [
        ([Candidate(0, 1, swap_s=0.1), Candidate(0, 2, swap_s=0.1)], "keys must be unique"),
        ([Candidate(0, 1, region="r", recompute_s=0.1), Candidate(1, 2, region="r", recompute_s=0.2)], "different recompute_s"),
        ([Candidate(0, -1, swap_s=0.1)], "must be >= 0"),
    ],
)
def test_bad_candidates_are_refused(candidates: list[Candidate], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_capuchin(candidates, bytes_to_save=1)


def test_negative_bytes_to_save_is_refused() -> None:
    with pytest.raises(ValueError, match=r"bytes_to_save must be >= 0"):
        plan_capuchin([], bytes_to_save=-1)
