"""ResNets: the CIFAR bottleneck ResNet-50/110 of the focal-calibration papers, their
Tiny-ImageNet variant, the standard ImageNet ResNet-50, and a small CIFAR ResNet-20.

The CIFAR definitions follow the published training code of Mukhoti et al. (2020), Ghosh et al.
(2022) and Tao et al. (2023) (itself the widely used ``kuangliu/pytorch-cifar`` layout): a 3x3
stride-1 stem with 64 channels, no max-pool, bottleneck blocks (expansion 4) whose 1x1 projection
shortcut has a BatchNorm, global average pooling and a linear classifier; PyTorch's default
initialisation.  Parameter counts (10 / 100 classes): ResNet-50 23,520,842 / 23,705,252,
"ResNet-110" ([3, 4, 26, 3] bottlenecks) 45,864,522 / 46,048,932; the Tiny-ImageNet ResNet-50
(``AdaptiveAvgPool2d(2)``, 8192 -> 200) 25,138,952.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._registry import register_model

__all__ = [
    "BasicBlock",
    "Bottleneck",
    "CifarResNet",
    "ImageNetResNet",
    "resnet20",
    "resnet50",
    "resnet110",
    "resnet50_tiny",
    "imagenet_resnet50",
]


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BN-ReLU and a projection shortcut when the shape changes."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
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


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride), 1x1 expand (x4); BN after each; projection shortcut."""

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out_planes = self.expansion * planes
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_planes, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != out_planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, out_planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_planes),
            )

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """A CIFAR-style ResNet: 3x3 stride-1 stem, no max-pool, stages with strides 1, 2, 2, (2).

    Args:
        block: :class:`BasicBlock` or :class:`Bottleneck`.
        num_blocks: blocks per stage.
        num_classes: number of logits.
        widths: base width of each stage (``len(widths) == len(num_blocks)``).
        in_channels: input image channels.
        pool_size: output size of the final adaptive average pool (1: global average pooling;
            2 for the Tiny-ImageNet ResNet-50, whose 8x8 last feature map is pooled to 2x2).

    Shapes: input (N, in_channels, H, W); ``forward_features`` (N, num_features) with
    ``num_features = widths[-1] * block.expansion * pool_size**2``; output (N, num_classes).
    """

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        num_blocks: Sequence[int],
        num_classes: int = 10,
        widths: Sequence[int] = (64, 128, 256, 512),
        in_channels: int = 3,
        pool_size: int = 1,
    ) -> None:
        super().__init__()
        if len(widths) != len(num_blocks):
            raise ValueError(
                f"Expected `widths` and `num_blocks` of equal length, got {len(widths)} and {len(num_blocks)}"
            )
        self.in_planes = widths[0]
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        # Stages named layer1, layer2, ... as in the published code (state dicts load as is).
        self.num_stages = len(num_blocks)
        for i, (w, n) in enumerate(zip(widths, num_blocks, strict=True)):
            setattr(self, f"layer{i + 1}", self._make_layer(block, w, n, stride=1 if i == 0 else 2))
        self.pool = nn.AdaptiveAvgPool2d(pool_size)
        self.num_features = widths[-1] * block.expansion * pool_size * pool_size
        self.fc = nn.Linear(self.num_features, num_classes)

    def _make_layer(self, block, planes: int, n: int, stride: int) -> nn.Sequential:
        layers = []
        for s in [stride] + [1] * (n - 1):
            layers.append(block(self.in_planes, planes, s))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    def forward_features(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        for i in range(1, self.num_stages + 1):
            out = getattr(self, f"layer{i}")(out)
        return torch.flatten(self.pool(out), 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.forward_features(x))


@register_model("resnet50")
def resnet50(num_classes: int = 10, **kw) -> CifarResNet:
    """CIFAR ResNet-50: bottleneck blocks [3, 4, 6, 3] (23,520,842 parameters at 10 classes)."""
    return CifarResNet(Bottleneck, [3, 4, 6, 3], num_classes, **kw)


@register_model("resnet110")
def resnet110(num_classes: int = 10, **kw) -> CifarResNet:
    """The papers' "ResNet-110": the CIFAR bottleneck net with [3, 4, 26, 3] blocks."""
    return CifarResNet(Bottleneck, [3, 4, 26, 3], num_classes, **kw)


@register_model("resnet50_tiny")
def resnet50_tiny(num_classes: int = 200, **kw) -> CifarResNet:
    """Tiny-ImageNet ResNet-50: the CIFAR ResNet-50 with ``AdaptiveAvgPool2d(2)`` (8192 -> C)."""
    kw.setdefault("pool_size", 2)
    return CifarResNet(Bottleneck, [3, 4, 6, 3], num_classes, **kw)


@register_model("resnet20")
def resnet20(num_classes: int = 10, **kw) -> CifarResNet:
    """A small CIFAR ResNet-20 (He et al. 2016, 3x3 basic blocks, widths 16/32/64).

    The shortcut is a 1x1 convolution with BatchNorm where the shape changes (option B);
    272,474 parameters at 10 classes.  Trains in minutes on a CPU.
    """
    return CifarResNet(BasicBlock, [3, 3, 3], num_classes, widths=(16, 32, 64), **kw)


class _TVBottleneck(nn.Module):
    """torchvision's ResNet v1.5 bottleneck (stride on the 3x3 conv)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes * 4:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes * 4, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * 4),
            )

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ImageNetResNet(nn.Module):
    """The standard ImageNet ResNet (He et al. 2016; torchvision's v1.5 layout and init).

    7x7 stride-2 stem, 3x3 max-pool, bottleneck stages [3, 4, 6, 3] for ResNet-50 (25,557,032
    parameters at 1000 classes), global average pool, linear classifier.
    """

    def __init__(self, layers: Sequence[int] = (3, 4, 6, 3), num_classes: int = 1000,
                 zero_init_residual: bool = False) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0], 1)
        self.layer2 = self._make_layer(128, layers[1], 2)
        self.layer3 = self._make_layer(256, layers[2], 2)
        self.layer4 = self._make_layer(512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.num_features = 512 * 4
        self.fc = nn.Linear(self.num_features, num_classes)
        # torchvision's initialisation (skipped on the meta device, where there is no data).
        for m in self.modules():
            if isinstance(m, nn.Conv2d) and not m.weight.is_meta:
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d) and not m.weight.is_meta:
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, _TVBottleneck):
                    nn.init.zeros_(m.bn3.weight)

    def _make_layer(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        layers = [_TVBottleneck(self.inplanes, planes, stride)]
        self.inplanes = planes * 4
        layers += [_TVBottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward_features(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.forward_features(x))


@register_model("imagenet_resnet50")
def imagenet_resnet50(num_classes: int = 1000, **kw) -> ImageNetResNet:
    """The standard ImageNet ResNet-50 (25,557,032 parameters at 1000 classes)."""
    return ImageNetResNet((3, 4, 6, 3), num_classes, **kw)
