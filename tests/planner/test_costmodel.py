"""The CSWAP cost model on hand-computed cases that reach both sides of every max()."""

from __future__ import annotations

import pytest
import torch

from cswap.codecs import Encoding, zvc_compressed_nbytes
from cswap.planner.costmodel import codec_seconds, compressed_swap_s, decide, exposed_transfer_s, swap_s, zvc_nbytes_for

GB = 1e9


@pytest.mark.parametrize(
    "nbytes, gbps, hidden_s, expected_s",
    [
        (10 * GB, 10, 0.5, 0.5),  # transfer 1 s, 0.5 s hidden: 0.5 s exposed
        (10 * GB, 10, 2.0, 0.0),  # transfer 1 s, fully hidden: max() clamps at 0
        (10 * GB, 10, 1.0, 0.0),  # exactly hidden
    ],
)
def test_exposed_transfer(nbytes: float, gbps: float, hidden_s: float, expected_s: float) -> None:
    assert exposed_transfer_s(nbytes, gbps, hidden_s) == pytest.approx(expected_s)


def test_swap_cost_each_direction_separately() -> None:
    # d2h: 2 s - 0.5 s hidden = 1.5 s exposed; h2d: 1 s - 3 s hidden -> 0 (the other side of max).
    assert swap_s(20 * GB, d2h_gbps=10, h2d_gbps=20, hidden_forward_s=0.5, hidden_backward_s=3.0) == pytest.approx(1.5)
    # both exposed: 2 - 0.5 + 1 - 0.25
    assert swap_s(20 * GB, 10, 20, 0.5, 0.25) == pytest.approx(2.25)
    # both hidden
    assert swap_s(20 * GB, 10, 20, 5.0, 5.0) == 0.0


def test_compressed_swap_cost() -> None:
    # 4 GB compressed at 10/20 GB/s: 0.4 s and 0.2 s. O_f = max(0.4 - 0.1, 0) = 0.3; O_b = max(0.2 - 1, 0) = 0.
    total = compressed_swap_s(4 * GB, compress_s=0.05, decompress_s=0.02, d2h_gbps=10, h2d_gbps=20,
                              hidden_forward_s=0.1, hidden_backward_s=1.0)
    assert total == pytest.approx(0.05 + 0.02 + 0.3 + 0.0)
    # O_b exposed too: max(0.2 - 0.05, 0) = 0.15
    assert compressed_swap_s(4 * GB, 0.05, 0.02, 10, 20, 0.1, 0.05) == pytest.approx(0.05 + 0.02 + 0.3 + 0.15)


def test_paper_decision_compresses_when_the_link_is_the_bottleneck() -> None:
    # 10 GB at 80% sparsity over 10 GB/s, little compute to hide behind:
    # T' = (1 - 0.1) + (1 - 0.1) = 1.8; T = 0.2 + 0.1 + (0.2 - 0.1) + (0.2 - 0.1) = 0.5.
    d = decide(nbytes=10 * GB, sparsity=0.8, hidden_forward_s=0.1, hidden_backward_s=0.1, d2h_gbps=10, h2d_gbps=10,
               compress_s=0.2, decompress_s=0.1, paper_size=True)
    assert d.swap_s == pytest.approx(1.8)
    assert d.compressed_swap_s == pytest.approx(0.5)
    assert d.compress and d.saving_s == pytest.approx(1.3)


def test_paper_decision_keeps_plain_swap_when_the_transfer_is_hidden() -> None:
    # Everything hidden: T' = 0, T = codec time only = 0.3 > 0: do not compress.
    d = decide(nbytes=10 * GB, sparsity=0.8, hidden_forward_s=5, hidden_backward_s=5, d2h_gbps=10, h2d_gbps=10,
               compress_s=0.2, decompress_s=0.1, paper_size=True)
    assert d.swap_s == 0.0 and d.compressed_swap_s == pytest.approx(0.3) and not d.compress


def test_exact_size_counts_bitmap_and_offsets() -> None:
    numel, itemsize = 1 << 20, 4
    exact = zvc_nbytes_for(numel * itemsize, sparsity=1.0, itemsize=itemsize)
    assert exact == zvc_compressed_nbytes(numel, 0, itemsize) == 4 * (numel // 32) + 8 * (numel // 1024 + 1)
    paper = decide(numel * itemsize, 1.0, 0, 0, 10, 10, 0, 0, itemsize=itemsize, paper_size=True)
    real = decide(numel * itemsize, 1.0, 0, 0, 10, 10, 0, 0, itemsize=itemsize)
    assert paper.compressed_nbytes == 0.0
    assert real.compressed_nbytes == exact
    assert real.compressed_swap_s == pytest.approx(2 * exact / (10 * GB))


def test_exact_size_can_flip_a_dense_decision() -> None:
    # At 2% sparsity the bitmap (1/32 of fp32) outweighs the zeros: the paper's form says compress
    # (free codec), the exact size says the compressed transfer is larger than the original.
    args = dict(nbytes=4 * GB, sparsity=0.02, hidden_forward_s=0, hidden_backward_s=0, d2h_gbps=10, h2d_gbps=10,
                compress_s=0.0, decompress_s=0.0, itemsize=4)
    assert decide(**args, paper_size=True).compress
    assert not decide(**args).compress


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_sparsity_out_of_range(bad: float) -> None:
    with pytest.raises(ValueError, match="sparsity"):
        decide(1e6, bad, 0, 0, 10, 10, 0, 0)


def test_zero_bandwidth_is_an_error() -> None:
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        swap_s(1e6, 0, 10, 0, 0)


def _narrowed_to(itemsize: int) -> Encoding:
    widths = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return Encoding(torch.int64, widths[itemsize])


@pytest.mark.parametrize("encoded_itemsize", (1, 2, 4, 8))
def test_narrowed_int64_is_costed_at_its_encoded_width(encoded_itemsize: int) -> None:
    numel = 1 << 20
    cost = decide(numel * 8, 0.0, 0.0, 0.0, d2h_gbps=10, h2d_gbps=10, compress_s=0.0, decompress_s=0.0,
                  itemsize=8, encoding=_narrowed_to(encoded_itemsize))
    assert cost.compressed_nbytes == zvc_compressed_nbytes(numel, numel, encoded_itemsize)
    # Dense, so only narrowing makes the compressed transfer smaller than the plain one.
    assert cost.compress is (encoded_itemsize < 8)
    assert cost.swap_s == pytest.approx(2 * numel * 8 / (10 * GB))


class ZvcOnly:
    def compress_s(self, nbytes, density, itemsize, backend):
        return nbytes * density * 1e-9

    def decompress_s(self, nbytes, density, itemsize, backend):
        return nbytes * density * 2e-9


class PerCodec(ZvcOnly):
    def compress_s(self, nbytes, density, itemsize, backend, codec="zvc"):
        if codec == "bitpack":
            raise ValueError("codec 'bitpack' was not timed")
        return super().compress_s(nbytes, density, itemsize, backend) * (50 if codec == "exponent" else 1)


@pytest.mark.parametrize(("model", "codec", "want_s"), [
    (ZvcOnly(), "zvc", 0.25e-3),  # ZVC at the tensor's density
    (ZvcOnly(), "exponent", 1e-3),  # a ZVC-only model: ZVC's time on a dense tensor
    (PerCodec(), "exponent", 12.5e-3),  # the codec's own time, asked at the tensor's density
    (PerCodec(), "bitpack", 1e-3),  # a codec the model did not time: ZVC's dense time
])
def test_codec_seconds_asks_for_the_codec_where_the_model_knows_it(model, codec: str, want_s: float) -> None:
    assert codec_seconds(model, "compress", 1_000_000, 0.25, 2, "cuda", codec) == pytest.approx(want_s)
