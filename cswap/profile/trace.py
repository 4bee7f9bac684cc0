"""The profile of one training iteration: every saved tensor, and when compute ran around it.

The profiler fills a :class:`Trace` in the first iteration of each epoch; the advisor plans from it,
the simulator replays it, and ``rt.trace().to_json(path)`` / :meth:`Trace.from_json` carry it
between machines.

Timestamps are seconds since the start of the iteration's forward pass. The hidden times are:

* ``hidden_forward_s`` (the paper's ``Hidden_f``): forward compute between this tensor's pack and
  the pack of the next offloadable tensor, i.e. the compute a swap-out issued at pack time
  overlaps before the copy engine is wanted by the next tensor. The last one runs to the end of
  forward.
* ``hidden_backward_s`` (``Hidden_b``): backward compute between the previous unpack of an
  offloadable tensor (in unpack order) and this tensor's first unpack, i.e. the compute a
  prefetch issued right after that previous unpack overlaps before this tensor is needed. The
  first one runs from the start of backward.

Example:
    >>> rec = TensorRecord(key=0, shape=(2, 3), dtype="float32", nbytes=24, sparsity=0.5, producer="ReluBackward0")
    >>> t = Trace(tensors=(rec,), device={"kind": "cpu"}, d2h_gbps=10.0, h2d_gbps=10.0)
    >>> Trace.from_dict(t.to_dict()) == t
    True
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["TRACE_FORMAT_VERSION", "TensorRecord", "Trace"]

TRACE_FORMAT_VERSION = 1


@dataclass(frozen=True)
class TensorRecord:
    """One tensor autograd saved for backward.

    Attributes:
        key: ordinal in the iteration's pack sequence (guarded by ``shape`` and ``dtype``).
        shape: the saved tensor's shape.
        dtype: dtype name without ``torch.`` (``"float32"``).
        nbytes: bytes of its contiguous form.
        sparsity: fraction of elements whose bits are all zero.
        producer: name of the autograd node that saved it (``grad_fn`` name), or ``""``.
        offloadable: False for parameters, buffers and tensors the runtime never moves.
        pack_s, unpack_s: seconds spent in the pack and (first) unpack hooks.
        pack_at_s: when it was packed, seconds since forward began.
        unpack_at_s: when it was first unpacked, or ``None`` if backward never asked for it.
        hidden_forward_s: ``Hidden_f`` (module docstring).
        hidden_backward_s: ``Hidden_b`` (module docstring).
        flops: forward FLOPs of the producing op when known (simulated traces), else 0.
        narrow_dtype: the dtype the codec's encoding stores the elements as, when narrower than
            ``dtype`` (``"int16"`` for an int64 tensor of small values; see
            :class:`cswap.codecs.Encoding`), so it is costed at that width. None otherwise.
        unpack_order: its position among first unpacks in backward (0: unpacked first), or
            ``None``: derived from ``unpack_at_s``, ties in reverse pack order
            (:func:`cswap.planner.lifetime.lifetimes_from_trace`).
        free_order: the backward position (as ``unpack_order`` counts) after which its storage
            dies, or ``None``: right after its own first unpack (the end of backward when it is
            never unpacked).
        module: the module that produced it, as ``path (Type)`` (``"features.3 (ReLU)"``) when the
            runtime was given ``model=``, else ``""`` (traces written without it load as ``""``).
        rebuilt_nbytes: the storage bytes of the tensor rebuilt for backward, when the profile
            rebuilt it and they differ from ``nbytes`` (a strided view is rebuilt with its strides,
            in a buffer spanning them); ``None`` otherwise.
        recompute_s: measured forward seconds of its producing op (what recomputing it costs), or
            ``None`` (traces written without it load as ``None``): then it is derived from
            ``flops`` where those are known.
        codec: the codec besides ZVC that takes its dtype (``"bitpack"``, ``"exponent"``), or ``None``.
        codec_fraction: the size ``codec`` gave it when profiled, as a fraction of ``nbytes`` (a
            fraction, so that it holds for the same tensor at another size), or ``None``.
        view_of: the key of the first saved tensor whose storage this one is another view of (a
            view of the same shape and strides is a duplicate instead), or ``None``: kept together,
            the two hold that storage once.
        storage_nbytes: the bytes of the storage it is a view of, where more than ``nbytes`` (a
            slice of a larger tensor: keeping it keeps all of that storage), or ``None``.
    """

    key: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    sparsity: float
    producer: str = ""
    offloadable: bool = True
    pack_s: float = 0.0
    unpack_s: float = 0.0
    pack_at_s: float = 0.0
    unpack_at_s: float | None = None
    hidden_forward_s: float = 0.0
    hidden_backward_s: float = 0.0
    flops: float = 0.0
    narrow_dtype: str | None = None
    unpack_order: int | None = None
    free_order: int | None = None
    module: str = ""
    rebuilt_nbytes: int | None = None
    recompute_s: float | None = None
    codec: str | None = None
    codec_fraction: float | None = None
    view_of: int | None = None
    storage_nbytes: int | None = None

    @property
    def codec_nbytes(self) -> int | None:
        """The size ``codec`` gives it, or ``None``."""
        return None if self.codec_fraction is None else round(self.codec_fraction * self.nbytes)

    @property
    def density(self) -> float:
        """Fraction of nonzero elements."""
        return 1.0 - self.sparsity

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorRecord:
        """Build from :func:`dataclasses.asdict` output (lists become tuples); unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown tensor record fields {unknown}; known fields are {sorted(known)}")
        data = dict(data)
        data["shape"] = tuple(data["shape"])
        return cls(**data)


@dataclass(frozen=True)
class Trace:
    """One profiled iteration.

    Attributes:
        tensors: every saved tensor, in pack order.
        device: the device fingerprint (``DeviceFingerprint.to_dict()``).
        d2h_gbps, h2d_gbps: measured transfer bandwidths used when planning.
        forward_s, backward_s: wall seconds of forward and backward.
        epoch: the epoch it was profiled in.
        policy: the policy that was active while profiling.
        meta: free-form context (model name, batch size, input size...).
    """

    tensors: tuple[TensorRecord, ...]
    device: dict[str, Any] = field(default_factory=dict)
    d2h_gbps: float = 0.0
    h2d_gbps: float = 0.0
    forward_s: float = 0.0
    backward_s: float = 0.0
    epoch: int = 0
    policy: str = "none"
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def iteration_s(self) -> float:
        """Forward plus backward seconds."""
        return self.forward_s + self.backward_s

    @property
    def total_nbytes(self) -> int:
        """Bytes of every saved tensor."""
        return sum(t.nbytes for t in self.tensors)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with a format version."""
        return {"version": TRACE_FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trace:
        """Inverse of :meth:`to_dict`; ``ValueError`` naming what is wrong for a malformed dict."""
        data = dict(data)
        version = data.pop("version", TRACE_FORMAT_VERSION)
        if version != TRACE_FORMAT_VERSION:
            raise ValueError(f"trace format version {version} is not supported (this cswap reads {TRACE_FORMAT_VERSION})")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown trace fields {unknown}; known fields are {sorted(known)}")
        if "tensors" not in data:
            raise ValueError("a trace needs a 'tensors' list")
        data["tensors"] = tuple(TensorRecord.from_dict(t) for t in data["tensors"])
        return cls(**data)

    def to_json(self, path: str | os.PathLike[str]) -> Path:
        """Write the trace as JSON; returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> Trace:
        """Read a trace written by :meth:`to_json`; errors name the file."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except OSError as error:
            raise FileNotFoundError(f"cannot read trace {path}: {error}") from error
        except json.JSONDecodeError as error:
            raise ValueError(f"trace {path} is not valid JSON: {error}") from error
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError, KeyError) as error:
            raise ValueError(f"trace {path} is malformed: {error}") from error
