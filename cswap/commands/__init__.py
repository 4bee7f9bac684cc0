"""Subcommands of the ``cswap`` command line, one module each (see :mod:`cswap.cli`).

Every subcommand reports errors and warnings the same way, through the helpers here: one line on
stderr, ``error: ...`` or ``warning: ...``, printed as plain text (user text such as ``[/x]`` is
never read as rich markup), and exit code 2 for bad input.

Example:
    >>> one_line("recipe x.yaml is not valid YAML:\\n  in line 1\\n    [a")
    'recipe x.yaml is not valid YAML: in line 1 [a'
"""

from __future__ import annotations

import contextlib
import warnings
from typing import TextIO
from collections.abc import Iterator

import typer

__all__ = ["BAD_INPUT", "fail", "one_line", "warn", "warnings_as_lines"]

#: Exit status for input the user can fix (a bad flag, recipe, model name or URL).
BAD_INPUT = 2


def one_line(text: object) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed to one space.

    Example:
        >>> one_line("a\\n   b ")
        'a b'
    """
    return " ".join(str(text).split())


def fail(message: object, code: int = BAD_INPUT) -> typer.Exit:
    """Print ``error: MESSAGE`` as one plain line on stderr; return the :class:`typer.Exit` to raise.

    Args:
        message: what went wrong and how to fix it (an exception or a string).
        code: the exit status (2, :data:`BAD_INPUT`, for input the user can fix).

    Example:
        >>> exit_ = fail("no model '[/x]'")  # prints "error: no model '[/x]'" on stderr
        >>> exit_.exit_code
        2
    """
    typer.echo(f"error: {one_line(message)}", err=True)
    return typer.Exit(code)


def warn(message: object) -> None:
    """Print ``warning: MESSAGE`` as one plain line on stderr.

    Example:
        >>> warn("the tuning service is down")  # prints "warning: the tuning service is down" on stderr
    """
    typer.echo(f"warning: {one_line(message)}", err=True)


@contextlib.contextmanager
def warnings_as_lines() -> Iterator[None]:
    """Within the block, Python warnings print through :func:`warn` (no category, no source line).

    Each distinct warning still prints once per location, as Python's default filter does.

    Example:
        >>> with warnings_as_lines():
        ...     warnings.warn("slow link")  # prints "warning: slow link" on stderr
    """

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        warn(message)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield
