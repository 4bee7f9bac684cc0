"""The fallback time model: every codec's (de)compression seconds from a short micro-benchmark of one backend.

When no calibrated :class:`cswap.planner.costmodel.TimeModel` is given, the runtime times the chosen codec
backend on a few synthetic float32 tensors (three sizes, two densities) and fits, per operation,

    seconds = fixed_s + s_per_byte * nbytes + s_per_nonzero_byte * nbytes * density

by non-negative least squares (``scipy.optimize.nnls``): a launch/call overhead, the pass over the
whole tensor, and the nonzero values written (compress) or read (decompress). The other codecs do
the same work whatever the values, so each is timed on dense tensors of each width it takes
(exponent coding on bf16 normals and on fp32 normals, bit-packing on bool masks) and fitted on size
alone, per width: their speeds differ from ZVC's, and from each other, by an order of magnitude on
a GPU. The fit is cached as JSON per device fingerprint and backend under
:func:`cswap.paths.cswap_home`, so each machine pays the benchmark once.

Example:
    >>> speed = CodecSpeed(backend="cpu", compress=OpSpeed(1e-5, 1e-9, 0.0), decompress=OpSpeed(1e-5, 1e-9, 0.0))
    >>> round(speed.compress_s(nbytes=1_000_000, density=0.5, itemsize=4, backend="cpu"), 6)
    0.00101
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np
import torch
from scipy.optimize import nnls

import cswap.codecs as codecs_package
from cswap.codecs import CODECS, compress, decompress
from cswap.device import fingerprint, resolve_device
from cswap.paths import cswap_home

__all__ = ["CodecSpeed", "OpSpeed", "cache_path", "codec_speed", "kernels_digest", "measure_codec_speed"]

_FORMAT_VERSION = 2
#: The codecs besides ZVC that are timed, and the dtypes each is timed on (one fit per width).
OTHER_CODEC_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "exponent": (torch.bfloat16, torch.float32),
    "bitpack": (torch.bool,),
}


@dataclass(frozen=True)
class OpSpeed:
    """Seconds of one codec operation as a linear function of its size and density.

    Attributes:
        fixed_s: per-call overhead.
        s_per_byte: seconds per byte of the uncompressed tensor.
        s_per_nonzero_byte: extra seconds per byte of nonzero values.
    """

    fixed_s: float
    s_per_byte: float
    s_per_nonzero_byte: float

    def seconds(self, nbytes: float, density: float) -> float:
        """Predicted seconds for a tensor of ``nbytes`` with a fraction ``density`` of nonzero elements."""
        return self.fixed_s + self.s_per_byte * nbytes + self.s_per_nonzero_byte * nbytes * density

    @property
    def dense_gbps(self) -> float:
        """Throughput on a fully dense tensor, in GB/s (large-tensor limit)."""
        per_byte = self.s_per_byte + self.s_per_nonzero_byte
        return 1e-9 / per_byte if per_byte > 0 else float("inf")


@dataclass(frozen=True)
class CodecSpeed:
    """Measured ZVC speed of one backend on one device; implements :class:`cswap.planner.costmodel.TimeModel`.

    Attributes:
        backend: the backend measured (``cpu``, ``cuda``, ``torch``).
        compress, decompress: the fitted :class:`OpSpeed` of ZVC's operations.
        device_key: fingerprint key of the device measured (``""`` when built by hand).
        others: ``(codec, itemsize, compress, decompress)`` of each other codec and width timed;
            a codec or width not here raises ``ValueError`` when asked for (see
            :func:`cswap.planner.costmodel.codec_seconds`).
    """

    backend: str
    compress: OpSpeed
    decompress: OpSpeed
    device_key: str = ""
    others: tuple[tuple[str, int, OpSpeed, OpSpeed], ...] = ()

    def _other(self, codec: str, itemsize: int) -> tuple[OpSpeed, OpSpeed]:
        widths = {width: (c, d) for name, width, c, d in self.others if name == codec}
        if not widths:
            known = sorted({name for name, *_ in self.others})
            raise ValueError(f"codec {codec!r} was not timed on backend {self.backend!r} (timed: zvc, {', '.join(known) or 'nothing else'})")
        # the nearest width timed: per byte, exponent coding of fp16 runs as bf16's
        return widths[min(widths, key=lambda width: (abs(width - itemsize), width))]

    def _check(self, backend: str) -> None:
        if backend != self.backend:
            raise ValueError(
                f"this CodecSpeed was measured for backend {self.backend!r}, not {backend!r}: "
                f"measure it with codec_speed(device, {backend!r})"
            )

    def compress_s(self, nbytes: int, density: float, itemsize: int, backend: str, codec: str = "zvc") -> float:
        """Predicted compression seconds (ZVC's fit is per byte whatever ``itemsize``; another codec's per width)."""
        self._check(backend)
        if codec == "zvc":
            return self.compress.seconds(nbytes, density)
        return self._other(codec, itemsize)[0].seconds(nbytes, 1.0)

    def decompress_s(self, nbytes: int, density: float, itemsize: int, backend: str, codec: str = "zvc") -> float:
        """Predicted decompression seconds."""
        self._check(backend)
        if codec == "zvc":
            return self.decompress.seconds(nbytes, density)
        return self._other(codec, itemsize)[1].seconds(nbytes, 1.0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with a format version."""
        data = asdict(self)
        data["others"] = [{"codec": codec, "itemsize": itemsize, "compress": asdict(c), "decompress": asdict(d)}
                          for codec, itemsize, c, d in self.others]
        return {"version": _FORMAT_VERSION, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CodecSpeed:
        """Inverse of :meth:`to_dict`; ``ValueError`` for another format version or missing fields."""
        if data.get("version") != _FORMAT_VERSION:
            raise ValueError(f"codec speed format {data.get('version')!r} is not {_FORMAT_VERSION}")
        return cls(
            backend=str(data["backend"]),
            compress=OpSpeed(**data["compress"]),
            decompress=OpSpeed(**data["decompress"]),
            device_key=str(data.get("device_key", "")),
            others=tuple(
                (str(o["codec"]), int(o["itemsize"]), OpSpeed(**o["compress"]), OpSpeed(**o["decompress"]))
                for o in data.get("others", ())
            ),
        )


def _default_sizes(device: torch.device) -> tuple[int, ...]:
    if device.type == "cuda":
        return (1 << 20, 16 << 20, 64 << 20)
    return (256 << 10, 2 << 20, 8 << 20)


def _synthetic(nbytes: int, density: float, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    numel = nbytes // 4
    mask = torch.rand(numel, generator=generator) < density
    values = torch.rand(numel, generator=generator) + 1.0
    return torch.where(mask, values, torch.zeros(())).to(device)


def _dense(nbytes: int, dtype: torch.dtype, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """Values another codec codes as it would an activation: normals, or a mask with one element in ten off."""
    if dtype == torch.bool:
        return (torch.rand(nbytes, generator=generator) >= 0.1).to(device)
    return torch.randn(nbytes // dtype.itemsize, generator=generator).to(dtype).to(device)


def _timed(fn: Any, device: torch.device, repeats: int, clock: Callable[[], float]) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after one warm-up call, read from ``clock``."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = clock()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(clock() - start)
    return float(np.median(times))


def _fit(rows: list[tuple[float, float, float]]) -> OpSpeed:
    """Non-negative least squares of seconds on (1, nbytes, nonzero bytes), weighted by 1/seconds."""
    design = np.array([[1.0, n, n * d] for n, d, _ in rows])
    seconds = np.array([s for _, _, s in rows])
    # Relative, not absolute, error matters across sizes: weight each row by 1/seconds.
    weights = 1.0 / np.maximum(seconds, 1e-9)
    coefficients, _ = nnls(design * weights[:, None], seconds * weights)
    return OpSpeed(fixed_s=float(coefficients[0]), s_per_byte=float(coefficients[1]), s_per_nonzero_byte=float(coefficients[2]))


def measure_codec_speed(
    device: str | torch.device | None,
    backend: str,
    sizes: tuple[int, ...] | None = None,
    densities: tuple[float, ...] = (0.1, 0.7),
    repeats: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> CodecSpeed:
    """Time ``compress``/``decompress`` of ``backend`` on ``device`` now and fit :class:`OpSpeed` per op (no cache).

    Args:
        device: where the tensors live.
        backend: the codec backend to time.
        sizes: tensor sizes in bytes (default: 256 KiB-8 MiB on CPU, 1-64 MiB on GPU).
        densities: fractions of nonzero elements.
        repeats: timed calls per point (the median is used).
        clock: seconds now (default ``time.perf_counter``); tests pass a deterministic one.

    Example:
        >>> measure_codec_speed("cpu", "torch", sizes=(4096, 65536), repeats=1).backend
        'torch'
    """
    device = resolve_device(device)
    generator = torch.Generator().manual_seed(0)
    compress_rows: list[tuple[float, float, float]] = []
    decompress_rows: list[tuple[float, float, float]] = []
    # Numba's OpenMP layer changes torch's intra-op thread count as a side effect: put it back.
    threads = torch.get_num_threads()
    try:
        for nbytes in sizes or _default_sizes(device):
            for density in densities:
                tensor = _synthetic(nbytes, density, device, generator)
                packed = compress(tensor, backend=backend)
                actual_density = packed.density
                compress_rows.append((nbytes, actual_density, _timed(lambda: compress(tensor, backend=backend), device, repeats, clock)))
                out = torch.empty_like(tensor)
                decompress_rows.append(
                    (nbytes, actual_density, _timed(lambda: decompress(packed, backend=backend, out=out, validate=False), device, repeats, clock))
                )
        others = tuple(_time_other(codec, dtype, backend, device, sizes or _default_sizes(device), repeats, clock, generator)
                       for codec, dtypes in OTHER_CODEC_DTYPES.items() if backend in CODECS.get(codec).available_backends()
                       for dtype in dtypes)
    finally:
        torch.set_num_threads(threads)
    return CodecSpeed(backend=backend, compress=_fit(compress_rows), decompress=_fit(decompress_rows), device_key=fingerprint(device).key,
                      others=others)


def _time_other(
    codec: str, dtype: torch.dtype, backend: str, device: torch.device, sizes: tuple[int, ...], repeats: int,
    clock: Callable[[], float], generator: torch.Generator,
) -> tuple[str, int, OpSpeed, OpSpeed]:
    """``codec`` on dense ``dtype`` tensors of each size, fitted on size alone (density 1)."""
    compress_rows, decompress_rows = [], []
    for nbytes in sizes:
        tensor = _dense(nbytes, dtype, device, generator)
        packed = compress(tensor, codec=codec, backend=backend)
        out = torch.empty_like(tensor)
        compress_rows.append((nbytes, 1.0, _timed(lambda: compress(tensor, codec=codec, backend=backend), device, repeats, clock)))
        decompress_rows.append(
            (nbytes, 1.0, _timed(lambda: decompress(packed, backend=backend, out=out, validate=False), device, repeats, clock))
        )
    return codec, dtype.itemsize, _fit(compress_rows), _fit(decompress_rows)


@functools.cache
def kernels_digest(backend: str) -> str:
    """A digest of the sources of ``backend``'s codec kernels (``cswap/codecs/*_<backend>.py``).

    A speed is measured for the kernels that ran: once they change (a release, an edit), a cached
    speed describes other code, so its cache file is named by this digest.

    Example:
        >>> kernels_digest("cpu") == kernels_digest("cpu") != kernels_digest("torch")
        True
    """
    digest = hashlib.sha256()
    for path in sorted(Path(codecs_package.__file__).parent.glob(f"*_{backend}.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def cache_path(device: str | torch.device | None, backend: str, cache_dir: Path | None = None) -> Path:
    """Where :func:`codec_speed` keeps the speed of ``backend`` on ``device``: one file per device
    fingerprint, backend and :func:`kernels_digest`."""
    key = fingerprint(device).key
    return (cache_dir or cswap_home()) / f"codec-speed-{key}-{backend}-{kernels_digest(backend)}.json"


def codec_speed(device: str | torch.device | None, backend: str, cache_dir: Path | None = None) -> CodecSpeed:
    """:func:`measure_codec_speed` once per device fingerprint, backend and version of its kernels,
    cached as JSON (:func:`cache_path`).

    Args:
        device: where the tensors live.
        backend: the codec backend.
        cache_dir: where the cache lives (default :func:`cswap_home`).
    """
    path = cache_path(device, backend, cache_dir)
    try:
        return CodecSpeed.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        pass
    measured = measure_codec_speed(device, backend)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(measured.to_dict()))
    tmp.replace(path)
    return measured
