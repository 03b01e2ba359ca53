"""Small networks that train in seconds to minutes on a CPU: an MLP (the digits benchmark) and a
small CNN."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .._validation import check_scalar
from ._registry import register_model

__all__ = ["MLP", "SmallCNN", "mlp", "small_cnn"]


class MLP(nn.Module):
    """A ReLU multilayer perceptron: ``in_features -> hidden[0] -> ... -> hidden[-1] -> C``.

    Inputs of more than two dimensions are flattened from dimension 1, so (N, 1, 8, 8) images
    and (N, 64) feature vectors are the same to it.  PyTorch's default ``nn.Linear`` init.

    Args:
        num_classes: number of logits.
        in_features: input features (64 for the 8x8 digits).
        hidden: hidden layer widths (the digits benchmark uses (256, 256)).
        dropout: dropout probability after each hidden ReLU (0 disables it).

    >>> m = MLP(10)
    >>> m(torch.zeros(3, 64)).shape
    torch.Size([3, 10])
    >>> sum(p.numel() for p in m.parameters())
    85002
    """

    def __init__(self, num_classes: int = 10, in_features: int = 64,
                 hidden: Sequence[int] = (256, 256), dropout: float = 0.0) -> None:
        super().__init__()
        if len(hidden) == 0:
            raise ValueError("Expected `hidden` to hold at least one layer width, got ()")
        dropout = check_scalar(dropout, "dropout", float, min_val=0.0, max_val=1.0,
                               include_boundaries="left", expected="in [0, 1)")
        layers: list[nn.Module] = []
        d = int(in_features)
        for h in hidden:
            layers += [nn.Linear(d, int(h)), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            d = int(h)
        self.body = nn.Sequential(*layers)
        self.in_features = int(in_features)
        self.num_features = d
        self.fc = nn.Linear(d, num_classes)

    def forward_features(self, x: Tensor) -> Tensor:
        return self.body(torch.flatten(x, 1) if x.dim() > 2 else x)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.forward_features(x))


class SmallCNN(nn.Module):
    """A small convolutional net for images of any size: three conv-BN-ReLU blocks (widths
    ``width, 2·width, 4·width``) with 2x2 max-pooling after the first two, global average
    pooling, then the linear classifier.

    Args:
        num_classes: number of logits.
        in_channels: input channels (3 for CIFAR, 1 for the digits as (N, 1, 8, 8)).
        width: channels of the first block.
        in_features: if given, inputs of shape (N, in_features) are reshaped to
            (N, in_channels, s, s) with ``s = sqrt(in_features / in_channels)`` (so the digits'
            (N, 64) features work with ``in_channels=1, in_features=64``).

    >>> SmallCNN(10)(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 3, width: int = 32,
                 in_features: int | None = None) -> None:
        super().__init__()
        self.in_channels = int(in_channels)
        self.side = None
        if in_features is not None:
            side = int(round((in_features / in_channels) ** 0.5))
            if side * side * in_channels != in_features:
                raise ValueError(
                    f"Expected `in_features` to be in_channels * s**2, got {in_features!r}"
                )
            self.side = side

        def block(i: int, o: int) -> list[nn.Module]:
            return [nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU()]

        w = int(width)
        self.body = nn.Sequential(
            *block(in_channels, w), nn.MaxPool2d(2, ceil_mode=True),
            *block(w, 2 * w), nn.MaxPool2d(2, ceil_mode=True),
            *block(2 * w, 4 * w), nn.AdaptiveAvgPool2d(1), nn.Flatten(1),
        )
        self.num_features = 4 * w
        self.fc = nn.Linear(self.num_features, num_classes)

    def forward_features(self, x: Tensor) -> Tensor:
        if x.dim() == 2 and self.side is not None:
            x = x.reshape(x.shape[0], self.in_channels, self.side, self.side)
        return self.body(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.forward_features(x))


@register_model("mlp")
def mlp(num_classes: int = 10, **kw) -> MLP:
    """The digits benchmark's MLP (64-256-256-C by default)."""
    return MLP(num_classes, **kw)


@register_model("small_cnn")
def small_cnn(num_classes: int = 10, **kw) -> SmallCNN:
    """A small CNN (widths 32/64/128) for any image size."""
    return SmallCNN(num_classes, **kw)
