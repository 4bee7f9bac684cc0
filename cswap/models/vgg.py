"""VGG (Simonyan & Zisserman, 2015): configurations A (VGG-11), D (VGG-16) and E (VGG-19).

Stacks of 3x3 convolutions separated by 2x2 max pools, then three fully connected layers
(4096-4096-classes). An adaptive average pool fixes the classifier's input at 7x7, so the network
runs at 224x224 and at 32x32 (where the last pool leaves 1x1). Plain VGG as in the paper by
default; ``batch_norm=True`` inserts batch normalisation after each convolution.

Example:
    >>> import torch
    >>> model = vgg16(num_classes=10, width_mult=0.125).eval()
    >>> model(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

from types import MappingProxyType

import torch
from torch import nn

from cswap.models._common import check_common, on_meta, scaled

__all__ = ["VGG", "VGG_CONFIGS", "vgg11", "vgg16", "vgg19"]

#: Channel counts per convolution, ``"M"`` for a 2x2 max pool (Table 1 of the paper).
VGG_CONFIGS: MappingProxyType[str, tuple[int | str, ...]] = MappingProxyType(
    {
        "A": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
        "D": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
        "E": (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"),
    }
)


class VGG(nn.Module):
    """VGG: ``features`` (convolutions and pools), ``avgpool`` (adaptive, 7x7), ``classifier``.

    Args:
        config: ``"A"``, ``"D"`` or ``"E"`` (VGG-11, -16, -19), see :data:`VGG_CONFIGS`.
        num_classes: outputs of the last layer.
        width_mult: scales every convolution's channels and the two hidden fully connected widths.
        batch_norm: insert ``BatchNorm2d`` after each convolution (not in the paper).
        dropout: dropout probability after each hidden fully connected layer.
    """

    def __init__(
        self,
        config: str,
        num_classes: int = 1000,
        width_mult: float = 1.0,
        batch_norm: bool = False,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        check_common(num_classes, width_mult)
        if config not in VGG_CONFIGS:
            raise ValueError(f"unknown VGG config {config!r}: choose one of {', '.join(VGG_CONFIGS)}")
        layers: list[nn.Module] = []
        in_channels = 3
        for item in VGG_CONFIGS[config]:
            if item == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
                continue
            out_channels = scaled(int(item), width_mult)
            layers.append(nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1))
            if batch_norm:
                layers.append(nn.BatchNorm2d(out_channels))
            layers.append(nn.ReLU(inplace=False))
            in_channels = out_channels
        hidden = scaled(4096, width_mult)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(in_channels * 7 * 7, hidden),
            nn.ReLU(inplace=False),
            nn.Dropout(p=dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=False),
            nn.Dropout(p=dropout),
            nn.Linear(hidden, num_classes),
        )
        self._init_weights()

    def _init_weights(self) -> None:
        if on_meta(self):
            return
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def vgg11(num_classes: int = 1000, width_mult: float = 1.0, batch_norm: bool = False, dropout: float = 0.5) -> VGG:
    """VGG-11 (configuration A); see :class:`VGG` for the arguments."""
    return VGG("A", num_classes=num_classes, width_mult=width_mult, batch_norm=batch_norm, dropout=dropout)


def vgg16(num_classes: int = 1000, width_mult: float = 1.0, batch_norm: bool = False, dropout: float = 0.5) -> VGG:
    """VGG-16 (configuration D); see :class:`VGG` for the arguments."""
    return VGG("D", num_classes=num_classes, width_mult=width_mult, batch_norm=batch_norm, dropout=dropout)


def vgg19(num_classes: int = 1000, width_mult: float = 1.0, batch_norm: bool = False, dropout: float = 0.5) -> VGG:
    """VGG-19 (configuration E); see :class:`VGG` for the arguments."""
    return VGG("E", num_classes=num_classes, width_mult=width_mult, batch_norm=batch_norm, dropout=dropout)
