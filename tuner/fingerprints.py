"""Device fingerprints as the store and the tuning service see them: one pydantic model and its key.

A fingerprint says which device a config was tuned on. It is a plain dict everywhere outside
this module (``DeviceFingerprint.to_dict()``); a ``DeviceFingerprint`` is accepted wherever a dict
is. :class:`Fingerprint` is the one definition of a valid fingerprint: the store validates
through it and the service takes it as its request body, so both refuse the same inputs with the
same messages. This module imports neither torch nor the cswap runtime.

Example:
    >>> fp = {"kind": "cpu", "name": "x", "compute_capability": "", "sm_count": 2, "memory_bytes": 0}
    >>> normalize_fingerprint(fp)["driver"], fingerprint_key(fp)
    ('', '0243cabd96bab5e2')
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cswap.tuner.validation import INT32_MAX, INT64_MAX, check_integer, check_text

if TYPE_CHECKING:
    from cswap.device import DeviceFingerprint

__all__ = ["REQUIRED_FIELDS", "Fingerprint", "FingerprintLike", "fingerprint_key", "normalize_fingerprint"]

#: Fields a fingerprint must have; ``driver`` and ``cuda`` default to ``""``.
REQUIRED_FIELDS: tuple[str, ...] = ("kind", "name", "compute_capability", "sm_count", "memory_bytes")

FingerprintLike = Union["DeviceFingerprint", Mapping[str, Any]]


class Fingerprint(BaseModel):
    """A device, as ``DeviceFingerprint.to_dict()`` writes it (unknown fields are refused).

    Example:
        >>> Fingerprint.model_validate({"kind": "cuda", "name": "NVIDIA L4", "compute_capability": "8.9",
        ...                             "sm_count": 58, "memory_bytes": 24 << 30}).sm_count
        58
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9_\-]*$")] = Field(
        description="cuda or cpu", examples=["cuda"]
    )
    name: Annotated[str, Field(max_length=256)] = Field(
        description="GPU or CPU model name", examples=["NVIDIA H100 80GB HBM3"]
    )
    compute_capability: Annotated[str, Field(max_length=16, pattern=r"^[0-9.]*$")] = Field(examples=["9.0"])
    sm_count: Annotated[int, Field(ge=1, le=INT32_MAX)] = Field(description="SMs on GPU, cores on CPU")
    memory_bytes: Annotated[int, Field(ge=0, le=INT64_MAX)]
    driver: Annotated[str, Field(max_length=256)] = ""
    cuda: Annotated[str, Field(max_length=256)] = ""

    @model_validator(mode="before")
    @classmethod
    def _complete(cls, data: Any) -> Any:
        if hasattr(data, "to_dict") and not isinstance(data, Mapping):
            data = data.to_dict()
        if not isinstance(data, Mapping):
            raise ValueError(
                f"fingerprint must be a dict (DeviceFingerprint.to_dict()) or a DeviceFingerprint, "
                f"got {type(data).__name__}"
            )
        missing = [name for name in REQUIRED_FIELDS if name not in data]
        if missing:
            raise ValueError(
                f"fingerprint is missing {', '.join(missing)}; pass cswap.device.fingerprint(device).to_dict()"
            )
        return data

    @field_validator("kind", "name", "compute_capability", "driver", "cuda", mode="before")
    @classmethod
    def _text(cls, value: Any, info: Any) -> str:
        return check_text(value, f"fingerprint {info.field_name}", allow_empty=info.field_name != "kind", max_len=256)

    @field_validator("sm_count", mode="before")
    @classmethod
    def _sm_count(cls, value: Any) -> int:
        return check_integer(value, "fingerprint sm_count", 1, INT32_MAX)

    @field_validator("memory_bytes", mode="before")
    @classmethod
    def _memory_bytes(cls, value: Any) -> int:
        return check_integer(value, "fingerprint memory_bytes", 0, INT64_MAX)


def normalize_fingerprint(fingerprint: FingerprintLike | Fingerprint) -> dict[str, Any]:
    """A validated plain-dict fingerprint, with ``driver`` and ``cuda`` defaulted to ``""``.

    Args:
        fingerprint: a ``DeviceFingerprint``, its ``to_dict()`` form, or a :class:`Fingerprint`.

    Raises:
        ValueError: a field is missing, unknown, or has the wrong type, naming it.

    Example:
        >>> normalize_fingerprint({"kind": "cpu", "name": "x", "compute_capability": "", "sm_count": 2,
        ...                        "memory_bytes": 0})["cuda"]
        ''
    """
    if isinstance(fingerprint, Fingerprint):
        return fingerprint.model_dump()
    return Fingerprint.model_validate(fingerprint).model_dump()


def fingerprint_key(fingerprint: FingerprintLike | Fingerprint) -> str:
    """The device key: the same 16-hex-digit hash as ``DeviceFingerprint.key``.

    Example:
        >>> fingerprint_key({"kind": "cpu", "name": "x", "compute_capability": "", "sm_count": 2,
        ...                  "memory_bytes": 0})
        '0243cabd96bab5e2'
    """
    key = getattr(fingerprint, "key", None)
    if isinstance(key, str) and not isinstance(fingerprint, Mapping):
        return key
    blob = json.dumps(normalize_fingerprint(fingerprint), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
