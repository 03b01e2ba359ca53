"""Cross-entropy, label smoothing (both conventions) and the Brier score as training losses."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ._common import check_alpha, no_autocast
from ._loss_utils import _compute_dtype, check_loss_args, reduce_loss, target_log_probs

__all__ = ["cross_entropy", "label_smoothing_loss", "brier_loss", "SPREADS"]

SPREADS = ("others", "uniform")


def _check_target_range(target: torch.Tensor, c: int, ignore_index: int) -> None:
    if target.numel() == 0:
        return
    bad = ((target < 0) | (target >= c)) & (target != ignore_index)
    if bool(bad.any()):
        raise ValueError(
            f"Expected `target` values in [0, {c - 1}] (or ignore_index={ignore_index}), "
            f"got {int(target[bad][0])}"
        )


def cross_entropy(
    input: torch.Tensor, target: torch.Tensor, *, reduction: str = "mean",
    ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Cross-entropy ``-log p_y`` (``F.cross_entropy`` computed in float32/float64).

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        reduction: ``"mean"`` (over entries not equal to ``ignore_index``), ``"sum"`` or ``"none"``.
        ignore_index: target value whose entries contribute 0 and are left out of the mean.
        validate_args: check the target range with a clear error (one host sync).

    Example:
        >>> cross_entropy(torch.tensor([[0.0, 0.0]]), torch.tensor([1]))  # log 2
        tensor(0.6931)
    """
    check_loss_args(input, target, reduction)
    if validate_args:
        _check_target_range(target, input.shape[1], ignore_index)
    with no_autocast(input):
        return F.cross_entropy(input.to(_compute_dtype(input)), target.long(),
                               reduction=reduction, ignore_index=ignore_index)


def label_smoothing_loss(
    input: torch.Tensor, target: torch.Tensor, alpha: float = 0.05, *, spread: str = "others",
    reduction: str = "mean", ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Cross-entropy against a smoothed target ``q``: ``-Σ_c q_c log p_c``.

    * ``spread="others"`` (default; the focal-calibration code): ``q_y = 1-α``,
      ``q_c = α/(C-1)`` for ``c != y``.
    * ``spread="uniform"`` (PyTorch's ``label_smoothing=α``): ``q_c = α/C`` for every class,
      so ``q_y = 1 - α + α/C``.

    "others" with α equals "uniform" with ``α·C/(C-1)``; both run on ``F.cross_entropy``'s fused
    kernel when that value is at most 1, and on an explicit formula otherwise.

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        alpha: smoothing in [0, 1) (default 0.05, the paper's LS-0.05).
        spread: ``"others"`` or ``"uniform"``.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: target value to ignore.
        validate_args: check the target range.

    Example:
        >>> x = torch.tensor([[0.0, 0.0]])
        >>> label_smoothing_loss(x, torch.tensor([0]), alpha=0.1)  # log 2 for any q
        tensor(0.6931)
    """
    check_loss_args(input, target, reduction)
    alpha = check_alpha(alpha)
    if spread not in SPREADS:
        raise ValueError(f"Expected `spread` to be one of {SPREADS}, got {spread!r}")
    c = input.shape[1]
    if spread == "others" and alpha > 0:
        if c < 2:
            raise ValueError(
                f"Expected at least 2 classes for spread='others' with alpha > 0, got {c}"
            )
        eps = alpha * c / (c - 1)
    else:
        eps = alpha
    if validate_args:
        _check_target_range(target, c, ignore_index)
    with no_autocast(input):
        x = input.to(_compute_dtype(input))
        if eps <= 1.0:
            return F.cross_entropy(x, target.long(), reduction=reduction,
                                   ignore_index=ignore_index, label_smoothing=eps)
        log_p, lp, _, valid = target_log_probs(x, target, ignore_index, validate_args=False)
        total = log_p.sum(1)
        other = alpha / (c - 1)
        loss = -(1.0 - alpha) * lp - other * (total - lp)
        return reduce_loss(loss, valid, reduction)


def _flat(input: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, C, d1, ...) -> (M, C) logits and (M,) targets (a view for (N, C) input)."""
    if input.ndim == 2:
        return input, target
    c = input.shape[1]
    return input.movedim(1, -1).reshape(-1, c), target.reshape(-1)


class _BrierFunction(torch.autograd.Function):
    """Per-sample ``Σ_c (p_c - onehot_c)^2`` of logits (M, C); backward ``2 p (d - <d, p>)``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        log_p = torch.log_softmax(x, dim=1)
        p = log_p.exp()
        idx = y.unsqueeze(1)
        # d = p - onehot, with d_y = -(1 - p_y) = expm1(log p_y): exact near p_y = 1.
        d = p.scatter(1, idx, torch.expm1(log_p.gather(1, idx)))
        loss = torch.linalg.vecdot(d, d, dim=1)
        ctx.save_for_backward(p, d)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        p, d = ctx.saved_tensors
        m = torch.linalg.vecdot(d, p, dim=1)
        return (2.0 * grad).unsqueeze(1) * p * (d - m.unsqueeze(1)), None


def brier_loss(
    input: torch.Tensor, target: torch.Tensor, *, reduction: str = "mean",
    ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Brier score as a loss: ``Σ_c (p_c - onehot(y)_c)^2`` per sample (not divided by C).

    The published training code averages it over the batch (``published_reduction="mean"``).
    Backward is the closed form ``∂ℓ/∂z_k = 2 p_k (d_k - Σ_c d_c p_c)`` with ``d = p - onehot``.

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: target value to ignore.
        validate_args: check the target range.

    Example:
        >>> brier_loss(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))  # 0.25 + 0.25
        tensor(0.5000)
    """
    check_loss_args(input, target, reduction)
    c = input.shape[1]
    if validate_args:
        _check_target_range(target, c, ignore_index)
    with no_autocast(input):
        x, t = _flat(input.to(_compute_dtype(input)), target)
        ignored = t == ignore_index
        valid = ~ignored if bool(ignored.any()) else None
        safe = t.long() if valid is None else torch.where(valid, t, torch.zeros_like(t)).long()
        loss = _BrierFunction.apply(x, safe).reshape(target.shape)
        return reduce_loss(loss, None if valid is None else valid.reshape(target.shape), reduction)
