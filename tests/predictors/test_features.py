"""Feature construction of the time model and the decider."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cswap.planner.costmodel import exposed_transfer_s, swap_s
from cswap.predictors.features import (
    DECISION_FEATURES,
    DECISION_KNEES_BYTES,
    GAIN_FLOOR_S,
    MAX_KNEES,
    TIME_FEATURES,
    decision_features,
    time_features,
)


@pytest.mark.parametrize("nbytes", [4096, 3 << 20, 64 << 20])
@pytest.mark.parametrize("density", [0.0, 0.01, 0.5, 1.0])
def test_time_features_are_the_documented_cost_terms(nbytes: int, density: float) -> None:
    row = time_features(nbytes, density)[0]
    gb = nbytes / 1e9
    expected = {
        "calls": 1.0,
        "bytes": gb,
        "nonzero_bytes": gb * density,
        "mixed_bytes": gb * 4 * density * (1 - density),
    }
    assert row.shape == (len(TIME_FEATURES),)
    for name, value in expected.items():
        assert row[TIME_FEATURES.index(name)] == pytest.approx(value, rel=1e-12, abs=0)
    # Without knees the past-knee columns are all zero.
    assert not row[4:].any()


def test_knee_columns_step_when_their_buffer_outgrows_the_knee() -> None:
    knees = (1 << 20, 16 << 20)
    n = np.array([1 << 20, (1 << 20) + 256, 4 << 20, 64 << 20], dtype=float)
    d = np.array([1.0, 1.0, 0.1, 0.5])
    rows = time_features(n, d, knees)
    terms = ("bytes", "nonzero_bytes", "mixed_bytes")
    for k, knee in enumerate(knees, start=1):
        for term, size in zip(terms, (n, n * d, n)):
            column = rows[:, TIME_FEATURES.index(f"{term}_past_knee{k}")]
            base = rows[:, TIME_FEATURES.index(term)]
            # The whole term counts once its buffer is larger than the knee; exactly at it, nothing.
            np.testing.assert_array_equal(column, np.where(size > knee, base, 0.0))
    # 4 MiB at density 0.1 is past the first knee, but its 0.4 MiB of values are not.
    assert rows[2, TIME_FEATURES.index("bytes_past_knee1")] > 0
    assert rows[2, TIME_FEATURES.index("nonzero_bytes_past_knee1")] == 0


def test_time_features_broadcast() -> None:
    x = time_features([4096, 8192, 16384], 0.25)
    assert x.shape == (3, len(TIME_FEATURES))
    np.testing.assert_allclose(x[:, 2], np.array([4096, 8192, 16384]) * 0.25 / 1e9)


@pytest.mark.parametrize(
    ("nbytes", "density", "knees", "match"),
    [
        (-1, 0.5, (), "nbytes >= 0"),
        (4096, 1.5, (), r"density in \[0, 1\]"),
        (4096, -0.1, (), r"density in \[0, 1\]"),
        (float("nan"), 0.5, (), "finite"),
        (4096, 0.5, (1.0, 2.0, 3.0), f"at most {MAX_KNEES}"),
        (4096, 0.5, (0.0,), "positive"),
    ],
)
def test_bad_time_feature_inputs_raise(nbytes: float, density: float, knees: tuple[float, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        time_features(nbytes, density, knees)


@pytest.mark.parametrize("nbytes", [4096, 1 << 20, 256 << 20])
@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.99])
@pytest.mark.parametrize(("hidden_f", "hidden_b"), [(0.0, 0.0), (1e-4, 5e-4), (10.0, 10.0)])
@pytest.mark.parametrize(("d2h", "h2d"), [(12.0, 12.0), (2.0, 25.0)])
def test_decision_features_follow_the_cost_model(
    nbytes: int, sparsity: float, hidden_f: float, hidden_b: float, d2h: float, h2d: float
) -> None:
    row = decision_features(nbytes, sparsity, hidden_f, hidden_b, d2h, h2d)[0]
    t_prime = swap_s(nbytes, d2h, h2d, hidden_f, hidden_b)
    compressed = nbytes * (1 - sparsity)
    overhead = exposed_transfer_s(compressed, d2h, hidden_f) + exposed_transfer_s(compressed, h2d, hidden_b)
    transfer = nbytes / (d2h * 1e9) + nbytes / (h2d * 1e9)
    named = dict(zip(DECISION_FEATURES, row))
    assert named["log_gain_s"] == pytest.approx(math.log(t_prime - overhead + GAIN_FLOOR_S), rel=1e-9)
    assert named["log_swap_s"] == pytest.approx(math.log(t_prime + GAIN_FLOOR_S), rel=1e-9)
    assert named["log_transfer_hidden_ratio"] == pytest.approx(math.log(transfer / (transfer + hidden_f + hidden_b)), rel=1e-9)
    assert named["log_nbytes"] == pytest.approx(math.log(nbytes))
    for knee in DECISION_KNEES_BYTES:
        name = next(n for n in DECISION_FEATURES if n.startswith("softplus") and n.endswith(_label(knee)))
        assert named[name] == pytest.approx(math.log1p(nbytes / knee), rel=1e-9)


def _label(knee: int) -> str:
    return f"{knee >> 20}MiB" if knee >= 1 << 20 else f"{knee >> 10}KiB"


def test_a_fully_hidden_transfer_has_the_floor_as_gain() -> None:
    row = decision_features(1 << 20, 0.9, 1.0, 1.0, 12.0, 12.0)[0]
    assert row[DECISION_FEATURES.index("log_gain_s")] == pytest.approx(math.log(GAIN_FLOOR_S))


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 0.5, 0.0, 0.0, 12.0, 12.0), "nbytes must be positive"),
        ((4096, 1.2, 0.0, 0.0, 12.0, 12.0), r"sparsity must lie in \[0, 1\]"),
        ((4096, 0.5, -1.0, 0.0, 12.0, 12.0), "hidden times"),
        ((4096, 0.5, 0.0, float("inf"), 12.0, 12.0), "hidden times"),
        ((4096, 0.5, 0.0, 0.0, 0.0, 12.0), "bandwidths must be positive"),
    ],
)
def test_bad_decision_inputs_raise(args: tuple[float, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decision_features(*args)
