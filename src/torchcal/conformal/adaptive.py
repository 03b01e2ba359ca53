"""Adaptive conformal inference for a sequence (Gibbs & Candès 2021): the miscoverage level is
steered online so that the long-run miscoverage matches ``alpha`` whatever the distribution
shift."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

import torch

from .._validation import check_alpha, check_positive_int, check_scalar
from ..regression.predictive import as_float, kept_rows, like
from .core import conformal_rank

__all__ = ["AdaptiveConformal", "AdaptiveResult"]


@dataclass(frozen=True)
class AdaptiveResult:
    """The outcome of :meth:`AdaptiveConformal.run` over a sequence of T scores.

    Attributes:
        thresholds: (T,) the threshold used at each step (``+inf`` when ``alpha_t <= 0`` or
            the history is too short, ``-inf`` when ``alpha_t >= 1``).
        alphas: (T,) the level ``alpha_t`` used at each step.
        errors: (T,) booleans, True where the score exceeded its threshold (a miss).
        miscoverage: the realised miscoverage ``mean(errors)``.
        bound: the paper's bound on ``|miscoverage - alpha|``:
            ``(max(alpha_1, 1 - alpha_1) + gamma) / (gamma T)``.
    """

    thresholds: Any
    alphas: Any
    errors: Any
    miscoverage: float
    bound: float


class AdaptiveConformal:
    r"""Adaptive conformal inference (ACI; Gibbs & Candès 2021) over a sequence of scores.

    At step t the threshold is the conformal quantile at level ``alpha_t`` of the scores seen
    so far (``calib_scores`` then ``s_1 .. s_{t-1}``, the last ``window`` of them): the
    ``ceil((n + 1)(1 - alpha_t))``-th smallest, ``+inf`` when that rank exceeds n or
    ``alpha_t <= 0``, ``-inf`` (an empty interval) when ``alpha_t >= 1``.  The step's error is
    ``err_t = 1{s_t > threshold_t}`` and the level is updated by

    ``alpha_{t+1} = alpha_t + gamma (alpha - err_t)``, ``alpha_1 = alpha``.

    **Guarantee** (Gibbs & Candès 2021, Prop. 4.1): for *any* sequence of scores (no
    exchangeability assumed: adversarial or shifting data), the realised miscoverage over T
    steps satisfies ``|mean(err) - alpha| <= (max(alpha_1, 1 - alpha_1) + gamma) / (gamma T)``,
    so it tends to ``alpha``; a larger ``gamma`` adapts faster with more volatile thresholds.
    This is long-run (average) coverage, not coverage at each step.

    The recursion is sequential by definition (each level depends on the previous step's
    error): one step costs an insertion into a sorted history (O(log n) search).

    Args:
        alpha: the target miscoverage in (0, 1).
        gamma: the step size > 0 (the paper's examples use 0.005).
        window: None (every past score) or the number of most recent scores to keep.

    Example:
        >>> aci = AdaptiveConformal(alpha=0.1, gamma=0.05)
        >>> res = aci.run(torch.linspace(0, 1, 200) * torch.rand(200, generator=torch.Generator(
        ...     ).manual_seed(0)), calib_scores=torch.rand(50))
        >>> abs(res.miscoverage - 0.1) <= res.bound
        True
    """

    def __init__(self, alpha: float = 0.1, gamma: float = 0.005, *,
                 window: int | None = None) -> None:
        self.alpha = check_alpha(alpha)
        self.gamma = check_scalar(gamma, "gamma", float)
        if not self.gamma > 0:
            raise ValueError(f"Expected `gamma` to be > 0, got {gamma!r}")
        self.window = None if window is None else check_positive_int(window, "window")

    def run(self, scores: Any, *, calib_scores: Any = None) -> AdaptiveResult:
        """Run ACI over ``scores`` (T,) in order (``calib_scores`` (n,): an initial history);
        returns an :class:`AdaptiveResult` (tensors, NumPy for NumPy ``scores``)."""
        s = as_float(scores, "scores").reshape(-1)
        if s.numel() == 0 or not bool(torch.isfinite(s).all()):
            raise ValueError("Expected `scores` to be a non-empty sequence of finite numbers")
        hist = [] if calib_scores is None else as_float(calib_scores, "calib_scores").reshape(
            -1).double().tolist()
        if not all(math.isfinite(v) for v in hist):
            raise ValueError("Expected `calib_scores` to be finite")
        order = list(hist)  # arrival order, for the window
        if self.window is not None:
            order = order[-self.window:]
        srt = sorted(order)
        seq = s.double().tolist()
        thr, alphas, errs = [], [], []
        a_t = self.alpha
        for x in seq:
            q = self._threshold(srt, a_t)
            err = x > q
            thr.append(q)
            alphas.append(a_t)
            errs.append(err)
            a_t = a_t + self.gamma * (self.alpha - float(err))
            bisect.insort(srt, x)
            order.append(x)
            if self.window is not None and len(order) > self.window:
                old = order.pop(0)
                del srt[bisect.bisect_left(srt, old)]
        t = len(seq)
        errors = torch.tensor(errs)
        bound = (max(self.alpha, 1 - self.alpha) + self.gamma) / (self.gamma * t)
        return AdaptiveResult(
            thresholds=like(torch.tensor(thr, dtype=s.dtype), scores),
            alphas=like(torch.tensor(alphas, dtype=torch.float64), scores),
            errors=like(errors, scores), miscoverage=float(errors.double().mean()),
            bound=bound)

    @staticmethod
    def _threshold(srt: list, a_t: float) -> float:
        if a_t <= 0:
            return math.inf
        if a_t >= 1:
            return -math.inf
        n = len(srt)
        k = conformal_rank(n, a_t)
        return math.inf if k > n else srt[k - 1]

    def run_intervals(self, pred: Any, target: Any, *, calib_scores: Any = None
                      ) -> tuple[Any, Any, AdaptiveResult]:
        """ACI on absolute residuals ``|y_t - mu_t|`` of a sequence of point predictions
        ``pred`` (T,) and targets (T,): returns ``(lower, upper, result)`` with the intervals
        ``mu_t -+ threshold_t`` each step used."""
        mu, y, _ = kept_rows(pred, target)
        if as_float(pred, "pred").ndim != 1:
            raise ValueError("Expected `pred` and `target` of shape (T,), a sequence")
        res = self.run((y - mu).abs(), calib_scores=calib_scores)
        q = as_float(res.thresholds, "thresholds").to(mu)
        return like(mu - q, pred), like(mu + q, pred), res

    def __repr__(self) -> str:
        return (f"AdaptiveConformal(alpha={self.alpha}, gamma={self.gamma}, "
                f"window={self.window})")
