"""Subcommands of the ``cswap`` command line, one module each (see :mod:`cswap.cli`)."""
