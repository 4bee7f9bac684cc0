"""``cswap max-batch``'s table title: one line above the table, not squeezed into the table's width."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cswap.cli import app

pytest.importorskip("transformers")

ARGS = ["max-batch", "--model", "gpt2", "--seq-len", "128", "--layers", "2", "--memory-limit", "1GiB", "--policies", "none,swap"]


def test_the_title_is_one_line_above_the_table() -> None:
    runner = CliRunner(env={"COLUMNS": "250"})
    shown = runner.invoke(app, ARGS)
    assert shown.exit_code == 0, shown.output
    report = json.loads(runner.invoke(app, [*ARGS, "--json"]).output)
    title = (
        f"Largest gpt2 micro-batch of 128-token sequences in 1GiB (planned on meta traces, not run: "
        f"{report['parameters']:,} parameters with {report['optimizer']}, and a "
        f"{report['workspace_bytes'] / 2**30:.2f} GiB workspace counted)"
    )
    lines = shown.output.splitlines()
    assert lines[0] == title
    assert lines[1].startswith("┏") and "policy or strategy" in lines[2]
