"""Conformal prediction beyond classification sets, and conformal risk control.

* :mod:`~torchcal.conformal.core`: the finite-sample quantile ``ceil((n + 1)(1 - alpha)) / n``
  (and its weighted form) that every method here uses.

Conformal prediction *sets* for classifiers (LAC, APS, RAPS) are a post-hoc calibrator:
:class:`torchcal.posthoc.ConformalClassifier`.
"""

from .core import (
    InfiniteIntervalWarning,
    conformal_quantile,
    conformal_rank,
    weighted_conformal_quantile,
)

__all__ = ["conformal_quantile", "conformal_rank", "weighted_conformal_quantile",
           "InfiniteIntervalWarning"]
