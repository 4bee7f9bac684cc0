"""Keeping calibrated predictors in the config store, per device, as JSON.

Names under which :meth:`cswap.tuner.store.ConfigStore.put_model` keeps them, one per codec backend:

* ``time-model/<backend>``: a :class:`~cswap.predictors.timemodel.CalibratedTimeModel` document
  holding every calibrated codec of the backend; saving one codec's models replaces that codec's
  and keeps the others';
* ``decider/<backend>``: a :class:`~cswap.predictors.decision.LogisticDecider` document;
* ``calibration-samples/<backend>``: ZVC's raw measurements (:func:`cswap.predictors.calibration.samples_to_dict`),
  ``calibration-samples/<backend>/<codec>`` another codec's.

:func:`load_time_model` and :func:`load_decider` return ``None`` when the device was never
calibrated, and raise ``ValueError`` (naming the model and the problem) when what is stored does
not validate.

Example:
    >>> from cswap.tuner.store import ConfigStore
    >>> store = ConfigStore("/tmp/cswap-persistence-doc.db")
    >>> fp = {"kind": "cpu", "name": "doc-cpu", "compute_capability": "", "sm_count": 2, "memory_bytes": 0}
    >>> load_decider(fp, store) is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cswap.device import DeviceFingerprint
from cswap.predictors.decision import LogisticDecider
from cswap.predictors.timemodel import CalibratedTimeModel
from cswap.tuner.store import ConfigStore, fingerprint_key

__all__ = [
    "decider_name",
    "load_decider",
    "load_samples",
    "load_time_model",
    "samples_name",
    "save_decider",
    "save_samples",
    "save_time_model",
    "time_model_name",
]

FingerprintLike = DeviceFingerprint | Mapping[str, Any]
_TIME_MODEL = "time-model/"
_DECIDER = "decider/"
_SAMPLES = "calibration-samples/"


def time_model_name(backend: str) -> str:
    """Store name of a backend's time model, ``time-model/<backend>``."""
    return _TIME_MODEL + backend


def decider_name(backend: str) -> str:
    """Store name of a backend's decider, ``decider/<backend>``."""
    return _DECIDER + backend


def samples_name(backend: str, codec: str = "zvc") -> str:
    """Store name of a codec backend's calibration samples: ``calibration-samples/<backend>`` for ZVC,
    else ``calibration-samples/<backend>/<codec>``.

    Example:
        >>> samples_name("cpu"), samples_name("cpu", "exponent")
        ('calibration-samples/cpu', 'calibration-samples/cpu/exponent')
    """
    return _SAMPLES + backend + ("" if codec == "zvc" else f"/{codec}")


def _kind(fingerprint: FingerprintLike) -> str:
    data = fingerprint.to_dict() if isinstance(fingerprint, DeviceFingerprint) else dict(fingerprint)
    return "cuda" if data.get("kind") == "cuda" else "cpu"


def save_time_model(fingerprint: FingerprintLike, model: CalibratedTimeModel, store: ConfigStore | None = None) -> list[str]:
    """Store ``model`` for ``fingerprint``, one document per backend it covers; returns the names written.

    The codecs ``model`` has replace their stored models; the stored models of other codecs of the
    backend are kept (a stored document that no longer validates is replaced whole).
    """
    store = store if store is not None else ConfigStore()
    stored = store.models(fingerprint_key(fingerprint))
    names = []
    for backend in model.backends:
        new = model.only(backend)
        try:
            old = CalibratedTimeModel.from_dict(stored[time_model_name(backend)]) if time_model_name(backend) in stored else None
        except ValueError:
            old = None
        codecs = {key[1] for key in new.models}
        kept = {} if old is None else {key: m for key, m in old.models.items() if key[1] not in codecs}
        if kept:
            assert old is not None
            new = CalibratedTimeModel(kept, old.meta).merged(new)
        store.put_model(fingerprint, time_model_name(backend), new.to_dict())
        names.append(time_model_name(backend))
    return names


def load_time_model(
    fingerprint: FingerprintLike, store: ConfigStore | None = None, backend: str | None = None
) -> CalibratedTimeModel | None:
    """The calibrated time model of a device (every backend, or just ``backend``), or ``None``.

    Args:
        fingerprint: the device (``cswap.device.fingerprint(device)`` or its dict).
        store: the config store (default: ``$CSWAP_HOME/store.db``).
        backend: only this backend's model.

    Raises:
        ValueError: a stored model does not validate (the message names it; rerun ``cswap calibrate``).
    """
    store = store if store is not None else ConfigStore()
    models = store.models(fingerprint_key(fingerprint))
    merged: CalibratedTimeModel | None = None
    for name, document in sorted(models.items()):
        if not name.startswith(_TIME_MODEL) or (backend is not None and name != time_model_name(backend)):
            continue
        try:
            model = CalibratedTimeModel.from_dict(document)
        except ValueError as error:
            raise ValueError(f"stored model {name!r} is unusable: {error}; rerun `cswap calibrate`") from None
        merged = model if merged is None else merged.merged(model)
    return merged


def save_decider(
    fingerprint: FingerprintLike, decider: LogisticDecider, backend: str, store: ConfigStore | None = None
) -> str:
    """Store ``decider`` (trained with ``backend``'s codec times) for ``fingerprint``; returns its name."""
    store = store if store is not None else ConfigStore()
    store.put_model(fingerprint, decider_name(backend), decider.to_dict())
    return decider_name(backend)


def load_decider(
    fingerprint: FingerprintLike, store: ConfigStore | None = None, backend: str | None = None
) -> LogisticDecider | None:
    """The stored decider of a device for ``backend`` (default: ``cuda`` on a GPU, else ``cpu``), or ``None``.

    Raises:
        ValueError: the stored decider does not validate (the message names it; rerun ``cswap calibrate``).
    """
    store = store if store is not None else ConfigStore()
    name = decider_name(backend or _kind(fingerprint))
    document = store.models(fingerprint_key(fingerprint)).get(name)
    if document is None:
        return None
    try:
        return LogisticDecider.from_dict(document)
    except ValueError as error:
        raise ValueError(f"stored model {name!r} is unusable: {error}; rerun `cswap calibrate`") from None


def save_samples(
    fingerprint: FingerprintLike, backend: str, document: Mapping[str, Any], store: ConfigStore | None = None,
    codec: str = "zvc",
) -> str:
    """Store one codec's calibration samples (a :func:`~cswap.predictors.calibration.samples_to_dict` document); returns the name."""
    store = store if store is not None else ConfigStore()
    store.put_model(fingerprint, samples_name(backend, codec), dict(document))
    return samples_name(backend, codec)


def load_samples(
    fingerprint: FingerprintLike, backend: str, store: ConfigStore | None = None, codec: str = "zvc"
) -> dict[str, Any] | None:
    """The stored calibration-samples document of a device, backend and codec, or ``None``."""
    store = store if store is not None else ConfigStore()
    return store.models(fingerprint_key(fingerprint)).get(samples_name(backend, codec))
