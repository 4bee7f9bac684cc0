"""Launch-config search methods compared on this device: random, expert, BO and grid, and warm-started BO.

For each case (kernel op, dtype, tensor size) the benchmark

1. runs grid search (every config of the discretized space, each the median of ``--repeats``
   calls, as tuning measures it): its wall time and evaluations are grid's cost. It also
   measures the **reference table**: ``--rounds`` passes over every config (order rotated each
   pass) of ``--repeats`` calls, spread over the whole case (one before the searches, the rest
   between seeds), so every config is sampled at many moments; a config's reference time is
   its fastest call. Other processes on a shared machine only ever add time, and they hurt
   multi-threaded configs most (their threads wait for each other, so a busy neighbour makes
   a 2-thread config 10x slower for seconds at a time): the fastest call estimates the
   kernel's undisturbed speed where a median would mostly measure the neighbours' load. The
   table's fastest config is **grid's best**.
2. runs each method with ``--seeds`` seeds (same budget for BO and random: a third of the grid
   unless ``--budget``), each evaluation measured afresh like a real tuning run;
3. scores each run: it **reaches** grid's best at the first evaluation whose config's reference
   time is within 5% of grid's best (judging by the reference table rather than by the run's own
   single measurement keeps one lucky or unlucky sample from deciding). Configs off the grid (BO
   and random on CUDA log-scale grids) are re-measured ``--rounds`` times when first seen.
4. compares BO warm-started from another device's configs with cold BO. The other device is
   played by a peer fingerprint (same kind, different name and core count) whose runs are the grid
   pass of the same kernel at a 4x smaller size, measured here: its configs reach this device the
   way a real peer's would, through ``ConfigStore.lookup`` (``match == "transferred"``) and
   ``LookupResult.warm_start``.

Figures, averaged over seeds (``reach_rate`` is the fraction of seeds that reached; the
``*_to_reach`` means are over those seeds):

* ``best_time_s``: the run's own best measurement; ``best_ref_s``: the reference time of its best config.
* ``best_vs_grid``: ``best_ref_s`` / grid's best (1.0 = as good as exhaustive search).
* ``evals_to_reach``, ``wall_s_to_reach``: evaluations and seconds (search overhead included)
  until it reached; ``evals_vs_grid`` = ``evals_to_reach`` / grid's evaluations,
  ``wall_vs_grid`` = ``wall_s_to_reach`` / grid's wall seconds.
* For warm start: the same for warm and cold BO, and ``warm_vs_cold_evals``.

``--codec`` picks whose kernels (``zvc`` by default, ``bitpack``, ``exponent``), on ``--dtype``
(default float32; bit-packing: bool), each on its own search space and representative tensor.

Usage:
    python benchmarks/tuning.py              # rich tables
    python benchmarks/tuning.py --codec exponent --dtype bfloat16 --json
    python benchmarks/tuning.py --json       # JSON lines: a header, one per (case, method), one per warm-start case
    python benchmarks/tuning.py --quick      # one small case, 3 seeds
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from collections.abc import Mapping

import torch

from cswap.device import fingerprint
from cswap.tuner.kernels import default_dtype, dtype_name, kernel_name, kernel_source_hash
from cswap.tuner.objective import KernelObjective, check_tunable
from cswap.tuner.search import SearchResult, bo_search, default_budget, expert_search, random_search
from cswap.tuner.space import SearchSpace, load_search_space
from cswap.tuner.store import ConfigStore, Evaluation, TuningRun, size_bucket

REACH = 1.05


@dataclass(frozen=True)
class MethodRow:
    """One method on one case, averaged over seeds."""

    case: str
    method: str
    seeds: int
    budget: int
    evaluations: float
    wall_s: float
    best_time_s: float
    best_ref_s: float
    best_vs_grid: float
    reach_rate: float
    evals_to_reach: float | None
    wall_s_to_reach: float | None
    evals_vs_grid: float | None
    wall_vs_grid: float | None


@dataclass(frozen=True)
class WarmRow:
    """Warm-started against cold BO on one case."""

    case: str
    source: str
    warm_start_configs: int
    seeds: int
    budget: int
    cold_reach_rate: float
    warm_reach_rate: float
    cold_evals_to_reach: float | None
    warm_evals_to_reach: float | None
    cold_wall_s_to_reach: float | None
    warm_wall_s_to_reach: float | None
    cold_best_vs_grid: float
    warm_best_vs_grid: float
    warm_vs_cold_evals: float | None


class Reference:
    """Grid search, then the reference times of configs (fastest call over interleaved passes), extended on demand."""

    def __init__(self, space: SearchSpace, objective: KernelObjective, rounds: int) -> None:
        self.space = space
        self.rounds = rounds
        self.fastest = KernelObjective(
            objective.backend, objective.op, objective.dtype, objective.nbytes, repeats=objective.repeats, statistic=min,
            codec=objective.codec,
        )
        self.samples: dict[tuple[int, ...], list[float]] = {}
        self.points = list(space.grid_points())
        start_s = time.perf_counter()
        self.grid_pass = [Evaluation(params, objective(params)) for params in self.points]
        self.grid_wall_s = time.perf_counter() - start_s
        self.passes = 0

    def add_pass(self) -> None:
        """One more pass over every grid config, starting at a rotated position."""
        shift = self.passes * len(self.points) // self.rounds
        for params in self.points[shift:] + self.points[:shift]:
            self.samples.setdefault(self.space.key(params), []).append(self.fastest(params))
        self.passes += 1

    @property
    def best_params(self) -> dict[str, int]:
        """Grid's best: the config with the fastest reference time."""
        return min(self.points, key=self.time_s)

    @property
    def best_s(self) -> float:
        """Its reference time."""
        return self.time_s(self.best_params)

    def time_s(self, params: Mapping[str, int]) -> float:
        key = self.space.key(params)
        if key not in self.samples:
            self.samples[key] = [self.fastest(params) for _ in range(self.rounds)]
        return min(self.samples[key])

    def reached_at(self, result: SearchResult) -> int | None:
        """1-based index of the first evaluation whose config is within 5% of grid's best."""
        for index, evaluation in enumerate(result.evaluations, start=1):
            if self.time_s(evaluation.params) <= REACH * self.best_s:
                return index
        return None


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _ratio(value: float | None, baseline: float) -> float | None:
    return None if value is None or not baseline else value / baseline


def _method_row(case: str, method: str, budget: int, results: list[SearchResult], ref: Reference) -> MethodRow:
    reached = [(ref.reached_at(r), r) for r in results]
    hits = [(i, r) for i, r in reached if i is not None]
    evals_to_reach = _mean([float(i) for i, _ in hits])
    wall_to_reach = _mean([r.elapsed_s[i - 1] for i, r in hits])
    best_ref = statistics.fmean(ref.time_s(r.best_params) for r in results)
    return MethodRow(
        case=case, method=method, seeds=len(results), budget=budget,
        evaluations=statistics.fmean(len(r.evaluations) for r in results),
        wall_s=statistics.fmean(r.wall_s for r in results),
        best_time_s=statistics.fmean(r.best_time_s for r in results),
        best_ref_s=best_ref, best_vs_grid=best_ref / ref.best_s,
        reach_rate=len(hits) / len(results),
        evals_to_reach=evals_to_reach, wall_s_to_reach=wall_to_reach,
        evals_vs_grid=_ratio(evals_to_reach, ref.space.grid_size),
        wall_vs_grid=_ratio(wall_to_reach, ref.grid_wall_s),
    )


def _grid_row(case: str, ref: Reference) -> MethodRow:
    best = min(ref.grid_pass, key=lambda e: e.time_s)
    best_ref = ref.time_s(best.params)
    size = ref.space.grid_size
    # Grid search knows it holds the best only after the whole pass: it reaches at its last evaluation.
    return MethodRow(
        case=case, method="grid", seeds=1, budget=size, evaluations=size, wall_s=ref.grid_wall_s,
        best_time_s=best.time_s, best_ref_s=best_ref, best_vs_grid=best_ref / ref.best_s,
        reach_rate=1.0 if best_ref <= REACH * ref.best_s else 0.0, evals_to_reach=float(size),
        wall_s_to_reach=ref.grid_wall_s, evals_vs_grid=1.0, wall_vs_grid=1.0,
    )


def _peer_warm_start(
    backend: str, op: str, dtype: str, nbytes: int, space: SearchSpace, repeats: int, store: ConfigStore
) -> tuple[tuple[dict[str, int], ...], str]:
    """The warm start a peer device's grid run gives this device through the store."""
    here = fingerprint(backend)
    peer = {**here.to_dict(), "name": f"{here.name} (peer)", "sm_count": here.sm_count * 2}
    peer_objective = KernelObjective(backend, op, dtype, max(nbytes // 4, 1), repeats=repeats, codec=space.codec)
    evaluations = tuple(Evaluation(p, peer_objective(p)) for p in space.grid_points())
    best = min(evaluations, key=lambda e: e.time_s)
    source_hash = kernel_source_hash(backend, space.codec)
    kernel = space.kernel
    store.record_run(TuningRun(
        fingerprint=peer, kernel=kernel, source_hash=source_hash, dtype=dtype, bucket=size_bucket(nbytes),
        method="grid", best_params=best.params, best_time_s=best.time_s, evaluations=evaluations,
    ))
    found = store.lookup(here, kernel, source_hash, dtype, size_bucket(nbytes))
    if found.match != "transferred":
        raise RuntimeError(f"expected a transferred config from the peer, the store answered {found.match}")
    return found.warm_start, peer["name"]


def run_case(
    backend: str, op: str, dtype: str, nbytes: int, seeds: int, repeats: int, rounds: int, budget: int | None,
    log: Any, codec: str = "zvc",
) -> tuple[list[MethodRow], WarmRow, dict[str, Any]]:
    """Every method on one case; returns the method rows, the warm-start row and the case facts."""
    space = load_search_space(backend, op, codec=codec)
    case = f"{kernel_name(backend, op, codec)}/{dtype}/{nbytes >> 10}KiB"
    objective = KernelObjective(backend, op, dtype, nbytes, repeats=repeats, codec=codec)
    budget = budget or default_budget(space)
    units = fingerprint(backend).sm_count
    log(f"{case}: grid search over {space.grid_size} configs, then {rounds} reference passes between the seeds")
    ref = Reference(space, objective, rounds)
    ref.add_pass()
    by_method: dict[str, list[SearchResult]] = {"random": [], "expert": [], "bo": []}
    warm_results: list[SearchResult] = []
    with tempfile.TemporaryDirectory() as tmp:
        warm, source = _peer_warm_start(backend, op, dtype, nbytes, space, repeats, ConfigStore(Path(tmp) / "store.db"))
    for seed in range(seeds):
        log(f"{case}: seed {seed}")
        by_method["random"].append(random_search(space, objective, budget, seed))
        by_method["expert"].append(expert_search(space, objective, units))
        by_method["bo"].append(bo_search(space, objective, budget, seed))
        warm_results.append(bo_search(space, objective, budget, seed, warm_start=warm))
        if ref.passes < rounds * (seed + 1) // seeds:
            ref.add_pass()
    while ref.passes < rounds:
        ref.add_pass()
    rows = [_grid_row(case, ref)]
    for method, results in by_method.items():
        rows.append(_method_row(case, method, 1 if method == "expert" else budget, results, ref))
    cold, warm_row = rows[-1], _method_row(case, "bo-warm", budget, warm_results, ref)
    warm_vs_cold = WarmRow(
        case=case, source=source, warm_start_configs=len(warm), seeds=seeds, budget=budget,
        cold_reach_rate=cold.reach_rate, warm_reach_rate=warm_row.reach_rate,
        cold_evals_to_reach=cold.evals_to_reach, warm_evals_to_reach=warm_row.evals_to_reach,
        cold_wall_s_to_reach=cold.wall_s_to_reach, warm_wall_s_to_reach=warm_row.wall_s_to_reach,
        cold_best_vs_grid=cold.best_vs_grid, warm_best_vs_grid=warm_row.best_vs_grid,
        warm_vs_cold_evals=None if cold.evals_to_reach is None or warm_row.evals_to_reach is None
        else warm_row.evals_to_reach / cold.evals_to_reach,
    )
    facts = {
        "case": case, "grid_size": space.grid_size, "grid_best_params": ref.best_params, "grid_best_s": ref.best_s,
        "configs_within_5pct": sum(1 for p in space.grid_points() if ref.time_s(p) <= REACH * ref.best_s),
        "reference_spread": max(ref.time_s(p) for p in space.grid_points()) / ref.best_s,
    }
    return rows, warm_vs_cold, facts


def _print_tables(header: dict[str, Any], cases: list[tuple[list[MethodRow], WarmRow, dict[str, Any]]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"{header['device']} ({header['backend']}), {header['seeds']} seeds, {header['repeats']} repeats "
                  f"x {header['rounds']} reference rounds")
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    for rows, warm, facts in cases:
        table = Table(title=f"{facts['case']}: grid best {facts['grid_best_s'] * 1e3:.3f} ms at {facts['grid_best_params']}, "
                            f"{facts['configs_within_5pct']}/{facts['grid_size']} configs within 5%")
        for column in ("method", "budget", "best ms", "best/grid", "reached", "evals to 5%", "evals/grid", "s to 5%", "wall/grid"):
            table.add_column(column, justify="right")
        for r in rows:
            table.add_row(r.method, str(r.budget), f"{r.best_ref_s * 1e3:.3f}", f"{r.best_vs_grid:.3f}",
                          f"{r.reach_rate:.0%}", fmt(r.evals_to_reach, ".1f"), fmt(r.evals_vs_grid, ".2f"),
                          fmt(r.wall_s_to_reach, ".2f"), fmt(r.wall_vs_grid, ".2f"))
        console.print(table)
        console.print(f"  warm BO ({warm.warm_start_configs} configs from {warm.source}): reached {warm.warm_reach_rate:.0%} "
                      f"in {fmt(warm.warm_evals_to_reach, '.1f')} evals vs cold {warm.cold_reach_rate:.0%} in "
                      f"{fmt(warm.cold_evals_to_reach, '.1f')} (warm/cold {fmt(warm.warm_vs_cold_evals, '.2f')})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--ops", default="compress,decompress", help="comma-separated: compress, decompress")
    parser.add_argument("--codec", default="zvc", choices=("zvc", "bitpack", "exponent"))
    parser.add_argument("--dtype", default=None, help="default: float32 (bitpack: bool)")
    parser.add_argument("--sizes-mib", default="4", help="comma-separated tensor sizes in MiB (powers of 4 are bucket edges)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=9, help="timed calls per evaluation (median)")
    parser.add_argument("--rounds", type=int, default=6, help="passes of the reference table, spread over the case")
    parser.add_argument("--budget", type=int, default=None, help="BO and random evaluations (default: a third of the grid)")
    parser.add_argument("--json", action="store_true", help="JSON lines instead of tables")
    parser.add_argument("--quick", action="store_true", help="one 1 MiB compress case, 3 seeds, 3 rounds")
    args = parser.parse_args()
    if args.quick:
        args.ops, args.sizes_mib, args.seeds, args.rounds = "compress", "1", 3, 3
    check_tunable(args.backend)
    dtype = dtype_name(args.dtype or default_dtype(args.codec), args.codec)
    device = fingerprint(args.backend)
    header = {
        "benchmark": "tuning", "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "backend": args.backend, "codec": args.codec, "dtype": dtype, "device": device.name, "cores_or_sms": device.sm_count, "torch": torch.__version__,
        "seeds": args.seeds, "repeats": args.repeats, "rounds": args.rounds, "reach": REACH,
        "load_avg_1m_start": os.getloadavg()[0],
    }
    log = (lambda message: None) if args.json else (lambda message: print(message, flush=True))
    if args.json:
        print(json.dumps(header), flush=True)
    cases = []
    for op in args.ops.split(","):
        for size in args.sizes_mib.split(","):
            nbytes = int(float(size) * (1 << 20))
            rows, warm, facts = run_case(args.backend, op, dtype, nbytes, args.seeds, args.repeats, args.rounds,
                                         args.budget, log, args.codec)
            cases.append((rows, warm, facts))
            if args.json:
                for row in rows:
                    print(json.dumps({"kind": "method", **facts, **asdict(row)}), flush=True)
                print(json.dumps({"kind": "warm_start", **asdict(warm)}), flush=True)
    if args.json:
        print(json.dumps({"kind": "end", "load_avg_1m_end": os.getloadavg()[0]}), flush=True)
    else:
        _print_tables(header, cases)


if __name__ == "__main__":
    main()
