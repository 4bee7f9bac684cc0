"""Request and response bodies of the tuning service (pydantic), and their conversion to store records.

Requests are strict (names restricted to safe characters, numbers bounded, no NaN or infinity,
no unknown fields) so that anything a client sends is either stored as given or answered with a
422 naming the field. Responses are permissive: they describe what the store holds.

JSON has no infinity, so a time of ``null`` means "failed to launch" (``math.inf`` in the store).

Example:
    >>> body = TuningRunIn.model_validate({
    ...     "fingerprint": {"kind": "cpu", "name": "x", "compute_capability": "", "sm_count": 2,
    ...                     "memory_bytes": 0},
    ...     "kernel": "zvc.cpu.compress", "source_hash": "abc", "dtype": "float32", "bucket": 10,
    ...     "method": "grid", "best_params": {"threads": 2}, "best_time_s": 0.01})
    >>> body.to_run().best_params
    {'threads': 2}
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from cswap.tuner.store import LookupResult, TuningRun

__all__ = [
    "DeviceOut",
    "ErrorOut",
    "EvaluationIn",
    "EvaluationOut",
    "FingerprintIn",
    "HealthOut",
    "LookupOut",
    "LookupQuery",
    "PredictorsOut",
    "PublishOut",
    "RunsOut",
    "TuningRunIn",
    "TuningRunOut",
]

MAX_BUCKET = 63
MAX_EVALUATIONS = 10_000
MAX_PARAMS = 64
INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1


def _utf8(value: str) -> str:
    # JSON escapes can smuggle lone surrogates in; SQLite (UTF-8) cannot store them.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not valid Unicode text (lone surrogate at index {exc.start})") from None
    return value


#: Identifier-like names: kernels, hashes, dtypes, methods, run ids, parameter names.
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:+\-]+$")]
#: Free text (device names, driver versions).
Text = Annotated[str, Field(max_length=256), AfterValidator(_utf8)]
# Strict: a JSON true or "12" is not an integer here.
ParamValue = Annotated[int, Field(ge=0, le=INT32_MAX, strict=True)]
Params = Annotated[dict[Name, ParamValue], Field(max_length=MAX_PARAMS)]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
#: Seconds, or null for a config that failed to launch.
SecondsOrFailed = Annotated[float | None, Field(ge=0, allow_inf_nan=False)]
Bucket = Annotated[int, Field(ge=0, le=MAX_BUCKET, strict=True)]
Match = Literal["exact", "same-model", "transferred", "default"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FingerprintIn(_Strict):
    """A device, as ``DeviceFingerprint.to_dict()`` writes it."""

    kind: Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9_\-]*$")] = Field(
        description="cuda or cpu", examples=["cuda"]
    )
    name: Text = Field(description="GPU or CPU model name", examples=["NVIDIA H100 80GB HBM3"])
    compute_capability: Annotated[str, Field(max_length=16, pattern=r"^[0-9.]*$")] = Field(examples=["9.0"])
    sm_count: Annotated[int, Field(ge=1, le=INT32_MAX, strict=True)] = Field(description="SMs on GPU, cores on CPU")
    memory_bytes: Annotated[int, Field(ge=0, le=INT64_MAX, strict=True)]
    driver: Text = ""
    cuda: Text = ""


class EvaluationIn(_Strict):
    """One evaluated launch config."""

    params: Params
    time_s: SecondsOrFailed = Field(description="kernel time in seconds; null when the config failed to launch")


class TuningRunIn(_Strict):
    """A finished tuning run, as published by ``cswap tune`` or ``cswap configs push``."""

    run_id: Name = Field(default_factory=lambda: uuid.uuid4().hex, description="publishing the same id twice is a no-op")
    fingerprint: FingerprintIn
    kernel: Name = Field(examples=["zvc.cuda.compress"])
    source_hash: Name
    dtype: Name = Field(examples=["float32"])
    bucket: Bucket = Field(description="floor(log4(tensor bytes))")
    method: Name = Field(examples=["bo"])
    best_params: Params
    best_time_s: SecondsOrFailed = Field(description="null when every config failed")
    evaluations: Annotated[list[EvaluationIn], Field(max_length=MAX_EVALUATIONS)] = []
    wall_s: Seconds = 0.0
    created_at: Annotated[float, Field(ge=0, le=1e11, allow_inf_nan=False)] = Field(default_factory=time.time)

    def to_run(self) -> TuningRun:
        """The store record (raises ``ValueError`` if the store's own checks reject it)."""
        data = self.model_dump()
        return TuningRun.from_dict(data)


class HealthOut(BaseModel):
    """``GET /healthz``."""

    status: Literal["ok"] = "ok"
    api: str = "v1"
    version: str


class DeviceOut(BaseModel):
    """A tuned device and how much is stored for it."""

    key: str
    fingerprint: dict[str, Any]
    configs: int
    runs: int
    models: int


class LookupQuery(BaseModel):
    """Query of ``GET /v1/configs``: what the config is for, and the device (its key and/or fields)."""

    kernel: Name = Field(examples=["zvc.cuda.compress"])
    source_hash: Name = Field(description="hash of the kernel source")
    dtype: Name = Field(examples=["float32"])
    bucket: Annotated[int, Field(ge=0, le=MAX_BUCKET)] = Field(description="floor(log4(tensor bytes))")
    fingerprint: Annotated[str | None, Field(min_length=1, max_length=64)] = Field(None, description="device key")
    kind: Annotated[str | None, Field(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9_\-]*$")] = None
    name: Annotated[str | None, Field(min_length=1, max_length=256)] = Field(None, description="device model name")
    compute_capability: Annotated[str | None, Field(max_length=16, pattern=r"^[0-9.]*$")] = None
    sm_count: Annotated[int | None, Field(ge=1, le=INT32_MAX)] = None
    memory_bytes: Annotated[int | None, Field(ge=0, le=INT64_MAX)] = None


class LookupOut(BaseModel):
    """The config to use, and how it was found (the same lookup as ``ConfigStore.lookup``)."""

    params: dict[str, int] | None
    time_s: float | None
    match: Match
    source_key: str | None = Field(description="fingerprint key of the device the config came from")
    warm_start: list[dict[str, int]] = Field(description="for transferred: scaled configs to seed a search with")

    @classmethod
    def from_result(cls, result: LookupResult) -> LookupOut:
        """From the store's answer."""
        return cls.model_validate(result.to_dict())

    def to_result(self) -> LookupResult:
        """Back to the store's type."""
        return LookupResult.from_dict(self.model_dump())


class PublishOut(BaseModel):
    """``POST /v1/configs``."""

    run_id: str
    fingerprint_key: str
    created: bool = Field(description="false when a run with this id was already stored")


class EvaluationOut(BaseModel):
    """One evaluated config; ``time_s`` null when it failed to launch."""

    params: dict[str, int]
    time_s: float | None


class TuningRunOut(BaseModel):
    """A stored tuning run; ``best_time_s`` and evaluation times are null for failures."""

    run_id: str
    fingerprint_key: str
    fingerprint: dict[str, Any]
    kernel: str
    source_hash: str
    dtype: str
    bucket: int
    method: str
    best_params: dict[str, int]
    best_time_s: float | None
    evaluations: list[EvaluationOut]
    wall_s: float
    created_at: float

    @classmethod
    def from_run(cls, run: TuningRun) -> TuningRunOut:
        """From a store record (infinities become null)."""
        return cls.model_validate({**run.to_dict(), "fingerprint_key": run.fingerprint_key})

    def to_run(self) -> TuningRun:
        """Back to a store record."""
        data = self.model_dump()
        data.pop("fingerprint_key")
        return TuningRun.from_dict(data)


class RunsOut(BaseModel):
    """``GET /v1/tuning-runs``."""

    runs: list[TuningRunOut]


class PredictorsOut(BaseModel):
    """``GET /v1/predictors``: calibrated models of one device, by name."""

    fingerprint: str
    models: dict[str, dict[str, Any]]


class ErrorOut(BaseModel):
    """Error body of 401, 404, 413 and 503 answers."""

    detail: str

