"""What the runtime asks the tuner: the launch config to use (:func:`launch_for`), and tuning it (:func:`tune`).

:func:`launch_for` never measures anything: it looks the config up in the store (this device,
then a device of the same model, then the nearest device of the same kind with grids scaled by
the SM ratio) and falls back to the codec's default launch.

:func:`tune` measures: unless the store already holds a config tuned on this device (or one of the
same model) for the same kernel source, dtype and size bucket, it runs a search and records the
run. A store hit does zero evaluations and returns a run whose ``method`` is ``"cached"``.

Both take the codec (``codec="zvc"`` by default): its kernels are tuned and looked up under their
own names (``bitpack.cpu.compress``), so a config tuned for one codec never reaches another.

Example:
    >>> from cswap.device import fingerprint
    >>> from cswap.tuner.store import ConfigStore
    >>> store = ConfigStore("/tmp/cswap-lookup-doc.db")
    >>> launch, found = launch_for(fingerprint("cpu"), "cpu", "compress", "float32", 1 << 20, store)
    >>> found.match in ("exact", "same-model", "transferred", "default"), type(launch).__name__
    (True, 'CpuLaunch')
    >>> launch_for(fingerprint("cpu"), "cpu", "compress", "bfloat16", 1 << 20, store, codec="exponent")[1].match
    'default'
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import fields
from typing import Any
from collections.abc import Mapping

import torch

from cswap.codecs.launch import CpuLaunch, CudaLaunch, Launch, launch_from_params
from cswap.device import DeviceFingerprint
from cswap.tuner.kernels import bucket_nbytes, dtype_name, kernel_name, kernel_source_hash
from cswap.tuner.space import check_codec
from cswap.tuner.objective import KernelObjective
from cswap.tuner.search import METHODS, ObjectiveFn, ProgressFn, search
from cswap.tuner.space import SearchSpace, load_search_space
from cswap.tuner.store import ConfigStore, LookupResult, TuningRun, fingerprint_key, normalize_fingerprint, size_bucket

__all__ = ["CACHED_METHOD", "HIT_MATCHES", "default_params", "launch_for", "launch_of", "tune"]

logger = logging.getLogger(__name__)

#: ``TuningRun.method`` of what :func:`tune` returns on a store hit (no evaluation was made).
CACHED_METHOD = "cached"
#: Store matches that count as already tuned: configs measured on this device or one of its model.
HIT_MATCHES: tuple[str, ...] = ("exact", "same-model")

FingerprintLike = DeviceFingerprint | Mapping[str, Any]


def default_params(backend: str) -> dict[str, int]:
    """The codec's default launch of ``backend`` as params (``CpuLaunch``'s ``threads=None`` becomes the core count).

    Example:
        >>> default_params("cuda")["compress_block"]
        256
    """
    if backend == "cpu":
        launch = CpuLaunch()
        return {"threads": launch.threads or os.cpu_count() or 1, "chunk_words": launch.chunk_words}
    if backend == "cuda":
        return CudaLaunch().to_params()
    raise ValueError(f"no tunable launch for backend {backend!r}: choose cpu or cuda")


def _launch(backend: str, space: SearchSpace, params: Mapping[str, int]) -> Launch:
    """The backend's launch from stored ``params``, projected onto the space here (bounds, core count)."""
    merged = {**default_params(backend), **{name: int(value) for name, value in params.items()}}
    merged.update(space.project(merged))
    valid = {f.name for f in fields(CpuLaunch if backend == "cpu" else CudaLaunch)}
    launch = launch_from_params(backend, {name: value for name, value in merged.items() if name in valid})
    assert launch is not None  # backend is cpu or cuda here
    return launch


def launch_for(
    fingerprint: FingerprintLike,
    backend: str,
    op: str,
    dtype: torch.dtype | str,
    nbytes: int,
    store: ConfigStore | None = None,
    codec: str = "zvc",
) -> tuple[Launch, LookupResult]:
    """The launch config the runtime should use for one (de)compression; never tunes.

    Args:
        fingerprint: the device that will run the kernel (``cswap.device.fingerprint(device)``).
        backend: ``cpu`` or ``cuda``.
        op: ``compress`` or ``decompress``.
        dtype: the tensor's dtype (or its name).
        nbytes: the tensor's size in bytes (configs are kept per :func:`size_bucket`).
        store: where tuned configs are kept; ``None`` opens the default store.
        codec: the codec that will run (``zvc``, ``bitpack`` or ``exponent``): only configs tuned
            for its kernels are found.

    Returns:
        ``(launch, found)``: a :class:`CpuLaunch` or :class:`CudaLaunch` valid on this machine,
        and the store's answer (``found.match == "default"`` when nothing was tuned). With
        nothing tuned the launch is the codec's own default (``CpuLaunch()``, ``CudaLaunch()``),
        the one the runtime uses without a store: on the CPU it leaves the thread count to the
        codec, which runs a tensor under 16 MiB on one thread
        (:data:`cswap.codecs.cpu_launch.SERIAL_BELOW_BYTES`); naming every core there makes a
        small tensor wait milliseconds for a second thread on a busy machine.

    Raises:
        ValueError: unknown backend, op, codec, or a dtype the codec does not take.
        cswap.tuner.store.StoreError: the store is corrupt, locked or unreadable.

    Example:
        >>> launch, found = launch_for({"kind": "cpu", "name": "x", "compute_capability": "", "sm_count": 2,
        ...                             "memory_bytes": 0}, "cpu", "decompress", torch.float32, 4096,
        ...                            ConfigStore("/tmp/cswap-lookup-doc.db"))
        >>> found.match
        'default'
    """
    kernel = kernel_name(backend, op, check_codec(codec))
    space = load_search_space(backend, op, codec=codec)
    store = store if store is not None else ConfigStore()
    found = store.lookup(
        normalize_fingerprint(fingerprint),
        kernel,
        kernel_source_hash(backend, codec),
        dtype_name(dtype, codec),
        size_bucket(nbytes),
        default=default_params(backend),
    )
    return launch_of(backend, space, found), found


def launch_of(backend: str, space: SearchSpace, found: LookupResult) -> Launch:
    """The launch of a lookup's answer: its config fitted to this machine, or the codec's default launch."""
    if found.match == "default" or not found.params:
        return CpuLaunch() if backend == "cpu" else CudaLaunch()
    return _launch(backend, space, found.params)


def _cached_run(
    data: dict[str, Any], kernel: str, source_hash: str, dtype: str, bucket: int, found: LookupResult, wall_s: float
) -> TuningRun:
    assert found.params is not None and found.time_s is not None
    return TuningRun(
        fingerprint=data,
        kernel=kernel,
        source_hash=source_hash,
        dtype=dtype,
        bucket=bucket,
        method=CACHED_METHOD,
        best_params=found.params,
        best_time_s=found.time_s,
        evaluations=(),
        wall_s=wall_s,
    )


def tune(
    fingerprint: FingerprintLike,
    backend: str,
    op: str,
    dtype: torch.dtype | str,
    nbytes: int,
    method: str = "bo",
    budget: int | None = None,
    store: ConfigStore | None = None,
    seed: int = 0,
    progress: ProgressFn | None = None,
    *,
    force: bool = False,
    space: SearchSpace | None = None,
    objective: ObjectiveFn | None = None,
    repeats: int = 7,
    found: LookupResult | None = None,
    codec: str = "zvc",
) -> TuningRun:
    """Tune kernel ``<codec>.<backend>.<op>`` for ``dtype`` and the size bucket of ``nbytes`` on this machine.

    A config already stored for this device (or another of the same model), kernel source,
    dtype and bucket is a store hit: nothing is measured and the returned run has
    ``method == "cached"``, no evaluations, and the stored config and time. Otherwise the search
    runs (BO warm-started from a transferred device's configs when the store has some), and the
    run is recorded in the store.

    Args:
        fingerprint: this machine's device that runs the kernel (``cswap.device.fingerprint``).
        backend: ``cpu`` or ``cuda``.
        op: ``compress`` or ``decompress``.
        dtype: dtype of the tensors (or its name).
        nbytes: a tensor size in the bucket to tune; the measured tensor has
            :func:`cswap.tuner.kernels.bucket_nbytes` bytes.
        method: ``bo``, ``grid``, ``random`` or ``expert``.
        budget: evaluations for ``bo`` and ``random`` (default :func:`cswap.tuner.search.default_budget`).
        store: where runs are recorded; ``None`` opens the default store.
        seed: for ``bo`` and ``random``.
        progress: called after each evaluation with (done, planned, best seconds so far).
        force: tune even when the store has a config.
        space: the search space (default: from ``configs/search_spaces``).
        objective: seconds of a config (default: :class:`cswap.tuner.objective.KernelObjective`, which
            measures the real kernel here).
        repeats: timed calls per config of the default objective (median).
        found: a lookup already made (e.g. by a tuning service) instead of asking ``store``.
        codec: ``zvc`` (default), ``bitpack`` or ``exponent``; ``dtype`` must be one it takes,
            and ``space`` (when given) must be its.

    Returns:
        The recorded run, or on a store hit the cached result (``method == "cached"``).

    Raises:
        ValueError: unknown backend, op, codec, dtype or method, or a space of another codec.
        RuntimeError: the backend cannot be tuned here (no GPU, CUDA simulator), or every config failed.
        cswap.tuner.store.StoreError: the store is corrupt, locked or unreadable.

    Example:
        >>> from cswap.device import fingerprint
        >>> store = ConfigStore("/tmp/cswap-tune-doc.db")
        >>> run = tune(fingerprint("cpu"), "cpu", "compress", "float32", 1 << 16, budget=4, store=store)
        >>> tune(fingerprint("cpu"), "cpu", "compress", "float32", 1 << 16, store=store).method
        'cached'
    """
    if method not in METHODS:
        raise ValueError(f"unknown tuning method {method!r}: choose one of {', '.join(METHODS)}")
    started_s = time.perf_counter()
    kernel = kernel_name(backend, op, check_codec(codec))
    data = normalize_fingerprint(fingerprint)
    if data["kind"] != backend:
        raise ValueError(f"fingerprint is of a {data['kind']} device but backend {backend!r} was asked; pass the "
                         f"fingerprint of the device that runs the kernel")
    if space is not None and (space.codec, space.backend, space.op) != (codec, backend, op):
        raise ValueError(f"the search space given is {space.kernel}'s, but {kernel} is being tuned")
    dtype_str = dtype_name(dtype, codec)
    bucket = size_bucket(nbytes)
    source_hash = kernel_source_hash(backend, codec)
    store = store if store is not None else ConfigStore()
    if found is None:
        found = store.lookup(data, kernel, source_hash, dtype_str, bucket)
    if not force and found.match in HIT_MATCHES and found.params is not None and found.time_s is not None:
        logger.info("%s %s bucket %d: store hit (%s), zero evaluations", kernel, dtype_str, bucket, found.match)
        return _cached_run(data, kernel, source_hash, dtype_str, bucket, found, time.perf_counter() - started_s)

    space = space if space is not None else load_search_space(backend, op, codec=codec)
    if objective is None:
        objective = KernelObjective(backend, op, dtype_str, bucket_nbytes(bucket), repeats=repeats, codec=codec)
    warm = found.warm_start if found.match == "transferred" else ()
    result = search(method, space, objective, budget, seed, warm, progress, units=int(data["sm_count"]))
    if result.best_time_s == float("inf"):
        failures = getattr(objective, "failures", {})
        example = next(iter(failures.values()), "no message")
        raise RuntimeError(
            f"every config of {kernel} failed ({len(result.evaluations)} tried; e.g. {example}); "
            f"check the backend works here: python -c \"import torch, cswap.codecs as c; "
            f"c.compress(torch.ones(8, dtype=torch.{dtype_str}), codec='{codec}', backend='{backend}')\""
        )
    run = TuningRun(
        fingerprint=data,
        kernel=kernel,
        source_hash=source_hash,
        dtype=dtype_str,
        bucket=bucket,
        method=method,
        best_params=result.best_params,
        best_time_s=result.best_time_s,
        evaluations=result.evaluations,
        wall_s=time.perf_counter() - started_s,
    )
    store.record_run(run)
    logger.info(
        "%s %s bucket %d: %s found %s in %.3g ms after %d evaluations (key %s)",
        kernel, dtype_str, bucket, method, run.best_params, run.best_time_s * 1e3,
        len(run.evaluations), fingerprint_key(data),
    )
    return run
