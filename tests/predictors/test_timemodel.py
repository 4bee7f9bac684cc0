"""The time model: fitting a known law, held-out MAPE, JSON round trips, validation, the TimeModel protocol."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

from cswap.planner.costmodel import TimeModel, decide
from cswap.predictors.calibration import Sample, log_sizes
from cswap.predictors.features import TIME_FEATURES, time_features
from cswap.predictors.timemodel import CalibratedTimeModel, LinearTimeModel, fit_linear_time_model, fit_time_models, holdout_sizes, mape

SIZES = log_sizes(4096, 64 << 20, 15)
DENSITIES = (1.0, 0.6, 0.3, 0.1, 0.01)


def _law(knees: tuple[float, ...]) -> np.ndarray:
    """A plausible CPU codec: 60 us per call, 0.2 s/GB, dearer past each knee."""
    coef = np.zeros(len(TIME_FEATURES))
    coef[:4] = (60e-6, 0.2, 0.05, 0.1)
    for k in range(len(knees)):
        coef[4 + 3 * k: 7 + 3 * k] = (0.5 * (k + 1), 0.1, 0.2)
    return coef


def _grid() -> tuple[np.ndarray, np.ndarray]:
    n, d = np.meshgrid(np.array(SIZES, dtype=float), np.array(DENSITIES))
    return n.ravel(), d.ravel()


@pytest.mark.parametrize("knees", [(), (float(2 << 20),), (float(2 << 20), float(16 << 20))])
def test_exact_law_with_given_knees_is_recovered(knees: tuple[float, ...]) -> None:
    n, d = _grid()
    truth = _law(knees)
    seconds = time_features(n, d, knees) @ truth
    model = fit_linear_time_model(n, d, seconds, "cpu", "compress", 4, knees_bytes=knees)
    np.testing.assert_allclose(model.coef, truth, rtol=1e-6, atol=1e-12)
    assert model.metrics["train_mape"] < 1e-6
    assert model.metrics["trimmed"] == 0


@pytest.mark.parametrize("knees", [(), (float(4 << 20) - 1,), (float(4 << 20) - 1, float(32 << 20) - 1)])
def test_knees_are_found_by_cross_validation(knees: tuple[float, ...]) -> None:
    # The search places a knee one byte below a measured size (that size and larger are past it).
    n, d = _grid()
    seconds = time_features(n, d, knees) @ _law(knees)
    model = fit_linear_time_model(n, d, seconds, "cpu", "decompress", 2)
    assert model.knees_bytes == knees
    assert mape(seconds, model.predict(n, d)) < 1e-6


def _samples(op: str, itemsize: int, seconds: np.ndarray, n: np.ndarray, d: np.ndarray) -> list[Sample]:
    return [
        Sample("cpu", "zvc", op, "float32" if itemsize == 4 else "bfloat16", itemsize, int(nb), float(dd), float(t), (float(t),))
        for nb, dd, t in zip(n, d, seconds)
    ]


@pytest.mark.parametrize("op", ["compress", "decompress"])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_noisy_measurements_with_interference_give_a_small_heldout_mape(op: str, itemsize: int) -> None:
    rng = np.random.default_rng(itemsize)
    n, d = _grid()
    knees = (float(2 << 20), float(16 << 20))
    clean = time_features(n, d, knees) @ _law(knees)
    measured = clean * rng.uniform(1.0, 1.05, clean.shape)  # interference only ever adds time
    slowed = rng.choice(len(measured), 4, replace=False)
    measured[slowed] *= 5.0
    model, reports = fit_time_models(_samples(op, itemsize, measured, n, d))
    (report,) = reports
    assert report.key == ("cpu", "zvc", op, itemsize)
    assert report.heldout_sizes == holdout_sizes(SIZES)
    assert report.n_heldout == len(report.heldout_sizes) * len(DENSITIES)
    fitted = model.models[report.key]
    # The five-fold slow measurements are trimmed, not fitted.
    assert fitted.metrics["trimmed"] >= 4
    clean_points = np.setdiff1d(np.arange(len(n)), slowed)
    assert mape(clean[clean_points], fitted.predict(n[clean_points], d[clean_points])) < 0.05
    assert report.heldout_mape == pytest.approx(fitted.metrics["heldout_mape"])


def test_holdout_sizes_are_interior_and_spread() -> None:
    held = holdout_sizes(SIZES)
    assert held == (SIZES[1], SIZES[4], SIZES[7], SIZES[10], SIZES[13])
    assert SIZES[0] not in held and SIZES[-1] not in held


def _model() -> CalibratedTimeModel:
    n, d = _grid()
    models = {}
    for op, itemsize in [("compress", 2), ("compress", 4), ("decompress", 2), ("decompress", 4)]:
        knees = (float(1 << 20),)
        seconds = time_features(n, d, knees) @ _law(knees) * (1 + 0.1 * (op == "decompress")) * (itemsize / 4)
        fitted = fit_linear_time_model(n, d, seconds, "cpu", op, itemsize, knees_bytes=knees)
        models[fitted.key] = fitted
    return CalibratedTimeModel(models, meta={"fingerprint_key": "abc"})


def test_json_round_trip_reproduces_predictions_exactly() -> None:
    model = _model()
    loaded = CalibratedTimeModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert loaded == model
    rng = np.random.default_rng(0)
    n = rng.integers(1, 1 << 28, 1000)
    d = rng.uniform(0, 1, 1000)
    for op in ("compress", "decompress"):
        for itemsize in (1, 2, 4, 8):
            np.testing.assert_array_equal(
                loaded.predict_s(op, n, d, itemsize, "cpu"), model.predict_s(op, n, d, itemsize, "cpu")
            )
    assert loaded.compress_s(12345, 0.3, 4, "cpu") == model.compress_s(12345, 0.3, 4, "cpu")
    assert loaded.meta == {"fingerprint_key": "abc"}


def _break(path: tuple, value: object) -> dict:
    document = copy.deepcopy(_model().to_dict())
    target = document
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return document


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        (("format",), "cswap.decider", "format"),
        (("format",), _DELETE, "format"),
        (("version",), 2, "version"),
        (("models",), [], "models"),
        (("surprise",), 1, "surprise"),
        (("models", 0, "op"), "encode", "op"),
        (("models", 0, "itemsize"), 3, "itemsize"),
        (("models", 0, "coef"), [1.0] * 3, "coefficients"),
        (("models", 0, "coef", 1), -0.5, "costs"),
        (("models", 0, "coef", 0), float("nan"), "finite"),
        (("models", 0, "features"), ["calls", "bytes"], "feature set"),
        (("models", 0, "knees_bytes"), [1e6, 1e3], "increasing"),
        (("models", 0, "knees_bytes"), [1.0, 2.0, 3.0], "knees_bytes"),
        (("models", 0, "backend"), "", "backend"),
        (("models", 1, "op"), "compress", "more than one model"),
        (("models", 0, "coef", 2), "fast", "coef"),
    ],
)
def test_malformed_json_raises_a_clear_value_error(path: tuple, value: object, match: str) -> None:
    document = _break(path, value)
    if path == ("models", 1, "op"):
        document["models"][1]["itemsize"] = document["models"][0]["itemsize"]
    with pytest.raises(ValueError, match=rf"invalid time model: .*{match}"):
        CalibratedTimeModel.from_dict(json.loads(json.dumps(document)))


@pytest.mark.parametrize("document", [None, [], "time-model", 3])
def test_a_time_model_must_be_an_object(document: object) -> None:
    with pytest.raises(ValueError, match="invalid time model: expected a JSON object"):
        CalibratedTimeModel.from_dict(document)


def test_it_is_a_cost_model_time_model() -> None:
    model = _model()
    assert isinstance(model, TimeModel)
    verdict = decide(
        nbytes=64 << 20, sparsity=0.9, hidden_forward_s=0.0, hidden_backward_s=0.0, d2h_gbps=1.0, h2d_gbps=1.0,
        compress_s=model.compress_s(64 << 20, 0.1, 4, "cpu"), decompress_s=model.decompress_s(64 << 20, 0.1, 4, "cpu"),
    )
    assert verdict.compress


def test_an_uncalibrated_backend_names_the_fix() -> None:
    with pytest.raises(ValueError, match=r"no calibrated compress time for backend 'cuda'.*cswap calibrate --backend cuda"):
        _model().compress_s(4096, 0.5, 4, "cuda")


@pytest.mark.parametrize(("itemsize", "used"), [(1, 2), (2, 2), (4, 4), (8, 4)])
def test_an_uncalibrated_width_uses_the_nearest(itemsize: int, used: int) -> None:
    model = _model()
    assert model.model_for("compress", itemsize, "cpu").itemsize == used


def test_models_must_be_stored_under_their_own_key() -> None:
    fitted = next(iter(_model().models.values()))
    with pytest.raises(ValueError, match="is for"):
        CalibratedTimeModel({("cpu", "zvc", "compress", 8): fitted})
    with pytest.raises(ValueError, match="at least one"):
        CalibratedTimeModel({})


@pytest.mark.parametrize(
    ("seconds", "match"),
    [([1e-3, 0.0, 1e-3], "positive and finite"), ([1e-3, math.inf, 1e-3], "positive and finite"), ([1e-3, 1e-3], "one length")],
)
def test_bad_measurements_raise(seconds: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fit_linear_time_model([4096, 8192, 16384], [1.0, 1.0, 1.0], seconds, "cpu", "compress", 4)


def test_no_samples_name_the_fix() -> None:
    with pytest.raises(ValueError, match="cswap calibrate"):
        fit_time_models([])


def test_linear_model_dict_lists_features_and_coefficients() -> None:
    fitted = LinearTimeModel("cpu", "zvc", "compress", 4, (), (1e-5,) + (0.0,) * (len(TIME_FEATURES) - 1))
    data = fitted.to_dict()
    assert data["features"] == list(TIME_FEATURES)
    assert fitted.predict(1 << 30, 0.5)[0] == pytest.approx(1e-5)
