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
pruning keeps when a longer distance hides no more), else the cheapest option of that action.

Blocks make the budget's granularity coarse: where the exact plan switches one position in 5 of a
block's 7 layers, a tied plan switches all 7 or none. So the tied plan is **refined**: every
repeated layer is planned on its own, choosing at each position among what its block and the blocks
on either side chose (one or a few options each). The tied plan is one of these plans, so the
refined plan is never dearer; it is kept where it is cheaper. Rows are kept only at events where
the most every unit could hold passes the budget (less what the units left a single option hold
there), one per distinct row.

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
    >>> len(tie_layers(problem, "recompute", repeats).units)   # 4 edge layers and 4 blocks, 3 positions each
    24
    >>> plan = plan_tied(problem, "recompute", 3000, repeats)
    >>> plan.status, plan.peak_bytes <= 3000, plan.action_counts(), round(plan.predicted_s, 6)
    ('tied', True, {'keep': 16, 'recompute': 32}, 6.6)
    >>> tied_least_peak(problem, "recompute", repeats)
    500
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import Bounds, LinearConstraint
from scipy.sparse import csr_matrix

from cswap.planner.bounds import policy_options
from cswap.planner.lifetime import resident_bytes
from cswap.planner import highs
from cswap.planner.actions import KEEP
from cswap.planner.milp import EXACT_REL_GAP, BudgetPlan, _Arrays, _both_kept, _greedy, _level, budget_plan_of
from cswap.planner.problem import Option, PlanningProblem
from cswap.planner.repeats import RepeatedLayers

__all__ = ["DEFAULT_BLOCKS", "DEFAULT_EDGE_LAYERS", "TiedProgram", "plan_tied", "tie_layers", "tied_least_peak"]

#: Repeated layers at each end planned one by one.
DEFAULT_EDGE_LAYERS = 2
#: Blocks the repeated layers between the edges are cut into.
DEFAULT_BLOCKS = 4

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
        labels: per column, the label it was built for: ``(action, wait_offload, prefetch_distance)``.
        cost_s: per column, its members' seconds, summed.
        held_bytes: columns x events, its members' bytes, summed.
        places: per unit, ``(block, position)`` in the repeated layers, or ``None`` outside them.
        blocks: the layers of each block.
        shared: per pair of units whose members share storages
            (:class:`~cswap.planner.problem.SharedStorage`): the two units' keep columns and the
            bytes the pairs' credits change at each event when both are taken.
    """

    units: tuple[tuple[int, ...], ...]
    owner: np.ndarray
    choices: tuple[tuple[Option, ...], ...]
    labels: tuple[_Label, ...]
    cost_s: np.ndarray
    held_bytes: np.ndarray
    places: tuple[tuple[int, int] | None, ...]
    blocks: tuple[range, ...]
    shared: tuple[tuple[int, int, np.ndarray], ...] = ()

    @property
    def starts(self) -> np.ndarray:
        """Each unit's first column (a unit's columns are consecutive)."""
        return np.searchsorted(self.owner, np.arange(len(self.units)))

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
    allowed: Mapping[tuple[int, int], frozenset[_Label]] | None = None,
) -> TiedProgram:
    """The columns of the tied program for ``policy`` (see the module docstring).

    Args:
        problem: every tensor's options.
        policy: a policy with an action set.
        repeats: the repeated layers of ``problem``.
        edge_layers: layers at each end of the run planned one by one.
        blocks: runs of consecutive layers between the edges whose layers share decisions.
        allowed: ``(layer, position)`` -> the labels a unit holding that tensor may take (the
            union over its layers); a tensor not in it may take any of its options.
    """
    units: list[tuple[int, ...]] = []
    places: list[tuple[int, int] | None] = []
    for rank in range(len(repeats.order)):
        if repeats.layer_of(rank) is None:
            units.append((repeats.order[rank],))
            places.append(None)
    runs = _blocks(repeats.layers, edge_layers, blocks)
    for index, block in enumerate(runs):
        for position in range(repeats.period):
            units.append(tuple(repeats.tensors_of(layer)[position] for layer in block))
            places.append((index, position))
    owner: list[int] = []
    choices: list[tuple[Option, ...]] = []
    labels: list[_Label] = []
    for unit, (members, place) in enumerate(zip(units, places, strict=True)):
        offered = [{_label(o): o for o in policy_options(problem.tensors[t], policy)} for t in members]
        wanted: set[_Label] = {lb for each in offered for lb in each}
        if allowed is not None and place is not None:
            limits = [allowed.get((layer, place[1])) for layer in runs[place[0]]]
            if all(limit is not None for limit in limits):
                wanted = set().union(*limits)  # type: ignore[arg-type]
        seen: set[tuple[int, ...]] = set()
        for label in sorted(wanted, key=repr):
            column = tuple(_stand_in(each, label) for each in offered)
            ids = tuple(id(o) for o in column)
            if any(o is None for o in column) or ids in seen:
                continue
            seen.add(ids)
            owner.append(unit)
            choices.append(column)  # type: ignore[arg-type]
            labels.append(label)
    held = np.zeros((len(choices), problem.event_count), dtype=np.int64)
    for column, options in enumerate(choices):
        held[column] = resident_bytes(problem.event_count, [s for o in options for s in o.holds])
    cost = np.array([sum(o.cost_s for o in options) for options in choices])
    return TiedProgram(tuple(units), np.asarray(owner, dtype=np.int64), tuple(choices), tuple(labels), cost, held, tuple(places),
                       tuple(runs), _shared_columns(problem, units, owner, choices, held))


def _shared_columns(problem: PlanningProblem, units: list[tuple[int, ...]], owner: list[int], choices: list[tuple[Option, ...]],
                    held: np.ndarray) -> tuple[tuple[int, int, np.ndarray], ...]:
    """The program's shared storages: each pair's credit on its units' keep columns, summed per pair
    of units (kept both, every member pair of theirs is kept both); a pair within one unit goes
    into that unit's keep column, which ``held`` is changed in place for."""
    if not problem.shared:
        return ()
    unit_of = {t: u for u, members in enumerate(units) for t in members}
    keep_column: dict[int, int] = {}
    for column, options in enumerate(choices):
        if all(o.action == KEEP for o in options):
            keep_column.setdefault(owner[column], column)
    index = {tensor.key: t for t, tensor in enumerate(problem.tensors)}
    credits: dict[tuple[int, int], np.ndarray] = {}
    for pair in problem.shared:
        a, b = (keep_column.get(unit_of.get(index.get(key, -1), -1)) for key in (pair.owner_key, pair.view_key))
        if a is None or b is None:
            continue
        credit = resident_bytes(problem.event_count, pair.credit_holds)
        if a == b:
            held[a] += credit
        else:
            credits[(a, b)] = credits.get((a, b), 0) + credit
    return tuple((a, b, credit) for (a, b), credit in credits.items())


def _most_per_event(program: TiedProgram) -> np.ndarray:
    most = np.maximum.reduceat(program.held_bytes, program.starts, axis=0).sum(axis=0)
    for _, _, credit in program.shared:
        most = most + np.maximum(credit, 0)
    return most


def _rows(program: TiedProgram, above_bytes: np.ndarray) -> np.ndarray:
    # only events where the most every unit could hold passes ``above_bytes`` can bind; of events
    # whose columns hold the same bytes against the same bound, one row is enough
    rows = np.flatnonzero(_most_per_event(program) > above_bytes)
    if rows.size == 0:
        return rows
    keyed = np.vstack([program.held_bytes[:, rows], *(credit[rows] for _, _, credit in program.shared), above_bytes[rows]])
    first = np.unique(keyed, axis=1, return_index=True)[1]
    return rows[np.sort(first)]


def _solve(program: TiedProgram, rows: np.ndarray, c: np.ndarray, upper_bytes: np.ndarray | None, floor_bytes: float,
           time_limit_s: float, rel_gap: float = EXACT_REL_GAP):  # type: ignore[no-untyped-def]
    count, links = len(program.choices), len(program.shared)
    peak = 1 if upper_bytes is None else 0  # minimise the peak: one more (continuous) variable
    width = count + links + peak
    c = np.concatenate([c[:count], np.zeros(links), c[count:]])
    one = csr_matrix((np.ones(count), (program.owner, np.arange(count))), shape=(len(program.units), width))
    memory = program.held_bytes[:, rows].T.astype(float) * _SCALE
    if links:
        memory = np.hstack([memory, np.stack([credit[rows] for _, _, credit in program.shared], axis=1).astype(float) * _SCALE])
    if peak:
        memory = np.hstack([memory, -np.ones((memory.shape[0], 1))])
    bound = np.zeros(memory.shape[0]) if upper_bytes is None else upper_bytes[rows].astype(float) * _SCALE
    constraints = [LinearConstraint(one, 1, 1)]
    if rows.size:
        constraints.append(LinearConstraint(csr_matrix(memory), -np.inf, bound))
    if links:
        constraints.append(_both_kept(count, [(a, b) for a, b, _ in program.shared], width))
    bounds = Bounds(np.concatenate([np.zeros(count + links), np.full(peak, floor_bytes * _SCALE)]),
                    np.concatenate([np.ones(count + links), np.full(peak, np.inf)]))
    return highs.solve(c, constraints, np.concatenate([np.ones(count + links), np.zeros(peak)]), bounds,
                       {"time_limit": time_limit_s, "mip_rel_gap": rel_gap})


def _subset(program: TiedProgram, units: np.ndarray) -> tuple[TiedProgram, np.ndarray]:
    """The program of the units where ``units`` is true, and its columns' indices in ``program``."""
    columns = np.flatnonzero(units[program.owner])
    renumber = np.cumsum(units) - 1
    kept = np.flatnonzero(units)
    at = {int(column): i for i, column in enumerate(columns)}
    shared = tuple((at[a], at[b], credit) for a, b, credit in program.shared if a in at and b in at)
    return TiedProgram(
        tuple(program.units[u] for u in kept),
        renumber[program.owner[columns]],
        tuple(program.choices[c] for c in columns),
        tuple(program.labels[c] for c in columns),
        program.cost_s[columns],
        program.held_bytes[columns],
        tuple(program.places[u] for u in kept),
        program.blocks,
        shared,
    ), columns


def _columns(program: TiedProgram, x: np.ndarray) -> np.ndarray:
    bounds = [*program.starts.tolist(), len(program.choices)]
    return np.array([start + int(np.argmax(x[start:end])) for start, end in itertools.pairwise(bounds)], dtype=np.int64)


def _neighbours(program: TiedProgram, columns: np.ndarray) -> dict[tuple[int, int], frozenset[_Label]]:
    """Per ``(layer, position)`` of a block of several layers: the labels its block and the blocks on
    either side took (a layer planned alone keeps all its options)."""
    taken = {place: program.labels[column] for place, column in zip(program.places, columns, strict=True) if place is not None}
    allowed: dict[tuple[int, int], frozenset[_Label]] = {}
    for index, position in taken:
        if len(program.blocks[index]) < 2:
            continue
        near = frozenset(taken[(i, position)] for i in (index - 1, index, index + 1) if (i, position) in taken)
        for layer in program.blocks[index]:
            allowed[(layer, position)] = near
    return allowed


def _fitting(program: TiedProgram, budget_bytes: int, time_limit_s: float, rel_gap: float = EXACT_REL_GAP) -> tuple[np.ndarray | None, bool]:
    """The solver's column per unit within ``budget_bytes`` (``None``: none in time, or a few bytes
    over), and whether it is proved optimal. Units with one column are taken as given: their bytes
    come off the budget, event by event, and only the others reach the solver."""
    found = program.starts.copy()
    free = np.diff([*program.starts.tolist(), len(program.choices)]) > 1
    optimal = True
    if free.any():
        left = budget_bytes - program.held_bytes[found[~free]].sum(axis=0)
        fixed = set(found[~free].tolist())
        pending = program
        for a, b, credit in program.shared:  # a pair with a unit taken as given: its credit is known, or rides on the other's keep
            if a in fixed and b in fixed:
                left = left - credit
            elif a in fixed or b in fixed:
                if pending is program:
                    pending = replace(program, held_bytes=program.held_bytes.copy())
                pending.held_bytes[b if a in fixed else a] += credit
        sub, columns = _subset(pending, free)
        result = _solve(sub, _rows(sub, left), sub.cost_s, left, 0.0, time_limit_s, rel_gap)
        if result.x is None:
            return None, False
        found[free] = columns[_columns(sub, result.x)]
        optimal = result.status == 0
    if _level(program.held_bytes, program.shared, found).max(initial=0) > budget_bytes:
        return None, False  # the solver's tolerance let a few bytes through: not a plan
    return found, optimal


def plan_tied(
    problem: PlanningProblem,
    policy: str,
    budget_bytes: int,
    repeats: RepeatedLayers,
    time_limit_s: float = 30.0,
    greedy: bool = True,
    edge_layers: int = DEFAULT_EDGE_LAYERS,
    blocks: int = DEFAULT_BLOCKS,
    refine: bool = True,
    rel_gap: float = EXACT_REL_GAP,
) -> BudgetPlan | None:
    """The least-time plan of ``policy`` within ``budget_bytes`` whose blocks of repeated layers share decisions.

    Args:
        problem, policy, budget_bytes: as :func:`cswap.planner.solve.plan_budget` takes them.
        repeats: the repeated layers of ``problem`` (:func:`cswap.planner.repeats.find_repeats`).
        time_limit_s: the solver's limit for each of its two solves (the tied program, the refinement).
        greedy: also run the exact program's greedy on the tied columns (for its gap, and as the
            fallback when the solver finds nothing in time).
        edge_layers, blocks: how the layers are tied (:func:`tie_layers`).
        refine: then plan every layer on its own, among the options its block and the blocks on
            either side took (the refinement in the module docstring).
        rel_gap: the solver's relative gap (:func:`cswap.planner.milp.solve_milp`).

    Returns:
        The plan (status ``tied``, or ``tied-time-limit`` for the solver's best when time ran out,
        or ``tied-greedy``), checked in exact bytes against the budget at every event; ``None`` when
        no tied plan fits (the exact program may still find one).
    """
    started = time.perf_counter()
    program = tie_layers(problem, policy, repeats, edge_layers, blocks)
    found, optimal = _fitting(program, budget_bytes, time_limit_s, rel_gap)
    arrays = _Arrays(program.choices, program.owner, program.cost_s, program.held_bytes, len(program.units),  # type: ignore[arg-type]
                     shared=program.shared)
    fallback = _greedy(arrays, budget_bytes) if greedy or found is None else None
    if found is None and fallback is None:
        return None
    solver_s = float(program.cost_s[found].sum()) if found is not None else None
    greedy_s = float(program.cost_s[fallback].sum()) if fallback is not None else None
    # the solver's plan unless the greedy's is cheaper by more than rounding
    if found is not None and (greedy_s is None or solver_s <= greedy_s + 1e-9 * abs(greedy_s)):  # type: ignore[operator]
        columns, status = found, "tied" if optimal else "tied-time-limit"
    else:
        columns, status = fallback, "tied-greedy"
    choice = program.options_of(columns, len(problem.tensors))  # type: ignore[arg-type]
    best_s = float(program.cost_s[columns].sum())  # type: ignore[index]
    if refine and any(len(block) > 1 for block in program.blocks):
        # every layer alone, choosing among what its block and the neighbouring blocks chose: the
        # coarse plan is one of these plans, so this one is never dearer
        fine = tie_layers(problem, policy, repeats, edge_layers, repeats.layers, _neighbours(program, columns))  # type: ignore[arg-type]
        refined, fine_optimal = _fitting(fine, budget_bytes, time_limit_s, rel_gap)
        if refined is not None and float(fine.cost_s[refined].sum()) < best_s:
            choice = fine.options_of(refined, len(problem.tensors))
            solver_s = float(fine.cost_s[refined].sum())
            status = "tied" if fine_optimal else "tied-time-limit"
    plan = budget_plan_of(
        problem,
        policy,
        budget_bytes,
        choice,
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
    rows = _rows(program, np.full(problem.event_count, floor_bytes, dtype=np.int64))
    c = np.concatenate([np.zeros(len(program.choices)), [1.0]])
    result = _solve(program, rows, c, None, float(floor_bytes), time_limit_s)
    if result.x is None:
        return None
    return int(_level(program.held_bytes, program.shared, _columns(program, result.x[:-1])).max(initial=0))
