"""The help texts and the README explain what the tables show."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cswap.cli import app

README = Path(__file__).resolve().parents[2] / "README.md"


def _help(command: str) -> str:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.replace("│", " ").split())


def _command_line_section() -> str:
    text = README.read_text()
    section = text[text.index("## The command line"):]
    return " ".join(section[: section.index("\n## ", 3)].split())


@pytest.mark.parametrize(
    "command, phrases",
    [
        ("calibrate", ["knees", "cost per byte steps up", "MAPE"]),
        ("simulate", ['"formula ms"', "prices each tensor alone", '"ranked N/M"',
                      "cpu-compress-swap (vDNN++", "host CPU compresses", "128-1024", '"x own"']),
        ("max-batch", ["128-1024", '"ms at N"']),
    ],
)
def test_help_explains_the_columns_and_policies(command: str, phrases: list[str]) -> None:
    shown = _help(command)
    for phrase in phrases:
        assert phrase in shown, phrase


@pytest.mark.parametrize("phrase", ['"knees"', '"formula ms"', '"ranked N/M"', "`cpu-compress-swap` (vDNN++",
                                    "host CPU compresses", "progress bar"])
def test_readme_command_line_section_explains_them(phrase: str) -> None:
    assert phrase in _command_line_section()


@pytest.mark.parametrize("command", ["train", "simulate", "max-batch", "calibrate", "tune", "configs", "demo", "serve", None])
def test_flags_show_no_value_type_and_options_do(command: str | None) -> None:
    args = [command, "--help"] if command else ["--help"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output  # a flag takes no value
    if command == "train":
        assert "<int>" in result.output  # --epochs does


@pytest.mark.parametrize("command", ["train", "simulate", "max-batch", "calibrate", "tune", "configs", "demo", "serve"])
def test_help_has_no_space_before_a_period(command: str) -> None:
    """rich reads ``[default: ...]`` in a help text as markup and drops it, leaving "iteration ." behind."""
    shown = _help(command).replace(" ...", "").replace(" .yaml", "")
    assert " ." not in shown, shown[max(shown.find(" .") - 60, 0):shown.find(" .") + 20]


def test_each_command_is_summed_up_in_whole_sentences() -> None:
    """``cswap --help`` lists each command by the first paragraph of its help, line breaks kept:
    a summary spread over several source lines shows cut at the first (``... planned without one (a``)."""
    import inspect

    import typer.main

    group = typer.main.get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        summary = inspect.cleandoc(command.help or "").split("\n\n")[0]
        assert "\n" not in summary and summary.endswith("."), (name, summary)
