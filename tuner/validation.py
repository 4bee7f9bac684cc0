"""The field checks every stored or published record goes through, with messages naming the field.

These are the validators of the pydantic records in :mod:`cswap.tuner.records` and
:mod:`cswap.tuner.fingerprints`; the store and the tuning service both validate through those
records, so a value is judged by the same rule (and the same message) wherever it enters.

Example:
    >>> check_seconds(None, "best_time_s", allow_inf=True)
    inf
    >>> check_params({"compress_grid": 528}, "best_params")
    {'compress_grid': 528}
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from typing import Any

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "MAX_BUCKET",
    "check_integer",
    "check_params",
    "check_seconds",
    "check_text",
    "dumps",
    "json_seconds",
]

#: Largest size bucket: ``size_bucket`` of any 2**126-byte tensor; keeps the column a small int.
MAX_BUCKET = 63
INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1


def check_text(value: Any, what: str, *, allow_empty: bool = False, max_len: int = 1024) -> str:
    """``value`` if it is a string SQLite can store (valid UTF-8, not empty unless allowed, bounded).

    Example:
        >>> check_text("zvc.cuda.compress", "kernel")
        'zvc.cuda.compress'
    """
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__} {value!r:.80}")
    if not allow_empty and not value:
        raise ValueError(f"{what} must be a non-empty string")
    if len(value) > max_len:
        raise ValueError(f"{what} is {len(value)} characters long; at most {max_len} are allowed")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        # JSON escapes can smuggle lone surrogates in; SQLite (UTF-8) cannot store them.
        raise ValueError(f"{what} is not valid Unicode text (lone surrogate at index {exc.start})") from None
    return value


def check_integer(value: Any, what: str, lo: int = -INT64_MAX - 1, hi: int = INT64_MAX) -> int:
    """``value`` as an int in ``lo..hi``; a bool or a numeric string is not an integer here.

    Example:
        >>> check_integer(12, "bucket", 0, MAX_BUCKET)
        12
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{what} must be an integer, got {type(value).__name__} {value!r:.80}")
    value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"{what} is {value}, must be between {lo} and {hi}")
    return value


def check_seconds(value: Any, what: str, *, allow_inf: bool) -> float:
    """A non-negative duration; ``None`` stands for ``inf`` (JSON has no infinity) where ``allow_inf``.

    Example:
        >>> check_seconds(0.5, "wall_s", allow_inf=False)
        0.5
    """
    if value is None and allow_inf:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{what} must be a number of seconds, got {type(value).__name__} {value!r:.80}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{what} is NaN; use a measured time (or inf / null for a config that failed to launch)")
    if value < 0:
        raise ValueError(f"{what} is {value}, must be >= 0")
    if math.isinf(value) and not allow_inf:
        raise ValueError(f"{what} is infinite, must be a finite number of seconds")
    return value


def check_params(value: Any, what: str) -> dict[str, int]:
    """A launch config ``{name: int}``; NumPy integers (from scikit-optimize) become ints.

    Example:
        >>> check_params({"threads": 2}, "params")
        {'threads': 2}
    """
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a dict of parameter name -> int, got {type(value).__name__}")
    return {check_text(k, f"{what} key", max_len=128): check_integer(v, f"{what}[{k!r}]") for k, v in value.items()}


def json_seconds(value: float) -> float | None:
    """``value`` for JSON: infinity (a failed launch) becomes ``None``.

    Example:
        >>> json_seconds(math.inf) is None, json_seconds(0.25)
        (True, 0.25)
    """
    return None if math.isinf(value) else value


def dumps(value: Any) -> str:
    """Canonical JSON text (sorted keys, no NaN or infinity) of a stored value.

    Example:
        >>> dumps({"b": 1, "a": 2})
        '{"a": 2, "b": 1}'
    """
    return json.dumps(value, sort_keys=True, allow_nan=False)
