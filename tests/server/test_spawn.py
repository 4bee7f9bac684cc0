"""``cswap.server.spawn``: a real ``cswap serve`` child process, its failures reported with its stderr."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from cswap.server.spawn import spawn_service, stop_service


def test_spawned_service_answers_and_stops(tmp_path: Path) -> None:
    process, url = spawn_service(tmp_path / "store.db")
    try:
        assert httpx.get(f"{url}/healthz", timeout=5.0).json()["status"] == "ok"
    finally:
        stop_service(process)
    assert process.returncode is not None
    stop_service(process)  # a second stop is harmless
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/healthz", timeout=2.0)


def test_a_service_that_cannot_start_reports_its_stderr(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"cswap serve exited with [1-9]\d*: .*store"):
        spawn_service(tmp_path)  # a directory, not a store file
