"""The compute efficiency a hardware profile needs to reproduce a published training throughput.

The simulator prices a compute-bound operator at ``flops / (peak * efficiency)``. This script finds
the ``efficiency`` of one dtype at which the simulated iteration of a model (policy ``none``: every
operator once forward and once backward, nothing moved) takes as long as a published run says it
did, by bisection on the profile's ``compute_efficiency_by_dtype``. The published figure is tokens
per second per GPU; the iteration is ``batch * seq_len`` tokens.

Anchors shipped in the profiles (``--anchor``):

* ``torchtitan-h100``: torchtitan's docs/performance.md, Llama 3.1 8B on 8 H100s (96 GB HBM2e, 500 W
  limit), FSDP, local batch 2, sequence 8192, selective activation checkpointing, bf16, no Float8,
  no torch.compile: 5,762 tokens/s per GPU (Table 1; 33-39% MFU per that page).
* ``torchtitan-a100``: the same page, Llama 3 8B on 64 A100s (80 GB), FSDP, local batch 1,
  sequence 8192, selective layer checkpointing, bf16: 2,876 tokens/s per GPU (56.3% MFU).

What the published runs do and the simulated iteration does not (FSDP's collectives, mostly
overlapped; selective checkpointing's recompute of cheap operators; a 500 W power limit on the
H100s) makes the published iteration longer, so the efficiency found is the fraction of peak the
whole run reaches per unit of compute, a lower bound on what the matmuls alone reach.

Usage:
    python benchmarks/compute_efficiency.py --anchor torchtitan-h100 --hardware h100-sxm
    python benchmarks/compute_efficiency.py --anchor torchtitan-a100 --hardware a100-pcie4

Output: one JSON line: the anchor, the profile, the efficiency found, the simulated tokens/s at it
and at the profile's current efficiency, and the date.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cswap.simulate.engine import simulate
from cswap.simulate.hardware import HardwareProfile, load_hardware
from cswap.simulate.lmtrace import transformer_trace

__all__ = ["ANCHORS", "Anchor", "efficiency_for", "main", "tokens_per_s"]


@dataclass(frozen=True)
class Anchor:
    """One published training throughput."""

    model: str
    batch: int
    seq_len: int
    dtype: str
    tokens_per_s: float
    source: str


ANCHORS = {
    "torchtitan-h100": Anchor("llama-3-8b", 2, 8192, "bfloat16", 5762.0,
                              "torchtitan docs/performance.md, Table 1: Llama 3.1 8B, 8 H100, FSDP, local batch 2, "
                              "selective AC, no compile, no Float8: 5,762 tokens/s/GPU"),
    "torchtitan-a100": Anchor("llama-3-8b", 1, 8192, "bfloat16", 2876.0,
                              "torchtitan docs/performance.md, Llama 3 8B on 64 A100 80GB, FSDP, local batch 1, "
                              "selective layer AC: 2,876 tokens/s/GPU (56.3% MFU)"),
}


def _with_efficiency(profile: HardwareProfile, dtype: str, efficiency: float) -> HardwareProfile:
    by_dtype = {**profile.device.compute_efficiency_by_dtype, dtype: efficiency}
    return profile.model_copy(update={"device": profile.device.model_copy(update={"compute_efficiency_by_dtype": by_dtype})})


def tokens_per_s(anchor: Anchor, profile: HardwareProfile) -> float:
    """Simulated tokens per second of ``anchor``'s iteration on ``profile`` (policy ``none``)."""
    trace = transformer_trace(anchor.model, batch_size=anchor.batch, seq_len=anchor.seq_len, hardware=profile,
                              dtype=anchor.dtype, attention="sdpa")
    return anchor.batch * anchor.seq_len / simulate(trace, profile, "none").iteration_s


def efficiency_for(anchor: Anchor, profile: HardwareProfile, tolerance: float = 0.002) -> float:
    """The efficiency of ``anchor.dtype`` at which the simulated throughput equals the published one."""
    low, high = 0.01, 1.0
    if tokens_per_s(anchor, _with_efficiency(profile, anchor.dtype, high)) < anchor.tokens_per_s:
        raise ValueError(f"{profile.name} cannot reach {anchor.tokens_per_s:.0f} tokens/s even at efficiency 1: "
                         "its memory-bound operators alone take longer")
    while high - low > tolerance:
        middle = (low + high) / 2
        if tokens_per_s(anchor, _with_efficiency(profile, anchor.dtype, middle)) < anchor.tokens_per_s:
            low = middle
        else:
            high = middle
    return round((low + high) / 2, 3)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchor", choices=tuple(ANCHORS), required=True)
    parser.add_argument("--hardware", required=True, help="profile name or path")
    args = parser.parse_args(argv)
    anchor = ANCHORS[args.anchor]
    profile = load_hardware(args.hardware)
    found = efficiency_for(anchor, profile)
    print(json.dumps({
        "anchor": args.anchor, "source": anchor.source, "hardware": profile.name, "dtype": anchor.dtype,
        "efficiency": found, "published_tokens_per_s": anchor.tokens_per_s,
        "simulated_tokens_per_s_at_found": tokens_per_s(anchor, _with_efficiency(profile, anchor.dtype, found)),
        "profile_efficiency": profile.device.efficiency(anchor.dtype),
        "simulated_tokens_per_s_at_profile": tokens_per_s(anchor, profile),
        "date": dt.date.today().isoformat(),
    }), flush=True)


if __name__ == "__main__":
    main()
