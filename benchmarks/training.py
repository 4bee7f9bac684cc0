"""Training iterations per model and policy, against plain PyTorch and ``save_on_cpu`` in the same run.

Per model and policy: seconds per iteration (mean over an epoch of ``--iterations`` including its
profiling iteration, which is what a user pays, and the steady-state median without it), and peak
activation memory: ``torch.cuda.max_memory_allocated`` above the pre-forward level on a GPU, the
runtime's ``stats().peak_resident_bytes`` on the CPU. Plain PyTorch has no runtime to count its
activations on the CPU; policy ``none`` keeps exactly what plain PyTorch keeps, so its count stands
for plain there. The configurations run interleaved in rounds so machine load drifts evenly.

Usage:
    python benchmarks/training.py [--json] [--quick] [--models vgg16,resnet18] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import statistics
import time
from typing import Any, Callable, Iterator

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

import cswap
from cswap import models
from cswap.device import fingerprint, resolve_device
from cswap.options import POLICIES

BASELINES = ("plain", "save_on_cpu")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _epoch(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, iterations: int, device: torch.device,
           context: Callable[[], contextlib.AbstractContextManager[Any]], runtime: cswap.Runtime | None) -> tuple[list[float], int]:
    """Run one epoch; per-iteration seconds and peak activation bytes."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    if runtime is not None:
        runtime.new_epoch()
    times = []
    peak = 0
    for _ in range(iterations):
        _synchronize(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        start = time.perf_counter()
        with context():
            loss_fn(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _synchronize(device)
        times.append(time.perf_counter() - start)
        if device.type == "cuda":
            peak = max(peak, torch.cuda.max_memory_allocated(device) - base)
    if device.type != "cuda" and runtime is not None:
        peak = runtime.stats().peak_resident_bytes
    return times, peak


def _contexts(name: str, model: nn.Module, device: torch.device) -> tuple[Callable[[], Any], cswap.Runtime | None]:
    if name == "plain":
        return contextlib.nullcontext, None
    if name == "save_on_cpu":
        return lambda: torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda"), None
    runtime = cswap.Runtime(name, model=model, device=str(device))
    return runtime.iteration, runtime


def measure(model_name: str, batch_size: int, resolution: int, width_mult: float, iterations: int, rounds: int,
            device: torch.device) -> Iterator[dict[str, Any]]:
    """One JSON record per configuration of ``model_name``."""
    torch.manual_seed(0)
    model = models.build(model_name, num_classes=10, width_mult=width_mult).to(device).train()
    images = torch.randn(batch_size, 3, resolution, resolution, device=device).relu()
    labels = torch.randint(0, 10, (batch_size,), device=device)
    names = (*BASELINES, *POLICIES)
    setups = {name: _contexts(name, model, device) for name in names}
    mean_s: dict[str, list[float]] = {n: [] for n in names}
    steady_s: dict[str, list[float]] = {n: [] for n in names}
    peak: dict[str, int] = {}
    _epoch(model, images, labels, 1, device, contextlib.nullcontext, None)  # warm-up: allocator, kernels
    for round_index in range(rounds):
        order = names if round_index % 2 == 0 else tuple(reversed(names))
        for name in order:
            context, runtime = setups[name]
            times, peak_bytes = _epoch(model, images, labels, iterations, device, context, runtime)
            mean_s[name].append(sum(times) / len(times))
            steady_s[name].append(statistics.median(times[1:]) if len(times) > 1 else times[0])
            peak[name] = max(peak.get(name, 0), peak_bytes)
    if device.type != "cuda":
        peak["plain"] = peak["none"]
    plain_s = statistics.median(mean_s["plain"])
    save_on_cpu_s = statistics.median(mean_s["save_on_cpu"])
    for name in names:
        iteration_s = statistics.median(mean_s[name])
        yield {
            "model": model_name, "policy": name, "batch_size": batch_size, "resolution": resolution,
            "width_mult": width_mult, "device": device.type, "iteration_s": iteration_s,
            "steady_iteration_s": statistics.median(steady_s[name]), "peak_bytes": peak.get(name, 0),
            "vs_plain_time": iteration_s / plain_s, "vs_plain_memory": peak.get(name, 0) / peak["plain"] if peak.get("plain") else None,
            "vs_save_on_cpu_time": iteration_s / save_on_cpu_s,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--quick", action="store_true", help="a small, fast configuration")
    parser.add_argument("--models", default=None, help="comma-separated model names")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--resolution", type=int, default=None)
    parser.add_argument("--width-mult", type=float, default=None)
    parser.add_argument("--iterations", type=int, default=None, help="iterations per epoch (the first profiles)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved repetitions of every configuration")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    device = resolve_device(args.device)
    on_gpu = device.type == "cuda"
    defaults = {
        "models": "vgg16,resnet50" if on_gpu else "vgg16,resnet18",
        "batch_size": 64 if on_gpu else 32,
        "resolution": 224 if on_gpu else 32,
        "width_mult": 0.25 if args.quick else 1.0,
        "iterations": 3 if args.quick else 5,
        "rounds": 1 if args.quick else 3,
    }
    chosen = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in defaults.items()}
    header = {
        "kind": "header", "benchmark": "training", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": fingerprint(device).name, "cores": os.cpu_count(), "load_average_1m": os.getloadavg()[0],
        "torch": torch.__version__, **chosen,
    }
    records = []
    if args.json:
        print(json.dumps(header), flush=True)
    for name in chosen["models"].split(","):
        for record in measure(name, chosen["batch_size"], chosen["resolution"], chosen["width_mult"],
                              chosen["iterations"], chosen["rounds"], device):
            records.append(record)
            if args.json:
                print(json.dumps(record), flush=True)
    if not args.json:
        table = Table(title=f"training on {header['machine']} ({header['date']})")
        for column in ("model", "policy", "iteration ms", "steady ms", "peak MiB", "vs plain time", "vs plain memory", "vs save_on_cpu"):
            table.add_column(column, justify="right")
        for r in records:
            memory = f"{r['vs_plain_memory']:.2f}x" if r["vs_plain_memory"] is not None else "-"
            table.add_row(r["model"], r["policy"], f"{r['iteration_s'] * 1e3:.1f}", f"{r['steady_iteration_s'] * 1e3:.1f}",
                          f"{r['peak_bytes'] / 2**20:.1f}", f"{r['vs_plain_time']:.2f}x", memory, f"{r['vs_save_on_cpu_time']:.2f}x")
        Console().print(table)


if __name__ == "__main__":
    main()
