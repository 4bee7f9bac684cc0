"""BENCHMARKS.md holds the current figures, not a diary of them (issue 39, item 13).

The page stays short, every result file it cites is there, every file under ``benchmarks/results/``
is cited by the page or read by code or tests, and no two sections share a heading (their anchors
would collide). Earlier measurements live in git history, not in the page or the results folder.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "BENCHMARKS.md"
RESULTS = ROOT / "benchmarks" / "results"
MAX_LINES = 1000

#: A result path as the page writes it; a template such as ``benchmarks/results/gpu-<date>`` or
#: ``cpu-$(date +%F)`` is not a path (the lookahead refuses a match cut short by ``<`` or ``$``).
_RESULT_PATH = re.compile(r"benchmarks/results/[\w.-]+(?:/[\w.-]+)*/?(?![\w<$-])")


def _page() -> str:
    return PAGE.read_text(encoding="utf-8")


def _code_and_docs() -> str:
    """The text of what may read a result file: tests, benchmark scripts, the package, the Makefile,
    the README and the docs (this test itself left out, as it names no result file)."""
    paths = [
        *(p for p in (ROOT / "tests").rglob("*.py") if p.resolve() != Path(__file__).resolve()),
        *(ROOT / "benchmarks").glob("*.py"),
        *(ROOT / "cswap").rglob("*.py"),
        ROOT / "Makefile",
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
    ]
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in paths if p.is_file())


def _headings(text: str) -> list[str]:
    """Markdown headings outside fenced code blocks, as written (without the leading hashes)."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced and re.match(r"#{1,6} ", line):
            found.append(line.lstrip("#").strip())
    return found


def test_the_page_is_at_most_1000_lines():
    lines = len(_page().splitlines())
    assert lines <= MAX_LINES, (
        f"BENCHMARKS.md has {lines} lines (at most {MAX_LINES}): keep the latest figure per question "
        "and leave the older ones to git history"
    )


def test_every_result_path_the_page_cites_exists():
    cited = {m.group(0).rstrip(".") for m in _RESULT_PATH.finditer(_page())}
    assert cited, "the page cites no result file: the pattern no longer matches how it writes them"
    missing = sorted(path for path in cited if not (ROOT / path).exists())
    assert not missing, f"BENCHMARKS.md cites result paths that do not exist: {missing}"


def test_every_result_file_is_cited_by_the_page_or_read_by_code():
    page, code = _page(), _code_and_docs()
    stray = []
    for path in sorted(p for p in RESULTS.rglob("*") if p.is_file()):
        rel = path.relative_to(ROOT).as_posix()
        if not any(needle in text for needle in (rel, path.name) for text in (page, code)):
            stray.append(rel)
    assert not stray, (
        f"result files neither cited by BENCHMARKS.md nor read by code or tests: {stray} "
        "(delete them: superseded measurements stay in git history)"
    )


def test_no_two_sections_share_a_heading():
    headings = _headings(_page())
    seen: dict[str, int] = {}
    for heading in headings:
        key = heading.casefold()
        seen[key] = seen.get(key, 0) + 1
    repeated = sorted(h for h, n in seen.items() if n > 1)
    assert not repeated, f"BENCHMARKS.md repeats these headings: {repeated}"
    assert len(headings) > 10, "found too few headings: the parser no longer matches the page"
