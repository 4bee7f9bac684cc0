"""Importing an optional framework, with a one-line message naming the extra that installs it.

Example:
    >>> require("math", "hf").pi > 3
    True
    >>> require("no_such_framework", "hf")
    Traceback (most recent call last):
    ...
    ImportError: no_such_framework is not installed; cswap's integration needs it: pip install 'cswap[hf]'
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, extra: str) -> ModuleType:
    """Import ``module``, or raise a one-line ``ImportError`` naming ``pip install 'cswap[extra]'``.

    Args:
        module: the framework's module, e.g. ``transformers``.
        extra: the cswap extra that installs it, e.g. ``hf``.

    Raises:
        ImportError: ``module`` cannot be imported (not installed, or blocked in ``sys.modules``).
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        # `from None`: the framework's own traceback says nothing the user can act on.
        raise ImportError(f"{module} is not installed; cswap's integration needs it: pip install 'cswap[{extra}]'") from None
