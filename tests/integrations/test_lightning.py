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


transformers = pytest.importorskip("transformers")

#: Per batch, the lengths of its 3 sequences; accumulation 2: the first step's second micro-batch is
#: its longest, and no later one is longer.
PADDED_LENGTHS = [(40, 25, 33), (96, 60, 12), (96, 9, 50), (64, 64, 7), (30, 5, 9), (96, 80, 79)]


class PaddedLM(pl.LightningModule):
    """GPT-2 from its config class (small sizes, the library's defaults otherwise) on batches padded
    to their longest sequence, with an attention mask and labels ignored on the padding."""

    def __init__(self) -> None:
        super().__init__()
        config = transformers.GPT2Config(vocab_size=256, n_positions=128, n_embd=64, n_layer=2, n_head=2)
        self.model = transformers.GPT2LMHeadModel(config)

        self.validation_losses: list[torch.Tensor] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ids, mask = batch
        return self.model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.validation_losses.append(self.training_step(batch, batch_idx).detach().clone())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _padded_loader() -> torch.utils.data.DataLoader:
    def collate(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        longest = max(len(r) for r in rows)
        ids, mask = torch.zeros(len(rows), longest, dtype=torch.long), torch.zeros(len(rows), longest, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, :len(row)], mask[i, :len(row)] = row, 1
        return ids, mask

    g = torch.Generator().manual_seed(5)
    rows = [torch.randint(1, 256, (n,), generator=g) for lengths in PADDED_LENGTHS for n in lengths]
    return torch.utils.data.DataLoader(rows, batch_size=3, shuffle=False, collate_fn=collate)


class _StepPeaks(pl.Callback):
    """Each optimizer step's peak and the budget in force, read after the iteration closed."""

    def __init__(self, callback: CswapCallback) -> None:
        self.callback = callback
        self.seen: list[tuple[int, int | None]] = []

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        stats = self.callback.runtime.stats()
        self.seen.append((stats.iteration_peak_resident_bytes, stats.budget_bytes))


def _fit_padded(tmp_path: Path, callback: CswapCallback | None, validate: bool = False,
                ) -> tuple[list[torch.Tensor], list[tuple[int, int | None]]]:
    """The weights after one epoch (and with ``validate``, every validation loss after them) and
    each step's peak and budget; ``validate`` checks one batch after every training batch, so
    between the two micro-batches of each step too."""
    pl.seed_everything(0, verbose=False)
    module = PaddedLM()
    peaks = _StepPeaks(callback) if callback is not None else None
    validation = dict(val_check_interval=1, limit_val_batches=1, num_sanity_val_steps=0) if validate else {}
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, deterministic=True, accumulate_grad_batches=2, precision="bf16-mixed",
        enable_checkpointing=False, logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=str(tmp_path), callbacks=[callback, peaks] if callback is not None else None, **validation,
    )
    trainer.fit(module, _padded_loader(), _padded_loader() if validate else None)
    return [p.detach().clone() for p in module.parameters()] + module.validation_losses, peaks.seen if peaks is not None else []


@pytest.mark.parametrize("validate", [False, True], ids=["train", "validating-between-micro-batches"])
@pytest.mark.parametrize("policy", ["cswap", "recompute"])
def test_a_transformer_padded_per_batch_under_bf16_mixed_precision(tmp_path: Path, policy: str, validate: bool) -> None:
    """``precision="bf16-mixed"`` (autocast over float32 weights), each batch padded to its longest,
    ``accumulate_grad_batches=2``, at 0.5 of ``none``'s peak: the first step's longer micro-batch is
    planned for from its profile (one profile, no step outgrows the plan or plans again), every
    step is within the budget, and the weights are those of the run without the callback.
    ``disable_kv_cache=True`` is taken when the callback is made, before it has the model.

    ``validate``: ``val_check_interval=1`` validates after every training batch, so inside each
    step's open iteration, between its two micro-batches: an eval-mode forward without grad through
    the model whose blocks the runtime recomputes. Every validation loss is that of the run without
    the callback too, and the runtime sees the steps it sees without validation."""
    plain, _ = _fit_padded(tmp_path / "plain", None, validate)
    if validate:
        assert len(plain) == len(list(PaddedLM().parameters())) + len(PADDED_LENGTHS), "a validation after every batch"
    callback = CswapCallback(policy, memory_budget=0.5, log_stats=False, disable_kv_cache=True)
    weights, seen = _fit_padded(tmp_path / policy, callback, validate)
    _assert_same_weights(plain, weights, f"{policy} under bf16-mixed with padded batches" + (", validating" if validate else ""))
    stats = callback.runtime.stats()
    assert (stats.iterations, stats.profiled_iterations, stats.unprofiled_plans, stats.outgrown_tensors) == (3, 1, 0, 0), stats
    assert len(seen) == 3 and all(budget is not None and peak <= budget for peak, budget in seen), seen
    assert {"bfloat16", "float32"} <= {t.dtype for t in callback.runtime.trace().tensors}
    if policy == "recompute":  # the callback's disable_kv_cache=True let GPT-2's blocks be recomputed
        assert stats.actions["recompute"] > 0, stats.actions
