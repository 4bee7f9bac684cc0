"""The runtime's plan under a memory budget: profile at the smallest footprint, then plan within the budget.

Under a budget, a profiling iteration stores every movable tensor with its policy's
smallest-footprint action (:data:`PROFILE_ACTIONS`), so it stays within any budget the policy can
meet; ``compress-keep``'s, under a budget whose bytes are known, keeps each tensor while the budget
has room and compresses those it kept, oldest first, past it (:func:`keep_first_least`). From its
trace, :func:`budget_plan` builds the planner's problem
(:func:`cswap.planner.problem_from_trace`), resolves a fractional budget against policy ``none``'s
peak, checks the policy's least budget (:func:`cswap.planner.minimum_bytes`) and turns the
planner's :class:`~cswap.planner.BudgetPlan` into the executor's :class:`~cswap.planner.plan.Plan`: an
action per key, the prefetch window, and per row the predicted seconds and the budget slack.

Under a budget ``min_bytes`` binds nothing: the profile stores a tensor below it as any other, and
the problem lets the plan move it, each of its copies priced with a fixed latency
(:data:`cswap.planner.costmodel.COPY_LATENCY_S`), so the plan keeps small tensors where the budget
allows and moves them where it needs to. When no plan fits, the :class:`~cswap.budget.BudgetError`
names the event that sets the floor and the tensors held there whatever the plan
(:func:`floor_note`).

Example:
    >>> from cswap.profile.trace import TensorRecord, Trace
    >>> recs = tuple(TensorRecord(key=k, shape=(1024,), dtype="float32", nbytes=4096, sparsity=0.5,
    ...                           pack_at_s=0.1 * k, unpack_at_s=1.0 - 0.1 * k) for k in range(3))
    >>> trace = Trace(tensors=recs, d2h_gbps=10.0, h2d_gbps=10.0, forward_s=0.5, backward_s=0.6)
    >>> plan, budget_bytes, _ = budget_plan(trace, "swap", MemoryBudget(fraction=0.5), NO_CODEC, "cpu", 0, epoch=0)
    >>> budget_bytes, plan.counts()["swap"] >= 1, plan.prefetch_bytes
    (6144, True, 0)
    >>> budget_plan(trace, "none", MemoryBudget(fraction=0.5), NO_CODEC, "cpu", 0, epoch=0)[2].minimum_bytes
    12288
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import numpy as np

from cswap.budget import BudgetError, MemoryBudget, format_bytes
from cswap.planner import BudgetPlan, PlannedTensor, PlanningProblem, TensorOptions, minimum_bytes, plan_budget, problem_from_trace
from cswap.planner.bounds import floor_levels, floor_shares
from cswap.planner.problem import Option
from cswap.planner.milp import EXACT_REL_GAP
from cswap.planner.solve import carry_plan, minimum_host_bytes
from cswap.planner.actions import HOST_ZVC_SWAP, KEEP, POLICY_ACTIONS, POLICY_TABLE, carried_out, compressed_on_host_if_it_shrinks
from cswap.planner.codec_choice import codecs_by_dtype
from cswap.planner.costmodel import TimeModel
from cswap.planner.plan import Action, Decision, LaunchCache, Plan, host_bytes_at_pack, unsized_compression_bytes
from cswap.profile.trace import TensorRecord, Trace
from cswap.stats import human_bytes

__all__ = [
    "DRIFT_MARGIN",
    "FALLBACK_ACTIONS",
    "FLOOR_NAMED",
    "KEEP_FIRST_POLICIES",
    "NO_CODEC",
    "PASSIVE_ACTION",
    "PROFILE_ACTIONS",
    "SPARSITY_MARGIN",
    "budget_plan",
    "floor_note",
    "host_budget_error",
    "host_codec_model",
    "profile_action",
    "keep_first_least",
    "profile_peaks",
    "profiled_device_peak",
    "with_profile_leasts",
    "plan_from_budget",
    "stated_least",
]

#: Compressed sizes are planned at the profiled sparsity less this: later batches' activations are
#: a little denser or sparser than the profiled one's, and a plan must hold for them too.
SPARSITY_MARGIN = 0.02

#: What a profiling iteration of a recomputing policy under a budget does with every tensor:
#: Capuchin's passive mode, which swaps while it profiles so that profiling works wherever the
#: final plan fits (regions cannot be recomputed before they are profiled, and a tensor kept while
#: it fits can pass the budget later, when backward rebuilds the swapped ones beside it).
PASSIVE_ACTION = Action(POLICY_TABLE["recompute"].profile_action)

# The policies the runtime runs under a budget: those planned under one, and those whose recompute
# regions are fixed (ac-full), which meet any budget at least their own peak.
_UNDER_BUDGET = {name: policy for name, policy in POLICY_TABLE.items() if policy.budget_actions or policy.checkpoints_layers}

#: Per policy, the action of least device footprint: what a profiling iteration under a budget does.
PROFILE_ACTIONS: Mapping[str, Action] = MappingProxyType(
    {name: Action(policy.profile_action) for name, policy in _UNDER_BUDGET.items()}
)

def profile_action(policy: str, host_budget_bytes: int | None = None) -> Action:
    """How a profiling iteration under a budget stores each movable tensor (:data:`PROFILE_ACTIONS`).
    Under a host budget, a policy that swaps raw there but may compress on the host (``cswap``)
    compresses every host copy instead, as ``cpu-compress-swap`` does: its profile then holds on
    the host what its plans can, not every moved byte raw.

    Example:
        >>> profile_action("cswap").value, profile_action("cswap", 1 << 20).value, profile_action("swap", 1 << 20).value
        ('swap', 'host-zvc-swap', 'swap')
    """
    action = PROFILE_ACTIONS[policy]
    if host_budget_bytes is not None and action is Action.SWAP and HOST_ZVC_SWAP in POLICY_ACTIONS.get(policy, frozenset()):
        return Action.HOST_ZVC_SWAP
    return action


#: Per policy, what a keep that would pass the budget at pack becomes (``None``: nothing smaller
#: is certain: compressing a dense tensor would hold more, not less).
FALLBACK_ACTIONS: Mapping[str, Action | None] = MappingProxyType(
    {name: None if policy.fallback_action is None else Action(policy.fallback_action) for name, policy in _UNDER_BUDGET.items()}
)

#: The policies whose profile, under a budget whose bytes are known, keeps each tensor while the
#: budget has room and compresses those it kept, oldest first, past it (:func:`keep_first_least`):
#: those whose smallest footprint is compressed on the device, with nothing else to fall back to
#: (``compress-keep``). Compressing a tensor the budget has room for saves nothing, and backward
#: holds its compressed copy beside what it rebuilds.
KEEP_FIRST_POLICIES: frozenset[str] = frozenset(
    name for name, action in PROFILE_ACTIONS.items() if action.compresses and not action.offloads and FALLBACK_ACTIONS[name] is None
)


class _NoCodec:
    """The time model of policies that never compress: codec seconds are never asked for in earnest."""

    def compress_s(self, nbytes: int, density: float, itemsize: int, backend: str) -> float:
        return 0.0

    def decompress_s(self, nbytes: int, density: float, itemsize: int, backend: str) -> float:
        return 0.0


#: A :class:`~cswap.planner.costmodel.TimeModel` that prices no codec time (for ``none`` and ``swap``).
NO_CODEC: TimeModel = _NoCodec()


def _event_names(problem: PlanningProblem) -> dict[int, str]:
    names: dict[int, str] = {}
    rebuilt: dict[int, str] = {}
    for tensor in problem.tensors:
        if tensor.lifetime is None:
            continue
        if tensor.lifetime.pack >= problem.forward_events:  # held from a recomputation in backward, not packed there
            what = f"key {tensor.key}" if tensor.key >= 0 else "a second copy"
            rebuilt.setdefault(tensor.lifetime.pack, f"recomputation rebuilding {what}")
            continue
        names[tensor.lifetime.pack] = f"pack of key {tensor.key}"
        if tensor.lifetime.unpack is not None:
            names[tensor.lifetime.unpack] = f"unpack of key {tensor.key}"
    return {**rebuilt, **names}


def _own_hold_at_pack(tensor: TensorOptions, planned: PlannedTensor, problem: PlanningProblem) -> int:
    for option in tensor.options:
        if (option.action, option.wait_offload, option.prefetch_distance) == (planned.action, planned.wait_offload, planned.prefetch_distance):
            return int(problem.holds(option)[tensor.lifetime.pack]) if tensor.lifetime is not None else 0
    return planned.nbytes


def _decisions(
    trace: Trace, problem: PlanningProblem, planned: BudgetPlan, launches: LaunchCache, policy: str
) -> tuple[dict[int, Decision], int, dict[int, int]]:
    """Per record its decision, the host bytes the offloaded ones need, and per planned key the
    resident bytes the plan expects just before its pack."""
    chosen = {t.key: t for t in planned.tensors}
    # a kept view of a kept storage holds nothing of its own at its pack: its credit takes its bytes back
    actions = {t.key: t.action for t in planned.tensors}
    packs = {t.key: t.lifetime.pack for t in problem.tensors if t.lifetime is not None}
    shared_at_pack = {
        pair.view_key: sum(nbytes for first, last, nbytes in pair.credit_holds if first <= packs[pair.view_key] <= last)
        for pair in problem.shared
        if actions.get(pair.owner_key) == KEEP == actions.get(pair.view_key)
    }
    expected = {
        t.key: planned.timeline_bytes[t.lifetime.pack] - _own_hold_at_pack(t, chosen[t.key], problem) - shared_at_pack.get(t.key, 0)
        for t in problem.tensors
        if t.lifetime is not None
    }
    lifetimes = {t.key: t.lifetime for t in problem.tensors}
    compressed = {t.key: t.compressed_nbytes for t in problem.tensors}
    codecs = {t.key: t.codec for t in problem.tensors}
    timeline = planned.timeline_bytes
    kept_reasons: Mapping[str, str] = trace.meta.get("not_offloadable", {})
    duplicates: Mapping[str, int] = trace.meta.get("duplicates", {})
    decisions: dict[int, Decision] = {}
    host_bytes = 0
    for record in trace.tensors:
        base: dict[str, Any] = dict(key=record.key, shape=tuple(record.shape), dtype=record.dtype, nbytes=record.nbytes,
                                    sparsity=record.sparsity, module=record.module, encoded_dtype=record.narrow_dtype)
        first = duplicates.get(str(record.key))
        tensor = chosen.get(record.key)
        if first is not None and first in decisions:
            decisions[record.key] = replace(decisions[first], **base, reason=f"duplicate of key {first}: stored once")
            continue
        if tensor is None:
            decisions[record.key] = Decision(**base, action=Action.KEEP, reason=kept_reasons.get(str(record.key), "not offloadable"))
            continue
        # cpu-compress-swap's swaps compress on the host, where that shrinks them (else held raw)
        action = Action(compressed_on_host_if_it_shrinks(carried_out(policy, tensor.action), record.nbytes, compressed.get(record.key)))
        life = lifetimes[record.key]
        slack = planned.budget_bytes - max(timeline[life.pack : life.free + 1], default=0) if life is not None else None
        # a compressing action, or a budget fallback to one, encodes by the codec the tensor was sized with
        extra: dict[str, Any] = {"codec": codecs[record.key]}
        if action.compresses:  # each codec runs with the launches tuned for its own kernels (LaunchCache.launches)
            extra.update(launches.launches(record.dtype, record.nbytes, codecs[record.key]))
        if action is Action.ZVC_KEEP:
            extra["compressed_nbytes"] = float(tensor.held_bytes - record.nbytes)  # it holds raw + compressed at pack
        elif action is Action.HOST_ZVC_SWAP and compressed.get(record.key) is not None:
            # what its host copy shrinks to, and the room the pack sets aside for it (plan.host_reserve_bytes)
            extra["compressed_nbytes"] = float(compressed[record.key])
        decisions[record.key] = Decision(
            **base,
            action=action,
            reason=f"budget plan ({planned.status}): {action.value} at {tensor.cost_s * 1e3:.3f} ms predicted",
            predicted_s=tensor.cost_s,
            slack_bytes=slack,
            **extra,
        )
        if action is Action.SWAP or action is Action.ZVC_SWAP:  # host-zvc-swap's raw copies are transient (advisor)
            host_bytes += record.nbytes
    return decisions, host_bytes, expected


def plan_from_budget(
    trace: Trace, problem: PlanningProblem, planned: BudgetPlan, rules: Mapping[str, Any], default_action: Action, least_bytes: int,
    none_peak_bytes: int | None = None,
) -> Plan:
    """The executor's :class:`~cswap.planner.plan.Plan` from the planner's ``planned`` solution of ``problem``.

    Args:
        trace: the profile ``problem`` was built from.
        problem: the planner's problem.
        planned: its solution within the budget.
        rules: the :class:`~cswap.planner.plan.Plan` fields that do not come from the solution (``policy``,
            ``epoch``, ``min_bytes``, ``launches``, ``budget_bytes``, ``fallback_action``, bandwidths).
        default_action: the action of a key the plan does not know.
        least_bytes: the policy's least budget, reported in the planner summary.
        none_peak_bytes: policy ``none``'s peak on the same profile, reported in the planner summary
            (what a budget is a fraction of).
    """
    launches = rules["launches"]
    unpacked = sorted((r for r in trace.tensors if r.unpack_order is not None), key=lambda r: r.unpack_order)
    decisions, host_bytes, expected = _decisions(trace, problem, planned, launches, rules["policy"])
    event = _event_names(problem).get(planned.binding_event, f"event {planned.binding_event}")
    binding = (f"{event} (event {planned.binding_event}): {planned.timeline_bytes[planned.binding_event] if planned.timeline_bytes else 0:,d} B "
               f"planned, slack {planned.slack_bytes:,d} B")
    summary = dict(status=planned.status, predicted_s=planned.predicted_s, peak_bytes=planned.peak_bytes, slack_bytes=planned.slack_bytes,
                   minimum_bytes=least_bytes, greedy_gap_s=planned.greedy_gap_s, solve_s=planned.solve_s,
                   prefetch_window_bytes=planned.prefetch_window_bytes, none_peak_bytes=none_peak_bytes)
    if planned.host_budget_bytes is not None:
        # Under a host budget the arena is sized by the planned host peak, not by every offloaded
        # byte at once: the budget is what the host may hold.
        host_bytes = planned.host_peak_bytes
        summary.update(host_budget_bytes=planned.host_budget_bytes, host_peak_bytes=planned.host_peak_bytes)
    return Plan(**rules, default_action=default_action, decisions=decisions, unpack_order=tuple(r.key for r in unpacked),
                host_bytes=host_bytes, unseen_codecs=_unseen_codecs(trace, problem), default_reason=f"policy {rules['policy']} under a budget: not in the plan, smallest footprint",
                prefetch_bytes=planned.prefetch_window_bytes, binding=binding, expected_bytes=expected, planner=MappingProxyType(summary),
                solution=planned)


def _unseen_codecs(trace: Trace, problem: PlanningProblem) -> dict[str, str]:
    """Per dtype, the codec a tensor the plan does not know takes (:attr:`Plan.unseen_codecs`)."""
    dtypes = {r.key: r.dtype for r in trace.tensors}
    return codecs_by_dtype((dtypes[t.key], t.nbytes, t.codec) for t in problem.tensors if t.compressed_nbytes is not None and t.key in dtypes)


#: The share added to the least budget of a policy whose profile compresses every tensor: its
#: profiled peak holds compressed sizes, which drift a little as training changes the data (0.05 to
#: 0.4% over four epochs of SGD on a GPT-2, a DenseNet and a ViT), so a run at the stated least
#: still profiles within it at later epochs.
DRIFT_MARGIN = 0.01


def stated_least(least: int, profile_action: Action) -> int:
    """The least budget to tell a user: ``least``, with :data:`DRIFT_MARGIN` more when the profiling
    iteration compresses (its peak depends on the data).

    >>> stated_least(100_000, Action.ZVC_KEEP), stated_least(100_000, Action.SWAP)
    (101000, 100000)
    """
    return math.ceil(least * (1.0 + DRIFT_MARGIN)) if profile_action.compresses else least


def _drift_note(least: int, stated: int) -> str:
    if stated == least:
        return ""
    return (f"It includes a {DRIFT_MARGIN:.0%} margin over this profile's {least:,d} bytes: compressed sizes drift as "
            "training changes the activations, and the budget must hold at the next epoch's profile too.")


def _advice(problem: PlanningProblem, policy: str, least: int, host_budget: bool = False) -> str:
    """What would lower ``policy``'s ``least`` on this profile, as the end of a BudgetError's advice:
    the policy with every action where its least is lower (not under a host budget, where the
    least is the profiling iteration's as much as the plan's); else nothing (``min_bytes`` binds
    nothing under a budget, and :func:`floor_note` says what does)."""
    if policy != "cswap" and not host_budget:
        every = minimum_bytes(problem, "cswap")
        if every < least:
            return f", or use policy cswap, whose least here is {every:,d} bytes (every action)"
    return ""


#: How many of the tensors held at the floor's event a :class:`~cswap.budget.BudgetError` names.
FLOOR_NAMED = 3


def _tensor_words(key: int, held: int, records: Mapping[int, TensorRecord], rebuilt: bool) -> str:
    """One tensor held at the floor, in words: its module (when the trace knows it) and key, dtype,
    shape and the bytes it holds there."""
    if key < 0:
        return f"a recomputation's second copy, {human_bytes(held)} held"
    record = records.get(key)
    if record is None:
        return f"key {key}, {human_bytes(held)} held"
    what = f"{record.module} key {key}" if record.module else f"key {key}"
    how = " rebuilt by its recomputation" if rebuilt else ""
    return f"{what}, {record.dtype} {list(record.shape)}, {human_bytes(held)} held{how}"


def floor_note(trace: Trace, problem: PlanningProblem, policy: str, least_bytes: int, extra_bytes: int = 0) -> str:
    """What sets ``policy``'s least budget on ``problem``, for a :class:`~cswap.budget.BudgetError`:
    the event where the bytes that stay resident whatever the plan does are most (the tensors
    packed or in use there, rebuilt ones, those the policy may only keep), and the
    :data:`FLOOR_NAMED` largest of them, each by its module from ``trace`` (else its key), dtype,
    shape and bytes.

    Args:
        trace: the profile ``problem`` was built from (the records' modules and shapes).
        problem: the planner's problem.
        policy: the policy whose options count (``cswap``: every action).
        least_bytes: the least budget planned on ``problem`` (without ``extra_bytes``): the note
            says the floor sets it where they are equal.
        extra_bytes: bytes held throughout beside ``problem``'s (recompute regions' inputs).

    Example:
        >>> from cswap.planner.lifetime import lifetimes_from_orders
        >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
        >>> from cswap.profile.trace import TensorRecord, Trace
        >>> recs = tuple(TensorRecord(key=k, shape=(n // 4,), dtype="float32", nbytes=n, sparsity=0.0, module=m)
        ...              for k, (n, m) in enumerate([(4096, "fc1 (Linear)"), (1024, "")]))
        >>> events = lifetimes_from_orders([0, 1], [1, 0])
        >>> specs = [TensorSpec(key=r.key, nbytes=r.nbytes, lifetime=lt) for r, lt in zip(recs, events.lifetimes)]
        >>> problem = build_problem(specs, events, [0.0, 1.0, 2.0, 3.0], 1.5, LinkModel(1e-6, 1e-6, async_copies=False))
        >>> print(floor_note(Trace(tensors=recs), problem, "swap", 4096))  # doctest: +NORMALIZE_WHITESPACE
        The floor is set at the pack of key 0 (event 0): whatever the plan does, 4.0 KiB stay resident there,
        the tensors in use or kept: fc1 (Linear) key 0, float32 [1024], 4.0 KiB held.
    """
    if not problem.tensors or not problem.event_count:
        return ""
    levels = floor_levels(problem, policy)
    event = int(np.argmax(levels))
    floor = int(levels[event])
    rebuilt_from = problem.forward_events  # a tensor held from backward on is rebuilt by a recomputation
    packs = {t.key: t.lifetime.pack for t in problem.tensors if t.lifetime is not None}
    held = [(nbytes, key, packs.get(key, -1) >= rebuilt_from) for key, nbytes in floor_shares(problem, policy, event).items() if nbytes > 0]
    held.sort(key=lambda h: (-h[0], h[1]))
    records = {r.key: r for r in trace.tensors}
    named = "; ".join(_tensor_words(key, nbytes, records, rebuilt) for nbytes, key, rebuilt in held[:FLOOR_NAMED])
    rest = held[FLOOR_NAMED:]
    if rest:
        named += f"; and {len(rest)} more ({human_bytes(sum(h[0] for h in rest))})"
    where = f"the {_event_names(problem).get(event, 'event')} (event {event})"
    beside = f" beside {human_bytes(extra_bytes)} of recompute regions' inputs held throughout" if extra_bytes else ""
    if floor >= least_bytes:
        return (f"The floor is set at {where}: whatever the plan does, {human_bytes(floor)} stay resident there{beside}, "
                f"the tensors in use or kept: {named}.")
    return (f"The floor is at its highest at {where}: whatever the plan does, {human_bytes(floor)} stay resident there{beside} "
            f"({named}); no plan meets it at every event at once.")


# What a profile's zvc-keep does with a tensor (cswap.execute.executor.Executor._smallest_coding).
_BY_SMALLEST_CODING = " by the codec that gives it the fewest bytes (raw where none shrinks it)"


def _profile_note(planned_least: int, profiled_peak_bytes: int, action: Action, keeps_first: bool = False) -> str:
    """Why the least is above what the plans need, where the profiling iteration sets it, or ``""``
    (``keeps_first``: the profile keeps each tensor while the budget leaves room, and
    ``profiled_peak_bytes`` is the least budget it holds)."""
    if profiled_peak_bytes <= planned_least:
        return ""
    coding = _BY_SMALLEST_CODING if action is Action.ZVC_KEEP else ""
    if keeps_first:
        return (f"The plans need {human_bytes(planned_least)}, but a run at the budget profiles first, keeping each tensor "
                f"while the budget leaves room and past it storing those it kept, oldest first, as {action.value}{coding}, "
                f"and that iteration holds no budget below {human_bytes(profiled_peak_bytes)}.")
    return (f"The plans need {human_bytes(planned_least)}, but a run at the budget profiles first, storing every tensor "
            f"as {action.value}{coding}, and that iteration reaches {human_bytes(profiled_peak_bytes)}.")


def _above_plain(least: int, none_bytes: int, action: Action) -> str:
    """Why a least budget is above what plain PyTorch holds, or ``""`` when it is not."""
    if least <= none_bytes:
        return ""
    return (f"That is more than plain PyTorch holds here ({format_bytes(none_bytes)}): under a budget the profiling "
            f"iteration stores every tensor as {action.value}, and those copies, with what backward rebuilds from them, "
            "sit beside tensors that stay alive anyway (views of one storage saved apart; a backward that saves what it "
            "reads: create_graph=True, retain_graph=True), where plain PyTorch holds one reference.")


def host_budget_error(problem: PlanningProblem, policy: str, budget_bytes: int, host_budget_bytes: int, alone_bytes: int,
                      least_bytes: int, profiled_host_peak_bytes: int = 0, none_peak_bytes: int | None = None,
                      why: str = "", advice: str | None = None, profile_action: Action | None = None) -> BudgetError:
    """The :class:`~cswap.budget.BudgetError` of a policy that cannot meet ``budget_bytes`` and
    ``host_budget_bytes`` together: the device budget binds when it is below ``alone_bytes`` (the
    least the policy meets with no host budget), else the host budget does. It carries
    ``least_bytes`` (the least device budget within the host budget) and the least host budget
    within the device budget (or within ``least_bytes`` when the device binds), at least the host
    bytes the profiling iteration held (``profiled_host_peak_bytes``: a run at the budgets profiles
    first; with :data:`DRIFT_MARGIN` more when ``profile_action`` compresses, as :func:`stated_least`)."""
    binding = "device" if budget_bytes < alone_bytes else "host"
    host_least = minimum_host_bytes(problem, policy, least_bytes if binding == "device" else budget_bytes)
    if host_least is not None:
        host_least = max(host_least, profiled_host_peak_bytes, 1)
        if profile_action is not None:
            host_least = stated_least(host_least, profile_action)
    return BudgetError(least_bytes, policy, budget_bytes, why, none_peak_bytes=none_peak_bytes, advice=advice,
                       host_budget_bytes=host_budget_bytes, host_minimum_bytes=host_least, binding=binding)


def _profile_option(tensor: TensorOptions, action: Action) -> Option | None:
    """The option a profiling iteration stores ``tensor`` with: ``action``, fetched on demand (a
    profile prefetches nothing), the copy waited for where that is offered. A ``host-zvc-swap``
    not offered (ZVC cannot shrink the tensor) is carried out as a raw swap."""
    mine = [o for o in tensor.options if o.action == action.value]
    if not mine and action is Action.HOST_ZVC_SWAP:
        mine = [o for o in tensor.options if o.action == Action.SWAP.value]
    if not mine:
        return None
    return min(mine, key=lambda o: (o.prefetch_distance or 0, not o.wait_offload))


def profile_peaks(problem: PlanningProblem, action: Action, budget_bytes: int | None, host_budget_bytes: int | None,
                  keeps_first: bool = False) -> tuple[int, int]:
    """The device and host peaks of a profiling iteration at these budgets, by the pack's rule
    (:meth:`cswap.planner.plan.Plan.resolve`): in pack order, each tensor is stored with the
    profile's ``action`` when its host copy fits the host bytes held, else kept where the device
    budget leaves room, else stored with ``action`` all the same (the device budget first). A
    compression not yet sized is taken at its raw bytes and a bitmap's more, as the rule does, and
    a ``host-zvc-swap`` at its raw copy and that room for its compression. ``keeps_first``: a
    device-side ``action`` (compress-keep's profile under a budget in bytes) keeps each tensor
    while the device budget leaves room, else stores those it kept with ``action``, saved first
    first, until it does, else stores this one with ``action``.

    Example:
        >>> from cswap.planner.lifetime import lifetimes_from_orders
        >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
        >>> events = lifetimes_from_orders([0, 1], [1, 0])
        >>> specs = [TensorSpec(key=k, nbytes=1000, lifetime=lt) for k, lt in enumerate(events.lifetimes)]
        >>> problem = build_problem(specs, events, [0.0, 1.0, 2.0, 3.0], 1.5, LinkModel(1e-6, 1e-6, async_copies=False))
        >>> profile_peaks(problem, Action.SWAP, None, 1000), profile_peaks(problem, Action.SWAP, 1000, 500)
        ((1000, 1000), (2000, 2000))

    At budgets of 1000 and 500 B the first tensor is kept (the host is full), the second swapped
    all the same (the device is full too), and backward swaps the first to the host to read the
    second.
    """
    device = np.zeros(problem.event_count, dtype=np.int64)
    host = np.zeros(problem.event_count, dtype=np.int64)
    compressing = _HostCompressions()
    host_peak = 0
    kept: list[TensorOptions] = []
    compactable: list[tuple[Option, Option]] = []  # kept raw, and how it is stored compressed
    order = sorted((t for t in problem.tensors if t.lifetime is not None), key=lambda t: t.lifetime.pack)  # type: ignore[union-attr]
    for tensor in order:
        keep = next(o for o in tensor.options if o.action == Action.KEEP.value)
        kept_bytes = tensor.kept_nbytes
        moved = _profile_option(tensor, action)
        choice = keep
        pack = tensor.lifetime.pack  # type: ignore[union-attr]
        # A host-compressing profile compresses every host copy; one ZVC would not shrink (not
        # offered host-zvc-swap) stays raw once collected, but sets the room aside all the same.
        on_host = action is Action.HOST_ZVC_SWAP and moved is not None and bool(moved.host_holds)
        if moved is not None and moved.host_holds:
            size = host_bytes_at_pack(action, tensor.nbytes)  # nothing is sized in a profile
            # pending compressions are collected first while the copy would pass the host budget
            limit = None if host_budget_bytes is None else host_budget_bytes - size - int(host[pack])
            held = int(host[pack]) + compressing.held_at(pack, limit)
            if host_budget_bytes is None or held + size <= host_budget_bytes:
                choice = moved
            elif budget_bytes is not None and device[pack] + kept_bytes > budget_bytes:
                choice = moved
        elif moved is not None and keeps_first and budget_bytes is not None:
            # compress the oldest kept first (Executor._compact_kept): from this pack on they hold
            # their compressed bytes
            while compactable and device[pack] + kept_bytes > budget_bytes:
                raw, coded = compactable.pop(0)
                change = problem.holds(coded) - problem.holds(raw)
                change[:pack] = 0
                device += change
            choice = keep if device[pack] + kept_bytes <= budget_bytes else moved
            if choice is keep:
                compactable.append((keep, moved))
        elif moved is not None:
            choice = moved
        device += problem.holds(choice)
        if choice is keep:
            kept.append(tensor)
        elif choice.host_holds:
            if on_host:
                compressing.add(tensor, pack)
            else:
                host += problem.host_holds(choice)
            # in forward the host grows only at a pack: its peak there is at one
            host_peak = max(host_peak, int(host[pack]) + compressing.held_at(pack, None))
    if budget_bytes is not None and action.offloads:
        _evict_in_backward(problem, device, host, kept, budget_bytes)
        for event in range(problem.forward_events, problem.event_count):
            host_peak = max(host_peak, int(host[event]) + compressing.held_at(event, None))
    return int(device.max(initial=0)), host_peak


class _HostCompressions:
    """A profile's ``host-zvc-swap`` copies as its packs count them
    (:meth:`cswap.execute.streams.Transfers.make_host_room`): from its pack each holds its raw copy
    and ZVC's most beside it, until a later pack that needs the room collects it (oldest first);
    then its compressed bytes (its raw bytes where ZVC would not shrink it) to its free point. A
    worker that finishes sooner is collected sooner, which only holds less."""

    def __init__(self) -> None:
        self.live: list[list[int]] = []  # per copy, in pack order: [free point, bytes held, bytes once collected]

    def held_at(self, event: int, limit: int | None) -> int:
        """What they hold at ``event``, after collecting the oldest pending ones while the bytes
        they hold pass ``limit`` (``None``: collect none)."""
        self.live = live = [entry for entry in self.live if entry[0] >= event]
        held = sum(entry[1] for entry in live)
        if limit is not None:
            for entry in live:
                if held <= limit:
                    break
                held -= entry[1] - entry[2]
                entry[1] = entry[2]
        return held

    def add(self, tensor: TensorOptions, pack: int) -> None:
        """A copy of ``tensor`` stored at ``pack``."""
        raw = int(tensor.nbytes)
        compressed = raw if tensor.compressed_nbytes is None else min(int(tensor.compressed_nbytes), raw)
        assert tensor.lifetime is not None
        self.live.append([int(tensor.lifetime.free), raw + unsized_compression_bytes(raw), compressed])


def _evict_in_backward(problem: PlanningProblem, device: np.ndarray, host: np.ndarray, kept: list[TensorOptions],
                       budget_bytes: int) -> None:
    """Backward's evictions (:meth:`cswap.execute.executor.Executor._make_room`), applied to a
    profile's ``device`` and ``host`` bytes per event: at each event where the device passes the
    budget, the kept tensors not read yet, saved first first, are swapped to the host until it
    does not, each off the device until its first read and on the host to its free point (the
    device budget first)."""
    waiting = sorted((t for t in kept if t.lifetime is not None and t.lifetime.unpack is not None),
                     key=lambda t: t.lifetime.pack)  # type: ignore[union-attr]
    for event in range(problem.forward_events, problem.event_count):
        if device[event] <= budget_bytes:
            continue
        for tensor in list(waiting):
            life = tensor.lifetime
            assert life is not None and life.unpack is not None
            if life.unpack <= event:
                continue
            waiting.remove(tensor)
            device[event : life.unpack] -= tensor.kept_nbytes
            host[event : life.free + 1] += tensor.nbytes
            if device[event] <= budget_bytes:
                break


def _profile_least_host(problem: PlanningProblem, action: Action, budget_bytes: int) -> int:
    """The least host budget a profiling iteration at ``budget_bytes`` holds both at. The device
    side is held to the budget or to the profile's peak with every tensor moved, whichever is more:
    the model's transient bytes (a compression's source beside its output) are the runtime's to
    count, and a fresh run's profile reached that peak within the budget."""
    everything = profile_peaks(problem, action, budget_bytes, None)
    device_bound = max(budget_bytes, everything[0])

    def holds(host_budget: int) -> bool:
        device, host = profile_peaks(problem, action, budget_bytes, host_budget)
        return device <= device_bound and host <= host_budget

    return _least_holding(0, max(everything[1], 1), holds)  # the profile holds both at the second


def _least_holding(low: int, high: int, holds: Callable[[int], bool]) -> int:
    """The least budget in ``(low, high]`` that ``holds``, by bisection: it fails at ``low`` and holds at ``high``."""
    while high - low > 1:
        middle = (low + high) // 2
        if holds(middle):
            high = middle
        else:
            low = middle
    return high


def keep_first_least(problem: PlanningProblem, action: Action, low_bytes: int, high_bytes: int) -> int:
    """The least budget from ``low_bytes`` up at which a profiling iteration that keeps each tensor
    while the budget leaves room, and compresses with the device-side ``action`` what it kept past
    it, holds it (:func:`profile_peaks` with ``keeps_first``; compress-keep's profile under a
    budget in bytes). At ``high_bytes``, ``none``'s peak, such a profile keeps every tensor and holds it.

    Example:
        >>> from cswap.planner.lifetime import lifetimes_from_orders
        >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
        >>> events = lifetimes_from_orders([0, 1], [1, 0])
        >>> specs = [TensorSpec(key=k, nbytes=1000, lifetime=lt) for k, lt in enumerate(events.lifetimes)]
        >>> problem = build_problem(specs, events, [0.0, 1.0, 2.0, 3.0], 1.5, LinkModel(1e-6, 1e-6, async_copies=False))
        >>> keep_first_least(problem, Action.ZVC_KEEP, 0, 2000)
        2000

    Neither tensor compresses here, so a profile holds both raw: ``none``'s peak.
    """
    def holds(budget_bytes: int) -> bool:
        return profile_peaks(problem, action, budget_bytes, None, keeps_first=True)[0] <= budget_bytes

    return low_bytes if holds(low_bytes) else _least_holding(low_bytes, max(high_bytes, low_bytes), holds)


def profiled_device_peak(problem: PlanningProblem, policy: str, budget_bytes: int, host_budget_bytes: int | None,
                         observed_bytes: int | None, keeps_first: bool = False) -> int:
    """The device peak of the profiling iteration behind a plan at ``budget_bytes``: the one
    observed, or for ``None`` (the first profile under a fraction of ``none``'s peak ran before the
    budget was known: keeping what the host budget had no room for, or, for ``compress-keep``,
    keeping first against the fraction of the ``none`` peak seen so far, a lower budget)
    :func:`profile_peaks`' replay of the profile a known budget would
    have run, storing every tensor at the least device footprint (``keeps_first``: keeping each
    while the budget leaves room, :data:`KEEP_FIRST_POLICIES`).

    Example:
        >>> from cswap.planner.lifetime import lifetimes_from_orders
        >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
        >>> events = lifetimes_from_orders([0, 1], [1, 0])
        >>> specs = [TensorSpec(key=k, nbytes=1000, lifetime=lt) for k, lt in enumerate(events.lifetimes)]
        >>> problem = build_problem(specs, events, [0.0, 1.0, 2.0, 3.0], 1.5, LinkModel(1e-6, 1e-6, async_copies=False))
        >>> profiled_device_peak(problem, "swap", 1000, 500, 2000), profiled_device_peak(problem, "swap", 1000, 500, None)
        (2000, 1000)
    """
    if observed_bytes is not None:
        return observed_bytes
    return profile_peaks(problem, profile_action(policy, host_budget_bytes), budget_bytes, None, keeps_first=keeps_first)[0]


def with_profile_leasts(error: BudgetError, problem: PlanningProblem, action: Action) -> BudgetError:
    """``error`` with its least budgets raised to what the profiling iteration of a fresh run at
    them needs (:func:`profile_peaks`): it stores every tensor at the policy's least device
    footprint while the host takes it, and keeps the rest.

    Example:
        >>> from cswap.planner.lifetime import lifetimes_from_orders
        >>> from cswap.planner.problem import LinkModel, TensorSpec, build_problem
        >>> events = lifetimes_from_orders([0, 1], [1, 0])
        >>> specs = [TensorSpec(key=k, nbytes=1000, lifetime=lt) for k, lt in enumerate(events.lifetimes)]
        >>> problem = build_problem(specs, events, [0.0, 1.0, 2.0, 3.0], 1.5, LinkModel(1e-6, 1e-6, async_copies=False))
        >>> error = BudgetError(1000, "swap", 1000, host_budget_bytes=500, host_minimum_bytes=1000, binding="host")
        >>> raised = with_profile_leasts(error, problem, Action.SWAP)
        >>> raised.minimum_bytes, raised.host_minimum_bytes, raised.binding
        (2000, 1000, 'host')
    """
    host_budget = error.host_budget_bytes
    assert host_budget is not None
    least = max(error.minimum_bytes, stated_least(profile_peaks(problem, action, None, host_budget)[0], action))
    host_least = error.host_minimum_bytes
    if host_least is not None:
        at = error.budget_bytes if error.binding == "host" else least
        # a profile compressing on the host holds compressed bytes there, which drift like a device compression's
        host_margin = Action.ZVC_SWAP if action is Action.HOST_ZVC_SWAP else action
        host_least = max(host_least, stated_least(_profile_least_host(problem, action, at), host_margin))
    return BudgetError(least, error.policy, error.budget_bytes, error.why, error.none_peak_bytes, error.advice, host_budget, host_least,
                       error.binding)


def host_codec_model(policy: str, host_budget_bytes: int | None, time_model: TimeModel, backend: str,
                     host_time_model: TimeModel | None = None) -> TimeModel | None:
    """The host codec's time model to offer ``host-zvc-swap`` with, or ``None`` not to offer it:
    only under a host budget (without one it never pays, and a plan without one is left as it
    was) and for a policy that may use it. Default: ``time_model`` where it is the ``cpu``
    backend's, else :data:`NO_CODEC`.

    Example:
        >>> host_codec_model("cswap", None, NO_CODEC, "cpu") is None, host_codec_model("swap", 1 << 20, NO_CODEC, "cpu") is None
        (True, True)
        >>> host_codec_model("cswap", 1 << 20, NO_CODEC, "cpu") is NO_CODEC
        True
    """
    if host_budget_bytes is None or HOST_ZVC_SWAP not in POLICY_ACTIONS.get(policy, frozenset()):
        return None
    if host_time_model is not None:
        return host_time_model
    return time_model if backend == "cpu" else NO_CODEC


def budget_plan(
    trace: Trace,
    policy: str,
    budget: MemoryBudget,
    time_model: TimeModel,
    backend: str,
    min_bytes: int,
    epoch: int,
    launches: LaunchCache | None = None,
    profiled_peak_bytes: int | None = 0,
    host_budget_bytes: int | None = None,
    profiled_host_peak_bytes: int = 0,
    host_time_model: TimeModel | None = None,
    time_limit_s: float = 30.0,
    rel_gap: float = EXACT_REL_GAP,
    carried: BudgetPlan | None = None,
    profile_keeps_first: bool = False,
) -> tuple[Plan, int, BudgetError | None]:
    """The plan of ``policy`` within ``budget`` from a profiling iteration's ``trace``.

    Args:
        trace: the profile (taken with :data:`PROFILE_ACTIONS`).
        policy: the runtime's policy.
        budget: the memory budget (a fraction resolves against policy ``none``'s peak).
        time_model: predicts codec seconds (:data:`NO_CODEC` for policies that never compress).
        backend: the codec backend.
        min_bytes: the plan's ``min_bytes``, which binds nothing under a budget: the plan may move a
            tensor below it (each of its copies priced with a fixed latency, so it is kept where the
            budget allows), and one it does not know is kept while the budget allows, moved where
            it does not.
        epoch: the epoch the plan is for.
        launches: the codec launch configs.
        profiled_peak_bytes: the resident peak the profiling iteration itself reached; a run at
            the budget profiles first, so the least budget is at least this (``compress-keep``'s
            profile keeps compressed tensors beside their rebuilt ones in backward, which a plan
            may avoid). ``None``: the profile ran before the budget was known (a fraction of
            ``none``'s peak) under a host budget, or for ``compress-keep``, and the peak of the
            profile a known budget runs is replayed (:func:`profiled_device_peak`; for
            ``compress-keep`` the one that keeps first, as ``profile_keeps_first``).
        host_budget_bytes: the host memory budget (``None``: none): the plan's host copies stay
            within it at every event too, or the error names the budget that binds.
        profiled_host_peak_bytes: the host bytes the profiling iteration itself held (0: it ran
            before the budget was known).
        host_time_model: predicts the host codec's seconds (backend ``cpu``): under a host budget,
            a policy that may compress on the host is offered ``host-zvc-swap`` priced with it
            (default: ``time_model``, when ``backend`` is ``cpu``, else :data:`NO_CODEC`).
        time_limit_s: the solver's time limit per solve (:data:`cswap.planner.solve.PROVING_TIME_LIMIT_S`
            for a plan needed inside training).
        rel_gap: the solver's relative gap (:data:`cswap.planner.solve.PROVING_REL_GAP` for a plan
            needed inside training).
        carried: the solution of a plan of the same graph at smaller sizes (:attr:`Plan.solution`):
            carried to these sizes without a solve where it holds the budgets
            (:func:`cswap.planner.solve.carry_plan`), else planned anew.
        profile_keeps_first: the profile kept each tensor while the budget left room and stored
            the rest at the policy's least footprint (``compress-keep`` under a budget in bytes): a
            run at another budget profiles otherwise, so where this one is refused the least is
            where that profile's replay holds (:func:`keep_first_least`), not the peak it measured.

    Returns:
        ``(plan, budget_bytes, error)``: ``error`` is the :class:`~cswap.budget.BudgetError` to
        raise when the policy cannot meet the budget (then ``plan`` is the smallest-footprint one).
    """
    launches = launches if launches is not None else LaunchCache(backend, None)
    host_codec = host_codec_model(policy, host_budget_bytes, time_model, backend, host_time_model)
    # min_bytes binds nothing under a budget: every tensor may move, a small one's copies priced with
    # their fixed latency, so the plan keeps it where the budget allows (the profile moved it too)
    problem = problem_from_trace(trace, time_model, backend, min_bytes=0, sparsity_margin=SPARSITY_MARGIN,
                                 host_time_model=host_codec, copy_latency_below=min_bytes)
    none_bytes = minimum_bytes(problem, "none")
    budget_bytes = budget.resolve(max(none_bytes, 1)) if budget.relative else budget.resolve()
    fallback = FALLBACK_ACTIONS[policy]
    rules: dict[str, Any] = dict(policy=policy, epoch=epoch, min_bytes=min_bytes, launches=launches, budget_bytes=budget_bytes,
                                 fallback_action=fallback, d2h_gbps=trace.d2h_gbps, h2d_gbps=trace.h2d_gbps)
    unpacked = sorted((r for r in trace.tensors if r.unpack_order is not None), key=lambda r: r.unpack_order)
    unpack_order = tuple(r.key for r in unpacked)
    # a profile that ran before the budget was known is replayed as the one a known budget runs
    profile_keeps_first = profile_keeps_first or (profiled_peak_bytes is None and policy in KEEP_FIRST_POLICIES)
    profiled_peak_bytes = profiled_device_peak(problem, policy, budget_bytes, host_budget_bytes, profiled_peak_bytes, profile_keeps_first)
    planned_least = minimum_bytes(problem, policy, time_limit_s)
    alone = max(planned_least, profiled_peak_bytes)
    if profile_keeps_first and alone > budget_bytes:
        replayed = keep_first_least(problem, profile_action(policy), planned_least, none_bytes)
        # a profile that passed this budget is not one this budget holds, whatever its replay says
        alone = max(planned_least, replayed, budget_bytes + 1 if profiled_peak_bytes > budget_bytes else 0)
    least = alone if host_budget_bytes is None else max(minimum_bytes(problem, policy, time_limit_s, host_budget_bytes=host_budget_bytes),
                                                        profiled_peak_bytes)
    planned = None
    if budget_bytes >= least and carried is not None:
        planned = carry_plan(problem, policy, budget_bytes, carried, host_budget_bytes)
    if budget_bytes >= least and planned is None:
        try:
            planned = plan_budget(problem, policy, budget_bytes, time_limit_s, host_budget_bytes=host_budget_bytes, rel_gap=rel_gap)
        except BudgetError:
            if host_budget_bytes is None:
                raise
            least = max(least, budget_bytes + 1)  # the solver found no plan at the edge: not within these budgets
    if planned is not None and host_budget_bytes is not None and profiled_host_peak_bytes > host_budget_bytes:
        # The plan fits, but its profile passed the host budget (the device budget was full): a run
        # at these budgets does not hold both. The error says what a profile holds both at.
        least = max(least, profile_peaks(problem, profile_action(policy, host_budget_bytes), None, host_budget_bytes)[0],
                    budget_bytes + 1)
        planned = None
    if planned is None:
        action = profile_action(policy, host_budget_bytes)
        stated = stated_least(least, action)
        device_binds = host_budget_bytes is None or budget_bytes < alone
        floor = floor_note(trace, problem, policy, planned_least) if device_binds else ""
        profiled = (_profile_note(planned_least, alone if profile_keeps_first else profiled_peak_bytes, action, profile_keeps_first)
                    if device_binds else "")
        why = " ".join(w for w in (floor, profiled, _drift_note(least, stated), _above_plain(least, none_bytes, action)) if w)
        advice = _advice(problem, policy, least, host_budget_bytes is not None)
        if host_budget_bytes is None:
            error = BudgetError(stated, policy, budget_bytes, why, none_peak_bytes=none_bytes or None, advice=advice)
        else:
            error = host_budget_error(problem, policy, budget_bytes, host_budget_bytes, alone, stated, profiled_host_peak_bytes,
                                      none_bytes or None, why, advice, action)
            error = with_profile_leasts(error, problem, action)
        plan = Plan(**rules, default_action=action, unpack_order=unpack_order, prefetch_bytes=0, unseen_codecs=_unseen_codecs(trace, problem),
                    default_reason=f"budget {budget_bytes:,d} B below this policy's least {least:,d} B: {action.value}")
        return plan, budget_bytes, error
    plan = plan_from_budget(trace, problem, planned, rules, profile_action(policy, host_budget_bytes), least, none_bytes)
    return plan, budget_bytes, None
