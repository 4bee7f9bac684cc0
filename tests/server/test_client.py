"""TuningClient: retries and errors (mock transport), the full API against a live server, the fall-back helpers."""

from __future__ import annotations

import math
import threading
import warnings

import httpx
import pytest

import cswap.server.client as client_module
from cswap.server.client import (
    RequestRejected,
    ServiceUnavailable,
    ServiceUnavailableWarning,
    TuningClient,
    best_lookup,
    lookup_or_none,
    publish_or_queue,
)
from tests.server.helpers import A100, BUCKET, DTYPE, GRID, H100, KERNEL, SOURCE, TOKEN, make_run, serve_in_thread
from cswap.server.app import create_app
from cswap.tuner.store import ConfigStore, LookupResult, fingerprint_key

HEALTH = {"status": "ok", "api": "v1", "version": "0.1.0"}


def mock_client(responses: list, retries: int = 2, backoff_s: float = 0.0) -> tuple[TuningClient, list[httpx.Request]]:
    """A client whose transport answers from ``responses`` in turn (an exception is raised)."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = responses[min(len(seen), len(responses)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    client = TuningClient("http://tuner.test:8765/", token=TOKEN, retries=retries, backoff_s=backoff_s,
                          transport=httpx.MockTransport(handler))
    return client, seen


# ----------------------------------------------------------------------------- retries and errors


@pytest.mark.parametrize("retries", [0, 1, 3])
def test_connection_errors_are_retried_then_service_unavailable(retries: int) -> None:
    client, seen = mock_client([httpx.ConnectError("refused")], retries=retries)
    with pytest.raises(ServiceUnavailable, match=rf"tuning service at http://tuner.test:8765 did not answer GET /healthz "
                                                 rf"after {retries + 1} attempt\(s\).*ConnectError: refused.*cswap serve"):
        client.health()
    assert len(seen) == retries + 1


def test_backoff_doubles(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(client_module.time, "sleep", sleeps.append)
    client, _ = mock_client([httpx.ReadTimeout("slow")], retries=3, backoff_s=0.2)
    with pytest.raises(ServiceUnavailable, match="ReadTimeout"):
        client.devices()
    assert sleeps == [0.2, 0.4, 0.8]


@pytest.mark.parametrize("status", [502, 503, 504])
def test_gateway_errors_are_retried_until_success(status: int) -> None:
    client, seen = mock_client([httpx.Response(status, json={"detail": "busy"}), httpx.Response(status),
                                httpx.Response(200, json=HEALTH)])
    assert client.health() == HEALTH
    assert len(seen) == 3
    assert seen[0].headers["authorization"] == f"Bearer {TOKEN}"


def test_a_500_is_not_retried() -> None:
    client, seen = mock_client([httpx.Response(500, text="boom")])
    with pytest.raises(ServiceUnavailable, match="failed on GET /v1/devices with HTTP 500"):
        client.devices()
    assert len(seen) == 1


@pytest.mark.parametrize(
    "status, detail, match",
    [
        (401, "needs a bearer token", "HTTP 401: needs a bearer token .*--token or CSWAP_SERVER_TOKEN"),
        (422, [{"loc": ["body", "bucket"], "msg": "too big"}], "HTTP 422: .*bucket.*too big"),
        (413, "too large", "HTTP 413: too large"),
    ],
)
def test_4xx_raise_request_rejected_at_once(status: int, detail: object, match: str) -> None:
    client, seen = mock_client([httpx.Response(status, json={"detail": detail})])
    with pytest.raises(RequestRejected, match=match) as info:
        client.publish(make_run())
    assert (info.value.status_code, info.value.detail) == (status, detail)
    assert len(seen) == 1


def test_a_non_json_answer_is_reported() -> None:
    client, _ = mock_client([httpx.Response(200, text="<html>")])
    with pytest.raises(ServiceUnavailable, match="not JSON; is http://tuner.test:8765 a `cswap serve`"):
        client.health()


@pytest.mark.parametrize("url", ["tuner:8765", "ftp://x", ""])
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="must look like http://HOST:PORT"):
        TuningClient(url)


def test_lookup_sends_the_fingerprint_fields() -> None:
    answer = {"params": None, "time_s": None, "match": "default", "source_key": None, "warm_start": []}
    client, seen = mock_client([httpx.Response(200, json=answer)])
    result = client.lookup(H100, KERNEL, SOURCE, DTYPE, BUCKET, default={"compress_grid": 9})
    assert result == LookupResult({"compress_grid": 9}, None, "default", None)
    query = dict(seen[0].url.params)
    assert query == {"kernel": KERNEL, "source_hash": SOURCE, "dtype": DTYPE, "bucket": str(BUCKET),
                     "fingerprint": fingerprint_key(H100), "kind": "cuda", "name": H100["name"],
                     "compute_capability": "9.0", "sm_count": "132", "memory_bytes": str(H100["memory_bytes"])}


# ----------------------------------------------------------------------------- against a live server


def test_every_endpoint_against_a_live_server(live_url: str, store: ConfigStore) -> None:
    from cswap.device import DeviceFingerprint

    runs = [make_run(created_at=1.0), make_run(fp=A100, params={**GRID, "compress_grid": 216}, created_at=2.0),
            make_run(time_s=math.inf, created_at=3.0)]
    store.put_model(H100, "compress_time", {"coef": [2.0, 0.5]})
    with TuningClient(live_url) as client:
        assert client.health()["status"] == "ok"
        assert [client.publish(r) for r in runs] == [True, True, True]
        assert client.publish(runs[0]) is False
        assert client.runs() == runs
        assert client.runs(fingerprint_key(A100)) == [runs[1]]
        assert [r.evaluations for r in client.runs(evaluations=False)] == [(), (), ()]
        assert client.run(runs[2].run_id) == runs[2]
        assert client.run("no/such id") is None
        assert {d["key"]: d["runs"] for d in client.devices()} == {fingerprint_key(H100): 2, fingerprint_key(A100): 1}
        assert client.predictors(fingerprint_key(H100)) == {"compress_time": {"coef": [2.0, 0.5]}}
        assert client.predictors("ffffffffffffffff") == {}

        exact = client.lookup(DeviceFingerprint(**H100), KERNEL, SOURCE, DTYPE, BUCKET)
        assert exact == LookupResult(GRID, 1e-3, "exact", fingerprint_key(H100))
        assert client.lookup(fingerprint_key(H100), KERNEL, SOURCE, DTYPE, BUCKET) == exact
        sibling = {**H100, "driver": "99999"}  # never seen by the service, same model
        assert client.lookup(sibling, KERNEL, SOURCE, DTYPE, BUCKET).match == "same-model"
        half = {**A100, "name": "smaller GPU", "sm_count": 54}
        transferred = client.lookup(half, KERNEL, SOURCE, DTYPE, BUCKET)
        assert transferred == store.lookup(half, KERNEL, SOURCE, DTYPE, BUCKET)
        assert transferred.match == "transferred" and transferred.params["compress_grid"] == 108
        assert client.lookup(H100, KERNEL, "other-source", DTYPE, BUCKET).match == "default"


def test_eight_concurrent_clients_lose_nothing(live_url: str, store: ConfigStore) -> None:
    errors: list[BaseException] = []
    published: dict[int, list[str]] = {}

    def work(worker: int) -> None:
        try:
            with TuningClient(live_url, timeout_s=20.0) as client:
                ids = []
                for index in range(6):
                    run = make_run(time_s=1e-3 + worker * 1e-5 + index * 1e-7,
                                   params={**GRID, "compress_grid": 100 * worker + index + 1})
                    assert client.publish(run) is True
                    ids.append(run.run_id)
                    assert client.run(run.run_id) == run
                    assert client.lookup(H100, KERNEL, SOURCE, DTYPE, BUCKET).match == "exact"
                published[worker] = ids
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    expected = {run_id for ids in published.values() for run_id in ids}
    assert len(expected) == 48
    assert {r.run_id for r in store.runs()} == expected
    assert store.best(fingerprint_key(H100), KERNEL, SOURCE, DTYPE, BUCKET) == ({**GRID, "compress_grid": 1}, 1e-3)


# ----------------------------------------------------------------------------- fall-back helpers


def dead_client() -> TuningClient:
    return TuningClient("http://127.0.0.1:9", timeout_s=0.2, retries=1, backoff_s=0.0)


def test_lookup_or_none_warns_once_and_returns_none(recwarn: pytest.WarningsRecorder) -> None:
    warnings.simplefilter("always")
    client = dead_client()
    for _ in range(3):
        assert lookup_or_none(client, H100, KERNEL, SOURCE, DTYPE, BUCKET) is None
    messages = [str(w.message) for w in recwarn if w.category is ServiceUnavailableWarning]
    assert len(messages) == 1
    assert "did not answer GET /v1/configs" in messages[0] and "using the local config store" in messages[0]
    assert lookup_or_none(None, H100, KERNEL, SOURCE, DTYPE, BUCKET) is None


def test_publish_or_queue_keeps_the_run_locally_when_the_service_is_down(tmp_path, recwarn) -> None:
    warnings.simplefilter("always")
    local = ConfigStore(tmp_path / "local.db")
    runs = [make_run() for _ in range(3)]
    client = dead_client()
    assert [publish_or_queue(client, r, local) for r in runs] == [False, False, False]
    assert [r.run_id for r in local.runs()] == [r.run_id for r in runs]
    assert len([w for w in recwarn if w.category is ServiceUnavailableWarning]) == 1
    assert "cswap configs push" in str(recwarn[0].message)
    assert publish_or_queue(None, make_run(), local) is False
    assert len(local.runs()) == 4


def test_publish_or_queue_publishes_and_records(live_url: str, store: ConfigStore, tmp_path) -> None:
    local = ConfigStore(tmp_path / "local.db")
    run = make_run()
    with TuningClient(live_url) as client:
        assert publish_or_queue(client, run, local) is True
        assert publish_or_queue(client, run, local) is True  # already there is still "the service has it"
    assert local.run(run.run_id) == run and store.run(run.run_id) == run


def test_publish_or_queue_defaults_to_the_home_store() -> None:
    run = make_run()
    publish_or_queue(None, run)
    assert ConfigStore().run(run.run_id) == run


def test_best_lookup_prefers_the_closer_match(live_url: str, store: ConfigStore, tmp_path) -> None:
    local = ConfigStore(tmp_path / "local.db")
    store.record_run(make_run(fp={**H100, "driver": "1"}))  # the service knows a sibling
    with TuningClient(live_url) as client:
        assert best_lookup(client, local, H100, KERNEL, SOURCE, DTYPE, BUCKET).match == "same-model"
        local.record_run(make_run(params={**GRID, "compress_grid": 7}))
        assert best_lookup(client, local, H100, KERNEL, SOURCE, DTYPE, BUCKET).params["compress_grid"] == 7
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh = ConfigStore(tmp_path / "fresh.db")
        assert best_lookup(dead_client(), fresh, H100, KERNEL, SOURCE, DTYPE, BUCKET, default={"x": 1}).match == "default"


def test_a_token_protected_live_server(store: ConfigStore) -> None:
    with serve_in_thread(create_app(store, token=TOKEN)) as url:
        with TuningClient(url) as anonymous, pytest.raises(RequestRejected, match="HTTP 401"):
            anonymous.publish(make_run())
        with TuningClient(url, token=TOKEN) as client:
            assert client.publish(make_run()) is True
    assert len(store.runs()) == 1
