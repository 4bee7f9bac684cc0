"""Feature construction for the two predictors: codec time (linear) and compress-or-not (logistic).

Time features (:func:`time_features`) are physical cost terms, so that each fitted coefficient is a
cost per unit and must be non-negative (the regression is constrained to that):

* ``calls``: 1 per call: Python dispatch, starting the parallel region or kernel, allocating outputs.
* ``bytes``: the dense tensor, read by compress and written by decompress (GB).
* ``nonzero_bytes``: ``bytes * density``, the values compress writes and decompress reads (GB).
* ``mixed_bytes``: ``bytes * 4 * density * (1 - density)``, largest at density 0.5: a kernel with a
  data-dependent branch pays mispredictions in proportion to how unpredictable the zero pattern is.
* ``*_past_knee1``, ``*_past_knee2``: the same three terms again, but only once the buffer a term
  stands for outgrows a knee (the dense tensor for ``bytes`` and ``mixed_bytes``, the values
  buffer of ``nbytes * density`` bytes for ``nonzero_bytes``). Past a cache level every byte of a
  streamed buffer comes from the next level, and past the allocator's mmap threshold every fresh
  output buffer is mapped and page-faulted anew: the cost per byte of the *whole* buffer steps
  up, which is what these terms add. The knees are chosen per model (see
  :mod:`cswap.predictors.timemodel`); an unused knee leaves its columns zero.

Sizes are in GB (1e9 bytes), so the ``bytes`` coefficient reads as seconds per GB, the inverse of a
bandwidth.

Decision features (:func:`decision_features`) are built from the same quantities the cost model
uses, in log space so that one linear boundary spans 4 KiB to GBs:

* ``log_gain_s``: log of what compression saves on the wire, ``T' - (O_f + O_b)``, with the paper's
  compressed size ``Size * (1 - Sparsity)``. It is exactly zero when every transfer is hidden,
  which the floor ``GAIN_FLOOR_S`` turns into a very negative feature (never compress).
* ``log_nbytes``, ``log_nonzero_bytes``, and ``softplus(log_nbytes - log(knee))`` at a few knees:
  a basis for the log of the codec time, which is a constant for small tensors and grows linearly
  for large ones. The decision is ``gain > codec time``, i.e. a linear boundary in these features.
* ``log_swap_s``: log of the plain swap's exposed time ``T'``, and ``log_transfer_hidden_ratio``:
  how much of the transfer compute hides, both as the cost model sees them.

Example:
    >>> time_features([1e9], [0.5], knees_bytes=(4e8,)).round(3).tolist()
    [[1.0, 1.0, 0.5, 1.0, 1.0, 0.5, 1.0, 0.0, 0.0, 0.0]]
    >>> decision_features(1 << 20, 0.5, 0.0, 0.0, 10.0, 10.0).shape
    (1, 9)
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "MAX_KNEES",
    "DECISION_FEATURES",
    "DECISION_KNEES_BYTES",
    "GAIN_FLOOR_S",
    "TIME_FEATURES",
    "decision_features",
    "time_features",
]

#: Most knees a time model has.
MAX_KNEES = 2
_BASE_TERMS = ("bytes", "nonzero_bytes", "mixed_bytes")
#: Columns of :func:`time_features`, in order.
TIME_FEATURES: tuple[str, ...] = (
    "calls",
    *_BASE_TERMS,
    *(f"{term}_past_knee{k + 1}" for k in range(MAX_KNEES) for term in _BASE_TERMS),
)
_GB = 1e9


def _as_arrays(*values: ArrayLike) -> list[np.ndarray]:
    arrays = np.broadcast_arrays(*(np.atleast_1d(np.asarray(v, dtype=np.float64)) for v in values))
    return [np.ascontiguousarray(a) for a in arrays]


def time_features(nbytes: ArrayLike, density: ArrayLike, knees_bytes: tuple[float, ...] = ()) -> np.ndarray:
    """The design matrix of the codec-time regression, one row per (nbytes, density).

    Args:
        nbytes: uncompressed sizes in bytes.
        density: nonzero fractions in ``[0, 1]`` (broadcast against ``nbytes``).
        knees_bytes: up to :data:`MAX_KNEES` sizes; a tensor larger than a knee gets that knee's terms.

    Returns:
        ``float64`` array of shape ``(n, len(TIME_FEATURES))``.

    Example:
        >>> time_features(4096, 1.0)[0, :3].tolist()
        [1.0, 4.096e-06, 4.096e-06]
        >>> time_features([1e6, 1e8], 0.5, knees_bytes=(1e7,))[:, 4].tolist()
        [0.0, 0.1]
    """
    n, d = _as_arrays(nbytes, density)
    if not np.all(np.isfinite(n) & (n >= 0)) or not np.all((d >= 0) & (d <= 1)):
        raise ValueError("time features need finite nbytes >= 0 and density in [0, 1]")
    if len(knees_bytes) > MAX_KNEES or not all(k > 0 for k in knees_bytes):
        raise ValueError(f"knees_bytes must be at most {MAX_KNEES} positive sizes, got {knees_bytes}")
    gb = n / _GB
    base = [gb, gb * d, gb * 4.0 * d * (1.0 - d)]
    # Each term steps up when the buffer it stands for outgrows the knee: the dense tensor for
    # ``bytes`` and ``mixed_bytes``, the values buffer (``nbytes * density``) for ``nonzero_bytes``.
    sizes = [n, n * d, n]
    columns = [np.ones_like(gb), *base]
    for k in range(MAX_KNEES):
        for term, size in zip(base, sizes):
            columns.append(term * (size > knees_bytes[k]) if k < len(knees_bytes) else np.zeros_like(gb))
    return np.stack(columns, axis=1)


#: Columns of :func:`decision_features`, in order.
DECISION_FEATURES: tuple[str, ...] = (
    "log_gain_s",
    "log_swap_s",
    "log_transfer_hidden_ratio",
    "log_nbytes",
    "log_nonzero_bytes",
    "softplus_log_nbytes_64KiB",
    "softplus_log_nbytes_1MiB",
    "softplus_log_nbytes_16MiB",
    "softplus_log_nbytes_256MiB",
)
#: Knees of the softplus basis of the codec time's dependence on size.
DECISION_KNEES_BYTES: tuple[int, ...] = (64 << 10, 1 << 20, 16 << 20, 256 << 20)
#: Seconds added inside the logs of times: far below any codec call, so a zero gain stays decisive.
GAIN_FLOOR_S = 1e-9
_MIN_NONZERO_FRACTION = 1e-4


def _exposed_s(nbytes: np.ndarray, gbps: np.ndarray, hidden_s: np.ndarray) -> np.ndarray:
    return np.maximum(nbytes / (gbps * 1e9) - hidden_s, 0.0)


def decision_features(
    nbytes: ArrayLike,
    sparsity: ArrayLike,
    hidden_forward_s: ArrayLike,
    hidden_backward_s: ArrayLike,
    d2h_gbps: ArrayLike,
    h2d_gbps: ArrayLike,
) -> np.ndarray:
    """The design matrix of the compress-or-not classifier (arguments broadcast against each other).

    Args:
        nbytes: uncompressed sizes in bytes (> 0).
        sparsity: fractions of zero elements in ``[0, 1]``.
        hidden_forward_s, hidden_backward_s: compute a swap-out / swap-in overlaps (``Hidden_f``, ``Hidden_b``).
        d2h_gbps, h2d_gbps: transfer bandwidths in GB/s (> 0).

    Returns:
        ``float64`` array of shape ``(n, len(DECISION_FEATURES))``.

    Example:
        >>> x = decision_features([1 << 20, 1 << 20], [0.9, 0.9], [0.0, 1.0], 0.0, 12.0, 12.0)
        >>> bool(x[0, 0] > x[1, 0])   # the hidden forward copy saves less
        True
    """
    n, s, hf, hb, d2h, h2d = _as_arrays(nbytes, sparsity, hidden_forward_s, hidden_backward_s, d2h_gbps, h2d_gbps)
    problems = []
    if not np.all(np.isfinite(n) & (n > 0)):
        problems.append("nbytes must be positive")
    if not np.all((s >= 0) & (s <= 1)):
        problems.append("sparsity must lie in [0, 1]")
    if not np.all(np.isfinite(hf) & (hf >= 0) & np.isfinite(hb) & (hb >= 0)):
        problems.append("hidden times must be finite and >= 0")
    if not np.all(np.isfinite(d2h) & (d2h > 0) & np.isfinite(h2d) & (h2d > 0)):
        problems.append("bandwidths must be positive GB/s")
    if problems:
        raise ValueError("bad decision inputs: " + "; ".join(problems))
    compressed = n * (1.0 - s)
    swap_s = _exposed_s(n, d2h, hf) + _exposed_s(n, h2d, hb)
    overhead_s = _exposed_s(compressed, d2h, hf) + _exposed_s(compressed, h2d, hb)
    gain_s = np.maximum(swap_s - overhead_s, 0.0)
    transfer_s = n / (d2h * 1e9) + n / (h2d * 1e9)
    log_n = np.log(n)
    columns = [
        np.log(gain_s + GAIN_FLOOR_S),
        np.log(swap_s + GAIN_FLOOR_S),
        np.log(transfer_s / (hf + hb + transfer_s)),
        log_n,
        np.log(n * np.maximum(1.0 - s, _MIN_NONZERO_FRACTION)),
    ]
    columns += [np.logaddexp(0.0, log_n - np.log(knee)) for knee in DECISION_KNEES_BYTES]
    return np.stack(columns, axis=1)
