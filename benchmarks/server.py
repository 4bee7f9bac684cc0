"""Throughput and latency of the tuning service: ``GET /v1/configs`` against ``GET /healthz``.

Starts a real ``cswap serve`` on a free loopback port over a seeded temporary store, drives it
with ``httpx`` async clients at concurrency 1, 16 and 64, and stops it at the end. Every figure
is also given as a ratio to ``/healthz`` measured in the same run, so that the machine's speed
cancels out. The two endpoints alternate in rounds so that load changes on the machine hit both.

Output: one JSON line per (endpoint, concurrency), then one line per concurrency comparing the
two; with ``--json`` only those lines, otherwise also a table on stderr. Besides wall-clock rates
and latencies, each line has the server process's CPU time per request (from ``/proc``): on a
shared machine the wall-clock rate mostly measures the scheduler and the client, while
``server_capacity_ratio`` (requests per server CPU second, relative to ``/healthz``) is the rate
ratio the service reaches once it is the bottleneck.

Example:
    $ python benchmarks/server.py --json
    $ python benchmarks/server.py --requests 500 --concurrency 1 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cswap.server.spawn import spawn_service, stop_service
from cswap.tuner.store import ConfigStore, Evaluation, TuningRun, fingerprint_key

__all__ = ["Measurement", "main", "measure", "seed_store"]

TARGET_RATIO_AT_16 = 0.5


def seed_store(path: Path, devices: int = 16, kernels: int = 4, buckets: int = 8) -> dict[str, Any]:
    """A store with ``devices x kernels x buckets`` tuned configs; returns the query of one exact lookup."""
    store = ConfigStore(path)
    query: dict[str, Any] = {}
    for d in range(devices):
        fp = {"kind": "cuda", "name": f"GPU model {d % 4}", "compute_capability": "8.0", "sm_count": 40 + 8 * d,
              "memory_bytes": (16 + d) << 30, "driver": "12040", "cuda": "12.4"}
        for k in range(kernels):
            for b in range(10, 10 + buckets):
                params = {f"k{k}_grid": 64 * (d + 1), f"k{k}_block": 256, "chunk_words": 32}
                store.record_run(TuningRun(
                    fingerprint=fp, kernel=f"zvc.cuda.kernel{k}", source_hash="bench", dtype="float32", bucket=b,
                    method="bo", best_params=params, best_time_s=1e-4 * (b - 9),
                    evaluations=tuple(Evaluation({**params, f"k{k}_block": 32 * (i + 1)}, 1e-4 * (i + 1)) for i in range(8)),
                ))
        if d == devices // 2:
            query = {"fingerprint": fingerprint_key(fp), "kernel": "zvc.cuda.kernel1", "source_hash": "bench",
                     "dtype": "float32", "bucket": 12, **{k: fp[k] for k in ("kind", "name", "compute_capability",
                                                                         "sm_count", "memory_bytes")}}
    store.close()
    return query


@dataclass
class Measurement:
    """Requests completed by a set of workers, with the latency of each."""

    endpoint: str
    concurrency: int
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    elapsed_s: float = 0.0
    server_cpu_s: float = 0.0

    @property
    def rps(self) -> float:
        return len(self.latencies_s) / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def server_cpu_ms_per_request(self) -> float | None:
        done = len(self.latencies_s) + self.errors
        return 1e3 * self.server_cpu_s / done if done and self.server_cpu_s else None

    def quantile_ms(self, q: float) -> float:
        if not self.latencies_s:
            return float("nan")
        ordered = sorted(self.latencies_s)
        return 1e3 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far; 0.0 where /proc is missing."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(
    client: httpx.AsyncClient, path: str, params: dict[str, Any] | None, concurrency: int, requests: int,
    max_s: float, into: Measurement, server_pid: int,
) -> None:
    """Send ``requests`` requests from ``concurrency`` workers (or stop after ``max_s``), adding to ``into``.

    Also adds the server's CPU time over the run: on a busy machine wall-clock rates mostly measure
    the scheduler, CPU per request still measures the server.
    """
    remaining = requests
    deadline = time.perf_counter() + max_s

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0 and time.perf_counter() < deadline:
            remaining -= 1
            start = time.perf_counter()
            try:
                response = await client.get(path, params=params)
                ok = response.status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                into.latencies_s.append(time.perf_counter() - start)
            else:
                into.errors += 1

    cpu = process_cpu_s(server_pid)
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    into.elapsed_s += time.perf_counter() - start
    into.server_cpu_s += process_cpu_s(server_pid) - cpu


async def run_all(
    url: str, server_pid: int, query: dict[str, Any], levels: list[int], requests: int, rounds: int, max_s: float,
) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for concurrency in levels:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30.0) as client:
            results = {name: Measurement(name, concurrency) for name in ("/healthz", "/v1/configs")}
            warm = Measurement("warm-up", concurrency)
            await measure(client, "/healthz", None, concurrency, min(200, requests), max_s, warm, server_pid)
            await measure(client, "/v1/configs", query, concurrency, min(200, requests), max_s, warm, server_pid)
            for _ in range(rounds):  # alternate so that load changes on the machine hit both endpoints
                for path, params in (("/healthz", None), ("/v1/configs", query)):
                    await measure(client, path, params, concurrency, requests // rounds, max_s / rounds,
                                  results[path], server_pid)
        base = results["/healthz"]
        for m in results.values():
            lines.append({
                "bench": "server", "endpoint": m.endpoint, "concurrency": concurrency,
                "requests": len(m.latencies_s), "errors": m.errors, "rps": round(m.rps, 1),
                "p50_ms": round(m.quantile_ms(0.50), 3), "p99_ms": round(m.quantile_ms(0.99), 3),
                "rps_ratio_vs_healthz": round(m.rps / base.rps, 3) if base.rps else None,
                "p50_ratio_vs_healthz": round(m.quantile_ms(0.5) / base.quantile_ms(0.5), 3),
                "p99_ratio_vs_healthz": round(m.quantile_ms(0.99) / base.quantile_ms(0.99), 3),
                "server_cpu_ms_per_request": _round(m.server_cpu_ms_per_request),
                # requests per server-CPU-second relative to /healthz: the rate ratio once the server is the bottleneck
                "server_capacity_ratio_vs_healthz": _round(_ratio(base.server_cpu_ms_per_request, m.server_cpu_ms_per_request)),
            })
        ratio = results["/v1/configs"].rps / base.rps if base.rps else 0.0
        capacity = _ratio(base.server_cpu_ms_per_request, results["/v1/configs"].server_cpu_ms_per_request)
        summary: dict[str, Any] = {"bench": "server", "summary": "configs_vs_healthz", "concurrency": concurrency,
                                   "rps_ratio": round(ratio, 3), "server_capacity_ratio": _round(capacity)}
        if concurrency == 16:
            summary.update(target_rps_ratio=TARGET_RATIO_AT_16, meets_target=ratio >= TARGET_RATIO_AT_16)
        lines.append(summary)
    return lines


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator and denominator else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _table(lines: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="cswap serve: GET /v1/configs vs GET /healthz (loopback)")
    for column in ("endpoint", "concurrency", "req/s", "p50 ms", "p99 ms", "req/s vs healthz", "p99 vs healthz",
                   "server CPU ms/req"):
        table.add_column(column, justify="right")
    for line in lines:
        if "endpoint" in line:
            table.add_row(line["endpoint"], str(line["concurrency"]), f"{line['rps']:.0f}", f"{line['p50_ms']:.2f}",
                          f"{line['p99_ms']:.2f}", f"{line['rps_ratio_vs_healthz']:.2f}", f"{line['p99_ratio_vs_healthz']:.2f}",
                          str(line["server_cpu_ms_per_request"]))
    Console(stderr=True).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON lines")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--requests", type=int, default=3000, help="requests per endpoint and concurrency")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per endpoint")
    parser.add_argument("--max-seconds", type=float, default=30.0, help="time cap per endpoint and concurrency")
    args = parser.parse_args(argv)
    if min(args.concurrency) < 1 or args.requests < args.rounds or args.rounds < 1:
        parser.error("concurrency must be >= 1 and requests >= rounds >= 1")

    with tempfile.TemporaryDirectory(prefix="cswap-bench-server-") as directory:
        store = Path(directory) / "store.db"
        query = seed_store(store)
        process, url = spawn_service(store, startup_s=120.0)
        try:
            lines = asyncio.run(
                run_all(url, process.pid, query, args.concurrency, args.requests, args.rounds, args.max_seconds)
            )
        finally:
            stop_service(process)
    meta = {"bench": "server", "meta": True, "cpus": os.cpu_count(), "load_avg_1min": round(os.getloadavg()[0], 2),
            "python": sys.version.split()[0],
            "server": "cswap serve (uvicorn, 1 worker)", "client": "httpx.AsyncClient, same machine", "host": "127.0.0.1"}
    for line in [meta, *lines]:
        print(json.dumps(line), flush=True)
    if not args.json:
        _table(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
