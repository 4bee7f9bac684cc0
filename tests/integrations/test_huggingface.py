"""The Hugging Face ``Trainer`` with ``CswapCallback``: a tiny BERT trained with gradient
accumulation ends with exactly the weights of the same run without the callback, under every
policy, while the runtime moves its activations; one ``rt.iteration()`` per optimizer step."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest
import torch

import cswap
from cswap.integrations.scope import mib
from cswap.options import POLICIES
from tests.integrations.conftest import acted, offload_everything

transformers = pytest.importorskip("transformers")
from cswap.integrations.huggingface import CswapCallback  # noqa: E402

SAMPLES, SEQ_LEN, VOCAB = 16, 12, 100
BATCH, ACCUMULATION, EPOCHS = 4, 2, 2
STEPS = EPOCHS * SAMPLES // (BATCH * ACCUMULATION)
# transformers 5 renamed gradient_checkpointing (still accepted, with a warning).
_ARGUMENTS = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
CHECKPOINTING = "activation_checkpointing" if "activation_checkpointing" in _ARGUMENTS else "gradient_checkpointing"


class _Tokens(torch.utils.data.Dataset):
    """Random token sequences with random binary labels."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(7)
        self.ids = torch.randint(1, VOCAB, (SAMPLES, SEQ_LEN), generator=g)
        self.ids[::3, -4:] = 0  # some padding, so the attention mask matters
        self.labels = torch.randint(0, 2, (SAMPLES,), generator=g)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": (self.ids[i] != 0).long(), "labels": self.labels[i]}


def _train(tmp_path: Path, callback: CswapCallback | None, checkpointing: bool = False) -> tuple[list[torch.Tensor], Any]:
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=SEQ_LEN, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, num_labels=2,
    )
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=BATCH, gradient_accumulation_steps=ACCUMULATION,
        num_train_epochs=EPOCHS, learning_rate=1e-3, use_cpu=True, report_to=[], save_strategy="no", logging_steps=1,
        seed=0, data_seed=0, disable_tqdm=True, dataloader_num_workers=0, **{CHECKPOINTING: checkpointing},
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens(), callbacks=[callback] if callback else None)
    trainer.train()
    return [p.detach().clone() for p in model.parameters()], trainer


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, list[torch.Tensor]]:
    return {checkpointing: _train(tmp_path_factory.mktemp("plain"), None, checkpointing)[0] for checkpointing in (False, True)}


def _assert_same_weights(expected: list[torch.Tensor], got: list[torch.Tensor], what: str) -> None:
    assert len(expected) == len(got)
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        assert torch.equal(e, g), f"{what}: parameter {i} differs from the run without the callback"


@pytest.mark.parametrize("policy", POLICIES)
def test_trainer_weights_bit_identical(plain, tmp_path: Path, policy: str) -> None:
    callback = CswapCallback(policy, **offload_everything(policy))
    weights, trainer = _train(tmp_path, callback)
    _assert_same_weights(plain[False], weights, policy)
    stats = callback.runtime.stats()
    assert trainer.state.global_step == STEPS
    # One iteration per optimizer step (not per micro-batch), the first of each epoch profiled.
    assert (stats.iterations, stats.profiled_iterations, stats.epoch) == (STEPS, EPOCHS, EPOCHS - 1)
    assert stats.packed_tensors > 0 and stats.resident_bytes == 0
    assert acted(stats, policy)
    logged = [record for record in trainer.state.log_history if "loss" in record]
    assert len(logged) == STEPS
    assert logged[-1]["cswap/offloaded_mib"] == mib(stats.offloaded_bytes)
    assert logged[-1]["cswap/peak_resident_mib"] == mib(stats.peak_resident_bytes)


def test_an_iteration_spans_every_micro_batch_of_a_step(tmp_path: Path) -> None:
    callback = CswapCallback("swap", **offload_everything("swap"))
    _train(tmp_path, callback)
    trace = callback.runtime.trace()
    # One iteration holds every micro-batch of its optimizer step; the profile is the first
    # micro-batch's (the others repeat it), so the word embedding's token ids are saved once in it.
    assert trace.meta["micro_batches"] == ACCUMULATION
    embedding_saves = [r for r in trace.tensors if r.producer.startswith("bert.embeddings.word_embeddings:")]
    assert len(embedding_saves) == 1
    stats = callback.runtime.stats()
    assert stats.iterations == STEPS and stats.packed_tensors == STEPS * ACCUMULATION * len(trace.tensors)
    assert stats.unknown_keys == 0  # every micro-batch's packs are numbered as the plan numbers them


@pytest.mark.parametrize("policy", ["swap", "cswap", "recompute", "capuchin"])
def test_trainer_with_gradient_checkpointing(plain, tmp_path: Path, policy: str) -> None:
    callback = CswapCallback(policy, **offload_everything(policy))
    weights, _ = _train(tmp_path, callback, checkpointing=True)
    _assert_same_weights(plain[True], weights, f"{policy} with gradient checkpointing")
    assert acted(callback.runtime.stats(), policy)


def test_a_step_that_raises_is_closed_by_the_next_train(tmp_path: Path) -> None:
    callback = CswapCallback("swap", **offload_everything("swap"))

    class Boom(transformers.TrainerCallback):
        def on_substep_end(self, args, state, control, **kwargs):
            raise KeyboardInterrupt("stopped by the user")

    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=SEQ_LEN)
    model = transformers.BertForSequenceClassification(config)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=BATCH, gradient_accumulation_steps=ACCUMULATION,
                                          max_steps=1, use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens(), callbacks=[callback, Boom()])
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    with pytest.raises(RuntimeError, match="already active in this thread"):
        with callback.runtime.iteration():
            pass
    trainer.pop_callback(Boom)
    trainer.train()
    stats = callback.runtime.stats()
    # The interrupted iteration is not counted, and its partial profile was dropped: the next one profiled.
    assert (stats.iterations, stats.profiled_iterations, stats.resident_bytes) == (1, 1, 0)


def test_the_context_manager_closes_a_step_that_raised() -> None:
    with pytest.raises(ValueError, match="in the step"):
        with CswapCallback("swap", device="cpu", min_bytes=0, d2h_gbps=1.0, h2d_gbps=1.0) as callback:
            callback.on_train_begin(None, None, None, model=torch.nn.Linear(4, 4))
            callback.on_step_begin(None, None, None)
            raise ValueError("in the step")
    x = torch.ones(3, requires_grad=True)
    x.exp().sum().backward()  # no cswap hooks left on this thread
    assert callback.runtime.stats().packed_tensors == 0


def test_bad_options_fail_when_the_callback_is_made() -> None:
    with pytest.raises(ValueError, match="choose one of none, swap"):
        CswapCallback("swop")
    with pytest.raises(TypeError, match="unknown Runtime option 'min_byte'"):
        CswapCallback("swap", min_byte=0)
    with pytest.raises(ValueError, match="budget"):
        CswapCallback("swap", memory_budget="-3GiB")


def test_disable_kv_cache_waits_for_the_model_and_a_bad_value_fails_at_once() -> None:
    """The callback is made before the Trainer hands it the model, whose configs
    ``disable_kv_cache=True`` turns the cache off in: it is taken then and checked against the
    model when the runtime is made; a value that is not a bool fails when the callback is made."""
    assert CswapCallback("recompute", disable_kv_cache=True)._kwargs["disable_kv_cache"] is True
    with pytest.raises(ValueError, match="disable_kv_cache='yes': must be true or false"):
        CswapCallback("recompute", disable_kv_cache="yes")


def test_a_memory_budget_reaches_the_runtime_that_takes_one() -> None:
    if "memory_budget" in inspect.signature(cswap.Runtime).parameters:
        assert CswapCallback("swap", memory_budget="1GiB")._kwargs["memory_budget"] == "1GiB"
    else:
        with pytest.raises(TypeError, match="takes no memory_budget: leave memory_budget=None"):
            CswapCallback("swap", memory_budget="1GiB")
    assert "memory_budget" not in CswapCallback("swap")._kwargs


# ----------------------------------------------------------------------------- gradient accumulation

GPT2_SEQ, GPT2_VOCAB, GPT2_SAMPLES, GPT2_STEPS = 16, 128, 32, 2


class _Text(torch.utils.data.Dataset):
    """Random token sequences, some padded, for a causal language model."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(11)
        self.ids = torch.randint(1, GPT2_VOCAB, (GPT2_SAMPLES, GPT2_SEQ), generator=g)
        self.ids[::3, -4:] = 0

    def __len__(self) -> int:
        return GPT2_SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": (self.ids[i] != 0).long(), "labels": self.ids[i]}


def _train_gpt2(tmp_path: Path, accumulation: int, callback: CswapCallback | None) -> list[torch.Tensor]:
    """A small GPT-2 (its config's defaults but the sizes: dropout, GELU, the KV cache on) for a few
    optimizer steps of ``accumulation`` micro-batches of 2 sequences each."""
    config = transformers.GPT2Config(vocab_size=GPT2_VOCAB, n_positions=GPT2_SEQ, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, gradient_accumulation_steps=accumulation,
        max_steps=GPT2_STEPS, learning_rate=1e-3, use_cpu=True, report_to=[], save_strategy="no", seed=0, data_seed=0,
        disable_tqdm=True, dataloader_num_workers=0,
    )
    transformers.Trainer(model=model, args=args, train_dataset=_Text(), callbacks=[callback] if callback else None).train()
    return [p.detach().clone() for p in model.parameters()]


def _least_budget(tmp_path: Path, accumulation: int, policy: str) -> int:
    with pytest.raises(cswap.BudgetError) as raised:
        _train_gpt2(tmp_path, accumulation, CswapCallback(policy, memory_budget=1, **offload_everything(policy)))
    return raised.value.minimum_bytes


def test_gradient_accumulation_keeps_the_budget_of_one_micro_batch(tmp_path: Path) -> None:
    """With 1, 2 or 4 micro-batches per optimizer step a fractional budget resolves against what
    plain PyTorch holds at once (one micro-batch's activations), the peak is the same, and so is
    each policy's least budget; the weights match the same Trainer run without cswap."""
    budgets, peaks, least = {}, {}, {}
    for accumulation in (1, 2, 4):
        plain = _train_gpt2(tmp_path / f"plain{accumulation}", accumulation, None)
        for policy, budget in (("none", 1.0), ("swap", 0.5)):
            callback = CswapCallback(policy, memory_budget=budget, **offload_everything(policy))
            weights = _train_gpt2(tmp_path / f"{policy}{accumulation}", accumulation, callback)
            _assert_same_weights(plain, weights, f"{policy} with accumulation {accumulation}")
            stats = callback.runtime.stats()
            assert callback.runtime.trace().meta["micro_batches"] == accumulation
            assert stats.peak_resident_bytes <= stats.budget_bytes
            budgets[policy, accumulation], peaks[policy, accumulation] = stats.budget_bytes, stats.peak_resident_bytes
        least[accumulation] = _least_budget(tmp_path / f"least{accumulation}", accumulation, "recompute")
    for policy in ("none", "swap"):
        assert budgets[policy, 2] == budgets[policy, 4] == budgets[policy, 1], budgets
    assert peaks["none", 2] == peaks["none", 4] == peaks["none", 1] == budgets["none", 1], peaks
    assert least[2] == least[4] == least[1], least


class _Lengths(torch.utils.data.Dataset):
    """Token sequences of 20 to 120 tokens, for a collator that pads each batch to its longest."""

    def __init__(self, samples: int = 32) -> None:
        g = torch.Generator().manual_seed(13)
        lengths = torch.randint(20, 121, (samples,), generator=g).tolist()
        self.ids = [torch.randint(1, GPT2_VOCAB, (n,), generator=g) for n in lengths]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i]}


def _pad_to_longest(features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """What ``DataCollatorWithPadding`` does for a causal LM: right padding to the batch's longest,
    the padding masked out of attention and of the loss."""
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, f in enumerate(features):
        ids[row, : len(f["input_ids"])] = f["input_ids"]
        mask[row, : len(f["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def _train_padded(tmp_path: Path, callback: CswapCallback | None, bf16: bool = False) -> tuple[list[torch.Tensor], Any]:
    config = transformers.GPT2Config(vocab_size=GPT2_VOCAB, n_positions=128, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=8,
        learning_rate=1e-3, use_cpu=True, report_to=[], save_strategy="no", seed=0, data_seed=0, disable_tqdm=True,
        dataloader_num_workers=0, logging_steps=1, bf16=bf16,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Lengths(), data_collator=_pad_to_longest,
                                   callbacks=[callback] if callback else None)
    trainer.train()
    return [p.detach().clone() for p in model.parameters()], trainer


def test_a_collator_padding_to_the_longest_profiles_once_per_graph(tmp_path: Path) -> None:
    """Each micro-batch padded to its own longest (20 to 120 tokens), accumulation 2, budget 0.6:
    the weights are those of the Trainer without cswap, at most 3 of the 8 steps profile, the
    budget holds and the Trainer's logs carry the profile counts."""
    plain, _ = _train_padded(tmp_path / "plain", None)
    callback = CswapCallback("cswap", memory_budget=0.6)
    weights, trainer = _train_padded(tmp_path / "cswap", callback)
    _assert_same_weights(plain, weights, "cswap under dynamic padding")
    stats = callback.runtime.stats()
    assert stats.iterations == 8 and stats.profiled_iterations <= 3, stats
    assert stats.peak_resident_bytes <= stats.budget_bytes
    logged = [entry for entry in trainer.state.log_history if "cswap/profiled_iterations" in entry]
    assert logged and logged[-1]["cswap/profiled_iterations"] == stats.profiled_iterations
    assert logged[-1]["cswap/unprofiled_plans"] == stats.unprofiled_plans


@pytest.mark.parametrize("policy", ["cswap", "compress-swap"])
def test_bf16_mixed_precision_under_dynamic_padding_ends_with_the_same_weights(tmp_path: Path, policy: str) -> None:
    """``bf16=True``, the Trainer's mixed precision (autocast; float32 weights), with each micro-batch
    padded to its longest and accumulation 2, at 0.4 of ``none``'s peak: the saved activations are
    autocast's bfloat16 beside float32, the budget holds at every step, and the weights are those of
    the same Trainer without cswap, bit for bit."""
    plain, _ = _train_padded(tmp_path / "plain", None, bf16=True)
    callback = CswapCallback(policy, memory_budget=0.4)
    weights, _ = _train_padded(tmp_path / policy, callback, bf16=True)
    _assert_same_weights(plain, weights, f"{policy} under bf16 mixed precision")
    stats = callback.runtime.stats()
    assert stats.budget_bytes is not None and stats.peak_resident_bytes <= stats.budget_bytes, stats
    assert {"bfloat16", "float32"} <= {t.dtype for t in callback.runtime.trace().tensors}
    moved = stats.actions["zvc-swap"] if policy == "compress-swap" else stats.actions["swap"]
    assert moved > 0, stats.actions
