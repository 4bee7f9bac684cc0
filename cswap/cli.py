"""The ``cswap`` command: one Typer app; each subcommand lives in ``cswap.commands.<name>``.

Example:
    $ cswap --help
    $ cswap demo
"""

from __future__ import annotations

import importlib
import sys
from typing import Any
from collections.abc import Sequence

import typer
from typer.core import TyperGroup

from cswap.commands import fail, one_line

__all__ = ["OneLineErrors", "app", "main"]


def _untyped_flags(command: Any, ctx: Any) -> None:
    """Give ``command``'s flags (``--json``, ``--help``) an empty metavar: typer's rich help would
    print ``<bool>`` after each, as if the flag took a value."""
    for param in command.get_params(ctx):
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""


class OneLineErrors(TyperGroup):
    """The ``cswap`` group: a flag the parser rejects is one ``error:`` line on stderr, exit 2, like every
    other bad input (typer would draw a framed panel over several lines).

    Example:
        >>> from typer.testing import CliRunner
        >>> result = CliRunner().invoke(app, ["train", "--epochs", "abc"])
        >>> result.exit_code, result.stderr.count("\\n"), result.stderr.startswith("error: Invalid value for '--epochs'")
        (2, 1, True)
    """

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _untyped_flags(command, ctx)
        return command

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _untyped_flags(self, ctx)
        super().format_help(ctx, formatter)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            outcome = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as error:
            if type(error).__name__ == "NoArgsIsHelpError":  # a bare group: its help, not an error
                error.show()
                sys.exit(error.exit_code)
            ctx = getattr(error, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            raise SystemExit(fail(f"{one_line(error.format_message())}{hint}", getattr(error, "exit_code", 2)).exit_code) from None
        # Without standalone mode typer returns an Exit's status instead of exiting with it.
        sys.exit(outcome if isinstance(outcome, int) else 0)

#: Subcommand modules, each exposing ``register(app: typer.Typer) -> None``.
COMMAND_MODULES: tuple[str, ...] = ("demo", "train", "max_batch", "serve", "configs", "simulate", "tune", "calibrate")

app = typer.Typer(
    name="cswap",
    cls=OneLineErrors,
    help="A self-tuning compressed-swap runtime for PyTorch training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)



@app.callback()
def _root() -> None:
    """A self-tuning compressed-swap runtime for PyTorch training."""


for _name in COMMAND_MODULES:
    importlib.import_module(f"cswap.commands.{_name}").register(app)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
