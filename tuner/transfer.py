"""Configs across devices: which stored device's config a device without one should use, scaled how.

A config tuned on one device helps another in two ways: a device of the same model (name,
compute capability, SM count) runs kernels the same way, so its config is used as is; the nearest
device of the same kind (by SM count, then memory) gives a starting point with every ``*_grid``
parameter scaled by the SM ratio, plus warm starts for a Bayesian search. The store runs the
queries and hands the rows to these functions.

Example:
    >>> scale_grid_params({"compress_grid": 264, "compress_block": 256}, 0.5)
    {'compress_grid': 132, 'compress_block': 256}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from cswap.tuner.records import LookupResult
from cswap.tuner.validation import dumps

__all__ = ["WARM_START_MAX", "Candidate", "nearest_of_kind", "same_model", "scale_grid_params", "transferred"]

_GRID_MIN, _GRID_MAX = 1, 65535
#: Most warm-start configs handed to a search.
WARM_START_MAX = 8


class Candidate(NamedTuple):
    """A best config stored for another device, with that device's identity."""

    device_key: str
    params: dict[str, int]
    time_s: float
    kind: str
    name: str
    compute_capability: str
    sm_count: int
    memory_bytes: int


def scale_grid_params(params: Mapping[str, int], sm_ratio: float) -> dict[str, int]:
    """Scale every ``*_grid`` parameter by ``sm_ratio``, rounded and clamped to 1..65535.

    Grids are sized to fill the device, so a config tuned on a GPU with ``S`` SMs transfers to one
    with ``S'`` SMs by ``grid * S' / S``; block sizes and everything else are kept.

    Example:
        >>> scale_grid_params({"compress_grid": 264, "compress_block": 256}, 0.5)
        {'compress_grid': 132, 'compress_block': 256}
    """
    return {
        name: min(max(round(value * sm_ratio), _GRID_MIN), _GRID_MAX) if name.endswith("_grid") else value
        for name, value in params.items()
    }


def same_model(
    candidates: Iterable[Candidate], kind: str | None, name: str, compute_capability: str, sm_count: int
) -> LookupResult | None:
    """The fastest config of a device of the same model, or ``None``.

    Example:
        >>> c = Candidate("k1", {"compress_grid": 8}, 1e-3, "cuda", "L4", "8.9", 58, 0)
        >>> same_model([c], "cuda", "L4", "8.9", 58).match
        'same-model'
    """
    matching = [
        c for c in candidates
        if (c.name, c.compute_capability, c.sm_count) == (name, compute_capability, sm_count)
        and (kind is None or c.kind == kind)
    ]
    if not matching:
        return None
    source = min(matching, key=lambda c: (c.time_s, c.device_key))
    return LookupResult(dict(source.params), source.time_s, "same-model", source.device_key)


def nearest_of_kind(
    candidates: Iterable[Candidate], kind: str, sm_count: int, memory_bytes: int | None
) -> list[Candidate]:
    """Devices of ``kind``, nearest first: by SM count, then memory, then time.

    Example:
        >>> far = Candidate("a", {}, 1.0, "cuda", "A", "8.0", 108, 0)
        >>> near = Candidate("b", {}, 1.0, "cuda", "B", "8.9", 58, 0)
        >>> [c.device_key for c in nearest_of_kind([far, near], "cuda", 60, None)]
        ['b', 'a']
    """
    return sorted(
        (c for c in candidates if c.kind == kind),
        key=lambda c: (abs(c.sm_count - sm_count), abs(c.memory_bytes - (memory_bytes or c.memory_bytes)),
                       c.time_s, c.device_key),
    )


def transferred(ranked: Sequence[Candidate], sm_count: int, evaluated: Iterable[Mapping[str, int]]) -> LookupResult:
    """The nearest device's best, scaled to ``sm_count``; warm starts: the others' bests, then ``evaluated``.

    Args:
        ranked: :func:`nearest_of_kind`'s answer (not empty).
        sm_count: SMs of the device asking.
        evaluated: the nearest device's evaluated configs for this kernel, fastest first.

    Example:
        >>> near = Candidate("b", {"compress_grid": 116}, 1e-3, "cuda", "L4", "8.9", 58, 0)
        >>> transferred([near], 29, []).params
        {'compress_grid': 58}
    """
    nearest = ranked[0]
    params = scale_grid_params(nearest.params, sm_count / nearest.sm_count)
    seeds: list[dict[str, int]] = [params]
    seeds.extend(scale_grid_params(c.params, sm_count / c.sm_count) for c in ranked[1:])
    seeds.extend(scale_grid_params(p, sm_count / nearest.sm_count) for p in evaluated)
    unique: dict[str, dict[str, int]] = {}
    for seed in seeds:
        unique.setdefault(dumps(seed), seed)
    warm = tuple(list(unique.values())[:WARM_START_MAX])
    return LookupResult(params, nearest.time_s, "transferred", nearest.device_key, warm)
