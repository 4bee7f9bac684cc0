"""What a model's repeated layers do in a profile that runs with them recomputed.

Policy ``ac-full`` without a memory budget has a plan fixed by the model's structure: every
repeated layer (:func:`cswap.profile.regions.repeated_layers`) that can be recomputed, the rest
kept. So its profiling iteration runs that plan instead of holding every tensor as plain PyTorch
does: the runtime enables the layers, checks each call before it runs
(:meth:`cswap.execute.recompute.RecomputeRegions.guard`), and a :class:`LayersProfile` records which
layers were recomputed and what each recomputation saved; the plan is made from it
(:func:`cswap.planner.regions.fixed_layers_plan`).

Example:
    >>> import torch
    >>> from torch import nn
    >>> block = lambda: nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    >>> model = nn.Sequential(nn.Linear(2, 4), block(), block(), nn.Linear(4, 1))
    >>> seen = LayersProfile.candidates(model, {"2": "its forward calls itself"})
    >>> seen.enabled, seen.refused
    (('1',), {'2': 'its forward calls itself'})
    >>> recorder = seen.recorder(listener=type("Counting", (), {"rebuilt": lambda self, t: None})(), protected=set())
    >>> rebuilt = torch.zeros(2, 4)
    >>> recorder.rebuilt_in("1", rebuilt); recorder.rebuilt_in("1", rebuilt[0])  # a view: its storage counted once
    >>> seen.recomputed = ("1",)
    >>> seen.layers(), seen.tensors(), seen.nbytes()
    (('1', '2'), 2, 32)
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, Mapping
from typing import Any

import torch
from torch import nn

from cswap.profile.regions import repeated_layers
from cswap.profile.rerun import compiled_paths

__all__ = ["LayersProfile"]


class LayersProfile:
    """What the repeated layers did in a profile that ran with them enabled.

    Attributes:
        enabled: the layers enabled for the profile (repeated, not refused before, not inside a
            ``torch.compile`` graph).
        candidates_of: the model's repeated layers outside compiled graphs, in module order.
        refused: the layers that cannot be recomputed, and why (those refused before included);
            the runtime adds those its guard refused.
        compiled: the model's ``torch.compile`` graphs (:func:`cswap.profile.rerun.compiled_paths`).
        recomputed: the layers recomputed in the profile's backward (set by the runtime).
        rebuilt: per layer, what its recomputations saved: shape, dtype and new bytes each (a
            storage counted once per layer; parameters and buffers not at all).
        peak_bytes: the profile's measured peak of resident bytes (set by the runtime).
    """

    def __init__(self, enabled: tuple[str, ...], candidates_of: tuple[str, ...], refused: dict[str, str],
                 compiled: tuple[str, ...]) -> None:
        self.enabled = enabled
        self.candidates_of = candidates_of
        self.refused = refused
        self.compiled = compiled
        self.recomputed: tuple[str, ...] = ()
        self.rebuilt: dict[str, list[tuple[tuple[int, ...], str, int]]] = {}
        self.peak_bytes = 0
        # per layer, the storages recorded, while they live (a dead one's address may be taken again)
        self._storages: dict[str, dict[int, weakref.ref[Any]]] = {}

    @classmethod
    def candidates(cls, model: nn.Module, ineligible: Mapping[str, str]) -> LayersProfile:
        """The layers of ``model`` to enable for a profile: its repeated layers, but those inside a
        compiled graph (never layers: they run in the compiled code) and those ``ineligible`` (path
        -> why: refused before)."""
        compiled = compiled_paths(model)
        layers = tuple(p for p in repeated_layers(model) if not any(p == c or p.startswith(f"{c}.") for c in compiled))
        refused = {p: ineligible[p] for p in layers if p in ineligible}
        return cls(tuple(p for p in layers if p not in refused), layers, refused, compiled)

    def layers(self) -> tuple[str, ...]:
        """The repeated layers that ran with grad and saved tensors (those recomputed), and those that
        cannot be recomputed, in module order."""
        return tuple(p for p in self.candidates_of if p in self.recomputed or p in self.refused)

    def recorder(self, listener: Any, protected: Collection[int]) -> Any:
        """A recompute listener (:class:`cswap.execute.recompute.RecomputeListener`) that tells
        ``listener`` of each rebuilt tensor and records it by layer; storages in ``protected``
        (parameters and buffers) are told, not recorded."""
        seen = self

        class _Recorder:
            def rebuilt(self, tensor: torch.Tensor) -> None:
                listener.rebuilt(tensor)

            def rebuilt_in(self, path: str, tensor: torch.Tensor) -> None:
                listener.rebuilt(tensor)
                storage = tensor.untyped_storage()
                if storage._cdata in protected:
                    return
                mine = seen._storages.setdefault(path, {})
                known = mine.get(storage._cdata)
                nbytes = 0 if known is not None and known() is not None else storage.nbytes()
                mine[storage._cdata] = weakref.ref(storage)
                seen.rebuilt.setdefault(path, []).append((tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."), nbytes))

        return _Recorder()

    def tensors(self) -> int:
        """Tensors the layers' recomputations saved."""
        return sum(len(saved) for saved in self.rebuilt.values())

    def nbytes(self) -> int:
        """Their new bytes (a storage counted once per layer)."""
        return sum(nbytes for saved in self.rebuilt.values() for _, _, nbytes in saved)
