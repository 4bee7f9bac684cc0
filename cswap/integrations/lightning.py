"""``CswapCallback`` for Lightning: every optimizer step under one ``rt.iteration()``.

Pass it in ``Trainer(callbacks=[...])``. With automatic optimization each optimizer step, with all
the batches of its ``accumulate_grad_batches`` window, runs inside one ``rt.iteration()`` (opened
at the window's first ``on_train_batch_start`` and closed at ``on_before_optimizer_step``, after
the last backward); with manual optimization each training batch is one iteration. Each training
epoch begins with ``rt.new_epoch()``. The runtime is made when fitting begins, for the
LightningModule and on its device (``callback.runtime``); after each optimizer step a few of its
stats, in MiB, are logged through ``pl_module.log`` (``cswap/peak_resident_mib``,
``cswap/budget_mib``, ``cswap/offloaded_mib``, ... see :func:`cswap.integrations.log_values`), and
the budget in force is said once, when the first step has resolved it (and again if it rises),
through Lightning's own ``rank_zero_info``. An exception closes the open iteration (``on_exception``).

Needs the ``lightning`` extra: ``pip install 'cswap[lightning]'``.

Example:
    >>> callback = CswapCallback("swap", min_bytes=0)
    >>> callback.policy
    'swap'
"""

from __future__ import annotations

import importlib
from typing import Any

from cswap.integrations.scope import RuntimeHolder, log_values, make_runtime, require

_pl = require("lightning.pytorch", "lightning", __name__)
_rank_zero_info = importlib.import_module("lightning.pytorch.utilities").rank_zero_info

__all__ = ["CswapCallback"]


class CswapCallback(RuntimeHolder, _pl.Callback):
    """Runs a Lightning ``Trainer``'s optimizer steps under a :class:`cswap.Runtime`.

    Args:
        policy: any of :data:`cswap.options.POLICIES` (``none``, ``swap``, ``cswap``, ``recompute``,
            ``ac-full``, ...; default from ``configs/default.yaml``).
        memory_budget: passed to the runtime when it is not ``None`` (bytes, ``"2GiB"``, or a
            fraction of policy ``none``'s activation peak).
        host_memory_budget: passed to the runtime when it is not ``None``: the most bytes of saved
            activations' host copies held at once (bytes, ``"8GiB"``, or ``"auto"``).
        log_stats: log the runtime's stats after each optimizer step, and say the budget in force.
        **options: any other :class:`cswap.Runtime` option (``min_bytes``, ``backend``, ...).
            ``model`` defaults to the LightningModule and ``device`` to where it runs.

    Raises:
        ValueError, TypeError: a bad policy, option or budget (at construction).
    """

    _made_at = "fitting begins (on_fit_start)"
    _started_by = "fit()"

    def __init__(self, policy: str | None = None, memory_budget: int | str | float | None = None, log_stats: bool = True,
                 host_memory_budget: int | str | None = None, **options: Any) -> None:
        if host_memory_budget is not None:
            options["host_memory_budget"] = host_memory_budget
        RuntimeHolder.__init__(self, policy, memory_budget, options)
        self._log_stats = log_stats
        self._stepped = False

    # ------------------------------------------------------------------ Trainer hooks

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if self._runtime is None or pl_module is not self._model:
            kwargs = dict(self._kwargs)
            kwargs.setdefault("device", str(pl_module.device))
            self._runtime = make_runtime(kwargs, pl_module)
            self._model = pl_module

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.runtime.new_epoch()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._stepped = False
        if not self._scope.is_open:  # the first batch of an accumulation window
            self._scope.open(self.runtime)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if pl_module.automatic_optimization:
            # Every backward of the window is done; the optimizer step saves nothing for backward.
            self._scope.close()
            self._stepped = True

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not pl_module.automatic_optimization:
            self._scope.close()
            self._stepped = True
        if self._stepped and self._log_stats:
            to_logger = bool(trainer.loggers)  # without one the values still reach trainer.callback_metrics
            for name, value in log_values(self.runtime).items():
                pl_module.log(name, value, on_step=True, on_epoch=False, prog_bar=False, logger=to_logger)
            line = self._budget_news()
            if line is not None:
                _rank_zero_info(line)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._scope.close()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._scope.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._scope.close(exception)
