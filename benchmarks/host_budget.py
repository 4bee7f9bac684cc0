"""A host budget beside the device budget, in ``tests/runtime/test_host_budget.py``'s setting.

Per model and swapping policy, on the CPU (``min_bytes=0``, the tests' slow link): a run at a device
budget of 0.3 of policy ``none``'s peak (in bytes) with no host budget, whose planned iteration's
host peak sets the host budget (half of it); a run at both budgets, which either holds them or
raises a ``BudgetError`` naming the binding budget and the least of each; and, after an error, a
fresh run at the least it states (the host's when the host binds, else the device's), with its
device and host peaks and how many tensors it compressed on the host.

Output: one JSON object per (model, policy), on its own line.

Example:
    $ python benchmarks/host_budget.py > benchmarks/results/cpu-$(date +%F)/host-budget.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cswap
from tests.runtime.helpers import runtime_for, train
from tests.runtime.test_host_budget import MODELS, POLICIES

__all__ = ["main", "measure"]


def _run(name: str, policy: str, **budgets: Any) -> cswap.Runtime:
    build, data, loss_fn = MODELS[name]
    return train(build, data(), 1, runtime_for(policy, **budgets), loss_fn=loss_fn)[1]


def measure(name: str, policy: str) -> dict[str, Any]:
    """One row of the table for ``policy`` on model ``name``."""
    build, data, loss_fn = MODELS[name]
    _, none = train(build, data()[:1], 1, runtime_for("none", memory_budget=1.0), loss_fn=loss_fn)
    none_peak = none.stats().peak_resident_bytes
    device = int(0.3 * none_peak)
    free = _run(name, policy, memory_budget=device).stats().iteration_host_peak_bytes
    host = free // 2
    row: dict[str, Any] = {"model": name, "policy": policy, "none_peak_bytes": none_peak, "device_budget_bytes": device,
                           "host_bytes_without_host_budget": free, "host_budget_bytes": host}
    try:
        rt = _run(name, policy, memory_budget=device, host_memory_budget=host)
    except cswap.BudgetError as error:
        row.update(binding=error.binding, least_device_bytes=error.minimum_bytes, least_host_bytes=error.host_minimum_bytes)
        if error.binding == "host":
            host = error.host_minimum_bytes
        else:
            device = error.minimum_bytes
        try:
            rt = _run(name, policy, memory_budget=device, host_memory_budget=host)
        except cswap.BudgetError as again:
            row.update(fresh_run="BudgetError", fresh_least_device_bytes=again.minimum_bytes, fresh_least_host_bytes=again.host_minimum_bytes)
            return row
    stats = rt.stats()
    row.update(fresh_run="held" if stats.peak_resident_bytes <= device and stats.host_peak_bytes <= host else "passed",
               run_device_budget_bytes=device, run_host_budget_bytes=host, device_peak_bytes=stats.peak_resident_bytes,
               host_peak_bytes=stats.host_peak_bytes, host_zvc_swaps=stats.actions["host-zvc-swap"])
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated swapping policies")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    for name in args.models.split(","):
        for policy in args.policies.split(","):
            row = measure(name, policy)
            row.update(cpus=os.cpu_count(), date=time.strftime("%Y-%m-%d"))
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
