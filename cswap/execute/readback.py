"""Readback slots for compressions whose size the host learns later (:func:`cswap.codecs.encode_unsized`).

Each compression in flight needs two int64 of host memory for its count to land in. On a GPU
they must be pinned for the copy to be asynchronous, and pinning memory inside a pack hook would
synchronise the device, so the slots are allocated once, with the executor, and reused.

Example:
    >>> slots = ReadbackSlots(2, pin_memory=False)
    >>> a, b = slots.take(), slots.take()
    >>> slots.take() is None, slots.free
    (True, 0)
    >>> slots.give(a); slots.free
    1
"""

from __future__ import annotations

import torch

__all__ = ["READBACK_SLOTS", "ReadbackSlots"]

#: Compressions whose size may be in flight at once; one more waits for the oldest.
READBACK_SLOTS = 256


class ReadbackSlots:
    """A fixed pool of 2-element int64 host buffers.

    Args:
        count: how many slots.
        pin_memory: page-locked (for asynchronous device-to-host copies).
    """

    def __init__(self, count: int = READBACK_SLOTS, pin_memory: bool = False) -> None:
        self._buffer = torch.zeros((count, 2), dtype=torch.int64, pin_memory=pin_memory)
        self._free = list(range(count - 1, -1, -1))

    @property
    def free(self) -> int:
        """Slots not taken."""
        return len(self._free)

    def take(self) -> torch.Tensor | None:
        """A free slot (a view of 2 elements), or ``None`` when every slot is taken."""
        if not self._free:
            return None
        return self._buffer[self._free.pop()]

    def give(self, slot: torch.Tensor) -> None:
        """Return ``slot`` (from :meth:`take`) to the pool."""
        index = (slot.data_ptr() - self._buffer.data_ptr()) // self._buffer[0].nbytes
        self._free.append(index)
