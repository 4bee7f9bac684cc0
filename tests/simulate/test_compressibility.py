"""The simulator's compressibility profile: loaded with its source, refused when malformed, applied
to a meta trace by kind (masks, attention probabilities, upcasts, activations), and priced by the
policies so that the codecs besides ZVC lower what compressing policies need."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from cswap.simulate.compressibility import Compressibility, compressibility_names, load_compressibility
from cswap.simulate.hardware import load_hardware
from cswap.simulate.metatrace import SparsityModel, run_on_meta

SHIPPED = load_compressibility("all-minilm-l6-v2")


def test_the_shipped_profile_says_what_it_measured() -> None:
    assert "all-minilm-l6-v2" in compressibility_names()
    assert "trained weights" in SHIPPED.source and SHIPPED.date
    assert SHIPPED.codec_of("bool", "mask") == ("bitpack", 0.125)
    codec, fraction = SHIPPED.codec_of("bfloat16", "activation")
    assert codec == "exponent" and 0.65 < fraction < 0.77  # the 1.36x measured on the trained MiniLM
    assert SHIPPED.codec_of("float32", "upcast")[1] < 0.4  # zero low halves
    assert SHIPPED.codec_of("int64", "activation") is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("fractions: {weights: {bfloat16: 0.7}}", "kind 'weights' is not one of"),
        ("fractions: {activation: {int64: 0.7}}", "no codec besides ZVC takes it"),
        ("fractions: {activation: {bfloat16: 0}}", "a fraction of the raw bytes in (0, 2]"),
    ],
)
def test_a_malformed_profile_is_refused_naming_the_file(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=str(path)) as raised:
        load_compressibility(path)
    assert problem in str(raised.value)


def test_an_unknown_name_lists_the_shipped_ones() -> None:
    with pytest.raises(ValueError, match="choose one of .*all-minilm-l6-v2"):
        load_compressibility("no-such-profile")


class _Block(nn.Module):
    """A bf16 block that saves an activation, a dropout mask, attention probabilities and an upcast."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.proj(x))
        probs = torch.softmax(h @ h.transpose(1, 2), dim=-1)
        mixed = torch.native_dropout(probs, 0.1, True)[0] @ h
        return mixed.float().pow(2).sum()


def _records(compressibility: Compressibility | None) -> list:
    model = _Block().to("meta")
    x = torch.empty(2, 4, 16, device="meta", dtype=torch.bfloat16)
    run = run_on_meta(model, lambda m: m(x), load_hardware("h100-pcie5"), SparsityModel(compressibility=compressibility))
    return [r for r in run.records if r.offloadable]


def test_a_meta_trace_takes_each_tensors_compressibility_by_kind() -> None:
    records = _records(SHIPPED)
    by_kind = {(r.dtype, r.codec, r.codec_fraction) for r in records}
    assert ("bool", "bitpack", 0.125) in by_kind
    assert ("bfloat16", "exponent", SHIPPED.codec_of("bfloat16", "activation")[1]) in by_kind
    assert ("bfloat16", "exponent", SHIPPED.codec_of("bfloat16", "attention_probabilities")[1]) in by_kind
    assert ("float32", "exponent", SHIPPED.codec_of("float32", "upcast")[1]) in by_kind
    assert all(r.codec is None for r in _records(None))


def test_compress_keep_needs_less_with_the_profile_than_with_zvc_alone() -> None:
    from cswap.commands.simulate import run_simulate

    def least(compressibility: str) -> float:
        report = run_simulate(model="gpt2", policies="compress-keep", memory_budget="0.05", compressibility=compressibility,
                              num_layers=2, seq_len=64)
        return report["policies"]["compress-keep"]["minimum_bytes"]

    # What the codecs shrink is the activations; the parameters and the tensors held raw at their pack stay.
    assert least("all-minilm-l6-v2") < 0.97 * least("none")
