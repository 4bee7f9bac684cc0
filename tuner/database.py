"""The SQLite file under the config store: schema, connections, transactions, and what errors mean.

Several processes and threads may read and write at once: the database runs in WAL mode, every
write is one ``BEGIN IMMEDIATE`` transaction, and a writer waits up to ``timeout_s`` for another.
Opening a store that already has the current schema only reads, so a store on a read-only file
or directory (or one opened with ``read_only=True``) can be listed and read; writing to it raises
:class:`StoreError` saying it is read-only and how to point cswap at a writable store.

A file that is not a readable store is never modified, deleted or replaced: opening it raises
:class:`StoreError` naming the file, the problem and the fix.

Example:
    >>> db = Database("/tmp/cswap-doc-database.db")
    >>> with db.transaction() as tx:
    ...     tx.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    True
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

__all__ = ["SCHEMA_VERSION", "WRITABLE_HINT", "Database", "StoreError", "describe_sqlite_error"]

#: Version of the on-disk schema; a store written by a newer cswap is refused, not rewritten.
SCHEMA_VERSION = 1

#: How a user points cswap at another store.
WRITABLE_HINT = "--store PATH or the CSWAP_HOME environment variable"

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
    """The store file is corrupt, locked, read-only, from a newer cswap, or cannot be opened.

    The message names the file, the problem, and what to do about it.
    """


def describe_sqlite_error(path: Path, exc: sqlite3.Error, timeout_s: float) -> StoreError:
    """A :class:`StoreError` that says what an SQLite error on ``path`` means and what to do.

    Example:
        >>> str(describe_sqlite_error(Path("s.db"), sqlite3.OperationalError("database is locked"), 1.0))[:32]
        'config store s.db is locked: ano'
    """
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
            f"({WRITABLE_HINT})"
        )
    if "readonly" in lowered or "read-only" in lowered:
        return StoreError(
            f"config store {path} is read-only ({message}): it can be listed and read but not written. "
            f"To record tuning results, make the file and its directory writable or point cswap at a "
            f"writable store ({WRITABLE_HINT})"
        )
    if "unable to open" in lowered or "disk i/o" in lowered:
        return StoreError(
            f"config store {path} cannot be opened ({message}). Check that the file and its directory exist "
            f"and are writable, or use another path ({WRITABLE_HINT})"
        )
    return StoreError(f"config store {path}: {message}")


def _writable(path: Path) -> bool:
    """Whether a write could succeed: the file (when it exists) and its directory are writable."""
    if path.exists() and not os.access(path, os.W_OK):
        return False
    return os.access(path.parent, os.W_OK)


class Database:
    """One SQLite store file: per-thread connections, transactions and the schema.

    Args:
        path: the database file.
        timeout_s: how long a write waits for another writer.
        read_only: open with SQLite's ``mode=ro``: reads only, writes raise :class:`StoreError`.
            A file or directory without write permission is opened read-only by itself.

    Example:
        >>> Database("/tmp/cswap-doc-database.db", read_only=True).read_only
        True
    """

    def __init__(self, path: str | os.PathLike[str], timeout_s: float = 30.0, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.timeout_s = float(timeout_s)
        self._local = threading.local()
        self._connections: list[tuple[sqlite3.Connection, int]] = []
        self._connections_lock = threading.Lock()
        if self.path.is_dir():
            raise StoreError(f"config store {self.path} is a directory; pass a file path such as {self.path / 'store.db'}")
        if read_only and not self.path.is_file():
            raise StoreError(
                f"config store {self.path} does not exist, so it cannot be opened read-only; run `cswap tune` "
                f"to create one, or point cswap at an existing store ({WRITABLE_HINT})"
            )
        if not read_only and self.path.is_file() and not _writable(self.path):
            read_only = True
        self.read_only = read_only
        if not read_only:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"config store {self.path}: cannot create its directory ({exc}); use another path ({WRITABLE_HINT})"
                ) from exc
        self._init_schema()

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (a forked child opens its own)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            return conn
        try:
            if self.read_only:
                uri = f"file:{quote(str(self.path.absolute()))}?mode=ro"
                conn = sqlite3.connect(uri, uri=True, timeout=self.timeout_s, isolation_level=None,
                                       check_same_thread=False)
            else:
                conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
            conn.execute("PRAGMA foreign_keys = ON")
            if not self.read_only:
                conn.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as exc:
            raise describe_sqlite_error(self.path, exc, self.timeout_s) from exc
        self._local.conn, self._local.pid = conn, os.getpid()
        with self._connections_lock:
            self._connections.append((conn, os.getpid()))
        return conn

    def refuse_write(self) -> None:
        """Raise :class:`StoreError` when the store is read-only."""
        if self.read_only:
            raise StoreError(
                f"config store {self.path} is read-only (opened with read_only=True, or the file or its directory "
                f"is not writable): it can be listed and read but not written. To record tuning results, open it "
                f"without read_only, make it writable, or point cswap at a writable store ({WRITABLE_HINT})"
            )

    @contextmanager
    def transaction(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """One transaction: ``BEGIN IMMEDIATE`` for writes (no lock upgrade deadlocks), plain for reads."""
        if write:
            self.refuse_write()
        conn = self.connection()
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
            raise describe_sqlite_error(self.path, exc, self.timeout_s) from exc

    def _schema_state(self) -> int | None:
        """The stored schema version (``None``: no cswap schema yet); refuses foreign or newer files."""
        with self.transaction() as tx:
            tables = {row[0] for row in tx.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables and "schema_version" not in tables:
                raise StoreError(
                    f"config store {self.path} is an SQLite database but not a cswap store (it has tables "
                    f"{', '.join(sorted(tables)[:5])}). cswap leaves it untouched: use another path ({WRITABLE_HINT})"
                )
            version = tx.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] if tables else None
        if version is not None and version > SCHEMA_VERSION:
            raise StoreError(
                f"config store {self.path} has schema version {version}, newer than this cswap understands "
                f"({SCHEMA_VERSION}). Upgrade cswap, or use another path ({WRITABLE_HINT})"
            )
        return version

    def _init_schema(self) -> None:
        # A store that already has this schema is opened by reading alone: no write lock, no journal
        # change, so read-only files and stores busy with a writer open all the same.
        if self._schema_state() == SCHEMA_VERSION:
            return
        if self.read_only:
            raise StoreError(
                f"config store {self.path} has no cswap schema yet and is read-only, so it cannot be set up; "
                f"point cswap at a writable store ({WRITABLE_HINT})"
            )
        conn = self.connection()
        try:
            # journal_mode needs no transaction; on filesystems without shared memory it stays "delete".
            conn.execute("PRAGMA journal_mode = WAL").fetchone()
        except sqlite3.Error as exc:
            raise describe_sqlite_error(self.path, exc, self.timeout_s) from exc
        with self.transaction(write=True) as tx:
            # executescript() would COMMIT first; statement by statement keeps the schema in this transaction.
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    tx.execute(statement)
            if tx.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] is None:
                tx.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        self._schema_state()  # another process may have written a newer schema meanwhile

    def close(self) -> None:
        """Close every connection opened here (they reopen on the next call)."""
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
