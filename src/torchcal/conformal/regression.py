"""Split-conformal prediction intervals for regression: absolute residual, normalised residual,
CQR; Mondrian (per group) and weighted (covariate shift); point and dense layouts.

Every method here reduces to one score per calibration element,

    ``s = max(lo - y, y - hi) / scale``,

and the interval ``[lo - q * scale, hi + q * scale]`` with ``q`` the conformal threshold of
:func:`~torchcal.conformal.conformal_quantile` (the ``ceil((n + 1)(1 - alpha))``-th smallest
score), where

* ``"absolute"`` (split conformal, Lei et al. 2018): ``lo = hi = mu``, ``scale = 1``, so
  ``s = |y - mu|``;
* ``"normalized"``: ``lo = hi = mu``, ``scale = sigma`` (a :class:`~torchcal.regression.Gaussian`
  as Kendall et al.'s head outputs it, or an ensemble's :class:`~torchcal.regression.Samples`):
  ``s = |y - mu| / sigma``;
* ``"cqr"`` (conformalised quantile regression, Romano et al. 2019): ``lo``, ``hi`` the predicted
  ``alpha / 2`` and ``1 - alpha / 2`` quantiles (:class:`~torchcal.regression.Quantiles`),
  ``scale = 1``: ``s = max(q_lo - y, y - q_hi)``.

The functions :func:`interval_parts`, :func:`conformity_scores`, :func:`interval_bounds` and
:func:`mondrian_thresholds` are the vectorised pieces :class:`ConformalRegressor` is made of;
they take any leading batch dimensions (e.g. (B, n) scores of B random splits at once).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import torch

from .._validation import as_tensor, check_alpha
from ..errors import InfiniteIntervalWarning
from ..posthoc import Estimator
from ..regression.predictive import (
    Gaussian,
    Quantiles,
    Samples,
    as_float,
    flat_values,
    kept_rows,
    like,
    prediction_shape,
)
from .core import conformal_quantile, conformal_rank, weighted_conformal_quantile

__all__ = [
    "ConformalRegressor",
    "IntervalParts",
    "interval_parts",
    "conformity_scores",
    "interval_bounds",
    "mondrian_thresholds",
    "SCORES",
]

#: The scores :class:`ConformalRegressor` takes.
SCORES = ("absolute", "normalized", "cqr")


class IntervalParts(NamedTuple):
    """The pieces of a prediction the score and the interval are made of: the lower and upper
    reference ``lo``, ``hi`` (both the mean, or the two predicted quantiles) and the ``scale``
    (``sigma``, or None for 1), all of the prediction's shape."""

    lo: torch.Tensor
    hi: torch.Tensor
    scale: torch.Tensor | None


def _check_choice(value: Any, name: str, choices: tuple) -> str:
    """``value`` if it is one of ``choices``, else ValueError naming ``name``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"Expected `{name}` to be one of {choices}, got {value!r}")
    return value


def _float_tensor(values: Any, name: str) -> torch.Tensor:
    """A JSON list of numbers (None for +inf) as a float64 tensor."""
    if not isinstance(values, list) or not all(
            v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)
                          and not math.isnan(v)) for v in values):
        raise ValueError(f"Expected `{name}` to be a list of numbers (None for +inf)")
    return torch.tensor([math.inf if v is None else float(v) for v in values],
                        dtype=torch.float64)


def _ref(pred: Any) -> Any:
    """The user's own array behind a prediction (NumPy in -> NumPy out)."""
    return getattr(pred, "_ref", pred)


def interval_parts(pred: Any, score: str, alpha: float) -> IntervalParts:
    """Split a prediction into :class:`IntervalParts` for ``score``.

    Args:
        pred: ``"absolute"``: a point prediction (tensor or array), a
            :class:`~torchcal.regression.Gaussian` or :class:`~torchcal.regression.Samples`
            (their mean); ``"normalized"``: a Gaussian or Samples (``sigma = sqrt(var)``;
            ``Gaussian(mean, std=s)`` for an explicit ``s``); ``"cqr"``:
            :class:`~torchcal.regression.Quantiles` holding the levels ``alpha / 2`` and
            ``1 - alpha / 2``.
        score: one of ``"absolute"``, ``"normalized"``, ``"cqr"``.
        alpha: the miscoverage level (selects CQR's two quantile columns).

    Raises TypeError for a prediction the score cannot use and ValueError for a ``sigma <= 0``.

    >>> p = interval_parts(Quantiles([[0.0, 1.0, 2.0]], [0.05, 0.5, 0.95]), "cqr", 0.1)
    >>> p.lo.tolist(), p.hi.tolist(), p.scale
    ([0.0], [2.0], None)
    """
    score = _check_choice(score, "score", SCORES)
    a = check_alpha(alpha)
    pred = flat_values(pred)
    if score == "cqr":
        if not isinstance(pred, Quantiles):
            raise TypeError("Expected `pred` to be Quantiles (levels alpha/2 and 1 - alpha/2) "
                            f"for score='cqr', got {type(pred).__name__}")
        lo, hi = pred.interval(a)
        return IntervalParts(lo, hi, None)
    if isinstance(pred, Quantiles):
        raise TypeError(f"Expected `pred` to be a point prediction, Gaussian or Samples for "
                        f"score={score!r}, got Quantiles (use score='cqr')")
    if score == "absolute":
        mu = pred.mean if isinstance(pred, (Gaussian, Samples)) else pred
        return IntervalParts(mu, mu, None)
    if not isinstance(pred, (Gaussian, Samples)):
        raise TypeError("Expected `pred` to be a Gaussian or Samples for score='normalized' "
                        f"(e.g. Gaussian(mean, std=sigma)), got {type(pred).__name__}")
    sigma = pred.var.sqrt()
    if sigma.numel() and not bool((sigma > 0).all()):
        raise ValueError(f"Expected sigma > 0 for score='normalized', found "
                         f"{int((sigma <= 0).sum())} element(s) with sigma <= 0")
    mu = pred.mean
    return IntervalParts(mu, mu, sigma.to(mu.dtype))


def conformity_scores(parts: IntervalParts, y: torch.Tensor) -> torch.Tensor:
    """The non-conformity scores ``max(lo - y, y - hi) / scale`` (``|y - mu|`` for ``lo = hi =
    mu``), elementwise over any shape.

    >>> mu = torch.tensor([0.0, 1.0])
    >>> conformity_scores(IntervalParts(mu, mu, None), torch.tensor([0.5, -1.0]))
    tensor([0.5000, 2.0000])
    """
    s = torch.maximum(parts.lo - y, y - parts.hi)
    return s if parts.scale is None else s / parts.scale


def interval_bounds(parts: IntervalParts, q: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lo - q * scale, hi + q * scale)`` with the threshold(s) ``q`` broadcast against the
    parts (a number, or a tensor of the parts' shape or of their leading dimensions padded with
    trailing ones by the caller)."""
    qt = torch.as_tensor(q, dtype=parts.lo.dtype, device=parts.lo.device)
    w = qt if parts.scale is None else qt * parts.scale
    return parts.lo - w, parts.hi + w


def mondrian_thresholds(scores: torch.Tensor, groups: torch.Tensor, alpha: Any, *,
                        where: str = "mondrian_thresholds"
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One conformal threshold per group (Mondrian conformal prediction, Vovk et al. 2005).

    Args:
        scores: (M,) calibration scores.
        groups: (M,) integer group labels.
        alpha: the miscoverage level.
        where: the caller's name, for the warning.

    Returns:
        ``(labels (G,), thresholds (G,), counts (G,))``: the sorted distinct labels, each
        group's :func:`~torchcal.conformal.conformal_quantile` of its own scores (``+inf`` for a
        group with too few scores, with one :class:`~torchcal.errors.InfiniteIntervalWarning`
        naming the groups, their n and alpha) and each group's n.  Vectorised: the groups of
        one size n are stacked into a (G_n, n) matrix and share one ``kthvalue`` call (one
        call per distinct group size, never per group or per score).

    >>> s = torch.tensor([1.0, 5.0, 2.0, 3.0, 4.0, 6.0])
    >>> mondrian_thresholds(s, torch.tensor([0, 1, 0, 0, 1, 1]), 0.5)[1]
    tensor([2., 5.])
    """
    a = check_alpha(alpha)
    labels, inv, counts = torch.unique(groups.reshape(-1), return_inverse=True,
                                       return_counts=True)
    order = torch.argsort(inv, stable=True)
    grouped = scores.reshape(-1)[order]
    starts = torch.cumsum(counts, 0) - counts
    q = torch.full((labels.numel(),), math.inf, dtype=scores.dtype, device=scores.device)
    small = []
    for n in counts.unique().tolist():
        sel = (counts == n).nonzero().flatten()
        if conformal_rank(n, a) > n:
            small.append((n, sel))
            continue
        idx = starts[sel].unsqueeze(1) + torch.arange(n, device=scores.device)
        q[sel] = conformal_quantile(grouped[idx], a, dim=1, where=where)
    if small:
        named = [(labels[i].item(), n) for n, sel in small for i in sel[:10].tolist()][:10]
        total = sum(int(sel.numel()) for _, sel in small)
        warnings.warn(
            f"{where}: {total} group(s) have too few calibration points for alpha = {a} "
            f"(ceil((n + 1)(1 - alpha)) > n): (group, n) = {named}; their threshold is +inf "
            f"(infinite intervals); at least {math.ceil(1 / a) - 1} points per group are needed",
            InfiniteIntervalWarning, stacklevel=2)
    return labels, q, counts


def _per_element(x: Any, shape: torch.Size, name: str, device: torch.device) -> torch.Tensor:
    """``x`` of the target's ``shape``, or (N,) per sample broadcast over a dense target."""
    t = as_tensor(x, name).to(device)
    if t.shape == shape:
        return t
    if t.ndim == 1 and len(shape) > 1 and t.shape[0] == shape[0]:
        return t.reshape((-1,) + (1,) * (len(shape) - 1)).expand(shape)
    raise ValueError(f"Expected `{name}` of the target's shape {tuple(shape)} (or (N,) = "
                     f"({shape[0]},) per sample), got {tuple(t.shape)}")


def _check_groups(g: torch.Tensor) -> torch.Tensor:
    if g.is_floating_point() or g.is_complex():
        raise TypeError(f"Expected `groups` to hold integer labels, got {g.dtype}")
    return g.to(torch.int64)


def _check_weights(w: torch.Tensor, name: str) -> torch.Tensor:
    w = as_float(w, name)
    if w.numel() and (not bool(torch.isfinite(w).all()) or bool((w < 0).any())):
        raise ValueError(f"Expected `{name}` to be finite and >= 0 (likelihood ratios)")
    return w


class ConformalRegressor(Estimator):
    r"""Split-conformal prediction intervals for regression, with a coverage guarantee.

    Fit on held-out calibration predictions and targets: each calibration element gets the
    score ``s = max(lo - y, y - hi) / scale`` (see :mod:`torchcal.conformal.regression`:
    ``|y - mu|`` for ``score="absolute"``, ``|y - mu| / sigma`` for ``"normalized"``,
    ``max(q_lo - y, y - q_hi)`` for ``"cqr"``), and the threshold ``q`` is the ``k``-th
    smallest of the n scores, ``k = ceil((n + 1)(1 - alpha))``
    (:func:`~torchcal.conformal.conformal_quantile`).  The interval of a new prediction is
    ``[lo - q * scale, hi + q * scale]``.

    **Guarantee.** If the calibration and test points are exchangeable, the interval holds the
    test target with probability at least ``1 - alpha`` (and at most ``1 - alpha + 1 / (n +
    1)`` when the scores have no ties), whatever the model: the probability is over the
    calibration and test draws together (marginal, not conditional on ``x``).

    * **Mondrian** (``groups`` at fit and at predict: integer labels, per element or per
      sample): one threshold per group from that group's scores; the guarantee holds within
      every group (exchangeability within the group).  A group with fewer than
      ``ceil(1 / alpha) - 1`` points gets ``q = +inf`` (a warning names it, its n and alpha);
      a group at predict that was not seen at fit is refused.
    * **Weighted** (Tibshirani et al. 2019; ``weights`` at fit, ``test_weights`` at predict):
      under a covariate shift with a *known* likelihood ratio ``w(x) = dP_test / dP_calib``
      (``weights = w(x_i)`` of the calibration points, ``test_weights = w(x)`` of the test
      points, any common scale), the threshold is the ``1 - alpha`` quantile of the
      calibration scores weighted by ``w(x_i)`` with the test point's own weight on ``+inf``
      (:func:`~torchcal.conformal.weighted_conformal_quantile`), one per test point; coverage
      is ``>= 1 - alpha`` under the shifted test distribution.  Not combined with Mondrian.
    * **Dense** targets (N, d1, ...) (depth, per-pixel values) and (N, T): every observed
      element (``mask`` / ``ignore_value`` drop the rest) is one calibration score, *one
      threshold is shared by all positions* (the pooled scores), and :meth:`predict_interval`
      returns per-element intervals of the prediction's shape.  The guarantee is the marginal
      one over elements exchangeable with the calibration elements (e.g. i.i.d. pixel noise);
      pixels of one image are usually dependent, and then it holds only approximately.

    Too few calibration points for ``alpha`` (``k > n``) give infinite intervals with an
    :class:`~torchcal.errors.InfiniteIntervalWarning` naming n and alpha, never a silently
    narrow interval.  NumPy in gives NumPy out; torch in gives torch out (same device).

    Args:
        alpha: the miscoverage level in (0, 1): intervals cover with probability
            ``>= 1 - alpha``.
        score: ``"absolute"``, ``"normalized"`` or ``"cqr"``.

    Attributes:
        threshold_ (torch.Tensor): the threshold q (0-d), or the (G,) per-group thresholds
            (Mondrian); None for a weighted fit (the threshold depends on the test weight).
        groups_ (torch.Tensor | None): the (G,) sorted group labels (Mondrian).
        group_counts_ (torch.Tensor | None): the (G,) calibration points per group.
        scores_ (torch.Tensor): the (n,) calibration scores.
        weights_ (torch.Tensor | None): the (n,) calibration weights (weighted fit).
        n_calib_ (int): n.

    Example:
        >>> cal_mu = torch.zeros(19)
        >>> cal_y = torch.arange(1.0, 20.0)
        >>> cr = ConformalRegressor(alpha=0.1).fit(cal_mu, cal_y)  # k = ceil(20 * 0.9) = 18
        >>> lo, hi = cr.predict_interval(torch.tensor([0.0, 10.0]))
        >>> lo.tolist(), hi.tolist()
        ([-18.0, -8.0], [18.0, 28.0])
    """

    _fitted_attr = "scores_"

    def __init__(self, alpha: float = 0.1, score: str = "absolute") -> None:
        self.alpha = alpha
        self.score = score
        self._settings()

    def _settings(self) -> tuple[float, str]:
        return check_alpha(self.alpha), _check_choice(self.score, "score", SCORES)

    def fit(self, pred: Any, target: Any, *, groups: Any = None, weights: Any = None,
            mask: Any = None, ignore_value: Any = None) -> ConformalRegressor:
        """Calibrate on held-out predictions and targets; returns ``self``.

        Args:
            pred: the calibration predictions (see :func:`interval_parts` for what each
                score takes), of the target's layout.
            target: the calibration targets (N,), (N, d1, ...) or (N, T).
            groups: optional integer group labels of the target's shape, or (N,) per sample
                (Mondrian).
            weights: optional likelihood ratios ``w(x_i) >= 0`` of the calibration points
                (target's shape or (N,)), for a known covariate shift.
            mask: optional boolean of the target's shape, True where observed.
            ignore_value: optional number marking missing targets.
        """
        alpha, score = self._settings()
        if groups is not None and weights is not None:
            raise ValueError("Expected at most one of `groups` (Mondrian) and `weights` "
                             "(covariate shift), got both")
        rows, y, keep = kept_rows(pred, target, mask=mask, ignore_value=ignore_value)
        parts = interval_parts(rows, score, alpha)
        s = conformity_scores(parts, y.to(parts.lo.dtype))
        shape = prediction_shape(flat_values(pred))

        def kept(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(-1) if keep is None else x[keep]

        self.groups_ = self.group_counts_ = self.weights_ = None
        self.__dict__.pop("_refit_needed", None)
        where = "ConformalRegressor.fit"
        if groups is not None:
            g = kept(_check_groups(_per_element(groups, shape, "groups", s.device)))
            self.groups_, self.threshold_, self.group_counts_ = mondrian_thresholds(
                s, g, alpha, where=where)
        elif weights is not None:
            self.weights_ = kept(_check_weights(_per_element(weights, shape, "weights",
                                                             s.device), "weights")).to(s.dtype)
            if not bool((self.weights_ > 0).any()):
                raise ValueError("Expected `weights` to have a positive weight, every weight "
                                 "is zero")
            self.threshold_ = None
        else:
            self.threshold_ = conformal_quantile(s, alpha, where=where)
        self.scores_ = s
        self.n_calib_ = int(s.numel())
        return self

    def _thresholds(self, shape: torch.Size, device: torch.device, groups: Any,
                    test_weights: Any) -> torch.Tensor:
        """The threshold of every predicted element (0-d when shared)."""
        if self.groups_ is not None:
            if groups is None:
                raise ValueError("Expected `groups` at predict: this predictor was fitted per "
                                 "group (Mondrian)")
            g = _check_groups(_per_element(groups, shape, "groups", device))
            labels = self.groups_.to(device)
            pos = torch.searchsorted(labels, g.reshape(-1).contiguous()).clamp(
                max=labels.numel() - 1)
            unseen = labels[pos] != g.reshape(-1)
            if bool(unseen.any()):
                bad = torch.unique(g.reshape(-1)[unseen])[:10].tolist()
                raise ValueError(f"Expected `groups` seen at fit {labels[:10].tolist()}..., "
                                 f"got unseen group label(s) {bad}")
            return self.threshold_.to(device)[pos].reshape(shape)
        if groups is not None:
            raise ValueError("Expected no `groups` at predict: this predictor was not fitted "
                             "per group")
        if self.weights_ is not None:
            if test_weights is None:
                raise ValueError("Expected `test_weights` (the test points' likelihood "
                                 "ratios) at predict: this predictor was fitted with `weights`")
            tw = _check_weights(_per_element(test_weights, shape, "test_weights", device),
                                "test_weights")
            q = weighted_conformal_quantile(self.scores_, self.weights_, tw.reshape(-1),
                                            check_alpha(self.alpha),
                                            where="ConformalRegressor.predict_interval")
            return q.reshape(shape)
        if test_weights is not None:
            raise ValueError("Expected no `test_weights`: this predictor was fitted without "
                             "`weights`")
        return self.threshold_

    def predict_interval(self, pred: Any, *, groups: Any = None,
                         test_weights: Any = None) -> tuple[Any, Any]:
        """The ``(lower, upper)`` intervals of ``pred`` (of the prediction's target shape;
        NumPy for NumPy input).

        Args:
            pred: test predictions of the kind given at fit.
            groups: the test points' group labels (required after a Mondrian fit).
            test_weights: the test points' likelihood ratios (required after a weighted fit).
        """
        self._check_fitted()
        alpha, score = self._settings()
        p = flat_values(pred)
        parts = interval_parts(p, score, alpha)
        q = self._thresholds(parts.lo.shape, parts.lo.device, groups, test_weights)
        lo, hi = interval_bounds(parts, q)
        ref = _ref(p) if isinstance(p, (Gaussian, Quantiles, Samples)) else pred
        return like(lo, ref), like(hi, ref)

    def coverage(self, pred: Any, target: Any, *, groups: Any = None, test_weights: Any = None,
                 mask: Any = None, ignore_value: Any = None) -> float:
        """The share of observed targets inside their intervals (the empirical coverage)."""
        lo, hi = self.predict_interval(pred, groups=groups, test_weights=test_weights)
        lo_t, hi_t = as_float(lo, "lower"), as_float(hi, "upper")
        _, y, keep = kept_rows(lo_t, target, mask=mask, ignore_value=ignore_value)
        lo_k = lo_t.reshape(-1) if keep is None else lo_t[keep]
        hi_k = hi_t.reshape(-1) if keep is None else hi_t[keep]
        return float(((lo_k <= y) & (y <= hi_k)).double().mean())

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description: settings, the threshold(s) (None for +inf), the groups and
        their counts; a weighted fit also writes its scores and weights."""
        self._check_fitted()

        def fl(t: torch.Tensor) -> list:
            return [None if math.isinf(v) else v for v in t.double().reshape(-1).tolist()]

        d = {**self._header(), "n_calib": self.n_calib_,
             "threshold": None if self.threshold_ is None else fl(self.threshold_)}
        if self.groups_ is not None:
            d.update(groups=self.groups_.tolist(), group_counts=self.group_counts_.tolist())
        if self.weights_ is not None:
            d.update(scores=fl(self.scores_), weights=fl(self.weights_))
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConformalRegressor:
        """Rebuild a fitted predictor from :meth:`to_dict`'s output (``scores_`` holds the
        calibration scores only for a weighted fit)."""
        cls._check_dict(d, ("alpha", "score", "n_calib", "threshold"))
        obj = cls(alpha=d["alpha"], score=d["score"])

        obj.n_calib_ = int(d["n_calib"])
        obj.groups_ = obj.group_counts_ = obj.weights_ = None
        if d["threshold"] is None:
            obj.scores_ = _float_tensor(d["scores"], "d['scores']")
            obj.weights_ = _float_tensor(d["weights"], "d['weights']")
            obj.threshold_ = None
            return obj
        q = _float_tensor(d["threshold"], "d['threshold']")
        if "groups" in d:
            obj.groups_ = torch.tensor(d["groups"], dtype=torch.int64)
            obj.group_counts_ = torch.tensor(d["group_counts"], dtype=torch.int64)
            obj.threshold_ = q
        else:
            obj.threshold_ = q.reshape(())
        obj.scores_ = torch.empty(0, dtype=torch.float64)
        return obj
