"""The simulator's figures: the CSWAP reproduction table, the sparsity x bandwidth sweep, and the
check of simulated against measured iteration times on this machine's CPU.

Every line printed is one JSON object with a ``kind``:

* ``header``: machine, date, settings.
* ``reproduce``: per model and setting on the paper's hardware (V100, PCIe 3; ImageNet-sized
  input), each policy's simulated iteration seconds (queue model, and the per-tensor formula) and
  cswap's speed-ups, each a ratio of two policies simulated on the same trace:
  ``vs_vdnn = swap / cswap - 1``, ``vs_vdnnpp = cpu-compress-swap / cswap - 1``,
  ``vs_static = compress-swap / cswap - 1``, ``time_cut_vs_vdnn = 1 - cswap / swap``.
* ``reproduce_summary``: their means over the models next to the paper's figures.
* ``sweep`` / ``sweep_break_even``: compress-swap and cswap against swap on a grid of ReLU-output
  sparsity and link bandwidth (VGG-16), and per bandwidth the sparsity where compression starts
  to pay.
* ``validate`` / ``validate_summary``: per model and runtime policy, the measured and simulated
  iteration seconds on this CPU and the error (simulated / measured - 1, median over rounds; and
  ``error_fastest`` from the fastest rounds, which a shared machine disturbs least).

Settings of the reproduction: ``default`` (copies queue freely, one prefetch ahead, ReLU sparsity
0.5); ``vdnn-sync`` (at most one swap-out in flight: vDNN's per-layer synchronisation);
``sparsity-0.7`` (trained networks are sparser than freshly initialised ones); ``host-8-threads``
(vDNN++'s host codec eight times faster).

Usage:
    python benchmarks/simulate.py                       # everything (validation takes minutes)
    python benchmarks/simulate.py --only reproduce,sweep --plot-dir docs
    python benchmarks/simulate.py --quick               # fewer models, a coarse sweep, short validation
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict
from typing import Any

from cswap.simulate import SimConfig, Simulator, SparsityModel, load_hardware, meta_trace
from cswap.simulate.plot import plot_breakdown, plot_normalized, plot_sweep
from cswap.simulate.sweep import sweep

PAPER_MODELS = ("alexnet", "vgg16", "vgg19", "resnet50", "mobilenet_v2", "squeezenet1_1", "googlenet")
PAPER = {"vs_vdnn": 0.25, "vs_vdnnpp": 1.90, "vs_static": 0.055, "time_cut_vs_vdnn": 0.207}
VALIDATION_MODELS = ("alexnet", "vgg11", "resnet18", "squeezenet1_1")


def emit(kind: str, **fields: Any) -> None:
    print(json.dumps({"kind": kind, **fields}), flush=True)


def _faster_host(profile: Any, factor: float) -> Any:
    host = profile.host_codec
    faster = host.model_copy(update={"compress_gbps": host.compress_gbps * factor, "decompress_gbps": host.decompress_gbps * factor})
    return profile.model_copy(update={"host_codec": faster})


def reproduce(models: tuple[str, ...], batch_size: int, hardware: str, plot_dir: str | None) -> None:
    profile = load_hardware(hardware)
    traces = {m: meta_trace(m, batch_size, 224, profile) for m in models}
    sparse = {m: meta_trace(m, batch_size, 224, profile, sparsity=SparsityModel(relu=0.7)) for m in models}
    settings = {
        "default": (traces, profile, SimConfig()),
        "vdnn-sync": (traces, profile, SimConfig(max_inflight_offloads=1)),
        "sparsity-0.7": (sparse, profile, SimConfig()),
        "host-8-threads": (traces, _faster_host(profile, 8.0), SimConfig()),
    }
    for setting, (chosen, hw, config) in settings.items():
        ratios: dict[str, list[float]] = {key: [] for key in PAPER}
        normalized: dict[str, dict[str, float]] = {}
        for model in models:
            start = time.perf_counter()
            results = Simulator(chosen[model], hw, config).run_all("all")
            seconds = {p: r.iteration_s for p, r in results.items()}
            cswap = seconds["cswap"]
            row = {
                "vs_vdnn": seconds["swap"] / cswap - 1,
                "vs_vdnnpp": seconds["cpu-compress-swap"] / cswap - 1,
                "vs_static": seconds["compress-swap"] / cswap - 1,
                "time_cut_vs_vdnn": 1 - cswap / seconds["swap"],
            }
            for key, value in row.items():
                ratios[key].append(value)
            normalized[model] = seconds
            emit(
                "reproduce",
                setting=setting,
                model=model,
                hardware=hw.name,
                batch_size=batch_size,
                resolution=224,
                saved_gb=sum(r.nbytes for r in chosen[model].tensors if r.offloadable) / 1e9,
                iteration_s=seconds,
                formula_iteration_s={p: r.formula.iteration_s for p, r in results.items()},
                peak_gb={p: r.peak_bytes / 1e9 for p, r in results.items()},
                cswap_plan=results["cswap"].plan,
                cswap_actions=results["cswap"].action_counts(),
                simulate_s=time.perf_counter() - start,
                **row,
            )
            if plot_dir and setting == "default" and model == "vgg16":
                plot_breakdown(results, f"{plot_dir}/vgg16-v100-pcie3.png", title=f"vgg16, batch {batch_size}, V100 + PCIe 3 (simulated)")
        emit(
            "reproduce_summary",
            setting=setting,
            models=list(models),
            mean={key: statistics.mean(values) for key, values in ratios.items()},
            paper=PAPER,
        )
        if plot_dir and setting == "default":
            plot_normalized(
                {m: {p: s for p, s in row.items() if p != "none"} | {"none": row["none"]} for m, row in normalized.items()},
                f"{plot_dir}/reproduction.png",
                title=f"Simulated iteration time relative to vDNN (swap): V100 + PCIe 3, batch {batch_size}",
            )


def run_sweep(quick: bool, plot_dir: str | None, batch_size: int) -> None:
    sparsities = (0.0, 0.3, 0.6, 0.9) if quick else (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
    bandwidths = (4.0, 12.0, 50.0, 450.0) if quick else (4.0, 8.0, 12.0, 16.0, 25.0, 32.0, 50.0, 64.0, 100.0, 200.0, 450.0)
    result = sweep("vgg16", "v100-pcie3", batch_size=batch_size, resolution=224, sparsities=sparsities, bandwidths_gbps=bandwidths)
    for row in result.rows():
        emit("sweep", **row)
    even = result.break_even()
    emit("sweep_break_even", model="vgg16", hardware="v100-pcie3", link_gbps=list(result.bandwidths_gbps), break_even_sparsity=even)
    if plot_dir:
        plot_sweep(
            result.sparsities,
            result.bandwidths_gbps,
            result.speedup(),
            f"{plot_dir}/sweep.png",
            title=f"vgg16 batch {batch_size}, V100 compute: compress-swap vs swap (simulated)",
            break_even=even,
        )


def run_validation(quick: bool) -> None:
    from cswap.simulate.validate import measure_runtime_overheads, thread_limit, validate

    start = time.perf_counter()
    with thread_limit(1):  # as validate() measures
        overheads = measure_runtime_overheads()
    emit("validate_overheads", **asdict(overheads))
    models = VALIDATION_MODELS[:3] if quick else VALIDATION_MODELS
    rows = validate(models=models, batch_size=32, resolution=64, width_mult=0.25, iterations=3 if quick else 11, threads=1, overheads=overheads)
    for row in rows:
        emit("validate", **row.to_dict())
    per_model = {}
    for model in models:
        errors = [abs(r.error) for r in rows if r.model == model]
        fastest = [abs(r.error_fastest) for r in rows if r.model == model]
        per_model[model] = {
            "max_abs_error": max(errors),
            "mean_abs_error": statistics.mean(errors),
            "max_abs_error_fastest": max(fastest),
        }
    within = [m for m, e in per_model.items() if e["max_abs_error"] <= 0.15]
    within_fastest = [m for m, e in per_model.items() if e["max_abs_error_fastest"] <= 0.15]
    emit(
        "validate_summary",
        per_model=per_model,
        models_within_15pct=within,
        models_within_15pct_fastest=within_fastest,
        mean_abs_error=statistics.mean(abs(r.error) for r in rows),
        seconds=time.perf_counter() - start,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="reproduce,sweep,validate", help="comma-separated: reproduce, sweep, validate")
    parser.add_argument("--quick", action="store_true", help="fewer models, a coarse sweep, a short validation")
    parser.add_argument("--batch-size", type=int, default=64, help="batch of the reproduction and the sweep")
    parser.add_argument("--hardware", default="v100-pcie3", help="profile of the reproduction")
    parser.add_argument("--plot-dir", default=None, help="write reproduction.png, sweep.png and a breakdown here")
    args = parser.parse_args()
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    unknown = parts - {"reproduce", "sweep", "validate"}
    if unknown:
        sys.exit(f"unknown --only parts {sorted(unknown)}: choose from reproduce, sweep, validate")
    emit(
        "header",
        machine=platform.node(),
        processor=platform.processor() or platform.machine(),
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        parts=sorted(parts),
        quick=args.quick,
        batch_size=args.batch_size,
        hardware=args.hardware,
    )
    if "reproduce" in parts:
        models = PAPER_MODELS[:3] if args.quick else PAPER_MODELS
        reproduce(models, args.batch_size, args.hardware, args.plot_dir)
    if "sweep" in parts:
        run_sweep(args.quick, args.plot_dir, args.batch_size)
    if "validate" in parts:
        run_validation(args.quick)


if __name__ == "__main__":
    main()
