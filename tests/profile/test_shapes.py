"""Sizes a plan is made for at a length no profile saw: what the packs show, and what they hide
inside recompute regions, inferred from it (:mod:`cswap.profile.shapes`)."""

from __future__ import annotations

import copy

import pytest
import torch

import cswap
from cswap.planner.budgeted import NO_CODEC, SPARSITY_MARGIN, problem_from_trace
from cswap.planner.solve import minimum_bytes
from cswap.profile.shapes import SizeMap, grown_shapes, scaled_trace
from cswap.profile.trace import TensorRecord, Trace

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("seen", "old", "new"),
    [
        ([((4, 59, 64), (4, 112, 64))], 59, 112),  # the sequence, seen
        ([((4, 59, 64), (4, 112, 64))], 236, 448),  # a flattened batch of it, not seen
        ([((4, 59, 64), (4, 112, 64))], 64, 64),  # the width, seen unchanged
        ([((80, 256), (224, 256))], 40, 112),  # the sequence inside a flattened batch of 2, not seen
        ([((80, 256), (224, 256))], 2, 2),  # that batch
        ([((80, 256), (224, 256))], 20, 56),  # a factor of it like a sequence's: grown (too large costs plan quality only)
        ([((80, 256), (224, 256))], 256, 256),
        ([((80, 256), (224, 256)), ((2, 40), (2, 40))], 40, 40),  # a size seen unchanged stays
        ([((96, 8), (224, 8))], 32, 32),  # 96 / 32 = 3, and 224 is not 3 times anything
        ([((3, 96, 128), (3, 120, 128))], 12, 12),  # a sequence seen behind its batch: 12 is not 96 / 8
        ([((3, 96, 128), (3, 120, 128)), ((288, 128), (360, 128))], 32, 32),  # nor 32 of 288 = 3 x 96, 9 x 32
        ([((3, 96, 128), (3, 120, 128))], 288, 360),  # its batch of 3, flattened, grows
    ],
)
def test_a_size_the_packs_did_not_show_grows_with_what_it_is_part_of(seen: list, old: int, new: int) -> None:
    assert SizeMap.learn(seen).size(old) == new


def _lm_trace(base: torch.nn.Module, length: int, batch: int = 2) -> Trace:
    model = copy.deepcopy(base)
    rt = cswap.Runtime("none", model=model, device="cpu")
    ids = torch.randint(3, 250, (batch, length), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    with rt.iteration():
        model(input_ids=ids, labels=ids).loss.backward()
    return rt.trace()


def _none_bytes(trace: Trace) -> int:
    return minimum_bytes(problem_from_trace(trace, NO_CODEC, "cpu", min_bytes=0, sparsity_margin=SPARSITY_MARGIN), "none")


def test_a_region_around_the_whole_body_leaves_only_the_flattened_loss_to_see() -> None:
    """BART as a causal LM (its decoder, as ``AutoModelForCausalLM`` builds it), the library's
    defaults at small sizes: recomputing ``model.decoder`` whole, a longer length packs only the
    loss's ``[batch x sequence, vocabulary]`` tensors. Scaled from those, the 40-token profile gives
    ``none``'s peak at 112 tokens as a 112-token profile does (unscaled inside, 2.2 MiB for 3.4: a
    fraction's bytes resolved that low, and two steps passed the budget by up to 42%)."""
    config = transformers.BartConfig(vocab_size=256, d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                     decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256)
    torch.manual_seed(0)
    base = transformers.BartForCausalLM(config).train()
    short, long = _lm_trace(base, 40), _lm_trace(base, 112)
    outside = {r.key: long.tensors[r.key].shape for r in short.tensors if not r.module.startswith("model.decoder")}
    assert outside and all(len(shape) <= 2 for shape in outside.values())  # the loss's tensors only
    scaled = scaled_trace(short, grown_shapes(short, outside))
    assert [r.shape for r in scaled.tensors] == [r.shape for r in long.tensors]
    assert _none_bytes(scaled) == _none_bytes(long) > 2 * _none_bytes(short)


def test_a_slice_of_an_activation_grows_with_its_storage() -> None:
    """GPT-NeoX (the library's defaults at small sizes, the key/value cache off as training turns
    it off) saves its values as a third of its fused projection, which keeping them holds: a
    40-token profile scaled to 112 tokens holds that projection's bytes as a 112-token profile
    does. Left at the profile's, a longer step's keeps were planned at a third of the projection
    and ``none`` passed all of its own peak."""
    config = transformers.GPTNeoXConfig(vocab_size=256, hidden_size=128, intermediate_size=512, num_attention_heads=4,
                                        num_hidden_layers=2, use_cache=False)
    torch.manual_seed(0)
    base = transformers.GPTNeoXForCausalLM(config).train()
    short, long = _lm_trace(base, 40), _lm_trace(base, 112)
    assert sum(r.storage_nbytes is not None for r in long.tensors) == 2  # one per layer
    scaled = scaled_trace(short, {r.key: long.tensors[r.key].shape for r in short.tensors})
    assert [r.storage_nbytes for r in scaled.tensors] == [r.storage_nbytes for r in long.tensors]
    assert _none_bytes(scaled) == _none_bytes(long)


def test_a_step_of_a_scan_keeps_a_storage_that_grows_with_the_sequence() -> None:
    """A scan saves one step's slice of a tensor over the whole sequence (Mamba's reference path):
    the slice stays as it is at a longer length, the storage it keeps grows as the tensor does."""
    whole = TensorRecord(key=0, shape=(2, 256, 40, 16), dtype="bfloat16", nbytes=2 * 256 * 40 * 16 * 2, sparsity=0.0)
    step = TensorRecord(key=1, shape=(2, 256, 16), dtype="bfloat16", nbytes=2 * 256 * 16 * 2, sparsity=0.0, view_of=0,
                        storage_nbytes=whole.nbytes)
    scaled = scaled_trace(Trace(tensors=(whole, step)), {0: (2, 256, 112, 16)})
    assert scaled.tensors[1].shape == step.shape and scaled.tensors[1].nbytes == step.nbytes
    assert scaled.tensors[1].storage_nbytes == scaled.tensors[0].nbytes == 2 * 256 * 112 * 16 * 2


def _bert() -> torch.nn.Module:
    config = transformers.BertConfig(vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=256)
    return transformers.BertForMaskedLM(config)


def _distilbert() -> torch.nn.Module:
    # its feed-forward width as shipped, 3072: 32 x 96 tokens
    return transformers.DistilBertForMaskedLM(transformers.DistilBertConfig(vocab_size=256, dim=128, n_layers=2, n_heads=4))


@pytest.mark.parametrize(("build", "layers"), [(_bert, "bert.encoder.layer"), (_distilbert, "distilbert.transformer.layer")])
def test_layers_recomputed_scale_by_the_sequence_seen_outside(build, layers: str) -> None:
    """Masked LMs, the library's defaults at small sizes, batch 3 with 4 heads: recomputing each
    layer leaves ``[3, sequence, ...]`` packs outside, from which a 96-token profile scales to 120
    tokens exactly as a 120-token profile is. Inside, BERT's ``[12, 96, 96]`` scores and
    ``[12, 96, 32]`` heads (12 and 32 divide 96 and 288: taken for sequences of a flattened batch,
    none's peak came out 11% high) and DistilBERT's 3072-wide feed-forward (32 x 96: taken for a
    flattened batch of 32 sequences, 18% high) keep their widths."""
    torch.manual_seed(0)
    base = build().train()
    short, long = _lm_trace(base, 96, batch=3), _lm_trace(base, 120, batch=3)
    outside = {r.key: long.tensors[r.key].shape for r in short.tensors if not r.module.startswith(layers)}
    assert any(len(shape) == 3 and shape[0] == 3 for shape in outside.values())  # the sequence behind its batch
    assert len(outside) < len(short.tensors) // 2
    scaled = scaled_trace(short, grown_shapes(short, outside))
    offloadable = [r.key for r in long.tensors if r.offloadable]
    assert [scaled.tensors[k].shape for k in offloadable] == [long.tensors[k].shape for k in offloadable]
    assert _none_bytes(scaled) == _none_bytes(long)
