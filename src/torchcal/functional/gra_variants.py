r"""More gradient-weighted (GRA) losses of the BSCE-GRA repository (Lin, Tao, Dong, Xu 2025).

Each is ``ℓ_i = w_i · (-log p_{y_i})`` with a **detached** weight (the gradient is
``Σ_i w_i ∇CE_i``, see :func:`torchcal.functional.gradient_weighted_loss`):

* TLBS (``TLBSLoss``): ``w = |c - r|^γ`` with ``r`` the top-1 confidence and ``c = [argmax p = y]``
  (γ = 2 makes ``w`` the top-label Brier score);
* sample-dependent focal GRA (``FocalLossAdaptiveGra``): ``w = (1 - p_y)^{γ_i}`` with ``γ_i`` from
  the FLSD threshold schedule (FLSD-53: 5 for ``p_y < 0.2``, 3 for ``p_y < 0.5``, else 3);
* adaptive BSCE-GRA (``BSCELossAdaptiveGra``): ``w = ‖onehot(y) - p‖_β^{γ_i}``, the same schedule;
* consistency (``ConsistencyLoss``): ``w = (1 - q_y)^γ`` with ``q`` the probabilities of an
  external calibrator (the published training passes a perturbation-consistency calibrator's
  output).

Written as plain tensor operations.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._common import check_hyper
from ._loss_utils import check_loss_args
from ._plain import rows, weighted_ce
from .focal import FLSD53, check_schedule
from .gradient_weighted import brier_uncertainty, check_beta

__all__ = ["tlbs_loss", "sample_dependent_focal_gra_loss", "bsce_adaptive_gra_loss",
           "consistency_loss"]


def tlbs_loss(
    input: torch.Tensor, target: torch.Tensor, gamma: float = 2.0, *, reduction: str = "mean",
    ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""TLBS: ``|c - r|^γ`` (detached) times ``-log p_y``, ``r = max_c p_c``, ``c = [argmax = y]``.

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        gamma: γ >= 0 (default 2: the top-label Brier score; the published CLI default is 1).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: target value to ignore.
        validate_args: check the target range.

    Example:
        >>> x = torch.log(torch.tensor([[0.6, 0.4], [0.7, 0.3]]))
        >>> # correct (0.4² · -log 0.6), wrong (0.7² · -log 0.3), summed
        >>> tlbs_loss(x, torch.tensor([0, 1]), reduction="sum")
        tensor(0.6717)
    """
    check_loss_args(input, target, reduction)
    gamma = check_hyper(gamma, "gamma")

    def weight(log_p, y):
        top, pred = log_p.max(dim=1)
        return ((pred == y).to(top.dtype) - top.exp()).abs().pow(gamma)

    return weighted_ce(input, target, weight, detach=True, reduction=reduction,
                       ignore_index=ignore_index, validate_args=validate_args)


def _schedule_gamma(lp_y: torch.Tensor, thresholds: tuple[float, ...],
                    gammas: tuple[float, ...]) -> torch.Tensor:
    """``gammas[#{k : thresholds[k] <= p_y}]`` (the FLSD schedule) as a tensor."""
    t = torch.tensor(thresholds, dtype=lp_y.dtype, device=lp_y.device)
    g = torch.tensor(gammas, dtype=lp_y.dtype, device=lp_y.device)
    return g[torch.bucketize(lp_y.exp(), t, right=True)]


def sample_dependent_focal_gra_loss(
    input: torch.Tensor, target: torch.Tensor, thresholds: Sequence[float] = FLSD53[0],
    gammas: Sequence[float] = FLSD53[1], *, reduction: str = "mean", ignore_index: int = -100,
    validate_args: bool = True,
) -> torch.Tensor:
    r"""Sample-dependent focal GRA: ``(1 - p_y)^{γ_i}`` (detached) times ``-log p_y``, ``γ_i``
    picked from ``p_y`` by the threshold schedule of
    :func:`~torchcal.functional.sample_dependent_focal_loss` (default FLSD-53; the published
    ``FocalLossAdaptiveGra`` with ``--gamma g`` is ``gammas=(5, 3, g)``).

    Example:
        >>> x = torch.tensor([[0.0, 0.0]])  # p_y = 0.5 -> γ = 3: 0.5³ · log 2
        >>> sample_dependent_focal_gra_loss(x, torch.tensor([0]))
        tensor(0.0866)
    """
    check_loss_args(input, target, reduction)
    thr, gam = check_schedule(thresholds, gammas)

    def weight(log_p, y):
        lp_y = log_p.gather(1, y.unsqueeze(1)).squeeze(1)
        return (-torch.expm1(lp_y)).pow(_schedule_gamma(lp_y, thr, gam))

    return weighted_ce(input, target, weight, detach=True, reduction=reduction,
                       ignore_index=ignore_index, validate_args=validate_args)


def bsce_adaptive_gra_loss(
    input: torch.Tensor, target: torch.Tensor, beta: float = 2.0,
    thresholds: Sequence[float] = FLSD53[0], gammas: Sequence[float] = FLSD53[1], *,
    reduction: str = "mean", ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Adaptive BSCE-GRA: ``‖onehot(y) - p‖_β^{γ_i}`` (detached) times ``-log p_y`` with ``γ_i``
    from the FLSD threshold schedule of ``p_y`` (default FLSD-53: 5, 3, 3; the published
    ``BSCELossAdaptiveGra`` with ``--gamma g --bsce-norm β`` is ``gammas=(5, 3, g)``).

    Example:
        >>> x = torch.tensor([[0.0, 0.0]])  # ‖(0.5, -0.5)‖₂³ · log 2 (p_y = 0.5 -> γ = 3)
        >>> bsce_adaptive_gra_loss(x, torch.tensor([0]))
        tensor(0.2451)
    """
    check_loss_args(input, target, reduction)
    beta = check_beta(beta)
    thr, gam = check_schedule(thresholds, gammas)

    def weight(log_p, y):
        lp_y = log_p.gather(1, y.unsqueeze(1)).squeeze(1)
        s = brier_uncertainty(log_p, y, beta, beta)  # Σ_c |d_c|^β
        return s.pow(_schedule_gamma(lp_y, thr, gam) / beta)

    return weighted_ce(input, target, weight, detach=True, reduction=reduction,
                       ignore_index=ignore_index, validate_args=validate_args)


def consistency_loss(
    input: torch.Tensor, target: torch.Tensor, calibrated_probs: torch.Tensor,
    gamma: float = 3.0, *, reduction: str = "mean", ignore_index: int = -100,
    validate_args: bool = True,
) -> torch.Tensor:
    r"""Consistency loss: ``(1 - q_y)^γ`` (detached) times ``-log p_y``, ``q`` the probabilities
    of a calibrator (the published ``ConsistencyLoss``).

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        calibrated_probs: calibrated probabilities of ``input``'s shape (detached).
        gamma: γ >= 0 (default 3, the published default).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: target value to ignore.
        validate_args: check the target range.

    Example:
        >>> x = torch.tensor([[0.0, 0.0]])
        >>> q = torch.tensor([[0.8, 0.2]])
        >>> consistency_loss(x, torch.tensor([0]), q, gamma=1.0)  # 0.2 · log 2
        tensor(0.1386)
    """
    check_loss_args(input, target, reduction)
    gamma = check_hyper(gamma, "gamma")
    if not isinstance(calibrated_probs, torch.Tensor) or not calibrated_probs.is_floating_point():
        raise TypeError("Expected `calibrated_probs` to be a floating-point tensor, got "
                        + type(calibrated_probs).__name__)
    if tuple(calibrated_probs.shape) != tuple(input.shape):
        raise ValueError(f"Expected `calibrated_probs` of the input's shape {tuple(input.shape)}, "
                         f"got {tuple(calibrated_probs.shape)}")
    q = rows(calibrated_probs.detach())

    def weight(log_p, y):
        q_y = q.to(device=log_p.device, dtype=log_p.dtype).gather(1, y.unsqueeze(1)).squeeze(1)
        return (1.0 - q_y).clamp_min(0.0).pow(gamma)

    return weighted_ce(input, target, weight, detach=True, reduction=reduction,
                       ignore_index=ignore_index, validate_args=validate_args)
