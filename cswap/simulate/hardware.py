"""Hardware profiles: what one machine computes, moves and compresses per second.

A profile is a YAML file in ``configs/hardware/`` (or anywhere, given by path) validated into a
frozen :class:`HardwareProfile`. It holds the figures the simulator needs and nothing it does not:

* ``device``: peak compute per dtype and the efficiency assumed on it, device memory size and
  bandwidth (and the fraction memory-bound kernels reach), and a fixed cost per operator;
* ``link``: effective (not peak) host<->device bandwidth each way, and whether copies overlap
  compute (a copy engine: ``true`` on GPUs; ``false`` where a copy runs on the compute thread, as
  on a CPU);
* ``device_codec`` / ``host_codec``: the ZVC codec's speed on the device and on the host CPU.

Codec time follows the traffic of the ZVC format (:mod:`cswap.codecs.format`): compressing reads
the tensor and writes the compressed buffers, decompressing reads those and writes the tensor, so

    compress_s   = (nbytes + compressed_nbytes) / compress_gbps   + compress_overhead_s
    decompress_s = (compressed_nbytes + nbytes) / decompress_gbps + decompress_overhead_s

with ``*_gbps`` the effective bandwidth the codec reaches on that traffic. A calibrated time model
(any :class:`cswap.planner.costmodel.TimeModel`) can replace these per simulation.

Profiles are found by name in, in order: ``$CSWAP_HARDWARE_DIR``, then the repository's
``configs/hardware`` next to this package, so they load from any working directory.

Example:
    >>> profile = load_hardware("v100-pcie3")
    >>> profile.link.h2d_gbps
    12.0
    >>> round(profile.effective_tflops("float32"), 2) > 0
    True
    >>> "v100-pcie3" in hardware_names()
    True
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cswap.codecs.format import DEFAULT_CHUNK_WORDS
from cswap.paths import shipped_configs_dir
from cswap.planner.costmodel import zvc_nbytes_for

__all__ = [
    "HARDWARE_ENV",
    "CodecSpec",
    "DeviceSpec",
    "HardwareError",
    "HardwareProfile",
    "HardwareTimeModel",
    "LinkSpec",
    "hardware_dir",
    "hardware_names",
    "load_hardware",
]

#: The environment variable that points at a directory of hardware profiles.
HARDWARE_ENV = "CSWAP_HARDWARE_DIR"


class HardwareError(ValueError):
    """A hardware profile that is missing, unreadable or invalid; the message names the file and key."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DeviceSpec(_Frozen):
    """The accelerator (or, for a CPU profile, the CPU doing the compute).

    Args:
        name: the product name.
        kind: ``cuda`` for a GPU, ``cpu`` for a CPU profile; names the codec backend of device work.
        memory_gb: device memory, GB (1e9 bytes).
        memory_gbps: peak device memory bandwidth, GB/s.
        memory_efficiency: fraction of ``memory_gbps`` memory-bound operators reach.
        peak_tflops: peak dense throughput per dtype name (``float32``, ``float16``, ``bfloat16``),
            TFLOP/s, for the math PyTorch uses by default on that dtype.
        compute_efficiency: fraction of ``peak_tflops`` compute-bound operators reach (every dtype
            not in ``compute_efficiency_by_dtype``).
        compute_efficiency_by_dtype: the same per dtype name, where a dtype's math differs (bf16
            and fp16 on tensor cores against TF32), each from its own published source.
        op_overhead_s: fixed seconds per operator (launch and scheduling).
        hook_overhead_s: seconds of the runtime's own work per saved-tensor hook call (pack or
            unpack) that compute waits for. On a GPU the host runs ahead of queued kernels and
            hides it (0); on a CPU every hook call delays compute.
        move_overhead_s: extra seconds per hook call of a tensor that is moved or compressed
            (host buffers, bookkeeping), beyond its copy and codec time.
        iteration_overhead_s: seconds of the runtime's own work per iteration with hooks installed.
    """

    name: str = Field(min_length=1)
    kind: Literal["cuda", "cpu"] = "cuda"
    memory_gb: float = Field(gt=0)
    memory_gbps: float = Field(gt=0)
    memory_efficiency: float = Field(gt=0, le=1)
    peak_tflops: dict[str, float] = Field(min_length=1)
    compute_efficiency: float = Field(gt=0, le=1)
    compute_efficiency_by_dtype: dict[str, float] = Field(default_factory=dict)
    op_overhead_s: float = Field(default=0.0, ge=0)
    hook_overhead_s: float = Field(default=0.0, ge=0)
    move_overhead_s: float = Field(default=0.0, ge=0)
    iteration_overhead_s: float = Field(default=0.0, ge=0)

    @field_validator("peak_tflops")
    @classmethod
    def _positive_with_float32(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if not v > 0}
        if bad:
            raise ValueError(f"every peak must be positive, got {bad}")
        if "float32" not in value:
            raise ValueError("needs a 'float32' entry (the fallback for dtypes not listed)")
        return value

    @field_validator("compute_efficiency_by_dtype")
    @classmethod
    def _fractions(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if not 0 < v <= 1}
        if bad:
            raise ValueError(f"every efficiency must be in (0, 1], got {bad}")
        return value

    def efficiency(self, dtype: str) -> float:
        """The fraction of ``dtype``'s peak compute-bound operators reach."""
        return self.compute_efficiency_by_dtype.get(dtype, self.compute_efficiency)


class LinkSpec(_Frozen):
    """The host<->device link.

    Args:
        name: e.g. ``PCIe 3.0 x16``.
        h2d_gbps, d2h_gbps: effective bandwidth each way, GB/s.
        async_copies: copies run on a copy engine, overlapping compute; ``false`` puts every copy
            on the compute stream (a CPU "device").
    """

    name: str = Field(min_length=1)
    h2d_gbps: float = Field(gt=0)
    d2h_gbps: float = Field(gt=0)
    async_copies: bool = True


class CodecSpec(_Frozen):
    """Speed of the ZVC codec on one processor (see the module docstring for the traffic model).

    Args:
        compress_gbps, decompress_gbps: effective bandwidth on the codec's traffic, GB/s.
        compress_overhead_s, decompress_overhead_s: fixed seconds per call (kernel launches).
    """

    compress_gbps: float = Field(gt=0)
    decompress_gbps: float = Field(gt=0)
    compress_overhead_s: float = Field(default=0.0, ge=0)
    decompress_overhead_s: float = Field(default=0.0, ge=0)

    def compress_s(self, nbytes: float, compressed_nbytes: float) -> float:
        """Seconds to compress ``nbytes`` into ``compressed_nbytes``."""
        return (nbytes + compressed_nbytes) / (self.compress_gbps * 1e9) + self.compress_overhead_s

    def decompress_s(self, nbytes: float, compressed_nbytes: float) -> float:
        """Seconds to rebuild ``nbytes`` from ``compressed_nbytes``."""
        return (nbytes + compressed_nbytes) / (self.decompress_gbps * 1e9) + self.decompress_overhead_s


class CodecRate(_Frozen):
    """Speed of a codec besides ZVC on one processor, in GB/s of the uncompressed tensor.

    Exponent coding and bit-packing do the same work on every element whatever its value, so their
    time follows the tensor's size alone.

    Args:
        compress_gbps, decompress_gbps: uncompressed bytes per second, GB/s.
        compress_overhead_s, decompress_overhead_s: fixed seconds per call.
        by_itemsize: the rates of element widths timed apart (on a CPU exponent coding of bf16
            runs at half fp32's bytes per second); a width not here takes the nearest one's, and
            with none the rates above hold for every width.

    Example:
        >>> rate = CodecRate(compress_gbps=0.3, decompress_gbps=1.0, by_itemsize={2: CodecRate(compress_gbps=0.2, decompress_gbps=0.7)})
        >>> rate.at(2).compress_gbps, rate.at(1).compress_gbps, rate.at(4).compress_gbps
        (0.2, 0.2, 0.2)
    """

    compress_gbps: float = Field(gt=0)
    decompress_gbps: float = Field(gt=0)
    compress_overhead_s: float = Field(default=0.0, ge=0)
    decompress_overhead_s: float = Field(default=0.0, ge=0)
    by_itemsize: dict[int, CodecRate] = Field(default_factory=dict)

    def at(self, itemsize: int) -> CodecRate:
        """The rate of elements of ``itemsize`` bytes (:attr:`by_itemsize`' nearest width, else this one)."""
        if not self.by_itemsize:
            return self
        return self.by_itemsize[min(self.by_itemsize, key=lambda width: (abs(width - itemsize), width))]

    def seconds(self, op: str, nbytes: float) -> float:
        """Seconds of ``op`` (``compress`` or ``decompress``) on ``nbytes`` uncompressed bytes."""
        if op == "compress":
            return nbytes / (self.compress_gbps * 1e9) + self.compress_overhead_s
        return nbytes / (self.decompress_gbps * 1e9) + self.decompress_overhead_s


class HardwareProfile(_Frozen):
    """One machine as the simulator sees it.

    Args:
        name: the profile's name (the file stem for shipped profiles).
        description: one line for tables.
        device, link, device_codec, host_codec: see :class:`DeviceSpec`, :class:`LinkSpec`, :class:`CodecSpec`.
        device_codecs, host_codecs: the other codecs' speeds by registry name (:class:`CodecRate`);
            a codec not listed is priced as ZVC on a dense tensor.
        sources: where each figure comes from (datasheets, measurements, assumptions).
    """

    name: str = Field(min_length=1)
    description: str = ""
    device: DeviceSpec
    link: LinkSpec
    device_codec: CodecSpec
    host_codec: CodecSpec
    device_codecs: dict[str, CodecRate] = Field(default_factory=dict)
    host_codecs: dict[str, CodecRate] = Field(default_factory=dict)
    sources: tuple[str, ...] = Field(min_length=1)

    @property
    def memory_bytes(self) -> int:
        """Device memory in bytes."""
        return int(self.device.memory_gb * 1e9)

    def effective_tflops(self, dtype: str) -> float:
        """TFLOP/s compute-bound operators reach on ``dtype`` (``float32``'s peak for unlisted dtypes)."""
        peak = self.device.peak_tflops.get(dtype, self.device.peak_tflops["float32"])
        return peak * self.device.efficiency(dtype)

    def effective_memory_gbps(self) -> float:
        """GB/s memory-bound operators reach."""
        return self.device.memory_gbps * self.device.memory_efficiency

    def op_s(self, flops: float, nbytes: float, dtype: str = "float32") -> float:
        """Roofline seconds of one operator: the slower of its FLOPs and its memory traffic, plus the fixed cost.

        Example:
            >>> p = load_hardware("v100-pcie3")
            >>> p.op_s(0, 0) == p.device.op_overhead_s
            True
        """
        compute = flops / (self.effective_tflops(dtype) * 1e12)
        memory = nbytes / (self.effective_memory_gbps() * 1e9)
        return max(compute, memory) + self.device.op_overhead_s

    def time_model(self) -> HardwareTimeModel:
        """This profile's codec speeds as a :class:`cswap.planner.costmodel.TimeModel`."""
        return HardwareTimeModel(self)


class HardwareTimeModel:
    """A :class:`cswap.planner.costmodel.TimeModel` from a profile's codec speeds.

    Backend ``cuda`` uses ``device_codec``, ``cpu`` and ``torch`` use ``host_codec``; on a CPU
    profile (``device.kind: cpu``) every backend uses ``device_codec``: it is the same processor.

    Example:
        >>> tm = load_hardware("v100-pcie3").time_model()
        >>> tm.compress_s(1 << 20, 0.5, 4, "cuda") < tm.compress_s(1 << 20, 0.5, 4, "cpu")
        True
    """

    def __init__(self, profile: HardwareProfile, chunk_words: int = DEFAULT_CHUNK_WORDS) -> None:
        self.profile = profile
        self.chunk_words = chunk_words

    def _on_device(self, backend: str) -> bool:
        if backend == "cuda" or (self.profile.device.kind == "cpu" and backend in ("cpu", "torch")):
            return True
        if backend in ("cpu", "torch"):
            return False
        raise ValueError(f"unknown codec backend {backend!r}: choose cuda, cpu or torch")

    def _codec(self, backend: str) -> CodecSpec:
        return self.profile.device_codec if self._on_device(backend) else self.profile.host_codec

    def _other(self, backend: str, codec: str, itemsize: int) -> CodecRate:
        rates = self.profile.device_codecs if self._on_device(backend) else self.profile.host_codecs
        if codec not in rates:
            raise ValueError(f"profile {self.profile.name!r} gives no speed for codec {codec!r} on backend {backend!r}")
        return rates[codec].at(itemsize)

    def _compressed(self, nbytes: int, density: float, itemsize: int) -> int:
        return zvc_nbytes_for(int(nbytes), 1.0 - density, itemsize, self.chunk_words)

    def compress_s(self, nbytes: int, density: float, itemsize: int, backend: str, codec: str = "zvc") -> float:
        """Seconds to compress (see the module docstring); another codec's from its :class:`CodecRate`."""
        if codec != "zvc":
            return self._other(backend, codec, itemsize).seconds("compress", nbytes)
        return self._codec(backend).compress_s(nbytes, self._compressed(nbytes, density, itemsize))

    def decompress_s(self, nbytes: int, density: float, itemsize: int, backend: str, codec: str = "zvc") -> float:
        """Seconds to decompress (see the module docstring)."""
        if codec != "zvc":
            return self._other(backend, codec, itemsize).seconds("decompress", nbytes)
        return self._codec(backend).decompress_s(nbytes, self._compressed(nbytes, density, itemsize))


def hardware_dir() -> Path:
    """The directory profiles are looked up in by name (see the module docstring)."""
    env = os.environ.get(HARDWARE_ENV)
    if env:
        return Path(env)
    return shipped_configs_dir() / "hardware"


def hardware_names() -> tuple[str, ...]:
    """Names of the profiles in :func:`hardware_dir`, sorted."""
    directory = hardware_dir()
    if not directory.is_dir():
        return ()
    return tuple(sorted(p.stem for p in directory.glob("*.yaml")))


def _problems(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(part) for part in e['loc']) or '<file>'}: {e['msg']}" for e in error.errors())


def load_hardware(name_or_path: str | os.PathLike[str] | HardwareProfile) -> HardwareProfile:
    """Load and validate a profile by name (``v100-pcie3``) or by path to a YAML file.

    Raises:
        HardwareError: unknown name (listing the valid ones), unreadable or invalid file (naming the
            file and each bad key).
    """
    if isinstance(name_or_path, HardwareProfile):
        return name_or_path
    text = str(name_or_path)
    path = Path(text)
    if not (text.endswith((".yaml", ".yml")) or path.is_file()):
        path = hardware_dir() / f"{text}.yaml"
        if not path.is_file():
            names = ", ".join(hardware_names()) or "(none found)"
            raise HardwareError(
                f"unknown hardware {text!r}: choose one of {names}, or give the path of a profile YAML "
                f"(profiles are read from {hardware_dir()}; set ${HARDWARE_ENV} to use another directory)"
            )
    try:
        raw: Any = yaml.safe_load(path.read_text())
    except OSError as error:
        raise HardwareError(f"cannot read hardware profile {path}: {error}") from error
    except yaml.YAMLError as error:
        raise HardwareError(f"hardware profile {path} is not valid YAML: {error}; fix the syntax") from error
    if not isinstance(raw, dict):
        raise HardwareError(
            f"hardware profile {path} must be a mapping with keys name, device, link, device_codec, host_codec, sources"
        )
    try:
        return HardwareProfile.model_validate(raw)
    except ValidationError as error:
        raise HardwareError(f"invalid hardware profile {path}: {_problems(error)}") from error
