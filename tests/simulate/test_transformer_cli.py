"""``cswap simulate`` and ``cswap max-batch`` with transformers: presets, options, and errors naming the valid choices."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from cswap.cli import app

pytest.importorskip("transformers")

SMALL = ["--model", "gpt2", "--seq-len", "128", "--batch-size", "1", "--layers", "2", "--dtype", "bfloat16"]


def _flat(output: str) -> str:
    return " ".join(output.replace("│", " ").split())


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "250"})


def test_simulate_a_preset_shows_the_policies_table(runner) -> None:
    result = runner.invoke(app, ["simulate", *SMALL])
    assert result.exit_code == 0, result.output
    flat = _flat(result.output)
    assert "gpt2 batch 1 x 128 tokens, 2 layers, bfloat16, sdpa on v100-pcie3" in flat
    for policy in ("none", "swap", "cpu-compress-swap", "compress-swap", "cswap", "compress-keep"):
        assert f" {policy} " in flat


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_simulate_json_reports_the_transformer_shape(runner, attention) -> None:
    args = ["simulate", *SMALL, "--attention", attention, "--policies", "none,swap", "--hardware", "a100-pcie4", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["model"], report["seq_len"], report["num_layers"], report["attention"], report["dtype"]) == (
        "gpt2",
        128,
        2,
        attention,
        "bfloat16",
    )
    assert report["resolution"] is None and list(report["policies"]) == ["none", "swap"]
    assert report["policies"]["none"]["iteration_s"] > 0


def test_simulate_a_config_path_and_a_budget(runner, tmp_path) -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 256,
        "max_position_embeddings": 128,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = runner.invoke(
        app,
        [
            "simulate",
            "--model",
            str(path),
            "--seq-len",
            "32",
            "--memory-budget",
            "0.75",
            "--min-bytes",
            "0",
            "--policies",
            "swap",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (
        report["seq_len"] == 32
        and report["num_layers"] == 2
        and report["policies"]["swap"]["peak_bytes"] <= report["budget_bytes"]
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "llama-3-9b"], "unknown model 'llama-3-9b': choose one of alexnet"),
        (
            ["--model", "llama-3-9b"],
            "a transformer preset (bert-base, bert-large, gpt2, gpt2-xl, gpt3-175b-layer, llama-3-8b, llama-3.2-1b)",
        ),
        (["--model", "gpt2", "--attention", "flash"], "attention must be one of sdpa, eager, got 'flash'"),
        (["--model", "gpt2", "--seq-len", "4096"], "seq_len 4096 is longer than gpt2's 1024 positions"),
        (["--model", "vgg11", "--layers", "2"], "--layers apply to transformers; 'vgg11' is an image model"),
        (["--model", "hf:nosuch"], "unknown transformers model type 'nosuch'"),
    ],
)
def test_errors_name_the_valid_choices(runner, args, message) -> None:
    result = runner.invoke(app, ["simulate", "--layers", "1", *args] if "--layers" not in args else ["simulate", *args])
    assert result.exit_code == 2
    assert message in _flat(result.output)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the planned path without a GPU")
def test_max_batch_plans_a_transformer(runner) -> None:
    args = [
        "max-batch",
        "--model",
        "gpt2",
        "--seq-len",
        "64",
        "--layers",
        "2",
        "--memory-limit",
        "2GiB",
        "--policies",
        "none,swap",
    ]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["method"] == "planned" and report["optimizer"].startswith("AdamW")
    assert 0 < report["max_batch"]["none"] <= report["max_batch"]["swap"]
    table = runner.invoke(app, args)
    assert table.exit_code == 0 and "gpt2" in table.output and "AdamW" in _flat(table.output)


def test_max_batch_bad_transformer_name(runner) -> None:
    result = runner.invoke(app, ["max-batch", "--model", "gpt-5", "--seq-len", "64", "--memory-limit", "2GiB"])
    assert result.exit_code == 2
    assert "unknown model 'gpt-5'" in _flat(result.output) and "llama-3-8b" in _flat(result.output)
