"""``cswap serve`` as a child process: on a free loopback port, returned once ``/healthz`` answers.

For benchmarks, tests and scripts that need a real service process (one that can be killed).

Example:
    >>> from cswap.server.spawn import spawn_service, stop_service
    >>> process, url = spawn_service("/tmp/spawn-example.db")  # doctest: +SKIP
    >>> stop_service(process)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

__all__ = ["TOKEN_ENV", "free_port", "spawn_service", "stop_service"]

#: The environment variable ``cswap serve`` reads its bearer token from.
TOKEN_ENV = "CSWAP_SERVER_TOKEN"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on at ``host`` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def spawn_service(
    store_path: str | os.PathLike[str], token: str | None = None, startup_s: float = 90.0, host: str = "127.0.0.1"
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``cswap serve`` on ``store_path`` and wait until it answers.

    Args:
        store_path: the SQLite config store the service serves.
        token: the bearer token it requires, or ``None`` for none (``$CSWAP_SERVER_TOKEN`` is not inherited).
        startup_s: how long to wait for ``/healthz``.
        host: the interface to listen on.

    Returns:
        The process (its stderr is a pipe) and the service's URL.

    Raises:
        RuntimeError: the process exited (its stderr is in the message) or did not answer in time.
    """
    port = free_port(host)
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    if token:
        env[TOKEN_ENV] = token
    command = [sys.executable, "-m", "cswap.cli", "serve", "--host", host, "--port", str(port),
               "--store", str(Path(store_path)), "--log-level", "warning"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://{host}:{port}"
    deadline = time.monotonic() + startup_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            stderr = process.stderr.read().decode() if process.stderr is not None else ""
            raise RuntimeError(f"cswap serve exited with {process.returncode}: {stderr}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.1)
    stop_service(process)
    raise RuntimeError(f"cswap serve did not answer within {startup_s} s")


def stop_service(process: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """Stop a service from :func:`spawn_service` (terminate, then kill) and close its pipe; safe to repeat."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    process.wait(timeout=timeout_s)
    if process.stderr is not None:
        process.stderr.close()
