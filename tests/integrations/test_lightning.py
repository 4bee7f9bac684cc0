"""Lightning with ``CswapCallback``: a small CNN trained with ``accumulate_grad_batches=2`` ends with
exactly the weights of the same run without the callback, under every policy, while the runtime
moves its activations; one ``rt.iteration()`` per optimizer step, its stats logged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from cswap.integrations.scope import mib
from cswap.options import POLICIES
from tests.integrations.conftest import acted, offload_everything

pl = pytest.importorskip("lightning.pytorch")
from cswap.integrations.lightning import CswapCallback  # noqa: E402

SAMPLES, BATCH, ACCUMULATION, EPOCHS = 16, 4, 2, 2
STEPS = EPOCHS * SAMPLES // (BATCH * ACCUMULATION)


class SmallCNN(pl.LightningModule):
    """conv-BN-ReLU-pool, dropout, linear: sparse ReLU outputs for the codec, dropout for the RNG."""

    def __init__(self, manual: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
            nn.Dropout(0.2), nn.Linear(64, 10),
        )
        self.automatic_optimization = not manual

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor | None:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        if self.automatic_optimization:
            return loss
        optimizer = self.optimizers()
        self.manual_backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _loader() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(3)
    data = torch.utils.data.TensorDataset(torch.randn(SAMPLES, 3, 16, 16, generator=g), torch.randint(0, 10, (SAMPLES,), generator=g))
    return torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=False)


def _fit(tmp_path: Path, callback: CswapCallback | None, manual: bool = False) -> tuple[list[torch.Tensor], Any]:
    pl.seed_everything(0, verbose=False)
    model = SmallCNN(manual)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=EPOCHS, deterministic=True, accumulate_grad_batches=1 if manual else ACCUMULATION,
        enable_checkpointing=False, logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=str(tmp_path), callbacks=[callback] if callback else None,
    )
    trainer.fit(model, _loader())
    return [p.detach().clone() for p in model.parameters()], trainer


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> list[torch.Tensor]:
    return _fit(tmp_path_factory.mktemp("plain"), None)[0]


def _assert_same_weights(expected: list[torch.Tensor], got: list[torch.Tensor], what: str) -> None:
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        assert torch.equal(e, g), f"{what}: parameter {i} differs from the run without the callback"


@pytest.mark.parametrize("policy", POLICIES)
def test_lightning_weights_bit_identical(plain, tmp_path: Path, policy: str) -> None:
    callback = CswapCallback(policy, **offload_everything(policy))
    weights, trainer = _fit(tmp_path, callback)
    _assert_same_weights(plain, weights, policy)
    stats = callback.runtime.stats()
    assert trainer.global_step == STEPS
    # One iteration per optimizer step (not per batch), the first of each epoch profiled.
    assert (stats.iterations, stats.profiled_iterations, stats.epoch) == (STEPS, EPOCHS, EPOCHS - 1)
    assert stats.packed_tensors > 0 and stats.resident_bytes == 0
    assert acted(stats, policy)
    logged = trainer.callback_metrics
    assert float(logged["cswap/offloaded_mib"]) == pytest.approx(mib(stats.offloaded_bytes), rel=1e-6)
    assert float(logged["cswap/peak_resident_mib"]) == pytest.approx(mib(stats.peak_resident_bytes), rel=1e-6)


def test_manual_optimization_runs_one_iteration_per_batch(tmp_path: Path) -> None:
    expected, _ = _fit(tmp_path / "plain", None, manual=True)
    callback = CswapCallback("swap", **offload_everything("swap"))
    weights, _ = _fit(tmp_path / "cswap", callback, manual=True)
    _assert_same_weights(expected, weights, "manual optimization")
    stats = callback.runtime.stats()
    assert stats.iterations == EPOCHS * SAMPLES // BATCH and stats.offloaded_bytes > 0


def test_an_exception_closes_the_open_iteration(tmp_path: Path) -> None:
    class Boom(pl.Callback):
        def on_before_backward(self, trainer, pl_module, loss):
            raise ValueError("stopped inside the step")

    callback = CswapCallback("swap", **offload_everything("swap"))
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, enable_checkpointing=False, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                         callbacks=[callback, Boom()])
    with pytest.raises(ValueError, match="stopped inside the step"):
        trainer.fit(SmallCNN(), _loader())
    with callback.runtime.iteration():  # the runtime is free again, and its hooks were removed
        pass
    x = torch.ones(3, requires_grad=True)
    before = callback.runtime.stats().packed_tensors
    x.exp().sum().backward()
    assert callback.runtime.stats().packed_tensors == before


def test_bad_options_fail_when_the_callback_is_made() -> None:
    with pytest.raises(ValueError, match="choose one of none, swap"):
        CswapCallback("swop")
    with pytest.raises(RuntimeError, match="made when fitting begins"):
        _ = CswapCallback("swap").runtime
