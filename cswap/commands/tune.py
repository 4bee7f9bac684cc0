"""``cswap tune``: tune the codec kernels' launch configs on this machine and keep them in the store.

Each (kernel, dtype, size bucket) is tuned once per device: a second ``cswap tune`` finds the
configs in the store and measures nothing (a store hit), unless ``--force``. With ``--tuner-url``
the tuning service is asked first (it may know this device, its model, or a similar device to
warm-start from) and every new run is published to it.

``--codec`` picks whose kernels: ``zvc`` (the default), ``bitpack``, ``exponent``, a comma-separated
list, or ``all``; each codec is tuned for ``--dtype`` (one it takes; with several codecs, those that
do not take it are left out) or, without ``--dtype``, for float32 (bit-packing: bool).

Example:
    $ cswap tune                                   # this machine's default device, bo, 4 MiB float32
    $ cswap tune --codec all --sizes 4MiB          # ZVC and exponent coding on float32, bit-packing on bool
    $ cswap tune --backend cpu --method grid --op compress --sizes 1MiB --sizes 16MiB
    $ cswap tune --json --budget 10 --dtype bfloat16
    $ cswap tune --tuner-url http://tuner:8765 --token s3cret
"""

from __future__ import annotations

import itertools
import json
import math
import re
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

import typer
from rich import box
from rich.console import Console

from cswap.commands import fail, warnings_as_lines
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

__all__ = ["format_size", "parse_size", "register", "run_tune"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_OPS = ("compress", "decompress", "all")


def parse_size(text: str) -> int:
    """Bytes of a size such as ``4MiB``, ``16M``, ``512KiB`` or ``65536`` (binary units).

    Example:
        >>> parse_size("4MiB"), parse_size("1.5k"), parse_size("100")
        (4194304, 1536, 100)
    """
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(f"size {text!r} is not a byte count: write e.g. 65536, 512KiB, 4MiB or 1GiB")
    nbytes = int(float(match.group(1)) * _UNITS[unit])
    if nbytes < 1:
        raise ValueError(f"size {text!r} is below one byte")
    return nbytes


def format_size(nbytes: int) -> str:
    """``4MiB``-style label of a byte count.

    Example:
        >>> format_size(4 << 20), format_size(1536)
        ('4MiB', '1.5KiB')
    """
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{nbytes}B"


def _codec_dtypes(codecs: list[str], dtype: str | None) -> dict[str, str]:
    """The dtype to tune each codec for; with several codecs, one that does not take ``dtype`` is left out."""
    from cswap.tuner.kernels import default_dtype, dtype_name

    if dtype is None:
        return {codec: default_dtype(codec) for codec in codecs}
    dtype_name(dtype)  # an unknown dtype is an error whatever the codecs
    chosen = {}
    for codec in codecs:
        try:
            chosen[codec] = dtype_name(dtype, codec)
        except ValueError:
            if len(codecs) == 1:
                raise
    if not chosen:
        raise ValueError(f"none of the codecs {', '.join(codecs)} takes dtype {dtype!r}")
    return chosen


def _sizes(items: list[str]) -> list[int]:
    return [parse_size(part) for item in items for part in item.split(",") if part.strip()]


class _Bar:
    """A rich progress bar with one task per tuned kernel (or nothing when quiet)."""

    def __init__(self, console: Console | None) -> None:
        self._progress = None if console is None else Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), console=console, transient=False,
        )

    def __enter__(self) -> _Bar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def task(self, description: str) -> Callable[[int, int, float], None] | None:
        """A progress callback whose bar appears with the first evaluation (a store hit shows none)."""
        if self._progress is None:
            return None
        progress = self._progress
        task_ids: list[Any] = []

        def update(done: int, planned: int, best_s: float) -> None:
            if not task_ids:
                task_ids.append(progress.add_task(description, total=planned, best="-"))
            best = f"{best_s * 1e3:.3f} ms" if math.isfinite(best_s) else "-"
            progress.update(task_ids[0], completed=done, total=planned, best=best)

        return update


def _client(url: str | None, token: str | None) -> Any:
    if url is None:
        return None
    from cswap.server.client import TuningClient

    return TuningClient(url, token=token)


def run_tune(
    backend: str | None = None,
    method: str = "bo",
    budget: int | None = None,
    dtype: str | None = None,
    sizes: list[int] | None = None,
    op: str = "all",
    store: Path | None = None,
    force: bool = False,
    seed: int = 0,
    repeats: int = 7,
    space: Path | None = None,
    tuner_url: str | None = None,
    token: str | None = None,
    console: Console | None = None,
    codec: str = "zvc",
) -> dict[str, Any]:
    """Tune every (codec, op, size) asked for and return the JSON-ready report.

    Args:
        backend: ``cpu`` or ``cuda``; ``None`` picks ``cuda`` when a GPU is visible, else ``cpu``.
        method: ``bo``, ``grid``, ``random`` or ``expert``.
        budget: evaluations per kernel for ``bo``/``random`` (default: a third of the grid, 4..20).
        dtype: dtype name of the tensors (``None``: float32, or bool for bit-packing); with several
            codecs, those that do not take it are left out.
        sizes: tensor sizes in bytes, one tuning per size bucket (default 4 MiB).
        op: ``compress``, ``decompress`` or ``all``.
        store: the config store file (default ``$CSWAP_HOME/store.db``).
        force: tune even what the store already has.
        seed: seed of ``bo``/``random``.
        repeats: timed calls per config (the median is its time).
        space: a search-space file or directory instead of ``configs/search_spaces``.
        tuner_url: a running ``cswap serve`` to ask first and to publish to.
        token: bearer token for publishing to ``tuner_url``.
        console: where the progress bar goes (``None``: no bar).
        codec: ``zvc`` (default), ``bitpack``, ``exponent``, a comma-separated list, or ``all``.

    Returns:
        ``{"method", "backend", "codecs", "device", "store", "best_params", "best_time_s", "evaluations",
        "wall_s", "store_hit", "match", "results"}``; ``best_params``, ``best_time_s`` and
        ``match`` map each ``<kernel>/<dtype>/<size>`` label to its result, ``evaluations`` and
        ``wall_s`` are totals, ``store_hit`` is true when nothing had to be measured, and
        ``results`` has one entry per label. Each result says ``published`` (whether the service
        holds its run now) and ``publication``: ``published``, ``queued`` (the service was down;
        ``cswap configs push`` sends it later), ``local`` (no ``tuner_url``) or ``none`` (a store hit).

    Raises:
        ValueError: a bad method, op, dtype or size; RuntimeError: the backend cannot be tuned
        here; cswap.tuner.store.StoreError, cswap.tuner.space.SearchSpaceError: as their messages say.
    """
    import torch

    from cswap.device import fingerprint
    from cswap.training.kernelconfigs import settle_config
    from cswap.tuner.kernels import kernel_name
    from cswap.tuner.lookup import CACHED_METHOD
    from cswap.tuner.objective import check_tunable
    from cswap.tuner.search import METHODS
    from cswap.tuner.space import load_search_space, parse_codecs
    from cswap.tuner.store import ConfigStore, size_bucket

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    if op not in _OPS:
        raise ValueError(f"unknown op {op!r}: choose one of {', '.join(_OPS)}")
    if budget is not None and budget < 1:
        raise ValueError(f"--budget is {budget}; give at least 1 evaluation")
    codecs = parse_codecs(codec)
    dtypes = _codec_dtypes(codecs, dtype)
    backend = backend or ("cuda" if torch.cuda.is_available() else "cpu")
    check_tunable(backend)
    sizes = sizes or [4 << 20]
    ops = ["compress", "decompress"] if op == "all" else [op]
    spaces = {(c, name): load_search_space(backend, name, space, codec=c) for c in dtypes for name in ops}
    config_store = ConfigStore(store)
    device = fingerprint(backend)
    client = _client(tuner_url, token)
    results: list[dict[str, Any]] = []
    started_s = time.perf_counter()
    try:
        with _Bar(console) as bar:
            for (codec_name, dtype_str), name, nbytes in itertools.product(dtypes.items(), ops, sizes):
                kernel = kernel_name(backend, name, codec_name)
                bucket = size_bucket(nbytes)
                label = f"{kernel}/{dtype_str}/{format_size(nbytes)}"
                settled = settle_config(
                    device, backend, name, dtype_str, nbytes, config_store, client, method, budget=budget, seed=seed,
                    force=force, space=spaces[(codec_name, name)], repeats=repeats, progress=bar.task(label),
                    codec=codec_name,
                )
                run, found = settled.run, settled.found
                assert run is not None  # a method was given
                hit = run.method == CACHED_METHOD
                results.append({
                    "label": label, "kernel": kernel, "codec": codec_name, "op": name, "dtype": dtype_str,
                    "nbytes": nbytes, "bucket": bucket,
                    "method": run.method, "store_hit": hit, "match": found.match,
                    "warm_started": found.match == "transferred" and method == "bo" and not hit,
                    "best_params": run.best_params, "best_time_s": run.best_time_s,
                    "evaluations": len(run.evaluations), "wall_s": run.wall_s, "run_id": None if hit else run.run_id,
                    "published": settled.published, "publication": settled.publication,
                })
    finally:
        if client is not None:
            client.close()
    return {
        "method": method,
        "backend": backend,
        "codecs": list(dtypes),
        "device": {"key": device.key, "name": device.name, "sm_count": device.sm_count},
        "store": str(config_store.path),
        "best_params": {r["label"]: r["best_params"] for r in results},
        "best_time_s": {r["label"]: r["best_time_s"] for r in results},
        "match": {r["label"]: r["match"] for r in results},
        "evaluations": sum(r["evaluations"] for r in results),
        "wall_s": time.perf_counter() - started_s,
        "store_hit": all(r["store_hit"] for r in results),
        "results": results,
    }


def _print_report(report: dict[str, Any], console: Console) -> None:
    device = report["device"]
    dtypes = sorted({r["dtype"] for r in report["results"]})
    table = Table(
        title=f"cswap tune --method {report['method']} ({', '.join(dtypes)}) on {device['name']}",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("kernel", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("from", no_wrap=True)
    table.add_column("evals", justify="right", no_wrap=True)
    table.add_column("best ms", justify="right", no_wrap=True)
    table.add_column("best config", no_wrap=True)
    for r in report["results"]:
        source = "store" if r["store_hit"] else r["method"] + ("+warm" if r["warm_started"] else "")
        params = " ".join(f"{k}={v}" for k, v in r["best_params"].items())
        table.add_row(r["kernel"], format_size(r["nbytes"]), source, str(r["evaluations"]),
                      f"{r['best_time_s'] * 1e3:.3f}", params)
    console.print(table)
    hits = sum(r["store_hit"] for r in report["results"])
    if hits:
        console.print(
            f"store hit: {hits} of {len(report['results'])} kernel configs were already tuned in {report['store']}, "
            "zero evaluations for them (--force tunes again)"
        )
    console.print(f"{report['evaluations']} evaluations in {report['wall_s']:.1f} s")


def register(app: typer.Typer) -> None:
    """Add ``tune`` to the ``cswap`` command."""

    @app.command("tune")
    def tune_command(
        backend: str = typer.Option(None, help="cpu or cuda (default: cuda when a GPU is visible, else cpu)."),
        method: str = typer.Option("bo", help="Search method: bo, grid, random or expert."),
        budget: int = typer.Option(None, help="Evaluations per kernel for bo and random (default: a third of the grid, 4..20)."),
        json_output: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
        codec: str = typer.Option("zvc", help="Whose kernels: zvc, bitpack, exponent, a comma-separated list, or all."),
        dtype: str = typer.Option(None, help="Tensor dtype: float32, bfloat16, bool, ... (default: float32; bitpack: bool)."),
        sizes: list[str] = typer.Option(["4MiB"], help="Tensor sizes to tune (one per power-of-4 bucket), e.g. 1MiB,16MiB."),
        op: str = typer.Option("all", help="compress, decompress or all."),
        store: Path = typer.Option(None, help="Config store file (default: $CSWAP_HOME/store.db)."),
        force: bool = typer.Option(False, help="Tune even kernels the store already has configs for."),
        seed: int = typer.Option(0, help="Seed of bo and random search."),
        repeats: int = typer.Option(7, min=1, help="Timed calls per config; the median counts."),
        space: Path = typer.Option(None, help="Search-space YAML file or directory (default: configs/search_spaces)."),
        tuner_url: str = typer.Option(None, help="A running `cswap serve` to look configs up in and publish runs to."),
        token: str = typer.Option(None, envvar="CSWAP_SERVER_TOKEN", help="Bearer token for publishing to --tuner-url."),
    ) -> None:
        """Tune the codec kernels' launch configs on this machine (a store hit measures nothing)."""
        from cswap.tuner.space import SearchSpaceError
        from cswap.tuner.store import StoreError

        try:
            parsed_sizes = _sizes(sizes)
        except ValueError as exc:
            raise fail(f"--sizes: {exc}") from None
        console = Console(stderr=True)
        try:
            with warnings_as_lines():
                report = run_tune(
                    backend=backend, method=method, budget=budget, dtype=dtype, sizes=parsed_sizes, op=op, store=store,
                    force=force, seed=seed, repeats=repeats, space=space, tuner_url=tuner_url, token=token,
                    console=None if json_output else console, codec=codec,
                )
        except (ValueError, SearchSpaceError) as exc:
            raise fail(exc) from None
        except (RuntimeError, StoreError) as exc:
            raise fail(exc, code=1) from None
        if json_output:
            typer.echo(json.dumps(report, sort_keys=True, allow_nan=False))
        else:
            _print_report(report, Console())
