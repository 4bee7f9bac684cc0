"""Kernel launch configs for a training run: from the local store, the tuning service, or tuned now.

``--tune`` decides: ``off`` uses the codec defaults; ``cached`` looks configs up (service first when
``--tuner-url`` is given, then the local store) and never measures; ``bo``, ``grid`` and ``random``
look up the same way and tune on a miss, then publish. Only the size buckets that hold most of the
model's saved bytes are tuned (found with one probing forward pass), so tuning stays short; other
sizes use what the store has or the default.

:func:`settle_config` is that flow for one kernel, and the only copy of it: ask the service and
the local store, tune on a miss, then publish the new run, or keep it queued in the local store
when the service is down (training goes on). ``cswap tune`` and ``cswap train`` both call it.

This module and :mod:`cswap.training.loop` sit at the top of the import layers with :mod:`cswap.cli`:
they wire the runtime to the tuner and to the tuning service's client.

Under torchrun, rank 0 tunes and publishes while the others wait at a barrier, then read from the
store (shared on one machine) or the service.

Example:
    >>> from cswap.training.config import TrainConfig
    >>> configs = KernelConfigs(backend="cpu", mode="off")
    >>> configs.launch_lookup("cpu", "compress", torch.float32, 1 << 20) is None
    True
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

import torch
from rich.console import Console
from rich.progress import Progress
from torch import nn

from cswap.codecs.choice import alternative_codec
from cswap.codecs.launch import Launch
from cswap.device import DeviceFingerprint
from cswap.planner.costmodel import TimeModel
from cswap.server.client import TuningClient, best_lookup, publish_or_queue
from cswap.training.config import TrainConfig
from cswap.tuner import ConfigStore, LookupResult, TuningRun, size_bucket
from cswap.tuner.kernels import dtype_name, kernel_name, kernel_source_hash
from cswap.tuner.lookup import CACHED_METHOD, default_params, launch_for, launch_of, tune
from cswap.tuner.search import ProgressFn
from cswap.tuner.space import SearchSpace, load_search_space

__all__ = ["PUBLICATIONS", "KernelConfigs", "Settled", "prepare_kernel_configs", "saved_bytes_by_codec", "settle_config"]

OPS: tuple[str, ...] = ("compress", "decompress")

#: What became of a settled config's run: ``published`` (the service has it), ``queued`` (the
#: service could not be reached; it waits in the local store for ``cswap configs push``),
#: ``local`` (no service was given), ``none`` (nothing new: looked up, or a store hit).
PUBLICATIONS: tuple[str, ...] = ("published", "queued", "local", "none")


@dataclass(frozen=True)
class Settled:
    """One kernel's config after :func:`settle_config`.

    Attributes:
        found: what the service or the local store answered before any tuning.
        run: the tuning run (``method == "cached"`` for a store hit), or ``None`` when only looked up.
        publication: one of :data:`PUBLICATIONS`.
    """

    found: LookupResult
    run: TuningRun | None = None
    publication: str = "none"

    @property
    def published(self) -> bool:
        """Whether the service holds the run now."""
        return self.publication == "published"

    @property
    def result(self) -> LookupResult:
        """The config to use: the run's best when one was made, else what was found."""
        if self.run is None or self.run.method == CACHED_METHOD:
            return self.found
        return LookupResult(dict(self.run.best_params), self.run.best_time_s, "exact", self.run.fingerprint_key)


def settle_config(
    fp: DeviceFingerprint,
    backend: str,
    op: str,
    dtype: torch.dtype | str,
    nbytes: int,
    store: ConfigStore,
    client: TuningClient | None = None,
    method: str | None = None,
    *,
    budget: int | None = None,
    seed: int = 0,
    force: bool = False,
    space: SearchSpace | None = None,
    repeats: int = 7,
    progress: ProgressFn | None = None,
    codec: str = "zvc",
) -> Settled:
    """Ask the service, else the local store; with ``method``, tune on a miss and publish (or queue) the run.

    Args:
        fp: the device that runs the kernel.
        backend, op, dtype, nbytes: which kernel, for which tensors.
        codec: whose kernel (``zvc``, ``bitpack`` or ``exponent``).
        store: the local store (runs are always recorded there first).
        client: the tuning service, or ``None``. When it cannot be reached, the flow goes on with
            the local store and warns once.
        method: ``None`` only looks up; ``bo``, ``grid``, ``random`` or ``expert`` tune on a miss.
        budget, seed, force, space, repeats, progress: as :func:`cswap.tuner.lookup.tune` takes them.

    Example:
        >>> from cswap.device import fingerprint
        >>> settled = settle_config(fingerprint("cpu"), "cpu", "compress", "float32", 1 << 16,
        ...                         ConfigStore("/tmp/cswap-settle-doc.db"))
        >>> settled.publication, settled.run is None
        ('none', True)
    """
    kernel = kernel_name(backend, op, codec)
    dtype_str = dtype_name(dtype, codec)
    bucket = size_bucket(nbytes)
    found = best_lookup(client, store, fp, kernel, kernel_source_hash(backend, codec), dtype_str, bucket,
                        default=default_params(backend))
    if method is None:
        return Settled(found)
    run = tune(fp, backend, op, dtype_str, nbytes, method, budget, store, seed, progress,
               force=force, space=space, repeats=repeats, found=found, codec=codec)
    if run.method == CACHED_METHOD:
        return Settled(found, run)
    if client is None:
        return Settled(found, run, "local")
    return Settled(found, run, "published" if publish_or_queue(client, run, store) else "queued")


@dataclass
class KernelConfigs:
    """The launch configs a run uses, and how each was found.

    Attributes:
        backend: codec backend on the training device (``cpu`` or ``cuda``).
        mode: the ``--tune`` mode.
        fingerprint: the training device.
        store: the local config store (``None`` with ``mode="off"``).
        chosen: (op, dtype name, bucket) -> (launch, lookup answer) of ZVC, settled before training.
        chosen_codecs: (codec, op, dtype name, bucket) -> (launch, lookup answer) of the other
            codecs: settled before training for the buckets the probe found, the rest looked up
            when the runtime first asks.
        runs: tuning runs made or found in this run (``method == "cached"`` for store hits).
        publications: run id -> one of :data:`PUBLICATIONS` (what became of each run).
        time_model: a calibrated time model for the advisor, when the store has one.
        service_url: the tuning service given with ``--tuner-url``, or ``None``.
        service_answered: whether the service answered every request made to it (``False``: at
            least one went unanswered and the local store was used); ``None`` when it was never asked.
    """

    backend: str
    mode: str
    fingerprint: DeviceFingerprint | None = None
    store: ConfigStore | None = None
    chosen: dict[tuple[str, str, int], tuple[Launch, LookupResult]] = field(default_factory=dict)
    chosen_codecs: dict[tuple[str, str, str, int], tuple[Launch, LookupResult]] = field(default_factory=dict)
    runs: list[TuningRun] = field(default_factory=list)
    publications: dict[str, str] = field(default_factory=dict)
    time_model: TimeModel | None = None
    service_url: str | None = None
    service_answered: bool | None = None

    def launch_lookup(self, backend: str, op: str, dtype: torch.dtype, nbytes: int, codec: str = "zvc") -> Launch | None:
        """The runtime's ``launch_lookup``: a settled config, else the store's, else ``None`` (the default).

        ``codec`` names whose kernel runs: a config tuned for another codec is never returned.
        """
        if self.mode == "off" or backend != self.backend or self.fingerprint is None:
            return None
        key = (op, dtype_name(dtype), size_bucket(nbytes))
        chosen: dict[Any, tuple[Launch, LookupResult]] = self.chosen if codec == "zvc" else self.chosen_codecs
        if codec != "zvc":
            key = (codec, *key)
        if key not in chosen:
            try:
                chosen[key] = launch_for(self.fingerprint, backend, op, dtype, nbytes, self.store, codec=codec)
            except ValueError:
                return None
        return chosen[key][0]

    def summary(self) -> dict[str, Any]:
        """What the report says about tuning: each settled config and every run with its evaluations."""
        settled = [(("zvc", *key), value) for key, value in sorted(self.chosen.items())]
        settled += sorted(self.chosen_codecs.items())
        return {
            "mode": self.mode,
            "backend": self.backend,
            "service_url": self.service_url,
            "service_answered": self.service_answered,
            "time_model": type(self.time_model).__name__ if self.time_model is not None else None,
            "kernels": [
                {
                    "codec": codec, "op": op, "dtype": dtype, "bucket": bucket, "match": found.match,
                    "source_key": found.source_key, "params": dict(found.params or {}), "time_s": found.time_s,
                }
                for (codec, op, dtype, bucket), (_, found) in settled
            ],
            "runs": [
                {
                    "run_id": run.run_id, "kernel": run.kernel, "dtype": run.dtype, "bucket": run.bucket,
                    "method": run.method, "best_params": dict(run.best_params), "best_time_s": run.best_time_s,
                    "publication": self.publications.get(run.run_id, "none"),
                    "published": self.publications.get(run.run_id) == "published",
                    "wall_s": run.wall_s, "evaluations": [{"params": dict(e.params), "time_s": e.time_s} for e in run.evaluations],
                }
                for run in self.runs
            ],
        }


def saved_bytes_by_codec(model: nn.Module, images: torch.Tensor) -> dict[str, tuple[torch.dtype, Counter[int]]]:
    """Probe one forward pass: per codec that could compress the saved activations, the dtype it
    would take most bytes of and its bytes per size bucket. ZVC takes every tensor; ``bitpack`` and
    ``exponent`` the dtypes they take (:func:`cswap.codecs.choice.alternative_codec`).

    Parameters are skipped (they are never offloaded). Nothing is moved or kept.

    Example:
        >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Dropout(0.5))
        >>> sorted(saved_bytes_by_codec(model, torch.randn(4, 8)))
        ['exponent', 'zvc']
    """
    by_codec: dict[str, tuple[Counter[torch.dtype], Counter[int]]] = {}
    # Autograd often saves a view of a weight (``weight.t()`` for a linear layer), not the
    # parameter itself: recognise parameters and buffers by their storage.
    parameter_storages = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers()) if t.layout is torch.strided}

    def pack(t: torch.Tensor) -> None:
        if (t.layout is torch.strided and t.untyped_storage().data_ptr() not in parameter_storages
                and not (t.is_leaf and t.requires_grad)):
            nbytes = t.numel() * t.element_size()
            for codec in ("zvc", alternative_codec(t.dtype)):
                if codec is not None:
                    by_dtype, by_bucket = by_codec.setdefault(codec, (Counter(), Counter()))
                    by_bucket[size_bucket(nbytes)] += nbytes
                    by_dtype[t.dtype] += nbytes

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda _: None):
        model(images)
    return {codec: (by_dtype.most_common(1)[0][0], by_bucket) for codec, (by_dtype, by_bucket) in by_codec.items()}


def prepare_kernel_configs(
    cfg: TrainConfig,
    fp: DeviceFingerprint,
    device: torch.device,
    model: nn.Module,
    probe_images: torch.Tensor,
    is_main: bool,
    barrier: Callable[[], None],
    console: Console,
    show_progress: bool = True,
    buckets_to_tune: int = 1,
) -> KernelConfigs:
    """Settle the launch configs of the run before training starts (see the module docstring).

    Args:
        cfg: the run's configuration (``tune``, ``tune_budget``, ``tuner_url``, ``seed``).
        fp: the training device's fingerprint.
        device: the training device.
        model: the model, for the probing forward pass.
        probe_images: one batch on ``device``.
        is_main: this process tunes and publishes (rank 0).
        barrier: waits for every rank.
        console: where progress goes.
        show_progress: draw a progress bar while tuning.
        buckets_to_tune: how many of the heaviest size buckets to settle, per codec that could
            compress the saved activations (ZVC, and bit-packing or exponent coding where the
            model saves their dtypes: :func:`saved_bytes_by_codec`).
    """
    backend = "cuda" if device.type == "cuda" else "cpu"
    configs = KernelConfigs(backend=backend, mode=cfg.tune, fingerprint=fp)
    if cfg.tune == "off":
        barrier()
        return configs
    configs.store = ConfigStore()
    client = TuningClient(cfg.tuner_url) if cfg.tuner_url else None
    configs.service_url = cfg.tuner_url or None
    kernels = [(codec, dtype, bucket) for codec, (dtype, by_bucket) in saved_bytes_by_codec(model, probe_images).items()
               for bucket, _ in by_bucket.most_common(buckets_to_tune)]
    searching = cfg.tune in ("bo", "grid", "random")
    with Progress(console=console, disable=not (show_progress and is_main and searching)) as bars:
        for phase in ("main", "others"):
            if (phase == "main") != is_main:
                barrier()
                continue
            for op in OPS:
                for codec, dtype, bucket in kernels:
                    progress = None
                    if searching and is_main:
                        task = bars.add_task(f"tuning {kernel_name(backend, op, codec)} {dtype_name(dtype)} bucket {bucket} "
                                             f"({cfg.tune})", total=cfg.tune_budget)
                        progress = lambda done, planned, best, t=task: bars.update(t, completed=done, total=planned)  # noqa: E731
                    settled = settle_config(fp, backend, op, dtype, 4**bucket, configs.store, client,
                                            cfg.tune if searching and is_main else None, budget=cfg.tune_budget,
                                            seed=cfg.seed, progress=progress, codec=codec)
                    if settled.run is not None:
                        bars.update(task, completed=bars.tasks[-1].total)
                        configs.runs.append(settled.run)
                        configs.publications[settled.run.run_id] = settled.publication
                    found = settled.result
                    # As launch_for: fitted to this machine's space (a transferred config's threads to
                    # its cores), the codec's default launch when nothing was found.
                    launch = launch_of(backend, load_search_space(backend, op, codec=codec), found)
                    if codec == "zvc":
                        configs.chosen[(op, dtype_name(dtype), bucket)] = (launch, found)
                    else:  # where launch_lookup looks a codec's launch up
                        configs.chosen_codecs[(codec, op, dtype_name(dtype), bucket)] = (launch, found)
    if client is not None:
        configs.service_answered = client.answered
        client.close()
    configs.time_model = _calibrated_time_model(fp, configs.store, backend)
    return configs


def _calibrated_time_model(fp: DeviceFingerprint, store: ConfigStore, backend: str) -> TimeModel | None:
    """The stored time model of this device, or ``None`` (the runtime then times the codecs itself)
    when there is none, it does not validate, or it lacks ZVC's times on ``backend`` (a calibration of
    other codecs only), which every compressing plan asks for."""
    try:
        from cswap.predictors import load_time_model
    except ImportError:
        return None
    try:
        model = load_time_model(fp, store)
        if model is not None:
            for op in ("compress", "decompress"):
                model.model_for(op, 4, backend)
        return model
    except (ValueError, KeyError) as error:
        warnings.warn(f"ignoring the stored time model of this device: {error}; rerun `cswap calibrate`", stacklevel=2)
        return None
