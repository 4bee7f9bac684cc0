"""Device facts: a fingerprint that names the hardware, and its measured host<->device bandwidth.

The fingerprint is what tuned kernel configs and calibrated predictors are keyed by, so it holds
what changes kernel speed (GPU model, compute capability, SM count, memory, driver and CUDA
versions; CPU model and cores on CPU) and nothing that changes from run to run.

Bandwidths are measured once per fingerprint (median of several pinned 64 MiB copies) and cached
as JSON under :func:`cswap.paths.cswap_home`.

Example:
    >>> fp = fingerprint("cpu")
    >>> fp.kind
    'cpu'
    >>> bw = bandwidth("cpu", nbytes=1 << 20, repeats=3)
    >>> bw.h2d_gbps > 0
    True
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

import torch

from cswap.paths import cswap_home

__all__ = ["Bandwidth", "DeviceFingerprint", "bandwidth", "fingerprint", "measure_bandwidth", "resolve_device", "time_call_s"]


@dataclass(frozen=True)
class DeviceFingerprint:
    """What identifies a device for tuning purposes.

    Args:
        kind: ``cuda`` or ``cpu``.
        name: GPU or CPU model name.
        compute_capability: ``"9.0"`` style on GPU, ``""`` on CPU.
        sm_count: streaming multiprocessors on GPU, cores on CPU.
        memory_bytes: device memory on GPU, physical memory on CPU.
        driver: CUDA driver version (GPU) or ``""``.
        cuda: CUDA runtime version torch was built with, or ``""``.
    """

    kind: str
    name: str
    compute_capability: str
    sm_count: int
    memory_bytes: int
    driver: str = ""
    cuda: str = ""

    @property
    def key(self) -> str:
        """A short stable hash of all fields, for store keys and file names."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def model_key(self) -> tuple[str, str, int]:
        """(name, compute capability, SM count): devices that run kernels the same way."""
        return (self.name, self.compute_capability, self.sm_count)

    def to_dict(self) -> dict[str, object]:
        """Plain dict (JSON-ready)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> DeviceFingerprint:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)  # type: ignore[arg-type]


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``auto``/``None`` -> ``cuda`` when available else ``cpu``; ``cuda`` without a GPU is an error.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "CUDA was asked for but torch sees no GPU (torch.cuda.is_available() is False); "
            "use --device cpu, or install a CUDA build of torch"
        )
    return device


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _physical_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def fingerprint(device: str | torch.device | None = None) -> DeviceFingerprint:
    """The fingerprint of ``device`` (``None``: the default device).

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, a :class:`torch.device`, or ``None``/``"auto"``.
    """
    device = resolve_device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        driver = ""
        try:
            driver = str(torch.cuda.driver_version()) if hasattr(torch.cuda, "driver_version") else ""
        except RuntimeError:
            driver = ""
        return DeviceFingerprint(
            kind="cuda",
            name=props.name,
            compute_capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            memory_bytes=props.total_memory,
            driver=driver,
            cuda=torch.version.cuda or "",
        )
    return DeviceFingerprint(
        kind="cpu",
        name=_cpu_model(),
        compute_capability="",
        sm_count=os.cpu_count() or 1,
        memory_bytes=_physical_memory_bytes(),
    )


@dataclass(frozen=True)
class Bandwidth:
    """Measured transfer bandwidth between host and device, in GB/s (1e9 bytes per second).

    On CPU, "device" and host are the same memory: the figures are pinned-to-pageable copy speed,
    which is what the swap path pays there.
    """

    h2d_gbps: float
    d2h_gbps: float
    nbytes: int
    repeats: int

    def h2d_s(self, nbytes: int) -> float:
        """Seconds to move ``nbytes`` host -> device."""
        return nbytes / (self.h2d_gbps * 1e9)

    def d2h_s(self, nbytes: int) -> float:
        """Seconds to move ``nbytes`` device -> host."""
        return nbytes / (self.d2h_gbps * 1e9)


def time_call_s(call: Callable[[], Any], device: torch.device) -> float:
    """Seconds one call of ``call`` takes on ``device``: CUDA events on a GPU, ``perf_counter`` on the CPU.

    Example:
        >>> isinstance(time_call_s(lambda: sum(range(1000)), torch.device("cpu")), float)
        True
    """
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    start_s = time.perf_counter()
    call()
    return time.perf_counter() - start_s


def _median_copy_s(dst: torch.Tensor, src: torch.Tensor, repeats: int, sync: bool) -> float:
    times = []
    for _ in range(repeats + 1):
        if sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        if sync:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def measure_bandwidth(device: str | torch.device | None = None, nbytes: int = 64 << 20, repeats: int = 5) -> Bandwidth:
    """Measure pinned H2D and D2H bandwidth now (no cache).

    Args:
        device: the device to measure.
        nbytes: bytes per copy (64 MiB by default).
        repeats: copies per direction; the median is reported (the first, warm-up copy is dropped).
    """
    device = resolve_device(device)
    on_gpu = device.type == "cuda"
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=on_gpu)
    host.fill_(1)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dev.fill_(2)
    h2d = _median_copy_s(dev, host, repeats, on_gpu)
    d2h = _median_copy_s(host, dev, repeats, on_gpu)
    return Bandwidth(h2d_gbps=nbytes / h2d / 1e9, d2h_gbps=nbytes / d2h / 1e9, nbytes=nbytes, repeats=repeats)


def bandwidth(
    device: str | torch.device | None = None,
    nbytes: int = 64 << 20,
    repeats: int = 5,
    cache_dir: Path | None = None,
) -> Bandwidth:
    """Pinned H2D/D2H bandwidth of ``device``, measured once per fingerprint and cached.

    Args:
        device: the device to measure.
        nbytes: bytes per copy.
        repeats: copies per direction (median reported).
        cache_dir: where the JSON cache lives (default :func:`cswap_home`).
    """
    fp = fingerprint(device)
    path = (cache_dir or cswap_home()) / f"bandwidth-{fp.key}-{nbytes}.json"
    try:
        cached = json.loads(path.read_text())
        return Bandwidth(**cached)
    except (OSError, ValueError, TypeError):
        pass
    measured = measure_bandwidth(device, nbytes=nbytes, repeats=repeats)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(measured)))
    tmp.replace(path)
    return measured
