"""``cswap configs``: inspect, export, import and publish the kernel-config store.

``list`` and ``show`` print tables (``--json`` for JSON); ``export``, ``import`` and ``push`` print JSON.
``list``, ``show`` and ``export`` only read: they work on a read-only store.

Example:
    $ cswap configs list
    $ cswap configs list --json
    $ cswap configs show 3fa2c1
    $ cswap configs export store.json
    $ cswap configs import store.json
    $ cswap configs push --tuner-url http://tuner:8765 --token s3cret
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from cswap.commands import fail

__all__ = ["register"]

_STORE_HELP = "Config store file (default: $CSWAP_HOME/store.db)."


def _emit(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True, allow_nan=False))


def _console():  # -> rich Console; imported lazily to keep `cswap --help` fast
    from rich.console import Console

    return Console()


def _fail(message: str, code: int = 1) -> typer.Exit:
    """Store and network trouble exit 1; input the user can fix passes ``code=2``."""
    return fail(message, code)


def _open(store: Path | None, read: bool = False):  # -> ConfigStore; imported lazily to keep `cswap --help` fast
    from cswap.paths import cswap_home
    from cswap.tuner.store import ConfigStore, StoreError

    path = store if store is not None else cswap_home() / "store.db"
    try:
        # Reading commands open an existing store read-only, so they work where it cannot be written.
        return ConfigStore(path, read_only=read and path.is_file())
    except StoreError as exc:
        raise _fail(str(exc)) from None


def _run_summary(run: Any) -> dict[str, Any]:
    data = run.to_dict()
    data["fingerprint_key"] = run.fingerprint_key
    data["evaluations"] = len(run.evaluations)
    data.pop("fingerprint")
    return data


def register(app: typer.Typer) -> None:
    """Add ``configs`` (list, show, export, import, push) to the ``cswap`` command."""
    configs = typer.Typer(help="Inspect, export, import and publish tuned kernel configs.", no_args_is_help=True)
    app.add_typer(configs, name="configs")

    @configs.command("list")
    def list_(
        store: Path = typer.Option(None, help=_STORE_HELP),
        json_output: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    ) -> None:
        """Every tuned device with its best configs."""
        from cswap.tuner.store import StoreError

        config_store = _open(store, read=True)
        try:
            devices = config_store.devices()
            for device in devices:
                device["best_configs"] = [
                    {k: v for k, v in c.items() if k != "device_key"} for c in config_store.configs(device["key"])
                ]
        except StoreError as exc:
            raise _fail(str(exc)) from None
        body = {"store": str(config_store.path), "devices": devices}
        if json_output:
            _emit(body)
        else:
            from cswap.commands.configs_tables import print_list

            print_list(body, _console())

    @configs.command("show")
    def show(
        key: str = typer.Argument(..., help="A device key (or a unique prefix of one), or a tuning run id."),
        store: Path = typer.Option(None, help=_STORE_HELP),
        json_output: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    ) -> None:
        """One device: fingerprint, best configs, calibrated models and runs; or one run with its evaluations."""
        from cswap.commands.configs_tables import print_run, print_show
        from cswap.tuner.store import StoreError

        config_store = _open(store, read=True)
        try:
            device_key = config_store.resolve_key(key)
            if device_key is None:
                run = config_store.run(key)
                if run is None:
                    raise _fail(
                        f"no device key starting with {key!r} and no tuning run with that id in {config_store.path}; "
                        f"see `cswap configs list`",
                        code=2,
                    )
                body = {**run.to_dict(), "fingerprint_key": run.fingerprint_key}
                if json_output:
                    _emit(body)
                else:
                    print_run(body, _console())
                return
            body = {
                "key": device_key,
                "fingerprint": config_store.device(device_key),
                "best_configs": [
                    {k: v for k, v in c.items() if k != "device_key"} for c in config_store.configs(device_key)
                ],
                "models": config_store.models(device_key),
                "runs": [_run_summary(r) for r in config_store.runs(device_key, with_evaluations=True)],
            }
            if json_output:
                _emit(body)
            else:
                print_show(body, _console())
        except StoreError as exc:
            raise _fail(str(exc)) from None

    @configs.command("export")
    def export(
        path: Path = typer.Argument(None, help="Output file (default: standard output)."),
        store: Path = typer.Option(None, help=_STORE_HELP),
    ) -> None:
        """Everything in the store as one JSON document (for `cswap configs import`)."""
        from cswap.tuner.store import StoreError

        try:
            document = _open(store, read=True).export_json()
        except StoreError as exc:
            raise _fail(str(exc)) from None
        text = json.dumps(document, indent=2, sort_keys=True, allow_nan=False)
        if path is None:
            typer.echo(text)
            return
        try:
            path.write_text(text + "\n")
        except OSError as exc:
            raise _fail(f"cannot write {path}: {exc}") from None
        typer.echo(
            json.dumps({"path": str(path), "devices": len(document["devices"]), "runs": len(document["runs"])}),
        )

    @configs.command("import")
    def import_(
        path: Path = typer.Argument(..., help="A file written by `cswap configs export` ('-': standard input)."),
        store: Path = typer.Option(None, help=_STORE_HELP),
    ) -> None:
        """Merge an export into the store; prints what was new."""
        from cswap.tuner.store import StoreError

        try:
            text = sys.stdin.read() if str(path) == "-" else path.read_text()
        except OSError as exc:
            raise _fail(f"cannot read {path}: {exc}") from None
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise _fail(f"{path} is not JSON ({exc}); pass a file written by `cswap configs export`", code=2) from None
        try:
            counts = _open(store).import_json(document)
        except (StoreError, ValueError) as exc:
            raise _fail(f"{path}: {exc}") from None
        _emit(counts)

    @configs.command("push")
    def push(
        tuner_url: str = typer.Option(..., help="The tuning service, e.g. http://127.0.0.1:8765."),
        token: str = typer.Option(None, envvar="CSWAP_SERVER_TOKEN", help="The service's bearer token."),
        store: Path = typer.Option(None, help=_STORE_HELP),
        timeout_s: float = typer.Option(10.0, min=0.001, help="Per-request timeout in seconds."),
    ) -> None:
        """Publish every local tuning run to a service (runs it already has are skipped by id)."""
        from cswap.server.client import TuningClient, TuningServiceError
        from cswap.tuner.store import StoreError

        config_store = _open(store)
        try:
            client = TuningClient(tuner_url, token=token, timeout_s=timeout_s)
        except ValueError as exc:
            raise _fail(str(exc), code=2) from None
        published = already = 0
        try:
            with client:
                client.health()  # a wrong URL fails here even when there is nothing to push
                for summary in config_store.runs():
                    run = config_store.run(summary.run_id)
                    if run is None:
                        continue
                    if client.publish(run):
                        published += 1
                    else:
                        already += 1
        except (TuningServiceError, StoreError) as exc:
            typer.echo(json.dumps({"published": published, "already_there": already}), err=True)
            raise _fail(f"{exc}. Runs not yet published stay in the local store; run this again later") from None
        _emit({"published": published, "already_there": already, "tuner_url": client.url})
