"""What a launch config scores: the median seconds of one (de)compression of a representative tensor.

The tensor stands for a size bucket: ``4 ** bucket`` bytes of the dtype, seeded so that every
config sees the same data, and shaped like what the codec is for: for ZVC about half of it zero
(ReLU of Gaussian noise for floats, the same zero pattern for integers); for bit-packing a
dropout mask (nine in ten elements kept); for exponent coding Gaussian noise, no zeros. Time is measured with ``time.perf_counter`` on CPU and CUDA events on
the GPU, after a warm-up call, as the median of ``repeats`` calls. A config the codec rejects or
that fails while running scores ``math.inf``; so does one whose output does not round-trip
bit-exactly (checked once per config, outside the timing).

Example:
    >>> objective = KernelObjective("cpu", "compress", "float32", nbytes=1 << 16, repeats=3)
    >>> seconds = objective({"threads": 1, "chunk_words": 32})
    >>> 0 < seconds < 1
    True
    >>> objective({"threads": 1, "chunk_words": 0})
    inf
    >>> KernelObjective("cpu", "compress", "bool", nbytes=1 << 12, repeats=1, codec="bitpack")({"threads": 1}) > 0
    True
"""

from __future__ import annotations

import math
import os
import statistics
from typing import Any
from collections.abc import Callable, Mapping

import torch

from cswap.codecs import compress, decompress
from cswap.codecs.format import bits_dtype
from cswap.codecs.launch import launch_from_params
from cswap.device import time_call_s
from cswap.tuner.kernels import dtype_name, kernel_name, parse_dtype
from cswap.tuner.space import OPS, check_codec

__all__ = ["DENSITIES", "KernelObjective", "check_tunable", "representative_tensor"]

#: The nonzero fraction of each codec's representative tensor: ZVC's half-zero activations, a
#: dropout mask of p = 0.1, floats with no zeros.
DENSITIES: dict[str, float] = {"zvc": 0.5, "bitpack": 0.9, "exponent": 1.0}


def representative_tensor(
    dtype: torch.dtype | str,
    nbytes: int,
    device: torch.device | str = "cpu",
    density: float = 0.5,
    seed: int = 0,
    codec: str = "zvc",
) -> torch.Tensor:
    """A 1-d tensor of ``nbytes`` bytes (at least one element) in which about ``density`` of the elements are nonzero.

    For ZVC and bit-packing, floats are ``relu(randn)`` (post-activation data), shifted so the
    nonzero fraction is ``density``; integers and bool get random nonzero values (bool: ``True``)
    in the same kind of pattern (for bit-packing, 0 and 1). For exponent coding, floats are ``randn`` (pre-activation data,
    whose exponents the codec codes) with ``1 - density`` of them zeroed.

    Args:
        dtype: a dtype ``codec`` takes, or its name.
        nbytes: bytes of the tensor (rounded down to whole elements).
        device: where it lives.
        density: fraction of nonzero elements, in ``[0, 1]``.
        seed: the generator seed, so each config is timed on the same data.
        codec: the codec the tensor is for.

    Example:
        >>> t = representative_tensor("float32", 4096, seed=1)
        >>> t.numel(), 0.4 < float((t != 0).float().mean()) < 0.6
        (1024, True)
        >>> bool((representative_tensor("bfloat16", 4096, density=1.0, codec="exponent") < 0).any())
        True
    """
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density is {density}, must be within [0, 1]")
    dtype = parse_dtype(dtype, check_codec(codec))
    numel = max(1, nbytes // dtype.itemsize)
    generator = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point and codec == "exponent":
        normal = torch.randn(numel, generator=generator)
        keep = torch.rand(numel, generator=generator) < density
        t = (normal * keep).to(dtype)
    elif dtype.is_floating_point:
        normal = torch.randn(numel, generator=generator)
        # The (1 - density) quantile of N(0, 1): relu(x - q) is nonzero with probability density.
        shift = float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(min(max(1.0 - density, 1e-6), 1 - 1e-6))))
        t = torch.relu(normal - shift).to(dtype)
    else:
        keep = torch.rand(numel, generator=generator) < density
        if dtype == torch.bool or codec == "bitpack":  # bit-packing takes uint8 of 0 and 1 only
            t = keep.to(dtype)
        else:
            t = torch.randint(1, 100, (numel,), generator=generator).to(dtype) * keep.to(dtype)
    return t.to(device)


def check_tunable(backend: str) -> torch.device:
    """The device to measure ``backend`` on; ``RuntimeError`` with the fix when it cannot be tuned here.

    CUDA is never tuned on the Numba simulator (``NUMBA_ENABLE_CUDASIM=1``): its timings say
    nothing about a GPU.
    """
    if backend == "cpu":
        return torch.device("cpu")
    if backend == "cuda":
        if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
            raise RuntimeError(
                "refusing to tune zvc.cuda under the Numba CUDA simulator (NUMBA_ENABLE_CUDASIM is set): "
                "simulated timings say nothing about a GPU. Unset it and tune on a machine with a GPU."
            )
        if not torch.cuda.is_available():
            raise RuntimeError(
                "cannot tune backend 'cuda': torch sees no GPU (torch.cuda.is_available() is False). "
                "Tune --backend cpu here, or run on a machine with a CUDA GPU."
            )
        return torch.device("cuda", torch.cuda.current_device())
    raise ValueError(f"no tunable kernels for backend {backend!r}: choose cpu or cuda")


class KernelObjective:
    """Seconds of kernel ``<codec>.<backend>.<op>`` on a representative tensor, as a function of the launch config.

    Args:
        backend: ``cpu`` or ``cuda``.
        op: ``compress`` or ``decompress`` (decompress times the decoding of data compressed
            with the same config, so a CPU config's ``chunk_words`` applies to both).
        dtype: element dtype of the tensor (one the codec takes).
        nbytes: bytes of the tensor (normally :func:`cswap.tuner.kernels.bucket_nbytes` of a bucket).
        repeats: timed calls per config; the median is the score.
        warmup: untimed calls first (JIT compilation, caches, page faults).
        verify: check once per config that the output round-trips bit-exactly.
        density: nonzero fraction of the tensor (``None``: the codec's, :data:`DENSITIES`).
        seed: data seed.
        statistic: how the repeats become the score; the median (default) is what tuning uses,
            ``min`` estimates the undisturbed time on a busy machine (for reference tables).
        codec: ``zvc`` (default), ``bitpack`` or ``exponent``.

    Attributes:
        kernel: the kernel name.
        failures: the error message of each config that scored ``inf``, by config.
        calls: configs measured so far (cached repeats included).

    Example:
        >>> KernelObjective("cpu", "decompress", torch.float16, nbytes=4096, repeats=1)({"threads": 1, "chunk_words": 16}) > 0
        True
    """

    def __init__(
        self,
        backend: str,
        op: str,
        dtype: torch.dtype | str,
        nbytes: int,
        repeats: int = 7,
        warmup: int = 1,
        verify: bool = True,
        density: float | None = None,
        seed: int = 0,
        statistic: Callable[[list[float]], float] = statistics.median,
        codec: str = "zvc",
    ) -> None:
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}: choose one of {', '.join(OPS)}")
        if repeats < 1 or warmup < 0:
            raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
        self.kernel = kernel_name(backend, op, check_codec(codec))
        self.codec = codec
        self.backend = backend
        self.op = op
        self.dtype = parse_dtype(dtype, codec)
        self.density = DENSITIES[codec] if density is None else density
        self.nbytes = nbytes
        self.repeats = repeats
        self.warmup = warmup
        self.verify = verify
        self.statistic = statistic
        self.device = check_tunable(backend)
        self.tensor = representative_tensor(self.dtype, nbytes, self.device, self.density, seed, codec)
        self.failures: dict[tuple[tuple[str, int], ...], str] = {}
        self.calls = 0
        self._verified: set[tuple[tuple[str, int], ...]] = set()

    def __repr__(self) -> str:
        return (
            f"KernelObjective({self.kernel}, {dtype_name(self.dtype)}, nbytes={self.nbytes}, "
            f"repeats={self.repeats}, device={self.device})"
        )

    def __call__(self, params: Mapping[str, Any]) -> float:
        """Seconds of the op with launch ``params`` (the statistic of the repeats); ``math.inf`` if the config fails."""
        self.calls += 1
        key = tuple(sorted((k, int(v)) for k, v in params.items()))
        try:
            launch = launch_from_params(self.backend, params)
            call = self._call(launch)
            if self.verify and key not in self._verified:
                self._check(call())
                self._verified.add(key)
            for _ in range(self.warmup):
                call()
            return float(self.statistic([self._time(call) for _ in range(self.repeats)]))
        except Exception as error:  # any failure of a config is a score, not a crash of the search
            self.failures[key] = f"{type(error).__name__}: {error}"
            return math.inf

    def _call(self, launch: Any) -> Callable[[], torch.Tensor | Any]:
        t = self.tensor
        if self.op == "compress":
            return lambda: compress(t, codec=self.codec, backend=self.backend, launch=launch)
        packed = compress(t, codec=self.codec, backend=self.backend, launch=launch)
        out = torch.empty_like(t)
        return lambda: decompress(packed, backend=self.backend, out=out, launch=launch, validate=False)

    def _check(self, result: Any) -> None:
        if self.op == "compress":
            result = decompress(result, backend="torch")
        bits = bits_dtype(self.dtype)
        if self.dtype == torch.bool:
            same = torch.equal(result.view(torch.uint8), self.tensor.view(torch.uint8))
        else:
            same = torch.equal(result.view(bits), self.tensor.view(bits))
        if not same:
            raise RuntimeError(f"{self.kernel} with this config did not round-trip bit-exactly")

    def _time(self, call: Callable[[], Any]) -> float:
        return time_call_s(call, self.device)
