"""Debiased binned calibration error (Kumar, Liang & Ma 2019, "Verified uncertainty
calibration")."""

from __future__ import annotations

from typing import Any

import torch

from .._validation import check_positive_int
from ._common import keyword_inputs, prepare, result_dtype, top1
from .binning import bin_index, binned_sums, equal_width_bin_index
from .layout import IGNORE_INDEX, flatten_inputs
from .tasks import binary_columns, check_task, warn_two_columns

__all__ = ["debiased_ece"]

_STRATEGIES = ("quantile", "uniform")


def _midpoint_edges(conf: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Equal-mass interior edges as the reference package draws them (``get_equal_bins``).

    Split the sorted values into ``B' = min(B, N)`` consecutive parts as ``numpy.array_split``
    does (the first ``N mod B'`` parts one longer) and put each edge halfway between the last
    value of a part and the first of the next: ``(s[j - 1] + s[j]) / 2`` at every part start
    ``j = i q + min(i, r)``, ``q, r = divmod(N, B')``, i = 1..B'-1.
    """
    n = conf.shape[0]
    b = min(n_bins, n)
    q, r = divmod(n, b)
    i = torch.arange(1, b, device=conf.device)
    start = i * q + torch.clamp(i, max=r)
    s = torch.sort(conf).values
    return (s[start - 1] + s[start]) / 2


@keyword_inputs
def debiased_ece(
    *, logits: Any = None, probs: Any = None, labels: Any, n_bins: int = 15,
    strategy: str = "quantile", validate_args: bool = True,
    ignore_index: int | None = IGNORE_INDEX, task: str = "multiclass",
) -> torch.Tensor:
    """Debiased estimate of the top-label l2 calibration error (Kumar et al. 2019).

    The plug-in binned error ``sum_b (n_b / N) (conf_b - acc_b)^2`` over-estimates the squared
    calibration error: even a calibrated model's bin accuracies scatter around the bin
    confidences, by a variance ``acc_b (1 - acc_b) / n_b``.  The debiased estimator subtracts
    an unbiased estimate of that variance in every bin:

    ``CE^2 = sum_{b : n_b >= 2} (n_b / N) [(conf_b - acc_b)^2 - acc_b (1 - acc_b) / (n_b - 1)]``

    and returns ``sqrt(max(CE^2, 0))`` (bins of fewer than 2 samples add 0).  It is an l2
    (root-mean-square) error, comparable with :func:`torchcal.metrics.rmsce` rather than with
    the l1 :func:`torchcal.metrics.ece`, and it is close to 0 for a calibrated model at any N
    where the plug-in estimates stay positive.

    Bins (the reference package's defaults): ``"quantile"`` (default) splits the sorted top-1
    confidences into ``min(n_bins, N)`` parts of (almost) equal size and puts each edge
    halfway between neighbouring parts; ``"uniform"`` uses the equal-width bins of
    :func:`torchcal.metrics.ece`.  Bins are right-closed.  The number is that of the
    reference implementation, ``calibration.get_calibration_error(probs, labels, p=2,
    debias=True, mode="top-label")`` of the ``uncertainty-calibration`` package (which
    uses the quantile bins, 15 of them), to float rounding; this is vectorised (one sort and
    one ``bincount``).

    Args:
        logits: (N, C) logits; exactly one of ``logits`` / ``probs``.
        probs: (N, C) probabilities.
        labels: (N,) integer class indices.
        n_bins: number of bins B.
        strategy: ``"quantile"`` or ``"uniform"``.
        validate_args: check the inputs for NaN/Inf, range and row sums.
        ignore_index: label of the entries left out (see :func:`torchcal.metrics.ece`).
        task: ``"multiclass"`` (top label), ``"binary"`` (the class-1 probability against the
            label) or ``"multilabel"`` (the mean over labels), as :func:`torchcal.metrics.ece`.

    Returns:
        0-d tensor on the input's device (a fraction in [0, 1]).

    Example:
        >>> probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
        >>> debiased_ece(probs=probs, labels=torch.tensor([0, 1, 1, 0]), n_bins=2)
        tensor(0.)
        >>> probs = torch.tensor([[0.9, 0.1]] * 4 + [[0.6, 0.4]] * 4)
        >>> debiased_ece(probs=probs, labels=torch.tensor([1, 1, 0, 0, 0, 0, 0, 0]), n_bins=2)
        tensor(0.3440)
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    if strategy not in _STRATEGIES:
        raise ValueError(f"Expected `strategy` to be one of {_STRATEGIES}, got {strategy!r}")
    if check_task(task) != "multiclass":
        pairs, out = binary_columns(task, logits, probs, labels, ignore_index, validate_args)
        values = [_debiased(p, y, n_bins, strategy) for p, y in pairs]
        return torch.stack(values).mean().to(out)
    logits, probs, labels = flatten_inputs(logits, probs, labels, ignore_index)
    p, y = prepare(logits, probs, labels, validate_args=validate_args)
    warn_two_columns(p.shape[1])
    conf, correct = top1(p, y)
    return _debiased(conf, correct, n_bins, strategy).to(result_dtype(p.dtype))


def _debiased(conf: torch.Tensor, correct: torch.Tensor, n_bins: int, strategy: str
              ) -> torch.Tensor:
    """The debiased l2 error of values ``conf`` against outcomes ``correct`` (float64)."""
    if strategy == "quantile":
        conf64 = conf.to(torch.float64)
        idx = bin_index(conf64, _midpoint_edges(conf64, n_bins))
    else:
        idx = equal_width_bin_index(conf, n_bins)
    counts, conf_sum, acc_sum = binned_sums(idx, conf, correct, n_bins)
    enough = counts >= 2
    m = counts.clamp(min=1)
    acc = acc_sum / m
    term = (conf_sum / m - acc) ** 2 - acc * (1 - acc) / (counts - 1).clamp(min=1)
    sq = (counts * term).where(enough, 0.0).sum() / counts.sum()
    return sq.clamp(min=0).sqrt()
