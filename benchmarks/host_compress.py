"""Host compression (``cpu-compress-swap``, vDNN++) against ``swap`` on one run, beside the simulator.

Per model: two runtimes on copies of one model, ``swap`` and ``cpu-compress-swap``, both moving
every saved tensor to the host (``min_bytes=0``), warmed up past their profiling iteration, then
``--rounds`` timed iterations interleaved round by round on the same batch. Per iteration: its
seconds and the most host bytes the saved tensors held in it (``stats().iteration_host_peak_bytes``:
raw host copies, and compressed buffers once a worker has replaced a copy with them; for the moment
both of one tensor are held, both count). Once more, untimed: the
host bytes held at the end of forward with every compression collected (what the host holds when
the workers keep up).

The simulator is given a ``none`` runtime's profile of the same model and batch and this machine's
CPU profile (:func:`cswap.simulate.validate.cpu_profile`, measured now, with the runtime's
overheads) and runs both policies: its iteration seconds, its host bytes (every moved tensor at
its compressed size for ``cpu-compress-swap``, raw for ``swap``) and its host codec seconds.

Output: one JSON object per model, on its own line.

Example:
    $ python benchmarks/host_compress.py --rounds 9 > benchmarks/results/cpu-$(date +%F)/host-compress.jsonl
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

import cswap
from cswap import models as zoo
from cswap.simulate import SimConfig, Simulator
from cswap.simulate.validate import cpu_profile, cpu_time_model, measure_runtime_overheads

__all__ = ["POLICIES", "main", "measure"]

#: The two policies compared: raw host copies, and the same copies compressed on the host.
POLICIES = ("swap", "cpu-compress-swap")


def _step(rt: cswap.Runtime, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    with rt.iteration():
        F.cross_entropy(model(x), y).backward()
    return time.perf_counter() - started


def _held_after_forward(rt: cswap.Runtime, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Host bytes held at the end of forward, every host compression collected (it waits for them)."""
    model.zero_grad(set_to_none=True)
    with rt.iteration():
        loss = F.cross_entropy(model(x), y)
        held = rt.stats().host_bytes  # stats() collects every compression first
        loss.backward()
    return held


def measure(name: str, batch: int, resolution: int, width_mult: float, rounds: int, profile: Any, time_model: Any) -> dict[str, Any]:
    """``swap`` against ``cpu-compress-swap`` on ``name``, measured and simulated (see the module docstring)."""
    torch.manual_seed(0)
    base = zoo.build(name, num_classes=10, width_mult=width_mult).train()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, resolution, resolution, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    link = profile.link
    options = dict(device="cpu", min_bytes=0, d2h_gbps=link.d2h_gbps, h2d_gbps=link.h2d_gbps)
    models = {p: copy.deepcopy(base) for p in POLICIES}
    runtimes = {p: cswap.Runtime(p, model=models[p], **options) for p in POLICIES}
    for policy in POLICIES:
        for _ in range(2):  # its profiling iteration (and the codec's JIT load), then one under its plan
            _step(runtimes[policy], models[policy], x, y)
    seconds: dict[str, list[float]] = {p: [] for p in POLICIES}
    peaks: dict[str, list[int]] = {p: [] for p in POLICIES}
    for _ in range(rounds):
        for policy in POLICIES:
            seconds[policy].append(_step(runtimes[policy], models[policy], x, y))
            peaks[policy].append(runtimes[policy].stats().iteration_host_peak_bytes)
    held = {p: _held_after_forward(runtimes[p], models[p], x, y) for p in POLICIES}
    counters = runtimes["cpu-compress-swap"]._executor.snapshot()  # host compression counts are not in stats()
    for rt in runtimes.values():
        rt._executor.close()

    # As cswap.simulate.validate does: the profile of a warm iteration (the first ones pay
    # first-touch allocations), without model= (per-module hooks would slow the profiled compute).
    profiler = cswap.Runtime("none", **options)
    for _ in range(2):
        _step(profiler, base, x, y)
    profiler.new_epoch()
    _step(profiler, base, x, y)
    simulator = Simulator(profiler.trace(), profile, SimConfig(min_bytes=0), time_model=time_model)
    simulated = {p: simulator.run(p) for p in POLICIES}

    rows: dict[str, Any] = {}
    for policy in POLICIES:
        result = simulated[policy]
        rows[policy] = {
            "iteration_s_median": statistics.median(seconds[policy]),
            "iteration_s_min": min(seconds[policy]),
            "host_peak_bytes_median": int(statistics.median(peaks[policy])),
            "host_peak_bytes_max": max(peaks[policy]),
            "host_bytes_after_forward": held[policy],
            "simulated_iteration_s": result.iteration_s,
            "simulated_host_bytes": int(result.host_bytes),
            "simulated_host_codec_s": result.host_codec_s,
            "simulated_peak_device_bytes": result.peak_bytes,
        }
    swap, host = rows["swap"], rows["cpu-compress-swap"]
    return {
        "model": name,
        "batch": batch,
        "resolution": resolution,
        "width_mult": width_mult,
        "rounds": rounds,
        "torch_threads": torch.get_num_threads(),
        "host_workers": runtimes["cpu-compress-swap"]._executor.transfers.host_codec.workers,
        "policies": rows,
        "host_compressed_tensors": counters.host_compressed_tensors,
        "host_compression_ratio": counters.host_compressed_input_bytes / max(counters.host_compressed_bytes, 1),
        "ratio": {
            "host_peak_bytes": host["host_peak_bytes_median"] / swap["host_peak_bytes_median"],
            "host_bytes_after_forward": host["host_bytes_after_forward"] / swap["host_bytes_after_forward"],
            "iteration_s": host["iteration_s_median"] / swap["iteration_s_median"],
            "simulated_host_bytes": host["simulated_host_bytes"] / swap["simulated_host_bytes"],
            "simulated_iteration_s": host["simulated_iteration_s"] / swap["simulated_iteration_s"],
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Print one JSON line per model."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vgg11,resnet18", help="comma-separated model names (cswap.models)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--width-mult", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    # The CPU profile is measured once, here: on a machine shared with other work the simulator's
    # prediction is only as good as the load at this moment (the load averages are printed).
    load_at_profile = os.getloadavg()[0]
    overheads = measure_runtime_overheads()
    profile = cpu_profile(measure=True, overheads=overheads)
    time_model = cpu_time_model(measure=True, call_s=overheads.codec_call_s)
    for name in args.models.split(","):
        row = measure(name, args.batch, args.resolution, args.width_mult, args.rounds, profile, time_model)
        row["machine"] = f"{os.cpu_count()} cores, CPU"
        row["load_average"] = {"at_profile": load_at_profile, "after": os.getloadavg()[0]}
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
