"""Where compression stops paying (sparsity x link bandwidth), and what each memory budget costs.

For one model and hardware profile, :func:`sweep` regenerates the meta trace at each ReLU-output
sparsity (pooling and concatenation follow it through the :class:`SparsityModel`) and replaces the
profile's link bandwidth (both ways) with each value, then simulates ``swap``, ``compress-swap``
and ``cswap``. The break-even sparsity at a bandwidth is where ``compress-swap`` and ``swap`` take
the same time (linear interpolation between grid points); below it static compression loses.

:func:`budget_sweep` plans and simulates each policy and strategy at each of several memory
budgets: the iteration time a user pays for each budget (:func:`cswap.simulate.plot.plot_budget_sweep`).

Example:
    >>> result = sweep("vgg11", batch_size=2, resolution=32, width_mult=0.125,
    ...                sparsities=(0.0, 0.9), bandwidths_gbps=(1.0, 1000.0))
    >>> result.speedup().shape
    (2, 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cswap.budget import parse_budget
from cswap.simulate.budgeted import BudgetOutcome, none_peak_bytes, planning_problem
from cswap.simulate.engine import SimConfig, Simulator
from cswap.simulate.hardware import HardwareProfile, load_hardware
from cswap.simulate.metatrace import SparsityModel, meta_trace
from cswap.simulate.strategies import Strategies
from cswap.simulate.versus import run_side_by_side

__all__ = ["BudgetSweep", "SweepResult", "budget_sweep", "sweep", "with_link"]

DEFAULT_SPARSITIES: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
DEFAULT_BANDWIDTHS_GBPS: tuple[float, ...] = (4.0, 8.0, 12.0, 16.0, 25.0, 32.0, 50.0, 64.0, 100.0, 200.0, 450.0)


def with_link(profile: HardwareProfile, gbps: float) -> HardwareProfile:
    """``profile`` with its link at ``gbps`` each way.

    Example:
        >>> with_link(load_hardware("v100-pcie3"), 25.0).link.h2d_gbps
        25.0
    """
    link = profile.link.model_copy(update={"h2d_gbps": float(gbps), "d2h_gbps": float(gbps), "name": f"{gbps:g} GB/s link"})
    return profile.model_copy(update={"link": link})


@dataclass(frozen=True)
class SweepResult:
    """Iteration seconds per (sparsity, bandwidth) for ``swap``, ``compress-swap`` and ``cswap``.

    Arrays are indexed ``[sparsity index, bandwidth index]``.
    """

    model: str
    hardware: str
    batch_size: int
    resolution: int
    sparsities: tuple[float, ...]
    bandwidths_gbps: tuple[float, ...]
    swap_s: np.ndarray
    compress_swap_s: np.ndarray
    cswap_s: np.ndarray
    none_s: np.ndarray

    def speedup(self) -> np.ndarray:
        """``swap_s / compress_swap_s``: above 1, static compression pays."""
        return self.swap_s / self.compress_swap_s

    def cswap_speedup(self) -> np.ndarray:
        """``swap_s / cswap_s`` (never below 1)."""
        return self.swap_s / self.cswap_s

    def break_even(self) -> list[float | None]:
        """Per bandwidth, the sparsity where ``compress-swap`` starts to beat ``swap``.

        ``None`` when it never does on the grid; the lowest sparsity when it always does.
        """
        speed = self.speedup()
        found: list[float | None] = []
        for j in range(len(self.bandwidths_gbps)):
            column = speed[:, j]
            value = None
            for i, ratio in enumerate(column):
                if ratio >= 1.0:
                    if i == 0:
                        value = self.sparsities[0]
                    else:
                        s0, s1, r0 = self.sparsities[i - 1], self.sparsities[i], column[i - 1]
                        value = s0 + (1.0 - r0) * (s1 - s0) / (ratio - r0)
                    break
            found.append(value)
        return found

    def rows(self) -> list[dict[str, Any]]:
        """One JSON-ready dict per grid point."""
        out = []
        for i, sparsity in enumerate(self.sparsities):
            for j, gbps in enumerate(self.bandwidths_gbps):
                out.append(
                    {
                        "model": self.model,
                        "hardware": self.hardware,
                        "sparsity": sparsity,
                        "link_gbps": gbps,
                        "none_s": float(self.none_s[i, j]),
                        "swap_s": float(self.swap_s[i, j]),
                        "compress_swap_s": float(self.compress_swap_s[i, j]),
                        "cswap_s": float(self.cswap_s[i, j]),
                        "compress_swap_speedup": float(self.swap_s[i, j] / self.compress_swap_s[i, j]),
                        "cswap_speedup": float(self.swap_s[i, j] / self.cswap_s[i, j]),
                    }
                )
        return out


def sweep(
    model: str = "vgg16",
    hardware: str | HardwareProfile = "v100-pcie3",
    batch_size: int = 64,
    resolution: int = 224,
    sparsities: Sequence[float] = DEFAULT_SPARSITIES,
    bandwidths_gbps: Sequence[float] = DEFAULT_BANDWIDTHS_GBPS,
    config: SimConfig | None = None,
    width_mult: float = 1.0,
) -> SweepResult:
    """Simulate ``swap``, ``compress-swap`` and ``cswap`` over a sparsity x bandwidth grid.

    Args:
        model: a model name for :func:`meta_trace`.
        hardware: the profile whose compute and codec speeds are kept.
        batch_size, resolution, width_mult: the model's input and size.
        sparsities: ReLU-output sparsities.
        bandwidths_gbps: link bandwidths, each way.
        config: simulation settings.
    """
    profile = load_hardware(hardware)
    shape = (len(sparsities), len(bandwidths_gbps))
    grids = {name: np.zeros(shape) for name in ("none", "swap", "compress-swap", "cswap")}
    links = [with_link(profile, gbps) for gbps in bandwidths_gbps]
    for i, sparsity in enumerate(sparsities):
        trace = meta_trace(model, batch_size, resolution, profile, sparsity=SparsityModel(relu=float(sparsity)), width_mult=width_mult)
        for j, linked in enumerate(links):
            simulator = Simulator(trace, linked, config)
            for name, grid in grids.items():
                grid[i, j] = simulator.run(name).iteration_s
    return SweepResult(
        model=model,
        hardware=profile.name,
        batch_size=batch_size,
        resolution=resolution,
        sparsities=tuple(float(s) for s in sparsities),
        bandwidths_gbps=tuple(float(b) for b in bandwidths_gbps),
        swap_s=grids["swap"],
        compress_swap_s=grids["compress-swap"],
        cswap_s=grids["cswap"],
        none_s=grids["none"],
    )


@dataclass(frozen=True)
class BudgetSweep:
    """Iteration seconds per policy over a range of memory budgets (one trace, one profile).

    Attributes:
        model, hardware: what was simulated.
        none_peak_bytes: policy ``none``'s activation peak (the budget's 1.0).
        budgets_bytes: the budgets, in the order given.
        outcomes: per budget, per policy, its :class:`~cswap.simulate.budgeted.BudgetOutcome`.
    """

    model: str
    hardware: str
    none_peak_bytes: int
    budgets_bytes: tuple[int, ...]
    outcomes: tuple[dict[str, BudgetOutcome], ...]

    def iteration_s(self, policy: str) -> list[float | None]:
        """Per budget, ``policy``'s iteration seconds (``None`` where it cannot meet the budget)."""
        return [None if row[policy].infeasible else row[policy].result.iteration_s for row in self.outcomes]  # type: ignore[union-attr]

    def rows(self) -> list[dict[str, Any]]:
        """One JSON-ready dict per budget: ``budget_bytes`` and each policy's figures."""
        return [
            {"budget_bytes": budget, "policies": {name: outcome.to_dict() for name, outcome in row.items()}}
            for budget, row in zip(self.budgets_bytes, self.outcomes)
        ]


def budget_sweep(
    simulator: Simulator,
    policies: Sequence[str],
    budgets: Sequence[float | int | str],
    time_limit_s: float = 30.0,
    host_budget: int | str | None = None,
) -> BudgetSweep:
    """Plan and simulate every policy and strategy (:mod:`cswap.simulate.strategies`) at every budget
    (any form :func:`cswap.budget.parse_budget` reads), side by side
    (:func:`cswap.simulate.versus.run_side_by_side`: ``cswap`` takes a strategy's plan where it is faster),
    all within ``host_budget`` on the host when one is given (policies only: the strategies plan none).

    Example:
        >>> from cswap.simulate.metatrace import meta_trace
        >>> sim = Simulator(meta_trace("vgg11", 2, 32, width_mult=0.125), "v100-pcie3", SimConfig(min_bytes=0))
        >>> result = budget_sweep(sim, ("none", "swap"), (1.0, 0.5))
        >>> result.iteration_s("none")[1] is None, result.iteration_s("swap")[1] is not None
        (True, True)
    """
    problem, _ = planning_problem(simulator)
    none_peak = none_peak_bytes(problem)
    resolved = []
    for budget in budgets:
        parsed = parse_budget(budget)
        if parsed is None:
            raise ValueError("a budget sweep needs budgets, got None")
        resolved.append(parsed.resolve(none_peak))
    strategies = Strategies(simulator, time_limit_s)
    outcomes = tuple(
        run_side_by_side(simulator, policies, nbytes, time_limit_s, problem=problem, strategies=strategies, host_budget=host_budget)
        for nbytes in resolved
    )
    return BudgetSweep(
        model=str(simulator.trace.meta.get("model", "")),
        hardware=simulator.hardware.name,
        none_peak_bytes=none_peak,
        budgets_bytes=tuple(resolved),
        outcomes=outcomes,
    )
