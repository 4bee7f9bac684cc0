"""cswap under FSDP2 (``fully_shard``), two CPU processes on gloo: the local shards end bit-identical
to the run without cswap under every policy that moves bytes, the activations are what moves, and
the parameters FSDP all-gathers for forward are never offloaded."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import ProcessException

from tests.integrations import fsdp2_worker

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")

POLICIES = ["swap", "compress-swap", "cswap", "compress-keep"]
WORLD_SIZE = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stderr_of_ranks(out: Path, max_chars: int = 4000) -> str:
    """What each rank wrote to its stderr (a C++ exception's message, faulthandler's stacks), on one
    line: a failed fixture's summary line is all CI's log may keep."""
    texts = []
    for rank in range(WORLD_SIZE):
        path = out / f"rank{rank}.stderr"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else ["(no stderr file)"]
        texts.append(f"rank {rank}: " + " | ".join(line.strip() for line in lines if line.strip())[:max_chars])
    return " || ".join(texts)


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("fsdp2")
    try:
        torch.multiprocessing.spawn(fsdp2_worker.run, args=(WORLD_SIZE, _free_port(), str(out), POLICIES), nprocs=WORLD_SIZE)
    except ProcessException as e:
        raise RuntimeError(f"{e}: {_stderr_of_ranks(out)}") from e
    return [torch.load(Path(out) / f"rank{rank}.pt") for rank in range(WORLD_SIZE)]


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
