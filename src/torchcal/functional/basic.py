"""Cross-entropy, label smoothing (both conventions) and the Brier score as training losses."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from . import _loss_utils
from ._common import check_alpha, no_autocast
from ._fused import label_smoothing_apply
from ._loss_utils import (
    as_compute,
    as_index,
    check_loss_args,
    check_target_range,
    flat_rows,
    reduce_loss,
    scatter_fresh,
    target_log_probs,
    unflat_rows,
)

__all__ = ["cross_entropy", "label_smoothing_loss", "brier_loss", "SPREADS", "brier_apply"]

SPREADS = ("others", "uniform")


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
        validate_args: turn a bad target into a clear ``ValueError`` (eager, CPU; the range
            check itself is ``F.cross_entropy``'s own and costs nothing extra).

    Example:
        >>> cross_entropy(torch.tensor([[0.0, 0.0]]), torch.tensor([1]))  # log 2
        tensor(0.6931)
    """
    check_loss_args(input, target, reduction)
    return _torch_cross_entropy(input, target, reduction, ignore_index, validate_args, 0.0)


def _torch_cross_entropy(input: torch.Tensor, target: torch.Tensor, reduction: str,
                         ignore_index: int, validate_args: bool, label_smoothing: float
                         ) -> torch.Tensor:
    """``F.cross_entropy`` in float32/float64 with torchcal's target check (after
    ``check_loss_args``)."""
    try:  # F.cross_entropy checks the target range itself (no extra op)
        with no_autocast(input):
            return F.cross_entropy(as_compute(input), as_index(target),
                                   reduction=reduction, ignore_index=ignore_index,
                                   label_smoothing=label_smoothing)
    except (RuntimeError, IndexError) as e:
        error = e
    if validate_args and not _loss_utils.sync_free(target):
        check_target_range(target, input.shape[1], ignore_index)  # the clear error
    raise error


def label_smoothing_loss(
    input: torch.Tensor, target: torch.Tensor, alpha: float = 0.05, *, spread: str = "others",
    reduction: str = "mean", ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Cross-entropy against a smoothed target ``q``: ``-Σ_c q_c log p_c``.

    * ``spread="others"`` (default; the focal-calibration code): ``q_y = 1-α``,
      ``q_c = α/(C-1)`` for ``c != y``.
    * ``spread="uniform"`` (PyTorch's ``label_smoothing=α``): ``q_c = α/C`` for every class,
      so ``q_y = 1 - α + α/C``.

    "others" with α is "uniform" with ``ε = α·C/(C-1)``: both compute
    ``-(1-ε) log p_y - (ε/C) Σ_c log p_c`` with the gradient ``p - q``.

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
    if eps == 0.0:  # cross-entropy itself
        return _torch_cross_entropy(input, target, reduction, ignore_index, validate_args, eps)
    # one log_softmax, the sum of its row and the analytic backward g (p - q) (also for
    # "others" with C = 2 and alpha > 1/2, where eps = 2 alpha > 1)
    with no_autocast(input):
        loss, valid = label_smoothing_apply(as_compute(input), target, eps, ignore_index,
                                            validate_args)
        return reduce_loss(loss, valid, reduction)


class _BrierFunction(torch.autograd.Function):
    """Brier score ``B = ‖d‖²`` (``bsce_gamma=None``) or BSCE ``-B^(γ/2) · log p_y`` per row.

    ``d = p - onehot`` with ``d_y = expm1(log p_y)`` (exact near p_y = 1).
    ``∂B/∂z = 2 p ∘ (d - m)`` with ``m = <d, p> = B - q``; on ``d`` alone (``p = d + e_y``) this
    is ``2 d ∘ (d - m)`` plus ``2 (d_y - m) = -2B`` at the true class.  For BSCE,
    ``∂ℓ/∂z = u·d + (-log p_y)·(γ/2) B^(γ/2-1) ∂B/∂z = d ∘ (u + k (d - m)) - k B e_y`` with
    ``u = B^(γ/2)``, ``k = -γ log p_y B^(γ/2-1)`` (``k = 0`` where ``B = 0``, its limit).
    The backward is two passes over ``d`` (an ``addcmul`` and a multiply) plus a scatter.

    The forward's scatter goes in place on its fresh ``exp`` outside ``vmap`` and
    ``torch.compile`` (:func:`~torchcal.functional._loss_utils.scatter_fresh`), the backward's
    multiply and scatter in place on its own fresh tensor, and no (N, C) zero gradient is
    materialised for the intermediates: the same values, bit for bit, with fewer copies.

    Written in the ``setup_context`` form with the intermediates the backward needs returned
    as (non-differentiable) outputs and ``generate_vmap_rule``, so that the loss runs under
    ``torch.func.vmap`` (packed training evaluates the lanes' losses in one vmapped call).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, target: torch.Tensor, ignore_index: int,
                validate_args: bool, bsce_gamma: float | None):
        log_p, lp, safe, valid = target_log_probs(x, target, ignore_index,
                                                  validate_args=validate_args)
        d = flat_rows(log_p).exp()
        lp1 = lp.reshape(-1)
        y = as_index(safe).reshape(-1, 1)
        # in place on the fresh exp where that is safe (the values of ``scatter``, no copy)
        d = scatter_fresh(d, 1, y, torch.expm1(lp1).unsqueeze(1))
        b = torch.linalg.vector_norm(d, dim=1).square()  # one fast pass (vecdot is mul + sum)
        m = b + torch.expm1(lp1)  # B - q
        if bsce_gamma is None:
            loss = b
            a = b.new_empty(0)  # two tensors: an output may not be returned twice
            k = b.new_empty(0)
            e = -2.0 * b
        else:
            gam = bsce_gamma
            a = b.pow(gam / 2.0)
            loss = -a * lp1
            pos = b > 0
            k = torch.where(pos, -gam * lp1 * torch.where(pos, b, torch.ones_like(b)).pow(
                gam / 2.0 - 1.0), torch.zeros_like(b))
            e = -k * b
        valid_out = torch.empty(0, dtype=torch.bool, device=x.device) if valid is None else valid
        return loss.reshape(target.shape), valid_out, d, y, m, e, a, k

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, _, _, _, bsce_gamma = inputs
        _, valid_out, d, y, m, e, a, k = output
        ctx.shape = x.shape
        ctx.brier = bsce_gamma is None
        ctx.set_materialize_grads(False)  # no (N, C) zeros for the gradient of ``d``
        ctx.save_for_backward(d, y, m, e, a, k)
        ctx.mark_non_differentiable(valid_out, d, y, m, e, a, k)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor, *_unused):
        if grad is None:  # the loss itself is not differentiated
            return None, None, None, None, None
        d, y, m, e, a, k = ctx.saved_tensors
        g = grad.reshape(-1)
        if ctx.brier:  # k = 2, a = 0
            gk = 2.0 * g
            base = -gk * m
        else:
            gk = k * g
            base = a * g - gk * m
        gx = torch.addcmul(base.unsqueeze(1), d, gk.unsqueeze(1))  # g (a + k (d - m))
        # in place on the fresh gx (the values of ``gx * d`` and ``scatter_add``; both in-place
        # ops have vmap batching rules)
        gx.mul_(d)
        gx.scatter_add_(1, y, (g * e).unsqueeze(1))
        return unflat_rows(gx, ctx.shape), None, None, None, None


def brier_apply(x: torch.Tensor, target: torch.Tensor, ignore_index: int, validate_args: bool,
                bsce_gamma: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-entry Brier (or BSCE, ``bsce_gamma``) loss and the valid mask (None: all valid)."""
    loss, valid, *_ = _BrierFunction.apply(x, target, ignore_index, validate_args, bsce_gamma)
    return loss, (valid if valid.numel() else None)


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
    with no_autocast(input):
        loss, valid = brier_apply(as_compute(input), target, ignore_index, validate_args, None)
        return reduce_loss(loss, valid, reduction)
