"""Split-conformal prediction sets for classifiers: LAC, APS and RAPS."""

from __future__ import annotations

import math
import numbers
import warnings
from fractions import Fraction
from typing import Any

import torch

from .._validation import check_labels, check_nonneg_finite, check_positive_int
from ._common import (
    Estimator,
    check_choice,
    check_n_classes,
    finite_float,
    like_input,
    prepare_fit,
    prepare_logits,
)

__all__ = ["ConformalClassifier"]

_METHODS = ("lac", "aps", "raps")


def _check_alpha(alpha: Any) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 < alpha < 1:
        raise ValueError(f"Expected `alpha` to be a number in (0, 1), got {alpha!r}")
    return float(alpha)


def conformal_rank(n: int, alpha: float) -> int:
    """``k = ceil((n + 1)(1 - alpha))``, computed exactly on the float ``alpha`` (float
    arithmetic gives 91 instead of 90 for n = 99, alpha = 0.1)."""
    return math.ceil((n + 1) * (1 - Fraction(alpha)))


class ConformalClassifier(Estimator):
    """Split-conformal prediction sets with a marginal coverage guarantee.

    Fit on held-out calibration logits: every sample gets a non-conformity score
    ``s(x_i, y_i)``, and the threshold ``q`` is the ``k``-th smallest of the n scores with
    ``k = ceil((n + 1)(1 - alpha))``.  The prediction set of a new ``x`` is
    ``{y : s(x, y) <= q}``.  If the calibration and test samples are exchangeable, the set
    contains the true label with probability at least ``1 - alpha``, and (scores without
    ties) at most ``1 - alpha + 1 / (n + 1)``, whatever the model.  Scores, with ``p =
    softmax(z)`` in float64 and ``p_(1) >= p_(2) >= ...`` the sorted probabilities:

    * ``"lac"`` (Sadinle et al. 2019, least ambiguous set-valued classifier): ``s = 1 - p_y``;
      the smallest sets on average.
    * ``"aps"`` (Romano et al. 2020, adaptive prediction sets, non-randomised): ``s = sum of
      p_(j) over the classes ranked up to and including y``; sets grow with the model's
      uncertainty.
    * ``"raps"`` (Angelopoulos et al. 2021): APS plus ``lam * max(0, rank(y) - k_reg)``
      (1-based rank), which penalises long tails of unlikely classes.

    Sets can be empty (when even the top class's score is above ``q``) or hold every class;
    with ``k > n`` (too few calibration samples for ``alpha``) every set is the full set and
    :meth:`fit` warns.

    Args:
        method: ``"lac"``, ``"aps"`` or ``"raps"``.
        alpha: miscoverage level in (0, 1): sets cover the label with probability >= 1 - alpha.
        lam: RAPS penalty weight (``"raps"`` only).
        k_reg: RAPS rank from which the penalty starts (``"raps"`` only).

    Attributes:
        quantile_ (float): the threshold q (``inf`` when ``k > n``).
        n_calib_ (int): n.
        n_classes_ (int): C.

    Example:
        >>> z = torch.tensor([[3.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 3.0],
        ...                   [1.0, 1.0, 0.0], [0.0, 1.0, 1.0]] * 4)
        >>> y = torch.tensor([0, 1, 2, 0, 2] * 4)
        >>> cp = ConformalClassifier(method="lac", alpha=0.2).fit(z, y)
        >>> cp.predict_sets(torch.tensor([[3.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
        tensor([[ True, False, False],
                [ True,  True, False]])
    """

    _fitted_attr = "quantile_"

    def __init__(self, method: str = "lac", alpha: float = 0.1, lam: float = 0.01,
                 k_reg: int = 5) -> None:
        self.method = method
        self.alpha = alpha
        self.lam = lam
        self.k_reg = k_reg
        self._settings()

    def _settings(self) -> tuple[str, float, float, int]:
        """The settings, checked (at construction, and at fit: ``set_params`` does not)."""
        return (check_choice(self.method, "method", _METHODS), _check_alpha(self.alpha),
                check_nonneg_finite(self.lam, "lam"), check_positive_int(self.k_reg, "k_reg"))

    def _scores(self, z: torch.Tensor) -> torch.Tensor:
        """(N, C) float64 score of every (sample, candidate label) pair."""
        p = torch.softmax(z.to(torch.float64), dim=1)
        if self.method == "lac":
            return 1.0 - p
        sorted_p, order = torch.sort(p, dim=1, descending=True, stable=True)
        cum = torch.cumsum(sorted_p, dim=1)
        if self.method == "raps":
            rank = torch.arange(1, p.shape[1] + 1, dtype=torch.float64, device=p.device)
            cum = cum + float(self.lam) * (rank - int(self.k_reg)).clamp(min=0)
        return torch.empty_like(cum).scatter_(1, order, cum)

    def fit(self, logits: Any, labels: Any) -> ConformalClassifier:
        """Calibrate the threshold on held-out ``logits`` (N, C) and ``labels`` (N,)."""
        alpha = self._settings()[1]
        z, y = prepare_fit(logits, labels, one_class_ok=True)
        s = self._scores(z).gather(1, y.unsqueeze(1)).squeeze(1)
        n = s.shape[0]
        k = conformal_rank(n, alpha)
        if k > n:
            warnings.warn(
                f"ConformalClassifier: {n} calibration samples are too few for alpha={alpha} "
                f"(the threshold is the {k}-th smallest score); every prediction set is the "
                f"full set. At least {math.ceil(1 / alpha) - 1} samples are needed.",
                RuntimeWarning,
                stacklevel=2,
            )
            self.quantile_ = math.inf
        else:
            self.quantile_ = float(torch.kthvalue(s.cpu(), k).values)
        self.n_calib_ = n
        self.n_classes_ = z.shape[1]
        return self

    def predict_sets(self, logits: Any) -> Any:
        """Boolean (N, C) mask of the prediction sets (NumPy for NumPy input)."""
        self._check_fitted()
        z = prepare_logits(logits)
        check_n_classes(z, self.n_classes_)
        return like_input(self._scores(z) <= self.quantile_, logits)

    def mean_set_size(self, logits: Any) -> float:
        """Average number of classes in the prediction sets of ``logits``."""
        self._check_fitted()
        z = prepare_logits(logits)
        check_n_classes(z, self.n_classes_)
        return float((self._scores(z) <= self.quantile_).sum(dim=1, dtype=torch.float64).mean())

    def coverage(self, logits: Any, labels: Any) -> float:
        """Share of samples whose prediction set contains the label (the empirical coverage)."""
        self._check_fitted()
        z = prepare_logits(logits)
        check_n_classes(z, self.n_classes_)
        y = check_labels(labels, n=z.shape[0], num_classes=z.shape[1], device=z.device)
        s = self._scores(z).gather(1, y.unsqueeze(1)).squeeze(1)
        return float((s <= self.quantile_).to(torch.float64).mean())

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (settings and the calibrated threshold)."""
        self._check_fitted()
        q = self.quantile_
        return {**self._header(), "quantile": None if math.isinf(q) else q,
                "n_calib": self.n_calib_, "n_classes": self.n_classes_}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConformalClassifier:
        """Rebuild a fitted predictor from :meth:`to_dict`'s output."""
        cls._check_dict(d, ("method", "alpha", "lam", "k_reg", "quantile", "n_calib",
                            "n_classes"))
        obj = cls(method=d["method"], alpha=d["alpha"], lam=d["lam"], k_reg=d["k_reg"])
        q = d["quantile"]
        obj.quantile_ = math.inf if q is None else finite_float(q, "d['quantile']")
        obj.n_calib_ = check_positive_int(d["n_calib"], "d['n_calib']")
        obj.n_classes_ = check_positive_int(d["n_classes"], "d['n_classes']")
        return obj
