"""Shared setup of the planner tests: one intra-op thread (``one_torch_thread`` in ``tests/conftest.py``)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    yield
