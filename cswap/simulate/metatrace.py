"""Traces without compute: a model's saved tensors and layer times from the ``meta`` device.

:func:`meta_trace` builds the model on the ``meta`` device (shapes, no storage), runs one forward
and backward under ``saved_tensors_hooks`` and a ``TorchDispatchMode``, and records:

* every saved tensor in pack order (shape, dtype, bytes, the autograd node that saved it), once per
  view: a tensor saved by two nodes (a ReLU's output is also the next convolution's input) is one
  record, as the runtime stores it once, and another view of a saved storage (Phi-3's gate and up
  halves of one projection) is a record of its own whose ``view_of`` names the first, with the
  storage's bytes as ``storage_nbytes`` where a slice is smaller than them, as the runtime's
  profiler records them; parameters are recorded as not offloadable;
* when each was packed and first unpacked, on a clock that advances by the roofline time of every
  operator (:meth:`HardwareProfile.op_s`: FLOPs from ``torch.utils.flop_counter``'s formulas
  against the profile's effective TFLOP/s, bytes read and written against its effective memory
  bandwidth, plus a fixed cost per operator; views are free). The backward runs on ``meta`` too,
  so the unpack order is the one autograd really uses;
* the sparsity each tensor would have, from a :class:`SparsityModel` (ReLU outputs ``relu``,
  pooling and concatenation propagate it), or from a profiled trace of the same model;
* the module that saved each tensor (``module``: ``"features.3 (ReLU)"``, the innermost module
  running at its first pack), and whether it holds attention probabilities: a softmax output, or
  what a cast, dropout (output and mask) or copy makes of one, element for element.

:func:`run_on_meta` is the part that runs any module with any loss; :func:`meta_trace` feeds it an
image batch, :func:`cswap.simulate.lmtrace.transformer_trace` token ids.

Example:
    >>> trace = meta_trace("alexnet", batch_size=2, resolution=64, hardware="v100-pcie3", width_mult=0.25)
    >>> trace.meta["source"], trace.tensors[0].shape
    ('meta', (2, 3, 64, 64))
    >>> trace.forward_s > 0 and trace.backward_s > trace.forward_s
    True
"""

from __future__ import annotations

import copy
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from cswap.profile.trace import Trace, TensorRecord
from cswap.simulate.compressibility import Compressibility
from cswap.simulate.hardware import HardwareProfile, load_hardware

__all__ = ["MetaRun", "ModuleCall", "SparsityModel", "meta_trace", "module_calls", "run_on_meta", "with_hidden_times"]

_aten = torch.ops.aten
_RELU_LIKE = (_aten.relu, _aten.threshold, _aten.relu6)
_POOLS = (_aten.max_pool2d_with_indices, _aten.avg_pool2d, _aten._adaptive_avg_pool2d, _aten.max_pool3d_with_indices)
_SOFTMAXES = (_aten._softmax, _aten._safe_softmax)
# Operators that carry attention probabilities on element for element (a cast, dropout and its
# mask, a scaling, a copy made by reshape), so that what they make of them is marked too.
_CARRIERS = (_aten.native_dropout, _aten._to_copy, _aten.clone, _aten.mul, _aten.div, _aten._unsafe_view, _aten.masked_fill)


@dataclass(frozen=True)
class SparsityModel:
    """The fraction of zeros each saved tensor is assumed to have.

    Args:
        relu: sparsity of a ReLU (or ReLU6) output. Trained CNNs range from about 0.4 in early
            layers to above 0.9 in late ones; freshly initialised ones sit near 0.5.
        pool_window_exponent: a pooling output is zero only where its window is, so its sparsity is
            ``s ** (window ** pool_window_exponent)`` for input sparsity ``s``; 0.25 is what max
            pooling of ReLU outputs of cswap's models gives on the digits images (measured 0.06-0.47
            over AlexNet, VGG-16, ResNet-50 and SqueezeNet; independent zeros would give 1).
        default: sparsity of every other output (convolutions, batch norm, additions: dense).
        by_producer: measured sparsities per producer name, in pack order (see :meth:`from_trace`);
            they take precedence over the estimates above.
        compressibility: what the codecs besides ZVC give each kind of tensor
            (:class:`cswap.simulate.compressibility.Compressibility`), or ``None``: ZVC alone.

    Example:
        >>> SparsityModel(relu=0.6).pooled(0.6, window=4) < 0.6
        True
    """

    relu: float = 0.5
    pool_window_exponent: float = 0.25
    default: float = 0.0
    by_producer: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    compressibility: Compressibility | None = None

    def __post_init__(self) -> None:
        for name in ("relu", "default"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"SparsityModel.{name} must be in [0, 1], got {value}")
        if self.pool_window_exponent < 0:
            raise ValueError(f"SparsityModel.pool_window_exponent must be >= 0, got {self.pool_window_exponent}")

    def pooled(self, sparsity: float, window: float) -> float:
        """Sparsity after pooling ``window`` inputs of sparsity ``sparsity`` into one output."""
        if window <= 1.0:
            return sparsity
        return sparsity ** (window**self.pool_window_exponent)

    @classmethod
    def from_trace(cls, trace: Trace, **estimates: float) -> SparsityModel:
        """Use the sparsities a profiled trace measured, matched by producer name and order.

        The ``i``-th meta record saved by producer ``P`` takes the ``i``-th measured sparsity of
        ``P``; records beyond what was measured fall back to the estimates (``relu`` etc.).

        Example:
            >>> rec = TensorRecord(key=0, shape=(4,), dtype="float32", nbytes=16, sparsity=0.75, producer="ReluBackward0")
            >>> SparsityModel.from_trace(Trace(tensors=(rec,))).by_producer["ReluBackward0"]
            (0.75,)
        """
        measured: dict[str, list[float]] = defaultdict(list)
        for record in trace.tensors:
            if record.offloadable:
                measured[record.producer].append(record.sparsity)
        return cls(by_producer={k: tuple(v) for k, v in measured.items()}, **estimates)


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _argument(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str, position: int) -> Any:
    """An operator's argument as given, or its schema default (dispatch drops arguments equal to it)."""
    if len(args) > position:
        return args[position]
    if name in kwargs:
        return kwargs[name]
    for argument in func._schema.arguments:
        if argument.name == name and argument.has_default_value():
            return argument.default_value
    return None


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


class _Clock(TorchDispatchMode):
    """Advances a clock by each operator's roofline time and tracks what produced each storage."""

    def __init__(self, hardware: HardwareProfile, sparsity: SparsityModel) -> None:
        super().__init__()
        self.hardware = hardware
        self.sparsity = sparsity
        self.clock_s = 0.0
        self.estimate: dict[int, float] = {}
        self.flops: dict[int, float] = {}
        # Storages holding attention probabilities, and float32 casts of bf16 or fp16 values (whose
        # low mantissa bits are zero); weak, so that a freed storage's reused address is not taken for one.
        self.probabilities: dict[int, StorageWeakRef] = {}
        self.upcasts: dict[int, StorageWeakRef] = {}

    def holds_upcast(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s storage holds float32 values cast up from a 16-bit float."""
        ref = self.upcasts.get(_storage_key(t))
        return ref is not None and not ref.expired()

    def _mark_upcasts(self, packet: Any, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        if packet in (_aten._to_copy, _aten.clone) and inputs and outputs and outputs[0].dtype == torch.float32:
            source = inputs[0]
            if source.dtype in (torch.bfloat16, torch.float16) or (source.dtype == torch.float32 and self.holds_upcast(source)):
                storage = outputs[0].untyped_storage()
                self.upcasts[storage._cdata] = StorageWeakRef(storage)

    def holds_probabilities(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s storage holds attention probabilities (module docstring)."""
        ref = self.probabilities.get(_storage_key(t))
        return ref is not None and not ref.expired()

    def _mark_probabilities(self, packet: Any, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        if not outputs:
            return
        if packet not in _SOFTMAXES:
            if packet not in _CARRIERS:
                return
            size = outputs[0].numel()
            if not any(t.numel() == size and self.holds_probabilities(t) for t in inputs):
                return
        for t in outputs:
            storage = t.untyped_storage()
            self.probabilities[storage._cdata] = StorageWeakRef(storage)

    def _input_sparsity(self, t: torch.Tensor) -> float:
        return self.estimate.get(_storage_key(t), self.sparsity.default)

    def _estimate(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> list[float]:
        packet = func.overloadpacket
        outputs = _tensors(out)
        model = self.sparsity
        if packet in (_aten.relu, _aten.relu6) or (packet is _aten.threshold and args[1] == 0):
            return [model.relu]
        if packet is _aten.hardtanh and len(args) > 1 and args[1] == 0:
            return [model.relu]
        if packet is _aten.clamp_min and len(args) > 1 and args[1] == 0:
            return [model.relu]
        if packet in _POOLS:
            source = args[0]
            pooled = model.pooled(self._input_sparsity(source), source.numel() / max(outputs[0].numel(), 1))
            return [pooled] + [model.default] * (len(outputs) - 1)
        if packet is _aten.cat:
            parts = [t for t in args[0] if isinstance(t, torch.Tensor)]
            total = sum(t.numel() for t in parts) or 1
            return [sum(self._input_sparsity(t) * t.numel() for t in parts) / total]
        if packet is _aten.native_dropout:
            p = float(args[1])
            kept = (1.0 - self._input_sparsity(args[0])) * (1.0 - p)
            return [1.0 - kept, p]
        if packet in (_aten.bernoulli, _aten.bernoulli_):
            p = _argument(func, args, kwargs, "p", position=1)
            if isinstance(p, float):
                return [1.0 - p]  # a dropout mask: ones with probability p
        if packet in (_aten.mul, _aten.mul_):
            factors = [a for a in args[:2] if isinstance(a, torch.Tensor)]
            dense = 1.0
            for factor in factors:
                dense *= 1.0 - self._input_sparsity(factor)
            return [1.0 - dense]
        if packet in (_aten.div, _aten.div_) and isinstance(args[0], torch.Tensor):
            return [self._input_sparsity(args[0])]
        return [model.default] * len(outputs)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view or func.overloadpacket in (_aten.detach, _aten.lift_fresh):
            return out
        inputs, outputs = _tensors((args, kwargs)), _tensors(out)
        packet = func.overloadpacket
        flops = float(flop_registry[packet](*args, **kwargs, out_val=out)) if packet in flop_registry else 0.0
        nbytes = sum(t.numel() * t.element_size() for t in inputs + outputs)
        floating = [t for t in inputs + outputs if t.is_floating_point()]
        dtype = str(floating[0].dtype).removeprefix("torch.") if floating else "float32"
        self.clock_s += self.hardware.op_s(flops, nbytes, dtype)
        self._mark_probabilities(packet, inputs, outputs)
        self._mark_upcasts(packet, inputs, outputs)
        for t, sparsity in zip(outputs, self._estimate(func, args, kwargs, out)):
            key = _storage_key(t)
            self.estimate[key] = sparsity
            self.flops[key] = flops
        return out


@dataclass
class _Saved:
    tensor: torch.Tensor
    first_pack: int
    pack_at_s: float
    offloadable: bool
    sparsity: float
    flops: float
    module: str = ""
    probabilities: bool = False
    upcast: bool = False
    unpack_at_s: float | None = None
    view_of: int | None = None
    storage_nbytes: int | None = None


class _Handle:
    """What the pack hook returns: one per pack (each holds its own view of the storage), so the
    node that made each pack can be named."""

    __slots__ = ("index", "ordinal", "tensor")

    def __init__(self, index: int, ordinal: int, tensor: torch.Tensor) -> None:
        self.index = index
        self.ordinal = ordinal
        self.tensor = tensor


@dataclass(frozen=True)
class ModuleCall:
    """A module's first call in forward, on the trace's clock: what checkpointing the call would
    re-run and hold.

    Attributes:
        path: the module's path in the model (``"transformer.h.3"``; ``""`` for the model itself).
        start_s, end_s: when its forward began and ended, seconds since forward began.
        input_shape, input_dtype, input_nbytes: its first positional tensor input that is not a
            parameter (a transformer layer's hidden states), or ``None``, ``None``, 0 without one:
            what a checkpoint of the call holds until its backward.
        input_key: the record whose storage that input is (saved by some operator anyway), or ``None``.
        input_keys: the records whose storage is any of its tensor inputs (positional or keyword).

    Example:
        >>> call = ModuleCall("h.0", 0.5, 1.5, (1, 8, 256), "float16", 4096, None, (3,))
        >>> ModuleCall.from_dict(call.to_dict()) == call, call.forward_s
        (True, 1.0)
    """

    path: str
    start_s: float
    end_s: float
    input_shape: tuple[int, ...] | None = None
    input_dtype: str | None = None
    input_nbytes: int = 0
    input_key: int | None = None
    input_keys: tuple[int, ...] = ()

    @property
    def forward_s(self) -> float:
        """Seconds its forward took: what recomputing the call costs."""
        return self.end_s - self.start_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (a trace's ``meta["module_calls"]`` holds these)."""
        return {
            "path": self.path,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "input_shape": None if self.input_shape is None else list(self.input_shape),
            "input_dtype": self.input_dtype,
            "input_nbytes": self.input_nbytes,
            "input_key": self.input_key,
            "input_keys": list(self.input_keys),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModuleCall:
        """Inverse of :meth:`to_dict`."""
        shape, key = data.get("input_shape"), data.get("input_key")
        return cls(
            path=str(data["path"]),
            start_s=float(data["start_s"]),
            end_s=float(data["end_s"]),
            input_shape=None if shape is None else tuple(int(n) for n in shape),
            input_dtype=data.get("input_dtype"),
            input_nbytes=int(data.get("input_nbytes", 0)),
            input_key=None if key is None else int(key),
            input_keys=tuple(int(k) for k in data.get("input_keys", ())),
        )


def module_calls(trace: Trace) -> tuple[ModuleCall, ...]:
    """The first call of every module of a meta trace, in the order they began (empty for a trace
    that does not record them: a profiled one, or one written before they were recorded).

    Example:
        >>> trace = meta_trace("alexnet", batch_size=2, resolution=64, width_mult=0.25)
        >>> calls = {c.path: c for c in module_calls(trace)}
        >>> calls["features.0"].input_shape, calls["features.0"].input_key, calls[""].end_s <= trace.forward_s
        ((2, 3, 64, 64), 0, True)
    """
    return tuple(ModuleCall.from_dict(c) for c in trace.meta.get("module_calls") or ())


class _Recorder:
    def __init__(self, clock: _Clock, fixed_storages: set[int]) -> None:
        self.clock = clock
        self.fixed_storages = fixed_storages
        self.saved: list[_Saved] = []
        self.by_storage: dict[int, int] = {}  # per storage, its first record
        self.by_view: dict[Any, int] = {}  # per view (a fixed storage's: per storage), its record
        self.packs = 0
        self.naming: str | None = None
        self.producer_of_pack: dict[int, str] = {}
        self.modules: list[str] = []  # the running modules' labels, innermost last
        # per module path, its first call: start, end and its tensor inputs (held, so that their
        # storages are still theirs when matched against the saved ones after the run)
        self.calls: dict[str, list[Any]] = {}

    def pack(self, t: torch.Tensor) -> _Handle:
        key = _storage_key(t)
        ordinal = self.packs
        self.packs += 1
        fixed = key in self.fixed_storages or isinstance(t, nn.Parameter)
        # What the runtime's executor stores once: the same view of a storage at the same version.
        # (Every saved tensor is held until the run ends, so no storage's address is reused.)
        view = key if fixed else (key, t.storage_offset(), tuple(t.stride()), tuple(t.shape), t.dtype, t._version)
        index = self.by_view.get(view)
        if index is None:
            index = len(self.saved)
            self.by_view[view] = index
            first = self.by_storage.setdefault(key, index)
            own_nbytes, storage_nbytes = t.numel() * t.element_size(), t.untyped_storage().nbytes()
            self.saved.append(
                _Saved(
                    tensor=t,
                    first_pack=ordinal,
                    pack_at_s=self.clock.clock_s,
                    offloadable=not fixed,
                    sparsity=self.clock.estimate.get(key, self.clock.sparsity.default),
                    flops=self.clock.flops.get(key, 0.0),
                    module=self.modules[-1] if self.modules else "",
                    probabilities=self.clock.holds_probabilities(t),
                    upcast=self.clock.holds_upcast(t),
                    view_of=None if fixed or first == index else first,
                    # keeping a slice of an activation keeps its storage (the executor's rule)
                    storage_nbytes=storage_nbytes if not fixed and t.requires_grad and storage_nbytes > own_nbytes else None,
                )
            )
        return _Handle(index, ordinal, t)

    def unpack(self, handle: _Handle) -> torch.Tensor:
        saved = self.saved[handle.index]
        if self.naming is not None:
            self.producer_of_pack.setdefault(handle.ordinal, self.naming)
        elif saved.unpack_at_s is None:
            saved.unpack_at_s = self.clock.clock_s
        return handle.tensor

    def watch_modules(self, root: nn.Module) -> list[Any]:
        """Hooks that keep :attr:`modules` current while ``root`` runs, each module labelled
        ``path (Type)`` as the runtime's profiler labels them; returns the hook handles."""

        def enter(label: str, path: str) -> Callable[..., None]:
            def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
                self.modules.append(label)
                if path not in self.calls:
                    self.calls[path] = [self.clock.clock_s, None, _tensors(args), _tensors(kwargs)]

            return hook

        def leave(path: str) -> Callable[..., None]:
            def hook(module: nn.Module, args: Any, output: Any) -> None:
                if self.modules:
                    self.modules.pop()
                call = self.calls.get(path)
                if call is not None and call[1] is None:
                    call[1] = self.clock.clock_s

            return hook

        handles = []
        for name, module in root.named_modules():
            label = f"{name} ({type(module).__name__})" if name else type(module).__name__
            handles.append(module.register_forward_pre_hook(enter(label, name), with_kwargs=True))
            handles.append(module.register_forward_hook(leave(name), always_call=True))
        return handles

    def module_calls(self) -> tuple[ModuleCall, ...]:
        """Each module's first call, in the order they began (after the run)."""

        def saved_as(t: torch.Tensor) -> int | None:
            key = self.by_storage.get(_storage_key(t))
            return key if key is not None and self.saved[key].offloadable else None

        found = []
        for path, (start_s, end_s, positional, keyword) in self.calls.items():
            first = next((t for t in positional if _storage_key(t) not in self.fixed_storages and not isinstance(t, nn.Parameter)), None)
            keys = {saved_as(t) for t in positional + keyword} - {None}
            found.append(
                ModuleCall(
                    path=path,
                    start_s=start_s,
                    end_s=start_s if end_s is None else end_s,
                    input_shape=None if first is None else tuple(first.shape),
                    input_dtype=None if first is None else str(first.dtype).removeprefix("torch."),
                    input_nbytes=0 if first is None else first.numel() * first.element_size(),
                    input_key=None if first is None else saved_as(first),
                    input_keys=tuple(sorted(k for k in keys if k is not None)),
                )
            )
        return tuple(sorted(found, key=lambda c: c.start_s))

    def name_producers(self, root: Any) -> None:
        """Visit the graph and read every ``_saved_*`` attribute: each read unpacks with the node's name."""
        seen: set[int] = set()
        todo = deque([root])
        while todo:
            node = todo.popleft()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            self.naming = node.name()
            for attr in dir(node):
                if attr.startswith("_saved_"):
                    try:
                        getattr(node, attr)
                    except RuntimeError:
                        pass  # released or not unpackable: it keeps the producer of another pack
            self.naming = None
            todo.extend(fn for fn, _ in node.next_functions)


def _module_on_meta(model: str | nn.Module, num_classes: int, width_mult: float, dtype: torch.dtype) -> tuple[nn.Module, str]:
    if isinstance(model, nn.Module):
        module = copy.deepcopy(model).to(device="meta")
        name = type(model).__name__
    else:
        from cswap import models

        with torch.device("meta"):
            module = models.build(model, num_classes=num_classes, width_mult=width_mult)
        name = model
    return module.to(dtype=dtype).train(), name


def with_hidden_times(trace: Trace) -> Trace:
    """Fill ``hidden_forward_s`` / ``hidden_backward_s`` of every record from its pack and unpack times.

    Uses the definitions in :mod:`cswap.profile.trace` over the offloadable records: forward compute until
    the next offloadable pack (the last: until forward ends), backward compute since the previous
    offloadable unpack (the first: since backward began).
    """
    records = list(trace.tensors)
    movable = [i for i, r in enumerate(records) if r.offloadable]
    hidden_f: dict[int, float] = {}
    for position, i in enumerate(movable):
        end = records[movable[position + 1]].pack_at_s if position + 1 < len(movable) else trace.forward_s
        hidden_f[i] = max(end - records[i].pack_at_s, 0.0)
    hidden_b: dict[int, float] = {}
    previous = trace.forward_s
    for i in sorted((i for i in movable if records[i].unpack_at_s is not None), key=lambda i: (records[i].unpack_at_s, i)):
        at = records[i].unpack_at_s
        hidden_b[i] = max(at - previous, 0.0)
        previous = at
    tensors = tuple(
        replace(r, hidden_forward_s=hidden_f.get(i, 0.0), hidden_backward_s=hidden_b.get(i, 0.0)) for i, r in enumerate(records)
    )
    return replace(trace, tensors=tensors)


def _sparsity_model(sparsity: float | SparsityModel | Trace | None) -> SparsityModel:
    if sparsity is None:
        return SparsityModel()
    if isinstance(sparsity, SparsityModel):
        return sparsity
    if isinstance(sparsity, Trace):
        return SparsityModel.from_trace(sparsity)
    if isinstance(sparsity, (int, float)) and not isinstance(sparsity, bool):
        return SparsityModel(relu=float(sparsity))
    raise TypeError(f"sparsity must be a float, a SparsityModel, a Trace or None, got {type(sparsity).__name__}")


def _floating_dtype(dtype: str) -> torch.dtype:
    torch_dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    if not isinstance(torch_dtype, torch.dtype) or not torch_dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype name such as float32, float16 or bfloat16, got {dtype!r}")
    return torch_dtype


@dataclass(frozen=True)
class MetaRun:
    """What :func:`run_on_meta` recorded of one forward and backward.

    Attributes:
        records: every saved tensor, in pack order, once per view (hidden times not yet filled).
        forward_s, backward_s: simulated seconds of forward and backward.
        saved_slots: pack hook calls (a storage saved twice counts twice).
        param_bytes: bytes of the module's parameters.
        probability_keys: keys of the offloadable records that hold attention probabilities.
        calls: every module's first call (:class:`ModuleCall`), in the order they began.
    """

    records: tuple[TensorRecord, ...]
    forward_s: float
    backward_s: float
    saved_slots: int
    param_bytes: int
    probability_keys: tuple[int, ...] = ()
    calls: tuple[ModuleCall, ...] = ()

    def trace(self, profile: HardwareProfile, sparsity: SparsityModel, **meta: Any) -> Trace:
        """The :class:`Trace` of this run on ``profile``, hidden times filled: ``meta`` (the model,
        its input) beside what every meta trace records (the profile, parameters, saved slots,
        sparsity, module calls)."""
        trace = Trace(
            tensors=self.records,
            device={"kind": "simulated", "name": profile.device.name, "hardware": profile.name},
            d2h_gbps=profile.link.d2h_gbps,
            h2d_gbps=profile.link.h2d_gbps,
            forward_s=self.forward_s,
            backward_s=self.backward_s,
            meta={
                "source": "meta",
                **meta,
                "hardware": profile.name,
                "param_bytes": self.param_bytes,
                "saved_slots": self.saved_slots,
                "relu_sparsity": sparsity.relu,
                "measured_sparsity": bool(sparsity.by_producer),
                "module_calls": [call.to_dict() for call in self.calls],
            },
        )
        return with_hidden_times(trace)


def run_on_meta(
    module: nn.Module,
    loss_of: Callable[[nn.Module], torch.Tensor],
    hardware: HardwareProfile,
    sparsity: SparsityModel,
    qualified_producers: bool = False,
) -> MetaRun:
    """Run ``loss_of(module)`` and its backward on ``meta`` under the recorder and the clock.

    Args:
        module: a module on ``meta``, in the mode and dtype to trace.
        loss_of: the forward: takes ``module``, returns a scalar loss on ``meta``.
        hardware: the profile whose roofline times the clock advances by.
        sparsity: the sparsity estimates (measured ones by producer name included).
        qualified_producers: name producers ``"<module path>:<node>"`` (``"transformer.h.3.attn:BmmBackward0"``),
            as the runtime's profiler does when given the model, instead of the node name alone.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).to("meta")
        >>> x = torch.empty(2, 4, device="meta")
        >>> run = run_on_meta(model, lambda m: m(x).sum(), load_hardware("v100-pcie3"), SparsityModel())
        >>> [(r.producer, r.module) for r in run.records if r.offloadable]
        [('AddmmBackward0', '0 (Linear)'), ('ReluBackward0', '1 (ReLU)')]
    """
    fixed = {_storage_key(t) for t in (*module.parameters(), *module.buffers())}
    clock = _Clock(hardware, sparsity)
    recorder = _Recorder(clock, fixed)
    handles = recorder.watch_modules(module)
    try:
        with torch.autograd.graph.saved_tensors_hooks(recorder.pack, recorder.unpack), clock:
            loss = loss_of(module)
            forward_s = clock.clock_s
            recorder.name_producers(loss.grad_fn)
            loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    backward_s = clock.clock_s - forward_s

    measured = {k: deque(v) for k, v in sparsity.by_producer.items()}
    records = []
    for key, saved in enumerate(recorder.saved):
        t = saved.tensor
        producer = recorder.producer_of_pack.get(saved.first_pack, "")
        path = saved.module.rsplit(" (", 1)[0] if " (" in saved.module else ""
        if qualified_producers and path and producer:
            producer = f"{path}:{producer}"
        value = saved.sparsity
        if saved.offloadable and measured.get(producer):
            value = measured[producer].popleft()
        dtype = str(t.dtype).removeprefix("torch.")
        kind = "mask" if dtype == "bool" else "attention_probabilities" if saved.probabilities else "upcast" if saved.upcast else "activation"
        coded = sparsity.compressibility.codec_of(dtype, kind) if sparsity.compressibility is not None else None
        records.append(
            TensorRecord(
                key=key,
                shape=tuple(t.shape),
                dtype=str(t.dtype).removeprefix("torch."),
                nbytes=t.numel() * t.element_size(),
                sparsity=min(max(value, 0.0), 1.0),
                producer=producer,
                offloadable=saved.offloadable,
                pack_at_s=saved.pack_at_s,
                unpack_at_s=saved.unpack_at_s,
                flops=saved.flops,
                module=saved.module,
                codec=coded[0] if coded else None,
                codec_fraction=coded[1] if coded else None,
                view_of=saved.view_of,
                storage_nbytes=saved.storage_nbytes,
            )
        )
    return MetaRun(
        records=tuple(records),
        forward_s=forward_s,
        backward_s=backward_s,
        saved_slots=recorder.packs,
        param_bytes=sum(p.numel() * p.element_size() for p in module.parameters()),
        probability_keys=tuple(k for k, saved in enumerate(recorder.saved) if saved.probabilities and saved.offloadable),
        calls=recorder.module_calls(),
    )


def meta_trace(
    model: str | nn.Module,
    batch_size: int = 64,
    resolution: int = 224,
    hardware: str | HardwareProfile = "v100-pcie3",
    sparsity: float | SparsityModel | Trace | None = None,
    dtype: str = "float32",
    num_classes: int = 1000,
    width_mult: float = 1.0,
    input_shape: Sequence[int] | None = None,
) -> Trace:
    """The trace one training iteration of ``model`` would give on ``hardware``, computed on ``meta``.

    Args:
        model: a name from ``cswap.models.MODEL_NAMES`` (or ``"package.module:function"``), or an
            ``nn.Module`` (copied to ``meta``; the original is untouched).
        batch_size, resolution: the input is ``(batch_size, 3, resolution, resolution)``.
        hardware: profile name, path or object; sets the layer times and the trace's bandwidths.
        sparsity: ReLU-output sparsity (float), a :class:`SparsityModel`, or a profiled
            :class:`Trace` of the same model to take measured sparsities from.
        dtype: ``float32``, ``float16`` or ``bfloat16`` for parameters and activations.
        num_classes, width_mult: passed to ``cswap.models.build``.
        input_shape: the full input shape, overriding ``batch_size`` and ``resolution``.

    Returns:
        A :class:`Trace` with ``meta["source"] == "meta"``, times in simulated seconds, and the
        hidden times filled by :func:`with_hidden_times`.

    Raises:
        ValueError: unknown model (naming the valid ones), non-positive sizes, unknown dtype.
    """
    if batch_size < 1 or resolution < 1:
        raise ValueError(f"batch_size and resolution must be positive, got {batch_size} and {resolution}")
    torch_dtype = _floating_dtype(dtype)
    profile = load_hardware(hardware)
    sparsity_model = _sparsity_model(sparsity)
    module, name = _module_on_meta(model, num_classes, width_mult, torch_dtype)
    shape = tuple(input_shape) if input_shape is not None else (batch_size, 3, resolution, resolution)
    x = torch.empty(shape, device="meta", dtype=torch_dtype)
    run = run_on_meta(module, lambda m: m(x).float().sum(), profile, sparsity_model)
    return run.trace(
        profile, sparsity_model, model=name, batch_size=shape[0], input_shape=list(shape),
        resolution=resolution if input_shape is None else None, dtype=dtype,
    )
