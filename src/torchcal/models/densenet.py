"""DenseNet-121 for CIFAR as in the focal-calibration papers' code.

Growth rate 32, dense blocks [6, 12, 24, 16], bottleneck layers BN-ReLU-conv1x1 (4 x growth)
-BN-ReLU-conv3x3 (growth) whose output is concatenated to the input, transitions BN-ReLU-conv1x1
with compression 0.5 and 2x2 average pooling, a 3x3 stem with 2 x growth channels, a final
BN-ReLU and global average pooling.  6,956,298 parameters at 10 classes, 7,048,548 at 100.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._registry import register_model

__all__ = ["DenseNet", "densenet121"]


class _DenseLayer(nn.Module):
    def __init__(self, in_planes: int, growth_rate: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, 4 * growth_rate, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(4 * growth_rate)
        self.conv2 = nn.Conv2d(4 * growth_rate, growth_rate, 3, padding=1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out = self.conv1(F.relu(self.bn1(x)))
        out = self.conv2(F.relu(self.bn2(out)))
        return torch.cat([out, x], 1)


class _Transition(nn.Module):
    def __init__(self, in_planes: int, out_planes: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(in_planes)
        self.conv = nn.Conv2d(in_planes, out_planes, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return F.avg_pool2d(self.conv(F.relu(self.bn(x))), 2)


class DenseNet(nn.Module):
    """CIFAR DenseNet-BC.

    Args:
        block_config: layers per dense block.
        growth_rate: channels added by each layer.
        reduction: compression of the transitions (output ``floor(reduction * in)`` channels).
        num_classes: number of logits.
        in_channels: input image channels.
    """

    def __init__(self, block_config: Sequence[int] = (6, 12, 24, 16), growth_rate: int = 32,
                 reduction: float = 0.5, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        planes = 2 * growth_rate
        self.conv1 = nn.Conv2d(in_channels, planes, 3, padding=1, bias=False)
        # Blocks named dense1, trans1, dense2, ... as in the published code.
        self._stages: list[str] = []
        for i, n in enumerate(block_config):
            layers = []
            for _ in range(n):
                layers.append(_DenseLayer(planes, growth_rate))
                planes += growth_rate
            setattr(self, f"dense{i + 1}", nn.Sequential(*layers))
            self._stages.append(f"dense{i + 1}")
            if i != len(block_config) - 1:
                out_planes = int(math.floor(planes * reduction))
                setattr(self, f"trans{i + 1}", _Transition(planes, out_planes))
                self._stages.append(f"trans{i + 1}")
                planes = out_planes
        self.bn = nn.BatchNorm2d(planes)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.num_features = planes
        self.fc = nn.Linear(planes, num_classes)

    def forward_features(self, x: Tensor) -> Tensor:
        out = self.conv1(x)
        for name in self._stages:
            out = getattr(self, name)(out)
        out = F.relu(self.bn(out))
        return torch.flatten(self.pool(out), 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.forward_features(x))


@register_model("densenet121")
def densenet121(num_classes: int = 10, **kw) -> DenseNet:
    """DenseNet-121 for CIFAR (6,956,298 parameters at 10 classes)."""
    return DenseNet((6, 12, 24, 16), 32, 0.5, num_classes, **kw)
