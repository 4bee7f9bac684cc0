"""`cswap configs list | show | export | import | push` and the guard rails of `cswap serve`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cswap import cli
from cswap.commands.serve import is_loopback
from cswap.server.app import create_app
from tests.server.helpers import A100, GRID, H100, KERNEL, TOKEN, make_run, serve_in_thread
from cswap.tuner.store import ConfigStore, fingerprint_key

runner = CliRunner()


def invoke(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(cli.app, list(args), env=env)


@pytest.fixture
def home_store() -> ConfigStore:
    """The default store ($CSWAP_HOME/store.db) with two devices, three runs and a model."""
    store = ConfigStore()
    store.record_run(make_run(created_at=1.0))
    store.record_run(make_run(params={**GRID, "compress_grid": 528}, time_s=5e-4, created_at=2.0))
    store.record_run(make_run(fp=A100, created_at=3.0))
    store.put_model(H100, "compress_time", {"coef": [1.0, 2.0]})
    return store


def test_list(home_store: ConfigStore) -> None:
    result = invoke("configs", "list", "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["store"] == str(Path(os.environ["CSWAP_HOME"]) / "store.db")
    devices = {d["key"]: d for d in body["devices"]}
    h100 = devices[fingerprint_key(H100)]
    assert (h100["runs"], h100["configs"], h100["models"]) == (2, 1, 1)
    assert [(c["kernel"], c["params"], c["time_s"]) for c in h100["best_configs"]] == [(KERNEL, {**GRID, "compress_grid": 528}, 5e-4)]


def test_list_an_empty_store_given_by_path(tmp_path: Path) -> None:
    result = invoke("configs", "list", "--json", "--store", str(tmp_path / "empty.db"))
    assert result.exit_code == 0 and json.loads(result.stdout)["devices"] == []


def test_show_a_device_by_prefix_and_a_run_by_id(home_store: ConfigStore) -> None:
    key = fingerprint_key(H100)
    body = json.loads(invoke("configs", "show", key[:5], "--json").stdout)
    assert body["key"] == key and body["fingerprint"] == H100
    assert body["models"] == {"compress_time": {"coef": [1.0, 2.0]}}
    assert [r["evaluations"] for r in body["runs"]] == [3, 3]
    run = home_store.run(home_store.runs()[0].run_id)
    shown = json.loads(invoke("configs", "show", run.run_id, "--json").stdout)
    assert shown["evaluations"] == [e.to_dict() for e in run.evaluations]


def test_show_unknown(home_store: ConfigStore) -> None:
    result = invoke("configs", "show", "zzzz")
    assert result.exit_code == 2
    assert "no device key starting with 'zzzz'" in result.stderr and "cswap configs list" in result.stderr


def _table_text(*args: str) -> str:
    result = runner.invoke(cli.app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert not result.stdout.lstrip().startswith("{"), "a table, not JSON, by default"
    return result.stdout


def test_list_prints_tables_by_default(home_store: ConfigStore) -> None:
    out = _table_text("configs", "list")
    assert f"store: {home_store.path}" in out
    h100_row = next(line for line in out.splitlines() if line.strip().startswith(fingerprint_key(H100)) and "cuda" in line)
    assert H100["name"] in h100_row and h100_row.split()[-4:] == ["132", "1", "2", "1"]
    best = [line.split() for line in out.splitlines() if KERNEL in line and fingerprint_key(H100)[:8] in line]
    assert best == [[fingerprint_key(H100)[:8], KERNEL, "float32", "12", "0.500", "chunk_words=32"]]
    assert "compress_grid=528" in out


def test_show_prints_a_device_and_a_run_as_tables(home_store: ConfigStore) -> None:
    out = _table_text("configs", "show", fingerprint_key(H100)[:6])
    assert f"device {fingerprint_key(H100)}" in out and H100["name"] in out
    assert "compress_time" in out
    runs = home_store.runs()
    assert all(run.run_id in out for run in runs if run.fingerprint_key == fingerprint_key(H100))
    run = home_store.run(runs[0].run_id)
    out = _table_text("configs", "show", run.run_id)
    assert f"tuning run {run.run_id}" in out
    lines = [line.split() for line in out.splitlines()]
    evaluations = [line for line in lines if line and line[0] in ("0", "1", "2")]
    assert [line[1] for line in evaluations] == [f"{run.evaluations[0].time_s * 1e3:.3f}",
                                                 f"{run.evaluations[1].time_s * 1e3:.3f}", "failed"]


def test_tables_never_read_stored_text_as_markup(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path / "odd.db")
    store.record_run(make_run(fp={**H100, "name": "[bold]GPU[/] [/x]"}))
    out = _table_text("configs", "list", "--store", str(store.path))
    assert "[bold]GPU[/] [/x]" in out


def test_listing_a_read_only_store(home_store: ConfigStore) -> None:
    assert json.loads(invoke("configs", "list", "--json").stdout)["devices"]
    home_store.close()
    os.chmod(home_store.path, 0o444)
    try:
        assert len(json.loads(invoke("configs", "list", "--json").stdout)["devices"]) == 2
    finally:
        os.chmod(home_store.path, 0o644)


def test_export_import_round_trip(home_store: ConfigStore, tmp_path: Path) -> None:
    path = tmp_path / "export.json"
    result = invoke("configs", "export", str(path))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"path": str(path), "devices": 2, "runs": 3}
    assert json.loads(invoke("configs", "export").stdout)["runs"] == json.loads(path.read_text())["runs"]
    other = tmp_path / "other.db"
    imported = invoke("configs", "import", str(path), "--store", str(other))
    assert imported.exit_code == 0, imported.output
    assert json.loads(imported.stdout) == {"devices": 2, "runs": 3, "configs": 2, "models": 1}
    assert ConfigStore(other).runs(with_evaluations=True) == home_store.runs(with_evaluations=True)
    assert json.loads(invoke("configs", "import", str(path), "--store", str(other)).stdout)["runs"] == 0


@pytest.mark.parametrize(
    "content, message, code",
    [("{broken", "is not JSON", 2), ('{"format": "zip"}', "not a cswap store export", 1), (None, "cannot read", 1)],
)
def test_import_bad_files(tmp_path: Path, content: str | None, message: str, code: int) -> None:
    path = tmp_path / "in.json"
    if content is not None:
        path.write_text(content)
    result = invoke("configs", "import", str(path))
    assert result.exit_code == code
    assert message in result.stderr


def test_a_corrupt_store_is_reported_not_touched(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    path.write_bytes(b"garbage" * 1000)
    for args in (["list"], ["export"], ["show", "x"]):
        result = invoke("configs", *args, "--store", str(path))
        assert result.exit_code == 1
        assert f"config store {path} is not a readable cswap store" in result.stderr
    assert path.read_bytes() == b"garbage" * 1000


def test_push_publishes_local_runs(home_store: ConfigStore, tmp_path: Path) -> None:
    remote = ConfigStore(tmp_path / "remote.db")
    remote.record_run(home_store.run(home_store.runs()[0].run_id))
    with serve_in_thread(create_app(remote, token=TOKEN)) as url:
        refused = invoke("configs", "push", "--tuner-url", url, env={"CSWAP_SERVER_TOKEN": ""})
        assert refused.exit_code == 1 and "HTTP 401" in refused.stderr
        result = invoke("configs", "push", "--tuner-url", url, "--token", TOKEN)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == {"published": 2, "already_there": 1, "tuner_url": url}
    assert remote.runs(with_evaluations=True) == home_store.runs(with_evaluations=True)


def test_push_to_a_dead_service(home_store: ConfigStore) -> None:
    result = invoke("configs", "push", "--tuner-url", "http://127.0.0.1:9", "--timeout-s", "0.2")
    assert result.exit_code == 1
    assert "did not answer GET /healthz" in result.stderr and "run this again later" in result.stderr
    assert len(home_store.runs()) == 3


def test_push_bad_url() -> None:
    result = invoke("configs", "push", "--tuner-url", "localhost:8765")
    assert result.exit_code == 2 and "must look like http://HOST:PORT" in result.stderr


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1"])
def test_serve_refuses_non_loopback_without_a_token(host: str, tmp_path: Path) -> None:
    result = invoke("serve", "--host", host, "--store", str(tmp_path / "s.db"), env={"CSWAP_SERVER_TOKEN": ""})
    assert result.exit_code == 2
    assert f"refusing to serve on {host}" in result.stderr and "--token" in result.stderr
    assert not (tmp_path / "s.db").exists()


def test_serve_reports_a_corrupt_store(tmp_path: Path) -> None:
    path = tmp_path / "bad.db"
    path.write_bytes(b"\x01" * 4096)
    result = invoke("serve", "--store", str(path))
    assert result.exit_code == 1 and "not a readable cswap store" in result.stderr


@pytest.mark.parametrize(
    "host, loopback",
    [("127.0.0.1", True), ("127.5.0.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False),
     ("::", False), ("10.0.0.1", False), ("no-such-host.invalid", False)],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
