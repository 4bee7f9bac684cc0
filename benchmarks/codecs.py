"""ZVC compress/decompress speed of every backend against the device's copy bandwidth, measured together.

For each size, dtype and sparsity, every backend that runs here (``torch``, ``cpu``; ``cuda`` on a
GPU, never under the simulator) compresses and decompresses the same tensor. Each figure is the
median over repeats, and every repeat of an operation is interleaved with a ``Tensor.copy_`` of the
same size into a preallocated tensor on the same device, so the copy bandwidth each row is compared
with was measured under the same conditions (this matters on a shared machine).

Rows with ``reuse: true`` write into preallocated buffers (``compress(..., out=Packed.workspace(...))``
and ``decompress(..., out=...)``); the others allocate fresh outputs every call, as a first call
would. Decompression is timed with ``validate=False`` (the kernels alone; validation is a separate,
optional torch pass).

Figures (GB = 1e9 bytes):

* ``input_gbps``: original bytes / seconds.
* ``traffic_gbps``: (bytes read + bytes written) / seconds; compress reads the tensor and writes
  the compressed buffers, decompress the reverse.
* ``copy_gbps``: (bytes read + bytes written) / seconds of the copy, i.e. ``2 * nbytes / seconds``.
* ``traffic_vs_copy``: ``traffic_gbps / copy_gbps``, the fraction of the memory system's copy speed.
* ``vs_torch``: the torch backend's seconds (fresh outputs) / this row's seconds, same run.
* ``min_seconds``, ``copy_min_seconds``, ``traffic_vs_copy_min``: the same from the fastest round
  of each, which other processes on a shared machine disturb least.

Usage:
    python benchmarks/codecs.py            # a rich table
    python benchmarks/codecs.py --json     # one JSON object per line: a header, then one per row
    python benchmarks/codecs.py --quick    # two small sizes, under a minute
    python benchmarks/codecs.py --validation   # JSON: decompress with vs without validate, 16 MiB fp32

``--validation`` times ``decompress(packed)`` (``validate=True``, the default) against
``decompress(packed, validate=False)`` on the same buffers, alternating the two every round, and
reports ``ratio`` = median with / median without (also from the minima).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import inspect
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import numba
import torch

from cswap.codecs import Packed, compress, decompress
from cswap.codecs.zvc import ZVC
from cswap.device import fingerprint

MiB = 1 << 20
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SPARSITIES = (0.0, 0.5, 0.9)


@dataclass(frozen=True)
class Row:
    """One measured operation."""

    backend: str
    op: str
    dtype: str
    nbytes: int
    sparsity: float
    reuse: bool
    seconds: float
    input_gbps: float
    traffic_gbps: float
    copy_gbps: float
    traffic_vs_copy: float
    vs_torch: float | None
    min_seconds: float
    copy_min_seconds: float
    traffic_vs_copy_min: float
    compressed_nbytes: int
    repeats: int
    device: str


class Timer:
    """Seconds of one call: wall clock on CPU, CUDA events on a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], object]) -> float:
        if not self.cuda:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        begin.record()
        fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1e3


@dataclass(frozen=True)
class Timing:
    """Seconds of an operation and of the copy it is compared with, over the same rounds."""

    median_s: float
    min_s: float
    copy_median_s: float
    copy_min_s: float
    rounds: int


def interleaved(
    op: Callable[[], object], copy: Callable[[], object], timer: Timer, repeats: int, budget_s: float
) -> Timing:
    """Time ``op`` and ``copy`` alternately: at least 3 and at most ``repeats`` rounds, within ``budget_s`` after 3.

    The minimum is reported next to the median because on a shared machine other processes
    inflate the median of both; the minimum approaches what the hardware does unloaded.
    """
    op(), copy()  # warm-up: JIT, allocator, page faults of reused buffers
    op_s, copy_s = [], []
    deadline = time.perf_counter() + budget_s
    while len(op_s) < repeats and (len(op_s) < 3 or time.perf_counter() < deadline):
        copy_s.append(timer(copy))
        op_s.append(timer(op))
    return Timing(statistics.median(op_s), min(op_s), statistics.median(copy_s), min(copy_s), len(op_s))


def make_tensor(nbytes: int, dtype: torch.dtype, sparsity: float, device: torch.device, seed: int = 0) -> torch.Tensor:
    """Normal values with ``sparsity`` of them exactly zero, at random positions."""
    numel = nbytes // torch.empty((), dtype=dtype).element_size()
    generator = torch.Generator().manual_seed(seed)
    t = torch.randn(numel, generator=generator)
    t[torch.rand(numel, generator=generator) < sparsity] = 0.0
    return t.to(dtype).to(device)


def supports_out(backend: str) -> bool:
    """Whether the backend writes into caller buffers itself (others would only add a copy)."""
    return "out" in inspect.signature(ZVC.backend_module(backend).compress_bits).parameters


def backends_here(device: torch.device) -> list[str]:
    """Backends for tensors on ``device``; ``cuda`` only on a real GPU."""
    available = ZVC.available_backends()
    if device.type == "cuda":
        return [b for b in ("torch", "cuda") if b in available]
    return [b for b in ("torch", "cpu") if b in available]


def measure(
    sizes_mib: list[int],
    device: torch.device,
    repeats: int,
    budget_s: float,
    sparsities: tuple[float, ...] = SPARSITIES,
    backends: list[str] | None = None,
) -> Iterator[Row]:
    """Every row, sizes ascending; each row's copy bandwidth measured alongside it.

    ``backends`` defaults to :func:`backends_here`; ``vs_torch`` is ``None`` when ``torch`` is not among them.
    """
    timer = Timer(device)
    backends = backends or backends_here(device)
    for size_mib in sizes_mib:
        nbytes = size_mib * MiB
        for dtype_name, dtype in DTYPES.items():
            for sparsity in sparsities:
                t = make_tensor(nbytes, dtype, sparsity, device)
                src, dst = t.clone(), torch.empty_like(t)
                baseline: dict[str, float] = {}
                for backend in backends:
                    packed = compress(t, backend=backend)
                    reusable = supports_out(backend)
                    workspace = Packed.workspace(t.shape, dtype, device=device) if reusable else None
                    restored = torch.empty_like(t)
                    cases: list[tuple[str, bool, Callable[[], object]]] = [
                        ("compress", False, functools.partial(compress, t, backend=backend)),
                        ("decompress", False, functools.partial(decompress, packed, backend=backend, validate=False)),
                    ]
                    if reusable:
                        cases += [
                            ("compress", True, functools.partial(compress, t, backend=backend, out=workspace)),
                            ("decompress", True, functools.partial(decompress, packed, backend=backend, out=restored, validate=False)),
                        ]
                    for op, reuse, fn in cases:
                        timing = interleaved(fn, lambda: dst.copy_(src), timer, repeats, budget_s)
                        seconds = timing.median_s
                        if backend == "torch" and not reuse:
                            baseline[op] = seconds
                        traffic = nbytes + packed.compressed_nbytes
                        copy_gbps = 2 * nbytes / timing.copy_median_s / 1e9
                        yield Row(
                            backend=backend,
                            op=op,
                            dtype=dtype_name,
                            nbytes=nbytes,
                            sparsity=sparsity,
                            reuse=reuse,
                            seconds=seconds,
                            input_gbps=nbytes / seconds / 1e9,
                            traffic_gbps=traffic / seconds / 1e9,
                            copy_gbps=copy_gbps,
                            traffic_vs_copy=traffic / seconds / 1e9 / copy_gbps,
                            vs_torch=baseline[op] / seconds if op in baseline else None,
                            min_seconds=timing.min_s,
                            copy_min_seconds=timing.copy_min_s,
                            traffic_vs_copy_min=(traffic / timing.min_s) / (2 * nbytes / timing.copy_min_s),
                            compressed_nbytes=packed.compressed_nbytes,
                            repeats=timing.rounds,
                            device=device.type,
                        )
                    del packed, workspace, restored


#: Saved-tensor kinds of a transformer the lossless codecs are measured on: (codec, dtype, what).
LOSSLESS_CASES: tuple[tuple[str, str, str], ...] = (
    ("exponent", "bf16", "normal values in bf16, as hidden states"),
    ("exponent", "fp32", "normal values in fp32"),
    ("exponent", "fp32-upcast", "fp32 upcasts of bf16 values, as RMSNorm saves"),
    ("bitpack", "bool", "dropout masks at p = 0.1, as bool"),
)


def make_lossless_tensor(nbytes: int, kind: str, device: torch.device, seed: int = 0) -> torch.Tensor:
    """A tensor of ``kind`` (a dtype name of :data:`LOSSLESS_CASES`) of ``nbytes`` bytes, made on ``device``."""
    generator = torch.Generator(device=device).manual_seed(seed)
    if kind == "bool":
        return torch.rand(nbytes, generator=generator, device=device) >= 0.1
    itemsize = 2 if kind == "bf16" else 4
    values = torch.randn(nbytes // itemsize, generator=generator, device=device)
    if kind == "bf16":
        return values.to(torch.bfloat16)
    return values.to(torch.bfloat16).float() if kind == "fp32-upcast" else values


def nvcomp_ans() -> tuple[Callable[[torch.Tensor], object], Callable[[object], object], Callable[[object], int]] | str:
    """nvCOMP's ANS codec as (encode, decode, compressed size), or why it is not here."""
    try:
        from nvidia import nvcomp  # type: ignore[import-not-found]
    except ImportError as error:
        return f"optional package missing: nvidia-nvcomp ({error})"
    codec = nvcomp.Codec(algorithm="ANS")
    return (lambda t: codec.encode(nvcomp.as_array(t.view(torch.uint8))), codec.decode,
            lambda encoded: int(encoded.buffer_size))


def _codec_ops(t: torch.Tensor, codec: str, backend: str, packed: object) -> list[tuple[str, Callable[[], object]]]:
    return [("compress", functools.partial(compress, t, codec=codec, backend=backend)),
            ("decompress", functools.partial(decompress, packed, backend=backend, validate=False))]


def _breakdown(t: torch.Tensor, codec: str, packed: object) -> list[tuple[str, str, str, int, Callable[[], object]]]:
    """Where a GPU compress spends its time: the exponent plan kernel alone (``plan``: the histogram,
    table and size of every chunk, no words written), the same op on a 4 KiB tensor (``fixed``: the
    launches and the host's work, which the figure of a large tensor amortises), and the torch
    reference backend on the device (vectorised torch ops, same bytes)."""
    from cswap.codecs import exponent_cuda
    from cswap.codecs.exponent_layout import FLOAT_LAYOUTS
    from cswap.codecs.launch import DEFAULT_CHUNK_WORDS

    size = packed.compressed_nbytes  # type: ignore[attr-defined]
    tiny = t.reshape(-1)[: 4096 // t.element_size()].clone()
    tiny_packed = compress(tiny, codec=codec, backend="cuda")
    rows = [(codec, "cuda", f"{op} fixed", size, fn) for op, fn in _codec_ops(tiny, codec, "cuda", tiny_packed)]
    rows += [(codec, "torch", op, size, fn) for op, fn in _codec_ops(t, codec, "torch", compress(t, codec=codec, backend="torch"))]
    if codec == "exponent":
        layout = FLOAT_LAYOUTS[t.dtype]
        bits = t.reshape(-1).view(layout.bits_dtype)
        rows.append((codec, "cuda", "plan", size,
                     functools.partial(exponent_cuda.chunk_words_needed, bits, layout, DEFAULT_CHUNK_WORDS, None)))
    return rows


def kernel_resources() -> dict[str, list[dict[str, object]]]:
    """Registers per thread and static shared bytes of every lossless-codec CUDA kernel compiled so
    far in this process (what bounds its blocks per SM), by kernel and argument types."""
    from cswap.codecs import bitpack_cuda, exponent_cuda

    found: dict[str, list[dict[str, object]]] = {}
    for kernel in (*exponent_cuda._kernels(), *bitpack_cuda._kernels()):
        found[kernel.py_func.__name__] = [
            {"signature": ", ".join(str(a) for a in args), "registers": compiled.regs_per_thread,
             "shared_bytes": compiled.shared_mem_per_block}
            for args, compiled in getattr(kernel, "overloads", {}).items()
        ]
    return found


def measure_lossless(sizes_mib: list[int], device: torch.device, repeats: int, budget_s: float) -> Iterator[dict[str, object]]:
    """Exponent coding and bit-packing on ``device``'s backend, each op interleaved with a copy of the
    same bytes; nvCOMP's ANS on the same tensors where that package imports (a GPU only).

    Rows: codec, op, kind, backend, nbytes, ratio, seconds, input_gbps, copy_gbps, ``input_vs_copy``
    (the tensor's bytes per second against the copy's), and the same from the fastest rounds. On a
    GPU also the rows of :func:`_breakdown` (``plan``, ``compress fixed``, ``decompress fixed``, the
    torch backend), each against the same copy of the full tensor's bytes: their GB/s are the full
    tensor's bytes over their seconds.
    """
    timer = Timer(device)
    backend = "cuda" if device.type == "cuda" else "cpu"
    ans = nvcomp_ans() if device.type == "cuda" else "needs a GPU"
    for size_mib in sizes_mib:
        nbytes = size_mib * MiB
        for codec, kind, what in LOSSLESS_CASES:
            t = make_lossless_tensor(nbytes, kind, device)
            src, dst = t.clone(), torch.empty_like(t)
            packed = compress(t, codec=codec, backend=backend)
            runners = [(codec, backend, op, packed.compressed_nbytes, fn) for op, fn in _codec_ops(t, codec, backend, packed)]
            if device.type == "cuda":
                runners += _breakdown(t, codec, packed)
            if not isinstance(ans, str):
                encode, decode, size_of = ans
                encoded = encode(t)
                runners += [("nvcomp-ans", "nvcomp", "compress", size_of(encoded), functools.partial(encode, t)),
                            ("nvcomp-ans", "nvcomp", "decompress", size_of(encoded), functools.partial(decode, encoded))]
            for name, ran_on, op, compressed, fn in runners:
                timing = interleaved(fn, functools.partial(dst.copy_, src), timer, repeats, budget_s)
                copy_gbps = nbytes / timing.copy_median_s / 1e9
                yield {"codec": name, "op": op, "kind": kind, "what": what, "backend": ran_on,
                       "nbytes": nbytes, "ratio": nbytes / max(compressed, 1), "seconds": timing.median_s,
                       "input_gbps": nbytes / timing.median_s / 1e9, "copy_gbps": copy_gbps,
                       "input_vs_copy": timing.copy_median_s / timing.median_s,
                       "input_vs_copy_min": timing.copy_min_s / timing.min_s, "repeats": timing.rounds,
                       "nvcomp": ans if isinstance(ans, str) else "measured", "device": device.type}
            del packed, src, dst, t


def measure_validation(
    size_mib: int, device: torch.device, backend: str, repeats: int, budget_s: float, sparsity: float = 0.5
) -> dict[str, object]:
    """Decompress with ``validate=True`` against ``validate=False``, fp32, alternating every round."""
    timer = Timer(device)
    t = make_tensor(size_mib * MiB, torch.float32, sparsity, device)
    packed = compress(t, backend=backend)
    restored = torch.empty_like(t)
    timing = interleaved(
        lambda: decompress(packed, backend=backend, out=restored, validate=True),
        lambda: decompress(packed, backend=backend, out=restored, validate=False),
        timer,
        repeats,
        budget_s,
    )
    return {
        "kind": "validation",
        "backend": backend,
        "dtype": "fp32",
        "nbytes": size_mib * MiB,
        "sparsity": sparsity,
        "validated_s": timing.median_s,
        "unvalidated_s": timing.copy_median_s,
        "ratio": timing.median_s / timing.copy_median_s,
        "ratio_min": timing.min_s / timing.copy_min_s,
        "repeats": timing.rounds,
        "device": device.type,
    }


def header(device: torch.device, sizes_mib: list[int]) -> dict[str, object]:
    """What the figures depend on: machine, threads, versions, load, date."""
    return {
        "kind": "header",
        "benchmark": "codecs",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": fingerprint(device).name,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "numba_threads": numba.get_num_threads(),
        "load_average_1m": os.getloadavg()[0],
        "torch": torch.__version__,
        "numba": numba.__version__,
        "device": device.type,
        "sizes_mib": sizes_mib,
    }


def print_table(head: dict[str, object], rows: list[Row]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"ZVC codecs on {head['machine']} ({head['cores']} cores, {head['device']}), {head['date']}",
        caption="GB/s = 1e9 bytes/s; traffic = bytes read + written; copy = Tensor.copy_ of the same size, same run",
    )
    columns = (
        "backend", "op", "reuse", "dtype", "MiB", "sparsity", "ms", "input GB/s", "traffic GB/s", "copy GB/s",
        "traffic/copy", "vs torch", "min ms", "traffic/copy (min)",
    )
    for column in columns:
        table.add_column(column, justify="right" if column not in ("backend", "op", "dtype") else "left")
    for r in rows:
        table.add_row(
            r.backend,
            r.op,
            "yes" if r.reuse else "",
            r.dtype,
            f"{r.nbytes / MiB:g}",
            f"{r.sparsity:g}",
            f"{r.seconds * 1e3:.3f}",
            f"{r.input_gbps:.2f}",
            f"{r.traffic_gbps:.2f}",
            f"{r.copy_gbps:.2f}",
            f"{r.traffic_vs_copy:.2f}",
            f"{r.vs_torch:.1f}x" if r.vs_torch is not None else "",
            f"{r.min_seconds * 1e3:.3f}",
            f"{r.traffic_vs_copy_min:.2f}",
        )
    Console(width=max(Console().width, 200)).print(table)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    parser.add_argument("--quick", action="store_true", help="1 and 4 MiB only, fewer repeats (under a minute)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=None, help="override the sizes")
    parser.add_argument("--repeats", type=int, default=None, help="rounds per row (median reported)")
    parser.add_argument("--budget-s", type=float, default=None, help="stop adding rounds to a row after this long")
    parser.add_argument(
        "--validation", action="store_true", help="JSON: decompress with validation vs without (16 MiB fp32, 50%% zeros)"
    )
    args = parser.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.validation:
        size = (args.sizes_mib or [16])[0]
        print(json.dumps(header(device, [size])), flush=True)
        backend = "cuda" if device.type == "cuda" else "cpu"
        print(json.dumps(measure_validation(size, device, backend, args.repeats or 41, args.budget_s or 5.0)), flush=True)
        return
    if args.sizes_mib:
        sizes = args.sizes_mib
    elif args.quick:
        sizes = [1, 4]
    else:
        sizes = [1, 4, 16, 64, 256] if device.type == "cuda" else [1, 4, 16, 64]
    repeats = args.repeats or (5 if args.quick else 21)
    budget_s = args.budget_s or (0.5 if args.quick else 3.0)

    head = header(device, sizes)
    rows = []
    if args.json:
        print(json.dumps(head), flush=True)
    for row in measure(sizes, device, repeats, budget_s):
        rows.append(row)
        if args.json:
            print(json.dumps({"kind": "result", **asdict(row)}), flush=True)
    if not args.json:
        print_table(head, rows)


if __name__ == "__main__":
    main()
