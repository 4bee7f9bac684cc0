"""Choose one option per saved tensor: least predicted time with the resident bytes within the budget.

The exact formulation is a 0-1 program solved by SciPy's ``milp`` (HiGHS): a binary ``x[t, o]`` per
tensor ``t`` and option ``o`` of the policy's actions, ``sum_o x[t, o] = 1`` per tensor, one row per
timeline event ``sum x[t, o] * held[t, o, e] <= budget``, and the objective ``sum x[t, o] *
cost[t, o]``. A time limit bounds the solve; a greedy (Capuchin-style: at the peak event, move the
tensor that frees most bytes per second of added cost, then undo what the budget no longer needs)
runs alongside, its gap to the solver's objective is reported, and it is the answer when the solver
finds none in time.

:func:`least_peak` is the least budget a policy's actions can meet: the same program minimising
the peak instead of time. Its plan meets it, so planning at exactly that budget is feasible.
Which planner a policy uses (this one, or Capuchin's greedy) is :mod:`cswap.planner.solve`'s choice.

A **host budget** adds a second row per event: the host copies the chosen options hold there
(:attr:`cswap.planner.problem.Option.host_holds`) stay within it, beside the device row.
:func:`least_peak` then gives the least device peak within the host budget, and
:func:`least_host_peak` the least host peak within a device budget; :func:`budgets_error` says
which budget binds when a plan cannot meet both, with the least of each.

Example:
    >>> from cswap.planner.lifetime import lifetimes_from_orders
    >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
    >>> events = lifetimes_from_orders([0, 1, 2], [2, 1, 0])
    >>> sizes = [4000, 1000, 2000]
    >>> specs = [TensorSpec(key=k, nbytes=n, lifetime=lt) for k, (n, lt) in enumerate(zip(sizes, events.lifetimes))]
    >>> problem = build_problem(specs, events, [0, 1, 2, 3, 4, 5], 2.5, LinkModel(1e-6, 1e-6, async_copies=False))
    >>> least_peak(problem, "swap") < least_peak(problem, "none") == 7000
    True
    >>> plan = solve_milp(problem, "swap", 5000, greedy=False)
    >>> plan.actions[0], plan.peak_bytes <= 5000, plan.status
    ('swap', True, 'optimal')
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
from scipy.optimize import Bounds, LinearConstraint
from scipy.sparse import csr_matrix

from cswap.budget import BudgetError
from cswap.planner import highs
from cswap.planner.actions import KEEP, tensor_actions
from cswap.planner.lifetime import resident_bytes
from cswap.planner.problem import Option, PlanningProblem, TensorOptions

__all__ = [
    "EXACT_REL_GAP",
    "BudgetPlan",
    "PlannedTensor",
    "budget_plan_of",
    "budgets_error",
    "host_timeline_of",
    "least_host_peak",
    "least_peak",
    "solve_milp",
    "timeline_of",
]

#: The solver's relative gap by default: a plan proven optimal (to rounding).
EXACT_REL_GAP = 1e-6

# constraint rows in MiB keep HiGHS's coefficients near 1; plans are checked in exact bytes after
_SCALE = 1.0 / 2**20


@dataclass(frozen=True)
class PlannedTensor:
    """The plan for one tensor.

    Attributes:
        key: the tensor's key.
        action: the chosen action.
        cost_s: its predicted seconds.
        nbytes: raw bytes.
        held_bytes: the most it holds at any event under this action.
        wait_offload: pack waits for its copy out.
        prefetch_distance: events ahead of its unpack its copy back is issued (swaps), else ``None``.
        fetch_with: the key of the tensor at whose unpack its copy back is issued (``None``: at its
            own unpack, on demand): what the executor's unpack hook carries out.
    """

    key: int
    action: str
    cost_s: float
    nbytes: int
    held_bytes: int
    wait_offload: bool = False
    prefetch_distance: int | None = None
    fetch_with: int | None = None


@dataclass(frozen=True)
class BudgetPlan:
    """A plan that keeps a policy's saved activations within a budget.

    Attributes:
        policy: the policy.
        budget_bytes: the budget.
        tensors: per tensor, in the problem's order.
        predicted_s: the plan's predicted seconds over keeping everything.
        peak_bytes: the peak of its resident-bytes timeline.
        timeline_bytes: resident bytes at each event.
        binding_event: the event with the least slack (the constraint that binds, if any does).
        slack_bytes: ``budget_bytes - timeline_bytes[binding_event]``.
        status: ``optimal``, ``time-limit`` (the solver's best when time ran out) or ``greedy``
            (the solver found nothing in time, or the greedy was better); from the fast path
            (:mod:`cswap.planner.tied`) ``tied``, ``tied-time-limit`` or ``tied-greedy``, the same
            among plans whose blocks of repeated layers share decisions.
        solve_s: seconds spent planning (solver and greedy).
        greedy_s: the greedy plan's predicted seconds (``None``: it found no feasible plan).
        greedy_gap_s: ``greedy_s`` minus the solver's objective (``None`` without both).
        bound_s: the solver's lower bound on the predicted seconds.
        prefetch_window_bytes: the most bytes fetched back ahead of need at any event.
        host_budget_bytes: the host memory budget it was planned within (``None``: none).
        host_peak_bytes: the most bytes its host copies hold at one event.
        host_timeline_bytes: host bytes at each event.
    """

    policy: str
    budget_bytes: int
    tensors: tuple[PlannedTensor, ...]
    predicted_s: float
    peak_bytes: int
    timeline_bytes: tuple[int, ...]
    binding_event: int
    slack_bytes: int
    status: str
    solve_s: float
    greedy_s: float | None
    greedy_gap_s: float | None
    bound_s: float | None
    prefetch_window_bytes: int
    host_budget_bytes: int | None = None
    host_peak_bytes: int = 0
    host_timeline_bytes: tuple[int, ...] = ()

    @property
    def actions(self) -> Mapping[int, str]:
        """Key -> action."""
        return MappingProxyType({t.key: t.action for t in self.tensors})

    def action_counts(self) -> dict[str, int]:
        """How many tensors got each action."""
        counts: dict[str, int] = {}
        for tensor in self.tensors:
            counts[tensor.action] = counts.get(tensor.action, 0) + 1
        return counts


@dataclass(frozen=True)
class _Arrays:
    options: tuple[Option, ...]
    owner: np.ndarray  # option -> tensor index
    cost: np.ndarray
    held: np.ndarray  # options x events, int64
    tensor_count: int
    host: np.ndarray = None  # type: ignore[assignment]  # options x events, int64: host bytes (the tied fast path leaves it out)
    # per shared storage: the owner's and the view's keep columns, and the credit when both are chosen
    shared: tuple[tuple[int, int, np.ndarray], ...] = ()


def _shared_columns(problem: PlanningProblem, options: list[Option], owner: list[int]) -> tuple[tuple[int, int, np.ndarray], ...]:
    index = {tensor.key: t for t, tensor in enumerate(problem.tensors)}
    keep_column = {owner[v]: v for v, option in enumerate(options) if option.action == KEEP}
    columns = []
    for pair in problem.shared:
        a, b = keep_column.get(index.get(pair.owner_key, -1)), keep_column.get(index.get(pair.view_key, -1))
        if a is not None and b is not None:
            columns.append((a, b, resident_bytes(problem.event_count, pair.credit_holds)))
    return tuple(columns)


def _level(held: np.ndarray, shared: tuple[tuple[int, int, np.ndarray], ...], chosen: np.ndarray) -> np.ndarray:
    """Resident bytes at each event of the ``chosen`` columns of ``held`` (one per tensor, or per
    unit of the tied program), with the credit of every shared storage whose two columns are chosen."""
    level = held[chosen].sum(axis=0)
    if shared:
        picked = set(np.asarray(chosen).tolist())
        for a, b, credit in shared:
            if a in picked and b in picked:
                level = level + credit
    return level


def _arrays(problem: PlanningProblem, policy: str) -> _Arrays:
    options, owner = [], []
    for t, tensor in enumerate(problem.tensors):
        allowed = tensor_actions(policy, {o.action for o in tensor.options})
        chosen = [o for o in tensor.options if o.action in allowed]
        if not chosen:
            raise ValueError(f"tensor {tensor.key} has no option under policy {policy!r}")
        options += chosen
        owner += [t] * len(chosen)
    held = np.zeros((len(options), problem.event_count), dtype=np.int64)
    host = np.zeros((len(options), problem.event_count), dtype=np.int64)
    for v, option in enumerate(options):
        held[v] = problem.holds(option)
        if option.host_holds:
            host[v] = problem.host_holds(option)
    return _Arrays(
        tuple(options), np.asarray(owner, dtype=np.int64), np.array([o.cost_s for o in options]), held, len(problem.tensors), host,
        _shared_columns(problem, options, owner),
    )


def timeline_of(problem: PlanningProblem, choice: list[Option]) -> np.ndarray:
    """Resident bytes at each event when each tensor takes the option in ``choice`` (problem order),
    a storage that two kept tensors share counted once."""
    total = np.zeros(problem.event_count, dtype=np.int64)
    for option in choice:
        total += problem.holds(option)
    if problem.shared:
        total += problem.shared_credit({tensor.key: option.action for tensor, option in zip(problem.tensors, choice, strict=True)})
    return total


def host_timeline_of(problem: PlanningProblem, choice: list[Option]) -> np.ndarray:
    """Host bytes at each event when each tensor takes the option in ``choice`` (problem order)."""
    total = np.zeros(problem.event_count, dtype=np.int64)
    for option in choice:
        if option.host_holds:
            total += problem.host_holds(option)
    return total


def _milp(arrays: _Arrays, c: np.ndarray, budget_bytes: int | None, peak_variable: bool, time_limit_s: float,  # type: ignore[no-untyped-def]
          host_budget_bytes: int | None = None, host_peak: bool = False, rel_gap: float = EXACT_REL_GAP):
    """The program: ``peak_variable`` minimises the device peak (the last variable), ``host_peak``
    the host peak, within ``budget_bytes`` on the device; ``host_budget_bytes`` bounds the host.
    The solver stops once its plan is within ``rel_gap`` of the optimum (relative).

    A shared storage is a binary ``y`` after the options, one when both its keeps are chosen
    (``y <= x_owner``, ``y <= x_view``, ``y >= x_owner + x_view - 1``), its credit on the device rows."""
    count, links = len(arrays.options), len(arrays.shared)
    extra = 1 if peak_variable or host_peak else 0
    width = count + links + extra
    c = np.concatenate([c[:count], np.zeros(links), c[count:]])
    one = csr_matrix((np.ones(count), (arrays.owner, np.arange(count))), shape=(arrays.tensor_count, width))
    memory = arrays.held.T.astype(float) * _SCALE
    if links:
        memory = np.hstack([memory, np.stack([credit for _, _, credit in arrays.shared], axis=1).astype(float) * _SCALE])
    if peak_variable:
        memory = np.hstack([memory, -np.ones((memory.shape[0], 1))])
        upper = np.zeros(memory.shape[0])
    else:
        memory = np.hstack([memory, np.zeros((memory.shape[0], extra))])
        upper = np.full(memory.shape[0], budget_bytes * _SCALE)
    constraints = [LinearConstraint(one, 1, 1), LinearConstraint(csr_matrix(memory), -np.inf, upper)]
    if links:
        constraints.append(_both_kept(count, [(a, b) for a, b, _ in arrays.shared], width))
    if host_peak or host_budget_bytes is not None:
        host = arrays.host.T[np.any(arrays.host.T != 0, axis=1)].astype(float) * _SCALE
        if host.shape[0]:
            host = np.hstack([host, np.zeros((host.shape[0], links))])
            if host_peak:
                host = np.hstack([host, -np.ones((host.shape[0], 1))])
                host_upper = np.zeros(host.shape[0])
            else:
                host = np.hstack([host, np.zeros((host.shape[0], extra))])
                host_upper = np.full(host.shape[0], host_budget_bytes * _SCALE)
            constraints.append(LinearConstraint(csr_matrix(host), -np.inf, host_upper))
    integrality = np.concatenate([np.ones(count + links), np.zeros(extra)])
    bounds = Bounds(np.zeros(width), np.concatenate([np.ones(count + links), np.full(extra, np.inf)]))
    return highs.solve(c, constraints, integrality, bounds, {"time_limit": time_limit_s, "mip_rel_gap": rel_gap})


def _both_kept(count: int, pairs: list[tuple[int, int]], width: int) -> LinearConstraint:
    """Rows making variable ``count + i`` one exactly when both columns of ``pairs[i]`` are taken:
    ``y <= x_a``, ``y <= x_b``, ``x_a + x_b - y <= 1``."""
    rows, cols, vals = [], [], []
    for link, (a, b) in enumerate(pairs):
        y = count + link
        for row, entries in enumerate((((y, 1.0), (a, -1.0)), ((y, 1.0), (b, -1.0)), ((a, 1.0), (b, 1.0), (y, -1.0)))):
            for col, val in entries:
                rows.append(3 * link + row)
                cols.append(col)
                vals.append(val)
    return LinearConstraint(csr_matrix((vals, (rows, cols)), shape=(3 * len(pairs), width)), -np.inf, np.tile([0.0, 0.0, 1.0], len(pairs)))


def _choice(arrays: _Arrays, x: np.ndarray) -> np.ndarray:
    chosen = np.zeros(arrays.tensor_count, dtype=np.int64)
    best = np.full(arrays.tensor_count, -1.0)
    for v in range(len(arrays.options)):
        t = arrays.owner[v]
        if x[v] > best[t]:
            best[t], chosen[t] = x[v], v
    return chosen


def _least_peak_choice(arrays: _Arrays) -> np.ndarray:
    # without the solver: each tensor at its option holding the fewest byte-events
    chosen = np.zeros(arrays.tensor_count, dtype=np.int64)
    area = arrays.held.sum(axis=1)
    for t in range(arrays.tensor_count):
        mine = np.flatnonzero(arrays.owner == t)
        chosen[t] = mine[np.lexsort((arrays.cost[mine], area[mine]))[0]]
    return chosen


def least_peak(problem: PlanningProblem, policy: str, time_limit_s: float = 30.0, host_budget_bytes: int | None = None) -> int:
    """The smallest peak any plan of ``policy``'s actions has: the solver's plan measured in exact bytes,
    or, if it finds none in time, the peak of each tensor at its smallest-footprint option (a budget
    that plan meets). With ``host_budget_bytes``, among the plans whose host copies stay within it
    (keeping everything holds nothing on the host, so there always is one)."""
    if not problem.tensors:
        return 0
    arrays = _arrays(problem, policy)
    c = np.concatenate([np.zeros(len(arrays.options)), [1.0]])
    result = _milp(arrays, c, None, peak_variable=True, time_limit_s=time_limit_s, host_budget_bytes=host_budget_bytes)
    chosen = _choice(arrays, result.x[:-1]) if result.x is not None else None
    if chosen is not None and host_budget_bytes is not None and arrays.host[chosen].sum(axis=0).max(initial=0) > host_budget_bytes:
        chosen = None  # the solver's tolerance let a few host bytes through: not a plan
    if chosen is None:
        chosen = _least_peak_choice(arrays)
        if host_budget_bytes is not None and arrays.host[chosen].sum(axis=0).max(initial=0) > host_budget_bytes:
            chosen = _keep_choice(arrays)
    return int(_level(arrays.held, arrays.shared, chosen).max(initial=0))


def _keep_choice(arrays: _Arrays) -> np.ndarray:
    # every tensor at its cheapest option that holds nothing on the host (a keep: always offered)
    chosen = np.zeros(arrays.tensor_count, dtype=np.int64)
    on_host = arrays.host.any(axis=1)
    for t in range(arrays.tensor_count):
        mine = np.flatnonzero((arrays.owner == t) & ~on_host)
        chosen[t] = mine[np.argmin(arrays.cost[mine])]
    return chosen


def least_host_peak(problem: PlanningProblem, policy: str, budget_bytes: int, time_limit_s: float = 30.0) -> int | None:
    """The least host peak of ``policy``'s plans within ``budget_bytes`` on the device (``None``:
    no plan meets that device budget); planning at the two budgets succeeds.

    Example:
        >>> from cswap.planner.lifetime import lifetimes_from_orders
        >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
        >>> events = lifetimes_from_orders([0, 1], [1, 0])
        >>> specs = [TensorSpec(key=k, nbytes=1000, lifetime=lt) for k, lt in enumerate(events.lifetimes)]
        >>> problem = build_problem(specs, events, [0.0, 1.0, 2.0, 3.0], 1.5, LinkModel(1e-6, 1e-6, async_copies=False))
        >>> least_host_peak(problem, "swap", 1000), least_host_peak(problem, "swap", 2000), least_host_peak(problem, "swap", 500)
        (1000, 0, None)
    """
    if not problem.tensors:
        return 0
    arrays = _arrays(problem, policy)
    c = np.concatenate([np.zeros(len(arrays.options)), [1.0]])
    result = _milp(arrays, c, budget_bytes, peak_variable=False, time_limit_s=time_limit_s, host_peak=True)
    chosen = _choice(arrays, result.x[:-1]) if result.x is not None else None
    if chosen is None or _level(arrays.held, arrays.shared, chosen).max(initial=0) > budget_bytes:
        chosen = _greedy(arrays, budget_bytes)  # nothing in time (or the tolerance let bytes through)
    if chosen is None:
        return None
    return int(arrays.host[chosen].sum(axis=0).max(initial=0))


def budgets_error(problem: PlanningProblem, policy: str, budget_bytes: int, host_budget_bytes: int | None,
                  time_limit_s: float = 30.0) -> BudgetError:
    """The :class:`~cswap.budget.BudgetError` of a plan that cannot meet ``budget_bytes`` (and
    ``host_budget_bytes``): the device budget binds when no plan meets it alone, else the host
    budget does; it carries the least device budget within the host budget and the least host
    budget within the device budget (or within that least device budget, when the device binds).

    Example:
        >>> from cswap.planner.lifetime import lifetimes_from_orders
        >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
        >>> events = lifetimes_from_orders([0, 1], [1, 0])
        >>> specs = [TensorSpec(key=k, nbytes=1000, lifetime=lt) for k, lt in enumerate(events.lifetimes)]
        >>> problem = build_problem(specs, events, [0.0, 1.0, 2.0, 3.0], 1.5, LinkModel(1e-6, 1e-6, async_copies=False))
        >>> error = budgets_error(problem, "swap", 1000, 500)
        >>> error.binding, error.minimum_bytes, error.host_minimum_bytes
        ('host', 2000, 1000)
    """
    if host_budget_bytes is None:
        return BudgetError(least_peak(problem, policy, time_limit_s), policy, budget_bytes)
    alone = least_peak(problem, policy, time_limit_s)
    device_least = least_peak(problem, policy, time_limit_s, host_budget_bytes)
    binding = "device" if budget_bytes < alone else "host"
    host_least = least_host_peak(problem, policy, max(budget_bytes, device_least) if binding == "device" else budget_bytes,
                                 time_limit_s)
    return BudgetError(device_least, policy, budget_bytes, host_budget_bytes=host_budget_bytes, host_minimum_bytes=host_least,
                       binding=binding)


def _partners(shared: tuple[tuple[int, int, np.ndarray], ...]) -> dict[int, list[tuple[int, np.ndarray]]]:
    """Per keep column of a shared storage: the other keep column and the pair's credit."""
    partners: dict[int, list[tuple[int, np.ndarray]]] = {}
    for a, b, credit in shared:
        partners.setdefault(a, []).append((b, credit))
        partners.setdefault(b, []).append((a, credit))
    return partners


def _greedy(arrays: _Arrays, budget_bytes: int, host_budget_bytes: int | None = None) -> np.ndarray | None:
    """Capuchin-style: each tensor at its cheapest option, then, while the peak passes the budget,
    the move freeing most bytes at the peak per second added; then back to cheaper options where the
    budget still holds. The plan it returns holds the budget in exact bytes, shared storages' credits
    included."""
    cost, held, owner = arrays.cost, arrays.held, arrays.owner
    partners = _partners(arrays.shared)
    chosen = np.zeros(arrays.tensor_count, dtype=np.int64)
    for t in range(arrays.tensor_count):
        mine = np.flatnonzero(owner == t)
        chosen[t] = mine[np.lexsort((held[mine].sum(axis=1), cost[mine]))[0]]
    host, host_level = arrays.host, None
    if host_budget_bytes is not None:
        host_level = host[chosen].sum(axis=0)
        if host_level.max(initial=0) > host_budget_bytes:
            return None  # the cheapest options already pass the host budget: left to the solver
    # Each kept tensor of a shared storage counted on its own first ("alone"): moving either frees
    # its bytes there, where in exact bytes neither frees the storage until both have moved. The
    # exact level then finishes, where a view outliving its owner holds more than it alone does.
    levels = {False: held[chosen].sum(axis=0), True: _level(held, arrays.shared, chosen)}

    def moved(t: int, v: int, exact: bool) -> np.ndarray:
        line = levels[exact] - held[chosen[t]] + held[v]
        if exact:  # the credits of the shared storages the move parts or joins
            for column, sign in ((chosen[t], -1), (v, 1)):
                for partner, credit in partners.get(column, ()):
                    if chosen[owner[partner]] == partner:
                        line = line + sign * credit
        return line

    def take(t: int, v: int, line: np.ndarray, exact: bool) -> None:
        # ``line`` is moved(t, v, exact), already computed to accept the move
        levels[not exact], levels[exact] = moved(t, v, not exact), line
        chosen[t] = v

    def overflow(line: np.ndarray) -> int:
        return int(np.maximum(line - budget_bytes, 0).sum())

    for exact in (False, True):
        while levels[exact].max(initial=0) > budget_bytes:
            level = levels[exact]
            peak = int(np.argmax(level))
            current = chosen[owner]
            freed = held[current, peak] - held[:, peak]
            if exact:
                credit_at_peak = np.zeros(len(cost), dtype=np.int64)
                for column, pairs in partners.items():
                    credit_at_peak[column] = sum(int(credit[peak]) for partner, credit in pairs if chosen[owner[partner]] == partner)
                freed = freed + credit_at_peak[current] - credit_at_peak
            added = cost - cost[current]
            movable = np.flatnonzero(freed > 0)
            score = freed[movable] / np.maximum(added[movable], 1e-12)
            before = overflow(level)
            for v in movable[np.argsort(-score, kind="stable")]:
                t = owner[v]
                line = moved(t, v, exact)
                if overflow(line) < before:
                    if host_level is not None:
                        host_line = host_level - host[chosen[t]] + host[v]
                        if host_line.max(initial=0) > host_budget_bytes:  # type: ignore[operator]
                            continue  # it would pass the host budget: the next best move
                        host_level = host_line
                    take(t, v, line, exact)
                    break
            else:
                return None
    # undo what the budget no longer needs: cheaper options first where they still fit
    for t in np.argsort(-cost[chosen], kind="stable"):
        mine = np.flatnonzero(owner == t)
        for v in mine[np.argsort(cost[mine], kind="stable")]:
            if cost[v] >= cost[chosen[t]]:
                break
            line = moved(t, v, True)
            if line.max(initial=0) <= budget_bytes:
                if host_level is not None:
                    host_line = host_level - host[chosen[t]] + host[v]
                    if host_line.max(initial=0) > host_budget_bytes:  # type: ignore[operator]
                        continue
                    host_level = host_line
                take(t, v, line, True)
                break
    return chosen


def solve_milp(problem: PlanningProblem, policy: str, budget_bytes: int, time_limit_s: float = 30.0, greedy: bool = True,
               host_budget_bytes: int | None = None, explain: bool = True, rel_gap: float = EXACT_REL_GAP) -> BudgetPlan:
    """The least-time plan of ``policy``'s actions whose timeline stays within ``budget_bytes``
    (the arguments are :func:`cswap.planner.solve.plan_budget`'s; ``greedy`` also runs the greedy,
    for its gap and as the fallback), and whose host copies stay within ``host_budget_bytes``;
    least to within ``rel_gap`` of the optimum's predicted seconds.

    Raises:
        BudgetError: the policy cannot meet the budgets; it carries :func:`least_peak` (and, with a
            host budget, which binds and the least of each: :func:`budgets_error`).
            ``explain=False`` leaves the least budgets out (the caller only asks whether a plan fits):
            its ``minimum_bytes`` is then ``budget_bytes + 1``, a bound, not the least.
        ValueError: an unknown policy or a budget that is not positive.
    """
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
    if host_budget_bytes is not None and host_budget_bytes <= 0:
        raise ValueError(f"host_budget_bytes must be positive, got {host_budget_bytes}")
    started = time.perf_counter()
    if not problem.tensors:  # nothing to place (every activation recomputed): the empty plan
        return budget_plan_of(problem, policy, budget_bytes, [], status="optimal", solve_s=time.perf_counter() - started,
                              host_budget_bytes=host_budget_bytes)
    arrays = _arrays(problem, policy)
    result = _milp(arrays, arrays.cost, budget_bytes, peak_variable=False, time_limit_s=time_limit_s,
                   host_budget_bytes=host_budget_bytes, rel_gap=rel_gap)
    solver_choice = _choice(arrays, result.x) if result.x is not None else None
    if solver_choice is not None and (
        _level(arrays.held, arrays.shared, solver_choice).max(initial=0) > budget_bytes
        or (host_budget_bytes is not None and arrays.host[solver_choice].sum(axis=0).max(initial=0) > host_budget_bytes)
    ):
        solver_choice = None  # the solver's tolerance let a few bytes through: not a plan
    greedy_choice = _greedy(arrays, budget_bytes, host_budget_bytes) if greedy or solver_choice is None else None
    if solver_choice is None and greedy_choice is None:
        if not explain:
            raise BudgetError(budget_bytes + 1, policy, budget_bytes, host_budget_bytes=host_budget_bytes)
        raise budgets_error(problem, policy, budget_bytes, host_budget_bytes, time_limit_s)
    solver_s = float(arrays.cost[solver_choice].sum()) if solver_choice is not None else None
    greedy_s = float(arrays.cost[greedy_choice].sum()) if greedy_choice is not None else None
    if solver_choice is not None and (greedy_s is None or solver_s <= greedy_s):
        chosen, status = solver_choice, "optimal" if result.status == 0 else "time-limit"
    else:
        chosen, status = greedy_choice, "greedy"
    bound = getattr(result, "mip_dual_bound", None)
    return budget_plan_of(
        problem,
        policy,
        budget_bytes,
        [arrays.options[v] for v in chosen],
        status=status,
        solve_s=time.perf_counter() - started,
        greedy_s=greedy_s,
        greedy_gap_s=None if greedy_s is None or solver_s is None else greedy_s - solver_s,
        bound_s=None if bound is None or not np.isfinite(bound) else float(bound),
        host_budget_bytes=host_budget_bytes,
    )


def budget_plan_of(
    problem: PlanningProblem,
    policy: str,
    budget_bytes: int,
    choice: list[Option],
    status: str,
    solve_s: float,
    greedy_s: float | None = None,
    greedy_gap_s: float | None = None,
    bound_s: float | None = None,
    host_budget_bytes: int | None = None,
) -> BudgetPlan:
    """The :class:`BudgetPlan` of one option per tensor (problem order), whichever planner chose them."""
    held = [problem.holds(option) for option in choice]
    level = np.sum(held, axis=0) if held else np.zeros(problem.event_count, dtype=np.int64)
    if problem.shared:  # as timeline_of counts them, from the holds at hand
        level = level + problem.shared_credit({tensor.key: option.action for tensor, option in zip(problem.tensors, choice, strict=True)})
    host_level = host_timeline_of(problem, choice)
    binding = int(np.argmax(level)) if level.size else 0
    unpacked_at = {t.lifetime.unpack: t.key for t in problem.tensors if t.lifetime is not None and t.lifetime.unpack is not None}
    tensors = tuple(
        PlannedTensor(
            key=tensor.key,
            action=option.action,
            cost_s=float(option.cost_s),
            nbytes=tensor.nbytes,
            held_bytes=int(line.max(initial=0)),
            wait_offload=option.wait_offload,
            prefetch_distance=option.prefetch_distance,
            fetch_with=_fetch_with(tensor, option, problem.forward_events, unpacked_at),
        )
        for tensor, option, line in zip(problem.tensors, choice, held, strict=True)
    )
    return BudgetPlan(
        policy=policy,
        budget_bytes=int(budget_bytes),
        tensors=tensors,
        predicted_s=float(sum(option.cost_s for option in choice)),
        peak_bytes=int(level.max(initial=0)),
        timeline_bytes=tuple(int(b) for b in level),
        binding_event=binding,
        slack_bytes=int(budget_bytes - (level[binding] if level.size else 0)),
        status=status,
        solve_s=solve_s,
        greedy_s=greedy_s,
        greedy_gap_s=greedy_gap_s,
        bound_s=bound_s,
        prefetch_window_bytes=_prefetch_window(problem, choice),
        host_budget_bytes=None if host_budget_bytes is None else int(host_budget_bytes),
        host_peak_bytes=int(host_level.max(initial=0)),
        host_timeline_bytes=tuple(int(b) for b in host_level),
    )


def _fetch_with(tensor: TensorOptions, option: Option, forward_events: int, unpacked_at: dict[int, int]) -> int | None:
    if not option.prefetch_distance or tensor.lifetime is None or tensor.lifetime.unpack is None:
        return None
    return unpacked_at.get(max(tensor.lifetime.unpack - option.prefetch_distance, forward_events))


def _prefetch_window(problem: PlanningProblem, choice: list[Option]) -> int:
    ahead = [option.fetched_ahead for option in choice if option.fetched_ahead is not None]
    return int(resident_bytes(problem.event_count, ahead).max(initial=0))
