r"""MMCE (weighted), Kumar, Sarawagi, Jain (ICML 2018): ``CE_mean + λ · MMCE_w`` over a batch.

With ``r_i`` the top-1 confidence (differentiable), ``c_i = [argmax p_i = y_i]``, the kernel
``k(r_i, r_j) = exp(-|r_i - r_j| / width)`` (width 0.4), ``m`` correct and ``n`` incorrect samples:

* ``S_cc = Σ_{i,j correct} (1-r_i)(1-r_j) k``, ``S_ww = Σ_{i,j wrong} r_i r_j k``,
  ``S_cw = Σ_{i correct, j wrong} (1-r_i) r_j k``;
* ``normalization="published"`` (default; the code under which λ=2 was tuned):
  ``MMCE² = S_cc/(m²(m²+1e-5)) + S_ww/(n²(n²+1e-5)) - 2 S_cw/(mn(mn+1e-5))``
  (a mean over each matrix, then a second division with +1e-5);
* ``normalization="paper"``: ``MMCE² = S_cc/m² + S_ww/n² - 2 S_cw/(mn)``;
* penalty ``sqrt(max(MMCE², 0) + 1e-10)``, and exactly 0 when ``m = 0`` or ``n = 0``.
  (The ``max(·, 0)`` guards against a rounding-negative value, where the published code
  would return NaN.)

O(batch²) time and memory, as the original.
"""

from __future__ import annotations

import torch

from ._common import check_hyper, no_autocast
from ._loss_utils import check_loss_args, flat_rows, target_log_probs

__all__ = ["mmce_loss", "mmce_penalty", "MMCE_NORMALIZATIONS"]

MMCE_NORMALIZATIONS = ("published", "paper")


def mmce_penalty(
    conf: torch.Tensor, correct: torch.Tensor, *, normalization: str = "published",
    width: float = 0.4, weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """The weighted MMCE penalty of 1-D confidences ``conf`` and booleans ``correct``.

    ``weight`` (optional, 0/1 floats) drops entries (e.g. ignored targets).
    Differentiable in ``conf``.

    Example:
        >>> # sqrt(0.1² + 0.6² - 2·0.1·0.6·exp(-0.3/0.4)) = sqrt(0.3133)
        >>> mmce_penalty(torch.tensor([0.9, 0.6]), torch.tensor([True, False]), normalization="paper")
        tensor(0.5597)
    """
    if normalization not in MMCE_NORMALIZATIONS:
        raise ValueError(
            f"Expected `normalization` to be one of {MMCE_NORMALIZATIONS}, got {normalization!r}"
        )
    c = correct.to(conf.dtype)
    wrong = 1.0 - c
    if weight is not None:
        c = c * weight
        wrong = wrong * weight
    m = c.sum()
    n = wrong.sum()
    wc = (1.0 - conf) * c
    ww = conf * wrong
    k = torch.exp(-(conf.unsqueeze(0) - conf.unsqueeze(1)).abs() / width)
    kwc = k @ wc
    s_cc = wc @ kwc
    s_cw = ww @ kwc
    s_ww = ww @ (k @ ww)
    one = torch.ones_like(m)
    ms, ns = torch.maximum(m, one), torch.maximum(n, one)
    if normalization == "published":
        sq = (s_cc / (ms * ms * (ms * ms + 1e-5)) + s_ww / (ns * ns * (ns * ns + 1e-5))
              - 2.0 * s_cw / (ms * ns * (ms * ns + 1e-5)))
    else:
        sq = s_cc / (ms * ms) + s_ww / (ns * ns) - 2.0 * s_cw / (ms * ns)
    pen = torch.sqrt(sq.clamp_min(0.0) + 1e-10)
    return torch.where((m > 0) & (n > 0), pen, torch.zeros_like(pen))


def mmce_loss(
    input: torch.Tensor, target: torch.Tensor, lam: float = 2.0, *,
    normalization: str = "published", width: float = 0.4, reduction: str = "mean",
    ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""Cross-entropy plus λ times the weighted MMCE penalty of the batch.

    ``reduction="mean"`` gives ``CE_mean + λ·MMCE``; ``"sum"`` gives ``M`` times that (``M``
    the number of entries not equal to ``ignore_index``; the published training:
    ``published_reduction="sum"``); ``"none"`` raises (the penalty is a batch quantity).
    (N, C, d1, ...) inputs are treated as M = N·d1·... samples.

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        lam: λ >= 0 (default 2).
        normalization: ``"published"`` (default) or ``"paper"`` (see the module docstring).
        width: kernel width > 0 (default 0.4).
        reduction: ``"mean"`` or ``"sum"``.
        ignore_index: target value to ignore.
        validate_args: check the target range.

    Example:
        >>> x = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
        >>> mmce_loss(x, torch.tensor([0, 1]))  # all correct: the penalty is 0
        tensor(0.2201)
    """
    check_loss_args(input, target, reduction)
    if reduction == "none":
        raise ValueError(
            "Expected `reduction` to be 'mean' or 'sum' for MMCE: its penalty is a batch "
            "quantity, so reduction='none' is not supported"
        )
    lam = check_hyper(lam, "lam")
    width = check_hyper(width, "width", positive=True)
    if normalization not in MMCE_NORMALIZATIONS:
        raise ValueError(
            f"Expected `normalization` to be one of {MMCE_NORMALIZATIONS}, got {normalization!r}"
        )
    with no_autocast(input):
        log_p, lp, _, valid = target_log_probs(input, target, ignore_index,
                                               validate_args=validate_args)
        top, pred = flat_rows(log_p).max(dim=1)
        conf = top.exp()
        correct = pred == target.reshape(-1)
        w = None if valid is None else valid.reshape(-1).to(conf.dtype)
        # a number when nothing is ignored (no host-to-device copy: CUDA-graph safe)
        kept = float(lp.numel()) if valid is None else valid.sum().to(lp.dtype)
        ce_sum = -lp.sum()
        pen = lam * mmce_penalty(conf, correct, normalization=normalization, width=width,
                                 weight=w)
        if reduction == "mean":
            return ce_sum / kept + pen  # NaN when every entry is ignored, as F.cross_entropy
        # M·(CE_mean + λ·MMCE) written as CE_sum + M·λ·MMCE: 0 (not 0·NaN) when M = 0
        return ce_sum + kept * pen
