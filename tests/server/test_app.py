"""Every endpoint and error of the tuning service, through FastAPI's TestClient."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import cswap.server.app as app_module
from cswap.server.app import MAX_BODY_BYTES, create_app
from tests.server.helpers import A100, BUCKET, CPU, DTYPE, GRID, H100, KERNEL, SOURCE, TOKEN, make_run
from cswap.tuner.store import ConfigStore, StoreError, TuningRun, fingerprint_key

QUERY = {"kernel": KERNEL, "source_hash": SOURCE, "dtype": DTYPE, "bucket": BUCKET}


def publish(client: TestClient, run, token: str | None = None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return client.post("/v1/configs", json=run.to_dict(), headers=headers)


def test_healthz(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok", "api": "v1", "version": "0.1.0"}


def test_openapi_lists_the_versioned_endpoints(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert set(spec["paths"]) == {
        "/healthz", "/v1/devices", "/v1/configs", "/v1/tuning-runs", "/v1/tuning-runs/{run_id}", "/v1/predictors"
    }
    assert set(spec["paths"]["/v1/configs"]) == {"get", "post"}
    assert "HTTPBearer" in spec["components"]["securitySchemes"]


def test_server_imports_no_torch() -> None:
    code = ("import sys, cswap.server.app, cswap.server.client, cswap.server.schemas, cswap.tuner.store, "
            "cswap.tuner.records; assert 'torch' not in sys.modules, 'torch was imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# ----------------------------------------------------------------------------- publish


def test_publish_stores_the_run_and_is_idempotent(client: TestClient, store: ConfigStore) -> None:
    run = make_run()
    first = publish(client, run)
    assert first.status_code == 201
    assert first.json() == {"run_id": run.run_id, "fingerprint_key": fingerprint_key(H100), "created": True}
    again = publish(client, run)
    assert again.status_code == 200 and again.json()["created"] is False
    assert store.runs(with_evaluations=True) == [run]


def test_publish_fills_in_run_id_and_created_at(client: TestClient, store: ConfigStore) -> None:
    body = make_run().to_dict()
    del body["run_id"], body["created_at"], body["evaluations"], body["wall_s"]
    response = client.post("/v1/configs", json=body)
    assert response.status_code == 201
    run_id = response.json()["run_id"]
    assert len(run_id) == 32 and store.run(run_id).best_params == GRID


def test_devices_lists_what_is_stored(client: TestClient, store: ConfigStore) -> None:
    assert client.get("/v1/devices").json() == []
    publish(client, make_run())
    publish(client, make_run(kernel="zvc.cuda.decompress"))
    store.put_model(CPU, "compress_time", {"coef": [1.0]})
    devices = {d["key"]: d for d in client.get("/v1/devices").json()}
    assert devices[fingerprint_key(H100)] == {
        "key": fingerprint_key(H100), "fingerprint": H100, "configs": 2, "runs": 2, "models": 0
    }
    assert (devices[fingerprint_key(CPU)]["models"], devices[fingerprint_key(CPU)]["runs"]) == (1, 0)


# ----------------------------------------------------------------------------- lookup


def test_lookup_exact_and_faster_runs_replace_the_best(client: TestClient) -> None:
    publish(client, make_run(time_s=2e-3))
    publish(client, make_run(params={**GRID, "compress_grid": 528}, time_s=1e-3))
    publish(client, make_run(params={**GRID, "compress_grid": 1056}, time_s=4e-3))
    body = client.get("/v1/configs", params={**QUERY, "fingerprint": fingerprint_key(H100)}).json()
    assert body == {"params": {**GRID, "compress_grid": 528}, "time_s": 1e-3, "match": "exact",
                    "source_key": fingerprint_key(H100), "warm_start": []}


def test_lookup_same_model_for_an_unknown_device(client: TestClient) -> None:
    publish(client, make_run())
    fields = {k: H100[k] for k in ("kind", "name", "compute_capability", "sm_count")}
    body = client.get("/v1/configs", params={**QUERY, "fingerprint": "0123456789abcdef", **fields}).json()
    assert (body["match"], body["params"], body["source_key"]) == ("same-model", GRID, fingerprint_key(H100))


def test_lookup_transferred_scales_grids(client: TestClient) -> None:
    publish(client, make_run(fp=A100, params={**GRID, "compress_grid": 216}))
    body = client.get("/v1/configs", params={**QUERY, "kind": "cuda", "sm_count": 54}).json()
    assert body["match"] == "transferred"
    assert body["params"] == {**GRID, "compress_grid": 108}
    assert body["source_key"] == fingerprint_key(A100)
    assert body["warm_start"][0] == body["params"] and len(body["warm_start"]) >= 2


@pytest.mark.parametrize("field, value", [("source_hash", "src-2"), ("kernel", "zvc.cuda.scan"), ("dtype", "float16"),
                                          ("bucket", 13)])
def test_lookup_default_when_nothing_matches(client: TestClient, field: str, value: object) -> None:
    publish(client, make_run())
    body = client.get("/v1/configs", params={**QUERY, field: value, "fingerprint": fingerprint_key(H100)}).json()
    assert body == {"params": None, "time_s": None, "match": "default", "source_key": None, "warm_start": []}


@pytest.mark.parametrize(
    "params, location",
    [
        ({k: v for k, v in QUERY.items() if k != "kernel"} | {"fingerprint": "k"}, ["query", "kernel"]),
        (QUERY, ["query", "fingerprint"]),  # no device at all
        (QUERY | {"fingerprint": "k", "bucket": 64}, ["query", "bucket"]),
        (QUERY | {"fingerprint": "k", "bucket": "12.5"}, ["query", "bucket"]),
        (QUERY | {"fingerprint": "k", "bucket": str(10**40)}, ["query", "bucket"]),
        (QUERY | {"fingerprint": "k", "kernel": "zvc cuda;drop"}, ["query", "kernel"]),
        (QUERY | {"kind": "cuda", "sm_count": 0}, ["query", "sm_count"]),
        (QUERY | {"kind": "CUDA!", "sm_count": 8}, ["query", "kind"]),
    ],
)
def test_lookup_bad_parameters_are_422_naming_the_parameter(client: TestClient, params: dict, location: list) -> None:
    response = client.get("/v1/configs", params=params)
    assert response.status_code == 422
    assert location in [error["loc"] for error in response.json()["detail"]]


def test_lookup_with_odd_unicode_is_answered(client: TestClient) -> None:
    response = client.get("/v1/configs", params={**QUERY, "name": "GPU \x00 \ufffd 😀 \u202e", "kind": "cuda",
                                                 "compute_capability": "9.0", "sm_count": 5})
    assert response.status_code == 200 and response.json()["match"] == "default"


# ----------------------------------------------------------------------------- tuning runs and predictors


def test_tuning_runs_with_every_evaluation(client: TestClient) -> None:
    runs = [make_run(created_at=1.0), make_run(fp=A100, created_at=2.0), make_run(kernel="zvc.cuda.decompress", created_at=3.0)]
    for run in runs:
        publish(client, run)
    body = client.get("/v1/tuning-runs").json()["runs"]
    assert [r["run_id"] for r in body] == [r.run_id for r in runs]
    assert body[0]["evaluations"] == [e.to_dict() for e in runs[0].evaluations]
    assert body[0]["evaluations"][2]["time_s"] is None  # the failed launch
    assert body[0]["fingerprint_key"] == fingerprint_key(H100)
    only_h100 = client.get("/v1/tuning-runs", params={"fingerprint": fingerprint_key(H100), "kernel": KERNEL}).json()
    assert [r["run_id"] for r in only_h100["runs"]] == [runs[0].run_id]
    paged = client.get("/v1/tuning-runs", params={"limit": 1, "offset": 1, "evaluations": False}).json()["runs"]
    assert [(r["run_id"], r["evaluations"]) for r in paged] == [(runs[1].run_id, [])]


def test_one_tuning_run_and_404(client: TestClient) -> None:
    run = make_run()
    publish(client, run)
    body = client.get(f"/v1/tuning-runs/{run.run_id}").json()
    assert {k: v for k, v in body.items() if k != "fingerprint_key"} == run.to_dict()
    missing = client.get("/v1/tuning-runs/nope")
    assert missing.status_code == 404
    assert "no tuning run with id 'nope'" in missing.json()["detail"]


def test_a_run_where_every_launch_failed_round_trips_as_null(client: TestClient) -> None:
    run = make_run(time_s=float("inf"))
    assert publish(client, run).status_code == 201
    assert client.get(f"/v1/tuning-runs/{run.run_id}").json()["best_time_s"] is None
    assert client.get("/v1/configs", params={**QUERY, "fingerprint": fingerprint_key(H100)}).json()["match"] == "default"


def test_predictors(client: TestClient, store: ConfigStore) -> None:
    store.put_model(H100, "compress_time", {"coef": [1.5, -2.0], "intercept": 0.25})
    store.put_model(H100, "keep_classifier", {"threshold": 0.5})
    body = client.get("/v1/predictors", params={"fingerprint": fingerprint_key(H100)}).json()
    assert body == {"fingerprint": fingerprint_key(H100), "models": {
        "compress_time": {"coef": [1.5, -2.0], "intercept": 0.25}, "keep_classifier": {"threshold": 0.5}}}
    missing = client.get("/v1/predictors", params={"fingerprint": "ffffffffffffffff"})
    assert missing.status_code == 404 and "ffffffffffffffff" in missing.json()["detail"]
    assert client.get("/v1/predictors").status_code == 422


# ----------------------------------------------------------------------------- auth


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic czNjcmV0", f"bearer {TOKEN}x", "Bearer \u00e9"])
def test_publish_needs_the_token(secured: TestClient, store: ConfigStore, header: str | None) -> None:
    headers = {"Authorization": header.encode("utf-8")} if header else {}
    response = secured.post("/v1/configs", json=make_run().to_dict(), headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert "bearer token" in response.json()["detail"]
    assert store.runs() == []


def test_publish_with_the_token_and_reads_without(secured: TestClient) -> None:
    run = make_run()
    assert publish(secured, run, token=TOKEN).status_code == 201
    assert secured.get(f"/v1/tuning-runs/{run.run_id}").status_code == 200
    assert secured.get("/v1/devices").status_code == 200


def test_an_empty_token_is_refused(store: ConfigStore) -> None:
    with pytest.raises(ValueError, match="token is empty"):
        create_app(store, token="")


# ----------------------------------------------------------------------------- bad bodies: never a 5xx


def test_a_body_over_one_mib_is_413(client: TestClient, store: ConfigStore) -> None:
    body = make_run().to_dict()
    body["method"] = "x" * MAX_BODY_BYTES
    response = client.post("/v1/configs", content=json.dumps(body), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert store.runs() == []


def _raw(body: dict, **replace: str) -> str:
    """``body`` as JSON with some values replaced by raw JSON text (NaN, huge numbers, escapes)."""
    text = json.dumps({**body, **{k: f"@@{k}@@" for k in replace}})
    for key, raw in replace.items():
        text = text.replace(f'"@@{key}@@"', raw)
    return text


GOOD = make_run().to_dict()
BAD_BODIES = {
    "nan time": _raw(GOOD, best_time_s="NaN"),
    "infinite time": _raw(GOOD, best_time_s="Infinity"),
    "negative time": _raw(GOOD, best_time_s="-1.0"),
    "huge bucket": _raw(GOOD, bucket="1" + "0" * 400),
    "float overflow": _raw(GOOD, wall_s="1e999"),
    "huge param": _raw(GOOD, best_params='{"compress_grid": 100000000000000000000000000000000000000000}'),
    "negative param": _raw(GOOD, best_params='{"compress_grid": -3}'),
    "lone surrogate": _raw(GOOD, fingerprint=json.dumps({**H100}).replace('"NVIDIA', '"\\ud800NVIDIA')),
    "surrogate key": _raw(GOOD, best_params='{"\\udfff": 1}'),
    "bad param name": _raw(GOOD, best_params='{"a b": 1}'),
    "extra field": _raw(GOOD, colour='"red"'),
    "unknown fingerprint field": _raw(GOOD, fingerprint=json.dumps({**H100, "extra": 1})),
    "deep nesting": '{"fingerprint": ' + "[" * 50_000 + "]" * 50_000 + "}",
    "deep nesting unclosed": "[" * 200_000,
    "not json": "{not json",
    "a list": "[1, 2, 3]",
    "a string": '"hello"',
    "empty": "",
    "evaluations not a list": _raw(GOOD, evaluations='{"a": 1}'),
    "evaluation nan": _raw(GOOD, evaluations='[{"params": {"a_grid": 1}, "time_s": NaN}]'),
    "too many params": _raw(GOOD, best_params=json.dumps({f"p{i}": i for i in range(100)})),
    "run id with slash": _raw(GOOD, run_id='"a/b"'),
    "bucket as bool": _raw(GOOD, bucket="true"),
    "created far future": _raw(GOOD, created_at="1e300"),
}


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_bad_bodies_get_a_422_never_a_5xx(client: TestClient, store: ConfigStore, name: str) -> None:
    response = client.post("/v1/configs", content=BAD_BODIES[name], headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert "detail" in response.json()
    assert store.runs() == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"best_params": {"a": 2**40}}, r"best_params \['a'\] are not cuda launch parameters"),
        ({"best_params": {"compress_grid": 2**40}}, r"best_params\['compress_grid'\] is 1099511627776: zvc.cuda.compress allows integers between 1 and 65535"),
        ({"best_params": {"compress_block": 100}}, r"best_params\['compress_block'\] is 100: zvc.cuda.compress allows powers of two between 32 and 1024"),
        ({"best_params": {"chunk_words": 0}}, r"chunk_words is 0"),
        ({"kernel": "zvc.cuda.scan"}, r"kernel 'zvc.cuda.scan' has no launch search space"),
        ({"fingerprint": CPU, "kernel": "zvc.cpu.compress", "best_params": {"threads": 3, "chunk_words": 512}},
         r"best_params\['threads'\] is 3: zvc.cpu.compress allows integers between 1 and 2"),
        ({"fingerprint": CPU, "kernel": "zvc.cpu.compress", "best_params": {"threads": 2, "chunk_words": 100}},
         r"best_params\['chunk_words'\] is 100: zvc.cpu.compress allows powers of two between 16 and 16384"),
    ],
)
def test_configs_outside_the_kernels_search_space_are_422_and_not_stored(
    client: TestClient, store: ConfigStore, overrides: dict, message: str
) -> None:
    response = publish(client, make_run(**overrides))
    assert response.status_code == 422, response.text
    assert re.search(message, response.text), response.text
    assert store.runs() == []


def test_a_config_within_the_search_space_is_stored_as_sent(client: TestClient, store: ConfigStore) -> None:
    run = make_run(fp=CPU, kernel="zvc.cpu.compress", params={"threads": 2, "chunk_words": 512})
    assert publish(client, run).status_code == 201
    assert [r.best_params for r in store.runs()] == [{"threads": 2, "chunk_words": 512}]


def test_validation_errors_name_the_field(client: TestClient) -> None:
    response = client.post("/v1/configs", content=BAD_BODIES["nan time"], headers={"content-type": "application/json"})
    assert response.json()["detail"] == [
        {"type": "value_error", "loc": ["body", "best_time_s"],
         "msg": "Value error, best_time_s is NaN; use a measured time (or inf / null for a config that failed to launch)"}
    ]
    response = client.post("/v1/configs", content=BAD_BODIES["lone surrogate"], headers={"content-type": "application/json"})
    assert [e["loc"] for e in response.json()["detail"]] == [["body", "fingerprint", "name"]]


def test_a_locked_store_is_503_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    store = ConfigStore(path, timeout_s=0.1)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with TestClient(create_app(store)) as client:
            response = client.post("/v1/configs", json=make_run().to_dict())
        assert response.status_code == 503
        assert f"{path} is locked" in response.json()["detail"]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.runs() == []


def test_create_app_over_a_corrupt_file_raises(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"\x00\xff" * 2048)
    with pytest.raises(StoreError, match="not a readable cswap store"):
        create_app(path)
    assert path.read_bytes() == b"\x00\xff" * 2048


def test_create_app_takes_a_path(tmp_path: Path) -> None:
    app = create_app(str(tmp_path / "by-path.db"))
    assert app.state.store.path == tmp_path / "by-path.db"


@pytest.mark.parametrize("body", ["{not json", '{"kernel": ', "[" * 200_000, BAD_BODIES["deep nesting"]])
def test_malformed_json_is_422_as_documented(client: TestClient, body: str) -> None:
    response = client.post("/v1/configs", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["type"] == "json_invalid"
    responses = client.get("/openapi.json").json()["paths"]["/v1/configs"]["post"]["responses"]
    assert "400" not in responses
    assert "json_invalid" in responses["422"]["description"]
    assert "400" not in app_module.__doc__ and "json_invalid" in app_module.__doc__


def test_an_infinite_time_must_arrive_as_null(client: TestClient) -> None:
    response = client.post("/v1/configs", content=BAD_BODIES["infinite time"], headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert "send null for a failed launch" in response.json()["detail"][0]["msg"]


def test_the_service_and_the_store_refuse_with_the_same_message(client: TestClient) -> None:
    body = {**make_run().to_dict(), "bucket": 64}
    with pytest.raises(ValueError) as refused:
        TuningRun.from_dict(body)
    detail = client.post("/v1/configs", json=body).json()["detail"]
    assert detail[0]["loc"] == ["body", "bucket"]
    assert detail[0]["msg"] == "Value error, bucket is 64, must be between 0 and 63"
    assert "bucket is 64, must be between 0 and 63" in str(refused.value)
