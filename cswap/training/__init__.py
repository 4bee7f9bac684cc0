"""Training runs: the ``cswap train`` loop and what surrounds it.

* :mod:`~cswap.training.loop`: the loop (also ``torchrun -m cswap.train``);
* :mod:`~cswap.training.config`: a run's validated, frozen configuration;
* :mod:`~cswap.training.data`: datasets that need no download;
* :mod:`~cswap.training.kernelconfigs`: kernel launch configs from the store, the service, or tuned now;
* :mod:`~cswap.training.report`, :mod:`~cswap.training.plots`, :mod:`~cswap.training.progress`:
  what a run writes and shows;
* :mod:`~cswap.training.memtimeline`: device memory over one iteration, per policy;
* :mod:`~cswap.training.maxbatch`: the largest batch per policy, measured or planned.

Example:
    >>> from cswap.training.config import TrainConfig
    >>> TrainConfig(model="vgg11").model
    'vgg11'
"""
