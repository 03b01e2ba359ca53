r"""The other uncertainty-head objectives of Kirchhof et al.'s ``url`` code.

Besides the pairwise :func:`~torchcal.uncertainty.ranking_loss` (``--loss losspred-order``, the
paper's default), the published code trains the head with

* **loss prediction** (``--loss losspred``, ``LossPrediction`` with ``nn.MSELoss``): the head
  regresses the classifier's per-sample loss, :func:`loss_prediction_mse`
  ``= mean_i (u_i - ℓ_i)²`` with the target ``ℓ`` detached;
* the **log-uncertainty regulariser** (``--unc_reg_lambda λ``), *subtracted* from the loss:
  :func:`log_uncertainty_regularizer` ``= -λ·log(mean_i u_i)``, which rewards a larger mean
  uncertainty (it keeps a ranking-trained head away from collapsing to tiny values).

:func:`head_loss` combines them as :func:`~torchcal.uncertainty.fit_head` uses them.
"""

from __future__ import annotations

import torch

from .._validation import check_nonneg_finite
from .head import as_vector, ranking_loss

__all__ = ["HEAD_OBJECTIVES", "loss_prediction_mse", "log_uncertainty_regularizer", "head_loss"]

#: The head objectives :func:`head_loss` / :func:`~torchcal.uncertainty.fit_head` accept.
HEAD_OBJECTIVES = ("ranking", "mse")


def loss_prediction_mse(uncertainty: torch.Tensor, target_loss: torch.Tensor) -> torch.Tensor:
    r"""Loss-prediction objective: ``mean_i (u_i - ℓ_i)²`` with ``ℓ`` detached.

    The published ``LossPrediction`` head loss with ``unc_loss = nn.MSELoss()`` (the
    ``--loss losspred`` setting of the ``url`` code); ``ℓ`` is the classifier's per-sample
    cross-entropy, detached there (``detach=True``) as here.

    Args:
        uncertainty: predicted uncertainties, shape (N,) or (N, 1), N > 0.
        target_loss: per-sample target losses, same number of entries.

    Returns:
        0-d tensor in the uncertainty's dtype.

    Example:
        >>> loss_prediction_mse(torch.tensor([0.5, 2.0]), torch.tensor([1.0, 1.0]))  # (0.25 + 1) / 2
        tensor(0.6250)
    """
    u = as_vector(uncertainty, "uncertainty")
    t = as_vector(target_loss, "target_loss").detach()
    if t.shape[0] != u.shape[0]:
        raise ValueError(
            f"Expected `target_loss` to have {u.shape[0]} entries (one per `uncertainty`), "
            f"got {t.shape[0]}"
        )
    if u.shape[0] == 0:
        raise ValueError("Expected at least one sample, got 0")
    return (u - t.to(device=u.device, dtype=u.dtype)).square().mean()


def log_uncertainty_regularizer(uncertainty: torch.Tensor, lam: float) -> torch.Tensor:
    r"""The ``url`` code's regulariser ``-λ·log(mean_i u_i)``, added to the head loss.

    The published training subtracts ``unc_reg_lambda · log(unc.mean())`` from its loss
    (``--unc_reg_lambda``, default 0 = off).  The uncertainties must be positive (the
    :class:`~torchcal.uncertainty.UncertaintyHead`'s Softplus + 1e-6 output is).

    Args:
        uncertainty: predicted uncertainties, shape (N,) or (N, 1), N > 0.
        lam: λ >= 0.

    Example:
        >>> log_uncertainty_regularizer(torch.tensor([1.0, 3.0]), 0.5)  # -0.5 log 2
        tensor(-0.3466)
    """
    u = as_vector(uncertainty, "uncertainty")
    lam = check_nonneg_finite(lam, "lam")
    if u.shape[0] == 0:
        raise ValueError("Expected at least one sample, got 0")
    return -lam * u.mean().log()


def head_loss(
    uncertainty: torch.Tensor, target_loss: torch.Tensor, *, objective: str = "ranking",
    margin: float = 0.1, leeway: float = 0.0, unc_reg_lambda: float = 0.0,
) -> torch.Tensor:
    r"""One head-training loss: ``objective`` plus the optional log-uncertainty regulariser.

    ``objective="ranking"``: :func:`~torchcal.uncertainty.ranking_loss` (``margin``,
    ``leeway``); ``"mse"``: :func:`loss_prediction_mse`.  ``unc_reg_lambda > 0`` adds
    :func:`log_uncertainty_regularizer`.

    Example:
        >>> u, l = torch.tensor([0.5, 2.0]), torch.tensor([1.0, 1.0])
        >>> head_loss(u, l, objective="mse", unc_reg_lambda=1.0)  # 0.625 - log 1.25
        tensor(0.4019)
    """
    if objective not in HEAD_OBJECTIVES:
        raise ValueError(f"Expected `objective` to be one of {HEAD_OBJECTIVES}, got {objective!r}")
    if objective == "ranking":
        loss = ranking_loss(uncertainty, target_loss, margin=margin, leeway=leeway)
    else:
        loss = loss_prediction_mse(uncertainty, target_loss)
    if check_nonneg_finite(unc_reg_lambda, "unc_reg_lambda") > 0:
        loss = loss + log_uncertainty_regularizer(uncertainty, unc_reg_lambda)
    return loss
