"""Cross-entropy as a :class:`CalibrationLoss` (the baseline of every paper)."""

from __future__ import annotations

import torch

from ..functional import cross_entropy
from ._registry import register_loss
from .base import CalibrationLoss

__all__ = ["CrossEntropyLoss"]


@register_loss("ce", display="Cross-entropy", order=0, tags={"demo"})
class CrossEntropyLoss(CalibrationLoss):
    """Cross-entropy ``-log p_y`` (see :func:`torchcal.functional.cross_entropy`).

    Example:
        >>> CrossEntropyLoss()(torch.tensor([[0.0, 0.0]]), torch.tensor([1]))
        tensor(0.6931)
    """

    def __init__(self, *, reduction: str = "mean", ignore_index: int = -100,
                 validate_args: bool = True) -> None:
        super().__init__(reduction=reduction, ignore_index=ignore_index, validate_args=validate_args)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return cross_entropy(input, target, reduction=self.reduction,
                             ignore_index=self.ignore_index, validate_args=self.validate_args)
