"""The largest batch that trains under each policy: measured on this GPU, or planned without one.

**Measured** (:func:`max_batch`): a batch "trains" when two iterations (the profiling one and a
planned one) of forward, backward and an SGD step finish without running out of device memory.
``torch.cuda.set_per_process_memory_fraction`` caps the allocator so a large GPU can stand in for
a smaller one (``memory_limit_bytes``).

**Planned** (:func:`planned_max_batch`): nothing is run. For each batch size a meta trace of the
model (:func:`cswap.simulate.meta_trace`) is read into the planner's problem (:func:`cswap.simulate.budgeted.planning_problem`), and the
batch fits a policy when the least activation budget the policy can meet
(:func:`cswap.planner.minimum_bytes`, honest: its plan meets it) fits in what the limit leaves:

    limit - weights - gradients - optimizer state - input batch - workspace

with the optimizer SGD with momentum (one state tensor per parameter: ``optimizer_states=1``;
Adam has 2) and a workspace allowance (``workspace_fraction`` of the limit, for convolution
workspaces, the allocator's fragmentation and the CUDA context).

A transformer (:func:`planned_max_batch_transformer`: a preset, ``hf:<model_type>`` or a config
path, traced by :func:`cswap.simulate.lmtrace.transformer_trace`) searches the micro-batch of
``seq_len``-token sequences, with the state of AdamW training in ``dtype`` counted per parameter:

    weights (dtype) + gradients (dtype) + AdamW's two moments (float32: 8 bytes)
        [+ float32 master weights (4 bytes) with ``mixed_precision`` and a 16-bit dtype]

so 12 bytes a parameter for pure bfloat16 training, 16 for mixed precision (the 2 + 2 + 12 of
Rajbhandari et al., "ZeRO", SC 2020) and 16 for float32; the input batch is the token ids and
labels (int64). Transformers are always planned, also on a GPU (not measured yet). A transformer's
saved tensors compress as a trained one's do (``compressibility``, by default what ``cswap simulate``
assumes); an image model's by its ReLU sparsity, with ZVC alone.

The strategies users pick instead of a policy (:mod:`cswap.simulate.strategies`: checkpointing
every layer, selective recompute, torchtune's and Megatron-LM's offloading, a recompute knapsack,
an exact keep/recompute/swap program) are searched with the same accounting: a batch fits a
strategy when the least budget it meets on that batch's trace
(:meth:`cswap.simulate.strategies.Strategies.minimum_bytes`: a fixed strategy's simulated peak)
fits in what the limit leaves. ``"all"`` (:data:`ALL`) names every policy with an action set and
every strategy that can run on the model (a CNN has no transformer layers to checkpoint: those
are ``skipped``, with the reason).

Both search the same way (:func:`largest_fitting`): double the batch until it fails, then bisect
between the last success and the first failure.

Several sequence lengths (``served_seq_lens``, shorter than ``seq_len``): training with variable
lengths is served by the plan for the longest (:mod:`cswap.simulate.seqlens`), and every tensor is
no larger at a shorter length, so the longest length binds: the batch is searched at ``seq_len`` as
for one length. Each name's plan at its largest batch (made within what the limit leaves there)
is then carried out at every shorter length, and ``served_s`` gives its simulated iteration
seconds per length (the longest's too); nothing else is reported per length.

Example:
    >>> largest_fitting(lambda batch: batch <= 37, start=1, ceiling=1024)
    37
    >>> result = planned_max_batch("vgg11", ("none", "swap"), 64 * 2**20, resolution=32, width_mult=0.125)
    >>> result.batches["none"] <= result.batches["swap"], result.method
    (True, 'planned')
    >>> lm = planned_max_batch_transformer("gpt2", ("none",), 2 * 2**30, seq_len=64, num_layers=1, ceiling=64)
    >>> lm.optimizer, lm.state_bytes == 12 * lm.parameters
    ('AdamW (2 float32 moments), bfloat16 weights and gradients', True)
    >>> ac = planned_max_batch_transformer("gpt2", ("none", "ac-full"), 2 * 2**30, seq_len=64, num_layers=2, ceiling=64)
    >>> ac.batches["none"] <= ac.batches["ac-full"]
    True
    >>> ranged = planned_max_batch_transformer("gpt2", ("swap",), 2 * 2**30, seq_len=64, num_layers=1, ceiling=8, served_seq_lens=(32,))
    >>> sorted(ranged.served_s["swap"]), ranged.served_s["swap"][32] < ranged.served_s["swap"][64]
    ([32, 64], True)
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from cswap import models
from cswap.profile.trace import Trace
from cswap.simulate.compressibility import DEFAULT_COMPRESSIBILITY
from cswap.runtime import Runtime

if TYPE_CHECKING:
    from cswap.planner import PlanningProblem
    from cswap.simulate import Simulator
    from cswap.simulate.strategies import Strategies

__all__ = [
    "ALL",
    "DEFAULT_WORKSPACE_FRACTION",
    "PlannedMaxBatch",
    "batch_fits",
    "largest_fitting",
    "max_batch",
    "parse_bytes",
    "planned_max_batch",
    "planned_max_batch_transformer",
    "searchable_names",
]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``"16GiB"`` -> 17179869184; decimal (GB) and binary (GiB) units.

    Example:
        >>> parse_bytes("1.5 MiB")
        1572864
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size: write e.g. 16GiB, 12GB or 500MiB")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def largest_fitting(fits: Callable[[int], bool], start: int = 1, ceiling: int = 1 << 16) -> int:
    """The largest batch in ``[start, ceiling]`` for which ``fits`` holds (0 if ``start`` fails).

    Assumes ``fits`` is monotone: a batch that fails means every larger one fails.
    """
    if not fits(start):
        return 0
    good, bad = start, None
    while bad is None:
        trial = min(good * 2, ceiling)
        if trial == good:
            return good
        if fits(trial):
            good = trial
        else:
            bad = trial
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good


def batch_fits(model: nn.Module, policy: str, batch_size: int, resolution: int, device: torch.device) -> bool:
    """Whether two training iterations at ``batch_size`` finish without a CUDA out-of-memory error.

    Every policy but ``none`` profiles swapping every tensor (Capuchin's passive mode), so the
    profiling iteration fits wherever the plan it leads to does.
    """
    runtime = Runtime(policy=policy, model=model, device=str(device), passive_profile=policy != "none")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    try:
        images = torch.randn(batch_size, 3, resolution, resolution, device=device)
        labels = torch.randint(0, 1000, (batch_size,), device=device)
        for _ in range(2):
            with runtime.iteration():
                loss_fn(model(images), labels).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        optimizer.zero_grad(set_to_none=True)
        del optimizer, runtime
        gc.collect()
        torch.cuda.empty_cache()


def max_batch(
    model_name: str,
    policies: Sequence[str],
    memory_limit_bytes: int | None = None,
    resolution: int | None = None,
    ceiling: int = 4096,
    device: str = "cuda",
) -> dict[str, int]:
    """Largest batch per policy for ``model_name`` on the GPU.

    Args:
        model_name: a name from ``cswap.models.MODEL_NAMES``.
        policies: runtime policies to compare.
        memory_limit_bytes: emulate a GPU with this much memory (``None``: the whole device).
        resolution: input size (default: the model's, 224).
        ceiling: the largest batch tried.
        device: the CUDA device.

    Raises:
        RuntimeError: no GPU (the search measures real device memory).
    """
    if not torch.cuda.is_available():
        raise RuntimeError(
            "cswap max-batch measures device memory and needs a GPU; torch sees none here "
            "(torch.cuda.is_available() is False). Use `cswap simulate` to estimate peak memory without one."
        )
    cuda = torch.device(device)
    total = torch.cuda.get_device_properties(cuda).total_memory
    if memory_limit_bytes is not None:
        if memory_limit_bytes > total:
            raise ValueError(f"--memory-limit {memory_limit_bytes} B exceeds the GPU's {total} B")
        torch.cuda.set_per_process_memory_fraction(memory_limit_bytes / total, cuda)
    resolution = resolution or models.input_size(model_name)
    model = models.build(model_name, num_classes=1000).to(cuda).train()
    try:
        return {
            policy: largest_fitting(lambda b, p=policy: batch_fits(model, p, b, resolution, cuda), ceiling=ceiling)
            for policy in policies
        }
    finally:
        if memory_limit_bytes is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, cuda)


#: Share of the memory limit set aside for workspaces, fragmentation and the CUDA context.
DEFAULT_WORKSPACE_FRACTION = 0.1

#: In a list of names, every policy with an action set and every strategy that can run on the model.
ALL = "all"


@dataclass(frozen=True)
class PlannedMaxBatch:
    """The planned largest batch per policy.

    Attributes:
        model: the model.
        memory_limit_bytes: the limit.
        batches: policy -> the largest batch whose plan fits (0: not even ``start``).
        state_bytes: weights + gradients + optimizer state.
        workspace_bytes: the workspace allowance.
        optimizer: what the optimizer state assumes.
        method: ``"planned"`` (never run).
        minimum_bytes: policy -> batch -> the least activation budget its plan meets, for the batches tried.
        parameters: the model's parameter count (0 where not counted).
        seq_len: tokens per sequence of a transformer, else None (with several lengths, the longest).
        skipped: strategies ``"all"`` left out because they cannot run on the model, and why.
        served_s: with several sequence lengths, per name, per length, the simulated iteration
            seconds of its plan for the longest length at its largest batch (``None``: no batch fits).
    """

    model: str
    memory_limit_bytes: int
    batches: dict[str, int]
    state_bytes: int
    workspace_bytes: int
    optimizer: str
    method: str = "planned"
    minimum_bytes: dict[str, dict[int, int]] = field(default_factory=dict)
    parameters: int = 0
    seq_len: int | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    served_s: dict[str, dict[int, float | None]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready; with several sequence lengths, ``lengths``: per length (ascending),
        ``seq_len`` and ``iteration_s`` per name (:attr:`served_s`)."""
        report: dict[str, object] = {
            "model": self.model,
            "memory_limit_bytes": self.memory_limit_bytes,
            "method": self.method,
            "max_batch": dict(self.batches),
            "state_bytes": self.state_bytes,
            "workspace_bytes": self.workspace_bytes,
            "optimizer": self.optimizer,
        }
        if self.seq_len is not None:
            report.update(parameters=self.parameters, seq_len=self.seq_len)
        if self.skipped:
            report["skipped"] = dict(self.skipped)
        if self.served_s:
            tokens = sorted({n for per_length in self.served_s.values() for n in per_length})
            report["lengths"] = [
                {"seq_len": n, "iteration_s": {name: per_length.get(n) for name, per_length in self.served_s.items()}} for n in tokens
            ]
        return report


def planned_max_batch(
    model: str,
    policies: Sequence[str],
    memory_limit_bytes: int,
    resolution: int = 224,
    hardware: str = "v100-pcie3",
    optimizer_states: int = 1,
    workspace_fraction: float = DEFAULT_WORKSPACE_FRACTION,
    width_mult: float = 1.0,
    ceiling: int = 4096,
    time_limit_s: float = 30.0,
) -> PlannedMaxBatch:
    """The largest batch per policy whose plan fits ``memory_limit_bytes`` (see the module docstring).

    Args:
        model: a name from ``cswap.models.MODEL_NAMES``.
        policies: policies with an action set (:data:`cswap.planner.POLICY_ACTIONS`), strategies
            (:data:`cswap.simulate.strategies.STRATEGIES`), or :data:`ALL` for every one that can run.
        memory_limit_bytes: the device memory.
        resolution: input size.
        hardware: the profile the trace's times (and so the planner's costs) come from.
        optimizer_states: optimizer tensors per parameter (SGD momentum: 1, Adam: 2, plain SGD: 0).
        workspace_fraction: share of the limit set aside as workspace, in [0, 1).
        width_mult: passed to the model builder (small models for tests).
        ceiling: the largest batch tried.
        time_limit_s: the solver's time limit per least-budget solve.

    Raises:
        ValueError: a limit that is not positive, a bad fraction or count, an unknown policy, or a
            strategy named that cannot run on the model (a checkpointing one on a CNN).
    """
    from cswap.simulate import meta_trace

    _check_settings(policies, memory_limit_bytes, workspace_fraction)
    if optimizer_states < 0:
        raise ValueError(f"optimizer_states must be >= 0 (SGD momentum: 1, Adam: 2), got {optimizer_states}")
    network = models.build(model, num_classes=1000, width_mult=width_mult)
    weight_bytes = sum(p.numel() * p.element_size() for p in network.parameters())
    state_bytes = weight_bytes * (2 + optimizer_states)  # weights, gradients, optimizer state
    optimizer = {0: "SGD without momentum", 1: "SGD with momentum", 2: "Adam"}.get(
        optimizer_states, f"{optimizer_states} states per parameter"
    )
    found = _search(
        policies,
        memory_limit_bytes,
        trace_at=lambda batch: meta_trace(model, batch, resolution, hardware, width_mult=width_mult),
        fixed_bytes=state_bytes,
        input_bytes=lambda batch: batch * 3 * resolution * resolution * 4,
        hardware=hardware,
        workspace_fraction=workspace_fraction,
        ceiling=ceiling,
        time_limit_s=time_limit_s,
    )
    parameters = sum(p.numel() for p in network.parameters())
    return PlannedMaxBatch(
        model,
        int(memory_limit_bytes),
        found.batches,
        state_bytes,
        found.workspace_bytes,
        optimizer,
        minimum_bytes=found.minimums,
        parameters=parameters,
        skipped=found.skipped,
    )


def searchable_names() -> tuple[str, ...]:
    """What the planned search takes: every policy with an action set, then every strategy
    (:data:`cswap.simulate.strategies.STRATEGIES`); ``"all"`` in a list of names stands for them.

    Example:
        >>> searchable_names()[0], searchable_names()[-1]
        ('none', 'ilp-kro')
    """
    from cswap.simulate.versus import comparable_names

    return comparable_names()


def _check_settings(policies: Sequence[str], memory_limit_bytes: int, workspace_fraction: float) -> None:
    from cswap.planner import POLICY_ACTIONS
    from cswap.simulate.strategies import STRATEGIES

    if memory_limit_bytes <= 0:
        raise ValueError(f"memory limit must be positive, got {memory_limit_bytes} bytes")
    if not 0 <= workspace_fraction < 1:
        raise ValueError(f"workspace_fraction must be in [0, 1), got {workspace_fraction}")
    unknown = [p for p in policies if p != ALL and p not in POLICY_ACTIONS and p not in STRATEGIES]
    if unknown:
        raise ValueError(
            f"policies {unknown} cannot be planned: choose from {', '.join(POLICY_ACTIONS)}, "
            f"the strategies {', '.join(STRATEGIES)}, or all"
        )


@dataclass(frozen=True)
class _Searched:
    """What :func:`_search` found: per name the largest batch, the least budgets it computed, the
    workspace allowance, and the strategies left out of ``all`` (name -> why); and per batch, the
    simulator, planning problem and strategies it used (built once) and what the limit leaves for
    activations, with the solver's time limit."""

    batches: dict[str, int]
    minimums: dict[str, dict[int, int]]
    workspace_bytes: int
    skipped: dict[str, str]
    simulator: Callable[[int], Simulator]
    problem: Callable[[int], PlanningProblem]
    strategies: Callable[[int], Strategies]
    left_bytes: Callable[[int], int]
    time_limit_s: float


def _search(
    policies: Sequence[str],
    memory_limit_bytes: int,
    trace_at: Callable[[int], Trace],
    fixed_bytes: int,
    input_bytes: Callable[[int], int],
    hardware: str,
    workspace_fraction: float,
    ceiling: int,
    time_limit_s: float,
) -> _Searched:
    """Per policy or strategy, the largest batch whose least activation budget fits what the limit
    leaves (module docstring); each batch's trace, simulator, problem and strategies are built once
    for every name. A strategy's least budget is :meth:`cswap.simulate.strategies.Strategies.minimum_bytes`
    (a fixed one's simulated peak). ``"all"`` is every policy and every strategy that can run on
    the model's trace; a strategy named that cannot is an error saying why."""
    from cswap.planner import POLICY_ACTIONS, minimum_bytes
    from cswap.simulate import SimConfig, Simulator
    from cswap.simulate.budgeted import planning_problem
    from cswap.simulate.strategies import STRATEGIES, Strategies

    workspace_bytes = int(workspace_fraction * memory_limit_bytes)
    simulators: dict[int, Simulator] = {}
    problems: dict[int, PlanningProblem] = {}
    strategies: dict[int, Strategies] = {}

    def simulator(batch: int) -> Simulator:
        if batch not in simulators:
            simulators[batch] = Simulator(trace_at(batch), hardware, SimConfig())
        return simulators[batch]

    def strategies_at(batch: int) -> Strategies:
        if batch not in strategies:
            strategies[batch] = Strategies(simulator(batch), time_limit_s)
        return strategies[batch]

    def problem(batch: int) -> PlanningProblem:
        if batch not in problems:
            problems[batch] = planning_problem(simulator(batch))[0]
        return problems[batch]

    def left_bytes(batch: int) -> int:
        return memory_limit_bytes - fixed_bytes - workspace_bytes - input_bytes(batch)

    # Which strategies run depends on the model's layers, not on the batch: the first batch tells.
    skipped: dict[str, str] = {}
    names: list[str] = []
    for name in dict.fromkeys(n for p in policies for n in (searchable_names() if p == ALL else (p,))):
        reason = strategies_at(1).unavailable(name) if name in STRATEGIES else None
        if reason is None:
            names.append(name)
        elif ALL in policies and name not in policies:
            skipped[name] = reason
        else:
            raise ValueError(f"strategy {name!r} cannot run on this model: {reason}")
    minimums: dict[str, dict[int, int]] = {p: {} for p in names}

    def least(policy: str, batch: int) -> int:
        if batch not in minimums[policy]:
            if policy in POLICY_ACTIONS:
                minimums[policy][batch] = minimum_bytes(problem(batch), policy, time_limit_s)
            else:
                minimums[policy][batch] = strategies_at(batch).minimum_bytes(policy)
        return minimums[policy][batch]

    def fits(policy: str) -> Callable[[int], bool]:
        def check(batch: int) -> bool:
            left = left_bytes(batch)
            return left > 0 and least(policy, batch) <= left

        return check

    batches = {policy: largest_fitting(fits(policy), ceiling=ceiling) for policy in names}
    return _Searched(batches, minimums, workspace_bytes, skipped, simulator, problem, strategies_at, left_bytes, time_limit_s)


def planned_max_batch_transformer(
    model: str,
    policies: Sequence[str],
    memory_limit_bytes: int,
    seq_len: int | None = None,
    dtype: str = "bfloat16",
    attention: str = "sdpa",
    num_layers: int | None = None,
    mixed_precision: bool = False,
    hardware: str = "a100-pcie4",
    workspace_fraction: float = DEFAULT_WORKSPACE_FRACTION,
    ceiling: int = 4096,
    time_limit_s: float = 30.0,
    served_seq_lens: Sequence[int] = (),
    compressibility: str | None = DEFAULT_COMPRESSIBILITY,
) -> PlannedMaxBatch:
    """The largest micro-batch of a transformer per policy whose plan fits ``memory_limit_bytes``.

    The state counted is AdamW training's (module docstring); the rest as :func:`planned_max_batch`.

    Args:
        model: a transformer preset, ``hf:<model_type>``, a config path or ``"package.module:function"``.
        policies: policies with an action set (:data:`cswap.planner.POLICY_ACTIONS`), strategies
            (:data:`cswap.simulate.strategies.STRATEGIES`), or :data:`ALL` for every one that can run.
        memory_limit_bytes: the device memory.
        seq_len: tokens per sequence (default: the preset's).
        dtype: weights, gradients and activations.
        attention: ``sdpa`` or ``eager``.
        num_layers: transformer layers, replacing the preset's.
        mixed_precision: also count float32 master weights (only with a 16-bit ``dtype``).
        hardware: the profile the trace's times come from.
        workspace_fraction, ceiling, time_limit_s: as :func:`planned_max_batch` takes them.
        served_seq_lens: shorter lengths served by the plan for ``seq_len`` (module docstring):
            :attr:`PlannedMaxBatch.served_s` gives each name's iteration seconds at each.
        compressibility: what exponent coding and bit-packing give each kind of saved tensor, a
            profile :func:`cswap.simulate.compressibility.load_compressibility` reads (measured on
            a trained transformer), as ``cswap simulate`` assumes; ``None`` or ``"none"``: ZVC
            alone, which shrinks no dense activation.

    Raises:
        ValueError: a limit that is not positive, a bad fraction, an unknown policy or model, a
            strategy named that cannot run on the model, a served length not shorter than
            ``seq_len``, or a model whose saved tensors change with the length.
    """
    from cswap.simulate.compressibility import compressibility_named
    from cswap.simulate.metatrace import SparsityModel
    from cswap.simulate.modeltrace import is_transformer_model, trace_model

    _check_settings(policies, memory_limit_bytes, workspace_fraction)
    coded = compressibility_named(compressibility)
    sparsity = SparsityModel(compressibility=coded)

    if not is_transformer_model(model, seq_len):
        raise ValueError(
            f"{model!r} is not a transformer: give a preset, hf:<model_type>, a config path, or a seq_len with 'package.module:function'"
        )

    def trace_at(batch: int) -> Trace:
        return trace_model(model, batch, hardware, dtype=dtype, seq_len=seq_len, num_layers=num_layers, attention=attention,
                           sparsity=sparsity)

    first = trace_at(1)
    parameters, weight_bytes = int(first.meta["param_count"]), int(first.meta["param_bytes"])
    master = mixed_precision and dtype in ("float16", "bfloat16")
    state_bytes = 2 * weight_bytes + 8 * parameters + (4 * parameters if master else 0)
    optimizer = f"AdamW (2 float32 moments), {dtype} weights and gradients" + (", float32 master weights" if master else "")
    tokens = int(first.meta["seq_len"])
    found = _search(
        policies,
        memory_limit_bytes,
        trace_at=lambda batch: first if batch == 1 else trace_at(batch),
        fixed_bytes=state_bytes,
        input_bytes=lambda batch: 2 * batch * tokens * 8,  # input ids and labels, int64
        hardware=hardware,
        workspace_fraction=workspace_fraction,
        ceiling=ceiling,
        time_limit_s=time_limit_s,
    )
    name = str(first.meta["model"])
    served: dict[str, dict[int, float | None]] = {}
    if served_seq_lens:
        longer = sorted({n for n in served_seq_lens if not 0 < n < tokens})
        if longer:
            raise ValueError(f"served lengths {longer} are not shorter than the {tokens} tokens the batch is searched at")

        def trace_short(batch: int, length: int) -> Trace:
            return trace_model(model, batch, hardware, dtype=dtype, seq_len=length, num_layers=num_layers, attention=attention,
                               sparsity=sparsity)

        served = _served_times(found, sorted(set(served_seq_lens)), tokens, trace_short)
    return PlannedMaxBatch(
        name,
        int(memory_limit_bytes),
        found.batches,
        state_bytes,
        found.workspace_bytes,
        optimizer,
        minimum_bytes=found.minimums,
        parameters=parameters,
        seq_len=tokens,
        skipped=found.skipped,
        served_s=served,
    )


def _served_times(
    found: _Searched, shorter: Sequence[int], longest: int, trace_at: Callable[[int, int], Trace]
) -> dict[str, dict[int, float | None]]:
    """Per name, per length: the iteration seconds of its plan at its largest batch, made within what
    the limit leaves there at the ``longest`` length, carried out at each ``shorter`` length
    (:func:`cswap.simulate.seqlens.serve_plan`); ``None`` where no batch fits."""
    from cswap.planner import POLICY_ACTIONS
    from cswap.simulate import Simulator
    from cswap.simulate.budgeted import run_budget
    from cswap.simulate.seqlens import check_same_structure, serve_plan

    from cswap.simulate.budgeted import planning_problem
    from cswap.simulate.strategies import Strategies

    simulators: dict[tuple[int, int], Simulator] = {}
    problems: dict[tuple[int, int], PlanningProblem] = {}
    strategies: dict[tuple[int, int], Strategies] = {}
    times: dict[str, dict[int, float | None]] = {}
    for name, batch in found.batches.items():
        times[name] = {n: None for n in (*shorter, longest)}
        if batch < 1:
            continue
        long_sim, left = found.simulator(batch), found.left_bytes(batch)
        if name in POLICY_ACTIONS:
            outcome = run_budget(long_sim, name, left, found.problem(batch))
        else:
            outcome = found.strategies(batch).run(name, left)
        if outcome.result is None:  # the planner's tolerance at the edge of the least budget
            continue
        times[name][longest] = outcome.result.iteration_s
        for length in shorter:
            key = (batch, length)
            if key not in simulators:
                sim = Simulator(trace_at(batch, length), long_sim.hardware, long_sim.config)
                check_same_structure(long_sim.trace, sim.trace, f"at {length} tokens")
                simulators[key], strategies[key] = sim, Strategies(sim, found.time_limit_s)
            if outcome.plan is not None and key not in problems:
                problems[key] = planning_problem(simulators[key])[0]
            times[name][length] = serve_plan(simulators[key], outcome, problems.get(key), strategies[key]).iteration_s
    return times
