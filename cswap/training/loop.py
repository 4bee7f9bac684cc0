"""The training loop behind ``cswap train`` (and ``torchrun -m cswap.train``, :mod:`cswap.train`).

One run: device fingerprint -> kernel launch configs (from the store, the service, or tuned now)
-> :class:`cswap.Runtime` -> epochs of SGD with momentum under a cosine schedule, each forward and
backward inside ``rt.iteration()`` -> a JSON report and plots.

Under ``torchrun`` (``WORLD_SIZE`` > 1) each rank trains a :class:`DistributedDataParallel` replica
with its own Runtime on an equal slice of every global batch (gloo on CPU, nccl on GPU); rank 0
tunes and publishes the kernel configs while the others wait at a barrier, then read them from the
store or the service.

With :mod:`cswap.training.kernelconfigs` it wires the runtime, the tuner and the tuning service's
client together; the command line (:mod:`cswap.commands.train`) sits above it.

Example:
    >>> import contextlib, io
    >>> from cswap.training.config import TrainConfig
    >>> with contextlib.redirect_stdout(io.StringIO()):  # the summary table
    ...     report = train(TrainConfig(model="vgg11", width_mult=0.125, epochs=1, train_samples=64), show_progress=False)
    >>> report["model"], report["policy"], len(report["epochs"])
    ('vgg11', 'cswap', 1)
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass
from typing import Any
from collections.abc import Iterator

import torch
import torch.distributed as dist
from rich.console import Console
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from cswap import models
from cswap.device import fingerprint, resolve_device
from cswap.planner.actions import RUNTIME_POLICIES as POLICIES
from cswap.runtime import Runtime
from cswap.training import data as datasets
from cswap.training.config import TrainConfig
from cswap.training.kernelconfigs import KernelConfigs, prepare_kernel_configs
from cswap.training.memtimeline import MemorySample, measure_memory_timeline
from cswap.training.progress import EpochProgress

__all__ = ["DistContext", "GlobalBatchSampler", "OutOfMemoryAdvice", "train"]

_AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class OutOfMemoryAdvice(RuntimeError):
    """The device ran out of memory; the message suggests a policy that frees activation memory."""


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in a ``torchrun`` job (rank 0 of 1 without one)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that tunes, publishes, prints and writes the report."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """More than one process."""
        return self.world_size > 1

    @classmethod
    def from_env(cls) -> DistContext:
        """Read ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` as set by torchrun."""
        return cls(
            rank=int(os.environ.get("RANK", 0)),
            world_size=int(os.environ.get("WORLD_SIZE", 1)),
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        )

    def barrier(self) -> None:
        """Wait for every rank (no-op in a single process)."""
        if self.distributed:
            dist.barrier()


class GlobalBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Global batches of a seeded per-epoch permutation; each rank takes its contiguous slice.

    With ``world_size`` ranks each global batch of ``batch_size`` is split into equal slices, so
    the gradient DDP averages equals the gradient of one process on the whole global batch. The
    last incomplete global batch is dropped so every rank sees the same number of batches.

    Args:
        num_samples: dataset length.
        batch_size: the global batch (a multiple of ``world_size``).
        rank, world_size: this rank's slice.
        seed: the permutation of epoch ``e`` is seeded with ``seed + e``.
    """

    def __init__(self, num_samples: int, batch_size: int, rank: int = 0, world_size: int = 1, seed: int = 0) -> None:
        if batch_size % world_size:
            raise ValueError(f"--batch-size {batch_size} must be a multiple of the {world_size} ranks")
        if num_samples < batch_size:
            raise ValueError(f"the training set has {num_samples} samples, fewer than one batch of {batch_size}")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s permutation next."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.num_samples, generator=generator).tolist()
        per_rank = self.batch_size // self.world_size
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            first = start + self.rank * per_rank
            yield order[first : first + per_rank]


def _device_for(cfg: TrainConfig, ctx: DistContext) -> torch.device:
    device = resolve_device(cfg.device)
    if device.type == "cuda" and ctx.distributed:
        device = torch.device("cuda", ctx.local_rank)
        torch.cuda.set_device(device)
    return device


def _init_distributed(ctx: DistContext, device: torch.device) -> None:
    if ctx.distributed and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")


def _dataset(cfg: TrainConfig) -> datasets.DatasetSplit:
    split = datasets.build_dataset(cfg.dataset, image_size=cfg.image_size, seed=cfg.seed)
    if cfg.train_samples is not None and cfg.train_samples < len(split.train):
        split = datasets.DatasetSplit(
            train=Subset(split.train, range(cfg.train_samples)),
            test=split.test,
            num_classes=split.num_classes,
            image_size=split.image_size,
            channels=split.channels,
        )
    return split


def _evaluate(model: nn.Module, test: Dataset, device: torch.device, batch_size: int) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in DataLoader(test, batch_size=max(batch_size, 64)):
            logits = model(images.to(device))
            correct += int((logits.argmax(dim=1).cpu() == labels).sum())
            total += labels.numel()
    model.train()
    return correct / total if total else 0.0


def _ratio(input_bytes: int, compressed_bytes: int) -> float:
    """Bytes in over bytes out of compression (1.0 when nothing was compressed)."""
    return input_bytes / compressed_bytes if compressed_bytes else 1.0


def _peak_memory_bytes(device: torch.device, runtime: Runtime) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return runtime.stats().peak_resident_bytes


def _epoch_record(epoch: int, losses: list[float], accuracy: float, samples: int, seconds: float,
                  runtime: Runtime, device: torch.device) -> dict[str, Any]:
    stats = runtime.stats()
    current = stats.history[-1] if stats.history else None
    plan = runtime.plan()
    compressed = [d for d in plan.decisions.values() if d.action.compresses]
    trace = runtime.trace() if stats.profiled_iterations else None
    measured_pack_s = None
    if trace is not None and compressed:
        keys = {d.key for d in compressed}
        measured_pack_s = sum(t.pack_s for t in trace.tensors if t.key in keys)
    return {
        "epoch": epoch,
        "loss": sum(losses) / len(losses) if losses else math.nan,
        "first_loss": losses[0] if losses else math.nan,
        "last_loss": losses[-1] if losses else math.nan,
        "accuracy": accuracy,
        "samples_per_s": samples / seconds if seconds else 0.0,
        "seconds": seconds,
        "peak_memory_bytes": _peak_memory_bytes(device, runtime),
        "peak_resident_bytes": current.peak_resident_bytes if current else stats.peak_resident_bytes,
        "kept_bytes": stats.kept_bytes,
        "offloaded_bytes": current.offloaded_bytes if current else 0,
        "compressed_input_bytes": current.compressed_input_bytes if current else 0,
        "compressed_bytes": current.compressed_bytes if current else 0,
        "decisions": plan.counts(),
        "predicted_compress_s": sum(d.compress_s or 0.0 for d in compressed),
        "measured_compress_s": measured_pack_s,
        "plan": plan.to_dict()["decisions"],
        "sparsity": {str(t.key): t.sparsity for t in trace.tensors} if trace is not None else {},
    }


def _memory_timeline(model: nn.Module, split: datasets.DatasetSplit, cfg: TrainConfig, device: torch.device,
                     kernels: KernelConfigs) -> dict[str, list[MemorySample]]:
    """Memory over one iteration under every policy, on a batch of at most 16 images.

    Each policy runs on a copy of a freshly built model holding the trained weights: the trained
    model may carry its runtime's recompute regions, which a copy cannot take a second time.
    """
    fresh = models.build(cfg.model, num_classes=split.num_classes, width_mult=cfg.width_mult).to(device)
    fresh.load_state_dict(model.state_dict())
    images, labels = next(iter(DataLoader(split.train, batch_size=min(cfg.batch_size, 16))))
    options: dict[str, Any] = {"launch_lookup": kernels.launch_lookup}
    if cfg.min_bytes is not None:
        options["min_bytes"] = cfg.min_bytes
    return measure_memory_timeline(fresh, images.to(device), labels.to(device), POLICIES, device, **options)


@contextlib.contextmanager
def _oom_advice(policy: str) -> Iterator[None]:
    try:
        yield
    except torch.OutOfMemoryError as error:
        hint = (
            "retry with --policy cswap (or swap / compress-keep) to move saved activations off the GPU"
            if policy == "none"
            else "lower --batch-size, or try --policy swap, which keeps the least on the GPU"
        )
        raise OutOfMemoryAdvice(f"out of GPU memory while training with --policy {policy}: {hint}") from error


def _service_notice(cfg: TrainConfig) -> str:
    """What ``--tuner-url`` does in this run, said once at the start.

    Example:
        >>> _service_notice(TrainConfig(tuner_url="http://127.0.0.1:8765"))
        'tuning service http://127.0.0.1:8765 (--tune cached): kernel configs are looked up there, then in the local store; nothing is measured'
    """
    if cfg.tune == "cached":
        does = "kernel configs are looked up there, then in the local store; nothing is measured"
    else:
        does = f"kernel configs are looked up there, tuned here with {cfg.tune} on a miss, and published there"
    return f"tuning service {cfg.tuner_url} (--tune {cfg.tune}): {does}"


def train(cfg: TrainConfig, console: Console | None = None, show_progress: bool = True) -> dict[str, Any]:
    """Run one training job and return its report (also written to ``cfg.report_path`` by rank 0).

    Args:
        cfg: the run's configuration.
        console: where progress and the summary go (default: stderr-free rich console on stdout).
        show_progress: draw rich progress bars.

    Returns:
        The report: ``model, policy, device, tune, epochs: [...]`` and more (see ``cswap.training.report``).
    """
    from cswap.training.report import summarize, write_report

    console = console or Console()
    ctx = DistContext.from_env()
    device = _device_for(cfg, ctx)
    _init_distributed(ctx, device)
    torch.manual_seed(cfg.seed)
    split = _dataset(cfg)
    model = models.build(cfg.model, num_classes=split.num_classes, width_mult=cfg.width_mult).to(device)
    fp = fingerprint(device)
    sampler = GlobalBatchSampler(len(split.train), cfg.batch_size, ctx.rank, ctx.world_size, cfg.seed)
    loader = DataLoader(split.train, batch_sampler=sampler)
    probe_images = next(iter(loader))[0].to(device)
    if cfg.tuner_url is not None and ctx.is_main:
        console.print(_service_notice(cfg), markup=False, highlight=False, soft_wrap=True)
    # Tuning draws its sample tensors from torch's generator: forked, so that a run with --tune
    # trains on the same dropout masks and losses as one without it (and as plain PyTorch).
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        kernels: KernelConfigs = prepare_kernel_configs(
            cfg, fp, device, model, probe_images, ctx.is_main, ctx.barrier, console, show_progress=show_progress
        )
    runtime_options: dict[str, Any] = {"model": model, "device": str(device), "launch_lookup": kernels.launch_lookup}
    if kernels.time_model is not None:
        runtime_options["time_model"] = kernels.time_model
    if cfg.min_bytes is not None:
        runtime_options["min_bytes"] = cfg.min_bytes
    runtime_options["memory_budget"] = cfg.memory_budget
    runtime_options["host_memory_budget"] = cfg.host_memory_budget
    runtime = Runtime(policy=cfg.policy, **runtime_options)
    trained: nn.Module = model
    if ctx.distributed:
        trained = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg.epochs * len(sampler))
    loss_fn = nn.CrossEntropyLoss()
    amp_dtype = _AMP_DTYPES.get(cfg.amp)
    progress = EpochProgress(console, enabled=show_progress and ctx.is_main, epochs=cfg.epochs, steps=len(sampler))
    epochs: list[dict[str, Any]] = []
    profiled = 0  # profiling iterations so far, to tell which iteration profiled
    told_budget = False
    with progress, _oom_advice(cfg.policy):
        for epoch in range(cfg.epochs):
            sampler.set_epoch(epoch)
            runtime.new_epoch()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            losses: list[float] = []
            iteration_peaks: list[int] = []
            iteration_profiled: list[bool] = []
            samples = 0
            start = time.perf_counter()
            for step, (images, labels) in enumerate(loader):
                images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
                with runtime.iteration():
                    with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                        loss = loss_fn(trained(images), labels)
                    loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
                losses.append(float(loss.detach()))
                samples += labels.numel() * ctx.world_size
                stats = runtime.stats()
                iteration_peaks.append(stats.iteration_peak_resident_bytes)
                iteration_profiled.append(stats.profiled_iterations > profiled)
                profiled = stats.profiled_iterations
                if not told_budget and runtime.resolved_budget is not None:
                    # once, at the first profile: what "1 GB" or "0.3" came to on this model
                    told_budget = True
                    if ctx.is_main:
                        console.print(str(runtime.resolved_budget), markup=False, highlight=False, soft_wrap=True)
                current = stats.history[-1] if stats.history else None
                # The same figures as the summary table: mean loss so far, this epoch's offloaded bytes and ratio.
                progress.update(epoch, step, loss=sum(losses) / len(losses),
                                samples_per_s=samples / (time.perf_counter() - start),
                                memory_bytes=_peak_memory_bytes(device, runtime),
                                offloaded_bytes=current.offloaded_bytes if current else 0,
                                ratio=_ratio(current.compressed_input_bytes, current.compressed_bytes) if current else 1.0)
            seconds = time.perf_counter() - start
            accuracy = _evaluate(model, split.test, device, cfg.batch_size)
            epochs.append({**_epoch_record(epoch, losses, accuracy, samples, seconds, runtime, device),
                           "iteration_peak_resident_bytes": iteration_peaks, "iteration_profiled": iteration_profiled})
    report = {
        "model": cfg.model,
        "dataset": cfg.dataset,
        "policy": cfg.policy,
        "device": fp.to_dict(),
        "tune": kernels.summary(),
        "world_size": ctx.world_size,
        "config": cfg.model_dump(mode="json"),
        "epochs": epochs,
        "stats": runtime.stats().to_dict(),
        "budget_bytes": runtime.stats().budget_bytes,
        "none_peak_bytes": runtime.resolved_budget.none_peak_bytes if runtime.resolved_budget is not None else None,
    }
    if ctx.is_main and cfg.save_model is not None:
        cfg.save_model.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), cfg.save_model)
    if ctx.is_main:
        report["memory_timeline"] = _memory_timeline(model, split, cfg, device, kernels)
        write_report(report, cfg, console)
        summarize(report, console)
    if ctx.distributed:
        ctx.barrier()
        dist.destroy_process_group()
    return report

