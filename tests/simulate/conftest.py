"""Shared builders for the simulator tests: hand-made traces and profiles."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cswap.profile.trace import TensorRecord, Trace
from cswap.simulate.hardware import CodecSpec, DeviceSpec, HardwareProfile, LinkSpec


def make_profile(
    gbps: float = 1.0,
    async_copies: bool = True,
    codec_gbps: float = 1e6,
    hook_overhead_s: float = 0.0,
    move_overhead_s: float = 0.0,
    iteration_overhead_s: float = 0.0,
) -> HardwareProfile:
    """A profile with round numbers: ``gbps`` each way, near-free codec unless told otherwise."""
    codec = CodecSpec(compress_gbps=codec_gbps, decompress_gbps=codec_gbps)
    return HardwareProfile(
        name="test",
        device=DeviceSpec(
            name="test device",
            memory_gb=1.0,
            memory_gbps=100.0,
            memory_efficiency=1.0,
            peak_tflops={"float32": 1.0},
            compute_efficiency=1.0,
            hook_overhead_s=hook_overhead_s,
            move_overhead_s=move_overhead_s,
            iteration_overhead_s=iteration_overhead_s,
        ),
        link=LinkSpec(name="test link", h2d_gbps=gbps, d2h_gbps=gbps, async_copies=async_copies),
        device_codec=codec,
        host_codec=codec,
        sources=("made up for tests",),
    )


def make_trace(
    tensors: Sequence[tuple[int, float, float | None]],
    forward_s: float,
    backward_s: float,
    sparsity: float = 0.0,
) -> Trace:
    """A trace from ``(nbytes, produced_at_s, consumed_after_backward_start_s)`` per tensor (float32)."""
    records = tuple(
        TensorRecord(
            key=i,
            shape=(nbytes // 4,),
            dtype="float32",
            nbytes=nbytes,
            sparsity=sparsity,
            pack_at_s=produced,
            unpack_at_s=None if consumed is None else forward_s + consumed,
        )
        for i, (nbytes, produced, consumed) in enumerate(tensors)
    )
    return Trace(tensors=records, forward_s=forward_s, backward_s=backward_s, d2h_gbps=1.0, h2d_gbps=1.0)


@pytest.fixture
def gb() -> int:
    """One GB (1e9 bytes): at 1 GB/s it moves in one second."""
    return 1_000_000_000
