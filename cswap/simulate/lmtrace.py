"""Meta traces of transformer language models: one training iteration on token ids, without a GPU.

:func:`transformer_trace` builds a transformer on the ``meta`` device (no weights, no download: a
preset, ``hf:<model_type>`` or a config path, see :mod:`cswap.models.transformer`), feeds it
``(batch_size, seq_len)`` int64 token ids with the same ids as ``labels`` so that the loss is the
model's own language-model loss, and records forward and backward as
:func:`cswap.simulate.metatrace.run_on_meta` does for images: every saved tensor, its producer
(``"transformer.h.3.attn:BmmBackward0"``, the module path and the autograd node), the module that
saved it, and roofline times on a hardware profile.

The kernels are those a CUDA GPU runs (:mod:`cswap.simulate.gpukernels`): dropout is the fused
``native_dropout`` with a 1-byte mask, and ``attention="sdpa"`` is FlashAttention-2 (memory-efficient
attention with a mask or in float32), which saves no ``s x s`` tensor. ``attention="eager"`` is
``transformers``' own matmul-softmax-dropout-matmul, which saves the ``s x s`` attention
probabilities: the *attention core* that selective recomputation (Korthikanti et al., MLSys 2023)
recomputes instead of storing; :func:`attention_core_keys` names those records.

A user's own model: ``"package.module:function"``, called under ``torch.device("meta")`` with those
of ``batch_size``, ``seq_len``, ``num_layers``, ``attention`` and ``dtype`` (a ``torch.dtype``) it
accepts (it need not take ``dtype``: the module is cast to it afterwards). It returns the module,
or ``(module, inputs)`` with ``inputs`` the keyword arguments of its forward (a mapping of names to
meta tensors). Without inputs it gets ``input_ids`` and ``labels`` as above. The loss is the
output's ``loss`` (attribute or key) when there is one, else the sum of its (first) tensor.

Example:
    >>> trace = transformer_trace("gpt2", batch_size=1, seq_len=64, num_layers=2, attention="eager")
    >>> trace.meta["model"], trace.meta["num_layers"], trace.meta["attention"]
    ('gpt2', 2, 'eager')
    >>> core = attention_core_keys(trace)
    >>> sorted({trace.tensors[k].producer.split(":")[1] for k in core})
    ['BmmBackward0', 'NativeDropoutBackward0', 'SoftmaxBackward0']
    >>> sum(trace.tensors[k].nbytes for k in core) == 2 * 5 * 12 * 64 * 64  # 2 layers of 5*a*s*s*b bytes
    True
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from cswap._userfn import call_accepting, is_spec, load_callable
from cswap.models.transformer import ATTENTION_IMPLEMENTATIONS, TransformerSpec, build_transformer, load_transformer_spec
from cswap.profile.trace import Trace
from cswap.simulate.gpukernels import cuda_kernels_on_meta
from cswap.simulate.hardware import HardwareProfile, load_hardware
from cswap.simulate.metatrace import SparsityModel, _floating_dtype, _sparsity_model, run_on_meta

__all__ = ["attention_core_keys", "layer_index", "transformer_trace"]

# A user's function may leave these out without a warning: the defaults, and the dtype the model is
# cast to afterwards anyway.
_USER_DEFAULTS: Mapping[str, Any] = {"num_layers": None, "attention": "sdpa"}
# The layer index in a module path: GPT-2's transformer.h.3, Llama's model.layers.3, BERT's bert.encoder.layer.3.
_LAYER = re.compile(r"(?:^|\.)(?:h|layers|layer|blocks|block)\.(\d+)(?:\.|$| )")


def _loss(output: Any) -> torch.Tensor:
    """The model's own loss when it computes one, else the sum of its output."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss.float().sum() if loss.dim() else loss.float()
    if isinstance(output, (tuple, list)):
        output = next((x for x in output if isinstance(x, torch.Tensor)), None)
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"the model returned a {type(output).__name__} with no loss and no tensor to sum")
    return output.float().sum()


def _token_inputs(batch_size: int, seq_len: int) -> dict[str, torch.Tensor]:
    ids = torch.zeros(batch_size, seq_len, dtype=torch.int64, device="meta")
    return {"input_ids": ids, "labels": ids}


def _user_model(spec: str, arguments: dict[str, Any]) -> tuple[nn.Module, Mapping[str, Any] | None]:
    with torch.device("meta"):
        defaults = {**_USER_DEFAULTS, "dtype": arguments["dtype"]}
        built = call_accepting(load_callable(spec, what="model"), arguments, defaults, what=f"model {spec!r}")
    inputs = None
    if isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], nn.Module):
        built, inputs = built
        if not isinstance(inputs, Mapping):
            raise TypeError(
                f"model {spec!r} returned inputs of type {type(inputs).__name__}; they must be a mapping of forward's keyword arguments"
            )
    if not isinstance(built, nn.Module):
        raise TypeError(f"model {spec!r} returned a {type(built).__name__}; it must return a torch.nn.Module or (module, inputs)")
    return built, inputs


def _max_positions(module: nn.Module) -> int | None:
    config = getattr(module, "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def layer_index(module: str) -> int | None:
    """The transformer layer a record's ``module`` (or producer) lies in, or None outside the layers.

    Example:
        >>> layer_index("transformer.h.3.attn (GPT2Attention)"), layer_index("model.layers.12.mlp.act_fn (SiLUActivation)")
        (3, 12)
        >>> layer_index("lm_head (Linear)") is None
        True
    """
    found = _LAYER.search(module)
    return int(found.group(1)) if found else None


def attention_core_keys(trace: Trace) -> frozenset[int]:
    """Keys of the records that hold attention probabilities: what recomputing the attention core saves.

    These are the ``s x s`` tensors of eager attention: the softmax output, its dropout mask and
    the dropped-out probabilities (with a dtype cast, its copy), marked while the trace ran (a
    softmax output, or what a cast, dropout or copy makes of one; never a parameter). A fused
    kernel (``attention="sdpa"``) saves none, so the set is empty.

    Raises:
        ValueError: a trace that does not mark them (only :func:`transformer_trace` does).

    Example:
        >>> attention_core_keys(transformer_trace("gpt2", seq_len=32, num_layers=1, attention="sdpa"))
        frozenset()
    """
    keys = trace.meta.get("attention_core_keys")
    if keys is None:
        raise ValueError("this trace does not mark its attention core: only transformer_trace (cswap.simulate.lmtrace) traces do")
    return frozenset(int(k) for k in keys)


def transformer_trace(
    model: str | TransformerSpec | nn.Module,
    batch_size: int = 1,
    seq_len: int | None = None,
    hardware: str | HardwareProfile = "a100-pcie4",
    dtype: str = "bfloat16",
    attention: str = "sdpa",
    num_layers: int | None = None,
    sparsity: float | SparsityModel | Trace | None = None,
) -> Trace:
    """The trace one training iteration of a transformer would give on ``hardware``, computed on ``meta``.

    Args:
        model: a preset (``gpt2``, ``llama-3-8b``, ...), ``"hf:<model_type>"``, a ``.yaml`` / ``.json``
            config path, a :class:`~cswap.models.transformer.TransformerSpec`, ``"package.module:function"``
            (module docstring), or an ``nn.Module`` taking ``input_ids`` and ``labels`` (copied to
            ``meta``; the original is untouched).
        batch_size: sequences per micro-batch.
        seq_len: tokens per sequence (default: the spec's; at most the model's ``max_position_embeddings``).
        hardware: profile name, path or object (bfloat16 needs an Ampere or later GPU to be fast).
        dtype: parameters and activations (``bfloat16``, ``float16``, ``float32``): pure 16-bit
            training, as ``model.to(dtype)`` trains; norms and losses upcast where the model does.
        attention: ``sdpa`` (a fused kernel, :mod:`cswap.simulate.gpukernels`) or ``eager``.
        num_layers: transformer layers, replacing the spec's (ignored by a user's function that
            does not take it, with a warning).
        sparsity: as :func:`cswap.simulate.meta_trace` takes it (transformers have no ReLU:
            dropout outputs and masks are the sparse tensors).

    Returns:
        A :class:`Trace` with ``meta["source"] == "meta"``, ``meta["attention_core_keys"]`` (see
        :func:`attention_core_keys`), ``meta["module_calls"]`` (each module's first call:
        :func:`cswap.simulate.metatrace.module_calls`), times in simulated seconds and the hidden
        times filled.

    Raises:
        ValueError: an unknown model (listing the presets), non-positive sizes, a sequence longer
            than the model's positions, an unknown dtype or attention.
        ImportError: ``transformers`` is not installed (``pip install 'cswap[hf]'``).
    """
    if batch_size < 1 or (seq_len is not None and seq_len < 1):
        raise ValueError(f"batch_size and seq_len must be positive, got {batch_size} and {seq_len}")
    if attention not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_IMPLEMENTATIONS)}, got {attention!r}")
    torch_dtype = _floating_dtype(dtype)
    profile = load_hardware(hardware)
    sparsity_model = _sparsity_model(sparsity)
    inputs: Mapping[str, Any] | None = None
    task = "causal-lm"
    if isinstance(model, nn.Module):
        module, name = copy.deepcopy(model).to(device="meta"), type(model).__name__
        seq_len = seq_len or 1024
    elif isinstance(model, str) and is_spec(model) and not model.startswith("hf:"):
        seq_len = seq_len or 1024
        arguments = {
            "batch_size": batch_size,
            "seq_len": seq_len,
            "num_layers": num_layers,
            "attention": attention,
            "dtype": torch_dtype,
        }
        (module, inputs), name = _user_model(model, arguments), model
    else:
        spec = load_transformer_spec(model)
        with torch.device("meta"):
            module = build_transformer(spec, num_layers=num_layers, attention=attention)
        name, task, seq_len = spec.name, spec.task, seq_len or spec.seq_len
    positions = _max_positions(module)
    if positions is not None and seq_len > positions:
        raise ValueError(f"seq_len {seq_len} is longer than {name}'s {positions} positions (max_position_embeddings)")
    # use_cache stays as the config has it, as a training loop calling model(input_ids, labels=...)
    # leaves it: the cache holds references, not saved tensors, and without one transformers asks
    # the position ids' values (whether sequences are packed), which meta tensors do not have.
    config = getattr(module, "config", None)
    module = module.to(dtype=torch_dtype).train()
    feed = dict(inputs) if inputs is not None else _token_inputs(batch_size, seq_len)

    with cuda_kernels_on_meta():
        run = run_on_meta(module, lambda m: _loss(m(**feed)), profile, sparsity_model, qualified_producers=True)
    layers = getattr(config, "num_hidden_layers", None) if config is not None else None
    return run.trace(
        profile, sparsity_model, model=name, task=task, batch_size=batch_size, seq_len=seq_len,
        input_shape=[batch_size, seq_len], resolution=None, dtype=dtype, attention=attention, num_layers=layers,
        param_count=sum(p.numel() for p in module.parameters()), attention_core_keys=list(run.probability_keys),
    )
