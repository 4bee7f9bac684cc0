"""The tables ``cswap configs list`` and ``cswap configs show`` print (``--json`` prints the data instead).

Every cell is a :class:`rich.text.Text`: device names, kernels and parameters come from the store
(and so from whoever tuned), and are never read as rich markup.

Example:
    >>> from rich.console import Console
    >>> print_list({"store": "s.db", "devices": []}, Console(width=120))
    store: s.db
    no tuned devices yet: run `cswap tune`, or `cswap configs import FILE`
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["print_list", "print_run", "print_show"]


_WRAPPING = frozenset({"name", "params", "value", "coefficients"})


def _ms(seconds: float | None) -> str:
    return "failed" if seconds is None else f"{seconds * 1e3:.3f}"


def _params(params: Mapping[str, int] | None) -> str:
    # One per line keeps the column narrow enough for 80 columns.
    return "\n".join(f"{name}={value}" for name, value in (params or {}).items())


def _table(title: str, columns: Iterable[str], rows: Iterable[Iterable[Any]], right: Iterable[str] = ()) -> Table:
    aligned = set(right)
    table = Table(title=Text(title), box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False,
                  collapse_padding=True)
    for column in columns:
        # Identifiers stay whole (a user copies them into `cswap configs show`); free text wraps.
        table.add_column(Text(column), justify="right" if column in aligned else "left", overflow="fold",
                         no_wrap=column not in _WRAPPING)
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in row))
    return table


def _configs_table(configs: list[Mapping[str, Any]], title: str, with_device: bool = False) -> Table:
    # Listing every device leaves no room for the method: `cswap configs show` has it.
    columns = [*(["device"] if with_device else []), "kernel", "dtype", "bucket", "best ms",
               *([] if with_device else ["method"]), "params"]
    rows = [
        [*([c["device_key"][:8]] if with_device else []), c["kernel"], c["dtype"], c["bucket"], _ms(c["time_s"]),
         *([] if with_device else [c["method"]]), _params(c["params"])]
        for c in configs
    ]
    return _table(title, columns, rows, right=("bucket", "best ms"))


def print_list(body: Mapping[str, Any], console: Console) -> None:
    """``cswap configs list``: the devices, then every best config.

    Args:
        body: ``{"store", "devices": [{"key", "fingerprint", "configs", "runs", "models", "best_configs"}]}``.
        console: where to print.
    """
    console.print(Text(f"store: {body['store']}"))
    devices = body["devices"]
    if not devices:
        console.print(Text("no tuned devices yet: run `cswap tune`, or `cswap configs import FILE`"))
        return
    console.print(_table(
        "devices",
        ("key", "kind", "name", "SMs", "configs", "runs", "models"),
        ([d["key"], d["fingerprint"]["kind"], d["fingerprint"]["name"], d["fingerprint"]["sm_count"], d["configs"],
          d["runs"], d["models"]] for d in devices),
        right=("SMs", "configs", "runs", "models"),
    ))
    configs = [{**c, "device_key": d["key"]} for d in devices for c in d.get("best_configs", [])]
    if configs:
        console.print(_configs_table(configs, "best configs", with_device=True))


def print_show(body: Mapping[str, Any], console: Console) -> None:
    """``cswap configs show DEVICE``: fingerprint, best configs, calibrated models and runs.

    Args:
        body: ``{"key", "fingerprint", "best_configs", "models", "runs"}`` (runs with evaluation counts).
        console: where to print.
    """
    console.print(_table(f"device {body['key']}", ("field", "value"), body["fingerprint"].items()))
    console.print(_configs_table(body["best_configs"], "best configs"))
    console.print(_table("calibrated models", ("name", "coefficients"), ((name, len(model)) for name, model in
                                                                         body["models"].items()),
                         right=("coefficients",)))
    console.print(_table(
        "tuning runs",
        ("run id", "kernel", "dtype", "bucket", "method", "best ms", "evals", "wall s"),
        ([r["run_id"], r["kernel"], r["dtype"], r["bucket"], r["method"], _ms(r["best_time_s"]), r["evaluations"],
          f"{r['wall_s']:.2f}"] for r in body["runs"]),
        right=("bucket", "best ms", "evals", "wall s"),
    ))


def print_run(body: Mapping[str, Any], console: Console) -> None:
    """``cswap configs show RUN_ID``: the run, then every evaluated config in order.

    Args:
        body: a run's ``to_dict()`` with ``fingerprint_key``.
        console: where to print.
    """
    summary = [
        ("run id", body["run_id"]), ("device", f"{body['fingerprint_key']} ({body['fingerprint']['name']})"),
        ("kernel", body["kernel"]), ("source hash", body["source_hash"]), ("dtype", body["dtype"]),
        ("bucket", body["bucket"]), ("method", body["method"]), ("best ms", _ms(body["best_time_s"])),
        ("best params", _params(body["best_params"])), ("wall s", f"{body['wall_s']:.2f}"),
    ]
    console.print(_table(f"tuning run {body['run_id']}", ("field", "value"), summary))
    console.print(_table(
        "evaluations", ("#", "time ms", "params"),
        ([index, _ms(e["time_s"]), _params(e["params"])] for index, e in enumerate(body["evaluations"])),
        right=("#", "time ms"),
    ))
