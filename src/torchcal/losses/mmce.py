"""MMCE (weighted) as a training loss: ``CE_mean + λ·MMCE`` over the batch."""

from __future__ import annotations

import torch

from .._validation import Options
from ..functional import mmce_loss
from ..functional.mmce import MMCE_NORMALIZATIONS
from ._registry import KUMAR_2018, register_loss
from .base import NON_NEGATIVE, POSITIVE, CalibrationLoss

__all__ = ["MMCELoss"]


@register_loss("mmce", display="MMCE", order=3,
               paper=KUMAR_2018, tags={"demo"})
class MMCELoss(CalibrationLoss):
    """Cross-entropy plus λ times the weighted MMCE penalty (see :func:`torchcal.functional.mmce_loss`).

    ``reduction="mean"`` gives ``CE_mean + λ·MMCE``, ``"sum"`` gives N times that (the
    published training, ``published_reduction = "sum"``); ``"none"`` is rejected.

    Args:
        lam: λ >= 0 (default 2).
        normalization: ``"published"`` (default) or ``"paper"``.
        width: kernel width (default 0.4).

    Example:
        >>> MMCELoss()(torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1]))
        tensor(0.2201)
    """

    vmap_rounds_alike = False  # the weighted kernel sum rounds otherwise when vmapped

    published_reduction = "sum"

    lam: float
    normalization: str
    width: float

    _parameter_constraints = {"lam": NON_NEGATIVE, "normalization": Options(MMCE_NORMALIZATIONS),
                              "width": POSITIVE}

    def __init__(self, lam: float = 2.0, normalization: str = "published", width: float = 0.4, *,
                 reduction: str = "mean", ignore_index: int = -100,
                 validate_args: bool = True) -> None:
        if reduction == "none":
            raise ValueError(
                "Expected `reduction` to be 'mean' or 'sum' for MMCE: its penalty is a batch "
                "quantity, so reduction='none' is not supported"
            )
        super().__init__(lam=lam, normalization=normalization, width=width, reduction=reduction, ignore_index=ignore_index, validate_args=validate_args)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return mmce_loss(input, target, lam=self.lam, normalization=self.normalization,
                         width=self.width, reduction=self.reduction,
                         ignore_index=self.ignore_index, validate_args=self.validate_args)
