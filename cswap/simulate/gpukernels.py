"""Dropout and attention on the ``meta`` device as a CUDA GPU runs them, so meta traces save what a GPU saves.

On ``meta`` (as on a CPU) two composite operators decompose differently from CUDA, and so autograd
saves different tensors:

* ``aten::dropout``: CUDA runs the fused ``native_dropout``, which saves a ``bool`` mask (1 byte
  per element); elsewhere it decomposes to ``bernoulli_`` and ``mul``, which save a mask in the
  input's dtype (2 or 4 bytes per element).
* ``aten::scaled_dot_product_attention``: on meta it takes the math path, which saves the
  ``s x s`` attention probabilities (upcast to float32); a GPU picks a fused kernel that saves
  only its inputs, output and a per-row log-sum-exp.

Inside :func:`cuda_kernels_on_meta` both run as CUDA would pick them for meta tensors:

* dropout with ``0 < p < 1`` in training is ``native_dropout`` (its ``bool`` mask is what the
  paper counts: one byte per element); ``p == 0`` or evaluation returns the input, as CUDA does;
* attention is FlashAttention-2 (``aten::_scaled_dot_product_flash_attention``) for 16-bit
  inputs with no mask and a head size of at most 256, saving query, key, value, output, the
  float32 log-sum-exp (``batch x heads x s``) and the dropout RNG's seed and offset (no mask: the
  kernel regenerates it in backward); grouped-query attention (fewer key/value heads) runs in the
  kernel without repeating key and value. Otherwise (float32 inputs, or an attention mask: BERT
  with padding) it is memory-efficient attention
  (``aten::_scaled_dot_product_efficient_attention``), which also saves the mask as an additive
  bias, with key and value repeated for grouped-query attention. These are the fused kernels
  torch's CUDA build tries first for such inputs (on an A100 or H100, every backend enabled).
  Where torch picks cuDNN attention instead, it saves the same tensors as flash; float32
  grouped-query attention may fall back to the math kernel on a GPU, which this does not model.

The overrides are registered for the ``AutogradMeta`` dispatch key only, while the context is
open: tensors on other devices never see them. ``torch.utils.flop_counter`` has formulas for both
attention kernels and their backward, so a :class:`~cswap.simulate.metatrace` clock prices them.

Example:
    >>> import torch
    >>> x = torch.empty(2, 8, device="meta", dtype=torch.bfloat16, requires_grad=True)
    >>> with cuda_kernels_on_meta():
    ...     y = torch.nn.functional.dropout(x, p=0.1, training=True)
    >>> type(y.grad_fn).__name__
    'NativeDropoutBackward0'
    >>> type(torch.nn.functional.dropout(x, p=0.1, training=True).grad_fn).__name__
    'MulBackward0'
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["FLASH_MAX_HEAD_DIM", "cuda_dropout_on_cpu", "cuda_kernels_on_meta"]

#: The largest head size FlashAttention-2 takes in torch's CUDA build.
FLASH_MAX_HEAD_DIM = 256

_lock = threading.Lock()
_depth = 0
_library: torch.library.Library | None = None


def _dropout(input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    # The branches CUDA's aten::dropout takes (at::native::dropout): fused only for 0 < p < 1.
    if not train or p == 0:
        return input
    if p >= 1:
        return input * torch.zeros_like(input)
    return torch.native_dropout(input, p, train)[0]


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True: attend) as the additive bias the fused kernels take, as torch converts it."""
    if mask.dtype != torch.bool:
        return mask.to(dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask.logical_not(), float("-inf"))


def _attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    head_dim = query.shape[-1]
    flash = (
        attn_mask is None
        and query.dtype in (torch.float16, torch.bfloat16)
        and head_dim == key.shape[-1] == value.shape[-1]
        and head_dim <= FLASH_MAX_HEAD_DIM
    )
    if flash:
        return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False, scale=scale)[0]
    groups = query.shape[-3] // key.shape[-3] if query.dim() >= 3 and key.dim() >= 3 else 1
    if enable_gqa and groups > 1:
        key = key.repeat_interleave(groups, dim=-3)
        value = value.repeat_interleave(groups, dim=-3)
    bias = None if attn_mask is None else _additive(attn_mask, query.dtype)
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, True, dropout_p, is_causal, scale=scale
    )[0]


@contextmanager
def cuda_kernels_on_meta() -> Iterator[None]:
    """Run dropout and scaled-dot-product attention on ``meta`` tensors as CUDA does (module docstring).

    Reentrant and safe across threads: the overrides are registered on the first entry and removed
    on the last exit.
    """
    global _depth, _library
    with _lock:
        if _depth == 0:
            library = torch.library.Library("aten", "IMPL")
            library.impl("dropout", _dropout, "AutogradMeta")
            library.impl("scaled_dot_product_attention", _attention, "AutogradMeta")
            _library = library
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _library is not None:
                _library._destroy()
                _library = None


@contextmanager
def cuda_dropout_on_cpu() -> Iterator[None]:
    """Dropout on CPU tensors as CUDA runs it: the fused ``native_dropout``, saving a ``bool`` mask.

    For measuring on a CPU what a GPU saves (the codecs' ratios on dropout masks, a runtime test of
    bit-packing): the CPU's own dropout saves the mask in the input's dtype. Not reentrant.

    Example:
        >>> x = torch.ones(4, requires_grad=True)
        >>> with cuda_dropout_on_cpu():
        ...     type(torch.nn.functional.dropout(x, p=0.5, training=True).grad_fn).__name__
        'NativeDropoutBackward0'
    """
    library = torch.library.Library("aten", "IMPL")
    library.impl("dropout", _dropout, "AutogradCPU")
    try:
        yield
    finally:
        library._destroy()
