"""Where cswap keeps what it learns about a machine: ``$CSWAP_HOME``, else the user cache directory.

Example:
    >>> import os
    >>> os.environ["CSWAP_HOME"] = "/tmp/cswap-example"
    >>> str(cswap_home())
    '/tmp/cswap-example'
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cswap_home"]


def cswap_home() -> Path:
    """The directory for the config store and cached device facts, created if missing.

    ``$CSWAP_HOME`` when set, else ``$XDG_CACHE_HOME/cswap``, else ``~/.cache/cswap``.
    """
    root = os.environ.get("CSWAP_HOME")
    if root:
        path = Path(root)
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(cache) / "cswap"
    path.mkdir(parents=True, exist_ok=True)
    return path
