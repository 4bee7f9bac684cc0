"""Search spaces: the shipped files, loading from anywhere, and clear errors for bad files."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from cswap.tuner.space import OPS, Param, SearchSpace, SearchSpaceError, load_search_space, load_search_spaces

CORES = 4


def _write(tmp_path: Path, text: str, name: str = "cpu.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_cpu_space_is_threads_by_power_of_two_chunks() -> None:
    for op in OPS:
        space = load_search_space("cpu", op, cores=CORES)
        threads, chunk = space.params
        assert (threads.name, threads.low, threads.high, threads.grid) == ("threads", 1, CORES, (1, 2, 3, 4))
        assert chunk.name == "chunk_words"
        assert chunk.grid == tuple(2**e for e in range(4, 15))
        assert space.grid_size == CORES * 11


@pytest.mark.parametrize("op", OPS)
def test_cuda_space_has_grid_and_block_of_each_kernel(op: str) -> None:
    space = load_search_space("cuda", op)
    kernels = ("compress", "scan", "scatter") if op == "compress" else ("decompress",)
    assert space.names == tuple(f"{k}_{what}" for k in kernels for what in ("grid", "block"))
    for param in space.params:
        if param.name.endswith("_block"):
            assert (param.low, param.high, param.scale) == (32, 1024, "pow2")
            assert all(v & (v - 1) == 0 and 32 <= v <= 1024 for v in param.grid)
        else:
            assert (param.low, param.high, param.scale) == (1, 65535, "log")
            assert all(1 <= v <= 65535 for v in param.grid)


def test_loads_from_any_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert set(load_search_spaces("cuda")) == set(OPS)


def test_override_by_argument_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = "backend: cpu\nops:\n  compress:\n    chunk_words: {low: 64, high: 256, scale: pow2}\n"
    _write(tmp_path, text)
    assert load_search_space("cpu", "compress", tmp_path).params[0].grid == (64, 128, 256)
    assert load_search_space("cpu", "compress", tmp_path / "cpu.yaml").names == ("chunk_words",)
    monkeypatch.setenv("CSWAP_SEARCH_SPACES", str(tmp_path))
    assert load_search_space("cpu", "compress").names == ("chunk_words",)


def test_threads_above_the_cores_are_clamped(tmp_path: Path) -> None:
    _write(tmp_path, "backend: cpu\nops:\n  compress:\n    threads: {low: 1, high: 64}\n")
    assert load_search_space("cpu", "compress", tmp_path, cores=3).params[0].high == 3


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("backend: cpu\nops: [unclosed", "not valid YAML"),
        ("- just\n- a list\n", "must be a mapping"),
        ("backend: cpu\n", "ops: Field required"),
        ("ops:\n  compress:\n    threads: {low: 1, high: 2}\n", "backend: Field required"),
        ("backend: cpu\nops:\n  compress:\n    threads: {low: 1}\n", "ops.compress.threads.high: Field required"),
        ("backend: cpu\nops:\n  compress:\n    threads: {low: 3, high: 2}\n", "low 3 is above high 2"),
        ("backend: cpu\nops:\n  compress:\n    threads: {low: 0, high: 2}\n", "greater than or equal to 1"),
        ("backend: cpu\nops:\n  compress:\n    chunk_words: {low: 16, high: 100, scale: pow2}\n", "powers of two"),
        ("backend: cpu\nops:\n  compress:\n    chunk_words: {low: 16, high: 64, scale: cubic}\n", "scale"),
        ("backend: cpu\nops:\n  compress:\n    warp: {low: 1, high: 2}\n", "unknown parameters \\['warp'\\]"),
        ("backend: cpu\nops:\n  squash:\n    threads: {low: 1, high: 2}\n", "ops.squash"),
        ("backend: cpu\nops:\n  compress: {}\n", "lists no parameters"),
        ("backend: cpu\nops:\n  compress:\n    chunk_words: {low: 16, high: cores}\n", "only meaningful for threads"),
        ("backend: cpu\nops:\n  compress:\n    threads: {low: 1, high: 2, grid: [1, 5]}\n", "grid values \\[5\\]"),
        ("backend: cpu\nops:\n  compress:\n    threads: {low: 1, high: 2, step: 1}\n", "Extra inputs"),
        ("backend: cuda\nops:\n  compress:\n    compress_block: {low: 32, high: 2048, scale: pow2}\n", "within \\[32, 1024\\]"),
        ("backend: cuda\nops:\n  compress:\n    compress_block: {low: 32, high: 1024}\n", "scale: pow2"),
        ("backend: cuda\nops:\n  compress:\n    compress_grid: {low: 1, high: 100000, scale: log}\n", "within \\[1, 65535\\]"),
    ],
)
def test_bad_file_is_an_error_naming_the_file_and_problem(tmp_path: Path, text: str, problem: str) -> None:
    backend = "cuda" if "backend: cuda" in text else "cpu"
    path = _write(tmp_path, text, f"{backend}.yaml")
    with pytest.raises(SearchSpaceError, match=problem) as error:
        load_search_spaces(backend, path)
    assert str(path) in str(error.value)


def test_missing_file_and_wrong_backend_and_missing_op(tmp_path: Path) -> None:
    with pytest.raises(SearchSpaceError, match=r"cpu\.yaml does not exist.*CSWAP_SEARCH_SPACES"):
        load_search_spaces("cpu", tmp_path)
    path = _write(tmp_path, "backend: cuda\nops:\n  decompress:\n    decompress_block: {low: 32, high: 64, scale: pow2}\n")
    with pytest.raises(SearchSpaceError, match="is for backend 'cuda', expected 'cpu'"):
        load_search_spaces("cpu", path)
    cuda = _write(tmp_path, path.read_text(), "cuda.yaml")
    with pytest.raises(SearchSpaceError, match="has no ops.compress"):
        load_search_space("cuda", "compress", cuda)
    with pytest.raises(ValueError, match="choose one of cpu, cuda"):
        load_search_spaces("torch")
    with pytest.raises(ValueError, match="unknown op 'squash'"):
        load_search_space("cpu", "squash")


def test_project_contains_and_point_round_trip() -> None:
    space = load_search_space("cpu", "compress", cores=CORES)
    assert space.project({"threads": 99, "chunk_words": 3}) == {"threads": CORES, "chunk_words": 16}
    assert space.project({"chunk_words": 700}) == {"threads": 1, "chunk_words": 512}
    assert space.contains({"threads": 2, "chunk_words": 1024})
    assert not space.contains({"threads": 2, "chunk_words": 1000})
    assert not space.contains({"threads": 2})
    for params in space.grid_points():
        assert space.from_point(space.to_point(params)) == params
    dims = space.dimensions()
    assert [(d.low, d.high) for d in dims] == [(1, CORES), (4, 14)]


def test_log_scale_grid_and_constant_params() -> None:
    grid = Param("g", 3, 100, "log", ())
    assert grid.dimension().prior == "log-uniform"
    space = SearchSpace("cuda", "decompress", (Param("decompress_grid", 8, 8, "log", (8,)), Param("decompress_block", 32, 64, "pow2", (32, 64))))
    assert len(space.dimensions()) == 1
    assert space.from_point([6]) == {"decompress_grid": 8, "decompress_block": 64}
    loaded = load_search_space("cuda", "decompress").params[0].grid
    assert loaded[0] == 1 and loaded[-1] == 65535 and all(math.log2(v).is_integer() for v in loaded[:-1])
