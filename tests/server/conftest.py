"""Fixtures of the service tests: a store, the app over it, test clients, a live server in a thread."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from cswap.server.app import create_app
from tests.server.helpers import TOKEN, serve_in_thread
from cswap.tuner.store import ConfigStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ConfigStore]:
    with ConfigStore(tmp_path / "server-store.db") as s:
        yield s


@pytest.fixture
def app(store: ConfigStore) -> FastAPI:
    return create_app(store)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


@pytest.fixture
def secured(store: ConfigStore) -> Iterator[TestClient]:
    with TestClient(create_app(store, token=TOKEN)) as c:
        yield c


@pytest.fixture
def live_url(app: FastAPI) -> Iterator[str]:
    with serve_in_thread(app) as url:
        yield url
