"""Meta traces: the saved tensors, their order and their sparsity, without running the model."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from cswap import models
from cswap.profile.trace import TensorRecord, Trace
from cswap.simulate import SparsityModel, meta_trace
from cswap.simulate.metatrace import with_hidden_times


def _small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(8 * 4 * 4, 10),
    )


def _real_saves(module: nn.Module, shape: tuple[int, ...]) -> tuple[list[tuple], list[int]]:
    """(shape, dtype, is-parameter-or-buffer) of each saved view (of a parameter or buffer: each
    saved storage) in first-pack order, and the order backward unpacks them."""
    fixed = {p.untyped_storage()._cdata for p in (*module.parameters(), *module.buffers())}
    first: dict[object, int] = {}
    saved: list[tuple] = []
    unpacked: list[int] = []
    keep: list[torch.Tensor] = []

    def pack(t):
        storage = t.untyped_storage()._cdata
        key = storage if storage in fixed else (storage, t.storage_offset(), t.stride(), t.shape, t.dtype, t._version)
        if key not in first:
            first[key] = len(saved)
            saved.append((tuple(t.shape), str(t.dtype).removeprefix("torch."), storage in fixed))
            keep.append(t)
        return (first[key], t)

    def unpack(handle):
        index, t = handle
        if index not in unpacked:
            unpacked.append(index)
        return t

    torch.manual_seed(0)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        module(torch.randn(shape)).float().sum().backward()
    return saved, unpacked


@pytest.mark.parametrize("name", ["small", "vgg11", "resnet18", "squeezenet1_1"])
def test_saved_tensors_match_a_real_run(name):
    module = _small_cnn() if name == "small" else models.build(name, num_classes=10, width_mult=0.125)
    resolution = 8 if name == "small" else 32
    trace = meta_trace(module, batch_size=2, resolution=resolution, hardware="v100-pcie3")
    saved, unpacked = _real_saves(module.train(), (2, 3, resolution, resolution))
    assert [(r.shape, r.dtype, not r.offloadable) for r in trace.tensors] == saved
    meta_order = [r.key for r in sorted(trace.tensors, key=lambda r: (r.unpack_at_s, r.key))]
    assert meta_order == unpacked
    for record in trace.tensors:
        assert record.nbytes == torch.Size(record.shape).numel() * torch.empty((), dtype=getattr(torch, record.dtype)).element_size()


def test_small_cnn_records_by_hand():
    trace = meta_trace(_small_cnn(), batch_size=2, resolution=8, hardware="v100-pcie3", sparsity=0.6)
    rows = [(r.shape, r.producer, r.offloadable, round(r.sparsity, 6), r.view_of, r.storage_nbytes) for r in trace.tensors]
    pooled = round(0.6 ** (4**0.25), 6)
    assert rows == [
        ((2, 3, 8, 8), "ConvolutionBackward0", True, 0.0, None, None),  # the input image
        ((8, 3, 3, 3), "ConvolutionBackward0", False, 0.0, None, None),  # conv weight: a parameter
        ((2, 8, 8, 8), "ReluBackward0", True, 0.6, None, None),  # ReLU output (also the pool's input: stored once)
        ((2, 8, 4, 4), "MaxPool2DWithIndicesBackward0", True, 0.0, None, None),  # pool indices (int64)
        ((2, 8, 4, 4), "ConvolutionBackward0", True, pooled, None, None),  # pool output, the second conv's input
        ((8, 8, 3, 3), "ConvolutionBackward0", False, 0.0, None, None),
        ((2, 8, 4, 4), "ReluBackward0", True, 0.6, None, None),
        ((2, 128), "AddmmBackward0", True, 0.6, 6, None),  # the flattened ReLU output: another view of record 6
        ((128, 10), "AddmmBackward0", False, 0.0, None, None),  # the linear weight, transposed view of a parameter
    ]
    assert trace.tensors[3].dtype == "int64"
    assert trace.meta["saved_slots"] == 10  # two storages were saved twice (the flattened ReLU output too)
    # backward needs the last-produced tensors first
    assert trace.tensors[6].unpack_at_s < trace.tensors[2].unpack_at_s
    assert trace.tensors[4].flops == 0.0 and trace.tensors[2].flops == 0.0  # ReLU and pooling count no FLOPs


def test_layer_times_follow_the_hardware():
    slow = meta_trace("vgg11", batch_size=8, resolution=32, hardware="v100-pcie3", width_mult=0.5)
    fast = meta_trace("vgg11", batch_size=8, resolution=32, hardware="h100-pcie5", width_mult=0.5)
    assert 0 < fast.forward_s < slow.forward_s
    assert fast.backward_s > fast.forward_s
    assert [r.shape for r in fast.tensors] == [r.shape for r in slow.tensors]
    assert slow.d2h_gbps == 12.0 and fast.d2h_gbps == 55.0


def test_hidden_times_follow_the_trace_definitions():
    trace = meta_trace(_small_cnn(), batch_size=2, resolution=8, hardware="v100-pcie3")
    movable = [r for r in trace.tensors if r.offloadable]
    for here, after in itertools.pairwise(movable):
        assert here.hidden_forward_s == pytest.approx(after.pack_at_s - here.pack_at_s)
    assert movable[-1].hidden_forward_s == pytest.approx(trace.forward_s - movable[-1].pack_at_s)
    by_use = sorted(movable, key=lambda r: r.unpack_at_s)
    assert by_use[0].hidden_backward_s == pytest.approx(by_use[0].unpack_at_s - trace.forward_s)
    for before, here in itertools.pairwise(by_use):
        assert here.hidden_backward_s == pytest.approx(here.unpack_at_s - before.unpack_at_s)
    assert all(r.hidden_forward_s == 0.0 for r in trace.tensors if not r.offloadable)


def test_with_hidden_times_on_a_hand_trace():
    recs = tuple(
        TensorRecord(key=k, shape=(1,), dtype="float32", nbytes=4, sparsity=0.0, pack_at_s=p, unpack_at_s=u, offloadable=o)
        for k, (p, u, o) in enumerate([(0.0, 9.0, True), (1.0, 5.0, False), (3.0, 6.0, True)])
    )
    trace = with_hidden_times(Trace(tensors=recs, forward_s=4.0, backward_s=6.0))
    assert [r.hidden_forward_s for r in trace.tensors] == [3.0, 0.0, 1.0]
    assert [r.hidden_backward_s for r in trace.tensors] == [3.0, 0.0, 2.0]


def test_sparsity_from_a_profiled_trace():
    template = meta_trace(_small_cnn(), batch_size=2, resolution=8, hardware="v100-pcie3")
    measured = Trace(
        tensors=tuple(
            TensorRecord(key=r.key, shape=r.shape, dtype=r.dtype, nbytes=r.nbytes, sparsity=0.9 if r.producer == "ReluBackward0" else 0.1,
                         producer=r.producer, offloadable=r.offloadable)
            for r in template.tensors
        )
    )
    trace = meta_trace(_small_cnn(), batch_size=4, resolution=8, hardware="v100-pcie3", sparsity=measured)
    assert [r.sparsity for r in trace.tensors if r.offloadable] == [0.1, 0.9, 0.1, 0.1, 0.9, 0.1]
    assert trace.meta["measured_sparsity"] is True


def test_dropout_and_concatenation_propagate_sparsity():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.out = nn.Linear(8, 2)

        def forward(self, x):
            left = torch.relu(self.a(x))
            right = self.b(x)
            joined = torch.cat([left, right], dim=1)
            return self.out(nn.functional.dropout(joined, p=0.5, training=True))

    trace = meta_trace(Net(), input_shape=(3, 4), hardware="v100-pcie3", sparsity=SparsityModel(relu=0.8))
    rows = [(r.shape, r.producer, pytest.approx(r.sparsity)) for r in trace.tensors if r.offloadable]
    assert rows == [
        ((3, 4), "AddmmBackward0", 0.0),  # the input
        ((3, 4), "ReluBackward0", 0.8),
        ((3, 8), "MulBackward0", 0.5),  # the dropout mask (dropout decomposes to bernoulli_ and mul)
        ((3, 8), "AddmmBackward0", 0.7),  # cat of 0.8 and 0.0 halves is 0.4 sparse; after dropout 1 - 0.6 * 0.5
    ]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(model="resnet9000"), ValueError, "unknown model 'resnet9000': choose one of alexnet"),
        (dict(model="vgg11", dtype="int32"), ValueError, "dtype must be a floating dtype"),
        (dict(model="vgg11", batch_size=0), ValueError, "must be positive"),
        (dict(model="vgg11", hardware="tpu-v9"), ValueError, "unknown hardware 'tpu-v9': choose one of a100-pcie4"),
        (dict(model="vgg11", sparsity="half"), TypeError, "sparsity must be a float"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        meta_trace(**{"resolution": 32, "width_mult": 0.125, **kwargs})


def test_sparsity_model_validates():
    with pytest.raises(ValueError, match="relu must be in"):
        SparsityModel(relu=1.5)
    with pytest.raises(ValueError, match="pool_window_exponent"):
        SparsityModel(pool_window_exponent=-1.0)


def test_the_original_module_is_untouched():
    module = _small_cnn()
    before = [p.clone() for p in module.parameters()]
    meta_trace(module, batch_size=2, resolution=8)
    assert all(p.device.type == "cpu" and torch.equal(p, q) for p, q in zip(module.parameters(), before))
