"""A real `cswap serve` in a subprocess, driven by TuningClient and killed mid-run; then `cswap configs push`."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cswap import cli
from cswap.server.app import create_app
from cswap.server.client import RequestRejected, ServiceUnavailable, ServiceUnavailableWarning, TuningClient, publish_or_queue
from cswap.server.spawn import spawn_service, stop_service
from tests.server.helpers import BUCKET, DTYPE, GRID, H100, KERNEL, SOURCE, TOKEN, make_run, serve_in_thread
from cswap.tuner.store import ConfigStore, fingerprint_key


def test_cswap_serve_end_to_end_with_the_server_killed_mid_run(tmp_path: Path) -> None:
    server_store = tmp_path / "server.db"
    local = ConfigStore(tmp_path / "local.db")
    runs = [make_run(time_s=1e-3 * (i + 1), params={**GRID, "compress_grid": 100 + i}, created_at=float(i))
            for i in range(8)]

    process, url = spawn_service(server_store, token=TOKEN)
    try:
        client = TuningClient(url, token=TOKEN, timeout_s=2.0, retries=1, backoff_s=0.05)
        assert client.health()["status"] == "ok"
        with pytest.raises(RequestRejected, match="HTTP 401"):
            TuningClient(url, retries=0).publish(runs[0])
        for run in runs[:4]:
            assert publish_or_queue(client, run, local) is True
        assert client.runs() == runs[:4]
        assert client.lookup(H100, KERNEL, SOURCE, DTYPE, BUCKET).params == {**GRID, "compress_grid": 100}

        process.kill()  # the service dies in the middle of the tuning session
        process.wait(timeout=20)
        with pytest.raises(ServiceUnavailable, match=rf"tuning service at {url} did not answer POST /v1/configs"):
            client.publish(runs[4])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert [publish_or_queue(client, run, local) for run in runs[4:]] == [False] * 4
        assert len([w for w in caught if w.category is ServiceUnavailableWarning]) == 1
    finally:
        stop_service(process)
    assert [r.run_id for r in local.runs()] == [r.run_id for r in runs]  # nothing lost

    # A later session publishes what was tuned while the service was down, to a service on the same store.
    with serve_in_thread(create_app(server_store, token=TOKEN)) as url:
        push = CliRunner().invoke(
            cli.app, ["configs", "push", "--tuner-url", url, "--store", str(local.path)],
            env={"CSWAP_SERVER_TOKEN": TOKEN},
        )
        assert push.exit_code == 0, push.output
        assert json.loads(push.stdout) == {"published": 4, "already_there": 4, "tuner_url": url}
        with TuningClient(url) as reader:
            assert reader.runs() == runs
            assert reader.run(runs[7].run_id) == runs[7]
            best = reader.lookup(fingerprint_key(H100), KERNEL, SOURCE, DTYPE, BUCKET)
            assert (best.match, best.params["compress_grid"]) == ("exact", 100)
