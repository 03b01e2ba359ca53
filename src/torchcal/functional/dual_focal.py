"""Dual focal loss (Tao, Dong, Xu, ICML 2023).

Per sample ``-(1 - p_y + p_j)^γ log p_y`` with ``p_j = max{p_c : p_c < p_y}`` the largest
probability *strictly below* the true class's (0 if there is none, e.g. when ``p_y`` is the
smallest or all probabilities are tied).  Nothing is detached.

Implementation: plain autograd.  ``p_j``'s index is found without gradient by a row
arg-extremum over the entries strictly below ``log p_y`` (see :func:`log_p_below`; on ties in
``p_j`` the first index gets the gradient, a valid subgradient); ``log p_y`` and ``log p_j`` are
then read by one gather (one scatter in the backward), and the weight is taken by
:func:`~torchcal.functional._common.safe_pow`, finite everywhere (also at ``p_y = 1`` for
``0 < γ < 1``).  DFL-GRA (``dual_focal_gra_loss``) needs only the value and uses the cheaper
``amin`` of the same ``1/u`` key.
"""

from __future__ import annotations

import torch

from ._common import check_hyper, no_autocast, safe_pow
from ._loss_utils import as_index, check_loss_args, reduce_loss, target_log_probs

__all__ = ["dual_focal_loss", "log_p_below"]


def log_p_below(log_p: torch.Tensor, lp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise ``max{log p_c : log p_c < lp}`` over dim 1 of ``log_p`` (N, C, ...) and its index
    (``-inf`` if none); ``lp`` has ``log_p``'s shape without dim 1.

    Computed without boolean masks (``where``/``masked_fill`` are slow on CPU) as the
    ``argmin`` of ``1/u``, ``u = log p - lp``: candidates (``u < 0``) map to negative values,
    the largest candidate to the most negative, and ``u >= 0`` (the target itself and every
    tie with it; ``u`` is never -0 since it is a difference) to positive values or ``+inf``.
    The value is then read exactly from ``log_p``.  (Two candidates within one float ulp of
    each other, relative, can round to the same ``1/u``; either may then be picked: they are
    equal to working precision.)
    """
    rmin, j = _below_key(log_p, lp)
    lj = log_p.gather(1, j.unsqueeze(1)).squeeze(1)
    return torch.where(rmin < 0, lj, torch.full_like(lj, float("-inf"))), j


def _below_key(log_p: torch.Tensor, lp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row minimum of ``1/(log p - lp)`` and its index: negative iff some ``log p_c < lp``."""
    return (log_p - lp.unsqueeze(1)).reciprocal_().min(dim=1)


def dual_focal_terms(log_p: torch.Tensor, target: torch.Tensor, gamma: float) -> torch.Tensor:
    """Per-entry ``-(1 - p_y + p_j)^γ log p_y`` from ``log_p`` (N, C, ...) and (in-range)
    targets of ``log_p``'s shape without dim 1; differentiable through ``log_p``."""
    with torch.no_grad():
        rmin, j = _below_key(log_p, log_p.gather(1, target.unsqueeze(1)).squeeze(1))
        has_below = rmin < 0
    lp, lj = log_p.gather(1, torch.stack((target, j), 1)).unbind(1)
    pj = torch.where(has_below, lj.exp(), 0.0)
    w = safe_pow(torch.expm1(lp).neg().add(pj), gamma)
    return torch.mul(w, lp).neg()


def dual_focal_loss(
    input: torch.Tensor, target: torch.Tensor, gamma: float = 5.0, *, reduction: str = "mean",
    ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Dual focal loss ``-(1 - p_y + p_j)^γ log p_y``, ``p_j`` the largest probability strictly
    below ``p_y`` (0 if none).  Nothing is detached.

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        gamma: finite γ >= 0 (default 5, the published CIFAR-10/100 ResNet-50 value).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: target value to ignore.
        validate_args: check the target range.

    Example:
        >>> x = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
        >>> dual_focal_loss(x, torch.tensor([1]), gamma=1.0)  # (1 - 0.3 + 0.2) * -log 0.3
        tensor(1.0836)
    """
    check_loss_args(input, target, reduction)
    gamma = check_hyper(gamma, "gamma")
    with no_autocast(input):
        log_p, _, safe, valid = target_log_probs(input, target, ignore_index,
                                                 validate_args=validate_args)
        return reduce_loss(dual_focal_terms(log_p, as_index(safe), gamma), valid, reduction)

