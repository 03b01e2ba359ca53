"""Wide-ResNet-26-10 as in the focal-calibration papers' code.

Post-activation basic blocks (conv-BN-ReLU, conv-BN, add, ReLU), (26 - 2) / 6 = 4 blocks per
stage, widths 16·k / 32·k / 64·k with k = 10, a 1x1 convolution + BN shortcut where the shape
changes, a conv-BN-ReLU 3x3 stem with 16 channels, no dropout, and average pooling over the final
8x8 map.  36,481,434 parameters at 10 classes, 36,539,124 at 100.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._registry import register_model

__all__ = ["WideResNet", "wrn26_10"]


class _WideBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class WideResNet(nn.Module):
    """Wide-ResNet-``depth``-``widen_factor`` (post-activation, no dropout).

    Args:
        depth: total depth, ``6n + 2`` (26 gives n = 4 blocks per stage).
        widen_factor: k; stage widths 16k, 32k, 64k.
        num_classes: number of logits.
        in_channels: input image channels.

    Shapes: input (N, in_channels, H, W) (32x32 on CIFAR; the final map is average-pooled to
    1x1, which is the published ``avg_pool2d(out, 8)`` at 32x32); output (N, num_classes).
    """

    def __init__(self, depth: int = 26, widen_factor: int = 10, num_classes: int = 10,
                 in_channels: int = 3) -> None:
        super().__init__()
        if (depth - 2) % 6 != 0 or depth < 8:
            raise ValueError(f"Expected `depth` of the form 6n+2 (n >= 1), got {depth!r}")
        n = (depth - 2) // 6
        widths = [16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        in_planes = 16
        for i, w in enumerate(widths):
            blocks = []
            for j in range(n):
                blocks.append(_WideBlock(in_planes, w, (1 if i == 0 else 2) if j == 0 else 1))
                in_planes = w
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.num_features = widths[-1]
        self.fc = nn.Linear(self.num_features, num_classes)

    def forward_features(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        return torch.flatten(self.pool(out), 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.forward_features(x))


@register_model("wrn26_10")
def wrn26_10(num_classes: int = 10, **kw) -> WideResNet:
    """Wide-ResNet-26-10 (36,481,434 parameters at 10 classes)."""
    return WideResNet(26, 10, num_classes, **kw)
