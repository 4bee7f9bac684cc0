"""What the simulator assumes of how well a saved tensor compresses, which a meta trace cannot see.

A meta trace has shapes and dtypes, no values. ZVC's size follows from the sparsity estimates of
:class:`cswap.simulate.metatrace.SparsityModel`; the other codecs' sizes come from a profile
measured on a trained model (``configs/compressibility/<name>.yaml``, with its source and date):
per kind of tensor (``activation``, ``attention_probabilities``, ``mask``, ``upcast``: a float32
tensor cast up from bf16 or fp16) and dtype, the bytes the best codec besides ZVC gives it over its
raw bytes. A kind or dtype the profile has no figure for is taken as not compressible by them.

Example:
    >>> profile = load_compressibility("all-minilm-l6-v2")
    >>> profile.codec_of("bfloat16", "activation")[0], profile.codec_of("bool", "mask")
    ('exponent', ('bitpack', 0.125))
    >>> profile.codec_of("int64", "activation") is None
    True
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import yaml

from cswap.paths import shipped_configs_dir

__all__ = ["DEFAULT_COMPRESSIBILITY", "KINDS", "Compressibility", "compressibility_names", "load_compressibility", "compressibility_named"]

#: The profile ``cswap simulate`` uses unless told otherwise.
DEFAULT_COMPRESSIBILITY = "all-minilm-l6-v2"

KINDS: tuple[str, ...] = ("activation", "attention_probabilities", "mask", "upcast")

_CODEC_BY_DTYPE = MappingProxyType({"bool": "bitpack", "bfloat16": "exponent", "float16": "exponent", "float32": "exponent"})


@dataclass(frozen=True)
class Compressibility:
    """Bytes per raw byte that the codec besides ZVC gives each kind and dtype of saved tensor.

    Args:
        fractions: ``{kind: {dtype name: compressed / raw}}``.
        source: what was measured, and how.
        date: when.
    """

    fractions: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    source: str = ""
    date: str = ""

    def __post_init__(self) -> None:
        for kind, by_dtype in self.fractions.items():
            if kind not in KINDS:
                raise ValueError(f"compressibility kind {kind!r} is not one of {', '.join(KINDS)}")
            for dtype, fraction in by_dtype.items():
                if dtype not in _CODEC_BY_DTYPE:
                    raise ValueError(f"compressibility of {kind} {dtype!r}: no codec besides ZVC takes it ({', '.join(_CODEC_BY_DTYPE)} do)")
                if not 0.0 < float(fraction) <= 2.0:
                    raise ValueError(f"compressibility of {kind} {dtype} is {fraction!r}: a fraction of the raw bytes in (0, 2]")

    def codec_of(self, dtype: str, kind: str) -> tuple[str, float] | None:
        """``(codec, compressed / raw)`` for a tensor of ``dtype`` and ``kind``, or ``None`` when not known."""
        fraction = self.fractions.get(kind, {}).get(dtype)
        if fraction is None and kind != "activation" and dtype != "bool":
            fraction = self.fractions.get("activation", {}).get(dtype)
        if fraction is None:
            return None
        return _CODEC_BY_DTYPE[dtype], float(fraction)


def compressibility_dir() -> Path:
    """Where the shipped profiles live."""
    return shipped_configs_dir() / "compressibility"


def compressibility_names() -> tuple[str, ...]:
    """The shipped profiles' names."""
    return tuple(sorted(p.stem for p in compressibility_dir().glob("*.yaml")))


def load_compressibility(name_or_path: str | os.PathLike[str]) -> Compressibility:
    """A profile by name (``all-minilm-l6-v2``) or by path to its YAML file.

    Raises:
        ValueError: an unknown name (listing the shipped ones) or a malformed file (naming it).
    """
    text = str(name_or_path)
    path = Path(text)
    if not (text.endswith((".yaml", ".yml")) or path.is_file()):
        path = compressibility_dir() / f"{text}.yaml"
        if not path.is_file():
            raise ValueError(f"unknown compressibility profile {text!r}: choose one of {', '.join(compressibility_names())}, or a YAML path")
    data = yaml.safe_load(path.read_text()) or {}
    try:
        return Compressibility(fractions=data.get("fractions", {}), source=str(data.get("source", "")), date=str(data.get("date", "")))
    except (ValueError, AttributeError, TypeError) as error:
        raise ValueError(f"{path}: {error}") from None


def compressibility_named(name_or_path: str | os.PathLike[str] | None) -> Compressibility | None:
    """:func:`load_compressibility`'s profile, or ``None`` (ZVC alone) for ``None`` or ``"none"``, as
    the commands' ``--compressibility`` takes it.

    Example:
        >>> compressibility_named("none") is None, compressibility_named("all-minilm-l6-v2") is not None
        (True, True)
    """
    if name_or_path is None or str(name_or_path) == "none":
        return None
    return load_compressibility(name_or_path)
