"""Transformer language models from Hugging Face ``transformers`` configs, without weights or downloads.

A :class:`TransformerSpec` says which model to build: the ``transformers`` model type, the task its
loss trains (``causal-lm`` or ``masked-lm``) and the config fields that differ from the library's
defaults. :func:`load_transformer_spec` reads one from:

* a shipped preset: ``configs/transformers/<name>.yaml`` (:func:`transformer_presets` lists them;
  each file states its source, the published checkpoint's ``config.json`` or the paper);
* ``"hf:<model_type>"``: the library's defaults for that model type (``hf:gpt2``, ``hf:llama``,
  ``hf:bert``), as its config class builds them with no arguments;
* a path: a YAML file in the presets' format, or a checkpoint's ``config.json``.

:func:`build_transformer` builds the model from a spec with fresh weights on the current default
device: under ``torch.device("meta")`` nothing is allocated, so any size builds in milliseconds.
``transformers`` is imported only then (the ``hf`` extra: ``pip install 'cswap[hf]'``).

Example:
    >>> "llama-3-8b" in transformer_presets()
    True
    >>> spec = load_transformer_spec("gpt3-175b-layer")
    >>> spec.model_type, spec.task, spec.config["n_embd"], spec.seq_len
    ('gpt2', 'causal-lm', 12288, 2048)
    >>> import torch
    >>> with torch.device("meta"):
    ...     model = build_transformer("gpt2", num_layers=2, attention="eager")
    >>> type(model).__name__, model.config.n_layer, model.config._attn_implementation
    ('GPT2LMHeadModel', 2, 'eager')
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

import yaml
from torch import nn

from cswap.paths import shipped_configs_dir

__all__ = [
    "ATTENTION_IMPLEMENTATIONS",
    "DEFAULT_SEQ_LEN",
    "TASKS",
    "TransformerSpec",
    "build_transformer",
    "is_transformer",
    "load_transformer_spec",
    "presets_dir",
    "transformer_presets",
]

#: The losses a spec's model trains, as ``transformers`` auto classes.
TASKS: Mapping[str, str] = MappingProxyType({"causal-lm": "AutoModelForCausalLM", "masked-lm": "AutoModelForMaskedLM"})

#: Attention kernels a model may be built with (``transformers``' ``attn_implementation``).
ATTENTION_IMPLEMENTATIONS: tuple[str, ...] = ("sdpa", "eager")

#: The sequence length of a spec that states none (``hf:`` and ``config.json``), capped at the
#: model's ``max_position_embeddings``.
DEFAULT_SEQ_LEN = 1024

# transformers' loss per task (its LOSS_MAPPING keys).
_LOSS_TYPES: Mapping[str, str] = MappingProxyType({"causal-lm": "ForCausalLM", "masked-lm": "ForMaskedLM"})
_HF_PREFIX = "hf:"
_SPEC_KEYS = frozenset({"name", "model_type", "task", "source", "seq_len", "config"})


@dataclass(frozen=True)
class TransformerSpec:
    """Which transformer to build.

    Args:
        name: what it is called in reports (``gpt2``, ``llama-3-8b``).
        model_type: the ``transformers`` model type (``gpt2``, ``llama``, ``bert``).
        task: a key of :data:`TASKS`: the loss the model computes from ``labels``.
        config: config fields that differ from the library's defaults.
        source: where the numbers come from (a ``config.json`` URL, a paper, a path).
        seq_len: the sequence length a trace uses unless told otherwise.
    """

    name: str
    model_type: str
    task: str = "causal-lm"
    config: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    seq_len: int = DEFAULT_SEQ_LEN

    def __post_init__(self) -> None:
        if not self.name or not self.model_type:
            raise ValueError(f"a transformer spec needs a name and a model_type, got {self.name!r} and {self.model_type!r}")
        if self.task not in TASKS:
            raise ValueError(f"transformer {self.name!r}: task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if not isinstance(self.seq_len, int) or isinstance(self.seq_len, bool) or self.seq_len < 1:
            raise ValueError(f"transformer {self.name!r}: seq_len must be a positive integer, got {self.seq_len!r}")
        if not isinstance(self.config, Mapping):
            raise ValueError(f"transformer {self.name!r}: config must be a mapping, got {type(self.config).__name__}")
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))


def presets_dir() -> Path:
    """The directory of the shipped presets, ``configs/transformers``."""
    return shipped_configs_dir() / "transformers"


def transformer_presets() -> tuple[str, ...]:
    """The names of the shipped presets, sorted."""
    return tuple(sorted(p.stem for p in presets_dir().glob("*.yaml")))


def _looks_like_path(name: str) -> bool:
    return name.endswith((".json", ".yaml", ".yml"))


def is_transformer(name: str) -> bool:
    """Whether ``name`` names a transformer :func:`load_transformer_spec` reads: a preset, an
    ``hf:`` model type or a ``.json`` / ``.yaml`` config path (imports nothing).

    Example:
        >>> is_transformer("bert-large"), is_transformer("hf:llama"), is_transformer("resnet50")
        (True, True, False)
    """
    return isinstance(name, str) and (name.startswith(_HF_PREFIX) or _looks_like_path(name) or name in transformer_presets())


def _unknown(name: str) -> ValueError:
    return ValueError(
        f"unknown transformer {name!r}: choose a preset ({', '.join(transformer_presets())}), "
        "'hf:<model_type>' (e.g. hf:gpt2, hf:llama, hf:bert), or a config path (.yaml preset or a checkpoint's config.json)"
    )


def _from_yaml(path: Path) -> TransformerSpec:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"cannot read transformer preset {path}: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"transformer preset {path} must be a mapping with keys {', '.join(sorted(_SPEC_KEYS))}")
    unknown = sorted(set(data) - _SPEC_KEYS)
    if unknown:
        raise ValueError(f"transformer preset {path} has unknown keys {unknown}; known keys are {sorted(_SPEC_KEYS)}")
    if not data.get("source"):
        raise ValueError(f"transformer preset {path} must state its source (the config.json or paper its numbers come from)")
    try:
        return TransformerSpec(**{"name": path.stem, **data})
    except TypeError as error:
        raise ValueError(f"transformer preset {path}: {error}") from None


def _transformers() -> ModuleType:
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise ImportError(
            "cswap.models.transformer needs transformers, which is not installed: pip install 'cswap[hf]'"
        ) from None


def _max_positions(config: Mapping[str, Any]) -> int | None:
    value = config.get("max_position_embeddings", config.get("n_positions"))
    return value if isinstance(value, int) and value > 0 else None


def _task_of(model_type: str, architectures: Any = None) -> str:
    """Masked LM for a model type trained as one (BERT, RoBERTa), else causal LM; an explicit
    ``architectures`` entry decides first."""
    if isinstance(architectures, list) and architectures:
        return "masked-lm" if str(architectures[0]).endswith("ForMaskedLM") else "causal-lm"
    auto = importlib.import_module("transformers.models.auto.modeling_auto")
    if model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "masked-lm"
    if model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "causal-lm"
    raise ValueError(f"model type {model_type!r} has no causal or masked language-model head in transformers")


def _from_hf(model_type: str) -> TransformerSpec:
    transformers = _transformers()
    try:
        defaults = transformers.AutoConfig.for_model(model_type).to_dict()
    except ValueError:
        raise ValueError(
            f"unknown transformers model type {model_type!r} in 'hf:{model_type}' (e.g. hf:gpt2, hf:llama, hf:bert)"
        ) from None
    positions = _max_positions(defaults)
    return TransformerSpec(
        name=f"hf:{model_type}",
        model_type=model_type,
        task=_task_of(model_type),
        source=f"transformers {transformers.__version__} defaults for {model_type}",
        seq_len=min(DEFAULT_SEQ_LEN, positions or DEFAULT_SEQ_LEN),
    )


def _from_config_json(path: Path) -> TransformerSpec:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read config {path}: {error}") from None
    if not isinstance(data, dict) or not data.get("model_type"):
        raise ValueError(f"config {path} has no model_type: give a Hugging Face checkpoint's config.json")
    config = {
        k: v
        for k, v in data.items()
        if k not in ("model_type", "architectures", "transformers_version") and not k.startswith("_")
    }
    positions = _max_positions(config)
    _transformers()
    return TransformerSpec(
        name=path.stem if path.stem != "config" else path.parent.name or "config",
        model_type=data["model_type"],
        task=_task_of(data["model_type"], data.get("architectures")),
        config=config,
        source=str(path),
        seq_len=min(DEFAULT_SEQ_LEN, positions or DEFAULT_SEQ_LEN),
    )


def load_transformer_spec(name: str | TransformerSpec) -> TransformerSpec:
    """The spec ``name`` stands for: a preset, ``"hf:<model_type>"``, or a ``.yaml`` / ``.json`` path.

    Raises:
        ValueError: an unknown name (the message lists the presets), an unreadable or invalid file.
        ImportError: ``hf:`` or ``config.json`` without ``transformers`` installed.

    Example:
        >>> load_transformer_spec("llama-3.2-1b").config["num_key_value_heads"]
        8
        >>> load_transformer_spec("gtp2")
        Traceback (most recent call last):
        ...
        ValueError: unknown transformer 'gtp2': choose a preset (bert-base, ...
    """
    if isinstance(name, TransformerSpec):
        return name
    if not isinstance(name, str) or not name:
        raise _unknown(str(name))
    if name.startswith(_HF_PREFIX):
        return _from_hf(name.removeprefix(_HF_PREFIX))
    if _looks_like_path(name):
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"transformer config {name!r} is not a file")
        return _from_config_json(path) if path.suffix == ".json" else _from_yaml(path)
    preset = presets_dir() / f"{name}.yaml"
    if "/" in name or not preset.is_file():
        raise _unknown(name)
    return _from_yaml(preset)


def build_transformer(spec: str | TransformerSpec, num_layers: int | None = None, attention: str = "sdpa") -> nn.Module:
    """The spec's model with fresh weights, in training mode, on the current default device.

    Build it under ``torch.device("meta")`` for shapes without memory.

    Args:
        spec: a :class:`TransformerSpec` or anything :func:`load_transformer_spec` reads.
        num_layers: the number of transformer layers, replacing the spec's (e.g. 80 layers of a shape).
        attention: ``sdpa`` or ``eager`` (``transformers``' ``attn_implementation``).

    Raises:
        ValueError: a bad spec, layer count or attention name, or a config ``transformers`` rejects.
        ImportError: ``transformers`` is not installed.
    """
    spec = load_transformer_spec(spec)
    if attention not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_IMPLEMENTATIONS)}, got {attention!r}")
    if num_layers is not None and (isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1):
        raise ValueError(f"num_layers must be a positive integer, got {num_layers!r}")
    transformers = _transformers()
    fields = dict(spec.config)
    if num_layers is not None:
        # Every config class maps num_hidden_layers to its own name (GPT-2's n_layer).
        fields = {k: v for k, v in fields.items() if k not in ("n_layer", "num_hidden_layers")}
        fields["num_hidden_layers"] = num_layers
    try:
        config = transformers.AutoConfig.for_model(spec.model_type, **fields)
        model = getattr(transformers, TASKS[spec.task]).from_config(config, attn_implementation=attention)
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"transformers cannot build {spec.name!r} ({spec.model_type}, {spec.task}): {error}") from None
    if getattr(model, "loss_type", None) is None:
        # The loss transformers falls back to anyway, named so that it does not warn about it.
        model.loss_type = _LOSS_TYPES[spec.task]
    return model.train()
