"""ResNet (He et al., 2016): ResNet-18 (basic blocks) and ResNet-50 (bottleneck blocks).

The ImageNet stem (7x7 stride-2 convolution, 3x3 stride-2 max pool), four stages of residual blocks
at 64-128-256-512 base channels, global average pool, one fully connected layer. ResNet-50 puts the
stride on the 3x3 convolution of its bottleneck ("ResNet v1.5", as torchvision does). Residual sums
are out of place so that every tensor autograd saves keeps its version.

Example:
    >>> import torch
    >>> model = resnet18(num_classes=10, width_mult=0.25).eval()
    >>> model(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn

from cswap.models._common import check_common, on_meta, scaled

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet50"]


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a shortcut; output channels = ``planes``.

    Args:
        in_channels: input channels.
        planes: channels of both convolutions.
        stride: stride of the first convolution (and of the projection shortcut).
        downsample: projection shortcut, or None for the identity.
    """

    expansion = 1

    def __init__(self, in_channels: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_channels, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=False)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4, with a shortcut; output channels = ``4 * planes``.

    Args:
        in_channels: input channels.
        planes: channels of the 1x1 reduce and the 3x3 convolution.
        stride: stride of the 3x3 convolution (and of the projection shortcut).
        downsample: projection shortcut, or None for the identity.
    """

    expansion = 4

    def __init__(self, in_channels: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv1x1(in_channels, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=False)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """ResNet: stem, ``layer1``..``layer4``, global average pool, ``fc``.

    Args:
        block: :class:`BasicBlock` or :class:`Bottleneck`.
        layers: blocks per stage, e.g. ``(2, 2, 2, 2)`` for ResNet-18.
        num_classes: outputs of the last layer.
        width_mult: scales the stem and every stage's channels.
        zero_init_residual: start each block's last batch norm at zero, so blocks begin as identities.
    """

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        layers: tuple[int, int, int, int],
        num_classes: int = 1000,
        width_mult: float = 1.0,
        zero_init_residual: bool = False,
    ) -> None:
        super().__init__()
        check_common(num_classes, width_mult)
        self._in_channels = scaled(64, width_mult)
        self.conv1 = nn.Conv2d(3, self._in_channels, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self._in_channels)
        self.relu = nn.ReLU(inplace=False)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_stage(block, scaled(64, width_mult), layers[0], stride=1)
        self.layer2 = self._make_stage(block, scaled(128, width_mult), layers[1], stride=2)
        self.layer3 = self._make_stage(block, scaled(256, width_mult), layers[2], stride=2)
        self.layer4 = self._make_stage(block, scaled(512, width_mult), layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(self._in_channels, num_classes)
        self._init_weights(zero_init_residual)

    def _make_stage(
        self, block: type[BasicBlock] | type[Bottleneck], planes: int, blocks: int, stride: int
    ) -> nn.Sequential:
        out_channels = planes * block.expansion
        downsample = None
        if stride != 1 or self._in_channels != out_channels:
            downsample = nn.Sequential(
                _conv1x1(self._in_channels, out_channels, stride), nn.BatchNorm2d(out_channels)
            )
        stage = [block(self._in_channels, planes, stride, downsample)]
        self._in_channels = out_channels
        stage.extend(block(out_channels, planes) for _ in range(1, blocks))
        return nn.Sequential(*stage)

    def _init_weights(self, zero_init_residual: bool) -> None:
        if on_meta(self):
            return
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        if zero_init_residual:
            for module in self.modules():
                if isinstance(module, Bottleneck):
                    nn.init.zeros_(module.bn3.weight)
                elif isinstance(module, BasicBlock):
                    nn.init.zeros_(module.bn2.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 1000, width_mult: float = 1.0, zero_init_residual: bool = False) -> ResNet:
    """ResNet-18: basic blocks, (2, 2, 2, 2); see :class:`ResNet` for the arguments."""
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes, width_mult, zero_init_residual)


def resnet50(num_classes: int = 1000, width_mult: float = 1.0, zero_init_residual: bool = False) -> ResNet:
    """ResNet-50: bottleneck blocks, (3, 4, 6, 3); see :class:`ResNet` for the arguments."""
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes, width_mult, zero_init_residual)
