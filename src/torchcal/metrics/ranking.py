"""Ranking metrics: AUROC, AUPR (average precision), FPR at a TPR, AURC, R-AUROC, OOD AUROC.

All are exact with tied scores (computed from sorted score groups, vectorised, in float64 /
int64 arithmetic); none uses scikit-learn.  Binary ``labels`` are 1 (or True) for the positive
class and 0 for the negative one; a higher score means "more positive".  Results are 0-d
float64 tensors on the input's device.
"""

from __future__ import annotations

from typing import Any

import torch

from .._validation import as_tensor, check_finite
from ._common import check_unit_interval, resolve
from .scoring import plogp_from_logits

__all__ = ["auroc", "aupr", "fpr_at_tpr", "aurc", "r_auroc", "ood_auroc", "ood_scores"]


def _check_scores(scores: Any, name: str) -> torch.Tensor:
    s = as_tensor(scores, name)
    if s.dtype == torch.bool or s.is_complex():
        raise TypeError(f"Expected `{name}` to be a real-valued tensor, got {s.dtype}")
    if s.ndim != 1:
        raise ValueError(f"Expected `{name}` to be 1-D of shape (N,), got shape {tuple(s.shape)}")
    if s.shape[0] == 0:
        raise ValueError(f"Expected `{name}` to be non-empty, got shape {tuple(s.shape)}")
    check_finite(s, name)
    return s


def _check_binary(labels: Any, name: str, n: int, device: torch.device) -> torch.Tensor:
    t = as_tensor(labels, name)
    if t.is_floating_point() or t.is_complex():
        raise TypeError(f"Expected `{name}` to be binary integers or bools, got {t.dtype}")
    if t.ndim != 1 or t.shape[0] != n:
        raise ValueError(
            f"Expected `{name}` to have shape ({n},) like the scores, got shape {tuple(t.shape)}"
        )
    t = t.to(device)
    if t.dtype != torch.bool:
        if bool(((t != 0) & (t != 1)).any()):
            raise ValueError(f"Expected `{name}` to contain only 0 and 1")
        t = t.bool()
    return t


def _groups(
    scores: torch.Tensor, labels: torch.Tensor, *, descending: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positives and negatives per group of tied scores, groups sorted by score (int64 each)."""
    order = torch.argsort(scores, descending=descending, stable=True)
    s = scores[order]
    lab = labels[order]
    _, inverse, counts = torch.unique_consecutive(s, return_inverse=True, return_counts=True)
    pos = torch.zeros(counts.shape[0], dtype=torch.int64, device=s.device)
    pos.index_add_(0, inverse, lab.to(torch.int64))
    return pos, counts - pos


def _both_classes(pos: torch.Tensor, neg: torch.Tensor, what: str) -> tuple[int, int]:
    n_pos, n_neg = int(pos.sum()), int(neg.sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(
            f"Expected `labels` to contain both classes for {what}, got {n_pos} positive and "
            f"{n_neg} negative"
        )
    return n_pos, n_neg


def auroc(*, scores: Any, labels: Any) -> torch.Tensor:
    """Area under the ROC curve = P(score_pos > score_neg) + 1/2 P(score_pos = score_neg).

    Computed exactly (Mann-Whitney U with ties counted as 1/2) from the groups of tied scores:
    ``sum_g pos_g (neg_below_g + neg_g / 2) / (P N)``, in integer arithmetic up to the final
    division.

    Args:
        scores: (N,) real scores, higher = more positive.
        labels: (N,) 0/1 or bool, 1 = positive.  Both classes must be present.

    Example:
        >>> auroc(scores=torch.tensor([0.1, 0.4, 0.35, 0.8]), labels=torch.tensor([0, 0, 1, 1]))
        tensor(0.7500, dtype=torch.float64)
        >>> auroc(scores=torch.tensor([0.5, 0.5, 0.5]), labels=torch.tensor([0, 1, 1]))
        tensor(0.5000, dtype=torch.float64)
    """
    s = _check_scores(scores, "scores")
    y = _check_binary(labels, "labels", s.shape[0], s.device)
    pos, neg = _groups(s, y, descending=False)
    n_pos, n_neg = _both_classes(pos, neg, "AUROC")
    neg_below = torch.cumsum(neg, 0) - neg
    twice_u = (pos * (2 * neg_below + neg)).sum()
    return twice_u.to(torch.float64) / (2.0 * n_pos * n_neg)


def _curve_counts(scores: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Cumulative true / false positives at each distinct threshold, highest score first."""
    s = _check_scores(scores, "scores")
    y = _check_binary(labels, "labels", s.shape[0], s.device)
    pos, neg = _groups(s, y, descending=True)
    return torch.cumsum(pos, 0), torch.cumsum(neg, 0), int(pos.sum()), int(neg.sum())


def aupr(*, scores: Any, labels: Any) -> torch.Tensor:
    """Area under the precision-recall curve as average precision (step-wise).

    ``AP = sum_n (R_n - R_{n-1}) P_n`` over the distinct score thresholds from the highest down
    (tied scores enter together), ``R_0 = 0``; the definition of scikit-learn's
    ``average_precision_score``.  Needs at least one positive.

    Example:
        >>> aupr(scores=torch.tensor([0.1, 0.4, 0.35, 0.8]), labels=torch.tensor([0, 0, 1, 1]))
        tensor(0.8333, dtype=torch.float64)
    """
    tp, fp, n_pos, _ = _curve_counts(scores, labels)
    if n_pos == 0:
        raise ValueError("Expected `labels` to contain at least one positive for AUPR, got none")
    tp64 = tp.to(torch.float64)
    precision = tp64 / (tp + fp).to(torch.float64)
    recall_step = torch.diff(tp64, prepend=tp64.new_zeros(1)) / n_pos
    return (recall_step * precision).sum()


def fpr_at_tpr(*, scores: Any, labels: Any, tpr: float = 0.95) -> torch.Tensor:
    """False-positive rate at the first threshold (from the highest score down) whose TPR
    reaches ``tpr``; tied scores are taken together (all pass the threshold or none does).

    Example:
        >>> fpr_at_tpr(scores=torch.tensor([0.1, 0.4, 0.35, 0.8]),
        ...            labels=torch.tensor([0, 0, 1, 1]), tpr=0.95)
        tensor(0.5000, dtype=torch.float64)
    """
    tpr = check_unit_interval(tpr, "tpr")
    tp, fp, n_pos, n_neg = _curve_counts(scores, labels)
    if n_pos == 0 or n_neg == 0:
        raise ValueError(
            f"Expected `labels` to contain both classes for FPR@TPR, got {n_pos} positive and "
            f"{n_neg} negative"
        )
    rates = tp.to(torch.float64) / n_pos
    first = torch.searchsorted(rates, torch.tensor([tpr], dtype=torch.float64, device=rates.device))
    # rates is non-decreasing and reaches 1.0, so `first` is a valid index.
    return fp[first[0]].to(torch.float64) / n_neg


def _check_correct(correct: Any, n: int, device: torch.device) -> torch.Tensor:
    return _check_binary(correct, "correct", n, device)


def aurc(*, uncertainty: Any, correct: Any) -> torch.Tensor:
    """Area under the risk-coverage curve.

    The mean over coverages k/N (k = 1..N) of the error rate among the k least uncertain
    samples.  Tied uncertainties are taken together: inside a group of m tied samples with e
    errors, the k-th sample adds e/m expected errors (the average over every order of the
    ties), so the result does not depend on sample order.

    Args:
        uncertainty: (N,) predicted uncertainty, lower = more confident.
        correct: (N,) bool / 0-1, whether each prediction is correct.

    Example:
        >>> aurc(uncertainty=torch.tensor([0.1, 0.2, 0.3, 0.4]),
        ...      correct=torch.tensor([1, 1, 0, 1]))
        tensor(0.1458, dtype=torch.float64)
    """
    u = _check_scores(uncertainty, "uncertainty")
    c = _check_correct(correct, u.shape[0], u.device)
    n = u.shape[0]
    order = torch.argsort(u, stable=True)
    _, inverse, counts = torch.unique_consecutive(u[order], return_inverse=True, return_counts=True)
    err_g = torch.zeros(counts.shape[0], dtype=torch.float64, device=u.device)
    err_g.index_add_(0, inverse, (~c[order]).to(torch.float64))
    start_g = torch.cumsum(counts, 0) - counts  # samples before each group
    err_before_g = torch.cumsum(err_g, 0) - err_g
    k = torch.arange(1, n + 1, device=u.device, dtype=torch.float64)
    g = inverse
    errors_k = err_before_g[g] + (k - start_g[g].to(torch.float64)) * err_g[g] / counts[g]
    return (errors_k / k).mean()


def r_auroc(*, uncertainty: Any, correct: Any) -> torch.Tensor:
    """R-AUROC: AUROC of ``-uncertainty`` for predicting whether a prediction is correct.

    Example:
        >>> r_auroc(uncertainty=torch.tensor([0.1, 0.2, 0.3, 0.4]),
        ...         correct=torch.tensor([1, 1, 0, 1]))
        tensor(0.6667, dtype=torch.float64)
    """
    u = _check_scores(uncertainty, "uncertainty")
    c = _check_correct(correct, u.shape[0], u.device)
    # integer uncertainties are negated in int64: -u wraps around for uint8 (and int8 -128)
    return auroc(scores=-(u if u.is_floating_point() else u.to(torch.int64)), labels=c)


def ood_scores(
    *, id_logits: Any, ood_logits: Any, score: str = "entropy", validate_args: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """OOD-detection scores and labels of the concatenated in- and out-of-distribution sets.

    ``score="entropy"``: predictive entropy ``-sum_c p_c log p_c`` (from ``log_softmax``);
    ``"max_prob"``: ``-max_c p_c``.  Higher = more likely OOD.  Returns ``(scores, labels)`` of
    length ``N_id + N_ood`` with label 1 for the OOD samples (in-distribution first), ready for
    :func:`auroc`, :func:`aupr` and :func:`fpr_at_tpr`.
    """
    if score not in ("entropy", "max_prob"):
        raise ValueError(f"Expected `score` to be 'entropy' or 'max_prob', got {score!r}")
    probs = []
    for name, z in (("id_logits", id_logits), ("ood_logits", ood_logits)):
        try:
            probs.append(resolve(z, None, validate_args=validate_args))
        except (ValueError, TypeError) as exc:
            raise type(exc)(str(exc).replace("`logits`", f"`{name}`")) from None
    if probs[0].shape[1] != probs[1].shape[1]:
        raise ValueError(
            "Expected `id_logits` and `ood_logits` to have the same number of classes, "
            f"got {probs[0].shape[1]} and {probs[1].shape[1]}"
        )
    device = probs[0].device
    parts = []
    for name, z, p in (("id_logits", id_logits, probs[0]), ("ood_logits", ood_logits, probs[1])):
        if score == "entropy":
            t = as_tensor(z, name).to(device=p.device)
            plogp = plogp_from_logits(t.to(torch.promote_types(t.dtype, torch.float32)))
            s = -plogp.sum(dim=1, dtype=torch.float64)
        else:
            s = -p.max(dim=1).values.to(torch.float64)
        parts.append(s.to(device))
    labels = torch.cat([
        torch.zeros(parts[0].shape[0], dtype=torch.bool, device=device),
        torch.ones(parts[1].shape[0], dtype=torch.bool, device=device),
    ])
    return torch.cat(parts), labels


def ood_auroc(*, id_logits: Any, ood_logits: Any, score: str = "entropy") -> torch.Tensor:
    """AUROC of OOD detection with OOD as the positive class (fraction, not x100).

    ``score="entropy"`` ranks by predictive entropy, ``"max_prob"`` by ``-max_c p_c``.

    Example:
        >>> id_logits = torch.tensor([[4.0, 0.0], [3.0, 0.0], [0.0, 0.1]])
        >>> ood_logits = torch.tensor([[0.0, 0.0], [1.0, 0.5]])
        >>> ood_auroc(id_logits=id_logits, ood_logits=ood_logits)
        tensor(0.8333, dtype=torch.float64)
    """
    s, y = ood_scores(id_logits=id_logits, ood_logits=ood_logits, score=score)
    return auroc(scores=s, labels=y)
