"""``cswap demo``: every layer's activations round-trip, and its timings exclude the codec's warm-up."""

from __future__ import annotations

import pytest
import torch
from rich.console import Console

import cswap.codecs.api
import cswap.commands.demo as demo


def test_each_layer_is_compressed_once_untimed_before_it_is_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_compress = cswap.codecs.api.compress
    ticks = iter(range(1000))

    def compress(tensor: torch.Tensor, **kwargs):
        events.append("compress")
        return real_compress(tensor, **kwargs)

    def clock() -> float:
        events.append("clock")
        return float(next(ticks))

    monkeypatch.setattr(cswap.codecs.api, "compress", compress)  # the demo loads the codecs when it runs
    rows = demo.run_demo(batch_size=4, backend="cpu", console=Console(quiet=True), clock=clock)
    assert len(rows) == 12
    # per layer: an untimed warm-up call, then three timed calls, each between two clock readings
    assert events == (["compress"] + ["clock", "compress", "clock"] * 3) * len(rows)
    assert [row["compress_s"] for row in rows] == [1.0] * len(rows)
    relu = rows[1]
    assert relu["layer"] == "1:ReLU" and relu["sparsity"] > 0 and relu["ratio"] > 1
