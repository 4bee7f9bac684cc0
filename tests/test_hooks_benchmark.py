"""The baselines of ``benchmarks/hooks.py`` do the work they stand for: a figure against a
baseline that skipped its copies, or stored a tensor wrongly, would measure nothing."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from tests.scripts import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("hooks")


def _grads(model: torch.nn.Module, x: torch.Tensor, bench: ModuleType, context: object | None) -> list[torch.Tensor]:
    if context is None:
        bench._step(model, x)
    else:
        with context():  # type: ignore[operator]
            bench._step(model, x)
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("baseline", ["copying offload", "keyed floor", "essential swap"])
@pytest.mark.parametrize("blocks, width, batch", [(3, 8, 2), (5, 32, 8)])
def test_a_baseline_copies_every_stored_tensor_and_gives_plain_gradients(bench: ModuleType, baseline: str, blocks: int,
                                                                         width: int, batch: int) -> None:
    model, x = bench.Workload("t", blocks=blocks, width=width, batch=batch).build()
    plain = _grads(model, x, bench, None)
    if baseline == "keyed floor":
        floor = bench.KeyedFloor(model, x)
        context = floor
        # a Linear's input is the ReLU output before it: stored once, the second save found; the
        # first Linear's weight is not saved (its input needs no gradient), the others' are
        kinds = [kind for kind, _ in floor.kinds]
        assert kinds.count("param") == blocks - 1 and kinds.count("store") == blocks + 1 and kinds.count("dup") == blocks - 1
    elif baseline == "essential swap":
        context = bench.EssentialSwap(model, x)
    else:
        context = bench.copying_offload
    copies: list[int] = []
    original = torch.Tensor.copy_

    def counted(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        copies.append(1)
        return original(self, *args, **kwargs)

    torch.Tensor.copy_ = counted  # type: ignore[method-assign]
    try:
        grads = _grads(model, x, bench, context)
    finally:
        torch.Tensor.copy_ = original  # type: ignore[method-assign]
    assert all(torch.equal(a, b) for a, b in zip(plain, grads))
    expected = 3 * blocks - 1 if baseline == "copying offload" else blocks + 1  # every saved tensor, or every stored one
    assert len(copies) == expected, f"{baseline}: {len(copies)} copies to the host, expected {expected}"
    if baseline == "essential swap":
        # every stored tensor on the host at once at the end of forward, all released after backward
        assert context.peak_host_bytes == (blocks + 1) * batch * width * 4
        assert (context.host_bytes, context.resident_bytes, context.held) == (0, 0, set())


@pytest.mark.parametrize("blocks, width, batch", [(3, 8, 2), (5, 32, 8)])
def test_the_checkpoint_baseline_recomputes_every_block_and_gives_plain_gradients(bench: ModuleType, blocks: int, width: int,
                                                                                 batch: int) -> None:
    model, x = bench.Workload("t", blocks=blocks, width=width, batch=batch).build()
    plain = _grads(model, x, bench, None)
    own = bench.checkpointed_copy(model)
    linears: list[int] = []
    for block in own.children():
        block[0].register_forward_pre_hook(lambda module, args: linears.append(1))
    grads = _grads(own, x, bench, None)
    assert all(torch.equal(a, b) for a, b in zip(plain, grads))
    assert len(linears) == 2 * blocks  # each block's forward once, and once more recomputed in backward
    assert all(a is not b for a, b in zip(model.parameters(), own.parameters()))


@pytest.mark.parametrize("policies, measured", [(("ac-full",), True), (("recompute", "swap"), True), (("swap", "cswap"), False)])
def test_the_checkpoint_baseline_is_measured_with_a_policy_that_recomputes_without_a_budget(bench: ModuleType, policies: tuple[str, ...],
                                                                                           measured: bool) -> None:
    model, x = bench.Workload("t", blocks=2, width=4, batch=1).build()
    names = [run.name for run in bench._runs(model, x, policies, (None,))]
    assert (bench.CHECKPOINT_RUN in names) is measured
    assert names[:5] == ["plain", "save_on_cpu", "copying offload", "keyed floor", "essential swap"]


def _row(run: str, ratio: float, seconds: float, **extra: object) -> dict[str, object]:
    return {"workload": "w", "run": run, "median_s": seconds, "vs_save_on_cpu": ratio, "vs_plain": ratio * 2, **extra}


@pytest.mark.parametrize("processes", [1, 2, 3, 5])
def test_combined_processes_give_each_run_the_median_of_their_figures_and_their_spread(bench: ModuleType, processes: int) -> None:
    ratios = [1.1 + 0.1 * i for i in range(processes)][::-1]  # out of order: the median is not the middle one given
    runs = [[_row("plain", 1.0, 0.01), _row("swap", r, r / 100, pack_us=r * 3)] for r in ratios]
    combined = {row["run"]: row for row in bench.combine(runs)}
    middle = sorted(ratios)[processes // 2] if processes % 2 else sum(sorted(ratios)[processes // 2 - 1:processes // 2 + 1]) / 2
    swap = combined["swap"]
    assert swap["vs_save_on_cpu"] == pytest.approx(middle) and swap["vs_plain"] == pytest.approx(2 * middle)
    assert swap["median_s"] == pytest.approx(middle / 100) and swap["pack_us"] == pytest.approx(3 * middle)
    assert swap["vs_save_on_cpu_range"] == [min(ratios), max(ratios)] and swap["processes"] == processes
    assert combined["plain"]["vs_save_on_cpu_range"] == [1.0, 1.0]


def test_a_run_infeasible_in_any_process_is_combined_as_infeasible_with_the_largest_least_budget(bench: ModuleType) -> None:
    runs = [[_row("swap @0.1", 1.3, 0.01)],
            [{"workload": "w", "run": "swap @0.1", "infeasible": True, "least_budget_fraction": 0.2}],
            [{"workload": "w", "run": "swap @0.1", "infeasible": True, "least_budget_fraction": 0.3}]]
    (row,) = bench.combine(runs)
    assert row["infeasible"] is True and row["least_budget_fraction"] == 0.3 and row["processes"] == 3
    assert "median_s" not in row and "vs_save_on_cpu" not in row


@pytest.mark.parametrize("argv, expected", [
    (["--rounds", "3", "--processes", "4", "--blocks", "9"], ["--rounds", "3", "--blocks", "9"]),
    (["--processes=4", "--workloads", "many-small", "--rounds=3"], ["--rounds=3"]),
    (["--workloads=few-large", "--policies", "swap"], ["--policies", "swap"]),
])
def test_a_worker_process_is_given_the_options_but_how_many_processes_and_which_workloads(bench: ModuleType, argv: list[str],
                                                                                            expected: list[str]) -> None:
    assert bench._without(argv, "--processes") == expected


def test_fewer_than_one_process_is_refused_with_the_option_named(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--processes", "0"])
    assert "--processes must be at least 1, not 0" in capsys.readouterr().err
