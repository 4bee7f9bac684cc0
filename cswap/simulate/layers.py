"""A transformer trace's layers: what each saves, when its forward ran, and what checkpointing it holds.

A meta trace records every module's first call (:func:`cswap.simulate.metatrace.module_calls`).
The calls whose path ends in a layer index (``transformer.h.3``, ``model.layers.12``,
``bert.encoder.layer.0``: :func:`cswap.simulate.lmtrace.layer_index`'s names) are the layers; a
record lies in the layer whose path its saving module's path starts with. From these:

* :func:`transformer_layers`: per layer, the records it saves, its forward seconds, and its
  hidden-states input: the tensor a checkpoint of the layer holds from its forward to its
  backward. Where an operator inside the layer saves that input anyway (GPT-2's first LayerNorm),
  it has a record (:attr:`Layer.input_key`); where none does (Llama's RMSNorm saves a float32 copy
  instead), the checkpoint holds a tensor the trace has no record of. Records saved inside the
  layer that are its other inputs (Llama's rotary cos and sin, passed by keyword) are held by the
  checkpoint as they are.
* :func:`attention_core_regions`: per layer, the attention core of eager attention
  (:func:`cswap.simulate.lmtrace.attention_core_keys`) and what running it again costs.
* :func:`megatron_records`: the records Megatron-LM's fine-grained offloading moves for a list of
  its module names, found by module path.

Example:
    >>> from cswap.simulate.lmtrace import transformer_trace
    >>> trace = transformer_trace("gpt2", seq_len=64, num_layers=2, attention="eager")
    >>> layers = transformer_layers(trace)
    >>> [layer.path for layer in layers], layers[0].input_key is not None
    (['transformer.h.0', 'transformer.h.1'], True)
    >>> [region.label for region in attention_core_regions(trace)]
    ['transformer.h.0', 'transformer.h.1']
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from cswap.profile.trace import Trace
from cswap.simulate.lmtrace import attention_core_keys
from cswap.simulate.metatrace import module_calls
from cswap.simulate.policies import RecomputeRegion

__all__ = ["MEGATRON_MODULES", "Layer", "attention_core_regions", "megatron_records", "module_path", "transformer_layers"]

# A layer's own path: GPT-2's transformer.h.3, Llama's model.layers.3, BERT's bert.encoder.layer.3.
_LAYER_PATH = re.compile(r"(?:^|\.)(?:h|layers|layer|blocks|block)\.\d+$")

#: Megatron-LM's fine-grained offloading modules (``--offload-modules``) for dense layers, as the
#: paths of GPT-2's, Llama's and BERT's modules relative to their layer. Each offloads what is saved
#: inside it: its input (a Linear's), or the attention core's q, k, v, output and softmax
#: statistics. ``mlp`` is the dense counterpart of Megatron's ``expert_fc1`` and ``moe_act``: every
#: tensor the MLP saves.
MEGATRON_MODULES: Mapping[str, str] = MappingProxyType(
    {
        "attn_norm": r"ln_1|input_layernorm",
        "qkv_linear": r"attn\.c_attn|self_attn\.(?:q_proj|k_proj|v_proj|qkv_proj)|attention\.self\.(?:query|key|value)",
        "core_attn": r"attn|self_attn|attention\.self|attn\.attn_dropout|attention\.self\.dropout",
        "attn_proj": r"attn\.c_proj|self_attn\.o_proj|attention\.output\.dense",
        "mlp_norm": r"ln_2|post_attention_layernorm|attention\.output\.LayerNorm",
        "mlp": r"mlp(?:\..+)?|intermediate(?:\..+)?|output\.dense",
    }
)


@dataclass(frozen=True)
class Layer:
    """One transformer layer of a trace.

    Attributes:
        index: its position among the layers.
        path: its module path (``"transformer.h.3"``).
        start_s, end_s: when its forward began and ended, seconds since forward began.
        saved: the records saved inside it that checkpointing drops and its forward, run again,
            saves again (offloadable ones, trace order); the record of its hidden-states input is
            among them when an operator inside saves it.
        held: the records saved inside it that are its other inputs (keyword ones): a checkpoint
            holds them from its forward to its backward, as the trace does.
        input_key: the record holding its hidden-states input, or ``None`` when nothing saves it.
        input_shape, input_dtype, input_nbytes: that input's shape, dtype and bytes.
    """

    index: int
    path: str
    start_s: float
    end_s: float
    saved: tuple[int, ...]
    held: tuple[int, ...]
    input_key: int | None
    input_shape: tuple[int, ...] | None
    input_dtype: str | None
    input_nbytes: int

    @property
    def forward_s(self) -> float:
        """Seconds of its forward: what checkpointing it runs again in backward."""
        return self.end_s - self.start_s


def module_path(label: str) -> str:
    """A record's ``module`` label without its type: ``"transformer.h.0.attn (GPT2Attention)"`` ->
    ``"transformer.h.0.attn"``; the model itself (``"GPT2LMHeadModel"``) -> ``""``.

    Example:
        >>> module_path("model.layers.1.mlp.act_fn (SiLUActivation)"), module_path("GPT2LMHeadModel")
        ('model.layers.1.mlp.act_fn', '')
    """
    return label.rsplit(" (", 1)[0] if " (" in label else ""


def _inside(path: str, outer: str) -> bool:
    return path == outer or path.startswith(outer + ".")


def transformer_layers(trace: Trace) -> tuple[Layer, ...]:
    """The layers of a meta trace, in forward order (empty when it has none: an image model, or a
    trace that does not record its module calls).

    Example:
        >>> from cswap.simulate.lmtrace import transformer_trace
        >>> layers = transformer_layers(transformer_trace("llama-3.2-1b", seq_len=32, num_layers=2))
        >>> layers[1].input_key is None, layers[1].input_shape, layers[0].forward_s > 0
        (True, (1, 32, 2048), True)
    """
    calls = [c for c in module_calls(trace) if _LAYER_PATH.search(c.path)]
    outermost = [c for c in calls if not any(o is not c and _inside(c.path, o.path) for o in calls)]
    paths = [module_path(r.module) for r in trace.tensors]
    layers = []
    for index, call in enumerate(outermost):
        inside = [i for i, r in enumerate(trace.tensors) if r.offloadable and paths[i] and _inside(paths[i], call.path)]
        held = set(call.input_keys) - {call.input_key}
        layers.append(
            Layer(
                index=index,
                path=call.path,
                start_s=call.start_s,
                end_s=call.end_s,
                saved=tuple(i for i in inside if trace.tensors[i].key not in held),
                held=tuple(i for i in inside if trace.tensors[i].key in held),
                input_key=call.input_key,
                input_shape=call.input_shape,
                input_dtype=call.input_dtype,
                input_nbytes=call.input_nbytes,
            )
        )
    return tuple(layers)


def attention_core_regions(trace: Trace) -> tuple[RecomputeRegion, ...]:
    """Per layer, its attention core (the ``s x s`` records of eager attention) as a region, with
    the seconds that running the core again takes: from the save of the ``Q K^T`` product's inputs
    (autograd saves an operator's inputs just before it runs) to the first save after the
    attention over ``V`` (the output projection's input), on the trace's clock. That window holds
    ``Q K^T``, its scaling and mask, softmax, dropout, the attention over ``V`` and the copy that
    merges the heads again (a few percent of it). Empty for fused attention (``sdpa``), which saves
    no core.

    Raises:
        ValueError: a trace that does not mark its attention core (not a transformer trace).

    Example:
        >>> from cswap.simulate.lmtrace import transformer_trace
        >>> regions = attention_core_regions(transformer_trace("gpt2", seq_len=64, num_layers=1, attention="eager"))
        >>> len(regions), len(regions[0].records), regions[0].forward_s > 0
        (1, 3, True)
    """
    core = attention_core_keys(trace)
    index_of = {r.key: i for i, r in enumerate(trace.tensors)}
    packs = sorted({r.pack_at_s for r in trace.tensors})
    regions = []
    for layer in transformer_layers(trace):
        mine = [i for i in layer.saved + layer.held if trace.tensors[i].key in core]
        if not mine:
            continue
        first = min(trace.tensors[i].pack_at_s for i in mine)
        last = max(trace.tensors[i].pack_at_s for i in mine)
        before = [at for at in packs if layer.start_s <= at < first]
        after = [at for at in packs if at > last]
        start = before[-1] if before else first
        end = min(after[0] if after else layer.end_s, layer.end_s)
        regions.append(
            RecomputeRegion(tuple(sorted(index_of[trace.tensors[i].key] for i in mine)), max(end - start, 0.0), layer.path)
        )
    return tuple(regions)


def megatron_records(trace: Trace, modules: Sequence[str]) -> tuple[int, ...]:
    """The records Megatron-LM's fine-grained offloading of ``modules`` moves: the offloadable
    records saved inside those modules of every layer (:data:`MEGATRON_MODULES`), by module path.

    Raises:
        ValueError: a module name Megatron's list does not have.

    Example:
        >>> from cswap.simulate.lmtrace import transformer_trace
        >>> trace = transformer_trace("gpt2", seq_len=64, num_layers=1, attention="eager")
        >>> sorted({module_path(trace.tensors[i].module) for i in megatron_records(trace, ["attn_proj"])})
        ['transformer.h.0.attn.c_proj']
    """
    unknown = [m for m in modules if m not in MEGATRON_MODULES]
    if unknown:
        raise ValueError(f"unknown Megatron offload modules {unknown}: choose from {', '.join(MEGATRON_MODULES)}")
    pattern = re.compile("|".join(f"(?:{MEGATRON_MODULES[m]})" for m in modules))
    chosen = []
    for layer in transformer_layers(trace):
        prefix = layer.path + "."
        for i in layer.saved + layer.held:
            path = module_path(trace.tensors[i].module)
            if path.startswith(prefix) and pattern.fullmatch(path[len(prefix) :]):
                chosen.append(i)
    return tuple(sorted(chosen))
