"""``cswap max-batch``: the search, size parsing, and the message on a machine without a GPU."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from cswap.cli import app
from cswap.training.maxbatch import largest_fitting, parse_bytes


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
def test_cpu_without_a_limit_says_it_plans_and_needs_one() -> None:
    result = CliRunner().invoke(app, ["max-batch", "--model", "resnet50"])
    assert result.exit_code == 2
    assert "without a GPU the batch is planned, not measured: give --memory-limit" in " ".join(result.output.split())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the planned path runs where there is no GPU")
def test_cli_plans_without_a_gpu() -> None:
    import json

    args = ["max-batch", "--model", "vgg11", "--resolution", "32", "--memory-limit", "2GiB", "--policies", "none,swap"]
    result = CliRunner(env={"COLUMNS": "250"}).invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["method"] == "planned" and report["optimizer"] == "SGD with momentum"
    assert 0 < report["max_batch"]["none"] <= report["max_batch"]["swap"]
    table = CliRunner(env={"COLUMNS": "250"}).invoke(app, args)
    assert table.exit_code == 0 and "planned on meta traces, not run" in " ".join(table.output.split())
    missing = CliRunner().invoke(app, ["max-batch", "--model", "vgg11"])
    assert missing.exit_code == 2 and "give --memory-limit" in " ".join(missing.output.split())


@pytest.fixture(scope="module")
def planned_batches():
    from cswap.training.maxbatch import planned_max_batch

    limits = (128 * 2**20, 144 * 2**20)  # the weights, gradients and momentum take 104 MiB
    return {
        limit: planned_max_batch("vgg11", ("none", "swap", "cswap"), limit, resolution=32, width_mult=0.25, ceiling=512).batches
        for limit in limits
    }


def test_planned_batch_is_monotone_in_the_limit_and_in_the_actions(planned_batches) -> None:
    small, large = (planned_batches[limit] for limit in sorted(planned_batches))
    for batches in (small, large):
        assert 0 < batches["none"] <= batches["swap"] <= batches["cswap"], batches
    assert small["none"] < large["none"] and all(small[p] <= large[p] for p in small)
    assert large["cswap"] > large["none"]


def test_planned_rejects_bad_settings() -> None:
    from cswap.training.maxbatch import planned_max_batch

    with pytest.raises(ValueError, match="memory limit must be positive"):
        planned_max_batch("vgg11", ("none",), 0)
    with pytest.raises(ValueError, match="cannot be planned: choose from none"):
        planned_max_batch("vgg11", ("vdnn",), 2**30)
    with pytest.raises(ValueError, match="workspace_fraction must be in"):
        planned_max_batch("vgg11", ("none",), 2**30, workspace_fraction=1.5)


# A two-layer GPT-2 of 128-token sequences: its state (53.6 M parameters, 12 bytes each: 0.60 GiB)
# leaves room for a few dozen sequences in 1.25 GiB.
LM = dict(seq_len=128, num_layers=2, dtype="bfloat16", attention="sdpa")
LM_LIMIT = 5 * 2**28


@pytest.fixture(scope="module")
def lm_batches():
    from cswap.training.maxbatch import planned_max_batch_transformer

    return planned_max_batch_transformer("gpt2", ("none", "swap", "ac-full", "offload-all"), LM_LIMIT, ceiling=256, **LM)


def test_strategies_get_a_largest_micro_batch_with_the_policies_accounting(lm_batches) -> None:
    batches = lm_batches.batches
    assert list(batches) == ["none", "swap", "ac-full", "offload-all"]
    assert 0 < batches["none"] < batches["ac-full"], batches  # checkpointing every layer fits more
    assert batches["none"] < batches["offload-all"] <= batches["swap"], batches
    assert lm_batches.skipped == {}


@pytest.mark.parametrize("strategy", ["ac-full", "offload-all"])
def test_a_strategys_largest_batch_is_the_last_whose_simulated_peak_fits(lm_batches, strategy: str) -> None:
    from cswap.simulate import SimConfig, Simulator
    from cswap.simulate.modeltrace import trace_model
    from cswap.simulate.strategies import Strategies

    def left(batch: int) -> int:  # what the limit leaves the activations: the search's own arithmetic
        return LM_LIMIT - lm_batches.state_bytes - lm_batches.workspace_bytes - 2 * batch * LM["seq_len"] * 8

    def peak(batch: int) -> int:
        trace = trace_model("gpt2", batch, "a100-pcie4", **LM)
        return Strategies(Simulator(trace, "a100-pcie4", SimConfig())).result(strategy).peak_bytes

    largest = lm_batches.batches[strategy]
    assert peak(largest) <= left(largest) and peak(largest + 1) > left(largest + 1)
    assert lm_batches.minimum_bytes[strategy][largest] == peak(largest)


def test_all_takes_the_strategies_a_model_can_run_and_says_why_not_the_others() -> None:
    from cswap.planner import POLICY_ACTIONS
    from cswap.training.maxbatch import planned_max_batch

    result = planned_max_batch("vgg11", ("all",), 144 * 2**20, resolution=32, width_mult=0.25, ceiling=512)
    assert list(result.batches) == [*POLICY_ACTIONS, "offload-all", "recompute-knapsack", "ilp-kro"]
    assert set(result.skipped) == {"ac-full", "ac-selective", "offload-all+ac", "megatron-offload"}
    assert "no transformer layers" in result.skipped["ac-full"] and result.to_dict()["skipped"] == result.skipped
    assert result.batches["none"] < result.batches["offload-all"] <= result.batches["swap"]
    with pytest.raises(ValueError, match="strategy 'ac-full' cannot run on this model: the trace has no transformer layers"):
        planned_max_batch("vgg11", ("none", "ac-full"), 144 * 2**20, resolution=32, width_mult=0.25, ceiling=512)


def test_cli_lists_strategies_beside_policies_for_a_transformer() -> None:
    import json

    args = ["max-batch", "--model", "gpt2", "--layers", "1", "--seq-len", "64", "--memory-limit", "1GiB"]
    result = CliRunner().invoke(app, [*args, "--policies", "none,ac-full,recompute-knapsack", "--json"])
    assert result.exit_code == 0, result.output
    batches = json.loads(result.output)["max_batch"]
    assert list(batches) == ["none", "ac-full", "recompute-knapsack"] and 0 < batches["none"] <= batches["ac-full"]
    unknown = CliRunner().invoke(app, [*args, "--policies", "none,ac-ful"])
    assert unknown.exit_code == 2 and "the strategies ac-full" in " ".join(unknown.output.split())


def test_a_transformers_activations_compress_as_the_trained_profile_says() -> None:
    """ZVC finds no zeros in bf16 GPT-2's activations; exponent coding, as measured on a trained
    transformer, takes a quarter off: compress-keep fits more sequences with it, none the same."""
    from cswap.training.maxbatch import planned_max_batch_transformer

    found = {c: planned_max_batch_transformer("gpt2", ("none", "compress-keep"), LM_LIMIT, ceiling=256, compressibility=c, **LM)
             for c in ("none", "all-minilm-l6-v2")}
    zvc, coded = found["none"].batches, found["all-minilm-l6-v2"].batches
    assert zvc["none"] == coded["none"] and zvc["compress-keep"] == zvc["none"] < coded["compress-keep"], (zvc, coded)
    # the GPT-2 head's float32 logits, which no codec shrinks much, leave little more room: the least
    # budget shows the codec's effect
    batch = max(set(found["none"].minimum_bytes["compress-keep"]) & set(found["all-minilm-l6-v2"].minimum_bytes["compress-keep"]))
    least = {c: found[c].minimum_bytes["compress-keep"][batch] for c in found}
    assert least["all-minilm-l6-v2"] <= 0.93 * least["none"], least
    with pytest.raises(ValueError, match="unknown compressibility profile 'minilm'"):
        planned_max_batch_transformer("gpt2", ("none",), LM_LIMIT, compressibility="minilm", **LM)
