r"""Unweighted MMCE (MMCE_m, Kumar, Sarawagi, Jain, ICML 2018) and MMCE-GRA.

With ``r_i`` the top-1 confidence (differentiable), ``c_i = [argmax p_i = y_i]`` and the kernel
``k(r_i, r_j) = exp(-|r_i - r_j| / width)`` (width 0.4), over the M samples of a batch

.. math::
    \mathrm{MMCE}_m = \frac{1}{M^2} \sum_{i,j} (c_i - r_i)(c_j - r_j)\, k(r_i, r_j)

(no square root: the focal-calibration code's ``mmce`` option, ``MMCE``).

* :func:`mmce_unweighted_loss`: ``CE_mean + λ·MMCE_m`` (the published ``mmce`` training objective);
* :func:`mmce_gra_loss`: ``MMCE_m`` **detached** times ``CE_mean`` (the BSCE-GRA repository's
  ``MMCEGRA``): the batch's calibration error scales the cross-entropy gradient.

``reduction="sum"`` gives M times the value (the published training multiplies by the batch
size), ``"none"`` is rejected (batch quantities).  O(M²) time and memory.  Plain tensor ops.
"""

from __future__ import annotations

import torch

from ._common import check_hyper, no_autocast
from ._loss_utils import check_loss_args
from ._plain import batch_reduce, check_batch_reduction, kept_count, row_log_probs

__all__ = ["mmce_unweighted_penalty", "mmce_m_terms", "mmce_unweighted_loss", "mmce_gra_loss"]


def mmce_unweighted_penalty(
    conf: torch.Tensor, correct: torch.Tensor, *, width: float = 0.4,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""``Σ_{i,j} (c_i - r_i)(c_j - r_j) k(r_i, r_j) / M²`` of 1-D confidences and booleans.

    ``weight`` (optional 0/1 floats) drops entries (e.g. ignored targets; M is then their
    number); 0 when M = 0.  Differentiable in ``conf``.

    Example:
        >>> # (0.1² + 0.6² - 2·0.1·0.6·exp(-0.75)) / 4 with c - r = (0.1, -0.6)
        >>> mmce_unweighted_penalty(torch.tensor([0.9, 0.6]), torch.tensor([True, False]))
        tensor(0.0783)
    """
    width = check_hyper(width, "width", positive=True)
    e = correct.to(conf.dtype) - conf
    if weight is not None:
        e = e * weight
        m = weight.sum()
    else:
        m = torch.tensor(float(conf.shape[0]), dtype=conf.dtype, device=conf.device)
    k = torch.exp(-(conf.unsqueeze(0) - conf.unsqueeze(1)).abs() / width)
    total = e @ (k @ e)
    return torch.where(m > 0, total / m.clamp_min(1.0).square(), torch.zeros_like(total))


def mmce_m_terms(
    input: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100,
    validate_args: bool = True, width: float = 0.4,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(CE_mean, MMCE_m, M)`` of a batch over its kept entries (M of them), in the
    computation dtype (call after ``check_loss_args``, with autocast off)."""
    log_p, lp, _, valid = row_log_probs(input, target, ignore_index, validate_args)
    top, pred = log_p.max(dim=1)
    correct = pred == target.reshape(-1)
    w = None if valid is None else valid.to(top.dtype)
    m = kept_count(lp, valid)
    pen = mmce_unweighted_penalty(top.exp(), correct, width=width, weight=w)
    return -lp.sum() / m, pen, m


def mmce_unweighted_loss(
    input: torch.Tensor, target: torch.Tensor, lam: float = 1.0, *, width: float = 0.4,
    reduction: str = "mean", ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""``CE_mean + λ·MMCE_m`` over the batch (``"sum"``: M times that).

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        lam: λ >= 0 (default 1, the published ``--lamda`` default).
        width: kernel width > 0 (default 0.4).
        reduction: ``"mean"`` or ``"sum"``.
        ignore_index: target value to ignore.
        validate_args: check the target range.

    Example:
        >>> x = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
        >>> mmce_unweighted_loss(x, torch.tensor([0, 0]))  # CE 0.7201 + MMCE_m 0.1072
        tensor(0.8273)
    """
    check_loss_args(input, target, reduction)
    check_batch_reduction(reduction, "MMCE_m")
    lam = check_hyper(lam, "lam")
    with no_autocast(input):
        ce, pen, m = mmce_m_terms(input, target, ignore_index=ignore_index,
                                  validate_args=validate_args, width=width)
        return batch_reduce(ce + lam * pen, m, reduction)


def mmce_gra_loss(
    input: torch.Tensor, target: torch.Tensor, *, width: float = 0.4, reduction: str = "mean",
    ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""MMCE-GRA: ``MMCE_m`` (detached) times ``CE_mean`` (``"sum"``: M times that, i.e.
    ``MMCE_m · Σ_i CE_i``).  Arguments as :func:`mmce_unweighted_loss` (no λ).

    Example:
        >>> x = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
        >>> mmce_gra_loss(x, torch.tensor([0, 0]))  # 0.1072 · 0.7201
        tensor(0.0772)
    """
    check_loss_args(input, target, reduction)
    check_batch_reduction(reduction, "MMCE-GRA")
    with no_autocast(input):
        ce, pen, m = mmce_m_terms(input, target, ignore_index=ignore_index,
                                  validate_args=validate_args, width=width)
        return batch_reduce(pen.detach() * ce, m, reduction)
