"""Shared setup of the runtime tests: one intra-op thread (the tests are many tiny iterations, where
threads only add contention on a shared 2-core machine)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
