"""``cswap serve``: run the tuning service (FastAPI under uvicorn) over a config store.

Binding an address other than loopback needs a token, so that nobody on the network can publish
configs into the store.

Example:
    $ cswap serve --port 8765
    $ CSWAP_SERVER_TOKEN=s3cret cswap serve --host 0.0.0.0
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

import typer

from cswap.commands import fail

__all__ = ["is_loopback", "register"]


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` resolves to is a loopback address.

    Example:
        >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("0.0.0.0")
        (True, True, False)
    """
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the ``cswap`` command."""

    @app.command("serve")
    def serve(
        host: str = typer.Option("127.0.0.1", help="Address to bind; non-loopback addresses need --token."),
        port: int = typer.Option(8765, min=0, max=65535, help="TCP port (0: any free port)."),
        store: Path = typer.Option(None, help="Config store file (default: $CSWAP_HOME/store.db)."),
        token: str = typer.Option(
            None, envvar="CSWAP_SERVER_TOKEN", help="Bearer token required to publish (env CSWAP_SERVER_TOKEN)."
        ),
        log_level: str = typer.Option("info", help="uvicorn log level: critical, error, warning, info, debug."),
        access_log: bool = typer.Option(False, help="Log every request."),
    ) -> None:
        """Serve tuned kernel configs, tuning runs and calibrated models over HTTP (OpenAPI at /openapi.json)."""
        if not token and not is_loopback(host):
            raise fail(
                f"refusing to serve on {host}, which is reachable from other machines, without a token: "
                f"pass --token TOKEN (or set CSWAP_SERVER_TOKEN), or bind 127.0.0.1"
            )
        import uvicorn

        from cswap.server.app import create_app
        from cswap.tuner.store import StoreError

        try:
            service = create_app(store, token=token or None)
        except StoreError as exc:
            raise fail(exc, code=1) from None
        typer.echo(f"cswap tuning service on http://{host}:{port} (store {service.state.store.path})", err=True)
        uvicorn.run(service, host=host, port=port, log_level=log_level, access_log=access_log, workers=1)
