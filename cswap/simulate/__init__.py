"""Trace-driven simulation of one training iteration under each policy and hardware profile.

The pieces, bottom up:

* :mod:`~cswap.simulate.hardware`: hardware profiles (``configs/hardware/*.yaml``), validated;
* :mod:`~cswap.simulate.metatrace`: a :class:`~cswap.profile.trace.Trace` from a model on the ``meta`` device;
* :mod:`~cswap.simulate.timeline`: the compute timeline a trace describes, and the hidden windows;
* :mod:`~cswap.simulate.policies`: the six policies and the action each takes per tensor;
* :mod:`~cswap.simulate.formula` and :mod:`~cswap.simulate.queues`: the paper's per-tensor model
  and the queue model;
* :mod:`~cswap.simulate.engine`: :class:`Simulator`, :func:`simulate`, :func:`simulate_policies`;
* :mod:`~cswap.simulate.budgeted`: every policy planned under a memory budget;
* :mod:`~cswap.simulate.strategies`: what users pick instead (activation checkpointing, selective
  recompute, torchtune's and Megatron-LM's offloading, a recompute knapsack, an exact keep /
  recompute / swap program), read from the trace's layers (:mod:`~cswap.simulate.layers`), and
  :mod:`~cswap.simulate.versus`: policies and strategies side by side under one budget;
* :mod:`~cswap.simulate.sweep`, :mod:`~cswap.simulate.validate`, :mod:`~cswap.simulate.plot`:
  the sparsity x bandwidth sweep, the check against measured iterations, and the figures.

Example:
    >>> from cswap.simulate import meta_trace, simulate_policies
    >>> trace = meta_trace("vgg11", batch_size=2, resolution=32, width_mult=0.125)
    >>> results = simulate_policies(trace, "v100-pcie3", "swap,cswap")
    >>> sorted(results)
    ['cswap', 'swap']
"""

from __future__ import annotations

from cswap.simulate.engine import DEFAULT_MIN_BYTES, Breakdown, PolicyResult, SimConfig, Simulator, simulate, simulate_policies
from cswap.simulate.hardware import HardwareError, HardwareProfile, hardware_names, load_hardware
from cswap.simulate.metatrace import SparsityModel, meta_trace
from cswap.simulate.policies import POLICIES, Action

__all__ = [
    "DEFAULT_MIN_BYTES",
    "POLICIES",
    "Action",
    "Breakdown",
    "HardwareError",
    "HardwareProfile",
    "PolicyResult",
    "SimConfig",
    "Simulator",
    "SparsityModel",
    "hardware_names",
    "load_hardware",
    "meta_trace",
    "simulate",
    "simulate_policies",
]
