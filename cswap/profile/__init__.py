"""Profiling: what one training iteration saves, when, and what it costs.

* :mod:`~cswap.profile.trace`: the profile of one iteration (:class:`Trace`, one record per saved tensor);
* :mod:`~cswap.profile.profiler`: fills a trace from the executor's hooks;
* :mod:`~cswap.profile.regions`: what recomputing each module call would save and cost;
* :mod:`~cswap.profile.rerun`: what makes a module call unsafe to run a second time;
* :mod:`~cswap.profile.codec_speed`: the codec's seconds on this machine, from a short micro-benchmark.

Example:
    >>> from cswap.profile.trace import TensorRecord, Trace
    >>> Trace(tensors=()).total_nbytes
    0
"""
