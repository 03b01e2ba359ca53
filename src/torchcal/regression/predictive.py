"""Regression predictions as users have them: a point, a Gaussian, quantiles, an ensemble's samples.

Every prediction is per target element: a target of shape (N,), (N, d1, ...) (depth, per-pixel
values) or (N, T) (a sequence) is predicted by

* a **point**: a tensor or array of the target's shape;
* a :class:`Gaussian`: a mean and a variance of the target's shape (the variance may be given
  as ``log_var``, as Kendall et al.'s heads output it, or as ``std``);
* :class:`Quantiles`: values of shape ``target.shape + (Q,)`` at ``Q`` increasing levels in
  (0, 1) (``(N, Q)`` for a 1-D target);
* :class:`Samples`: an ensemble's or MC dropout's ``S >= 2`` draws, shape ``(S,) +
  target.shape``.

Missing targets are dropped through ``mask`` (boolean, the target's shape, True where the
target is observed) or ``ignore_value`` (a sentinel such as 0 for a depth map's missing
pixels): :func:`kept_rows` flattens a prediction and its target to the observed elements, the
one place every metric, calibrator and conformal predictor selects them.  A NaN target outside
the mask is an error, never a silently NaN metric.

NumPy in gives NumPy out where a method returns values of the input's layout; the arithmetic is
done in the inputs' floating dtype (at least float32; NumPy integers become float64).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch

from .._validation import as_tensor, check_alpha, check_finite

__all__ = [
    "Gaussian",
    "Quantiles",
    "Samples",
    "Prediction",
    "as_float",
    "kept_rows",
    "prediction_shape",
    "flat_values",
    "like",
]


def as_float(x: Any, name: str) -> torch.Tensor:
    """``x`` as a floating tensor (float tensors keep their dtype and device; integer and bool
    input becomes float64 from NumPy or a sequence, float32 from a tensor).  Raises TypeError
    naming ``name`` for anything that is not numeric."""
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        x = np.asarray(float(x))  # a plain number (a level, a target): a 0-d float64 array
    t = as_tensor(x, name)
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"Expected `{name}` to be a real numeric tensor or array, got {t.dtype}")
    if not t.is_floating_point():
        t = t.to(torch.float32 if isinstance(x, torch.Tensor) else torch.float64)
    elif t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()
    return t


def _check_finite(t: torch.Tensor, name: str) -> None:
    # one reduction (aminmax: NaN propagates, +-Inf shows in the extremes), not an isfinite mask
    check_finite(t, name)


def like(out: torch.Tensor, ref: Any) -> Any:
    """``out`` as NumPy when ``ref`` is a NumPy array (NumPy in, NumPy out), else the tensor."""
    if isinstance(ref, np.ndarray):
        return out.detach().cpu().numpy()
    return out


class Gaussian:
    """A Gaussian predictive distribution per target element.

    Args:
        mean: the predicted means, of the target's shape.
        var: the predicted variances (>= 0, finite), of ``mean``'s shape; or give exactly one of
        log_var: the log-variances (Kendall et al.'s head; ``var = exp(log_var)``), or
        std: the standard deviations (>= 0).

    >>> g = Gaussian([0.0, 1.0], std=[1.0, 2.0])
    >>> [round(v, 4) for v in g.cdf([1.96, 1.0]).tolist()]
    [0.975, 0.5]
    >>> lo, hi = g.interval(0.05)
    >>> [round(v, 3) for v in hi.tolist()]
    [1.96, 4.92]
    """

    def __init__(self, mean: Any, var: Any = None, *, log_var: Any = None, std: Any = None):
        given = [k for k, v in (("var", var), ("log_var", log_var), ("std", std)) if v is not None]
        if len(given) != 1:
            raise ValueError("Expected exactly one of `var`, `log_var` and `std` for a "
                             f"Gaussian, got {given or 'none'}")
        self.mean = as_float(mean, "mean")
        _check_finite(self.mean, "mean")
        name = given[0]
        spread = as_float({"var": var, "log_var": log_var, "std": std}[name], name)
        if spread.shape != self.mean.shape:
            raise ValueError(f"Expected `{name}` to have the shape of `mean` "
                             f"{tuple(self.mean.shape)}, got {tuple(spread.shape)}")
        _check_finite(spread, name)
        if name != "log_var" and spread.numel() and bool((spread < 0).any()):
            raise ValueError(f"Expected `{name}` to be >= 0, found {int((spread < 0).sum())} "
                             "negative value(s)")
        spread = spread.to(device=self.mean.device)
        dtype = torch.promote_types(self.mean.dtype, spread.dtype)
        self.mean = self.mean.to(dtype)
        self.var = {"var": spread, "log_var": torch.exp(spread),
                    "std": spread * spread}[name].to(dtype)
        self._ref = mean

    @property
    def std(self) -> torch.Tensor:
        """The standard deviations ``sqrt(var)``."""
        return self.var.sqrt()

    @property
    def shape(self) -> torch.Size:
        """The target's shape."""
        return self.mean.shape

    def cdf(self, y: Any) -> torch.Tensor:
        """``P(Y <= y)`` per element (``y`` broadcast against the mean); a zero variance gives
        the step function at the mean (1 at ``y >= mean``)."""
        yt = as_float(y, "y").to(self.mean)
        z = (yt - self.mean) / self.std
        out = 0.5 * torch.erfc(-z / math.sqrt(2.0))
        return torch.where(self.var > 0, out, (yt >= self.mean).to(out.dtype))

    def ppf(self, q: Any) -> torch.Tensor:
        """The ``q``-quantile per element (``q`` in (0, 1), a number or a tensor broadcast
        against the mean: ``q`` of shape (Q,) with a mean of shape (N,) needs ``q`` as (1, Q)
        and the mean's ``[:, None]``; see :meth:`quantiles`)."""
        qt = as_float(q, "q").to(self.mean)
        if qt.numel() and not bool(((qt > 0) & (qt < 1)).all()):
            raise ValueError(f"Expected `q` to lie in (0, 1), got {q!r}")
        return self.mean + self.std * torch.special.ndtri(qt)  # finite down to q = 1e-300

    def quantiles(self, levels: Any) -> Quantiles:
        """The :class:`Quantiles` at ``levels`` (shape ``mean.shape + (Q,)``)."""
        lv = _check_levels(levels).to(self.mean)
        vals = self.mean.unsqueeze(-1) + self.std.unsqueeze(-1) * torch.special.ndtri(lv)
        return Quantiles(vals, lv)

    def interval(self, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The central ``1 - alpha`` interval ``mean -+ z_{1-alpha/2} std`` per element."""
        a = check_alpha(alpha)
        z = float(torch.special.ndtri(torch.tensor(1 - a / 2, dtype=torch.float64)))
        half = z * self.std
        return self.mean - half, self.mean + half

    def select(self, keep: torch.Tensor | None) -> Gaussian:
        """The elements where ``keep`` (a boolean of the target's shape) is True, flattened to
        1-D (all of them, flattened, when ``keep`` is None)."""
        out = Gaussian.__new__(Gaussian)
        out.mean = self.mean.reshape(-1) if keep is None else self.mean[keep]
        out.var = self.var.reshape(-1) if keep is None else self.var[keep]
        out._ref = self._ref
        return out

    def __repr__(self) -> str:
        return f"Gaussian(shape={tuple(self.shape)}, dtype={self.mean.dtype})"


def _check_levels(levels: Any) -> torch.Tensor:
    lv = as_float(levels, "levels").reshape(-1)
    if lv.numel() == 0:
        raise ValueError("Expected `levels` to hold at least one quantile level, got none")
    if not bool(((lv > 0) & (lv < 1)).all()):
        raise ValueError(f"Expected `levels` to lie in (0, 1), got {lv.tolist()}")
    if lv.numel() > 1 and not bool((lv[1:] > lv[:-1]).all()):
        raise ValueError(f"Expected `levels` to be strictly increasing, got {lv.tolist()}")
    return lv


class Quantiles:
    """Predicted quantiles per target element: ``values`` of shape ``target.shape + (Q,)`` at
    ``levels`` (Q strictly increasing numbers in (0, 1)).

    Crossing quantiles (a row whose column j exceeds column j + 1) are refused with the count
    of such rows; sort them first (``values.sort(-1).values``, the rearrangement of
    Chernozhukov et al.) if that is what you want.

    >>> q = Quantiles([[0.0, 1.0, 2.0]], levels=[0.05, 0.5, 0.95])
    >>> [t.tolist() for t in q.interval(0.1)]
    [[0.0], [2.0]]
    """

    def __init__(self, values: Any, levels: Any):
        self.values = as_float(values, "values")
        self.levels = _check_levels(levels).to(self.values.device)
        if self.values.ndim < 2 or self.values.shape[-1] != self.levels.numel():
            raise ValueError(
                f"Expected `values` of shape target.shape + (Q,) with Q = {self.levels.numel()} "
                f"levels (at least 2-D: (N, Q)), got {tuple(self.values.shape)}")
        if self.values.shape[-1] == 1 or self.values.numel() == 0:
            _check_finite(self.values, "values")
            crossing = None
        else:  # one pass for both checks: the gaps' extremes (NaN/Inf values make them so)
            gaps = torch.diff(self.values, dim=-1)
            lo, hi = torch.aminmax(gaps)
            if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
                _check_finite(self.values, "values")  # raises, unless a finite gap overflowed
            crossing = (gaps < 0).any(-1) if bool(lo < 0) else None
        if crossing is not None:
            raise ValueError(
                f"Expected the quantile columns of `values` to be non-decreasing along the "
                f"last axis (levels {self.levels.tolist()}), found {int(crossing.sum())} "
                "element(s) whose quantiles cross")
        self._ref = values

    @property
    def shape(self) -> torch.Size:
        """The target's shape."""
        return self.values.shape[:-1]

    def column(self, level: float, name: str = "level") -> torch.Tensor:
        """The values at ``level`` (one of :attr:`levels`, to 1e-9)."""
        hit = (self.levels - level).abs() <= 1e-9
        if not bool(hit.any()):
            raise ValueError(f"Expected `{name}` {level!r} to be one of the predicted levels "
                             f"{self.levels.tolist()}")
        return self.values[..., int(hit.nonzero()[0, 0])]

    def interval(self, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The predicted ``alpha/2`` and ``1 - alpha/2`` quantiles (both must be levels)."""
        a = check_alpha(alpha)
        return self.column(a / 2, "alpha / 2"), self.column(1 - a / 2, "1 - alpha / 2")

    def select(self, keep: torch.Tensor | None) -> Quantiles:
        """The kept elements' quantiles, shape (M, Q) (see :meth:`Gaussian.select`)."""
        out = Quantiles.__new__(Quantiles)
        out.values = (self.values.reshape(-1, self.values.shape[-1]) if keep is None
                      else self.values[keep])
        out.levels, out._ref = self.levels, self._ref
        return out

    def __repr__(self) -> str:
        return f"Quantiles(shape={tuple(self.shape)}, levels={self.levels.tolist()})"


class Samples:
    """An ensemble's (or MC dropout's) draws: ``values`` of shape ``(S,) + target.shape`` with
    ``S >= 2`` members.

    :attr:`mean` and :attr:`var` are the members' mean and variance (``ddof=0``, the mixture
    of point predictions' own variance); :meth:`to_gaussian` moment-matches them.
    """

    def __init__(self, values: Any):
        self.values = as_float(values, "values")
        if self.values.ndim < 2 or self.values.shape[0] < 2:
            raise ValueError("Expected `values` of shape (S,) + target.shape with S >= 2 "
                             f"samples, got {tuple(self.values.shape)}")
        _check_finite(self.values, "values")
        self._ref = values

    @property
    def shape(self) -> torch.Size:
        """The target's shape."""
        return self.values.shape[1:]

    @property
    def mean(self) -> torch.Tensor:
        """The members' mean per element."""
        return self.values.mean(0)

    @property
    def var(self) -> torch.Tensor:
        """The members' variance per element (``ddof=0``)."""
        return self.values.var(0, correction=0)

    def to_gaussian(self) -> Gaussian:
        """The moment-matched :class:`Gaussian` (the members' mean and variance)."""
        return Gaussian(self.mean, self.var)

    def quantiles(self, levels: Any) -> Quantiles:
        """The members' empirical quantiles at ``levels`` (``torch.quantile``'s linear
        interpolation), shape ``target.shape + (Q,)``."""
        lv = _check_levels(levels).to(self.values)
        return Quantiles(torch.quantile(self.values, lv, dim=0).movedim(0, -1), lv)

    def select(self, keep: torch.Tensor | None) -> Samples:
        """The kept elements' draws, shape (S, M) (see :meth:`Gaussian.select`)."""
        out = Samples.__new__(Samples)
        s = self.values.shape[0]
        out.values = self.values.reshape(s, -1) if keep is None else self.values[:, keep]
        out._ref = self._ref
        return out

    def __repr__(self) -> str:
        return f"Samples(S={self.values.shape[0]}, shape={tuple(self.shape)})"


#: Any prediction :func:`kept_rows` takes (a point prediction is a tensor or array).
Prediction = torch.Tensor | np.ndarray | Gaussian | Quantiles | Samples


def prediction_shape(pred: Any) -> torch.Size:
    """The target shape a prediction is for."""
    if isinstance(pred, (Gaussian, Quantiles, Samples)):
        return pred.shape
    return as_float(pred, "pred").shape


def flat_values(pred: Any) -> Any:
    """A point prediction as a float tensor; a distribution unchanged."""
    if isinstance(pred, (Gaussian, Quantiles, Samples)):
        return pred
    t = as_float(pred, "pred")
    _check_finite(t, "pred")
    return t


def kept_rows(pred: Any, target: Any, *, mask: Any = None, ignore_value: Any = None
              ) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
    """Flatten a prediction and its target to the observed elements.

    Args:
        pred: a point prediction (the target's shape), :class:`Gaussian`, :class:`Quantiles`
            or :class:`Samples`.
        target: the targets, shape (N,), (N, d1, ...) or (N, T).
        mask: optional boolean of the target's shape, True where the target is observed.
        ignore_value: optional number marking missing targets (e.g. 0 in a depth map).

    Returns:
        ``(pred_rows, y, keep)``: the prediction restricted to the kept elements (a 1-D tensor,
        or the distribution's ``select``), the kept targets (1-D, the prediction's dtype) and
        the boolean ``keep`` of the target's shape (None when every element is kept).

    Raises ValueError, naming the argument, for mismatched shapes, a NaN/Inf target that is
    not masked out, or no element left.

    >>> p, y, keep = kept_rows(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 0.0, 2.5]),
    ...                        ignore_value=0.0)
    >>> p.tolist(), y.tolist(), keep.tolist()
    ([1.0, 3.0], [1.0, 2.5], [True, False, True])
    """
    pred = flat_values(pred)
    shape = prediction_shape(pred)
    y = as_float(target, "target")
    if y.shape != shape:
        raise ValueError(f"Expected `target` to have the predictions' shape {tuple(shape)}, "
                         f"got {tuple(y.shape)}")
    if y.numel() == 0:
        raise ValueError("Expected at least one target, got an empty `target`")
    keep = None
    if mask is not None:
        m = as_tensor(mask, "mask")
        if m.dtype != torch.bool or m.shape != y.shape:
            raise ValueError(f"Expected `mask` to be a boolean of the target's shape "
                             f"{tuple(y.shape)} (True = observed), got {m.dtype} "
                             f"{tuple(m.shape)}")
        keep = m.to(y.device)
    if ignore_value is not None:
        iv = float(ignore_value)
        drop = torch.isnan(y) if math.isnan(iv) else (y == iv)
        keep = ~drop if keep is None else keep & ~drop
    ref = pred.mean if isinstance(pred, Gaussian) else (
        pred.values if isinstance(pred, (Quantiles, Samples)) else pred)
    y = y.to(device=ref.device)
    y_kept = y.reshape(-1) if keep is None else y[keep]
    if y_kept.numel() == 0:
        raise ValueError("Expected at least one observed target, but `mask` / `ignore_value` "
                         "drop every element")
    lo, hi = torch.aminmax(y_kept)  # one reduction: NaN propagates, +-Inf are the extremes
    if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
        n_bad = int((~torch.isfinite(y_kept)).sum())
        raise ValueError(f"Expected `target` to be finite, found {n_bad} NaN/Inf value(s); "
                         "mark missing targets with `mask` (False) or `ignore_value`")
    if keep is not None and bool(keep.all()):
        keep = None
    if isinstance(pred, (Gaussian, Quantiles, Samples)):
        rows = pred.select(keep)
    else:
        rows = pred.reshape(-1) if keep is None else pred[keep]
    dtype = torch.promote_types(ref.dtype, y_kept.dtype) if ref.is_floating_point() else \
        y_kept.dtype
    return rows, y_kept.to(dtype), keep
