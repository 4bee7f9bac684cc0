"""Meta traces of transformers: the paper's per-layer activation bytes, the attention core, and sanity over models.

The reference is Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models", MLSys 2023, Section 4.1: one transformer layer with 16-bit activations, 1-byte dropout
masks and no parallelism stores

    s*b*h*(34 + 5*a*s/h) bytes

(s: sequence length, b: micro-batch, h: hidden size, a: attention heads), of which ``5*a*s*s*b``
is the attention core (softmax output 2*a*s*s*b, its dropout mask a*s*s*b, the dropped-out
probabilities 2*a*s*s*b) that selective recomputation recomputes instead.

The trace's dropout masks are 1-byte bools as the paper counts them, because the trace runs
dropout as CUDA's fused ``native_dropout`` (:mod:`cswap.simulate.gpukernels`); torch's CPU and
meta decomposition would save a mask in the activations' dtype. torch also saves what the paper
does not count: each LayerNorm's float32 mean and rstd (``b x s`` each), 16*s*b bytes a layer.
"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch
from torch import nn

from cswap.models.transformer import TransformerSpec
from cswap.profile.trace import Trace
from cswap.simulate.lmtrace import attention_core_keys, layer_index, transformer_trace

pytest.importorskip("transformers")

#: GPT-3 175B's layer as the paper counts it (Table 3): s=2048, h=12288, a=96, and b=1.
S, H, A, B = 2048, 12288, 96, 1

TINY = {
    "gpt2": TransformerSpec(
        "gpt2-tiny",
        "gpt2",
        config=dict(n_layer=2, n_embd=128, n_head=4, n_positions=256, vocab_size=512),
        source="test",
        seq_len=64,
    ),
    "llama": TransformerSpec(
        "llama-tiny",
        "llama",
        config=dict(
            num_hidden_layers=2,
            hidden_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=256,
            vocab_size=512,
            max_position_embeddings=256,
        ),
        source="test",
        seq_len=64,
    ),
    "bert": TransformerSpec(
        "bert-tiny",
        "bert",
        task="masked-lm",
        config=dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=512, vocab_size=512),
        source="test",
        seq_len=64,
    ),
}


def _activation_bytes(trace: Trace) -> int:
    return sum(r.nbytes for r in trace.tensors if r.offloadable)


@pytest.fixture(scope="module")
def gpt3_layers() -> dict[int, Trace]:
    """Eager traces of 1 and 2 GPT-3 175B layers (bfloat16 activations, the presets' dropout of 0.1)."""
    return {
        n: transformer_trace("gpt3-175b-layer", batch_size=B, seq_len=S, num_layers=n, attention="eager", dtype="bfloat16")
        for n in (1, 2)
    }


def test_gpt3_layer_saves_the_papers_bytes(gpt3_layers) -> None:
    """Per layer, the trace of 2 layers less the trace of 1 (embeddings, final norm and loss cancel)."""
    per_layer = _activation_bytes(gpt3_layers[2]) - _activation_bytes(gpt3_layers[1])
    formula = S * B * H * (34 + 5 * A * S / H)
    assert per_layer == pytest.approx(formula, rel=0.02)
    # The whole difference, exactly: torch's LayerNorm also saves its float32 mean and rstd
    # (b x s x 1 each, two per LayerNorm, two LayerNorms a layer), which the paper does not count.
    layer_norm_statistics = 2 * 2 * B * S * 4
    assert per_layer - formula == layer_norm_statistics
    # Grouping the 2-layer trace's records by layer gives the same bytes for each layer.
    by_layer = Counter()
    for record in gpt3_layers[2].tensors:
        if record.offloadable and layer_index(record.module) is not None:
            by_layer[layer_index(record.module)] += record.nbytes
    assert by_layer == {0: per_layer, 1: per_layer}


def test_gpt3_layer_records_are_the_papers_terms(gpt3_layers) -> None:
    """Each saved tensor of layer 1, in units of s*b*h bytes, against Section 4.1's list."""
    sbh = S * B * H
    terms = sorted(
        (round(r.nbytes / sbh, 4), r.dtype) for r in gpt3_layers[2].tensors if r.offloadable and layer_index(r.module) == 1
    )
    attention_square = 2 * A * S / H  # 2*a*s*s*b bytes in sbh units: 32
    assert terms == sorted(
        [
            (2.0, "bfloat16"),  # LayerNorm 1 input
            (2.0, "bfloat16"),  # QKV projection input (LayerNorm 1 output)
            (2.0, "bfloat16"),
            (2.0, "bfloat16"),  # Q and K for Q K^T
            (attention_square, "bfloat16"),  # softmax output
            (attention_square / 2, "bool"),  # attention dropout mask
            (attention_square, "bfloat16"),  # dropped-out probabilities, for the product with V
            (2.0, "bfloat16"),  # V
            (2.0, "bfloat16"),  # output projection input
            (1.0, "bool"),  # its dropout mask
            (2.0, "bfloat16"),  # LayerNorm 2 input
            (2.0, "bfloat16"),  # MLP first linear input
            (8.0, "bfloat16"),  # GeLU input
            (8.0, "bfloat16"),  # MLP second linear input
            (1.0, "bool"),  # MLP dropout mask
            *[(round(B * S * 4 / sbh, 4), "float32")] * 4,  # LayerNorm mean and rstd: not in the paper
        ]
    )


def test_attention_core_is_exactly_five_a_s_s_b(gpt3_layers) -> None:
    trace = gpt3_layers[1]
    core = [trace.tensors[k] for k in sorted(attention_core_keys(trace))]
    assert sum(r.nbytes for r in core) == 5 * A * S * S * B
    assert sorted((r.producer.split(":")[1], r.dtype, r.nbytes) for r in core) == sorted(
        [
            ("SoftmaxBackward0", "bfloat16", 2 * A * S * S * B),
            ("NativeDropoutBackward0", "bool", A * S * S * B),
            ("BmmBackward0", "bfloat16", 2 * A * S * S * B),
        ]
    )
    assert all(r.module == "transformer.h.0.attn (GPT2Attention)" and r.offloadable for r in core)
    # What is left of the layer without the core is the paper's 34*s*b*h (and the LayerNorm statistics).
    per_layer = _activation_bytes(gpt3_layers[2]) - _activation_bytes(trace)
    assert per_layer - 5 * A * S * S * B == 34 * S * B * H + 2 * 2 * B * S * 4


def test_a_fused_kernel_saves_no_attention_core() -> None:
    trace = transformer_trace("gpt3-175b-layer", batch_size=B, seq_len=S, num_layers=1, attention="sdpa")
    assert attention_core_keys(trace) == frozenset()
    flash = [r for r in trace.tensors if r.producer.endswith("ScaledDotProductFlashAttentionBackward0")]
    # query, key, value, output, log-sum-exp and the dropout RNG's seed and offset; no s x s tensor
    assert sorted(r.shape for r in flash) == sorted([(B, A, S, H // A)] * 4 + [(B, A, S), (2,), ()])
    (log_sum_exp,) = [r for r in flash if r.shape == (B, A, S)]  # an output of the kernel, so its FLOPs are the kernel's
    assert log_sum_exp.flops == 4 * B * A * S * S * (H // A)  # torch.utils.flop_counter's two products


@pytest.fixture(scope="module", params=sorted(TINY))
def family(request) -> str:
    return request.param


def _tiny(family: str, **kwargs) -> Trace:
    options = {"batch_size": 2, "attention": "eager", "dtype": "bfloat16", "hardware": "a100-pcie4", **kwargs}
    return transformer_trace(TINY[family], **options)


def test_eager_saves_square_tensors_and_sdpa_does_not(family: str) -> None:
    s = TINY[family].seq_len
    square = {
        att: [r for r in _tiny(family, attention=att).tensors if r.offloadable and r.shape[-2:] == (s, s)]
        for att in ("eager", "sdpa")
    }
    assert square["sdpa"] == []
    assert len(square["eager"]) >= 2 * 2  # at least two per layer: the probabilities and their copy or mask
    eager, sdpa = _tiny(family, attention="eager"), _tiny(family, attention="sdpa")
    assert _activation_bytes(eager) > _activation_bytes(sdpa)
    assert {eager.tensors[k].key for k in attention_core_keys(eager)} == {r.key for r in square["eager"]}
    assert eager.forward_s > sdpa.forward_s > 0


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_bfloat16_halves_the_activations(family: str, attention: str) -> None:
    half, full = _tiny(family, attention=attention, dtype="bfloat16"), _tiny(family, attention=attention, dtype="float32")

    def floating(trace: Trace, dtype: str) -> int:  # (each storage once: not another view's record)
        return sum(r.nbytes for r in trace.tensors if r.offloadable and r.dtype == dtype and r.view_of is None)

    # What the model computes in float32 whatever the dtype (norm statistics, Llama's RMSNorm
    # input, eager softmax, the loss's log-softmax) stays; everything else halves.
    difference = floating(full, "float32") - floating(half, "float32") - 2 * floating(half, "bfloat16")
    if family != "llama":
        assert difference == 0
        if attention == "eager":  # (sdpa: flash in bfloat16, memory-efficient in float32, whose RNG states differ)
            assert [r.shape for r in half.tensors] == [r.shape for r in full.tensors]
    elif attention == "eager":
        # Llama's softmax runs in float32 and is cast to bfloat16 for the product with V: a copy
        # that the float32 model, whose cast is a no-op, does not make.
        copies = sum(half.tensors[k].nbytes for k in attention_core_keys(half) if half.tensors[k].dtype == "bfloat16")
        assert difference == -2 * copies and copies > 0
    else:
        # float32 attention is memory-efficient attention, which takes key and value repeated to the
        # query's 4 heads (2 key/value heads): 2 layers x (key, value) x 2 more heads, float32.
        b, s, d = 2, 64, 32
        assert difference == 2 * 2 * b * 2 * s * d * 4


def test_saved_tensors_grow_linearly_with_layers(family: str) -> None:
    counts = [len(_tiny(family, num_layers=n).tensors) for n in (1, 2, 3)]
    assert counts[2] - counts[1] == counts[1] - counts[0] > 0
    bytes_ = [_activation_bytes(_tiny(family, num_layers=n)) for n in (1, 2, 3)]
    assert bytes_[2] - bytes_[1] == bytes_[1] - bytes_[0] > 0


def test_records_name_their_module_and_layer(family: str) -> None:
    trace = _tiny(family)
    assert trace.forward_s > 0 and trace.backward_s > trace.forward_s
    assert trace.meta["num_layers"] == 2 and trace.meta["seq_len"] == 64 and trace.meta["attention"] == "eager"
    layers = {layer_index(r.module) for r in trace.tensors}
    assert {0, 1} <= layers
    for record in trace.tensors:
        path = record.module.rsplit(" (", 1)[0] if " (" in record.module else ""  # the root module has no path
        if path and record.producer:
            assert record.producer.startswith(f"{path}:"), (record.producer, record.module)
    # dropout masks are bool, as CUDA's fused dropout saves them (Llama has no dropout)
    masks = [r for r in trace.tensors if r.producer.endswith("NativeDropoutBackward0")]
    assert all(r.dtype == "bool" for r in masks) and (family == "llama") == (not masks)


def test_llama_grouped_query_attention_keeps_fewer_key_value_heads() -> None:
    flash = [r for r in _tiny("llama", attention="sdpa", num_layers=1).tensors if r.producer.endswith("FlashAttentionBackward0")]
    heads = sorted(r.shape[1] for r in flash if len(r.shape) == 4)
    assert heads == [2, 2, 4, 4]  # key and value with 2 heads, query and output with 4


def test_presets_trace_and_layers_override() -> None:
    trace = transformer_trace("llama-3-8b", batch_size=1, seq_len=128, num_layers=2)
    assert trace.meta["model"] == "llama-3-8b" and trace.meta["num_layers"] == 2 and trace.meta["dtype"] == "bfloat16"
    assert trace.meta["param_count"] == 2 * 218_112_000 + 2 * 128256 * 4096 + 4096  # 2 layers, embeddings, head, final norm


def tiny_lm(batch_size: int, seq_len: int):
    """A user's model for the ``package.module:function`` contract: a module and its forward's inputs."""
    model = nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 100))
    return model, {"input": torch.zeros(batch_size, seq_len, dtype=torch.int64)}


def test_a_users_function_returning_module_and_inputs() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # num_layers and attention stay at their defaults: no warning
        trace = transformer_trace(f"{__name__}:tiny_lm", batch_size=3, seq_len=5)
    assert trace.meta["model"] == f"{__name__}:tiny_lm"
    assert [r.shape for r in trace.tensors if r.offloadable] == [(3, 5), (15, 16)]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(model="gpt3-175b"), ValueError, "unknown transformer 'gpt3-175b': choose a preset"),
        (dict(model="gpt2", seq_len=1025), ValueError, "seq_len 1025 is longer than gpt2's 1024 positions"),
        (dict(model="gpt2", attention="flash"), ValueError, "attention must be one of sdpa, eager"),
        (dict(model="gpt2", dtype="int8"), ValueError, "dtype must be a floating dtype"),
        (dict(model="gpt2", batch_size=0), ValueError, "must be positive"),
    ],
)
def test_bad_arguments(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        transformer_trace(**{"num_layers": 1, "seq_len": 16, **kwargs})


def test_only_transformer_traces_mark_the_core() -> None:
    with pytest.raises(ValueError, match="does not mark its attention core"):
        attention_core_keys(Trace(tensors=()))


def _records(trace: Trace) -> list[tuple]:
    """Each movable record's shape, dtype, bytes, storage bytes and the position (among these) of the
    record it is another view of."""
    movable = [r for r in trace.tensors if r.offloadable]
    position = {r.key: i for i, r in enumerate(movable)}
    return [(r.shape, r.dtype, r.nbytes, r.storage_nbytes, None if r.view_of is None else position[r.view_of]) for r in movable]


@pytest.mark.parametrize("model_type", ["phi3", "falcon", "llama"])
def test_a_meta_trace_records_the_views_the_runtime_records(model_type: str) -> None:
    """As shipped (no dropout), small: Phi-3 saves its fused gate and up projection's halves, Falcon its
    attention probabilities in two shapes; the meta trace records each view and what keeping a
    slice holds exactly as the runtime's profile of the same model does."""
    import transformers

    import cswap

    config = transformers.AutoConfig.for_model(
        model_type, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=256, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.randint(3, 250, (2, 16))
    traced = transformer_trace(model, batch_size=2, seq_len=16, attention="eager", dtype="float32")
    model.config.use_cache = False  # (meta tensors cannot tell transformers whether sequences are packed; values can)
    rt = cswap.Runtime("none", model=model, device="cpu", min_bytes=0)
    with rt.iteration():
        model(input_ids=ids, labels=ids).loss.backward()
    profiled = _records(rt.trace())
    assert _records(traced) == profiled
    assert any(view is not None for *_, view in profiled)
    if model_type == "phi3":
        assert any(storage is not None for _, _, _, storage, _ in profiled)
