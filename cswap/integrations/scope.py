"""What the framework callbacks share: one ``rt.iteration()`` kept open across callback calls,
the runtime's options, the stats as log values, and the import of an optional framework.

A callback cannot hold a ``with`` block open across the framework's calls, so
:class:`IterationScope` enters ``rt.iteration()`` in one callback and leaves it in a later one
through a :class:`contextlib.ExitStack`. Saved-tensor hooks are thread-local: the scope refuses
to close on another thread than the one that opened it (closing there would pop that thread's hooks).

Example:
    >>> import torch, cswap
    >>> rt = cswap.Runtime("swap", device="cpu", min_bytes=0, d2h_gbps=10.0, h2d_gbps=10.0)
    >>> scope = IterationScope()
    >>> x = torch.randn(16, requires_grad=True)
    >>> scope.open(rt)                  # e.g. at the first micro-batch of an optimizer step
    >>> x.exp().sum().backward()        # the framework's forward and backward, in between
    >>> scope.close()                   # e.g. before the optimizer step
    >>> rt.stats().iterations, log_values(rt)["cswap/offloaded_mib"]   # 64 bytes
    (1, 6.1e-05)
"""

from __future__ import annotations

import importlib
import inspect
import math
import threading
from contextlib import ExitStack
from types import ModuleType
from typing import Any

import torch

from cswap.budget import parse_budget
from cswap.options import load_options
from cswap.runtime import Runtime

__all__ = ["IterationScope", "RuntimeHolder", "budget_line", "log_values", "make_runtime", "mib", "require", "runtime_options"]


def require(module: str, extra: str, needed_by: str) -> ModuleType:
    """Import the optional ``module``, or raise a one-line ``ImportError`` naming the extra.

    Args:
        module: the framework's module (``transformers``, ``lightning.pytorch``).
        extra: the cswap extra that installs it (``hf``, ``lightning``).
        needed_by: the cswap module that needs it, for the message.

    Example:
        >>> require("no_such_framework", "hf", "cswap.integrations.huggingface")
        Traceback (most recent call last):
        ...
        ImportError: cswap.integrations.huggingface needs no_such_framework, which is not installed: pip install 'cswap[hf]'
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{needed_by} needs {module}, which is not installed: pip install 'cswap[{extra}]'") from None


def runtime_options(policy: str | None, memory_budget: int | str | float | None, options: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of the callback's :class:`cswap.Runtime`, validated now.

    ``policy`` is resolved (``None`` gives the default's), and ``memory_budget`` is passed on only
    when it is not ``None``, so a runtime that plans to no budget never sees the keyword. A bad
    policy, option or budget raises here, when the callback is made, not when training reaches it.

    Example:
        >>> runtime_options("swap", None, {"min_bytes": 0})
        {'min_bytes': 0, 'policy': 'swap'}
        >>> runtime_options("recompute", None, {"disable_kv_cache": True})
        {'disable_kv_cache': True, 'policy': 'recompute'}
        >>> runtime_options("swop", None, {})
        Traceback (most recent call last):
        ...
        ValueError: invalid Runtime option policy='swop': did you mean 'swap'? choose one of none, swap, cpu-compress-swap, compress-swap, cswap, compress-keep, recompute, capuchin, ac-full
    """
    kwargs = dict(options)
    if policy is not None:
        kwargs["policy"] = policy
    checked = dict(kwargs)
    if checked.get("disable_kv_cache") is True:
        # checked against the model the runtime is made for, which the callback is not given yet
        checked["disable_kv_cache"] = False
    kwargs["policy"] = load_options(**checked).policy
    if memory_budget is not None:
        parse_budget(memory_budget)
        if "memory_budget" not in inspect.signature(Runtime).parameters:
            raise TypeError("this version of cswap.Runtime takes no memory_budget: leave memory_budget=None")
        kwargs["memory_budget"] = memory_budget
    return kwargs


def make_runtime(kwargs: dict[str, Any], model: torch.nn.Module | None) -> Runtime:
    """A runtime for ``model``: its parameters and buffers are never offloaded, its submodule names
    label the profile, and, unless ``device`` was given, it runs where the model's parameters are."""
    kwargs = dict(kwargs)
    if model is not None:
        kwargs.setdefault("model", model)
        first = next(model.parameters(), None)
        if first is not None and "device" not in kwargs:
            kwargs["device"] = str(first.device)
    return Runtime(**kwargs)


def mib(nbytes: float) -> float:
    """``nbytes`` in MiB, to 0.01 MiB, or to three significant digits below 1 MiB (a log line of a
    small model still shows its figures).

    Example:
        >>> mib(94_180_000), mib(5 << 20), mib(5000), mib(0)
        (89.82, 5.0, 0.00477, 0.0)
    """
    value = nbytes / (1 << 20)
    if value == 0:
        return 0.0
    return round(value, max(2, 2 - math.floor(math.log10(abs(value)))))


def log_values(rt: Runtime) -> dict[str, float]:
    """The few figures of the runtime's stats a trainer logs at every step, in MiB.

    ``cswap/peak_resident_mib`` (the most activation bytes resident on the device at once),
    ``cswap/budget_mib`` when the runtime plans to a memory budget, ``cswap/offloaded_mib`` (moved
    to the host so far), ``cswap/host_peak_mib`` and ``cswap/host_budget_mib`` under a host memory
    budget, and the counts ``cswap/profiled_iterations`` and ``cswap/unprofiled_plans`` (what
    dynamic padding costs). ``rt.stats()`` has the rest.

    Example:
        >>> import cswap
        >>> sorted(log_values(cswap.Runtime("swap", device="cpu", memory_budget="64MiB")).items())  # doctest: +NORMALIZE_WHITESPACE
        [('cswap/budget_mib', 64.0), ('cswap/offloaded_mib', 0.0), ('cswap/peak_resident_mib', 0.0),
         ('cswap/profiled_iterations', 0), ('cswap/unprofiled_plans', 0)]
    """
    stats = rt.stats()
    values: dict[str, float] = {"cswap/peak_resident_mib": mib(stats.peak_resident_bytes)}
    budget_bytes = getattr(stats, "budget_bytes", None)  # reported by runtimes that plan to a budget
    if budget_bytes:
        values["cswap/budget_mib"] = mib(budget_bytes)
    values["cswap/offloaded_mib"] = mib(stats.offloaded_bytes)
    host_budget_bytes = getattr(stats, "host_budget_bytes", None)
    if host_budget_bytes:
        values["cswap/host_peak_mib"] = mib(getattr(stats, "host_peak_bytes", 0))
        values["cswap/host_budget_mib"] = mib(host_budget_bytes)
    # Iterations that profiled, and plans made without one (a larger size of a graph profiled
    # before): what dynamic padding costs, in the trainer's own logs.
    values["cswap/profiled_iterations"] = int(getattr(stats, "profiled_iterations", 0))
    values["cswap/unprofiled_plans"] = int(getattr(stats, "unprofiled_plans", 0))
    return values


def budget_line(policy: str, given: Any, budget_bytes: int | None, host_given: Any = None, host_budget_bytes: int | None = None) -> str:
    """The line a callback prints when the budgets in force are known, or change.

    Args:
        policy: the runtime's policy.
        given, host_given: the ``memory_budget`` and ``host_memory_budget`` the callback was given.
        budget_bytes, host_budget_bytes: what they resolved to (``None``: no such budget, or not
            resolved yet).

    Example:
        >>> budget_line("cswap", 0.5, 94_180_000)
        "cswap: policy cswap keeps saved activations within 89.82 MiB on the device (memory_budget=0.5: that fraction of policy none's peak, as profiled)"
        >>> budget_line("swap", "2GiB", 2 << 30, "auto", 8 << 30)
        "cswap: policy swap keeps saved activations within 2048.0 MiB on the device (memory_budget='2GiB'), their host copies within 8192.0 MiB (host_memory_budget='auto')"
    """
    parts = []
    if budget_bytes:
        how = f"memory_budget={given!r}"
        if parse_budget(given) is not None and parse_budget(given).relative:  # type: ignore[union-attr]
            how += ": that fraction of policy none's peak, as profiled"
        parts.append(f"saved activations within {mib(budget_bytes)} MiB on the device ({how})")
    if host_budget_bytes:
        whose = "their host copies" if parts else "the host copies of saved activations"
        parts.append(f"{whose} within {mib(host_budget_bytes)} MiB (host_memory_budget={host_given!r})")
    return f"cswap: policy {policy} keeps " + ", ".join(parts)


class IterationScope:
    """One ``rt.iteration()`` opened by one callback call and closed by a later one.

    Example:
        >>> scope = IterationScope()
        >>> scope.is_open
        False
        >>> scope.close()                   # closing a closed scope does nothing
    """

    def __init__(self) -> None:
        self._stack: ExitStack | None = None
        self._thread: int | None = None

    @property
    def is_open(self) -> bool:
        """Whether an iteration is open."""
        return self._stack is not None

    def open(self, rt: Runtime) -> None:
        """Enter ``rt.iteration()`` on this thread.

        Raises:
            RuntimeError: one is open already (close it first).
        """
        if self._stack is not None:
            raise RuntimeError("an iteration is already open: close() it before opening the next one")
        stack = ExitStack()
        stack.enter_context(rt.iteration())
        self._stack, self._thread = stack, threading.get_ident()

    def close(self, error: BaseException | None = None) -> None:
        """Leave the open iteration, if any.

        Args:
            error: the exception that ended the step early, if one did: the runtime then drops the
                iteration's partial profile (and re-profiles the next one) instead of planning from it.

        Raises:
            RuntimeError: called on another thread than the one that opened the iteration.
            cswap.BudgetError: from a runtime with a memory budget, when the profiled iteration
                showed the policy cannot meet it (the iteration's gradients are complete).
        """
        if self._stack is None:
            return
        if threading.get_ident() != self._thread:
            raise RuntimeError(
                "the iteration was opened on another thread: saved-tensor hooks are thread-local, "
                "so the callback events that open and close it must run on the same thread"
            )
        stack, self._stack, self._thread = self._stack, None, None
        if error is None:
            stack.close()
        else:
            stack.__exit__(type(error), error, error.__traceback__)


class RuntimeHolder:
    """What every framework callback holds: the runtime's validated options, the runtime once
    training begins, the model it was made for, and the open iteration.

    Subclasses name the framework's event that makes the runtime (``_made_at``, e.g.
    ``"training begins (on_train_begin)"``) and the call that starts it (``_started_by``, e.g.
    ``"train()"``), for the error a too-early :attr:`runtime` raises.

    Example:
        >>> class Holder(RuntimeHolder):
        ...     _made_at, _started_by = "fitting begins (on_fit_start)", "fit()"
        >>> holder = Holder("swap", None, {"min_bytes": 0})
        >>> holder.policy
        'swap'
        >>> holder.runtime
        Traceback (most recent call last):
        ...
        RuntimeError: the runtime is made when fitting begins (on_fit_start): pass the callback to a Trainer and call fit() first
    """

    _made_at = "training begins"
    _started_by = "train()"

    def __init__(self, policy: str | None, memory_budget: int | str | float | None, options: dict[str, Any]) -> None:
        self._kwargs = runtime_options(policy, memory_budget, options)
        self._runtime: Runtime | None = None
        self._model: torch.nn.Module | None = None
        self._scope = IterationScope()
        self._said_budgets: tuple[int | None, int | None] = (None, None)

    def _budget_news(self) -> str | None:
        """:func:`budget_line` when the budgets in force differ from those last said (the first
        step shows them; a fraction of none's peak rises with a longer sequence), else ``None``."""
        if self._runtime is None:
            return None
        stats = self._runtime.stats()
        now = (getattr(stats, "budget_bytes", None), getattr(stats, "host_budget_bytes", None))
        if now == self._said_budgets:
            return None
        self._said_budgets = now
        return budget_line(self.policy, self._kwargs.get("memory_budget"), now[0], self._kwargs.get("host_memory_budget"), now[1])

    @property
    def policy(self) -> str:
        """The policy the runtime runs."""
        return str(self._kwargs["policy"])

    @property
    def runtime(self) -> Runtime:
        """The :class:`cswap.Runtime` (made when training begins).

        Raises:
            RuntimeError: training has not begun yet.
        """
        if self._runtime is None:
            raise RuntimeError(
                f"the runtime is made when {self._made_at}: pass the callback to a Trainer and call {self._started_by} first"
            )
        return self._runtime
