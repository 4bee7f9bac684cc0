"""The logistic decider: learning the cost model's verdict, JSON round trips, validation."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from sklearn.metrics import balanced_accuracy_score

from cswap.planner.costmodel import decide
from cswap.predictors.decision import LogisticDecider, fit
from cswap.predictors.features import DECISION_FEATURES, decision_features

LINKS_GBPS = (2.0, 12.0, 25.0, 50.0)


def _labelled(seed: int, n: int, codec_gbps: float, overhead_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random tensors, links and hidden times labelled by the cost model with a linear codec law."""
    rng = np.random.default_rng(seed)
    nbytes = np.round(2.0 ** rng.uniform(12, 28, n))
    sparsity = rng.uniform(0, 1, n)
    link = rng.choice(LINKS_GBPS, n)
    transfer_s = nbytes / (link * 1e9)
    hidden_f = transfer_s * rng.choice([0.0, 0.1, 0.5, 1.0, 2.0], n) * rng.uniform(0.5, 1.5, n)
    hidden_b = transfer_s * rng.choice([0.0, 0.1, 0.5, 1.0, 2.0], n) * rng.uniform(0.5, 1.5, n)
    labels = np.array([
        decide(nbytes[i], sparsity[i], hidden_f[i], hidden_b[i], link[i], link[i],
               compress_s=overhead_s + nbytes[i] * (2 - sparsity[i]) / (codec_gbps * 1e9),
               decompress_s=overhead_s + nbytes[i] * (2 - sparsity[i]) / (1.3 * codec_gbps * 1e9)).compress
        for i in range(n)
    ])
    raw = np.stack([nbytes, sparsity, hidden_f, hidden_b, link, link], axis=1)
    return decision_features(nbytes, sparsity, hidden_f, hidden_b, link, link), labels, raw


@pytest.mark.parametrize(("codec_gbps", "overhead_s"), [(400.0, 25e-6), (30.0, 10e-6), (3.0, 60e-6)])
def test_learns_the_cost_model_on_held_out_tensors(codec_gbps: float, overhead_s: float) -> None:
    x, y, _ = _labelled(0, 3000, codec_gbps, overhead_s)
    x_test, y_test, raw_test = _labelled(1, 1500, codec_gbps, overhead_s)
    assert 0 < y.mean() < 1
    decider = fit(x, y)
    assert decider.accuracy(x_test, y_test) >= 0.97
    assert balanced_accuracy_score(y_test, decider.predict(x_test)) >= 0.9
    # should_compress (one tensor at a time, what the runtime calls) agrees with the batch prediction.
    batch = decider.predict(x_test[:50])
    single = [decider.should_compress(*row) for row in raw_test[:50]]
    assert single == batch.tolist()
    assert decider.meta["train_samples"] == 3000
    assert decider.meta["positive_fraction"] == pytest.approx(y.mean())


def test_json_round_trip_reproduces_predictions_exactly() -> None:
    x, y, _ = _labelled(2, 1000, 400.0, 25e-6)
    decider = fit(x, y, meta={"backend": "cuda"})
    loaded = LogisticDecider.from_dict(json.loads(json.dumps(decider.to_dict())))
    assert loaded == decider
    x_test, _, _ = _labelled(3, 500, 400.0, 25e-6)
    np.testing.assert_array_equal(loaded.decision_function(x_test), decider.decision_function(x_test))
    np.testing.assert_array_equal(loaded.probability(x_test), decider.probability(x_test))
    assert loaded.meta["backend"] == "cuda"


def _document() -> dict:
    x, y, _ = _labelled(4, 400, 400.0, 25e-6)
    return fit(x, y).to_dict()


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("format", "cswap.time-model", "format"),
        ("version", 7, "version"),
        ("features", ["log_nbytes"], "feature set"),
        ("coef", [1.0, 2.0], "needs 9 entries"),
        ("mean", [float("nan")] * 9, "finite"),
        ("scale", [1.0] * 8 + [0.0], "scale must be positive"),
        ("scale", [1.0] * 8 + [float("inf")], "finite"),
        ("intercept", "high", "intercept"),
        ("intercept", float("inf"), "intercept"),
        ("extra", 1, "extra"),
    ],
)
def test_malformed_json_raises_a_clear_value_error(key: str, value: object, match: str) -> None:
    document = copy.deepcopy(_document())
    document[key] = value
    with pytest.raises(ValueError, match=rf"invalid decider: .*{match}"):
        LogisticDecider.from_dict(json.loads(json.dumps(document)))


@pytest.mark.parametrize("missing", ["coef", "intercept", "mean", "scale", "format"])
def test_missing_fields_are_named(missing: str) -> None:
    document = _document()
    del document[missing]
    with pytest.raises(ValueError, match=rf"invalid decider: {missing}: Field required"):
        LogisticDecider.from_dict(document)


def test_a_decider_must_be_an_object() -> None:
    with pytest.raises(ValueError, match="expected a JSON object, got list"):
        LogisticDecider.from_dict([1, 2])


@pytest.mark.parametrize("label", [True, False])
def test_single_class_labels_say_how_to_get_both(label: bool) -> None:
    x, _, _ = _labelled(5, 100, 400.0, 25e-6)
    with pytest.raises(ValueError, match="needs both; vary the bandwidths and hidden times"):
        fit(x, np.full(100, label))


@pytest.mark.parametrize("label", [True, False])
def test_constant_decider_always_answers_the_same(label: bool) -> None:
    x, _, _ = _labelled(6, 200, 400.0, 25e-6)
    decider = LogisticDecider.constant(label)
    assert decider.predict(x).tolist() == [label] * 200
    assert LogisticDecider.from_dict(decider.to_dict()).meta["constant"] is True


def test_bad_shapes_raise() -> None:
    x, y, _ = _labelled(7, 100, 400.0, 25e-6)
    with pytest.raises(ValueError, match=r"features must have shape \(n, 9\)"):
        fit(x[:, :5], y)
    with pytest.raises(ValueError, match="labels shape"):
        fit(x, y[:50])
    with pytest.raises(ValueError, match="NaN or infinity"):
        fit(np.where(np.arange(x.size).reshape(x.shape) == 0, np.nan, x), y)
    decider = fit(x, y)
    with pytest.raises(ValueError, match=r"features must have shape \(n, 9\)"):
        decider.predict(x[0])
    with pytest.raises(ValueError, match="one per decision feature"):
        LogisticDecider((1.0,), 0.0, (0.0,), (1.0,))
    assert len(DECISION_FEATURES) == 9
