"""Every codec's kernels are tuned like ZVC's: their search spaces, names, store keys, lookups and ``cswap tune --codec``.

A config is stored under its kernel's name, ``<codec>.<backend>.<op>``, so one tuned for a codec is
never returned for another, and the ``zvc.*`` entries of older stores read as ZVC's.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cswap.cli import app
from cswap.codecs import CODECS
from cswap.codecs.launch import CpuLaunch, CudaLaunch
from cswap.device import fingerprint
from cswap.server.schemas import TuningRunIn
from cswap.training.kernelconfigs import KernelConfigs
from cswap.tuner import launch_for, tune
from cswap.tuner.kernels import (
    KERNELS,
    default_dtype,
    dtype_name,
    kernel_name,
    kernel_source_hash,
    split_kernel,
)
from cswap.tuner.lookup import CACHED_METHOD, launch_of
from cswap.tuner.objective import KernelObjective, representative_tensor
from cswap.tuner.space import (
    CODEC_LAUNCH_FIELDS,
    TUNED_CODECS,
    SearchSpaceError,
    check_launch_params,
    load_search_space,
    load_search_spaces,
    parse_codecs,
)
from cswap.tuner.store import ConfigStore, LookupResult, TuningRun, size_bucket

NEW = ("bitpack", "exponent")
NBYTES = 1 << 14  # tiny tensors: these tests check keys and values, not speed


@pytest.fixture
def store(tmp_path: Path) -> ConfigStore:
    return ConfigStore(tmp_path / "store.db")


def record(store: ConfigStore, fp: dict, kernel: str, params: dict, dtype: str = "float32") -> TuningRun:
    codec, backend, _ = split_kernel(kernel)
    run = TuningRun(fingerprint=fp, kernel=kernel, source_hash=kernel_source_hash(backend, codec), dtype=dtype,
                    bucket=size_bucket(NBYTES), method="grid", best_params=params, best_time_s=1e-4)
    assert store.record_run(run)
    return run


# ---------------------------------------------------------------------------- spaces and names


def test_the_tuned_codecs_are_the_registered_ones() -> None:
    assert TUNED_CODECS == CODECS.names() == tuple(CODEC_LAUNCH_FIELDS)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("codec", NEW)
def test_each_codec_has_a_space_of_its_own_kernels(codec: str, backend: str) -> None:
    spaces = load_search_spaces(backend, cores=2, codec=codec)
    assert set(spaces) == {"compress", "decompress"}
    for op, space in spaces.items():
        assert (space.codec, space.kernel) == (codec, f"{codec}.{backend}.{op}")
        assert space.source is not None and space.source.name == f"{codec}-{backend}.yaml"
        assert set(space.names) <= set(CODEC_LAUNCH_FIELDS[codec][backend])
        assert space.grid_size >= 2
    if backend == "cpu":
        assert spaces["compress"].names == (("threads",) if codec == "bitpack" else ("threads", "chunk_words"))
    else:
        launched = {"bitpack": {"compress": ("compress",), "decompress": ("decompress",)},
                    "exponent": {"compress": ("compress", "scatter"), "decompress": ("decompress",)}}[codec]
        for op, kernels in launched.items():
            assert {n for n in spaces[op].names if n != "chunk_words"} == {f"{k}_{w}" for k in kernels for w in ("grid", "block")}
    if codec == "exponent":  # smaller chunks than the default cost ratio: never searched
        assert all(p.low == 32 for s in spaces.values() for p in s.params if p.name == "chunk_words")


def test_a_space_file_of_another_codec_or_with_fields_the_codec_ignores_is_refused(tmp_path: Path) -> None:
    zvc_file = tmp_path / "cpu.yaml"
    zvc_file.write_text("backend: cpu\nops:\n  compress:\n    threads: {low: 1, high: 2}\n")
    assert load_search_space("cpu", "compress", zvc_file).codec == "zvc"  # no codec: key means ZVC, as before
    with pytest.raises(SearchSpaceError, match="is for codec 'zvc', expected 'bitpack'"):
        load_search_space("cpu", "compress", zvc_file, codec="bitpack")
    bad = tmp_path / "bitpack-cpu.yaml"
    bad.write_text("backend: cpu\ncodec: bitpack\nops:\n  compress:\n    chunk_words: {low: 16, high: 64, scale: pow2}\n")
    with pytest.raises(SearchSpaceError, match=r"unknown parameters \['chunk_words'\]; bitpack cpu launch parameters are \['threads'\]"):
        load_search_spaces("cpu", tmp_path, codec="bitpack")
    with pytest.raises(SearchSpaceError, match="exponent-cpu.yaml does not exist"):
        load_search_spaces("cpu", tmp_path, codec="exponent")
    with pytest.raises(ValueError, match="no tunable kernels for codec 'lz4'"):
        load_search_spaces("cpu", codec="lz4")


def test_kernel_names_hashes_and_dtypes_per_codec() -> None:
    assert kernel_name("cpu", "compress", "bitpack") == "bitpack.cpu.compress"
    assert split_kernel("exponent.cuda.decompress") == ("exponent", "cuda", "decompress")
    assert len(KERNELS) == len(TUNED_CODECS) * 4
    hashes = {kernel_source_hash(backend, codec) for codec in TUNED_CODECS for backend in ("cpu", "cuda")}
    assert len(hashes) == 6 and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes)
    assert (default_dtype("zvc"), default_dtype("bitpack"), default_dtype("exponent")) == ("float32", "bool", "float32")
    assert dtype_name(torch.uint8, "bitpack") == "uint8" and dtype_name("bfloat16", "exponent") == "bfloat16"
    with pytest.raises(ValueError, match="codec 'exponent' does not take dtype 'int32': choose one of"):
        dtype_name("int32", "exponent")
    assert parse_codecs("all") == list(TUNED_CODECS) and parse_codecs("exponent,bitpack") == ["exponent", "bitpack"]
    with pytest.raises(ValueError, match="no tunable kernels for codec 'lz4'"):
        parse_codecs("zvc,lz4")


def test_the_service_checks_each_codecs_configs_against_its_space() -> None:
    check_launch_params("bitpack.cpu.compress", {"threads": 2}, cores=2)
    check_launch_params("exponent.cuda.compress", {"scatter_grid": 528, "scatter_block": 256, "chunk_words": 128})
    with pytest.raises(ValueError, match=r"best_params \['chunk_words'\] are not bitpack cpu launch parameters"):
        check_launch_params("bitpack.cpu.compress", {"threads": 1, "chunk_words": 32}, cores=2)
    with pytest.raises(ValueError, match=r"best_params\['chunk_words'\] is 16: exponent.cpu.compress allows powers of two between 32"):
        check_launch_params("exponent.cpu.compress", {"threads": 1, "chunk_words": 16}, cores=2)
    with pytest.raises(ValueError, match="kernel 'lz4.cpu.compress' has no launch search space"):
        check_launch_params("lz4.cpu.compress", {})
    body = {"fingerprint": {"kind": "cpu", "name": "x", "compute_capability": "", "sm_count": 2, "memory_bytes": 0},
            "kernel": "bitpack.cpu.decompress", "source_hash": "s", "dtype": "bool", "bucket": 7, "method": "bo",
            "best_params": {"threads": 2}, "best_time_s": 1e-4}
    assert TuningRunIn.model_validate(body).to_run().kernel == "bitpack.cpu.decompress"


def test_representative_tensors_fit_each_codec() -> None:
    mask = representative_tensor("uint8", 4096, density=0.9, codec="bitpack")
    assert set(mask.unique().tolist()) == {0, 1} and 0.85 < float(mask.float().mean()) < 0.95
    floats = representative_tensor("bfloat16", 4096, density=1.0, codec="exponent")
    assert bool((floats < 0).any()) and bool((floats != 0).all())  # Gaussian, not post-ReLU
    objective = KernelObjective("cpu", "decompress", "float32", NBYTES, repeats=1, codec="exponent")
    assert objective.kernel == "exponent.cpu.decompress" and objective.density == 1.0
    assert math.isfinite(objective({"threads": 1, "chunk_words": 64})) and objective.failures == {}
    with pytest.raises(ValueError, match="codec 'bitpack' does not take dtype 'float32'"):
        KernelObjective("cpu", "compress", "float32", NBYTES, codec="bitpack")


# ---------------------------------------------------------------------------- tuning and the store


@pytest.mark.parametrize(("codec", "dtype"), [("bitpack", "bool"), ("exponent", "bfloat16")])
def test_tuning_a_new_codec_stores_its_config_under_its_own_kernel(store: ConfigStore, codec: str, dtype: str) -> None:
    fp = fingerprint("cpu")
    run = tune(fp, "cpu", "compress", dtype, NBYTES, "bo", budget=2, store=store, repeats=1, codec=codec)
    assert run.kernel == f"{codec}.cpu.compress" and run.method == "bo" and math.isfinite(run.best_time_s)
    assert run.source_hash == kernel_source_hash("cpu", codec) and run.dtype == dtype
    assert set(run.best_params) == set(load_search_space("cpu", "compress", codec=codec).names)
    (config,) = store.configs(fp.key)
    assert (config["kernel"], config["dtype"], config["params"]) == (run.kernel, dtype, run.best_params)

    again = tune(fp, "cpu", "compress", dtype, NBYTES, "bo", budget=2, store=store, codec=codec)
    assert again.method == CACHED_METHOD and again.best_params == run.best_params
    launch, found = launch_for(fp, "cpu", "compress", dtype, NBYTES, store, codec=codec)
    assert found.match == "exact" and launch == CpuLaunch(**{"chunk_words": 32, **run.best_params})
    # ZVC on the same dtype and size has nothing tuned: the config is exponent's (or bit-packing's) alone.
    assert launch_for(fp, "cpu", "compress", dtype, NBYTES, store)[1].match == "default"


def test_a_zvc_config_is_never_returned_for_another_codec(store: ConfigStore) -> None:
    fp = fingerprint("cpu").to_dict()
    zvc = record(store, fp, "zvc.cpu.compress", {"threads": 1, "chunk_words": 4096})
    # The zvc.* entry an older store holds reads as ZVC's config, exactly as before.
    launch, found = launch_for(fp, "cpu", "compress", "float32", NBYTES, store)
    assert (found.match, launch) == ("exact", CpuLaunch(threads=1, chunk_words=4096))
    launch, found = launch_for(fp, "cpu", "compress", "float32", NBYTES, store, codec="exponent")
    assert found.match == "default" and launch.chunk_words == 32
    # Nor transferred from another device, nor a store hit that skips tuning.
    other = {**fp, "name": "another CPU", "sm_count": fp["sm_count"] + 6}
    assert launch_for(other, "cpu", "compress", "float32", NBYTES, store)[1].match == "transferred"
    assert launch_for(other, "cpu", "compress", "float32", NBYTES, store, codec="exponent")[1].match == "default"
    run = tune(fp, "cpu", "compress", "float32", NBYTES, "random", budget=1, store=store, repeats=1, codec="exponent",
               objective=lambda params: 1e-3)
    assert run.method == "random" and run.kernel == "exponent.cpu.compress"
    assert {c["kernel"] for c in store.configs()} == {zvc.kernel, run.kernel}
    with pytest.raises(ValueError, match="the search space given is zvc.cpu.compress's, but exponent.cpu.compress"):
        tune(fp, "cpu", "compress", "float32", NBYTES, store=store, codec="exponent", force=True,
             space=load_search_space("cpu", "compress"))


def test_the_runtime_lookup_asks_by_codec(store: ConfigStore) -> None:
    fp = fingerprint("cpu")
    record(store, fp.to_dict(), "zvc.cpu.compress", {"threads": 1, "chunk_words": 4096})
    record(store, fp.to_dict(), "exponent.cpu.compress", {"threads": 1, "chunk_words": 256}, dtype="bfloat16")
    configs = KernelConfigs(backend="cpu", mode="cached", fingerprint=fp, store=store)
    assert configs.launch_lookup("cpu", "compress", torch.float32, NBYTES) == CpuLaunch(threads=1, chunk_words=4096)
    assert configs.launch_lookup("cpu", "compress", torch.bfloat16, NBYTES, codec="exponent") == CpuLaunch(threads=1, chunk_words=256)
    assert configs.launch_lookup("cpu", "compress", torch.float32, NBYTES, codec="exponent").chunk_words == 32
    assert configs.launch_lookup("cpu", "compress", torch.float32, NBYTES, codec="bitpack") is None  # not its dtype
    kernels = configs.summary()["kernels"]
    assert [(k["codec"], k["dtype"], k["match"]) for k in kernels] == [
        ("zvc", "float32", "exact"), ("exponent", "bfloat16", "exact"), ("exponent", "float32", "default")]


def test_a_lookup_without_a_config_gives_the_codecs_own_default_launch() -> None:
    """What the runtime uses without a store: CpuLaunch() runs a tensor under 16 MiB on one thread,
    where a launch naming every core made it wait for a busy second core."""
    cores = os.cpu_count() or 1
    for codec in TUNED_CODECS:
        space = load_search_space("cpu", "compress", codec=codec)
        assert launch_of("cpu", space, LookupResult({"threads": cores}, None, "default", None)) == CpuLaunch()
        transferred = launch_of("cpu", space, LookupResult({"threads": 64, "chunk_words": 4096}, 1e-4, "transferred", "k"))
        assert transferred.threads == cores  # fitted to the cores here, as launch_for does
    assert launch_of("cuda", load_search_space("cuda", "decompress"), LookupResult(None, None, "default", None)) == CudaLaunch()


# ---------------------------------------------------------------------------- cswap tune --codec


def test_cswap_tune_codec(tmp_path: Path) -> None:
    store = str(tmp_path / "store.db")
    args = ["tune", "--backend", "cpu", "--sizes", "16KiB", "--repeats", "1", "--budget", "2", "--json", "--store", store]
    result = CliRunner().invoke(app, [*args, "--codec", "bitpack,exponent", "--op", "compress"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["codecs"] == ["bitpack", "exponent"]
    assert sorted(report["best_params"]) == ["bitpack.cpu.compress/bool/16KiB", "exponent.cpu.compress/float32/16KiB"]
    assert [(r["codec"], r["evaluations"]) for r in report["results"]] == [("bitpack", 2), ("exponent", 2)]
    assert {c["kernel"] for c in ConfigStore(store).configs()} == {"bitpack.cpu.compress", "exponent.cpu.compress"}

    # With a dtype, the codecs that do not take it are left out; alone, such a codec is an error.
    result = CliRunner().invoke(app, [*args, "--codec", "all", "--dtype", "bfloat16", "--op", "decompress", "--method", "expert"])
    assert result.exit_code == 0, result.output
    assert [r["kernel"] for r in json.loads(result.stdout)["results"]] == ["zvc.cpu.decompress", "exponent.cpu.decompress"]
    for bad, message in ((["--codec", "bitpack", "--dtype", "float32"], "codec 'bitpack' does not take dtype 'float32'"),
                         (["--codec", "lz4"], "no tunable kernels for codec 'lz4'")):
        result = CliRunner().invoke(app, [*args, *bad])
        assert result.exit_code == 2 and message in " ".join(result.stderr.split())
