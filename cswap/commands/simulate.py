"""``cswap simulate``: one training iteration under each policy on a hardware profile, without the hardware.

Example:
    $ cswap simulate --model vgg16 --batch-size 64 --resolution 224 --hardware v100-pcie3 --policies all
    $ cswap simulate --trace trace.json --hardware a100-pcie4 --json
    $ cswap simulate --model resnet50 --hardware h100-pcie5 --plot resnet50.png
    $ cswap simulate --model resnet50 --memory-budget 0.25 --json
    $ cswap simulate --model vgg16 --memory-budget 1.0,0.75,0.5,0.25 --plot budgets.png
    $ cswap simulate --model llama-3-8b --seq-len 4096 --batch-size 1 --dtype bfloat16 --hardware h100-pcie5
    $ cswap simulate --model gpt3-175b-layer --attention eager --layers 2 --policies none,swap,cswap
    $ cswap simulate --model gpt2-xl --attention eager --hardware h100-pcie5 --policies all --memory-budget 0.5,0.25,0.1
    $ cswap simulate --model gpt2 --seq-len 128-1024 --hardware h100-pcie5 --memory-budget 0.5

Several sequence lengths (``--seq-len 128-1024`` or ``128,256,512,1024``, a transformer's): the
iteration at the longest is simulated as one length is, and each policy's plan for it serves
every shorter length (:mod:`cswap.simulate.seqlens`): ``lengths`` gives, per length and policy,
that plan's time and peak there beside a plan made for the length itself (``own_*``) and
``ratio_to_own_plan``, what serving it with the longest length's plan costs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from cswap.commands import fail
from rich.table import Table

__all__ = ["register", "run_simulate"]


def run_simulate(
    model: str = "vgg16",
    batch_size: int | None = None,
    resolution: int = 224,
    hardware: str = "v100-pcie3",
    policies: str = "all",
    trace_path: Path | None = None,
    sparsity: float | None = None,
    min_bytes: int | None = None,
    prefetch_depth: int = 1,
    max_inflight_offloads: int | None = None,
    paper_size: bool = False,
    dtype: str | None = None,
    memory_budget: str | None = None,
    host_memory_budget: str | None = None,
    time_limit_s: float = 30.0,
    seq_len: int | str | None = None,
    num_layers: int | None = None,
    attention: str | None = None,
    compressibility: str | None = "all-minilm-l6-v2",
) -> dict[str, Any]:
    """Simulate and return the JSON-ready report (``policies`` maps each policy to its figures).

    ``compressibility`` names the profile of what the codecs besides ZVC give each kind of saved
    tensor (:mod:`cswap.simulate.compressibility`), or ``None``: ZVC alone.

    With ``trace_path`` the trace is read from a file (``rt.trace().to_json(...)``) and its own
    compute times are used; otherwise a meta trace of ``model`` is built for ``hardware``: an image
    model's, or a transformer's with ``seq_len``, ``num_layers`` and ``attention``
    (:func:`cswap.simulate.modeltrace.trace_model`; ``batch_size`` and ``dtype`` default to 64
    float32 images or one bfloat16 sequence).

    With ``memory_budget`` (any form :func:`cswap.budget.parse_budget` reads; several, comma
    separated, for a sweep) every policy is planned under the budget
    (:mod:`cswap.simulate.budgeted`) and every strategy a user would pick instead runs within it
    (:mod:`cswap.simulate.strategies`; ``all`` names every policy and every strategy that can run
    on the trace, and ``skipped`` says why the others cannot): ``budget_bytes`` is the budget, and
    each has its figures with ``peak_bytes`` within it, or ``infeasible: true`` with
    ``minimum_bytes``; ``none_iteration_s`` is policy ``none``'s iteration without a budget. A sweep
    has ``budgets``: one such report per budget. ``compute_s`` is the iteration's compute, and each
    policy's ``codec_s`` is all its extra work on the compute stream, ``recompute_s`` (recomputation)
    included. ``pinned_bytes`` are the saved tensors below ``min_bytes`` (echoed), which the
    simulator keeps on the device whatever the budget (the runtime may move them under one). With
    ``host_memory_budget`` as well (bytes, a unit string or ``auto``:
    :func:`cswap.budget.parse_host_budget`) every policy's plan holds it on the host at every event
    (``planned_host_peak_bytes``), or it is infeasible with ``binding`` (the budget that binds) and
    ``host_minimum_bytes``; the strategies plan no host budget and are skipped.

    With several sequence lengths (``seq_len`` a list ``"128,256,512"`` or a range ``"128-1024"``:
    :func:`cswap.simulate.seqlens.parse_seq_lens`) the report is the longest length's, as one
    length gives it, with ``seq_lens`` (the lengths and how they were picked) and ``lengths``: per
    length, per policy, the longest length's plan carried out at that length
    (:func:`cswap.simulate.seqlens.serve_plan`: ``iteration_s``, ``peak_bytes``, ``plan``), the plan
    made for that length (``own_iteration_s``, ``own_peak_bytes``, ``own_plan``) and
    ``ratio_to_own_plan``; ``infeasible: true`` where the longest length has no plan within the
    budget. A fractional budget resolves against the longest length's ``none`` peak: one cap for
    every length.

    Raises:
        ValueError: unknown model, hardware, policy or strategy (naming the valid ones), a strategy
            without a budget or one that cannot run on the trace, a bad trace file, a bad
            ``seq_len``, or several lengths with a trace file, an image model or a budget sweep, or
            of a model whose saved tensors change with the length.
    """
    from cswap.simulate import SimConfig, Simulator, load_hardware
    from cswap.simulate.engine import DEFAULT_MIN_BYTES
    from cswap.simulate.compressibility import compressibility_named
    from cswap.simulate.metatrace import SparsityModel
    from cswap.simulate.modeltrace import trace_model
    from cswap.profile.trace import Trace

    from cswap.simulate.seqlens import parse_seq_lens

    budgets = _budgets(memory_budget)
    lengths = parse_seq_lens(seq_len)
    if lengths is not None and lengths.several:
        _check_several_lengths(lengths, model, trace_path, budgets)
    longest = None if lengths is None else lengths.longest
    if host_memory_budget is not None:
        from cswap.budget import parse_host_budget

        parse_host_budget(host_memory_budget)  # a bad one fails here, before any simulation
        if not budgets:
            raise ValueError("--host-memory-budget bounds the host beside a device budget: add --memory-budget (e.g. 0.5)")
    names = _budget_policies(policies) if budgets else _unbudgeted_policies(policies)
    profile = load_hardware(hardware)

    coded = compressibility_named(compressibility)

    def trace_at(tokens: int | None) -> Trace:
        return trace_model(
            model,
            batch_size,
            profile,
            dtype=dtype,
            sparsity=SparsityModel(**({} if sparsity is None else {"relu": sparsity}), compressibility=coded),
            resolution=resolution,
            seq_len=tokens,
            num_layers=num_layers,
            attention=attention,
        )

    trace = Trace.from_json(trace_path) if trace_path is not None else trace_at(longest)
    config = SimConfig(
        min_bytes=DEFAULT_MIN_BYTES if min_bytes is None else min_bytes,
        prefetch_depth=prefetch_depth,
        max_inflight_offloads=max_inflight_offloads,
        paper_size=paper_size,
    )
    simulator = Simulator(trace, profile, config)
    header = {
        "model": trace.meta.get("model", model),
        "hardware": profile.name,
        "batch_size": trace.meta.get("batch_size", batch_size),
        "resolution": trace.meta.get("resolution", resolution),
        "trace": str(trace_path) if trace_path is not None else None,
        "saved_bytes": sum(r.nbytes for r in trace.tensors if r.offloadable),
        "compute_s": simulator.timeline.compute_s,
    }
    if trace.meta.get("seq_len"):  # a transformer's trace: what shaped it
        header.update({k: trace.meta.get(k) for k in ("seq_len", "num_layers", "attention", "dtype")})
    if budgets:
        from cswap.simulate.strategies import STRATEGIES, Strategies
        from cswap.simulate.sweep import budget_sweep

        skipped = {}
        if policies.strip() == "all" and host_memory_budget is not None:
            skipped = {name: "it plans no host memory budget" for name in names if name in STRATEGIES}
            names = tuple(name for name in names if name not in skipped)
        elif policies.strip() == "all":  # every strategy that can run on this trace
            strategies = Strategies(simulator, time_limit_s)
            skipped = {name: strategies.unavailable(name) for name in names if name in STRATEGIES and strategies.unavailable(name)}
            names = tuple(name for name in names if name not in skipped)
        sweep = budget_sweep(simulator, names, budgets, time_limit_s, host_budget=host_memory_budget)
        rows = sweep.rows()
        # none without a budget: what "x none" compares with where none does not fit the budget
        report = {**header, "none_peak_bytes": sweep.none_peak_bytes, "none_iteration_s": simulator.run("none").iteration_s}
        # what min_bytes keeps on the device whatever the budget (the runtime may move it under one)
        report["pinned_bytes"] = sum(r.nbytes for r in trace.tensors if r.offloadable and r.nbytes < config.min_bytes)
        report["min_bytes"] = config.min_bytes
        if host_memory_budget is not None:
            from cswap.budget import parse_host_budget

            report["host_budget_bytes"] = parse_host_budget(host_memory_budget).resolve()  # type: ignore[union-attr]
        if skipped:
            report["skipped"] = skipped
        if len(rows) == 1:
            report.update(rows[0])
            results = {name: o.result for name, o in sweep.outcomes[0].items() if o.result is not None}
        else:
            report["budgets"] = rows
            results = {}
        if lengths is not None and lengths.several:
            own = _OwnPlans(names, time_limit_s, sweep.budgets_bytes[0], host_memory_budget)
            report.update(_served_lengths(lengths, simulator, dict(sweep.outcomes[0]), trace_at, config, own))
        return {**report, "_results": results, "_sweep": sweep}
    results = simulator.run_all(names)
    report = {**header, "policies": {name: result.to_dict() for name, result in results.items()}}
    if lengths is not None and lengths.several:
        report.update(_served_lengths(lengths, simulator, dict(results), trace_at, config, _OwnPlans(names, time_limit_s)))
    return {**report, "_results": results}


def _check_several_lengths(lengths: Any, model: str, trace_path: Path | None, budgets: list[str]) -> None:
    """Several sequence lengths need a transformer model (not a trace file) and one budget at most."""
    from cswap.simulate.modeltrace import is_transformer_model

    if trace_path is not None:
        raise ValueError(f"--seq-len {lengths.given} names several lengths, but a trace file (--trace) holds one: give a transformer --model instead")
    if not is_transformer_model(model, lengths.longest):
        raise ValueError(
            f"--seq-len {lengths.given} names several sequence lengths, which only a transformer model has; {model!r} is not one "
            "(give a transformer preset such as gpt2, hf:<model_type> or a config path)"
        )
    if len(budgets) > 1:
        raise ValueError(
            f"--seq-len {lengths.given} names several lengths: give one --memory-budget, not a sweep ({','.join(budgets)}), "
            "or sweep the budgets at one length"
        )


class _OwnPlans:
    """What one length gives on its own: every policy simulated (without a budget), or planned and
    run side by side with the strategies under ``budget_bytes`` (the longest length's budget)."""

    def __init__(self, names: tuple[str, ...], time_limit_s: float, budget_bytes: int | None = None, host_budget: str | None = None):
        self.names, self.time_limit_s, self.budget_bytes, self.host_budget = names, time_limit_s, budget_bytes, host_budget

    def run(self, simulator: Any, problem: Any, strategies: Any) -> dict[str, Any]:
        """Per name, its result at ``simulator``'s length (``None``: infeasible within the budget)."""
        if self.budget_bytes is None:
            return dict(simulator.run_all(self.names))
        from cswap.simulate.versus import run_side_by_side

        outcomes = run_side_by_side(
            simulator, self.names, self.budget_bytes, self.time_limit_s, problem=problem, strategies=strategies, host_budget=self.host_budget
        )
        return {name: outcome.result for name, outcome in outcomes.items()}


def _served_lengths(lengths: Any, simulator: Any, planned: dict[str, Any], trace_at: Any, config: Any, own: _OwnPlans) -> dict[str, Any]:
    """``seq_lens`` and ``lengths`` of the report (see :func:`run_simulate`): each shorter length
    served by the longest length's plans (``planned``: per name its result, or its outcome under a
    budget), beside the plans made for it."""
    from cswap.simulate import Simulator
    from cswap.simulate.budgeted import planning_problem
    from cswap.simulate.seqlens import check_same_structure, serve_plan
    from cswap.simulate.strategies import Strategies

    def result_of(entry: Any) -> Any:
        return getattr(entry, "result", entry)  # a BudgetOutcome's result (None: infeasible), or the result itself

    rows = []
    for tokens in lengths.lengths:
        if tokens == lengths.longest:
            served = own_results = {name: result_of(entry) for name, entry in planned.items()}
        else:
            shorter = Simulator(trace_at(tokens), simulator.hardware, config)
            check_same_structure(simulator.trace, shorter.trace, f"at {tokens} tokens")
            problem = planning_problem(shorter)[0] if own.budget_bytes is not None else None
            strategies = Strategies(shorter, own.time_limit_s)
            served = {
                name: None if result_of(entry) is None else serve_plan(shorter, entry, problem, strategies)
                for name, entry in planned.items()
            }
            own_results = own.run(shorter, problem, strategies)
        rows.append({"seq_len": tokens, "policies": {name: _length_figures(served[name], own_results.get(name)) for name in planned}})
    return {
        "seq_lens": {"given": lengths.given, "lengths": list(lengths.lengths), "picked": lengths.picked, "served_by": lengths.longest},
        "lengths": rows,
    }


def _length_figures(served: Any, own: Any) -> dict[str, Any]:
    """One policy at one length: the longest length's plan there, the length's own plan, their ratio."""
    row: dict[str, Any] = (
        {"infeasible": True}
        if served is None
        else {"infeasible": False, "iteration_s": served.iteration_s, "peak_bytes": served.peak_bytes, "plan": served.plan}
    )
    if own is not None:
        row.update(own_iteration_s=own.iteration_s, own_peak_bytes=own.peak_bytes, own_plan=own.plan)
    row["ratio_to_own_plan"] = served.iteration_s / own.iteration_s if served is not None and own is not None and own.iteration_s > 0 else None
    return row


def _budgets(memory_budget: str | None) -> list[str]:
    if memory_budget is None:
        return []
    budgets = [b.strip() for b in memory_budget.split(",") if b.strip()]
    if not budgets:
        raise ValueError(f"--memory-budget {memory_budget!r} names no budget: give e.g. 0.5, 2GiB or 1.0,0.5,0.25")
    from cswap.budget import parse_budget

    for budget in budgets:
        parse_budget(budget)  # a bad one fails here, before any simulation
    return budgets


def _budget_policies(policies: str) -> tuple[str, ...]:
    from cswap.simulate.versus import comparable_names

    known = comparable_names()
    if policies.strip() == "all":
        return known
    names = tuple(dict.fromkeys(p.strip() for p in policies.split(",") if p.strip()))
    unknown = [p for p in names if p not in known]
    if unknown or not names:
        raise ValueError(
            f"policies {unknown or '(none given)'} cannot be planned under a memory budget: choose from {', '.join(known)} or 'all'"
        )
    return names


def _unbudgeted_policies(policies: str) -> tuple[str, ...]:
    """The policies to simulate without a budget; a strategy asks for one."""
    from cswap.simulate.policies import resolve_policies
    from cswap.simulate.strategies import STRATEGIES

    named = [p.strip() for p in policies.split(",") if p.strip()]
    strategies = [p for p in named if p in STRATEGIES]
    if strategies:
        raise ValueError(f"strategies {strategies} are compared under a memory budget: add --memory-budget (e.g. 0.5,0.25,0.1)")
    return resolve_policies(policies)


def _what(report: dict[str, Any]) -> str:
    """``vgg16 batch 64``, or for a transformer ``gpt2 batch 1 x 1024 tokens, 12 layers, bfloat16, sdpa``."""
    what = f"{report['model']} batch {report['batch_size']}"
    if report.get("seq_len"):
        what += f" x {report['seq_len']} tokens, {report.get('num_layers')} layers, {report.get('dtype')}, {report.get('attention')}"
    return what


def _table(report: dict[str, Any]) -> Table:
    """The policies' figures; :func:`_notes` says what the table alone cannot (print them under it).

    Under a budget "recomp ms" holds the recomputation, apart from the codec's "codec ms".
    """
    base, _ = _baseline(report)
    title = (
        f"{_what(report)} on {report['hardware']}: "
        f"{report['compute_s'] * 1e3:.1f} ms compute, {report['saved_bytes'] / 1e9:.2f} GB saved activations"
    )
    if "budget_bytes" in report:
        title += f", budget {report['budget_bytes'] / 1e9:.2f} GB"
    if report.get("host_budget_bytes"):
        title += f", host budget {report['host_budget_bytes'] / 1e9:.2f} GB"
    budgeted = "budget_bytes" in report
    table = Table(title=title)
    columns = ("policy", "iter ms", "x none", "xfer ms", "codec ms", *(("recomp ms",) if budgeted else ()), "peak GB", "formula ms", "plan")
    for column in columns:
        table.add_column(column, justify="left" if column in ("policy", "plan") else "right", no_wrap=column == "policy")
    for name, row in report["policies"].items():
        if row.get("infeasible"):
            why = "infeasible"
            if row.get("binding"):  # under a host budget: which binds, and the host's least beside the device budget
                host_least = row.get("host_minimum_bytes")
                why += f" ({row['binding']} binds" + (f"; host needs {host_least / 1e9:.2f} GB" if host_least else "") + ")"
            table.add_row(name, *("-",) * (len(columns) - 4), f"needs {row['minimum_bytes'] / 1e9:.2f}", "-", why)
            continue
        recompute_s = row.get("recompute_s", 0.0)
        table.add_row(
            name,
            f"{row['iteration_s'] * 1e3:.1f}",
            f"{row['iteration_s'] / base:.2f}" if base else "-",
            f"{row['exposed_transfer_s'] * 1e3:.1f}",
            f"{(row['codec_s'] - recompute_s) * 1e3:.1f}",
            *((f"{recompute_s * 1e3:.1f}",) if budgeted else ()),
            f"{row['peak_bytes'] / 1e9:.2f}",
            f"{row['formula_iteration_s'] * 1e3:.1f}",
            row["plan"],
        )
    return table


def _baseline(report: dict[str, Any]) -> tuple[float | None, str]:
    """What "x none" divides by, and a note when it is not policy ``none``'s row: under a budget
    ``none`` does not fit (or was not asked for), its time without a budget stands in."""
    row = report["policies"].get("none")
    if row is not None and not row.get("infeasible"):
        return row["iteration_s"], ""
    unbudgeted = report.get("none_iteration_s")
    if not unbudgeted:
        return None, ""
    why = (
        f"none needs {report['none_peak_bytes'] / 1e9:.2f} GB, over the budget"
        if report.get("none_peak_bytes", 0) > report.get("budget_bytes", 0)
        else "none was not asked for"
    )
    return unbudgeted, f'"x none" is over none without a budget, {unbudgeted * 1e3:.1f} ms ({why}).'


#: What each label of the "plan" column means (the budget planner's statuses after "budget ").
_PLAN_LABELS: dict[str, str] = {
    "static": "the policy's fixed rule, nothing planned",
    "cost-model": "cswap's per-tensor cost model: compress where T < T'",
    "swap": "cswap's check in the queue model: swapping every moved tensor beat the cost model's plan",
    "compress-swap": "cswap's check in the queue model: compressing every moved tensor beat the cost model's plan",
    "ranked": "the N of the M compressible moved tensors that save the most link time per codec second are compressed, the rest swapped",
    "budget optimal": "the planner's exact program (an action per tensor, the budget held at every event), solved to optimality",
    "budget time-limit": "the exact program's best plan when the solver's --time-limit ran out",
    "budget greedy": "the planner's greedy plan, which the solver did not beat in time",
    "budget tied": "the exact program with the repeated layers tied (one decision per tensor position "
    "for each block of identical layers), then refined layer by layer; the budget holds at every event",
    "budget tied-time-limit": "as budget tied, the solver's best when the --time-limit ran out",
    "budget tied-greedy": "as budget tied, from the greedy plan",
    "budget capuchin": "Capuchin's own greedy planner",
    "budget plan": "cswap carries out that policy's plan (made with fewer actions): it ran faster in the queue model than cswap's own",
    "plan": "cswap carries out that strategy's plan: it fits the budget and ran faster in the queue model",
    "fixed": "a strategy's own plan, the same at every budget (ac-full checkpoints every layer, ...): it fits when its peak does",
    "knapsack": "recompute-knapsack's choice: a 0-1 knapsack of recomputation seconds against bytes kept",
}


def _plan_kind(label: str) -> tuple[str, str]:
    """The key of :data:`_PLAN_LABELS` for a "plan" cell, and how the legend names it.

    Example:
        >>> _plan_kind("budget swap plan"), _plan_kind("ac-full plan"), _plan_kind("ranked 3/9")
        (('budget plan', 'budget <policy> plan'), ('plan', '<strategy> plan'), ('ranked', 'ranked N/M'))
    """
    if label.startswith("budget ") and label.endswith(" plan"):
        return "budget plan", "budget <policy> plan"
    if label.endswith(" plan"):
        return "plan", "<strategy> plan"
    if label.startswith("ranked "):
        return "ranked", "ranked N/M"
    return label, label


def _notes(report: dict[str, Any]) -> list[str]:
    """Lines to print under :func:`_table`'s table: what "x none" is over when not none's row, that
    nothing fits the budget, and a legend of the plan labels shown."""
    notes = []
    _, baseline_note = _baseline(report)
    if baseline_note:
        notes.append(baseline_note)
    rows = report["policies"]
    if "budget_bytes" in report and rows and all(row.get("infeasible") for row in rows.values()):
        least = min(row["minimum_bytes"] for row in rows.values())
        names = ", ".join(name for name, row in rows.items() if row["minimum_bytes"] == least)
        notes.append(
            f"Nothing fits in {report['budget_bytes'] / 1e9:.2f} GB: the least any needs is {least / 1e9:.2f} GB ({names})."
        )
        if report.get("pinned_bytes"):
            notes.append(
                f"{report['pinned_bytes'] / 1e9:.3f} GB of saved tensors are below --min-bytes ({report['min_bytes']:,d} B) and stay "
                "on the device whatever the budget; --min-bytes 0 lets the planner move them, as the runtime may under a budget."
            )
    shown: dict[str, str] = {}
    for row in rows.values():
        if not row.get("infeasible"):
            key, name = _plan_kind(row["plan"])
            shown.setdefault(name, _PLAN_LABELS.get(key, ""))
    legend = [f"  {name}: {meaning}" for name, meaning in shown.items() if meaning]
    if legend:
        notes += ["plan:", *legend]
    return notes


def _lengths_table(report: dict[str, Any]) -> Table:
    """Per policy and length: the longest length's plan carried out there, beside the length's own plan."""
    picked = report["seq_lens"]
    what = f"{report['model']} batch {report['batch_size']}, {report.get('num_layers')} layers, {report.get('dtype')}, {report.get('attention')}"
    title = (
        f"{what} on {report['hardware']}: every length served by the plan for {picked['served_by']} tokens"
        + (f", budget {report['budget_bytes'] / 1e9:.2f} GB" if "budget_bytes" in report else "")
        + f"; lengths {', '.join(str(n) for n in picked['lengths'])}"
        + (f" (from {picked['given']}: {picked['picked']})" if picked["picked"] != "given" else "")
    )
    table = Table(title=title)
    for column in ("policy", "tokens", "iter ms", "peak GB", "own plan ms", "own peak GB", "x own"):
        table.add_column(column, justify="left" if column == "policy" else "right", no_wrap=column == "policy")
    names = list(report["lengths"][0]["policies"]) if report["lengths"] else []
    for name in names:
        for position, row in enumerate(report["lengths"]):
            figures = row["policies"][name]
            own = figures.get("own_iteration_s")
            served = "infeasible" if figures["infeasible"] else f"{figures['iteration_s'] * 1e3:.1f}"
            table.add_row(
                name if position == 0 else "",
                str(row["seq_len"]),
                served,
                "-" if figures["infeasible"] else f"{figures['peak_bytes'] / 1e9:.2f}",
                "-" if own is None else f"{own * 1e3:.1f}",
                "-" if own is None else f"{figures['own_peak_bytes'] / 1e9:.2f}",
                "-" if figures["ratio_to_own_plan"] is None else f"{figures['ratio_to_own_plan']:.2f}",
                end_section=position == len(report["lengths"]) - 1,
            )
    return table


def _print_notes(console: Console, report: dict[str, Any]) -> None:
    """Print :func:`_notes` as plain lines (a label is never read as rich markup), a legend line
    wrapped under its own text."""
    import textwrap

    for line in _notes(report):
        indent = " " * (len(line) - len(line.lstrip()) + 2)
        for part in textwrap.wrap(line, width=max(console.width - 1, 40), subsequent_indent=indent):
            console.print(part, markup=False, highlight=False, soft_wrap=True)


def _print_skipped(console: Console, report: dict[str, Any]) -> None:
    """Say which strategies 'all' left out, and why."""
    for name, reason in report.get("skipped", {}).items():
        console.print(f"{name}: not run, {reason}")


def register(app: typer.Typer) -> None:
    """Add ``simulate`` to the ``cswap`` command."""

    @app.command("simulate")
    def simulate(
        model: str = typer.Option(
            "vgg16",
            help="An image model (cswap.models.MODEL_NAMES), a transformer preset (gpt2, gpt2-xl, llama-3.2-1b, "
            "llama-3-8b, bert-base, bert-large, gpt3-175b-layer), hf:<model_type>, a transformer config path "
            "(.yaml, config.json), or package.module:function (a transformer with --seq-len); ignored with --trace.",
        ),
        batch_size: Optional[int] = typer.Option(None, min=1, help="Images or sequences per iteration (default: 64 images, 1 sequence)."),
        resolution: int = typer.Option(224, min=1, help="Image side in pixels."),
        seq_len: Optional[str] = typer.Option(
            None,
            help="Tokens per sequence of a transformer (default: the preset's); several, as a range (128-1024: its ends "
            "and the powers of two between, at most 6) or a list (128,256,512), serve every shorter length with each "
            "policy's plan for the longest and show what that costs against a plan made for the length.",
        ),
        layers: Optional[int] = typer.Option(None, min=1, help="Transformer layers, replacing the preset's (e.g. 80)."),
        attention: Optional[str] = typer.Option(
            None, help="Transformer attention: sdpa (a fused kernel, no s*s tensors saved) or eager (default: sdpa)."
        ),
        hardware: str = typer.Option("v100-pcie3", help="Hardware profile name (configs/hardware) or YAML path."),
        policies: str = typer.Option(
            "all",
            help="'all' or a comma-separated list of: none, swap, cpu-compress-swap (vDNN++: copy out in full, "
            "then the host CPU compresses it; decompress on the host before the copy back), compress-swap, "
            "cswap, compress-keep; with --memory-budget also recompute, capuchin and the strategies users pick "
            "instead: ac-full, ac-selective, offload-all, offload-all+ac, megatron-offload, recompute-knapsack, "
            "ilp-kro (cswap.simulate.strategies; 'all' takes those that can run on the trace).",
        ),
        trace: Path = typer.Option(None, help="A profiled trace (rt.trace().to_json(path)) instead of a meta trace."),
        sparsity: float = typer.Option(None, min=0.0, max=1.0, help="ReLU-output sparsity of the meta trace (default 0.5)."),
        compressibility: str = typer.Option(
            "all-minilm-l6-v2",
            help="What exponent coding and bit-packing give each kind of saved tensor of a meta trace: a profile in "
            "configs/compressibility/ (measured on a trained model) or a YAML path; 'none' for ZVC alone.",
        ),
        min_bytes: int = typer.Option(
            None, min=0,
            help="Activations below this stay on the device (default: the runtime's, 256 KiB). Under a memory budget the "
            "runtime may still move them and the simulator does not: pass 0 for a model whose saved tensors are small.",
        ),
        prefetch_depth: int = typer.Option(1, min=1, help="Swap-ins issued ahead of need, in tensors."),
        max_inflight: int = typer.Option(None, min=1, help="Swap-outs in flight before compute waits (default: unbounded)."),
        paper_size: bool = typer.Option(False, help="Size compressed tensors as Size*(1-Sparsity), as the paper does."),
        dtype: Optional[str] = typer.Option(
            None, help="Parameter and activation dtype of the meta trace (default: float32 images, bfloat16 transformers)."
        ),
        memory_budget: str = typer.Option(
            None,
            help="Plan every policy under this budget for saved activations: bytes, '2GiB', '1.5GB', or a fraction "
            "of none's peak (0.5); several, comma separated, sweep them (--plot draws time against budget).",
        ),
        host_memory_budget: str = typer.Option(
            None,
            help="With --memory-budget: plan every policy within this host budget for saved activations' host copies "
            "too: bytes, '8GiB', or auto (half the cgroup limit, else of the available RAM).",
        ),
        time_limit: float = typer.Option(30.0, min=0.1, help="The planner's solver time limit per solve, seconds."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
        plot: Path = typer.Option(None, help="Write stacked bars of the breakdown to this PNG."),
    ) -> None:
        """Simulate one training iteration under each policy on a hardware profile (no GPU needed).

        Columns: "iter ms" is the iteration in the queue model (copies and codec calls wait for the link
        and each other); "x none" is that over policy none's (where none does not fit the budget, over
        none's without one, as a note under the table says); "xfer ms" is the copy time compute waits
        for in it, "codec ms" the (de)compression and, under a budget, "recomp ms" the forward work run
        again to rebuild recomputed tensors. "formula ms" is the same iteration by the paper's per-
        tensor formula, which prices each tensor alone: each copy must hide in its own window (out:
        until the next moved tensor is produced; back: from the use of the moved tensor before it), and
        what does not is charged as if compute waited for it. So the gap to "iter ms" goes both ways:
        copies piling up on the link lengthen "iter ms", while copies that run on into later compute
        (swap-outs hold compute back only with --max-inflight) or that a budget plan fetches further
        ahead shorten it; without a budget and with --max-inflight 1, swap's two are equal. "plan" says
        how the actions were chosen ("ranked N/M": the N of the M compressible moved tensors that save
        the most link time per codec second compressed, the rest swapped); a legend under the table
        explains each label shown.

        With several --seq-len lengths a second table follows: per policy and length, the iteration
        and peak of the longest length's plan carried out at that length, the same of a plan made
        for that length ("own plan ms", "own peak GB"), and "x own", the first time over the second:
        what serving the length with the longest length's plan costs. A fractional --memory-budget
        is of the longest length's none peak, one cap for every length.
        """
        try:
            report = run_simulate(
                model=model,
                batch_size=batch_size,
                resolution=resolution,
                hardware=hardware,
                policies=policies,
                trace_path=trace,
                sparsity=sparsity,
                min_bytes=min_bytes,
                prefetch_depth=prefetch_depth,
                max_inflight_offloads=max_inflight,
                paper_size=paper_size,
                dtype=dtype,
                memory_budget=memory_budget,
                host_memory_budget=host_memory_budget,
                time_limit_s=time_limit,
                seq_len=seq_len,
                num_layers=layers,
                attention=attention,
                compressibility=compressibility,
            )
        except (ValueError, FileNotFoundError, ImportError) as error:
            raise fail(error) from None
        results = report.pop("_results")
        sweep = report.pop("_sweep", None)
        if sweep is not None and "budgets" in report:
            if plot is not None:
                from cswap.simulate.plot import plot_budget_sweep

                plot_budget_sweep(sweep, plot, title=f"{_what(report)} on {report['hardware']}")
            if as_json:
                typer.echo(json.dumps(report))
            else:
                console = Console() if Console().is_terminal else Console(width=120)
                for row in report["budgets"]:
                    console.print(_table({**report, **row}))
                    _print_notes(console, {**report, **row})
                _print_skipped(console, report)
                if plot is not None:
                    console.print(f"wrote {plot}")
            return
        if plot is not None:
            from cswap.simulate.plot import plot_breakdown

            title = f"{_what(report)} on {report['hardware']}"
            plot_breakdown(results, plot, title=title)
        if as_json:
            typer.echo(json.dumps(report))
        else:
            console = Console()
            if not console.is_terminal:  # piped: rich would squeeze the table into 80 columns
                console = Console(width=120)
            console.print(_table(report))
            _print_notes(console, report)
            if "lengths" in report:
                console.print(_lengths_table(report))
            _print_skipped(console, report)
            if plot is not None:
                console.print(f"wrote {plot}")
