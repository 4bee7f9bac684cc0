"""The memory budget: how many bytes of saved activations a run may keep on the device.

A budget is given as ``None`` (no budget), an int (bytes), a string with a unit (``"512MiB"``,
``"2GiB"``, ``"1.5GB"``: binary and SI units, any case), or a float in (0, 1]: that fraction of
the activation peak policy ``none`` would have, known once a profile gives it. :func:`parse_budget`
turns any of these into a :class:`MemoryBudget`; :meth:`MemoryBudget.resolve` gives the bytes.

Units are read as written: ``GB`` is 10^9 bytes, ``GiB`` 2^30. Once a profile gives policy
``none``'s peak, :class:`ResolvedBudget` says what the budget came to, in bytes and as a fraction of
that peak; :func:`warn_if_over_device` warns of a budget larger than the device's memory, which can
never bind. When a policy cannot meet a budget, :class:`BudgetError` says the least budget it can meet.

Example:
    >>> parse_budget("2GiB").resolve(none_peak_bytes=10 << 30)
    2147483648
    >>> parse_budget(0.5).resolve(none_peak_bytes=1000)
    500
    >>> parse_budget(None) is None
    True
"""

from __future__ import annotations

import math
import os
import re
import warnings
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HOST_AUTO_SHARE",
    "BudgetError",
    "HostBudget",
    "MemoryBudget",
    "ResolvedBudget",
    "format_bytes",
    "host_memory_limit_bytes",
    "parse_budget",
    "parse_host_budget",
    "warn_if_over_device",
]

#: The least bare number a string may give as bytes: below it, a missing unit is the likelier story.
_LEAST_BARE_BYTES = 1 << 20

_FORMS = (
    "accepted forms: None (no budget), a positive int of bytes, a string with a unit "
    "(e.g. '512MiB', '2GiB', '1.5GB'; units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB, Ki, Mi, Gi, Ti, any case), "
    "or a float in (0, 1] = that fraction of policy none's activation peak"
)

_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}

_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def format_bytes(nbytes: float) -> str:
    """``nbytes`` in MiB or GiB for messages.

    Example:
        >>> format_bytes(3 << 29)
        '1.50 GiB (1610612736 bytes)'
    """
    scaled = nbytes / 2**30
    text = f"{scaled:.2f} GiB" if scaled >= 1 else f"{nbytes / 2**20:.2f} MiB"
    return f"{text} ({int(nbytes)} bytes)"


@dataclass(frozen=True)
class MemoryBudget:
    """A memory budget, absolute or relative to policy ``none``'s activation peak.

    Exactly one of the two is set.

    Attributes:
        nbytes: the budget in bytes.
        fraction: the budget as a fraction in (0, 1] of ``none``'s activation peak.

    Example:
        >>> MemoryBudget(fraction=0.25).resolve(none_peak_bytes=4096)
        1024
        >>> str(MemoryBudget(nbytes=1 << 20))
        '1.00 MiB (1048576 bytes)'
    """

    nbytes: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        if (self.nbytes is None) == (self.fraction is None):
            raise ValueError(f"a MemoryBudget needs exactly one of nbytes and fraction, got {self!r}")
        if self.nbytes is not None and (isinstance(self.nbytes, bool) or not isinstance(self.nbytes, int) or self.nbytes <= 0):
            raise ValueError(f"memory budget {self.nbytes!r} bytes is not a positive int; {_FORMS}")
        if self.fraction is not None and not (isinstance(self.fraction, float) and 0.0 < self.fraction <= 1.0):
            raise ValueError(f"memory budget fraction {self.fraction!r} is not in (0, 1]; {_FORMS}")

    @property
    def relative(self) -> bool:
        """Whether the bytes depend on a profile (a fraction of ``none``'s peak)."""
        return self.fraction is not None

    def resolve(self, none_peak_bytes: int | None = None) -> int:
        """The budget in bytes.

        Args:
            none_peak_bytes: policy ``none``'s activation peak, needed for a fractional budget.

        Raises:
            ValueError: a fractional budget without ``none_peak_bytes`` (or with a non-positive one).
        """
        if self.nbytes is not None:
            return self.nbytes
        if none_peak_bytes is None or none_peak_bytes <= 0:
            raise ValueError(
                f"memory budget {self.fraction} is a fraction of policy none's activation peak, "
                f"which needs a profile: got none_peak_bytes={none_peak_bytes!r}"
            )
        return max(1, math.floor(self.fraction * none_peak_bytes))

    def __str__(self) -> str:
        if self.nbytes is not None:
            return format_bytes(self.nbytes)
        return f"{self.fraction:g} of none's peak"


@dataclass(frozen=True)
class ResolvedBudget:
    """A memory budget as a run resolved it: its bytes, beside policy ``none``'s activation peak.

    Attributes:
        given: the budget as given.
        nbytes: the bytes it resolved to.
        none_peak_bytes: policy ``none``'s activation peak on the profile it was resolved on
            (``None`` when unknown).

    Example:
        >>> resolved = ResolvedBudget(parse_budget("1 GB"), 10**9, none_peak_bytes=4 * 10**9)
        >>> resolved.fraction_of_none
        0.25
        >>> print(resolved)
        memory budget 953.67 MiB (1000000000 bytes), 0.250 of policy none's activation peak of 3.73 GiB (4000000000 bytes)
        >>> print(ResolvedBudget(parse_budget(0.3), 300, none_peak_bytes=1000))
        memory budget 0.3 of policy none's activation peak of 0.00 MiB (1000 bytes): 0.00 MiB (300 bytes)
    """

    given: MemoryBudget
    nbytes: int
    none_peak_bytes: int | None = None

    @property
    def fraction_of_none(self) -> float | None:
        """The budget as a fraction of policy ``none``'s peak (``None`` when that peak is unknown)."""
        return self.nbytes / self.none_peak_bytes if self.none_peak_bytes else None

    def __str__(self) -> str:
        peak = "policy none's activation peak"
        if self.none_peak_bytes:
            peak += f" of {format_bytes(self.none_peak_bytes)}"
        if self.given.fraction is not None:
            return f"memory budget {self.given.fraction:g} of {peak}: {format_bytes(self.nbytes)}"
        share = f", {self.fraction_of_none:.3f} of {peak}" if self.none_peak_bytes else ""
        if self.none_peak_bytes and self.nbytes >= self.none_peak_bytes:
            share += " (no less than plain PyTorch holds: it limits nothing)"
        return f"memory budget {format_bytes(self.nbytes)}{share}"


def warn_if_over_device(budget_bytes: int, device_memory_bytes: int | None, device: str, stacklevel: int = 2) -> bool:
    """Warn (``UserWarning``) when a budget is more than the device's memory, and say whether it did.

    Saved activations cannot pass the device's memory, so such a budget never binds: a unit mistaken
    (``"1TiB"`` for ``"1GiB"``) is the likelier story. ``device_memory_bytes`` is the GPU's total
    memory on CUDA, the host's physical memory on CPU (where the activations live); ``None`` or 0
    (not known) never warns.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_if_over_device(2**40, 80 * 2**30, "cuda:0")
        True
        >>> print(caught[0].message)  # doctest: +ELLIPSIS
        memory budget 1024.00 GiB (1099511627776 bytes) is more than the 80.00 GiB (85899345920 bytes) of memory of device cuda:0: ...
    """
    if not device_memory_bytes or budget_bytes <= device_memory_bytes:
        return False
    warnings.warn(
        f"memory budget {format_bytes(budget_bytes)} is more than the {format_bytes(device_memory_bytes)} of memory of "
        f"device {device}: saved activations can never reach it, so it limits nothing (GB is 10^9 bytes, GiB 2^30); "
        "give a budget the device holds, or a fraction of policy none's peak such as 0.5",
        UserWarning,
        stacklevel=stacklevel + 1,
    )
    return True


def parse_budget(value: object) -> MemoryBudget | None:
    """Read a memory budget in any accepted form.

    Args:
        value: ``None``, ``MemoryBudget``, int bytes, a string with a unit, or a float in (0, 1].
            A string holding a bare number, as a command line gives it, is a fraction when it is at
            most 1 (``"0.5"``) and bytes when it is a whole number of at least 1 MiB (``"2e9"``); a
            bare number between them (``"2"``) is refused as a likely mistake.

    Raises:
        ValueError: naming the value and the accepted forms (0, negative, a float above 1, NaN,
            inf, a bool, an unknown unit or an unreadable string).

    Example:
        >>> parse_budget("1.5GB").nbytes, parse_budget("512 mib").nbytes, parse_budget(4096).nbytes
        (1500000000, 536870912, 4096)
        >>> parse_budget(1.5)
        Traceback (most recent call last):
        ...
        ValueError: memory budget 1.5 is not valid: a float must be a fraction in (0, 1]; accepted forms: ...
    """
    if value is None or isinstance(value, MemoryBudget):
        return value
    if isinstance(value, bool):
        raise ValueError(f"memory budget {value!r} is not valid: a bool is not a budget; {_FORMS}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"memory budget {value!r} is not valid: bytes must be positive; {_FORMS}")
        return MemoryBudget(nbytes=value)
    if isinstance(value, float):
        if not (0.0 < value <= 1.0):  # also NaN
            raise ValueError(f"memory budget {value!r} is not valid: a float must be a fraction in (0, 1]; {_FORMS}")
        return MemoryBudget(fraction=value)
    if isinstance(value, str):
        match = _PATTERN.match(value)
        if match is None:
            raise ValueError(f"memory budget {value!r} is not valid: cannot read it; {_FORMS}")
        number, unit = match.group(1), match.group(2).lower()
        if not unit:
            amount = float(number)
            if amount > 1.0 and amount.is_integer():
                if amount < _LEAST_BARE_BYTES:
                    raise ValueError(
                        f"memory budget {value!r} is not valid: a bare number above 1 is bytes, and {int(amount)} bytes of "
                        f"activations is almost certainly not meant: give a fraction in (0, 1] such as 0.5, or a number with "
                        f"a unit such as 2GiB ('{int(amount)}B' for exactly {int(amount)} bytes); {_FORMS}"
                    )
                return MemoryBudget(nbytes=int(amount))
            if not 0.0 < amount <= 1.0:
                raise ValueError(f"memory budget {value!r} is not valid: a float must be a fraction in (0, 1]; {_FORMS}")
            return MemoryBudget(fraction=amount)
        if unit not in _UNITS:
            raise ValueError(f"memory budget {value!r} is not valid: unknown unit {match.group(2)!r}; {_FORMS}")
        nbytes = round(float(number) * _UNITS[unit])
        if nbytes <= 0:
            raise ValueError(f"memory budget {value!r} is not valid: it is zero bytes; {_FORMS}")
        return MemoryBudget(nbytes=nbytes)
    raise ValueError(f"memory budget {value!r} is not valid: a {type(value).__name__} is not a budget; {_FORMS}")


#: The share of what the process may use that a host budget of ``"auto"`` takes: the rest is left to
#: the model, the optimiser, the data loader and the Python heap, which live in host memory too.
HOST_AUTO_SHARE = 0.5

_HOST_FORMS = (
    "accepted forms: None (no host budget), a positive int of bytes, a string with a unit "
    "(e.g. '8GiB', '512MiB', '16GB'), or 'auto' (a share of the cgroup memory limit if one is set, else of the available RAM)"
)

#: Where a cgroup states the process's memory limit: v2, then v1 ("max" or a huge number: none).
_CGROUP_LIMIT_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def _read_first_line(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.readline().strip()
    except OSError:
        return None


def host_memory_limit_bytes(cgroup_files: tuple[str, ...] = _CGROUP_LIMIT_FILES, meminfo: str = "/proc/meminfo") -> tuple[int, str]:
    """What this process may use of host memory, and where that figure comes from.

    The cgroup's memory limit when one is set (v2 ``memory.max``, else v1 ``memory.limit_in_bytes``:
    a container's limit, which the kernel enforces by killing the process), else the RAM available
    now (``MemAvailable`` in ``/proc/meminfo``), else the physical memory.

    Example:
        >>> nbytes, source = host_memory_limit_bytes()
        >>> nbytes > 0 and source.split()[0] in ("cgroup", "available", "physical")
        True
    """
    for path in cgroup_files:
        text = _read_first_line(path)
        if text and text.isdigit() and 0 < int(text) < 1 << 60:  # v1 states "no limit" as a huge number
            return int(text), f"cgroup limit ({path})"
    try:
        with open(meminfo) as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, f"available RAM ({meminfo})"
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory"
    except (ValueError, OSError, AttributeError):
        raise OSError("cannot tell how much host memory this process may use (no cgroup limit, no /proc/meminfo, "
                      "no sysconf): give host_memory_budget in bytes, e.g. '8GiB'") from None


@dataclass(frozen=True)
class HostBudget:
    """A host memory budget: the most bytes of saved activations' host copies (raw or compressed)
    held on the host at once.

    Attributes:
        nbytes: the budget in bytes.
        auto: it was given as ``"auto"``: :data:`HOST_AUTO_SHARE` of :func:`host_memory_limit_bytes`.
        source: where the bytes of an ``"auto"`` budget come from (``""`` otherwise).

    Example:
        >>> HostBudget(nbytes=1 << 30).resolve()
        1073741824
        >>> str(HostBudget(nbytes=1 << 30))
        'host memory budget 1.00 GiB (1073741824 bytes)'
    """

    nbytes: int
    auto: bool = False
    source: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.nbytes, bool) or not isinstance(self.nbytes, int) or self.nbytes <= 0:
            raise ValueError(f"host memory budget {self.nbytes!r} bytes is not a positive int; {_HOST_FORMS}")

    def resolve(self) -> int:
        """The budget in bytes (a host budget never depends on a profile)."""
        return self.nbytes

    def __str__(self) -> str:
        given = f" ('auto': {HOST_AUTO_SHARE:g} of the {self.source})" if self.auto else ""
        return f"host memory budget {format_bytes(self.nbytes)}{given}"


def parse_host_budget(value: object, limit: tuple[int, str] | None = None) -> HostBudget | None:
    """Read a host memory budget: ``None``, a :class:`HostBudget`, int bytes, a string with a unit,
    or ``"auto"``.

    A fraction is refused: the device budget's fractions are of policy ``none``'s peak, and a
    host budget is a share of the machine, which ``"auto"`` states.

    Args:
        value: the budget as given.
        limit: ``(bytes, source)`` of what the process may use, for ``"auto"`` (default:
            :func:`host_memory_limit_bytes`, read now).

    Raises:
        ValueError: naming the value and the accepted forms.

    Example:
        >>> parse_host_budget("8GiB").nbytes, parse_host_budget(4096).nbytes
        (8589934592, 4096)
        >>> parse_host_budget("auto", limit=(16 << 30, "cgroup limit")).nbytes == 8 << 30
        True
        >>> parse_host_budget(0.5)
        Traceback (most recent call last):
        ...
        ValueError: host memory budget 0.5 is not valid: a host budget is not a fraction of policy none's peak; accepted forms: ...
    """
    if value is None or isinstance(value, HostBudget):
        return value
    if isinstance(value, str) and value.strip().lower() == "auto":
        nbytes, source = limit if limit is not None else host_memory_limit_bytes()
        return HostBudget(nbytes=max(1, math.floor(HOST_AUTO_SHARE * nbytes)), auto=True, source=source)
    if isinstance(value, float) or (isinstance(value, str) and _PATTERN.match(value) and not _PATTERN.match(value).group(2)
                                    and float(_PATTERN.match(value).group(1)) <= 1.0):
        raise ValueError(f"host memory budget {value!r} is not valid: a host budget is not a fraction of policy none's peak; "
                         f"{_HOST_FORMS}")
    try:
        parsed = parse_budget(value)
    except ValueError as error:
        raise ValueError(f"host {error}".replace(_FORMS, _HOST_FORMS)) from None
    assert parsed is not None and parsed.nbytes is not None  # fractions were refused above
    return HostBudget(nbytes=parsed.nbytes)


class BudgetError(ValueError):
    """A policy cannot keep the saved activations within the memory budget (or, given one, within
    the device and the host budgets together).

    Attributes:
        minimum_bytes: the least device budget this policy can meet on this model (within the host
            budget, when one is given).
        policy: the policy.
        budget_bytes: the device budget asked for.
        why: why the least is what it is, where that needs saying (more than plain PyTorch holds).
        none_peak_bytes: policy ``none``'s peak on the profile, when known: the message then gives
            both budgets as fractions of it, and :attr:`minimum_fraction` is set.
        advice: what else lowers the least, as the message's last clause (default: a policy with
            more actions).
        host_budget_bytes: the host memory budget asked for (``None``: none).
        host_minimum_bytes: the least host budget the policy meets within the device budget
            (``None``: no host budget, or none does: the device budget binds on its own).
        binding: which budget binds, ``"device"`` or ``"host"``: ``"host"`` when the device budget
            alone could be met, but not with the host budget beside it.

    Example:
        >>> error = BudgetError(minimum_bytes=3 << 20, policy="swap", budget_bytes=1 << 20)
        >>> error.minimum_bytes, isinstance(error, ValueError), error.binding
        (3145728, True, 'device')
        >>> print(error)  # doctest: +NORMALIZE_WHITESPACE
        policy swap cannot keep saved activations within the memory budget of 1.00 MiB (1048576 bytes):
        it needs at least 3.00 MiB (3145728 bytes). Raise the budget to at least 3145728 bytes, or use a
        policy with more actions (cswap allows keep, swap, zvc-swap, zvc-keep and, given the model, recompute).
        >>> error = BudgetError(3 << 20, "swap", 2 << 20, host_budget_bytes=1 << 20, host_minimum_bytes=2 << 20, binding="host")
        >>> print(error)  # doctest: +NORMALIZE_WHITESPACE
        policy swap cannot keep saved activations within both the device memory budget of 2.00 MiB (2097152 bytes)
        and the host memory budget of 1.00 MiB (1048576 bytes): the host budget binds. Within the device budget it
        needs a host budget of at least 2.00 MiB (2097152 bytes); within the host budget it needs a device budget of
        at least 3.00 MiB (3145728 bytes). Raise the host budget to at least 2097152 bytes, or the device budget to
        at least 3145728 bytes, or use a policy with more actions (cswap allows keep, swap, zvc-swap, zvc-keep and,
        given the model, recompute).
    """

    def __init__(self, minimum_bytes: int, policy: str, budget_bytes: int, why: str = "",
                 none_peak_bytes: int | None = None, advice: str | None = None, host_budget_bytes: int | None = None,
                 host_minimum_bytes: int | None = None, binding: str = "device") -> None:
        if binding not in ("device", "host"):
            raise ValueError(f"binding must be 'device' or 'host', got {binding!r}")
        self.minimum_bytes = int(minimum_bytes)
        self.policy = policy
        self.budget_bytes = int(budget_bytes)
        self.why = why
        self.none_peak_bytes = none_peak_bytes
        self.advice = advice
        self.host_budget_bytes = None if host_budget_bytes is None else int(host_budget_bytes)
        self.host_minimum_bytes = None if host_minimum_bytes is None else int(host_minimum_bytes)
        self.binding = binding
        if advice is None:
            actions = "keep, swap, zvc-swap, zvc-keep and, given the model, recompute"
            advice = (f" (cswap already has every action: {actions})" if policy == "cswap"
                      else f", or use a policy with more actions (cswap allows {actions})")
        tail = f"{advice}." + (f" {why}" if why else "")
        device = f"{format_bytes(budget_bytes)}{self._share(self.budget_bytes)}"
        least = f"{format_bytes(minimum_bytes)}{self._share(self.minimum_bytes)}"
        if self.host_budget_bytes is None:
            message = (f"policy {policy} cannot keep saved activations within the memory budget of {device}: it needs at least "
                       f"{least}. Raise the budget to at least {self.minimum_bytes} bytes{self._least_fraction()}{tail}")
        elif binding == "host":
            host_least = self.host_minimum_bytes if self.host_minimum_bytes is not None else 0
            message = (f"policy {policy} cannot keep saved activations within both the device memory budget of {device} and the "
                       f"host memory budget of {format_bytes(self.host_budget_bytes)}: the host budget binds. Within the device "
                       f"budget it needs a host budget of at least {format_bytes(host_least)}; within the host budget it needs a "
                       f"device budget of at least {least}. Raise the host budget to at least {host_least} bytes, or the device "
                       f"budget to at least {self.minimum_bytes} bytes{self._least_fraction()}{tail}")
        else:
            host = (f" (and then a host budget of at least {self.host_minimum_bytes} bytes)"
                    if self.host_minimum_bytes is not None and self.host_minimum_bytes > self.host_budget_bytes else "")
            message = (f"policy {policy} cannot keep saved activations within the device memory budget of {device} (beside the "
                       f"host memory budget of {format_bytes(self.host_budget_bytes)}): the device budget binds. It needs a device "
                       f"budget of at least {least}. Raise the device budget to at least {self.minimum_bytes} bytes"
                       f"{self._least_fraction()}{host}{tail}")
        super().__init__(message)

    @property
    def minimum_fraction(self) -> float | None:
        """The least budget as a fraction of policy ``none``'s peak (``None`` when that peak is not known)."""
        if not self.none_peak_bytes:
            return None
        return self.minimum_bytes / self.none_peak_bytes

    def _share(self, nbytes: int) -> str:
        return f", {nbytes / self.none_peak_bytes:.2f} of policy none's peak" if self.none_peak_bytes else ""

    def _least_fraction(self) -> str:
        fraction = self.minimum_fraction
        if fraction is None:
            return ""
        if fraction > 1.0:
            # a fraction is at most 1, and at 1 a run profiles keeping every tensor, which every policy holds
            return " (above none's peak: memory_budget=1.0, a fraction, holds instead)"
        # rounded up, so that the fraction given back resolves to at least the minimum
        return f" (memory_budget={math.ceil(fraction * 1000) / 1000:g} as a fraction)"

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return (type(self), (self.minimum_bytes, self.policy, self.budget_bytes, self.why, self.none_peak_bytes, self.advice,
                             self.host_budget_bytes, self.host_minimum_bytes, self.binding))
