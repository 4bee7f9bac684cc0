"""``cswap max-batch``: the search, size parsing, and the message on a machine without a GPU."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from cswap.cli import app
from cswap.maxbatch import largest_fitting, parse_bytes


@pytest.mark.parametrize("limit", [1, 2, 3, 37, 64, 100, 1000])
def test_search_finds_the_largest_fitting_batch(limit: int) -> None:
    tried: list[int] = []

    def fits(batch: int) -> bool:
        tried.append(batch)
        return batch <= limit

    assert largest_fitting(fits, ceiling=4096) == limit
    assert len(tried) <= 2 * limit.bit_length() + 2


def test_search_respects_the_ceiling_and_reports_zero() -> None:
    assert largest_fitting(lambda b: True, ceiling=100) == 100
    assert largest_fitting(lambda b: False) == 0


@pytest.mark.parametrize("text, nbytes", [("16GiB", 16 << 30), ("12GB", 12 * 10**9), ("512 MiB", 512 << 20), ("100", 100)])
def test_parse_bytes(text: str, nbytes: int) -> None:
    assert parse_bytes(text) == nbytes


def test_parse_bytes_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="16GiB"):
        parse_bytes("sixteen gigs")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cpu_says_it_needs_a_gpu() -> None:
    result = CliRunner().invoke(app, ["max-batch", "--model", "resnet50"])
    assert result.exit_code == 2
    assert "needs a GPU" in result.output
