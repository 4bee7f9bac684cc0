"""Shared test setup: every test gets its own ``CSWAP_HOME`` so no test sees another's store or cache."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_cswap_home(tmp_path, monkeypatch):
    monkeypatch.setenv("CSWAP_HOME", str(tmp_path / "cswap-home"))
