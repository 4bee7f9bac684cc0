"""cswap.models.transformer: the shipped presets build the published architectures on meta; specs and errors."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from cswap.models.transformer import (
    TransformerSpec,
    build_transformer,
    is_transformer,
    load_transformer_spec,
    presets_dir,
    transformer_presets,
)

pytest.importorskip("transformers")

#: Parameter counts of the published checkpoints' architectures (tied embeddings counted once;
#: BERT as BertForMaskedLM: BertModel's 109,482,240 less its pooler, plus the MLM head).
PUBLISHED_PARAMS = {
    "gpt2": 124_439_808,
    "gpt2-xl": 1_557_611_200,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3-8b": 8_030_261_248,
    "bert-base": 109_514_298,
    "bert-large": 335_174_458,
}


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_the_presets_are_the_ones_promised() -> None:
    assert set(transformer_presets()) == {*PUBLISHED_PARAMS, "gpt3-175b-layer"}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_presets_build_the_published_architectures_on_meta(name: str) -> None:
    with torch.device("meta"):
        model = build_transformer(name)
    assert _count(model) == PUBLISHED_PARAMS[name]
    assert model.training and next(model.parameters()).device.type == "meta"


@pytest.mark.parametrize("name", sorted(transformer_presets()))
def test_every_preset_states_its_source(name: str) -> None:
    data = yaml.safe_load((presets_dir() / f"{name}.yaml").read_text())
    assert data["name"] == name and data["source"].strip()
    assert load_transformer_spec(name).source == data["source"]


def test_llama_3_2_1b_has_the_shape_asked_for() -> None:
    with torch.device("meta"):
        config = build_transformer("llama-3.2-1b").config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.num_key_value_heads) == (
        16,
        2048,
        32,
        8,
    )
    assert (config.intermediate_size, config.vocab_size, config.tie_word_embeddings) == (8192, 128256, True)
    assert config.rope_parameters["rope_theta"] == 500000.0


def test_gpt3_layer_is_one_gpt2_layer_of_gpt3_175b_shape() -> None:
    with torch.device("meta"):
        model = build_transformer("gpt3-175b-layer")
    config = model.config
    assert (config.n_layer, config.n_embd, config.n_head, config.n_positions) == (1, 12288, 96, 2048)
    per_layer = _count(model.transformer.h[0])
    assert per_layer == 12 * 12288**2 + 13 * 12288  # Narayanan et al.'s 12h^2 + 13h per layer


@pytest.mark.parametrize("layers", [1, 3, 80])
def test_layers_override_the_spec(layers: int) -> None:
    with torch.device("meta"):
        model = build_transformer("llama-3-8b", num_layers=layers)
    assert len(model.model.layers) == layers == model.config.num_hidden_layers


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_attention_implementation_is_passed_on(attention: str) -> None:
    with torch.device("meta"):
        model = build_transformer("bert-base", num_layers=1, attention=attention)
    assert model.config._attn_implementation == attention


def test_hf_model_types_take_the_library_defaults() -> None:
    spec = load_transformer_spec("hf:llama")
    assert (spec.model_type, spec.task, spec.config) == ("llama", "causal-lm", {})
    assert load_transformer_spec("hf:bert").task == "masked-lm"
    with torch.device("meta"):
        assert build_transformer("hf:gpt2").config.n_layer == 12


def test_config_paths(tmp_path) -> None:
    config = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_layer": 2,
        "n_embd": 64,
        "n_head": 4,
        "n_positions": 256,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = load_transformer_spec(str(tmp_path / "config.json"))
    assert (spec.model_type, spec.task, spec.seq_len, spec.config["n_embd"]) == ("gpt2", "causal-lm", 256, 64)
    preset = tmp_path / "tiny.yaml"
    preset.write_text(yaml.safe_dump({"model_type": "llama", "source": "made up", "seq_len": 64, "config": {"hidden_size": 64}}))
    assert load_transformer_spec(str(preset)) == TransformerSpec("tiny", "llama", "causal-lm", {"hidden_size": 64}, "made up", 64)
    assert is_transformer(str(preset)) and is_transformer("gpt2") and not is_transformer("vgg16")


@pytest.mark.parametrize(
    "name, match",
    [
        (
            "llama-3-9b",
            r"unknown transformer 'llama-3-9b': choose a preset \(bert-base, bert-large, gpt2, gpt2-xl, gpt3-175b-layer",
        ),
        ("hf:nosuchmodel", "unknown transformers model type 'nosuchmodel'"),
        ("missing.yaml", "is not a file"),
    ],
)
def test_bad_names_say_what_is_valid(name: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_transformer_spec(name)


def test_bad_presets_and_arguments(tmp_path) -> None:
    unsourced = tmp_path / "a.yaml"
    unsourced.write_text(yaml.safe_dump({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="must state its source"):
        load_transformer_spec(str(unsourced))
    typo = tmp_path / "b.yaml"
    typo.write_text(yaml.safe_dump({"model_type": "gpt2", "source": "x", "layers": 2}))
    with pytest.raises(ValueError, match=r"unknown keys \['layers'\]"):
        load_transformer_spec(str(typo))
    with pytest.raises(ValueError, match="task must be one of causal-lm, masked-lm"):
        TransformerSpec("x", "gpt2", task="seq2seq")
    with pytest.raises(ValueError, match="attention must be one of sdpa, eager"):
        build_transformer("gpt2", attention="flash")
    with pytest.raises(ValueError, match="num_layers must be a positive integer"):
        build_transformer("gpt2", num_layers=0)
