"""``python -m cswap.train`` (what ``torchrun`` runs): the ``cswap train`` command as a module.

The flags are those of ``cswap train``; the loop itself is :mod:`cswap.training.loop`.

Example:
    $ torchrun --nproc_per_node=2 -m cswap.train --model vgg11 --device cpu
"""

from __future__ import annotations

import sys

from cswap.cli import app

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Run ``cswap train`` with ``argv`` (default: the process's arguments)."""
    app(args=["train", *(argv if argv is not None else sys.argv[1:])], prog_name="cswap.train")


if __name__ == "__main__":
    main()
