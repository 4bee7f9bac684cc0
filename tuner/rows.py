"""Writing rows of the store: a device, a tuning run with its evaluations, and a best config if faster.

Each function runs inside a write transaction the caller opened (``Database.transaction(write=True)``),
so a run, its evaluations and the best config it improves are stored together or not at all.

Example:
    >>> from cswap.tuner.database import Database
    >>> db = Database("/tmp/cswap-doc-rows.db")
    >>> fp = {"kind": "cpu", "name": "x", "compute_capability": "", "sm_count": 2, "memory_bytes": 0,
    ...       "driver": "", "cuda": ""}
    >>> with db.transaction(write=True) as tx:
    ...     insert_device(tx, fp, "0243cabd96bab5e2")
    >>> with db.transaction() as tx:
    ...     tx.execute("SELECT name FROM devices WHERE key = ?", ("0243cabd96bab5e2",)).fetchone()[0]
    'x'
"""

from __future__ import annotations

import math
import sqlite3
import time
from typing import Any

from cswap.tuner.records import TuningRun
from cswap.tuner.validation import dumps, json_seconds

__all__ = ["insert_device", "insert_run", "offer_best"]


def insert_device(tx: sqlite3.Connection, fingerprint: dict[str, Any], key: str) -> None:
    """Register a device (a validated fingerprint dict) under ``key``; nothing happens if it is known."""
    tx.execute(
        "INSERT OR IGNORE INTO devices (key, kind, name, compute_capability, sm_count, memory_bytes, "
        "fingerprint, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            key,
            fingerprint["kind"],
            fingerprint["name"],
            fingerprint["compute_capability"],
            fingerprint["sm_count"],
            fingerprint["memory_bytes"],
            dumps(fingerprint),
            time.time(),
        ),
    )


def offer_best(
    tx: sqlite3.Connection, key: str, kernel: str, source_hash: str, dtype: str, bucket: int,
    params: dict[str, int], time_s: float, run_id: str | None, method: str,
) -> bool:
    """Insert or replace the best config when ``time_s`` is strictly lower; True if it changed."""
    cursor = tx.execute(
        "INSERT INTO best_configs (device_key, kernel, source_hash, dtype, bucket, params, time_s, run_id, "
        "method, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (device_key, kernel, source_hash, dtype, bucket) DO UPDATE SET "
        "params = excluded.params, time_s = excluded.time_s, run_id = excluded.run_id, "
        "method = excluded.method, updated_at = excluded.updated_at WHERE excluded.time_s < best_configs.time_s",
        (key, kernel, source_hash, dtype, bucket, dumps(params), time_s, run_id, method, time.time()),
    )
    return cursor.rowcount > 0


def insert_run(tx: sqlite3.Connection, run: TuningRun, key: str) -> bool:
    """Store a run and its evaluations, and offer its best config; ``False`` if its id is already stored."""
    cursor = tx.execute(
        "INSERT OR IGNORE INTO runs (run_id, device_key, kernel, source_hash, dtype, bucket, method, "
        "best_params, best_time_s, wall_s, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run.run_id, key, run.kernel, run.source_hash, run.dtype, run.bucket, run.method,
            dumps(run.best_params), json_seconds(run.best_time_s), run.wall_s, run.created_at,
        ),
    )
    if cursor.rowcount == 0:
        return False
    tx.executemany(
        "INSERT INTO evaluations (run_id, idx, params, time_s) VALUES (?, ?, ?, ?)",
        [(run.run_id, index, dumps(e.params), json_seconds(e.time_s)) for index, e in enumerate(run.evaluations)],
    )
    if math.isfinite(run.best_time_s):
        offer_best(
            tx, key, run.kernel, run.source_hash, run.dtype, run.bucket,
            run.best_params, run.best_time_s, run.run_id, run.method,
        )
    return True
