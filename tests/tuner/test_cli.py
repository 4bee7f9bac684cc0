"""``cswap tune`` through Typer's test runner: JSON keys, store hits, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cswap.cli import app

runner = CliRunner()
TINY = ["--backend", "cpu", "--sizes", "16KiB", "--repeats", "1"]


def tune(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["tune", *args])
    return result.exit_code, result.stdout, result.stderr


def test_json_has_the_required_keys_and_a_second_run_is_a_store_hit(tmp_path: Path) -> None:
    store = str(tmp_path / "store.db")
    code, out, err = tune(*TINY, "--json", "--budget", "3", "--store", store)
    assert code == 0, err
    report = json.loads(out)
    assert {"method", "backend", "best_params", "best_time_s", "evaluations", "wall_s", "match", "store_hit"} <= set(report)
    labels = ["zvc.cpu.compress/float32/16KiB", "zvc.cpu.decompress/float32/16KiB"]
    assert (report["method"], report["backend"], report["evaluations"], report["store_hit"]) == ("bo", "cpu", 6, False)
    assert sorted(report["best_params"]) == labels and set(report["best_params"][labels[0]]) == {"threads", "chunk_words"}
    assert all(r["evaluations"] == 3 and r["method"] == "bo" and r["match"] == "default" for r in report["results"])
    assert [r["best_time_s"] for r in report["results"]] == [report["best_time_s"][label] for label in labels]
    assert {(r["published"], r["publication"]) for r in report["results"]} == {(False, "local")}

    code, out, err = tune(*TINY, "--json", "--budget", "3", "--store", store)
    again = json.loads(out)
    assert code == 0 and again["evaluations"] == 0 and again["store_hit"] is True
    assert again["best_params"] == report["best_params"] and set(again["match"].values()) == {"exact"}
    assert {(r["published"], r["publication"]) for r in again["results"]} == {(False, "none")}

    code, out, _ = tune(*TINY, "--store", store, "--op", "compress")
    assert code == 0 and "store hit: 1 of 1 kernel configs" in " ".join(out.split())
    assert "zero evaluations" in " ".join(out.split())


def test_force_and_several_sizes(tmp_path: Path) -> None:
    store = str(tmp_path / "store.db")
    args = ["--backend", "cpu", "--repeats", "1", "--json", "--store", store, "--op", "decompress", "--method", "expert"]
    code, out, err = tune(*args, "--sizes", "4KiB,64KiB", "--dtype", "float16")
    assert code == 0, err
    report = json.loads(out)
    assert [(r["bucket"], r["dtype"], r["evaluations"]) for r in report["results"]] == [(6, "float16", 1), (8, "float16", 1)]
    code, out, _ = tune(*args, "--sizes", "4KiB", "--dtype", "float16", "--force")
    assert code == 0 and json.loads(out)["evaluations"] == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path: Path) -> None:
    code, _, err = tune("--backend", "cuda", "--store", str(tmp_path / "s.db"))
    assert code == 1 and "torch sees no GPU" in err and "--backend cpu" in err


def test_corrupt_store_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    path.write_bytes(b"this is not an sqlite database, it is a text file" * 100)
    code, _, err = tune(*TINY, "--store", str(path))
    assert code == 1 and str(path) in err and "not a readable cswap store" in err
    assert path.read_bytes().startswith(b"this is not")  # left untouched


def test_malformed_search_space_is_a_clear_error(tmp_path: Path) -> None:
    space = tmp_path / "cpu.yaml"
    space.write_text("backend: cpu\nops:\n  compress:\n    threads: {low: 4, high: 1}\n")
    code, _, err = tune(*TINY, "--space", str(space), "--store", str(tmp_path / "s.db"))
    assert code == 2 and str(space) in err and "low 4 is above high 1" in err


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--sizes", "4XB"], 2, "not a byte count"),
        (["--method", "anneal"], 2, "unknown method 'anneal'"),
        (["--op", "squash"], 2, "unknown op 'squash'"),
        (["--dtype", "complex64"], 2, "unsupported dtype 'complex64'"),
        (["--budget", "0"], 2, "give at least 1 evaluation"),
    ],
)
def test_bad_options(tmp_path: Path, args: list[str], code: int, message: str) -> None:
    exit_code, _, err = tune("--backend", "cpu", "--store", str(tmp_path / "s.db"), *args)
    assert exit_code == code and message in " ".join(err.split())


def test_tuner_url_publishes_runs_and_serves_them_to_a_fresh_machine(tmp_path: Path) -> None:
    from cswap.server.app import create_app
    from tests.server.helpers import serve_in_thread
    from cswap.tuner.store import ConfigStore

    service_store = ConfigStore(tmp_path / "service.db")
    with serve_in_thread(create_app(service_store)) as url:
        args = [*TINY, "--op", "compress", "--budget", "2", "--json", "--tuner-url", url]
        code, out, err = tune(*args, "--store", str(tmp_path / "first.db"))
        assert code == 0, err
        first = json.loads(out)
        (result,) = first["results"]
        assert result["published"] is True and result["publication"] == "published" and result["evaluations"] == 2
        assert service_store.run(result["run_id"]) is not None

        code, out, err = tune(*args, "--store", str(tmp_path / "fresh.db"))
        assert code == 0, err
        fresh = json.loads(out)
        assert fresh["store_hit"] is True and fresh["evaluations"] == 0
        assert fresh["best_params"] == first["best_params"]
