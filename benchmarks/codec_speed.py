"""How fast the device codecs must run for compression to pay, in the simulator.

One hardware profile is re-run with every codec of ``device_codecs`` (exponent coding,
bit-packing) set to one speed, compressing and decompressing alike, from the speeds the profile
holds (measured on a GPU) up to beyond the device's memory bandwidth. At each speed and budget,
cswap and a reference policy (``ilp-kro``: the same program without compression) are planned and
replayed; the compressibility of each saved tensor is the measured profile the simulator uses
(``configs/compressibility``). A speed above ``memory_gbps`` is beyond what any kernel reaches
(compressing reads the tensor and writes its code): it bounds what faster kernels could give.

Every line printed is one JSON object: a ``header``, then per speed and budget a ``row`` with both
policies' iteration over ``none``'s, cswap's margin (``reference / cswap - 1``), and its actions
(``zvc-swap`` and ``zvc-keep`` are compression by the tensor's best codec).

Usage:
    python benchmarks/codec_speed.py > benchmarks/results/cpu-2026-11-27/codec-speed.jsonl
    python benchmarks/codec_speed.py --model gpt2-xl --hardware h100-pcie5 --budgets 0.1 --speeds 400,1600
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from cswap.codecs import CODECS
from cswap.commands.simulate import run_simulate
from cswap.simulate.hardware import load_hardware


def profile_at(hardware: str, gbps: float | None, folder: Path) -> tuple[Path, dict[str, Any]]:
    """A copy of ``hardware`` with every device codec at ``gbps`` both ways (``None``: as it is), written to ``folder``."""
    profile = load_hardware(hardware)
    data = profile.model_dump(mode="json")
    if gbps is not None:
        for codec in CODECS.names():
            if codec != "zvc":  # ZVC's speed is device_codec's, the other codecs' here (none yet: ZVC's overheads)
                rate = data["device_codecs"].setdefault(codec, {"compress_overhead_s": data["device_codec"]["compress_overhead_s"],
                                                                "decompress_overhead_s": data["device_codec"]["decompress_overhead_s"]})
                rate["compress_gbps"] = rate["decompress_gbps"] = gbps
        data["name"] = f"{profile.name}-codecs-{gbps:g}"
    path = folder / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, data["device_codecs"]


def rows(model: str, attention: str, hardware: str, budgets: str, speeds: Sequence[float | None], reference: str) -> Any:
    with tempfile.TemporaryDirectory() as folder:
        for gbps in speeds:
            path, codecs = profile_at(hardware, gbps, Path(folder))
            started = time.perf_counter()
            report = run_simulate(model=model, attention=attention, hardware=str(path), policies=f"cswap,{reference}",
                                  memory_budget=budgets)
            none_s = report["none_iteration_s"]
            for at_budget in report.get("budgets", [report]):
                cswap, other = at_budget["policies"]["cswap"], at_budget["policies"][reference]
                yield {
                    "kind": "row", "model": model, "attention": attention, "hardware": hardware,
                    "codec_gbps": gbps if gbps is not None else "measured", "device_codecs": codecs,
                    "budget_bytes": at_budget["budget_bytes"], "budget_fraction": at_budget["budget_bytes"] / report["none_peak_bytes"],
                    "cswap_x_none": cswap["iteration_s"] / none_s, f"{reference}_x_none": other["iteration_s"] / none_s,
                    "margin": other["iteration_s"] / cswap["iteration_s"] - 1, "cswap_plan": cswap["plan"],
                    "cswap_actions": cswap["actions"], "exposed_transfer_s": cswap["exposed_transfer_s"],
                    "codec_s": cswap["codec_s"], "recompute_s": cswap["recompute_s"],
                    "seconds": time.perf_counter() - started,
                }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-xl")
    parser.add_argument("--attention", default="eager")
    parser.add_argument("--hardware", default="h100-pcie5")
    parser.add_argument("--budgets", default="0.1,0.25,0.5", help="fractions of none's peak, comma separated")
    parser.add_argument("--speeds", default="measured,400,800,1600,3200",
                        help="GB/s of input both ways for every device codec; 'measured' keeps the profile's")
    parser.add_argument("--reference", default="ilp-kro", help="the policy cswap's margin is over")
    args = parser.parse_args(argv)
    speeds = [None if s == "measured" else float(s) for s in args.speeds.split(",")]
    profile = load_hardware(args.hardware)
    print(json.dumps({"kind": "header", "benchmark": "codec_speed", "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                      "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                      "hardware": args.hardware, "memory_gbps": profile.device.memory_gbps,
                      "link_gbps": profile.link.h2d_gbps, "model": args.model, "attention": args.attention}), flush=True)
    for row in rows(args.model, args.attention, args.hardware, args.budgets, speeds, args.reference):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
