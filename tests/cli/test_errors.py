"""Every command reports bad input the same way: one plain line on stderr, exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cswap.cli import app
from cswap.training.config import shipped_recipes

runner = CliRunner()


def _error_line(result) -> str:
    """The single ``error: ...`` line of a failed command (and nothing on stdout)."""
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def _train(tmp_path: Path, *args: str):
    return runner.invoke(app, ["train", *args, "--report", str(tmp_path / "r.json"), "--no-progress"],
                         env={"COLUMNS": "80"})


def test_markup_closing_tag_in_a_model_name_is_printed_as_given(tmp_path: Path) -> None:
    line = _error_line(_train(tmp_path, "--model", "[/x]"))
    assert "'[/x]'" in line and "vgg16" in line


def test_markup_in_a_dataset_name_keeps_its_text(tmp_path: Path) -> None:
    line = _error_line(_train(tmp_path, "--dataset", "[bold]nope"))
    assert "[bold]nope" in line and "digits" in line


def test_malformed_yaml_excerpt_keeps_its_brackets(tmp_path: Path) -> None:
    recipe = tmp_path / "broken.yaml"
    recipe.write_text("model: vgg11\nepochs: [1, 2\n")
    line = _error_line(_train(tmp_path, "--config", str(recipe)))
    assert "broken.yaml is not valid YAML" in line and "epochs: [1, 2" in line


def test_unknown_recipe_name_is_printed_as_typed_with_the_shipped_ones(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    line = _error_line(_train(tmp_path, "--config", "nonexistent-recipe"))
    assert "PosixPath" not in line
    assert "'nonexistent-recipe'" in line and ", ".join(shipped_recipes()) in line


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--model", "vgg17", "--no-progress"], "vgg17"),
        (["tune", "--backend", "cpu", "--method", "anneal"], "unknown method 'anneal'"),
        (["tune", "--backend", "cpu", "--sizes", "4XB"], "not a byte count"),
        (["calibrate", "--backend", "tpu", "--quick"], "unknown backend 'tpu'"),
        (["simulate", "--hardware", "[nope]"], "unknown hardware '[nope]'"),
        (["configs", "show", "zzzz"], "no device key starting with 'zzzz'"),
        (["configs", "push", "--tuner-url", "localhost:8765"], "must look like http://HOST:PORT"),
        (["serve", "--host", "0.0.0.0"], "refusing to serve on 0.0.0.0"),
        (["demo", "--backend", "[bogus]"], "unknown backend '[bogus]'"),
    ],
    ids=lambda value: value[0] if isinstance(value, list) else None,
)
def test_every_command_reports_bad_input_on_one_stderr_line(tmp_path: Path, args: list[str], message: str) -> None:
    env = {"CSWAP_HOME": str(tmp_path / "home"), "CSWAP_SERVER_TOKEN": "", "COLUMNS": "80"}
    line = _error_line(runner.invoke(app, args, env=env))
    assert message in line


def test_max_batch_without_a_gpu_and_a_limit_is_one_stderr_line() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the message on a machine without a GPU")
    line = _error_line(runner.invoke(app, ["max-batch", "--model", "resnet50"], env={"COLUMNS": "80"}))
    assert "planned, not measured: give --memory-limit" in line


@pytest.mark.parametrize("url", ["not-a-url", "http://[::1", "ftp://127.0.0.1:8765", "http://", "http://h:99999",
                                 "http://a b:80"])
@pytest.mark.parametrize("tune", [None, "cached"])
def test_a_bad_tuner_url_is_one_line_before_anything_runs(tmp_path: Path, url: str, tune: str | None) -> None:
    args = ["--tuner-url", url] + (["--tune", tune] if tune else [])
    line = _error_line(_train(tmp_path, *args))
    assert repr(url) in line and "http://HOST:PORT" in line
    assert not (tmp_path / "r.json").exists()


def test_tuner_url_with_tune_off_says_it_would_do_nothing(tmp_path: Path) -> None:
    line = _error_line(_train(tmp_path, "--tuner-url", "http://127.0.0.1:8765", "--tune", "off"))
    assert "no effect with tune 'off'" in line and "--tune cached" in line


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--epochs", "abc"], "Invalid value for '--epochs'"),
        (["train", "--bogus"], "No such option: --bogus"),
        (["simulate", "--batch-size", "0"], "Invalid value for '--batch-size'"),
        (["nosuch"], "No such command 'nosuch'"),
    ],
    ids=["bad-int", "unknown-flag", "out-of-range", "unknown-command"],
)
def test_flags_the_parser_rejects_are_one_stderr_line(args: list[str], message: str) -> None:
    line = _error_line(runner.invoke(app, args, env={"COLUMNS": "80"}))
    assert message in line and "--help`" in line
