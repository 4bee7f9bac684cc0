"""Options of :class:`cswap.Runtime`: defaults from ``configs/default.yaml``, keyword overrides, validation.

The defaults file is found next to the package (``<repo>/configs/default.yaml``), so it loads from any
working directory; ``$CSWAP_RUNTIME_CONFIG`` names another file. Every value is validated into the
frozen :class:`RuntimeOptions`; a bad value in the file raises ``ValueError`` naming the file and the
key, a bad keyword raises ``ValueError`` naming the option, and an unknown keyword raises
``TypeError`` naming it and the valid ones.

Example:
    >>> opts = load_options(policy="swap", min_bytes=0)
    >>> opts.policy, opts.min_bytes
    ('swap', 0)
    >>> load_options(min_byte=0)
    Traceback (most recent call last):
    ...
    TypeError: unknown Runtime option 'min_byte'; valid options are arena_slack, backend, d2h_gbps, decider, device, disable_kv_cache, h2d_gbps, host_memory_budget, launch_lookup, logistic_model, memory_budget, min_bytes, model, paper_size, passive_profile, policy, prefetch_bytes, time_model
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
import yaml

from cswap.budget import HostBudget, MemoryBudget, parse_budget, parse_host_budget
from cswap.codecs.launch import LaunchLookup
from cswap.paths import shipped_configs_dir
from cswap.planner.actions import RECOMPUTING_POLICIES, RUNTIME_POLICIES

__all__ = [
    "BACKENDS",
    "DECIDERS",
    "DEFAULTS_ENV",
    "FILE_OPTIONS",
    "MODEL_OPTIONS",
    "OBJECT_OPTIONS",
    "POLICIES",
    "RECOMPUTING_POLICIES",
    "LaunchLookup",
    "RuntimeOptions",
    "cache_configs",
    "default_options_path",
    "file_defaults",
    "load_options",
]

#: The policies, after the systems they reproduce: plain PyTorch, vDNN, cDMA, CSWAP, FreeLunch,
#: checkpointing (Chen et al., MONeT) and Capuchin (:data:`cswap.planner.actions.POLICY_TABLE`).
POLICIES: tuple[str, ...] = RUNTIME_POLICIES

#: How the ``cswap`` policy decides compress-or-not per tensor.
DECIDERS: tuple[str, ...] = ("cost-model", "logistic")

#: Codec backends; ``auto`` picks ``cuda`` on a GPU and ``cpu`` otherwise.
BACKENDS: tuple[str, ...] = ("auto", "torch", "cpu", "cuda")

#: Environment variable naming a defaults file to use instead of ``configs/default.yaml``.
DEFAULTS_ENV = "CSWAP_RUNTIME_CONFIG"

#: Options the defaults file may set (plain values).
FILE_OPTIONS: tuple[str, ...] = (
    "policy",
    "device",
    "backend",
    "min_bytes",
    "prefetch_bytes",
    "decider",
    "paper_size",
    "passive_profile",
    "arena_slack",
    "d2h_gbps",
    "h2d_gbps",
)

#: Options that are objects, given as keyword arguments only (``None`` by default).
OBJECT_OPTIONS: tuple[str, ...] = ("model", "time_model", "launch_lookup", "logistic_model", "memory_budget", "host_memory_budget")

#: Plain values about the model given, as keyword arguments only (``False`` by default): a defaults
#: file is a machine's, and says nothing of a model.
MODEL_OPTIONS: tuple[str, ...] = ("disable_kv_cache",)

@dataclass(frozen=True)
class RuntimeOptions:
    """Validated options of one :class:`cswap.Runtime`.

    Attributes:
        policy: one of :data:`POLICIES`.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``: where training runs.
        backend: ZVC codec backend, one of :data:`BACKENDS`.
        min_bytes: without a memory budget, saved tensors smaller than this stay where they are
            (``0`` offloads everything). Under a budget it binds nothing: every tensor may move when
            the budget needs it, each copy of one below it priced with a fixed latency each way
            (:data:`cswap.planner.costmodel.COPY_LATENCY_S`), so the plan keeps small tensors where
            the budget allows.
        prefetch_bytes: bytes of offloaded tensors that backward may fetch ahead of need.
        decider: ``cost-model`` (compress iff T < T') or ``logistic`` (``logistic_model`` decides).
        paper_size: cost compressed transfers as ``Size*(1-Sparsity)`` (the paper) instead of exactly.
        passive_profile: profiling iterations swap every saved tensor even when memory suffices.
        arena_slack: extra host-arena room over the profiled need (fraction, >= 0).
        d2h_gbps, h2d_gbps: bandwidths for planning; ``None`` measures them once per device.
        model: a module whose parameters and buffers are never offloaded and whose submodule names
            label the profile's producers; its submodules are the recompute regions (required by
            :data:`RECOMPUTING_POLICIES`; ``cswap`` under a budget recomputes only when given one).
        time_model: predicts (de)compression seconds (:class:`cswap.planner.costmodel.TimeModel`); ``None``
            uses a throughput model measured once per device (:mod:`cswap.profile.codec_speed`).
        launch_lookup: ``(backend, op, dtype, nbytes) -> Launch | None``, e.g. backed by the tuner's store.
        logistic_model: an object with ``should_compress(nbytes, sparsity, hidden_forward_s,
            hidden_backward_s, d2h_gbps, h2d_gbps) -> bool``, for ``decider="logistic"``.
        memory_budget: the most bytes of saved activations kept on the device
            (:class:`cswap.budget.MemoryBudget`; given as bytes, ``"2GiB"`` or a fraction of policy
            ``none``'s peak, read by :func:`cswap.budget.parse_budget`); ``None``: no budget.
        host_memory_budget: the most bytes of saved activations' host copies (raw or compressed)
            held on the host at once (:class:`cswap.budget.HostBudget`; given as bytes, ``"8GiB"``
            or ``"auto"``, read by :func:`cswap.budget.parse_host_budget`); ``None``: no host budget.
        disable_kv_cache: turn a Hugging Face model's key/value cache off (``config.use_cache =
            False`` on every config of ``model`` that has it on) inside each ``rt.iteration()``,
            and back to its value when the iteration exits, as Hugging Face's gradient checkpointing
            turns it off for training: a decoder layer given the cache cannot be recomputed
            (``ac-full``, ``recompute``, ``capuchin``, ``cswap``). Outside iterations (generation,
            evaluation, ``save_pretrained``) the config holds the value you set. The gradients are
            those of plain PyTorch with the cache off, which on some models (T5) differ in their
            last bits from those with it on. Needs ``model`` with such a config.
    """

    policy: str
    device: str
    backend: str
    min_bytes: int
    prefetch_bytes: int
    decider: str
    paper_size: bool
    passive_profile: bool
    arena_slack: float
    d2h_gbps: float | None
    h2d_gbps: float | None
    model: torch.nn.Module | None = None
    time_model: Any = None
    launch_lookup: LaunchLookup | None = None
    logistic_model: Any = None
    memory_budget: MemoryBudget | None = None
    host_memory_budget: HostBudget | None = None
    disable_kv_cache: bool = False

    def __post_init__(self) -> None:
        # any accepted form becomes a MemoryBudget (a HostBudget); the parsers' errors name the forms
        object.__setattr__(self, "memory_budget", parse_budget(self.memory_budget))
        object.__setattr__(self, "host_memory_budget", parse_host_budget(self.host_memory_budget))
        if isinstance(self.policy, str):  # "Swap", " CSWAP": a policy's name in any case
            object.__setattr__(self, "policy", self.policy.strip().lower())
        for name in FILE_OPTIONS + OBJECT_OPTIONS + MODEL_OPTIONS:
            problem = _problem(name, getattr(self, name))
            if problem:
                raise ValueError(f"invalid Runtime option {name}={getattr(self, name)!r}: {problem}")
        if self.disable_kv_cache and not cache_configs(self.model):
            raise ValueError(
                "disable_kv_cache=True turns off a Hugging Face model's key/value cache (config.use_cache) during each "
                "iteration, and " + ("no model was given: cswap.Runtime(..., model=model)" if self.model is None
                                     else f"no module of {type(self.model).__name__} has a config with use_cache")
            )
        if self.decider == "logistic" and self.logistic_model is None:
            raise ValueError(
                "decider='logistic' needs logistic_model=<object with should_compress(...)>, "
                "e.g. cswap.predictors.load_decider(fingerprint, store); or use decider='cost-model'"
            )


def _problem(name: str, value: Any) -> str | None:
    """Why ``value`` is not valid for option ``name``, or ``None`` when it is."""
    if name == "policy":
        if value in POLICIES:
            return None
        close = difflib.get_close_matches(str(value), POLICIES, n=1)
        return (f"did you mean {close[0]!r}? " if close else "") + f"choose one of {', '.join(POLICIES)}"
    if name == "decider":
        return None if value in DECIDERS else f"choose one of {', '.join(DECIDERS)}"
    if name == "backend":
        return None if value in BACKENDS else f"choose one of {', '.join(BACKENDS)}"
    if name == "device":
        if not isinstance(value, str):
            return "give a device name such as 'auto', 'cpu' or 'cuda:0'"
        if value == "auto":
            return None
        try:
            torch.device(value)
        except (RuntimeError, ValueError):
            return "give a device name such as 'auto', 'cpu' or 'cuda:0'"
        return None
    if name in ("min_bytes", "prefetch_bytes"):
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return None if ok else "must be an int >= 0 (bytes)"
    if name in ("paper_size", "passive_profile", "disable_kv_cache"):
        return None if isinstance(value, bool) else "must be true or false"
    if name == "arena_slack":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
        return None if ok else "must be a number >= 0 (a fraction, e.g. 0.25)"
    if name in ("d2h_gbps", "h2d_gbps"):
        if value is None:
            return None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
        return None if ok else "must be a positive number of GB/s, or null to measure it"
    if name == "model":
        return None if value is None or isinstance(value, torch.nn.Module) else "must be a torch.nn.Module or None"
    if name in ("time_model",):
        ok = value is None or (callable(getattr(value, "compress_s", None)) and callable(getattr(value, "decompress_s", None)))
        return None if ok else "must have compress_s(...) and decompress_s(...) (cswap.planner.costmodel.TimeModel) or be None"
    if name == "launch_lookup":
        return None if value is None or callable(value) else "must be a callable (backend, op, dtype, nbytes) -> Launch | None"
    if name == "memory_budget":
        return None if value is None or isinstance(value, MemoryBudget) else "read it with cswap.budget.parse_budget"
    if name == "host_memory_budget":
        return None if value is None or isinstance(value, HostBudget) else "read it with cswap.budget.parse_host_budget"
    if name == "logistic_model":
        ok = value is None or callable(getattr(value, "should_compress", None))
        return None if ok else "must have should_compress(nbytes, sparsity, hidden_forward_s, hidden_backward_s, d2h_gbps, h2d_gbps)"
    return "unknown option"


def cache_configs(model: torch.nn.Module | None) -> tuple[Any, ...]:
    """The Hugging Face configs of ``model`` and its modules that have a ``use_cache`` setting,
    each once (the modules of a model share its config).

    Example:
        >>> class Config: use_cache = True
        >>> class Model(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__(); self.config = Config(); self.layer = torch.nn.Linear(2, 2)
        ...         self.layer.config = self.config
        >>> len(cache_configs(Model())), cache_configs(torch.nn.Linear(2, 2)), cache_configs(None)
        (1, (), ())
    """
    if model is None:
        return ()
    configs = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and isinstance(getattr(config, "use_cache", None), bool):
            configs[id(config)] = config
    return tuple(configs.values())


def default_options_path() -> Path:
    """``$CSWAP_RUNTIME_CONFIG`` when set, else the shipped ``default.yaml`` (:func:`cswap.paths.shipped_configs_dir`)."""
    env = os.environ.get(DEFAULTS_ENV)
    if env:
        return Path(env)
    return shipped_configs_dir() / "default.yaml"


def _read_defaults(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as error:
        raise FileNotFoundError(
            f"cannot read the runtime defaults {path}: {error}; restore configs/default.yaml "
            f"or point ${DEFAULTS_ENV} at a defaults file"
        ) from error
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(f"runtime defaults {path} are not valid YAML: {error}") from error
    if not isinstance(data, Mapping) or not isinstance(data.get("runtime"), Mapping):
        raise ValueError(f"runtime defaults {path}: expected a mapping with a 'runtime' mapping of options at the top")
    section = dict(data["runtime"])
    unknown = sorted(set(section) - set(FILE_OPTIONS))
    if unknown:
        raise ValueError(
            f"runtime defaults {path}: unknown key runtime.{unknown[0]}; valid keys are {', '.join(sorted(FILE_OPTIONS))}"
        )
    missing = [name for name in FILE_OPTIONS if name not in section]
    if missing:
        raise ValueError(f"runtime defaults {path}: missing key runtime.{missing[0]}")
    for name, value in section.items():
        problem = _problem(name, value)
        if problem:
            raise ValueError(f"runtime defaults {path}: runtime.{name} is {value!r}: {problem}")
    return section


def file_defaults(path: str | os.PathLike[str] | None = None) -> Mapping[str, Any]:
    """The validated ``runtime`` options of a defaults file (default :func:`default_options_path`).

    Example:
        >>> file_defaults()["policy"] in POLICIES
        True
    """
    return MappingProxyType(_read_defaults(Path(path) if path is not None else default_options_path()))


def load_options(path: str | os.PathLike[str] | None = None, **overrides: Any) -> RuntimeOptions:
    """The defaults from ``path`` (default :func:`default_options_path`) with ``overrides`` applied.

    Args:
        path: a defaults YAML file with a ``runtime`` mapping.
        **overrides: option values that replace the file's (:class:`RuntimeOptions` lists them).

    Raises:
        TypeError: an unknown option, naming it and the valid ones.
        ValueError: a bad value (naming the option), or a malformed file (naming the file and key).

    Example:
        >>> load_options(policy="compress-keep").policy
        'compress-keep'
    """
    valid = sorted(f.name for f in fields(RuntimeOptions))
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        names = ", ".join(repr(u) for u in unknown)
        raise TypeError(f"unknown Runtime option{plural} {names}; valid options are {', '.join(valid)}")
    values = _read_defaults(Path(path) if path is not None else default_options_path())
    values.update(overrides)
    return RuntimeOptions(**values)
