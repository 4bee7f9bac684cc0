"""Several sequence lengths served by the longest length's plan: ``--seq-len`` ranges and lists,
the structure check, :func:`cswap.simulate.seqlens.serve_plan`, and ``cswap simulate`` with them."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cswap.cli import app
from cswap.simulate import Simulator
from cswap.simulate.seqlens import MOST_PICKED, check_same_structure, parse_seq_lens, pick_lengths, serve_plan

pytest.importorskip("transformers")

SMALL = ["--model", "gpt2", "--batch-size", "1", "--layers", "2", "--hardware", "h100-pcie5"]
RATIO_SLACK = 1e-9  # "up to rounding"


def _flat(output: str) -> str:
    return " ".join(output.replace("│", " ").split())


# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    "text, lengths",
    [
        ("128-512", (128, 256, 512)),
        ("128,256", (128, 256)),
        ("256, 128 ,256", (128, 256)),
        ("100-1000", (100, 128, 256, 512, 1000)),
        (" 128 - 1024 ", (128, 256, 512, 1024)),
        ("512", (512,)),
        (512, (512,)),
    ],
)
def test_parse_reads_ranges_and_lists(text, lengths) -> None:
    parsed = parse_seq_lens(text)
    assert parsed is not None and parsed.lengths == lengths and parsed.longest == lengths[-1]
    assert parsed.several == (len(lengths) > 1)


def test_one_length_is_not_several_and_none_is_the_models_own() -> None:
    assert parse_seq_lens(None) is None
    assert parse_seq_lens("128").picked == "given" and not parse_seq_lens("128").several


def test_a_range_says_how_its_lengths_were_picked() -> None:
    assert "powers of two" in parse_seq_lens("128-1024").picked
    assert parse_seq_lens("128,1024").picked == "given"


@pytest.mark.parametrize("first, last", [(1, 65536), (100, 5000), (3, 7), (128, 129), (1000, 1 << 20)])
def test_a_range_keeps_its_ends_and_at_most_six_lengths(first, last) -> None:
    picked = pick_lengths(first, last)
    assert picked[0] == first and picked[-1] == last and len(picked) <= MOST_PICKED
    assert list(picked) == sorted(set(picked))
    assert all(n & (n - 1) == 0 for n in picked[1:-1])  # the ones between are powers of two


@pytest.mark.parametrize(
    "text, message",
    [
        ("512-128", "a range goes from the shortest length to the longest, e.g. 128-512"),
        ("128-128", "a range goes from the shortest length to the longest, e.g. 128 for one length"),
        ("abc", "--seq-len 'abc' is not a length: give tokens per sequence (512), a range"),
        ("128,abc", "is not a length"),
        ("128-256-512", "is not a length"),
        ("", "is not a length"),
        ("0", "a length must be a positive number of tokens"),
        ("0-128", "a length must be a positive number of tokens"),
        ("-128", "is not a length"),
    ],
)
def test_parse_rejects_bad_values_with_a_clear_message(text, message) -> None:
    with pytest.raises(ValueError) as error:
        parse_seq_lens(text)
    assert message in str(error.value)


# ------------------------------------------------------------------ the structure and the plan


@pytest.fixture(scope="module")
def traces():
    from cswap.simulate.lmtrace import transformer_trace

    return {
        n: transformer_trace("gpt2", seq_len=n, num_layers=2, attention="eager", hardware="h100-pcie5") for n in (32, 64)
    }


def test_a_shorter_trace_has_the_longest_ones_structure(traces) -> None:
    check_same_structure(traces[64], traces[32])


def test_a_longer_or_other_trace_is_refused(traces) -> None:
    from cswap.simulate.lmtrace import transformer_trace

    with pytest.raises(ValueError, match="differs from the longest length's"):
        check_same_structure(traces[32], traces[64], "at 64 tokens")
    other = transformer_trace("gpt2", seq_len=32, num_layers=1, attention="eager", hardware="h100-pcie5")
    with pytest.raises(ValueError, match="the model's structure changes with the length"):
        check_same_structure(traces[64], other, "at 32 tokens")


def _outcomes(simulator: Simulator, names, budget):
    from cswap.simulate.versus import run_side_by_side

    return run_side_by_side(simulator, names, budget)


NAMES = ("swap", "cswap", "recompute", "capuchin", "ac-full", "offload-all", "megatron-offload", "recompute-knapsack", "ilp-kro")


def test_serving_a_plan_on_its_own_trace_gives_its_figures(traces) -> None:
    """serve_plan carries a plan out as it ran: on the trace it was made for, the same result."""
    from cswap.simulate import SimConfig

    simulator = Simulator(traces[64], "h100-pcie5", SimConfig(min_bytes=0))
    for name, result in simulator.run_all("all").items():
        again = serve_plan(simulator, result)
        assert (again.iteration_s, again.peak_bytes, again.actions) == (result.iteration_s, result.peak_bytes, result.actions), name
    for name, outcome in _outcomes(simulator, NAMES, 0.75).items():
        assert outcome.result is not None, name
        again = serve_plan(simulator, outcome)
        assert (again.iteration_s, again.peak_bytes) == (outcome.result.iteration_s, outcome.result.peak_bytes), name


def test_a_served_plan_stays_within_the_budget_and_costs_time(traces) -> None:
    from cswap.simulate import SimConfig

    config = SimConfig(min_bytes=0)
    longest, shorter = Simulator(traces[64], "h100-pcie5", config), Simulator(traces[32], "h100-pcie5", config)
    planned = _outcomes(longest, NAMES, 0.75)
    budget = next(iter(planned.values())).budget_bytes
    own = _outcomes(shorter, NAMES, budget)
    for name, outcome in planned.items():
        served = serve_plan(shorter, outcome)
        assert served.peak_bytes <= min(budget, outcome.result.peak_bytes), name
        assert served.iteration_s >= own[name].result.iteration_s * (1 - RATIO_SLACK), name


def test_an_infeasible_outcome_has_nothing_to_serve_with(traces) -> None:
    simulator = Simulator(traces[64], "h100-pcie5")
    outcome = _outcomes(simulator, ("none",), 0.5)["none"]
    assert outcome.infeasible
    with pytest.raises(ValueError, match="nothing to serve shorter lengths with"):
        serve_plan(simulator, outcome)


# ------------------------------------------------------------------ cswap simulate


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "250"})


def _json(runner: CliRunner, *args: str) -> dict:
    result = runner.invoke(app, ["simulate", *SMALL, *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _check_rows(report: dict, budget: int | None = None) -> None:
    lengths = report["seq_lens"]["lengths"]
    assert [row["seq_len"] for row in report["lengths"]] == lengths and report["seq_lens"]["served_by"] == lengths[-1]
    longest = report["lengths"][-1]["policies"]
    for name, figures in report["policies"].items():
        if figures.get("infeasible"):
            assert all(row["policies"][name]["infeasible"] for row in report["lengths"])
            continue
        assert (longest[name]["iteration_s"], longest[name]["peak_bytes"]) == (figures["iteration_s"], figures["peak_bytes"])
        assert longest[name]["ratio_to_own_plan"] == 1.0
        for row in report["lengths"]:
            served = row["policies"][name]
            assert not served["infeasible"] and served["iteration_s"] > 0, (row["seq_len"], name)
            assert served["peak_bytes"] <= figures["peak_bytes"], (row["seq_len"], name)
            if budget is not None:
                assert served["peak_bytes"] <= budget
            assert served["ratio_to_own_plan"] >= 1 - RATIO_SLACK, (row["seq_len"], name, served)
            assert served["ratio_to_own_plan"] == pytest.approx(served["iteration_s"] / served["own_iteration_s"])


def test_a_range_without_a_budget_reports_every_length(runner) -> None:
    report = _json(runner, "--seq-len", "32-128")
    assert report["seq_lens"]["lengths"] == [32, 64, 128] and report["seq_lens"]["given"] == "32-128"
    assert report["seq_len"] == 128
    assert set(report["lengths"][0]["policies"]) == set(report["policies"])
    _check_rows(report)


def test_the_longest_length_is_reported_as_one_length_is(runner) -> None:
    ranged = _json(runner, "--seq-len", "32,128", "--policies", "none,swap,cswap")
    single = _json(runner, "--seq-len", "128", "--policies", "none,swap,cswap")
    assert "lengths" not in single and "seq_lens" not in single
    assert {k: v for k, v in ranged.items() if k not in ("seq_lens", "lengths")} == single


def test_a_range_under_a_budget_holds_it_at_every_length(runner) -> None:
    report = _json(
        runner, "--seq-len", "32,64", "--attention", "eager", "--memory-budget", "0.75", "--min-bytes", "0",
        "--policies", "swap,cswap,recompute,ac-full,offload-all,recompute-knapsack,ilp-kro",
    )
    single = _json(
        runner, "--seq-len", "64", "--attention", "eager", "--memory-budget", "0.75", "--min-bytes", "0",
        "--policies", "swap,cswap,recompute,ac-full,offload-all,recompute-knapsack,ilp-kro",
    )
    assert report["budget_bytes"] == single["budget_bytes"] and report["none_peak_bytes"] == single["none_peak_bytes"]
    for name, figures in single["policies"].items():
        assert report["policies"][name]["iteration_s"] == figures["iteration_s"], name
    _check_rows(report, report["budget_bytes"])


def test_the_table_shows_every_length(runner) -> None:
    result = runner.invoke(app, ["simulate", *SMALL, "--seq-len", "32-128", "--policies", "none,swap"])
    assert result.exit_code == 0, result.output
    flat = _flat(result.output)
    assert "gpt2 batch 1 x 128 tokens" in flat  # the longest length's table, as for one length
    assert "every length served by the plan for 128 tokens; lengths 32, 64, 128" in flat
    assert "(from 32-128: the range's ends and the powers of two between)" in flat
    for column in ("tokens", "own plan ms", "own peak GB", "x own"):
        assert column in flat
    assert " swap 32 " in flat and " 64 " in flat


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "gpt2", "--seq-len", "512-128"], "--seq-len 512-128: a range goes from the shortest length to the longest, e.g. 128-512"),
        (["--model", "gpt2", "--seq-len", "abc"], "--seq-len 'abc' is not a length"),
        (["--model", "gpt2", "--seq-len", "0"], "a length must be a positive number of tokens"),
        (["--model", "vgg11", "--seq-len", "128-512"], "names several sequence lengths, which only a transformer model has; 'vgg11' is not one"),
        (["--model", "gpt2", "--seq-len", "64,128", "--memory-budget", "0.5,0.25"], "give one --memory-budget, not a sweep"),
        (["--model", "gpt2", "--seq-len", "64-128", "--trace", "t.json"], "a trace file (--trace) holds one"),
        (["--model", "gpt2", "--seq-len", "512-4096"], "seq_len 4096 is longer than gpt2's 1024 positions"),
    ],
)
def test_bad_lengths_are_refused_with_a_clear_message(runner, args, message) -> None:
    result = runner.invoke(app, ["simulate", "--layers", "1", *args])
    assert result.exit_code == 2, result.output
    assert message in _flat(result.output)
