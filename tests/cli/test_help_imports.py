"""``cswap --help`` imports only what printing the help needs: no pydantic, yaml, numpy or torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: Modules the help has no use for; each would cost start-up time on every ``cswap --help``.
HEAVY = ("pydantic", "yaml", "numpy", "torch", "scipy", "cswap.training.config", "cswap.budget", "cswap.planner")

#: Runs the console script's entry point with the given arguments in a fresh interpreter, then
#: prints every module it imported (the subcommands load through importlib, which ``-X importtime``
#: does not report).
_RUN = """
import sys
sys.argv = ["cswap", *sys.argv[1:]]
from cswap.cli import main
try:
    main()
except SystemExit as done:
    assert done.code in (0, None), done.code
print("\\n".join(sorted(sys.modules)), file=sys.stderr)
"""


def _imported(*args: str) -> set[str]:
    """The modules a fresh interpreter has imported once ``cswap ARGS`` is done."""
    done = subprocess.run([sys.executable, "-c", _RUN, *args], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stderr.split())


@pytest.mark.parametrize("args", [("--help",), ("train", "--help"), ("simulate", "--help")])
def test_help_imports_nothing_heavy(args: tuple[str, ...]) -> None:
    imported = _imported(*args)
    assert {"cswap.commands.train", "cswap.commands.simulate", "typer"} <= imported  # every command was registered
    # typer itself reads a subcommand's options through pydantic: only the bare group's help is without it
    heavy = HEAVY if args == ("--help",) else tuple(name for name in HEAVY if name != "pydantic")
    assert sorted(name for name in heavy if name in imported) == []
