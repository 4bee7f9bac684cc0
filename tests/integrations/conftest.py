"""Shared setup of the integration tests: one intra-op thread (tiny models, a shared 2-core machine),
and runtime options that offload everything and decide without measuring the machine."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.runtime.helpers import FAST_CODEC, SLOW_LINK, one_thread_below_1mib


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def offload_everything(policy: str) -> dict[str, Any]:
    """Callback options: every saved activation is movable (``min_bytes=0``), the link is slow and
    the codec fast, so ``cswap`` compresses the sparse tensors and swaps the dense ones."""
    options: dict[str, Any] = {"min_bytes": 0, "launch_lookup": one_thread_below_1mib, **SLOW_LINK}
    if policy == "cswap":
        options["time_model"] = FAST_CODEC
    return options


#: The stats field that shows a policy moved bytes: ``none`` moves nothing; ``recompute`` moves
#: nothing either, it rebuilds (see :func:`acted`).
MOVED = {
    "none": None,
    "swap": "offloaded_bytes",
    "cpu-compress-swap": "offloaded_bytes",
    "compress-swap": "compressed_input_bytes",
    "cswap": "offloaded_bytes",
    "compress-keep": "compressed_input_bytes",
    "recompute": None,
    "capuchin": "offloaded_bytes",
    "ac-full": None,
}


def acted(stats: Any, policy: str) -> bool:
    """Whether ``stats`` show the policy did what it is for: moved bytes, or (``recompute``) rebuilt
    tensors in backward; ``none`` always passes, and so does ``ac-full``, which on these small
    models without repeated layers keeps everything as ``none`` does (tests/runtime/test_ac_full.py
    checks what it recomputes where there are layers)."""
    if policy == "recompute":
        return stats.actions["recompute"] > 0
    return MOVED[policy] is None or getattr(stats, MOVED[policy]) > 0
