"""Request and response bodies of the tuning service: the store's own records, plus what only HTTP needs.

The records are validated once, in :mod:`cswap.tuner.records` and :mod:`cswap.tuner.fingerprints`:
``POST /v1/configs`` takes a :class:`cswap.tuner.records.TuningRun` (as :class:`TuningRunIn`, which
adds the one rule only JSON needs: a failed launch is ``null``, never ``Infinity``), and the
answers are :class:`~cswap.tuner.records.LookupResult`, :class:`~cswap.tuner.records.Evaluation`
and a stored run with its device key. A value the store would refuse is answered with a 422
naming the field, with the store's own message.

This module imports neither torch nor the cswap runtime.

Example:
    >>> body = TuningRunIn.model_validate({
    ...     "fingerprint": {"kind": "cpu", "name": "x", "compute_capability": "", "sm_count": 2,
    ...                     "memory_bytes": 0},
    ...     "kernel": "zvc.cpu.compress", "source_hash": "abc", "dtype": "float32", "bucket": 10,
    ...     "method": "grid", "best_params": {"threads": 2}, "best_time_s": None})
    >>> body.to_run().best_time_s
    inf
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from cswap.tuner.fingerprints import Fingerprint
from cswap.tuner.records import Evaluation, LookupResult, Name, TuningRun
from cswap.tuner.space import check_launch_params
from cswap.tuner.validation import INT32_MAX, INT64_MAX, MAX_BUCKET, check_seconds

__all__ = [
    "DeviceOut",
    "ErrorOut",
    "Evaluation",
    "Fingerprint",
    "HealthOut",
    "LookupOut",
    "LookupQuery",
    "PredictorsOut",
    "PublishOut",
    "RunsOut",
    "TuningRunIn",
    "TuningRunOut",
]

#: ``GET /v1/configs`` answers the store's :class:`LookupResult` as is.
LookupOut = LookupResult


def _finite_on_the_wire(value: Any, what: str) -> Any:
    if isinstance(value, float) and math.isinf(value):
        raise ValueError(f"{what} must be a finite number of seconds; JSON has no infinity: send null for a failed launch")
    return value


class TuningRunIn(TuningRun):
    """A finished tuning run, as published by ``cswap tune`` or ``cswap configs push``.

    The store's :class:`TuningRun` with two rules more, because what the service stores it serves
    to other machines: a time that is not finite must arrive as ``null`` (``Infinity`` and ``NaN``
    are not JSON), and ``best_params`` must be a launch config of ``kernel`` within its search space
    (:func:`cswap.tuner.space.check_launch_params`; a CPU's ``high: cores`` is its fingerprint's).
    """

    @model_validator(mode="after")
    def _launchable(self) -> TuningRunIn:
        cores = self.fingerprint.get("sm_count") if self.fingerprint.get("kind") == "cpu" else None
        check_launch_params(self.kernel, self.best_params, cores=cores)
        return self

    @field_validator("best_time_s", mode="before")
    @classmethod
    def _best_time(cls, value: Any) -> float:
        return check_seconds(_finite_on_the_wire(value, "best_time_s"), "best_time_s", allow_inf=True)

    @field_validator("evaluations", mode="before")
    @classmethod
    def _finite_evaluations(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            for index, entry in enumerate(value):
                if isinstance(entry, Mapping):
                    _finite_on_the_wire(entry.get("time_s"), f"evaluations[{index}].time_s")
        return value

    def to_run(self) -> TuningRun:
        """The store record.

        Example:
            >>> TuningRunIn(fingerprint={"kind": "cpu", "name": "x", "compute_capability": "", "sm_count": 2,
            ...                          "memory_bytes": 0}, kernel="zvc.cpu.compress", source_hash="s", dtype="float32",
            ...             bucket=1, method="bo", best_params={}, best_time_s=1.0).to_run().method
            'bo'
        """
        return TuningRun.model_validate(dict(self))


#: A stored run as the service answers it: the store's record, with its device key.
TuningRunOut = TuningRun


class HealthOut(BaseModel):
    """``GET /healthz``."""

    status: Literal["ok"] = "ok"
    api: str = "v1"
    version: str


class DeviceOut(BaseModel):
    """A tuned device and how much is stored for it."""

    key: str
    fingerprint: Fingerprint
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


class PublishOut(BaseModel):
    """``POST /v1/configs``."""

    run_id: str
    fingerprint_key: str
    created: bool = Field(description="false when a run with this id was already stored")


class RunsOut(BaseModel):
    """``GET /v1/tuning-runs``."""

    runs: list[TuningRunOut]


class PredictorsOut(BaseModel):
    """``GET /v1/predictors``: calibrated models of one device, by name."""

    fingerprint: str
    models: dict[str, dict[str, Any]]


class ErrorOut(BaseModel):
    """Error body of 400, 401, 404, 413 and 503 answers."""

    detail: str
