"""Dual focal loss (Tao, Dong, Xu, ICML 2023).

Per sample ``-(1 - p_y + p_j)^γ log p_y`` with ``p_j = max{p_c : p_c < p_y}`` the largest
probability *strictly below* the true class's (0 if there is none, e.g. when ``p_y`` is the
smallest or all probabilities are tied).  Nothing is detached.

Implementation: the fused Function of :mod:`torchcal.functional._core`.  The forward finds
``p_j`` with a row arg-extremum over the entries strictly below ``log p_y`` (see
:func:`log_p_below`; on ties in ``p_j`` the first index gets the gradient, a valid
subgradient); the backward is the closed form

    ∂ℓ/∂z = a · (e_y - p) + b · (e_j - p) = -(a + b)·d - b·e_y + b·e_j,   d = p - onehot,
    a = ∂ℓ/∂log p_y = -w (1 - γ p_y r),   b = ∂ℓ/∂log p_j = -γ p_j r w,
    w = (q + p_j)^γ,  q = -expm1(log p_y),  r = log p_y / (q + p_j)  (r = -1 where q + p_j = 0),

finite everywhere (also at ``p_y = 1`` for ``0 < γ < 1``) and much cheaper than autograd
through the masked max.  DFL-GRA (``dual_focal_gra_loss``) needs only the value and uses
the cheaper ``amin`` of the same ``1/u`` key.
"""

from __future__ import annotations

import torch

from ._common import check_hyper, no_autocast
from ._core import Terms, fused_loss
from ._loss_utils import check_loss_args, reduce_loss

__all__ = ["dual_focal_loss", "dual_focal_weight", "log_p_below"]


def log_p_below(log_p: torch.Tensor, lp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise ``max{log p_c : log p_c < lp}`` of ``log_p`` (M, C) and its index (``-inf`` if none).

    Computed without boolean masks (``where``/``masked_fill`` are slow on CPU) as the
    ``argmin`` of ``1/u``, ``u = log p - lp``: candidates (``u < 0``) map to negative values,
    the largest candidate to the most negative, and ``u >= 0`` (the target itself and every
    tie with it; ``u`` is never -0 since it is a difference) to positive values or ``+inf``.
    The value is then read exactly from ``log_p``.  (Two candidates within one float ulp of
    each other, relative, can round to the same ``1/u``; either may then be picked: they are
    equal to working precision.)
    """
    r = (log_p - lp.unsqueeze(1)).reciprocal_()
    rmin, j = r.min(dim=1)
    lj = log_p.gather(1, j.unsqueeze(1)).squeeze(1)
    return torch.where(rmin < 0, lj, torch.full_like(lj, float("-inf"))), j


def _dual_spec(gamma: float):
    def spec(log_p, lp, y, make_d):
        lj, j = log_p_below(log_p, lp)
        p = lp.exp()
        pj = lj.exp()
        base = -torch.expm1(lp) + pj
        w = base.pow(gamma)
        # r = lp / base; base = 0 only where lp = 0 (0/0): the limit there is -1.
        r = (lp / base).nan_to_num_(nan=-1.0)
        a = -w * (1.0 - gamma * p * r)
        b = -gamma * pj * r * w
        return Terms(loss=-w * lp, alpha=-(a + b), beta=-b, extra_index=j, extra_coef=b)

    return spec


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
        loss, valid = fused_loss(input, target, ignore_index, validate_args, _dual_spec(gamma))
        return reduce_loss(loss, valid, reduction)


@torch.no_grad()
def dual_focal_weight(log_p: torch.Tensor, target: torch.Tensor, gamma: float) -> torch.Tensor:
    """Detached dual-focal weight ``(1 - p_y + p_j)^γ`` from log-probabilities (M, C), targets (M,)."""
    lp = log_p.gather(1, target.unsqueeze(1)).squeeze(1)
    lj, _ = log_p_below(log_p, lp)
    return (-torch.expm1(lp) + lj.exp()).pow(gamma)
