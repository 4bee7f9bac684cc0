"""Host-side compression (vDNN++): worker threads ZVC-compress host copies after they land.

``host-zvc-swap`` moves a saved tensor to the host raw, as ``swap`` does, and then compresses the
host copy off the training thread, so host memory holds the compressed bytes instead of the raw
ones. :class:`HostCodec` owns the worker threads (a small
:class:`concurrent.futures.ThreadPoolExecutor`, started at the first compression, shut down with
its owner) and nothing else: the workers only read a host copy and write freshly allocated buffers
(:func:`cswap.codecs.encode` with the Numba ``cpu`` backend, whose kernels hold no GIL), so the
arena, the counters and the stored entries stay the training thread's, touched under the
executor's lock (:meth:`cswap.execute.streams.Transfers.finish_host`).

On a GPU a worker first waits on the device-to-host copy's event (an event wait blocks that
worker, never the device); on CPU the copy has finished when the worker gets it.

A worker's failure is raised on the training thread as :class:`HostCompressionError` when its
result is collected, never turned into a raw fallback: a codec that fails is a bug to see.

Example:
    >>> codec = HostCodec(workers=1)
    >>> raw = torch.relu(torch.randn(4096))
    >>> pending = codec.submit(raw, None)
    >>> packed = HostCodec.result(pending, key=0)
    >>> packed.compressed_nbytes < raw.numel() * raw.element_size()
    True
    >>> codec.running, codec.close(), codec.running
    (True, None, False)
"""

from __future__ import annotations

import os
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from cswap.codecs import encode
from cswap.codecs.format import Packed
from cswap.codecs.launch import CpuLaunch

__all__ = ["HostCodec", "HostCompressionError", "default_workers"]


class HostCompressionError(RuntimeError):
    """A host compression worker failed; the saved tensor's raw copy was not replaced."""


def default_workers() -> int:
    """Worker threads for host compression: half the cores (the other half runs torch), 1 to 4.

    Example:
        >>> 1 <= default_workers() <= 4
        True
    """
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def _compress(raw: torch.Tensor, event: Any, launch: CpuLaunch, codec: str) -> Packed:
    """The worker's job: wait for the copy to land (GPU), then compress ``raw`` into fresh buffers."""
    if event is not None:
        event.synchronize()
    return encode(raw, backend="cpu", launch=launch, codec=codec)


class HostCodec:
    """The worker threads that compress host copies (see the module docstring).

    Args:
        workers: threads in the pool (default :func:`default_workers`).
        threads_per_job: Numba threads per compression (default 1: the workers are the parallelism,
            and one job per core leaves the training thread's cores alone).

    Attributes:
        submitted: compressions handed to the workers, ever.
    """

    def __init__(self, workers: int | None = None, threads_per_job: int = 1) -> None:
        self.workers = default_workers() if workers is None else workers
        if self.workers < 1:
            raise ValueError(f"HostCodec needs at least one worker thread, got workers={self.workers}")
        self.launch = CpuLaunch(threads=threads_per_job)
        self.submitted = 0
        self._pool: ThreadPoolExecutor | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def running(self) -> bool:
        """Whether the pool has been started and not shut down."""
        return self._pool is not None

    def submit(self, raw: torch.Tensor, event: Any, codec: str = "zvc") -> Future[Packed]:
        """Compress the flat host tensor ``raw`` with ``codec`` on a worker once ``event`` (``None``: at once) has passed.

        The caller keeps ``raw`` alive and unchanged until the future is done.
        """
        pool = self._pool
        if pool is None:
            pool = self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="cswap-host-zvc")
            # Shut down with its owner even when nobody calls close(): the pool holds no reference back.
            self._finalizer = weakref.finalize(self, pool.shutdown, wait=False)
        self.submitted += 1
        return pool.submit(_compress, raw, event, self.launch, codec)

    @staticmethod
    def result(future: Future[Packed], key: int) -> Packed:
        """``future``'s compression, waiting for it; a worker's exception becomes a :class:`HostCompressionError`."""
        try:
            return future.result()
        except BaseException as error:
            raise HostCompressionError(
                f"host compression of saved tensor key {key} failed in its worker thread: {type(error).__name__}: {error}. "
                "Its gradient would be wrong if training went on; fix the codec error above, or use policy 'swap', "
                "which keeps host copies raw."
            ) from error

    def close(self) -> None:
        """Shut the pool down, waiting for running compressions (a later :meth:`submit` starts a new one)."""
        pool, self._pool = self._pool, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if pool is not None:
            pool.shutdown(wait=True)
