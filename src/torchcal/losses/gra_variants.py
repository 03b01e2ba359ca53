r"""More gradient-weighted (GRA) losses of the BSCE-GRA repository as registry entries (see
:mod:`torchcal.functional.gra_variants`): TLBS, the sample-dependent (adaptive) focal GRA with
its FLSD-53 / FLSD-532 presets (``focal_gra_flsd53``, ``focal_gra_flsd532``), and the adaptive BSCE-GRA.  Each could be built with
:class:`~torchcal.losses.GradientWeightedLoss` and a weight function; these give them names,
defaults and presets."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..functional.focal import FLSD53, FLSD532, _check_schedule
from ..functional.gra_variants import (
    bsce_adaptive_gra_loss,
    sample_dependent_focal_gra_loss,
    tlbs_loss,
)
from ._registry import register_loss
from .gradient_weighted import GradientWeightedLoss

__all__ = ["TLBSLoss", "SampleDependentFocalGRALoss", "BSCEAdaptiveGRALoss", "focal_gra_flsd53",
           "focal_gra_flsd532"]


@register_loss("tlbs", display="TLBS", order=18, tags={"variant"})
class TLBSLoss(GradientWeightedLoss):
    """TLBS: ``|c - r|^γ`` (detached) times ``-log p_y`` with ``r`` the top-1 confidence and
    ``c`` the correctness (the published ``TLBSLoss``; see
    :func:`torchcal.functional.tlbs_loss`).

    Args:
        gamma: γ >= 0 (default 2: the top-label Brier score; the published CLI default is 1).

    Example:
        >>> x = torch.log(torch.tensor([[0.6, 0.4]]))
        >>> TLBSLoss()(x, torch.tensor([0]))  # 0.4² · -log 0.6
        tensor(0.0817)
    """

    gamma: float

    def __init__(self, gamma: float = 2.0, *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        super().__init__(gamma=gamma, reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)

    def own_weight_loss(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The fused published form (``forward`` without an explicit ``weight``)."""
        return tlbs_loss(input, target, self.gamma, reduction=self.reduction,
                         ignore_index=self.ignore_index, validate_args=self.validate_args)


class SampleDependentFocalGRALoss(GradientWeightedLoss):
    """Sample-dependent focal GRA: ``(1 - p_y)^{γ_i}`` (detached) times ``-log p_y``, ``γ_i`` by
    the threshold schedule of :class:`~torchcal.losses.SampleDependentFocalLoss` (the published
    ``FocalLossAdaptiveGra``; presets ``focal_gra_flsd53`` and ``focal_gra_flsd532``).

    Example:
        >>> SampleDependentFocalGRALoss()(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
        tensor(0.0866)
    """

    def __init__(self, thresholds: Sequence[float] = FLSD53[0],
                 gammas: Sequence[float] = FLSD53[1], *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        thr, gam = _check_schedule(thresholds, gammas)
        super().__init__(thresholds=thr, gammas=gam, reduction=reduction,
                         ignore_index=ignore_index, validate_args=validate_args)

    def own_weight_loss(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The fused published form (``forward`` without an explicit ``weight``)."""
        return sample_dependent_focal_gra_loss(input, target, self.thresholds, self.gammas,
                                               reduction=self.reduction,
                                               ignore_index=self.ignore_index,
                                               validate_args=self.validate_args)


@register_loss("focal_gra_flsd53", display="FLSD-53-GRA", order=19, tags={"variant"})
def focal_gra_flsd53(*, reduction: str = "mean", ignore_index: int = -100,
                     validate_args: bool = True) -> SampleDependentFocalGRALoss:
    """FLSD-53-GRA: detached ``(1 - p_y)^γ`` with γ = 5 for p_y < 0.2, else 3
    (the published ``focal_loss_adaptive_gra --gamma 3``)."""
    return SampleDependentFocalGRALoss(*FLSD53, reduction=reduction, ignore_index=ignore_index,
                                       validate_args=validate_args)


@register_loss("focal_gra_flsd532", display="FLSD-532-GRA", order=20, tags={"variant"})
def focal_gra_flsd532(*, reduction: str = "mean", ignore_index: int = -100,
                      validate_args: bool = True) -> SampleDependentFocalGRALoss:
    """FLSD-532-GRA: γ = 5 for p_y < 0.2, 3 for 0.2 <= p_y < 0.5, 2 for p_y >= 0.5
    (the published ``focal_loss_adaptive_gra --gamma 2``)."""
    return SampleDependentFocalGRALoss(*FLSD532, reduction=reduction, ignore_index=ignore_index,
                                       validate_args=validate_args)


@register_loss("bsce_adaptive_gra", display="BSCE-GRA (adaptive γ)", order=21, tags={"variant"})
class BSCEAdaptiveGRALoss(GradientWeightedLoss):
    """Adaptive BSCE-GRA: ``‖onehot(y) - p‖_β^{γ_i}`` (detached) times ``-log p_y`` with ``γ_i``
    from the FLSD threshold schedule of ``p_y`` (the published ``BSCELossAdaptiveGra``; see
    :func:`torchcal.functional.bsce_adaptive_gra_loss`).

    Args:
        beta: norm order β > 0 (default 2, as ``bsce_gra``; the published ``--bsce-norm``
            default is 1).
        thresholds: increasing p_y thresholds (default (0.2, 0.5)).
        gammas: one γ more than thresholds (default FLSD-53's (5, 3, 3)).

    Example:
        >>> BSCEAdaptiveGRALoss()(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
        tensor(0.2451)
    """

    def __init__(self, beta: float = 2.0, thresholds: Sequence[float] = FLSD53[0],
                 gammas: Sequence[float] = FLSD53[1], *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        thr, gam = _check_schedule(thresholds, gammas)
        super().__init__(beta=beta, thresholds=thr, gammas=gam, reduction=reduction,
                         ignore_index=ignore_index, validate_args=validate_args)

    def own_weight_loss(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The fused published form (``forward`` without an explicit ``weight``)."""
        return bsce_adaptive_gra_loss(input, target, self.beta, self.thresholds, self.gammas,
                                      reduction=self.reduction, ignore_index=self.ignore_index,
                                      validate_args=self.validate_args)
