"""The callbacks take host_memory_budget= and pass it to their runtime; their logged values report
the host copies' peak beside it, in MiB."""

from __future__ import annotations

import importlib

import pytest
import torch

from cswap.integrations.scope import log_values, make_runtime, mib


@pytest.mark.parametrize("module, package", [("cswap.integrations.huggingface", "transformers"),
                                             ("cswap.integrations.lightning", "lightning")])
def test_callbacks_pass_the_host_budget_on(module: str, package: str) -> None:
    pytest.importorskip(package)
    callback = importlib.import_module(module).CswapCallback("swap", memory_budget="1MiB", host_memory_budget="2MiB", min_bytes=0)
    runtime = make_runtime(callback._kwargs, torch.nn.Linear(4, 4))
    assert runtime.stats().host_budget_bytes == 2 << 20 and runtime.stats().budget_bytes == 1 << 20
    with pytest.raises(ValueError, match="host memory budget 0.5 is not valid"):
        importlib.import_module(module).CswapCallback("swap", host_memory_budget=0.5)


def test_logged_values_report_the_host_peak_against_its_budget() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    runtime = make_runtime({"policy": "swap", "min_bytes": 0, "device": "cpu", "host_memory_budget": "1MiB",
                            "d2h_gbps": 10.0, "h2d_gbps": 10.0}, model)
    with runtime.iteration():
        model(torch.randn(8, 64)).square().mean().backward()
    values = log_values(runtime)
    stats = runtime.stats()
    assert values["cswap/host_peak_mib"] == mib(stats.host_peak_bytes) > 0
    assert values["cswap/host_budget_mib"] == 1.0
