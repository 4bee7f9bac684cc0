"""Search methods over a :class:`~cswap.tuner.space.SearchSpace`: ``bo``, ``grid``, ``random`` and ``expert``.

* ``bo``: Bayesian optimization with scikit-optimize's ``Optimizer`` (a Gaussian process, expected
  improvement), asked and told one config at a time: a few initial points (the warm-start configs
  first, then a Latin hypercube), then configs the model picks. It models ``log(seconds)`` because
  launch configs change times by orders of magnitude; a config that failed (``inf``) is told a
  finite penalty, ten times the slowest time seen.
* ``grid``: every config of the discretized space, in a fixed order: the ground truth.
* ``random``: configs drawn from the same distribution as BO's initial points, same budget as BO.
* ``expert``: one fixed rule: block 256 and grid = 4 x SM count on CUDA; threads = cores and
  ``chunk_words`` = 32 on CPU.

No method evaluates a config twice. Every method returns a :class:`SearchResult`.

Example:
    >>> from cswap.tuner.space import Param, SearchSpace
    >>> space = SearchSpace("cpu", "compress", (Param("chunk_words", 16, 16384, "pow2", tuple(2**e for e in range(4, 15))),))
    >>> result = search("grid", space, lambda p: abs(p["chunk_words"] - 1000) + 1.0)
    >>> result.best_params, len(result.evaluations)
    ({'chunk_words': 1024}, 11)
"""

from __future__ import annotations

import math
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from cswap.codecs.format import DEFAULT_CHUNK_WORDS
from cswap.codecs.launch import CudaLaunch
from cswap.tuner.space import SearchSpace
from cswap.tuner.store import Evaluation

__all__ = [
    "METHODS",
    "ObjectiveFn",
    "ProgressFn",
    "SearchResult",
    "bo_search",
    "default_budget",
    "expert_params",
    "expert_search",
    "grid_search",
    "random_search",
    "search",
]

#: The search methods, by name.
METHODS: tuple[str, ...] = ("bo", "grid", "random", "expert")

#: Seconds of a config (``math.inf`` when it fails).
ObjectiveFn = Callable[[Mapping[str, int]], float]
#: Called after every evaluation with (evaluations done, evaluations planned, best seconds so far).
ProgressFn = Callable[[int, int, float], None]

# Grid search refuses spaces larger than this unless told otherwise: an accident, not a plan.
_MAX_GRID_POINTS = 100_000
# Failed configs are told to BO as this many times the slowest finite time seen.
_FAILURE_PENALTY = 10.0
# Before any config has run, a failure is told as this many seconds.
_FIRST_FAILURE_S = 60.0


@dataclass(frozen=True)
class SearchResult:
    """What a search found.

    Args:
        method: the method's name.
        best_params: the fastest config evaluated (the first one when every config failed).
        best_time_s: its seconds (``math.inf`` when every config failed).
        evaluations: every config evaluated, in order.
        elapsed_s: seconds from the start of the search to the end of each evaluation
            (the method's own overhead included), aligned with ``evaluations``.
        wall_s: seconds of the whole search.
        warm_started: how many warm-start configs were evaluated first.
    """

    method: str
    best_params: dict[str, int]
    best_time_s: float
    evaluations: tuple[Evaluation, ...]
    elapsed_s: tuple[float, ...]
    wall_s: float
    warm_started: int = 0


class _Recorder:
    """Evaluates configs once each, tracks the best, reports progress."""

    def __init__(self, space: SearchSpace, objective: ObjectiveFn, planned: int, progress: ProgressFn | None) -> None:
        self.space = space
        self.objective = objective
        self.planned = planned
        self.progress = progress
        self.start_s = time.perf_counter()
        self.evaluations: list[Evaluation] = []
        self.elapsed_s: list[float] = []
        self.seen: dict[tuple[int, ...], float] = {}

    def measured(self, params: Mapping[str, int]) -> float | None:
        return self.seen.get(self.space.key(params))

    def evaluate(self, params: Mapping[str, int]) -> float:
        params = {name: int(params[name]) for name in self.space.names}
        time_s = float(self.objective(params))
        if math.isnan(time_s) or time_s < 0:
            raise ValueError(f"the objective returned {time_s} for {params}; it must return seconds >= 0 or inf")
        self.seen[self.space.key(params)] = time_s
        self.evaluations.append(Evaluation(params=params, time_s=time_s))
        self.elapsed_s.append(time.perf_counter() - self.start_s)
        if self.progress is not None:
            self.progress(len(self.evaluations), self.planned, self.best_time_s)
        return time_s

    @property
    def best_time_s(self) -> float:
        return min((e.time_s for e in self.evaluations), default=math.inf)

    def result(self, method: str, warm_started: int = 0) -> SearchResult:
        if not self.evaluations:
            raise ValueError(f"{method} search evaluated no config: give a budget of at least 1")
        best = min(self.evaluations, key=lambda e: e.time_s)
        return SearchResult(
            method=method,
            best_params=dict(best.params),
            best_time_s=best.time_s,
            evaluations=tuple(self.evaluations),
            elapsed_s=tuple(self.elapsed_s),
            wall_s=time.perf_counter() - self.start_s,
            warm_started=warm_started,
        )


def _cardinality(space: SearchSpace) -> int:
    """Distinct configs BO and random search can draw (every integer, or every power of two)."""
    total = 1
    for p in space.params:
        total *= int(math.log2(p.high)) - int(math.log2(p.low)) + 1 if p.scale == "pow2" else p.high - p.low + 1
    return total


def _check_budget(budget: int, method: str) -> None:
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"{method} search needs a budget of at least 1 evaluation, got {budget!r}")


def default_budget(space: SearchSpace) -> int:
    """BO's and random search's default budget: a third of the grid, between 4 and 20 evaluations.

    Example:
        >>> from cswap.tuner.space import load_search_space
        >>> default_budget(load_search_space("cpu", "compress", cores=2))
        7
    """
    return max(4, min(20, space.grid_size // 3))


def grid_search(
    space: SearchSpace,
    objective: ObjectiveFn,
    progress: ProgressFn | None = None,
    max_points: int = _MAX_GRID_POINTS,
) -> SearchResult:
    """Evaluate every config of the discretized space (``space.grid_points()``).

    Args:
        space: the search space.
        objective: seconds of a config.
        progress: called after each evaluation.
        max_points: refuse larger grids (``ValueError``), which would run for hours.
    """
    if space.grid_size > max_points:
        raise ValueError(
            f"grid search over {space.grid_size} configs of {space.kernel} exceeds max_points="
            f"{max_points}: list coarser `grid:` values in {space.source or 'the search space'} or use method bo"
        )
    recorder = _Recorder(space, objective, space.grid_size, progress)
    for params in space.grid_points():
        recorder.evaluate(params)
    return recorder.result("grid")


def random_search(
    space: SearchSpace,
    objective: ObjectiveFn,
    budget: int,
    seed: int = 0,
    progress: ProgressFn | None = None,
) -> SearchResult:
    """Evaluate ``budget`` distinct configs drawn like BO's random points (log-uniform on log scales).

    Stops early when the space has fewer distinct configs than the budget.
    """
    from skopt.space import Space

    _check_budget(budget, "random")
    budget = min(budget, _cardinality(space))
    recorder = _Recorder(space, objective, budget, progress)
    dims = space.dimensions()
    if not dims:
        recorder.evaluate(space.from_point([]))
        return recorder.result("random")
    sampler = Space(dims)
    rng = np.random.RandomState(seed)
    draws = 0
    while len(recorder.evaluations) < budget and draws < 100 * budget:
        draws += 1
        params = space.from_point(sampler.rvs(random_state=rng)[0])
        if recorder.measured(params) is None:
            recorder.evaluate(params)
    return recorder.result("random")


@contextmanager
def _quiet_model() -> Iterator[None]:
    """Fit and query the surrogate on one BLAS thread, without skopt's repeat warnings.

    The GP's matrices are tiny: BLAS threads only contend with each other (and with the kernels
    being timed), which made each fit several times slower on a busy machine.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The objective has been evaluated")
        yield


def _told(time_s: float, worst_finite_s: float | None) -> float:
    if math.isfinite(time_s):
        return math.log(max(time_s, 1e-12))
    return math.log(_FAILURE_PENALTY * worst_finite_s if worst_finite_s else _FIRST_FAILURE_S)


def bo_search(
    space: SearchSpace,
    objective: ObjectiveFn,
    budget: int,
    seed: int = 0,
    warm_start: Iterable[Mapping[str, Any]] = (),
    progress: ProgressFn | None = None,
    n_initial_points: int | None = None,
) -> SearchResult:
    """Bayesian optimization: GP surrogate of log-seconds, expected improvement, ``budget`` evaluations.

    Args:
        space: the search space.
        objective: seconds of a config.
        budget: evaluations (warm-start ones included).
        seed: seeds the initial design and the acquisition sampling.
        warm_start: configs to evaluate and tell first (e.g. the scaled configs of another
            device, :attr:`cswap.tuner.store.LookupResult.warm_start`); projected onto ``space``,
            at most ``n_initial_points`` of them are used.
        progress: called after each evaluation.
        n_initial_points: configs before the model guides (default ``max(2, ceil(budget / 3))``).

    Example:
        >>> from cswap.tuner.space import Param, SearchSpace
        >>> space = SearchSpace("cpu", "compress", (Param("threads", 1, 64, "linear", tuple(range(1, 65))),))
        >>> result = bo_search(space, lambda p: (p["threads"] - 40) ** 2 + 1.0, budget=12, seed=0)
        >>> abs(result.best_params["threads"] - 40) <= 2
        True
    """
    from skopt import Optimizer

    _check_budget(budget, "bo")
    budget = min(budget, _cardinality(space))
    n_initial = n_initial_points if n_initial_points is not None else max(2, math.ceil(budget / 3))
    recorder = _Recorder(space, objective, budget, progress)
    dims = space.dimensions()
    if not dims:
        recorder.evaluate(space.from_point([]))
        return recorder.result("bo")

    warm: list[dict[str, int]] = []
    for params in warm_start:
        projected = space.project(params)
        if projected not in warm:
            warm.append(projected)
    warm = warm[: max(1, min(n_initial, budget))]

    cardinality = _cardinality(space)
    told: set[tuple[int, ...]] = set()

    def untold(point: list[Any]) -> bool:
        return tuple(point) not in told

    # The constraint keeps the acquisition's candidates to configs not told yet, so in small
    # discrete spaces the model's next pick is the best new config rather than a repeat; 20
    # candidates per config make it see every config of such a space.
    optimizer = Optimizer(
        dims,
        base_estimator="GP",
        acq_func="EI",
        acq_optimizer="sampling",
        acq_optimizer_kwargs={"n_points": min(10_000, 20 * cardinality)},
        n_initial_points=n_initial,
        initial_point_generator="lhs",
        random_state=seed,
        space_constraint=untold,
    )
    worst_s: float | None = None

    def tell(params: dict[str, int], time_s: float) -> None:
        nonlocal worst_s
        if math.isfinite(time_s):
            worst_s = max(worst_s or 0.0, time_s)
        point = space.to_point(params)
        # tell() checks the point against the constraint: a repeat is let through once more.
        told.discard(tuple(point))
        with _quiet_model():
            optimizer.tell(point, _told(time_s, worst_s))
        told.add(tuple(point))

    for params in warm:
        tell(params, recorder.evaluate(params))
    asks = 0
    while len(recorder.evaluations) < budget and asks < 20 * budget:
        asks += 1
        with _quiet_model():
            params = space.from_point(optimizer.ask())
        cached = recorder.measured(params)
        # An initial-design point may repeat a warm start: telling its known time moves the design on.
        tell(params, cached if cached is not None else recorder.evaluate(params))
    return recorder.result("bo", warm_started=len(warm))


def expert_params(space: SearchSpace, units: int) -> dict[str, int]:
    """The expert rule's config, projected onto ``space``.

    CUDA: every kernel's block 256 and grid 4 x ``units`` (SMs), except the scan over chunk counts,
    which keeps the codec's default single 1024-thread block. CPU: ``units`` threads (cores) and
    ``chunk_words`` 32.

    Args:
        space: the search space.
        units: SM count on CUDA, cores on CPU (``DeviceFingerprint.sm_count``).

    Example:
        >>> from cswap.tuner.space import load_search_space
        >>> expert_params(load_search_space("cuda", "decompress"), units=132)
        {'decompress_grid': 528, 'decompress_block': 256}
    """
    rule: dict[str, int] = {}
    default = CudaLaunch()
    for name in space.names:
        if name == "threads":
            rule[name] = units
        elif name == "chunk_words":
            rule[name] = DEFAULT_CHUNK_WORDS
        elif name.startswith("scan_"):
            rule[name] = getattr(default, name)
        elif name.endswith("_block"):
            rule[name] = 256
        elif name.endswith("_grid"):
            rule[name] = 4 * units
    return space.project(rule)


def expert_search(
    space: SearchSpace, objective: ObjectiveFn, units: int, progress: ProgressFn | None = None
) -> SearchResult:
    """Evaluate the one config of :func:`expert_params`."""
    recorder = _Recorder(space, objective, 1, progress)
    recorder.evaluate(expert_params(space, units))
    return recorder.result("expert")


def search(
    method: str,
    space: SearchSpace,
    objective: ObjectiveFn,
    budget: int | None = None,
    seed: int = 0,
    warm_start: Sequence[Mapping[str, Any]] = (),
    progress: ProgressFn | None = None,
    units: int = 1,
) -> SearchResult:
    """Run search ``method`` (one of :data:`METHODS`).

    Args:
        method: ``bo``, ``grid``, ``random`` or ``expert``.
        space: the search space.
        objective: seconds of a config (``math.inf`` for one that fails).
        budget: evaluations for ``bo`` and ``random`` (default :func:`default_budget`); grid and
            expert ignore it.
        seed: for ``bo`` and ``random``.
        warm_start: configs ``bo`` evaluates first; the other methods ignore them.
        progress: called after each evaluation with (done, planned, best seconds).
        units: SMs or cores, for ``expert``.
    """
    if method not in METHODS:
        raise ValueError(f"unknown search method {method!r}: choose one of {', '.join(METHODS)}")
    budget = default_budget(space) if budget is None else budget
    if method == "bo":
        return bo_search(space, objective, budget, seed, warm_start, progress)
    if method == "random":
        return random_search(space, objective, budget, seed, progress)
    if method == "grid":
        return grid_search(space, objective, progress)
    return expert_search(space, objective, units, progress)
