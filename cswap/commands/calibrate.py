"""``cswap calibrate``: measure a codec backend, fit the time model and the compress/don't decider, store both.

Steps:

1. micro-benchmark each codec asked for (``--codec``: ``zvc`` by default, ``bitpack``, ``exponent``, a
   list or ``all``) on its backend over sizes, sparsities and widths (:func:`cswap.predictors.calibrate`),
   with the tuned launch configs of that codec where the store has them;
2. fit one linear time model per (codec, op, width) and report its MAPE on held-out sizes;
3. profile a few small CNNs from :mod:`cswap.models` on :func:`cswap.training.data.digits` with
   ``cswap.Runtime(policy="none")`` to get real saved tensors (size, sparsity, hidden times);
4. label every tensor with the cost model (:func:`cswap.planner.costmodel.decide`, codec times from step 2)
   under the measured link, each hardware profile's link and a sweep of slow links, with the
   hidden times scaled around the profiled ones, so both decisions occur;
5. fit the logistic decider; its accuracy is measured on the tensors of each model with the
   decider fitted on the other models only (leave one model out); steps 3-5 weigh ZVC's times and
   run only when ``zvc`` is calibrated;
6. store samples, time model and decider under this device's fingerprint (``put_model``); the time
   models of codecs not calibrated this time are kept.

Example:
    $ cswap calibrate                      # the default backend of this machine, full grid (~2 min on CPU)
    $ cswap calibrate --quick --json       # a tiny grid, one JSON object on stdout
    $ cswap calibrate --backend cuda --store /tmp/store.db
    $ cswap calibrate --codec bitpack,exponent  # the new codecs' time models, ZVC's kept
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cswap.commands import fail, warnings_as_lines

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "DecisionData",
    "HIDDEN_SCALES",
    "SLOW_LINKS_GBPS",
    "collect_traces",
    "decision_dataset",
    "evaluate_decider",
    "link_profiles",
    "register",
    "run_calibrate",
]

#: Models profiled for the decider's tensors (full run), and in ``--quick``.
TRACE_MODELS: tuple[str, ...] = ("alexnet", "vgg11", "resnet18", "squeezenet1_1")
QUICK_TRACE_MODELS: tuple[str, ...] = ("alexnet", "squeezenet1_1")
#: Factors applied to the profiled hidden times: from nothing hidden to three times as much.
HIDDEN_SCALES: tuple[float, ...] = (0.0, 0.03, 0.1, 0.3, 1.0, 3.0)
#: Links slower than PCIe (GB/s), where a CPU codec's speed sits, so its decision boundary is covered too.
SLOW_LINKS_GBPS: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
_BACKENDS = ("cpu", "cuda", "torch")


def link_profiles(measured_d2h_gbps: float, measured_h2d_gbps: float) -> dict[str, tuple[float, float]]:
    """Links to label tensors under: ``measured``, every hardware profile's link, and :data:`SLOW_LINKS_GBPS`.

    Returns:
        ``{name: (d2h_gbps, h2d_gbps)}``.

    Example:
        >>> links = link_profiles(10.0, 11.0)
        >>> links["measured"], links["v100-pcie3"]
        ((10.0, 11.0), (12.0, 12.0))
    """
    from cswap.simulate.hardware import hardware_names, load_hardware

    links = {"measured": (float(measured_d2h_gbps), float(measured_h2d_gbps))}
    for name in hardware_names():
        link = load_hardware(name).link
        links[name] = (link.d2h_gbps, link.h2d_gbps)
    for gbps in SLOW_LINKS_GBPS:
        links[f"{gbps:g}GBps"] = (gbps, gbps)
    return links


def collect_traces(
    models: Sequence[str],
    device: Any,
    d2h_gbps: float,
    h2d_gbps: float,
    batch_size: int = 32,
    width_mult: float = 0.25,
    image_size: int = 32,
    on_model: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """One profiled training iteration per model, as ``{model name: cswap.profile.trace.Trace}``.

    Each model from :mod:`cswap.models` runs forward and backward on a batch of
    :func:`cswap.training.data.digits` under ``cswap.Runtime(policy="none")``, which records every saved
    tensor without moving any. ``on_model(name)`` is called before each model is profiled.
    """
    import torch

    import cswap
    from cswap import models as zoo
    from cswap.training.data import digits

    split = digits(image_size=image_size, channels=3)
    images, labels = split.train.tensors
    x, y = images[:batch_size].to(device), labels[:batch_size].to(device)
    traces = {}
    for name in models:
        if on_model is not None:
            on_model(name)
        torch.manual_seed(0)
        model = zoo.build(name, num_classes=split.num_classes, width_mult=width_mult).to(device)
        runtime = cswap.Runtime(policy="none", device=str(device), d2h_gbps=d2h_gbps, h2d_gbps=h2d_gbps)
        runtime.new_epoch()
        with runtime.iteration():
            torch.nn.functional.cross_entropy(model(x), y).backward()
        traces[name] = runtime.trace()
    return traces


@dataclass(frozen=True)
class DecisionData:
    """Labelled rows for the decider.

    Attributes:
        features: :func:`cswap.predictors.decision_features` rows.
        labels: the cost model's verdict (``True``: compress).
        groups: the model each row's tensor came from.
        links: the link name of each row.
        scales: the hidden-time factor of each row.
    """

    features: np.ndarray
    labels: np.ndarray
    groups: np.ndarray
    links: np.ndarray
    scales: np.ndarray


def _itemsize(dtype_name: str) -> int:
    import torch

    return torch.empty((), dtype=getattr(torch, dtype_name)).element_size()


def decision_dataset(
    traces: Mapping[str, Any],
    codec_s: Callable[[str, int, float, int], float],
    links: Mapping[str, tuple[float, float]],
    hidden_scales: Iterable[float] = HIDDEN_SCALES,
) -> DecisionData:
    """Label every offloadable tensor of ``traces`` with the cost model, under every link and hidden-time scale.

    Args:
        traces: ``{group name: Trace}``.
        codec_s: ``codec_s(op, nbytes, density, itemsize)``, seconds of ``compress`` / ``decompress``.
        links: ``{name: (d2h_gbps, h2d_gbps)}``.
        hidden_scales: factors on each tensor's profiled ``Hidden_f`` and ``Hidden_b``.

    Example:
        >>> from cswap.profile.trace import Trace, TensorRecord
        >>> rec = TensorRecord(key=0, shape=(1 << 20,), dtype="float32", nbytes=4 << 20, sparsity=0.9)
        >>> data = decision_dataset({"m": Trace(tensors=(rec,))}, lambda op, n, d, w: 1e-4, {"slow": (1.0, 1.0)}, [1.0])
        >>> data.labels.tolist()
        [True]
    """
    from cswap.planner.costmodel import decide
    from cswap.predictors import decision_features

    rows: list[tuple[float, ...]] = []
    labels, groups, link_names, scales = [], [], [], []
    for group, trace in traces.items():
        for record in trace.tensors:
            if not record.offloadable or record.nbytes <= 0:
                continue
            itemsize = _itemsize(record.dtype)
            density = 1.0 - record.sparsity
            compress_s = codec_s("compress", record.nbytes, density, itemsize)
            decompress_s = codec_s("decompress", record.nbytes, density, itemsize)
            for link, (d2h, h2d) in links.items():
                for scale in hidden_scales:
                    hidden_f, hidden_b = record.hidden_forward_s * scale, record.hidden_backward_s * scale
                    verdict = decide(
                        nbytes=record.nbytes, sparsity=record.sparsity, hidden_forward_s=hidden_f,
                        hidden_backward_s=hidden_b, d2h_gbps=d2h, h2d_gbps=h2d, compress_s=compress_s,
                        decompress_s=decompress_s, itemsize=itemsize,
                    )
                    rows.append((record.nbytes, record.sparsity, hidden_f, hidden_b, d2h, h2d))
                    labels.append(verdict.compress)
                    groups.append(group)
                    link_names.append(link)
                    scales.append(scale)
    if not rows:
        raise ValueError("the traces hold no offloadable tensor to learn from")
    import numpy as np  # here, not with the command line: `cswap --help` stays quick

    raw = np.asarray(rows, dtype=np.float64)
    return DecisionData(
        features=decision_features(*raw.T),
        labels=np.asarray(labels, dtype=bool),
        groups=np.asarray(groups),
        links=np.asarray(link_names),
        scales=np.asarray(scales, dtype=np.float64),
    )


def evaluate_decider(data: DecisionData) -> dict[str, Any]:
    """Leave-one-model-out accuracy of the decider on ``data`` (each model's tensors judged by a decider fitted without them).

    Returns:
        ``accuracy`` (pooled over models), ``balanced_accuracy`` (the mean of the accuracy on
        each class, which a majority answer cannot inflate), ``baseline_accuracy`` (always
        answering the majority class of the training rows), ``accuracy_by_model``, ``accuracy_measured_link`` (rows with
        the measured link and the profiled hidden times), ``positive_fraction``, ``test_samples``.
    """
    import numpy as np
    from sklearn.metrics import balanced_accuracy_score

    from cswap.predictors import fit

    predicted = np.zeros_like(data.labels)
    baseline = np.zeros_like(data.labels)
    names = list(dict.fromkeys(data.groups.tolist()))
    for name in names:
        test = data.groups == name
        train_labels = data.labels[~test]
        majority = bool(train_labels.mean() >= 0.5) if train_labels.size else False
        baseline[test] = majority
        if len(names) < 2 or train_labels.all() or not train_labels.any():
            predicted[test] = majority  # nothing to learn from: the best constant answer
            continue
        predicted[test] = fit(data.features[~test], train_labels).predict(data.features[test])
    correct = predicted == data.labels
    both = bool(data.labels.any() and not data.labels.all())
    profiled = (data.links == "measured") & (data.scales == 1.0)
    return {
        "accuracy": float(correct.mean()),
        "balanced_accuracy": float(balanced_accuracy_score(data.labels, predicted)) if both else float(correct.mean()),
        "baseline_accuracy": float((baseline == data.labels).mean()),
        "accuracy_by_model": {name: float(correct[data.groups == name].mean()) for name in names},
        "accuracy_measured_link": float(correct[profiled].mean()) if profiled.any() else None,
        "positive_fraction": float(data.labels.mean()),
        "test_samples": len(data.labels),
    }


def _device_for(backend: str) -> Any:
    """The device a backend compresses on: the GPU for ``cuda`` (an error without one), else the CPU."""
    from cswap.device import resolve_device

    return resolve_device("cuda" if backend == "cuda" else "cpu")


def run_calibrate(
    backend: str | None = None,
    quick: bool = False,
    store_path: Path | None = None,
    console: Console | None = None,
    show_progress: bool = True,
    codec: str = "zvc",
) -> dict[str, Any]:
    """Calibrate ``backend`` on this machine, store the predictors, return the report.

    Args:
        backend: ``cpu``, ``cuda`` or ``torch`` (default: ``cuda`` when a GPU is visible, else ``cpu``).
        quick: a tiny grid and two tiny models (seconds; for tests and smoke runs).
        store_path: the config store file (default ``$CSWAP_HOME/store.db``).
        console: where the progress bar goes (default: stderr).
        show_progress: draw the progress bar (on a terminal; elsewhere one line per stage).
        codec: ``zvc`` (default), ``bitpack``, ``exponent``, a comma-separated list, or ``all``: each
            is measured on its dtypes (:data:`cswap.predictors.calibration.CODEC_DTYPES`) and gets
            its own time models; the stored models of the codecs not named are kept. The decider
            weighs ZVC's times, so it is fitted (and the models profiled) only when ``zvc`` is named.

    Returns:
        The JSON-ready report ``cswap calibrate --json`` prints.
    """
    from cswap.device import bandwidth, fingerprint
    from cswap.predictors import (
        CalibrationPlan,
        LogisticDecider,
        calibrate,
        fit,
        fit_time_models,
        save_decider,
        save_samples,
        save_time_model,
    )
    from cswap.tuner.space import parse_codecs
    from cswap.tuner.store import ConfigStore

    import torch

    started_s = time.perf_counter()
    codecs = parse_codecs(codec)
    backend = backend or ("cuda" if torch.cuda.is_available() else "cpu")
    if backend not in _BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(_BACKENDS)}")
    device = _device_for(backend)
    fp = fingerprint(device)
    store = ConfigStore(store_path)
    plans = [CalibrationPlan.quick(backend, name) if quick else CalibrationPlan.default(backend, name) for name in codecs]
    console = console or Console(stderr=True)

    models = (QUICK_TRACE_MODELS if quick else TRACE_MODELS) if "zvc" in codecs else ()
    runs = []
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        # stdout is left alone: it carries the --json report, and nothing else writes to it meanwhile.
        console=console, transient=True, disable=not show_progress, redirect_stdout=False,
    ) as progress:
        # One step per timed point, then one per profiled model; fitting is instant next to either.
        planned = [plan.n_points * (plan.passes + 1) for plan in plans]
        task = progress.add_task(f"calibrating {codecs[0]}/{backend}", total=sum(planned) + len(models))

        def stage(description: str, completed: int | None = None) -> None:
            # Drawn now, not at the next timed refresh: a stage quicker than one refresh is still shown.
            progress.update(task, description=description, completed=completed, refresh=True)
            if show_progress and not console.is_terminal:
                # No live bar in a log or a pipe: one plain line per stage instead.
                console.print(f"cswap calibrate: {description}", markup=False, highlight=False)

        for index, plan in enumerate(plans):
            stage(f"measuring {plan.codec}/{backend} at {plan.n_points} points")
            done_before = int(progress.tasks[0].completed)
            later = sum(planned[index + 1:]) + len(models)
            runs.append(calibrate(
                plan, fingerprint=fp.to_dict(), store=store,
                on_step=lambda done, total, before=done_before, later=later: progress.update(
                    task, completed=before + done, total=before + total + later),
            ))
        stage("fitting time models")
        time_model, reports = fit_time_models([sample for run in runs for sample in run.samples])
        traces: dict[str, Any] = {}
        if models:
            measured = bandwidth(device, nbytes=(4 << 20) if quick else (64 << 20))
            done = progress.tasks[0].completed
            traces = collect_traces(
                models, device, measured.d2h_gbps, measured.h2d_gbps,
                batch_size=8 if quick else 64, width_mult=0.125 if quick else 0.5,
                on_model=lambda name: stage(f"profiling {name} for the decider", done + models.index(name)),
            )
        progress.update(task, completed=progress.tasks[0].total)
    wall_s = sum(run.wall_s for run in runs)
    time_model.meta.update({"fingerprint_key": fp.key, "calibration_wall_s": wall_s})
    stored = [save_samples(fp, backend, run.to_dict(), store, codec=run.plan.codec) for run in runs]
    stored += save_time_model(fp, time_model, store)
    decision_report = None
    if models:
        links = link_profiles(measured.d2h_gbps, measured.h2d_gbps)

        def codec_s(op: str, nbytes: int, density: float, itemsize: int) -> float:
            return float(time_model.predict_s(op, nbytes, density, itemsize, backend, "zvc")[0])

        data = decision_dataset(traces, codec_s, links)
        decision = evaluate_decider(data)
        meta = {"backend": backend, "codec": "zvc", "models": list(models)}
        if data.labels.all() or not data.labels.any():
            # Every tensor under every link got the same verdict: that verdict is the model.
            decider = LogisticDecider.constant(bool(data.labels.all()), meta)
        else:
            decider = fit(data.features, data.labels, meta=meta)
        stored.append(save_decider(fp, decider, backend, store))
        decision_report = {
            **decision,
            "train_samples": len(data.labels),
            "tensors": sum(1 for t in traces.values() for r in t.tensors if r.offloadable and r.nbytes > 0),
            "models": list(models),
            "traces": "profiled",
            "constant": bool(decider.meta.get("constant", False)),
            "links_gbps": {name: list(pair) for name, pair in links.items()},
            "hidden_scales": list(HIDDEN_SCALES),
        }
    samples = [sample for run in runs for sample in run.samples]
    return {
        "backend": backend,
        "codec": ",".join(codecs),
        "codecs": codecs,
        "quick": quick,
        "device": {"key": fp.key, "kind": fp.kind, "name": fp.name},
        "calibration": {
            "samples": len(samples),
            "timings": sum(len(s.times_s) for s in samples),
            "launch_matches": sorted({s.launch_match for s in samples}),
            "wall_s": wall_s,
            "by_codec": {
                run.plan.codec: {"samples": len(run.samples), "dtypes": list(run.plan.dtypes or ()), "wall_s": run.wall_s}
                for run in runs
            },
        },
        "time_models": [
            {**report.to_dict(), "knees_bytes": list(time_model.models[report.key].knees_bytes)} for report in reports
        ],
        "decision": decision_report,
        "store": str(store.path),
        "stored": stored,
        "wall_s": time.perf_counter() - started_s,
    }


def _print_table(report: dict[str, Any], console: Console) -> None:
    several = len(report["codecs"]) > 1
    table = Table(title=f"cswap calibrate: {report['codec']}/{report['backend']} on {report['device']['name']}")
    for column in ("codec",) * several + ("op", "width", "samples", "held-out MAPE", "train MAPE", "knees"):
        table.add_column(column, justify="right")
    for row in report["time_models"]:
        # A knee of k bytes means "tensors of k + 1 bytes and more".
        knees = ", ".join(f">={(k + 1) / 2**20:.3g} MiB" for k in row["knees_bytes"]) or "-"
        heldout = "-" if row["mape"] is None else f"{row['mape']:.1%}"
        cells = (row["op"], f"{row['itemsize']} B", str(row["samples"]), heldout, f"{row['train_mape']:.1%}", knees)
        table.add_row(*((row["codec"],) * several + cells))
    console.print(table)
    decision = report["decision"]
    if decision is not None:
        console.print(
            f"decider: accuracy {decision['accuracy']:.1%} on held-out models' tensors "
            f"(balanced {decision['balanced_accuracy']:.1%}, always-majority baseline {decision['baseline_accuracy']:.1%}, {decision['positive_fraction']:.1%} compress), "
            f"{decision['test_samples']} rows from {', '.join(decision['models'])}"
        )
    console.print(f"stored {', '.join(report['stored'])} in {report['store']} ({report['wall_s']:.0f} s)")


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` to the ``cswap`` command."""

    @app.command("calibrate")
    def calibrate_command(
        backend: str = typer.Option(None, help="Codec backend: cpu, cuda or torch (default: cuda when a GPU is visible, else cpu)."),
        json_output: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
        quick: bool = typer.Option(False, help="A tiny grid and two tiny models: seconds, for smoke tests."),
        store: Path = typer.Option(None, help="Config store file (default: $CSWAP_HOME/store.db)."),
        codec: str = typer.Option("zvc", help="Codecs to calibrate: zvc, bitpack, exponent, a comma-separated list, "
                                              "or all; the stored models of the others are kept."),
    ) -> None:
        """Measure the codecs, fit the time models and the compress/don't decider, store them for this device.

        The table has one row per operation and element width (and codec, with several). MAPE is the mean relative error of the
        fitted time model, on sizes held out of the fit and on the fit's own samples. "knees" are the
        tensor sizes past which the measured cost per byte steps up (the data no longer fits a cache,
        say): the model fits a separate slope beyond each, so ">=4 MiB" means tensors of 4 MiB and
        more are priced on their own line; "-" means one straight line fits every size. The last
        lines give the decider's accuracy on the tensors of models it was not fitted on; the decider
        weighs ZVC's times, so it is fitted only when zvc is calibrated.
        """
        console = Console(stderr=True)
        # --json keeps stderr quiet in logs and pipes (2>&1 stays parseable); a terminal still gets the live bar.
        show_progress = console.is_terminal or not json_output
        try:
            with warnings_as_lines():
                report = run_calibrate(backend=backend, quick=quick, store_path=store, console=console,
                                       show_progress=show_progress, codec=codec)
        except (ValueError, RuntimeError) as error:
            raise fail(error) from None
        if json_output:
            typer.echo(json.dumps(report, indent=1))
        else:
            _print_table(report, Console())
