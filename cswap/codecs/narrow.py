"""Exact narrowing of int64 tensors before ZVC.

ZVC drops only all-zero elements, so it cannot shrink a dense index tensor (max-pool, gather and
embedding indices are int64 and mostly nonzero). Such tensors usually hold small values: a
max-pool's indices are below its input plane's size. Stored as the narrowest signed integer that
holds every value, they shrink 2x to 8x with no loss, and widening them back restores the same
int64 values.

Example:
    >>> import torch
    >>> narrowest_int(torch.tensor([0, 1023, -5]))
    torch.int16
    >>> narrowest_int_for_range(0, 2**40) is None
    True
"""

from __future__ import annotations

import torch

__all__ = ["NARROW_INTS", "narrowest_int", "narrowest_int_for_range"]

#: The candidate encodings of an int64 tensor, narrowest first.
NARROW_INTS: tuple[torch.dtype, ...] = (torch.int8, torch.int16, torch.int32)


def narrowest_int_for_range(low: int, high: int) -> torch.dtype | None:
    """The narrowest of :data:`NARROW_INTS` that holds every integer in ``[low, high]``, else None.

    Args:
        low, high: the smallest and largest value of the tensor.
    """
    for dtype in NARROW_INTS:
        info = torch.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return dtype
    return None


def narrowest_int(t: torch.Tensor) -> torch.dtype | None:
    """The narrowest of :data:`NARROW_INTS` that holds every element of ``t`` exactly, else None.

    One pass over ``t`` (and one device synchronisation on a GPU). An empty tensor fits int8.

    Args:
        t: an integer tensor.
    """
    if t.numel() == 0:
        return NARROW_INTS[0]
    low, high = torch.aminmax(t)
    low_value, high_value = torch.stack((low, high)).tolist()
    return narrowest_int_for_range(low_value, high_value)
