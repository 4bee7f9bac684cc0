"""What makes a module call unsafe to run a second time, as a recomputation in backward does.

Torch's checkpoint replays a module's forward from the inputs it held: tensors it saved and
version-checks, everything else by reference. A call is unsafe to replay when an input it holds by
reference can change before backward (a list the caller appends to, a key/value cache), and a
module is out of reach when it runs inside a ``torch.compile`` graph. :mod:`cswap.profile.regions`
marks such regions ineligible with these facts. A call that draws from Python's or NumPy's global
random generator (the SpecAugment masks of Wav2Vec2, HuBERT and WavLM come from ``np.random``)
replays as it ran only with their states put back (:class:`HostRandomState`): torch's checkpoint
restores torch's generators alone. So does a module that keeps a tensor in a plain attribute from
one call to the next (RecurrentGemma's recurrence keeps its last state there, and starts from it),
or updates a buffer in its forward (a spectral norm's power iteration): replayed with the state as
the forward left it, the recomputation saves other tensors, or other values, than the forward did
(:class:`ModuleState` puts them back).

Example:
    >>> import torch
    >>> mutable_kind([torch.zeros(1)]), compiled_paths(torch.nn.Linear(2, 2))
    ('list', ())
"""

from __future__ import annotations

import enum
import functools
import random
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.modules import module as module_impl

__all__ = ["HostRandomState", "ModuleState", "compiled_paths", "foreign_hooks", "global_foreign_hooks", "mutable_kind"]

# A tensor is the checkpoint's own business (saved, version-checked); these others cannot change.
_IMMUTABLE = (torch.Tensor, type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, torch.layout,
              torch.memory_format, enum.Enum, slice, type(Ellipsis), type, nn.Module, types.FunctionType,
              types.BuiltinFunctionType, types.MethodType, functools.partial)


def mutable_kind(value: Any) -> str | None:
    """The type name of ``value`` when it is a mutable object other than a tensor, else ``None``:
    a tuple is looked into, a list, a dict or any other object is mutable.

    A module recomputed in backward reads its non-tensor inputs again as they are then; a mutable
    one may have changed since the forward (torch's checkpoint holds it by reference).

    >>> mutable_kind((torch.zeros(1), None, 3)), mutable_kind([torch.zeros(1)]), mutable_kind({"k": 1})
    (None, 'list', 'dict')
    """
    if isinstance(value, _IMMUTABLE):
        return None
    if isinstance(value, tuple | frozenset):
        return next((kind for item in value if (kind := mutable_kind(item)) is not None), None)
    return type(value).__name__


def compiled_paths(model: nn.Module) -> tuple[str, ...]:
    """The paths whose module (and everything under it) runs as a ``torch.compile`` graph: what
    ``torch.compile(module)`` wraps (its ``_orig_mod``) and a module compiled in place (``module.compile()``).

    >>> compiled_paths(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    ()
    """
    found = []
    for path, module in model.named_modules():
        if type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod"):
            found.append(f"{path}._orig_mod" if path else "_orig_mod")
        elif getattr(module, "_compiled_call_impl", None) is not None:
            found.append(path)
    return tuple(found)


def _hook_name(hook: Any) -> tuple[str, str]:
    function = hook.func if isinstance(hook, functools.partial) else hook
    return getattr(function, "__module__", None) or "", getattr(function, "__qualname__", None) or type(function).__name__


def foreign_hooks(module: nn.Module) -> list[str]:
    """The forward hooks and pre-hooks on ``module`` that are neither torch's nor cswap's (a user's
    hook that collects features or statistics), as ``"module.qualname"``. A recomputation runs the
    module's call again, hooks and all, so such a hook would run a second time in backward; torch's
    own (FSDP's unsharding, a quantization observer, checkpoint's) are meant to, and the buffers
    they update are put back (:class:`ModuleState`).

    >>> layer = torch.nn.Linear(2, 2)
    >>> handle = layer.register_forward_hook(print)
    >>> foreign_hooks(layer)
    ['builtins.print']
    """
    return _foreign((*module._forward_pre_hooks.values(), *module._forward_hooks.values()))


def global_foreign_hooks() -> list[str]:
    """The forward hooks and pre-hooks registered for every module
    (``torch.nn.modules.module.register_module_forward_hook`` and ``..._pre_hook``) that are
    neither torch's nor cswap's, as :func:`foreign_hooks` names them: such a hook runs again for
    every module a recomputation calls.

    >>> from torch.nn.modules.module import register_module_forward_hook
    >>> handle = register_module_forward_hook(print)
    >>> global_foreign_hooks()
    ['builtins.print']
    >>> handle.remove(); global_foreign_hooks()
    []
    """
    return _foreign((*module_impl._global_forward_pre_hooks.values(), *module_impl._global_forward_hooks.values()))


def _foreign(hooks: Iterable[Any]) -> list[str]:
    found = []
    for hook in hooks:
        where, name = _hook_name(hook)
        if not where.startswith(("torch.", "cswap.")):
            found.append(f"{where}.{name}" if where else name)
    return found


@dataclass(frozen=True, eq=False)
class HostRandomState:
    """The states of Python's and NumPy's global random generators, which torch's checkpoint does not stash.

    Attributes:
        python: ``random.getstate()``.
        numpy: ``np.random.get_state()``.

    >>> before = HostRandomState.now()
    >>> first = np.random.rand()
    >>> before.same_as(HostRandomState.now())
    False
    >>> before.restore(); np.random.rand() == first and before.same_as(before)
    True
    """

    python: tuple[Any, ...]
    numpy: tuple[Any, ...]

    @classmethod
    def now(cls) -> HostRandomState:
        """The states as they stand."""
        return cls(random.getstate(), np.random.get_state())

    def same_as(self, other: HostRandomState) -> bool:
        """Whether nothing was drawn between ``self`` and ``other``."""
        # NumPy's legacy state: (name, key array, position, has_gauss, cached_gaussian)
        mine, theirs = self.numpy, other.numpy
        return mine[2:] == theirs[2:] and self.python == other.python and bool(np.array_equal(mine[1], theirs[1]))

    def restore(self) -> None:
        """Set both generators back to these states."""
        random.setstate(self.python)
        np.random.set_state(self.numpy)


def _tensor_attributes(module: nn.Module) -> dict[str, torch.Tensor | None]:
    # Parameters, buffers and submodules live in their own dicts: what is left in __dict__ that is a
    # tensor (or None, which a forward may set to a tensor) is state the module's code keeps itself.
    return {name: value for name, value in vars(module).items() if value is None or isinstance(value, torch.Tensor)}


def _updated_buffers(module: nn.Module) -> dict[str, torch.Tensor]:
    # Running statistics are put back by the regions themselves (their output in training does not
    # read them); any other buffer a forward updates is state its recomputation must start from.
    if isinstance(module, nn.modules.batchnorm._NormBase):
        return {}
    return {name: b for name, b in module._buffers.items() if b is not None}


@dataclass(frozen=True, eq=False)
class ModuleState:
    """What modules' forwards may change for their next call besides parameters: the tensors they
    hold in plain attributes, and their buffers (a spectral norm's power-iteration vectors, updated
    in place each call; running statistics excepted), which torch's checkpoint does not put back for
    a recomputation.

    Attributes:
        held: per module, its attributes that held a tensor or ``None``, by name (the objects
            themselves: a recomputation must see the very tensors the forward saw).
        buffers: per module buffer, ``(module, name, the buffer, its version, a copy of its values)``
            (no copy, ``None``, in a state taken only to see what changes: :meth:`changed`).

    >>> class Running(torch.nn.Module):
    ...     def __init__(self): super().__init__(); self.last = None
    ...     def forward(self, x): y = x if self.last is None else x + self.last; self.last = y; return y
    >>> module = Running(); before = ModuleState.now([module])
    >>> y = module(torch.ones(2)); before.changed() == [module]
    True
    >>> after = ModuleState.now(before.modules); before.restore(); module.last is None
    True
    >>> after.restore(); module.last is y, after.changed()
    (True, [])
    """

    held: tuple[tuple[nn.Module, Mapping[str, torch.Tensor | None]], ...]
    buffers: tuple[tuple[nn.Module, str, torch.Tensor, int, torch.Tensor | None], ...] = ()

    @classmethod
    def now(cls, modules: Iterable[nn.Module], copies: bool = True) -> ModuleState:
        """The attributes and buffers of ``modules`` as they stand, the buffers' values copied
        (``copies=False``: not, for a state only compared with a later one, never restored)."""
        modules = list(modules)
        with torch.no_grad():
            buffers = tuple((m, name, b, b._version, b.detach().clone() if copies else None)
                            for m in modules for name, b in _updated_buffers(m).items())
        return cls(tuple((module, _tensor_attributes(module)) for module in modules), buffers)

    def changed(self) -> list[nn.Module]:
        """The modules whose tensor attributes are not these objects any more (set, replaced or
        removed), or whose buffers were replaced or updated in place."""
        found = []
        for module, held in self.held:
            now = _tensor_attributes(module)
            names = {n for n, v in held.items() if v is not None} | {n for n, v in now.items() if v is not None}
            if any(now.get(name) is not held.get(name) for name in names):
                found.append(module)
        for module, name, buffer, version, _ in self.buffers:
            current = module._buffers.get(name)
            if module not in found and (current is not buffer or buffer._version != version):
                found.append(module)
        return found

    @property
    def modules(self) -> tuple[nn.Module, ...]:
        """The modules whose state this is."""
        return tuple(module for module, _ in self.held)

    def restore(self) -> None:
        """Set the attributes back to these objects (a tensor attribute set since is removed) and the
        buffers to these objects and values."""
        for module, held in self.held:
            attributes = vars(module)
            for name in [n for n, v in attributes.items() if isinstance(v, torch.Tensor) and n not in held]:
                del attributes[name]
            attributes.update(held)
        with torch.no_grad():
            for module, name, buffer, _, values in self.buffers:
                if values is None:
                    raise ValueError("this state was taken without copies of the buffers (copies=False): it cannot be restored")
                module._buffers[name] = buffer
                buffer.copy_(values)
