"""Keeping time models and deciders in the config store."""

from __future__ import annotations

import numpy as np
import pytest

from cswap.device import DeviceFingerprint, fingerprint
from cswap.predictors.decision import LogisticDecider
from cswap.predictors.features import TIME_FEATURES
from cswap.predictors.persistence import (
    load_decider,
    load_samples,
    load_time_model,
    save_decider,
    save_samples,
    save_time_model,
)
from cswap.predictors.timemodel import CalibratedTimeModel, LinearTimeModel
from cswap.tuner.store import ConfigStore

GPU = {"kind": "cuda", "name": "NVIDIA H100", "compute_capability": "9.0", "sm_count": 132, "memory_bytes": 80 << 30}


def _time_model(backend: str, per_call_s: float) -> CalibratedTimeModel:
    coef = (per_call_s, 0.25) + (0.0,) * (len(TIME_FEATURES) - 2)
    return CalibratedTimeModel(
        {(backend, "zvc", op, w): LinearTimeModel(backend, "zvc", op, w, (), coef) for op in ("compress", "decompress") for w in (2, 4)}
    )


@pytest.fixture()
def store(tmp_path) -> ConfigStore:
    return ConfigStore(tmp_path / "store.db")


@pytest.mark.parametrize("fp", [fingerprint("cpu"), fingerprint("cpu").to_dict()], ids=["object", "dict"])
def test_nothing_stored_gives_none(store: ConfigStore, fp: DeviceFingerprint | dict) -> None:
    assert load_time_model(fp, store) is None
    assert load_decider(fp, store) is None
    assert load_samples(fp, "cpu", store) is None


def test_time_models_of_several_backends_are_stored_apart_and_merged(store: ConfigStore) -> None:
    fp = fingerprint("cpu")
    assert save_time_model(fp, _time_model("cpu", 1e-4), store) == ["time-model/cpu"]
    assert save_time_model(fp, _time_model("torch", 5e-4), store) == ["time-model/torch"]
    both = load_time_model(fp, store)
    assert both.backends == ("cpu", "torch")
    assert both.compress_s(1 << 20, 0.5, 4, "cpu") == _time_model("cpu", 1e-4).compress_s(1 << 20, 0.5, 4, "cpu")
    assert both.compress_s(1 << 20, 0.5, 4, "torch") == _time_model("torch", 5e-4).compress_s(1 << 20, 0.5, 4, "torch")
    assert load_time_model(fp, store, backend="torch").backends == ("torch",)
    assert load_time_model(fp.to_dict(), store) == both
    # A later calibration of one backend replaces only that backend.
    save_time_model(fp, _time_model("cpu", 2e-4), store)
    assert load_time_model(fp, store).compress_s(4096, 1.0, 4, "cpu") == pytest.approx(2e-4 + 4096 * 0.25 / 1e9)


def test_models_are_per_device(store: ConfigStore) -> None:
    save_time_model(fingerprint("cpu"), _time_model("cpu", 1e-4), store)
    assert load_time_model(GPU, store) is None


@pytest.mark.parametrize(("fp", "backend"), [(GPU, "cuda"), (fingerprint("cpu").to_dict(), "cpu")])
def test_decider_round_trip_picks_the_backend_of_the_device(store: ConfigStore, fp: dict, backend: str) -> None:
    decider = LogisticDecider(tuple(np.linspace(-1, 1, 9)), 0.25, (0.0,) * 9, (2.0,) * 9, {"backend": backend})
    assert save_decider(fp, decider, backend, store) == f"decider/{backend}"
    loaded = load_decider(fp, store)
    assert loaded == decider and loaded.meta == {"backend": backend}
    other = "cpu" if backend == "cuda" else "cuda"
    assert load_decider(fp, store, backend=other) is None


def test_samples_are_kept(store: ConfigStore) -> None:
    document = {"format": "cswap.calibration-samples", "version": 1, "samples": []}
    assert save_samples(GPU, "cuda", document, store) == "calibration-samples/cuda"
    assert load_samples(GPU, "cuda", store) == document


@pytest.mark.parametrize(
    ("name", "document", "loader"),
    [
        ("time-model/cpu", {"format": "cswap.time-model", "version": 1, "models": []}, load_time_model),
        ("time-model/cpu", {"format": "nope"}, load_time_model),
        ("decider/cpu", {"format": "cswap.decider", "version": 1}, load_decider),
    ],
)
def test_a_corrupt_stored_model_names_itself_and_the_fix(store: ConfigStore, name: str, document: dict, loader) -> None:
    fp = fingerprint("cpu")
    store.put_model(fp, name, document)
    with pytest.raises(ValueError, match=rf"stored model '{name}' is unusable: invalid .*rerun `cswap calibrate`"):
        loader(fp, store)
