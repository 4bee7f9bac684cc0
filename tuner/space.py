"""Search spaces of the kernel launch configs, loaded from ``configs/search_spaces/``.

A file describes one backend of one codec: ``<backend>.yaml`` for ZVC, ``<codec>-<backend>.yaml``
for the others (``bitpack-cpu.yaml``, ``exponent-cuda.yaml``, ...). Per op (``compress``,
``decompress``) it lists the launch parameters to search, each with inclusive bounds and a scale
(``linear``, ``log`` or ``pow2``); a codec takes only the launch fields its kernels read
(:data:`CODEC_LAUNCH_FIELDS`). Files are validated on load; a problem raises
:class:`SearchSpaceError` naming the file and what to fix.

The files are found, in order: the ``path`` argument (a file or a directory), ``$CSWAP_SEARCH_SPACES``
(a directory), then the repository's ``configs/search_spaces`` next to this package, so they load
from any working directory.

Example:
    >>> space = load_search_space("cpu", "compress", cores=4)
    >>> space.names
    ('threads', 'chunk_words')
    >>> space.grid_size
    44
    >>> space.project({"threads": 9, "chunk_words": 100})
    {'threads': 4, 'chunk_words': 128}
    >>> load_search_space("cpu", "compress", cores=4, codec="bitpack").names
    ('threads',)
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal
from collections.abc import Iterator, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cswap.codecs.launch import CpuLaunch, CudaLaunch, launch_from_params
from cswap.paths import shipped_configs_dir

__all__ = [
    "BACKENDS",
    "CODEC_LAUNCH_FIELDS",
    "OPS",
    "TUNED_CODECS",
    "Param",
    "SearchSpace",
    "SearchSpaceError",
    "check_codec",
    "check_launch_params",
    "load_search_space",
    "load_search_spaces",
    "parse_codecs",
    "search_space_dir",
    "space_file_name",
]

#: Codec backends that have launch parameters to tune.
BACKENDS: tuple[str, ...] = ("cpu", "cuda")
#: Codec operations tuned separately (the CUDA compress op launches three kernels).
OPS: tuple[str, ...] = ("compress", "decompress")

#: The environment variable that points at a directory of search-space files.
SPACES_ENV = "CSWAP_SEARCH_SPACES"

_LAUNCH_FIELDS = {
    "cpu": tuple(f.name for f in fields(CpuLaunch)),
    "cuda": tuple(f.name for f in fields(CudaLaunch)),
}
#: Codecs with tunable kernels, as registered in ``cswap.codecs.CODECS`` (named here, not imported:
#: the tuning service loads this module without torch; a test keeps the two lists equal).
TUNED_CODECS: tuple[str, ...] = ("zvc", "bitpack", "exponent")
#: The launch fields each codec's kernels read, per backend; a search space or a stored config
#: naming another field is refused. ZVC reads them all. Bit-packing has no chunks (its CPU kernel
#: splits the words itself) and two CUDA kernels; exponent coding launches ``compress`` (the plan
#: of each chunk), ``scatter`` (the writes) and ``decompress``.
CODEC_LAUNCH_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "zvc": _LAUNCH_FIELDS,
    "bitpack": {
        "cpu": ("threads",),
        "cuda": ("compress_grid", "compress_block", "decompress_grid", "decompress_block"),
    },
    "exponent": {
        "cpu": ("threads", "chunk_words"),
        "cuda": ("compress_grid", "compress_block", "scatter_grid", "scatter_block", "decompress_grid",
                 "decompress_block", "chunk_words"),
    },
}
# Hard limits of a launch parameter, whatever a file says: the CUDA hardware and API limits
# (a block holds at most 1024 threads; 65535 keeps a grid valid on every axis and GPU).
_MAX_BLOCK, _MIN_BLOCK, _MAX_GRID = 1024, 32, 65535
Scale = Literal["linear", "log", "pow2"]


class SearchSpaceError(ValueError):
    """A search-space file is missing, unreadable or invalid; the message names the file and the fix."""


def _is_pow2(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


class _ParamModel(BaseModel):
    """One parameter as written in the YAML file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    low: int = Field(ge=1)
    high: int | Literal["cores"]
    scale: Scale = "linear"
    grid: list[int] | None = None


class _SpaceFile(BaseModel):
    """The whole YAML file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["cpu", "cuda"]
    codec: Literal["zvc", "bitpack", "exponent"] = "zvc"
    ops: dict[Literal["compress", "decompress"], dict[str, _ParamModel]]

    @model_validator(mode="after")
    def _known_params(self) -> _SpaceFile:
        valid = CODEC_LAUNCH_FIELDS[self.codec][self.backend]
        for op, params in self.ops.items():
            if not params:
                raise ValueError(f"ops.{op} lists no parameters")
            unknown = sorted(set(params) - set(valid))
            if unknown:
                whose = self.backend if self.codec == "zvc" else f"{self.codec} {self.backend}"
                raise ValueError(f"ops.{op} has unknown parameters {unknown}; {whose} launch parameters are {list(valid)}")
        return self


@dataclass(frozen=True)
class Param:
    """One launch parameter: inclusive integer bounds, a scale, and the values grid search visits.

    Args:
        name: the launch field (``threads``, ``compress_grid``, ...).
        low: smallest value.
        high: largest value.
        scale: ``linear`` (every integer), ``log`` (log-uniform; grid uses powers of two) or
            ``pow2`` (powers of two only).
        grid: the values grid search enumerates, ascending.

    Example:
        >>> Param("block", 32, 1024, "pow2", (32, 64)).project(100)
        128
    """

    name: str
    low: int
    high: int
    scale: Scale
    grid: tuple[int, ...]

    @property
    def constant(self) -> bool:
        """Whether the parameter has a single value (it is then not a search dimension)."""
        return self.low == self.high

    def project(self, value: float) -> int:
        """The valid value nearest to ``value`` (in log distance for ``pow2``), within the bounds."""
        value = min(max(float(value), self.low), self.high)
        if self.scale == "pow2":
            return 1 << round(math.log2(value))
        return int(round(value))

    def contains(self, value: int) -> bool:
        """Whether ``value`` is a valid value of this parameter."""
        in_range = self.low <= value <= self.high
        return in_range and (self.scale != "pow2" or _is_pow2(value))

    def dimension(self) -> Any:
        """The scikit-optimize dimension: an ``Integer``, over the log2 exponent for ``pow2``."""
        from skopt.space import Integer

        if self.scale == "pow2":
            return Integer(int(math.log2(self.low)), int(math.log2(self.high)), name=f"log2_{self.name}")
        prior = "log-uniform" if self.scale == "log" else "uniform"
        return Integer(self.low, self.high, prior=prior, name=self.name)

    def to_point(self, value: int) -> int:
        """The coordinate of ``value`` on :meth:`dimension`."""
        return int(math.log2(value)) if self.scale == "pow2" else int(value)

    def from_point(self, coordinate: int) -> int:
        """Inverse of :meth:`to_point`."""
        return 1 << int(coordinate) if self.scale == "pow2" else int(coordinate)


@dataclass(frozen=True)
class SearchSpace:
    """The launch parameters of one kernel (``<codec>.<backend>.<op>``) and their ranges.

    Args:
        backend: ``cpu`` or ``cuda``.
        op: ``compress`` or ``decompress``.
        params: the parameters, in file order.
        source: the file it was loaded from (``None`` when built in code).
        codec: the codec whose kernel it is (``zvc``, ``bitpack`` or ``exponent``).

    Example:
        >>> space = SearchSpace("cpu", "compress", (Param("threads", 1, 2, "linear", (1, 2)),))
        >>> list(space.grid_points())
        [{'threads': 1}, {'threads': 2}]
    """

    backend: str
    op: str
    params: tuple[Param, ...]
    source: Path | None = None
    codec: str = "zvc"

    @property
    def kernel(self) -> str:
        """The kernel's name, ``<codec>.<backend>.<op>``."""
        return f"{self.codec}.{self.backend}.{self.op}"

    @property
    def names(self) -> tuple[str, ...]:
        """Parameter names, in order."""
        return tuple(p.name for p in self.params)

    @property
    def grid_size(self) -> int:
        """How many configs grid search evaluates."""
        return math.prod(len(p.grid) for p in self.params)

    def grid_points(self) -> Iterator[dict[str, int]]:
        """Every config of the discretized space, in a fixed order (last parameter fastest)."""
        for values in itertools.product(*(p.grid for p in self.params)):
            yield dict(zip(self.names, values))

    def project(self, params: Mapping[str, Any]) -> dict[str, int]:
        """The nearest config of this space to ``params``: missing keys take the low bound, extra keys drop.

        Used for configs from elsewhere (another device, an older store) before they are used here.
        """
        return {p.name: p.project(params.get(p.name, p.low)) for p in self.params}

    def contains(self, params: Mapping[str, Any]) -> bool:
        """Whether ``params`` names exactly this space's parameters, each with a valid value."""
        return set(params) == set(self.names) and all(p.contains(int(params[p.name])) for p in self.params)

    def dimensions(self) -> list[Any]:
        """scikit-optimize dimensions of the non-constant parameters."""
        return [p.dimension() for p in self.params if not p.constant]

    def to_point(self, params: Mapping[str, Any]) -> list[int]:
        """Coordinates of ``params`` (projected first) on :meth:`dimensions`."""
        projected = self.project(params)
        return [p.to_point(projected[p.name]) for p in self.params if not p.constant]

    def from_point(self, point: list[Any]) -> dict[str, int]:
        """The config at coordinates ``point`` of :meth:`dimensions`."""
        coordinates = iter(point)
        return {p.name: p.low if p.constant else p.from_point(next(coordinates)) for p in self.params}

    def key(self, params: Mapping[str, Any]) -> tuple[int, ...]:
        """A hashable identity of a config of this space."""
        return tuple(int(params[name]) for name in self.names)


def search_space_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The directory the search-space files are read from (see the module docstring for the order)."""
    if path is not None:
        return Path(path)
    env = os.environ.get(SPACES_ENV)
    if env:
        return Path(env)
    return shipped_configs_dir() / "search_spaces"


def check_codec(codec: str) -> str:
    """``codec`` if it has tunable kernels; ``ValueError`` naming the choices otherwise.

    Example:
        >>> check_codec("lz4")
        Traceback (most recent call last):
        ...
        ValueError: no tunable kernels for codec 'lz4': choose one of zvc, bitpack, exponent
    """
    if codec not in TUNED_CODECS:
        raise ValueError(f"no tunable kernels for codec {codec!r}: choose one of {', '.join(TUNED_CODECS)}")
    return codec


def parse_codecs(text: str) -> list[str]:
    """The codecs a ``--codec`` option names: one, a comma-separated list, or ``all`` (every tunable codec).

    Example:
        >>> parse_codecs("all"), parse_codecs("exponent, zvc")
        (['zvc', 'bitpack', 'exponent'], ['exponent', 'zvc'])
    """
    names = [part.strip() for part in text.split(",") if part.strip()]
    if names == ["all"]:
        return list(TUNED_CODECS)
    if not names:
        raise ValueError(f"--codec is empty: name one of {', '.join(TUNED_CODECS)}, a comma-separated list, or all")
    return list(dict.fromkeys(check_codec(name) for name in names))


def space_file_name(backend: str, codec: str = "zvc") -> str:
    """The file name of a codec backend's search space: ``<backend>.yaml`` for ZVC, else ``<codec>-<backend>.yaml``.

    Example:
        >>> space_file_name("cpu"), space_file_name("cuda", "exponent")
        ('cpu.yaml', 'exponent-cuda.yaml')
    """
    return f"{backend}.yaml" if codec == "zvc" else f"{codec}-{backend}.yaml"


def _space_file(backend: str, path: str | os.PathLike[str] | None, codec: str = "zvc") -> Path:
    if backend not in BACKENDS:
        raise ValueError(f"no launch search space for backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    check_codec(codec)
    location = search_space_dir(path)
    name = space_file_name(backend, codec)
    file = location / name if location.is_dir() else location
    if not file.is_file():
        raise SearchSpaceError(
            f"search-space file {file} does not exist: pass an existing file or directory, "
            f"or set ${SPACES_ENV} to a directory holding {name}"
        )
    return file


def _grid_values(name: str, model: _ParamModel, low: int, high: int, file: Path, op: str) -> tuple[int, ...]:
    where = f"{file}: ops.{op}.{name}"
    if model.grid is not None:
        if not model.grid:
            raise SearchSpaceError(f"{where}: grid is empty; list at least one value or remove it")
        bad = [v for v in model.grid if not low <= v <= high or (model.scale == "pow2" and not _is_pow2(v))]
        if bad:
            kind = "powers of two " if model.scale == "pow2" else ""
            raise SearchSpaceError(f"{where}: grid values {bad} are not {kind}within [{low}, {high}]; fix the list")
        return tuple(sorted(set(model.grid)))
    if model.scale == "linear":
        return tuple(range(low, high + 1))
    powers = {1 << e for e in range(int(math.log2(high)) + 1) if low <= 1 << e <= high}
    return tuple(sorted(powers | {low, high}))


def _param(name: str, model: _ParamModel, backend: str, op: str, file: Path, cores: int) -> Param:
    where = f"{file}: ops.{op}.{name}"
    if model.high == "cores":
        if name != "threads":
            raise SearchSpaceError(f"{where}: high 'cores' is only meaningful for threads; give a number")
        high = cores
    else:
        high = min(model.high, cores) if name == "threads" else model.high
    low = model.low
    if low > high:
        raise SearchSpaceError(f"{where}: low {low} is above high {high}; swap or fix the bounds")
    if model.scale == "pow2" and not (_is_pow2(low) and _is_pow2(high)):
        raise SearchSpaceError(f"{where}: scale pow2 needs powers of two as bounds, got low {low}, high {high}")
    if backend == "cuda" and name.endswith("_block") and not _MIN_BLOCK <= low <= high <= _MAX_BLOCK:
        raise SearchSpaceError(f"{where}: a CUDA block must be within [{_MIN_BLOCK}, {_MAX_BLOCK}], got [{low}, {high}]")
    if backend == "cuda" and name.endswith("_block") and model.scale != "pow2":
        raise SearchSpaceError(f"{where}: CUDA blocks are searched as powers of two; set scale: pow2")
    if backend == "cuda" and name.endswith("_grid") and high > _MAX_GRID:
        raise SearchSpaceError(f"{where}: a CUDA grid must be within [1, {_MAX_GRID}], got high {high}")
    return Param(name, low, high, model.scale, _grid_values(name, model, low, high, file, op))


def _read_yaml(file: Path) -> Any:
    try:
        return yaml.safe_load(file.read_text())
    except OSError as error:
        raise SearchSpaceError(f"cannot read search-space file {file}: {error}") from error
    except yaml.YAMLError as error:
        raise SearchSpaceError(f"search-space file {file} is not valid YAML: {error}; fix the syntax") from error


def load_search_spaces(
    backend: str, path: str | os.PathLike[str] | None = None, cores: int | None = None, codec: str = "zvc"
) -> dict[str, SearchSpace]:
    """All search spaces of ``codec``'s ``backend``, one per op listed in its file.

    Args:
        backend: ``cpu`` or ``cuda``.
        path: a YAML file, or a directory holding :func:`space_file_name`; ``None`` for the default.
        cores: the value of ``high: cores`` (default: this machine's core count).
        codec: ``zvc`` (default), ``bitpack`` or ``exponent``; a file says its codec with
            ``codec:`` (omitted: ``zvc``), which must be the one asked for.

    Raises:
        ValueError: for an unknown backend.
        SearchSpaceError: the file is missing, not YAML, or invalid; the message names it.

    Example:
        >>> sorted(load_search_spaces("cuda"))
        ['compress', 'decompress']
    """
    file = _space_file(backend, path, codec)
    raw = _read_yaml(file)
    if not isinstance(raw, dict):
        raise SearchSpaceError(f"search-space file {file} must be a mapping with keys 'backend' and 'ops'")
    try:
        parsed = _SpaceFile.model_validate(raw)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or '<file>'}: {e['msg']}" for e in error.errors()
        )
        raise SearchSpaceError(f"invalid search-space file {file}: {problems}") from error
    if parsed.backend != backend:
        raise SearchSpaceError(f"search-space file {file} is for backend {parsed.backend!r}, expected {backend!r}")
    if parsed.codec != codec:
        raise SearchSpaceError(
            f"search-space file {file} is for codec {parsed.codec!r}, expected {codec!r}; "
            f"pass the {space_file_name(backend, codec)} file or its directory"
        )
    cores = cores or os.cpu_count() or 1
    return {
        op: SearchSpace(
            backend, op, tuple(_param(name, m, backend, op, file, cores) for name, m in params.items()), file, codec
        )
        for op, params in parsed.ops.items()
    }


def load_search_space(
    backend: str, op: str, path: str | os.PathLike[str] | None = None, cores: int | None = None, codec: str = "zvc"
) -> SearchSpace:
    """The search space of kernel ``<codec>.<backend>.<op>`` (see :func:`load_search_spaces`).

    Example:
        >>> load_search_space("cuda", "decompress").names
        ('decompress_grid', 'decompress_block')
        >>> load_search_space("cuda", "compress", codec="exponent").names[-1]
        'chunk_words'
    """
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}: choose one of {', '.join(OPS)}")
    spaces = load_search_spaces(backend, path, cores, codec)
    if op not in spaces:
        raise SearchSpaceError(f"search-space file {_space_file(backend, path, codec)} has no ops.{op}; add it")
    return spaces[op]


def check_launch_params(kernel: str, params: Mapping[str, Any], cores: int | None = None) -> None:
    """Refuse ``params`` unless they are a launch config of ``kernel`` (``<codec>.<backend>.<op>``)
    that its search space allows: every name a launch field the codec's backend reads, every
    searched parameter in its range (powers of two where the space says so), the others valid for
    the launch itself.

    A config that passes can be launched on the kind of device it was tuned for, which is what a
    store shared between machines must hold.

    Args:
        kernel: the tuned kernel, e.g. ``"zvc.cuda.compress"``.
        params: the launch config, by name; a subset of the launch fields (the rest keep their defaults).
        cores: the tuned CPU's cores, for a space's ``high: cores`` (``None``: this machine's).

    Raises:
        ValueError: naming the kernel or the parameter, and what the space allows.

    Example:
        >>> check_launch_params("zvc.cuda.compress", {"compress_grid": 264, "compress_block": 256})
        >>> check_launch_params("zvc.cuda.compress", {"compress_block": 100})
        Traceback (most recent call last):
        ...
        ValueError: best_params['compress_block'] is 100: zvc.cuda.compress allows powers of two between 32 and 1024
    """
    parts = kernel.split(".")
    if len(parts) != 3 or parts[0] not in TUNED_CODECS or parts[1] not in BACKENDS or parts[2] not in OPS:
        known = ", ".join(f"{c}.{b}.{op}" for c in TUNED_CODECS for b in BACKENDS for op in OPS)
        raise ValueError(f"kernel {kernel!r} has no launch search space: choose one of {known}")
    codec, backend, op = parts
    valid = CODEC_LAUNCH_FIELDS[codec][backend]
    unknown = sorted(set(params) - set(valid))
    if unknown:
        whose = backend if codec == "zvc" else f"{codec} {backend}"
        raise ValueError(f"best_params {unknown} are not {whose} launch parameters: they are {list(valid)}")
    space = load_search_space(backend, op, cores=cores, codec=codec)
    for param in space.params:
        if param.name not in params:
            continue
        value = params[param.name]
        if isinstance(value, bool) or not isinstance(value, int) or not param.contains(value):
            allowed = "powers of two" if param.scale == "pow2" else "integers"
            raise ValueError(f"best_params[{param.name!r}] is {value!r}: {kernel} allows {allowed} between {param.low} and {param.high}")
    # The launch's own limits for the fields the space does not search; threads were checked against
    # the tuned machine's cores above, not this one's.
    launch_from_params(backend, {k: v for k, v in params.items() if k not in space.names and k != "threads"})
