"""Architectures outside ``cswap.models``: every policy still gives plain PyTorch's gradients.

The runtime only sees what autograd saves, so models it was not written around must work too:
embeddings (int64 indices saved, narrowed before compression), attention (softmax outputs, boolean
masks), layer norm, GELU, recurrent layers (many small saves per step), 1-d convolutions and
batch norm, dropout (bool masks saved).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from cswap.options import POLICIES
from tests.runtime.helpers import assert_bit_equal, runtime_for, train

VOCAB, CLASSES, LENGTH, BATCH = 50, 5, 12, 4


class TinyTransformer(nn.Module):
    """Token embedding, two pre-norm encoder layers with dropout, mean-pooled classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.position = nn.Parameter(torch.randn(LENGTH, 32) * 0.02)
        layer = nn.TransformerEncoderLayer(32, nhead=4, dim_feedforward=64, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        padding = tokens == 0
        hidden = self.encoder(self.embed(tokens) + self.position, src_key_padding_mask=padding)
        return self.head(hidden.mean(dim=1))


class TinyRecurrent(nn.Module):
    """Embedding, a two-layer LSTM and a GRU, classifier on the last step."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.lstm = nn.LSTM(16, 24, num_layers=2, batch_first=True, dropout=0.2)
        self.gru = nn.GRU(24, 16, batch_first=True)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(tokens))
        hidden, _ = self.gru(hidden)
        return self.head(hidden[:, -1])


class TinyConv1d(nn.Module):
    """Embedding as channels, 1-d convolutions with batch norm, max pooling and dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.features = nn.Sequential(
            nn.Conv1d(16, 32, 3, padding=1), nn.BatchNorm1d(32), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(32, 32, 3, padding=1), nn.BatchNorm1d(32), nn.SiLU(), nn.Dropout(0.3),
        )
        self.head = nn.Linear(32, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(self.embed(tokens).transpose(1, 2)).amax(dim=2))


MODELS: dict[str, Callable[[], nn.Module]] = {
    "transformer": TinyTransformer,
    "recurrent": TinyRecurrent,
    "conv1d": TinyConv1d,
}


def _token_batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    found = []
    for _ in range(count):
        tokens = torch.randint(1, VOCAB, (BATCH, LENGTH), generator=generator)
        tokens[:, -3:] = 0  # padding, masked in attention
        found.append((tokens, torch.randint(0, CLASSES, (BATCH,), generator=generator)))
    return found


DATA = _token_batches(2)


@pytest.fixture(scope="module")
def reference() -> dict[str, list[list[torch.Tensor]]]:
    return {name: train(build, DATA, epochs=2)[0] for name, build in MODELS.items()}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", MODELS)
def test_held_out_architectures_keep_plain_gradients(reference, name: str, policy: str) -> None:
    grads, rt = train(MODELS[name], DATA, epochs=2, runtime=runtime_for(policy))
    for iteration, (expected, got) in enumerate(zip(reference[name], grads)):
        assert_bit_equal(expected, got, what=f"{name}/{policy} iteration {iteration} gradient")
    stats = rt.stats()
    assert stats.resident_bytes == 0
    if policy == "ac-full":  # every repeated layer recomputed; a model without any keeps everything and says so
        layers = ("encoder.layers.0", "encoder.layers.1") if name == "transformer" else ()
        assert rt.plan().recompute_regions == layers
        assert (stats.actions["recompute"] > 0) == bool(layers)
        assert bool(layers) != rt.plan().planner["layers"].startswith("the model has no repeated layers")
    elif policy != "none":
        moved = sum(count for action, count in stats.actions.items() if action != "keep")
        assert moved > 0, f"{policy} moved nothing on {name}"
    indices = [t for t in rt.trace().tensors if t.dtype == "int64"]
    assert indices  # the embedding's indices were saved and went through the runtime
    assert all(t.narrow_dtype == "int8" for t in indices)  # token ids and positions below 128
