"""The ``cswap`` command: one Typer app; each subcommand lives in ``cswap.commands.<name>``.

Example:
    $ cswap --help
    $ cswap demo
"""

from __future__ import annotations

import importlib

import typer

__all__ = ["app", "main"]

#: Subcommand modules, each exposing ``register(app: typer.Typer) -> None``.
COMMAND_MODULES: tuple[str, ...] = ("demo", "train", "max_batch", "serve", "configs", "simulate", "tune", "calibrate")

app = typer.Typer(
    name="cswap",
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
