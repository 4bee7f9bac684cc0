"""Shared test setup: every test gets its own ``CSWAP_HOME`` so no test sees another's store or cache."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_cswap_home(tmp_path, monkeypatch):
    monkeypatch.setenv("CSWAP_HOME", str(tmp_path / "cswap-home"))


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module's tests: they are many tiny iterations, where threads only add
    contention on a shared 2-core machine."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
