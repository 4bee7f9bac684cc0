"""Where cswap reads its shipped configs and keeps what it learns about a machine.

The shipped configs (runtime defaults, hardware profiles, search spaces, recipes) are the
``configs/`` directory of a checkout or editable install; a wheel installs the same files as
``cswap/_configs``. What cswap learns (config store, device facts) goes to ``$CSWAP_HOME``, else
the user cache directory.

Example:
    >>> import os
    >>> os.environ["CSWAP_HOME"] = "/tmp/cswap-example"
    >>> str(cswap_home())
    '/tmp/cswap-example'
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cswap_home", "shipped_configs_dir"]


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


def shipped_configs_dir() -> Path:
    """The directory of cswap's shipped YAML configs.

    ``configs/`` next to the package in a checkout or editable install, else ``cswap/_configs``
    inside an installed wheel.

    Example:
        >>> (shipped_configs_dir() / "default.yaml").is_file()
        True
    """
    package = Path(__file__).resolve().parent
    source = package.parent / "configs"
    if (source / "default.yaml").is_file():
        return source
    return package / "_configs"
