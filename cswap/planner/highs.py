"""Run HiGHS (SciPy's ``milp``) for the planners: its stray output kept off stdout, its crashes retried.

HiGHS's presolve has crashed on valid programs in released versions (an out-of-range index or a
``std::length_error`` from a vector it sizes, raised through SciPy as ``ValueError`` or
``RuntimeError``), and which program trips it depends on the measured timings in the costs, so it
shows up as a planning failure now and then. :func:`solve` retries such a program once with
presolve off, which sidesteps those bugs; a program that fails both ways comes back without a
solution (``x`` is ``None``, ``status`` 4, the errors in ``message``) and one ``RuntimeWarning``,
so the caller answers as when the solver finds nothing in time (a greedy plan, the least peak of
a rule) instead of training stopping.

Example:
    >>> import numpy as np
    >>> from scipy.optimize import Bounds, LinearConstraint
    >>> result = solve(np.array([1.0, 2.0]), [LinearConstraint(np.ones((1, 2)), 1, 1)], np.ones(2), Bounds(0, 1), {})
    >>> result.x.round().tolist(), result.status
    ([1.0, 0.0], 0)
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, OptimizeResult, milp

__all__ = ["FAILED_STATUS", "HIGHS_DEBUG_LINE", "solve", "stdout_to_stderr"]

#: What a crash inside HiGHS surfaces as through SciPy's wrapper (C++ exceptions, translated).
_SOLVER_CRASHES: tuple[type[BaseException], ...] = (ValueError, RuntimeError, IndexError, MemoryError)

#: ``status`` of a result no run of the solver produced (SciPy's own code for "other error").
FAILED_STATUS = 4


def solve(c: np.ndarray, constraints: Sequence[LinearConstraint], integrality: np.ndarray, bounds: Bounds,
          options: Mapping[str, Any]) -> OptimizeResult:
    """``milp(c, constraints=..., integrality=..., bounds=..., options=...)``, retried once without
    presolve when HiGHS crashes; without a solution (``x`` ``None``) when it crashes both ways.

    Args:
        c: the objective's coefficients.
        constraints: the linear constraints.
        integrality: per variable, 1 where it is an integer.
        bounds: the variables' bounds.
        options: HiGHS options for ``milp`` (``time_limit``, ``mip_rel_gap``, ...).
    """
    errors: list[BaseException] = []
    for presolve in (True, False):
        try:
            with stdout_to_stderr():
                return milp(c, constraints=list(constraints), integrality=integrality, bounds=bounds,
                            options={**options, "presolve": presolve})
        except _SOLVER_CRASHES as error:
            errors.append(error)
    message = "; ".join(f"{'with' if i == 0 else 'without'} presolve: {type(e).__name__}: {e}" for i, e in enumerate(errors))
    warnings.warn(f"the MILP solver (HiGHS) failed on this plan's program ({message}); the planner answers as "
                  "when the solver finds nothing in time", RuntimeWarning, stacklevel=2)
    return OptimizeResult(x=None, status=FAILED_STATUS, success=False, message=message, fun=None)


#: The start of the debug line HiGHS prints to file descriptor 1 whatever its output options say.
HIGHS_DEBUG_LINE = b"HighsMipSolverData::"


@contextlib.contextmanager
def stdout_to_stderr(drop_prefix: bytes = HIGHS_DEBUG_LINE) -> Iterator[None]:
    """Send what native code writes to the process's stdout to stderr instead, for the block,
    less the lines that start with ``drop_prefix``.

    HiGHS prints a debug line (``HighsMipSolverData::transformNewIntegerFeasibleSolution
    tmpSolver.run();``) straight to file descriptor 1 whatever its output options say, which would
    corrupt the JSON that ``--json`` commands and benchmarks print there and clutter a training
    run's terminal. The block's writes to descriptor 1 are collected and passed to stderr when it
    ends; only that line is dropped.

    Args:
        drop_prefix: lines starting with it are dropped (empty: keep every line).

    Example:
        >>> with stdout_to_stderr():
        ...     _ = os.write(1, b"")
    """
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout to protect
        yield
        return
    with tempfile.TemporaryFile() as collected:
        try:
            os.dup2(collected.fileno(), 1)
            yield
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
            collected.seek(0)
            kept = [line for line in collected.read().splitlines(keepends=True) if not (drop_prefix and line.startswith(drop_prefix))]
            if kept:
                sys.stderr.flush()
                os.write(2, b"".join(kept))
