"""Execution: carrying a plan out on every saved tensor, inside ``saved_tensors_hooks``.

* :mod:`~cswap.execute.executor`: the pack and unpack hooks (dedup, never-move rules, prefetch, counting);
* :mod:`~cswap.execute.streams`: every copy, (de)compression, stream switch and event wait;
* :mod:`~cswap.execute.stored`: what the executor holds per saved tensor, and its counters;
* :mod:`~cswap.execute.layout`: views stored compactly and rebuilt with their strides;
* :mod:`~cswap.execute.arena`: the pinned host arena; :mod:`~cswap.execute.readback`: readback slots;
* :mod:`~cswap.execute.recompute`: recompute regions on torch's checkpoint;
* :mod:`~cswap.execute.passive`: swap-on-out-of-memory while profiling (Capuchin's passive mode).

Example:
    >>> from cswap.execute.layout import Layout
    >>> import torch
    >>> Layout.of(torch.zeros(2, 3).t()).nbytes
    24
"""
