"""Unweighted MMCE (MMCE_m) and MMCE-GRA as training losses (see
:mod:`torchcal.functional.mmce_unweighted`)."""

from __future__ import annotations

from typing import Any

import torch

from ..functional.basic import cross_entropy
from ..functional.blocks import check_batch_reduction
from ..functional.mmce_unweighted import mmce_gra_loss, mmce_m_terms, mmce_unweighted_loss
from ._registry import KUMAR_2018, LIN_2025_CODE, register_loss
from .base import NON_NEGATIVE, POSITIVE, CalibrationLoss

__all__ = ["MMCEUnweightedLoss", "MMCEGRALoss"]


class _BatchLoss(CalibrationLoss):
    """A batch-level loss: ``reduction`` "mean" or "sum" (N times the mean); "none" raises."""

    published_reduction = "sum"

    width: float

    _parameter_constraints = {"width": POSITIVE}

    def __init__(self, width: float = 0.4, *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True,
                 **hyperparameters: Any) -> None:
        super().__init__(reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args, width=width, **hyperparameters)
        check_batch_reduction(reduction, type(self).__name__)


@register_loss("mmce_unweighted", display="MMCE (unweighted)", order=16,
               paper=KUMAR_2018, tags={"variant"})
class MMCEUnweightedLoss(_BatchLoss):
    """``CE_mean + λ·MMCE_m``: the unweighted MMCE (the focal-calibration code's ``mmce``
    option; see :func:`torchcal.functional.mmce_unweighted_loss`).  ``"sum"`` gives N times it (the
    published training); ``"none"`` is rejected.

    Args:
        lam: λ >= 0 (default 1, the published ``--lamda`` default).
        width: kernel width (0.4).

    Example:
        >>> MMCEUnweightedLoss()(torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]))
        tensor(0.8273)
    """

    lam: float

    _parameter_constraints = {"lam": NON_NEGATIVE, "width": POSITIVE}

    def __init__(self, lam: float = 1.0, width: float = 0.4, *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        super().__init__(width=width, lam=lam, reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return mmce_unweighted_loss(input, target, lam=self.lam, width=self.width, reduction=self.reduction,
                           ignore_index=self.ignore_index, validate_args=self.validate_args)


@register_loss("mmce_gra", display="MMCE-GRA", order=17,
               paper=LIN_2025_CODE, tags={"variant"})
class MMCEGRALoss(_BatchLoss):
    """MMCE-GRA: ``MMCE_m`` (detached) times ``CE_mean`` (the BSCE-GRA repository's
    ``MMCEGRA``; see :func:`torchcal.functional.mmce_gra_loss`).  The gradient is
    ``MMCE_m · ∇CE_mean``: :meth:`gradient_weights` returns ``(w, CE_i)`` with
    ``w_i = MMCE_m`` for every sample, so that ``"sum"`` is ``Σ_i w_i CE_i``.

    Args:
        width: kernel width (0.4).

    Example:
        >>> MMCEGRALoss()(torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]))
        tensor(0.0772)
    """

    def gradient_weights(
        self, input: torch.Tensor, target: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(w, CE_i)`` with the batch's detached ``MMCE_m`` as every ``w_i``."""
        ce = cross_entropy(input, target, reduction="none", ignore_index=self.ignore_index,
                           validate_args=self.validate_args)
        with torch.no_grad():
            _, pen, _ = mmce_m_terms(input, target, ignore_index=self.ignore_index,
                                     validate_args=self.validate_args, width=self.width)
        return pen.expand(ce.shape), ce

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return mmce_gra_loss(input, target, width=self.width, reduction=self.reduction,
                             ignore_index=self.ignore_index, validate_args=self.validate_args)
