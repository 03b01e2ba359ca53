"""Answer or abstain: a confidence threshold with a certified error among answered questions,
the abstention curve, and conformal answer sets for multiple choice.

The guarantee comes from :class:`torchcal.conformal.SelectiveRiskControl` (Learn-then-Test on
the error among answered items); this module only adapts it to a language model's answers
and adds the tools to look at the trade-off.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from .._validation import check_alpha
from ..conformal import SelectiveRiskControl, ltt_valid
from ..conformal.losses import check_thresholds
from ..posthoc import ConformalClassifier
from .calibrate import check_confidence, check_correct

__all__ = ["abstention_threshold", "AbstentionCurve", "abstention_curve", "SplitCheck",
           "abstention_split_check", "conformal_answer_sets"]

_DEFAULT_GRID = torch.arange(100, -1, -1, dtype=torch.float64) / 100  # the risk API's default


def _grid(conf: torch.Tensor, thresholds: Any) -> torch.Tensor | None:
    if thresholds is None:
        if bool((conf < 0).any()) or bool((conf > 1).any()):
            raise ValueError("Expected `conf` in [0, 1] for the default threshold grid "
                             "(1.00, 0.99, ..., 0.00); for another score pass `thresholds` "
                             "(chosen without the calibration answers)")
        return None
    return check_thresholds(thresholds)


def abstention_threshold(conf: Any, correct: Any, eps: float, delta: float, *,
                         thresholds: Any = None, method: str = "bonferroni",
                         p_value: str = "hb") -> SelectiveRiskControl:
    """The lowest confidence threshold whose error among answered questions is certified
    ``<= eps`` with probability ``>= 1 - delta``: answer when ``conf >= threshold_``.

    A fitted :class:`~torchcal.conformal.SelectiveRiskControl` (``threshold_``,
    ``answered_fraction_``, ``selective_risk_`` on the calibration answers, ``predict(conf)``
    the answer mask; ``threshold_ = inf`` with a warning when no threshold is certified).

    Guarantee: ``P(P(wrong | conf >= threshold_) <= eps) >= 1 - delta`` over the draw of the
    calibration answers, when the calibration and future questions are independent draws
    from one distribution (same model, prompt and kind of question) and the threshold grid is
    fixed without looking at the calibration answers.  It holds for any score, calibrated or
    not; a better-ranking score answers more questions at the same ``eps``.

    Args:
        conf: (N,) calibration confidences (in [0, 1] for the default grid).
        correct: (N,) whether each calibration answer was right.
        eps: the tolerated error among answered questions, in (0, 1).
        delta: the probability that the certificate fails, in (0, 1).
        thresholds: the grid to test (default 1.00, 0.99, ..., 0.00).
        method: the family-wise procedure (see
            :class:`~torchcal.conformal.SelectiveRiskControl`).  Default ``"bonferroni"``,
            not the risk API's ``"fixed_sequence"``: testing from the highest threshold down
            stops at the first threshold it cannot certify, and the highest ones answer
            almost no question (one right answer cannot certify an error below 0.05), so on
            the default grid a fixed sequence usually certifies nothing.  Bonferroni tests
            every threshold at ``delta / L`` (the lowest certified one is taken; the
            guarantee holds for every certified one at once).
        p_value: ``"hb"`` (Hoeffding-Bentkus) or ``"hoeffding"``.

    Example:
        >>> conf = torch.linspace(0, 1, 2000, dtype=torch.float64)
        >>> sel = abstention_threshold(conf, conf > 0.25, eps=0.05, delta=0.1)
        >>> 0.2 < sel.threshold_ < 0.3, sel.predict(torch.tensor([0.2, 0.9])).tolist()
        (True, [False, True])
    """
    s = check_confidence(conf, probability=False)
    c = check_correct(correct, s.shape[0])
    grid = _grid(s, thresholds)
    sel = SelectiveRiskControl(eps=eps, delta=delta, thresholds=grid, method=method,
                               p_value=p_value)
    return sel.fit(s, c)


class AbstentionCurve(NamedTuple):
    """Answering when ``conf >= threshold``, for each threshold (highest first; (L,) each).

    Attributes:
        threshold: the thresholds (float64).
        coverage: the share of questions answered (float64).
        selective_error: the error rate among the answered ones (float64; NaN where none is
            answered).
        n_answered: the number answered (int64).
    """

    threshold: torch.Tensor
    coverage: torch.Tensor
    selective_error: torch.Tensor
    n_answered: torch.Tensor


def abstention_curve(conf: Any, correct: Any, *, thresholds: Any = None) -> AbstentionCurve:
    """Coverage against the error among answered questions, answering when ``conf >= t``.

    With ``thresholds=None`` every distinct confidence is a threshold (tied confidences are
    answered together, so the points are those of
    :func:`torchcal.metrics.risk_coverage_curve` at the ends of the tied groups), from the
    most confident answer alone to every answer.

    Example:
        >>> curve = abstention_curve(torch.tensor([0.9, 0.8, 0.8, 0.3], dtype=torch.float64),
        ...                          torch.tensor([1, 1, 0, 1]))
        >>> curve.threshold.tolist(), curve.coverage.tolist(), curve.selective_error.tolist()
        ([0.9, 0.8, 0.3], [0.25, 0.75, 1.0], [0.0, 0.3333333333333333, 0.25])
    """
    s = check_confidence(conf, probability=False)
    c = check_correct(correct, s.shape[0])
    if thresholds is None:
        t = torch.unique(s).flip(0)
    else:
        t = torch.sort(check_thresholds(thresholds).to(s.device), descending=True).values
    # answered at t: conf >= t; counts by sorting once (no loop over thresholds)
    order = torch.argsort(s)
    s_sorted = s[order]
    wrong_below = torch.cat([s.new_zeros(1), torch.cumsum((~c[order]).double(), 0)])
    below = torch.searchsorted(s_sorted, t, right=False)  # items with conf < t
    n = s.shape[0]
    n_ans = n - below
    err = wrong_below[-1] - wrong_below[below]
    sel = torch.where(n_ans > 0, err / n_ans.clamp(min=1).double(),
                      torch.full_like(err, float("nan")))
    return AbstentionCurve(threshold=t, coverage=n_ans.double() / n, selective_error=sel,
                           n_answered=n_ans)


class SplitCheck(NamedTuple):
    """The certified threshold over random calibration/test splits ((B,) each).

    Attributes:
        threshold: the threshold chosen on each split's calibration part (inf: abstain).
        test_error: the realised error among the answered test questions (0 where none).
        coverage: the share of test questions answered.
        violation: ``test_error > eps``.
    """

    threshold: torch.Tensor
    test_error: torch.Tensor
    coverage: torch.Tensor
    violation: torch.Tensor


def abstention_split_check(conf: Any, correct: Any, eps: float, delta: float, *, n_cal: int,
                           n_splits: int = 200, seed: int = 0, thresholds: Any = None,
                           method: str = "bonferroni") -> SplitCheck:
    """Check :func:`abstention_threshold` on ``n_splits`` random splits of your answers:
    ``n_cal`` calibrate the threshold, the rest measure its realised error.

    The splits are one batch (``torch.rand(B, N).argsort(1)``) and every split's threshold
    comes from one call of :func:`torchcal.conformal.ltt_valid` with the splits as a leading
    dimension: the computation of :class:`~torchcal.conformal.SelectiveRiskControl`
    (Hoeffding-Bentkus p-values of the error among answered items, ``method``'s family-wise
    procedure, the lowest certified threshold), for all splits at once.  The guarantee says the *population* error among
    answered questions exceeds ``eps`` on at most a ``delta`` share of splits; the realised
    test error adds the test set's own noise.

    Returns:
        :class:`SplitCheck`.
    """
    s = check_confidence(conf, probability=False)
    c = check_correct(correct, s.shape[0])
    check_alpha(eps, "eps")
    check_alpha(delta, "delta")
    n = s.shape[0]
    if not isinstance(n_cal, int) or not 0 < n_cal < n:
        raise ValueError(f"Expected `n_cal` to be an integer in (0, {n}), got {n_cal!r}")
    grid = _grid(s, thresholds)
    t = _DEFAULT_GRID if grid is None else torch.sort(grid, descending=True).values
    g = torch.Generator().manual_seed(seed)
    perm = torch.rand(n_splits, n, generator=g).argsort(dim=1)
    sc, wc = s[perm[:, :n_cal]], (~c)[perm[:, :n_cal]]
    answered = sc.unsqueeze(2) >= t  # (B, n_cal, L)
    valid, _ = ltt_valid(wc.double().unsqueeze(2), eps, delta, method=method, binary=True,
                         mask=answered)
    n_l = valid.shape[-1]
    last = n_l - 1 - valid.flip(-1).to(torch.int8).argmax(-1)  # lowest certified threshold
    thr = torch.where(valid.any(-1), t[last], torch.full_like(t[last], float("inf")))
    st, wt = s[perm[:, n_cal:]], (~c)[perm[:, n_cal:]]
    ans = st >= thr.unsqueeze(1)
    n_ans = ans.sum(1)
    err = (wt & ans).sum(1).double() / n_ans.clamp(min=1)
    return SplitCheck(threshold=thr, test_error=err, coverage=n_ans.double() / (n - n_cal),
                      violation=err > eps)


def conformal_answer_sets(scores: Any, answers: Any, *, alpha: float = 0.1,
                          method: str = "lac", **kwargs: Any) -> ConformalClassifier:
    """Conformal answer sets for multiple choice: a
    :class:`~torchcal.posthoc.ConformalClassifier` (``"lac"`` or ``"aps"``) fitted on the
    calibration questions' (Q, K) option scores (log-likelihoods or logits: their softmax over
    the options is :func:`~torchcal.llm.option_probs`) and right options (Q,).
    ``predict_sets(test_scores)`` gives (Q', K) bool sets holding the right option with
    probability ``>= 1 - alpha`` (questions exchangeable with the calibration ones).

    Example:
        >>> z = torch.tensor([[3.0, 0.0, 0.0], [0.0, 2.0, 1.0]] * 10)
        >>> cp = conformal_answer_sets(z, torch.tensor([0, 1] * 10), alpha=0.2)
        >>> cp.predict_sets(torch.tensor([[3.0, 0.0, 0.0]])).tolist()
        [[True, False, False]]
    """
    if method not in ("lac", "aps"):
        raise ValueError(f"Expected `method` to be 'lac' or 'aps', got {method!r}")
    return ConformalClassifier(method=method, alpha=alpha, **kwargs).fit(scores, answers)
