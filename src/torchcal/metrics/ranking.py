"""Ranking metrics: AUROC, AUPR (average precision), FPR at a TPR, OOD AUROC, and selective
prediction: the risk-coverage curve, AURC, E-AURC, AUGRC, risk at a coverage, R-AUROC.

All are exact with tied scores (computed from sorted score groups, vectorised, in float64 /
int64 arithmetic); none uses scikit-learn.  Binary ``labels`` are 1 (or True) for the positive
class and 0 for the negative one; a higher score means "more positive".  Results are 0-d
float64 tensors on the input's device.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from .._validation import as_tensor, check_finite
from ._common import check_unit_interval, resolve
from .members import check_member_logits, mutual_information
from .scoring import plogp_from_logits

__all__ = ["auroc", "aupr", "fpr_at_tpr", "FPR_CONVENTIONS", "aurc", "e_aurc", "E_AURC_OPTIMA",
           "augrc", "AUGRC_RULES", "risk_at_coverage", "risk_coverage_curve", "RiskCoverageCurve", "r_auroc", "ood_auroc", "ood_scores",
           "OOD_SCORES"]


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


#: The conventions of :func:`fpr_at_tpr` (the first is the default).
FPR_CONVENTIONS = ("id_positive", "ood_positive")


def fpr_at_tpr(*, scores: Any, labels: Any, tpr: float = 0.95,
               convention: str = "id_positive") -> torch.Tensor:
    """FPR at ``tpr`` TPR ("FPR@95"), in the OOD-detection literature's convention by default.

    ``scores`` and ``labels`` are laid out as :func:`ood_scores` returns them: label 1 (True)
    for an out-of-distribution (OOD) sample, 0 for an in-distribution (ID) one, and a higher
    score means "more likely OOD".  Tied scores are taken together (all pass the threshold or
    none does).

    * ``convention="id_positive"`` (default; Hendrycks & Gimpel 2017, Liang et al. 2018,
      Liu et al. 2020, OpenOOD): the ID samples are the positive class.  The threshold is the
      first one, from the lowest score up, that accepts at least ``tpr`` of the ID samples
      (score <= threshold); the result is the share of OOD samples accepted with them: "the
      FPR on OOD at 95% TPR of in-distribution".
    * ``convention="ood_positive"``: label 1 is the positive class, as in a generic binary
      classifier (scikit-learn's ``roc_curve``): the first threshold from the highest score
      down whose TPR (share of label-1 samples with score >= threshold) reaches ``tpr``, and
      the result is the share of label-0 samples above it.  torchcal's earlier default; on
      the same input the two generally differ (0.839 against 0.914 on one measured OOD set),
      so only ``"id_positive"`` can be set beside published FPR@95 numbers.

    ``convention="id_positive"`` is ``convention="ood_positive"`` of ``-scores`` and
    ``1 - labels``.

    Example:
        >>> s, y = torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])
        >>> fpr_at_tpr(scores=s, labels=y)  # accepting both ID (<= 0.4) accepts OOD 0.35
        tensor(0.5000, dtype=torch.float64)
        >>> fpr_at_tpr(scores=s, labels=y, convention="ood_positive")  # flag both OOD (>= 0.35)
        tensor(0.5000, dtype=torch.float64)
    """
    tpr = check_unit_interval(tpr, "tpr")
    if convention not in FPR_CONVENTIONS:
        raise ValueError(f"Expected `convention` to be one of {FPR_CONVENTIONS}, "
                         f"got {convention!r}")
    if convention == "id_positive":
        s = _check_scores(scores, "scores")
        # negated in float64 (or int64): -s of an unsigned integer tensor would wrap around
        s = -(s.to(torch.float64) if s.is_floating_point() else s.to(torch.int64))
        y = ~_check_binary(labels, "labels", s.shape[0], s.device)
        tp, fp, n_pos, n_neg = _curve_counts(s, y)
    else:
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


def _errors_at_coverage(uncertainty: Any, correct: Any) -> tuple[torch.Tensor, int]:
    """``(errors_k, n_errors)``: the expected number of errors among the k least uncertain
    samples, k = 1..N (float64 (N,)), with tied uncertainties taken together: inside a group
    of m tied samples with e errors, each sample adds e/m expected errors (the average over
    every order of the ties)."""
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
    return errors_k, int((~c).sum())


class RiskCoverageCurve(NamedTuple):
    """The risk-coverage curve of selective prediction (float64 (N,) each).

    Attributes:
        coverage: k/N for k = 1..N (the share of samples accepted, least uncertain first).
        risk: the error rate among the k accepted samples (tied uncertainties averaged).
    """

    coverage: torch.Tensor
    risk: torch.Tensor


def risk_coverage_curve(*, uncertainty: Any, correct: Any) -> RiskCoverageCurve:
    """Risk (error rate) among the k least uncertain samples against the coverage k/N.

    Accepting the k samples of lowest uncertainty, k = 1..N; tied uncertainties are taken
    together as in :func:`aurc` (each sample of a tied group adds the group's error rate),
    so the curve does not depend on sample order.  ``aurc`` is the mean of ``risk``.

    Args:
        uncertainty: (N,) predicted uncertainty, lower = more confident.
        correct: (N,) bool / 0-1, whether each prediction is correct.

    Example:
        >>> curve = risk_coverage_curve(uncertainty=torch.tensor([0.1, 0.2, 0.3, 0.4]),
        ...                             correct=torch.tensor([1, 1, 0, 1]))
        >>> curve.coverage.tolist(), [round(r, 4) for r in curve.risk.tolist()]
        ([0.25, 0.5, 0.75, 1.0], [0.0, 0.0, 0.3333, 0.25])
    """
    errors_k, _ = _errors_at_coverage(uncertainty, correct)
    n = errors_k.shape[0]
    k = torch.arange(1, n + 1, device=errors_k.device, dtype=torch.float64)
    return RiskCoverageCurve(coverage=k / n, risk=errors_k / k)


def aurc(*, uncertainty: Any, correct: Any) -> torch.Tensor:
    """Area under the risk-coverage curve.

    The mean over coverages k/N (k = 1..N) of the error rate among the k least uncertain
    samples (:func:`risk_coverage_curve`).  Tied uncertainties are taken together: inside a
    group of m tied samples with e errors, the k-th sample adds e/m expected errors (the
    average over every order of the ties), so the result does not depend on sample order.

    Args:
        uncertainty: (N,) predicted uncertainty, lower = more confident.
        correct: (N,) bool / 0-1, whether each prediction is correct.

    Example:
        >>> aurc(uncertainty=torch.tensor([0.1, 0.2, 0.3, 0.4]),
        ...      correct=torch.tensor([1, 1, 0, 1]))
        tensor(0.1458, dtype=torch.float64)
    """
    return risk_coverage_curve(uncertainty=uncertainty, correct=correct).risk.mean()


def _optimal_aurc(n: int, n_errors: int, device: torch.device) -> torch.Tensor:
    """AURC of N predictions with every correct one first: ``mean_k max(0, k - (N - E)) / k``."""
    k = torch.arange(1, n + 1, device=device, dtype=torch.float64)
    return ((k - (n - n_errors)).clamp(min=0) / k).mean()


#: The optima of :func:`e_aurc` (the first is the default).
E_AURC_OPTIMA = ("finite", "closed_form")


def e_aurc(*, uncertainty: Any, correct: Any, optimum: str = "finite") -> torch.Tensor:
    """Excess AURC (Geifman et al. 2019): :func:`aurc` minus the AURC of a perfect ranking.

    With N predictions and E errors (error rate ``r = E / N``), the perfect ranking accepts
    every correct prediction before any error.  Two forms of its AURC:

    * ``optimum="finite"`` (default): the exact finite-sample optimum, the AURC of that
      ranking on the same N points, ``mean_{k=1..N} max(0, k - (N - E)) / k``.  E-AURC is
      then exactly 0 for a perfect ranking and never negative.
    * ``optimum="closed_form"``: the paper's formula (Geifman et al. 2019; fd-shifts'
      ``e_aurc``), the continuous integral of the optimal risk ``max(0, 1 - (1 - r) / c)``
      over the coverage c in (0, 1], ``r + (1 - r) ln(1 - r)`` (``r`` at ``r = 1``).  It
      is below the finite optimum by O(1/N), so a perfect ranking of a small set
      gets a small non-zero (positive) E-AURC.

    E-AURC does not reward a lower error, only a better ordering.

    Example:
        >>> e_aurc(uncertainty=torch.tensor([0.1, 0.2, 0.3, 0.4]),
        ...        correct=torch.tensor([1, 1, 0, 1]))  # 0.1458 - 0.25 / 4
        tensor(0.0833, dtype=torch.float64)
    """
    if optimum not in E_AURC_OPTIMA:
        raise ValueError(f"Expected `optimum` to be one of {E_AURC_OPTIMA}, got {optimum!r}")
    errors_k, n_errors = _errors_at_coverage(uncertainty, correct)
    n = errors_k.shape[0]
    k = torch.arange(1, n + 1, device=errors_k.device, dtype=torch.float64)
    if optimum == "finite":
        best = _optimal_aurc(n, n_errors, errors_k.device)
    else:
        r = n_errors / n
        best = torch.tensor(r + (1 - r) * math.log1p(-r) if r < 1 else 1.0,
                            dtype=torch.float64, device=errors_k.device)
    return (errors_k / k).mean() - best


#: The integration rules of :func:`augrc` (the first is the default).
AUGRC_RULES = ("riemann", "trapezoid")


def augrc(*, uncertainty: Any, correct: Any, rule: str = "riemann") -> torch.Tensor:
    """Area under the generalized risk-coverage curve (Traub et al. 2024).

    The generalized risk at coverage k/N is the number of errors ``E_k`` among the k least
    uncertain samples divided by N (the probability that a sample is accepted *and* wrong).
    Ties as in :func:`aurc`.

    * ``rule="riemann"`` (default): the right Riemann sum ``(1/N) sum_{k=1..N} E_k / N``,
      the mean of the curve's N points (as :func:`aurc` is the mean of the risk curve).
    * ``rule="trapezoid"``: the paper's form (Traub et al. 2024, fd-shifts' ``augrc``), the
      trapezoid rule over the points ``(k/N, E_k/N)``, k = 0..N, from ``(0, 0)``:
      ``(1/N) sum_{k=1..N} (E_{k-1} + E_k) / (2N)``.  It is the Riemann sum minus
      ``E / (2 N^2)`` (E errors in all), and equals the integral of the piecewise-linear
      curve; a random ranking (every uncertainty tied) then gets exactly ``r / 2`` for the
      error rate ``r``, where the Riemann sum gives ``r (N + 1) / (2N)``.

    Example:
        >>> augrc(uncertainty=torch.tensor([0.1, 0.2, 0.3, 0.4]),
        ...       correct=torch.tensor([1, 1, 0, 1]))  # (0 + 0 + 1/4 + 1/4) / 4
        tensor(0.1250, dtype=torch.float64)
        >>> augrc(uncertainty=torch.tensor([0.1, 0.2, 0.3, 0.4]),
        ...       correct=torch.tensor([1, 1, 0, 1]), rule="trapezoid")  # 0.125 - 1/32
        tensor(0.0938, dtype=torch.float64)
    """
    if rule not in AUGRC_RULES:
        raise ValueError(f"Expected `rule` to be one of {AUGRC_RULES}, got {rule!r}")
    errors_k, n_errors = _errors_at_coverage(uncertainty, correct)
    n = errors_k.shape[0]
    area = (errors_k / n).mean()
    if rule == "trapezoid":
        area = area - n_errors / (2.0 * n * n)
    return area


def risk_at_coverage(*, uncertainty: Any, correct: Any, coverage: float = 0.8) -> torch.Tensor:
    """Error rate among the ``k = ceil(coverage N)`` least uncertain samples (ties as in
    :func:`aurc`): the risk of a model that abstains on the rest.  ``k`` is at least 1, and
    ``coverage N`` is rounded within 1e-9 first, so that a coverage of 0.7 of 10 samples
    accepts 7 (0.7 x 10 is 7.000000000000001 in floating point).

    Args:
        uncertainty: (N,) predicted uncertainty, lower = more confident.
        correct: (N,) bool / 0-1, whether each prediction is correct.
        coverage: the share of samples accepted, in (0, 1].

    Example:
        >>> risk_at_coverage(uncertainty=torch.tensor([0.1, 0.2, 0.3, 0.4]),
        ...                  correct=torch.tensor([1, 1, 0, 1]), coverage=0.5)
        tensor(0., dtype=torch.float64)
    """
    coverage = check_unit_interval(coverage, "coverage")
    errors_k, _ = _errors_at_coverage(uncertainty, correct)
    n = errors_k.shape[0]
    k = max(1, min(n, math.ceil(coverage * n - 1e-9)))
    return errors_k[k - 1] / k


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


#: The scores of :func:`ood_scores` (higher = more likely OOD).
OOD_SCORES = ("entropy", "max_prob", "energy", "max_logit", "mutual_information")


def _neg_log_max_prob(z: torch.Tensor) -> torch.Tensor:
    """``-log max_c p_c = logsumexp(z - max z)`` (N,) in float64, without rounding to 0.

    ``logsumexp(z - max z) = log(1 + sum_{c != top} exp(z_c - z_top))``: the sum of the
    non-top terms is formed first and ``log1p`` applied to it, so a margin of 40 gives
    ``4e-18``, not ``log(1.0) = 0`` (a float64 ``1 + 4e-18`` is 1, a float32 softmax is 1
    from a margin of about 17).  Ties only where ``exp`` underflows (margins > ~745)."""
    d = z.to(torch.float64)
    top = d.argmax(dim=1, keepdim=True)
    d = d - d.gather(1, top)
    # every class but one top class: a tied runner-up keeps its exp(0) = 1
    rest = d.exp().scatter_(1, top, 0.0).sum(dim=1)
    return torch.log1p(rest)


def _ood_score(z: Any, name: str, score: str, validate_args: bool) -> torch.Tensor:
    """(N,) float64 OOD score of one set's logits (``member_logits`` (S, N, C) for MI)."""
    if score == "mutual_information":
        return mutual_information(member_logits=check_member_logits(z, name))
    try:
        p = resolve(z, None, validate_args=validate_args)
    except (ValueError, TypeError) as exc:
        raise type(exc)(str(exc).replace("`logits`", f"`{name}`")) from None
    t = as_tensor(z, name).to(device=p.device)
    if score == "max_prob":
        return _neg_log_max_prob(t)
    if score == "entropy":
        plogp = plogp_from_logits(t.to(torch.promote_types(t.dtype, torch.float32)))
        return -plogp.sum(dim=1, dtype=torch.float64)
    t = t.to(torch.float64)
    if score == "energy":
        return -torch.logsumexp(t, dim=1)
    return -t.amax(dim=1)  # max_logit


def ood_scores(
    *, id_logits: Any, ood_logits: Any, score: str = "entropy", validate_args: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """OOD-detection scores and labels of the concatenated in- and out-of-distribution sets.

    Higher = more likely OOD, for every ``score``:

    * ``"entropy"``: predictive entropy ``-sum_c p_c log p_c`` (from ``log_softmax``);
    * ``"max_prob"``: ``-log max_c p_c = logsumexp(z - max_c z_c)``, computed in float64 from
      the logits so that confident samples never tie (the ranking of ``-max_c p_c``, the
      maximum softmax probability baseline of Hendrycks & Gimpel 2017; a float32 softmax
      rounds to exactly 1.0 from a margin of about 17, and ``1 - max p`` in float64 from
      about 37);
    * ``"energy"``: the free energy ``-log sum_c exp(z_c)`` (Liu et al. 2020, temperature 1);
    * ``"max_logit"``: ``-max_c z_c`` (Hendrycks et al. 2022);
    * ``"mutual_information"``: :func:`torchcal.metrics.mutual_information` of member logits;
      ``id_logits`` / ``ood_logits`` are then (S, N, C) (an ensemble or MC-dropout samples).

    The other scores take (N, C) logits.  Energy and max-logit use the logits' scale, which
    softmax forgets: adding a constant to a row changes them but not the probabilities.  So
    they need a network's own logits: on log-probabilities (an ensemble's pooled
    ``log pbar``, :attr:`torchcal.ensemble.Ensemble.logits`) the energy is
    ``-log sum_c pbar_c = 0`` for every input and max-logit ranks as ``"max_prob"``.
    Returns ``(scores, labels)`` of length ``N_id + N_ood`` (float64, bool) with label 1 for
    the OOD samples (in-distribution first), ready for :func:`auroc`, :func:`aupr` and
    :func:`fpr_at_tpr`.

    Example:
        >>> s, y = ood_scores(id_logits=torch.tensor([[4.0, 0.0]]),
        ...                   ood_logits=torch.tensor([[0.5, 0.0]]), score="max_logit")
        >>> s.tolist(), y.tolist()
        ([-4.0, -0.5], [False, True])
    """
    if score not in OOD_SCORES:
        raise ValueError(f"Expected `score` to be one of {OOD_SCORES}, got {score!r}")
    parts = [_ood_score(z, name, score, validate_args)
             for name, z in (("id_logits", id_logits), ("ood_logits", ood_logits))]
    shapes = [as_tensor(z, n).shape[-1] for n, z in (("id_logits", id_logits),
                                                     ("ood_logits", ood_logits))]
    if shapes[0] != shapes[1]:
        raise ValueError(
            "Expected `id_logits` and `ood_logits` to have the same number of classes, "
            f"got {shapes[0]} and {shapes[1]}"
        )
    device = parts[0].device
    labels = torch.cat([
        torch.zeros(parts[0].shape[0], dtype=torch.bool, device=device),
        torch.ones(parts[1].shape[0], dtype=torch.bool, device=device),
    ])
    return torch.cat([parts[0], parts[1].to(device)]), labels


def ood_auroc(*, id_logits: Any, ood_logits: Any, score: str = "entropy") -> torch.Tensor:
    """AUROC of OOD detection with OOD as the positive class (fraction, not x100).

    ``score``: one of :data:`OOD_SCORES` (see :func:`ood_scores`); ``"entropy"`` ranks by
    predictive entropy, ``"max_prob"`` by ``-log max_c p_c`` (float64, no ties),
    ``"energy"`` by ``-logsumexp(z)``,
    ``"max_logit"`` by ``-max_c z_c``, ``"mutual_information"`` by the members' mutual
    information ((S, N, C) member logits).

    Example:
        >>> id_logits = torch.tensor([[4.0, 0.0], [3.0, 0.0], [0.0, 0.1]])
        >>> ood_logits = torch.tensor([[0.0, 0.0], [1.0, 0.5]])
        >>> ood_auroc(id_logits=id_logits, ood_logits=ood_logits)
        tensor(0.8333, dtype=torch.float64)
    """
    s, y = ood_scores(id_logits=id_logits, ood_logits=ood_logits, score=score)
    return auroc(scores=s, labels=y)
