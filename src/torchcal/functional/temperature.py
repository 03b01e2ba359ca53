r"""Temperature-aware losses of the BSCE-GRA repository (Lin, Tao, Dong, Xu 2025).

The focal, dual-focal and BSCE weights are computed from the **temperature-scaled**
probabilities ``q = softmax(z / T)`` while the cross-entropy term keeps ``p = softmax(z)``:

* temperature focal: ``ℓ = -(1 - q_y)^γ · log p_y``;
* temperature dual focal: ``ℓ = -(1 - q_y + q_j)^γ · log p_y``, ``q_j = max{q_c : q_c < q_y}``
  (0 if none);
* temperature BSCE: ``ℓ = -‖onehot(y) - q‖_β^γ · log p_y``.

Each has a GRA variant whose weight is detached (the gradient is ``Σ_i w_i ∇CE_i``).  The
published training re-fits T after every epoch on the validation set (a grid 0.01, 0.02, ...,
10.00, lowest ECE or NLL); :mod:`torchcal.losses.temperature` holds that state, the functions
here take ``temperature`` as an argument (a positive number or a one-element tensor).  At ``T = 1``
they equal focal, dual focal, BSCE and their GRA forms.  Written as plain tensor operations.
"""

from __future__ import annotations

import torch

from ._common import check_hyper, no_autocast, safe_pow
from ._fused import weighted_ce_apply
from ._loss_utils import as_compute, check_loss_args, reduce_loss, scatter_fresh
from ._plain import WeightFn, check_temperature, weighted_ce
from .gradient_weighted import check_beta

__all__ = [
    "temperature_focal_loss",
    "temperature_focal_gra_loss",
    "temperature_dual_focal_loss",
    "temperature_dual_focal_gra_loss",
    "temperature_bsce_loss",
    "temperature_bsce_gra_loss",
]

def _bsce_weight(beta: float, gamma: float) -> WeightFn:
    def fn(log_q, y):
        # ‖onehot - q‖_β^γ = (Σ_c |d_c|^β)^(γ/β) with d_y = expm1(log q_y) (exact near q_y = 1);
        # out of place throughout, so that it is differentiable (the non-GRA loss)
        idx = y.unsqueeze(1)
        d = scatter_fresh(log_q.exp(), 1, idx, torch.expm1(log_q.gather(1, idx)))
        return safe_pow(safe_pow(d.abs(), beta).sum(dim=1), gamma / beta)

    return fn


def _bsce(input, target, beta, gamma, detach: bool, temperature, reduction: str,
          ignore_index: int, validate_args: bool) -> torch.Tensor:
    beta, gamma = check_beta(beta), check_hyper(gamma, "gamma")
    if beta == 2.0:  # the analytic backward
        return _run(input, target, "bsce", detach, temperature, reduction, ignore_index,
                    validate_args, gamma)
    return _run(input, target, _bsce_weight(beta, gamma), detach, temperature, reduction,
                ignore_index, validate_args)


def _run(input, target, weight: WeightFn | str, detach: bool, temperature, reduction: str,
         ignore_index: int, validate_args: bool, gamma: float = 0.0) -> torch.Tensor:
    """The loss with a weight of :data:`~torchcal.functional._fused.WEIGHT_KINDS` (named by
    ``weight``) through the analytic backward, any other (a ``WeightFn``) through autograd."""
    check_loss_args(input, target, reduction)
    if isinstance(weight, str):
        with no_autocast(input):
            loss, valid = weighted_ce_apply(
                as_compute(input), target, kind=weight, gamma=gamma,
                temperature=check_temperature(temperature), detach=detach,
                ignore_index=ignore_index, validate_args=validate_args)
            return reduce_loss(loss, valid, reduction)
    return weighted_ce(input, target, weight, detach=detach,
                       temperature=check_temperature(temperature), reduction=reduction,
                       ignore_index=ignore_index, validate_args=validate_args)


def temperature_focal_loss(
    input: torch.Tensor, target: torch.Tensor, gamma: float = 3.0,
    temperature: float | torch.Tensor = 1.0, *, reduction: str = "mean",
    ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Temperature focal loss ``-(1 - q_y)^γ log p_y``, ``q = softmax(z / T)``; the weight keeps
    its gradient (the published ``TemperatureFocalLoss``).

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        gamma: γ >= 0 (default 3).
        temperature: T > 0 of the weight's probabilities (a number or a one-element tensor).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: target value to ignore.
        validate_args: check the target range.

    Example:
        >>> x = torch.tensor([[2.0, 0.0]])
        >>> temperature_focal_loss(x, torch.tensor([0]), gamma=1.0, temperature=2.0)
        tensor(0.0341)
        >>> # (1 - sigmoid(1)) · -log sigmoid(2) = 0.2689 · 0.1269
    """
    return _run(input, target, "focal", False, temperature, reduction, ignore_index,
                validate_args, check_hyper(gamma, "gamma"))


def temperature_focal_gra_loss(
    input: torch.Tensor, target: torch.Tensor, gamma: float = 3.0,
    temperature: float | torch.Tensor = 1.0, *, reduction: str = "mean",
    ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Temperature focal GRA: the weight ``(1 - q_y)^γ`` detached times ``-log p_y`` (the
    published ``TemperatureFocalLossGra``).  Arguments as :func:`temperature_focal_loss`.

    Example:
        >>> x = torch.tensor([[2.0, 0.0]])
        >>> temperature_focal_gra_loss(x, torch.tensor([0]), gamma=1.0, temperature=2.0)
        tensor(0.0341)
    """
    return _run(input, target, "focal", True, temperature, reduction, ignore_index,
                validate_args, check_hyper(gamma, "gamma"))


def temperature_dual_focal_loss(
    input: torch.Tensor, target: torch.Tensor, gamma: float = 5.0,
    temperature: float | torch.Tensor = 1.0, *, reduction: str = "mean",
    ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Temperature dual focal loss ``-(1 - q_y + q_j)^γ log p_y`` with ``q = softmax(z / T)``
    and ``q_j`` the largest scaled probability strictly below ``q_y`` (0 if none); nothing is
    detached (the published ``TemperatureDualFocalLoss``).  Arguments as
    :func:`temperature_focal_loss` (γ default 5).

    Example:
        >>> x = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
        >>> temperature_dual_focal_loss(x, torch.tensor([1]), gamma=1.0)  # T = 1: dual focal
        tensor(1.0836)
    """
    return _run(input, target, "dual", False, temperature, reduction, ignore_index,
                validate_args, check_hyper(gamma, "gamma"))


def temperature_dual_focal_gra_loss(
    input: torch.Tensor, target: torch.Tensor, gamma: float = 5.0,
    temperature: float | torch.Tensor = 1.0, *, reduction: str = "mean",
    ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Temperature dual focal GRA: ``(1 - q_y + q_j)^γ`` detached times ``-log p_y`` (the
    published ``TemperatureDualFocalLossGra``).  Arguments as :func:`temperature_focal_loss`.

    Example:
        >>> x = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
        >>> temperature_dual_focal_gra_loss(x, torch.tensor([1]), gamma=1.0)
        tensor(1.0836)
    """
    return _run(input, target, "dual", True, temperature, reduction, ignore_index,
                validate_args, check_hyper(gamma, "gamma"))


def temperature_bsce_loss(
    input: torch.Tensor, target: torch.Tensor, beta: float = 2.0, gamma: float = 2.0,
    temperature: float | torch.Tensor = 1.0, *, reduction: str = "mean",
    ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Temperature BSCE ``-‖onehot(y) - q‖_β^γ log p_y`` with ``q = softmax(z / T)``, the weight
    not detached (the published ``TemperatureBSCELoss``, whose ``norm`` is β).

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        beta: norm order > 0 (default 2).
        gamma: exponent >= 0 (default 2).
        temperature: T > 0 (a number or a one-element tensor).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: target value to ignore.
        validate_args: check the target range.

    Example:
        >>> x = torch.tensor([[2.0, 0.0]])
        >>> temperature_bsce_loss(x, torch.tensor([0]), temperature=2.0)  # 2·(1-σ(1))²·(-log σ(2))
        tensor(0.0184)
    """
    return _bsce(input, target, beta, gamma, False, temperature, reduction, ignore_index,
                 validate_args)


def temperature_bsce_gra_loss(
    input: torch.Tensor, target: torch.Tensor, beta: float = 2.0, gamma: float = 2.0,
    temperature: float | torch.Tensor = 1.0, *, reduction: str = "mean",
    ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Temperature BSCE-GRA: ``‖onehot(y) - q‖_β^γ`` detached times ``-log p_y`` (the
    published ``TemperatureBSCELossGra``).  Arguments as :func:`temperature_bsce_loss`.

    Example:
        >>> x = torch.tensor([[2.0, 0.0]])
        >>> temperature_bsce_gra_loss(x, torch.tensor([0]), temperature=2.0)
        tensor(0.0184)
    """
    return _bsce(input, target, beta, gamma, True, temperature, reduction, ignore_index,
                 validate_args)
