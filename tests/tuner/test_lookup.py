"""What the runtime asks: ``launch_for`` (store lookup, never tuning) and ``tune`` (search, record, store hits)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from collections.abc import Mapping

import pytest
import torch

from cswap.codecs import zvc_cpu
from cswap.codecs.launch import CpuLaunch, CudaLaunch
from cswap.device import fingerprint
from cswap.tuner import launch_for, tune
from cswap.tuner.kernels import KERNELS, bucket_nbytes, dtype_name, kernel_name, kernel_source_hash, parse_kernel
from cswap.tuner.lookup import CACHED_METHOD, default_params
from cswap.tuner.space import SearchSpace, load_search_space
from cswap.tuner.store import ConfigStore, TuningRun, size_bucket

CORES = os.cpu_count() or 1


def cpu_fp(name: str = "Test CPU", cores: int = 4) -> dict:
    return {"kind": "cpu", "name": name, "compute_capability": "", "sm_count": cores, "memory_bytes": 16 << 30}


def gpu_fp(name: str, sms: int) -> dict:
    return {"kind": "cuda", "name": name, "compute_capability": "9.0", "sm_count": sms, "memory_bytes": 80 << 30}


@pytest.fixture
def store(tmp_path: Path) -> ConfigStore:
    return ConfigStore(tmp_path / "store.db")


def record(store: ConfigStore, fp: dict, kernel: str, params: dict, time_s: float, nbytes: int = 1 << 20) -> TuningRun:
    backend = parse_kernel(kernel)[0]
    run = TuningRun(
        fingerprint=fp, kernel=kernel, source_hash=kernel_source_hash(backend), dtype="float32",
        bucket=size_bucket(nbytes), method="grid", best_params=params, best_time_s=time_s,
    )
    assert store.record_run(run)
    return run


def bowl(params: Mapping[str, int]) -> float:
    return 1e-3 * (1 + 0.06 * (math.log2(params["chunk_words"]) - 9) ** 2) * (1 + 0.04 * (params["threads"] - 3) ** 2)


# ---------------------------------------------------------------------------- names and hashes


def test_kernel_names() -> None:
    assert KERNELS[:4] == ("zvc.cpu.compress", "zvc.cpu.decompress", "zvc.cuda.compress", "zvc.cuda.decompress")
    assert KERNELS[4:] == tuple(f"{codec}.{backend}.{op}" for codec in ("bitpack", "exponent")
                                for backend in ("cpu", "cuda") for op in ("compress", "decompress"))
    assert kernel_name("cuda", "compress") == "zvc.cuda.compress"
    assert parse_kernel("zvc.cpu.decompress") == ("cpu", "decompress")
    for bad in ("zvc.torch.compress", "zvc.cpu.scan", "lz4.cpu.compress"):
        with pytest.raises(ValueError, match=re.escape(f"unknown kernel {bad!r}: valid kernels are zvc.cpu.compress, ")):
            parse_kernel(bad)


def test_source_hash_comes_from_the_backend_module() -> None:
    assert kernel_source_hash("cpu") == zvc_cpu.kernel_source_hash()
    assert re.fullmatch(r"[0-9a-f]{64}", kernel_source_hash("cpu"))
    with pytest.raises(ValueError, match="no tunable kernels for backend 'torch'"):
        kernel_source_hash("torch")


def test_dtype_names_and_bucket_sizes() -> None:
    assert dtype_name(torch.bfloat16) == dtype_name("torch.bfloat16") == "bfloat16"
    assert bucket_nbytes(size_bucket(16 << 20)) == 16 << 20
    assert size_bucket(bucket_nbytes(7)) == 7 and size_bucket(bucket_nbytes(7) * 4 - 1) == 7
    with pytest.raises(ValueError, match="unsupported dtype 'half_float'"):
        dtype_name("half_float")


# ---------------------------------------------------------------------------- launch_for


@pytest.mark.parametrize("op", ["compress", "decompress"])
def test_launch_for_falls_back_to_the_codec_default(store: ConfigStore, op: str) -> None:
    launch, found = launch_for(cpu_fp(), "cpu", op, torch.float32, 1 << 20, store)
    assert found.match == "default" and found.source_key is None
    # The codec's own default: it runs a tensor under 16 MiB on one thread (cpu_launch.threads_for).
    assert launch == CpuLaunch()
    assert found.params == default_params("cpu")


def test_launch_for_uses_this_devices_config(store: ConfigStore) -> None:
    fp = cpu_fp(cores=CORES)
    record(store, fp, "zvc.cpu.compress", {"threads": 1, "chunk_words": 256}, 1e-3)
    launch, found = launch_for(fp, "cpu", "compress", "float32", 1 << 20, store)
    assert (launch, found.match, found.time_s) == (CpuLaunch(threads=1, chunk_words=256), "exact", 1e-3)
    # Another size bucket, dtype or op has nothing tuned.
    assert launch_for(fp, "cpu", "compress", "float32", 16 << 20, store)[1].match == "default"
    assert launch_for(fp, "cpu", "compress", "float16", 1 << 20, store)[1].match == "default"
    assert launch_for(fp, "cpu", "decompress", "float32", 1 << 20, store)[1].match == "default"


def test_launch_for_fits_a_transferred_cpu_config_to_the_cores_here(store: ConfigStore) -> None:
    record(store, cpu_fp("Big CPU", cores=64), "zvc.cpu.compress", {"threads": 64, "chunk_words": 4096}, 1e-4)
    launch, found = launch_for(cpu_fp("Small CPU", cores=CORES), "cpu", "compress", "float32", 1 << 20, store)
    assert found.match == "transferred"
    assert launch == CpuLaunch(threads=CORES, chunk_words=4096)


def test_launch_for_scales_cuda_grids_by_the_sm_ratio(store: ConfigStore) -> None:
    tuned = {"decompress_grid": 528, "decompress_block": 512}
    record(store, gpu_fp("NVIDIA H100", 132), "zvc.cuda.decompress", tuned, 1e-5)
    launch, found = launch_for(gpu_fp("NVIDIA small", 66), "cuda", "decompress", "float32", 1 << 20, store)
    assert found.match == "transferred" and found.warm_start[0] == {"decompress_grid": 264, "decompress_block": 512}
    assert launch == CudaLaunch(decompress_grid=264, decompress_block=512)
    same_model, found = launch_for(gpu_fp("NVIDIA H100", 132) | {"driver": "other"}, "cuda", "decompress", "float32", 1 << 20, store)
    assert found.match == "same-model" and same_model == CudaLaunch(decompress_grid=528, decompress_block=512)


def test_launch_for_bad_input(store: ConfigStore) -> None:
    with pytest.raises(ValueError, match="unknown kernel 'zvc.torch.compress'"):
        launch_for(cpu_fp(), "torch", "compress", "float32", 1024, store)
    with pytest.raises(ValueError, match="unsupported dtype"):
        launch_for(cpu_fp(), "cpu", "compress", "complex64", 1024, store)
    with pytest.raises(ValueError, match="fingerprint is missing sm_count"):
        launch_for({"kind": "cpu", "name": "x", "compute_capability": "", "memory_bytes": 0}, "cpu", "compress", "float32", 1024, store)


# ---------------------------------------------------------------------------- tune


def test_real_cpu_tuning_is_recorded_and_the_second_call_is_a_store_hit(store: ConfigStore) -> None:
    fp = fingerprint("cpu")
    seen: list[tuple[int, int]] = []
    run = tune(fp, "cpu", "compress", torch.float32, 1 << 14, "bo", budget=3, store=store, seed=0,
               progress=lambda done, planned, best: seen.append((done, planned)), repeats=2)
    assert run.method == "bo" and len(run.evaluations) == 3 and seen == [(1, 3), (2, 3), (3, 3)]
    assert run.best_time_s == min(e.time_s for e in run.evaluations) and math.isfinite(run.best_time_s)
    assert run.kernel == "zvc.cpu.compress" and run.bucket == 7 and run.source_hash == kernel_source_hash("cpu")
    stored = store.run(run.run_id)
    assert stored is not None and stored.evaluations == run.evaluations
    assert store.best(fp.key, "zvc.cpu.compress", run.source_hash, "float32", 7) == (run.best_params, run.best_time_s)

    again = tune(fp, "cpu", "compress", "float32", 1 << 14, "bo", budget=3, store=store, seed=0,
                 progress=lambda *a: seen.append(a))
    assert again.method == CACHED_METHOD and again.evaluations == ()
    assert (again.best_params, again.best_time_s) == (run.best_params, run.best_time_s)
    assert len(seen) == 3 and len(store.runs()) == 1  # nothing measured, nothing recorded

    forced = tune(fp, "cpu", "compress", "float32", 1 << 14, "random", budget=2, store=store, force=True, repeats=1)
    assert forced.method == "random" and len(forced.evaluations) == 2 and len(store.runs()) == 2


def test_expert_and_grid_tuning_on_the_real_cpu(store: ConfigStore) -> None:
    fp = fingerprint("cpu")
    expert = tune(fp, "cpu", "decompress", "bfloat16", 1 << 12, "expert", store=store, repeats=1)
    assert [e.params for e in expert.evaluations] == [{"threads": CORES, "chunk_words": 32}]
    threads_only = SearchSpace("cpu", "decompress", load_search_space("cpu", "decompress").params[:1])
    grid = tune(fp, "cpu", "decompress", "bfloat16", 1 << 12, "grid", store=store, force=True, space=threads_only, repeats=1)
    assert [e.params for e in grid.evaluations] == [{"threads": t} for t in range(1, CORES + 1)]


def test_bo_is_warm_started_from_a_transferred_device(store: ConfigStore) -> None:
    here = cpu_fp("This CPU", cores=4)
    space = load_search_space("cpu", "compress", cores=4)
    record(store, cpu_fp("Other CPU", cores=8), "zvc.cpu.compress", {"threads": 3, "chunk_words": 512}, 2e-3)
    asked: list[dict] = []

    def objective(params: Mapping[str, int]) -> float:
        asked.append(dict(params))
        return bowl(params)

    run = tune(here, "cpu", "compress", "float32", 1 << 20, "bo", budget=4, store=store, space=space, objective=objective)
    assert asked[0] == {"threads": 3, "chunk_words": 512}
    assert run.best_params == {"threads": 3, "chunk_words": 512} and len(run.evaluations) == 4
    assert launch_for(here, "cpu", "compress", "float32", 1 << 20, store)[1].match == "exact"


def test_a_same_model_config_is_a_store_hit(store: ConfigStore) -> None:
    record(store, gpu_fp("NVIDIA H100", 132), "zvc.cuda.compress", {"compress_grid": 528}, 1e-5)
    twin = gpu_fp("NVIDIA H100", 132) | {"memory_bytes": 81 << 30}
    run = tune(twin, "cuda", "compress", "float32", 1 << 20, "bo", store=store, objective=lambda p: pytest.fail("measured"))
    assert run.method == CACHED_METHOD and run.best_params == {"compress_grid": 528}


def test_when_every_config_fails_nothing_is_recorded(store: ConfigStore) -> None:
    with pytest.raises(RuntimeError, match="every config of zvc.cpu.compress failed \\(4 tried"):
        tune(cpu_fp(), "cpu", "compress", "float32", 4096, "random", budget=4, store=store, objective=lambda p: math.inf)
    assert store.runs() == []


def test_tune_bad_input(store: ConfigStore, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown tuning method 'anneal'"):
        tune(cpu_fp(), "cpu", "compress", "float32", 4096, "anneal", store=store)
    with pytest.raises(ValueError, match="fingerprint is of a cpu device but backend 'cuda'"):
        tune(cpu_fp(), "cuda", "compress", "float32", 4096, store=store)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="torch sees no GPU"):
        tune(gpu_fp("NVIDIA H100", 132), "cuda", "compress", "float32", 4096, store=store)
