"""docs/codecs.md's example runs as written and prints the ratios it says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "codecs.md"


def test_the_pages_example_runs_and_prints_its_ratios() -> None:
    block = re.search(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert block, "docs/codecs.md lost its example"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block.group(1), str(PAGE), "exec"), {})
    ratios = dict(line.split() for line in printed.getvalue().splitlines())
    assert float(ratios["bitpack"]) == 8.0
    assert 1.35 <= float(ratios["exponent"]) <= 1.45
