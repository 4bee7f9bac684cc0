# Longer than the ~500-line guide on purpose: the machine's profile (microbenchmarks) and the
# validation that uses it must measure under the same conditions; keeping them together keeps them so.
"""Check the simulator against measured iterations: traces profiled here, on the CPU.

The CPU is the only device every machine has, so validation runs there. :func:`cpu_profile` builds
the hardware profile of this machine from microbenchmarks that share nothing with the validated
models: the ``cpu`` codec's speed (:func:`cswap.profile.codec_speed.codec_speed`, the runtime's own fit,
used as the simulation's time model with the per-call cost added), and the runtime's own costs
(:func:`measure_runtime_overheads`, on chains of linear and tanh layers): per iteration, per hook
call, per moved tensor, per codec call, the profiler's unrecorded cost per hook, and the bytes per
second of its swap copies (on a CPU a swap-in rebuilds the tensor in freshly allocated memory, so
this is below a warm ``memcpy``; without it :func:`cswap.device.bandwidth` is used). On a CPU,
copies and (de)compression run on the thread that computes, so the profile says
``async_copies: false``: nothing overlaps and the queue model adds every copy, codec call and hook
to the compute (the per-tensor formula then gives the same figures).

:func:`validate` then, per model and round: profiles one iteration with policy ``none``, times
one iteration of every runtime policy, and simulates each policy's own plan (``rt.plan()``) on
that round's trace. The error is the median over rounds of ``simulated / measured - 1``.
:func:`median_trace` folds several profiles of one model into one trace, for offline use.

Example:
    >>> rows = validate(models=("vgg11",), policies=("none", "swap"), batch_size=2, resolution=32,
    ...                 width_mult=0.125, iterations=1, overheads=RuntimeOverheads(0.0, 0.0, 0.0, 0.0))
    >>> sorted({row.policy for row in rows})
    ['none', 'swap']
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from cswap.planner.actions import POLICY_TABLE
from cswap.profile.trace import Trace
from cswap.simulate.engine import DEFAULT_MIN_BYTES, SimConfig, Simulator
from cswap.simulate.hardware import CodecRate, CodecSpec, DeviceSpec, HardwareProfile, LinkSpec
from cswap.simulate.policies import POLICIES, Action

__all__ = [
    "RUNTIME_POLICIES",
    "RuntimeOverheads",
    "ValidationRow",
    "cpu_profile",
    "cpu_time_model",
    "measure_runtime_overheads",
    "median_trace",
    "runtime_actions",
    "thread_limit",
    "validate",
]

#: The policies both the runtime and the simulator run (the recomputing ones run only in the runtime).
RUNTIME_POLICIES: tuple[str, ...] = tuple(p for p in POLICIES if POLICY_TABLE[p].in_runtime)


def _matmul_tflops(size: int = 1024, repeats: int = 3) -> float:
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * size**3 / min(times) / 1e12


def _other_codec_rates(speed: Any, call_s: float) -> dict[str, CodecRate]:
    """The codecs besides ZVC as ``speed`` (a :class:`cswap.profile.codec_speed.CodecSpeed`) timed
    them, per element width (:attr:`CodecRate.by_itemsize`), ``call_s`` more per call; each
    codec's own rates are its widest width's."""
    widths: dict[str, dict[int, CodecRate]] = {}
    for name, itemsize, compress, decompress in speed.others:
        widths.setdefault(name, {})[itemsize] = CodecRate(
            compress_gbps=1e-9 / max(compress.s_per_byte, 1e-15),
            decompress_gbps=1e-9 / max(decompress.s_per_byte, 1e-15),
            compress_overhead_s=compress.fixed_s + call_s,
            decompress_overhead_s=decompress.fixed_s + call_s,
        )
    return {name: rates[max(rates)].model_copy(update={"by_itemsize": rates}) for name, rates in widths.items()}


def _codec_spec(op_fixed_s: float, s_per_byte: float, s_per_nonzero_byte: float) -> CodecSpec:
    # the profile's traffic form (nbytes + compressed) at density 0.5: about 1.5 nbytes
    seconds_per_byte = max(s_per_byte + 0.5 * s_per_nonzero_byte, 1e-15)
    gbps = 1.5 / seconds_per_byte / 1e9
    return CodecSpec(compress_gbps=gbps, decompress_gbps=gbps, compress_overhead_s=op_fixed_s, decompress_overhead_s=op_fixed_s)


@dataclass(frozen=True)
class RuntimeOverheads:
    """The runtime's own costs on this machine (see :func:`measure_runtime_overheads`).

    Attributes:
        iteration_s: per iteration with hooks installed.
        hook_s: per pack or unpack hook call.
        move_s: extra per hook call of a moved (swapped or compressed) tensor, beyond its bytes.
        codec_call_s: per compress or decompress call, beyond its bytes.
        profile_residual_s: per hook call of a profiling iteration, beyond the hook's recorded
            seconds (see :attr:`cswap.simulate.engine.SimConfig.hook_residual_s`).
        copy_gbps: bytes per second of the runtime's swap copies, each way (0: not measured). On
            a CPU a swap-in rebuilds the tensor in fresh memory, so this is below a warm ``memcpy``.
    """

    iteration_s: float
    hook_s: float
    move_s: float
    codec_call_s: float
    profile_residual_s: float = 0.0
    copy_gbps: float = 0.0


@dataclass(frozen=True)
class _ChainTiming:
    median_s: dict[str, float]
    hooks: float
    moved: float
    moved_bytes: float
    profiled_per_call_s: float
    profile_calls: int


def _time_chain(count: int, width: int, batch: int, rounds: int, linear: bool = True) -> _ChainTiming:
    """Interleaved timings of one chain under the calibration runtimes: ``Linear``+``ReLU`` layers,
    or (``linear=False``) ``Tanh`` layers, which save big outputs for little compute."""
    import cswap
    from cswap.simulate.timeline import Timeline

    torch.manual_seed(0)
    if linear:
        model = torch.nn.Sequential(*[m for _ in range(count) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())])
        x = torch.randn(batch, width)
    else:
        model = torch.nn.Sequential(*[torch.nn.Tanh() for _ in range(count)])
        x = torch.randn(batch, width, requires_grad=True)

    def step(rt: Any) -> float:
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        with rt.iteration():
            model(x).square().mean().backward()
        return time.perf_counter() - start

    def runtime(policy: str, min_bytes: int) -> Any:
        return cswap.Runtime(policy, device="cpu", min_bytes=min_bytes, d2h_gbps=1.0, h2d_gbps=1.0)

    profiler = runtime("none", 0)
    runtimes = {
        "profile": profiler,
        "none": runtime("none", 0),
        "keep": runtime("swap", 1 << 40),
        "swap": runtime("swap", 0),
        "compress-swap": runtime("compress-swap", 0),
    }
    for rt in runtimes.values():
        step(rt)
        step(rt)
    before = runtimes["swap"].stats()
    times: dict[str, list[float]] = {name: [] for name in runtimes}
    profiled: list[float] = []
    calls = 1
    for _ in range(rounds):
        for name, rt in runtimes.items():
            if rt is profiler:
                profiler.new_epoch()
            times[name].append(step(rt))
            if rt is profiler:
                trace = profiler.trace()
                calls = max(len(trace.tensors) + sum(r.unpack_at_s is not None for r in trace.tensors), 1)
                profiled.append(Timeline.from_trace(trace).compute_s / calls)
    after = runtimes["swap"].stats()
    return _ChainTiming(
        median_s={name: statistics.median(v) for name, v in times.items()},
        hooks=(after.packed_tensors - before.packed_tensors + after.unpacks - before.unpacks) / rounds,
        moved=(after.actions["swap"] - before.actions["swap"]) / rounds,
        moved_bytes=(after.transferred_bytes - before.transferred_bytes) / rounds,
        profiled_per_call_s=statistics.median(profiled),
        profile_calls=calls,
    )


def measure_runtime_overheads(rounds: int = 9, layers: Sequence[int] = (4, 16, 48)) -> RuntimeOverheads:
    """Calibrate the runtime's own costs on chains of ``Linear``+``ReLU`` layers (no CNN involved).

    On tiny chains (4 KiB activations) copies and codec bytes cost nothing, so differences between
    runtimes are the runtime's own work: ``swap`` keeping everything (``min_bytes`` above every
    tensor) minus ``none`` gives, by least squares over the chains' hook counts, the per-iteration
    and per-hook seconds; ``swap`` moving everything (``min_bytes=0``) minus keeping everything,
    per hook call, the cost of a move; ``compress-swap`` minus ``swap`` per codec call the
    per-call codec cost; a profiling runtime's trace, its hooks' recorded seconds taken out, minus
    the ``none`` time, per hook call, the profile residual. On a chain of ``Tanh`` layers (1 MiB
    outputs, little compute), ``swap`` minus keeping everything, less the per-move cost, per byte
    gives the copy bandwidth.
    Runtimes are interleaved round by round and medians taken.
    """
    import numpy as np

    tiny = [_time_chain(count, 64, 16, rounds) for count in layers]
    design = np.array([[1.0, chain.hooks] for chain in tiny])
    extra = np.array([chain.median_s["keep"] - chain.median_s["none"] for chain in tiny])
    (iteration_s, hook_s), *_ = np.linalg.lstsq(design, extra, rcond=None)
    moved = [chain for chain in tiny if chain.moved]
    move_s = max(statistics.median((c.median_s["swap"] - c.median_s["keep"]) / (2 * c.moved) for c in moved), 0.0)
    codec_call_s = statistics.median((c.median_s["compress-swap"] - c.median_s["swap"]) / (2 * c.moved) for c in moved)
    residual_s = statistics.median(c.profiled_per_call_s - c.median_s["none"] / c.profile_calls for c in tiny)
    wide = _time_chain(16, 1024, 256, rounds, linear=False)
    copy_s = wide.median_s["swap"] - wide.median_s["keep"] - 2 * wide.moved * move_s
    copy_gbps = 2 * wide.moved_bytes / copy_s / 1e9 if copy_s > 0 and wide.moved_bytes else 0.0
    return RuntimeOverheads(
        iteration_s=max(float(iteration_s), 0.0),
        hook_s=max(float(hook_s), 0.0),
        move_s=move_s,
        codec_call_s=max(codec_call_s, 0.0),
        profile_residual_s=max(residual_s, 0.0),
        copy_gbps=copy_gbps,
    )


class _WithCallCost:
    """A time model plus a fixed cost per call (the runtime's per-call codec work)."""

    def __init__(self, base: Any, call_s: float) -> None:
        self.base = base
        self.call_s = call_s

    def compress_s(self, nbytes: int, density: float, itemsize: int, backend: str) -> float:
        return self.base.compress_s(nbytes, density, itemsize, backend) + self.call_s

    def decompress_s(self, nbytes: int, density: float, itemsize: int, backend: str) -> float:
        return self.base.decompress_s(nbytes, density, itemsize, backend) + self.call_s


def cpu_profile(name: str = "cpu-here", measure: bool = False, overheads: RuntimeOverheads | None = None) -> HardwareProfile:
    """This machine's CPU as a hardware profile, from microbenchmarks (see the module docstring).

    Args:
        name: the profile's name.
        measure: measure bandwidth and codec speed now instead of reading the runtime's per-machine
            caches (:func:`cswap.device.bandwidth`, :func:`cswap.profile.codec_speed.codec_speed`).
        overheads: the runtime's overheads (default: none, i.e. zero; :func:`validate` measures them).

    The codec entries summarise the fitted codec speed at density 0.5; pass
    :func:`cpu_time_model` as the simulation's ``time_model`` for the exact fit.
    """
    from cswap.device import bandwidth, fingerprint, measure_bandwidth

    overheads = overheads or RuntimeOverheads(0.0, 0.0, 0.0, 0.0)
    fp = fingerprint("cpu")
    bw = measure_bandwidth("cpu") if measure else bandwidth("cpu")
    d2h_gbps, h2d_gbps = (overheads.copy_gbps, overheads.copy_gbps) if overheads.copy_gbps else (bw.d2h_gbps, bw.h2d_gbps)
    speed = cpu_time_model(measure)
    compress = _codec_spec(speed.compress.fixed_s + overheads.codec_call_s, speed.compress.s_per_byte, speed.compress.s_per_nonzero_byte)
    decompress = _codec_spec(
        speed.decompress.fixed_s + overheads.codec_call_s, speed.decompress.s_per_byte, speed.decompress.s_per_nonzero_byte
    )
    codec = CodecSpec(
        compress_gbps=compress.compress_gbps,
        decompress_gbps=decompress.decompress_gbps,
        compress_overhead_s=compress.compress_overhead_s,
        decompress_overhead_s=decompress.decompress_overhead_s,
    )
    others = _other_codec_rates(speed, overheads.codec_call_s)
    return HardwareProfile(
        name=name,
        description=f"{fp.name}, {fp.sm_count} cores, measured here",
        device=DeviceSpec(
            name=fp.name,
            kind="cpu",
            memory_gb=max(fp.memory_bytes / 1e9, 1e-3),
            memory_gbps=bw.d2h_gbps,
            memory_efficiency=1.0,
            peak_tflops={"float32": _matmul_tflops()},
            compute_efficiency=1.0,
            hook_overhead_s=overheads.hook_s,
            move_overhead_s=overheads.move_s,
            iteration_overhead_s=overheads.iteration_s,
        ),
        link=LinkSpec(name="memcpy into the host arena", h2d_gbps=h2d_gbps, d2h_gbps=d2h_gbps, async_copies=False),
        device_codec=codec,
        host_codec=codec,
        device_codecs=others,
        host_codecs=others,
        sources=(
            "link: the runtime's own swap copies on 1 MiB activations (measure_runtime_overheads), else "
            "cswap.device bandwidth on 'cpu' (median of 64 MiB copies)",
            "cswap.profile.codec_speed on ('cpu', 'cpu'): the runtime's fitted cpu codec speed, ZVC's and each other "
            "codec's per element width",
            "peak_tflops: a 1024x1024 float32 matmul timed here (efficiency 1: compute times come from the trace)",
            "hook, iteration and codec-call overheads: measure_runtime_overheads() on tiny linear chains",
        ),
    )


def cpu_time_model(measure: bool = False, call_s: float = 0.0) -> Any:
    """The runtime's fitted ``cpu`` codec speed (a :class:`cswap.planner.costmodel.TimeModel`), cached or
    measured now, plus ``call_s`` per call."""
    from cswap.profile.codec_speed import codec_speed, measure_codec_speed

    speed = measure_codec_speed("cpu", "cpu") if measure else codec_speed("cpu", "cpu")
    return _WithCallCost(speed, call_s) if call_s else speed


def median_trace(traces: Sequence[Trace]) -> Trace:
    """One trace whose times are the per-record medians of ``traces`` (same structure, e.g. profiles of one model).

    Raises:
        ValueError: no traces, or traces whose records differ in key, shape or dtype.
    """
    if not traces:
        raise ValueError("median_trace needs at least one trace")
    first = traces[0]
    for other in traces[1:]:
        if [(r.key, r.shape, r.dtype) for r in other.tensors] != [(r.key, r.shape, r.dtype) for r in first.tensors]:
            raise ValueError("traces differ in their saved tensors: profile the same model, input and policy")

    def median(values: Sequence[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if len(known) == len(values) else None

    tensors = []
    for i, record in enumerate(first.tensors):
        column = [t.tensors[i] for t in traces]
        tensors.append(
            replace(
                record,
                sparsity=statistics.median(r.sparsity for r in column),
                pack_s=statistics.median(r.pack_s for r in column),
                unpack_s=statistics.median(r.unpack_s for r in column),
                pack_at_s=statistics.median(r.pack_at_s for r in column),
                unpack_at_s=median([r.unpack_at_s for r in column]),
                hidden_forward_s=statistics.median(r.hidden_forward_s for r in column),
                hidden_backward_s=statistics.median(r.hidden_backward_s for r in column),
            )
        )
    return replace(
        first,
        tensors=tuple(tensors),
        forward_s=statistics.median(t.forward_s for t in traces),
        backward_s=statistics.median(t.backward_s for t in traces),
        meta={**first.meta, "median_of": len(traces)},
    )


@dataclass(frozen=True)
class ValidationRow:
    """One model and policy: measured against simulated iteration seconds.

    Attributes:
        measured_s, simulated_s, formula_s: medians over the rounds.
        error: median over rounds of ``simulated / measured - 1`` (queue model).
        formula_error: the same for the per-tensor formula.
        error_fastest: fastest simulated round over fastest measured round, minus 1: the rounds
            other processes on a shared machine disturbed least.
        plan_matches: whether the simulator's own plan for the policy equals the runtime's.
    """

    model: str
    policy: str
    measured_s: float
    simulated_s: float
    formula_s: float
    error: float
    formula_error: float
    error_fastest: float
    plan_matches: bool
    iterations: int
    batch_size: int
    resolution: int
    width_mult: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def runtime_actions(trace: Trace, plan: Any) -> tuple[Action, ...]:
    """The action a runtime ``plan`` carries out on each record of ``trace``, for
    :meth:`cswap.simulate.Simulator.run_plan`: the simulator then replays what the runtime did.

    A duplicate is stored with its first pack, so it is ``keep`` here (its first record carries the
    storage, needed from the earliest of their unpacks); so is a record the plan does not know.

    Args:
        trace: the runtime's profile (``rt.trace()``), whose keys the plan's decisions use.
        plan: the runtime's plan (``rt.plan()``).
    """
    decisions = plan.decisions
    duplicates = {int(k) for k in (trace.meta.get("duplicates") or {})}
    return tuple(
        Action(decisions[r.key].action.value) if r.key in decisions and r.key not in duplicates and r.offloadable else Action.KEEP
        for r in trace.tensors
    )


def validate(
    models: Sequence[str] = ("alexnet", "vgg11", "resnet18"),
    policies: Sequence[str] = RUNTIME_POLICIES,
    batch_size: int = 32,
    resolution: int = 64,
    width_mult: float = 0.25,
    iterations: int = 5,
    min_bytes: int = DEFAULT_MIN_BYTES,
    threads: int | None = 1,
    profile: HardwareProfile | None = None,
    overheads: RuntimeOverheads | None = None,
) -> list[ValidationRow]:
    """Measure and simulate every ``policy`` on every model here, on the CPU.

    Each of ``iterations`` rounds profiles one iteration with policy ``none`` and then times one
    iteration of every policy, so each simulated figure is paired with measurements taken moments
    later: ``error`` is the median over rounds of ``simulated / measured - 1`` (the simulation of a
    round uses that round's trace), which cancels the slow drift of a shared machine's load.

    Args:
        models: names from ``cswap.models.MODEL_NAMES``.
        policies: runtime policies (:data:`RUNTIME_POLICIES`).
        batch_size, resolution, width_mult: the workload (digits images, upsampled).
        iterations: rounds.
        min_bytes: the runtime's and the simulator's ``min_bytes``.
        threads: torch and Numba threads while measuring (``None``: leave them); one thread keeps a
            shared machine's timings steadier.
        profile: the hardware profile (default: :func:`cpu_profile` measured now, under ``threads``).
        overheads: the runtime's overheads (default: :func:`measure_runtime_overheads` now).
    """
    import cswap
    from cswap import models as zoo
    from cswap.training.data import digits

    unknown = [p for p in policies if p not in RUNTIME_POLICIES]
    if unknown:
        raise ValueError(f"policies {unknown} are not runtime policies: choose from {', '.join(RUNTIME_POLICIES)}")
    with thread_limit(threads):
        overheads = overheads or measure_runtime_overheads()
        profile = profile or cpu_profile(measure=True, overheads=overheads)
        time_model = cpu_time_model(measure=True, call_s=overheads.codec_call_s)
        images, labels = digits(image_size=resolution, channels=3).train.tensors
        x, y = images[:batch_size].contiguous(), labels[:batch_size].contiguous()
        rows: list[ValidationRow] = []
        for name in models:
            rows.extend(_validate_model(
                cswap, zoo, name, policies, x, y, width_mult, iterations, min_bytes, profile, time_model, resolution,
                overheads.profile_residual_s,
            ))
        return rows


@contextmanager
def thread_limit(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` torch and Numba threads (``None``: unchanged), restoring them after."""
    import numba

    saved = (torch.get_num_threads(), numba.get_num_threads())
    if threads is not None:
        torch.set_num_threads(threads)
        numba.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        numba.set_num_threads(saved[1])


def _validate_model(
    cswap: Any,
    zoo: Any,
    name: str,
    policies: Sequence[str],
    x: torch.Tensor,
    y: torch.Tensor,
    width_mult: float,
    iterations: int,
    min_bytes: int,
    profile: HardwareProfile,
    time_model: Any,
    resolution: int,
    hook_residual_s: float,
) -> list[ValidationRow]:
    torch.manual_seed(0)
    model = zoo.build(name, num_classes=10, width_mult=width_mult).train()

    def step(rt: Any) -> float:
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        with rt.iteration():
            F.cross_entropy(model(x), y).backward()
        return time.perf_counter() - start

    link = profile.link
    options = dict(
        device="cpu", min_bytes=min_bytes, model=model, time_model=getattr(time_model, "base", time_model),
        d2h_gbps=link.d2h_gbps, h2d_gbps=link.h2d_gbps,
    )
    # no model= for the profiler: its per-module forward hooks (producer names) would slow the
    # profiled compute in a way the hook timings do not show
    profiler = cswap.Runtime("none", **{k: v for k, v in options.items() if k != "model"})
    runtimes = {p: cswap.Runtime(p, **options) for p in policies}
    for rt in (profiler, *runtimes.values()):
        step(rt)  # its profiling iteration (and first-touch allocations, codec JIT)
        step(rt)  # warm-up under its plan
    config = SimConfig(min_bytes=min_bytes, hook_residual_s=hook_residual_s)
    measured: dict[str, list[float]] = {p: [] for p in policies}
    simulated: dict[str, list[tuple[float, float]]] = {p: [] for p in policies}
    matches: dict[str, bool] = {p: True for p in policies}
    for _ in range(iterations):
        profiler.new_epoch()
        step(profiler)
        trace = profiler.trace()
        for policy, rt in runtimes.items():
            measured[policy].append(step(rt))
        simulator = Simulator(trace, profile, config, time_model=time_model)
        for policy, rt in runtimes.items():
            actions = runtime_actions(trace, rt.plan())
            result = simulator.run_plan(actions, policy=policy, plan="runtime")
            simulated[policy].append((result.iteration_s, result.formula.iteration_s))
            matches[policy] = matches[policy] and simulator.plan(policy) == actions
    rows = []
    for policy in policies:
        pairs = list(zip(measured[policy], simulated[policy]))
        rows.append(
            ValidationRow(
                model=name,
                policy=policy,
                measured_s=statistics.median(measured[policy]),
                simulated_s=statistics.median(s for s, _ in simulated[policy]),
                formula_s=statistics.median(f for _, f in simulated[policy]),
                error=statistics.median(s / m - 1.0 for m, (s, _) in pairs),
                formula_error=statistics.median(f / m - 1.0 for m, (_, f) in pairs),
                error_fastest=min(s for s, _ in simulated[policy]) / min(measured[policy]) - 1.0,
                plan_matches=matches[policy],
                iterations=iterations,
                batch_size=int(x.shape[0]),
                resolution=resolution,
                width_mult=width_mult,
            )
        )
    return rows
