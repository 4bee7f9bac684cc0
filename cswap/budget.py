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
import re
import warnings
from dataclasses import dataclass

__all__ = ["BudgetError", "MemoryBudget", "ResolvedBudget", "format_bytes", "parse_budget", "warn_if_over_device"]

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


class BudgetError(ValueError):
    """A policy cannot keep the saved activations within the memory budget.

    Attributes:
        minimum_bytes: the least budget this policy can meet on this model.
        policy: the policy.
        budget_bytes: the budget asked for.
        why: why the least is what it is, where that needs saying (more than plain PyTorch holds).
        none_peak_bytes: policy ``none``'s peak on the profile, when known: the message then gives
            both budgets as fractions of it, and :attr:`minimum_fraction` is set.
        advice: what else lowers the least, as the message's last clause (default: a policy with
            more actions).

    Example:
        >>> error = BudgetError(minimum_bytes=3 << 20, policy="swap", budget_bytes=1 << 20)
        >>> error.minimum_bytes, isinstance(error, ValueError)
        (3145728, True)
        >>> print(error)  # doctest: +NORMALIZE_WHITESPACE
        policy swap cannot keep saved activations within the memory budget of 1.00 MiB (1048576 bytes):
        it needs at least 3.00 MiB (3145728 bytes). Raise the budget to at least 3145728 bytes, or use a
        policy with more actions (cswap allows keep, swap, zvc-swap, zvc-keep and, given the model, recompute).
    """

    def __init__(self, minimum_bytes: int, policy: str, budget_bytes: int, why: str = "",
                 none_peak_bytes: int | None = None, advice: str | None = None) -> None:
        self.minimum_bytes = int(minimum_bytes)
        self.policy = policy
        self.budget_bytes = int(budget_bytes)
        self.why = why
        self.none_peak_bytes = none_peak_bytes
        self.advice = advice
        if advice is None:
            actions = "keep, swap, zvc-swap, zvc-keep and, given the model, recompute"
            advice = (f" (cswap already has every action: {actions})" if policy == "cswap"
                      else f", or use a policy with more actions (cswap allows {actions})")
        super().__init__(
            f"policy {policy} cannot keep saved activations within the memory budget of "
            f"{format_bytes(budget_bytes)}{self._share(self.budget_bytes)}: it needs at least {format_bytes(minimum_bytes)}"
            f"{self._share(self.minimum_bytes)}. Raise the budget to at least {self.minimum_bytes} bytes"
            f"{self._least_fraction()}{advice}." + (f" {why}" if why else "")
        )

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
        # rounded up, so that the fraction given back resolves to at least the minimum
        return f" (memory_budget={math.ceil(fraction * 1000) / 1000:g} as a fraction)"

    def __reduce__(self) -> tuple[type, tuple[int, str, int, str, int | None, str | None]]:
        return (type(self), (self.minimum_bytes, self.policy, self.budget_bytes, self.why, self.none_peak_bytes, self.advice))
