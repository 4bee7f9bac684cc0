"""Search methods on synthetic objectives with known optima (deterministic and fast)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest

from cswap.tuner.search import (
    METHODS,
    bo_search,
    default_budget,
    expert_params,
    grid_search,
    random_search,
    search,
)
from cswap.tuner.space import Param, SearchSpace, load_search_space

# The CPU search space of a 4-core machine: 4 thread counts x 11 chunk sizes = 44 configs.
CPU_SPACE = load_search_space("cpu", "compress", cores=4)


def bowl(params: Mapping[str, int]) -> float:
    """Seconds with one optimum at 3 threads, 512-word chunks; a gentle ripple keeps it from being too easy."""
    threads, log_chunk = params["threads"], math.log2(params["chunk_words"])
    return 1e-3 * (1 + 0.06 * (log_chunk - 9) ** 2) * (1 + 0.04 * (threads - 3) ** 2) + 2e-6 * math.sin(3 * log_chunk)


def failing_small_chunks(params: Mapping[str, int]) -> float:
    """``bowl``, except that configs with chunks under 256 words fail to launch."""
    return math.inf if params["chunk_words"] < 256 else bowl(params)


class Counting:
    """Wraps an objective and remembers what it was asked."""

    def __init__(self, objective) -> None:
        self.objective = objective
        self.asked: list[dict[str, int]] = []

    def __call__(self, params: Mapping[str, int]) -> float:
        self.asked.append(dict(params))
        return self.objective(params)


def test_grid_is_exhaustive_and_finds_the_optimum() -> None:
    counting = Counting(bowl)
    result = grid_search(CPU_SPACE, counting)
    assert len(result.evaluations) == CPU_SPACE.grid_size == 44
    assert len({tuple(p.values()) for p in counting.asked}) == 44
    assert result.best_params == {"threads": 3, "chunk_words": 512}
    assert result.best_time_s == min(bowl(p) for p in CPU_SPACE.grid_points())
    assert len(result.elapsed_s) == 44 and list(result.elapsed_s) == sorted(result.elapsed_s)


def test_bo_gets_within_5_percent_of_grid_with_a_third_of_its_evaluations() -> None:
    grid = grid_search(CPU_SPACE, bowl)
    budget = CPU_SPACE.grid_size // 3
    result = bo_search(CPU_SPACE, bowl, budget=budget, seed=0)
    assert len(result.evaluations) <= budget == 14
    assert result.best_time_s <= 1.05 * grid.best_time_s


def test_bo_is_seeded() -> None:
    first = bo_search(CPU_SPACE, bowl, budget=5, seed=4)
    assert first.evaluations == bo_search(CPU_SPACE, bowl, budget=5, seed=4).evaluations
    assert first.evaluations != bo_search(CPU_SPACE, bowl, budget=5, seed=5).evaluations


@pytest.mark.parametrize("method", ["bo", "random"])
def test_budgeted_methods_never_repeat_a_config(method: str) -> None:
    space = load_search_space("cpu", "compress", cores=1)  # 11 configs
    counting = Counting(bowl)
    result = search(method, space, counting, budget=10, seed=3)
    keys = [tuple(p.values()) for p in counting.asked]
    assert len(keys) == len(set(keys)) == len(result.evaluations) == 10


def test_budget_beyond_the_space_stops_at_its_size() -> None:
    space = SearchSpace("cpu", "compress", (Param("threads", 1, 2, "linear", (1, 2)), Param("chunk_words", 16, 64, "pow2", (16, 32, 64))))
    assert len(bo_search(space, bowl, budget=30, seed=0).evaluations) == 6
    assert len(random_search(space, bowl, budget=30, seed=0).evaluations) == 6


@pytest.mark.parametrize("method", METHODS)
def test_failing_configs_score_inf_and_the_search_goes_on(method: str) -> None:
    result = search(method, CPU_SPACE, failing_small_chunks, budget=8, seed=0, units=4)
    failed = [e for e in result.evaluations if e.failed]
    assert all(e.params["chunk_words"] < 256 for e in failed)
    if method == "expert":  # the expert rule's 32-word chunks fail here: its one result is inf
        assert math.isinf(result.best_time_s) and len(result.evaluations) == 1
        return
    assert failed, "this space has failing configs; the search should have met some"
    assert math.isfinite(result.best_time_s) and result.best_params["chunk_words"] >= 256
    assert len(result.evaluations) == (44 if method == "grid" else 8)


def test_bo_survives_a_first_config_that_fails() -> None:
    result = bo_search(CPU_SPACE, failing_small_chunks, budget=6, seed=0, warm_start=[{"threads": 1, "chunk_words": 16}])
    assert result.evaluations[0].failed
    assert math.isfinite(result.best_time_s)


def test_bo_evaluates_warm_start_configs_first() -> None:
    warm = [{"threads": 3, "chunk_words": 512}, {"threads": 2, "chunk_words": 1024}, {"threads": 99, "chunk_words": 300}]
    counting = Counting(bowl)
    result = bo_search(CPU_SPACE, counting, budget=9, seed=0, warm_start=warm)  # 3 initial points
    assert result.warm_started == 3
    # Projected onto the space: 99 threads -> 4 (the cores), 300 words -> 256.
    assert counting.asked[:3] == [warm[0], warm[1], {"threads": 4, "chunk_words": 256}]
    assert result.best_params == {"threads": 3, "chunk_words": 512}


def test_warm_start_beats_cold_start_on_the_first_evaluation() -> None:
    cold = bo_search(CPU_SPACE, bowl, budget=3, seed=0)
    warm = bo_search(CPU_SPACE, bowl, budget=3, seed=0, warm_start=[{"threads": 3, "chunk_words": 512}])
    assert warm.evaluations[0].time_s < cold.evaluations[0].time_s
    assert warm.best_time_s <= cold.best_time_s


def test_random_search_is_seeded_and_uses_the_budget() -> None:
    first = random_search(CPU_SPACE, bowl, budget=10, seed=7)
    assert first.evaluations == random_search(CPU_SPACE, bowl, budget=10, seed=7).evaluations
    assert first.evaluations != random_search(CPU_SPACE, bowl, budget=10, seed=8).evaluations
    assert all(CPU_SPACE.contains(e.params) for e in first.evaluations)


def test_expert_rules() -> None:
    assert expert_params(load_search_space("cpu", "compress", cores=8), units=8) == {"threads": 8, "chunk_words": 32}
    assert expert_params(load_search_space("cpu", "decompress", cores=4), units=16) == {"threads": 4, "chunk_words": 32}
    cuda = expert_params(load_search_space("cuda", "compress"), units=132)
    assert cuda == {
        "compress_grid": 528, "compress_block": 256,
        "scan_grid": 1, "scan_block": 1024,
        "scatter_grid": 528, "scatter_block": 256,
    }
    assert expert_params(load_search_space("cuda", "decompress"), units=20000)["decompress_grid"] == 65535
    result = search("expert", CPU_SPACE, bowl, units=4)
    assert [e.params for e in result.evaluations] == [{"threads": 4, "chunk_words": 32}]


def test_progress_reports_every_evaluation() -> None:
    calls: list[tuple[int, int, float]] = []
    search("random", CPU_SPACE, bowl, budget=5, seed=0, progress=lambda *args: calls.append(args))
    assert [c[:2] for c in calls] == [(i, 5) for i in range(1, 6)]
    assert [c[2] for c in calls] == sorted((c[2] for c in calls), reverse=True)


def test_default_budget_is_a_third_of_the_grid_within_limits() -> None:
    assert default_budget(load_search_space("cpu", "compress", cores=16)) == 20
    assert default_budget(CPU_SPACE) == 14
    assert default_budget(load_search_space("cpu", "compress", cores=2)) == 7
    assert default_budget(load_search_space("cpu", "compress", cores=1)) == 4


def test_bad_arguments_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown search method 'anneal': choose one of bo, grid, random, expert"):
        search("anneal", CPU_SPACE, bowl)
    with pytest.raises(ValueError, match="budget of at least 1"):
        bo_search(CPU_SPACE, bowl, budget=0)
    with pytest.raises(ValueError, match="exceeds max_points=10.*use method bo"):
        grid_search(CPU_SPACE, bowl, max_points=10)
    with pytest.raises(ValueError, match="must return seconds >= 0 or inf"):
        search("random", CPU_SPACE, lambda p: float("nan"), budget=2)


def test_a_space_with_one_config() -> None:
    space = SearchSpace("cpu", "compress", (Param("threads", 2, 2, "linear", (2,)), Param("chunk_words", 64, 64, "pow2", (64,))))
    for method in METHODS:
        result = search(method, space, bowl, budget=5, units=2)
        assert [e.params for e in result.evaluations] == [{"threads": 2, "chunk_words": 64}]
