"""``CswapCallback`` for the Hugging Face ``Trainer``: every optimizer step under one ``rt.iteration()``.

Pass it in ``callbacks=[...]``. Each optimizer step, with all the micro-batches of its gradient
accumulation window, runs inside one ``rt.iteration()`` (opened at ``on_step_begin``, before the
first micro-batch's forward, and closed at ``on_pre_optimizer_step``, after the last backward);
each epoch begins with ``rt.new_epoch()``, so its first step re-profiles. The runtime is made when
training begins, for the Trainer's model and on its device (``callback.runtime``), and a few of its
stats, in MiB, are added to every log record (``cswap/peak_resident_mib``, ``cswap/budget_mib``,
``cswap/offloaded_mib``, ``cswap/profiled_iterations``, ``cswap/unprofiled_plans``: see
:func:`cswap.integrations.log_values`). The budget in force is said once, when the first step has
resolved it (and again if it rises), on the Trainer's own logger at the level it shows without any
logging set up (``transformers.logging.set_verbosity_error()`` hides it).

The Trainer has no callback event for an exception: a step that raises leaves its iteration open
until the next ``train()`` (whose ``on_train_begin`` closes it) or until :meth:`CswapCallback.close`.
Using the callback as a context manager closes it on the way out::

    with CswapCallback("cswap") as callback:
        Trainer(model, args, train_dataset=data, callbacks=[callback]).train()

Needs the ``hf`` extra: ``pip install 'cswap[hf]'``.

Example:
    >>> callback = CswapCallback("compress-swap", min_bytes=0)
    >>> callback.policy
    'compress-swap'
    >>> callback.runtime
    Traceback (most recent call last):
    ...
    RuntimeError: the runtime is made when training begins (on_train_begin): pass the callback to a Trainer and call train() first
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch

from cswap.integrations.scope import RuntimeHolder, log_values, make_runtime, require

_transformers = require("transformers", "hf", __name__)
#: The Trainer's own logger: transformers gives it a handler, so its warnings show with no logging
#: configured (its infos do not, unless the Trainer's log_level asks for them).
_trainer_logger = _transformers.utils.logging.get_logger("transformers.trainer")

__all__ = ["CswapCallback"]


class _StepInterrupted(RuntimeError):
    """Closes an iteration whose step never reached its optimizer step (an exception stopped it)."""


class CswapCallback(RuntimeHolder, _transformers.TrainerCallback):
    """Runs the Hugging Face ``Trainer``'s optimizer steps under a :class:`cswap.Runtime`.

    Args:
        policy: any of :data:`cswap.options.POLICIES` (``none``, ``swap``, ``cswap``, ``recompute``,
            ``ac-full``, ...; default from ``configs/default.yaml``).
        memory_budget: passed to the runtime when it is not ``None`` (bytes, ``"2GiB"``, or a
            fraction of policy ``none``'s activation peak).
        host_memory_budget: passed to the runtime when it is not ``None``: the most bytes of saved
            activations' host copies held at once (bytes, ``"8GiB"``, or ``"auto"``).
        **options: any other :class:`cswap.Runtime` option (``min_bytes``, ``backend``, ...).
            ``model`` defaults to the Trainer's model and ``device`` to where its parameters are.

    Raises:
        ValueError, TypeError: a bad policy, option or budget (at construction).
    """

    _made_at = "training begins (on_train_begin)"
    _started_by = "train()"

    def __init__(self, policy: str | None = None, memory_budget: int | str | float | None = None,
                 host_memory_budget: int | str | None = None, **options: Any) -> None:
        if host_memory_budget is not None:
            options["host_memory_budget"] = host_memory_budget
        RuntimeHolder.__init__(self, policy, memory_budget, options)

    def close(self, error: BaseException | None = None) -> None:
        """Close an iteration left open by a step that raised (nothing to do otherwise)."""
        self._scope.close(error)

    def __enter__(self) -> CswapCallback:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None) -> None:
        self.close(error)

    # ------------------------------------------------------------------ Trainer events

    def on_train_begin(self, args: Any, state: Any, control: Any, model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        self._scope.close(_StepInterrupted("a step of an earlier train() never reached its optimizer step"))
        if self._runtime is None or model is not self._model:
            self._runtime = make_runtime(self._kwargs, model)
            self._model = model

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.runtime.new_epoch()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Called before the first micro-batch of each accumulation window only.
        self._scope.close(_StepInterrupted("the previous step never reached its optimizer step"))
        self._scope.open(self.runtime)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Every backward of the window is done; the optimizer step saves nothing for backward.
        self._scope.close()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._scope.close()
        line = self._budget_news()
        if line is not None and state.is_world_process_zero:
            # a warning only by level: the one the Trainer's logger shows to a user who set up no logging
            _trainer_logger.warning(line)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._scope.close()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self._runtime is None or logs is None:
            return
        values = log_values(self._runtime)
        logs.update(values)
        # The Trainer appended a copy of this record to its history before calling the callbacks.
        if state.log_history and all(key in state.log_history[-1] for key in logs if key not in values):
            state.log_history[-1].update(values)
