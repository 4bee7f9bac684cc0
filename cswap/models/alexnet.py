"""AlexNet (Krizhevsky et al., 2012) in the single-tower form of torchvision (Krizhevsky, 2014).

Five convolutions (64-192-384-256-256 channels) and three fully connected layers (4096-4096-classes),
61.1M parameters at ``width_mult=1``. An adaptive average pool fixes the classifier's input at 6x6,
so the network runs at 224x224 and at small inputs such as 32x32.

Example:
    >>> import torch
    >>> model = alexnet(num_classes=10, width_mult=0.125).eval()
    >>> model(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cswap.models._common import check_common, scaled

__all__ = ["AlexNet", "alexnet"]


class _MaxPool2dClamped(nn.MaxPool2d):
    """``nn.MaxPool2d`` whose window shrinks to the input when the input is smaller than the window.

    At 224x224 it is exactly ``nn.MaxPool2d(3, 2)``; at 32x32 AlexNet's last pool sees a 1x1 map,
    which a plain 3x3 pool rejects.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[-2:]
        kernel = self.kernel_size if isinstance(self.kernel_size, int) else max(self.kernel_size)
        if height >= kernel and width >= kernel:
            return super().forward(x)
        return F.max_pool2d(x, kernel_size=(min(kernel, height), min(kernel, width)), stride=self.stride)


class AlexNet(nn.Module):
    """AlexNet: ``features`` (convolutions), ``avgpool`` (adaptive, 6x6), ``classifier``.

    Args:
        num_classes: outputs of the last layer.
        width_mult: scales every convolution's channels and the two hidden fully connected widths.
        dropout: dropout probability before each hidden fully connected layer.
    """

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.5) -> None:
        super().__init__()
        check_common(num_classes, width_mult)
        c1, c2, c3, c4, c5 = (scaled(c, width_mult) for c in (64, 192, 384, 256, 256))
        hidden = scaled(4096, width_mult)
        self.features = nn.Sequential(
            nn.Conv2d(3, c1, kernel_size=11, stride=4, padding=2),
            nn.ReLU(inplace=False),
            _MaxPool2dClamped(kernel_size=3, stride=2),
            nn.Conv2d(c1, c2, kernel_size=5, padding=2),
            nn.ReLU(inplace=False),
            _MaxPool2dClamped(kernel_size=3, stride=2),
            nn.Conv2d(c2, c3, kernel_size=3, padding=1),
            nn.ReLU(inplace=False),
            nn.Conv2d(c3, c4, kernel_size=3, padding=1),
            nn.ReLU(inplace=False),
            nn.Conv2d(c4, c5, kernel_size=3, padding=1),
            nn.ReLU(inplace=False),
            _MaxPool2dClamped(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(c5 * 6 * 6, hidden),
            nn.ReLU(inplace=False),
            nn.Dropout(p=dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=False),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def alexnet(num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.5) -> AlexNet:
    """AlexNet; see :class:`AlexNet` for the arguments."""
    return AlexNet(num_classes=num_classes, width_mult=width_mult, dropout=dropout)
