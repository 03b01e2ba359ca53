"""Binary calibrators: Platt scaling (Platt 1999) and beta calibration (Kull et al. 2017)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from .._validation import check_positive_int
from ..errors import CalibrationFitError
from ._checks import PARAMETER_BOUNDS, float_list
from ._fitting import GRAD_TOL, backtrack
from ._layout import row_chunks
from ._toplabel import keep_top_label, log_proba, top_label_rows
from .base import Calibrator

__all__ = ["PlattScaling", "BetaCalibration"]


def _check_binary(z: torch.Tensor, name: str) -> None:
    if z.shape[1] != 2:
        raise ValueError(
            f"Expected `logits` to have 2 columns (a binary problem) for {name}, got "
            f"{z.shape[1]}; for more classes pass top_label=True (it calibrates the "
            "predicted class's confidence), or use TemperatureScaling, VectorScaling, "
            "DirichletCalibration or IsotonicCalibration"
        )


def _check_top_label(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"Expected `top_label` to be a bool, got {value!r}")
    return value


def _bce(x: torch.Tensor, y: torch.Tensor, theta: torch.Tensor,
         w: torch.Tensor | None = None) -> float:
    s = x @ theta
    # mean of log(1 + e^s) - y s, stable for either sign of s
    loss = torch.nn.functional.softplus(s) - y * s
    return float(loss.mean() if w is None else (loss * w).sum() / w.sum())


def logistic_fit(x: torch.Tensor, y: torch.Tensor, *, max_iter: int, name: str,
                 w: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
    """Unregularised logistic regression ``P(y = 1) = sigmoid(x theta)`` by damped Newton.

    ``x`` (N, D) float64 features (with a column of ones for the intercept), ``y`` (N,) float64
    in {0, 1}, ``w`` optional (N,) sample weights (weighted means).  Returns
    ``(theta, mean NLL)``; raises :class:`CalibrationFitError` with the reason
    when ``max_iter`` steps leave the gradient above ``GRAD_TOL`` (e.g. scores that separate
    the classes perfectly, where the optimum is at infinity).
    """
    n, d = x.shape
    # weighted: every row's term times w_i, the sums over W = sum w instead of N
    xw = x if w is None else x * w.unsqueeze(1)
    total = n if w is None else float(w.sum())
    theta = torch.zeros(d, dtype=torch.float64, device=x.device)
    f = _bce(x, y, theta, w)
    grad = torch.full_like(theta, math.inf)
    for _ in range(max_iter):
        p = torch.sigmoid(x @ theta)
        grad = xw.T @ (p - y) / total
        if float(grad.abs().max()) <= 1e-12:
            break
        hess = (xw * (p * (1 - p)).unsqueeze(1)).T @ x / total
        step = torch.linalg.lstsq(hess, grad.unsqueeze(1)).solution.squeeze(1)
        moved = backtrack(lambda th: _bce(x, y, th, w), theta, f, step, float(grad @ step))
        if moved is None:
            break
        theta, f = moved
    s = x @ theta
    g_max = float((xw.T @ (torch.sigmoid(s) - y) / total).abs().max())
    if not (math.isfinite(f) and g_max <= GRAD_TOL):
        raise CalibrationFitError(
            f"{name} failed: the logistic fit stopped after at most {max_iter} Newton steps "
            f"with the NLL gradient still {g_max:.3g} (> {GRAD_TOL:g}); validation scores "
            "that separate the two classes perfectly have no finite optimum"
        )
    if bool(((s > 0) == (y > 0.5)).all()):
        warnings.warn(
            f"{name}: the validation scores separate the two classes perfectly, so the "
            "logistic fit has no finite optimum; the coefficients grew until the NLL gradient "
            f"fell below {GRAD_TOL:g} and the calibrated probabilities are nearly 0 and 1",
            RuntimeWarning,
            stacklevel=5,
        )
    return theta, f


class _BinaryCalibrator(Calibrator):
    """``q_1 = sigmoid(features(z) theta)``; calibrated logits ``[0, features(z) theta]``.

    With ``top_label=True`` the same logistic map calibrates the confidence of the predicted
    class (any number of classes): the features are those of the top-1 probability against
    the rest, the target whether the prediction is right, and the prediction keeps its
    arg-max (:func:`~torchcal.posthoc._toplabel.keep_top_label`)."""

    _fitted_attr = "coef_"
    _names: tuple[str, ...] = ()

    def __init__(self, max_iter: int = 100, top_label: bool = False) -> None:
        check_positive_int(max_iter, "max_iter")
        _check_top_label(top_label)
        self.max_iter = max_iter
        self.top_label = top_label

    @property
    def changes_argmax(self) -> bool:  # type: ignore[override]
        """Class-1 calibration moves the decision threshold (by design); the top-label form
        keeps every arg-max."""
        return not self.top_label

    @staticmethod
    def _features(z: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @staticmethod
    def _top_features(log_top: torch.Tensor, log_rest: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError  # pragma: no cover - abstract

    def _score(self, z: torch.Tensor) -> torch.Tensor:
        return self._features(z) @ self.coef_.to(z.device)

    def _fit_theta(self, x: torch.Tensor, y: torch.Tensor, max_iter: int,
                   w: torch.Tensor | None) -> torch.Tensor:
        return logistic_fit(x, y, max_iter=max_iter, name=type(self).__name__, w=w)[0]

    def _top_rows(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-label features (M, D) and predicted classes (M,), chunk by chunk."""
        feats, preds = [], []
        for sl in row_chunks(z.shape[0], z.shape[1]):
            lp, pred, rest = top_label_rows(z[sl])
            feats.append(self._top_features(lp.gather(1, pred.unsqueeze(1)).squeeze(1), rest))
            preds.append(pred)
        return torch.cat(feats), torch.cat(preds)

    def _fit(self, z: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None) -> None:
        """Fit on validated rows: ``logits`` (M, 2) and labels in {0, 1}, or with
        ``top_label=True`` (M, C) logits and the correctness of their predictions."""
        max_iter = check_positive_int(self.max_iter, "max_iter")
        if _check_top_label(self.top_label):
            x, pred = self._top_rows(z)
            target = pred.eq(y).to(torch.float64)
        else:
            _check_binary(z, type(self).__name__)
            x, target = self._features(z), y.to(torch.float64)
        self.coef_ = self._fit_theta(x, target, max_iter, w).cpu()

    def _predict_proba(self, z: torch.Tensor) -> torch.Tensor:
        if not self.top_label:
            return super()._predict_proba(z)
        lp, pred, rest = top_label_rows(z)
        x = self._top_features(lp.gather(1, pred.unsqueeze(1)).squeeze(1), rest)
        h = torch.sigmoid(x @ self.coef_.to(z.device))
        return keep_top_label(lp.exp(), pred, h, z.dtype)

    def _transform(self, z: torch.Tensor) -> torch.Tensor:
        """Calibrated logits ``[0, s]`` with ``s`` the calibrated log-odds of class 1 (with
        ``top_label=True``: ``log q`` of the calibrated probabilities)."""
        if self.top_label:
            return log_proba(self._predict_proba(z))
        _check_binary(z, type(self).__name__)
        s = self._score(z)
        return torch.stack([torch.zeros_like(s), s], dim=1).to(z.dtype)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (settings and the fitted coefficients)."""
        self._check_fitted()
        return {**self._header(), "coef": self.coef_.tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> _BinaryCalibrator:
        """Rebuild a fitted calibrator from :meth:`to_dict`'s output."""
        cls._check_dict(d, ("max_iter", "coef"))
        obj = cls(max_iter=d["max_iter"], top_label=d.get("top_label", False))
        obj.coef_ = torch.tensor(float_list(d["coef"], "d['coef']", length=len(cls._names),
                                            bounds=PARAMETER_BOUNDS),
                                 dtype=torch.float64)
        return obj


class PlattScaling(_BinaryCalibrator):
    """Platt scaling for binary problems: ``q_1 = sigmoid(a s + b)``, ``s = z_1 - z_0``.

    ``s`` is the model's log-odds of class 1 (``logit(p_1)``); ``a`` and ``b`` are fitted by
    logistic regression (Newton's method, float64) on the validation NLL, without Platt's
    smoothed targets, as netcal's ``LogisticCalibration`` does.  With ``b = 0`` it is
    temperature scaling (``a = 1 / T``); a negative ``a`` flips the predictions.

    Args:
        max_iter: Newton steps; running out (e.g. perfectly separated validation scores)
            raises :class:`~torchcal.posthoc.CalibrationFitError` with the reason.
        top_label: False (default): the binary form above, which may change the predicted
            class by design (its bias moves the threshold of 1/2; ``changes_argmax``).  True:
            Platt scaling of the top label, for any number of classes:
            ``q_top = sigmoid(a logit(p_top) + b)`` fitted on whether the prediction is right;
            the arg-max never changes (the other classes share ``1 - q_top``).

    Attributes:
        coef_ (torch.Tensor): float64 ``(a, b)``.

    Example:
        >>> z = torch.tensor([[0.0, 2.0]] * 3 + [[0.0, -1.0]] * 3)
        >>> ps = PlattScaling().fit(z, torch.tensor([1, 1, 0, 0, 0, 1]))
        >>> ps.predict_proba(z[[0, 3]])[:, 1]  # the frequencies of class 1 at each score
        tensor([0.6667, 0.3333])
    """

    _names = ("a", "b")

    @staticmethod
    def _features(z: torch.Tensor) -> torch.Tensor:
        z64 = z.to(torch.float64)
        return torch.stack([z64[:, 1] - z64[:, 0], torch.ones_like(z64[:, 0])], dim=1)

    @staticmethod
    def _top_features(log_top: torch.Tensor, log_rest: torch.Tensor) -> torch.Tensor:
        """``(logit(p_top), 1)``: the top label's log-odds."""
        return torch.stack([log_top - log_rest, torch.ones_like(log_top)], dim=1)


class BetaCalibration(_BinaryCalibrator):
    """Beta calibration (Kull, Silva Filho & Flach 2017) for binary problems.

    ``q_1 = sigmoid(a log p_1 - b log(1 - p_1) + c)`` with ``p = softmax(z)`` and ``a, b >=
    0`` (the three-parameter family; the calibration map is monotone and contains the
    identity, ``a = b = 1, c = 0``).  Fitted as a logistic regression on the features
    ``(log p_1, -log p_0)`` (``log_softmax``, so no clipping of ``p`` is needed).  When the
    unconstrained optimum has ``a < 0`` or ``b < 0``, the best fit on the boundary (``a = 0``,
    ``b = 0``, or both) is used instead: the constrained optimum of the convex problem, which
    is netcal's answer.  The authors' ``betacal`` re-fits without the negative coefficient
    only once and can return a different point: on anti-correlated scores it returns
    ``b = -1.96`` (outside the family) where torchcal and netcal return ``a = b = 0``.

    Args:
        max_iter: Newton steps per fit.
        top_label: False (default): the binary form above (it may change the predicted class:
            ``changes_argmax``).  True: beta calibration of the top label's confidence for any
            number of classes (features ``log p_top``, ``-log(1 - p_top)``; target: whether
            the prediction is right); the arg-max never changes.

    Attributes:
        coef_ (torch.Tensor): float64 ``(a, b, c)``.

    Example:
        >>> z = torch.tensor([[0.0, 2.0], [0.0, 2.0], [0.0, -1.0], [0.0, -1.0], [0.0, 0.5]])
        >>> bc = BetaCalibration().fit(z, torch.tensor([1, 1, 0, 1, 0]))
        >>> bool((bc.coef_[:2] >= 0).all())
        True
    """

    _names = ("a", "b", "c")

    @staticmethod
    def _features(z: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(z.to(torch.float64), dim=1)
        return torch.stack([logp[:, 1], -logp[:, 0], torch.ones_like(logp[:, 0])], dim=1)

    @staticmethod
    def _top_features(log_top: torch.Tensor, log_rest: torch.Tensor) -> torch.Tensor:
        """``(log p_top, -log(1 - p_top), 1)``."""
        return torch.stack([log_top, -log_rest, torch.ones_like(log_top)], dim=1)

    def _fit_theta(self, x: torch.Tensor, y: torch.Tensor, max_iter: int,
                   w: torch.Tensor | None = None) -> torch.Tensor:
        name = type(self).__name__
        best: tuple[float, torch.Tensor] | None = None
        # the unconstrained fit, then the faces a = 0 and b = 0 and the corner a = b = 0: the
        # constrained optimum is the best feasible one of these
        for free in ((0, 1, 2), (1, 2), (0, 2), (2,)):
            theta_f, f = logistic_fit(x[:, list(free)], y, max_iter=max_iter, name=name, w=w)
            theta = torch.zeros(3, dtype=torch.float64, device=x.device)
            theta[list(free)] = theta_f
            if bool((theta[:2] >= 0).all()) and (best is None or f < best[0]):
                best = (f, theta)
            if best is not None and len(free) == 3:
                break  # the unconstrained optimum is feasible
        assert best is not None  # the corner a = b = 0 is always feasible
        return best[1]
