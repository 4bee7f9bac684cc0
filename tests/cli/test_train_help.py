"""``cswap train --help`` shows the default of every option."""

from __future__ import annotations

import re

import typer.main
from typer.testing import CliRunner

from cswap.cli import app
from cswap.training.config import TrainConfig


def _help_text() -> str:
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.replace("│", " ").split())


def test_every_train_option_shows_its_default() -> None:
    command = typer.main.get_command(app).commands["train"]
    options = [p for p in command.params if p.name != "help"]
    text = _help_text()
    assert len(re.findall(r"\[default: ", text)) == len(options)


def test_train_help_shows_the_config_defaults_that_apply() -> None:
    text = _help_text()
    for name in ("model", "dataset", "epochs", "batch_size", "lr", "policy", "tune", "tune_budget", "device", "seed"):
        default = TrainConfig.model_fields[name].default
        assert f"[default: ({default})]" in text, name
    assert "[default: (beside the report)]" in text and "[default: (all)]" in text


def test_train_help_lists_every_runtime_policy() -> None:
    from cswap.planner.actions import RUNTIME_POLICIES

    command = typer.main.get_command(app).commands["train"]
    policy = next(p for p in command.params if p.name == "policy")
    listed = policy.help.rstrip(".").split(" | ")
    assert sorted(listed) == sorted(RUNTIME_POLICIES)
