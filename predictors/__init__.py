"""Predictors of the CSWAP cost model: codec-time regression and the compress-or-not classifier.

* :mod:`cswap.predictors.calibration`: micro-benchmarks of a codec backend (:func:`calibrate`).
* :mod:`cswap.predictors.timemodel`: per (backend, codec, op, width) linear regressions of codec seconds
  (:func:`fit_time_models`), bundled as a :class:`CalibratedTimeModel` (a ``cswap.planner.costmodel.TimeModel``).
* :mod:`cswap.predictors.decision`: the logistic compress/don't classifier (:func:`fit`, :class:`LogisticDecider`).
* :mod:`cswap.predictors.features`: the features both are built on.
* :mod:`cswap.predictors.persistence`: keeping them in the config store (:func:`load_time_model`, :func:`load_decider`).

Everything is stored as validated JSON coefficients, never pickles.

Example:
    >>> from cswap.predictors import CalibrationPlan, calibrate, fit_time_models
    >>> run = calibrate(CalibrationPlan.quick("torch"))
    >>> model, reports = fit_time_models(run.samples)
    >>> model.compress_s(1 << 16, density=0.5, itemsize=4, backend="torch") > 0
    True
"""

from cswap.predictors.calibration import CalibrationPlan, CalibrationRun, Sample, calibrate, samples_from_dict, samples_to_dict
from cswap.predictors.decision import LogisticDecider, fit
from cswap.predictors.features import DECISION_FEATURES, TIME_FEATURES, decision_features, time_features
from cswap.predictors.persistence import (
    decider_name,
    load_decider,
    load_samples,
    load_time_model,
    samples_name,
    save_decider,
    save_samples,
    save_time_model,
    time_model_name,
)
from cswap.predictors.timemodel import CalibratedTimeModel, LinearTimeModel, TimeModelReport, fit_time_models, mape

__all__ = [
    "DECISION_FEATURES",
    "TIME_FEATURES",
    "CalibratedTimeModel",
    "CalibrationPlan",
    "CalibrationRun",
    "LinearTimeModel",
    "LogisticDecider",
    "Sample",
    "TimeModelReport",
    "calibrate",
    "decider_name",
    "decision_features",
    "fit",
    "fit_time_models",
    "load_decider",
    "load_samples",
    "load_time_model",
    "mape",
    "samples_from_dict",
    "samples_name",
    "samples_to_dict",
    "save_decider",
    "save_samples",
    "save_time_model",
    "time_features",
    "time_model_name",
]
