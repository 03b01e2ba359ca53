r"""Exponentially weighted losses of the BSCE-GRA repository (Lin, Tao, Dong, Xu 2025).

Each per-sample base loss ``b_i`` (cross-entropy, focal, dual focal or Brier) is multiplied
by a **detached** weight that grows with the loss itself,

.. math::
    w_i = \exp\!\Big(\frac{\operatorname{clip}(b_i, 0, T)}{T + 1}\Big) - 1, \qquad
    \ell_i = w_i \cdot b_i ,

with a "temperature" ``T > 0`` (the published ``--temperature``, default 1).  The weight is
computed under ``no_grad``, so the gradient is ``Σ_i w_i ∇b_i``.  The published code writes
``exp(·) - 1``; torchcal uses ``expm1`` (the same number, without the cancellation for small
losses).  Published classes: ``CrossEntropyExp``, ``FocalLossExp``, ``DualFocalLossExp``,
``BrierScoreExp``, all summed over the batch.  Written as plain tensor operations.
"""

from __future__ import annotations

import torch

from ._common import check_hyper
from ._loss_utils import check_loss_args, reduce_loss
from ._plain import kept_mask
from .basic import brier_loss, cross_entropy
from .dual_focal import dual_focal_loss
from .focal import focal_loss

__all__ = [
    "exp_weight",
    "ce_exp_loss",
    "focal_exp_loss",
    "dual_focal_exp_loss",
    "brier_exp_loss",
]


def exp_weight(loss: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    r"""The detached weight ``exp(clip(b, 0, T) / (T + 1)) - 1`` of per-sample losses ``b``.

    Example:
        >>> exp_weight(torch.tensor([0.0, 0.5, 3.0]), temperature=1.0)  # e^0.25 - 1, e^0.5 - 1
        tensor([0.0000, 0.2840, 0.6487])
    """
    t = check_hyper(temperature, "temperature", positive=True)
    return torch.expm1(loss.detach().clamp(0.0, t) / (t + 1.0))


def _weighted(base: torch.Tensor, target: torch.Tensor, temperature: float, reduction: str,
              ignore_index: int) -> torch.Tensor:
    return reduce_loss(exp_weight(base, temperature) * base, kept_mask(target, ignore_index),
                       reduction)


def ce_exp_loss(
    input: torch.Tensor, target: torch.Tensor, temperature: float = 1.0, *,
    reduction: str = "mean", ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Exponentially weighted cross-entropy ``w_i · (-log p_{y_i})`` (module docstring).

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        temperature: T > 0 (default 1).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: target value to ignore.
        validate_args: check the target range.

    Example:
        >>> x = torch.tensor([[0.0, 0.0]])
        >>> ce_exp_loss(x, torch.tensor([0]))  # (e^{log 2 / 2} - 1) log 2 = (√2 - 1) log 2
        tensor(0.2871)
    """
    check_loss_args(input, target, reduction)
    base = cross_entropy(input, target, reduction="none", ignore_index=ignore_index,
                         validate_args=validate_args)
    return _weighted(base, target, temperature, reduction, ignore_index)


def focal_exp_loss(
    input: torch.Tensor, target: torch.Tensor, gamma: float = 3.0, temperature: float = 1.0, *,
    reduction: str = "mean", ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Exponentially weighted focal loss ``w_i · FL_γ,i`` (module docstring); γ default 3.

    Example:
        >>> x = torch.tensor([[0.0, 0.0]])
        >>> focal_exp_loss(x, torch.tensor([0]), gamma=1.0)  # b = log(2)/2: (e^{b/2} - 1)·b
        tensor(0.0656)
    """
    check_loss_args(input, target, reduction)
    base = focal_loss(input, target, gamma, reduction="none", ignore_index=ignore_index,
                      validate_args=validate_args)
    return _weighted(base, target, temperature, reduction, ignore_index)


def dual_focal_exp_loss(
    input: torch.Tensor, target: torch.Tensor, gamma: float = 5.0, temperature: float = 1.0, *,
    reduction: str = "mean", ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Exponentially weighted dual focal loss ``w_i · DFL_γ,i`` (module docstring); γ default 5.

    Example:
        >>> x = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
        >>> dual_focal_exp_loss(x, torch.tensor([1]), gamma=1.0)  # b = 1.0836, clipped to 1
        tensor(0.7029)
    """
    check_loss_args(input, target, reduction)
    base = dual_focal_loss(input, target, gamma, reduction="none", ignore_index=ignore_index,
                           validate_args=validate_args)
    return _weighted(base, target, temperature, reduction, ignore_index)


def brier_exp_loss(
    input: torch.Tensor, target: torch.Tensor, temperature: float = 1.0, *,
    reduction: str = "mean", ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Exponentially weighted Brier score ``w_i · Σ_c (p_c - onehot_c)²`` (module docstring).

    Example:
        >>> x = torch.tensor([[0.0, 0.0]])
        >>> brier_exp_loss(x, torch.tensor([0]))  # (e^{0.25} - 1) · 0.5
        tensor(0.1420)
    """
    check_loss_args(input, target, reduction)
    base = brier_loss(input, target, reduction="none", ignore_index=ignore_index,
                      validate_args=validate_args)
    return _weighted(base, target, temperature, reduction, ignore_index)
