"""The tuning service over the kernel-config store, and the HTTP client trainers use.

Example:
    >>> from server.app import create_app
    >>> from server.client import TuningClient
    >>> from server.spawn import spawn_service
"""
