"""Small models built as their authors ship them, for the tests that must hold on code nobody here wrote.

The Hugging Face models come from their config classes with the defaults (the key/value cache on,
dropout on, Wav2Vec2's SpecAugment masks drawn with NumPy's global generator) and only the sizes
made small. ``densenet`` and ``vit`` follow torchvision's
``DenseNet`` (each dense layer takes the block's list of features, appended to after the call) and
``VisionTransformer`` (``nn.MultiheadAttention`` called as ``attention(x, x, x)``) line for line in
what matters here; torchvision itself has no CPU build on the package index this project installs
from. ``compiled_cnn`` is a batch-norm CNN under ``torch.compile(backend="aot_eager")``.

Each builder returns the model (the module to train and to give cswap) and a step: one forward and
backward on fixed data, the loss of which it returns.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn import functional as F

Step = Callable[[], torch.Tensor]


def _tokens(vocab: int, batch: int = 4, seq: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, vocab, (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    mask[::2, -5:] = 0  # right padding on every other sequence
    return ids, mask


def gpt2() -> tuple[nn.Module, Callable[[nn.Module], Step]]:
    transformers = pytest.importorskip("transformers")
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2))
    return model, _causal_lm_step


def llama() -> tuple[nn.Module, Callable[[nn.Module], Step]]:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config), _causal_lm_step


def recurrent_gemma() -> tuple[nn.Module, Callable[[nn.Module], Step]]:
    """RecurrentGemma (Griffin): its recurrence keeps the last state of each call in a plain
    attribute and starts the next call from it. Trained without the cache: with it on (its default)
    transformers 5 fails in plain PyTorch when given a padding mask."""
    transformers = pytest.importorskip("transformers")
    config = transformers.RecurrentGemmaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=2, lru_width=32, attention_window_size=16,
                                               pad_token_id=0, bos_token_id=1, eos_token_id=2, use_cache=False)
    return transformers.RecurrentGemmaForCausalLM(config), _causal_lm_step


def wav2vec2() -> tuple[nn.Module, Callable[[nn.Module], Step]]:
    """Wav2Vec2 fine-tuned for CTC as Hugging Face's speech-recognition example does: the
    convolutional feature encoder frozen, SpecAugment on (its masks come from ``np.random``)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Wav2Vec2Config(vocab_size=12, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, conv_dim=(32,) * 7, num_conv_pos_embeddings=16)
    model = transformers.Wav2Vec2ForCTC(config)
    model.freeze_feature_encoder()

    def make_step(model: nn.Module) -> Step:
        g = torch.Generator().manual_seed(5)
        audio, labels = torch.randn(2, 8000, generator=g), torch.randint(1, 12, (2, 6), generator=g)

        def step() -> torch.Tensor:
            loss = model(input_values=audio, labels=labels).loss
            loss.backward()
            return loss

        return step

    return model, make_step


def _causal_lm_step(model: nn.Module) -> Step:
    ids, mask = _tokens(128)

    def step() -> torch.Tensor:
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        return loss

    return step


def t5() -> tuple[nn.Module, Callable[[nn.Module], Step]]:
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0)

    def make_step(model: nn.Module) -> Step:
        ids, mask = _tokens(128)
        labels = ids[:, :8].flip(1)

        def step() -> torch.Tensor:
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            return loss

        return step

    return transformers.T5ForConditionalGeneration(config), make_step


class _DenseLayer(nn.Module):
    def __init__(self, channels: int, growth: int) -> None:
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(channels), nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(channels, 4 * growth, 1, bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(4 * growth), nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)
        self.drop_rate = 0.1

    def forward(self, features: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        prev = [features] if isinstance(features, torch.Tensor) else features
        x = self.conv1(self.relu1(self.norm1(torch.cat(prev, 1))))
        x = self.conv2(self.relu2(self.norm2(x)))
        return F.dropout(x, p=self.drop_rate, training=self.training)


class _DenseBlock(nn.ModuleDict):
    def __init__(self, layers: int, channels: int, growth: int) -> None:
        super().__init__({f"denselayer{i + 1}": _DenseLayer(channels + i * growth, growth) for i in range(layers)})

    def forward(self, init: torch.Tensor) -> torch.Tensor:
        features = [init]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


class DenseNet(nn.Module):
    def __init__(self, growth: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True))
        self.block1 = _DenseBlock(3, 16, growth)
        self.norm5 = nn.BatchNorm2d(16 + 3 * growth)
        self.classifier = nn.Linear(16 + 3 * growth, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.norm5(self.block1(self.features(x))))
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class _EncoderBlock(nn.Module):
    def __init__(self, heads: int, dim: int, mlp: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Dropout(dropout), nn.Linear(mlp, dim), nn.Dropout(dropout))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x = self.ln_1(input)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x) + input
        return x + self.mlp(self.ln_2(x))


class VisionTransformer(nn.Module):
    def __init__(self, dim: int = 32, layers: int = 2, classes: int = 10) -> None:
        super().__init__()
        self.conv_proj = nn.Conv2d(3, dim, 4, 4)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.randn(1, 17, dim) * 0.02)
        self.layers = nn.Sequential(*[_EncoderBlock(2, dim, 2 * dim) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim, eps=1e-6)
        self.heads = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embedding
        return self.heads(self.ln(self.layers(x))[:, 0])


def _image_step(model: nn.Module) -> Step:
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)

    def step() -> torch.Tensor:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    return step


def _discriminator(spectral_norm: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """A GAN discriminator (SNGAN, BigGAN, HiFi-GAN's): every layer spectrally normalised, its
    power-iteration vectors updated in place by each training forward."""
    return nn.Sequential(nn.Sequential(spectral_norm(nn.Conv2d(3, 16, 3, padding=1)), nn.LeakyReLU(0.2)),
                         nn.Sequential(spectral_norm(nn.Conv2d(16, 16, 4, 2, 1)), nn.LeakyReLU(0.2)),
                         nn.Flatten(), spectral_norm(nn.Linear(16 * 8 * 8, 10)))


def spectral_norm() -> tuple[nn.Module, Callable[[nn.Module], Step]]:
    return _discriminator(nn.utils.parametrizations.spectral_norm), _image_step


def spectral_norm_hook() -> tuple[nn.Module, Callable[[nn.Module], Step]]:
    """The older form, a forward pre-hook that sets the normalised weight as a plain attribute."""
    return _discriminator(nn.utils.spectral_norm), _image_step


def densenet() -> tuple[nn.Module, Callable[[nn.Module], Step]]:
    return DenseNet(), _image_step


def vit() -> tuple[nn.Module, Callable[[nn.Module], Step]]:
    return VisionTransformer(), _image_step


def compiled_cnn() -> tuple[nn.Module, Callable[[nn.Module], Step]]:
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                        nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    return torch.compile(cnn, backend="aot_eager"), _image_step


#: name -> builder, for parametrized tests
ZOO: dict[str, Callable[[], tuple[nn.Module, Callable[[nn.Module], Step]]]] = {
    "gpt2": gpt2, "llama": llama, "t5": t5, "wav2vec2": wav2vec2, "recurrent-gemma": recurrent_gemma, "densenet": densenet, "vit": vit,
    "spectral-norm": spectral_norm, "spectral-norm-hook": spectral_norm_hook, "compiled-cnn": compiled_cnn,
}
