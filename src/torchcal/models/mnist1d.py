"""The 1-D CNN of the MNIST-1D paper (Greydanus & Kobak, ICML 2024; ``ConvBase`` of the paper's
code, ``notebooks/models.py`` of github.com/greydanus/mnist1d).

Three ReLU convolutions over the signal, each of ``width`` channels and stride 2 (kernel 5 with
padding 1, then kernel 3 with padding 1 twice), flattened into a linear classifier.  On the
40-sample signals the lengths are 40 -> 19 -> 10 -> 5, so the classifier sees ``5 * width``
features.  The paper's code uses ``width = 25`` (5,210 parameters); torchcal's benchmark chooses
its width by measurement (``benchmarks/results/mnist1d_ce_sizing.md``).  The classifier is named
``fc`` (the paper's ``linear``; :func:`torchcal.models.adapt_state_dict` renames it).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._validation import check_positive_int
from ._registry import register_model

__all__ = ["MNIST1DCNN", "mnist1d_cnn"]


def _conv_out(length: int, kernel: int) -> int:
    return (length + 2 * 1 - kernel) // 2 + 1  # stride 2, padding 1


class MNIST1DCNN(nn.Module):
    """The MNIST-1D paper's CNN: ``conv(k5,s2) -> ReLU -> conv(k3,s2) -> ReLU -> conv(k3,s2) ->
    ReLU -> flatten -> fc``.

    Args:
        num_classes: number of logits.
        width: channels of every convolution (the paper's ``channels``).
        in_length: length of the input signals (40 for MNIST-1D).

    Inputs are (N, in_length) signals or (N, 1, in_length).  PyTorch's default initialisation,
    as the paper's code.

    >>> m = MNIST1DCNN(10, width=25)
    >>> m(torch.zeros(3, 40)).shape, m.num_features, sum(p.numel() for p in m.parameters())
    (torch.Size([3, 10]), 125, 5210)
    """

    def __init__(self, num_classes: int = 10, width: int = 64, in_length: int = 40) -> None:
        super().__init__()
        w = check_positive_int(width, "width")
        length = check_positive_int(in_length, "in_length")
        out = _conv_out(_conv_out(_conv_out(length, 5), 3), 3)
        if out < 1:
            raise ValueError(f"Expected `in_length` of at least 3, got {in_length!r}")
        self.in_length = length
        self.conv1 = nn.Conv1d(1, w, 5, stride=2, padding=1)
        self.conv2 = nn.Conv1d(w, w, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(w, w, 3, stride=2, padding=1)
        self.num_features = w * out
        self.fc = nn.Linear(self.num_features, num_classes)

    def forward_features(self, x: Tensor) -> Tensor:
        h = x.unsqueeze(1) if x.dim() == 2 else x
        if h.dim() != 3 or h.shape[1] != 1 or h.shape[2] != self.in_length:
            raise ValueError(f"Expected input of shape (N, {self.in_length}) or "
                             f"(N, 1, {self.in_length}), got {tuple(x.shape)}")
        h = torch.relu(self.conv1(h))
        h = torch.relu(self.conv2(h))
        h = torch.relu(self.conv3(h))
        return torch.flatten(h, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.forward_features(x))

    def forward_packed(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        """Logits (M, B, C) of M stacked copies of this network (``params``: every parameter
        with a leading lane dimension) on inputs (M, B, in_length): the packed engine's
        vmapped forward (:class:`torchcal.train.stacks.PackedModel`) in the layout the
        convolutions want.

        The lanes' channels stay side by side in one (B, M * width, L) tensor from the first
        convolution to the last, each convolution one grouped call (``groups = M``) on a
        contiguous input, so that no layout change runs between the layers (``vmap`` moves the
        lane dimension in front of the batch after every layer and back before the next);
        the classifier is one batched matrix product on a strided view.  Equal to ``vmap`` over
        :meth:`forward` to float rounding.
        """
        m, b = x.shape[0], x.shape[1]
        if x.dim() not in (3, 4) or x.shape[-1] != self.in_length or (
                x.dim() == 4 and x.shape[2] != 1):
            raise ValueError(f"Expected input of shape (M, N, {self.in_length}), got "
                             f"{tuple(x.shape)}")
        h = x.reshape(m, b, self.in_length).transpose(0, 1).contiguous()  # (B, M, L)
        for name in ("conv1", "conv2", "conv3"):
            w = params[f"{name}.weight"]
            h = torch.relu(torch.nn.functional.conv1d(
                h, w.reshape(-1, *w.shape[2:]), params[f"{name}.bias"].reshape(-1),
                stride=2, padding=1, groups=m))
        f = h.reshape(b, m, -1).transpose(0, 1)  # (M, B, F), a strided view
        return torch.baddbmm(params["fc.bias"].unsqueeze(1), f,
                             params["fc.weight"].transpose(1, 2))


@register_model("mnist1d_cnn")
def mnist1d_cnn(num_classes: int = 10, **kw) -> MNIST1DCNN:
    """The MNIST-1D paper's 1-D CNN (``width`` channels, default 64)."""
    return MNIST1DCNN(num_classes, **kw)
