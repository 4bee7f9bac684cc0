"""Simulate one training iteration of a trace under each policy on a hardware profile.

:class:`Simulator` reads the trace once (its :class:`~cswap.simulate.timeline.Timeline` and every
tensor's sizes and codec seconds) and then gives, per policy, both models side by side:

* the paper's **per-tensor formula** (:mod:`cswap.simulate.formula`), and
* the **queue model** (:mod:`cswap.simulate.queues`), which also gives peak device memory.

Device (de)compression runs on the compute stream (:mod:`cswap.simulate.queues` says why).

The ``cswap`` policy decides per tensor with :func:`cswap.planner.costmodel.decide` (T < T', the hidden
windows taken over the tensors it moves), then **verifies** the plan in the queue model. The
per-tensor model cannot see transfers piling up on the link: a tensor whose copy would be hidden
on an idle link is left uncompressed even when the link is saturated by its neighbours, so the
cost model's plan alone can lose to a global one. The verification ranks the moved tensors by the
link seconds compression saves per codec second it costs and simulates "compress the best ``k``"
for a ladder of ``k`` from 0 (= ``swap``) to all (= ``compress-swap``), including the ``k`` that
compresses exactly the tensors ZVC shrinks; the fastest of these and the cost model's plan wins
(ties go to the cost model). ``cswap`` therefore never simulates slower than ``swap`` or
``compress-swap``; the result's ``plan`` says which plan won.

Example:
    >>> from cswap.simulate.metatrace import meta_trace
    >>> trace = meta_trace("alexnet", batch_size=4, resolution=64, width_mult=0.25)
    >>> results = simulate_policies(trace, "v100-pcie3", config=SimConfig(min_bytes=0))
    >>> results["cswap"].iteration_s <= min(results["swap"].iteration_s, results["compress-swap"].iteration_s)
    True
    >>> sorted(results["none"].to_dict())[:3]
    ['actions', 'codec_s', 'compute_s']
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from cswap.codecs.format import DEFAULT_CHUNK_WORDS
from cswap.planner.costmodel import TimeModel, decide
from cswap.profile.trace import TensorRecord, Trace
from cswap.simulate.formula import formula_times
from cswap.simulate.hardware import HardwareProfile, load_hardware
from cswap.simulate.policies import Action, POLICIES, RecomputeRegion, TensorCost, candidates, resolve_policies, static_plan, tensor_costs
from cswap.simulate.queues import QueueParams, run_queues
from cswap.simulate.timeline import Timeline, hidden_windows

__all__ = ["DEFAULT_MIN_BYTES", "Breakdown", "PolicyResult", "SimConfig", "Simulator", "simulate", "simulate_policies"]

#: Tensors below this stay on the device: the runtime's default ``min_bytes`` (configs/default.yaml).
DEFAULT_MIN_BYTES = 256 * 1024


@dataclass(frozen=True)
class SimConfig:
    """Settings of a simulation.

    Args:
        min_bytes: activations below this are never moved (the runtime's rule).
        prefetch_depth: swap-ins issued ahead of need, in tensors.
        prefetch_bytes: cap on the bytes fetched ahead of need (``None``: only the depth counts).
        max_inflight_offloads: swap-outs in flight before compute waits (``None``: never waits).
        paper_size: size compressed tensors as the paper does, ``Size*(1-Sparsity)``.
        chunk_words: ZVC chunk size for exact compressed sizes.
        strip_hooks: take the profiler's hook time out of a profiled trace's timeline.
        hook_residual_s: with ``strip_hooks``, seconds per profiled hook call its own timing does
            not see (calling into and out of it), also taken out; measure it with
            :func:`cswap.simulate.validate.measure_runtime_overheads`.
        verify_cswap: check the ``cswap`` plan against ranked global plans in the queue model.
        verify_steps: about how many ``k`` of the ladder to simulate (0, all, the shrinking ones and
            evenly spaced ones between).
    """

    min_bytes: int = DEFAULT_MIN_BYTES
    prefetch_depth: int = 1
    prefetch_bytes: int | None = None
    max_inflight_offloads: int | None = None
    paper_size: bool = False
    chunk_words: int = DEFAULT_CHUNK_WORDS
    strip_hooks: bool = True
    hook_residual_s: float = 0.0
    verify_cswap: bool = True
    verify_steps: int = 32

    def __post_init__(self) -> None:
        if self.min_bytes < 0:
            raise ValueError(f"min_bytes must be >= 0, got {self.min_bytes}")
        if self.verify_steps < 1:
            raise ValueError(f"verify_steps must be >= 1, got {self.verify_steps}")


@dataclass(frozen=True)
class Breakdown:
    """Where an iteration's time goes: ``iteration_s = compute_s + exposed_transfer_s + codec_s + overhead_s``.

    ``overhead_s`` is the runtime's own hook work that compute waits for (CPU profiles; 0 on GPUs).
    ``codec_s`` is all the extra work on the compute stream: (de)compression and recomputation;
    ``recompute_s`` is the recomputation's part of it.
    """

    iteration_s: float
    compute_s: float
    exposed_transfer_s: float
    codec_s: float
    overhead_s: float = 0.0
    recompute_s: float = 0.0


@dataclass(frozen=True)
class PolicyResult:
    """One policy on one trace and profile.

    Attributes:
        policy: the policy name.
        queue: the queue model's breakdown (the headline figures).
        formula: the per-tensor formula's breakdown.
        peak_bytes: peak device bytes of saved activations in the queue model.
        host_codec_s: host CPU seconds of (de)compression (``cpu-compress-swap``).
        actions: per trace record.
        offloaded_bytes: uncompressed bytes of the tensors moved or compressed.
        transferred_bytes: bytes copied each way.
        host_bytes: bytes held in host memory after host compression.
        plan: how the actions were chosen: ``static``, ``cost-model``, or for ``cswap`` the plan of
            the verification ladder that beat the cost model's in the queue model (``swap``,
            ``compress-swap``, ``ranked k/n``: the best ``k`` of ``n`` tensors compressed).
    """

    policy: str
    queue: Breakdown
    formula: Breakdown
    peak_bytes: int
    host_codec_s: float
    actions: tuple[Action, ...]
    offloaded_bytes: int
    transferred_bytes: float
    host_bytes: float
    plan: str = "static"

    @property
    def iteration_s(self) -> float:
        """The queue model's iteration time."""
        return self.queue.iteration_s

    def action_counts(self) -> dict[str, int]:
        """How many records got each action."""
        counts = Counter(a.value for a in self.actions)
        return {a.value: counts.get(a.value, 0) for a in Action}

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-ready dict: the queue model's figures, then ``formula_*``, then the plan."""
        return {
            "iteration_s": self.queue.iteration_s,
            "compute_s": self.queue.compute_s,
            "exposed_transfer_s": self.queue.exposed_transfer_s,
            "codec_s": self.queue.codec_s,
            "recompute_s": self.queue.recompute_s,
            "overhead_s": self.queue.overhead_s,
            "peak_bytes": self.peak_bytes,
            "formula_iteration_s": self.formula.iteration_s,
            "formula_compute_s": self.formula.compute_s,
            "formula_exposed_transfer_s": self.formula.exposed_transfer_s,
            "formula_codec_s": self.formula.codec_s,
            "host_codec_s": self.host_codec_s,
            "offloaded_bytes": self.offloaded_bytes,
            "transferred_bytes": self.transferred_bytes,
            "host_bytes": self.host_bytes,
            "actions": self.action_counts(),
            "plan": self.plan,
        }


class Simulator:
    """One trace on one hardware profile, ready to simulate any policy or plan.

    Args:
        trace: a profiled trace (``rt.trace()``) or a :func:`~cswap.simulate.metatrace.meta_trace`.
        hardware: profile name, path or object.
        config: simulation settings.
        time_model: (de)compression seconds; default: the profile's codec speeds. A calibrated
            predictor (any :class:`cswap.planner.costmodel.TimeModel`) fits here.

    Example:
        >>> from cswap.simulate.metatrace import meta_trace
        >>> sim = Simulator(meta_trace("vgg11", 2, 32, width_mult=0.125), "a100-pcie4")
        >>> sim.run("none").queue.exposed_transfer_s
        0.0
    """

    def __init__(
        self,
        trace: Trace,
        hardware: str | HardwareProfile,
        config: SimConfig | None = None,
        time_model: TimeModel | None = None,
    ) -> None:
        self.trace = trace
        self.hardware = load_hardware(hardware)
        self.config = config or SimConfig()
        self.timeline = Timeline.from_trace(trace, strip_hooks=self.config.strip_hooks, hook_residual_s=self.config.hook_residual_s)
        link = self.hardware.link
        self.params = QueueParams(
            d2h_gbps=link.d2h_gbps,
            h2d_gbps=link.h2d_gbps,
            async_copies=link.async_copies,
            prefetch_depth=self.config.prefetch_depth,
            prefetch_bytes=self.config.prefetch_bytes,
            max_inflight_offloads=self.config.max_inflight_offloads,
            hook_overhead_s=self.hardware.device.hook_overhead_s,
            move_overhead_s=self.hardware.device.move_overhead_s,
            iteration_overhead_s=self.hardware.device.iteration_overhead_s,
        )
        self.time_model = time_model or self.hardware.time_model()
        self.costs = tensor_costs(
            trace,
            self.time_model,
            device_backend=self.hardware.device.kind,
            host_backend="cpu",
            paper_size=self.config.paper_size,
            chunk_words=self.config.chunk_words,
        )
        self.costs = tuple(
            replace(cost, recompute_s=self._recompute_s(record)) for cost, record in zip(self.costs, trace.tensors, strict=True)
        )
        index_of = {r.key: i for i, r in enumerate(trace.tensors)}
        self.views = tuple(index_of.get(r.view_of) if r.view_of is not None else None for r in trace.tensors)
        self.moved = candidates(trace, self.config.min_bytes)
        self.counted = [r.offloadable for r in trace.tensors]

    def _recompute_s(self, record: TensorRecord) -> float | None:
        """Seconds to recompute ``record``: measured when the trace has it, else the producing op's
        roofline (reading its input, writing its output) from its FLOPs; ``None`` (never recomputed)
        when neither is known."""
        if record.recompute_s is not None:
            return record.recompute_s
        if record.flops > 0 or self.trace.meta.get("source") == "meta":
            return self.hardware.op_s(record.flops, 2 * record.nbytes, record.dtype)
        return None

    # ------------------------------------------------------------------ plans

    def plan(self, policy: str) -> tuple[Action, ...]:
        """The cost-model or static actions of ``policy`` (before ``cswap``'s verification)."""
        if policy == "cswap":
            return self.cost_model_plan()
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}: choose one of {', '.join(POLICIES)}")
        return static_plan(policy, len(self.costs), self.moved, self.costs)

    def cost_model_plan(self) -> tuple[Action, ...]:
        """Per moved tensor, ``zvc-swap`` iff the cost model says T < T', else ``swap``."""
        link = self.hardware.link
        hidden_f, hidden_b = hidden_windows(self.timeline, self.moved, self.config.prefetch_depth)
        actions = [Action.KEEP] * len(self.costs)
        for i in self.moved:
            cost = self.costs[i]
            overlap = link.async_copies
            decision = decide(
                nbytes=cost.nbytes,
                sparsity=cost.sparsity,
                hidden_forward_s=hidden_f[i] if overlap else 0.0,
                hidden_backward_s=hidden_b.get(i, 0.0) if overlap else 0.0,
                d2h_gbps=link.d2h_gbps,
                h2d_gbps=link.h2d_gbps,
                compress_s=cost.compress_s,
                decompress_s=cost.decompress_s if self.timeline.consumed_s[i] is not None else 0.0,
                itemsize=cost.itemsize,
                paper_size=self.config.paper_size,
                chunk_words=self.config.chunk_words,
            )
            actions[i] = Action.ZVC_SWAP if decision.compress and cost.compressible else Action.SWAP
        return tuple(actions)

    def ranked_plans(self) -> list[tuple[str, tuple[Action, ...]]]:
        """The verification ladder: ``(label, actions)`` compressing the best ``k`` moved tensors.

        Tensors are ranked by link seconds saved (both ways) per codec second; ``k = 0`` is the
        ``swap`` plan and ``k = all`` the ``compress-swap`` plan.
        """
        link = self.hardware.link
        per_byte_s = 1.0 / (link.d2h_gbps * 1e9) + 1.0 / (link.h2d_gbps * 1e9)

        def gain(i: int) -> float:
            cost = self.costs[i]
            saved_s = (cost.nbytes - cost.compressed_nbytes) * per_byte_s
            return saved_s / max(cost.compress_s + cost.decompress_s, 1e-12)

        ranked = sorted((i for i in self.moved if self.costs[i].compressible), key=lambda i: (-gain(i), i))
        total = len(ranked)
        shrinking = sum(1 for i in ranked if self.costs[i].shrinks)
        step = max(1, -(-total // self.config.verify_steps))
        ladder = sorted({0, total, shrinking, *range(0, total, step)})
        swap = self.plan("swap")
        plans = []
        for k in ladder:
            actions = list(swap)
            for i in ranked[:k]:
                actions[i] = Action.ZVC_SWAP
            label = "swap" if k == 0 else "compress-swap" if k == total else f"ranked {k}/{total}"
            plans.append((label, tuple(actions)))
        return plans

    # ------------------------------------------------------------------ simulation

    def run_plan(
        self,
        actions: Sequence[Action],
        policy: str = "custom",
        plan: str = "given",
        params: QueueParams | None = None,
        fetch_after: Sequence[int | None] | None = None,
        regions: Sequence[RecomputeRegion] = (),
    ) -> PolicyResult:
        """Simulate explicit per-record ``actions`` in both models (hooks are installed unless ``policy`` is ``none``).

        ``params`` replaces the queue model's settings (a memory budget); ``fetch_after`` is a
        plan's prefetch schedule; ``regions`` are records rebuilt together by running a piece of
        forward again (:func:`cswap.simulate.queues.run_queues`). The per-tensor formula charges a
        region's forward seconds once.
        """
        actions = tuple(Action(a) for a in actions)
        if len(actions) != len(self.costs):
            raise ValueError(f"need one action per trace record: {len(self.costs)} records, {len(actions)} actions")
        hooked = policy != "none"
        outcome = run_queues(
            self.timeline, self.costs, actions, params or self.params, self.counted, hooked=hooked, fetch_after=fetch_after, regions=regions,
            views=self.views,
        )
        moved = [i for i, a in enumerate(actions) if a.transfers]
        hidden_f, hidden_b = hidden_windows(self.timeline, moved, self.config.prefetch_depth)
        link = self.hardware.link
        compute, exposed, codec = formula_times(
            self.timeline, self._region_costs(regions), actions, hidden_f, hidden_b, link.d2h_gbps, link.h2d_gbps, link.async_copies
        )
        host_bytes = sum(
            self.costs[i].compressed_nbytes if actions[i] is not Action.SWAP else self.costs[i].nbytes for i in moved
        )
        return PolicyResult(
            policy=policy,
            queue=Breakdown(
                outcome.iteration_s, outcome.compute_s, outcome.exposed_transfer_s, outcome.codec_s, outcome.overhead_s, outcome.recompute_s
            ),
            formula=Breakdown(compute + exposed + codec + outcome.overhead_s, compute, exposed, codec, outcome.overhead_s),
            peak_bytes=outcome.peak_bytes,
            host_codec_s=outcome.host_codec_s,
            actions=actions,
            offloaded_bytes=sum(self.costs[i].nbytes for i, a in enumerate(actions) if a is not Action.KEEP),
            transferred_bytes=sum(self.costs[i].transfer_nbytes(actions[i]) for i in moved),
            host_bytes=host_bytes,
            plan=plan,
        )

    def _region_costs(self, regions: Sequence[RecomputeRegion]) -> tuple[TensorCost, ...]:
        """The costs with each region's forward seconds on the first of its records backward needs
        (and nothing on the others): the per-tensor formula then charges each region once."""
        if not regions:
            return self.costs
        costs = list(self.costs)
        for region in regions:
            needed = [i for i in region.records if self.timeline.consumed_s[i] is not None]
            first = min(needed, key=self.timeline.backward_key, default=None)
            for i in region.records:
                costs[i] = replace(costs[i], recompute_s=region.forward_s if i == first else 0.0)
        return tuple(costs)

    def run(self, policy: str) -> PolicyResult:
        """Simulate ``policy`` (one of :data:`~cswap.simulate.policies.POLICIES`)."""
        if policy != "cswap":
            return self.run_plan(self.plan(policy), policy=policy, plan="static")
        best = self.run_plan(self.cost_model_plan(), policy="cswap", plan="cost-model")
        if not self.config.verify_cswap:
            return best
        for label, actions in self.ranked_plans():
            other = self.run_plan(actions, policy="cswap", plan=label)
            if other.iteration_s < best.iteration_s:
                best = other
        return best

    def run_all(self, policies: str | Sequence[str] = "all") -> dict[str, PolicyResult]:
        """Simulate several policies: ``"all"``, ``"swap,cswap"`` or a sequence of names."""
        return {policy: self.run(policy) for policy in resolve_policies(policies)}


def simulate(
    trace: Trace,
    hardware: str | HardwareProfile,
    policy: str = "cswap",
    config: SimConfig | None = None,
    time_model: TimeModel | None = None,
) -> PolicyResult:
    """Simulate one policy; see :class:`Simulator`."""
    return Simulator(trace, hardware, config, time_model).run(policy)


def simulate_policies(
    trace: Trace,
    hardware: str | HardwareProfile,
    policies: str | Sequence[str] = "all",
    config: SimConfig | None = None,
    time_model: TimeModel | None = None,
) -> dict[str, PolicyResult]:
    """Simulate several policies on one trace and profile; see :class:`Simulator`."""
    return Simulator(trace, hardware, config, time_model).run_all(policies)
