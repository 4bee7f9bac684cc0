"""The largest batch each policy fits in a memory limit, planned on meta traces (no GPU needed).

Nothing is run: for each batch size a meta trace of the model (:func:`cswap.simulate.meta_trace`)
is read into the planner's problem (:func:`cswap.simulate.budgeted.planning_problem`), and the
batch fits a policy when the least activation budget the policy can meet
(:func:`cswap.planner.minimum_bytes`, honest: its plan meets it) fits in what the limit leaves:

    limit - weights - gradients - optimizer state - input batch - workspace

with the optimizer SGD with momentum (one state tensor per parameter: ``optimizer_states=1``;
Adam has 2) and a workspace allowance (``workspace_fraction`` of the limit, for convolution
workspaces, the allocator's fragmentation and the CUDA context). The batch size is found by the
same doubling-then-bisection search as the measured path (:func:`cswap.maxbatch.largest_fitting`).

Example:
    >>> result = planned_max_batch("vgg11", ("none", "swap"), 64 * 2**20, resolution=32, width_mult=0.125)
    >>> result.batches["none"] <= result.batches["swap"], result.method
    (True, 'planned')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cswap.maxbatch import largest_fitting

__all__ = ["DEFAULT_WORKSPACE_FRACTION", "PlannedMaxBatch", "planned_max_batch"]

#: Share of the memory limit set aside for workspaces, fragmentation and the CUDA context.
DEFAULT_WORKSPACE_FRACTION = 0.1


@dataclass(frozen=True)
class PlannedMaxBatch:
    """The planned largest batch per policy.

    Attributes:
        model: the model.
        memory_limit_bytes: the limit.
        batches: policy -> the largest batch whose plan fits (0: not even ``start``).
        state_bytes: weights + gradients + optimizer state.
        workspace_bytes: the workspace allowance.
        optimizer: what the optimizer state assumes.
        method: ``"planned"`` (never run).
    """

    model: str
    memory_limit_bytes: int
    batches: dict[str, int]
    state_bytes: int
    workspace_bytes: int
    optimizer: str
    method: str = "planned"
    minimum_bytes: dict[str, dict[int, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready."""
        return {
            "model": self.model,
            "memory_limit_bytes": self.memory_limit_bytes,
            "method": self.method,
            "max_batch": dict(self.batches),
            "state_bytes": self.state_bytes,
            "workspace_bytes": self.workspace_bytes,
            "optimizer": self.optimizer,
        }


def planned_max_batch(
    model: str,
    policies: Sequence[str],
    memory_limit_bytes: int,
    resolution: int = 224,
    hardware: str = "v100-pcie3",
    optimizer_states: int = 1,
    workspace_fraction: float = DEFAULT_WORKSPACE_FRACTION,
    width_mult: float = 1.0,
    ceiling: int = 4096,
    time_limit_s: float = 30.0,
) -> PlannedMaxBatch:
    """The largest batch per policy whose plan fits ``memory_limit_bytes`` (see the module docstring).

    Args:
        model: a name from ``cswap.models.MODEL_NAMES``.
        policies: policies with an action set (:data:`cswap.planner.POLICY_ACTIONS`).
        memory_limit_bytes: the device memory.
        resolution: input size.
        hardware: the profile the trace's times (and so the planner's costs) come from.
        optimizer_states: optimizer tensors per parameter (SGD momentum: 1, Adam: 2, plain SGD: 0).
        workspace_fraction: share of the limit set aside as workspace, in [0, 1).
        width_mult: passed to the model builder (small models for tests).
        ceiling: the largest batch tried.
        time_limit_s: the solver's time limit per least-budget solve.

    Raises:
        ValueError: a limit that is not positive, a bad fraction or count, or an unknown policy.
    """
    from cswap import models
    from cswap.planner import POLICY_ACTIONS, minimum_bytes
    from cswap.simulate import SimConfig, Simulator, meta_trace
    from cswap.simulate.budgeted import planning_problem

    if memory_limit_bytes <= 0:
        raise ValueError(f"memory limit must be positive, got {memory_limit_bytes} bytes")
    if not 0 <= workspace_fraction < 1:
        raise ValueError(f"workspace_fraction must be in [0, 1), got {workspace_fraction}")
    if optimizer_states < 0:
        raise ValueError(f"optimizer_states must be >= 0 (SGD momentum: 1, Adam: 2), got {optimizer_states}")
    unknown = [p for p in policies if p not in POLICY_ACTIONS]
    if unknown:
        raise ValueError(f"policies {unknown} cannot be planned: choose from {', '.join(POLICY_ACTIONS)}")
    network = models.build(model, num_classes=1000, width_mult=width_mult)
    weight_bytes = sum(p.numel() * p.element_size() for p in network.parameters())
    state_bytes = weight_bytes * (2 + optimizer_states)  # weights, gradients, optimizer state
    workspace_bytes = int(workspace_fraction * memory_limit_bytes)
    problems: dict[int, object] = {}
    minimums: dict[str, dict[int, int]] = {p: {} for p in policies}

    def least(policy: str, batch: int) -> int:
        if batch not in minimums[policy]:
            if batch not in problems:
                trace = meta_trace(model, batch, resolution, hardware, width_mult=width_mult)
                problems[batch] = planning_problem(Simulator(trace, hardware, SimConfig()))[0]
            minimums[policy][batch] = minimum_bytes(problems[batch], policy, time_limit_s)  # type: ignore[arg-type]
        return minimums[policy][batch]

    def fits(policy: str) -> Callable[[int], bool]:
        def check(batch: int) -> bool:
            input_bytes = batch * 3 * resolution * resolution * 4
            left = memory_limit_bytes - state_bytes - workspace_bytes - input_bytes
            return left > 0 and least(policy, batch) <= left

        return check

    batches = {policy: largest_fitting(fits(policy), ceiling=ceiling) for policy in policies}
    optimizer = {0: "SGD without momentum", 1: "SGD with momentum", 2: "Adam"}.get(optimizer_states, f"{optimizer_states} states per parameter")
    return PlannedMaxBatch(model, int(memory_limit_bytes), batches, state_bytes, workspace_bytes, optimizer, minimum_bytes=minimums)
