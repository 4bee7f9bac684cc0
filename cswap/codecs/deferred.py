"""Compression whose size the host learns later: no host wait while the device compresses.

:func:`cswap.codecs.encode` sizes its ``values`` exactly, which on a GPU means the host reads the
nonzero count back before the scatter: one synchronisation per tensor, so a training loop's
forward can never run ahead of the device. :func:`encode_unsized` instead writes the values into
a workspace of ``numel`` elements and queues one copy of the count (and, for a narrowed int64
tensor, whether the narrowing held) into a small host buffer, completed by an event. The host
reads it in :meth:`Unsized.resolve`, when the bytes must move or be cut to their exact size.

Narrowing an int64 tensor (:func:`cswap.codecs.narrowest_int`) needs its value range before the
encoded width is chosen. Here the width is given (``narrow_to``, as a profile recorded it) and
the check that every value fits is part of the same device pass and readback; when it did not
hold, :meth:`Unsized.resolve` raises :class:`NarrowingMissed` and the caller encodes the source
exactly.

On the ``torch`` and ``cpu`` backends nothing waits for a device: the result is sized at once
(its ``values`` exact) and :meth:`Unsized.ready` is true.

Example:
    >>> import torch
    >>> t = torch.tensor([0.0, 1.5, 0.0, 2.5])
    >>> pending = encode_unsized(t, backend="cpu")
    >>> pending.ready(), pending.resolve().values.view(torch.float32).tolist()
    (True, [1.5, 2.5])
    >>> encode_unsized(torch.tensor([1, 300]), backend="cpu", narrow_to=torch.int8).resolve()
    Traceback (most recent call last):
    ...
    cswap.codecs.deferred.NarrowingMissed: the int64 tensor does not fit int8: encode it exactly (cswap.codecs.encode)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cswap.codecs.api import _launch, compress, default_backend
from cswap.codecs.format import DEFAULT_CHUNK_WORDS, Packed, bits_dtype, check_dtype

__all__ = ["NarrowingMissed", "Unsized", "encode_unsized"]


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class NarrowingMissed(ValueError):
    """The width an int64 tensor was narrowed to did not hold all its values (nothing was lost:
    encode the source exactly)."""


@dataclass(frozen=True)
class Unsized:
    """A ZVC encoding whose nonzero count is still on its way to the host.

    Attributes:
        bitmap, offsets: the exact bitmap and offsets buffers.
        values: a workspace whose first ``nnz`` elements are the nonzeros.
        shape: the tensor's shape.
        dtype: the encoded dtype (narrower than ``source_dtype`` for a narrowed int64 tensor).
        source_dtype: the tensor's own dtype.
        chunk_words: the offsets' chunk size.
        counts: host buffer ``[nnz, narrowing held (1) or not (0)]``, written by a queued copy.
        event: recorded after that copy (``None``: already written).
    """

    bitmap: torch.Tensor
    offsets: torch.Tensor
    values: torch.Tensor
    shape: tuple[int, ...]
    dtype: torch.dtype
    source_dtype: torch.dtype
    chunk_words: int
    counts: torch.Tensor
    event: Any = None

    @property
    def workspace_nbytes(self) -> int:
        """Device bytes the buffers hold until :meth:`resolve` with ``exact=True`` cuts them."""
        return sum(b.numel() * b.element_size() for b in (self.bitmap, self.offsets, self.values))

    def ready(self) -> bool:
        """Whether :meth:`resolve` would return without waiting for the device."""
        return self.event is None or bool(self.event.query())

    def resolve(self, exact: bool = False) -> Packed:
        """The :class:`~cswap.codecs.Packed`, waiting for the count if it has not arrived.

        Args:
            exact: copy the nonzeros out of the workspace (on the current stream), so that the
                result holds only its own bytes; otherwise ``values`` is a view of the workspace.

        Raises:
            NarrowingMissed: the given narrow width did not hold every value.
        """
        if self.event is not None:
            self.event.synchronize()
        nnz, held = (int(v) for v in self.counts.tolist())
        if not held:
            raise NarrowingMissed(f"the {_name(self.source_dtype)} tensor does not fit {_name(self.dtype)}: "
                                  "encode it exactly (cswap.codecs.encode)")
        values = self.values[:nnz]
        return Packed(self.bitmap, self.offsets, values.clone() if exact else values, self.shape, self.dtype, self.chunk_words)


def encode_unsized(
    t: torch.Tensor,
    backend: str | None = None,
    launch: Any = None,
    narrow_to: torch.dtype | None = None,
    counts: torch.Tensor | None = None,
) -> Unsized:
    """Encode ``t`` without the host waiting for the device (module docstring).

    Args:
        t: a contiguous tensor of a ZVC dtype.
        backend, launch: as for :func:`cswap.codecs.compress`.
        narrow_to: for an int64 tensor, the integer dtype to store it as (checked on the device).
        counts: a host int64 buffer of 2 elements for the readback; on a GPU it should be pinned
            and allocated ahead (allocating pinned memory synchronises the device). ``None``
            allocates one.
    """
    check_dtype(t.dtype)
    backend = backend or default_backend(t.device)
    source_dtype = t.dtype
    held: torch.Tensor | None = None
    if narrow_to is not None and t.dtype == torch.int64 and narrow_to != t.dtype:
        narrowed = t.to(narrow_to)
        held = torch.eq(narrowed.to(torch.int64), t).all()
        t = narrowed
    if counts is None:
        counts = torch.empty(2, dtype=torch.int64, pin_memory=t.is_cuda)
    if backend != "cuda":
        packed = compress(t, backend=backend, launch=launch)
        counts[0] = packed.nnz
        counts[1] = 1 if held is None else int(held)
        return Unsized(packed.bitmap, packed.offsets, packed.values, tuple(t.shape), t.dtype, source_dtype,
                       packed.chunk_words, counts)
    from cswap.codecs import zvc_cuda  # numba-cuda only where the CUDA backend runs

    chosen = zvc_cuda.check_launch(_launch(backend, launch))
    chunk_words = getattr(chosen, "chunk_words", DEFAULT_CHUNK_WORDS)
    flat_bits = t.detach().reshape(-1).view(bits_dtype(t.dtype))
    bitmap, offsets, values = zvc_cuda.compress_bits_unsized(flat_bits, chunk_words, chosen)
    flag = held.to(torch.int64) if held is not None else torch.ones((), dtype=torch.int64, device=t.device)
    device_counts = torch.stack((offsets[-1], flag))
    event = None
    if t.is_cuda:
        counts.copy_(device_counts, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(t.device))
    else:  # Numba's simulator: "device" buffers are host memory already
        counts.copy_(device_counts)
    return Unsized(bitmap, offsets, values, tuple(t.shape), t.dtype, source_dtype, chunk_words, counts, event)
