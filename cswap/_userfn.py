"""Load a user's ``"package.module:function"`` and call it with the keyword arguments it accepts.

:func:`cswap.models.build` and :func:`cswap.training.data.build_dataset` take such a spec so that a user's own
model or dataset plugs into ``cswap train`` without registering anything.

Example:
    >>> dedent = load_callable("textwrap:dedent", what="function")
    >>> call_accepting(dedent, {"text": "  x", "num_classes": 1000}, defaults={"num_classes": 1000}, what="dedent")
    'x'
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["call_accepting", "is_spec", "load_callable"]


def is_spec(name: str) -> bool:
    """True when ``name`` looks like ``"package.module:function"`` rather than a built-in name."""
    module, sep, attribute = name.partition(":")
    return bool(sep and module and attribute)


def load_callable(spec: str, what: str) -> Callable[..., Any]:
    """Import ``"package.module:function"`` (the part after ``:`` may be dotted, e.g. ``Class.create``).

    Args:
        spec: the import path.
        what: what the callable builds (``"model"``, ``"dataset"``), used in error messages.

    Raises:
        ValueError: the module cannot be imported, has no such attribute, or it is not callable.
    """
    if not is_spec(spec):
        raise ValueError(f"{what} spec {spec!r} is not of the form 'package.module:function'")
    module_name, _, attribute_path = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(
            f"cannot import module {module_name!r} for {what} {spec!r}: {error}; "
            "check the spelling and that the module is on PYTHONPATH"
        ) from error
    for part in attribute_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as error:
            raise ValueError(
                f"module {module_name!r} has no attribute {attribute_path!r} (wanted for {what} {spec!r})"
            ) from error
    if not callable(obj):
        raise ValueError(f"{what} spec {spec!r} names a {type(obj).__name__}, not a function")
    return obj


def call_accepting(
    fn: Callable[..., Any], kwargs: Mapping[str, Any], defaults: Mapping[str, Any], what: str
) -> Any:
    """Call ``fn`` with those of ``kwargs`` that its signature accepts.

    An argument ``fn`` does not accept is dropped; a warning names it unless its value equals the
    caller's default (e.g. ``num_classes=1000`` passed to a function that fixes its own head).

    Args:
        fn: the user's function.
        kwargs: every argument the caller would like to pass.
        defaults: the caller's default values, whose silent dropping is expected.
        what: the spec, for the warning.
    """
    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return fn(**kwargs)
    accepted = {
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    dropped = [k for k in kwargs if k not in accepted and not (k in defaults and kwargs[k] == defaults[k])]
    if dropped:
        warnings.warn(
            f"{what} does not accept {', '.join(sorted(dropped))}; ignoring "
            f"(it accepts: {', '.join(sorted(accepted)) or 'no keyword arguments'})",
            stacklevel=3,
        )
    return fn(**{k: v for k, v in kwargs.items() if k in accepted})
