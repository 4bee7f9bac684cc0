"""The kernel-config store: tuned launch configs, tuning runs and calibrated models, in SQLite.

One file (``$CSWAP_HOME/store.db`` by default) holds

* the devices that were tuned (their fingerprints),
* the best launch config per (device, kernel, kernel source hash, dtype, size bucket),
* every tuning run with every evaluated point (for convergence plots and for seeding new searches),
* calibrated predictor models as JSON coefficients.

Several processes and threads may read and write at once: the database runs in WAL mode, every
write is one ``BEGIN IMMEDIATE`` transaction, and a writer waits up to ``timeout_s`` for another.
A file that is not a readable store is never modified, deleted or replaced: opening it raises
:class:`StoreError` naming the file, the problem and the fix.

This module imports neither torch nor the cswap runtime, so the tuning service can use it on a
machine without either. Fingerprints are plain dicts (``DeviceFingerprint.to_dict()``); a
``DeviceFingerprint`` object is accepted wherever a dict is.

Example:
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

import hashlib
import json
import math
import numbers
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from cswap.paths import cswap_home

if TYPE_CHECKING:
    from cswap.device import DeviceFingerprint

__all__ = [
    "MATCHES",
    "SCHEMA_VERSION",
    "ConfigStore",
    "Evaluation",
    "LookupResult",
    "StoreError",
    "TuningRun",
    "fingerprint_key",
    "normalize_fingerprint",
    "scale_grid_params",
    "size_bucket",
]

#: Version of the on-disk schema; a store written by a newer cswap is refused, not rewritten.
SCHEMA_VERSION = 1

#: How a :class:`LookupResult` was found, best first.
MATCHES: tuple[str, ...] = ("exact", "same-model", "transferred", "default")

#: Format tag of :meth:`ConfigStore.export_json` documents.
EXPORT_FORMAT = "cswap-config-store"

_MAX_BUCKET = 63  # size_bucket of any 2**126-byte tensor; keeps the column a small int
_MAX_INT64 = (1 << 63) - 1
_GRID_MIN, _GRID_MAX = 1, 65535
_WARM_START_MAX = 8

FingerprintLike = Union["DeviceFingerprint", Mapping[str, Any]]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS devices (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    compute_capability TEXT NOT NULL,
    sm_count INTEGER NOT NULL,
    memory_bytes INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS devices_model ON devices (kind, name, compute_capability, sm_count);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    device_key TEXT NOT NULL REFERENCES devices (key),
    kernel TEXT NOT NULL,
    source_hash TEXT NOT NULL,
    dtype TEXT NOT NULL,
    bucket INTEGER NOT NULL,
    method TEXT NOT NULL,
    best_params TEXT NOT NULL,
    best_time_s REAL,
    wall_s REAL NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_device_kernel ON runs (device_key, kernel, created_at);
CREATE INDEX IF NOT EXISTS runs_config ON runs (kernel, source_hash, dtype, bucket);
CREATE TABLE IF NOT EXISTS evaluations (
    run_id TEXT NOT NULL REFERENCES runs (run_id),
    idx INTEGER NOT NULL,
    params TEXT NOT NULL,
    time_s REAL,
    PRIMARY KEY (run_id, idx)
);
CREATE TABLE IF NOT EXISTS best_configs (
    device_key TEXT NOT NULL REFERENCES devices (key),
    kernel TEXT NOT NULL,
    source_hash TEXT NOT NULL,
    dtype TEXT NOT NULL,
    bucket INTEGER NOT NULL,
    params TEXT NOT NULL,
    time_s REAL NOT NULL,
    run_id TEXT,
    method TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (device_key, kernel, source_hash, dtype, bucket)
);
CREATE INDEX IF NOT EXISTS best_configs_config ON best_configs (kernel, source_hash, dtype, bucket);
CREATE TABLE IF NOT EXISTS models (
    device_key TEXT NOT NULL REFERENCES devices (key),
    name TEXT NOT NULL,
    model TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (device_key, name)
);
"""


class StoreError(RuntimeError):
    """The store file is corrupt, locked, from a newer cswap, or cannot be opened.

    The message names the file, the problem, and what to do about it.
    """


def size_bucket(nbytes: int) -> int:
    """The power-of-4 size bucket of a tensor: ``floor(log4(max(nbytes, 1)))``.

    Kernel speed changes smoothly with size, so configs are tuned and stored per bucket.

    Args:
        nbytes: the tensor's size in bytes.

    Example:
        >>> size_bucket(16 << 20)
        12
        >>> size_bucket(0), size_bucket(3), size_bucket(4)
        (0, 0, 1)
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral):
        raise TypeError(f"size_bucket takes a byte count (int), got {type(nbytes).__name__} {nbytes!r}")
    return (max(int(nbytes), 1).bit_length() - 1) // 2


# --------------------------------------------------------------------------- validation helpers


def _text(value: Any, what: str, *, allow_empty: bool = False, max_len: int = 1024) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__} {value!r:.80}")
    if not allow_empty and not value:
        raise ValueError(f"{what} must be a non-empty string")
    if len(value) > max_len:
        raise ValueError(f"{what} is {len(value)} characters long; at most {max_len} are allowed")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid Unicode text (lone surrogate at index {exc.start})") from None
    return value


def _integer(value: Any, what: str, lo: int = -_MAX_INT64 - 1, hi: int = _MAX_INT64) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{what} must be an integer, got {type(value).__name__} {value!r:.80}")
    value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"{what} is {value}, must be between {lo} and {hi}")
    return value


def _seconds(value: Any, what: str, *, allow_inf: bool) -> float:
    """A non-negative duration; ``None`` stands for ``inf`` (JSON has no infinity)."""
    if value is None and allow_inf:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{what} must be a number of seconds, got {type(value).__name__} {value!r:.80}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{what} is NaN; use a measured time (or inf / null for a config that failed to launch)")
    if value < 0:
        raise ValueError(f"{what} is {value}, must be >= 0")
    if math.isinf(value) and not allow_inf:
        raise ValueError(f"{what} is infinite, must be a finite number of seconds")
    return value


def _params(value: Any, what: str) -> dict[str, int]:
    """A launch config: ``{name: int}``; NumPy integers (from scikit-optimize) become ints."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a dict of parameter name -> int, got {type(value).__name__}")
    return {_text(k, f"{what} key", max_len=128): _integer(v, f"{what}[{k!r}]") for k, v in value.items()}


def _json_seconds(value: float) -> float | None:
    return None if math.isinf(value) else value


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=False)


# --------------------------------------------------------------------------- fingerprints

_FINGERPRINT_TEXT = ("kind", "name", "compute_capability", "driver", "cuda")


def normalize_fingerprint(fingerprint: FingerprintLike) -> dict[str, Any]:
    """A validated plain-dict fingerprint, with ``driver`` and ``cuda`` defaulted to ``""``.

    Args:
        fingerprint: a ``DeviceFingerprint`` or its ``to_dict()`` form. Fields other than the
            known ones are kept (and count in the key) so that newer fingerprints still round-trip.

    Raises:
        ValueError: a field is missing or has the wrong type, naming it.
    """
    if hasattr(fingerprint, "to_dict") and not isinstance(fingerprint, Mapping):
        fingerprint = fingerprint.to_dict()
    if not isinstance(fingerprint, Mapping):
        raise ValueError(
            f"fingerprint must be a dict (DeviceFingerprint.to_dict()) or a DeviceFingerprint, "
            f"got {type(fingerprint).__name__}"
        )
    data = dict(fingerprint)
    data.setdefault("driver", "")
    data.setdefault("cuda", "")
    missing = [name for name in ("kind", "name", "compute_capability", "sm_count", "memory_bytes") if name not in data]
    if missing:
        raise ValueError(
            f"fingerprint is missing {', '.join(missing)}; pass cswap.device.fingerprint(device).to_dict()"
        )
    for name in _FINGERPRINT_TEXT:
        data[name] = _text(data[name], f"fingerprint {name}", allow_empty=name != "kind", max_len=256)
    data["sm_count"] = _integer(data["sm_count"], "fingerprint sm_count", 1, (1 << 31) - 1)
    data["memory_bytes"] = _integer(data["memory_bytes"], "fingerprint memory_bytes", 0, _MAX_INT64)
    for name, value in data.items():
        _text(name, "fingerprint field name", max_len=128)
        if name not in _FINGERPRINT_TEXT and name not in ("sm_count", "memory_bytes"):
            try:
                _dumps(value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"fingerprint field {name!r} is not JSON-serialisable: {exc}") from None
    return data


def fingerprint_key(fingerprint: FingerprintLike) -> str:
    """The device key: the same 16-hex-digit hash as ``DeviceFingerprint.key``.

    Example:
        >>> fingerprint_key({"kind": "cpu", "name": "x", "compute_capability": "", "sm_count": 2,
        ...                  "memory_bytes": 0})
        '0243cabd96bab5e2'
    """
    key = getattr(fingerprint, "key", None)
    if isinstance(key, str) and not isinstance(fingerprint, Mapping):
        return key
    blob = json.dumps(normalize_fingerprint(fingerprint), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Evaluation:
    """One evaluated launch config of a tuning run.

    Args:
        params: the launch config, ``{name: int}``.
        time_s: measured kernel time in seconds; ``math.inf`` for a config that failed to launch.

    Example:
        >>> Evaluation({"compress_grid": 64}, math.inf).failed
        True
    """

    params: dict[str, int]
    time_s: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _params(self.params, "evaluation params"))
        object.__setattr__(self, "time_s", _seconds(self.time_s, "evaluation time_s", allow_inf=True))

    @property
    def failed(self) -> bool:
        """Whether the config failed to launch (its time is infinite)."""
        return math.isinf(self.time_s)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; an infinite time becomes ``None``."""
        return {"params": dict(self.params), "time_s": _json_seconds(self.time_s)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Evaluation:
        """Inverse of :meth:`to_dict` (``time_s`` ``None`` means ``inf``)."""
        if not isinstance(data, Mapping) or "params" not in data:
            raise ValueError(f"an evaluation must be a dict with params and time_s, got {data!r:.80}")
        return cls(params=data["params"], time_s=data.get("time_s"))  # type: ignore[arg-type]


def _now_s() -> float:
    return time.time()


def _new_run_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, kw_only=True)
class TuningRun:
    """One tuning search for one (device, kernel, source hash, dtype, size bucket), and its result.

    Construct by keyword. ``run_id`` is a fresh uuid4 hex unless given; recording or publishing
    the same ``run_id`` twice is a no-op, which makes retries safe.

    Args:
        run_id: unique id of the run.
        fingerprint: the device, ``DeviceFingerprint.to_dict()`` (a ``DeviceFingerprint`` is converted).
        kernel: what was tuned, e.g. ``"zvc.cuda.compress"``.
        source_hash: hash of the kernel's source; configs tuned for another source are never reused.
        dtype: ``"float32"``, ``"bfloat16"``, ...
        bucket: :func:`size_bucket` of the tensor size it was tuned for.
        method: ``"bo"``, ``"grid"``, ``"random"``, ``"expert"``, ``"transfer"``, ...
        best_params: the fastest config found.
        best_time_s: its time in seconds (``inf`` when every config failed).
        evaluations: every evaluated point, in the order evaluated.
        wall_s: wall-clock seconds the search took.
        created_at: unix seconds.

    Example:
        >>> run = TuningRun(fingerprint={"kind": "cpu", "name": "x", "compute_capability": "",
        ...                              "sm_count": 2, "memory_bytes": 0},
        ...                 kernel="zvc.cpu.compress", source_hash="h", dtype="float32", bucket=10,
        ...                 method="grid", best_params={"threads": 2}, best_time_s=0.01,
        ...                 evaluations=(Evaluation({"threads": 1}, 0.02), Evaluation({"threads": 2}, 0.01)))
        >>> TuningRun.from_dict(run.to_dict()) == run
        True
    """

    run_id: str = field(default_factory=_new_run_id)
    fingerprint: dict[str, Any]
    kernel: str
    source_hash: str
    dtype: str
    bucket: int
    method: str
    best_params: dict[str, int]
    best_time_s: float
    evaluations: tuple[Evaluation, ...] = ()
    wall_s: float = 0.0
    created_at: float = field(default_factory=_now_s)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "run_id", _text(self.run_id, "run_id", max_len=128))
        set_(self, "fingerprint", normalize_fingerprint(self.fingerprint))
        for name in ("kernel", "source_hash", "dtype", "method"):
            set_(self, name, _text(getattr(self, name), name, max_len=256))
        set_(self, "bucket", _integer(self.bucket, "bucket", 0, _MAX_BUCKET))
        set_(self, "best_params", _params(self.best_params, "best_params"))
        set_(self, "best_time_s", _seconds(self.best_time_s, "best_time_s", allow_inf=True))
        evaluations = self.evaluations
        if isinstance(evaluations, (str, bytes, Mapping)) or not hasattr(evaluations, "__iter__"):
            raise ValueError(f"evaluations must be a sequence of Evaluation, got {type(evaluations).__name__}")
        set_(
            self,
            "evaluations",
            tuple(e if isinstance(e, Evaluation) else Evaluation.from_dict(e) for e in evaluations),
        )
        set_(self, "wall_s", _seconds(self.wall_s, "wall_s", allow_inf=False))
        set_(self, "created_at", _seconds(self.created_at, "created_at", allow_inf=False))

    @property
    def fingerprint_key(self) -> str:
        """Key of the device the run was made on."""
        return fingerprint_key(self.fingerprint)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the wire format of the service); infinite times become ``None``."""
        return {
            "run_id": self.run_id,
            "fingerprint": dict(self.fingerprint),
            "kernel": self.kernel,
            "source_hash": self.source_hash,
            "dtype": self.dtype,
            "bucket": self.bucket,
            "method": self.method,
            "best_params": dict(self.best_params),
            "best_time_s": _json_seconds(self.best_time_s),
            "evaluations": [e.to_dict() for e in self.evaluations],
            "wall_s": self.wall_s,
            "created_at": self.created_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TuningRun:
        """Inverse of :meth:`to_dict`; raises ``ValueError`` naming a missing or bad field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a tuning run must be a JSON object, got {type(data).__name__}")
        required = ("fingerprint", "kernel", "source_hash", "dtype", "bucket", "method", "best_params", "best_time_s")
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"tuning run is missing {', '.join(missing)}")
        known = {*required, "run_id", "evaluations", "wall_s", "created_at"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"tuning run has unknown fields {', '.join(map(str, unknown))}")
        return cls(**{name: data[name] for name in known if name in data})


@dataclass(frozen=True)
class LookupResult:
    """The config to use for a kernel on a device, and how it was found.

    Args:
        params: the launch config; ``None`` only when ``match == "default"`` and no default was given.
        time_s: the stored time of that config (measured on ``source_key``'s device), or ``None``.
        match: ``"exact"`` (this device), ``"same-model"`` (another device of the same model),
            ``"transferred"`` (nearest tuned device of the same kind, grids scaled by the SM
            ratio), or ``"default"``.
        source_key: fingerprint key of the device the config came from.
        warm_start: for ``"transferred"``, scaled configs to seed a Bayesian search with.
    """

    params: dict[str, int] | None
    time_s: float | None
    match: str
    source_key: str | None
    warm_start: tuple[dict[str, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "params": None if self.params is None else dict(self.params),
            "time_s": self.time_s,
            "match": self.match,
            "source_key": self.source_key,
            "warm_start": [dict(p) for p in self.warm_start],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LookupResult:
        """Inverse of :meth:`to_dict`."""
        if data.get("match") not in MATCHES:
            raise ValueError(f"match must be one of {', '.join(MATCHES)}, got {data.get('match')!r}")
        params = data.get("params")
        return cls(
            params=None if params is None else _params(params, "params"),
            time_s=data.get("time_s"),
            match=data["match"],
            source_key=data.get("source_key"),
            warm_start=tuple(_params(p, "warm_start") for p in data.get("warm_start") or ()),
        )


def scale_grid_params(params: Mapping[str, int], sm_ratio: float) -> dict[str, int]:
    """Scale every ``*_grid`` parameter by ``sm_ratio``, rounded and clamped to 1..65535.

    Grids are sized to fill the device, so a config tuned on a GPU with ``S`` SMs transfers to one
    with ``S'`` SMs by ``grid * S' / S``; block sizes and everything else are kept.

    Example:
        >>> scale_grid_params({"compress_grid": 264, "compress_block": 256}, 0.5)
        {'compress_grid': 132, 'compress_block': 256}
    """
    return {
        name: min(max(round(value * sm_ratio), _GRID_MIN), _GRID_MAX) if name.endswith("_grid") else value
        for name, value in params.items()
    }


# --------------------------------------------------------------------------- the store


def _describe_sqlite_error(path: Path, exc: sqlite3.Error, timeout_s: float) -> StoreError:
    message = str(exc)
    lowered = message.lower()
    if "locked" in lowered or "busy" in lowered:
        return StoreError(
            f"config store {path} is locked: another process held it for more than {timeout_s:g} s ({message}). "
            f"Wait for that process (e.g. a running `cswap tune` or `cswap serve`) to finish, or open the store "
            f"with a larger timeout_s"
        )
    if "not a database" in lowered or "malformed" in lowered or "corrupt" in lowered:
        return StoreError(
            f"config store {path} is not a readable cswap store ({message}). cswap leaves the file untouched: "
            f"move it aside (mv {path} {path}.corrupt) to start a fresh store, or use another path "
            f"(--store PATH or CSWAP_HOME)"
        )
    if "unable to open" in lowered or "readonly" in lowered or "read-only" in lowered or "disk i/o" in lowered:
        return StoreError(
            f"config store {path} cannot be opened for writing ({message}). Check that the directory exists "
            f"and is writable, or use another path (--store PATH or CSWAP_HOME)"
        )
    return StoreError(f"config store {path}: {message}")


class ConfigStore:
    """Tuned launch configs, tuning runs and calibrated models of every device, in one SQLite file.

    Safe to share between threads (each thread gets its own connection) and processes (SQLite
    WAL and ``busy_timeout``). Forked children open their own connections.

    Args:
        path: the database file; default ``cswap_home() / "store.db"``. Missing parent
            directories are created.
        timeout_s: how long a write waits for another writer before raising :class:`StoreError`.

    Raises:
        StoreError: the file is not a cswap store (corrupt, another database, a newer schema),
            is locked for longer than ``timeout_s``, or cannot be opened.

    Example:
        >>> store = ConfigStore("/tmp/cswap-doc-store.db")
        >>> store.path.name
        'cswap-doc-store.db'
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, timeout_s: float = 30.0) -> None:
        self.path: Path = Path(path) if path is not None else cswap_home() / "store.db"
        self.timeout_s = float(timeout_s)
        self._local = threading.local()
        self._connections: list[tuple[sqlite3.Connection, int]] = []
        self._connections_lock = threading.Lock()
        if self.path.is_dir():
            raise StoreError(f"config store {self.path} is a directory; pass a file path such as {self.path / 'store.db'}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"config store {self.path}: cannot create its directory ({exc}); use another path") from exc
        self._init_schema()

    # ------------------------------------------------------------------ connections and transactions

    def _connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            return conn
        try:
            conn = sqlite3.connect(
                self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as exc:
            raise _describe_sqlite_error(self.path, exc, self.timeout_s) from exc
        self._local.conn, self._local.pid = conn, os.getpid()
        with self._connections_lock:
            self._connections.append((conn, os.getpid()))
        return conn

    @contextmanager
    def _transaction(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """One transaction: ``BEGIN IMMEDIATE`` for writes (no lock upgrade deadlocks), plain for reads."""
        conn = self._connection()
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            raise _describe_sqlite_error(self.path, exc, self.timeout_s) from exc

    def _init_schema(self) -> None:
        conn = self._connection()
        try:
            # journal_mode needs no transaction; on filesystems without shared memory it stays "delete".
            conn.execute("PRAGMA journal_mode = WAL").fetchone()
        except sqlite3.Error as exc:
            raise _describe_sqlite_error(self.path, exc, self.timeout_s) from exc
        with self._transaction(write=True) as tx:
            tables = {row[0] for row in tx.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables and "schema_version" not in tables:
                raise StoreError(
                    f"config store {self.path} is an SQLite database but not a cswap store (it has tables "
                    f"{', '.join(sorted(tables)[:5])}). cswap leaves it untouched: use another path "
                    f"(--store PATH or CSWAP_HOME)"
                )
            # executescript() would COMMIT first; statement by statement keeps the schema in this transaction.
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    tx.execute(statement)
            row = tx.execute("SELECT MAX(version) FROM schema_version").fetchone()
            if row[0] is None:
                tx.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
            elif row[0] > SCHEMA_VERSION:
                raise StoreError(
                    f"config store {self.path} has schema version {row[0]}, newer than this cswap understands "
                    f"({SCHEMA_VERSION}). Upgrade cswap, or use another path (--store PATH or CSWAP_HOME)"
                )

    def close(self) -> None:
        """Close every connection this store opened (it reopens on the next call)."""
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for conn, pid in connections:
            if pid != os.getpid():
                continue  # a connection inherited through fork belongs to the parent
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()

    def __enter__(self) -> ConfigStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ConfigStore({str(self.path)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Connections do not cross processes: a pickled store reopens the same file.
        return (type(self), (self.path, self.timeout_s))

    @property
    def schema_version(self) -> int:
        """The schema version of the file."""
        with self._transaction() as tx:
            return int(tx.execute("SELECT MAX(version) FROM schema_version").fetchone()[0])

    # ------------------------------------------------------------------ devices

    @staticmethod
    def _insert_device(tx: sqlite3.Connection, fingerprint: dict[str, Any], key: str) -> None:
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
                _dumps(fingerprint),
                _now_s(),
            ),
        )

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
            self._insert_device(tx, data, key)
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
            self._insert_device(tx, run.fingerprint, key)
            return self._insert_run(tx, run, key)

    @staticmethod
    def _offer_best(
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
            (key, kernel, source_hash, dtype, bucket, _dumps(params), time_s, run_id, method, _now_s()),
        )
        return cursor.rowcount > 0

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
            entry = dict(zip(names, row))
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
        default_params = None if default is None else _params(default, "default")
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
            candidates = tx.execute(
                "SELECT b.device_key, b.params, b.time_s, d.kind, d.name, d.compute_capability, d.sm_count, "
                "d.memory_bytes FROM best_configs b JOIN devices d ON d.key = b.device_key "
                "WHERE b.kernel = ? AND b.source_hash = ? AND b.dtype = ? AND b.bucket = ? AND b.device_key IS NOT ?",
                (kernel, source_hash, dtype, bucket, key),
            ).fetchall()
            if name is not None and compute_capability is not None and sm_count is not None:
                same_model = [
                    c for c in candidates
                    if (c[4], c[5], c[6]) == (name, compute_capability, sm_count) and (kind is None or c[3] == kind)
                ]
                if same_model:
                    source = min(same_model, key=lambda c: (c[2], c[0]))
                    return LookupResult(json.loads(source[1]), source[2], "same-model", source[0])
            if kind is not None and sm_count is not None:
                same_kind = sorted(
                    (c for c in candidates if c[3] == kind),
                    key=lambda c: (abs(c[6] - sm_count), abs(c[7] - (memory_bytes or c[7])), c[2], c[0]),
                )
                if same_kind:
                    return self._transferred(tx, same_kind, sm_count, kernel, source_hash, dtype, bucket)
        return LookupResult(default_params, None, "default", None)

    @staticmethod
    def _transferred(
        tx: sqlite3.Connection, ranked: list[tuple[Any, ...]], sm_count: int,
        kernel: str, source_hash: str, dtype: str, bucket: int,
    ) -> LookupResult:
        """The nearest device's best, scaled; warm starts: other devices' bests, then the nearest's runs."""
        nearest = ranked[0]
        params = scale_grid_params(json.loads(nearest[1]), sm_count / nearest[6])
        seeds: list[dict[str, int]] = [params]
        for candidate in ranked[1:]:
            seeds.append(scale_grid_params(json.loads(candidate[1]), sm_count / candidate[6]))
        evaluated = tx.execute(
            "SELECT e.params FROM evaluations e JOIN runs r ON r.run_id = e.run_id WHERE r.device_key = ? "
            "AND r.kernel = ? AND r.source_hash = ? AND r.dtype = ? AND r.bucket = ? AND e.time_s IS NOT NULL "
            "ORDER BY e.time_s LIMIT ?",
            (nearest[0], kernel, source_hash, dtype, bucket, 4 * _WARM_START_MAX),
        ).fetchall()
        seeds.extend(scale_grid_params(json.loads(row[0]), sm_count / nearest[6]) for row in evaluated)
        unique: dict[str, dict[str, int]] = {}
        for seed in seeds:
            unique.setdefault(_dumps(seed), seed)
        warm = tuple(list(unique.values())[:_WARM_START_MAX])
        return LookupResult(params, nearest[2], "transferred", nearest[0], warm)

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
        name = _text(name, "model name", max_len=256)
        if not isinstance(model, Mapping):
            raise ValueError(f"model {name!r} must be a dict of JSON-serialisable coefficients, got {type(model).__name__}")
        try:
            blob = _dumps(model)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"model {name!r} is not JSON-serialisable ({exc}); convert arrays with .tolist() and drop NaN/inf"
            ) from None
        key = fingerprint_key(data)
        with self._transaction(write=True) as tx:
            self._insert_device(tx, data, key)
            tx.execute(
                "INSERT INTO models (device_key, name, model, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (device_key, name) DO UPDATE SET model = excluded.model, updated_at = excluded.updated_at",
                (key, name, blob, _now_s()),
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
            runs = [self._run_from_row(row, self._evaluations(tx, row[0])).to_dict() for row in run_rows]
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
        return {
            "format": EXPORT_FORMAT,
            "schema_version": SCHEMA_VERSION,
            "exported_at": _now_s(),
            "devices": devices,
            "runs": runs,
            "best_configs": best,
            "models": models,
        }

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
        if not isinstance(data, Mapping) or data.get("format") != EXPORT_FORMAT:
            raise ValueError(f"not a cswap store export: expected a JSON object with format {EXPORT_FORMAT!r}")
        if not isinstance(data.get("schema_version"), int) or data["schema_version"] > SCHEMA_VERSION:
            raise ValueError(
                f"store export has schema_version {data.get('schema_version')!r}; this cswap reads up to "
                f"{SCHEMA_VERSION} (upgrade cswap)"
            )

        def entries(name: str) -> list[Any]:
            value = data.get(name, [])
            if not isinstance(value, list):
                raise ValueError(f"store export field {name!r} must be a list")
            return value

        devices = [normalize_fingerprint(fp) for fp in entries("devices")]
        runs = []
        for index, entry in enumerate(entries("runs")):
            try:
                runs.append(TuningRun.from_dict(entry))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"store export runs[{index}]: {exc}") from None
        best = []
        for index, entry in enumerate(entries("best_configs")):
            try:
                best.append((
                    _text(entry["device_key"], "device_key"), _text(entry["kernel"], "kernel"),
                    _text(entry["source_hash"], "source_hash"), _text(entry["dtype"], "dtype"),
                    _integer(entry["bucket"], "bucket", 0, _MAX_BUCKET), _params(entry["params"], "params"),
                    _seconds(entry["time_s"], "time_s", allow_inf=False), entry.get("run_id"),
                    _text(entry.get("method", "import"), "method"),
                ))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"store export best_configs[{index}]: {exc!s}") from None
        models = []
        for index, entry in enumerate(entries("models")):
            if not isinstance(entry, Mapping) or not isinstance(entry.get("model"), Mapping):
                raise ValueError(f"store export models[{index}] must have device_key, name and a model object")
            models.append((_text(entry.get("device_key"), "device_key"), _text(entry.get("name"), "model name"),
                           _dumps(entry["model"])))

        counts = {"devices": 0, "runs": 0, "configs": 0, "models": 0}
        best_query = "SELECT device_key, kernel, source_hash, dtype, bucket, params, time_s FROM best_configs"
        with self._transaction(write=True) as tx:
            before = {row[:5]: row[5:] for row in tx.execute(best_query)}
            known = {row[0] for row in tx.execute("SELECT key FROM devices")}
            for fp in devices:
                key = fingerprint_key(fp)
                if key not in known:
                    self._insert_device(tx, fp, key)
                    known.add(key)
                    counts["devices"] += 1
            for run in runs:
                key = fingerprint_key(run.fingerprint)
                if key not in known:
                    self._insert_device(tx, run.fingerprint, key)
                    known.add(key)
                    counts["devices"] += 1
                if self._insert_run(tx, run, key):
                    counts["runs"] += 1
            for key, kernel, source_hash, dtype, bucket, params, time_s, run_id, method in best:
                if key not in known:
                    raise ValueError(f"store export has a best config for unknown device {key}; export is incomplete")
                self._offer_best(tx, key, kernel, source_hash, dtype, bucket, params, time_s, run_id, method)
            for key, name, blob in models:
                if key not in known:
                    raise ValueError(f"store export has model {name!r} for unknown device {key}; export is incomplete")
                old = tx.execute("SELECT model FROM models WHERE device_key = ? AND name = ?", (key, name)).fetchone()
                if old is None or old[0] != blob:
                    tx.execute(
                        "INSERT INTO models (device_key, name, model, updated_at) VALUES (?, ?, ?, ?) "
                        "ON CONFLICT (device_key, name) DO UPDATE SET model = excluded.model, "
                        "updated_at = excluded.updated_at",
                        (key, name, blob, _now_s()),
                    )
                    counts["models"] += 1
            # A best config improves through an imported run as well as through best_configs entries.
            after = {row[:5]: row[5:] for row in tx.execute(best_query)}
            counts["configs"] = sum(1 for config, value in after.items() if before.get(config) != value)
        return counts

    def _insert_run(self, tx: sqlite3.Connection, run: TuningRun, key: str) -> bool:
        cursor = tx.execute(
            "INSERT OR IGNORE INTO runs (run_id, device_key, kernel, source_hash, dtype, bucket, method, "
            "best_params, best_time_s, wall_s, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run.run_id, key, run.kernel, run.source_hash, run.dtype, run.bucket, run.method,
                _dumps(run.best_params), _json_seconds(run.best_time_s), run.wall_s, run.created_at,
            ),
        )
        if cursor.rowcount == 0:
            return False
        tx.executemany(
            "INSERT INTO evaluations (run_id, idx, params, time_s) VALUES (?, ?, ?, ?)",
            [(run.run_id, index, _dumps(e.params), _json_seconds(e.time_s)) for index, e in enumerate(run.evaluations)],
        )
        if math.isfinite(run.best_time_s):
            self._offer_best(
                tx, key, run.kernel, run.source_hash, run.dtype, run.bucket,
                run.best_params, run.best_time_s, run.run_id, run.method,
            )
        return True
