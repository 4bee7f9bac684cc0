"""What the codecs after ZVC share: a frozen container of flat buffers, and dispatch to backend modules.

A codec here is one class with an id (``name``), the dtypes it takes, and three backend modules
(``torch``, the reference that defines the bytes; ``cpu``, Numba; ``cuda``, Numba CUDA) that
write identical buffers. Its container subclasses :class:`Encoded` and names its buffers in
``buffer_names``; sizes, moves between devices and pinning follow from that.

Example:
    >>> import torch
    >>> from cswap.codecs.bitpack import BitPacked
    >>> p = BitPacked(words=torch.zeros(1, dtype=torch.int32), shape=(10,), dtype=torch.bool)
    >>> p.compressed_nbytes, p.original_nbytes
    (4, 10)
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any, ClassVar

import torch

from cswap.codecs.registry import check_backend

__all__ = ["BackendCodec", "BackendModules", "Encoded", "check_codec_dtype", "output_tensor"]


@dataclass(frozen=True)
class Encoded:
    """Base of a codec's container: the original shape and dtype, and flat buffers named by the subclass.

    Args:
        shape: the original tensor's shape.
        dtype: the original tensor's dtype.
    """

    buffer_names: ClassVar[tuple[str, ...]] = ()
    codec: ClassVar[str] = ""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def buffers(self) -> tuple[torch.Tensor, ...]:
        """The buffers, in ``buffer_names`` order."""
        return tuple(getattr(self, name) for name in self.buffer_names)

    @property
    def numel(self) -> int:
        """Elements of the original tensor."""
        return math.prod(self.shape)

    @property
    def device(self) -> torch.device:
        """Where the buffers live."""
        return self.buffers()[0].device

    @property
    def compressed_nbytes(self) -> int:
        """Bytes of all buffers."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    @property
    def original_nbytes(self) -> int:
        """Bytes of the uncompressed tensor."""
        return self.numel * self.dtype.itemsize

    @property
    def ratio(self) -> float:
        """``original_nbytes / compressed_nbytes`` (above 1 when compression saves memory)."""
        return self.original_nbytes / max(1, self.compressed_nbytes)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Encoded:
        """Move the buffers to ``device``; with ``non_blocking`` and pinned memory the copies are async."""
        return self._map(lambda b: b.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Encoded:
        """A copy whose host buffers are page-locked, so transfers to the GPU can be asynchronous."""
        return self._map(torch.Tensor.pin_memory)

    def _map(self, fn: object) -> Encoded:
        return replace(self, **{name: fn(getattr(self, name)) for name in self.buffer_names})  # type: ignore[operator]

    def _buffer_problems(self, expected: Mapping[str, tuple[torch.dtype, int]]) -> list[str]:
        """Dtype, rank and length problems of the buffers against ``{name: (dtype, numel)}``."""
        problems = [f"shape {self.shape} has a negative size"] if any(s < 0 for s in self.shape) else []
        for name, (dtype, numel) in expected.items():
            buffer = getattr(self, name)
            if buffer.dtype != dtype or buffer.dim() != 1:
                problems.append(f"{name} is a {buffer.dim()}-d {buffer.dtype} tensor, expected 1-d {dtype}")
            elif numel >= 0 and buffer.numel() != numel:
                problems.append(f"{name} has {buffer.numel()} elements, shape {self.shape} needs {numel}")
        return problems

    def _raise_if(self, problems: list[str]) -> None:
        if problems:
            raise ValueError(
                f"corrupt {self.codec} buffer: " + "; ".join(problems)
                + ". It was truncated or modified after compress(); compress the tensor again."
            )


def check_codec_dtype(codec: str, dtype: torch.dtype, takes: tuple[torch.dtype, ...]) -> None:
    """``ValueError`` naming the dtypes ``codec`` takes when ``dtype`` is not one of them.

    Example:
        >>> check_codec_dtype("bitpack", torch.float32, (torch.bool, torch.uint8))
        Traceback (most recent call last):
        ...
        ValueError: codec 'bitpack' cannot compress torch.float32: it takes bool, uint8
    """
    if dtype not in takes:
        names = ", ".join(str(d).removeprefix("torch.") for d in takes)
        raise ValueError(f"codec {codec!r} cannot compress {dtype}: it takes {names}")


class BackendModules:
    """A codec's backends as modules, imported on first use so that Numba loads only when needed.

    Args:
        codec_name: the codec's id, for error messages.
        modules: backend name -> module path.
    """

    def __init__(self, codec_name: str, modules: Mapping[str, str]) -> None:
        self.name = codec_name
        self.modules = dict(modules)
        self.backends = tuple(modules)

    def module(self, backend: str) -> ModuleType:
        """The module implementing ``backend``; ``ValueError`` naming the choices for an unknown one."""
        check_backend(self, backend)
        return importlib.import_module(self.modules[backend])

    def available(self) -> tuple[str, ...]:
        """Backends that can run on this machine."""
        return tuple(b for b in self.backends if self.module(b).available())


def output_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, out: torch.Tensor | None) -> torch.Tensor:
    """``out`` checked to be a contiguous tensor of ``shape`` and ``dtype``, or a new one on ``device``."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(
            f"out must be a contiguous {dtype} tensor of shape {shape}, "
            f"got {out.dtype} {tuple(out.shape)} (contiguous={out.is_contiguous()})"
        )
    return out


class BackendCodec:
    """Base of a codec whose backends are modules: its id, dtypes, container and the checks around a call.

    Subclasses set ``name``, ``dtypes``, ``container`` and ``backend_modules`` (backend -> module
    path), and implement ``compress`` and ``decompress`` with :meth:`_start` and :meth:`_start_decoding`.
    """

    name: ClassVar[str]
    dtypes: ClassVar[tuple[torch.dtype, ...]]
    container: ClassVar[type[Encoded]]
    backend_modules: ClassVar[Mapping[str, str]]

    def __init__(self) -> None:
        self._modules = BackendModules(self.name, self.backend_modules)
        self.backends = self._modules.backends

    def available_backends(self) -> tuple[str, ...]:
        """Backends that can run on this machine."""
        return self._modules.available()

    def _start(self, t: torch.Tensor, backend: str, launch: Any) -> tuple[ModuleType, Any]:
        """The backend module and checked launch for compressing ``t``; ``ValueError`` for a dtype not taken."""
        check_codec_dtype(self.name, t.dtype, self.dtypes)
        module = self._modules.module(backend)
        return module, module.check_launch(launch)

    def _start_decoding(
        self, packed: Encoded, backend: str, out: torch.Tensor | None, launch: Any, validate: bool
    ) -> tuple[ModuleType, Any, torch.Tensor]:
        """The backend module, checked launch and output tensor for decoding ``packed`` (validated first if asked)."""
        if not isinstance(packed, self.container):
            raise ValueError(f"codec {self.name!r} decodes a {self.container.__name__}, got {type(packed).__name__}")
        module = self._modules.module(backend)
        launch = module.check_launch(launch)
        if validate:
            packed.validate()  # type: ignore[attr-defined]
        return module, launch, output_tensor(packed.shape, packed.dtype, packed.device, out)
