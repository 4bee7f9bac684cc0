"""The planners' HiGHS call: a crash inside the solver is retried without presolve, then answered by the fallback."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint

from cswap.planner import highs
from cswap.planner.lifetime import lifetimes_from_orders
from cswap.planner.milp import least_peak, solve_milp
from cswap.planner.problem import LinkModel, TensorSpec, build_problem

real_milp = highs.milp


def _crashing(crash_with_presolve: bool, crash_without: bool, seen: list[bool]) -> Any:
    """A ``milp`` that raises as HiGHS's presolve bug does (``std::length_error`` through pybind11) when told to."""
    def milp(*args: Any, options: dict[str, Any], **kwargs: Any) -> Any:
        seen.append(options["presolve"])
        if crash_with_presolve if options["presolve"] else crash_without:
            raise ValueError("vector::reserve")
        return real_milp(*args, options=options, **kwargs)
    return milp


def _program() -> tuple[np.ndarray, list[LinearConstraint], np.ndarray, Bounds]:
    # pick two of four items, least cost: items 1 and 3
    return np.array([3.0, 1.0, 4.0, 2.0]), [LinearConstraint(np.ones((1, 4)), 2, 2)], np.ones(4), Bounds(0, 1)


def _problem():  # type: ignore[no-untyped-def]
    events = lifetimes_from_orders([0, 1, 2], [2, 1, 0])
    sizes = [4000, 1000, 2000]
    specs = [TensorSpec(key=k, nbytes=n, lifetime=lt) for k, (n, lt) in enumerate(zip(sizes, events.lifetimes))]
    return build_problem(specs, events, [0, 1, 2, 3, 4, 5], 2.5, LinkModel(1e-6, 1e-6, async_copies=False))


def test_a_program_solves_with_presolve_on(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    monkeypatch.setattr(highs, "milp", _crashing(False, False, seen))
    result = highs.solve(*_program(), {})
    assert result.x.round().tolist() == [0.0, 1.0, 0.0, 1.0] and result.status == 0 and seen == [True]


def test_a_crash_in_presolve_is_solved_again_without_it(monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder) -> None:
    seen: list[bool] = []
    monkeypatch.setattr(highs, "milp", _crashing(True, False, seen))
    result = highs.solve(*_program(), {"time_limit": 5.0})
    assert seen == [True, False]
    assert result.x.round().tolist() == [0.0, 1.0, 0.0, 1.0] and result.status == 0
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_a_crash_both_ways_gives_no_solution_and_one_warning_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    monkeypatch.setattr(highs, "milp", _crashing(True, True, seen))
    with pytest.warns(RuntimeWarning, match=r"HiGHS\) failed .*with presolve: ValueError: vector::reserve; without presolve"):
        result = highs.solve(*_program(), {})
    assert result.x is None and result.status == highs.FAILED_STATUS and not result.success and seen == [True, False]


def test_the_planners_answer_by_their_fallbacks_when_the_solver_crashes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget plan is the greedy one, still within the budget; the least peak is the rule's."""
    problem = _problem()
    solved = solve_milp(problem, "swap", 5000, greedy=False)
    least = least_peak(problem, "swap")
    monkeypatch.setattr(highs, "milp", _crashing(True, True, []))
    with pytest.warns(RuntimeWarning, match="HiGHS"):
        fallback = solve_milp(problem, "swap", 5000)
    assert fallback.status == "greedy" and fallback.peak_bytes <= 5000
    assert fallback.actions == solved.actions  # on this small problem the greedy finds the optimum too
    with pytest.warns(RuntimeWarning, match="HiGHS"):
        assert least_peak(problem, "swap") >= least
