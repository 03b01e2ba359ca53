r"""Exponentially weighted losses of the BSCE-GRA repository as modules (see
:mod:`torchcal.functional.exp_weighted`): ``ℓ_i = w_i · b_i`` with the detached weight
``w_i = exp(clip(b_i, 0, T) / (T + 1)) - 1`` of the base loss ``b`` (CE, focal, dual focal,
Brier).  The gradient is ``Σ_i w_i ∇b_i``; :meth:`ExpWeightedLoss.gradient_weights` returns
``(w, b)`` so that this can be checked.  The published training sums them over the batch.
"""

from __future__ import annotations

from typing import Any

import torch

from ..functional.basic import brier_loss, cross_entropy
from ..functional.dual_focal import dual_focal_loss
from ..functional.exp_weighted import (
    brier_exp_loss,
    ce_exp_loss,
    dual_focal_exp_loss,
    exp_weight,
    focal_exp_loss,
)
from ..functional.focal import focal_loss
from ._registry import register_loss
from .base import CalibrationLoss

__all__ = ["ExpWeightedLoss", "CrossEntropyExpLoss", "FocalExpLoss", "DualFocalExpLoss",
           "BrierExpLoss"]


class ExpWeightedLoss(CalibrationLoss):
    """Base of the exponentially weighted losses: stores ``temperature`` (T > 0)."""

    temperature: float

    def __init__(self, temperature: float = 1.0, *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True,
                 **hyperparameters: Any) -> None:
        super().__init__(reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args, **hyperparameters,
                         temperature=temperature)

    def base_loss(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The per-sample base loss ``b`` (target's shape, with gradient)."""
        raise NotImplementedError

    def gradient_weights(
        self, input: torch.Tensor, target: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(w, b)``: the detached weights and the base losses; ``loss = reduce(w · b)``."""
        b = self.base_loss(input, target)
        return exp_weight(b, self.temperature), b


@register_loss("ce_exp", display="Cross-entropy (exp.-weighted)", order=22, tags={"variant"})
class CrossEntropyExpLoss(ExpWeightedLoss):
    """Exponentially weighted cross-entropy (the published ``CrossEntropyExp``; see
    :func:`torchcal.functional.ce_exp_loss`).

    Args:
        temperature: T > 0 (default 1, the published ``--temperature`` default).

    Example:
        >>> CrossEntropyExpLoss()(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
        tensor(0.2871)
    """

    def base_loss(self, input, target):
        return cross_entropy(input, target, reduction="none", ignore_index=self.ignore_index,
                             validate_args=self.validate_args)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ce_exp_loss(input, target, self.temperature, reduction=self.reduction,
                           ignore_index=self.ignore_index, validate_args=self.validate_args)


@register_loss("focal_exp", display="Focal (exp.-weighted)", order=23, tags={"variant"})
class FocalExpLoss(ExpWeightedLoss):
    """Exponentially weighted focal loss (the published ``FocalLossExp``; see
    :func:`torchcal.functional.focal_exp_loss`).

    Args:
        gamma: γ >= 0 (default 3).
        temperature: T > 0 (default 1).

    Example:
        >>> FocalExpLoss(gamma=1.0)(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
        tensor(0.0656)
    """

    gamma: float

    def __init__(self, gamma: float = 3.0, temperature: float = 1.0, *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        super().__init__(temperature, gamma=gamma, reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)

    def base_loss(self, input, target):
        return focal_loss(input, target, self.gamma, reduction="none",
                          ignore_index=self.ignore_index, validate_args=self.validate_args)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return focal_exp_loss(input, target, self.gamma, self.temperature,
                              reduction=self.reduction, ignore_index=self.ignore_index,
                              validate_args=self.validate_args)


@register_loss("dual_focal_exp", display="Dual focal (exp.-weighted)", order=24, tags={"variant"})
class DualFocalExpLoss(FocalExpLoss):
    """Exponentially weighted dual focal loss (the published ``DualFocalLossExp``; see
    :func:`torchcal.functional.dual_focal_exp_loss`).

    Args:
        gamma: γ >= 0 (default 5).
        temperature: T > 0 (default 1).

    Example:
        >>> x = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
        >>> DualFocalExpLoss(gamma=1.0)(x, torch.tensor([1]))
        tensor(0.7029)
    """

    def __init__(self, gamma: float = 5.0, temperature: float = 1.0, *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        super().__init__(gamma, temperature, reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)

    def base_loss(self, input, target):
        return dual_focal_loss(input, target, self.gamma, reduction="none",
                               ignore_index=self.ignore_index, validate_args=self.validate_args)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return dual_focal_exp_loss(input, target, self.gamma, self.temperature,
                                   reduction=self.reduction, ignore_index=self.ignore_index,
                                   validate_args=self.validate_args)


@register_loss("brier_exp", display="Brier (exp.-weighted)", order=25, tags={"variant"})
class BrierExpLoss(ExpWeightedLoss):
    """Exponentially weighted Brier score (the published ``BrierScoreExp``, summed over the
    batch; see :func:`torchcal.functional.brier_exp_loss`).

    Args:
        temperature: T > 0 (default 1).

    Example:
        >>> BrierExpLoss()(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
        tensor(0.1420)
    """

    def base_loss(self, input, target):
        return brier_loss(input, target, reduction="none", ignore_index=self.ignore_index,
                          validate_args=self.validate_args)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return brier_exp_loss(input, target, self.temperature, reduction=self.reduction,
                              ignore_index=self.ignore_index, validate_args=self.validate_args)
