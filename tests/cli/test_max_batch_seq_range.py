"""``cswap max-batch`` with several sequence lengths: the longest binds, and each policy's plan for
it is simulated at every length."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cswap.cli import app

pytest.importorskip("transformers")

ARGS = ["max-batch", "--model", "gpt2", "--layers", "2", "--memory-limit", "2GiB", "--policies", "none,swap,ac-full"]


def _flat(output: str) -> str:
    return " ".join(output.replace("│", " ").split())


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "250"})


@pytest.fixture(scope="module")
def reports(runner) -> dict[str, dict]:
    found = {}
    for seq_len in ("32-128", "128"):
        result = runner.invoke(app, [*ARGS, "--seq-len", seq_len, "--json"])
        assert result.exit_code == 0, result.output
        found[seq_len] = json.loads(result.output)
    return found


def test_the_longest_length_binds(reports) -> None:
    ranged, single = reports["32-128"], reports["128"]
    assert ranged["max_batch"] == single["max_batch"] and ranged["seq_len"] == 128
    assert "lengths" not in single and "seq_lens" not in single
    assert {k: v for k, v in ranged.items() if k not in ("lengths", "seq_lens")} == single


def test_every_length_has_each_policys_time(reports) -> None:
    ranged = reports["32-128"]
    assert ranged["seq_lens"] == {
        "given": "32-128",
        "lengths": [32, 64, 128],
        "picked": "the range's ends and the powers of two between",
        "served_by": 128,
    }
    assert [row["seq_len"] for row in ranged["lengths"]] == [32, 64, 128]
    for row in ranged["lengths"]:
        assert set(row["iteration_s"]) == set(ranged["max_batch"])
        assert all(seconds > 0 for seconds in row["iteration_s"].values()), row
    for name in ranged["max_batch"]:  # shorter sequences at the same batch take less time
        times = [row["iteration_s"][name] for row in ranged["lengths"]]
        assert times == sorted(times), (name, times)


def test_the_table_has_a_column_per_length(runner) -> None:
    result = runner.invoke(app, [*ARGS, "--seq-len", "32,128"])
    assert result.exit_code == 0, result.output
    flat = _flat(result.output)
    assert "ms at 32" in flat and "ms at 128" in flat and "each policy's plan for 128 tokens at its batch" in flat


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "gpt2", "--seq-len", "512-128"], "a range goes from the shortest length to the longest, e.g. 128-512"),
        (["--model", "gpt2", "--seq-len", "abc"], "--seq-len 'abc' is not a length"),
        (["--model", "resnet50", "--seq-len", "128,256"], "which only a transformer model has; 'resnet50' is not one"),
    ],
)
def test_bad_lengths_are_refused(runner, args, message) -> None:
    result = runner.invoke(app, ["max-batch", *args, "--memory-limit", "2GiB"])
    assert result.exit_code == 2, result.output
    assert message in _flat(result.output)
