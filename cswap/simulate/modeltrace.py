"""One entry for any model name: the meta trace of an image model or of a transformer.

``cswap simulate`` and ``cswap max-batch`` take ``--model`` as either; :func:`is_transformer_model`
decides which, and :func:`trace_model` builds the trace:

* a transformer (:func:`cswap.simulate.lmtrace.transformer_trace`): a preset (``gpt2``,
  ``llama-3-8b``, ...), ``hf:<model_type>``, a ``.yaml`` / ``.json`` config path, or
  ``"package.module:function"`` when a sequence length is given;
* an image model (:func:`cswap.simulate.meta_trace`): a name in ``cswap.models.MODEL_NAMES``, or
  ``"package.module:function"`` without a sequence length, exactly as before.

Example:
    >>> is_transformer_model("llama-3-8b"), is_transformer_model("vgg16"), is_transformer_model("my.mod:net", seq_len=128)
    (True, False, True)
    >>> trace = trace_model("gpt2", batch_size=1, seq_len=32, num_layers=1)
    >>> trace.meta["model"], trace.meta["dtype"], trace.meta["attention"]
    ('gpt2', 'bfloat16', 'sdpa')
"""

from __future__ import annotations

from typing import Any

from cswap._userfn import is_spec
from cswap.profile.trace import Trace
from cswap.simulate.hardware import HardwareProfile

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_DTYPE", "is_transformer_model", "trace_model", "unknown_model"]

#: Per kind of model, the batch and dtype a trace takes unless told: 64 float32 images (the
#: papers' CNN setting), one bfloat16 sequence (a transformer's micro-batch, 16-bit as trained).
DEFAULT_BATCH_SIZE = {"image": 64, "transformer": 1}
DEFAULT_DTYPE = {"image": "float32", "transformer": "bfloat16"}


def is_transformer_model(model: str, seq_len: int | None = None) -> bool:
    """Whether ``model`` is traced as a transformer (module docstring); imports neither torch nor transformers."""
    from cswap.models.transformer import is_transformer

    return is_transformer(model) or (seq_len is not None and is_spec(model))


def unknown_model(name: str) -> ValueError:
    """The error for a name that is neither kind, listing both kinds' valid names."""
    from cswap.models import MODEL_NAMES
    from cswap.models.transformer import transformer_presets

    return ValueError(
        f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)} (image models), "
        f"a transformer preset ({', '.join(transformer_presets())}), hf:<model_type> (e.g. hf:llama), "
        "a transformer config path (.yaml preset or config.json), or your own as 'package.module:function'"
    )


def trace_model(
    model: str,
    batch_size: int | None = None,
    hardware: str | HardwareProfile = "v100-pcie3",
    dtype: str | None = None,
    sparsity: Any = None,
    resolution: int = 224,
    width_mult: float = 1.0,
    seq_len: int | None = None,
    num_layers: int | None = None,
    attention: str | None = None,
) -> Trace:
    """The meta trace of ``model``, an image model or a transformer.

    Args:
        model: a name either kind takes (module docstring).
        batch_size, dtype: default per kind (:data:`DEFAULT_BATCH_SIZE`, :data:`DEFAULT_DTYPE`).
        hardware, sparsity: as both traces take them.
        resolution, width_mult: an image model's.
        seq_len, num_layers, attention: a transformer's (``attention`` defaults to ``sdpa``).

    Raises:
        ValueError: an unknown model (listing both kinds), or a transformer's option given for an
            image model.
    """
    if is_transformer_model(model, seq_len):
        from cswap.simulate.lmtrace import transformer_trace

        return transformer_trace(
            model,
            batch_size=batch_size or DEFAULT_BATCH_SIZE["transformer"],
            seq_len=seq_len,
            hardware=hardware,
            dtype=dtype or DEFAULT_DTYPE["transformer"],
            attention=attention or "sdpa",
            num_layers=num_layers,
            sparsity=sparsity,
        )
    from cswap.models import MODEL_NAMES
    from cswap.simulate.metatrace import meta_trace

    if not is_spec(model) and model not in MODEL_NAMES:
        raise unknown_model(model)
    given = [flag for flag, value in (("--layers", num_layers), ("--attention", attention)) if value is not None]
    if given:
        raise ValueError(f"{', '.join(given)} apply to transformers; {model!r} is an image model")
    return meta_trace(
        model,
        batch_size or DEFAULT_BATCH_SIZE["image"],
        resolution,
        hardware,
        sparsity=sparsity,
        dtype=dtype or DEFAULT_DTYPE["image"],
        width_mult=width_mult,
    )
