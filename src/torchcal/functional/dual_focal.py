"""Dual focal loss (Tao, Dong, Xu, ICML 2023).

Per sample ``-(1 - p_y + p_j)^γ log p_y`` with ``p_j = max{p_c : p_c < p_y}`` the largest
probability *strictly below* the true class's (0 if there is none, e.g. when ``p_y`` is the
smallest or all probabilities are tied).  Nothing is detached.

Implementation: one custom :class:`torch.autograd.Function` on the logits.  The forward takes
``log_softmax``, masks the entries ``>= log p_y`` and takes a row ``max`` (with its index ``j``;
on ties in ``p_j`` the first index gets the gradient, a valid subgradient); the backward is the
closed form

    ∂ℓ/∂z = a · (e_y - p) + b · (e_j - p),
    a = ∂ℓ/∂log p_y = -w (1 - γ p_y r),   b = ∂ℓ/∂log p_j = -γ p_j r w,
    w = (q + p_j)^γ,  q = -expm1(log p_y),  r = log p_y / (q + p_j)  (r = -1 where q + p_j = 0),

finite everywhere (also at ``p_y = 1`` for ``0 < γ < 1``) and cheaper than autograd through the
masked max.  The weight for the GRA variant (:func:`dual_focal_weight`) reuses the same masked max.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ._common import check_hyper, no_autocast
from ._loss_utils import _compute_dtype, check_loss_args, reduce_loss

__all__ = ["dual_focal_loss", "dual_focal_weight", "log_p_below"]


def _flat(input: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if input.ndim == 2:
        return input, target
    c = input.shape[1]
    return input.movedim(1, -1).reshape(-1, c), target.reshape(-1)


def _prepare(input, target, reduction, ignore_index, validate_args):
    """Checks; return (x (M,C) in compute dtype, safe targets (M,), valid (target shape) | None)."""
    from .basic import _check_target_range

    check_loss_args(input, target, reduction)
    if validate_args:
        _check_target_range(target, input.shape[1], ignore_index)
    x, t = _flat(input.to(_compute_dtype(input)), target)
    ignored = t == ignore_index
    if bool(ignored.any()):
        valid = ~ignored
        t = torch.where(valid, t, torch.zeros_like(t))
        valid = valid.reshape(target.shape)
    else:
        valid = None
    return x, t.long(), valid


def log_p_below(log_p: torch.Tensor, lp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise ``(max{log p_c : log p_c < lp}, argmax)`` of ``log_p`` (M, C); ``-inf`` if none."""
    masked = log_p.masked_fill(log_p >= lp.unsqueeze(1), float("-inf"))
    return masked.max(dim=1)


class _DualFocalFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, y: torch.Tensor, gamma: float) -> torch.Tensor:
        log_p = torch.log_softmax(x, dim=1)
        idx = y.unsqueeze(1)
        lp = log_p.gather(1, idx).squeeze(1)
        lj, j = log_p_below(log_p, lp)
        p = lp.exp()
        pj = lj.exp()
        base = -torch.expm1(lp) + pj
        w = base.pow(gamma)
        loss = -w * lp
        pos = base > 0
        r = torch.where(pos, lp / torch.where(pos, base, torch.ones_like(base)),
                        torch.full_like(base, -1.0))
        a = -w * (1.0 - gamma * p * r)
        b = -gamma * pj * r * w
        ctx.save_for_backward(log_p, idx, j, a, b)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        log_p, idx, j, a, b = ctx.saved_tensors
        ga = grad * a
        gb = grad * b
        gx = log_p.exp().mul_(-(ga + gb).unsqueeze(1))
        gx.scatter_add_(1, idx, ga.unsqueeze(1))
        gx.scatter_add_(1, j.unsqueeze(1), gb.unsqueeze(1))
        return gx, None, None


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
    gamma = check_hyper(gamma, "gamma")
    with no_autocast(input):
        x, t, valid = _prepare(input, target, reduction, ignore_index, validate_args)
        loss = _DualFocalFunction.apply(x, t, gamma).reshape(target.shape)
        return reduce_loss(loss, valid, reduction)


@torch.no_grad()
def dual_focal_weight(log_p: torch.Tensor, target: torch.Tensor, gamma: float) -> torch.Tensor:
    """Detached dual-focal weight ``(1 - p_y + p_j)^γ`` from log-probabilities (M, C), targets (M,)."""
    lp = log_p.gather(1, target.unsqueeze(1)).squeeze(1)
    lj, _ = log_p_below(log_p, lp)
    return (-torch.expm1(lp) + lj.exp()).pow(gamma)
