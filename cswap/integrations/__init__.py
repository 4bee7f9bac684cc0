"""Where people train: callbacks for the Hugging Face ``Trainer`` and Lightning, and the pieces they share.

``cswap.integrations.huggingface`` (extra ``hf``) and ``cswap.integrations.lightning`` (extra
``lightning``) import their framework when they are imported, never before, so ``import cswap``
stays light; a missing framework gives a one-line ``ImportError`` naming the extra to install.
Accelerate and hand-written loops need no callback: ``docs/integrations.md`` has the recipe.

Example:
    >>> from cswap.integrations import require
    >>> require("json", "hf", "cswap.integrations.huggingface").__name__
    'json'
"""

from __future__ import annotations

from cswap.integrations.scope import IterationScope, log_values, make_runtime, require, runtime_options

__all__ = ["IterationScope", "log_values", "make_runtime", "require", "runtime_options"]
