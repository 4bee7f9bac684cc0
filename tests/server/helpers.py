"""Shared pieces of the service tests: sample records and live servers (a thread, or a real `cswap serve`)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI

from cswap.tuner.store import Evaluation, TuningRun

TOKEN = "s3cret-token"
H100 = {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "sm_count": 132,
        "memory_bytes": 85_000_000_000, "driver": "12040", "cuda": "12.4"}
A100 = {"kind": "cuda", "name": "NVIDIA A100-SXM4-40GB", "compute_capability": "8.0", "sm_count": 108,
        "memory_bytes": 42_000_000_000, "driver": "12040", "cuda": "12.4"}
CPU = {"kind": "cpu", "name": "AMD EPYC", "compute_capability": "", "sm_count": 2, "memory_bytes": 8 << 30,
       "driver": "", "cuda": ""}
KERNEL, SOURCE, DTYPE, BUCKET = "zvc.cuda.compress", "src-1", "float32", 12
GRID = {"compress_grid": 264, "compress_block": 256, "chunk_words": 32}


def make_run(fp: dict = H100, params: dict = GRID, time_s: float = 1e-3, **overrides: Any) -> TuningRun:
    """A run whose evaluations include a failed launch (infinite time)."""
    fields: dict[str, Any] = dict(
        fingerprint=fp, kernel=KERNEL, source_hash=SOURCE, dtype=DTYPE, bucket=BUCKET, method="bo",
        best_params=params, best_time_s=time_s,
        evaluations=(Evaluation({**params, "compress_block": 32}, 3 * time_s), Evaluation(params, time_s),
                     Evaluation({**params, "compress_block": 1024}, math.inf)),
        wall_s=2.5,
    )
    fields.update(overrides)
    return TuningRun(**fields)


@contextmanager
def serve_in_thread(app: FastAPI) -> Iterator[str]:
    """Run ``app`` under uvicorn on a free loopback port in this process; yields its URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
