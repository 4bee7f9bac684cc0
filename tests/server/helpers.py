"""Shared pieces of the service tests: sample records and live servers (a thread, or a real `cswap serve`)."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from tuner.store import Evaluation, TuningRun

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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_cswap_serve(store_path: Path, token: str | None = None, timeout_s: float = 90.0) -> tuple[subprocess.Popen, str]:
    """Start a real ``cswap serve`` in a subprocess and wait until it answers /healthz."""
    port = free_port()
    command = [sys.executable, "-m", "cswap.cli", "serve", "--port", str(port), "--store", str(store_path),
               "--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if k != "CSWAP_SERVER_TOKEN"}
    if token:
        env["CSWAP_SERVER_TOKEN"] = token
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"cswap serve exited with {process.returncode}: {process.stdout.read().decode()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"cswap serve did not answer within {timeout_s} s")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=20)
    if process.stdout is not None:
        process.stdout.close()
