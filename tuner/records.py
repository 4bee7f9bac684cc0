"""The records the store keeps and the tuning service exchanges: one set of pydantic models.

:class:`Evaluation`, :class:`TuningRun` and :class:`LookupResult` are validated once, here: the
store builds them from its rows and from imports, and the service takes :class:`TuningRun` as its
request body and answers with these models (``cswap.server.schemas`` re-uses them rather than
mirroring them). A bad value raises ``ValueError`` (pydantic's ``ValidationError``) naming the
field, in Python and as a 422 over HTTP alike.

Times are seconds; ``math.inf`` marks a config that failed to launch. JSON has no infinity, so
``to_dict`` (the wire format) writes it as ``null``, and ``null`` reads back as ``inf``.

This module imports neither torch nor the cswap runtime.

Example:
    >>> run = TuningRun(fingerprint={"kind": "cpu", "name": "x", "compute_capability": "",
    ...                              "sm_count": 2, "memory_bytes": 0},
    ...                 kernel="zvc.cpu.compress", source_hash="h", dtype="float32", bucket=10,
    ...                 method="grid", best_params={"threads": 2}, best_time_s=0.01,
    ...                 evaluations=(Evaluation({"threads": 1}, 0.02), Evaluation({"threads": 2}, 0.01)))
    >>> TuningRun.from_dict(run.to_dict()) == run
    True
"""

from __future__ import annotations

import math
import numbers
import time
import uuid
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, computed_field, field_validator

from cswap.tuner.fingerprints import Fingerprint, fingerprint_key, normalize_fingerprint
from cswap.tuner.validation import (
    INT64_MAX,
    MAX_BUCKET,
    check_integer,
    check_params,
    check_seconds,
    check_text,
    json_seconds,
)

__all__ = [
    "MATCHES",
    "MAX_EVALUATIONS",
    "MAX_PARAMS",
    "Evaluation",
    "LookupResult",
    "Match",
    "TuningRun",
    "size_bucket",
]

#: How a :class:`LookupResult` was found, best first.
MATCHES: tuple[str, ...] = ("exact", "same-model", "transferred", "default")
Match = Literal["exact", "same-model", "transferred", "default"]
MAX_EVALUATIONS = 10_000
MAX_PARAMS = 64
_NAME_PATTERN = r"^[A-Za-z0-9_.:+\-]+$"


def size_bucket(nbytes: int) -> int:
    """The power-of-4 size bucket of a tensor: ``floor(log4(max(nbytes, 1)))``.

    Kernel speed changes smoothly with size, so configs are tuned and stored per bucket.

    Args:
        nbytes: the tensor's size in bytes.

    Example:
        >>> size_bucket(16 << 20)
        12
        >>> size_bucket(0), size_bucket(3), size_bucket(4)
        (0, 0, 1)
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral):
        raise TypeError(f"size_bucket takes a byte count (int), got {type(nbytes).__name__} {nbytes!r}")
    return (max(int(nbytes), 1).bit_length() - 1) // 2


def _params_of(what: str) -> Any:
    return BeforeValidator(lambda value: check_params(value, what))


#: A launch config ``{name: int}`` (JSON schema: identifier-like names, non-negative ints).
Params = Annotated[
    dict[Annotated[str, Field(min_length=1, max_length=128, pattern=_NAME_PATTERN)], Annotated[int, Field(ge=0, le=INT64_MAX)]],
    Field(max_length=MAX_PARAMS),
]
#: Seconds; ``inf`` (``null`` in JSON) for a config that failed to launch.
SecondsOrFailed = Annotated[
    float, WithJsonSchema({"anyOf": [{"type": "number", "minimum": 0}, {"type": "null"}]}),
]
#: An identifier-like name: kernels, hashes, dtypes, methods, run ids.
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=_NAME_PATTERN)]
_RECORD = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="null")


class Evaluation(BaseModel):
    """One evaluated launch config of a tuning run.

    Args:
        params: the launch config, ``{name: int}``.
        time_s: measured kernel time in seconds; ``math.inf`` (or ``None``) for a config that failed to launch.

    Example:
        >>> Evaluation({"compress_grid": 64}, math.inf).failed
        True
    """

    model_config = _RECORD

    params: Annotated[Params, _params_of("evaluation params")]
    time_s: SecondsOrFailed = Field(description="kernel time in seconds; null when the config failed to launch")

    def __init__(self, params: Any = None, time_s: Any = None, /, **data: Any) -> None:
        if params is not None:
            data["params"] = params
        if time_s is not None or "time_s" not in data:
            data["time_s"] = time_s
        super().__init__(**data)

    @field_validator("time_s", mode="before")
    @classmethod
    def _time(cls, value: Any) -> float:
        return check_seconds(value, "evaluation time_s", allow_inf=True)

    @property
    def failed(self) -> bool:
        """Whether the config failed to launch (its time is infinite)."""
        return math.isinf(self.time_s)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; an infinite time becomes ``None``."""
        return {"params": dict(self.params), "time_s": json_seconds(self.time_s)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Evaluation:
        """Inverse of :meth:`to_dict` (``time_s`` ``None`` means ``inf``)."""
        if not isinstance(data, Mapping) or "params" not in data:
            raise ValueError(f"an evaluation must be a dict with params and time_s, got {data!r:.80}")
        return cls.model_validate({"time_s": None, **data})


def _evaluations(value: Any) -> Any:
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise ValueError(f"evaluations must be a sequence of Evaluation, got {type(value).__name__}")
    return tuple(e if isinstance(e, Evaluation) else Evaluation.from_dict(e) for e in value)


def _text_of(what: str, max_len: int = 256) -> Any:
    return BeforeValidator(lambda value: check_text(value, what, max_len=max_len))


class TuningRun(BaseModel):
    """One tuning search for one (device, kernel, source hash, dtype, size bucket), and its result.

    Construct by keyword. ``run_id`` is a fresh uuid4 hex unless given; recording or publishing
    the same ``run_id`` twice is a no-op, which makes retries safe. The service's ``POST
    /v1/configs`` body is this model.

    Args:
        run_id: unique id of the run.
        fingerprint: the device, ``DeviceFingerprint.to_dict()`` (a ``DeviceFingerprint`` is converted).
        kernel: what was tuned, e.g. ``"zvc.cuda.compress"``.
        source_hash: hash of the kernel's source; configs tuned for another source are never reused.
        dtype: ``"float32"``, ``"bfloat16"``, ...
        bucket: :func:`size_bucket` of the tensor size it was tuned for.
        method: ``"bo"``, ``"grid"``, ``"random"``, ``"expert"``, ``"transfer"``, ...
        best_params: the fastest config found.
        best_time_s: its time in seconds (``inf`` when every config failed).
        evaluations: every evaluated point, in the order evaluated.
        wall_s: wall-clock seconds the search took.
        created_at: unix seconds.

    Example:
        >>> run = TuningRun(fingerprint={"kind": "cpu", "name": "x", "compute_capability": "",
        ...                              "sm_count": 2, "memory_bytes": 0},
        ...                 kernel="zvc.cpu.compress", source_hash="h", dtype="float32", bucket=10,
        ...                 method="grid", best_params={"threads": 2}, best_time_s=0.01)
        >>> run.fingerprint_key
        '0243cabd96bab5e2'
    """

    model_config = _RECORD

    run_id: Annotated[Name, _text_of("run_id", 128)] = Field(
        default_factory=lambda: uuid.uuid4().hex, description="publishing the same id twice is a no-op"
    )
    fingerprint: Annotated[
        dict[str, Any], BeforeValidator(normalize_fingerprint), WithJsonSchema(Fingerprint.model_json_schema())
    ]
    kernel: Annotated[Name, _text_of("kernel")] = Field(examples=["zvc.cuda.compress"])
    source_hash: Annotated[Name, _text_of("source_hash")]
    dtype: Annotated[Name, _text_of("dtype")] = Field(examples=["float32"])
    bucket: Annotated[int, Field(ge=0, le=MAX_BUCKET), BeforeValidator(lambda v: check_integer(v, "bucket", 0, MAX_BUCKET))] = (
        Field(description="floor(log4(tensor bytes))")
    )
    method: Annotated[Name, _text_of("method")] = Field(examples=["bo"])
    best_params: Annotated[Params, _params_of("best_params")]
    best_time_s: SecondsOrFailed = Field(description="null when every config failed")
    evaluations: Annotated[tuple[Evaluation, ...], Field(max_length=MAX_EVALUATIONS), BeforeValidator(_evaluations)] = ()
    wall_s: Annotated[float, Field(ge=0)] = 0.0
    created_at: Annotated[float, Field(ge=0, le=1e11)] = Field(default_factory=time.time, description="unix seconds")

    @field_validator("best_time_s", mode="before")
    @classmethod
    def _best_time(cls, value: Any) -> float:
        return check_seconds(value, "best_time_s", allow_inf=True)

    @field_validator("wall_s", "created_at", mode="before")
    @classmethod
    def _finite_seconds(cls, value: Any, info: Any) -> float:
        return check_seconds(value, info.field_name, allow_inf=False)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fingerprint_key(self) -> str:
        """Key of the device the run was made on (answered by the service, never read from input)."""
        return fingerprint_key(self.fingerprint)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the wire format of the service); infinite times become ``None``."""
        return {
            "run_id": self.run_id,
            "fingerprint": dict(self.fingerprint),
            "kernel": self.kernel,
            "source_hash": self.source_hash,
            "dtype": self.dtype,
            "bucket": self.bucket,
            "method": self.method,
            "best_params": dict(self.best_params),
            "best_time_s": json_seconds(self.best_time_s),
            "evaluations": [e.to_dict() for e in self.evaluations],
            "wall_s": self.wall_s,
            "created_at": self.created_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TuningRun:
        """Inverse of :meth:`to_dict`; raises ``ValueError`` naming a missing or bad field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a tuning run must be a JSON object, got {type(data).__name__}")
        required = ("fingerprint", "kernel", "source_hash", "dtype", "bucket", "method", "best_params", "best_time_s")
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"tuning run is missing {', '.join(missing)}")
        unknown = sorted(set(data) - set(cls.model_fields) - {"fingerprint_key"})
        if unknown:
            raise ValueError(f"tuning run has unknown fields {', '.join(map(str, unknown))}")
        # The service answers runs with their device key; it is derived, so it must agree.
        fields = {name: value for name, value in data.items() if name != "fingerprint_key"}
        run = cls.model_validate(fields)
        if "fingerprint_key" in data and data["fingerprint_key"] != run.fingerprint_key:
            raise ValueError(
                f"tuning run has fingerprint_key {data['fingerprint_key']!r} but its fingerprint's key is "
                f"{run.fingerprint_key!r}"
            )
        return run


class LookupResult(BaseModel):
    """The config to use for a kernel on a device, and how it was found (``GET /v1/configs`` answers this).

    Args:
        params: the launch config; ``None`` only when ``match == "default"`` and no default was given.
        time_s: the stored time of that config (measured on ``source_key``'s device), or ``None``.
        match: ``"exact"`` (this device), ``"same-model"`` (another device of the same model),
            ``"transferred"`` (nearest tuned device of the same kind, grids scaled by the SM
            ratio), or ``"default"``.
        source_key: fingerprint key of the device the config came from.
        warm_start: for ``"transferred"``, scaled configs to seed a Bayesian search with.

    Example:
        >>> LookupResult({"threads": 2}, 0.01, "exact", "0243cabd96bab5e2").to_dict()["match"]
        'exact'
    """

    model_config = ConfigDict(frozen=True)

    params: dict[str, int] | None
    time_s: float | None
    match: Match
    source_key: str | None = Field(description="fingerprint key of the device the config came from")
    warm_start: tuple[dict[str, int], ...] = Field(
        (), description="for transferred: scaled configs to seed a search with"
    )

    def __init__(self, params: Any = None, time_s: Any = None, match: Any = None, source_key: Any = None,
                 warm_start: Any = (), /, **data: Any) -> None:
        positional = {"params": params, "time_s": time_s, "match": match, "source_key": source_key,
                      "warm_start": warm_start}
        super().__init__(**{**positional, **data})

    @field_validator("match", mode="before")
    @classmethod
    def _match(cls, value: Any) -> str:
        if value not in MATCHES:
            raise ValueError(f"match must be one of {', '.join(MATCHES)}, got {value!r}")
        return value

    @field_validator("params", mode="before")
    @classmethod
    def _params(cls, value: Any) -> dict[str, int] | None:
        return None if value is None else check_params(value, "params")

    @field_validator("warm_start", mode="before")
    @classmethod
    def _warm_start(cls, value: Any) -> tuple[dict[str, int], ...]:
        return tuple(check_params(p, "warm_start") for p in value or ())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "params": None if self.params is None else dict(self.params),
            "time_s": self.time_s,
            "match": self.match,
            "source_key": self.source_key,
            "warm_start": [dict(p) for p in self.warm_start],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LookupResult:
        """Inverse of :meth:`to_dict`."""
        return cls.model_validate(dict(data))
