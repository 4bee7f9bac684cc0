"""The one lookup flow (service, else store, else tune, then publish or queue) and what the report says of it."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from cswap.device import fingerprint
from cswap.server.app import create_app
from cswap.server.client import ServiceUnavailableWarning, TuningClient
from cswap.training.config import TrainConfig
from cswap.training.kernelconfigs import KernelConfigs, prepare_kernel_configs, settle_config
from cswap.tuner.store import ConfigStore
from tests.cli.nets import tiny_cnn
from tests.server.helpers import serve_in_thread

NBYTES = 1 << 16


def _settle(store: ConfigStore, client: TuningClient | None, method: str | None = "random"):
    return settle_config(fingerprint("cpu"), "cpu", "compress", "float32", NBYTES, store, client, method,
                         budget=2, repeats=1)


def test_a_new_run_is_published_and_a_second_is_a_store_hit(tmp_path: Path) -> None:
    service_store = ConfigStore(tmp_path / "service.db")
    local = ConfigStore(tmp_path / "local.db")
    with serve_in_thread(create_app(service_store)) as url, TuningClient(url) as client:
        first = _settle(local, client)
        assert (first.publication, first.published) == ("published", True)
        assert service_store.run(first.run.run_id) == first.run == local.run(first.run.run_id)
        assert first.result.params == first.run.best_params and first.result.match == "exact"
        again = _settle(local, client)
        assert (again.run.method, again.publication, again.found.match) == ("cached", "none", "exact")
        assert client.answered is True


def test_a_service_that_is_down_queues_the_run_locally(tmp_path: Path) -> None:
    local = ConfigStore(tmp_path / "local.db")
    with TuningClient("http://127.0.0.1:1", timeout_s=0.2, retries=0) as client:
        with pytest.warns(ServiceUnavailableWarning, match="using the local config store"):
            settled = _settle(local, client)
        assert (settled.publication, settled.published) == ("queued", False)
        assert local.run(settled.run.run_id) == settled.run
        assert client.answered is False


def test_without_a_service_runs_stay_local_and_lookups_measure_nothing(tmp_path: Path) -> None:
    local = ConfigStore(tmp_path / "local.db")
    looked_up = _settle(local, None, method=None)
    assert (looked_up.run, looked_up.publication, looked_up.found.match) == (None, "none", "default")
    tuned = _settle(local, None)
    assert (tuned.publication, tuned.published) == ("local", False)


def _prepare(url: str | None) -> KernelConfigs:
    cfg = TrainConfig(model="tests.cli.nets:tiny_cnn", tune="random", tune_budget=2, tuner_url=url)
    from rich.console import Console

    return prepare_kernel_configs(cfg, fingerprint("cpu"), torch.device("cpu"), tiny_cnn(),
                                  torch.randn(4, 3, 16, 16), True, lambda: None, Console(quiet=True),
                                  show_progress=False)


def test_the_report_says_the_service_answered_and_the_runs_were_published(tmp_path: Path) -> None:
    service_store = ConfigStore(tmp_path / "service.db")
    with serve_in_thread(create_app(service_store)) as url:
        configs = _prepare(url)
    summary = configs.summary()
    assert (summary["service_url"], summary["service_answered"]) == (url, True)
    assert configs.runs and all(run["published"] is True for run in summary["runs"])
    assert {run["publication"] for run in summary["runs"]} == {"published"}
    assert {run.run_id for run in service_store.runs()} == {run["run_id"] for run in summary["runs"]}


def test_the_report_says_the_service_did_not_answer(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ServiceUnavailableWarning)
        configs = _prepare("http://127.0.0.1:1")
    summary = configs.summary()
    assert (summary["service_url"], summary["service_answered"]) == ("http://127.0.0.1:1", False)
    assert {(run["publication"], run["published"]) for run in summary["runs"]} == {("queued", False)}


def test_without_a_service_nothing_was_asked(tmp_path: Path) -> None:
    summary = _prepare(None).summary()
    assert (summary["service_url"], summary["service_answered"]) == (None, None)
    assert {(run["publication"], run["published"]) for run in summary["runs"]} == {("local", False)}


def test_training_tunes_every_codec_the_model_saves_tensors_for() -> None:
    """A CNN saves float32 activations: its run tunes ZVC and exponent coding, each op, and the
    runtime's lookup of each codec finds the config settled for it (bool masks, which this model
    does not save, leave bit-packing untuned)."""
    from cswap.tuner.kernels import kernel_name

    configs = _prepare(None)
    assert {run.kernel for run in configs.runs} == {kernel_name("cpu", op, codec) for op in ("compress", "decompress")
                                                     for codec in ("zvc", "exponent")}
    settled = {key[:3]: (key[3], launch) for key, (launch, _) in configs.chosen_codecs.items()}
    assert set(settled) == {("exponent", "compress", "float32"), ("exponent", "decompress", "float32")}
    bucket, launch = settled["exponent", "compress", "float32"]
    assert configs.launch_lookup("cpu", "compress", torch.float32, 4**bucket, codec="exponent") is launch
    assert {key[0] for key in configs.chosen} == {"compress", "decompress"}  # ZVC's, as before
    assert {k["codec"] for k in configs.summary()["kernels"]} == {"zvc", "exponent"}


@pytest.mark.parametrize("codecs", [("exponent", "bitpack"), ("zvc", "exponent")])
def test_a_stored_time_model_without_zvcs_times_is_left_to_the_runtime(tmp_path: Path, codecs: tuple[str, ...]) -> None:
    """A calibration of other codecs only has no ZVC times, which every compressing plan asks for:
    training then times the codecs itself, with a warning, instead of stopping at its first plan."""
    from cswap.predictors.features import TIME_FEATURES
    from cswap.predictors.persistence import save_time_model
    from cswap.predictors.timemodel import CalibratedTimeModel, LinearTimeModel
    from cswap.training.kernelconfigs import _calibrated_time_model

    store, fp = ConfigStore(tmp_path / "store.db"), fingerprint("cpu")
    coef = (1e-4, 0.25) + (0.0,) * (len(TIME_FEATURES) - 2)
    model = CalibratedTimeModel({("cpu", codec, op, 4): LinearTimeModel("cpu", codec, op, 4, (), coef)
                                 for codec in codecs for op in ("compress", "decompress")})
    save_time_model(fp, model, store)
    if "zvc" in codecs:
        assert _calibrated_time_model(fp, store, "cpu") == model
    else:
        with pytest.warns(UserWarning, match="no calibrated compress time for backend 'cpu', codec 'zvc'"):
            assert _calibrated_time_model(fp, store, "cpu") is None
