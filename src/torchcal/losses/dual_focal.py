"""Dual focal loss (Tao et al. 2023) as a :class:`CalibrationLoss`."""

from __future__ import annotations

import torch

from ..functional import dual_focal_loss
from ._registry import register_loss
from .base import CalibrationLoss

__all__ = ["DualFocalLoss"]


@register_loss("dual_focal", display="Dual focal", order=10,
               paper="Tao et al., ICML 2023", tags={"demo"})
class DualFocalLoss(CalibrationLoss):
    """``-(1 - p_y + p_j)^γ log p_y``, ``p_j`` the largest probability strictly below ``p_y``
    (see :func:`torchcal.functional.dual_focal_loss`).

    Args:
        gamma: γ >= 0 (default 5, the published CIFAR ResNet-50 value; the paper's other
            values: CIFAR-10 R110 4.5, WRN 2.6, DN121 5; CIFAR-100 R110 6.1, WRN 3.9,
            DN121 3.4; Tiny-ImageNet R50 2.3).

    Example:
        >>> x = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
        >>> DualFocalLoss(gamma=1.0)(x, torch.tensor([1]))
        tensor(1.0836)
    """

    gamma: float

    def __init__(self, gamma: float = 5.0, *, reduction: str = "mean", ignore_index: int = -100,
                 validate_args: bool = True) -> None:
        super().__init__(gamma=gamma, reduction=reduction, ignore_index=ignore_index, validate_args=validate_args)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return dual_focal_loss(input, target, self.gamma, reduction=self.reduction,
                               ignore_index=self.ignore_index, validate_args=self.validate_args)
