"""One ``rt.iteration()`` kept open across a framework's callback calls.

A framework calls a callback before the first micro-batch of an optimizer step and again before
the step; the iteration must span every micro-batch in between, so the context manager is entered
in one call and left in another. :class:`contextlib.ExitStack` holds it open. The runtime's
``saved_tensors_hooks`` are thread-local, so the window must close on the thread that opened it.

Example:
    >>> import torch, cswap
    >>> rt = cswap.Runtime("swap", device="cpu", min_bytes=0)
    >>> window = IterationWindow()
    >>> x = torch.randn(16, requires_grad=True)
    >>> window.open(rt)
    >>> for _ in range(2):  # two micro-batches, one iteration
    ...     x.exp().sum().backward()
    >>> window.close()
    >>> rt.stats().iterations, rt.stats().actions["swap"], window.is_open
    (1, 2, False)
"""

from __future__ import annotations

import threading
from contextlib import ExitStack

from cswap.runtime import Runtime

__all__ = ["IterationWindow"]


class IterationWindow:
    """Holds at most one open ``rt.iteration()``; :meth:`close` and :meth:`abort` end it."""

    def __init__(self) -> None:
        self._stack: ExitStack | None = None
        self._thread: int | None = None

    @property
    def is_open(self) -> bool:
        """Whether an iteration is open."""
        return self._stack is not None

    def open(self, runtime: Runtime) -> None:
        """Enter ``runtime.iteration()`` on this thread.

        Raises:
            RuntimeError: a window is already open (close it first), or the runtime's own error
                when another iteration of it is active.
        """
        if self._stack is not None:
            raise RuntimeError("an iteration window is already open: close() it before opening the next")
        stack = ExitStack()
        stack.enter_context(runtime.iteration())
        self._stack, self._thread = stack, threading.get_ident()

    def close(self) -> None:
        """Leave the open iteration normally (nothing happens when none is open).

        Raises:
            RuntimeError: called on another thread than the one that opened it (the hooks it
                installed are that thread's).
        """
        stack = self._take()
        if stack is not None:
            stack.close()

    def abort(self, error: BaseException) -> None:
        """Leave the open iteration as if ``error`` was raised inside it (nothing when none is open).

        The runtime then drops the iteration's profile instead of planning from a partial one.
        """
        stack = self._take()
        if stack is not None:
            stack.__exit__(type(error), error, error.__traceback__)

    def _take(self) -> ExitStack | None:
        if self._stack is not None and self._thread != threading.get_ident():
            raise RuntimeError(
                "the cswap iteration was opened on another thread: saved_tensors_hooks are thread-local, "
                "so run the training step and its callbacks on one thread"
            )
        stack, self._stack, self._thread = self._stack, None, None
        return stack
