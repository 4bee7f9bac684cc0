"""The strategies users pick instead of cswap, side by side under one budget: each within the budget
where it claims to fit, each doing what its system does, and cswap never slower than any that fits."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cswap.cli import app
from cswap.simulate import SimConfig, Simulator, meta_trace
from cswap.simulate.budgeted import none_peak_bytes, planning_problem
from cswap.simulate.layers import module_path, transformer_layers
from cswap.simulate.lmtrace import attention_core_keys, transformer_trace
from cswap.simulate.policies import Action, RecomputeRegion
from cswap.simulate.queues import QueueParams, run_queues
from cswap.simulate.strategies import STRATEGIES, TORCHTUNE_MIN_OFFLOAD_BYTES, Strategies
from cswap.simulate.timeline import Timeline
from cswap.simulate.versus import run_side_by_side

from .conftest import make_trace

pytest.importorskip("transformers")

# Two layers of a small GPT-2 and Llama with a small vocabulary, so that the layers (not the logits)
# hold most of what is saved and budgets of a tenth mean something.
TINY = {
    "gpt2": {
        "model_type": "gpt2",
        "n_embd": 64,
        "n_head": 4,
        "n_layer": 2,
        "vocab_size": 256,
        "n_positions": 256,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
    "llama": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 256,
        "max_position_embeddings": 256,
    },
}
SEQ_LEN = 128
FRACTIONS = (0.5, 0.25, 0.1)
CASES = [("gpt2", "eager"), ("gpt2", "sdpa"), ("llama", "sdpa"), ("llama", "eager")]


@pytest.fixture(scope="module")
def config_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("configs")
    paths = {}
    for name, config in TINY.items():
        paths[name] = root / f"{name}.json"
        paths[name].write_text(json.dumps(config))
    return paths


@pytest.fixture(scope="module")
def simulators(config_paths):
    """Per case, its simulator on an H100 (every saved tensor may move) and its strategies."""
    built = {}
    for model, attention in CASES:
        trace = transformer_trace(str(config_paths[model]), seq_len=SEQ_LEN, attention=attention, hardware="h100-pcie5")
        simulator = Simulator(trace, "h100-pcie5", SimConfig(min_bytes=0))
        built[model, attention] = (simulator, Strategies(simulator), planning_problem(simulator)[0])
    return built


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c) if isinstance(c, tuple) else c)
@pytest.mark.parametrize("fraction", FRACTIONS)
def test_within_the_budget_where_feasible_and_cswap_no_slower(simulators, case, fraction) -> None:
    simulator, strategies, problem = simulators[case]
    names = ("none", "swap", "cswap", *strategies.available())
    assert set(strategies.available()) == set(STRATEGIES)
    outcomes = run_side_by_side(simulator, names, fraction, problem=problem, strategies=strategies)
    budget = outcomes["none"].budget_bytes
    assert budget == int(fraction * none_peak_bytes(problem))
    feasible = {name: o for name, o in outcomes.items() if not o.infeasible}
    for name, outcome in outcomes.items():
        if outcome.infeasible:
            assert outcome.minimum_bytes > budget, name
        else:
            assert outcome.result.peak_bytes <= budget and outcome.minimum_bytes <= budget, name
    if len(feasible) > 0:
        assert "cswap" in feasible
        for name, outcome in feasible.items():
            assert feasible["cswap"].result.iteration_s <= outcome.result.iteration_s, (case, fraction, name)
    assert outcomes["cswap"].minimum_bytes <= min(o.minimum_bytes for o in outcomes.values())


@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_ac_full_holds_less_and_pays_one_forward_of_the_layers(simulators, case) -> None:
    simulator, strategies, _ = simulators[case]
    none = simulator.run("none")
    full = strategies.result("ac-full")
    layers = transformer_layers(simulator.trace)
    layers_s = sum(layer.forward_s for layer in layers)
    assert full.peak_bytes < none.peak_bytes
    assert full.iteration_s - none.iteration_s == pytest.approx(layers_s, rel=1e-9)
    # the layers are most of forward: the embedding and the head are the rest
    assert 0.5 * simulator.timeline.forward_s < layers_s < simulator.timeline.forward_s
    # every layer is one region, run again once; the checkpoint saves its input, a record added per layer
    plan = strategies.plan("ac-full")
    assert [r.label for r in plan.regions] == [layer.path for layer in layers]
    added = plan.simulator.trace.tensors[len(simulator.trace.tensors) :]
    assert [r.producer for r in added] == [f"{layer.path}:CheckpointInput" for layer in layers]
    assert all(
        r.nbytes == layer.input_nbytes and plan.actions[simulator.trace.tensors.__len__() + k] is Action.KEEP
        for k, (r, layer) in enumerate(zip(added, layers))
    )
    # GPT-2's first LayerNorm saves the input (again when the layer runs again); Llama's RMSNorm a float32 copy
    saved_inputs = [layer.input_key for layer in layers if layer.input_key is not None]
    assert (case[0] == "gpt2") == (len(saved_inputs) == len(layers))
    assert all(plan.actions[key] is Action.RECOMPUTE for key in saved_inputs)


def test_ac_full_holds_each_layers_input_until_backward_reaches_it() -> None:
    # a layer of two 100-byte records and a 10-byte input: kept, the records dropped and rebuilt together
    trace = make_trace([(10, 0.0, 1.5), (100, 0.2, 0.5), (100, 0.4, 0.2)], forward_s=1.0, backward_s=2.0)
    timeline = Timeline.from_trace(trace)
    sim = Simulator(trace, "h100-pcie5", SimConfig(min_bytes=0))
    actions = [Action.KEEP, Action.RECOMPUTE, Action.RECOMPUTE]
    region = RecomputeRegion((1, 2), forward_s=0.3, label="layer")
    out = run_queues(timeline, sim.costs, actions, QueueParams(d2h_gbps=1.0, h2d_gbps=1.0), regions=[region])
    assert out.codec_s == pytest.approx(0.3) and out.iteration_s == pytest.approx(3.3)
    assert out.peak_bytes == 210  # both rebuilt at once beside the input
    alone = run_queues(timeline, sim.costs, actions, QueueParams(d2h_gbps=1.0, h2d_gbps=1.0))
    assert alone.peak_bytes == 110  # per tensor: each rebuilt when needed
    with pytest.raises(ValueError, match="not recompute"):
        run_queues(timeline, sim.costs, [Action.KEEP] * 3, QueueParams(d2h_gbps=1.0, h2d_gbps=1.0), regions=[region])


@pytest.mark.parametrize("case", [("gpt2", "eager"), ("llama", "eager")], ids="-".join)
def test_selective_recompute_drops_exactly_the_attention_core(simulators, case) -> None:
    simulator, strategies, _ = simulators[case]
    core = attention_core_keys(simulator.trace)
    plan = strategies.plan("ac-selective")
    recomputed = {simulator.trace.tensors[i].key for i, a in enumerate(plan.actions) if a is Action.RECOMPUTE}
    assert recomputed == core and len(plan.regions) == len(transformer_layers(simulator.trace))
    core_bytes = sum(r.nbytes for r in simulator.trace.tensors if r.key in core)
    selective = strategies.result("ac-selective")
    assert selective.offloaded_bytes == core_bytes
    assert simulator.run("none").peak_bytes - selective.peak_bytes == core_bytes
    assert selective.iteration_s > simulator.run("none").iteration_s


@pytest.mark.parametrize("case", [("gpt2", "sdpa"), ("llama", "sdpa")], ids="-".join)
def test_selective_recompute_on_fused_attention_has_nothing_to_drop(simulators, case) -> None:
    simulator, strategies, _ = simulators[case]
    plan = strategies.plan("ac-selective")
    assert not plan.regions and set(plan.actions) == {Action.KEEP} and "nothing to recompute" in plan.note
    assert strategies.result("ac-selective").peak_bytes == simulator.run("none").peak_bytes


@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_offload_all_moves_every_activation_but_the_head_and_loss(simulators, case) -> None:
    simulator, strategies, _ = simulators[case]
    plan = strategies.plan("offload-all")
    moved = [simulator.trace.tensors[i] for i, a in enumerate(plan.actions) if a is Action.SWAP]
    assert moved and all(r.offloadable and r.nbytes >= TORCHTUNE_MIN_OFFLOAD_BYTES for r in moved)
    assert not any(module_path(r.module) in ("", "lm_head") for r in moved)
    assert plan.fetch_after == (None,) * len(plan.actions) and plan.max_inflight_offloads == 5
    none = simulator.run("none")
    offload = strategies.result("offload-all")
    assert offload.peak_bytes < none.peak_bytes and offload.iteration_s >= none.iteration_s
    both = strategies.result("offload-all+ac")
    assert both.peak_bytes <= strategies.result("ac-full").peak_bytes


@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_megatron_offloads_what_the_named_modules_save(simulators, case) -> None:
    simulator, strategies, _ = simulators[case]
    plan = strategies.plan("megatron-offload")
    layers = {layer.path for layer in transformer_layers(simulator.trace)}
    moved = [module_path(simulator.trace.tensors[i].module) for i, a in enumerate(plan.actions) if a is Action.SWAP]
    inside = [path.split(".", 3)[-1] for path in moved if ".".join(path.split(".", 3)[:3]) in layers]  # below the layer
    assert moved and len(inside) == len(moved)
    assert all(name.startswith(("attn", "self_attn", "mlp")) for name in inside)  # norms stay: not named
    assert sum(a is Action.SWAP for a in plan.actions) < sum(a is Action.SWAP for a in strategies.plan("offload-all").actions)
    assert strategies.result("megatron-offload").peak_bytes < simulator.run("none").peak_bytes


@pytest.mark.parametrize("case", CASES, ids="-".join)
@pytest.mark.parametrize("fraction", FRACTIONS)
def test_the_knapsack_never_swaps(simulators, case, fraction) -> None:
    _, strategies, problem = simulators[case]
    outcome = strategies.run("recompute-knapsack", int(fraction * none_peak_bytes(problem)))
    if outcome.infeasible:
        assert outcome.minimum_bytes > outcome.budget_bytes
        return
    assert {a for a in outcome.result.actions} <= {Action.KEEP, Action.RECOMPUTE}
    assert Action.RECOMPUTE in outcome.result.actions


def test_image_models_run_the_strategies_that_need_no_layers() -> None:
    simulator = Simulator(meta_trace("vgg11", 4, 32, width_mult=0.25), "v100-pcie3", SimConfig(min_bytes=0))
    strategies = Strategies(simulator)
    assert strategies.available() == ("offload-all", "recompute-knapsack", "ilp-kro")
    with pytest.raises(ValueError, match="no transformer layers"):
        run_side_by_side(simulator, ("cswap", "ac-full"), 0.5)
    outcomes = run_side_by_side(simulator, ("swap", "cswap", *strategies.available()), 0.5)
    assert not outcomes["cswap"].infeasible


def test_cli_lists_the_strategies_beside_the_policies(config_paths) -> None:
    runner = CliRunner(env={"COLUMNS": "250"})
    args = ["simulate", "--model", str(config_paths["gpt2"]), "--seq-len", str(SEQ_LEN), "--attention", "eager"]
    args += ["--hardware", "h100-pcie5", "--min-bytes", "0", "--policies", "all", "--memory-budget", "0.5,0.1", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert "skipped" not in report
    for row in report["budgets"]:
        assert set(STRATEGIES) <= set(row["policies"])
        feasible = [p for p in row["policies"].values() if not p["infeasible"]]
        assert all(p["peak_bytes"] <= row["budget_bytes"] for p in feasible)
        assert all(row["policies"]["cswap"]["iteration_s"] <= p["iteration_s"] for p in feasible)
    table = runner.invoke(app, [*args[:-1], "--memory-budget", "0.5"])
    assert table.exit_code == 0 and "ac-selective" in table.output and "recompute-knapsack" in table.output
    image = runner.invoke(
        app, ["simulate", "--model", "vgg11", "--batch-size", "2", "--resolution", "32", "--memory-budget", "0.5"]
    )
    assert image.exit_code == 0, image.output
    assert "ac-full: not run, the trace has no transformer layers" in " ".join(image.output.split())
    unbudgeted = runner.invoke(
        app, ["simulate", "--model", "vgg11", "--batch-size", "2", "--resolution", "32", "--policies", "ac-full"]
    )
    assert unbudgeted.exit_code == 2 and "compared under a memory budget" in " ".join(unbudgeted.output.split())
