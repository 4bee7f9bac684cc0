"""SqueezeNet 1.1 (Iandola et al., 2016; the v1.1 revision of the reference implementation).

A 3x3 stride-2 stem with 64 channels, eight Fire modules (1x1 squeeze, then concatenated 1x1 and
3x3 expands) between three max pools, and a 1x1 convolution to the classes followed by global
average pooling: 1.235M parameters at ``width_mult=1``, 2.4x less computation than 1.0.

Example:
    >>> import torch
    >>> model = squeezenet1_1(num_classes=10, width_mult=0.25).eval()
    >>> model(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn

from cswap.models._common import check_common, on_meta, scaled

__all__ = ["FIRE_SETTING_1_1", "Fire", "SqueezeNet", "squeezenet1_1"]

#: (squeeze, expand 1x1, expand 3x3) per Fire module, ``None`` for a 3x3 stride-2 max pool.
FIRE_SETTING_1_1: tuple[tuple[int, int, int] | None, ...] = (
    None,
    (16, 64, 64),
    (16, 64, 64),
    None,
    (32, 128, 128),
    (32, 128, 128),
    None,
    (48, 192, 192),
    (48, 192, 192),
    (64, 256, 256),
    (64, 256, 256),
)


class Fire(nn.Module):
    """Squeeze (1x1) then expand (1x1 and 3x3, concatenated); output channels = ``expand1x1 + expand3x3``.

    Args:
        in_channels: input channels.
        squeeze: channels of the 1x1 squeeze.
        expand1x1: channels of the 1x1 expand.
        expand3x3: channels of the 3x3 expand.
    """

    def __init__(self, in_channels: int, squeeze: int, expand1x1: int, expand3x3: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(in_channels, squeeze, kernel_size=1)
        self.squeeze_activation = nn.ReLU(inplace=False)
        self.expand1x1 = nn.Conv2d(squeeze, expand1x1, kernel_size=1)
        self.expand1x1_activation = nn.ReLU(inplace=False)
        self.expand3x3 = nn.Conv2d(squeeze, expand3x3, kernel_size=3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.squeeze_activation(self.squeeze(x))
        return torch.cat(
            [self.expand1x1_activation(self.expand1x1(x)), self.expand3x3_activation(self.expand3x3(x))], dim=1
        )


class SqueezeNet(nn.Module):
    """SqueezeNet 1.1: ``features`` (stem, pools, Fire modules), ``classifier`` (1x1 conv, average pool).

    Args:
        num_classes: outputs (channels of the final 1x1 convolution).
        width_mult: scales the stem and every Fire module's channels.
        dropout: dropout probability before the final convolution.
    """

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.5) -> None:
        super().__init__()
        check_common(num_classes, width_mult)
        in_channels = scaled(64, width_mult)
        layers: list[nn.Module] = [nn.Conv2d(3, in_channels, kernel_size=3, stride=2), nn.ReLU(inplace=False)]
        for setting in FIRE_SETTING_1_1:
            if setting is None:
                layers.append(nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True))
                continue
            squeeze, expand1x1, expand3x3 = (scaled(c, width_mult) for c in setting)
            layers.append(Fire(in_channels, squeeze, expand1x1, expand3x3))
            in_channels = expand1x1 + expand3x3
        self.features = nn.Sequential(*layers)
        final_conv = nn.Conv2d(in_channels, num_classes, kernel_size=1)
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout), final_conv, nn.ReLU(inplace=False), nn.AdaptiveAvgPool2d((1, 1))
        )
        self._init_weights(final_conv)

    def _init_weights(self, final_conv: nn.Conv2d) -> None:
        if on_meta(self):
            return
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                if module is final_conv:
                    nn.init.normal_(module.weight, mean=0.0, std=0.01)
                else:
                    nn.init.kaiming_uniform_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.classifier(self.features(x)), 1)


def squeezenet1_1(num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.5) -> SqueezeNet:
    """SqueezeNet 1.1; see :class:`SqueezeNet` for the arguments."""
    return SqueezeNet(num_classes=num_classes, width_mult=width_mult, dropout=dropout)
