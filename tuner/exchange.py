"""Store export and import: the JSON document ``cswap configs export`` writes and ``import`` reads.

The document holds every device, run (with its evaluations), best config and calibrated model.
:func:`parse_export` validates a whole document through the shared records before anything is
written, so a bad entry imports nothing and its error names the entry.

Example:
    >>> doc = export_document(devices=[], runs=[], best_configs=[], models=[], exported_at=0.0)
    >>> parse_export(doc).runs
    []
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from cswap.tuner.database import SCHEMA_VERSION
from cswap.tuner.fingerprints import normalize_fingerprint
from cswap.tuner.records import TuningRun
from cswap.tuner.validation import MAX_BUCKET, check_integer, check_params, check_seconds, check_text, dumps

__all__ = ["EXPORT_FORMAT", "BestEntry", "Export", "export_document", "parse_export"]

#: Format tag of export documents.
EXPORT_FORMAT = "cswap-config-store"


class BestEntry(NamedTuple):
    """A best config of a device, as imported."""

    device_key: str
    kernel: str
    source_hash: str
    dtype: str
    bucket: int
    params: dict[str, int]
    time_s: float
    run_id: str | None
    method: str


class Export(NamedTuple):
    """A validated export: fingerprints, runs, best configs and ``(device_key, name, model JSON)``."""

    devices: list[dict[str, Any]]
    runs: list[TuningRun]
    best_configs: list[BestEntry]
    models: list[tuple[str, str, str]]


def export_document(
    devices: list[dict[str, Any]], runs: list[TuningRun], best_configs: list[dict[str, Any]],
    models: list[dict[str, Any]], exported_at: float,
) -> dict[str, Any]:
    """The JSON-ready export document of a store's contents.

    Example:
        >>> export_document([], [], [], [], 0.0)["format"]
        'cswap-config-store'
    """
    return {
        "format": EXPORT_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "exported_at": exported_at,
        "devices": devices,
        "runs": [run.to_dict() for run in runs],
        "best_configs": best_configs,
        "models": models,
    }


def _entries(data: Mapping[str, Any], name: str) -> list[Any]:
    value = data.get(name, [])
    if not isinstance(value, list):
        raise ValueError(f"store export field {name!r} must be a list")
    return value


def _best(entry: Any) -> BestEntry:
    return BestEntry(
        check_text(entry["device_key"], "device_key"), check_text(entry["kernel"], "kernel"),
        check_text(entry["source_hash"], "source_hash"), check_text(entry["dtype"], "dtype"),
        check_integer(entry["bucket"], "bucket", 0, MAX_BUCKET), check_params(entry["params"], "params"),
        check_seconds(entry["time_s"], "time_s", allow_inf=False), entry.get("run_id"),
        check_text(entry.get("method", "import"), "method"),
    )


def parse_export(data: Any) -> Export:
    """Validate an export document (nothing is written).

    Raises:
        ValueError: the document is not an export, or names its first bad entry.

    Example:
        >>> parse_export({"format": "something else"})
        Traceback (most recent call last):
        ...
        ValueError: not a cswap store export: expected a JSON object with format 'cswap-config-store'
    """
    if not isinstance(data, Mapping) or data.get("format") != EXPORT_FORMAT:
        raise ValueError(f"not a cswap store export: expected a JSON object with format {EXPORT_FORMAT!r}")
    if not isinstance(data.get("schema_version"), int) or data["schema_version"] > SCHEMA_VERSION:
        raise ValueError(
            f"store export has schema_version {data.get('schema_version')!r}; this cswap reads up to "
            f"{SCHEMA_VERSION} (upgrade cswap)"
        )
    devices = [normalize_fingerprint(fp) for fp in _entries(data, "devices")]
    runs = []
    for index, entry in enumerate(_entries(data, "runs")):
        try:
            runs.append(TuningRun.from_dict(entry))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"store export runs[{index}]: {exc}") from None
    best = []
    for index, entry in enumerate(_entries(data, "best_configs")):
        try:
            best.append(_best(entry))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"store export best_configs[{index}]: {exc!s}") from None
    models = []
    for index, entry in enumerate(_entries(data, "models")):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("model"), Mapping):
            raise ValueError(f"store export models[{index}] must have device_key, name and a model object")
        models.append((check_text(entry.get("device_key"), "device_key"), check_text(entry.get("name"), "model name"),
                       dumps(entry["model"])))
    return Export(devices, runs, best, models)
