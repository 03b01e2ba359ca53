r"""The gradient-weighted (GRA) family and BSCE (Lin, Tao, Dong, Xu 2025).

GRA: ``ℓ_i = w_i · (-log p_{y_i})`` with the weight ``w`` **detached**, so the batch gradient is
``Σ_i w_i ∇CE_i``: the weight scales each sample's gradient instead of changing the loss
surface (the same gradients as a backward hook that scales per-sample gradients by ``w``).
One combinator, :func:`gradient_weighted_loss`, serves every member:

* BSCE-GRA: ``w = ‖onehot(y) - p‖_β^γ`` (β=2, γ=2 is the Brier score itself; the published
  code's β=1, γ=1 reduces to ``2(1-p_y)``);
* FL-GRA: ``w = (1-p_y)^γ``;  DFL-GRA: ``w = (1-p_y+p_j)^γ`` (everything detached by
  default; the published ``DualFocalLossGra`` detaches only ``p_j``: ``detach="p_j"``).

BSCE (:func:`bsce_loss`) applies the same Brier-score weight to the loss **without** detaching.

Implementation: the weight is computed under ``no_grad`` from the same ``log_softmax`` as the
loss, and ``-w·log p_y`` goes through plain autograd (the N×C backward is that of
``F.cross_entropy``).
"""

from __future__ import annotations

import torch

from ._common import check_hyper, no_autocast, safe_pow
from ._loss_utils import (
    as_compute,
    as_index,
    check_loss_args,
    compute_dtype,
    reduce_loss,
    scatter_fresh,
    target_log_probs,
)
from .basic import brier_apply

__all__ = [
    "gradient_weighted_loss",
    "brier_uncertainty",
    "bsce_gra_loss",
    "bsce_loss",
    "focal_gra_loss",
    "dual_focal_gra_loss",
    "check_beta",
]


def check_beta(beta) -> float:
    """``beta``, the norm order of the gradient-weighted losses, checked to be positive."""
    return check_hyper(beta, "beta", positive=True)  # the norm order


def gradient_weighted_loss(
    input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, *, reduction: str = "mean",
    ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Per-sample cross-entropy times a detached weight: ``ℓ_i = w_i.detach() · (-log p_{y_i})``.

    The gradient is ``Σ_i w_i ∇CE_i`` whatever ``w`` depends on.

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        weight: a tensor of ``target``'s shape (or a number); detached.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: target value to ignore.
        validate_args: check the target range and that the weight is finite.

    Example:
        >>> x = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
        >>> gradient_weighted_loss(x, torch.tensor([0, 1]), torch.tensor([1.0, 3.0]), reduction="sum")
        tensor(2.7726)
    """
    check_loss_args(input, target, reduction)
    if isinstance(weight, torch.Tensor) and weight.ndim > 0:
        if tuple(weight.shape) != tuple(target.shape):
            raise ValueError(
                f"Expected `weight` of the target's shape {tuple(target.shape)}, "
                f"got {tuple(weight.shape)}"
            )
        w = weight.detach().to(device=input.device, dtype=compute_dtype(input))
        if (validate_args and w.numel() and not torch.compiler.is_compiling()
                and not bool(torch.isfinite(w).all())):
            raise ValueError("Expected `weight` to be finite")
    else:
        w = check_hyper(weight, "weight", allow_negative=True)
    return _gra(input, target, lambda log_p, lp, safe: w, reduction=reduction,
                ignore_index=ignore_index, validate_args=validate_args)


def _gra(input: torch.Tensor, target: torch.Tensor, weight_of, *, reduction: str,
         ignore_index: int, validate_args: bool) -> torch.Tensor:
    """``-w·log p_y`` with ``w = weight_of(log_p, lp, safe_target)`` computed without gradient
    (call after ``check_loss_args``)."""
    with no_autocast(input):
        log_p, lp, safe, valid = target_log_probs(input, target, ignore_index,
                                                  validate_args=validate_args)
        with torch.no_grad():
            w = weight_of(log_p.detach(), lp.detach(), safe)
        return reduce_loss(torch.mul(w, lp).neg(), valid, reduction)


def brier_uncertainty(log_p: torch.Tensor, target: torch.Tensor, beta: float = 2.0,
                      gamma: float = 2.0) -> torch.Tensor:
    r"""``u_i = ‖onehot(y_i) - p_i‖_β^γ`` from log-probabilities (N, C, ...) and targets (N, ...)
    (the norm over dim 1).

    Differentiable (call under ``no_grad`` for the GRA weight).  ``d_y = -(1-p_y)`` is computed
    as ``expm1(log p_y)`` (exact near ``p_y = 1``); for β = γ = 2 this is the Brier score.
    """
    p = log_p.exp()
    idx = target.unsqueeze(1)
    # in place on the fresh exp when nothing differentiates it (the GRA weight under no_grad)
    d = scatter_fresh(p, 1, idx, torch.expm1(log_p.gather(1, idx)))
    if beta == 2.0:
        s = torch.linalg.vector_norm(d, dim=1).square()
    elif beta == 1.0:
        s = d.abs().sum(1)
    else:
        s = safe_pow(d.abs(), beta).sum(1)
    return s if gamma == beta else safe_pow(s, gamma / beta)


def bsce_gra_loss(
    input: torch.Tensor, target: torch.Tensor, beta: float = 2.0, gamma: float = 2.0, *,
    reduction: str = "mean", ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""BSCE-GRA: ``u_i · (-log p_{y_i})`` with ``u_i = ‖onehot(y_i) - p_i‖_β^γ`` detached.

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        beta: norm order, finite > 0 (default 2).
        gamma: exponent, finite >= 0 (default 2; β=γ=2 makes ``u`` the Brier score).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: target value to ignore.
        validate_args: check the target range.

    Example:
        >>> x = torch.tensor([[0.0, 0.0]])
        >>> bsce_gra_loss(x, torch.tensor([0]))  # 0.5 * log 2
        tensor(0.3466)
    """
    check_loss_args(input, target, reduction)
    beta = check_beta(beta)
    gamma = check_hyper(gamma, "gamma")

    def weight(log_p, lp, safe):
        # in place on the fresh exp (computed under no_grad): no (N, C) copy
        d = scatter_fresh(log_p.exp(), 1, as_index(safe).unsqueeze(1),
                          torch.expm1(lp).unsqueeze(1))
        n = torch.linalg.vector_norm(d, ord=beta, dim=1)
        return n if gamma == 1.0 else n.pow(gamma)

    return _gra(input, target, weight, reduction=reduction, ignore_index=ignore_index,
                validate_args=validate_args)


def bsce_loss(
    input: torch.Tensor, target: torch.Tensor, beta: float = 2.0, gamma: float = 2.0, *,
    reduction: str = "mean", ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""BSCE (loss-weighted): ``u_i · (-log p_{y_i})`` with ``u_i = ‖onehot(y_i) - p_i‖_β^γ``
    **not** detached (the BSCE-GRA paper's main comparison).  Same arguments as
    :func:`bsce_gra_loss`.

    Example:
        >>> x = torch.tensor([[0.0, 0.0]])
        >>> bsce_loss(x, torch.tensor([0]))  # 0.5 * log 2
        tensor(0.3466)
    """
    check_loss_args(input, target, reduction)
    beta = check_beta(beta)
    gamma = check_hyper(gamma, "gamma")
    with no_autocast(input):
        if beta == 2.0:  # closed-form fused backward (see torchcal.functional.basic)
            loss, valid = brier_apply(as_compute(input), target, ignore_index,
                                      validate_args, gamma)
            return reduce_loss(loss, valid, reduction)
        log_p, lp, safe, valid = target_log_probs(input, target, ignore_index,
                                                  validate_args=validate_args)
        u = brier_uncertainty(log_p, as_index(safe), beta, gamma)
        return reduce_loss(torch.mul(u, lp).neg(), valid, reduction)


def focal_gra_loss(
    input: torch.Tensor, target: torch.Tensor, gamma: float = 3.0, *, reduction: str = "mean",
    ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""FL-GRA: ``(1 - p_y)^γ`` (detached) times ``-log p_y``.

    Example:
        >>> focal_gra_loss(torch.tensor([[0.0, 0.0]]), torch.tensor([0]), gamma=1.0)
        tensor(0.3466)
    """
    check_loss_args(input, target, reduction)
    gamma = check_hyper(gamma, "gamma")
    return _gra(input, target, lambda log_p, lp, safe: torch.expm1(lp).neg_().pow_(gamma),
                reduction=reduction, ignore_index=ignore_index, validate_args=validate_args)


#: ``detach`` values of :func:`dual_focal_gra_loss`.
DFL_GRA_DETACH = ("weight", "p_j")


def dual_focal_gra_loss(
    input: torch.Tensor, target: torch.Tensor, gamma: float = 5.0, *, detach: str = "weight",
    reduction: str = "mean", ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""DFL-GRA: the dual-focal weight ``(1 - p_y + p_j)^γ`` times ``-log p_y``.

    ``detach="weight"`` (default) detaches the whole weight, the GRA rule of the paper (the
    gradient is ``Σ_i w_i ∇CE_i``); ``detach="p_j"`` detaches only ``p_j``, as the published
    ``DualFocalLossGra`` does, so the gradient also flows through ``1 - p_y``.  The values are
    equal; the gradients differ (by half or more of their norm).

    Example:
        >>> x = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
        >>> dual_focal_gra_loss(x, torch.tensor([1]), gamma=1.0)  # 0.9 * -log 0.3
        tensor(1.0836)
    """
    check_loss_args(input, target, reduction)
    gamma = check_hyper(gamma, "gamma")
    if detach not in DFL_GRA_DETACH:
        raise ValueError(f"Expected `detach` to be one of {DFL_GRA_DETACH}, got {detach!r}")

    def p_j_of(log_p, lp):
        # value only (no index needed for a detached p_j): amin of 1/u, u = log p - lp,
        # then u* = 1/min (to working precision); see dual_focal.log_p_below
        rmin = (log_p - lp.unsqueeze(1)).reciprocal_().amin(1)
        return torch.where(rmin < 0, (lp + rmin.reciprocal()).exp(), 0.0)

    if detach == "p_j":
        with no_autocast(input):
            log_p, lp, _, valid = target_log_probs(input, target, ignore_index,
                                                   validate_args=validate_args)
            with torch.no_grad():
                pj = p_j_of(log_p.detach(), lp.detach())
            base = torch.expm1(lp).neg() + pj
            return reduce_loss(safe_pow(base, gamma).mul(lp).neg(), valid, reduction)

    def weight(log_p, lp, safe):
        return torch.expm1(lp).neg_().add_(p_j_of(log_p, lp)).pow_(gamma)

    return _gra(input, target, weight, reduction=reduction, ignore_index=ignore_index,
                validate_args=validate_args)
