"""Regression metrics on any :mod:`~torchcal.regression.predictive` prediction.

Every metric takes ``(pred, target, *, mask=None, ignore_value=None)``, drops missing targets
with :func:`~torchcal.regression.predictive.kept_rows` (so a dense (N, d1, ...) or (N, T)
target with a mask gives the metric of its kept elements, flattened) and returns a 0-d float64
tensor on the input's device (:func:`calibration_curve` two 1-D ones, :func:`sharpness` needs
no target).  The streaming :class:`~torchcal.regression.RegressionMeter` adds up the same
per-element numbers.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .._validation import as_tensor, check_alpha, check_positive_int
from ._scores import (
    area_between,
    calibration_grid,
    calibration_hits,
    check_std_range,
    crps_elements,
    ence_bin_index,
    ence_from_sums,
    gaussian_rows,
    interval_bounds,
    interval_elements,
    kind_of,
    pinball_elements,
    std_bin_sums,
    uce_from_sums,
    width_bin_index,
)
from .predictive import Gaussian, Quantiles, Samples, as_float, flat_values, kept_rows

__all__ = [
    "gaussian_nll",
    "crps",
    "pinball_loss",
    "interval_coverage",
    "interval_width",
    "interval_score",
    "ence",
    "uce",
    "calibration_curve",
    "quantile_calibration_error",
    "sharpness",
]

_LOG_2PI = math.log(2 * math.pi)


def gaussian_nll(pred: Gaussian, target: Any, *, mask: Any = None, ignore_value: Any = None,
                 full: bool = True) -> torch.Tensor:
    r"""Mean Gaussian negative log-likelihood
    :math:`\frac{1}{n}\sum_i \tfrac12\left(\log 2\pi\sigma_i^2 + (y_i-\mu_i)^2/\sigma_i^2\right)`
    over the observed elements (``full=False`` drops the constant ``log(2 pi) / 2``, as
    ``torch.nn.functional.gaussian_nll_loss``'s default does).

    A zero variance is refused (its NLL is infinite or undefined).

    >>> g = Gaussian(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 4.0]))
    >>> float(gaussian_nll(g, torch.tensor([1.0, 2.0]), full=False))  # (0.5 + (log 4 + 1)/2)/2
    0.8465735902799727
    """
    if not isinstance(pred, Gaussian):
        raise TypeError(f"Expected `pred` to be a Gaussian, got {type(pred).__name__}")
    g, y, _ = kept_rows(pred, target, mask=mask, ignore_value=ignore_value)
    mu, var = g.mean.double(), g.var.double()
    if bool((var <= 0).any()):
        raise ValueError(f"Expected `var` > 0 for a Gaussian NLL, found {int((var <= 0).sum())} "
                         "zero variance(s)")
    nll = 0.5 * (torch.log(var) + (y.double() - mu) ** 2 / var)
    return nll.mean() + (0.5 * _LOG_2PI if full else 0.0)


def _as_pair(pred: Any) -> tuple[Any, Any] | None:
    if isinstance(pred, (tuple, list)) and len(pred) == 2:
        return pred[0], pred[1]
    return None


def _interval_rows(pred: Any, target: Any, alpha: Any, mask: Any, ignore_value: Any
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kept (lower, upper, y) of an interval pair or of a prediction's central interval."""
    pair = _as_pair(pred)
    if pair is None:
        if kind_of(pred) == "point":
            raise TypeError("Expected `pred` to be a (lower, upper) pair or a Gaussian, "
                            f"Quantiles or Samples prediction, got {type(pred).__name__}")
        rows, y, _ = kept_rows(pred, target, mask=mask, ignore_value=ignore_value)
        lo, hi = interval_bounds(rows, alpha)
        return lo, hi, y.double()
    lower, upper = as_float(pair[0], "lower"), as_float(pair[1], "upper")
    if lower.shape != upper.shape:
        raise ValueError(f"Expected `upper` to have the shape of `lower` {tuple(lower.shape)}, "
                         f"got {tuple(upper.shape)}")
    lo, y, keep = kept_rows(lower, target, mask=mask, ignore_value=ignore_value)
    hi = flat_values(upper).to(lo.device)
    hi = hi.reshape(-1) if keep is None else hi[keep]
    if bool((lo > hi).any()):
        raise ValueError(f"Expected `lower` <= `upper`, found {int((lo > hi).sum())} "
                         "element(s) with lower > upper")
    return lo.double(), hi.double(), y.double()


def crps(pred: Any, target: Any, *, mask: Any = None, ignore_value: Any = None,
         fair: bool = False) -> torch.Tensor:
    r"""Mean continuous ranked probability score
    :math:`\int (F(x) - 1\{x \ge y\})^2\,dx` over the observed elements (lower is better).

    * :class:`~torchcal.regression.Gaussian`: the closed form of Gneiting & Raftery (2007),
      :math:`\sigma\,[z(2\Phi(z) - 1) + 2\varphi(z) - 1/\sqrt\pi]`, ``z = (y - mu) / sigma``
      (the absolute error where ``sigma = 0``).
    * :class:`~torchcal.regression.Samples`: the energy form of the members' empirical
      distribution, :math:`E|X - y| - \tfrac12 E|X - X'|` (properscoring's
      ``crps_ensemble``); ``fair=True`` divides the pair sum by ``S (S - 1)`` instead of
      ``S^2`` (the unbiased "fair" CRPS of Ferro 2014, scoringrules' ``estimator="fair"``).
      The pair term is computed by sorting, ``sum_{i,j} |x_i - x_j| = 2 sum_i (2i - S - 1)
      x_(i)``: O(S log S) per element, not O(S^2).
    * :class:`~torchcal.regression.Quantiles`: the approximation ``2 * mean over levels of
      the pinball loss``: CRPS equals :math:`2\int_0^1 \rho_\tau(y - q_\tau)\,d\tau`, so this
      is exact in the limit of many evenly spread levels and a quadrature of it otherwise (it
      is not a proper CRPS of any one distribution for few levels).
    * a point prediction: the absolute error (the CRPS of a point mass).

    >>> float(crps(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0])))  # (1 + 2) / 2
    1.5
    >>> round(float(crps(Gaussian([0.0], [1.0]), [0.0])), 6)  # 2 phi(0) - 1/sqrt(pi)
    0.233695
    """
    rows, y, _ = kept_rows(pred, target, mask=mask, ignore_value=ignore_value)
    if fair and kind_of(rows) != "samples":
        raise ValueError("Expected `fair=True` only with Samples (the fair ensemble CRPS), "
                         f"got {type(pred).__name__}")
    return crps_elements(rows, y, fair=fair).mean()


def pinball_loss(pred: Quantiles, target: Any, *, mask: Any = None, ignore_value: Any = None,
                 per_level: bool = False) -> torch.Tensor:
    r"""Mean pinball (quantile) loss :math:`\rho_\tau(y - q) = \max(\tau (y - q), (\tau - 1)
    (y - q))` over the levels and the observed elements; ``per_level=True`` gives the (Q,)
    mean per level instead.

    >>> q = Quantiles([[1.0, 2.0]], levels=[0.1, 0.9])
    >>> pinball_loss(q, [3.0], per_level=True).tolist()  # 0.1 * 2, 0.9 * 1
    [0.2, 0.9]
    """
    if not isinstance(pred, Quantiles):
        raise TypeError(f"Expected `pred` to be Quantiles, got {type(pred).__name__}")
    rows, y, _ = kept_rows(pred, target, mask=mask, ignore_value=ignore_value)
    per = pinball_elements(rows, y)
    return per.mean(0) if per_level else per.mean()


def interval_coverage(pred: Any, target: Any, *, alpha: float | None = None, mask: Any = None,
                      ignore_value: Any = None) -> torch.Tensor:
    """Prediction-interval coverage probability (PICP): the share of observed targets with
    ``lower <= y <= upper``.

    Args:
        pred: a ``(lower, upper)`` pair of the target's shape, or a Gaussian, Quantiles
            (with the ``alpha/2`` and ``1 - alpha/2`` levels) or Samples (their empirical
            ``alpha/2`` and ``1 - alpha/2`` quantiles, ``torch.quantile``'s interpolation),
            whose central ``1 - alpha`` interval is used.
        target: the targets.
        alpha: the miscoverage in (0, 1) of a prediction's central interval (ignored for a
            pair).
        mask: optional boolean, True where the target is observed.
        ignore_value: optional value marking missing targets.

    >>> float(interval_coverage(([0.0, 0.0], [1.0, 1.0]), [0.5, 2.0]))
    0.5
    """
    lo, hi, y = _interval_rows(pred, target, alpha, mask, ignore_value)
    return interval_elements(lo, hi, y, None)["covered"].mean()


def interval_width(pred: Any, target: Any, *, alpha: float | None = None, mask: Any = None,
                   ignore_value: Any = None) -> torch.Tensor:
    """Mean prediction-interval width (MPIW) ``upper - lower`` over the observed elements
    (arguments as :func:`interval_coverage`; the target only selects the observed elements).

    >>> float(interval_width(([0.0, 0.0], [1.0, 3.0]), [0.5, 2.0]))
    2.0
    """
    lo, hi, y = _interval_rows(pred, target, alpha, mask, ignore_value)
    return interval_elements(lo, hi, y, None)["width"].mean()


def interval_score(pred: Any, target: Any, *, alpha: float, mask: Any = None,
                   ignore_value: Any = None) -> torch.Tensor:
    r"""Mean interval (Winkler) score of Gneiting & Raftery (2007) for a central ``1 - alpha``
    interval: :math:`(u - l) + \tfrac{2}{\alpha}(l - y)1\{y < l\} + \tfrac{2}{\alpha}(y - u)
    1\{y > u\}` (lower is better; proper for the ``alpha/2`` and ``1 - alpha/2`` quantiles).

    ``alpha`` is required, also for a ``(lower, upper)`` pair (arguments as
    :func:`interval_coverage`).

    >>> float(interval_score(([0.0], [1.0]), [2.0], alpha=0.5))  # 1 + (2 / 0.5) * 1
    5.0
    """
    a = check_alpha(alpha)
    lo, hi, y = _interval_rows(pred, target, a, mask, ignore_value)
    return interval_elements(lo, hi, y, a)["score"].mean()


def ence(pred: Any, target: Any, *, n_bins: int = 10, std_range: Any = None, mask: Any = None,
         ignore_value: Any = None) -> torch.Tensor:
    r"""Expected normalised calibration error (Levi et al. 2022):
    :math:`\frac1B\sum_b |\mathrm{RMV}_b - \mathrm{RMSE}_b| / \mathrm{RMV}_b`, with
    :math:`\mathrm{RMV}_b = \sqrt{\mathrm{mean}_b\,\sigma^2}` and
    :math:`\mathrm{RMSE}_b = \sqrt{\mathrm{mean}_b (y - \mu)^2}` over the elements of bin b.

    Bins (``std_range=None``): equal-mass bins of the predicted std, the house convention of
    :func:`~torchcal.metrics.binning.equal_mass_bin_index` (sorted std split into B runs of
    ``floor((k+1) n/B) - floor(k n/B)`` elements; tied stds stay in one bin).  With
    ``std_range=(lo, hi)``: B equal-width bins of ``log std`` over ``[log lo, log hi]``
    (values outside in the end bins), the fixed bins of
    :class:`~torchcal.regression.RegressionMeter`.  Empty bins are left out of the
    mean.  uncertainty-toolbox has no ENCE; this follows Levi et al.'s formula.

    Args:
        pred: a :class:`~torchcal.regression.Gaussian` (variances > 0) or
            :class:`~torchcal.regression.Samples` (moment-matched).
        target: the targets.
        n_bins: B.
        std_range: None (equal-mass) or ``(lo, hi)`` for fixed log-std bins.
        mask: optional boolean, True where the target is observed.
        ignore_value: optional value marking missing targets.

    >>> g = Gaussian([0.0, 0.0], [1.0, 4.0])
    >>> float(ence(g, [2.0, 1.0], n_bins=2))  # (|1 - 2| / 1 + |2 - 1| / 2) / 2
    0.75
    """
    b = check_positive_int(n_bins, "n_bins")
    var, sq = gaussian_rows(pred, target, mask, ignore_value, "ENCE")
    return ence_from_sums(std_bin_sums(ence_bin_index(var, b, std_range), var, sq, b))


def uce(pred: Any, target: Any, *, n_bins: int = 10, std_range: Any = None, mask: Any = None,
        ignore_value: Any = None) -> torch.Tensor:
    r"""Uncertainty calibration error (Laves et al. 2020):
    :math:`\sum_b \frac{n_b}{n} |\mathrm{MV}_b - \mathrm{MSE}_b|` (mean variance against mean
    squared error per bin).

    Bins (``std_range=None``): B equal-width bins of the predicted variance over
    ``[min var, max var]``, right-closed with the minimum in the first bin (Laves et al.'s
    code leaves the minimum itself out of every bin); with ``std_range=(lo, hi)`` the fixed
    log-std bins of :func:`ence`.  Arguments as :func:`ence`.

    >>> g = Gaussian([0.0, 0.0], [1.0, 4.0])
    >>> float(uce(g, [2.0, 1.0], n_bins=2))  # (|1 - 4| + |4 - 1|) / 2
    3.0
    """
    b = check_positive_int(n_bins, "n_bins")
    var, sq = gaussian_rows(pred, target, mask, ignore_value, "UCE")
    if std_range is None:
        idx = width_bin_index(var, float(var.min()), float(var.max()), b)
    else:
        lo, hi = check_std_range(std_range)
        idx = width_bin_index(0.5 * var.log(), math.log(lo), math.log(hi), b)
    return uce_from_sums(std_bin_sums(idx, var, sq, b))


def calibration_curve(pred: Any, target: Any, levels: Any = None, *, kind: str = "interval",
                      mask: Any = None, ignore_value: Any = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Expected against observed proportions of a regression prediction (float64 (L,) each).

    ``kind="interval"`` (uncertainty-toolbox's default ``prop_type``): the share of observed
    targets inside the central interval ``[q_{(1-p)/2}, q_{(1+p)/2}]`` per expected proportion
    p.  ``kind="quantile"``: the share with ``y <= q_p``.  uncertainty-toolbox's
    ``get_proportion_lists_vectorized`` counts ``(mu - y) / sigma <= Phi^-1(p)`` for its
    ``"quantile"`` variant, i.e. ``y >= q_{1-p}``: its curve is this one reflected
    (``1 - observed`` at ``1 - p``), and on a grid symmetric about 1/2 (its own) the
    calibration errors of :func:`quantile_calibration_error` are the same.

    Args:
        pred: a :class:`~torchcal.regression.Gaussian`,
            :class:`~torchcal.regression.Quantiles` or :class:`~torchcal.regression.Samples`.
        target: the targets.
        levels: the expected proportions in [0, 1], increasing.  Default: uncertainty-toolbox's
            ``linspace(0, 1, 100)`` for a Gaussian or samples (a Gaussian's quantiles are
            -inf / +inf at 0 / 1; samples' are their min / max); for quantiles the predicted
            levels (``"quantile"``) or the central intervals of their symmetric pairs
            (``"interval"``); given levels must then be predicted ones.
        kind: ``"interval"`` or ``"quantile"``.
        mask: optional boolean, True where the target is observed.
        ignore_value: optional value marking missing targets.

    >>> g = Gaussian([0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0])
    >>> calibration_curve(g, [-2.0, -0.5, 0.5, 2.0], [0.5, 0.9], kind="interval")[1].tolist()
    [0.5, 0.5]
    """
    rows, y, _ = kept_rows(pred, target, mask=mask, ignore_value=ignore_value)
    if kind_of(rows) == "point":
        raise TypeError("Expected `pred` to be a Gaussian, Quantiles or Samples for a "
                        f"calibration curve, got {type(pred).__name__}")
    expected = calibration_grid(rows, levels, kind)
    dev = y.device
    hits = calibration_hits(rows, y, expected.to(dev), kind)
    return expected.to(dev), hits / y.numel()


def quantile_calibration_error(pred: Any, target: Any, levels: Any = None, *,
                               kind: str = "interval", norm: str = "l1", mask: Any = None,
                               ignore_value: Any = None) -> torch.Tensor:
    """Calibration error of the :func:`calibration_curve` (arguments as there).

    ``norm="l1"``: the mean absolute difference of observed and expected proportions
    (uncertainty-toolbox's ``mean_absolute_calibration_error``); ``"l2"``: the root mean
    squared one (``root_mean_squared_calibration_error``); ``"area"``: the area between the
    piecewise-linear curve and the diagonal, crossings included (``miscalibration_area``).
    0 for a perfectly calibrated prediction.

    >>> g = Gaussian([0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0])
    >>> float(quantile_calibration_error(g, [-2.0, -0.5, 0.5, 2.0], [0.5, 0.9]))
    0.2
    """
    if norm not in ("l1", "l2", "area"):
        raise ValueError(f"Expected `norm` to be 'l1', 'l2' or 'area', got {norm!r}")
    expected, observed = calibration_curve(pred, target, levels, kind=kind, mask=mask,
                                           ignore_value=ignore_value)
    if norm == "l1":
        return (observed - expected).abs().mean()
    if norm == "l2":
        return (observed - expected).square().mean().sqrt()
    return area_between(expected, observed)


def sharpness(pred: Any, *, mask: Any = None) -> torch.Tensor:
    """Sharpness: the root mean predicted variance ``sqrt(mean sigma^2)`` (uncertainty-toolbox's
    ``sharpness``; lower is sharper) of a :class:`~torchcal.regression.Gaussian` or
    :class:`~torchcal.regression.Samples` (their ``ddof=0`` variance), over the elements where
    the optional boolean ``mask`` (the target's shape) is True.

    >>> float(sharpness(Gaussian([0.0, 0.0], [1.0, 7.0])))
    2.0
    """
    if not isinstance(pred, (Gaussian, Samples)):
        raise TypeError(f"Expected `pred` to be a Gaussian or Samples, got {type(pred).__name__}")
    var = pred.var.double()
    if mask is not None:
        m = as_tensor(mask, "mask")
        if m.dtype != torch.bool or m.shape != var.shape:
            raise ValueError(f"Expected `mask` to be a boolean of the target's shape "
                             f"{tuple(var.shape)}, got {m.dtype} {tuple(m.shape)}")
        var = var[m.to(var.device)]
        if var.numel() == 0:
            raise ValueError("Expected `mask` to keep at least one element, got none")
    return var.mean().sqrt()
