"""Memory budgets: every accepted form, every rejected one with its message, and BudgetError."""

from __future__ import annotations

import pickle
import warnings

import pytest

import cswap
from cswap.budget import BudgetError, MemoryBudget, ResolvedBudget, parse_budget, warn_if_over_device


@pytest.mark.parametrize(
    "value, nbytes",
    [
        (4096, 4096),
        ("512MiB", 512 * 2**20),
        ("2GiB", 2 * 2**30),
        ("2gib", 2 * 2**30),
        ("1.5GB", 1_500_000_000),
        ("1.5 gb", 1_500_000_000),
        ("100kB", 100_000),
        ("3KiB", 3072),
        ("1Ti", 2**40),
        ("7b", 7),
        ("1000B", 1000),
        ("1048576", 2**20),
        ("2e9", 2_000_000_000),
    ],
)
def test_absolute_forms(value, nbytes):
    budget = parse_budget(value)
    assert budget == MemoryBudget(nbytes=nbytes) and not budget.relative
    assert budget.resolve() == nbytes and budget.resolve(none_peak_bytes=1) == nbytes


@pytest.mark.parametrize("value, fraction", [(0.5, 0.5), (1.0, 1.0), ("0.25", 0.25), (1e-3, 1e-3)])
def test_fractions_resolve_against_none_peak(value, fraction):
    budget = parse_budget(value)
    assert budget == MemoryBudget(fraction=fraction) and budget.relative
    assert budget.resolve(none_peak_bytes=10_000) == int(fraction * 10_000)


def test_none_and_budget_pass_through():
    budget = MemoryBudget(nbytes=10)
    assert parse_budget(None) is None and parse_budget(budget) is budget


@pytest.mark.parametrize(
    "value, reason",
    [
        (0, "bytes must be positive"),
        (-5, "bytes must be positive"),
        (0.0, "a float must be a fraction in (0, 1]"),
        (-0.5, "a float must be a fraction in (0, 1]"),
        (1.5, "a float must be a fraction in (0, 1]"),
        (float("nan"), "a float must be a fraction in (0, 1]"),
        (float("inf"), "a float must be a fraction in (0, 1]"),
        (True, "a bool is not a budget"),
        ("12 parsecs", "unknown unit 'parsecs'"),
        ("lots", "cannot read it"),
        ("-1GiB", "cannot read it"),
        ("0GiB", "it is zero bytes"),
        ("1.5", "a float must be a fraction in (0, 1]"),
        ("2", "a bare number above 1 is bytes, and 2 bytes of activations is almost certainly not meant"),
        ("1048575", "a bare number above 1 is bytes"),
        ([1], "a list is not a budget"),
    ],
)
def test_bad_values_name_the_value_and_the_forms(value, reason):
    with pytest.raises(ValueError) as caught:
        parse_budget(value)
    message = str(caught.value)
    assert message.startswith(f"memory budget {value!r} is not valid: {reason}")
    assert "accepted forms: None (no budget), a positive int of bytes, a string with a unit" in message


def test_fraction_needs_the_peak():
    with pytest.raises(ValueError, match="fraction of policy none's activation peak, which needs a profile"):
        MemoryBudget(fraction=0.5).resolve()


def test_budget_needs_exactly_one_form():
    with pytest.raises(ValueError, match="exactly one of nbytes and fraction"):
        MemoryBudget()
    with pytest.raises(ValueError, match="exactly one of nbytes and fraction"):
        MemoryBudget(nbytes=1, fraction=0.5)


def test_budget_error_states_minimum_and_fix():
    error = BudgetError(minimum_bytes=5 << 30, policy="compress-keep", budget_bytes=2 << 30)
    assert isinstance(error, ValueError)
    assert (error.minimum_bytes, error.policy, error.budget_bytes) == (5 << 30, "compress-keep", 2 << 30)
    message = str(error)
    assert "policy compress-keep cannot keep saved activations within the memory budget of 2.00 GiB" in message
    assert "it needs at least 5.00 GiB (5368709120 bytes)" in message
    assert "Raise the budget to at least 5368709120 bytes, or use a policy with more actions" in message
    assert "given the model, recompute" in message
    again = pickle.loads(pickle.dumps(error))
    assert again.minimum_bytes == error.minimum_bytes and str(again) == message


def test_budget_error_of_cswap_suggests_no_other_policy():
    message = str(BudgetError(minimum_bytes=5 << 30, policy="cswap", budget_bytes=2 << 30))
    assert "Raise the budget to at least 5368709120 bytes (cswap already has every action:" in message
    assert "use a policy" not in message


def test_exported_lazily_from_cswap():
    assert cswap.BudgetError is BudgetError and "BudgetError" in cswap.__all__


def test_a_budget_is_weighed_against_the_devices_memory_only_when_known() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_over_device(2**40, 0, "cpu") is False  # memory not known: silent
        assert warn_if_over_device(80 * 2**30, 80 * 2**30, "cuda:0") is False  # all of it: allowed
    with pytest.warns(UserWarning, match=r"1024\.00 GiB \(1099511627776 bytes\) is more than the 80\.00 GiB .* device cuda:0"):
        assert warn_if_over_device(parse_budget("1TiB").nbytes, 80 * 2**30, "cuda:0") is True


def test_a_resolved_budget_reads_as_bytes_and_a_share_of_nones_peak() -> None:
    resolved = ResolvedBudget(parse_budget("1 GB"), 10**9, none_peak_bytes=4 * 10**9)
    assert resolved.fraction_of_none == 0.25 and ResolvedBudget(parse_budget("1 GB"), 10**9).fraction_of_none is None
    assert str(resolved) == "memory budget 953.67 MiB (1000000000 bytes), 0.250 of policy none's activation peak of 3.73 GiB (4000000000 bytes)"
