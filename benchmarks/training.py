"""Training iterations per model and policy, against plain PyTorch and ``save_on_cpu`` measured in the same run.

For each model, every configuration trains the same model from the same initial weights on the
same batches:

* ``plain``: the loop with no runtime at all (``loss.backward()`` + an SGD step);
* ``save_on_cpu``: the loop inside ``torch.autograd.graph.save_on_cpu(pin_memory=<on CUDA>)``;
* each policy (``none``, ``swap``, ``compress-swap``, ``cswap``, ``compress-keep``): one
  ``cswap.Runtime(policy=p, model=model, device=...)`` for the whole run; each measured epoch is
  ``rt.new_epoch()`` then ``--iterations`` iterations of ``with rt.iteration(): loss.backward()``
  + the SGD step, so its first iteration is the profiling one.

Figures per configuration:

* ``iteration_s``: seconds per iteration, the mean over an epoch INCLUDING its profiling iteration
  (what a user pays for an epoch of that length); the median over rounds.
* ``steady_iteration_s``: the median iteration without the profiling one (the steady state).
* ``profile_iteration_s``: the profiling iteration alone, so the cost can be amortised over any
  epoch length E: ``(profile + (E - 1) * steady) / E``.
* ``peak_bytes``: peak activation memory over the measured epochs. On a GPU,
  ``torch.cuda.max_memory_allocated`` above the allocation just before the forward (peak
  statistics reset before every iteration; profiling iterations included, since they too must
  fit; ``steady_peak_bytes`` leaves them out, on the CPU too). On the CPU, the runtime's peak resident bytes
  (``stats().peak_resident_bytes``, read per measured epoch from ``stats().history``: the saved
  activations the runtime holds, counted exactly at every hook call, parameters and buffers not
  counted). Plain PyTorch has no runtime to count with, so on the CPU its figure is policy
  ``none``'s, which keeps every saved tensor exactly as plain PyTorch does (``none`` only hooks
  its profiling iteration, in keep-all mode); ``save_on_cpu`` has no figure on the CPU (its
  "host" copies live in the same memory).
* ``vs_plain_time`` / ``vs_save_on_cpu_time``: the median over rounds of this configuration's
  ``iteration_s`` divided by the baseline's in the same round; ``vs_plain_memory``: ``peak_bytes``
  over plain's.

Fairness on a shared machine: every configuration first runs an unmeasured warm-up epoch (two
iterations for a policy, one for a baseline) that pays the one-time costs: Numba compilation, the
runtime's bandwidth and codec-speed measurements, the allocator's first growth. The measured
epochs then run in ``--rounds`` rounds, the order of the configurations reversed every other
round, so load drifts spread over all of them. Every epoch restores the initial weights and the
RNG seed (the same dropout masks) and makes a fresh optimizer, so every configuration sees the
same activations (the same sparsity). The header gives the machine, its cores, the load average
at the start and the end, and the date.

Usage:
    python benchmarks/training.py                      # CPU: vgg16 + resnet18, 32x32, batch 32 (~4 min)
    python benchmarks/training.py --quick              # width 0.25, fewer iterations (~1 min)
    python benchmarks/training.py --json --models vgg16 --policies none,compress-keep
    python benchmarks/training.py --device cuda        # GPU: vgg16 (batch 64), resnet50 (batch 96), 224x224
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as dt
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

from cswap import models
import cswap
from cswap.budget import parse_budget
from cswap.device import fingerprint, resolve_device
from cswap.options import POLICIES
from cswap.training.data import digits

BASELINES: tuple[str, ...] = ("plain", "save_on_cpu")
#: torchtune's activation offloading (CUDA streams and pinned memory), measured when it imports.
OFFLOAD_ACTIVATIONS = "offload_activations"
#: Suffix of a policy run with ``Runtime(memory_budget=...)``: ``cswap+budget``.
BUDGET_SUFFIX = "+budget"
CPU_MODELS = "vgg16,resnet18"
GPU_MODELS = "vgg16,resnet50"
#: GPU batch per model at 224x224 (fits an 80 GB H100 under plain PyTorch with room to spare).
GPU_BATCH = {"vgg16": 64, "resnet50": 96}
WARMUP_ITERATIONS = 2


@dataclass
class Config:
    """One measured configuration of one model: a baseline or a policy."""

    name: str
    context: Callable[[], contextlib.AbstractContextManager[Any]]
    runtime: cswap.Runtime | None = None
    epoch_mean_s: list[float] = field(default_factory=list)
    profile_s: list[float] = field(default_factory=list)
    steady_s: list[float] = field(default_factory=list)
    peak_bytes: int = 0
    steady_peak_bytes: int = 0
    #: Set when the policy cannot meet its memory budget: the least budget it can (BudgetError).
    infeasible_minimum_bytes: int | None = None


def _config(name: str, model: nn.Module, device: torch.device, memory_budget_bytes: int | None = None) -> Config:
    if name == "plain":
        return Config(name, contextlib.nullcontext)
    if name == "save_on_cpu":
        pin = device.type == "cuda"
        return Config(name, lambda: torch.autograd.graph.save_on_cpu(pin_memory=pin))
    if name == OFFLOAD_ACTIVATIONS:
        from torchtune.training import OffloadActivations

        return Config(name, OffloadActivations)
    if name.endswith(BUDGET_SUFFIX):
        if memory_budget_bytes is None:
            raise ValueError(f"configuration {name!r} needs memory_budget_bytes")
        policy = name.removesuffix(BUDGET_SUFFIX)
        runtime = cswap.Runtime(policy=policy, model=model, device=str(device), memory_budget=memory_budget_bytes)
        return Config(name, runtime.iteration, runtime)
    runtime = cswap.Runtime(policy=name, model=model, device=str(device))
    return Config(name, runtime.iteration, runtime)


def _batches(data: str, count: int, batch_size: int, resolution: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` batches on ``device``: consecutive slices of the digits training set, or random images."""
    if data == "digits":
        images, labels = digits(image_size=resolution, channels=3).train.tensors
        need = count * batch_size
        reps = -(-need // len(labels))
        images, labels = images.repeat(reps, 1, 1, 1)[:need], labels.repeat(reps)[:need]
    else:
        generator = torch.Generator().manual_seed(0)
        images = torch.randn(count * batch_size, 3, resolution, resolution, generator=generator)
        labels = torch.randint(0, 10, (count * batch_size,), generator=generator)
    return [(images[i : i + batch_size].to(device), labels[i : i + batch_size].to(device))
            for i in range(0, count * batch_size, batch_size)]


def _run_epoch(model: nn.Module, initial: dict[str, torch.Tensor], batches: list[tuple[torch.Tensor, torch.Tensor]],
               iterations: int, device: torch.device, config: Config, record: bool) -> None:
    """One epoch of ``config`` from the initial weights; appends its figures to ``config`` when ``record``.

    A policy that cannot meet its memory budget stops at the profiling iteration that shows it; the
    configuration is then recorded as infeasible with the least budget it can meet.
    """
    if config.infeasible_minimum_bytes is not None:
        return
    with torch.no_grad():
        model.load_state_dict(initial)
    torch.manual_seed(1)  # the same dropout masks in every epoch of every configuration
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    if config.runtime is not None:
        config.runtime.new_epoch()
    cuda = device.type == "cuda"
    times: list[float] = []
    peaks: list[int] = []
    for i in range(iterations):
        images, labels = batches[i % len(batches)]
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start_event.record()
        start = time.perf_counter()
        try:
            with config.context():
                loss_fn(model(images), labels).backward()
        except cswap.BudgetError as error:
            config.infeasible_minimum_bytes = error.minimum_bytes
            optimizer.zero_grad(set_to_none=True)
            return
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            end_event.record()
            torch.cuda.synchronize(device)
            times.append(start_event.elapsed_time(end_event) / 1e3)
            peaks.append(torch.cuda.max_memory_allocated(device) - base)
        else:
            times.append(time.perf_counter() - start)
            if config.runtime is not None and i > 0:
                # the runtime's peak over this iteration alone (policy none hooks no steady iteration: its
                # counter keeps the profiling iteration's peak, which is what plain PyTorch holds)
                peaks.append(config.runtime.stats().iteration_peak_resident_bytes)
    if not record:
        return
    config.epoch_mean_s.append(sum(times) / len(times))
    config.profile_s.append(times[0])
    config.steady_s.extend(times[1:])
    if cuda:
        config.peak_bytes = max(config.peak_bytes, *peaks)
        config.steady_peak_bytes = max(config.steady_peak_bytes, *peaks[1:], 0)
    elif config.runtime is not None:
        # This epoch's peak resident bytes (its profiling iteration included, the warm-up epoch not).
        config.peak_bytes = max(config.peak_bytes, config.runtime.stats().history[-1].peak_resident_bytes)
        config.steady_peak_bytes = max(config.steady_peak_bytes, *peaks, 0)


def measure(model_name: str, policies: tuple[str, ...], batch_size: int, resolution: int, width_mult: float,
            iterations: int, rounds: int, data: str, device: torch.device, context: dict[str, Any],
            memory_budget_bytes: int | None = None) -> Iterator[dict[str, Any]]:
    """One record per configuration (baselines first, then ``policies``) of ``model_name``.

    ``policies`` may also name :data:`OFFLOAD_ACTIVATIONS` and ``<policy>+budget`` (run with
    ``memory_budget_bytes``).
    """
    torch.manual_seed(0)
    model = models.build(model_name, num_classes=10, width_mult=width_mult).to(device).train()
    initial = copy.deepcopy(model.state_dict())
    batches = _batches(data, max(iterations, WARMUP_ITERATIONS), batch_size, resolution, device)
    configs = [_config(name, model, device, memory_budget_bytes) for name in (*BASELINES, *policies)]
    for config in configs:
        warmup = WARMUP_ITERATIONS if config.runtime is not None else 1
        _run_epoch(model, initial, batches, warmup, device, config, record=False)
    for round_index in range(rounds):
        for config in configs if round_index % 2 == 0 else reversed(configs):
            _run_epoch(model, initial, batches, iterations, device, config, record=True)
    by_name = {c.name: c for c in configs}
    plain, save_on_cpu = by_name["plain"], by_name["save_on_cpu"]
    cpu = device.type != "cuda"
    if cpu:
        # No runtime counts plain PyTorch's activations; `none` keeps exactly what plain keeps.
        plain.peak_bytes = by_name["none"].peak_bytes if "none" in by_name else 0
    del model, initial, batches
    for config in configs:
        if config.infeasible_minimum_bytes is not None:
            yield {"model": model_name, "policy": config.name, "batch_size": batch_size, "resolution": resolution,
                   "width_mult": width_mult, "data": data, "device": device.type, "infeasible": True,
                   "minimum_bytes": config.infeasible_minimum_bytes, **context}
            continue
        peak: int | None = config.peak_bytes
        if cpu and config.name == "save_on_cpu":
            peak = None
        if cpu and config.name == "plain" and "none" not in by_name:
            peak = None
        ratios = lambda base: statistics.median(a / b for a, b in zip(config.epoch_mean_s, base.epoch_mean_s))  # noqa: E731
        yield {
            "model": model_name,
            "policy": config.name,
            "batch_size": batch_size,
            "resolution": resolution,
            "width_mult": width_mult,
            "data": data,
            "device": device.type,
            "iterations": iterations,
            "rounds": rounds,
            "iteration_s": statistics.median(config.epoch_mean_s),
            "steady_iteration_s": statistics.median(config.steady_s) if config.steady_s else None,
            "profile_iteration_s": statistics.median(config.profile_s),
            "peak_bytes": peak,
            "steady_peak_bytes": None if cpu and config.runtime is None else config.steady_peak_bytes,
            "vs_plain_time": ratios(plain),
            "vs_plain_memory": peak / plain.peak_bytes if peak is not None and plain.peak_bytes else None,
            "vs_save_on_cpu_time": ratios(save_on_cpu),
            **context,
        }


def _table(header: dict[str, Any], records: list[dict[str, Any]]) -> None:
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    console.print(
        f"training benchmark on {header['machine']} ({header['cores']} cores, {header['device']}), {header['date']}, "
        f"load average {header['load_average_start']} at start, {header['load_average_end']} at end; torch {header['torch']}; "
        f"{header['iterations']} iterations/epoch x {header['rounds']} rounds, data {header['data']}, "
        f"resolution {header['resolution']}, width_mult {header['width_mult']}"
    )
    table = Table()
    for column in ("model", "batch", "policy", "ms/iter (epoch)", "steady ms", "profile ms", "peak MiB",
                   "vs plain time", "vs plain memory", "vs save_on_cpu time"):
        table.add_column(column, justify="left" if column in ("model", "policy") else "right")
    fmt_ratio = lambda value: "-" if value is None else f"{value:.3f}x"  # noqa: E731
    for r in records:
        if r.get("infeasible"):
            table.add_row(r["model"], str(r["batch_size"]), r["policy"], f"infeasible: needs {r['minimum_bytes'] / 2**20:.1f} MiB")
            continue
        table.add_row(
            r["model"], str(r["batch_size"]), r["policy"], f"{r['iteration_s'] * 1e3:.1f}",
            "-" if r["steady_iteration_s"] is None else f"{r['steady_iteration_s'] * 1e3:.1f}",
            f"{r['profile_iteration_s'] * 1e3:.1f}",
            "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.1f}",
            fmt_ratio(r["vs_plain_time"]), fmt_ratio(r["vs_plain_memory"]), fmt_ratio(r["vs_save_on_cpu_time"]),
        )
    console.print(table)
    if header["device"] == "cpu":
        console.print("CPU peak = the runtime's peak resident activation bytes; plain's is policy none's "
                      "(none keeps exactly what plain keeps); save_on_cpu has no separate device memory on a CPU.")


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="JSON lines: a header, then one object per model and configuration")
    parser.add_argument("--quick", action="store_true", help="width_mult 0.25, fewer iterations and rounds (~1 min on a CPU)")
    parser.add_argument("--models", default=None, help=f"comma-separated (default: {CPU_MODELS} on CPU, {GPU_MODELS} on GPU)")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help="comma-separated runtime policies (the baselines plain and save_on_cpu always run)")
    parser.add_argument("--batch-size", type=int, default=None, help="default 32 on CPU; on GPU vgg16 64, resnet50 96, else 64")
    parser.add_argument("--resolution", type=int, default=None, help="image side (default 32 on CPU, 224 on GPU)")
    parser.add_argument("--width-mult", type=float, default=None, help="channel scale (default 1.0; 0.25 with --quick)")
    parser.add_argument("--iterations", type=int, default=None, help="iterations per epoch, the first profiles (default 5; 3 quick)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved measured epochs per configuration (default 3; 2 quick)")
    parser.add_argument("--data", choices=("digits", "random"), default="digits",
                        help="digits: sklearn's digits resized (cswap.training.data.digits); random: standard-normal images")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--memory-budget", default=None,
                        help="bytes or a size (27MiB): every policy also runs as <policy>+budget within it")
    args = parser.parse_args(argv)

    device = resolve_device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    on_gpu = device.type == "cuda"
    policies = tuple(p for p in args.policies.split(",") if p)
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        parser.error(f"unknown policy {unknown[0]!r}: choose from {', '.join(POLICIES)} (plain and save_on_cpu always run)")
    budget_bytes = None
    if args.memory_budget is not None:
        budget = parse_budget(args.memory_budget)
        if budget is None or budget.relative:
            parser.error("--memory-budget takes bytes or a size such as 27MiB (a fraction needs plain's peak, which differs per model)")
        budget_bytes = budget.resolve()
        policies = (*policies, *(f"{p}{BUDGET_SUFFIX}" for p in policies if p != "none"))
    model_names = (args.models or (GPU_MODELS if on_gpu else CPU_MODELS)).split(",")
    for name in model_names:
        if name not in models.MODEL_NAMES:
            parser.error(f"unknown model {name!r}: choose from {', '.join(models.MODEL_NAMES)}")
    settings = {
        "resolution": args.resolution or (224 if on_gpu else 32),
        "width_mult": args.width_mult or (0.25 if args.quick else 1.0),
        "iterations": args.iterations or (3 if args.quick else 5),
        "rounds": args.rounds or (2 if args.quick else 3),
        "data": args.data,
    }
    if settings["iterations"] < 2:
        parser.error("--iterations must be >= 2 (the first of each epoch is the profiling iteration)")
    machine = fingerprint(device).name
    date = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    header = {
        "kind": "header", "benchmark": "training", "date": date, "machine": machine, "cores": os.cpu_count(),
        "device": device.type, "load_average_start": _load(), "torch": torch.__version__, "models": model_names,
        "policies": list(policies), **settings,
    }
    if args.json:
        print(json.dumps(header), flush=True)
    context = {"machine": machine, "cores": os.cpu_count(), "date": date}
    records: list[dict[str, Any]] = []
    for name in model_names:
        batch = args.batch_size or (GPU_BATCH.get(name, 64) if on_gpu else 32)
        for record in measure(name, policies, batch, settings["resolution"], settings["width_mult"], settings["iterations"],
                              settings["rounds"], settings["data"], device, {**context, "load_average": _load()}, budget_bytes):
            records.append(record)
            if args.json:
                print(json.dumps(record), flush=True)
        if on_gpu:
            torch.cuda.empty_cache()
    header["load_average_end"] = _load()
    if args.json:
        print(json.dumps({"kind": "footer", "load_average_end": header["load_average_end"]}), flush=True)
    else:
        _table(header, records)


if __name__ == "__main__":
    main()
