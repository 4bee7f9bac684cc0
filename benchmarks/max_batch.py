"""The largest batch per policy and strategy in a memory limit, planned on meta traces (no GPU): one JSON object.

An image model compares with Capuchin's published table (ResNet-50 on a 16 GB GPU: 190 without it,
1014 with it). A transformer (a preset such as ``llama-3.2-1b``, with ``--seq-len``) is full
fine-tuning with AdamW's state counted. ``--policies all`` adds the strategies users pick instead
(activation checkpointing, offloading, ...: :mod:`cswap.simulate.strategies`) that can run on the
model. The figures are planned, not run: see :mod:`cswap.training.maxbatch` for what is counted.

Usage:
    python benchmarks/max_batch.py
    python benchmarks/max_batch.py --model vgg16 --memory-limit 16GiB --policies none,swap,cswap
    python benchmarks/max_batch.py --model llama-3.2-1b --memory-limit 80GiB --seq-len 4096 --policies all
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time

from cswap.planner import POLICY_ACTIONS
from cswap.simulate.modeltrace import is_transformer_model
from cswap.training.maxbatch import parse_bytes, planned_max_batch, planned_max_batch_transformer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--memory-limit", default="16GiB")
    parser.add_argument("--policies", default=",".join(POLICY_ACTIONS), help="comma-separated policies and strategies, or all")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence of a transformer (default: the preset's)")
    parser.add_argument("--hardware", default=None, help="hardware profile (default: v100-pcie3 for an image model, a100-pcie4 for a transformer)")
    parser.add_argument("--compressibility", default="all-minilm-l6-v2",
                        help="a transformer's codec profile (configs/compressibility/), or none: ZVC alone")
    args = parser.parse_args()
    started = time.perf_counter()
    policies = args.policies.split(",")
    if is_transformer_model(args.model, args.seq_len):
        hardware = args.hardware or "a100-pcie4"
        result = planned_max_batch_transformer(args.model, policies, parse_bytes(args.memory_limit), seq_len=args.seq_len,
                                               hardware=hardware, compressibility=args.compressibility)
        reference = {"compressibility": args.compressibility}
    else:
        hardware = args.hardware or "v100-pcie3"
        result = planned_max_batch(args.model, policies, parse_bytes(args.memory_limit), hardware=hardware)
        reference = {"capuchin_paper": {"none": 190, "capuchin": 1014}}
    batches = result.batches
    print(
        json.dumps(
            {
                **result.to_dict(),
                "ratio_to_none": {p: (b / batches["none"] if batches.get("none") else None) for p, b in batches.items()},
                "hardware_profile": hardware,
                "machine": platform.processor() or platform.machine(),
                "cores": os.cpu_count(),
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "search_s": time.perf_counter() - started,
                **reference,
            }
        )
    )


if __name__ == "__main__":
    main()
