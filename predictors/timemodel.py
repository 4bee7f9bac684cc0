# Longer than the ~500-line guide on purpose: the fit, its trimming and the knee search are one
# estimator whose steps depend on each other's conventions (relative error, one-sided trimming).
"""The codec time model: a linear regression of seconds on physical cost terms, one per (backend, codec, op, width).

Each :class:`LinearTimeModel` predicts ``seconds = coef . time_features(nbytes, density, knees_bytes)``
(see :mod:`cswap.predictors.features` for the terms and why). It is fitted with scikit-learn's
:class:`~sklearn.linear_model.LinearRegression` with

* ``positive=True`` and no free intercept (the ``calls`` column is the intercept): every term is a
  cost, so no coefficient may be negative and no prediction can go below zero;
* ``sample_weight = 1 / time**2``: the least-squares error becomes relative, so a 4 KiB call counts
  as much as a 64 MiB one (their times differ by 1000x);
* one-sided trimming: a measurement more than ``trim_ratio`` times its fit, while the others of
  its size fit, is interference (a descheduled thread only ever adds time) and is dropped before
  refitting, until none is;
* up to two knees (sizes where the cost per byte steps up) chosen by leave-one-size-out
  cross-validation on the training sizes.

:func:`fit_time_models` fits every (backend, codec, op, width) of a calibration, holding out whole
sizes to report the MAPE on sizes the fit never saw, then refits on all sizes.

A :class:`CalibratedTimeModel` bundles the per-key models and implements
:class:`cswap.planner.costmodel.TimeModel` (``compress_s`` / ``decompress_s``). It travels as JSON
(:meth:`~CalibratedTimeModel.to_dict`); :meth:`~CalibratedTimeModel.from_dict` validates every field,
since a model may come over the network, and raises ``ValueError`` naming what is wrong.

Example:
    >>> import numpy as np
    >>> sizes = np.repeat(np.geomspace(4096, 1 << 26, 9), 3)
    >>> density = np.tile([1.0, 0.5, 0.1], 9)
    >>> seconds = 20e-6 + sizes * (0.5 + 0.3 * density) / 1e9
    >>> model = fit_linear_time_model(sizes, density, seconds, backend="cpu", op="compress", itemsize=4)
    >>> round(model.coefficient("calls") * 1e6, 3), round(model.coefficient("bytes"), 3)
    (20.0, 0.5)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from scipy.optimize import nnls
from sklearn.linear_model import LinearRegression
from sklearn.metrics import mean_absolute_percentage_error

from cswap.predictors.calibration import OPS, Sample
from cswap.predictors.features import MAX_KNEES, TIME_FEATURES, time_features

__all__ = [
    "TIME_MODEL_FORMAT",
    "CalibratedTimeModel",
    "LinearTimeModel",
    "TimeModelKey",
    "TimeModelReport",
    "fit_linear_time_model",
    "fit_time_models",
    "holdout_sizes",
    "mape",
]

TIME_MODEL_FORMAT = "cswap.time-model"
TIME_MODEL_VERSION = 1

# A knee must lower the cross-validated relative error by at least this much (absolute) to be kept.
_MIN_KNEE_GAIN = 0.005

TimeModelKey = tuple[str, str, str, int]
"""(backend, codec, op, itemsize)."""


def mape(measured_s: ArrayLike, predicted_s: ArrayLike) -> float:
    """Mean absolute percentage error as a fraction (0.1 is 10%), via scikit-learn."""
    return float(mean_absolute_percentage_error(np.asarray(measured_s, dtype=float), np.asarray(predicted_s, dtype=float)))


@dataclass(frozen=True)
class LinearTimeModel:
    """Seconds of one (backend, codec, op, width) as a linear function of :data:`TIME_FEATURES`.

    Args:
        backend, codec, op, itemsize: what it predicts.
        knees_bytes: the sizes past which the ``*_past_knee*`` terms count (at most two).
        coef: one non-negative coefficient per feature (seconds per call, per GB).
        metrics: fit diagnostics (``heldout_mape``, ``train_mape``, ``n_samples``, ``trimmed``,
            ``min_nbytes``, ``max_nbytes``); informational.
    """

    backend: str
    codec: str
    op: str
    itemsize: int
    knees_bytes: tuple[float, ...]
    coef: tuple[float, ...]
    metrics: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def key(self) -> TimeModelKey:
        """(backend, codec, op, itemsize)."""
        return (self.backend, self.codec, self.op, self.itemsize)

    def coefficient(self, name: str) -> float:
        """The coefficient of feature ``name`` (see :data:`TIME_FEATURES`)."""
        return self.coef[TIME_FEATURES.index(name)]

    def predict(self, nbytes: ArrayLike, density: ArrayLike) -> np.ndarray:
        """Predicted seconds, one per (nbytes, density) pair (broadcast)."""
        return time_features(nbytes, density, self.knees_bytes) @ np.asarray(self.coef, dtype=np.float64)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the ``models`` entries of :meth:`CalibratedTimeModel.to_dict`)."""
        return {
            "backend": self.backend,
            "codec": self.codec,
            "op": self.op,
            "itemsize": self.itemsize,
            "features": list(TIME_FEATURES),
            "knees_bytes": list(self.knees_bytes),
            "coef": list(self.coef),
            "metrics": dict(self.metrics),
        }


def _weighted_fit(x: np.ndarray, y: np.ndarray, keep: np.ndarray, fast: bool = False) -> np.ndarray:
    """Non-negative least squares of relative error on the kept rows.

    ``fast`` calls SciPy's ``nnls`` directly, the solver ``LinearRegression(positive=True)`` runs,
    without scikit-learn's per-call input validation (20x the solve on these small problems); the
    knee search makes thousands of fits. Stored models always come from scikit-learn.
    """
    if fast:
        scale = 1.0 / y[keep]
        coef, _ = nnls(x[keep] * scale[:, None], y[keep] * scale)
        return coef
    regression = LinearRegression(fit_intercept=False, positive=True)
    regression.fit(x[keep], y[keep], sample_weight=1.0 / y[keep] ** 2)
    return regression.coef_.astype(np.float64)


def _trimmed_fit(
    x: np.ndarray, y: np.ndarray, sizes: np.ndarray, trim_ratio: float, max_rounds: int = 10, fast: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Coefficients and the mask of kept rows after one-sided trimming of isolated slow outliers.

    A row is dropped when it is more than ``trim_ratio`` above the fit while the other rows of its
    size are not (their median is within ``trim_ratio``): interference hits single measurements,
    whereas a real change of regime (a cache or allocator threshold) moves a whole size.
    """
    keep = np.ones(len(y), dtype=bool)
    coef = _weighted_fit(x, y, keep, fast)
    for _ in range(max_rounds):
        ratio = y / np.maximum(x @ coef, 1e-12)
        size_median = {size: np.median(ratio[sizes == size]) for size in np.unique(sizes)}
        whole_size_fits = np.array([size_median[size] <= trim_ratio for size in sizes])
        new_keep = (ratio <= trim_ratio) | ~whole_size_fits
        # Never trim below half the rows: with that much interference the fit is the data's, not ours.
        if new_keep.sum() < max(len(y) // 2, x.shape[1]) or np.array_equal(new_keep, keep):
            break
        keep = new_keep
        coef = _weighted_fit(x, y, keep, fast)
    return coef, keep


def _cv_error(
    nbytes: np.ndarray, density: np.ndarray, seconds: np.ndarray, knees: tuple[float, ...], trim_ratio: float
) -> float:
    """Mean over sizes of the median relative error at that size: left out for interior sizes,
    in-sample for the smallest and largest.

    Leaving out interior sizes scores interpolation, as the held-out evaluation does; the end sizes
    count in-sample so that a knee whose only effect is to fit the largest size is still rewarded.
    The median keeps one interfered-with measurement from deciding.
    """
    x = time_features(nbytes, density, knees)
    sizes = np.unique(nbytes)
    coef_all, _ = _trimmed_fit(x, seconds, nbytes, trim_ratio, max_rounds=3, fast=True)
    errors = []
    for i, size in enumerate(sizes):
        at = nbytes == size
        if 0 < i < len(sizes) - 1:
            coef, _ = _trimmed_fit(x[~at], seconds[~at], nbytes[~at], trim_ratio, max_rounds=3, fast=True)
        else:
            coef = coef_all
        errors.append(float(np.median(np.abs(seconds[at] - x[at] @ coef) / seconds[at])))
    return float(np.mean(errors))


def _choose_knees(nbytes: np.ndarray, density: np.ndarray, seconds: np.ndarray, trim_ratio: float) -> tuple[float, ...]:
    """Up to :data:`MAX_KNEES` knees, added greedily while each lowers the cross-validated error by 3%
    (relative) and half a percentage point (absolute).

    A knee sits one byte below a measured size (that size and larger are past it): the data cannot
    tell where between two measured sizes the cost steps up, and placing the step late predicts
    the cheaper regime for sizes in between. Under-predicting a time is off by less than 100%,
    over-predicting it can be off by any factor, so the late step bounds the relative error.
    """
    sizes = np.unique(nbytes)
    if len(sizes) < 5:
        return ()
    knees: tuple[float, ...] = ()
    best = _cv_error(nbytes, density, seconds, knees, trim_ratio)
    for _ in range(MAX_KNEES):
        trials = [(float(size) - 1.0,) for size in sizes[1:] if float(size) - 1.0 not in knees]
        scored = [(_cv_error(nbytes, density, seconds, tuple(sorted(knees + t)), trim_ratio), t) for t in trials]
        if not scored:
            break
        error, extra = min(scored)
        if error >= 0.97 * best or best - error < _MIN_KNEE_GAIN:
            break
        knees, best = tuple(sorted(knees + tuple(float(k) for k in extra))), error
    return knees


def fit_linear_time_model(
    nbytes: ArrayLike,
    density: ArrayLike,
    seconds: ArrayLike,
    backend: str,
    op: str,
    itemsize: int,
    codec: str = "zvc",
    knees_bytes: tuple[float, ...] | None = None,
    trim_ratio: float = 1.5,
) -> LinearTimeModel:
    """Fit one :class:`LinearTimeModel` (see the module docstring for how).

    Args:
        nbytes, density, seconds: the measurements (same length).
        backend, op, itemsize, codec: what was measured.
        knees_bytes: fixed knees, or ``None`` to choose them by cross-validation.
        trim_ratio: isolated measurements above ``trim_ratio`` times their fit are dropped as interference.

    Example:
        >>> m = fit_linear_time_model([4096, 1 << 20, 1 << 24], [1.0, 1.0, 1.0], [1e-5, 1.1e-4, 1.7e-3], "cpu", "compress", 4)
        >>> bool(abs(m.predict(1 << 20, 1.0)[0] - 1.1e-4) < 2e-5)
        True
    """
    n = np.asarray(nbytes, dtype=np.float64)
    d = np.asarray(density, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if not (n.shape == d.shape == y.shape and n.ndim == 1 and len(n) >= 2):
        raise ValueError(f"need 1-d nbytes, density and seconds of one length >= 2, got shapes {n.shape}, {d.shape}, {y.shape}")
    if not np.all(np.isfinite(y) & (y > 0)):
        raise ValueError("seconds must be positive and finite (drop failed measurements first)")
    if trim_ratio <= 1:
        raise ValueError(f"trim_ratio must be > 1, got {trim_ratio}")
    knees = tuple(float(k) for k in knees_bytes) if knees_bytes is not None else _choose_knees(n, d, y, trim_ratio)
    x = time_features(n, d, knees)
    coef, keep = _trimmed_fit(x, y, n, trim_ratio)
    metrics = {
        "train_mape": mape(y, x @ coef),
        "n_samples": float(len(y)),
        "trimmed": float((~keep).sum()),
        "min_nbytes": float(n.min()),
        "max_nbytes": float(n.max()),
    }
    return LinearTimeModel(backend, codec, op, int(itemsize), knees, tuple(float(c) for c in coef), metrics)


def holdout_sizes(sizes: Iterable[int], every: int = 3) -> tuple[int, ...]:
    """The sizes held out for testing: every ``every``-th interior size, so testing interpolates.

    Example:
        >>> holdout_sizes(range(1, 11))
        (2, 5, 8)
    """
    ordered = sorted(set(sizes))
    return tuple(ordered[1:-1:every])


@dataclass(frozen=True)
class TimeModelReport:
    """Held-out accuracy of one fitted key.

    Attributes:
        key: (backend, codec, op, itemsize).
        heldout_mape: MAPE on the held-out sizes, of a fit that never saw them (NaN, and ``None``
            in :meth:`to_dict`, when there were too few sizes to hold any out).
        train_mape: MAPE of the final fit on every size.
        n_samples: measurements of this key; ``n_heldout`` of them held out.
        heldout_sizes: the sizes held out.
    """

    key: TimeModelKey
    heldout_mape: float
    train_mape: float
    n_samples: int
    n_heldout: int
    heldout_sizes: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        backend, codec, op, itemsize = self.key
        return {
            "backend": backend, "codec": codec, "op": op, "itemsize": itemsize,
            "mape": None if math.isnan(self.heldout_mape) else self.heldout_mape, "train_mape": self.train_mape,
            "samples": self.n_samples, "heldout_samples": self.n_heldout, "heldout_sizes": list(self.heldout_sizes),
        }


def fit_time_models(
    samples: Iterable[Sample], holdout_every: int = 3, trim_ratio: float = 1.5
) -> tuple[CalibratedTimeModel, tuple[TimeModelReport, ...]]:
    """Fit one model per (backend, codec, op, width) of ``samples``; report held-out MAPE.

    For each key the interior sizes from :func:`holdout_sizes` are held out, a model is fitted on
    the rest and scored on them (every held-out measurement counts, none is trimmed); then the
    stored model is refitted on all sizes.

    Args:
        samples: calibration measurements.
        holdout_every: hold out every this-many-th interior size (see :func:`holdout_sizes`).
        trim_ratio: see :func:`fit_linear_time_model`.

    Returns:
        The calibrated model and one report per key.
    """
    groups: dict[TimeModelKey, list[Sample]] = {}
    for sample in samples:
        groups.setdefault((sample.backend, sample.codec, sample.op, sample.itemsize), []).append(sample)
    if not groups:
        raise ValueError("no calibration samples to fit: run `cswap calibrate` first")
    models: dict[TimeModelKey, LinearTimeModel] = {}
    reports = []
    for key, group in sorted(groups.items()):
        backend, codec, op, itemsize = key
        n = np.array([s.nbytes for s in group], dtype=np.float64)
        d = np.array([s.density for s in group], dtype=np.float64)
        y = np.array([s.time_s for s in group], dtype=np.float64)
        held = holdout_sizes((int(v) for v in n), every=holdout_every)
        test = np.isin(n, held)
        heldout_mape = math.nan
        if held and (~test).sum() >= 2:
            trial = fit_linear_time_model(n[~test], d[~test], y[~test], backend, op, itemsize, codec, trim_ratio=trim_ratio)
            heldout_mape = mape(y[test], trial.predict(n[test], d[test]))
        final = fit_linear_time_model(n, d, y, backend, op, itemsize, codec, trim_ratio=trim_ratio)
        metrics = dict(final.metrics)
        if not math.isnan(heldout_mape):
            metrics["heldout_mape"] = heldout_mape
        models[key] = LinearTimeModel(backend, codec, op, itemsize, final.knees_bytes, final.coef, metrics)
        reports.append(
            TimeModelReport(key, heldout_mape, final.metrics["train_mape"], len(group), int(test.sum()), held)
        )
    return CalibratedTimeModel(models), tuple(reports)


# -------------------------------------------------------------------------------------- JSON


class _LinearModelDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: str = Field(min_length=1, max_length=64)
    codec: str = Field(min_length=1, max_length=64)
    op: Literal["compress", "decompress"]
    itemsize: Literal[1, 2, 4, 8]
    features: list[str]
    knees_bytes: list[float] = Field(max_length=MAX_KNEES)
    coef: list[float]
    metrics: dict[str, float] = Field(default_factory=dict)

    @field_validator("features")
    @classmethod
    def _same_features(cls, value: list[str]) -> list[str]:
        if tuple(value) != TIME_FEATURES:
            raise ValueError(f"features must be exactly {list(TIME_FEATURES)} (this cswap's feature set), got {value}")
        return value

    @field_validator("knees_bytes")
    @classmethod
    def _knees(cls, value: list[float]) -> list[float]:
        if not all(math.isfinite(k) and k > 0 for k in value) or value != sorted(value):
            raise ValueError(f"knees must be positive finite sizes in increasing order, got {value}")
        return value

    @field_validator("coef")
    @classmethod
    def _coefficients(cls, value: list[float]) -> list[float]:
        if len(value) != len(TIME_FEATURES):
            raise ValueError(f"needs {len(TIME_FEATURES)} coefficients (one per feature), got {len(value)}")
        if not all(math.isfinite(c) and c >= 0 for c in value):
            raise ValueError(f"coefficients must be finite and >= 0 (they are costs), got {value}")
        return value


class _TimeModelDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["cswap.time-model"]
    version: Literal[1]
    models: list[_LinearModelDoc] = Field(min_length=1)
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _unique(self) -> _TimeModelDoc:
        keys = [(m.backend, m.codec, m.op, m.itemsize) for m in self.models]
        duplicates = sorted({k for k in keys if keys.count(k) > 1})
        if duplicates:
            raise ValueError(f"more than one model for {duplicates}")
        return self


def _validation_message(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "document"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


class CalibratedTimeModel:
    """Predicted (de)compression seconds from calibrated per-key linear models; a :class:`cswap.planner.costmodel.TimeModel`.

    Args:
        models: the per-key models, by (backend, codec, op, itemsize).
        meta: free-form context (fingerprint key, calibration wall time...).

    A width that was not calibrated (1 or 8 bytes) uses the nearest calibrated width: the
    features count bytes, which is what a memory-bound codec pays for.

    Example:
        >>> coef = (1e-5, 1.0) + (0.0,) * 8
        >>> model = CalibratedTimeModel({("cpu", "zvc", op, 4): LinearTimeModel("cpu", "zvc", op, 4, (), coef) for op in OPS})
        >>> round(model.compress_s(1 << 20, density=0.5, itemsize=4, backend="cpu") * 1e6, 1)
        1058.6
        >>> CalibratedTimeModel.from_dict(model.to_dict()) == model
        True
    """

    def __init__(self, models: Mapping[TimeModelKey, LinearTimeModel], meta: Mapping[str, Any] | None = None) -> None:
        if not models:
            raise ValueError("a CalibratedTimeModel needs at least one fitted model")
        for key, model in models.items():
            if key != model.key:
                raise ValueError(f"model stored under {key} is for {model.key}")
        self.models: dict[TimeModelKey, LinearTimeModel] = dict(models)
        self.meta: dict[str, Any] = dict(meta or {})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CalibratedTimeModel) and self.models == other.models

    def __repr__(self) -> str:
        keys = ", ".join(f"{b}/{c}/{o}/{i}B" for b, c, o, i in sorted(self.models))
        return f"CalibratedTimeModel({keys})"

    @property
    def backends(self) -> tuple[str, ...]:
        """Backends with at least one model."""
        return tuple(sorted({key[0] for key in self.models}))

    def model_for(self, op: str, itemsize: int, backend: str, codec: str = "zvc") -> LinearTimeModel:
        """The model that predicts ``op``; ``ValueError`` naming the calibrated keys when there is none."""
        widths = sorted(k[3] for k in self.models if k[:3] == (backend, codec, op))
        if not widths:
            known = ", ".join(f"{b}/{c}/{o}" for b, c, o in sorted({k[:3] for k in self.models}))
            raise ValueError(
                f"no calibrated {op} time for backend {backend!r}, codec {codec!r} (calibrated: {known}); "
                f"run `cswap calibrate --backend {backend}`"
            )
        nearest = min(widths, key=lambda w: (abs(math.log2(w) - math.log2(max(itemsize, 1))), -w))
        return self.models[(backend, codec, op, nearest)]

    def predict_s(
        self, op: str, nbytes: ArrayLike, density: ArrayLike, itemsize: int, backend: str, codec: str = "zvc"
    ) -> np.ndarray:
        """Vectorised prediction: seconds of ``op`` for each (nbytes, density)."""
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}: choose one of {', '.join(OPS)}")
        return self.model_for(op, itemsize, backend, codec).predict(nbytes, density)

    def compress_s(self, nbytes: int, density: float, itemsize: int, backend: str, codec: str = "zvc") -> float:
        """Predicted seconds to compress one tensor (see :class:`cswap.planner.costmodel.TimeModel`)."""
        return float(self.predict_s("compress", nbytes, density, itemsize, backend, codec)[0])

    def decompress_s(self, nbytes: int, density: float, itemsize: int, backend: str, codec: str = "zvc") -> float:
        """Predicted seconds to decompress one tensor (see :class:`cswap.planner.costmodel.TimeModel`)."""
        return float(self.predict_s("decompress", nbytes, density, itemsize, backend, codec)[0])

    def merged(self, other: CalibratedTimeModel) -> CalibratedTimeModel:
        """The union of two models; ``other`` wins where both have a key."""
        return CalibratedTimeModel({**self.models, **other.models}, {**self.meta, **other.meta})

    def only(self, backend: str) -> CalibratedTimeModel:
        """The models of one backend."""
        return CalibratedTimeModel({k: m for k, m in self.models.items() if k[0] == backend}, self.meta)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready coefficients: ``{"format", "version", "models": [...], "meta"}``."""
        return {
            "format": TIME_MODEL_FORMAT,
            "version": TIME_MODEL_VERSION,
            "models": [self.models[key].to_dict() for key in sorted(self.models)],
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Any) -> CalibratedTimeModel:
        """Validate and load a :meth:`to_dict` document.

        Raises:
            ValueError: the document is not a time model, or a field is missing, unknown, of the
                wrong type, negative or non-finite; the message names each problem.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"invalid time model: expected a JSON object, got {type(data).__name__}")
        try:
            doc = _TimeModelDoc.model_validate(dict(data))
        except ValidationError as error:
            raise ValueError(f"invalid time model: {_validation_message(error)}") from None
        models = {
            (m.backend, m.codec, m.op, m.itemsize): LinearTimeModel(
                m.backend, m.codec, m.op, m.itemsize, tuple(m.knees_bytes), tuple(m.coef), dict(m.metrics)
            )
            for m in doc.models
        }
        return cls(models, doc.meta)
