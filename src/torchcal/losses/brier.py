"""The Brier score as a training loss."""

from __future__ import annotations

import torch

from ..functional import brier_loss
from ._registry import register_loss
from .base import CalibrationLoss

__all__ = ["BrierLoss"]


@register_loss("brier")
class BrierLoss(CalibrationLoss):
    """``Σ_c (p_c - onehot(y)_c)^2`` per sample (see :func:`torchcal.functional.brier_loss`).

    The published code averages it over the batch: ``published_reduction = "mean"``.

    Example:
        >>> BrierLoss()(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
        tensor(0.5000)
    """

    published_reduction = "mean"

    def __init__(self, *, reduction: str = "mean", ignore_index: int = -100,
                 validate_args: bool = True) -> None:
        super().__init__(reduction=reduction, ignore_index=ignore_index, validate_args=validate_args)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return brier_loss(input, target, reduction=self.reduction, ignore_index=self.ignore_index,
                          validate_args=self.validate_args)
