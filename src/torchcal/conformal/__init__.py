"""Conformal prediction beyond classification sets, and conformal risk control.

* :mod:`~torchcal.conformal.core`: the finite-sample quantile ``ceil((n + 1)(1 - alpha)) / n``
  (and its weighted form) that every method here uses.
* :mod:`~torchcal.conformal.regression`: :class:`ConformalRegressor`, split-conformal intervals
  (absolute, normalised, CQR; Mondrian, weighted, dense); :mod:`~torchcal.conformal.cv`:
  :func:`cv_plus` (CV+ / jackknife+); :mod:`~torchcal.conformal.adaptive`:
  :class:`AdaptiveConformal` (adaptive conformal inference for a sequence).

Conformal prediction *sets* for classifiers (LAC, APS, RAPS) are a post-hoc calibrator:
:class:`torchcal.posthoc.ConformalClassifier`.
"""

from .core import (
    InfiniteIntervalWarning,
    conformal_quantile,
    conformal_rank,
    weighted_conformal_quantile,
)

# isort: split
# regression (after .core: posthoc, which regression imports, imports conformal_rank from here)
from .adaptive import AdaptiveConformal, AdaptiveResult
from .cv import cv_plus
from .regression import ConformalRegressor

__all__ = ["conformal_quantile", "conformal_rank", "weighted_conformal_quantile",
           "InfiniteIntervalWarning",
           # regression
           "ConformalRegressor", "cv_plus", "AdaptiveConformal", "AdaptiveResult"]
