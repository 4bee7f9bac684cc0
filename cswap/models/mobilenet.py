"""MobileNetV2 (Sandler et al., 2018): inverted residual blocks with linear bottlenecks.

A 3x3 stride-2 stem, seventeen inverted residual blocks (expand 1x1, depthwise 3x3, project 1x1;
Table 2 of the paper), a 1x1 convolution to 1280 channels, global average pool, dropout and one
fully connected layer: 3.50M parameters at ``width_mult=1``. As in the paper, channel counts are
rounded to multiples of 8 (never below 8), and a width multiplier below 1 leaves the last
convolution at 1280 channels.

Example:
    >>> import torch
    >>> model = mobilenet_v2(num_classes=10, width_mult=0.25).eval()
    >>> model(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn

from cswap.models._common import check_common, on_meta

__all__ = ["INVERTED_RESIDUAL_SETTING", "InvertedResidual", "MobileNetV2", "make_divisible", "mobilenet_v2"]

#: (expansion t, output channels c, repeats n, first stride s) per stage, Table 2 of the paper.
INVERTED_RESIDUAL_SETTING: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round ``value`` to the nearest multiple of ``divisor`` (at least ``min_value``, default ``divisor``),
    going up a step where rounding down would lose more than 10%.

    Example:
        >>> make_divisible(32 * 0.125)
        8
        >>> make_divisible(1280 * 1.4)
        1792
    """
    min_value = divisor if min_value is None else min_value
    rounded = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return rounded


def _conv_bn_relu6(
    in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, groups: int = 1
) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, stride, (kernel_size - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU6(inplace=False),
    )


class InvertedResidual(nn.Module):
    """Expand (1x1, ReLU6), depthwise 3x3 (ReLU6), project (1x1, linear); residual when shapes allow.

    Args:
        in_channels: input channels.
        out_channels: output channels.
        stride: depthwise stride, 1 or 2.
        expand_ratio: hidden channels = ``round(in_channels * expand_ratio)``.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {stride}")
        hidden = int(round(in_channels * expand_ratio))
        self.use_residual = stride == 1 and in_channels == out_channels
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(_conv_bn_relu6(in_channels, hidden, kernel_size=1))
        layers.extend(
            [
                _conv_bn_relu6(hidden, hidden, kernel_size=3, stride=stride, groups=hidden),
                nn.Conv2d(hidden, out_channels, kernel_size=1, bias=False),
                nn.BatchNorm2d(out_channels),
            ]
        )
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        return x + out if self.use_residual else out


class MobileNetV2(nn.Module):
    """MobileNetV2: ``features`` (stem, inverted residuals, last 1x1), global average pool, ``classifier``.

    Args:
        num_classes: outputs of the last layer.
        width_mult: scales every stage's channels (rounded to multiples of 8, at least 8); the last
            convolution's 1280 channels only grow, for ``width_mult > 1``.
        dropout: dropout probability before the classifier.
    """

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.2) -> None:
        super().__init__()
        check_common(num_classes, width_mult)
        in_channels = make_divisible(32 * width_mult)
        self.last_channel = make_divisible(1280 * max(1.0, width_mult))
        layers: list[nn.Module] = [_conv_bn_relu6(3, in_channels, kernel_size=3, stride=2)]
        for expand_ratio, channels, repeats, stride in INVERTED_RESIDUAL_SETTING:
            out_channels = make_divisible(channels * width_mult)
            for index in range(repeats):
                layers.append(InvertedResidual(in_channels, out_channels, stride if index == 0 else 1, expand_ratio))
                in_channels = out_channels
        layers.append(_conv_bn_relu6(in_channels, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(self.last_channel, num_classes))
        self._init_weights()

    def _init_weights(self) -> None:
        if on_meta(self):
            return
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2(num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.2) -> MobileNetV2:
    """MobileNetV2; see :class:`MobileNetV2` for the arguments."""
    return MobileNetV2(num_classes=num_classes, width_mult=width_mult, dropout=dropout)
