"""The tuning service: tuned kernel configs, tuning runs and calibrated models over HTTP.

A thin FastAPI layer over :class:`cswap.tuner.store.ConfigStore`; it answers the same lookups as the
local store, so that a fleet of trainers shares what any of them tuned. It imports neither torch
nor the cswap runtime.

Endpoints (OpenAPI at ``/openapi.json``):

* ``GET /healthz``
* ``GET /v1/devices``: tuned devices and what is stored for each
* ``GET /v1/configs``: the best config for a kernel on a device, and the match used
* ``POST /v1/configs``: publish a tuning run (bearer token when the service has one)
* ``GET /v1/tuning-runs``, ``GET /v1/tuning-runs/{run_id}``: runs with every evaluated point
* ``GET /v1/predictors?fingerprint=KEY``: calibrated models as JSON coefficients

Errors: 422 for bad parameters or bodies, as FastAPI answers them, including a body that is not
parseable JSON (error type ``json_invalid``); 401 for a missing or wrong token, 404 for unknown
ids, 413 for a body over 1 MiB, 503 when the store itself fails (locked, corrupt). Nothing a
client sends gets a 500. Bodies are the store's own records (:mod:`cswap.server.schemas`), so the
service refuses exactly what the store would, with the same messages.

Example:
    >>> from fastapi.testclient import TestClient
    >>> client = TestClient(create_app("/tmp/cswap-doc-server.db"))
    >>> client.get("/healthz").json()["status"]
    'ok'
"""

# No ``from __future__ import annotations``: FastAPI reads the endpoint annotations, which refer
# to closures (the token check) that string annotations could not resolve.

import math
import os
import secrets
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response, status
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

import cswap
from cswap.server.schemas import (
    DeviceOut,
    ErrorOut,
    HealthOut,
    LookupOut,
    LookupQuery,
    PredictorsOut,
    PublishOut,
    RunsOut,
    TuningRunIn,
    TuningRunOut,
)
from cswap.tuner.store import ConfigStore, StoreError

__all__ = ["MAX_BODY_BYTES", "create_app"]

#: Largest request body accepted; larger ones get 413.
MAX_BODY_BYTES = 1 << 20

_KEY = Annotated[str, Query(min_length=1, max_length=64, description="device fingerprint key")]


def _error(code: int, detail: str) -> dict[int | str, dict[str, object]]:
    return {code: {"model": ErrorOut, "description": detail}}


_STORE_DOWN = _error(503, "the store is locked by another process for too long, or unreadable")


def _json_safe(value: Any) -> Any:
    """Non-finite floats -> ``None``, recursively (an echoed NaN must not turn a 422 into a 500)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """OpenAPI ``parameters`` of a query string that an endpoint validates as ``model`` itself."""
    schema = model.model_json_schema()
    required = set(schema.get("required", ()))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": field_schema,
         **({"description": field_schema["description"]} if "description" in field_schema else {})}
        for name, field_schema in schema["properties"].items()
    ]


def _invalid(location: tuple[str, ...], message: str) -> RequestValidationError:
    return RequestValidationError([{"type": "value_error", "loc": location, "msg": message}])


def create_app(store: ConfigStore | str | os.PathLike[str] | None = None, token: str | None = None) -> FastAPI:
    """Build the service over a store.

    Args:
        store: a :class:`ConfigStore`, a path to one, or ``None`` for the default
            (``$CSWAP_HOME/store.db``).
        token: when set, ``POST`` requests need ``Authorization: Bearer <token>``; reads stay open.

    Raises:
        StoreError: the store cannot be opened (corrupt, locked, newer schema).

    Example:
        >>> app = create_app("/tmp/cswap-doc-server.db", token="s3cret")
        >>> app.title
        'cswap tuning service'
    """
    if not isinstance(store, ConfigStore):
        store = ConfigStore(Path(store) if store is not None else None)
    if token is not None and not token:
        raise ValueError("token is empty; pass a non-empty token or None for an open service")
    config_store: ConfigStore = store

    app = FastAPI(
        title="cswap tuning service",
        version=cswap.__version__,
        description="Tuned launch configs of the cswap compression kernels, tuning runs and calibrated models.",
        max_body_size=MAX_BODY_BYTES,
    )
    app.state.store = config_store
    bearer = HTTPBearer(auto_error=False, description="Needed for POST when the service was started with a token.")

    def require_token(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
        if token is None:
            return
        given = credentials.credentials if credentials is not None else ""
        if not secrets.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode("utf-8", "surrogatepass")):
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                detail="this service needs a bearer token to publish: send 'Authorization: Bearer <token>' "
                "(cswap: --token or CSWAP_SERVER_TOKEN)",
                headers={"WWW-Authenticate": "Bearer"},
            )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        # The submitted value is not echoed back: it may be large, or hold NaN that JSON cannot carry.
        errors = [{k: v for k, v in error.items() if k not in ("input", "url")} for error in exc.errors()]
        for error in errors:  # the exception behind a value error is its message again, and not JSON
            if isinstance(error.get("ctx"), dict):
                error["ctx"] = {k: v for k, v in error["ctx"].items() if k != "error"} or None
                if error["ctx"] is None:
                    del error["ctx"]
        return JSONResponse(
            {"detail": _json_safe(jsonable_encoder(errors))}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # FastAPI answers a body its JSON parser gave up on (nested too deeply) with a bare 400, but
        # other malformed JSON with 422 json_invalid; every malformed body gets the 422 here.
        if exc.status_code == status.HTTP_400_BAD_REQUEST:
            error = {"type": "json_invalid", "loc": ["body"], "msg": f"JSON decode error: {exc.detail}"}
            return JSONResponse({"detail": [error]}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)
        return await http_exception_handler(request, exc)

    @app.exception_handler(StoreError)
    async def _store_error(request: Request, exc: StoreError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_503_SERVICE_UNAVAILABLE)

    @app.get("/healthz", response_model=HealthOut, tags=["service"])
    async def healthz() -> HealthOut:
        """Liveness: answers while the process serves requests."""
        return HealthOut(version=cswap.__version__)

    @app.get("/v1/devices", response_model=list[DeviceOut], tags=["devices"], responses=_STORE_DOWN)
    def devices() -> list[DeviceOut]:
        """Every tuned device, with how many best configs, runs and models are stored for it."""
        return [DeviceOut.model_validate(d) for d in config_store.devices()]

    @app.get(
        "/v1/configs",
        response_model=LookupOut,
        tags=["configs"],
        responses=_STORE_DOWN,
        openapi_extra={"parameters": _query_parameters(LookupQuery)},
    )
    # The hot path. It runs on the event loop: a WAL read never waits for writers and takes ~0.1 ms,
    # less than the hop to a worker thread. Its query is validated as one model rather than as ten
    # FastAPI parameters, which took longer than the lookup itself (see benchmarks/server.py).
    async def get_config(request: Request) -> LookupOut:
        """The best config for ``kernel`` on a device: exact, same-model, transferred, or default.

        Identify the device by its key (``fingerprint``) and/or its fields; the fields let a device
        the service has never seen get a same-model (``name``, ``compute_capability``, ``sm_count``)
        or transferred (``kind``, ``sm_count``) config. With no config anywhere, ``match`` is
        ``default`` and ``params`` null: the caller uses its own default.
        """
        try:
            query = LookupQuery.model_validate(dict(request.query_params))
        except ValidationError as exc:
            raise RequestValidationError([{**e, "loc": ("query", *e["loc"])} for e in exc.errors()]) from None
        if query.fingerprint is None and query.kind is None and query.name is None and query.sm_count is None:
            raise _invalid(
                ("query", "fingerprint"),
                "no device given: pass fingerprint=<device key> and/or kind, name, compute_capability, sm_count",
            )
        result = config_store.lookup_by(
            query.kernel, query.source_hash, query.dtype, query.bucket, key=query.fingerprint, kind=query.kind,
            name=query.name, compute_capability=query.compute_capability, sm_count=query.sm_count,
            memory_bytes=query.memory_bytes,
        )
        return result

    @app.post(
        "/v1/configs",
        response_model=PublishOut,
        status_code=status.HTTP_201_CREATED,
        tags=["configs"],
        responses={
            200: {"model": PublishOut, "description": "a run with this id was already stored; nothing changed"},
            422: {
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}},
                "description": "a field is invalid (the error names it), or the body is not parseable JSON "
                "(error type json_invalid)",
            },
            **_error(401, "a token is needed and was missing or wrong"),
            **_error(413, "body over 1 MiB"),
            **_STORE_DOWN,
        },
    )
    def publish(run: TuningRunIn, response: Response, _auth: Annotated[None, Depends(require_token)]) -> PublishOut:
        """Publish a tuning run: stores it with every evaluation and updates the best config if faster.

        Idempotent: publishing the same ``run_id`` again answers 200 and changes nothing.
        """
        record = run.to_run()
        created = config_store.record_run(record)
        if not created:
            response.status_code = status.HTTP_200_OK
        return PublishOut(run_id=record.run_id, fingerprint_key=record.fingerprint_key, created=created)

    @app.get("/v1/tuning-runs", response_model=RunsOut, tags=["tuning runs"], responses=_STORE_DOWN)
    def tuning_runs(
        fingerprint: Annotated[str | None, Query(min_length=1, max_length=64, description="device key")] = None,
        kernel: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
        evaluations: Annotated[bool, Query(description="include every evaluated point")] = True,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0, le=1 << 62)] = 0,
    ) -> RunsOut:
        """Tuning runs, oldest first, with every evaluated point (for convergence plots)."""
        runs = config_store.runs(fingerprint, kernel, with_evaluations=evaluations, limit=limit, offset=offset)
        return RunsOut(runs=[r for r in runs])

    @app.get(
        "/v1/tuning-runs/{run_id}",
        response_model=TuningRunOut,
        tags=["tuning runs"],
        responses={**_error(404, "no run with this id"), **_STORE_DOWN},
    )
    def tuning_run(run_id: str) -> TuningRunOut:
        """One tuning run with every evaluated point."""
        run = config_store.run(run_id)
        if run is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no tuning run with id {run_id!r}; see GET /v1/tuning-runs")
        return run

    @app.get(
        "/v1/predictors",
        response_model=PredictorsOut,
        tags=["predictors"],
        responses={**_error(404, "no device with this key"), **_STORE_DOWN},
    )
    async def predictors(fingerprint: _KEY) -> PredictorsOut:
        """Calibrated (de)compression-time models of a device, as JSON coefficients."""
        if config_store.device(fingerprint) is None:
            raise HTTPException(
                status.HTTP_404_NOT_FOUND, detail=f"no device with key {fingerprint!r}; see GET /v1/devices"
            )
        return PredictorsOut(fingerprint=fingerprint, models=config_store.models(fingerprint))

    return app
