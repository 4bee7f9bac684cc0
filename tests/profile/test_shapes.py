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
from cswap.profile.trace import Trace

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
    ],
)
def test_a_size_the_packs_did_not_show_grows_with_what_it_is_part_of(seen: list, old: int, new: int) -> None:
    assert SizeMap.learn(seen).size(old) == new


def _bart_trace(base: torch.nn.Module, length: int) -> Trace:
    model = copy.deepcopy(base)
    rt = cswap.Runtime("none", model=model, device="cpu")
    ids = torch.randint(3, 250, (2, length), generator=torch.Generator().manual_seed(1))
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
    short, long = _bart_trace(base, 40), _bart_trace(base, 112)
    outside = {r.key: long.tensors[r.key].shape for r in short.tensors if not r.module.startswith("model.decoder")}
    assert outside and all(len(shape) <= 2 for shape in outside.values())  # the loss's tensors only
    scaled = scaled_trace(short, grown_shapes(short, outside))
    assert [r.shape for r in scaled.tensors] == [r.shape for r in long.tensors]
    assert _none_bytes(scaled) == _none_bytes(long) > 2 * _none_bytes(short)
