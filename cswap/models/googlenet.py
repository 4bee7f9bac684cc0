"""GoogLeNet / Inception v1 (Szegedy et al., 2015), as torchvision defines it.

Stem (7x7 stride-2, 1x1, 3x3 convolutions and max pools), nine Inception modules (Table 1 of the
paper) in three groups separated by max pools, global average pool, dropout and one fully connected
layer. Every convolution is followed by batch normalisation, and the "5x5" branch uses a 3x3
convolution, both as torchvision does: 6.62M parameters at ``width_mult=1``.
``branch3_kernel_size=5`` restores the paper's 5x5 branch (7.01M). The auxiliary classifiers, used
only for training in the paper, are left out.

Example:
    >>> import torch
    >>> model = googlenet(num_classes=10, width_mult=0.125).eval()
    >>> model(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn

from cswap.models._common import check_common, on_meta, scaled

__all__ = ["GoogLeNet", "INCEPTION_SETTING", "Inception", "googlenet"]

#: (#1x1, #3x3 reduce, #3x3, #5x5 reduce, #5x5, pool proj) per Inception module, ``"M"`` for a max pool.
INCEPTION_SETTING: tuple[tuple[int, int, int, int, int, int] | tuple[str, int], ...] = (
    (64, 96, 128, 16, 32, 32),  # 3a
    (128, 128, 192, 32, 96, 64),  # 3b
    ("M", 3),
    (192, 96, 208, 16, 48, 64),  # 4a
    (160, 112, 224, 24, 64, 64),  # 4b
    (128, 128, 256, 24, 64, 64),  # 4c
    (112, 144, 288, 32, 64, 64),  # 4d
    (256, 160, 320, 32, 128, 128),  # 4e
    ("M", 2),
    (256, 160, 320, 32, 128, 128),  # 5a
    (384, 192, 384, 48, 128, 128),  # 5b
)


class _ConvBNReLU(nn.Sequential):
    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0
    ) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=False),
            nn.BatchNorm2d(out_channels, eps=0.001),
            nn.ReLU(inplace=False),
        )


class Inception(nn.Module):
    """Four parallel branches concatenated: 1x1; 1x1 then 3x3; 1x1 then k x k; 3x3 max pool then 1x1.

    Args:
        in_channels: input channels.
        ch1x1, ch3x3red, ch3x3, ch5x5red, ch5x5, pool_proj: branch widths as in the paper's Table 1.
        branch3_kernel_size: kernel of the third branch's second convolution (3 as torchvision, 5 as the paper).
    """

    def __init__(
        self,
        in_channels: int,
        ch1x1: int,
        ch3x3red: int,
        ch3x3: int,
        ch5x5red: int,
        ch5x5: int,
        pool_proj: int,
        branch3_kernel_size: int = 3,
    ) -> None:
        super().__init__()
        self.branch1 = _ConvBNReLU(in_channels, ch1x1, kernel_size=1)
        self.branch2 = nn.Sequential(
            _ConvBNReLU(in_channels, ch3x3red, kernel_size=1), _ConvBNReLU(ch3x3red, ch3x3, kernel_size=3, padding=1)
        )
        self.branch3 = nn.Sequential(
            _ConvBNReLU(in_channels, ch5x5red, kernel_size=1),
            _ConvBNReLU(ch5x5red, ch5x5, kernel_size=branch3_kernel_size, padding=branch3_kernel_size // 2),
        )
        self.branch4 = nn.Sequential(
            nn.MaxPool2d(kernel_size=3, stride=1, padding=1, ceil_mode=True),
            _ConvBNReLU(in_channels, pool_proj, kernel_size=1),
        )
        self.out_channels = ch1x1 + ch3x3 + ch5x5 + pool_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], dim=1)


class GoogLeNet(nn.Module):
    """GoogLeNet: ``stem``, ``inceptions`` (modules and pools), global average pool, dropout, ``fc``.

    Args:
        num_classes: outputs of the last layer.
        width_mult: scales the stem and every Inception branch.
        dropout: dropout probability before ``fc``.
        branch3_kernel_size: 3 (torchvision's GoogLeNet) or 5 (the paper's).
    """

    def __init__(
        self,
        num_classes: int = 1000,
        width_mult: float = 1.0,
        dropout: float = 0.2,
        branch3_kernel_size: int = 3,
    ) -> None:
        super().__init__()
        check_common(num_classes, width_mult)
        if branch3_kernel_size not in (3, 5):
            raise ValueError(f"branch3_kernel_size must be 3 (torchvision) or 5 (paper), got {branch3_kernel_size!r}")
        c64, c192 = scaled(64, width_mult), scaled(192, width_mult)
        self.stem = nn.Sequential(
            _ConvBNReLU(3, c64, kernel_size=7, stride=2, padding=3),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            _ConvBNReLU(c64, c64, kernel_size=1),
            _ConvBNReLU(c64, c192, kernel_size=3, padding=1),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
        )
        in_channels = c192
        layers: list[nn.Module] = []
        for setting in INCEPTION_SETTING:
            if setting[0] == "M":
                layers.append(nn.MaxPool2d(kernel_size=int(setting[1]), stride=2, ceil_mode=True))
                continue
            widths = (scaled(int(c), width_mult) for c in setting)
            module = Inception(in_channels, *widths, branch3_kernel_size=branch3_kernel_size)
            layers.append(module)
            in_channels = module.out_channels
        self.inceptions = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(p=dropout)
        self.fc = nn.Linear(in_channels, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        if on_meta(self):
            return
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(module.weight, mean=0.0, std=0.01, a=-2, b=2)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.inceptions(self.stem(x)))
        return self.fc(self.dropout(torch.flatten(x, 1)))


def googlenet(
    num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.2, branch3_kernel_size: int = 3
) -> GoogLeNet:
    """GoogLeNet (Inception v1) without auxiliary classifiers; see :class:`GoogLeNet` for the arguments."""
    return GoogLeNet(
        num_classes=num_classes, width_mult=width_mult, dropout=dropout, branch3_kernel_size=branch3_kernel_size
    )
