"""The Brier score as a training loss."""

from __future__ import annotations

import torch

from ..functional import brier_loss
from ._registry import register_loss
from .base import CalibrationLoss

__all__ = ["BrierLoss", "BRIER_PUBLISHED_REDUCTIONS"]

#: ``published_reduction`` values of :class:`BrierLoss`: the focal-calibration code averages the
#: Brier score over the batch, the BSCE-GRA repository sums it.
BRIER_PUBLISHED_REDUCTIONS = ("mean", "sum")


@register_loss("brier", display="Brier", order=2,
               paper="Brier, 1950", tags={"demo"})
class BrierLoss(CalibrationLoss):
    """``Σ_c (p_c - onehot(y)_c)^2`` per sample (see :func:`torchcal.functional.brier_loss`).

    How the published code reduces it over a batch depends on the repository: the
    focal-calibration code (Mukhoti et al., the seed tables) takes the **mean**, the BSCE-GRA
    repository (Lin et al.) the **sum**.  ``published_reduction`` says which one a faithful
    recipe uses (``TrainConfig(reduction="published")`` sets ``loss.reduction`` to it); the
    default is ``"mean"``.  ``reduction`` itself works as for every loss.

    Args:
        published_reduction: ``"mean"`` (default; focal-calibration) or ``"sum"`` (BSCE-GRA).

    Example:
        >>> BrierLoss()(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
        tensor(0.5000)
        >>> BrierLoss(published_reduction="sum").published_reduction
        'sum'
    """

    published_reduction = "mean"

    def __init__(self, *, published_reduction: str = "mean", reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        if published_reduction not in BRIER_PUBLISHED_REDUCTIONS:
            raise ValueError(
                f"Expected `published_reduction` to be one of {BRIER_PUBLISHED_REDUCTIONS}, "
                f"got {published_reduction!r}"
            )
        super().__init__(reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args, published_reduction=published_reduction)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return brier_loss(input, target, reduction=self.reduction, ignore_index=self.ignore_index,
                          validate_args=self.validate_args)
