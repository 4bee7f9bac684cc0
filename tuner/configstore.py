"""The kernel-config store: tuned launch configs, tuning runs and calibrated models, in SQLite.

One file (``$CSWAP_HOME/store.db`` by default) holds

* the devices that were tuned (their fingerprints),
* the best launch config per (device, kernel, kernel source hash, dtype, size bucket),
* every tuning run with every evaluated point (for convergence plots and for seeding new searches),
* calibrated predictor models as JSON coefficients.

The file, its transactions and its errors are :mod:`cswap.tuner.database`'s, the row writers
:mod:`cswap.tuner.rows`'; the records are
:mod:`cswap.tuner.records`'; which device's config a new device gets is :mod:`cswap.tuner.transfer`'s;
the export format is :mod:`cswap.tuner.exchange`'s. A store opened with ``read_only=True`` (or on a
file without write permission) lists and reads; writing to it raises :class:`StoreError`.

This module imports neither torch nor the cswap runtime, so the tuning service can use it on a
machine without either.

Example:
    >>> from cswap.tuner.records import TuningRun, size_bucket
    >>> store = ConfigStore("/tmp/cswap-doc-store.db")
    >>> fp = {"kind": "cuda", "name": "NVIDIA H100", "compute_capability": "9.0",
    ...       "sm_count": 132, "memory_bytes": 80 << 30}
    >>> run = TuningRun(fingerprint=fp, kernel="zvc.cuda.compress", source_hash="abc", dtype="float32",
    ...                 bucket=size_bucket(16 << 20), method="bo",
    ...                 best_params={"compress_grid": 528, "compress_block": 256}, best_time_s=1.2e-4)
    >>> store.record_run(run)
    True
    >>> store.lookup(fp, "zvc.cuda.compress", "abc", "float32", 12).match
    'exact'
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cswap.paths import cswap_home
from cswap.tuner.database import Database, StoreError
from cswap.tuner.rows import insert_device, insert_run, offer_best
from cswap.tuner.exchange import export_document, parse_export
from cswap.tuner.fingerprints import FingerprintLike, fingerprint_key, normalize_fingerprint
from cswap.tuner.records import Evaluation, LookupResult, TuningRun
from cswap.tuner.transfer import WARM_START_MAX, Candidate, nearest_of_kind, same_model, transferred
from cswap.tuner.validation import check_params, check_text, dumps

__all__ = ["ConfigStore", "StoreError"]


def _reopen(path: Path, timeout_s: float, read_only: bool) -> ConfigStore:
    return ConfigStore(path, timeout_s, read_only=read_only)


class ConfigStore:
    """Tuned launch configs, tuning runs and calibrated models of every device, in one SQLite file.

    Safe to share between threads (each thread gets its own connection) and processes (SQLite
    WAL and ``busy_timeout``). Forked children open their own connections.

    Args:
        path: the database file; default ``cswap_home() / "store.db"``. Missing parent
            directories are created.
        timeout_s: how long a write waits for another writer before raising :class:`StoreError`.
        read_only: only read (SQLite ``mode=ro``); opening never writes, and writes raise
            :class:`StoreError`. A file or directory without write permission opens read-only by itself.

    Raises:
        StoreError: the file is not a cswap store (corrupt, another database, a newer schema),
            is locked for longer than ``timeout_s``, or cannot be opened; with ``read_only``, does not exist.

    Example:
        >>> store = ConfigStore("/tmp/cswap-doc-store.db")
        >>> store.path.name
        'cswap-doc-store.db'
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, timeout_s: float = 30.0, *,
                 read_only: bool = False) -> None:
        self.path: Path = Path(path) if path is not None else cswap_home() / "store.db"
        self.timeout_s = float(timeout_s)
        self._db = Database(self.path, self.timeout_s, read_only=read_only)
        self._transaction = self._db.transaction

    @property
    def read_only(self) -> bool:
        """Whether writes are refused (opened with ``read_only=True``, or the file is not writable)."""
        return self._db.read_only

    def close(self) -> None:
        """Close every connection this store opened (it reopens on the next call)."""
        self._db.close()

    def __enter__(self) -> ConfigStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ConfigStore({str(self.path)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Connections do not cross processes: a pickled store reopens the same file.
        return (_reopen, (self.path, self.timeout_s, self.read_only))

    @property
    def schema_version(self) -> int:
        """The schema version of the file."""
        with self._transaction() as tx:
            return int(tx.execute("SELECT MAX(version) FROM schema_version").fetchone()[0])

    # ------------------------------------------------------------------ devices

    def add_device(self, fingerprint: FingerprintLike) -> str:
        """Register a device (idempotent) and return its fingerprint key.

        Example:
            >>> store = ConfigStore("/tmp/cswap-doc-store.db")
            >>> store.add_device({"kind": "cpu", "name": "x", "compute_capability": "", "sm_count": 2,
            ...                   "memory_bytes": 0})
            '0243cabd96bab5e2'
        """
        data = normalize_fingerprint(fingerprint)
        key = fingerprint_key(data)
        with self._transaction(write=True) as tx:
            insert_device(tx, data, key)
        return key

    def device(self, fingerprint_key: str) -> dict[str, Any] | None:
        """The stored fingerprint of a device key, or ``None``."""
        with self._transaction() as tx:
            row = tx.execute("SELECT fingerprint FROM devices WHERE key = ?", (fingerprint_key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def devices(self) -> list[dict[str, Any]]:
        """Every device, with how much is stored for it.

        Returns:
            ``[{"key", "fingerprint": {...}, "configs": n, "runs": n, "models": n}, ...]`` by key.
        """
        with self._transaction() as tx:
            rows = tx.execute(
                "SELECT d.key, d.fingerprint,"
                " (SELECT COUNT(*) FROM best_configs b WHERE b.device_key = d.key),"
                " (SELECT COUNT(*) FROM runs r WHERE r.device_key = d.key),"
                " (SELECT COUNT(*) FROM models m WHERE m.device_key = d.key)"
                " FROM devices d ORDER BY d.key"
            ).fetchall()
        return [
            {"key": key, "fingerprint": json.loads(fp), "configs": configs, "runs": runs, "models": models}
            for key, fp, configs, runs, models in rows
        ]

    def resolve_key(self, prefix: str) -> str | None:
        """The device key that starts with ``prefix`` when exactly one does, else ``None``."""
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        with self._transaction() as tx:
            rows = tx.execute("SELECT key FROM devices WHERE key LIKE ? ESCAPE '\\' LIMIT 2", (escaped + "%",)).fetchall()
        return rows[0][0] if len(rows) == 1 else None

    # ------------------------------------------------------------------ runs and best configs

    def record_run(self, run: TuningRun) -> bool:
        """Store a run with every evaluation, and make its best config the device's best if faster.

        Args:
            run: the finished run.

        Returns:
            ``False`` (and nothing changes) when a run with this ``run_id`` is already stored.
        """
        if not isinstance(run, TuningRun):
            raise TypeError(f"record_run takes a TuningRun, got {type(run).__name__}")
        key = fingerprint_key(run.fingerprint)
        with self._transaction(write=True) as tx:
            insert_device(tx, run.fingerprint, key)
            return insert_run(tx, run, key)

    def best(
        self, fingerprint_key: str, kernel: str, source_hash: str, dtype: str, bucket: int
    ) -> tuple[dict[str, int], float] | None:
        """The best stored config of exactly this device, or ``None``.

        Returns:
            ``(params, time_s)``.
        """
        with self._transaction() as tx:
            row = tx.execute(
                "SELECT params, time_s FROM best_configs WHERE device_key = ? AND kernel = ? AND source_hash = ? "
                "AND dtype = ? AND bucket = ?",
                (fingerprint_key, kernel, source_hash, dtype, bucket),
            ).fetchone()
        return None if row is None else (json.loads(row[0]), row[1])

    def configs(self, fingerprint_key: str | None = None) -> list[dict[str, Any]]:
        """Every best config (of one device when ``fingerprint_key`` is given).

        Returns:
            ``[{"device_key", "kernel", "source_hash", "dtype", "bucket", "params", "time_s", "run_id",
            "method", "updated_at"}, ...]``.
        """
        query = (
            "SELECT device_key, kernel, source_hash, dtype, bucket, params, time_s, run_id, method, updated_at "
            "FROM best_configs"
        )
        args: tuple[Any, ...] = ()
        if fingerprint_key is not None:
            query, args = query + " WHERE device_key = ?", (fingerprint_key,)
        with self._transaction() as tx:
            rows = tx.execute(query + " ORDER BY device_key, kernel, dtype, bucket, source_hash", args).fetchall()
        names = ("device_key", "kernel", "source_hash", "dtype", "bucket", "params", "time_s", "run_id", "method", "updated_at")
        out = []
        for row in rows:
            entry = dict(zip(names, row, strict=True))
            entry["params"] = json.loads(entry["params"])
            out.append(entry)
        return out

    def lookup(
        self,
        fingerprint: FingerprintLike,
        kernel: str,
        source_hash: str,
        dtype: str,
        bucket: int,
        default: Mapping[str, int] | None = None,
    ) -> LookupResult:
        """The config to use for ``kernel`` on this device, from the closest device that has one.

        Tries, in order: this exact device; another device of the same model (name, compute
        capability, SM count); the nearest tuned device of the same kind (by SM count, then
        memory), with every ``*_grid`` parameter scaled by the SM ratio; else ``default``. Only
        configs with the same ``kernel``, ``source_hash``, ``dtype`` and ``bucket`` are returned.

        Args:
            fingerprint: the device asking.
            kernel, source_hash, dtype, bucket: what the config is for.
            default: returned (``match="default"``) when no device has a config.
        """
        data = normalize_fingerprint(fingerprint)
        return self.lookup_by(
            kernel, source_hash, dtype, bucket,
            key=fingerprint_key(data), kind=data["kind"], name=data["name"],
            compute_capability=data["compute_capability"], sm_count=data["sm_count"],
            memory_bytes=data["memory_bytes"], default=default,
        )

    def lookup_by(
        self,
        kernel: str,
        source_hash: str,
        dtype: str,
        bucket: int,
        *,
        key: str | None = None,
        kind: str | None = None,
        name: str | None = None,
        compute_capability: str | None = None,
        sm_count: int | None = None,
        memory_bytes: int | None = None,
        default: Mapping[str, int] | None = None,
    ) -> LookupResult:
        """:meth:`lookup` from a device key and/or some fingerprint fields (what the service receives).

        A known ``key`` fills in the fields it does not give. The same-model step needs ``name``,
        ``compute_capability`` and ``sm_count``; the transfer step needs ``kind`` and ``sm_count``
        (``memory_bytes`` only breaks ties). Missing fields skip those steps.
        """
        default_params = None if default is None else check_params(default, "default")
        with self._transaction() as tx:
            if key is not None:
                row = tx.execute(
                    "SELECT kind, name, compute_capability, sm_count, memory_bytes FROM devices WHERE key = ?", (key,)
                ).fetchone()
                if row is not None:
                    kind = row[0] if kind is None else kind
                    name = row[1] if name is None else name
                    compute_capability = row[2] if compute_capability is None else compute_capability
                    sm_count = row[3] if sm_count is None else sm_count
                    memory_bytes = row[4] if memory_bytes is None else memory_bytes
                exact = tx.execute(
                    "SELECT params, time_s FROM best_configs WHERE device_key = ? AND kernel = ? AND source_hash = ? "
                    "AND dtype = ? AND bucket = ?",
                    (key, kernel, source_hash, dtype, bucket),
                ).fetchone()
                if exact is not None:
                    return LookupResult(json.loads(exact[0]), exact[1], "exact", key)
            candidates = [
                Candidate(row[0], json.loads(row[1]), *row[2:])
                for row in tx.execute(
                    "SELECT b.device_key, b.params, b.time_s, d.kind, d.name, d.compute_capability, d.sm_count, "
                    "d.memory_bytes FROM best_configs b JOIN devices d ON d.key = b.device_key WHERE b.kernel = ? "
                    "AND b.source_hash = ? AND b.dtype = ? AND b.bucket = ? AND b.device_key IS NOT ?",
                    (kernel, source_hash, dtype, bucket, key),
                )
            ]
            if name is not None and compute_capability is not None and sm_count is not None:
                found = same_model(candidates, kind, name, compute_capability, sm_count)
                if found is not None:
                    return found
            if kind is not None and sm_count is not None:
                ranked = nearest_of_kind(candidates, kind, sm_count, memory_bytes)
                if ranked:
                    evaluated = tx.execute(
                        "SELECT e.params FROM evaluations e JOIN runs r ON r.run_id = e.run_id WHERE r.device_key = ? "
                        "AND r.kernel = ? AND r.source_hash = ? AND r.dtype = ? AND r.bucket = ? "
                        "AND e.time_s IS NOT NULL ORDER BY e.time_s LIMIT ?",
                        (ranked[0].device_key, kernel, source_hash, dtype, bucket, 4 * WARM_START_MAX),
                    ).fetchall()
                    return transferred(ranked, sm_count, (json.loads(row[0]) for row in evaluated))
        return LookupResult(default_params, None, "default", None)

    def _run_from_row(self, row: tuple[Any, ...], evaluations: tuple[Evaluation, ...]) -> TuningRun:
        (run_id, fingerprint, kernel, source_hash, dtype, bucket, method, best_params, best_time_s, wall_s, created_at) = row
        return TuningRun(
            run_id=run_id, fingerprint=json.loads(fingerprint), kernel=kernel, source_hash=source_hash,
            dtype=dtype, bucket=bucket, method=method, best_params=json.loads(best_params),
            best_time_s=math.inf if best_time_s is None else best_time_s, evaluations=evaluations,
            wall_s=wall_s, created_at=created_at,
        )

    _RUN_COLUMNS = (
        "r.run_id, d.fingerprint, r.kernel, r.source_hash, r.dtype, r.bucket, r.method, r.best_params, "
        "r.best_time_s, r.wall_s, r.created_at"
    )

    @staticmethod
    def _evaluations(tx: sqlite3.Connection, run_id: str) -> tuple[Evaluation, ...]:
        rows = tx.execute("SELECT params, time_s FROM evaluations WHERE run_id = ? ORDER BY idx", (run_id,)).fetchall()
        return tuple(Evaluation(json.loads(p), math.inf if t is None else t) for p, t in rows)

    def runs(
        self,
        fingerprint_key: str | None = None,
        kernel: str | None = None,
        *,
        with_evaluations: bool = False,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[TuningRun]:
        """Stored runs, oldest first, optionally of one device and/or kernel.

        Args:
            fingerprint_key: only runs made on this device.
            kernel: only runs of this kernel.
            with_evaluations: also load every evaluation (by default ``evaluations`` is empty).
            limit, offset: paging.
        """
        where, args = [], []
        if fingerprint_key is not None:
            where.append("r.device_key = ?")
            args.append(fingerprint_key)
        if kernel is not None:
            where.append("r.kernel = ?")
            args.append(kernel)
        query = f"SELECT {self._RUN_COLUMNS} FROM runs r JOIN devices d ON d.key = r.device_key"
        if where:
            query += " WHERE " + " AND ".join(where)
        query += " ORDER BY r.created_at, r.run_id LIMIT ? OFFSET ?"
        args += [-1 if limit is None else int(limit), int(offset)]
        with self._transaction() as tx:
            rows = tx.execute(query, args).fetchall()
            return [self._run_from_row(row, self._evaluations(tx, row[0]) if with_evaluations else ()) for row in rows]

    def run(self, run_id: str) -> TuningRun | None:
        """One run with every evaluation, or ``None``."""
        with self._transaction() as tx:
            row = tx.execute(
                f"SELECT {self._RUN_COLUMNS} FROM runs r JOIN devices d ON d.key = r.device_key WHERE r.run_id = ?",
                (run_id,),
            ).fetchone()
            return None if row is None else self._run_from_row(row, self._evaluations(tx, run_id))

    # ------------------------------------------------------------------ calibrated models

    def put_model(self, fingerprint: FingerprintLike, name: str, model: Mapping[str, Any]) -> None:
        """Store (or replace) a calibrated model of a device as JSON.

        Args:
            fingerprint: the device the model was calibrated on.
            name: e.g. ``"zvc.cuda.compress_time"``.
            model: JSON-serialisable coefficients (no NaN or infinity).
        """
        data = normalize_fingerprint(fingerprint)
        name = check_text(name, "model name", max_len=256)
        if not isinstance(model, Mapping):
            raise ValueError(f"model {name!r} must be a dict of JSON-serialisable coefficients, got {type(model).__name__}")
        try:
            blob = dumps(model)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"model {name!r} is not JSON-serialisable ({exc}); convert arrays with .tolist() and drop NaN/inf"
            ) from None
        key = fingerprint_key(data)
        with self._transaction(write=True) as tx:
            insert_device(tx, data, key)
            tx.execute(
                "INSERT INTO models (device_key, name, model, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (device_key, name) DO UPDATE SET model = excluded.model, updated_at = excluded.updated_at",
                (key, name, blob, time.time()),
            )

    def models(self, fingerprint_key: str) -> dict[str, dict[str, Any]]:
        """Every calibrated model of a device, by name (empty when none)."""
        with self._transaction() as tx:
            rows = tx.execute(
                "SELECT name, model FROM models WHERE device_key = ? ORDER BY name", (fingerprint_key,)
            ).fetchall()
        return {name: json.loads(model) for name, model in rows}

    # ------------------------------------------------------------------ export / import

    def export_json(self) -> dict[str, Any]:
        """Everything in the store as one JSON-ready document (see :meth:`import_json`)."""
        with self._transaction() as tx:
            devices = [json.loads(row[0]) for row in tx.execute("SELECT fingerprint FROM devices ORDER BY key")]
            run_rows = tx.execute(
                f"SELECT {self._RUN_COLUMNS} FROM runs r JOIN devices d ON d.key = r.device_key "
                "ORDER BY r.created_at, r.run_id"
            ).fetchall()
            runs = [self._run_from_row(row, self._evaluations(tx, row[0])) for row in run_rows]
            best = [
                {
                    "device_key": row[0], "kernel": row[1], "source_hash": row[2], "dtype": row[3], "bucket": row[4],
                    "params": json.loads(row[5]), "time_s": row[6], "run_id": row[7], "method": row[8],
                }
                for row in tx.execute(
                    "SELECT device_key, kernel, source_hash, dtype, bucket, params, time_s, run_id, method "
                    "FROM best_configs ORDER BY device_key, kernel, source_hash, dtype, bucket"
                )
            ]
            models = [
                {"device_key": row[0], "name": row[1], "model": json.loads(row[2])}
                for row in tx.execute("SELECT device_key, name, model FROM models ORDER BY device_key, name")
            ]
        return export_document(devices, runs, best, models, time.time())

    def import_json(self, data: Mapping[str, Any]) -> dict[str, int]:
        """Merge an :meth:`export_json` document into this store, in one transaction.

        Runs already present (same ``run_id``) are skipped; a best config replaces the stored one
        only when faster; models replace models of the same name.

        Returns:
            What was new: ``{"devices": n, "runs": n, "configs": n, "models": n}``, where ``configs``
            counts best configs that were added or replaced by faster ones.

        Raises:
            ValueError: the document is not an export, naming the first bad entry (nothing is imported).
        """
        document = parse_export(data)
        counts = {"devices": 0, "runs": 0, "configs": 0, "models": 0}
        best_query = "SELECT device_key, kernel, source_hash, dtype, bucket, params, time_s FROM best_configs"
        with self._transaction(write=True) as tx:
            before = {row[:5]: row[5:] for row in tx.execute(best_query)}
            known = {row[0] for row in tx.execute("SELECT key FROM devices")}
            for fp in [*document.devices, *(run.fingerprint for run in document.runs)]:
                key = fingerprint_key(fp)
                if key not in known:
                    insert_device(tx, fp, key)
                    known.add(key)
                    counts["devices"] += 1
            for run in document.runs:
                if insert_run(tx, run, run.fingerprint_key):
                    counts["runs"] += 1
            for entry in document.best_configs:
                if entry.device_key not in known:
                    raise ValueError(
                        f"store export has a best config for unknown device {entry.device_key}; export is incomplete"
                    )
                offer_best(tx, *entry)
            for key, name, blob in document.models:
                if key not in known:
                    raise ValueError(f"store export has model {name!r} for unknown device {key}; export is incomplete")
                old = tx.execute("SELECT model FROM models WHERE device_key = ? AND name = ?", (key, name)).fetchone()
                if old is None or old[0] != blob:
                    tx.execute(
                        "INSERT INTO models (device_key, name, model, updated_at) VALUES (?, ?, ?, ?) "
                        "ON CONFLICT (device_key, name) DO UPDATE SET model = excluded.model, "
                        "updated_at = excluded.updated_at",
                        (key, name, blob, time.time()),
                    )
                    counts["models"] += 1
            # A best config improves through an imported run as well as through best_configs entries.
            after = {row[:5]: row[5:] for row in tx.execute(best_query)}
            counts["configs"] = sum(1 for config, value in after.items() if before.get(config) != value)
        return counts
