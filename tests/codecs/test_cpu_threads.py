"""Small tensors run the CPU codecs on one thread: a parallel region costs more than it saves there."""

from __future__ import annotations

import numba
import pytest
import torch

from cswap.codecs import CpuLaunch, compress, decompress, zvc_cpu
from cswap.codecs.cpu_launch import SERIAL_BELOW_BYTES, threads_for


def _threads_seen(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    kernel = zvc_cpu._bitmap_offsets

    def counting(*args):  # type: ignore[no-untyped-def]
        seen.append(numba.get_num_threads())
        return kernel(*args)

    monkeypatch.setattr(zvc_cpu, "_bitmap_offsets", counting)
    return seen


@pytest.mark.parametrize(("numel", "want"), [(640, 1), (SERIAL_BELOW_BYTES // 4, None)])
def test_the_default_launch_goes_serial_below_the_threshold_only(monkeypatch: pytest.MonkeyPatch, numel: int, want: int | None) -> None:
    seen = _threads_seen(monkeypatch)
    t = torch.relu(torch.randn(numel))
    assert torch.equal(decompress(compress(t, backend="cpu")), t)
    assert seen == [want if want is not None else numba.get_num_threads()]


def test_a_launch_that_names_its_threads_keeps_them(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _threads_seen(monkeypatch)
    compress(torch.ones(10), backend="cpu", launch=CpuLaunch(threads=numba.config.NUMBA_NUM_THREADS))
    assert seen == [numba.config.NUMBA_NUM_THREADS]
    assert threads_for(CpuLaunch(threads=1), 1 << 30) == 1
