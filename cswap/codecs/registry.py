"""Codec and backend registry: a later codec joins by name without touching the callers.

A codec is an object with ``compress(t, backend, launch) -> Packed`` and
``decompress(packed, backend, out, launch, validate) -> Tensor`` and a tuple ``backends``. Codecs are
registered as import paths so that importing :mod:`cswap.codecs` does not load Numba.

Example:
    >>> from cswap.codecs.registry import CODECS
    >>> CODECS.names()
    ('zvc', 'bitpack', 'exponent')
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol
from collections.abc import Callable

import torch

from cswap.codecs.format import Packed
from cswap.codecs.launch import Launch

__all__ = ["CODECS", "Codec", "CodecRegistry", "check_backend"]


class Codec(Protocol):
    """What a codec offers to :func:`cswap.codecs.compress` and :func:`cswap.codecs.decompress`."""

    name: str
    backends: tuple[str, ...]

    def compress(self, t: torch.Tensor, backend: str, launch: Launch | None) -> Packed: ...

    def decompress(
        self, packed: Packed, backend: str, out: torch.Tensor | None, launch: Launch | None, validate: bool
    ) -> torch.Tensor: ...

    def available_backends(self) -> tuple[str, ...]: ...


class CodecRegistry:
    """Name -> codec, loaded on first use from a ``module:attribute`` path or a factory."""

    def __init__(self) -> None:
        self._factories: dict[str, Callable[[], Codec]] = {}
        self._loaded: dict[str, Codec] = {}

    def register(self, name: str, factory: Callable[[], Codec] | str) -> None:
        """Add a codec under ``name``.

        Args:
            name: what users pass as ``codec=``.
            factory: a callable returning the codec, or ``"package.module:attribute"``.
        """
        if name in self._factories:
            raise ValueError(f"codec {name!r} is already registered")
        if isinstance(factory, str):
            path = factory

            def factory() -> Codec:
                module, _, attribute = path.partition(":")
                return getattr(importlib.import_module(module), attribute)

        self._factories[name] = factory

    def names(self) -> tuple[str, ...]:
        """Registered codec names."""
        return tuple(self._factories)

    def get(self, name: str) -> Codec:
        """The codec called ``name``; ``ValueError`` naming the choices when there is none."""
        if name not in self._factories:
            raise ValueError(f"unknown codec {name!r}: choose one of {', '.join(self.names())}")
        if name not in self._loaded:
            self._loaded[name] = self._factories[name]()
        return self._loaded[name]


CODECS = CodecRegistry()
CODECS.register("zvc", "cswap.codecs.zvc:ZVC")
CODECS.register("bitpack", "cswap.codecs.bitpack:BITPACK")
CODECS.register("exponent", "cswap.codecs.exponent:EXPONENT")


def check_backend(codec: Any, backend: str) -> None:
    """``ValueError`` naming the backend and the choices when ``codec`` has no such backend."""
    if backend not in codec.backends:
        raise ValueError(
            f"unknown backend {backend!r} for codec {codec.name!r}: choose one of {', '.join(codec.backends)}"
        )
