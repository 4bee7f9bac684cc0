"""What the callbacks put in a trainer's logs: a few figures in MiB per record, and the budget in
force said once, where a user who set up no logging sees it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cswap.integrations.scope import log_values, make_runtime, mib
from tests.integrations.conftest import offload_everything

KEYS = {"cswap/peak_resident_mib", "cswap/budget_mib", "cswap/offloaded_mib", "cswap/profiled_iterations", "cswap/unprofiled_plans"}


class _Lines(logging.Handler):
    """Keeps the records a logger passes on."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_mib_keeps_three_digits_below_one_mib_and_hundredths_above() -> None:
    assert (mib(94_180_000), mib(3 << 30), mib(1536), mib(0)) == (89.82, 3072.0, 0.00146, 0.0)


def test_log_values_are_the_few_figures_in_mib() -> None:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    runtime = make_runtime({"policy": "swap", "min_bytes": 0, "device": "cpu", "memory_budget": "3MiB",
                            "d2h_gbps": 10.0, "h2d_gbps": 10.0}, model)
    for _ in range(2):
        with runtime.iteration():
            model(torch.randn(512, 256)).square().mean().backward()
    values, stats = log_values(runtime), runtime.stats()
    assert set(values) == KEYS
    assert values["cswap/budget_mib"] == 3.0
    assert values["cswap/peak_resident_mib"] == round(stats.peak_resident_bytes / 2**20, 2) > 0
    assert values["cswap/offloaded_mib"] == round(stats.offloaded_bytes / 2**20, 2) > 0
    assert (values["cswap/profiled_iterations"], values["cswap/unprofiled_plans"]) == (1, 0)
    assert isinstance(values["cswap/profiled_iterations"], int)
    assert "e+" not in repr(values) and "e-" not in repr(values)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    """A tiny BERT trained by the Trainer under swap at half of none's peak, with the records the
    Trainer's logger passed on."""
    pytest.importorskip("transformers")
    from cswap.integrations.huggingface import CswapCallback
    from tests.integrations.test_huggingface import _train

    lines = _Lines()
    trainer_logger = logging.getLogger("transformers.trainer")
    trainer_logger.addHandler(lines)
    try:
        callback = CswapCallback("swap", memory_budget=0.5, **offload_everything("swap"))
        _, trainer = _train(tmp_path_factory.mktemp("logs"), callback)
    finally:
        trainer_logger.removeHandler(lines)
    return callback, trainer, lines.records


def test_each_record_carries_the_few_figures_in_mib(trained) -> None:
    callback, trainer, _ = trained
    stats = callback.runtime.stats()
    logged = [record for record in trainer.state.log_history if "loss" in record]
    assert logged and all({k for k in record if k.startswith("cswap/")} == KEYS for record in logged)
    last = logged[-1]
    assert last["cswap/budget_mib"] == mib(stats.budget_bytes)
    assert last["cswap/peak_resident_mib"] == mib(stats.peak_resident_bytes) <= last["cswap/budget_mib"]
    assert last["cswap/offloaded_mib"] == mib(stats.offloaded_bytes)
    assert last["cswap/profiled_iterations"] == stats.profiled_iterations == 2
    cswap_part = {k: v for k, v in last.items() if k.startswith("cswap/")}
    assert len(repr(cswap_part)) < 200 and "e+" not in repr(cswap_part)


def test_the_budget_is_said_once_on_the_trainers_logger(trained) -> None:
    callback, _, records = trained
    said = [r for r in records if r.getMessage().startswith("cswap:")]
    assert [r.getMessage() for r in said] == [
        f"cswap: policy swap keeps saved activations within {mib(callback.runtime.stats().budget_bytes)} MiB on the device "
        "(memory_budget=0.5: that fraction of policy none's peak, as profiled)"
    ]
    # transformers shows its loggers' warnings, and not their infos, when nobody set up logging
    assert said[0].levelno == logging.WARNING and said[0].name == "transformers.trainer"


def test_lightning_says_the_budget_once(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    from cswap.integrations.lightning import CswapCallback
    from tests.integrations.test_lightning import _fit

    lines = _Lines()
    shown = logging.getLogger("lightning.pytorch")
    shown.addHandler(lines)
    try:
        callback = CswapCallback("swap", memory_budget="1MiB", **offload_everything("swap"))
        _, trainer = _fit(tmp_path, callback)
    finally:
        shown.removeHandler(lines)
    said = [r.getMessage() for r in lines.records if r.getMessage().startswith("cswap:")]
    assert said == ["cswap: policy swap keeps saved activations within 1.0 MiB on the device (memory_budget='1MiB')"]
    assert float(trainer.callback_metrics["cswap/budget_mib"]) == 1.0
