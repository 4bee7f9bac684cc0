# Longer than the ~500-line guide on purpose: the sampling plan and the timing loop implement one
# protocol against interference (shuffled passes, per-call timing) that is read best in one place.
"""Calibration: micro-benchmarks of a codec backend over tensor size, sparsity and element width.

A :class:`CalibrationPlan` names the grid (log-spaced sizes, densities, dtypes, ops); :func:`calibrate`
times every point and returns :class:`Sample` records, the data the time model is fitted on.

How the timing is made robust on a busy machine:

* Each point is visited once per *pass*, and the passes visit the points in a fresh random order,
  so a burst of interference from other processes lands on different points in each pass instead
  of spoiling every repeat of one point.
* Every call is timed on its own; a visit repeats a cheap call until the visit lasts about
  ``min_time_s``, so cheap points get more timings. Interference on a 2-core machine comes in
  bursts of seconds, so many short visits spread over the run beat long visits.
* Points whose fastest time is not yet trustworthy (unconfirmed by a second timing, or well above
  its neighbours in size) are visited again, while the time budget lasts.
* A point's time is the *minimum* over its timings: interference (a descheduled worker thread, a
  page-cache flush) only ever adds time, so the fastest call is the best estimate of what the
  codec itself costs, and it is the figure that stays put from run to run on a shared machine.
  All timings are kept in :attr:`Sample.times_s`.
* What is timed is what the runtime pays: ``compress(t)`` including its output allocation, and
  ``decompress(packed, validate=False)`` into a fresh tensor, with the launch config the tuner
  would pick for that (codec, op, dtype, size) on this device.

The tensors of one (dtype, density) are prefixes of one random tensor of the largest size, so the
grid costs one allocation per (dtype, density) rather than one per point. A plan measures one codec
(``zvc`` by default) on the dtypes it is for (:data:`CODEC_DTYPES`): ZVC and exponent coding on
bfloat16 and float32, bit-packing on bool. The density is the fraction of nonzero elements
(bit-packing: of ``True``); exponent coding's nonzero values are Gaussian, whose exponents are
those of activations, where ZVC's and bit-packing's are in ``[1, 2)``.

Example:
    >>> plan = CalibrationPlan.quick("torch")
    >>> run = calibrate(plan)
    >>> len(run.samples) == plan.n_points
    True
    >>> sorted({s.op for s in run.samples})
    ['compress', 'decompress']
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np
import torch

from cswap.codecs import compress, decompress
from cswap.codecs.format import bits_dtype
from cswap.codecs.launch import CpuLaunch, Launch
from cswap.device import fingerprint as device_fingerprint
from cswap.device import time_call_s
from cswap.tuner.kernels import codec_dtypes
from cswap.tuner.lookup import launch_for
from cswap.tuner.store import ConfigStore

__all__ = [
    "CALIBRATED_DTYPES",
    "CODEC_DTYPES",
    "CalibrationPlan",
    "CalibrationRun",
    "OPS",
    "Sample",
    "calibrate",
    "log_sizes",
    "samples_from_dict",
    "samples_to_dict",
]

#: The operations a codec is calibrated for.
OPS: tuple[str, ...] = ("compress", "decompress")
#: Element widths 2 and 4 bytes, the activation dtypes of mixed-precision and fp32 training.
CALIBRATED_DTYPES: tuple[str, ...] = ("bfloat16", "float32")
#: The dtypes each codec is calibrated on: what it is for in training (bit-packing: dropout masks).
CODEC_DTYPES: Mapping[str, tuple[str, ...]] = {
    "zvc": CALIBRATED_DTYPES,
    "bitpack": ("bool",),
    "exponent": CALIBRATED_DTYPES,
}
#: Format tag of :func:`samples_to_dict` documents.
SAMPLES_FORMAT = "cswap.calibration-samples"
SAMPLES_VERSION = 1

_DTYPES: Mapping[str, torch.dtype] = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
}
_BACKENDS = ("torch", "cpu", "cuda")
# Sizes are multiples of 256 bytes so that every width divides them.
_SIZE_QUANTUM_BYTES = 256
# A visit planned to last ``min_time_s`` is cut short after this many times that (interference).
_VISIT_CAP = 10.0


def log_sizes(min_bytes: int, max_bytes: int, count: int) -> tuple[int, ...]:
    """``count`` log-spaced sizes from ``min_bytes`` to ``max_bytes``, multiples of 256 bytes, distinct.

    Example:
        >>> log_sizes(4096, 1 << 20, 5)
        (4096, 16384, 65536, 262144, 1048576)
    """
    if count < 2 or min_bytes < _SIZE_QUANTUM_BYTES or max_bytes <= min_bytes:
        raise ValueError(
            f"need count >= 2 and {_SIZE_QUANTUM_BYTES} <= min_bytes < max_bytes, "
            f"got count={count}, min_bytes={min_bytes}, max_bytes={max_bytes}"
        )
    sizes = np.geomspace(min_bytes, max_bytes, count)
    rounded = sorted({int(round(s / _SIZE_QUANTUM_BYTES)) * _SIZE_QUANTUM_BYTES for s in sizes})
    return tuple(rounded)


@dataclass(frozen=True)
class CalibrationPlan:
    """What to measure.

    Args:
        backend: codec backend (``cpu``, ``cuda`` or ``torch``).
        sizes_bytes: tensor sizes, in bytes.
        densities: nonzero fractions (``1 - sparsity``), each in ``(0, 1]``.
        dtypes: element dtypes, by name (``None``: the codec's, :data:`CODEC_DTYPES`).
        ops: ``compress`` and/or ``decompress``.
        passes: timed visits of every point.
        min_passes: passes made even when the budget has run out.
        min_time_s: a visit repeats a cheap call about this long (at most ten times longer).
        max_units: at most this many timed calls per visit.
        budget_s: seconds the calibration should take: a pass starts only if it should end within
            it (judging by the last pass), revisits stop at it (``None``: no limit).
        refine_rounds: rounds of revisiting points whose fastest time is not yet trustworthy.
        refine_ratio: a point whose fastest time is this much above its size neighbours' is revisited.
        codec: the codec to calibrate (``zvc``, ``bitpack`` or ``exponent``).
        seed: data and visiting-order seed.

    Example:
        >>> CalibrationPlan.default("cpu").sizes_bytes[-1] == 64 << 20
        True
        >>> CalibrationPlan.quick("cpu", codec="bitpack").dtypes
        ('bool',)
    """

    backend: str
    sizes_bytes: tuple[int, ...]
    densities: tuple[float, ...] = (1.0, 0.6, 0.3, 0.1, 0.01)
    dtypes: tuple[str, ...] | None = None
    ops: tuple[str, ...] = OPS
    passes: int = 10
    min_passes: int = 4
    min_time_s: float = 1e-3
    max_units: int = 16
    budget_s: float | None = None
    refine_rounds: int = 4
    refine_ratio: float = 1.25
    codec: str = "zvc"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.backend not in _BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}: choose one of {', '.join(_BACKENDS)}")
        if self.codec not in CODEC_DTYPES:
            raise ValueError(f"unknown codec {self.codec!r}: choose one of {', '.join(CODEC_DTYPES)}")
        if self.dtypes is None:
            object.__setattr__(self, "dtypes", CODEC_DTYPES[self.codec])
        if not self.sizes_bytes or any(s < _SIZE_QUANTUM_BYTES or s % _SIZE_QUANTUM_BYTES for s in self.sizes_bytes):
            raise ValueError(f"sizes_bytes must be multiples of {_SIZE_QUANTUM_BYTES} bytes (make them with log_sizes), got {self.sizes_bytes}")
        if not self.densities or any(not 0.0 < d <= 1.0 for d in self.densities):
            raise ValueError(f"densities must lie in (0, 1] (density = 1 - sparsity), got {self.densities}")
        unknown = [d for d in self.dtypes if d not in _DTYPES]
        if not self.dtypes or unknown:
            raise ValueError(f"unknown dtypes {unknown}: choose from {', '.join(_DTYPES)}")
        refused = [d for d in self.dtypes if _DTYPES[d] not in codec_dtypes(self.codec)]
        if refused:
            takes = ", ".join(str(d).removeprefix("torch.") for d in codec_dtypes(self.codec))
            raise ValueError(f"codec {self.codec!r} does not take dtypes {refused}: it takes {takes}")
        bad_ops = [op for op in self.ops if op not in OPS]
        if not self.ops or bad_ops:
            raise ValueError(f"unknown ops {bad_ops}: choose from {', '.join(OPS)}")
        if not 1 <= self.min_passes <= self.passes or self.max_units < 1 or self.min_time_s < 0 or self.refine_rounds < 0:
            raise ValueError(
                f"need 1 <= min_passes <= passes, max_units >= 1, min_time_s >= 0, refine_rounds >= 0; got "
                f"min_passes={self.min_passes}, passes={self.passes}, max_units={self.max_units}, "
                f"min_time_s={self.min_time_s}, refine_rounds={self.refine_rounds}"
            )
        if self.budget_s is not None and self.budget_s <= 0:
            raise ValueError(f"budget_s must be positive seconds or None, got {self.budget_s}")
        if self.refine_ratio <= 1:
            raise ValueError(f"refine_ratio must be > 1, got {self.refine_ratio}")

    @property
    def n_points(self) -> int:
        """Measured points: sizes x densities x dtypes x ops."""
        return len(self.sizes_bytes) * len(self.densities) * len(self.dtypes) * len(self.ops)

    @classmethod
    def default(cls, backend: str, codec: str = "zvc") -> CalibrationPlan:
        """The full grid: 4 KiB to 64 MiB (256 MiB on GPU) in steps just under 2x, 5 densities, the codec's dtypes.

        Steps under 2x resolve where the cost per byte changes (cache sizes, the allocator's mmap
        threshold), and keep every size but the ends off the powers of two: glibc's largest mmap
        threshold is exactly 32 MiB, where a fresh buffer is sometimes mapped and page-faulted and
        sometimes reused, so a measurement there says little about its neighbours. The budget of
        90 s keeps a busy 2-core CPU at about two minutes in all.
        """
        max_bytes = 256 << 20 if backend == "cuda" else 64 << 20
        count = int(math.log2(max_bytes // (4 << 10))) + 2
        return cls(backend=backend, sizes_bytes=log_sizes(4 << 10, max_bytes, count), budget_s=90.0, codec=codec)

    @classmethod
    def quick(cls, backend: str, codec: str = "zvc") -> CalibrationPlan:
        """A tiny grid for tests and smoke runs: 4 sizes up to 256 KiB, 3 densities, 2 passes."""
        return cls(
            backend=backend,
            codec=codec,
            sizes_bytes=log_sizes(4 << 10, 256 << 10, 4),
            densities=(1.0, 0.5, 0.1),
            passes=2,
            min_passes=1,
            min_time_s=2e-4,
            max_units=4,
            refine_rounds=0,
        )

    def with_(self, **changes: Any) -> CalibrationPlan:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Sample:
    """One measured point.

    Attributes:
        backend, codec, op: what was timed.
        dtype: element dtype name; ``itemsize`` its width in bytes.
        nbytes: uncompressed bytes of the tensor.
        density: measured fraction of nonzero elements.
        time_s: seconds of one call (the minimum of ``times_s``).
        times_s: every timed call, in the order they ran.
        launch: the launch config used (``{}`` for backends without one); a CPU launch that leaves
            the thread count to the codec records the count it ran on (one below 16 MiB).
        launch_match: how the config was found (``exact``, ``same-model``, ``transferred``, ``default``).
    """

    backend: str
    codec: str
    op: str
    dtype: str
    itemsize: int
    nbytes: int
    density: float
    time_s: float
    times_s: tuple[float, ...]
    launch: dict[str, int] = field(default_factory=dict)
    launch_match: str = "default"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        data = asdict(self)
        data["times_s"] = list(self.times_s)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        """Inverse of :meth:`to_dict`; ``ValueError`` naming a missing or unknown field."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        missing = sorted({"backend", "codec", "op", "dtype", "itemsize", "nbytes", "density", "time_s", "times_s"} - set(data))
        if unknown or missing:
            raise ValueError(f"malformed calibration sample: unknown fields {unknown}, missing fields {missing}")
        values = dict(data)
        values["times_s"] = tuple(float(t) for t in values["times_s"])
        sample = cls(**values)
        if sample.op not in OPS or sample.nbytes < 1 or not 0.0 <= sample.density <= 1.0:
            raise ValueError(f"malformed calibration sample: op={sample.op!r}, nbytes={sample.nbytes}, density={sample.density}")
        if not (math.isfinite(sample.time_s) and sample.time_s > 0):
            raise ValueError(f"malformed calibration sample: time_s must be positive and finite, got {sample.time_s}")
        return sample


@dataclass(frozen=True)
class CalibrationRun:
    """The result of :func:`calibrate`.

    Attributes:
        plan: what was measured.
        samples: one per point.
        fingerprint: ``DeviceFingerprint.to_dict()`` of the device measured.
        wall_s: seconds the calibration took, warm-up included.
    """

    plan: CalibrationPlan
    samples: tuple[Sample, ...]
    fingerprint: dict[str, Any]
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        """The samples document stored as ``calibration-samples/<backend>`` (see :func:`samples_to_dict`)."""
        return samples_to_dict(self.samples, self.fingerprint, wall_s=self.wall_s, plan=self.plan)


def samples_to_dict(
    samples: tuple[Sample, ...] | list[Sample],
    fingerprint: Mapping[str, Any],
    wall_s: float = 0.0,
    plan: CalibrationPlan | None = None,
) -> dict[str, Any]:
    """A JSON-ready document of calibration samples."""
    return {
        "format": SAMPLES_FORMAT,
        "version": SAMPLES_VERSION,
        "fingerprint": dict(fingerprint),
        "wall_s": wall_s,
        "plan": None if plan is None else {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(plan).items()},
        "samples": [s.to_dict() for s in samples],
    }


def samples_from_dict(data: Mapping[str, Any]) -> tuple[Sample, ...]:
    """The samples of a :func:`samples_to_dict` document; ``ValueError`` naming what is wrong otherwise."""
    if not isinstance(data, Mapping) or data.get("format") != SAMPLES_FORMAT:
        raise ValueError(f"not a calibration-samples document (expected format {SAMPLES_FORMAT!r}); re-run `cswap calibrate`")
    if data.get("version") != SAMPLES_VERSION:
        raise ValueError(f"calibration samples version {data.get('version')!r} is not supported (this cswap reads {SAMPLES_VERSION})")
    samples = data.get("samples")
    if not isinstance(samples, list):
        raise ValueError("calibration samples document has no 'samples' list")
    return tuple(Sample.from_dict(s) for s in samples)


# --------------------------------------------------------------------------------------------


def _launch_for(
    fingerprint: Mapping[str, Any], backend: str, op: str, dtype: str, nbytes: int, store: ConfigStore | None,
    codec: str = "zvc",
) -> tuple[Launch | None, str]:
    """The launch config the runtime would use (the tuned one where the store has it), and how it was found."""
    if backend not in ("cpu", "cuda"):
        return None, "default"
    launch, found = launch_for(fingerprint, backend, op, dtype, nbytes, store=store, codec=codec)
    return launch, found.match


def _launch_params(launch: Launch | None, nbytes: int) -> dict[str, int]:
    """What a point ran with: the launch's fields, a CPU launch's thread count as the codec resolves it."""
    if launch is None:
        return {}
    params = {k: v for k, v in launch.to_params().items() if v is not None}
    if isinstance(launch, CpuLaunch) and launch.threads is None:
        from cswap.codecs.cpu_launch import threads_for

        params["threads"] = threads_for(launch, nbytes) or _numba_threads()
    return params


def _numba_threads() -> int:
    """Numba's worker count: what a parallel CPU codec runs on when nothing limits it."""
    import numba

    return int(numba.config.NUMBA_NUM_THREADS)


class _Progress:
    """Counts timed visits for ``on_step(done, total)``; the total grows when points are revisited."""

    def __init__(self, on_step: Callable[[int, int], None] | None, total: int) -> None:
        self.on_step = on_step
        self.done = 0
        self.total = total

    def step(self) -> None:
        self.done += 1
        if self.on_step:
            self.on_step(self.done, self.total)

    def skip(self, visits: int) -> None:
        self.total -= visits
        if self.on_step:
            self.on_step(self.done, self.total)

    def extend(self, visits: int) -> None:
        self.total += visits


class _Timer:
    """Seconds of a callable on the calibrated device (see :func:`cswap.device.time_call_s`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self, call: Callable[[], Any]) -> float:
        return time_call_s(call, self.device)


@dataclass
class _Point:
    """One (dtype, size, density, op) to time, and what its timing needs."""

    dtype: str
    nbytes: int
    nominal_density: float
    density: float
    op: str
    call: Callable[[], Any]
    launch: dict[str, int]
    launch_match: str
    times_s: list[float] = field(default_factory=list)


def _visit(point: _Point, timer: _Timer, plan: CalibrationPlan, max_visit_s: float) -> None:
    """Time ``point`` enough times to fill ``plan.min_time_s``, stopping early after ``max_visit_s``.

    The count follows the fastest call so far, so a warm-up call slowed by interference does not
    starve a cheap point of timings; stopping early bounds what a burst of interference costs: one
    slow visit, not many slow calls.
    """
    units = int(min(plan.max_units, max(1, math.ceil(plan.min_time_s / max(min(point.times_s), 1e-9)))))
    spent_s = 0.0
    for _ in range(units):
        point.times_s.append(timer(point.call))
        spent_s += point.times_s[-1]
        if spent_s >= max_visit_s:
            break


def _suspects(points: list[_Point], ratio: float) -> list[_Point]:
    """Points whose fastest time may still include interference, to visit again.

    A point is suspect when no second timing confirms its fastest one (within 10%), or when its
    fastest time lies more than ``ratio`` above the geometric mean of its neighbours in size
    (same dtype, density and op), which a smooth cost curve would not do.
    """
    suspects = []
    series: dict[tuple[str, float, str], list[_Point]] = {}
    for point in points:
        series.setdefault((point.dtype, point.nominal_density, point.op), []).append(point)
    for row in series.values():
        row.sort(key=lambda p: p.nbytes)
        fastest = [min(p.times_s) for p in row]
        for i, point in enumerate(row):
            confirmed = sum(t <= 1.1 * fastest[i] for t in point.times_s) >= 2
            smooth = True
            if 0 < i < len(row) - 1:
                smooth = fastest[i] <= ratio * math.sqrt(fastest[i - 1] * fastest[i + 1])
            if not (confirmed and smooth):
                suspects.append(point)
    return suspects


def _base_tensor(
    uniform: torch.Tensor, density: float, dtype: torch.dtype, normal: torch.Tensor | None = None
) -> torch.Tensor:
    """Each element nonzero where ``uniform < density`` (i.i.d. with probability ``density``): a value
    in [1, 2), or the element of ``normal`` when given (exponent coding's data)."""
    nonzero = uniform + 1.0 if normal is None else normal
    values = torch.where(uniform < density, nonzero, torch.zeros((), dtype=uniform.dtype, device=uniform.device))
    return values.to(dtype=dtype)


def _itemsize(dtype_name: str) -> int:
    return _DTYPES[dtype_name].itemsize


def _device_of(backend: str) -> torch.device:
    if backend == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "cannot calibrate backend 'cuda': torch sees no GPU (torch.cuda.is_available() is False). "
                "Calibrate --backend cpu here, or run on a machine with a CUDA GPU."
            )
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def calibrate(
    plan: CalibrationPlan,
    fingerprint: Mapping[str, Any] | None = None,
    store: ConfigStore | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> CalibrationRun:
    """Time every point of ``plan`` on this machine.

    Args:
        plan: the grid to measure.
        fingerprint: the device's ``DeviceFingerprint.to_dict()`` (default: measured here); tuned
            launch configs are looked up for it.
        store: the :class:`cswap.tuner.store.ConfigStore` to look tuned configs up in (``None``: the default store).
        on_step: called as ``on_step(done, total)`` after each timed unit (for a progress bar).

    Returns:
        A :class:`CalibrationRun` with one :class:`Sample` per point.

    Example:
        >>> run = calibrate(CalibrationPlan.quick("torch").with_(sizes_bytes=(4096, 8192), ops=("compress",)))
        >>> [s.nbytes for s in run.samples if s.dtype == "float32" and s.density > 0.9]
        [4096, 8192]
    """
    started_s = time.perf_counter()
    device = _device_of(plan.backend)
    fp = dict(fingerprint) if fingerprint is not None else device_fingerprint(device).to_dict()
    generator = torch.Generator().manual_seed(plan.seed)
    if store is None and plan.backend in ("cpu", "cuda"):
        store = ConfigStore()
    timer = _Timer(device)
    points: list[_Point] = []
    max_numel = max(plan.sizes_bytes) // min(_itemsize(d) for d in plan.dtypes)
    uniform = torch.rand(max_numel, generator=generator).to(device)
    # Drawn after ``uniform``, so ZVC's data is what it always was.
    normal = torch.randn(max_numel, generator=generator).to(device) if plan.codec == "exponent" else None
    for dtype_name in plan.dtypes:
        dtype = _DTYPES[dtype_name]
        itemsize = _itemsize(dtype_name)
        launches = {
            (op, nbytes): _launch_for(fp, plan.backend, op, dtype_name, nbytes, store, plan.codec)
            for op in plan.ops
            for nbytes in plan.sizes_bytes
        }
        for density in plan.densities:
            base_numel = max(plan.sizes_bytes) // itemsize
            base = _base_tensor(uniform[:base_numel], density, dtype, None if normal is None else normal[:base_numel])
            base_bits = base.view(bits_dtype(dtype))
            for nbytes in plan.sizes_bytes:
                numel = nbytes // itemsize
                tensor = base[:numel]
                measured = int(torch.count_nonzero(base_bits[:numel])) / numel
                for op in plan.ops:
                    launch, match = launches[(op, nbytes)]
                    params = _launch_params(launch, nbytes)
                    points.append(
                        _Point(dtype_name, nbytes, density, measured, op, _op_call(plan, op, tensor, launch), params, match)
                    )
    progress = _Progress(on_step, total=len(points) * (plan.passes + 1))
    deadline_s = math.inf if plan.budget_s is None else started_s + plan.budget_s
    # Warm-up: JIT compilation and first-touch page faults (untimed), then a first timing.
    for point in points:
        point.call()
        point.times_s.append(timer(point.call))
        progress.step()
    order = random.Random(plan.seed)
    max_visit_s = _VISIT_CAP * plan.min_time_s
    for pass_index in range(plan.passes):
        pass_started_s = time.perf_counter()
        visit = list(points)
        order.shuffle(visit)
        for point in visit:
            _visit(point, timer, plan, max_visit_s)
            progress.step()
        # Start another pass only if it should end within the budget, judging by this one.
        now_s = time.perf_counter()
        if pass_index + 1 >= plan.min_passes and now_s + (now_s - pass_started_s) > deadline_s:
            progress.skip(len(points) * (plan.passes - pass_index - 1))
            break
    for _ in range(plan.refine_rounds):
        suspects = _suspects(points, plan.refine_ratio)
        if not suspects or time.perf_counter() > deadline_s:
            break
        progress.extend(len(suspects))
        order.shuffle(suspects)
        for point in suspects:
            if time.perf_counter() > deadline_s:
                progress.skip(1)
                continue
            _visit(point, timer, plan, max_visit_s)
            progress.step()
    samples = []
    for point in points:
        itemsize = _itemsize(point.dtype)
        samples.append(
            Sample(
                backend=plan.backend,
                codec=plan.codec,
                op=point.op,
                dtype=point.dtype,
                itemsize=itemsize,
                nbytes=point.nbytes,
                density=point.density,
                time_s=min(point.times_s),
                times_s=tuple(point.times_s),
                launch=point.launch,
                launch_match=point.launch_match,
            )
        )
    return CalibrationRun(plan=plan, samples=tuple(samples), fingerprint=fp, wall_s=time.perf_counter() - started_s)


def _op_call(plan: CalibrationPlan, op: str, tensor: torch.Tensor, launch: Launch | None) -> Callable[[], Any]:
    """The call to time for one point."""
    if op == "compress":
        return lambda: compress(tensor, codec=plan.codec, backend=plan.backend, launch=launch)
    packed = compress(tensor, codec=plan.codec, backend=plan.backend, launch=launch)
    return lambda: decompress(packed, backend=plan.backend, launch=launch, validate=False)
