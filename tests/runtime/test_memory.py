"""What the policies hold, counted by ``stats()``: the memory side of the policies on a real model.

Counts, not timings: peak resident bytes are exact sums at every hook call, so these are stable on
any machine. The model is VGG-16 at full width on digits-sized (32x32) images, the configuration
the runtime issue names.
"""

from __future__ import annotations

import pytest
import torch

from cswap import models
import cswap
from cswap.training.data import digits

BATCH = 16


@pytest.fixture(scope="module")
def vgg16_peaks() -> dict[str, cswap.RuntimeStats]:
    images, labels = digits(image_size=32, channels=3).train.tensors
    images, labels = images[:BATCH], labels[:BATCH]
    torch.manual_seed(0)
    model = models.build("vgg16", num_classes=10).train()
    stats = {}
    for policy in ("none", "compress-keep"):
        rt = cswap.Runtime(policy, model=model, device="cpu")
        torch.manual_seed(1)  # the same dropout masks under both policies
        with rt.iteration():
            torch.nn.functional.cross_entropy(model(images), labels).backward()
        model.zero_grad(set_to_none=True)
        stats[policy] = rt.stats()
    return stats


def test_compress_keep_holds_at_most_0_6_of_none(vgg16_peaks: dict[str, cswap.RuntimeStats]) -> None:
    none, keep = vgg16_peaks["none"], vgg16_peaks["compress-keep"]
    assert none.peak_resident_bytes > 0
    ratio = keep.peak_resident_bytes / none.peak_resident_bytes
    assert ratio <= 0.6, f"compress-keep holds {ratio:.3f}x of none's peak resident bytes"


def test_compress_keep_compresses_every_offloadable_tensor(vgg16_peaks: dict[str, cswap.RuntimeStats]) -> None:
    keep = vgg16_peaks["compress-keep"]
    assert keep.actions["zvc-keep"] > 0 and keep.actions["swap"] == keep.actions["zvc-swap"] == 0
    assert keep.offloaded_bytes == 0  # nothing leaves the device
    assert keep.compressed_bytes < keep.compressed_input_bytes
    assert keep.resident_bytes == 0  # all released once the graph is gone


def test_none_holds_what_plain_pytorch_saves(vgg16_peaks: dict[str, cswap.RuntimeStats]) -> None:
    none = vgg16_peaks["none"]
    assert none.peak_resident_bytes == none.kept_bytes  # every saved tensor alive until backward
    assert none.offloaded_bytes == none.compressed_input_bytes == 0
