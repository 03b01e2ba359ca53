r"""The calibration-error training losses the BSCE-GRA repository compares against.

* **DECE** (Bohdal, Yang, Hospedales 2021, "differentiable ECE"): equal-width ECE with soft
  bin membership and a soft top-1 accuracy.  With ``r_i = max_c p_ic``, ``B`` bins, cut points
  ``κ_b = b/B`` (b = 0..B-1), ``W = (1, ..., B)``, the bin probabilities are
  ``π_i = softmax_b((r_i W_b - Σ_{k<=b} κ_k) / t_b)``, smoothed as
  ``(π + 1e-6) / (1 + (B+1)·1e-6)`` (the published constant); the soft rank of the true class
  is ``ρ_i = 0.5 + Σ_c σ(t_a (p_ic - p_iy))`` and the soft accuracy ``a_i = relu(2 - ρ_i)``;

  .. math::
      \mathrm{DECE} = \sum_b \frac{S_b}{N}\,\Big|\frac{\sum_i π_{ib} a_i}{S_b}
                      - \frac{\sum_i π_{ib} r_i}{S_b}\Big|
                    = \frac{1}{N} \sum_b \Big|\sum_i π_{ib} (a_i - r_i)\Big|,
      \qquad S_b = \sum_i π_{ib}

  (``t_a = 100``, ``t_b = 0.01`` as the published ``DECE(t_a=100, t_b=0.01)``; computed in the
  second form, in float64).
* **ECE-KDE** (Popordanoska, Sayer, Blaschko, NeurIPS 2022): a kernel-density estimate of the
  Lp calibration error.  For ``mc_type="canonical"`` with a Dirichlet kernel
  ``K(f_i; f_j) = Dir(f_i; f_j / h + 1)``, leave-one-out ratios
  ``r̂_i = Σ_{j≠i} K_ij onehot(y_j) / Σ_{j≠i} K_ij`` and
  ``ECE_KDE = mean_i ‖r̂_i - f_i‖_p^p``; ``"top_label"`` applies a Beta kernel
  ``Beta(s_i; s_j/h + 1, (1-s_j)/h + 1)`` to the top-1 confidence against correctness, and
  ``"marginal"`` sums the Beta-kernel estimate of every class ``p_k`` against ``[y = k]``.
  (The published code's special cases for a class with 0 or 1 positive sample are the same
  formula with an empty sum read as 0.)  The value is the p-th power (not its root).
  Departure (``"canonical"``): torchcal normalises the kernel weights in log space (a
  softmax over ``j``), so rows whose kernels all underflow still get their nearest samples'
  weights; the published code exponentiates the raw log-kernels and clamps underflowed rows,
  which changes the value at small ``h`` (N = 64, C = 10, h = 0.001: 1.078 published, 1.844
  torchcal).
* **ECE-loss** (the repository's ``ECELoss``, :func:`ece_gap_loss`): cross-entropy weighted
  per sample by detached calibration gaps measured on the validation set (equal-width bin of
  ``p_y``, equal-mass bin of its rank in the batch, and the class's classwise ECE), blended
  from plain CE to the gap weight over the training epochs.

All are plain tensor operations.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._validation import check_scalar
from ._common import check_hyper, no_autocast
from ._loss_utils import check_loss_args, reduce_loss
from ._plain import batch_reduce, check_batch_reduction, kept_count, row_log_probs

__all__ = [
    "dece",
    "dece_loss",
    "ece_kde",
    "ece_kde_loss",
    "kde_bandwidth",
    "KDE_BANDWIDTH_RULES",
    "ECE_KDE_TYPES",
    "ece_gap_weight",
    "ece_gap_loss",
]

#: ``mc_type`` values of :func:`ece_kde`.
ECE_KDE_TYPES = ("canonical", "marginal", "top_label")


def _check_bins(n_bins) -> int:
    return check_scalar(n_bins, "n_bins", int, min_val=1)


def _log_probs(logits, probs, name="ece_kde") -> torch.Tensor:
    if (logits is None) == (probs is None):
        raise ValueError(f"Expected exactly one of `logits=` or `probs=` for {name}")
    x = logits if probs is None else probs
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.ndim != 2:
        raise ValueError("Expected `logits`/`probs` to be a floating-point tensor of shape (N, C)")
    if x.shape[1] < 2:
        raise ValueError(f"Expected at least 2 classes, got shape {tuple(x.shape)}")
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    return torch.log_softmax(x, dim=1) if probs is None else x.log()


def _check_labels(labels, n, c) -> torch.Tensor:
    if not isinstance(labels, torch.Tensor) or labels.is_floating_point() or labels.shape != (n,):
        raise ValueError(f"Expected `labels` to be an integer tensor of shape ({n},)")
    return labels.long()


# ------------------------------------------------------------------------------------- DECE
def _dece(p: torch.Tensor, y: torch.Tensor, n_bins: int, t_a: float, t_b: float,
          weight: torch.Tensor | None = None) -> torch.Tensor:
    """DECE of probabilities (M, C) and labels (M,); ``weight`` (0/1) drops rows.

    Evaluated in float64 and returned in ``p``'s dtype: with ``t_b = 0.01`` the soft binning
    divides confidences of order 1 by 0.01, and float32 rounding of those logits would change
    the bin weights (and the gradient) in the fourth digit.
    """
    out_dtype = p.dtype
    p = p.to(torch.float64)
    if weight is not None:
        weight = weight.to(torch.float64)
    conf = p.max(dim=1).values
    cut = torch.linspace(0.0, 1.0, n_bins + 1, dtype=p.dtype, device=p.device)[:-1]
    w_bins = torch.arange(1, n_bins + 1, dtype=p.dtype, device=p.device)
    h = (conf.unsqueeze(1) * w_bins + torch.cumsum(-cut, 0)) / t_b
    eps = 1e-6
    bins = (torch.softmax(h, dim=1) + eps) / (1.0 + (n_bins + 1) * eps)
    p_y = p.gather(1, y.unsqueeze(1))
    rank_y = 0.5 + torch.sigmoid(t_a * (p - p_y)).sum(dim=1)
    acc = torch.relu(2.0 - rank_y)
    if weight is not None:
        bins = bins * weight.unsqueeze(1)
        n = weight.sum()
    else:
        n = torch.tensor(float(p.shape[0]), dtype=p.dtype, device=p.device)
    # S_b |A_b/S_b - C_b/S_b| = |A_b - C_b|: no division by a bin's (possibly tiny) mass
    return ((bins.t() @ (acc - conf)).abs().sum() / n).to(out_dtype)


def dece(
    *, logits: torch.Tensor | None = None, probs: torch.Tensor | None = None,
    labels: torch.Tensor, n_bins: int = 15, t_a: float = 100.0, t_b: float = 0.01,
) -> torch.Tensor:
    r"""Differentiable ECE (DECE) of a batch (formula in the module docstring).

    Args:
        logits: (N, C) logits, or
        probs: (N, C) probabilities (exactly one of the two).
        labels: (N,) class indices.
        n_bins: number of soft bins (15).
        t_a: temperature of the soft rank (100).
        t_b: temperature of the soft binning (0.01).

    Example:
        >>> p = torch.tensor([[0.9, 0.1], [0.6, 0.4]])
        >>> dece(probs=p, labels=torch.tensor([0, 1]))  # ≈ (|1 - 0.9| + |0 - 0.6|) / 2
        tensor(0.3500)
    """
    n_bins = _check_bins(n_bins)
    t_a = check_hyper(t_a, "t_a", positive=True)
    t_b = check_hyper(t_b, "t_b", positive=True)
    log_p = _log_probs(logits, probs, "dece")
    y = _check_labels(labels, log_p.shape[0], log_p.shape[1])
    return _dece(log_p.exp(), y, n_bins, t_a, t_b)


def dece_loss(
    input: torch.Tensor, target: torch.Tensor, lam: float = 1.0, *, n_bins: int = 15,
    t_a: float = 100.0, t_b: float = 0.01, cross_entropy: bool = False,
    reduction: str = "mean", ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""``λ·DECE`` of the batch, plus ``CE_mean`` when ``cross_entropy=True``.

    The BSCE-GRA repository trains with DECE alone (``cross_entropy=False``, the default);
    Bohdal et al. add it to the cross-entropy.  ``reduction="sum"`` gives M times the value,
    ``"none"`` is rejected (a batch quantity).

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        lam: λ >= 0 (default 1).
        n_bins: soft bins (15).
        t_a: soft-rank temperature (100).
        t_b: soft-binning temperature (0.01).
        cross_entropy: add the mean cross-entropy.
        reduction: ``"mean"`` or ``"sum"``.
        ignore_index: target value to ignore.
        validate_args: check the target range.

    Example:
        >>> x = torch.log(torch.tensor([[0.9, 0.1], [0.6, 0.4]]))
        >>> dece_loss(x, torch.tensor([0, 1]))
        tensor(0.3500)
    """
    check_loss_args(input, target, reduction)
    check_batch_reduction(reduction, "DECE")
    lam = check_hyper(lam, "lam")
    n_bins = _check_bins(n_bins)
    t_a = check_hyper(t_a, "t_a", positive=True)
    t_b = check_hyper(t_b, "t_b", positive=True)
    with no_autocast(input):
        log_p, lp, safe, valid = row_log_probs(input, target, ignore_index, validate_args)
        w = None if valid is None else valid.to(log_p.dtype)
        m = kept_count(lp, valid)
        value = lam * _dece(log_p.exp(), safe, n_bins, t_a, t_b, w)
        if cross_entropy:
            value = value - lp.sum() / m
        return batch_reduce(value, m, reduction)


# ----------------------------------------------------------------------------------- ECE-KDE
def _tiny_log(x: torch.Tensor) -> torch.Tensor:
    return x.clamp_min(math.log(torch.finfo(x.dtype).tiny))


def _dirichlet_log_kernel(log_f: torch.Tensor, h: float) -> torch.Tensor:
    """``[i, j] = log Dir(f_i; f_j / h + 1)`` (M, M)."""
    f = log_f.exp()
    alpha = f / h + 1.0
    log_beta = torch.lgamma(alpha).sum(dim=1) - torch.lgamma(alpha.sum(dim=1))
    return _tiny_log(log_f) @ (alpha - 1.0).t() - log_beta.unsqueeze(0)


def _beta_log_kernel(log_s: torch.Tensor, h: float) -> torch.Tensor:
    """``[i, j, k] = log Beta(s_ik; s_jk/h + 1, (1 - s_jk)/h + 1)`` for scores (M, K)."""
    s = log_s.exp()
    a = s / h + 1.0
    b = (1.0 - s) / h + 1.0
    log_b = torch.lgamma(a) + torch.lgamma(b) - torch.lgamma(a + b)
    # clamp before the log: log(0) at s = 1 has an infinite derivative, which a clamp after
    # the log would multiply by 0 in backward (NaN gradients at saturated probabilities)
    log_1ms = torch.log((-torch.expm1(log_s)).clamp_min(torch.finfo(log_s.dtype).tiny))
    return ((a - 1.0).unsqueeze(0) * _tiny_log(log_s).unsqueeze(1)
            + (b - 1.0).unsqueeze(0) * log_1ms.unsqueeze(1) - log_b.unsqueeze(0))


def _loo_weights(log_k: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Row-normalised kernel weights over ``j != i`` (and kept j) along dim 1; 0 for a row
    without any other kept sample.  ``log_k`` is (M, M) or (M, M, K)."""
    m = log_k.shape[0]
    drop = torch.eye(m, dtype=torch.bool, device=log_k.device)
    if keep is not None:
        drop = drop | ~keep.unsqueeze(0)
    if log_k.ndim == 3:
        drop = drop.unsqueeze(2)
    has = (~drop).any(dim=1, keepdim=True)
    masked = torch.where(drop, torch.full_like(log_k, -math.inf), log_k)
    masked = torch.where(has, masked, torch.zeros_like(log_k))
    return torch.softmax(masked, dim=1) * has


def _ece_kde(log_f: torch.Tensor, y: torch.Tensor, h: float, p: float, mc_type: str,
             keep: torch.Tensor | None = None) -> torch.Tensor:
    # In float64 (where the device has it): with a small h the kernels' log-normalisers are
    # differences of lgamma values of order C/h, which float32 cancels to ~1e-4 absolute, so
    # that the estimate (and its gradient) would depend on the order of the float32 operations
    # (eager vs. a compiled kernel differ by ~0.4 % at h = 0.001).
    out_dtype = log_f.dtype
    if log_f.device.type != "mps":
        log_f = log_f.to(torch.float64)
    return _ece_kde_exact(log_f, y, h, p, mc_type, keep).to(out_dtype)


def _ece_kde_exact(log_f: torch.Tensor, y: torch.Tensor, h: float, p: float, mc_type: str,
                   keep: torch.Tensor | None) -> torch.Tensor:
    f = log_f.exp()
    w = None if keep is None else keep.to(f.dtype)
    if mc_type == "canonical":
        a = _loo_weights(_dirichlet_log_kernel(log_f, h), keep)
        ratio = a @ F.one_hot(y, f.shape[1]).to(f.dtype)
        per = (ratio - f).abs().pow(p).sum(dim=1)
    elif mc_type == "top_label":
        top, pred = log_f.max(dim=1)
        a = _loo_weights(_beta_log_kernel(top.unsqueeze(1), h).squeeze(2), keep)
        ratio = a @ (pred == y).to(f.dtype)
        per = (ratio - top.exp()).abs().pow(p)
    else:  # marginal: one Beta-kernel estimate per class, summed over classes
        a = _loo_weights(_beta_log_kernel(log_f, h), keep)  # (M, M, C)
        ratio = torch.einsum("ijk,jk->ik", a, F.one_hot(y, f.shape[1]).to(f.dtype))
        per = (ratio - f).abs().pow(p).sum(dim=1)
    if w is None:
        return per.mean()
    return (per * w).sum() / w.sum()


def _check_kde_args(bandwidth, p, mc_type):
    bandwidth = check_hyper(bandwidth, "bandwidth", positive=True)
    p = check_hyper(p, "p", positive=True)
    if mc_type not in ECE_KDE_TYPES:
        raise ValueError(f"Expected `mc_type` to be one of {ECE_KDE_TYPES}, got {mc_type!r}")
    return bandwidth, p


def ece_kde(
    *, logits: torch.Tensor | None = None, probs: torch.Tensor | None = None,
    labels: torch.Tensor, bandwidth: float = 0.001, p: float = 1.0,
    mc_type: str = "canonical",
) -> torch.Tensor:
    r"""The ECE-KDE estimate of the Lp calibration error (its p-th power; module docstring).

    Differentiable in the probabilities; O(N²·C) time (O(N²·C) memory for ``"marginal"``).

    Args:
        logits: (N, C) logits, or
        probs: (N, C) probabilities (exactly one), N >= 2.
        labels: (N,) class indices.
        bandwidth: kernel bandwidth h > 0 (0.001, the published example; see
            :func:`kde_bandwidth` for the leave-one-out choice).
        p: the norm's order p > 0 (1).
        mc_type: ``"canonical"`` (default), ``"marginal"`` or ``"top_label"``.

    Example:
        >>> p = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.2, 0.8], [0.2, 0.8]])
        >>> y = torch.tensor([0, 1, 1, 1])
        >>> # the identical row dominates the kernel: ratios (0, 1), (1, 0), (0, 1), (0, 1);
        >>> # (1.8 + 0.2 + 0.4 + 0.4) / 4
        >>> ece_kde(probs=p, labels=y, bandwidth=0.01)
        tensor(0.7000)
    """
    bandwidth, p = _check_kde_args(bandwidth, p, mc_type)
    log_f = _log_probs(logits, probs)
    y = _check_labels(labels, log_f.shape[0], log_f.shape[1])
    if log_f.shape[0] < 2:
        raise ValueError(f"Expected at least 2 samples for ECE-KDE, got {log_f.shape[0]}")
    return _ece_kde(log_f, y, bandwidth, p, mc_type)


#: The published leave-one-out bandwidth grid: 15 values in logspace(-5, -1), 5 in [0.2, 1].
KDE_BANDWIDTHS = tuple(10.0 ** (-5 + 4 * k / 14) for k in range(15)) + (0.2, 0.4, 0.6, 0.8, 1.0)


#: ``rule`` values of :func:`kde_bandwidth`.
KDE_BANDWIDTH_RULES = ("loo", "original")


def kde_bandwidth(
    *, logits: torch.Tensor | None = None, probs: torch.Tensor | None = None,
    candidates: tuple[float, ...] = KDE_BANDWIDTHS, rule: str = "loo",
) -> float:
    r"""The bandwidth of ``candidates`` with the highest leave-one-out log-likelihood of the
    Dirichlet KDE.

    ``rule="loo"`` (default): ``Σ_i log( Σ_{j≠i} K(f_i; f_j) / (N - 1) )``, the leave-one-out
    likelihood of the density estimate (the Dirichlet kernel is a normalised density); the
    BSCE-GRA repository's copy of ``get_bandwidth`` computes this.  ``rule="original"``: the
    original ECE-KDE code's ``get_bandwidth`` (Popordanoska et al.), which subtracts
    ``log((N - 1)·h)`` instead, i.e. adds ``-N log h`` and so prefers smaller bandwidths
    (N = 64, C = 3: h = 0.0072 against 0.052 with ``"loo"``).  Both published versions start their search at
    a likelihood of 0 and return -1 when every candidate's is negative; torchcal returns the
    arg-max.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> kde_bandwidth(logits=torch.randn(64, 3, generator=g)) in KDE_BANDWIDTHS
        True
    """
    if rule not in KDE_BANDWIDTH_RULES:
        raise ValueError(f"Expected `rule` to be one of {KDE_BANDWIDTH_RULES}, got {rule!r}")
    log_f = _log_probs(logits, probs, "kde_bandwidth").detach()
    n = log_f.shape[0]
    if n < 2:
        raise ValueError(f"Expected at least 2 samples, got {n}")
    eye = torch.eye(n, dtype=torch.bool, device=log_f.device)
    best, best_h = -math.inf, None
    for h in candidates:
        h = check_hyper(h, "candidates", positive=True)
        log_k = _dirichlet_log_kernel(log_f, h).masked_fill(eye, -math.inf)
        norm = math.log(n - 1) + (math.log(h) if rule == "original" else 0.0)
        ll = float((torch.logsumexp(log_k, dim=1) - norm).sum())
        if best_h is None or ll > best:
            best, best_h = ll, h
    return best_h


def ece_kde_loss(
    input: torch.Tensor, target: torch.Tensor, lam: float = 1.0, *, bandwidth: float = 0.001,
    p: float = 1.0, mc_type: str = "canonical", reduction: str = "mean",
    ignore_index: int = -100, validate_args: bool = True,
) -> torch.Tensor:
    r"""``CE_mean + λ·ECE_KDE`` of the batch (the paper's calibration-regularised objective,
    λ chosen by cross-validation).  ``"sum"`` gives M times it, ``"none"`` is rejected.

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        lam: λ >= 0 (default 1).
        bandwidth: kernel bandwidth h > 0 (0.001).
        p: order p > 0 (1).
        mc_type: ``"canonical"``, ``"marginal"`` or ``"top_label"``.
        reduction: ``"mean"`` or ``"sum"``.
        ignore_index: target value to ignore (ignored entries are left out of the estimate).
        validate_args: check the target range.

    Example:
        >>> x = torch.log(torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.2, 0.8], [0.2, 0.8]]))
        >>> ece_kde_loss(x, torch.tensor([0, 1, 1, 1]), lam=0.5, bandwidth=0.01)  # 0.7136 + 0.35
        tensor(1.0636)
    """
    check_loss_args(input, target, reduction)
    check_batch_reduction(reduction, "ECE-KDE")
    lam = check_hyper(lam, "lam")
    bandwidth, p = _check_kde_args(bandwidth, p, mc_type)
    with no_autocast(input):
        log_p, lp, safe, valid = row_log_probs(input, target, ignore_index, validate_args)
        m = kept_count(lp, valid)
        value = -lp.sum() / m + lam * _ece_kde(log_p, safe, bandwidth, p, mc_type, valid)
        return batch_reduce(value, m, reduction)


# ----------------------------------------------------------------------------------- ECE-loss
def ece_gap_weight(
    log_p_y: torch.Tensor, target: torch.Tensor, width_gaps: torch.Tensor,
    mass_gaps: torch.Tensor, classwise: torch.Tensor, *, progress: float = 1.0,
    classwise_weight: float = 2.0, valid: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""The ECE-loss weight of each sample (1-D tensors; computed without gradient).

    For a sample with true-class probability ``p = p_y``:

    * ``g_w``: ``width_gaps[b]`` of the equal-width bin ``b/B <= p < (b+1)/B`` (compared in
      ``p``'s dtype; 0 for ``p = 1``, which is in no published bin);
    * ``g_m``: ``mass_gaps[b]`` for the sample's rank ``r`` (0-based, ascending ``p``, stable)
      among the ``M`` kept samples of the batch: ``b = min(⌊r / ⌊M/B⌋⌋, B-1)`` (``B-1`` when
      ``M < B``), the published assignment of the batch to the validation's equal-mass bins;
    * ``g_c = classwise[y]``;

    ``u = (|g_w| + |g_m| + classwise_weight·|g_c|) / 3`` and the weight is
    ``(1 - progress) + progress·u`` (``progress = epoch / total_epochs``).

    Example:
        >>> lp = torch.log(torch.tensor([0.05, 0.5, 0.95]))
        >>> w = ece_gap_weight(lp, torch.tensor([0, 1, 0]), torch.tensor([0.1, -0.2]),
        ...                    torch.tensor([0.3, 0.6]), torch.tensor([0.0, 0.3]))
        >>> w  # (0.1 + 0.3)/3, (0.2 + 0.6 + 0.6)/3, (0.2 + 0.6)/3
        tensor([0.1333, 0.4667, 0.2667])
    """
    b = width_gaps.shape[0]
    p = log_p_y.detach().exp()
    edges = torch.tensor([k * (1.0 / b) for k in range(b + 1)], dtype=torch.float64,
                         device=p.device).to(p.dtype)
    wb = torch.bucketize(p, edges[1:b], right=True)
    g_w = torch.where(p < edges[b], width_gaps.to(p.dtype)[wb], torch.zeros_like(p))
    key = p if valid is None else torch.where(valid, p, torch.full_like(p, math.inf))
    rank = torch.argsort(torch.argsort(key, stable=True))
    m = key.new_tensor(float(key.numel())) if valid is None else valid.sum().to(p.dtype)
    size = torch.div(m, b, rounding_mode="floor")
    mb = torch.where(size > 0, torch.div(rank.to(p.dtype), size.clamp_min(1.0),
                                         rounding_mode="floor").clamp_max(b - 1),
                     torch.full_like(p, b - 1)).long()
    g_m = mass_gaps.to(p.dtype)[mb]
    g_c = classwise.to(p.dtype)[target]
    u = (g_w.abs() + g_m.abs() + classwise_weight * g_c.abs()) / 3.0
    return (1.0 - progress) + progress * u


def ece_gap_loss(
    input: torch.Tensor, target: torch.Tensor, width_gaps: torch.Tensor,
    mass_gaps: torch.Tensor, classwise: torch.Tensor, *, progress: float = 1.0,
    classwise_weight: float = 2.0, reduction: str = "mean", ignore_index: int = -100,
    validate_args: bool = True,
) -> torch.Tensor:
    r"""ECE-loss: ``w_i · (-log p_{y_i})`` with the detached :func:`ece_gap_weight`.

    Args:
        input: logits of shape (N, C) or (N, C, d1, ...).
        target: class indices of shape (N,) or (N, d1, ...).
        width_gaps: (B,) signed gaps ``conf_b - acc_b`` of the validation's equal-width bins.
        mass_gaps: (B,) the same for its equal-mass bins.
        classwise: (C,) the validation's classwise ECE of every class.
        progress: ``epoch / total_epochs`` in [0, 1] (0: plain cross-entropy).
        classwise_weight: factor of the classwise term (2, the published value).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: target value to ignore.
        validate_args: check the target range.

    Example:
        >>> x = torch.tensor([[0.0, 0.0]])
        >>> g = torch.tensor([0.3, 0.3])
        >>> ece_gap_loss(x, torch.tensor([0]), g, g, torch.zeros(2), progress=0.5)  # 0.6·log 2
        tensor(0.4159)
    """
    check_loss_args(input, target, reduction)
    progress = check_scalar(progress, "progress", float, min_val=0.0, max_val=1.0)
    classwise_weight = check_hyper(classwise_weight, "classwise_weight")
    c = input.shape[1]
    if width_gaps.ndim != 1 or mass_gaps.shape != width_gaps.shape or width_gaps.numel() == 0:
        raise ValueError("Expected `width_gaps` and `mass_gaps` to be 1-D tensors of one length "
                         f"B >= 1, got {tuple(width_gaps.shape)} and {tuple(mass_gaps.shape)}")
    if tuple(classwise.shape) != (c,):
        raise ValueError(f"Expected `classwise` of shape ({c},), got {tuple(classwise.shape)}")
    with no_autocast(input):
        log_p, lp, safe, valid = row_log_probs(input, target, ignore_index, validate_args)
        with torch.no_grad():
            w = ece_gap_weight(log_p.gather(1, safe.unsqueeze(1)).squeeze(1), safe,
                               width_gaps.to(lp.device), mass_gaps.to(lp.device),
                               classwise.to(lp.device), progress=progress,
                               classwise_weight=classwise_weight, valid=valid)
        loss = (-w * lp).reshape(target.shape)
        return reduce_loss(loss, None if valid is None else valid.reshape(target.shape),
                           reduction)
