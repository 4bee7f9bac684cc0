"""The paper's per-tensor model: compute plus each offloaded tensor's own exposed cost.

Each tensor is costed alone, with :mod:`cswap.planner.costmodel`: a swapped one adds ``T'``, a compressed
and swapped one adds ``T``, a compressed and kept one adds ``Time_c + Time_dc``. A host-compressed
one (vDNN++) adds ``max(Size/BW_d2h + Time_c_host - Hidden_f, 0) + max(Time_dc_host +
Size/BW_h2d - Hidden_b, 0)``: the host codec sits in the transfer's path. Nothing carries over from
one tensor to the next, so transfers that pile up on the link are not seen: that is what the queue
model adds. With ``async_copies=False`` nothing is hidden.

Example:
    >>> from cswap.simulate.timeline import Timeline
    >>> from cswap.simulate.policies import Action, TensorCost
    >>> tl = Timeline(forward_s=1.0, backward_s=1.0, produced_s=(0.0,), consumed_s=(1.0,))
    >>> cost = TensorCost(2_000_000_000, 1e9, 0.5, 4, 0.0, 0.0, 0.0, 0.0)
    >>> formula_times(tl, [cost], [Action.SWAP], {0: 1.0}, {0: 1.0}, 1.0, 1.0)
    (2.0, 2.0, 0.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cswap.planner.costmodel import compressed_swap_s, exposed_transfer_s, swap_s
from cswap.simulate.policies import Action, TensorCost
from cswap.simulate.timeline import Timeline

__all__ = ["formula_times"]


def formula_times(
    timeline: Timeline,
    costs: Sequence[TensorCost],
    actions: Sequence[Action],
    hidden_forward_s: Mapping[int, float],
    hidden_backward_s: Mapping[int, float],
    d2h_gbps: float,
    h2d_gbps: float,
    async_copies: bool = True,
) -> tuple[float, float, float]:
    """``(compute_s, exposed_transfer_s, codec_s)`` of the per-tensor model; their sum (plus the
    runtime overhead, which does not depend on the model) is the iteration.

    Args:
        timeline: compute times (and which records backward uses).
        costs, actions: per record.
        hidden_forward_s, hidden_backward_s: per moved record (see :func:`cswap.simulate.timeline.hidden_windows`).
        d2h_gbps, h2d_gbps: link bandwidths.
        async_copies: copies may overlap compute.
    """
    exposed = codec = 0.0
    for i, (action, cost) in enumerate(zip(actions, costs)):
        if action is Action.KEEP:
            continue
        used = timeline.consumed_s[i] is not None
        hidden_f = hidden_forward_s.get(i, 0.0) if async_copies else 0.0
        hidden_b = hidden_backward_s.get(i, 0.0) if async_copies else 0.0
        if action is Action.RECOMPUTE:
            codec += (cost.recompute_s or 0.0) if used else 0.0  # extra forward work in backward, counted with the device's own work
        elif action is Action.ZVC_KEEP:
            codec += cost.compress_s + (cost.decompress_s if used else 0.0)
        elif action is Action.SWAP:
            exposed += (
                swap_s(cost.nbytes, d2h_gbps, h2d_gbps, hidden_f, hidden_b)
                if used
                else exposed_transfer_s(cost.nbytes, d2h_gbps, hidden_f)
            )
        elif action is Action.ZVC_SWAP:
            if used:
                total = compressed_swap_s(
                    cost.compressed_nbytes, cost.compress_s, cost.decompress_s, d2h_gbps, h2d_gbps, hidden_f, hidden_b
                )
                codec += cost.compress_s + cost.decompress_s
                exposed += total - cost.compress_s - cost.decompress_s
            else:
                codec += cost.compress_s
                exposed += exposed_transfer_s(cost.compressed_nbytes, d2h_gbps, hidden_f)
        elif action is Action.HOST_ZVC_SWAP:
            out_s = cost.nbytes / (d2h_gbps * 1e9) + cost.host_compress_s
            exposed += max(out_s - hidden_f, 0.0)
            if used:
                in_s = cost.host_decompress_s + cost.nbytes / (h2d_gbps * 1e9)
                exposed += max(in_s - hidden_b, 0.0)
    return timeline.compute_s, exposed, codec
