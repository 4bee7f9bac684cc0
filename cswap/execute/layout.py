"""How a saved tensor is stored compactly and rebuilt with its original shape and strides.

Autograd saves views: transposes, slices, and stride-0 broadcasts from ``expand``. An offloaded
tensor is stored as a flat 1-d run of its elements (``numel`` of its *base*, the tensor with every
broadcast dimension narrowed to one element), and rebuilt with exactly the original strides, so
that backward kernels see the same memory format they would have seen without cswap:

* a broadcast dimension (stride 0) is stored once and re-expanded;
* a non-overlapping, dense base (contiguous, channels-last, any permutation) is its storage span,
  read and written without a gather;
* a non-dense base (a slice with gaps) is gathered into logical order and scattered back into a
  buffer with the original strides (the gaps hold garbage nobody reads);
* a self-overlapping base (``as_strided`` tricks) is returned contiguous: its values are equal,
  only its strides differ.

The storage offset is kept modulo 64 bytes, so vectorised kernels see the same alignment.

Example:
    >>> import torch
    >>> x = torch.arange(6.0).view(2, 3).t()            # a transposed (dense) view
    >>> layout = Layout.of(x)
    >>> compact = layout.compact(x)
    >>> y = layout.rebuild_from(compact.clone())
    >>> torch.equal(y, x), y.stride() == x.stride()
    (True, True)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

__all__ = ["Layout"]

_ALIGN_BYTES = 64


def _is_dense(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Non-overlapping and dense: the elements fill ``numel`` consecutive storage slots."""
    dims = sorted((st, sz) for sz, st in zip(shape, stride) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


def _is_non_overlapping(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """A sufficient test that no two elements share a storage slot (each stride clears the smaller dims)."""
    dims = sorted((st, sz) for sz, st in zip(shape, stride) if sz != 1)
    reach = 0  # the largest offset the dims so far can reach
    for st, sz in dims:
        if st <= reach:
            return False
        reach += (sz - 1) * st
    return True


@dataclass(frozen=True)
class Layout:
    """The geometry of a saved tensor and how its compact form maps back onto it.

    Attributes:
        shape, stride: the saved tensor's.
        base_shape: ``shape`` with every broadcast (stride-0, size > 1) dimension set to 1.
        dtype: element type.
        numel: elements of the base, i.e. of the compact form.
        dense: the base is non-overlapping and dense (its compact form is its storage span).
        exact: the rebuilt tensor has exactly ``stride`` (False only for self-overlapping bases).
        span: elements a buffer needs to hold the base with its strides.
        pad: elements before the base in that buffer (the storage offset modulo 64 bytes).
        plain: contiguous and 64-byte aligned, the common case: the tensor itself is its compact
            form (shaped), and a fresh contiguous buffer rebuilds it exactly.
        nbytes: bytes of the compact form.
    """

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    base_shape: tuple[int, ...]
    dtype: torch.dtype
    numel: int
    dense: bool
    exact: bool
    span: int
    pad: int
    plain: bool = False
    nbytes: int = field(init=False, compare=False)  # of the compact form; read once per hook call

    def __post_init__(self) -> None:
        object.__setattr__(self, "nbytes", self.numel * self.dtype.itemsize)

    @property
    def rebuilt_nbytes(self) -> int:
        """At most the bytes the rebuilt tensor's buffer holds: the compact form, or, with the
        original strides, their span (a slice of a larger tensor rebuilt as it was saved spans the
        rows it skips), after ``pad`` elements of alignment.

        Example:
            >>> Layout.of(torch.zeros(4, 16, 32)[:, 0]).rebuilt_nbytes  # 512 bytes of data, 6272 spanned
            6272
        """
        return (self.pad + max(self.span, self.numel)) * self.dtype.itemsize

    @classmethod
    def of(cls, t: torch.Tensor) -> Layout:
        """The layout of ``t`` (a strided tensor)."""
        shape = tuple(t.shape)
        stride = tuple(t.stride())
        itemsize = t.element_size()
        pad = (t.storage_offset() * itemsize) % _ALIGN_BYTES // itemsize
        if t.is_contiguous():
            # The common case, decided in C: row-major, so dense, exact and without broadcasts.
            # Saved tensors repeat few geometries, and one frozen Layout serves each.
            return _contiguous(shape, stride, t.dtype, pad)
        base_shape = tuple(1 if (st == 0 and sz > 1) else sz for sz, st in zip(shape, stride))
        numel = 1
        for sz in base_shape:
            numel *= sz
        dense = _is_dense(base_shape, stride)
        exact = dense or _is_non_overlapping(base_shape, stride)
        span = 1 + sum((sz - 1) * st for sz, st in zip(base_shape, stride)) if numel else 0
        return cls(shape, stride, base_shape, t.dtype, numel, dense, exact, span, pad)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize


    @property
    def broadcast(self) -> bool:
        """Whether some dimension is a stride-0 broadcast."""
        return self.base_shape != self.shape

    def _base(self, t: torch.Tensor) -> torch.Tensor:
        if not self.broadcast:
            return t
        for dim, (size, base_size) in enumerate(zip(self.shape, self.base_shape)):
            if size != base_size:
                t = t.narrow(dim, 0, 1)
        return t

    def compact(self, t: torch.Tensor) -> torch.Tensor:
        """The flat 1-d compact form of ``t``: a view of its storage when dense, else a gathered copy."""
        base = self._base(t)
        if self.dense:
            return base.as_strided((self.numel,), (1,), base.storage_offset())
        return base.contiguous().view(-1)

    def allocate(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A buffer for the rebuilt tensor: ``(flat, result)``.

        Write the compact form into ``flat`` (contiguous, ``numel`` elements). When ``result`` is not
        ``None`` it is already the rebuilt tensor (a view of the same buffer); otherwise finish with
        :meth:`rebuild_from` on ``flat``.
        """
        if self.dense:
            buffer = torch.empty(self.pad + self.numel, dtype=self.dtype, device=device)
            flat = buffer[self.pad :]
            return flat, self._expand(buffer.as_strided(self.base_shape, self.stride, self.pad))
        return torch.empty(self.numel, dtype=self.dtype, device=device), None

    def rebuild_from(self, flat: torch.Tensor) -> torch.Tensor:
        """The tensor of the original shape and strides holding the compact form ``flat``.

        For a dense layout this is a view of ``flat``; otherwise the values are scattered into a new
        buffer with the original strides (or, for a self-overlapping base, returned contiguous).
        """
        if self.dense:
            if self.pad:
                buffer = torch.empty(self.pad + self.numel, dtype=self.dtype, device=flat.device)
                buffer[self.pad :].copy_(flat)
                return self._expand(buffer.as_strided(self.base_shape, self.stride, self.pad))
            return self._expand(flat.as_strided(self.base_shape, self.stride, flat.storage_offset()))
        values = flat.view(self.base_shape)
        if not self.exact:
            return self._expand(values)
        buffer = torch.empty(self.pad + self.span, dtype=self.dtype, device=flat.device)
        view = buffer.as_strided(self.base_shape, self.stride, self.pad)
        view.copy_(values)
        return self._expand(view)

    def _expand(self, t: torch.Tensor) -> torch.Tensor:
        return t.expand(self.shape) if self.broadcast else t


@functools.lru_cache(maxsize=4096)
def _contiguous(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype, pad: int) -> Layout:
    numel = 1
    for size in shape:
        numel *= size
    return Layout(shape, stride, shape, dtype, numel, True, True, numel, pad, plain=pad == 0)
