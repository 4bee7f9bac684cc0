"""Two CPU processes on gloo for the distributed tests: spawning them from a test
(:func:`spawn_ranks`) and the setup each rank runs in (:func:`rank_session`).

A rank that dies of a signal (gloo aborts on a peer's closed socket) leaves no traceback the parent
can show: each rank writes its stderr, and faulthandler's stacks, to ``<out>/rank<r>.stderr``, and
a failed spawn raises with them on one line, which is all a CI log's summary may keep.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import ProcessException

WORLD_SIZE = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stderr_of_ranks(out: Path, max_chars: int = 4000) -> str:
    texts = []
    for rank in range(WORLD_SIZE):
        path = out / f"rank{rank}.stderr"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else ["(no stderr file)"]
        texts.append(f"rank {rank}: " + " | ".join(line.strip() for line in lines if line.strip())[:max_chars])
    return " || ".join(texts)


def spawn_ranks(worker: Callable[..., None], out: Path, *args: Any) -> list[Any]:
    """Run ``worker(rank, port, out, *args)`` in :data:`WORLD_SIZE` processes and return what each
    saved to ``<out>/rank<r>.pt``; a rank that failed raises ``RuntimeError`` with every rank's stderr."""
    try:
        torch.multiprocessing.spawn(worker, args=(_free_port(), str(out), *args), nprocs=WORLD_SIZE)
    except ProcessException as e:
        raise RuntimeError(f"{e}: {_stderr_of_ranks(out)}") from e
    return [torch.load(out / f"rank{rank}.pt") for rank in range(WORLD_SIZE)]


@contextlib.contextmanager
def rank_session(rank: int, port: int, out: str) -> Iterator[None]:
    """One rank's process group on gloo, one intra-op thread, its stderr in ``<out>/rank<r>.stderr``."""
    stderr = open(Path(out) / f"rank{rank}.stderr", "w")  # open until the process ends
    os.dup2(stderr.fileno(), 2)
    faulthandler.enable(file=stderr, all_threads=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        yield
        # No rank closes its sockets while a peer still talks on them.
        dist.barrier()
    finally:
        dist.destroy_process_group()
