"""cswap under FSDP2 (``fully_shard``), two CPU processes on gloo: the local shards end bit-identical
to the run without cswap under every policy that moves bytes, the activations are what moves, and
the parameters FSDP all-gathers for forward are never offloaded."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from tests.integrations import fsdp2_worker
from tests.integrations.ranks import WORLD_SIZE, spawn_ranks

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")

POLICIES = ["swap", "compress-swap", "cswap", "compress-keep"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return spawn_ranks(fsdp2_worker.run, tmp_path_factory.mktemp("fsdp2"), POLICIES)


@pytest.mark.parametrize("rank", range(WORLD_SIZE))
@pytest.mark.parametrize("policy", POLICIES)
def test_shards_are_bit_identical_and_only_activations_move(reports: list[dict], rank: int, policy: str) -> None:
    report = reports[rank]
    assert report["sharded"], "fully_shard did not make the parameters DTensors"
    seen = report[policy]
    assert all(seen["equal"]), f"rank {rank}: a parameter shard differs from the run without cswap under {policy}"
    steps, activation_bytes = fsdp2_worker.STEPS, fsdp2_worker.STEPS * fsdp2_worker.ACTIVATION_BYTES_PER_STEP
    assert seen["never_moved_tensors"] == steps * fsdp2_worker.PARAMETERS_SAVED_PER_STEP
    assert sum(seen["actions"].values()) == steps * fsdp2_worker.ACTIVATIONS_PER_STEP
    if policy == "swap":
        assert seen["offloaded_bytes"] == activation_bytes
    elif policy == "compress-swap":
        assert seen["offloaded_bytes"] == seen["compressed_input_bytes"] == activation_bytes
    elif policy == "compress-keep":
        assert (seen["offloaded_bytes"], seen["compressed_input_bytes"]) == (0, activation_bytes)
    else:  # cswap without a budget: keep, swap or zvc-swap per tensor, never zvc-keep
        assert seen["actions"]["zvc-keep"] == 0 and seen["offloaded_bytes"] > 0
        assert seen["offloaded_bytes"] + seen["kept_bytes"] == activation_bytes
