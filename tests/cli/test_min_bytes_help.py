"""What ``min_bytes`` means, as its three help texts say it: without a budget tensors below it stay
on the device; under a budget it binds nothing, small copies priced with a fixed latency."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from cswap.cli import app
from cswap.options import RuntimeOptions
from cswap.training.config import TrainConfig


def _flat(text: str | None) -> str:
    return " ".join((text or "").replace("│", " ").split())


def test_every_min_bytes_help_says_a_budget_unbinds_it() -> None:
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    texts = {
        "cswap train --help": _flat(result.output),
        "RuntimeOptions": _flat(RuntimeOptions.__doc__),
        "TrainConfig": _flat(TrainConfig.__doc__),
    }
    for where, text in texts.items():
        assert re.search(r"[Ww]ithout (a memory budget|--memory-budget), (saved )?tensors (below|smaller than) (it|this)", text), where
        assert re.search(r"under (a budget|one) it binds nothing", text, re.IGNORECASE), where
        assert "cswap.planner.costmodel.COPY_LATENCY_S" in text, where
