"""ZVC format v1: the layout every backend reads and writes, and the container that holds it.

A tensor of ``n`` elements is read as unsigned integers of its own width (1, 2, 4 or 8 bytes); an
element is "zero" when all its bits are zero, so ``-0.0``, NaN payloads and denormals survive.

* ``bitmap``: ``ceil(n / 32)`` uint32 words (stored as ``torch.int32``, same bits); element ``i`` is
  bit ``i % 32`` of word ``i // 32``, least significant bit first.
* ``offsets``: ``n_chunks + 1`` int64 prefix sums of the nonzero count per chunk of ``chunk_words``
  words, so each chunk decompresses independently.
* ``values``: the nonzero elements in order, as integers of the element width (their exact bits).

Example:
    >>> import torch
    >>> zvc_compressed_nbytes(numel=1000, nnz=10, itemsize=4, chunk_words=32)
    184
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from cswap.codecs.launch import DEFAULT_CHUNK_WORDS, MAX_CHUNK_WORDS, check_chunk_words

__all__ = [
    "DEFAULT_CHUNK_WORDS",
    "MAX_CHUNK_WORDS",
    "SUPPORTED_DTYPES",
    "Packed",
    "bits_dtype",
    "check_chunk_words",
    "check_dtype",
    "n_chunks_for",
    "n_words_for",
    "zvc_compressed_nbytes",
    "out_buffer",
]

_BITS_BY_ITEMSIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
)


def check_dtype(dtype: torch.dtype) -> None:
    """Raise ``TypeError`` unless ``dtype`` is one ZVC supports.

    Args:
        dtype: the dtype of the tensor to compress.

    Example:
        >>> check_dtype(torch.float32)
    """
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise TypeError(
            f"ZVC cannot compress dtype {dtype}: supported dtypes are {names}. "
            "Convert the tensor (for complex, torch.view_as_real) before compressing."
        )


def bits_dtype(dtype: torch.dtype) -> torch.dtype:
    """The integer dtype of the same width whose values are ``dtype``'s bit patterns.

    Example:
        >>> bits_dtype(torch.bfloat16)
        torch.int16
    """
    check_dtype(dtype)
    return _BITS_BY_ITEMSIZE[dtype.itemsize]


def n_words_for(numel: int) -> int:
    """Bitmap words for ``numel`` elements."""
    return (numel + 31) // 32


def n_chunks_for(numel: int, chunk_words: int) -> int:
    """Chunks of ``chunk_words`` words for ``numel`` elements."""
    return (n_words_for(numel) + chunk_words - 1) // chunk_words


def zvc_compressed_nbytes(numel: int, nnz: int, itemsize: int, chunk_words: int = DEFAULT_CHUNK_WORDS) -> int:
    """Exact size of a ZVC v1 buffer: bitmap + offsets + values.

    Args:
        numel: elements in the tensor.
        nnz: elements whose bits are not all zero.
        itemsize: bytes per element.
        chunk_words: words per offsets chunk.

    Example:
        >>> zvc_compressed_nbytes(64, 0, 4, 32)
        24
    """
    return 4 * n_words_for(numel) + 8 * (n_chunks_for(numel, chunk_words) + 1) + itemsize * nnz


@dataclass(frozen=True)
class Packed:
    """A compressed tensor: the three ZVC buffers and what is needed to rebuild the original.

    Args:
        bitmap: int32 tensor of ``ceil(numel / 32)`` words (uint32 bit patterns).
        offsets: int64 tensor of ``n_chunks + 1`` nonzero prefix counts per chunk.
        values: nonzero elements as integers of the element width (see :func:`bits_dtype`).
        shape: the original tensor's shape.
        dtype: the original tensor's dtype.
        chunk_words: words per offsets chunk.
        codec: the codec that wrote it.

    Example:
        >>> from cswap.codecs import compress
        >>> p = compress(torch.tensor([0.0, 1.0, 0.0, 2.0]))
        >>> p.nnz, p.original_nbytes
        (2, 16)
    """

    buffer_names: ClassVar[tuple[str, ...]] = ("bitmap", "offsets", "values")

    bitmap: torch.Tensor
    offsets: torch.Tensor
    values: torch.Tensor
    shape: tuple[int, ...]
    dtype: torch.dtype
    chunk_words: int = DEFAULT_CHUNK_WORDS
    codec: str = "zvc"

    def buffers(self) -> tuple[torch.Tensor, ...]:
        """The buffers, in ``buffer_names`` order."""
        return (self.bitmap, self.offsets, self.values)

    @property
    def numel(self) -> int:
        """Elements of the original tensor."""
        return math.prod(self.shape)

    @property
    def nnz(self) -> int:
        """Nonzero elements stored in ``values``."""
        return self.values.numel()

    @property
    def itemsize(self) -> int:
        """Bytes per element of the original dtype."""
        return self.dtype.itemsize

    @property
    def device(self) -> torch.device:
        """Where the buffers live."""
        return self.values.device

    @property
    def compressed_nbytes(self) -> int:
        """Bytes of bitmap + offsets + values."""
        return (
            self.bitmap.numel() * self.bitmap.element_size()
            + self.offsets.numel() * self.offsets.element_size()
            + self.values.numel() * self.values.element_size()
        )

    @property
    def original_nbytes(self) -> int:
        """Bytes of the uncompressed tensor."""
        return self.numel * self.itemsize

    @property
    def ratio(self) -> float:
        """``original_nbytes / compressed_nbytes`` (above 1 when compression saves memory)."""
        return self.original_nbytes / self.compressed_nbytes

    @property
    def density(self) -> float:
        """Fraction of nonzero elements (1 - sparsity); 0 for an empty tensor."""
        return self.nnz / self.numel if self.numel else 0.0

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Packed:
        """Move the buffers to ``device``; with ``non_blocking`` and pinned memory the copies are async.

        Example:
            >>> from cswap.codecs import compress
            >>> p = compress(torch.tensor([0.0, 1.0]))
            >>> p.to("cpu").device
            device(type='cpu')
        """
        return replace(
            self,
            bitmap=self.bitmap.to(device, non_blocking=non_blocking),
            offsets=self.offsets.to(device, non_blocking=non_blocking),
            values=self.values.to(device, non_blocking=non_blocking),
        )

    @classmethod
    def workspace(
        cls,
        shape: tuple[int, ...] | torch.Size,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        chunk_words: int = DEFAULT_CHUNK_WORDS,
        pin_memory: bool = False,
    ) -> Packed:
        """Empty buffers with room for any tensor of ``shape`` and ``dtype``: pass as ``compress(..., out=)``.

        ``values`` has ``numel`` elements (the all-nonzero worst case), so this is not itself a
        valid Packed; :func:`cswap.codecs.compress` returns views of its first elements.

        Args:
            shape: the shape of the tensors to compress.
            dtype: their dtype.
            device: where the buffers live.
            chunk_words: the chunk size the compression will use.
            pin_memory: page-locked host buffers (CPU only), for asynchronous copies to a GPU.

        Example:
            >>> ws = Packed.workspace((4, 256), torch.float32)
            >>> ws.bitmap.numel(), ws.offsets.numel(), ws.values.numel()
            (32, 2, 1024)
        """
        numel = math.prod(shape)
        pin = pin_memory and torch.device(device).type == "cpu"

        def empty(n: int, buffer_dtype: torch.dtype) -> torch.Tensor:
            return torch.empty(n, dtype=buffer_dtype, device=device, pin_memory=pin)

        return cls(
            bitmap=empty(n_words_for(numel), torch.int32),
            offsets=empty(n_chunks_for(numel, chunk_words) + 1, torch.int64),
            values=empty(numel, bits_dtype(dtype)),
            shape=tuple(shape),
            dtype=dtype,
            chunk_words=chunk_words,
        )

    def pin_memory(self) -> Packed:
        """A copy whose host buffers are page-locked, so transfers to the GPU can be asynchronous."""
        return replace(
            self,
            bitmap=self.bitmap.pin_memory(),
            offsets=self.offsets.pin_memory(),
            values=self.values.pin_memory(),
        )

    def validate(self, check_counts: bool = True) -> None:
        """Raise ``ValueError`` if the buffers disagree with each other or with the shape.

        Checks dtypes and lengths, that offsets start at 0, never decrease, grow by at most a
        chunk's element count and end at ``len(values)``; with ``check_counts`` also that each
        chunk's bitmap popcount equals its offsets step. After this passes, decoding reads no
        element out of bounds.

        Args:
            check_counts: also compare bitmap popcounts with offsets (one pass over the bitmap).
        """
        problems = self._problems(check_counts)
        if problems:
            raise ValueError(
                "corrupt ZVC buffer: " + "; ".join(problems)
                + ". The Packed was truncated or modified after compress(); compress the tensor again."
            )

    def _problems(self, check_counts: bool) -> list[str]:
        chunk_problem = check_chunk_words(self.chunk_words)
        if chunk_problem:
            return [chunk_problem]
        if any(s < 0 for s in self.shape):
            return [f"shape {self.shape} has a negative size"]
        check_dtype(self.dtype)
        expected_values = bits_dtype(self.dtype)
        problems = []
        for name, tensor, want in (
            ("bitmap", self.bitmap, torch.int32),
            ("offsets", self.offsets, torch.int64),
            ("values", self.values, expected_values),
        ):
            if tensor.dtype != want:
                problems.append(f"{name} has dtype {tensor.dtype}, expected {want}")
            if tensor.dim() != 1:
                problems.append(f"{name} has {tensor.dim()} dimensions, expected 1")
        if problems:
            return problems
        n_words = n_words_for(self.numel)
        n_chunks = n_chunks_for(self.numel, self.chunk_words)
        if self.bitmap.numel() != n_words:
            problems.append(f"bitmap has {self.bitmap.numel()} words, shape {self.shape} needs {n_words}")
        if self.offsets.numel() != n_chunks + 1:
            problems.append(f"offsets has {self.offsets.numel()} entries, expected {n_chunks + 1}")
        if problems:
            return problems
        offsets = self.offsets.cpu()
        if int(offsets[0]) != 0:
            problems.append(f"offsets[0] is {int(offsets[0])}, expected 0")
        steps = offsets.diff()
        if steps.numel() and int(steps.min()) < 0:
            problems.append("offsets decrease")
        if steps.numel() and int(steps.max()) > 32 * self.chunk_words:
            problems.append(f"an offsets step exceeds the {32 * self.chunk_words} elements of a chunk")
        if int(offsets[-1]) != self.values.numel():
            problems.append(f"offsets end at {int(offsets[-1])} but values holds {self.values.numel()} elements")
        if problems or not check_counts:
            return problems
        tail = self.numel % 32
        if tail and (int(self.bitmap[-1]) & 0xFFFFFFFF) >> tail:
            return [f"the last bitmap word has bits set past element {self.numel - 1}"]
        # Imported here so that the format loads without Numba, which only validation needs.
        from cswap.codecs.popcount import chunk_popcounts

        counts = chunk_popcounts(self.bitmap, self.chunk_words).cpu()
        if not torch.equal(counts, steps):
            bad = int((counts != steps).nonzero()[0, 0])
            problems.append(
                f"chunk {bad} has {int(counts[bad])} set bits in the bitmap but {int(steps[bad])} values in offsets"
            )
        return problems


def out_buffer(
    name: str, buffer: torch.Tensor, needed: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The first ``needed`` elements of a caller's buffer, after checking that it can hold them.

    Args:
        name: what the error message calls the buffer (``out.values``).
        buffer: the caller's buffer.
        needed: elements the result needs.
        dtype: the dtype the result must have.
        device: the device the result must be on.

    Example:
        >>> out_buffer("out.values", torch.empty(8, dtype=torch.int32), 3, torch.int32, torch.device("cpu")).shape
        torch.Size([3])
    """
    if buffer.device != device:
        raise ValueError(f"{name} is on {buffer.device} but the tensor is on {device}: allocate the buffers there")
    if buffer.dtype != dtype or buffer.dim() != 1 or not buffer.is_contiguous():
        raise ValueError(
            f"{name} must be a contiguous 1-d {dtype} tensor, got {buffer.dtype} of shape {tuple(buffer.shape)}: "
            "make the buffers with Packed.workspace(shape, dtype)"
        )
    if buffer.numel() < needed:
        raise ValueError(
            f"{name} holds {buffer.numel()} elements but this tensor needs {needed}: "
            "make the buffers with Packed.workspace(shape, dtype), which has room for any tensor of that shape"
        )
    return buffer[:needed]
