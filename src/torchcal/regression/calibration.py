"""Post-hoc calibration of regression predictions: sigma scaling, isotonic recalibration of the
predictive CDF and per-quantile conformalised recalibration.

Every calibrator follows the calibrators' contract (:class:`~torchcal.posthoc.Estimator`):
the constructor stores settings, ``fit(pred, target, *, sample_weight=None, mask=None,
ignore_value=None)`` learns attributes ending in ``_`` and returns ``self``, ``score`` is the
negative validation criterion (higher is better), ``to_dict`` / ``from_dict`` round-trip
through JSON and ``sklearn.base.clone`` works.  Predictions are those of
:mod:`~torchcal.regression.predictive` for a target of shape (N,), (N, d1, ...) or (N, T);
missing targets are dropped by ``mask`` / ``ignore_value``
(:func:`~torchcal.regression.predictive.kept_rows`), so a fit on a dense layout equals the fit
on its kept elements flattened.  ``sample_weight`` has the target's shape (scikit-learn's
convention: an integer weight k counts an element k times, 0 drops it).  Predictions built from
NumPy arrays give predictions built from NumPy arrays (and NumPy values from ``cdf``); tensors
keep their dtype and device.

A fitted calibrator compares its criterion with the uncalibrated prediction's on its
validation data (and ``score`` on the data it is given) and warns with
:class:`~torchcal.errors.WorseThanIdentityWarning`, naming both numbers, when it is worse.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from .._validation import as_tensor, check_finite, check_scalar
from ..conformal.core import conformal_rank
from ..errors import InfiniteIntervalWarning, NotFittedError, WorseThanIdentityWarning
from ..posthoc import Estimator
from ._scores import pinball_values
from .predictive import Gaussian, Quantiles, Samples, kept_rows, like

__all__ = ["SigmaScaling", "IsotonicRecalibration", "QuantileRecalibration", "DEFAULT_LEVELS"]

#: The quantile levels ``0.05, 0.10, ..., 0.95`` (exact decimals ``k / 20``): the default
#: output of :class:`IsotonicRecalibration` and the levels of its pinball-loss criterion.
DEFAULT_LEVELS: tuple[float, ...] = tuple(k / 20 for k in range(1, 20))

#: Absolute margin (nats per element) by which :class:`SigmaScaling`'s NLL must exceed the
#: uncalibrated NLL before :class:`~torchcal.errors.WorseThanIdentityWarning` is raised (the
#: NLL's differences, unlike its values, do not depend on the target's unit).
NLL_MARGIN = 0.01
#: Relative margin by which a pinball loss must exceed the uncalibrated one before the warning
#: (as the classification calibrators' ``IDENTITY_MARGIN``).
IDENTITY_MARGIN = 0.01


# ----------------------------------------------------------------------------- helpers


def _float_list(value: Any, name: str, *, length: int | None = None, allow_none: bool = False,
                bounds: tuple[float, float] | None = None) -> list:
    """A JSON list of finite floats (None entries when ``allow_none``), validated."""
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"Expected `{name}` to be a list of numbers, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise ValueError(f"Expected `{name}` to have {length} entries, got {len(value)}")
    kw = {} if bounds is None else {"min_val": bounds[0], "max_val": bounds[1]}
    return [None if v is None and allow_none else check_scalar(v, f"{name}[{i}]", float, **kw)
            for i, v in enumerate(value)]


def _weights(sample_weight: Any, shape: torch.Size, keep: torch.Tensor | None,
             device: torch.device) -> torch.Tensor | None:
    """The kept elements' weights (float64, 1-D) or None; scikit-learn's convention."""
    if sample_weight is None:
        return None
    w = as_tensor(sample_weight, "sample_weight")
    if w.is_complex() or w.dtype == torch.bool:
        raise TypeError(f"Expected `sample_weight` to be real numbers, got {w.dtype}")
    if tuple(w.shape) != tuple(shape):
        raise ValueError(f"Expected `sample_weight` of the target's shape {tuple(shape)}, got "
                         f"{tuple(w.shape)}")
    w = w.detach().to(device=device, dtype=torch.float64)
    check_finite(w, "sample_weight")
    if bool((w < 0).any()):
        raise ValueError("Expected `sample_weight` to be >= 0, got negative weight(s)")
    w = w.reshape(-1) if keep is None else w[keep.to(device)]
    if not bool((w > 0).any()):
        raise ValueError("Expected `sample_weight` to have a positive weight on an observed "
                         "target, but every such weight is zero")
    return w


def _fit_rows(pred: Any, target: Any, sample_weight: Any, mask: Any, ignore_value: Any
              ) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
    """``(pred rows, y (M,), weights (M,) float64 or None)`` of the observed elements."""
    rows, y, keep = kept_rows(pred, target, mask=mask, ignore_value=ignore_value)
    ref = rows.mean if isinstance(rows, Gaussian) else rows.values
    w = _weights(sample_weight, pred.shape, keep, ref.device)
    return rows, y, w


def _wmean(x: torch.Tensor, w: torch.Tensor | None) -> float:
    """(Weighted) mean of a float64 vector as a Python float."""
    return float(x.mean() if w is None else (x * w).sum() / w.sum())


def _as_gaussian(pred: Any, what: str) -> Gaussian:
    if isinstance(pred, Samples):
        return pred.to_gaussian()
    if not isinstance(pred, Gaussian):
        raise TypeError(f"Expected `pred` of {what} to be a Gaussian or Samples, got "
                        f"{type(pred).__name__}")
    return pred


def _ref(pred: Any) -> Any:
    """The array the prediction was built from (NumPy in, NumPy out)."""
    return getattr(pred, "_ref", None)


def _check_positive_var(var: torch.Tensor) -> None:
    if bool((var <= 0).any()):
        raise ValueError(f"Expected `var` > 0 to calibrate a Gaussian, found "
                         f"{int((var <= 0).sum())} zero variance(s)")


def _check_levels_param(levels: Any, name: str = "levels") -> tuple[float, ...] | None:
    """None, or the levels as a tuple of floats (strictly increasing, in (0, 1))."""
    if levels is None:
        return None
    try:
        vals = [float(v) for v in np.asarray(levels, dtype=np.float64).reshape(-1)]
    except (TypeError, ValueError):
        raise TypeError(f"Expected `{name}` to be a sequence of numbers in (0, 1), got "
                        f"{type(levels).__name__}") from None
    if not vals or not all(0 < v < 1 for v in vals) or any(
            b <= a for a, b in zip(vals, vals[1:], strict=False)):
        raise ValueError(f"Expected `{name}` to be strictly increasing numbers in (0, 1), got "
                         f"{vals}")
    return tuple(vals)


def _level_fraction(level: float, dtype: torch.dtype) -> Fraction:
    """The decimal a level of ``dtype`` stands for (its shortest round-trip repr), exactly:
    0.9 as float32 or float64 is 9/10, so ``ceil((n + 1) tau)`` is never one too many."""
    np_type = np.float32 if dtype in (torch.float32, torch.float16, torch.bfloat16) \
        else np.float64
    return Fraction(np.format_float_positional(np_type(level), unique=True, trim="0"))


def _pinball(q: torch.Tensor, y: torch.Tensor, levels: torch.Tensor,
             w: torch.Tensor | None) -> float:
    """Mean pinball loss of quantiles ``q`` (M, Q) at ``levels`` (Q,) for ``y`` (M,)."""
    return _wmean(pinball_values(q, levels, y).mean(1), w)


def _quantile_calibration_error(q: torch.Tensor, y: torch.Tensor, levels: torch.Tensor,
                                w: torch.Tensor | None) -> float:
    """Mean over levels of ``|P_hat(y <= q_tau) - tau|`` (the quantile calibration error)."""
    # weighted (sample_weight), one-sided: quantile_calibration_error(kind="quantile")'s
    # per-level frequencies with weights
    hit = (y.double().unsqueeze(1) <= q.double()).double()
    freq = hit.mean(0) if w is None else (hit * w.unsqueeze(1)).sum(0) / w.sum()
    return float((freq - levels.double().to(freq.device)).abs().mean())


def _worse_check(name: str, criterion: str, calibrated: float, identity: float, where: str,
                 margin: float) -> None:
    """Warn when ``calibrated`` exceeds ``identity`` by more than ``margin`` (absolute)."""
    if calibrated > identity + margin or (math.isnan(calibrated) and not math.isnan(identity)):
        cause = ("it over-fits its validation set, or its fit failed" if where == "validation"
                 else "these data differ from its validation data, or it over-fits it")
        warnings.warn(
            f"{name}: the recalibrated {criterion} on the {where} data ({calibrated:.6g}) is "
            f"worse than the uncalibrated prediction's ({identity:.6g}): {cause}; fit it on "
            "more data drawn like these", WorseThanIdentityWarning, stacklevel=3)


def _check_dict_levels(d: dict, key: str) -> tuple[float, ...] | None:
    return None if d[key] is None else _check_levels_param(
        _float_list(d[key], f"d[{key!r}]"), f"d[{key!r}]")


# ----------------------------------------------------------------------------- estimators


class _RegressionEstimator(Estimator):
    """:class:`~torchcal.posthoc.Estimator` whose not-fitted message names ``fit(pred,
    target)``."""

    def _check_fitted(self) -> None:
        try:
            super()._check_fitted()
        except NotFittedError as err:
            raise type(err)(str(err).replace("fit(logits, labels)", "fit(pred, target)")) \
                from None


# ----------------------------------------------------------------------------- sigma scaling


class SigmaScaling(_RegressionEstimator):
    r"""σ scaling (Levi et al. 2022): one scalar ``s`` on the predicted standard deviations,
    ``var' = s^2 var``, minimising the validation Gaussian NLL.

    The NLL :math:`\frac{1}{2W}\sum_i w_i(\log 2\pi s^2\sigma_i^2 + (y_i-\mu_i)^2/(s^2\sigma_i^2))`
    is minimised in closed form at :math:`s^2 = \sum_i w_i (y_i-\mu_i)^2/\sigma_i^2 / \sum_i w_i`
    (its derivative in ``s^2`` vanishes there and nowhere else): the global minimiser, no
    search.  Means are unchanged.  An ensemble's :class:`~torchcal.regression.Samples` are
    moment-matched first (:meth:`~torchcal.regression.Samples.to_gaussian`).  Guarantee: on
    the validation data the NLL after scaling is never above the NLL before; on new data only
    if they are drawn like the validation data.

    Attributes:
        scale_ (float): the fitted ``s`` (a std multiplier; the variance is scaled by ``s^2``).
        nll_before_, nll_after_ (float): the validation NLL (float64, weighted) at ``s = 1``
            and at ``scale_``.

    Example:
        >>> g = Gaussian([0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0])
        >>> ss = SigmaScaling().fit(g, [2.0, -2.0, 2.0, -2.0])  # s^2 = mean(y^2 / var) = 4
        >>> ss.scale_
        2.0
        >>> ss.transform(g).var.tolist()
        [4.0, 4.0, 4.0, 4.0]
    """

    _fitted_attr = "scale_"

    def __init__(self) -> None:
        pass

    def fit(self, pred: Gaussian | Samples, target: Any, *, sample_weight: Any = None,
            mask: Any = None, ignore_value: Any = None) -> SigmaScaling:
        """Fit ``s`` on validation predictions and targets; returns ``self``.

        Args:
            pred: a :class:`~torchcal.regression.Gaussian` or
                :class:`~torchcal.regression.Samples` (moment-matched) with variances > 0.
            target: the targets, the prediction's shape ((N,), (N, d1, ...) or (N, T)).
            sample_weight: optional weights >= 0 of the target's shape.
            mask: optional boolean, True where the target is observed.
            ignore_value: optional number marking missing targets.
        """
        g = _as_gaussian(pred, "SigmaScaling")
        rows, y, w = _fit_rows(g, target, sample_weight, mask, ignore_value)
        mu, var = rows.mean.double(), rows.var.double()
        _check_positive_var(var)
        z2 = (y.double() - mu) ** 2 / var
        s2 = _wmean(z2, w)
        if not s2 > 0:
            raise ValueError("Expected at least one observed target away from its predicted "
                             "mean: every residual is 0, so the NLL has no minimiser s > 0")
        self.nll_before_ = self._nll(mu, var, y, w, 1.0)
        self.nll_after_ = self._nll(mu, var, y, w, s2)
        self.scale_ = math.sqrt(s2)
        _worse_check(type(self).__name__, "Gaussian NLL", self.nll_after_, self.nll_before_,
                     "validation", NLL_MARGIN)
        return self

    @staticmethod
    def _nll(mu: torch.Tensor, var: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None,
             s2: float) -> float:
        v = var * s2
        nll = 0.5 * (torch.log(2 * math.pi * v) + (y.double() - mu) ** 2 / v)
        return _wmean(nll, w)

    def transform(self, pred: Gaussian | Samples) -> Gaussian:
        """The recalibrated :class:`~torchcal.regression.Gaussian` (means unchanged, variances
        times ``scale_ ** 2``; of the prediction's shape, dtype and device, built from NumPy
        arrays when the prediction was; Samples are moment-matched)."""
        self._check_fitted()
        g = _as_gaussian(pred, "SigmaScaling")
        ref = _ref(pred)
        var = g.var * (self.scale_ ** 2)
        return Gaussian(like(g.mean, ref), like(var.to(g.mean.dtype), ref))

    def score(self, pred: Gaussian | Samples, target: Any, *, sample_weight: Any = None,
              mask: Any = None, ignore_value: Any = None) -> float:
        """The negative Gaussian NLL of the recalibrated prediction on these data (higher is
        better); warns (:class:`~torchcal.errors.WorseThanIdentityWarning`) when it is worse
        than the uncalibrated prediction's by more than ``NLL_MARGIN`` nats."""
        self._check_fitted()
        g = _as_gaussian(pred, "SigmaScaling")
        rows, y, w = _fit_rows(g, target, sample_weight, mask, ignore_value)
        mu, var = rows.mean.double(), rows.var.double()
        _check_positive_var(var)
        after = self._nll(mu, var, y, w, self.scale_ ** 2)
        before = self._nll(mu, var, y, w, 1.0)
        _worse_check(type(self).__name__, "Gaussian NLL", after, before, "scored (held-out)",
                     NLL_MARGIN)
        return -after

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (the fitted scale)."""
        self._check_fitted()
        return {**self._header(), "scale": float(self.scale_)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SigmaScaling:
        """Rebuild a fitted calibrator from :meth:`to_dict`'s output."""
        cls._check_dict(d, ("scale",))
        s = check_scalar(d["scale"], "d['scale']", float)
        if not s > 0:
            raise ValueError(f"Expected `d['scale']` to be > 0, got {s!r}")
        obj = cls()
        obj.scale_ = s
        return obj


# ----------------------------------------------------------------------------- isotonic


def _interp(x: torch.Tensor, xp: torch.Tensor, fp: torch.Tensor) -> torch.Tensor:
    """``np.interp``: piecewise-linear through (xp, fp) (xp strictly increasing), clipped."""
    x = x.to(xp.dtype)
    if xp.numel() == 1:
        return fp.expand(x.shape).clone()
    j = torch.searchsorted(xp, x.contiguous(), right=True).clamp(1, xp.numel() - 1)
    x0, x1, f0, f1 = xp[j - 1], xp[j], fp[j - 1], fp[j]
    t = ((x - x0) / (x1 - x0)).clamp(0.0, 1.0)
    return f0 + t * (f1 - f0)


class IsotonicRecalibration(_RegressionEstimator):
    """Isotonic recalibration of the predictive CDF (Kuleshov et al. 2018).

    Fit: the probability integral transforms ``p_i = F_i(y_i)`` of the validation data are
    mapped to their empirical frequencies ``P_hat(p_i) = sum_{j: p_j <= p_i} w_j / W`` by an
    isotonic map ``R``.  Because ``P_hat`` is already non-decreasing in ``p``, the
    pool-adjacent-violators fit makes no pools: ``R`` is the (weighted) empirical CDF of the
    ``p_i`` at their distinct values, linear in between and clipped outside (exactly
    scikit-learn's ``IsotonicRegression(out_of_bounds="clip")`` on those pairs; no scikit-learn
    is imported).  The recalibrated predictive has CDF ``R(F(y))`` (:meth:`cdf`) and quantiles
    ``F^{-1}(R^{-1}(tau))`` (:meth:`quantiles`), ``R^{-1}`` interpolated over the same knots.

    Guarantee (Kuleshov et al.): with exchangeable validation and test data the recalibrated
    predictive is calibrated in the limit of many validation points (``P(y <= q_tau) -> tau``);
    levels below the smallest or above the largest validation frequency are clipped to the
    extreme validation PIT values (no extrapolation).  Gaussians are used as given, an
    ensemble's :class:`~torchcal.regression.Samples` through their moment-matched Gaussian
    (:meth:`~torchcal.regression.Samples.to_gaussian`), not their step-shaped empirical CDF.

    Args:
        levels: the quantile levels :meth:`transform` returns and the validation pinball loss
            is averaged over (default :data:`DEFAULT_LEVELS`, ``0.05, 0.10, ..., 0.95``).

    Attributes:
        knots_x_ (torch.Tensor): the distinct validation PIT values (float64, increasing).
        knots_y_ (torch.Tensor): ``R`` at them (float64, strictly increasing, last 1).
        pinball_before_, pinball_after_ (float): validation pinball loss at the levels.
        calibration_error_before_, calibration_error_after_ (float): validation quantile
            calibration error at the levels.

    Example:
        >>> g = Gaussian([0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0])
        >>> iso = IsotonicRecalibration().fit(g, [-3.0, -1.0, 1.0, 3.0])
        >>> [round(v, 4) for v in iso.knots_x_.tolist()]  # F(y_i)
        [0.0013, 0.1587, 0.8413, 0.9987]
        >>> iso.knots_y_.tolist()  # their empirical frequencies
        [0.25, 0.5, 0.75, 1.0]
        >>> float(iso.cdf(g, [0.0])[0])  # F(0) = 0.5, halfway from 0.1587 to 0.8413
        0.625
    """

    _fitted_attr = "knots_x_"

    def __init__(self, levels: Any = None) -> None:
        _check_levels_param(levels)
        self.levels = levels

    def _levels(self) -> tuple[float, ...]:
        return _check_levels_param(self.levels) or DEFAULT_LEVELS

    def fit(self, pred: Gaussian | Samples, target: Any, *, sample_weight: Any = None,
            mask: Any = None, ignore_value: Any = None) -> IsotonicRecalibration:
        """Fit ``R`` on validation predictions and targets (arguments as
        :meth:`SigmaScaling.fit`); returns ``self``."""
        levels = self._levels()
        g = _as_gaussian(pred, "IsotonicRecalibration")
        rows, y, w = _fit_rows(g, target, sample_weight, mask, ignore_value)
        p = rows.cdf(y).double()
        wt = torch.ones_like(p) if w is None else w
        if w is not None:  # zero weights: no knot (the knots' frequencies stay increasing)
            p, wt = p[w > 0], w[w > 0]
        ps, order = torch.sort(p)
        cw = torch.cumsum(wt[order], 0)
        last = torch.ones_like(ps, dtype=torch.bool)
        last[:-1] = ps[1:] > ps[:-1]  # the last of each run of equal p: its ECDF value
        self.knots_x_ = ps[last]
        self.knots_y_ = cw[last] / cw[-1]
        lv = torch.tensor(levels, dtype=torch.float64, device=p.device)
        q0 = rows.quantiles(lv).values
        q1 = self._quantile_rows(rows, lv)
        self.pinball_before_ = _pinball(q0, y, lv, w)
        self.pinball_after_ = _pinball(q1, y, lv, w)
        self.calibration_error_before_ = _quantile_calibration_error(q0, y, lv, w)
        self.calibration_error_after_ = _quantile_calibration_error(q1, y, lv, w)
        _worse_check(type(self).__name__, "pinball loss", self.pinball_after_,
                     self.pinball_before_, "validation", IDENTITY_MARGIN * self.pinball_before_)
        return self

    def _knots(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return self.knots_x_.to(device), self.knots_y_.to(device)

    def _quantile_rows(self, g: Gaussian, lv: torch.Tensor) -> torch.Tensor:
        """``F^{-1}(R^{-1}(tau))`` of shape ``g.shape + (Q,)`` in ``g``'s dtype."""
        kx, ky = self._knots(g.mean.device)
        p = _interp(lv.double().to(kx.device), ky, kx)
        tiny = torch.finfo(torch.float64).tiny
        p = p.clamp(tiny, 1 - torch.finfo(torch.float64).eps)
        # ndtri, not sqrt(2) erfinv(2p - 1): 2p - 1 rounds to -1 (z = -inf) for p < 1e-16,
        # the PIT of a validation target more than ~8 std below its mean
        z = torch.special.ndtri(p)
        vals = g.mean.double().unsqueeze(-1) + g.std.double().unsqueeze(-1) * z
        return vals.to(g.mean.dtype)

    def cdf(self, pred: Gaussian | Samples, y: Any) -> Any:
        """The recalibrated CDF ``R(F(y))`` per element (``y`` broadcast against the
        prediction), in the prediction's dtype (NumPy when ``y`` is a NumPy array)."""
        self._check_fitted()
        g = _as_gaussian(pred, "IsotonicRecalibration")
        kx, ky = self._knots(g.mean.device)
        out = _interp(g.cdf(y).double(), kx, ky).to(g.mean.dtype)
        return like(out, y if isinstance(y, np.ndarray) else _ref(pred))

    def quantiles(self, pred: Gaussian | Samples, levels: Any = None) -> Quantiles:
        """The recalibrated :class:`~torchcal.regression.Quantiles` at ``levels`` (default the
        ``levels`` setting), shape ``pred.shape + (Q,)``."""
        self._check_fitted()
        g = _as_gaussian(pred, "IsotonicRecalibration")
        lv = _check_levels_param(levels) or self._levels()
        lt = torch.tensor(lv, dtype=torch.float64, device=g.mean.device)
        vals = self._quantile_rows(g, lt)
        # equal R^{-1} values at neighbouring levels are fine; rounding never crosses them
        return Quantiles(like(vals, _ref(pred)), lt.to(g.mean.dtype))

    def transform(self, pred: Gaussian | Samples, levels: Any = None) -> Quantiles:
        """:meth:`quantiles` (the recalibrated predictive as quantiles)."""
        return self.quantiles(pred, levels)

    def score(self, pred: Gaussian | Samples, target: Any, *, sample_weight: Any = None,
              mask: Any = None, ignore_value: Any = None) -> float:
        """The negative mean pinball loss of the recalibrated quantiles at the ``levels``
        setting on these data (higher is better); warns
        (:class:`~torchcal.errors.WorseThanIdentityWarning`) when it is worse than the
        uncalibrated quantiles' by more than 1 % (``IDENTITY_MARGIN``)."""
        self._check_fitted()
        g = _as_gaussian(pred, "IsotonicRecalibration")
        rows, y, w = _fit_rows(g, target, sample_weight, mask, ignore_value)
        lv = torch.tensor(self._levels(), dtype=torch.float64, device=y.device)
        before = _pinball(rows.quantiles(lv).values, y, lv, w)
        after = _pinball(self._quantile_rows(rows, lv), y, lv, w)
        _worse_check(type(self).__name__, "pinball loss", after, before, "scored (held-out)",
                     IDENTITY_MARGIN * before)
        return -after

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (the setting and the knots of ``R``)."""
        self._check_fitted()
        lv = _check_levels_param(self.levels)
        return {**self._header(), "levels": None if lv is None else list(lv),
                "knots_x": self.knots_x_.tolist(), "knots_y": self.knots_y_.tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IsotonicRecalibration:
        """Rebuild a fitted calibrator from :meth:`to_dict`'s output."""
        cls._check_dict(d, ("levels", "knots_x", "knots_y"))
        obj = cls(levels=_check_dict_levels(d, "levels"))
        kx = torch.tensor(_float_list(d["knots_x"], "d['knots_x']", bounds=(0.0, 1.0)),
                          dtype=torch.float64)
        ky = torch.tensor(_float_list(d["knots_y"], "d['knots_y']", length=kx.numel(),
                                     bounds=(0.0, 1.0)), dtype=torch.float64)
        if kx.numel() == 0 or bool((kx[1:] <= kx[:-1]).any()) or bool((ky[1:] <= ky[:-1]).any()):
            raise ValueError("Expected `d['knots_x']` and `d['knots_y']` to be non-empty and "
                             "strictly increasing")
        obj.knots_x_, obj.knots_y_ = kx, ky
        return obj


# ----------------------------------------------------------------------------- quantiles


def _conformal_shifts(scores: torch.Tensor, w: torch.Tensor | None, lv: torch.Tensor,
                      where: str) -> torch.Tensor:
    """Per column j of ``scores`` (M, Q): the ``k_j``-th smallest score (weight ``w_i`` counts
    score i ``w_i`` times), ``k_j = ceil((W + 1) tau_j)``; +inf (one warning) when
    ``k_j > W``.  Vectorised over the levels: one sort, one batched ``searchsorted``."""
    s, order = torch.sort(scores.double(), dim=0)
    if w is None:
        n = scores.shape[0]
        total = Fraction(n)
        ks = [conformal_rank(n, 1 - _level_fraction(t, lv.dtype)) for t in lv.tolist()]
        cw = torch.arange(1, n + 1, dtype=torch.float64, device=s.device).unsqueeze(1)
        cw = cw.expand(-1, s.shape[1])
    else:
        total = Fraction(float(w.sum()))
        ks = [math.ceil((total + 1) * _level_fraction(t, lv.dtype)) for t in lv.tolist()]
        cw = torch.cumsum(w[order], dim=0)
    k = torch.tensor([float(v) for v in ks], dtype=torch.float64, device=s.device)
    # the first sorted index whose cumulative weight reaches k (never a zero-weight score)
    idx = torch.searchsorted(cw.T.contiguous(), k.unsqueeze(1), right=False).squeeze(1)
    inf = k > float(total)
    out = s.gather(0, idx.clamp(max=s.shape[0] - 1).unsqueeze(0)).squeeze(0)
    out = torch.where(inf, torch.full_like(out, math.inf), out)
    if bool(inf.any()):
        bad = [round(t, 6) for t, b in zip(lv.tolist(), inf.tolist(), strict=True) if b]
        warnings.warn(
            f"{where}: n = {float(total):g} calibration point(s) are too few for the level(s) "
            f"{bad}: ceil((n + 1) tau) > n, so their shift is +inf (an infinite upper "
            "quantile); at least ceil(tau / (1 - tau)) points are needed",
            InfiniteIntervalWarning, stacklevel=3)
    return out


class QuantileRecalibration(_RegressionEstimator):
    """Per-quantile conformalised recalibration: each predicted quantile column is shifted by
    the conformal quantile of its one-sided scores (the idea of conformalized quantile
    regression, Romano et al. 2019, applied level by level).

    Fit: for level ``tau`` with validation quantiles ``q_tau(x_i)``, the shift ``c_tau`` is the
    ``k``-th smallest of the scores ``y_i - q_tau(x_i)``, ``k = ceil((n + 1) tau)``
    (:func:`~torchcal.conformal.core.conformal_rank`; with ``sample_weight`` an integer weight
    counts a score that many times and ``n`` is the total weight).  When ``k > n`` the shift is
    ``+inf`` with an :class:`~torchcal.errors.InfiniteIntervalWarning`.  Predict: ``q_tau +
    c_tau`` for every level.

    Guarantee: with exchangeable validation and test points, ``P(y <= q_tau + c_tau) >= tau``
    for every level, marginally (and ``<= tau + 1/(n + 1)`` without ties).  Non-crossing:
    shifted columns can cross where the predicted quantiles of neighbouring levels are closer
    than their shifts differ; each element's shifted quantiles are then sorted along the
    levels (the rearrangement of Chernozhukov et al. 2010), which leaves a row without
    crossings unchanged, so the per-level guarantee is untouched wherever no crossing occurs
    (``crossing_fraction_`` reports how often sorting changed a validation row).

    Input: :class:`~torchcal.regression.Quantiles`, or a
    :class:`~torchcal.regression.Gaussian` / :class:`~torchcal.regression.Samples` turned into
    quantiles at the ``levels`` setting (their ``quantiles`` method).

    Args:
        levels: the levels used for Gaussian or Samples input (required for those); with
            Quantiles input, if given, they must equal the prediction's levels.

    Attributes:
        levels_ (torch.Tensor): the fitted levels (float64).
        shifts_ (torch.Tensor): ``c_tau`` per level (float64, may hold +inf).
        crossing_fraction_ (float): share of validation elements whose shifted columns crossed.
        pinball_before_, pinball_after_ (float): the validation pinball loss before and after.
        calibration_error_before_, calibration_error_after_ (float): the validation quantile
            calibration error before and after.

    Example:
        >>> q = Quantiles([[0.0, 1.0]] * 9, levels=[0.1, 0.9])
        >>> y = [0.5 * i for i in range(9)]  # scores y - q_0.9: -1, -0.5, ..., 3
        >>> qr = QuantileRecalibration().fit(q, y)  # k = ceil(10 tau): 1 and 9
        >>> qr.shifts_.tolist()
        [0.0, 3.0]
    """

    _fitted_attr = "shifts_"

    def __init__(self, levels: Any = None) -> None:
        _check_levels_param(levels)
        self.levels = levels

    def _as_quantiles(self, pred: Any) -> Quantiles:
        lv = _check_levels_param(self.levels)
        if isinstance(pred, Quantiles):
            if lv is not None and (len(lv) != pred.levels.numel() or not bool(torch.allclose(
                    pred.levels.double().cpu(), torch.tensor(lv, dtype=torch.float64),
                    atol=1e-6))):
                raise ValueError(f"Expected the prediction's levels {pred.levels.tolist()} to "
                                 f"equal the `levels` setting {list(lv)}")
            return pred
        if isinstance(pred, (Gaussian, Samples)):
            if lv is None:
                raise ValueError("Expected the `levels` setting for a Gaussian or Samples "
                                 "prediction (the quantile levels to recalibrate), got None")
            return pred.quantiles(list(lv))
        raise TypeError(f"Expected `pred` to be Quantiles, Gaussian or Samples, got "
                        f"{type(pred).__name__}")

    def fit(self, pred: Quantiles | Gaussian | Samples, target: Any, *,
            sample_weight: Any = None, mask: Any = None, ignore_value: Any = None
            ) -> QuantileRecalibration:
        """Fit the shifts on validation predictions and targets (arguments as
        :meth:`SigmaScaling.fit`); returns ``self``."""
        q = self._as_quantiles(pred)
        rows, y, w = _fit_rows(q, target, sample_weight, mask, ignore_value)
        vals, lv = rows.values, rows.levels
        c = _conformal_shifts(y.double().unsqueeze(1) - vals.double(), w, lv,
                              type(self).__name__)
        self.levels_ = lv.double().cpu()
        self.shifts_ = c.cpu()
        shifted = vals.double() + c
        fixed = shifted.sort(-1).values
        self.crossing_fraction_ = float((fixed != shifted).any(-1).double().mean()) \
            if bool(torch.isfinite(shifted).all()) else 0.0
        # the criteria on the levels with a finite shift (an infinite one is warned already)
        fin = torch.isfinite(c).to(vals.device)
        if not bool(fin.any()):
            self.pinball_before_ = self.pinball_after_ = math.nan
            self.calibration_error_before_ = self.calibration_error_after_ = math.nan
            return self
        vals, fixed, lv = vals[:, fin], fixed[:, fin], lv[fin]
        self.pinball_before_ = _pinball(vals, y, lv, w)
        self.pinball_after_ = _pinball(fixed, y, lv, w)
        self.calibration_error_before_ = _quantile_calibration_error(vals, y, lv, w)
        self.calibration_error_after_ = _quantile_calibration_error(fixed, y, lv, w)
        _worse_check(type(self).__name__, "pinball loss", self.pinball_after_,
                     self.pinball_before_, "validation", IDENTITY_MARGIN * self.pinball_before_)
        return self

    def _shifted(self, q: Quantiles) -> torch.Tensor:
        if q.levels.numel() != self.levels_.numel() or not bool(torch.allclose(
                q.levels.double().cpu(), self.levels_, atol=1e-6)):
            raise ValueError(f"Expected the prediction's levels {q.levels.tolist()} to equal the "
                             f"fitted levels {self.levels_.tolist()}")
        c = self.shifts_.to(device=q.values.device, dtype=q.values.dtype)
        return (q.values + c).sort(-1).values

    def transform(self, pred: Quantiles | Gaussian | Samples) -> Quantiles:
        """The recalibrated :class:`~torchcal.regression.Quantiles` (the prediction's shape,
        dtype and device; each element's columns sorted along the levels).  A level whose
        shift is +inf (too few validation points, warned at fit) gives +inf values there."""
        self._check_fitted()
        q = self._as_quantiles(pred)
        vals = self._shifted(q)
        if bool(torch.isfinite(vals).all()):
            return Quantiles(like(vals, _ref(q)), q.levels)
        out = Quantiles.__new__(Quantiles)  # +inf upper quantiles (too few points), warned
        out.values, out.levels, out._ref = vals, q.levels, like(vals, _ref(q))
        return out

    def score(self, pred: Quantiles | Gaussian | Samples, target: Any, *,
              sample_weight: Any = None, mask: Any = None, ignore_value: Any = None) -> float:
        """The negative mean pinball loss of the recalibrated quantiles on these data (higher
        is better; over the levels with a finite shift, ``-inf`` when none has one); warns (:class:`~torchcal.errors.WorseThanIdentityWarning`) when it is
        worse than the uncalibrated quantiles' by more than 1 % (``IDENTITY_MARGIN``)."""
        self._check_fitted()
        q = self._as_quantiles(pred)
        rows, y, w = _fit_rows(q, target, sample_weight, mask, ignore_value)
        fin = torch.isfinite(self.shifts_).to(y.device)
        if not bool(fin.any()):
            return -math.inf
        before = _pinball(rows.values[:, fin], y, rows.levels[fin], w)
        after = _pinball(self._shifted(rows)[:, fin], y, rows.levels[fin], w)
        _worse_check(type(self).__name__, "pinball loss", after, before, "scored (held-out)",
                     IDENTITY_MARGIN * before)
        return -after

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (``+inf`` shifts are written as None)."""
        self._check_fitted()
        lv = _check_levels_param(self.levels)
        return {**self._header(), "levels": None if lv is None else list(lv),
                "fitted_levels": self.levels_.tolist(),
                "shifts": [None if math.isinf(v) else v for v in self.shifts_.tolist()]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuantileRecalibration:
        """Rebuild a fitted calibrator from :meth:`to_dict`'s output."""
        cls._check_dict(d, ("levels", "fitted_levels", "shifts"))
        obj = cls(levels=_check_dict_levels(d, "levels"))
        lv = _check_levels_param(_float_list(d["fitted_levels"], "d['fitted_levels']"),
                                 "d['fitted_levels']")
        sh = _float_list(d["shifts"], "d['shifts']", length=len(lv), allow_none=True)
        obj.levels_ = torch.tensor(lv, dtype=torch.float64)
        obj.shifts_ = torch.tensor([math.inf if v is None else v for v in sh],
                                   dtype=torch.float64)
        return obj
