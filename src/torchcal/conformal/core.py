"""The finite-sample conformal quantile every conformal method of torchcal shares.

With n exchangeable calibration scores ``s_1..s_n`` and a test score ``s_{n+1}``,
``P(s_{n+1} <= q) >= 1 - alpha`` for ``q`` the ``k``-th smallest score,
``k = ceil((n + 1)(1 - alpha))`` (Vovk et al. 2005; Angelopoulos & Bates 2021, Thm. D.1); when
``k > n`` no finite threshold has the guarantee and ``q = +inf`` (with
:class:`~torchcal.errors.InfiniteIntervalWarning` naming n and alpha), never a silently
narrow interval.  The weighted form (Tibshirani et al. 2019) puts the test point's weight on
``+inf``.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from .._validation import check_alpha
from ..errors import InfiniteIntervalWarning

__all__ = ["conformal_rank", "conformal_quantile", "weighted_conformal_quantile", "kth_smallest",
           "SAMPLED_SELECTION_MIN",
           "InfiniteIntervalWarning"]


def conformal_rank(n: int, alpha: float) -> int:
    """``k = ceil((n + 1)(1 - alpha))``, exact on the float ``alpha`` (float arithmetic gives 91
    instead of 90 for n = 99, alpha = 0.1).

    >>> conformal_rank(99, 0.1), conformal_rank(9, 0.05)
    (90, 10)
    """
    return math.ceil((n + 1) * (1 - Fraction(alpha)))


def _warn_infinite(n: int, alpha: float, where: str) -> None:
    warnings.warn(
        f"{where}: n = {n} calibration point(s) are too few for alpha = {alpha}: "
        f"ceil((n + 1)(1 - alpha)) = {conformal_rank(n, alpha)} > n, so the threshold is +inf "
        f"(an infinite interval); at least {math.ceil(1 / alpha) - 1} points are needed",
        InfiniteIntervalWarning, stacklevel=3)


def conformal_quantile(scores: torch.Tensor, alpha: Any, *, dim: int = 0,
                       where: str = "conformal_quantile") -> torch.Tensor:
    """The conformal threshold of ``scores`` along ``dim``: the ``k``-th smallest,
    ``k = ceil((n + 1)(1 - alpha))``, ``+inf`` (with a warning) when ``k > n``.

    ``scores`` may have further dimensions (one threshold per group, per quantile level or per
    pixel: every column in one vectorised ``kthvalue``).  Returns a tensor of the other
    dimensions, in ``scores``' dtype.

    >>> conformal_quantile(torch.arange(1.0, 10.0), 0.2)  # n = 9, k = ceil(8) = 8
    tensor(8.)
    """
    a = check_alpha(alpha)
    if not isinstance(scores, torch.Tensor) or not scores.is_floating_point():
        raise TypeError("Expected `scores` to be a floating torch.Tensor, got "
                        f"{type(scores).__name__}")
    n = scores.shape[dim]
    if n == 0:
        raise ValueError("Expected at least one calibration score, got none")
    if scores.numel() and bool(torch.isnan(torch.aminmax(scores)[0])):  # NaN propagates
        raise ValueError("Expected `scores` to hold no NaN")
    k = conformal_rank(n, a)
    if k > n:
        _warn_infinite(n, a, where)
        shape = list(scores.shape)
        del shape[dim]
        return scores.new_full(shape, math.inf)
    return kth_smallest(scores, k, dim)


def kth_smallest(x: torch.Tensor, k: int, dim: int = 0) -> torch.Tensor:
    """The ``k``-th smallest (1-based) of ``x`` along ``dim``: ``torch.kthvalue``'s values.

    On the CPU: a long 1-D input by Floyd & Rivest's sampling selection (a strided sample's
    order statistics bracket the ``k``-th value, one pass counts what lies below the bracket and
    gathers what lies in it, and only that band is partitioned: 2x faster than a full
    ``np.partition`` at a million scores, exact, with the full partition as the fallback when the
    bracket misses); anything else by NumPy's introselect (``np.partition``: 3x faster than
    ``kthvalue``).  Elsewhere (CUDA, gradients, other dtypes) by ``kthvalue`` itself.

    >>> kth_smallest(torch.tensor([[3.0, 1.0, 2.0]]), 2, dim=1)
    tensor([2.])
    """
    if x.device.type != "cpu" or x.requires_grad or x.dtype not in (torch.float32,
                                                                     torch.float64):
        return torch.kthvalue(x, k, dim=dim).values
    a = x.numpy()
    if a.ndim == 1 and a.size >= SAMPLED_SELECTION_MIN:
        return torch.from_numpy(np.array(_sampled_kth(a, k)))
    part = np.partition(a, k - 1, axis=dim)
    return torch.from_numpy(np.array(np.take(part, k - 1, axis=dim)))


#: Inputs from this many elements use the sampling selection of :func:`kth_smallest`.
SAMPLED_SELECTION_MIN = 1 << 16
_SAMPLE = 4096


def _sampled_kth(a: np.ndarray, k: int) -> Any:
    """Floyd-Rivest selection of the ``k``-th smallest of the 1-D ``a`` (no NaN)."""
    n = a.size
    sample = np.sort(a[:: n // _SAMPLE])
    m = sample.size
    r = (k - 0.5) / n * m  # where the k-th value falls among the sorted sample
    margin = 4.0 * math.sqrt(m) + 8.0  # about 8 sample standard deviations of that rank
    lo_i, hi_i = int(r - margin), int(math.ceil(r + margin))
    lo = sample[lo_i] if lo_i >= 0 else -np.inf
    hi = sample[hi_i] if hi_i < m else np.inf
    below = int(np.count_nonzero(a < lo))
    band = a[(a >= lo) & (a <= hi)]
    j = k - below
    if 1 <= j <= band.size:  # the bracket holds the k-th value: select inside the band
        return np.partition(band, j - 1)[j - 1]
    return np.partition(a, k - 1)[k - 1]  # the bracket missed (adversarial order): exact anyway


def weighted_conformal_quantile(scores: torch.Tensor, weights: torch.Tensor,
                                test_weight: torch.Tensor, alpha: Any, *,
                                where: str = "weighted_conformal_quantile") -> torch.Tensor:
    """The weighted conformal threshold of Tibshirani et al. (2019) for a known covariate
    shift: the ``1 - alpha`` quantile of ``sum_i p_i delta_{s_i} + p_{n+1} delta_{+inf}`` with
    ``p_i = w_i / (sum_j w_j + w_{n+1})``.

    Args:
        scores: (n,) calibration scores.
        weights: (n,) non-negative likelihood ratios ``w(x_i)`` of the calibration points.
        test_weight: (m,) the ratios ``w(x_{n+1})`` of the test points (one threshold each).
        alpha: the miscoverage level.

    Returns (m,) thresholds, ``+inf`` where the test point's own mass keeps the cumulative
    weight of the finite scores below ``1 - alpha`` (with one warning).  With equal weights
    this is :func:`conformal_quantile`.

    >>> s = torch.arange(1.0, 10.0)
    >>> weighted_conformal_quantile(s, torch.ones(9), torch.ones(1), 0.2)
    tensor([8.])
    """
    a = check_alpha(alpha)
    s, order = torch.sort(scores.reshape(-1))
    w = weights.reshape(-1).to(s.dtype)[order]
    tw = test_weight.reshape(-1).to(s.dtype)
    if w.numel() != s.numel():
        raise ValueError(f"Expected `weights` to have one weight per score ({s.numel()}), got "
                         f"{w.numel()}")
    if bool((w < 0).any()) or bool((tw < 0).any()) or not bool(torch.isfinite(w).all()) or \
            not bool(torch.isfinite(tw).all()):
        raise ValueError("Expected `weights` and `test_weight` to be finite and >= 0")
    cum = torch.cumsum(w, 0)  # (n,)
    total = cum[-1] + tw  # (m,)
    # the smallest i with cum_i / total >= 1 - alpha; none -> +inf (the test point's mass)
    need = (1 - a) * total
    # relative tolerance: (n+1)(1-alpha) exactly an integer must count as reached
    idx = torch.searchsorted(cum, need * (1 - 1e-12), right=False)
    inf = idx >= s.numel()
    out = torch.where(inf, torch.full_like(tw, math.inf), s[idx.clamp(max=s.numel() - 1)])
    if bool(inf.any()):
        warnings.warn(f"{where}: {int(inf.sum())} of {tw.numel()} test point(s) get an infinite "
                      f"threshold at alpha = {a}: the calibration weights are too few or too "
                      "small against the test point's weight", InfiniteIntervalWarning,
                      stacklevel=2)
    return out
