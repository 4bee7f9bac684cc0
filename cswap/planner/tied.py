"""Plan repeated layers together: one decision per tensor position for a block of identical layers.

A transformer's layers save the same tensors (:mod:`cswap.planner.repeats`), and the least-time plan
treats them nearly alike: the same action at the same position of every layer, with a few layers
switching one position where the budget needs a fraction of a layer. This planner solves the same
0-1 program as :mod:`cswap.planner.milp` over a smaller set of plans. The repeated layers are cut
into **blocks**: the first and last ``edge_layers`` each form a block of one (they differ from the
rest: the first follows the stem, the last are unpacked as soon as backward begins, so their copies
back cannot hide), and the layers between are cut into ``blocks`` runs of consecutive layers. Every
layer of a block takes the same option at the same position: one binary per block, position and
option, where the exact program has one per layer. Tensors outside the repeated layers keep their
own binaries.

The restriction is exact where it is made: the bytes a tied binary holds at each event are the sum
of what every layer of its block holds there under that option, measured from each layer's own
holds, and its cost is the sum of their seconds. So a plan of this program keeps the budget at
every event of the full timeline, as the exact one does; it is the best plan among those that share
decisions within blocks, and the exact optimum is never dearer. A layer whose pruning left no
option of a tied label (a prefetch distance that collapses near the end of forward) takes, for that
label, the option of the same action and wait with the longest prefetch distance below it (what
pruning keeps when a longer distance hides no more), else the cheapest option of that action. Rows are kept only at events where the
most every tensor could hold passes the budget.

Example:
    >>> from cswap.planner.lifetime import lifetimes_from_orders
    >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
    >>> from cswap.planner.repeats import find_repeats
    >>> sizes = [100, 300, 200] * 16                      # sixteen layers of three tensors
    >>> events = lifetimes_from_orders(list(range(48)), list(range(47, -1, -1)))
    >>> specs = [TensorSpec(key=k, nbytes=n, lifetime=lt, recompute_s=1e-3 * n)
    ...          for k, (n, lt) in enumerate(zip(sizes, events.lifetimes))]
    >>> problem = build_problem(specs, events, list(range(96)), 47.5, LinkModel(1e-6, 1e-6, async_copies=False))
    >>> repeats = find_repeats(problem)
    >>> len(tie_layers(problem, "recompute", repeats).units)   # 4 edge layers and 8 blocks, 3 positions each
    36
    >>> plan = plan_tied(problem, "recompute", 3000, repeats)
    >>> plan.status, plan.peak_bytes <= 3000, plan.action_counts(), round(plan.predicted_s, 6)
    ('tied', True, {'recompute': 34, 'keep': 14}, 6.6)
    >>> tied_least_peak(problem, "recompute", repeats)
    500
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_matrix

from cswap.planner.bounds import policy_options
from cswap.planner.lifetime import resident_bytes
from cswap.planner.milp import BudgetPlan, _Arrays, _greedy, budget_plan_of, stdout_to_stderr
from cswap.planner.problem import Option, PlanningProblem
from cswap.planner.repeats import RepeatedLayers

__all__ = ["DEFAULT_BLOCKS", "DEFAULT_EDGE_LAYERS", "TiedProgram", "plan_tied", "tie_layers", "tied_least_peak"]

#: Repeated layers at each end planned one by one.
DEFAULT_EDGE_LAYERS = 2
#: Blocks the repeated layers between the edges are cut into.
DEFAULT_BLOCKS = 8

# constraint rows in MiB keep HiGHS's coefficients near 1 (as in the exact program)
_SCALE = 1.0 / 2**20
_Label = tuple[str, bool, "int | None"]


@dataclass(frozen=True)
class TiedProgram:
    """The tied program's columns: per column, one option for each member tensor of its unit.

    Attributes:
        units: per unit, the problem's tensor indices that share its decision.
        owner: per column, its unit.
        choices: per column, the option each member of its unit takes.
        cost_s: per column, its members' seconds, summed.
        held_bytes: columns x events, its members' bytes, summed.
    """

    units: tuple[tuple[int, ...], ...]
    owner: np.ndarray
    choices: tuple[tuple[Option, ...], ...]
    cost_s: np.ndarray
    held_bytes: np.ndarray

    def options_of(self, columns: np.ndarray, tensor_count: int) -> list[Option]:
        """Per problem tensor, its option when each unit takes its column in ``columns``."""
        chosen: list[Option | None] = [None] * tensor_count
        for column in columns:
            for tensor, option in zip(self.units[self.owner[column]], self.choices[column], strict=True):
                chosen[tensor] = option
        assert all(o is not None for o in chosen)  # every tensor is in exactly one unit
        return chosen  # type: ignore[return-value]


def _blocks(layers: int, edge_layers: int, blocks: int) -> list[range]:
    edge = min(edge_layers, layers // 2)
    inner = np.array_split(np.arange(edge, layers - edge), max(min(blocks, layers - 2 * edge), 1))
    middle = [range(int(b[0]), int(b[-1]) + 1) for b in inner if b.size]
    return [range(i, i + 1) for i in range(edge)] + middle + [range(i, i + 1) for i in range(layers - edge, layers)]


def _label(option: Option) -> _Label:
    return (option.action, option.wait_offload, option.prefetch_distance)


def _stand_in(offered: dict[_Label, Option], label: _Label) -> Option | None:
    if label in offered:
        return offered[label]
    action, waits, distance = label
    shorter = [lb for lb in offered if lb[:2] == (action, waits) and lb[2] is not None and distance is not None and lb[2] <= distance]
    if shorter:
        return offered[max(shorter, key=lambda lb: lb[2])]  # type: ignore[arg-type,return-value]
    same = [o for lb, o in offered.items() if lb[0] == action]
    return min(same, key=lambda o: o.cost_s) if same else None


def tie_layers(
    problem: PlanningProblem,
    policy: str,
    repeats: RepeatedLayers,
    edge_layers: int = DEFAULT_EDGE_LAYERS,
    blocks: int = DEFAULT_BLOCKS,
) -> TiedProgram:
    """The columns of the tied program for ``policy`` (see the module docstring).

    Args:
        problem: every tensor's options.
        policy: a policy with an action set.
        repeats: the repeated layers of ``problem``.
        edge_layers: layers at each end of the run planned one by one.
        blocks: runs of consecutive layers between the edges whose layers share decisions.
    """
    units: list[tuple[int, ...]] = []
    for rank in range(len(repeats.order)):
        if repeats.layer_of(rank) is None:
            units.append((repeats.order[rank],))
    for block in _blocks(repeats.layers, edge_layers, blocks):
        for position in range(repeats.period):
            units.append(tuple(repeats.tensors_of(layer)[position] for layer in block))
    owner: list[int] = []
    choices: list[tuple[Option, ...]] = []
    for unit, members in enumerate(units):
        offered = [{_label(o): o for o in policy_options(problem.tensors[t], policy)} for t in members]
        seen: set[tuple[int, ...]] = set()
        for label in sorted({lb for each in offered for lb in each}, key=repr):
            column = tuple(_stand_in(each, label) for each in offered)
            ids = tuple(id(o) for o in column)
            if any(o is None for o in column) or ids in seen:
                continue
            seen.add(ids)
            owner.append(unit)
            choices.append(column)  # type: ignore[arg-type]
    held = np.zeros((len(choices), problem.event_count), dtype=np.int64)
    for column, options in enumerate(choices):
        held[column] = resident_bytes(problem.event_count, [s for o in options for s in o.holds])
    cost = np.array([sum(o.cost_s for o in options) for options in choices])
    return TiedProgram(tuple(units), np.asarray(owner, dtype=np.int64), tuple(choices), cost, held)


def _most_per_event(program: TiedProgram) -> np.ndarray:
    most = np.zeros(program.held_bytes.shape[1], dtype=np.int64)
    for unit in range(len(program.units)):
        most += program.held_bytes[program.owner == unit].max(axis=0)
    return most


def _rows(program: TiedProgram, above_bytes: int) -> np.ndarray:
    # only events where the most every unit could hold passes ``above_bytes`` can bind; of events
    # whose columns hold the same bytes, one row is enough
    rows = np.flatnonzero(_most_per_event(program) > above_bytes)
    if rows.size == 0:
        return rows
    first = np.unique(program.held_bytes[:, rows], axis=1, return_index=True)[1]
    return rows[np.sort(first)]


def _solve(program: TiedProgram, rows: np.ndarray, c: np.ndarray, upper: float | None, floor: float, time_limit_s: float):  # type: ignore[no-untyped-def]
    count = len(program.choices)
    peak = 1 if upper is None else 0  # minimise the peak: one more (continuous) variable
    one = csr_matrix((np.ones(count), (program.owner, np.arange(count))), shape=(len(program.units), count + peak))
    memory = program.held_bytes[:, rows].T.astype(float) * _SCALE
    if peak:
        memory = np.hstack([memory, -np.ones((memory.shape[0], 1))])
    bound = np.zeros(memory.shape[0]) if upper is None else np.full(memory.shape[0], upper * _SCALE)
    constraints = [LinearConstraint(one, 1, 1)]
    if rows.size:
        constraints.append(LinearConstraint(csr_matrix(memory), -np.inf, bound))
    with stdout_to_stderr():
        return milp(
            c,
            constraints=constraints,
            integrality=np.concatenate([np.ones(count), np.zeros(peak)]),
            bounds=Bounds(np.concatenate([np.zeros(count), np.full(peak, floor * _SCALE)]),
                          np.concatenate([np.ones(count), np.full(peak, np.inf)])),
            options={"time_limit": time_limit_s, "mip_rel_gap": 1e-6},
        )


def _columns(program: TiedProgram, x: np.ndarray) -> np.ndarray:
    chosen = np.zeros(len(program.units), dtype=np.int64)
    for unit in range(len(program.units)):
        mine = np.flatnonzero(program.owner == unit)
        chosen[unit] = mine[np.argmax(x[mine])]
    return chosen


def plan_tied(
    problem: PlanningProblem,
    policy: str,
    budget_bytes: int,
    repeats: RepeatedLayers,
    time_limit_s: float = 30.0,
    greedy: bool = True,
    edge_layers: int = DEFAULT_EDGE_LAYERS,
    blocks: int = DEFAULT_BLOCKS,
) -> BudgetPlan | None:
    """The least-time plan of ``policy`` within ``budget_bytes`` whose blocks of repeated layers share decisions.

    Args:
        problem, policy, budget_bytes, time_limit_s: as :func:`cswap.planner.solve.plan_budget` takes them.
        repeats: the repeated layers of ``problem`` (:func:`cswap.planner.repeats.find_repeats`).
        greedy: also run the exact program's greedy on the tied columns (for its gap, and as the
            fallback when the solver finds nothing in time).
        edge_layers, blocks: how the layers are tied (:func:`tie_layers`).

    Returns:
        The plan (status ``tied``, or ``tied-time-limit`` for the solver's best when time ran out,
        or ``tied-greedy``), checked in exact bytes against the budget at every event; ``None`` when
        no tied plan fits (the exact program may still find one).
    """
    started = time.perf_counter()
    program = tie_layers(problem, policy, repeats, edge_layers, blocks)
    rows = _rows(program, budget_bytes)
    result = _solve(program, rows, program.cost_s, budget_bytes, 0.0, time_limit_s)
    found = _columns(program, result.x) if result.x is not None else None
    if found is not None and program.held_bytes[found].sum(axis=0).max(initial=0) > budget_bytes:
        found = None  # the solver's tolerance let a few bytes through: not a plan
    arrays = _Arrays(program.choices, program.owner, program.cost_s, program.held_bytes, len(program.units))  # type: ignore[arg-type]
    fallback = _greedy(arrays, budget_bytes) if greedy or found is None else None
    if found is None and fallback is None:
        return None
    solver_s = float(program.cost_s[found].sum()) if found is not None else None
    greedy_s = float(program.cost_s[fallback].sum()) if fallback is not None else None
    # the solver's plan unless the greedy's is cheaper by more than rounding
    if found is not None and (greedy_s is None or solver_s <= greedy_s + 1e-9 * abs(greedy_s)):  # type: ignore[operator]
        columns, status = found, "tied" if result.status == 0 else "tied-time-limit"
    else:
        columns, status = fallback, "tied-greedy"
    plan = budget_plan_of(
        problem,
        policy,
        budget_bytes,
        program.options_of(columns, len(problem.tensors)),  # type: ignore[arg-type]
        status=status,
        solve_s=time.perf_counter() - started,
        greedy_s=greedy_s,
        greedy_gap_s=None if greedy_s is None or solver_s is None else greedy_s - solver_s,
    )
    return plan if plan.peak_bytes <= budget_bytes else None


def tied_least_peak(
    problem: PlanningProblem,
    policy: str,
    repeats: RepeatedLayers,
    time_limit_s: float = 30.0,
    floor_bytes: int = 0,
    edge_layers: int = DEFAULT_EDGE_LAYERS,
    blocks: int = DEFAULT_BLOCKS,
) -> int | None:
    """The least peak of a tied plan of ``policy``, in exact bytes (a budget :func:`plan_tied` meets),
    or ``None`` when the solver finds none in time.

    ``floor_bytes``: a peak no plan goes below (:func:`cswap.planner.bounds.peak_floor`): events that
    can never hold more are left out.
    """
    program = tie_layers(problem, policy, repeats, edge_layers, blocks)
    rows = _rows(program, floor_bytes)
    c = np.concatenate([np.zeros(len(program.choices)), [1.0]])
    result = _solve(program, rows, c, None, float(floor_bytes), time_limit_s)
    if result.x is None:
        return None
    return int(program.held_bytes[_columns(program, result.x[:-1])].sum(axis=0).max(initial=0))
