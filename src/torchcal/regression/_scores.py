"""Element-wise scores and sums shared by :mod:`~torchcal.regression.metrics` and
:mod:`~torchcal.regression.meter` (so that the functions and the streaming meter add up the
same float64 numbers).  Every helper takes the kept rows of
:func:`~torchcal.regression.predictive.kept_rows` (1-D targets) and works in float64.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .._validation import check_alpha
from ..metrics.binning import equal_mass_bin_index
from .predictive import Gaussian, Quantiles, Samples, as_float, kept_rows

__all__ = [
    "PREDICTION_KINDS",
    "kind_of",
    "crps_elements",
    "pinball_elements",
    "pinball_values",
    "interval_bounds",
    "interval_elements",
    "quantile_values",
    "calibration_grid",
    "calibration_hits",
    "area_between",
    "normal_ppf",
    "check_std_range",
    "width_bin_index",
    "std_bin_sums",
    "ence_from_sums",
    "uce_from_sums",
    "gaussian_rows",
    "ence_bin_index",
]

#: The prediction kinds, as :func:`kind_of` names them.
PREDICTION_KINDS = ("point", "gaussian", "quantiles", "samples")

_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def kind_of(pred: Any) -> str:
    """``"gaussian"``, ``"quantiles"``, ``"samples"`` or ``"point"`` (anything else)."""
    if isinstance(pred, Gaussian):
        return "gaussian"
    if isinstance(pred, Quantiles):
        return "quantiles"
    if isinstance(pred, Samples):
        return "samples"
    return "point"


def normal_ppf(p: torch.Tensor) -> torch.Tensor:
    """The standard normal quantile of ``p`` in [0, 1] (``-inf`` at 0, ``+inf`` at 1)."""
    return torch.special.ndtri(p)  # not sqrt(2) erfinv(2p - 1): -inf for p < 1e-16


def _crps_gaussian(g: Gaussian, y: torch.Tensor) -> torch.Tensor:
    mu, sd = g.mean.double(), g.var.double().sqrt()
    err = y - mu
    safe = torch.where(sd > 0, sd, torch.ones_like(sd))
    z = err / safe
    pdf = torch.exp(-0.5 * z * z) * _INV_SQRT_2PI
    cdf = 0.5 * torch.erfc(-z / math.sqrt(2.0))
    closed = safe * (z * (2 * cdf - 1) + 2 * pdf - _INV_SQRT_PI)
    return torch.where(sd > 0, closed, err.abs())


def _crps_samples(s: Samples, y: torch.Tensor, fair: bool) -> torch.Tensor:
    x = s.values.double()  # (S, M)
    n = x.shape[0]
    first = (x - y).abs().mean(0)
    xs = x.sort(0).values
    # sum_{i,j} |x_i - x_j| = 2 sum_i (2i - S - 1) x_(i), i = 1..S: O(S log S), not O(S^2)
    w = (2 * torch.arange(1, n + 1, dtype=x.dtype, device=x.device) - n - 1).unsqueeze(1)
    pair_sum = 2 * (w * xs).sum(0)
    denom = n * (n - 1) if fair else n * n
    return first - 0.5 * pair_sum / denom


def crps_elements(rows: Any, y: torch.Tensor, *, fair: bool = False) -> torch.Tensor:
    """Per-element CRPS (float64, shape (M,)) of kept rows; see
    :func:`~torchcal.regression.crps`."""
    y = y.double()
    kind = kind_of(rows)
    if kind == "gaussian":
        return _crps_gaussian(rows, y)
    if kind == "samples":
        return _crps_samples(rows, y, fair)
    if kind == "quantiles":
        return 2 * pinball_elements(rows, y).mean(1)
    return (y - rows.double()).abs()


def pinball_elements(q: Quantiles, y: torch.Tensor) -> torch.Tensor:
    """Per-(element, level) pinball loss ``max(tau (y - q), (tau - 1)(y - q))``, (M, Q)."""
    return pinball_values(q.values, q.levels, y)


def pinball_values(values: torch.Tensor, levels: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """:func:`pinball_elements` of quantile values (M, Q) at ``levels`` (Q,), float64 (M, Q)."""
    diff = y.double().unsqueeze(1) - values.double()
    tau = levels.double().to(diff.device)
    return torch.maximum(tau * diff, (tau - 1) * diff)


def interval_bounds(rows: Any, alpha: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The central ``1 - alpha`` interval of kept rows (a (lower, upper) pair passes through)."""
    kind = kind_of(rows)
    if kind == "point":
        lo, hi = rows
        return lo.double(), hi.double()
    if alpha is None:
        raise ValueError(f"Expected `alpha` (the miscoverage of the central interval) for a "
                         f"{type(rows).__name__} prediction, got None")
    a = check_alpha(alpha)
    if kind == "samples":
        lv = torch.tensor([a / 2, 1 - a / 2], dtype=torch.float64, device=rows.values.device)
        qv = torch.quantile(rows.values.double(), lv, dim=0)
        return qv[0], qv[1]
    lo, hi = rows.interval(a)
    return lo.double(), hi.double()


def interval_elements(lo: torch.Tensor, hi: torch.Tensor, y: torch.Tensor,
                      alpha: float | None) -> dict[str, torch.Tensor]:
    """Per-element coverage (0/1), width and (with ``alpha``) interval score, float64."""
    y = y.double()
    out = {"covered": ((lo <= y) & (y <= hi)).double(), "width": hi - lo}
    if alpha is not None:
        a = check_alpha(alpha)
        out["score"] = (hi - lo) + (2 / a) * ((lo - y).clamp_min(0) + (y - hi).clamp_min(0))
    return out


def calibration_grid(rows: Any, levels: Any, kind: str) -> torch.Tensor:
    """The expected proportions (float64): ``levels`` checked in [0, 1] and increasing, or the
    default - uncertainty-toolbox's ``linspace(0, 1, 100)`` for a Gaussian or samples, the
    predicted levels (``"quantile"``) or the central intervals they hold (``"interval"``) for
    :class:`~torchcal.regression.predictive.Quantiles`."""
    if kind not in ("interval", "quantile"):
        raise ValueError(f"Expected `kind` to be 'interval' or 'quantile', got {kind!r}")
    if isinstance(rows, Quantiles) and levels is None:
        lv = rows.levels.double().cpu()
        if kind == "quantile":
            return lv
        low = lv[lv < 0.5]
        pairs = [float(1 - 2 * t) for t in low.tolist() if bool(((lv - (1 - t)).abs()
                                                                   <= 1e-9).any())]
        if not pairs:
            raise ValueError(f"Expected the predicted levels {lv.tolist()} to hold at least "
                             "one symmetric pair (tau, 1 - tau) for kind='interval'")
        return torch.tensor(sorted(pairs), dtype=torch.float64)
    if levels is None:
        return torch.linspace(0, 1, 100, dtype=torch.float64)
    lv = as_float(levels, "levels").double().reshape(-1).cpu()
    if lv.numel() == 0 or not bool(((lv >= 0) & (lv <= 1)).all()):
        raise ValueError(f"Expected `levels` to be a non-empty set of proportions in [0, 1], "
                         f"got {lv.tolist()}")
    if lv.numel() > 1 and not bool((lv[1:] > lv[:-1]).all()):
        raise ValueError(f"Expected `levels` to be strictly increasing, got {lv.tolist()}")
    return lv


def quantile_values(rows: Any, levels: torch.Tensor) -> torch.Tensor:
    """The predicted ``levels``-quantiles of kept rows, float64 (M, L): a Gaussian's exact
    quantiles (+-inf at 0 and 1), samples' ``torch.quantile`` (linear interpolation; min and
    max at 0 and 1), or the columns of predicted quantiles (each level must be predicted)."""
    kind = kind_of(rows)
    if kind == "gaussian":
        lv = levels.to(rows.mean.device)
        return (rows.mean.double().unsqueeze(1)
                + rows.var.double().sqrt().unsqueeze(1) * normal_ppf(lv))
    if kind == "samples":
        lv = levels.to(rows.values.device)
        return torch.quantile(rows.values.double(), lv, dim=0).T
    if kind == "quantiles":
        return torch.stack([rows.column(float(t)) for t in levels.tolist()], 1).double()
    raise TypeError("Expected `pred` to be a Gaussian, Quantiles or Samples for a calibration "
                    f"curve, got {type(rows).__name__}")


def calibration_hits(rows: Any, y: torch.Tensor, expected: torch.Tensor,
                     kind: str) -> torch.Tensor:
    """Per expected proportion, the number of kept targets inside the central interval
    (``"interval"``: ``q_{(1-p)/2} <= y <= q_{(1+p)/2}``) or below the quantile
    (``"quantile"``: ``y <= q_p``), float64 (L,)."""
    y = y.double().unsqueeze(1)
    if kind == "quantile":
        return (y <= quantile_values(rows, expected)).sum(0).double()
    if isinstance(rows, Quantiles):
        lo = quantile_values(rows, (1 - expected) / 2)
        hi = quantile_values(rows, (1 + expected) / 2)
    else:
        both = quantile_values(rows, torch.cat([0.5 - expected / 2, 0.5 + expected / 2]))
        lo, hi = both[:, :expected.numel()], both[:, expected.numel():]
    return ((lo <= y) & (y <= hi)).sum(0).double()


def area_between(expected: torch.Tensor, observed: torch.Tensor) -> torch.Tensor:
    """The area between the piecewise-linear curve (expected, observed) and the diagonal:
    ``integral |observed - expected|`` exactly, crossings included (uncertainty-toolbox's
    ``miscalibration_area_from_proportions``)."""
    d = observed - expected
    d0, d1, h = d[:-1], d[1:], expected[1:] - expected[:-1]
    same = d0 * d1 >= 0
    denom = torch.where(same, torch.ones_like(d0), d0.abs() + d1.abs())
    area = torch.where(same, 0.5 * h * (d0 + d1).abs(), 0.5 * h * (d0 * d0 + d1 * d1) / denom)
    return area.sum()


def check_std_range(std_range: Any) -> tuple[float, float]:
    """``std_range`` as ``(lo, hi)`` with ``0 < lo < hi`` finite, else ValueError."""
    try:
        lo, hi = (float(v) for v in std_range)
    except (TypeError, ValueError):
        raise ValueError(f"Expected `std_range` to be a pair (lo, hi) of numbers, got "
                         f"{std_range!r}") from None
    if not (0 < lo < hi < math.inf):
        raise ValueError(f"Expected `std_range` (lo, hi) with 0 < lo < hi < inf, got "
                         f"{std_range!r}")
    return lo, hi


def width_bin_index(x: torch.Tensor, lo: float, hi: float, n_bins: int) -> torch.Tensor:
    """Right-closed equal-width bins ``(e_k, e_{k+1}]`` of ``[lo, hi]`` (``lo`` itself in the
    first bin; values outside the range in the end bins), int64."""
    if hi <= lo:
        return torch.zeros(x.shape, dtype=torch.int64, device=x.device)
    t = (x.double() - lo) / (hi - lo) * n_bins
    return (torch.ceil(t) - 1).clamp(0, n_bins - 1).long()


def std_bin_sums(idx: torch.Tensor, var: torch.Tensor, sq_err: torch.Tensor,
                 n_bins: int) -> torch.Tensor:
    """Per-bin (count, variance sum, squared-error sum), float64 (3, B)."""
    out = torch.zeros(3, n_bins, dtype=torch.float64, device=var.device)
    out[0].index_add_(0, idx, torch.ones_like(var, dtype=torch.float64))
    out[1].index_add_(0, idx, var.double())
    out[2].index_add_(0, idx, sq_err.double())
    return out


def ence_from_sums(sums: torch.Tensor) -> torch.Tensor:
    """ENCE ``mean_b |RMV_b - RMSE_b| / RMV_b`` over the non-empty bins of (3, B) sums."""
    n, sv, se = sums
    full = n > 0
    rmv = (sv[full] / n[full]).sqrt()
    rmse = (se[full] / n[full]).sqrt()
    return ((rmv - rmse).abs() / rmv).mean()


def uce_from_sums(sums: torch.Tensor) -> torch.Tensor:
    """UCE ``sum_b n_b / n |MV_b - MSE_b|`` from (3, B) sums."""
    n, sv, se = sums
    return (sv - se).abs().sum() / n.sum()


def gaussian_rows(pred: Any, target: Any, mask: Any, ignore_value: Any, what: str
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept (variance, squared error), float64, of a Gaussian (or moment-matched Samples)."""
    if isinstance(pred, Samples):
        pred = pred.to_gaussian()
    if not isinstance(pred, Gaussian):
        raise TypeError(f"Expected `pred` to be a Gaussian (or Samples) for {what}, got "
                        f"{type(pred).__name__}")
    g, y, _ = kept_rows(pred, target, mask=mask, ignore_value=ignore_value)
    var = g.var.double()
    if bool((var <= 0).any()):
        raise ValueError(f"Expected `var` > 0 for {what}, found {int((var <= 0).sum())} zero "
                         "variance(s)")
    return var, (y.double() - g.mean.double()) ** 2


def ence_bin_index(var: torch.Tensor, n_bins: int, std_range: Any) -> torch.Tensor:
    """ENCE's bins of the predicted std: equal-mass (``std_range=None``) or equal-width in
    ``log std`` over ``std_range``."""
    if std_range is None:
        return equal_mass_bin_index(var.sqrt(), n_bins)[0]
    lo, hi = check_std_range(std_range)
    return width_bin_index(0.5 * var.log(), math.log(lo), math.log(hi), n_bins)
