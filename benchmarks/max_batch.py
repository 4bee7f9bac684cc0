"""The largest batch per policy in a memory limit, planned on meta traces (no GPU): one JSON object.

Compares with Capuchin's published table (ResNet-50 on a 16 GB GPU: 190 without it, 1014 with it).
The figures are planned, not run: see :mod:`cswap.training.maxbatch` for what is counted.

Usage:
    python benchmarks/max_batch.py
    python benchmarks/max_batch.py --model vgg16 --memory-limit 16GiB --policies none,swap,cswap
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time

from cswap.planner import POLICY_ACTIONS
from cswap.training.maxbatch import parse_bytes
from cswap.training.maxbatch import planned_max_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--memory-limit", default="16GiB")
    parser.add_argument("--policies", default=",".join(POLICY_ACTIONS))
    parser.add_argument("--hardware", default="v100-pcie3")
    args = parser.parse_args()
    started = time.perf_counter()
    result = planned_max_batch(args.model, args.policies.split(","), parse_bytes(args.memory_limit), hardware=args.hardware)
    batches = result.batches
    print(
        json.dumps(
            {
                **result.to_dict(),
                "ratio_to_none": {p: (b / batches["none"] if batches.get("none") else None) for p, b in batches.items()},
                "hardware_profile": args.hardware,
                "machine": platform.processor() or platform.machine(),
                "cores": os.cpu_count(),
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "search_s": time.perf_counter() - started,
                "capuchin_paper": {"none": 190, "capuchin": 1014},
            }
        )
    )


if __name__ == "__main__":
    main()
