"""The planner's fast path: repeated layers found, tied plans within the budget at every event and as
cheap as the exact MILP's, the least budget as the exact one gives it, and the exact MILP where layers differ."""

from __future__ import annotations

import numpy as np
import pytest

from cswap.budget import BudgetError
from cswap.planner import LinkModel, TensorSpec, build_problem, minimum_bytes, plan_budget, timeline_of
from cswap.planner import fastpath
from cswap.planner.bounds import least_footprint_peak, peak_floor
from cswap.planner.lifetime import lifetimes_from_orders
from cswap.planner.repeats import find_repeats
from cswap.planner.tied import plan_tied, tie_layers, tied_least_peak

MB = 1_000_000
POLICIES = ("cswap", "swap", "recompute", "compress-swap", "compress-keep")
FRACTIONS = (0.5, 0.25, 0.1)
#: The gap to the exact optimum the tied plans are held to (the benchmark measures 0 on these shapes).
STATED_GAP = 0.01
#: Layers of the synthetic problems: two at each edge, and eight blocks of two between.
LAYERS = 20


def repeated_problem(layers: int, seed: int = 0, differ: bool = False, per_layer: int = 4, views: bool = False,
                     viewed: int = 2):
    """A stem tensor, ``layers`` layers of ``per_layer`` tensors, two head tensors; backward in reverse.

    Every layer saves the same tensors (sizes, compressibility, codec and recompute seconds drawn
    once per position); ``differ``: each layer's tensors grow by half a MB per layer. 1 MB moves in
    1 ms; forward events are 1 ms apart, backward events 2 ms. ``views``: each layer's tensors after
    its first, up to its ``viewed``-th, are other views of its first one's storage (as large), and
    the first head tensor is another view of the stem's.
    """
    rng = np.random.default_rng(seed)
    sizes = [int(s) * MB for s in rng.integers(1, 6, per_layer)]
    if views:
        sizes[1:viewed] = [sizes[0]] * (viewed - 1)
    ratios = rng.choice([0.3, 0.6, 1.2], per_layer)  # 1.2: ZVC would expand it
    codec_s = rng.uniform(0.0, 1e-3, per_layer)
    recompute_s = rng.uniform(0.0, 3e-3, per_layer)
    rows = [(7 * MB, 0.5, 1e-4, 1e-3)]
    for layer in range(layers):
        rows += [(sizes[j] + (layer * MB // 2 if differ else 0), ratios[j], codec_s[j], recompute_s[j]) for j in range(per_layer)]
    rows += [(9 * MB, 1.2, 1e-4, 5e-4), (11 * MB, 0.4, 1e-4, 2e-3)]
    count = len(rows)
    events = lifetimes_from_orders(list(range(count)), [count - 1 - i for i in range(count)])
    specs = [
        TensorSpec(key=k, nbytes=n, lifetime=lt, compressed_nbytes=int(n * r), compress_s=c, decompress_s=c, hidden_forward_s=1e-3,
                   recompute_s=rc)
        for k, ((n, r, c, rc), lt) in enumerate(zip(rows, events.lifetimes, strict=True))
    ]
    if views:
        specs[count - 2] = TensorSpec(key=count - 2, nbytes=7 * MB, lifetime=events.lifetimes[count - 2], compressed_nbytes=3 * MB)
    shared = ({1 + per_layer * layer + j: 1 + per_layer * layer for layer in range(layers) for j in range(1, viewed)} | {count - 2: 0}
              if views else None)
    times = [1e-3 * i for i in range(count)] + [count * 1e-3 + 2e-3 * i for i in range(count)]
    return build_problem(specs, events, times, count * 1e-3, LinkModel(1.0, 1.0), views=shared)


@pytest.fixture(scope="module")
def gpt2_problem():
    """A 16-layer GPT-2 of hidden size 64 on the meta device, as the simulator plans it."""
    pytest.importorskip("transformers")
    from cswap.models.transformer import TransformerSpec
    from cswap.simulate import SimConfig, Simulator
    from cswap.simulate.budgeted import planning_problem
    from cswap.simulate.lmtrace import transformer_trace

    spec = TransformerSpec("gpt2-tiny", "gpt2", config=dict(n_layer=16, n_embd=64, n_head=4, n_positions=128, vocab_size=512,
                                                            bos_token_id=0, eos_token_id=0), source="test", seq_len=64)
    trace = transformer_trace(spec, batch_size=2, seq_len=64, hardware="h100-pcie5", dtype="float32")
    return planning_problem(Simulator(trace, "h100-pcie5", SimConfig(min_bytes=0)))[0]


@pytest.fixture(params=["synthetic", "views", "three-views", "gpt2"])
def problem(request):
    if request.param == "gpt2":
        return request.getfixturevalue("gpt2_problem")
    return repeated_problem(LAYERS, seed=1, views=request.param != "synthetic", viewed=4 if request.param == "three-views" else 2)


def _chosen_options(problem, plan):
    chosen = []
    for tensor, planned in zip(problem.tensors, plan.tensors, strict=True):
        chosen.append(next(o for o in tensor.options if (o.action, o.cost_s, o.wait_offload, o.prefetch_distance)
                           == (planned.action, planned.cost_s, planned.wait_offload, planned.prefetch_distance)))
    return chosen


@pytest.mark.parametrize("layers", [6, 12, 20])
@pytest.mark.parametrize("per_layer", [1, 4])
def test_the_repeated_layers_are_found(layers, per_layer):
    found = find_repeats(repeated_problem(layers, per_layer=per_layer), min_layers=2)
    assert (found.period, found.layers, found.first) == (per_layer, layers, 1)
    assert [found.layer_of(rank) for rank in (0, 1, per_layer * layers, per_layer * layers + 1)] == [None, 0, layers - 1, None]


def test_layers_that_differ_do_not_repeat():
    assert find_repeats(repeated_problem(LAYERS, differ=True), min_layers=fastpath.FAST_PATH_MIN_LAYERS) is None
    assert fastpath.repeated_layers(repeated_problem(LAYERS, differ=True), min_tensors=0) is None


@pytest.mark.parametrize("policy", ["cswap", "swap", "recompute"])
@pytest.mark.parametrize("fraction", FRACTIONS)
def test_a_tied_plan_holds_the_budget_at_every_event(problem, policy, fraction):
    budget = int(fraction * minimum_bytes(problem, "none"))
    if budget < minimum_bytes(problem, policy):
        pytest.skip(f"{policy} cannot meet {fraction} of none's peak here")
    plan = plan_tied(problem, policy, budget, find_repeats(problem, fastpath.FAST_PATH_MIN_LAYERS))
    line = timeline_of(problem, _chosen_options(problem, plan))
    assert plan.status.startswith("tied") and plan.timeline_bytes == tuple(line.tolist())
    assert plan.peak_bytes == int(line.max()) <= budget


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("fraction", FRACTIONS)
def test_a_tied_plan_costs_what_the_exact_one_does(problem, policy, fraction):
    budget = int(fraction * minimum_bytes(problem, "none"))
    if budget < minimum_bytes(problem, policy, exact=True):
        pytest.skip(f"{policy} cannot meet {fraction} of none's peak here")
    exact = plan_budget(problem, policy, budget, exact=True)
    tied = plan_tied(problem, policy, budget, find_repeats(problem, fastpath.FAST_PATH_MIN_LAYERS))
    assert tied is not None and tied.peak_bytes <= budget
    assert tied.predicted_s <= exact.predicted_s * (1 + STATED_GAP) + 1e-12


@pytest.mark.parametrize(("seed", "policy", "fraction"), [(3, "swap", 0.3), (4, "recompute", 0.5), (5, "cswap", 0.2)])
def test_the_refinement_finds_what_blocks_miss(seed, policy, fraction):
    # 30 layers: blocks of 6 or 7, where the exact plan switches a position in only some of a block's layers
    problem = repeated_problem(30, seed=seed)
    budget = int(fraction * minimum_bytes(problem, "none"))
    repeats = find_repeats(problem, fastpath.FAST_PATH_MIN_LAYERS)
    coarse, refined = plan_tied(problem, policy, budget, repeats, refine=False), plan_tied(problem, policy, budget, repeats)
    exact = plan_budget(problem, policy, budget, exact=True)
    assert coarse.predicted_s > exact.predicted_s * 1.0001
    assert refined.predicted_s == pytest.approx(exact.predicted_s, rel=1e-9) and refined.peak_bytes <= budget


def test_blocks_tie_layers_and_edges_stand_alone():
    problem = repeated_problem(12)
    program = tie_layers(problem, "swap", find_repeats(problem), edge_layers=2, blocks=4)
    sizes = sorted(len(unit) for unit in program.units)
    # stem and two head tensors, 2 + 2 edge layers of 4, and 4 blocks of 2 layers at each of 4 positions
    assert sizes == [1] * (3 + 16) + [2] * 16
    assert set(program.owner.tolist()) == set(range(len(program.units)))


@pytest.mark.parametrize("policy", POLICIES)
def test_minimum_bytes_agrees_with_the_exact_program(problem, policy):
    least = minimum_bytes(problem, policy)
    assert least == minimum_bytes(problem, policy, exact=True)
    assert peak_floor(problem, policy) <= least <= least_footprint_peak(problem, policy)
    assert tied_least_peak(problem, policy, find_repeats(problem, fastpath.FAST_PATH_MIN_LAYERS)) == least


@pytest.mark.parametrize(("seed", "viewed"), [(0, 4), (8, 3), (1, 4)])
@pytest.mark.parametrize("policy", ["compress-keep", "cswap"])
def test_a_storage_saved_as_several_views_states_the_exact_least(seed, viewed, policy):
    """Each layer saves its first tensor's storage ``viewed`` times: the least the fast path states
    is the exact program's. A floor taken view by view against the first passed the least plan,
    and a tied plan above the least stood as it: 137.5 MB where 117.5 MB holds (seed 0), 213.5 MB
    where 197.5 MB holds (seed 8), under ``compress-keep``."""
    problem = repeated_problem(LAYERS, seed=seed, views=True, viewed=viewed)
    least = minimum_bytes(problem, policy, exact=True)
    assert minimum_bytes(problem, policy) == least
    assert peak_floor(problem, policy) <= least


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", ["cswap", "recompute"])
def test_plan_budget_takes_the_fast_path_by_itself(monkeypatch, seed, policy):
    problem = repeated_problem(LAYERS, seed=seed)
    monkeypatch.setattr(fastpath, "FAST_PATH_MIN_TENSORS", 0)
    least = minimum_bytes(problem, policy)
    budget = max(int(0.3 * minimum_bytes(problem, "none")), least)
    fast, exact = plan_budget(problem, policy, budget), plan_budget(problem, policy, budget, exact=True)
    assert fast.status.startswith("tied") and not exact.status.startswith("tied")
    assert fast.peak_bytes <= budget and fast.predicted_s == pytest.approx(exact.predicted_s, rel=STATED_GAP)
    assert plan_budget(problem, policy, least).peak_bytes <= least
    with pytest.raises(BudgetError) as caught:
        plan_budget(problem, policy, least - 1)
    assert caught.value.minimum_bytes == least


def test_layers_that_differ_take_the_exact_program(monkeypatch):
    problem = repeated_problem(LAYERS, differ=True)
    monkeypatch.setattr(fastpath, "FAST_PATH_MIN_TENSORS", 0)
    budget = int(0.3 * minimum_bytes(problem, "none"))
    plan = plan_budget(problem, "cswap", budget)
    assert plan.status in ("optimal", "greedy") and plan.peak_bytes <= budget
    assert plan.predicted_s == plan_budget(problem, "cswap", budget, exact=True).predicted_s


def test_no_tied_plan_falls_back_to_the_exact_program(monkeypatch):
    import cswap.planner.solve as solve

    problem = repeated_problem(LAYERS, seed=2)
    monkeypatch.setattr(fastpath, "FAST_PATH_MIN_TENSORS", 0)
    monkeypatch.setattr(solve, "plan_tied", lambda *args, **kwargs: None)
    budget = int(0.3 * minimum_bytes(problem, "none"))
    plan = plan_budget(problem, "swap", budget)
    assert not plan.status.startswith("tied") and plan.peak_bytes <= budget


def test_small_problems_are_planned_exactly():
    problem = repeated_problem(LAYERS)  # 83 tensors, under the fast path's size
    assert len(problem.tensors) < fastpath.FAST_PATH_MIN_TENSORS and fastpath.repeated_layers(problem) is None
    assert plan_budget(problem, "swap", int(0.5 * minimum_bytes(problem, "none"))).status in ("optimal", "greedy")
