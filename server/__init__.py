"""The tuning service over the kernel-config store, and the HTTP client trainers use.

Example:
    >>> from cswap.server.app import create_app
    >>> from cswap.server.client import TuningClient
    >>> from cswap.server.spawn import spawn_service
"""
