"""``benchmarks/least_budgets.py`` measures what its table says: each least it states is one a fresh
run then holds, with plain PyTorch's gradients, and in bytes ``compress-keep`` needs no more than as
a fraction (its profile keeps what fits before it compresses)."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.scripts import load_benchmark

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("least_budgets")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_each_least_in_bytes_holds_and_is_no_more_than_as_a_fraction(bench: ModuleType, dtype: str) -> None:
    (row,) = bench.measure("llama", dtype, ["compress-keep"], 0.5, seq_len=64, batch=1)
    assert row["least_fraction_as_fraction"] is not None and row["least_fraction_in_bytes"] is not None
    assert 0.5 < row["least_fraction_in_bytes"] <= row["least_fraction_as_fraction"]
    assert row["held"] is True and row["peak_at_least_bytes"] <= row["least_bytes"]
    assert row["gradients_bit_identical"] is True
