"""Binned calibration errors: ECE, MCE, RMSCE, ACE, AdaECE (equal-mass), Classwise-ECE, and the
reliability curve behind them.

Conventions (shared with :mod:`torchcal.metrics.binning`, the single home of bin assignment):

* Inputs: exactly one of ``logits=`` / ``probs=`` of shape (N, C) (torch or NumPy, any float
  dtype, any device) and ``labels=`` (N,) integer class indices; or (N, C, d1, ...) with
  (N, d1, ...) labels, flattened, and the entries labelled ``ignore_index`` (default -100)
  left out (:mod:`torchcal.metrics.layout`).  Logits go through ``softmax``.
  The value range is never used to guess which one was passed.
* Top-label metrics bin the top-1 confidence ``conf_i = max_c p_ic``; sample i is correct when
  ``argmax_c p_ic = y_i``.  With ``n_b`` samples in bin b, ``acc_b`` their accuracy and ``conf_b``
  their mean confidence.
* Equal-width bins: edges ``k/B`` computed in the input's own dtype
  (``torch.arange(B + 1, dtype=x.dtype) / B``), bins right-closed ``(e_k, e_{k+1}]``, the first
  bin also holds 0.  A confidence of 1.0 is in the last bin, 0 in the first, and a confidence
  exactly equal to edge ``e_k`` in bin k-1, in float16, bfloat16, float32 and float64 alike.
* Equal-mass bins (AdaECE): sort ``s_0 <= ... <= s_{N-1}``, interior edges
  ``e_k = s_{max(floor(kN/B) - 1, 0)}``, a value x goes to bin ``#{k : e_k < x}``: ties stay
  together, the result does not depend on sample order.
* Per-bin sums are accumulated in float64 (``torch.bincount``); results are 0-d tensors on the
  input's device, in the input's float dtype promoted to at least float32 (float16 -> float32,
  float64 stays float64).  Values are fractions in [0, 1], not percent.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from .._validation import check_positive_int
from ._common import keyword_inputs, prepare, result_dtype, top1
from .binning import (
    binned_sums,
    calibration_from_sums,
    classwise_sums,
    equal_mass_bin_index,
    equal_width_bin_index,
    equal_width_edges,
)
from .layout import IGNORE_INDEX, flatten_inputs
from .tasks import (
    binary_inputs,
    check_task,
    label_binned_sums,
    multilabel_inputs,
    warn_two_columns,
)

__all__ = [
    "ece",
    "mce",
    "rmsce",
    "ace",
    "adaptive_ece",
    "classwise_ece",
    "reliability_curve",
    "ReliabilityCurve",
    "confidence_gap",
    "ece_noise_floor",
]


def _binary_or_label_sums(task: str, logits: Any, probs: Any, labels: Any, n_bins: int,
                          validate_args: bool, ignore_index: int | None, equal_mass: bool
                          ) -> tuple[torch.Tensor, torch.dtype]:
    """Per-bin sums (3, B) of ``task="binary"`` or (3, L, B) of ``"multilabel"`` (each label
    its own bins) and the result dtype: the binned quantity is the probability ``p`` of the
    positive class, "correct" is the label being 1."""
    if task == "binary":
        p, y, _ = binary_inputs(logits, probs, labels, ignore_index, validate_args)
        idx = equal_mass_bin_index(p, n_bins)[0] if equal_mass else equal_width_bin_index(p, n_bins)
        return binned_sums(idx, p, y, n_bins), result_dtype(p.dtype)
    p, y, keep, _ = multilabel_inputs(logits, probs, labels, ignore_index, validate_args)
    if not equal_mass:
        return label_binned_sums(p, y, keep, n_bins), result_dtype(p.dtype)
    # equal-mass edges differ by label (and so do the kept entries): one pass per label
    sums = torch.zeros(3, p.shape[1], n_bins, dtype=torch.float64, device=p.device)
    for j in range(p.shape[1]):
        pj, yj = p[keep[:, j], j], y[keep[:, j], j]
        if pj.numel():
            sums[:, j] = binned_sums(equal_mass_bin_index(pj, n_bins)[0], pj, yj, n_bins)
    return sums, result_dtype(p.dtype)


def _label_mean(values: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Mean over the labels (last axis of ``values``) that hold at least one entry."""
    seen = counts > 0
    return values[seen].mean()


def _top_label(
    logits: Any, probs: Any, labels: Any, n_bins: int, validate_args: bool, norm: str,
    ignore_index: int | None, equal_mass: bool = False, task: str = "multiclass",
) -> torch.Tensor:
    n_bins = check_positive_int(n_bins, "n_bins")
    if check_task(task) != "multiclass":
        sums, out = _binary_or_label_sums(task, logits, probs, labels, n_bins, validate_args,
                                          ignore_index, equal_mass)
        value = calibration_from_sums(sums, norm)
        if task == "multilabel":
            value = _label_mean(value, sums[0].sum(dim=-1))
        return value.to(out)
    logits, probs, labels = flatten_inputs(logits, probs, labels, ignore_index)
    p, y = prepare(logits, probs, labels, validate_args=validate_args)
    warn_two_columns(p.shape[1])
    conf, correct = top1(p, y)
    if equal_mass:
        idx, _ = equal_mass_bin_index(conf, n_bins)
    else:
        idx = equal_width_bin_index(conf, n_bins)
    sums = binned_sums(idx, conf, correct, n_bins)
    return calibration_from_sums(sums, norm).to(result_dtype(p.dtype))


@keyword_inputs
def ece(
    *, logits: Any = None, probs: Any = None, labels: Any, n_bins: int = 15,
    validate_args: bool = True, ignore_index: int | None = IGNORE_INDEX,
    task: str = "multiclass",
) -> torch.Tensor:
    """Expected calibration error with ``n_bins`` equal-width bins.

    ``ECE = sum_b (n_b / N) |acc_b - conf_b|`` over the top-1 confidence ``max_c p_c``
    (correct when ``argmax_c p_c``, first index on ties, equals the label).

    Bin convention: the edges are ``k/B`` computed in the input's own dtype
    (``torch.arange(B + 1, dtype=x.dtype) / B``, never ``linspace``); bins are right-closed
    ``(e_k, e_{k+1}]`` and the first bin also holds 0, so a confidence of 1.0 is in the last
    bin (no extra bin), 0 in the first, and a confidence equal to the edge ``e_k`` in bin
    k-1 - in float16, bfloat16, float32 and float64 alike.  Logits are turned into
    probabilities in their own dtype first, so the same rule applies to them.

    Args:
        logits: (N, C) scores, turned into probabilities with softmax.  Exactly one of
            ``logits`` / ``probs``.
        probs: (N, C) probabilities in [0, 1], rows summing to 1 (within
            ``max(1e-3, eps of the dtype)``).
        labels: (N,) integer class indices in [0, C).
        n_bins: number of equal-width bins B (>= 1).
        validate_args: check the inputs for NaN/Inf, range and row sums (the cheap shape and
            label checks always run).
        ignore_index: label of the entries left out (default -100; None keeps every entry).
            Predictions may also be (N, C, d1, ...) with (N, d1, ...) labels: the metric is
            then that of the flattened rows whose label is kept
            (:func:`torchcal.metrics.flatten_valid`); every labelled metric does the same.
        task: ``"multiclass"`` (default; the inputs above, top-1 confidence), ``"binary"``
            ((N,) or (N, d1, ...) logits (sigmoid) or class-1 probabilities ``p`` with 0/1
            labels of the same shape; bins ``p`` against the share of positives, the number
            of torchmetrics' ``BinaryCalibrationError`` and netcal) or ``"multilabel"``
            ((N, L, ...) with 0/1 labels of the same shape; the mean over the labels of their
            binary ECE).  A 2-column ``"multiclass"`` input warns, once, that it measures the
            top label (:class:`~torchcal.metrics.tasks.TwoColumnWarning`).  The same for
            every metric of this module (:mod:`torchcal.metrics.tasks`).

    Returns:
        0-d tensor on the input's device.

    Example:
        >>> probs = torch.tensor([[0.2, 0.5, 0.3], [0.9, 0.05, 0.05], [0.3, 0.3, 0.4],
        ...                       [0.1, 0.8, 0.1]])
        >>> ece(probs=probs, labels=torch.tensor([1, 0, 0, 2]), n_bins=2)
        tensor(0.2000)
        >>> ece(probs=torch.tensor([0.1, 0.3, 0.8, 0.9]), labels=torch.tensor([0, 1, 1, 1]),
        ...     n_bins=2, task="binary")  # bins (0.2 vs 1/2) and (0.85 vs 1): (0.6 + 0.3) / 4
        tensor(0.2250)
    """
    return _top_label(logits, probs, labels, n_bins, validate_args, "l1", ignore_index,
                      task=task)


@keyword_inputs
def mce(
    *, logits: Any = None, probs: Any = None, labels: Any, n_bins: int = 15,
    validate_args: bool = True, ignore_index: int | None = IGNORE_INDEX,
    task: str = "multiclass",
) -> torch.Tensor:
    """Maximum calibration error: ``max_b |acc_b - conf_b|`` over the non-empty equal-width bins.

    Same inputs and bin convention as :func:`ece`: edges ``k/B`` in the input's dtype, bins
    ``(e_k, e_{k+1}]``, 0 in the first bin, 1.0 in the last, ``e_k`` in bin k-1.

    Example:
        >>> probs = torch.tensor([[0.2, 0.5, 0.3], [0.9, 0.05, 0.05], [0.3, 0.3, 0.4],
        ...                       [0.1, 0.8, 0.1]])
        >>> mce(probs=probs, labels=torch.tensor([1, 0, 0, 2]), n_bins=2)
        tensor(0.3500)
    """
    return _top_label(logits, probs, labels, n_bins, validate_args, "max", ignore_index,
                      task=task)


@keyword_inputs
def rmsce(
    *, logits: Any = None, probs: Any = None, labels: Any, n_bins: int = 15,
    validate_args: bool = True, ignore_index: int | None = IGNORE_INDEX,
    task: str = "multiclass",
) -> torch.Tensor:
    """Root-mean-square calibration error: ``sqrt(sum_b (n_b / N) (acc_b - conf_b)^2)``.

    Same inputs and bin convention as :func:`ece`: edges ``k/B`` in the input's dtype, bins
    ``(e_k, e_{k+1}]``, 0 in the first bin, 1.0 in the last, ``e_k`` in bin k-1.

    Example:
        >>> probs = torch.tensor([[0.2, 0.5, 0.3], [0.9, 0.05, 0.05], [0.3, 0.3, 0.4],
        ...                       [0.1, 0.8, 0.1]])
        >>> rmsce(probs=probs, labels=torch.tensor([1, 0, 0, 2]), n_bins=2)
        tensor(0.2500)
    """
    return _top_label(logits, probs, labels, n_bins, validate_args, "l2", ignore_index,
                      task=task)


@keyword_inputs
def ace(
    *, logits: Any = None, probs: Any = None, labels: Any, n_bins: int = 15,
    validate_args: bool = True, ignore_index: int | None = IGNORE_INDEX,
    task: str = "multiclass",
) -> torch.Tensor:
    """Average calibration error: the unweighted mean gap over the non-empty equal-width bins.

    ``ACE = (1 / |B+|) sum_{b in B+} |acc_b - conf_b|`` with ``B+`` the bins holding at least
    one top-1 confidence.  Unlike ECE, every non-empty bin counts the same whatever its size,
    so a sparsely populated bin weighs as much as a full one.  This is what the focal-loss
    calibration code (Mukhoti et al. 2020, ``average_calibration_error`` in
    ``Metrics/metrics.py``) computes; that code bins a confidence c into
    ``ceil(B c - 1)`` in float64, which is this module's right-closed rule except for a
    confidence within rounding of an edge.  Not the "adaptive calibration error" of Nixon et
    al. 2019, which is also abbreviated ACE.

    Same inputs and bin convention as :func:`ece`: edges ``k/B`` in the input's dtype, bins
    ``(e_k, e_{k+1}]``, 0 in the first bin, 1.0 in the last, ``e_k`` in bin k-1.

    Example:
        >>> probs = torch.tensor([[0.2, 0.5, 0.3], [0.9, 0.05, 0.05], [0.3, 0.3, 0.4],
        ...                       [0.1, 0.8, 0.1]])
        >>> ace(probs=probs, labels=torch.tensor([1, 0, 0, 2]), n_bins=4)  # (0.05 + 0.35) / 2
        tensor(0.2000)
    """
    return _top_label(logits, probs, labels, n_bins, validate_args, "mean", ignore_index,
                      task=task)


@keyword_inputs
def adaptive_ece(
    *, logits: Any = None, probs: Any = None, labels: Any, n_bins: int = 15,
    validate_args: bool = True, ignore_index: int | None = IGNORE_INDEX,
    task: str = "multiclass",
) -> torch.Tensor:
    """AdaECE (ECE_EM): ECE with ``n_bins`` equal-mass bins on the top-1 confidence.

    Sort the confidences ``s_0 <= ... <= s_{N-1}``; interior edges
    ``e_k = s_{max(floor(kN/B) - 1, 0)}`` (k = 1..B-1); a confidence x goes to bin
    ``#{k : e_k < x}``.  Without ties (and N >= B) bin k holds ``floor((k+1)N/B) - floor(kN/B)``
    samples;
    tied confidences always share a bin (bins may then be uneven or empty), and the result does
    not depend on sample order.  ``AdaECE = sum_b (n_b / N) |acc_b - conf_b|``.  This is the
    binning AdaFocal uses (:func:`torchcal.metrics.binning.equal_mass_bin_index`).  The
    focal-calibration code instead uses ``e_k = s_{kN/B}`` and drops the smallest sample.

    Example:
        >>> probs = torch.tensor([[0.2, 0.5, 0.3], [0.9, 0.05, 0.05], [0.3, 0.3, 0.4],
        ...                       [0.1, 0.8, 0.1]])
        >>> adaptive_ece(probs=probs, labels=torch.tensor([1, 0, 0, 2]), n_bins=2)
        tensor(0.2000)
    """
    return _top_label(logits, probs, labels, n_bins, validate_args, "l1", ignore_index,
                      equal_mass=True, task=task)


@keyword_inputs
def classwise_ece(
    *, logits: Any = None, probs: Any = None, labels: Any, n_bins: int = 15,
    validate_args: bool = True, ignore_index: int | None = IGNORE_INDEX,
    task: str = "multiclass",
) -> torch.Tensor:
    """Classwise-ECE: the mean over classes of the equal-width ECE of ``p_k`` vs ``[y = k]``.

    ``CW-ECE = (1/C) sum_k sum_b (n_bk / N) |acc_bk - conf_bk|`` where bin ``b`` of class ``k``
    holds the samples whose ``p_ik`` falls in it (all N samples for every class), ``acc_bk`` is
    the share of them with label k and ``conf_bk`` their mean ``p_ik``.  Computed as one float64
    ``bincount`` over the flattened (class, bin) pairs: ``sum_{k,b} |sum_{i in bk} (p_ik -
    [y_i = k])| / (N C)``; O(N C) time, memory bounded by chunking.  Every ``p_ik`` is binned
    by the convention of :func:`ece` (edges ``k/B`` in the input's dtype, right-closed bins, an
    exact 0 in the first bin, 1.0 in the last, ``e_k`` in bin k-1).

    Two conventions differ from the focal-loss calibration code (``ClasswiseECELoss``), on
    purpose:

    * the mean is over all C classes (the columns of the input).  That code averages over
      ``max(label) + 1`` classes, so when the highest classes never occur among the labels it
      drops their (non-zero) terms and divides by a smaller count;
    * an exact-zero probability is in the first bin (``[0, 1/B]``), so every one of the N C
      probabilities is counted.  That code's bins are ``(e_k, e_{k+1}]`` with no special case
      for 0, so exact zeros (masked classes, saturated softmax) fall in no bin.  Both differ
      from this function only when such inputs occur.

    Example:
        >>> probs = torch.tensor([[0.2, 0.5, 0.3], [0.9, 0.05, 0.05], [0.3, 0.3, 0.4],
        ...                       [0.1, 0.8, 0.1]])
        >>> classwise_ece(probs=probs, labels=torch.tensor([1, 0, 0, 2]), n_bins=2)
        tensor(0.1333)
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    if check_task(task) == "multilabel":
        return _top_label(logits, probs, labels, n_bins, validate_args, "l1", ignore_index,
                          task=task)
    if task == "binary":
        q, y, _ = binary_inputs(logits, probs, labels, ignore_index, validate_args)
        p, y = torch.stack([1 - q, q], dim=1), y.long()
    else:
        logits, probs, labels = flatten_inputs(logits, probs, labels, ignore_index)
        p, y = prepare(logits, probs, labels, validate_args=validate_args)
    sums = classwise_sums(p, y, n_bins)
    n, c = p.shape
    return (sums.abs().sum() / (n * c)).to(result_dtype(p.dtype))


class ReliabilityCurve(NamedTuple):
    """Per-bin statistics of the top-1 confidence.

    Attributes:
        counts: (B,) int64 number of samples per bin.
        confidences: (B,) mean confidence per bin (NaN for an empty bin).
        accuracies: (B,) accuracy per bin (NaN for an empty bin).
        edges: (B + 1,) bin edges, first 0 and last 1, in the input's dtype.
    """

    counts: torch.Tensor
    confidences: torch.Tensor
    accuracies: torch.Tensor
    edges: torch.Tensor


def _curve_sums(conf: torch.Tensor, correct: torch.Tensor, n_bins: int, strategy: str
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-bin sums (3, B) and edges (B + 1,) of 1-D values for :func:`reliability_curve`."""
    if strategy == "uniform":
        idx = equal_width_bin_index(conf, n_bins)
        edges = equal_width_edges(n_bins, dtype=conf.dtype, device=conf.device)
    else:
        idx, interior = equal_mass_bin_index(conf, n_bins)
        edges = torch.cat([conf.new_zeros(1), interior.to(conf.dtype), conf.new_ones(1)])
    return binned_sums(idx, conf, correct, n_bins), edges


def _label_curve_sums(p: torch.Tensor, y: torch.Tensor, keep: torch.Tensor, n_bins: int,
                      strategy: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-label sums (3, L, B) and edges ((B + 1,) uniform, (L, B + 1) quantile)."""
    if strategy == "uniform":
        edges = equal_width_edges(n_bins, dtype=p.dtype, device=p.device)
        return label_binned_sums(p, y, keep, n_bins), edges
    n_labels = p.shape[1]
    sums = torch.zeros(3, n_labels, n_bins, dtype=torch.float64, device=p.device)
    edges = torch.full((n_labels, n_bins + 1), float("nan"), dtype=p.dtype, device=p.device)
    for j in range(n_labels):  # equal-mass edges differ by label
        pj, yj = p[keep[:, j], j], y[keep[:, j], j]
        if pj.numel():
            sums[:, j], edges[j] = _curve_sums(pj, yj, n_bins, strategy)
    return sums, edges


@keyword_inputs
def reliability_curve(
    *, logits: Any = None, probs: Any = None, labels: Any, n_bins: int = 15,
    strategy: str = "uniform", validate_args: bool = True,
    ignore_index: int | None = IGNORE_INDEX, task: str = "multiclass",
) -> ReliabilityCurve:
    """Per-bin count, mean confidence and accuracy of the top-1 prediction.

    ``strategy="uniform"``: equal-width bins (the ECE convention); ``"quantile"``: equal-mass bins
    (the AdaECE convention), whose edges are ``[0, e_1, ..., e_{B-1}, 1]``.  The curve gives
    ``ece = sum(counts * |accuracies - confidences|) / N`` over the non-empty bins.

    ``task="binary"`` bins the class-1 probability ``p``: ``confidences`` is the mean ``p``
    of a bin and ``accuracies`` the share of positives in it (scikit-learn's
    ``calibration_curve``).  ``task="multilabel"`` gives one such curve per label: every
    field has a leading label axis, (L, B) (``edges`` (B + 1,) for equal-width bins, (L, B + 1)
    for equal-mass ones), and the mean over labels of each curve's ECE is
    ``ece(task="multilabel")``.  See :mod:`torchcal.metrics.tasks`.

    Example:
        >>> probs = torch.tensor([[0.2, 0.5, 0.3], [0.9, 0.05, 0.05], [0.3, 0.3, 0.4],
        ...                       [0.1, 0.8, 0.1]])
        >>> curve = reliability_curve(probs=probs, labels=torch.tensor([1, 0, 0, 2]), n_bins=4)
        >>> curve.counts
        tensor([0, 2, 0, 2])
        >>> curve.confidences
        tensor([   nan, 0.4500,    nan, 0.8500])
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    if strategy not in ("uniform", "quantile"):
        raise ValueError(f"Expected `strategy` to be 'uniform' or 'quantile', got {strategy!r}")
    if check_task(task) == "binary":
        p, y, _ = binary_inputs(logits, probs, labels, ignore_index, validate_args)
        sums, edges = _curve_sums(p, y, n_bins, strategy)
    elif task == "multilabel":
        p, y, keep, _ = multilabel_inputs(logits, probs, labels, ignore_index, validate_args)
        sums, edges = _label_curve_sums(p, y, keep, n_bins, strategy)
    else:
        logits, probs, labels = flatten_inputs(logits, probs, labels, ignore_index)
        p, y = prepare(logits, probs, labels, validate_args=validate_args)
        warn_two_columns(p.shape[1])
        sums, edges = _curve_sums(*top1(p, y), n_bins, strategy)
    counts = sums[0]
    out = result_dtype(p.dtype)
    denom = torch.where(counts > 0, counts, torch.full_like(counts, float("nan")))
    return ReliabilityCurve(
        counts=counts.to(torch.int64),
        confidences=(sums[1] / denom).to(out),
        accuracies=(sums[2] / denom).to(out),
        edges=edges,
    )


def confidence_gap(
    *, logits: Any = None, probs: Any = None, labels: Any, validate_args: bool = True,
    ignore_index: int | None = IGNORE_INDEX, task: str = "multiclass",
) -> torch.Tensor:
    """Mean top-1 confidence minus top-1 accuracy: > 0 over-confident, < 0 under-confident.

    ``gap = mean_i max_c p_ic - mean_i [argmax_c p_ic == y_i]`` (the signed counterpart of the
    ECE with one bin), computed in float64.

    Args:
        logits: (N, C) scores (exactly one of ``logits`` / ``probs``).
        probs: (N, C) probabilities.
        labels: (N,) integer class indices.
        validate_args: check the inputs (see :func:`ece`).
        ignore_index: label of the entries left out (see :func:`ece`).

    Returns:
        0-d tensor on the input's device, in the input's float dtype (at least float32).

    Example:
        >>> confidence_gap(probs=torch.tensor([[0.9, 0.1], [0.6, 0.4]]),
        ...                labels=torch.tensor([0, 1]))  # 0.75 - 0.5
        tensor(0.2500)
    """
    if check_task(task) != "multiclass":
        sums, out = _binary_or_label_sums(task, logits, probs, labels, 1, validate_args,
                                          ignore_index, False)
        gap = (sums[1] - sums[2]).sum(dim=-1) / sums[0].sum(dim=-1)
        if task == "multilabel":
            gap = _label_mean(gap, sums[0].sum(dim=-1))
        return gap.to(out)
    logits, probs, labels = flatten_inputs(logits, probs, labels, ignore_index)
    p, y = prepare(logits, probs, labels, validate_args=validate_args)
    warn_two_columns(p.shape[1])
    conf, correct = top1(p, y)
    gap = conf.to(torch.float64).mean() - correct.to(torch.float64).mean()
    return gap.to(result_dtype(p.dtype))


def ece_noise_floor(confidences: Any, *, n_bins: int = 15, n_draws: int = 200,
                    seed: int = 0) -> float:
    """The ECE a perfectly calibrated model with these top-1 confidences would show.

    Draws the correctness of each sample from ``Bernoulli(c_i)`` (so the model is calibrated
    by construction) ``n_draws`` times and averages the equal-width ECE of the draws:
    ``E[sum_b |sum_{i in b} (1[correct_i] - c_i)| / N]``.  It is the noise floor of the ECE at
    this test-set size: differences smaller than it are not meaningful.  Deterministic for a
    given ``seed``.

    >>> round(ece_noise_floor([0.5] * 100, n_bins=1, n_draws=4000), 3)  # E|Bin(100,.5)/100-.5|
    0.04
    """
    c = torch.as_tensor(np.asarray(confidences, dtype=np.float64))
    if c.ndim != 1 or c.numel() == 0:
        raise ValueError(f"Expected `confidences` to be a non-empty 1-D array, got shape {tuple(c.shape)}")
    n = c.numel()
    idx = equal_width_bin_index(c, n_bins)
    gen = torch.Generator().manual_seed(int(seed))
    total = torch.zeros((), dtype=torch.float64)
    chunk = max(1, min(n_draws, 4_000_000 // n))
    for start in range(0, n_draws, chunk):
        r = min(chunk, n_draws - start)
        hit = (torch.rand(r, n, generator=gen, dtype=torch.float64) < c).double()
        gap = torch.zeros(r, n_bins, dtype=torch.float64).index_add_(1, idx, hit - c)
        total += gap.abs().sum() / n
    return float(total) / n_draws
