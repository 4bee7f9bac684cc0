"""One command that measures everything on one GPU (or the CPU-capable part on a CPU): JSON + summary.

Steps, each timed and isolated (a step that fails is recorded with its error and the suite goes
on; a step whose optional package is missing is recorded as skipped, naming it):

* ``gpu_tests``: ``pytest -m gpu tests/`` without Numba's simulator (``NUMBA_ENABLE_CUDASIM``
  unset), results read from its JUnit XML. Needs a GPU.
* ``lossless_traffic``: exponent coding and bit-packing on the backend of the device, each op
  timed against a copy of the same bytes (``benchmarks/codecs.py``'s ``measure_lossless``), with
  nvCOMP's ANS beside them where ``nvidia-nvcomp`` imports.
* ``codec_traffic``: ZVC compress and decompress traffic against the device's copy bandwidth
  (``benchmarks/codecs.py``'s ``measure``), fp32 and bf16 at sparsity 0.5 and 0.9: the ``cuda``
  backend at 64 and 256 MiB on a GPU; the ``cpu`` backend against memcpy at small sizes on a CPU.
* ``transformers``: cswap under dynamic padding against a fixed length (``benchmarks/dynamic_shapes.py``;
  on a GPU, GPT-2 as ``GPT2Config()`` ships and a small Llama, bf16 autocast): time over plain,
  profiles, plans made without one, iterations over the budget in force.
* ``tuning``: BO against grid search on the backend's launch-config search space
  (``benchmarks/tuning.py``'s ``run_case``): evaluations until within 5% of grid's best.
* ``training``: iterations of vgg16 and resnet50 (224x224 on a GPU) under plain PyTorch,
  ``save_on_cpu``, torchtune's ``OffloadActivations`` (GPU, when it imports), and every cswap
  policy, also with a memory budget of half plain's peak where ``Runtime`` takes
  ``memory_budget=`` (``benchmarks/training.py``'s ``measure``); time and peak memory as ratios to
  plain.
* ``max_batch``: ``cswap max-batch`` for resnet50 in an emulated 16 GiB GPU. Needs a GPU.
* ``simulator``: the simulator's prediction of measured iterations and its error
  (``cswap.simulate.validate``, which measures on the CPU on any machine).

Usage:
    python benchmarks/gpu_suite.py --out benchmarks/results/gpu-$(date -u +%F)       # on a GPU (< 8 min: --deadline-s)
    python benchmarks/gpu_suite.py --device cpu --out benchmarks/results/cpu-$(date -u +%F)
    python benchmarks/gpu_suite.py --device cpu --scale smoke --out /tmp/suite        # seconds, for tests
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
#: In the order they run: what only a GPU can show first (its tests, the kernels' speeds), so that a
#: run cut short by its deadline has measured those.
STEPS: tuple[str, ...] = ("gpu_tests", "lossless_traffic", "codec_traffic", "transformers", "training", "tuning", "max_batch",
                          "simulator")
#: Steps that only a GPU can run, and why.
GPU_ONLY: dict[str, str] = {
    "gpu_tests": "the gpu-marked tests run the CUDA kernels and streams on a real device",
    "max_batch": "cswap max-batch measures device memory",
}
#: The budget rows get this fraction of plain PyTorch's peak, fixed beforehand (never fitted).
BUDGET_FRACTION = 0.5
#: Seconds after which the suite starts no more work (steps, models, policies), so that one call
#: ends within 8 minutes on any GPU; what it did not reach is recorded as skipped, with the
#: ``--only`` call that runs it.
DEADLINE_S = 420.0
#: The published figures the codec traffic is set beside (not measured here).
NVCOMP_PUBLISHED = (
    "nvCOMP 1.0's README (github.com/NVIDIA/nvcomp) reports Cascaded compression at up to 500 GB/s "
    "(ratios up to 80x on numerical columns) and LZ4 decompression at up to 60 GB/s, on a Tesla V100 PCIe."
)
GOALS = {
    "codec_traffic_vs_copy_at_64mib": 0.5,
    "cswap_vs_plain_time": 1.25,
    "cswap_vs_save_on_cpu_time": 0.5,
}


@dataclass(frozen=True)
class Scale:
    """The sizes of one run of the suite."""

    codec_sizes_mib: tuple[int, ...]
    codec_repeats: int
    codec_budget_s: float
    tune_nbytes: int
    tune_ops: tuple[str, ...]
    tune_seeds: int
    tune_repeats: int
    tune_rounds: int
    tune_budget: int | None
    train_models: tuple[str, ...]
    train_batch: int | None
    train_resolution: int
    train_width_mult: float
    train_iterations: int
    train_rounds: int
    sim_models: tuple[str, ...]
    sim_batch: int
    sim_resolution: int
    sim_iterations: int
    lossless_sizes_mib: tuple[int, ...] = (1,)
    #: Dynamic padding rows: (models, steps, batch, shortest, longest, repeats).
    transformer_runs: tuple[tuple[str, ...], int, int, int, int, int] = (("gpt2",), 3, 2, 8, 24, 1)


SCALES: dict[str, Scale] = {
    # The CUDA compress grid has 5400 configs and run_case walks it about four times (grid, the
    # reference passes, the peer's warm start): few repeats keep the step within a couple of minutes.
    "gpu": Scale((64, 256), 11, 2.0, 16 << 20, ("compress", "decompress"), 2, 3, 2, None,
                 ("vgg16", "resnet50"), None, 224, 1.0, 5, 2, ("vgg16", "resnet50"), 8, 32, 2,
                 lossless_sizes_mib=(64,), transformer_runs=(("gpt2-shipped", "llama"), 12, 8, 64, 512, 1)),
    "cpu": Scale((4, 16), 7, 1.0, 1 << 20, ("compress",), 2, 3, 2, None,
                 ("vgg16", "resnet50"), 4, 32, 0.125, 3, 2, ("vgg16", "resnet50"), 4, 32, 2,
                 lossless_sizes_mib=(4,), transformer_runs=(("gpt2",), 8, 4, 20, 120, 1)),
    "smoke": Scale((1,), 3, 0.2, 64 << 10, ("compress",), 1, 1, 1, 3,
                   ("vgg16", "resnet50"), 2, 32, 0.0625, 2, 1, ("vgg16",), 2, 32, 1),
}


class Skipped(Exception):
    """A step that cannot run here; the message says why."""


@dataclass(frozen=True)
class Deadline:
    """When the suite stops starting work: ``limit_s`` seconds after ``start`` (``time.perf_counter``)."""

    start: float
    limit_s: float

    def passed(self) -> bool:
        return time.perf_counter() - self.start > self.limit_s

    def reason(self, rerun: str) -> str:
        return f"not reached: the suite's {self.limit_s:.0f} s deadline passed first (run it alone: --only {rerun})"


def load_benchmark(name: str) -> ModuleType:
    """A sibling script as a module (by path: ``benchmarks/codecs.py`` would clash with the stdlib's ``codecs``)."""
    key = f"cswap_benchmark_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


def run_step(name: str, fn: Callable[[], dict[str, Any]], needs_gpu: bool) -> dict[str, Any]:
    """Run one step: ``ok`` with its result, ``skipped`` with the reason, or ``failed`` with the error."""
    start = time.perf_counter()
    record: dict[str, Any] = {"needs_gpu": needs_gpu}
    try:
        record.update(status="ok", result=fn())
    except Skipped as skip:
        record.update(status="skipped", reason=str(skip))
    except ImportError as missing:
        record.update(status="skipped", reason=f"optional package missing: {missing}")
    except Exception as error:  # a failed step is data: the suite goes on
        record.update(status="failed", error=f"{type(error).__name__}: {error}", traceback=traceback.format_exc(limit=8))
    record["seconds"] = time.perf_counter() - start
    print(f"[gpu_suite] {name}: {record['status']} in {record['seconds']:.1f} s", file=sys.stderr, flush=True)
    return record


def _require_gpu(step: str, device: torch.device) -> None:
    if device.type != "cuda":
        raise Skipped(f"needs a GPU: {GPU_ONLY[step]}")


def step_gpu_tests(device: torch.device, out: Path) -> dict[str, Any]:
    """``pytest -m gpu tests/`` on the real device; counts and failed test ids from the JUnit XML."""
    _require_gpu("gpu_tests", device)
    xml_path = out / "gpu-tests.xml"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    # A module that cannot be collected there (a dev-only package missing) must not stop the rest.
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "tests", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
               f"--junitxml={xml_path}"]
    completed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return {**parse_junit(xml_path), "exit_code": completed.returncode, "output_tail": completed.stdout[-2000:]}


def parse_junit(xml_path: Path) -> dict[str, Any]:
    """Counts (tests, failures, errors, skipped, passed) and failed test ids from pytest's JUnit XML."""
    suite = ElementTree.parse(xml_path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    if suite is None:
        raise ValueError(f"{xml_path} holds no <testsuite>: not pytest's --junitxml output")
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    return {**counts, "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "failed_tests": failed}


def step_codec_traffic(device: torch.device, scale: Scale) -> dict[str, Any]:
    """Compress and decompress traffic per size, dtype and sparsity, with the copy bandwidth of the same run."""
    codecs = load_benchmark("codecs")
    backend = "cuda" if device.type == "cuda" else "cpu"
    rows = [asdict(row) for row in codecs.measure(
        list(scale.codec_sizes_mib), device, scale.codec_repeats, scale.codec_budget_s,
        sparsities=(0.5, 0.9), backends=[backend],
    )]
    baseline = "device copy (Tensor.copy_)" if device.type == "cuda" else "memcpy (Tensor.copy_ on the host)"
    return {"backend": backend, "baseline": baseline, "rows": rows}


def step_lossless_traffic(device: torch.device, scale: Scale) -> dict[str, Any]:
    """Exponent coding and bit-packing against a copy of the same bytes (and nvCOMP's ANS where it imports)."""
    codecs = load_benchmark("codecs")
    rows = list(codecs.measure_lossless(list(scale.lossless_sizes_mib), device, scale.codec_repeats, scale.codec_budget_s))
    try:  # a side figure: never lose the measured rows to it
        kernels = codecs.kernel_resources() if device.type == "cuda" else {}
    except Exception as error:
        kernels = {"unavailable": [{"signature": repr(error), "registers": None, "shared_bytes": None}]}
    return {"backend": "cuda" if device.type == "cuda" else "cpu", "rows": rows, "kernels": kernels}


def step_transformers(device: torch.device, scale: Scale, deadline: Deadline | None = None) -> dict[str, Any]:
    """cswap under dynamic padding against a fixed length (``benchmarks/dynamic_shapes.py``), per model."""
    dynamic = load_benchmark("dynamic_shapes")
    models, steps, batch, shortest, longest, repeats = scale.transformer_runs
    rows, skipped = [], {}
    for model in models:
        if deadline is not None and deadline.passed():
            skipped[model] = deadline.reason("transformers")
            continue
        rows.append(dynamic.measure(model, steps, batch, shortest, longest, "cswap", 0.6, repeats, 0, device))
    return {"rows": rows, "skipped_models": skipped,
            "autocast": "bf16 on a GPU, none on the CPU", "policy": "cswap", "memory_budget": 0.6}


def step_tuning(device: torch.device, scale: Scale, deadline: Deadline | None = None) -> dict[str, Any]:
    """BO against grid: evaluations until within 5% of grid's best, per op; past ``deadline`` no further op starts."""
    tuning = load_benchmark("tuning")
    backend = "cuda" if device.type == "cuda" else "cpu"
    cases: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    for op in scale.tune_ops:
        if deadline is not None and deadline.passed():
            skipped[op] = deadline.reason("tuning")
            continue
        rows, warm, facts = tuning.run_case(
            backend, op, "float32", scale.tune_nbytes, scale.tune_seeds, scale.tune_repeats, scale.tune_rounds,
            scale.tune_budget, lambda message: print(f"[gpu_suite] tuning: {message}", file=sys.stderr, flush=True),
        )
        by_method = {row.method: asdict(row) for row in rows}
        cases.append({
            "op": op, "facts": facts, "methods": by_method, "warm_start": asdict(warm),
            "bo_evals_to_reach": by_method["bo"]["evals_to_reach"], "grid_evals": by_method["grid"]["evaluations"],
            "bo_evals_vs_grid": by_method["bo"]["evals_vs_grid"], "bo_reach_rate": by_method["bo"]["reach_rate"],
        })
    return {"backend": backend, "search_space": f"{backend} (configs/search_spaces)", "cases": cases, "skipped_ops": skipped}


def runtime_takes_memory_budget() -> bool:
    """Whether ``cswap.Runtime`` has a ``memory_budget`` parameter in its signature."""
    import cswap

    return "memory_budget" in inspect.signature(cswap.Runtime).parameters


def step_training(device: torch.device, scale: Scale, deadline: Deadline | None = None) -> dict[str, Any]:
    """Every baseline and policy per model; the budget rows in a second pass once plain's peak is known.
    Past ``deadline`` no further model or budget pass starts (the rows left are named as skipped)."""
    training = load_benchmark("training")
    from cswap.options import POLICIES

    skipped: dict[str, str] = {}
    extra: list[str] = []
    if device.type != "cuda":
        skipped[training.OFFLOAD_ACTIVATIONS] = "needs a GPU: torchtune's OffloadActivations offloads to pinned host memory on CUDA streams"
    elif importlib.util.find_spec("torchtune") is None:
        skipped[training.OFFLOAD_ACTIVATIONS] = "optional package missing: torchtune"
    else:
        extra.append(training.OFFLOAD_ACTIVATIONS)
    budget_rows = [f"{p}{training.BUDGET_SUFFIX}" for p in POLICIES]
    if not runtime_takes_memory_budget():
        skipped.update({name: "cswap.Runtime has no memory_budget= parameter yet" for name in budget_rows})
    records: list[dict[str, Any]] = []
    gpu_batch = getattr(training, "GPU_BATCH", {})
    for model in scale.train_models:
        if deadline is not None and deadline.passed():
            skipped[model] = deadline.reason("training")
            continue
        batch = scale.train_batch or gpu_batch.get(model, 64)
        args = (batch, scale.train_resolution, scale.train_width_mult, scale.train_iterations, scale.train_rounds,
                "random", device, {})
        first = list(training.measure(model, (*extra, *POLICIES), *args))
        records += first
        plain_peak = next(r["peak_bytes"] for r in first if r["policy"] == "plain")
        if deadline is not None and deadline.passed():
            skipped[f"{model} budget rows"] = deadline.reason("training")
        elif budget_rows[0] not in skipped and plain_peak:
            budget = int(BUDGET_FRACTION * plain_peak)
            for record in training.measure(model, tuple(budget_rows), *args, memory_budget_bytes=budget):
                if record["policy"].endswith(training.BUDGET_SUFFIX):
                    within = None if record.get("infeasible") else record["peak_bytes"] is not None and record["peak_bytes"] <= budget
                    records.append({**record, "memory_budget_bytes": budget, "peak_within_budget": within})
    return {"records": records, "skipped_configs": skipped, "budget_fraction_of_plain_peak": BUDGET_FRACTION}


def step_max_batch(device: torch.device, deadline: Deadline | None = None) -> dict[str, Any]:
    """``cswap max-batch`` for resnet50 in an emulated 16 GiB GPU (bounds the search's time), one
    policy at a time; past ``deadline`` the policies left are named as skipped."""
    _require_gpu("max_batch", device)
    from cswap.training.maxbatch import max_batch
    from cswap.options import POLICIES

    limit = 16 << 30
    found: dict[str, int] = {}
    skipped: dict[str, str] = {}
    for policy in POLICIES:
        if deadline is not None and deadline.passed():
            skipped[policy] = deadline.reason("max_batch")
            continue
        found.update(max_batch("resnet50", (policy,), memory_limit_bytes=limit, resolution=224, ceiling=2048))
    return {"model": "resnet50", "memory_limit_bytes": limit, "resolution": 224, "max_batch": found, "skipped_policies": skipped}


def step_simulator(scale: Scale) -> dict[str, Any]:
    """Measured and simulated iteration seconds per model and runtime policy, and the error."""
    from cswap.simulate.validate import RUNTIME_POLICIES, validate

    rows = validate(models=scale.sim_models, policies=RUNTIME_POLICIES, batch_size=scale.sim_batch,
                    resolution=scale.sim_resolution, width_mult=0.125, iterations=scale.sim_iterations)
    return {"measured_on": "cpu", "rows": [row.to_dict() for row in rows]}


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def summary(report: dict[str, Any]) -> str:
    """The short markdown summary of a report."""
    steps = report["steps"]
    lines = [f"# GPU suite: {report['machine']} ({report['device']}), {report['date']}", "",
             f"Scale `{report['scale']}`; total {report['seconds']:.0f} s."
             + (" CPU run at small sizes: it shows that the CPU-capable steps run; its figures are not the GPU goals."
                if report["device"] == "cpu" else "")
             + ("" if report.get("complete", True) else " **Incomplete**: the run stopped before its last step."), "",
             "| step | status | seconds | note |", "|---|---|---|---|"]
    for name in STEPS:
        step = steps[name]
        note = step.get("reason") or step.get("error") or ""
        lines.append(f"| {name} | {step['status']} | {step['seconds']:.1f} | {note.splitlines()[0] if note else ''} |")
    skipped_gpu = [n for n in STEPS if steps[n]["status"] == "skipped" and steps[n].get("reason", "").startswith("needs a GPU")]
    lines += ["", "GPU-only steps: " + ", ".join(f"`{n}`" for n in GPU_ONLY) + "."]
    if skipped_gpu:
        lines.append("Skipped here because they need a GPU: " + ", ".join(f"`{n}`" for n in skipped_gpu) + ".")
    tests = steps["gpu_tests"]
    if tests["status"] == "ok":
        r = tests["result"]
        lines += ["", "## GPU tests", "", f"{r['passed']} passed, {r['failures']} failed, {r['errors']} errors, {r['skipped']} skipped."]
    codec = steps["codec_traffic"]
    if codec["status"] == "ok":
        r = codec["result"]
        lines += ["", f"## Codec traffic ({r['backend']} backend) against {r['baseline']}", "",
                  "| op | dtype | MiB | sparsity | traffic GB/s | copy GB/s | traffic / copy |", "|---|---|---|---|---|---|---|"]
        for row in r["rows"]:
            if not row["reuse"]:
                lines.append(f"| {row['op']} | {row['dtype']} | {row['nbytes'] >> 20} | {row['sparsity']:g} | "
                             f"{row['traffic_gbps']:.2f} | {row['copy_gbps']:.2f} | {row['traffic_vs_copy']:.2f} |")
        lines += ["", f"Goal on a GPU: traffic >= {GOALS['codec_traffic_vs_copy_at_64mib']:.0%} of device copy at 64 MiB. "
                  f"Yardstick (published figures, not measured here): {NVCOMP_PUBLISHED}"]
    lossless = steps["lossless_traffic"]
    if lossless["status"] == "ok":
        lines += ["", f"## Lossless codecs ({lossless['result']['backend']} backend) against a copy of the same bytes", "",
                  "| codec | backend | op | tensors | MiB | ratio | GB/s of input | copy GB/s | vs copy |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for row in lossless["result"]["rows"]:
            lines.append(f"| {row['codec']} | {row['backend']} | {row['op']} | {row['kind']} | {row['nbytes'] >> 20} | {row['ratio']:.2f} | "
                         f"{row['input_gbps']:.1f} | {row['copy_gbps']:.1f} | {row['input_vs_copy']:.2f} |")
        nvcomp = {row["nvcomp"] for row in lossless["result"]["rows"]}
        lines += ["", f"nvCOMP ANS: {', '.join(sorted(nvcomp))}."]
        for kernel, compiled in lossless["result"].get("kernels", {}).items():
            lines += [f"- `{kernel}`: " + "; ".join(f"{c['signature']}: {c['registers']} registers, {c['shared_bytes']} B shared"
                                                    for c in compiled)]
    transformers = steps["transformers"]
    if transformers["status"] == "ok":
        lines += ["", "## Dynamic padding (cswap at 0.6 of the peak, ratios to plain in the same run)", "",
                  "| model | shape | vs plain | without planning | profiled | planned unprofiled | iterations over budget |",
                  "|---|---|---|---|---|---|---|"]
        for row in transformers["result"]["rows"]:
            for shape in ("fixed", "dynamic"):
                r = row[shape]
                lines.append(f"| {row['model']} | {shape} | {r['over_plain']:.2f} | {r['over_plain_without_planning']:.2f} | "
                             f"{r['profiled_iterations']} | {r['unprofiled_plans']} | {r['iterations_over_budget']} |")
    tune = steps["tuning"]
    if tune["status"] == "ok":
        lines += ["", f"## BO against grid ({tune['result']['backend']} search space)", ""]
        for case in tune["result"]["cases"]:
            lines.append(f"- {case['facts']['case']}: BO within 5% of grid's best after {_fmt(case['bo_evals_to_reach'], '.1f')} "
                         f"evaluations (grid: {case['grid_evals']}; reach rate {case['bo_reach_rate']:.0%}).")
    train = steps["training"]
    if train["status"] == "ok":
        lines += ["", "## Training iterations (ratios to plain in the same run)", "",
                  "| model | config | time vs plain | memory vs plain | time vs save_on_cpu |", "|---|---|---|---|---|"]
        for r in train["result"]["records"]:
            if r.get("infeasible"):
                lines.append(f"| {r['model']} | {r['policy']} | infeasible at {r['memory_budget_bytes']} bytes: "
                             f"needs {r['minimum_bytes']} | | |")
                continue
            lines.append(f"| {r['model']} | {r['policy']} | {_fmt(r['vs_plain_time'])} | {_fmt(r['vs_plain_memory'])} | "
                         f"{_fmt(r['vs_save_on_cpu_time'])} |")
        for name, reason in train["result"]["skipped_configs"].items():
            lines.append(f"| - | {name} | skipped: {reason} | | |")
        lines += ["", f"Goals: cswap <= {GOALS['cswap_vs_plain_time']}x plain's time and <= {GOALS['cswap_vs_save_on_cpu_time']}x "
                  "save_on_cpu's; peak within the budget."]
    batch = steps["max_batch"]
    if batch["status"] == "ok":
        lines += ["", "## Max batch, resnet50 224x224, 16 GiB", "",
                  ", ".join(f"{p}: {b}" for p, b in batch["result"]["max_batch"].items())]
        lines += [f"- {p}: skipped, {reason}" for p, reason in batch["result"].get("skipped_policies", {}).items()]
    sim = steps["simulator"]
    if sim["status"] == "ok":
        lines += ["", "## Simulator against measured (CPU)", "", "| model | policy | measured ms | simulated ms | error |",
                  "|---|---|---|---|---|"]
        for r in sim["result"]["rows"]:
            lines.append(f"| {r['model']} | {r['policy']} | {r['measured_s'] * 1e3:.1f} | {r['simulated_s'] * 1e3:.1f} | {r['error']:+.0%} |")
    return "\n".join(lines) + "\n"


def run_suite(device: torch.device, scale_name: str, out: Path, only: tuple[str, ...] = STEPS,
              deadline_s: float = DEADLINE_S) -> dict[str, Any]:
    """Every step in order; writes ``suite.json`` and ``summary.md`` into ``out`` and returns the report.

    The files are written again after each step, so a run cut short keeps what it measured (the
    steps it did not reach say so). Past ``deadline_s`` seconds no further work starts.
    """
    from cswap.device import fingerprint

    out.mkdir(parents=True, exist_ok=True)
    scale = SCALES[scale_name]
    start = time.perf_counter()
    deadline = Deadline(start, deadline_s)
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "gpu_tests": lambda: step_gpu_tests(device, out),
        "lossless_traffic": lambda: step_lossless_traffic(device, scale),
        "transformers": lambda: step_transformers(device, scale, deadline),
        "codec_traffic": lambda: step_codec_traffic(device, scale),
        "tuning": lambda: step_tuning(device, scale, deadline),
        "training": lambda: step_training(device, scale, deadline),
        "max_batch": lambda: step_max_batch(device, deadline),
        "simulator": lambda: step_simulator(scale),
    }
    steps: dict[str, Any] = {
        name: {"status": "skipped", "needs_gpu": name in GPU_ONLY, "seconds": 0.0,
               "reason": "not reached: the suite stopped before it" if name in only else "not selected (--only)"}
        for name in STEPS
    }
    report = {
        "suite": "gpu_suite",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": device.type,
        "machine": fingerprint(device).name,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "scale": scale_name,
        "scale_settings": asdict(scale),
        "deadline_s": deadline_s,
        "gpu_only_steps": dict(GPU_ONLY),
        "skipped_for_no_gpu": [n for n in STEPS if n in GPU_ONLY and device.type != "cuda"],
        "goals": GOALS,
        "nvcomp_published": NVCOMP_PUBLISHED,
        "seconds": 0.0,
        "complete": False,
        "steps": steps,
    }
    for name in STEPS:
        if name not in only:
            continue
        if deadline.passed():
            steps[name] = {**steps[name], "reason": deadline.reason(name)}
        else:
            steps[name] = run_step(name, runners[name], name in GPU_ONLY)
        report["seconds"] = time.perf_counter() - start
        _write(out, report)
    report["complete"] = True
    _write(out, report)
    return report


def _write(out: Path, report: dict[str, Any]) -> None:
    (out / "suite.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "summary.md").write_text(summary(report))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for suite.json and summary.md")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    parser.add_argument("--scale", choices=tuple(SCALES), default=None, help="default: gpu on cuda, cpu on cpu")
    parser.add_argument("--only", default=",".join(STEPS), help=f"comma-separated steps (default all: {','.join(STEPS)})")
    parser.add_argument("--deadline-s", type=float, default=DEADLINE_S,
                        help=f"start no more work after this many seconds (default {DEADLINE_S:.0f}: one call under 8 minutes)")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU here: run with --device cpu")
    only = tuple(s.strip() for s in args.only.split(",") if s.strip())
    unknown = sorted(set(only) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}: choose from {', '.join(STEPS)}")
    if args.deadline_s < 0:
        parser.error(f"--deadline-s must be >= 0, got {args.deadline_s}")
    report = run_suite(device, args.scale or ("gpu" if device.type == "cuda" else "cpu"), args.out, only, args.deadline_s)
    print(json.dumps({"out": str(args.out), "statuses": {n: s["status"] for n, s in report["steps"].items()}}))


if __name__ == "__main__":
    main()
