"""The decision model: a logistic regression that says compress-then-swap or plain swap for one tensor.

It learns the cost model's verdict (``compress iff T < T'``, :mod:`cswap.planner.costmodel`) from the
quantities the runtime profiles: size, sparsity, ``Hidden_f``, ``Hidden_b`` and the two link
bandwidths, through the features of :func:`cswap.predictors.features.decision_features`. The caller makes
the labels (the top-layer ``cswap calibrate`` runs the cost model with calibrated codec times);
:func:`fit` fits scikit-learn's :class:`~sklearn.linear_model.LogisticRegression` on standardised
features and returns a :class:`LogisticDecider`.

A decider travels as JSON coefficients (scaler mean and scale, weights, intercept), never as a
pickle; :meth:`LogisticDecider.from_dict` validates the document and raises ``ValueError`` naming
what is wrong. Predictions are computed from those coefficients, so a decider loaded from JSON
predicts exactly what the fitted one did.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> nbytes = 2.0 ** rng.uniform(12, 28, 500); sparsity = rng.uniform(0, 1, 500)
    >>> x = decision_features(nbytes, sparsity, 0.0, 0.0, 12.0, 12.0)
    >>> labels = nbytes * sparsity > 1e6            # a made-up rule that is linear in the features
    >>> decider = fit(x, labels)
    >>> decider.accuracy(x, labels) > 0.95
    True
    >>> decider.should_compress(64 << 20, 0.9, 0.0, 0.0, 12.0, 12.0)
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score
from sklearn.preprocessing import StandardScaler

from cswap.predictors.features import DECISION_FEATURES, decision_features

__all__ = ["DECIDER_FORMAT", "LogisticDecider", "fit"]

DECIDER_FORMAT = "cswap.decider"
DECIDER_VERSION = 1


@dataclass(frozen=True)
class LogisticDecider:
    """``P(compress) = sigmoid(coef . (features - mean) / scale + intercept)``; compress when it exceeds 0.5.

    Args:
        coef: one weight per :data:`~cswap.predictors.features.DECISION_FEATURES` entry.
        intercept: the bias.
        mean, scale: the standardisation fitted on the training features.
        meta: free-form context (training accuracy, class balance, backend...); informational.
    """

    coef: tuple[float, ...]
    intercept: float
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        width = len(DECISION_FEATURES)
        if not len(self.coef) == len(self.mean) == len(self.scale) == width:
            raise ValueError(
                f"a decider needs {width} coefficients, means and scales (one per decision feature), "
                f"got {len(self.coef)}, {len(self.mean)}, {len(self.scale)}"
            )

    @classmethod
    def constant(cls, compress: bool, meta: Mapping[str, Any] | None = None) -> LogisticDecider:
        """A decider that always answers ``compress``: what the data says when every label agreed.

        Example:
            >>> LogisticDecider.constant(False).should_compress(1 << 30, 0.99, 0.0, 0.0, 0.1, 0.1)
            False
        """
        width = len(DECISION_FEATURES)
        return cls((0.0,) * width, 1.0 if compress else -1.0, (0.0,) * width, (1.0,) * width, {**dict(meta or {}), "constant": True})

    def decision_function(self, features: ArrayLike) -> np.ndarray:
        """The logit of each row of a :func:`decision_features` matrix."""
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(DECISION_FEATURES):
            raise ValueError(f"features must have shape (n, {len(DECISION_FEATURES)}), got {x.shape}")
        standard = (x - np.asarray(self.mean)) / np.asarray(self.scale)
        return standard @ np.asarray(self.coef) + self.intercept

    def predict(self, features: ArrayLike) -> np.ndarray:
        """``True`` (compress) where the logit is positive."""
        return self.decision_function(features) > 0.0

    def probability(self, features: ArrayLike) -> np.ndarray:
        """``P(compress)`` of each row."""
        return 1.0 / (1.0 + np.exp(-self.decision_function(features)))

    def accuracy(self, features: ArrayLike, labels: ArrayLike) -> float:
        """Fraction of rows where :meth:`predict` agrees with ``labels`` (scikit-learn's ``accuracy_score``)."""
        return float(accuracy_score(np.asarray(labels, dtype=bool), self.predict(features)))

    def should_compress(
        self,
        nbytes: float,
        sparsity: float,
        hidden_forward_s: float,
        hidden_backward_s: float,
        d2h_gbps: float,
        h2d_gbps: float,
    ) -> bool:
        """Compress this tensor before swapping it? (what ``Runtime(decider="logistic")`` asks).

        Example:
            >>> LogisticDecider((1.0,) + (0.0,) * 8, 0.0, (0.0,) * 9, (1.0,) * 9).should_compress(1 << 20, 0.5, 0, 0, 12, 12)
            False
        """
        x = decision_features(nbytes, sparsity, hidden_forward_s, hidden_backward_s, d2h_gbps, h2d_gbps)
        return bool(self.predict(x)[0])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready coefficients."""
        return {
            "format": DECIDER_FORMAT,
            "version": DECIDER_VERSION,
            "features": list(DECISION_FEATURES),
            "coef": list(self.coef),
            "intercept": self.intercept,
            "mean": list(self.mean),
            "scale": list(self.scale),
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Any) -> LogisticDecider:
        """Validate and load a :meth:`to_dict` document.

        Raises:
            ValueError: not a decider document, or a field missing, unknown, of the wrong length,
                non-finite, or a non-positive scale; the message names each problem.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"invalid decider: expected a JSON object, got {type(data).__name__}")
        try:
            doc = _DeciderDoc.model_validate(dict(data))
        except ValidationError as error:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'document'}: {e['msg']}" for e in error.errors())
            raise ValueError(f"invalid decider: {problems}") from None
        return cls(tuple(doc.coef), doc.intercept, tuple(doc.mean), tuple(doc.scale), dict(doc.meta))


def _finite(values: list[float], what: str) -> list[float]:
    if len(values) != len(DECISION_FEATURES):
        raise ValueError(f"{what} needs {len(DECISION_FEATURES)} entries (one per decision feature), got {len(values)}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{what} must be finite numbers")
    return values


class _DeciderDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["cswap.decider"]
    version: Literal[1]
    features: list[str]
    coef: list[float]
    intercept: float = Field(allow_inf_nan=False)
    mean: list[float]
    scale: list[float]
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("features")
    @classmethod
    def _same_features(cls, value: list[str]) -> list[str]:
        if tuple(value) != DECISION_FEATURES:
            raise ValueError(f"features must be exactly {list(DECISION_FEATURES)} (this cswap's feature set), got {value}")
        return value

    @field_validator("coef", "mean")
    @classmethod
    def _vectors(cls, value: list[float]) -> list[float]:
        return _finite(value, "this vector")

    @model_validator(mode="after")
    def _positive_scale(self) -> _DeciderDoc:
        _finite(self.scale, "scale")
        if not all(s > 0 for s in self.scale):
            raise ValueError(f"scale must be positive (it divides the features), got {self.scale}")
        return self


def fit(
    features: ArrayLike,
    labels: ArrayLike,
    c: float = 100.0,
    sample_weight: ArrayLike | None = None,
    meta: Mapping[str, Any] | None = None,
) -> LogisticDecider:
    """Fit a :class:`LogisticDecider` on a :func:`decision_features` matrix and compress/don't labels.

    Args:
        features: shape ``(n, len(DECISION_FEATURES))``.
        labels: ``True`` where compressing is the better choice.
        c: inverse L2 strength of scikit-learn's ``LogisticRegression`` (weak: the features are few
            and engineered, and the labels are noise-free).
        sample_weight: optional per-row weights.
        meta: context stored with the decider; the training accuracy and class balance are added.

    Raises:
        ValueError: wrong shapes, non-finite features, or labels of a single class (the message
            says how to get both: vary bandwidth and hidden times).
    """
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    if x.ndim != 2 or x.shape[1] != len(DECISION_FEATURES) or y.shape != (x.shape[0],):
        raise ValueError(
            f"features must have shape (n, {len(DECISION_FEATURES)}) and labels shape (n,), got {x.shape} and {y.shape}"
        )
    if not np.all(np.isfinite(x)):
        raise ValueError("features contain NaN or infinity: build them with cswap.predictors.features.decision_features")
    if y.all() or not y.any():
        raise ValueError(
            f"all {len(y)} labels say {'compress' if y.any() else 'do not compress'}: a classifier needs both; "
            "vary the bandwidths and hidden times of the training tensors so both decisions occur"
        )
    scaler = StandardScaler().fit(x)
    # Constant columns get scale 1 from scikit-learn already; keep that guarantee explicit for from_dict.
    scale = np.where(scaler.scale_ > 0, scaler.scale_, 1.0)
    regression = LogisticRegression(C=c, max_iter=10_000)
    regression.fit((x - scaler.mean_) / scale, y, sample_weight=sample_weight)
    decider = LogisticDecider(
        coef=tuple(float(v) for v in regression.coef_[0]),
        intercept=float(regression.intercept_[0]),
        mean=tuple(float(v) for v in scaler.mean_),
        scale=tuple(float(v) for v in scale),
    )
    summary = {"train_accuracy": decider.accuracy(x, y), "train_samples": len(y), "positive_fraction": float(y.mean())}
    return replace(decider, meta={**dict(meta or {}), **summary})
