"""Conformal prediction beyond classification sets, and conformal risk control.

* :mod:`~torchcal.conformal.core`: the finite-sample quantile ``ceil((n + 1)(1 - alpha)) / n``
  (and its weighted form) that every method here uses.
* :mod:`~torchcal.conformal.regression`: :class:`ConformalRegressor`, split-conformal intervals
  (absolute, normalised, CQR; Mondrian, weighted, dense); :mod:`~torchcal.conformal.cv`:
  :func:`cv_plus` (CV+ / jackknife+); :mod:`~torchcal.conformal.adaptive`:
  :class:`AdaptiveConformal` (adaptive conformal inference for a sequence).
* :mod:`~torchcal.conformal.risk`: conformal risk control and Learn-then-Test on a loss matrix
  over a grid of ``lambda`` (multi-label sets, segmentation masks, token sets, selective
  classification), with the losses of :mod:`~torchcal.conformal.losses`.

Conformal prediction *sets* for classifiers (LAC, APS, RAPS) are a post-hoc calibrator:
:class:`torchcal.posthoc.ConformalClassifier`.
"""

from ..errors import InfiniteIntervalWarning
from .core import conformal_quantile, conformal_rank, weighted_conformal_quantile

# isort: split
# regression and risk control (after .core: posthoc, which regression imports, imports
# conformal_rank from here)
from .adaptive import AdaptiveConformal, AdaptiveResult
from .cv import cv_plus
from .losses import false_discovery_rate, false_negative_rate, token_miscoverage
from .regression import ConformalRegressor
from .risk import (
    ConformalRiskControl,
    LearnThenTest,
    MultiLabelRiskControl,
    SelectiveRiskControl,
    crc_index,
    fwer_reject,
    hb_p_values,
    hoeffding_p_values,
    ltt_valid,
)

__all__ = ["conformal_quantile", "conformal_rank", "weighted_conformal_quantile",
           "InfiniteIntervalWarning",
           # regression
           "ConformalRegressor", "cv_plus", "AdaptiveConformal", "AdaptiveResult",
           # risk control
           "ConformalRiskControl", "LearnThenTest", "MultiLabelRiskControl",
           "SelectiveRiskControl", "crc_index", "ltt_valid", "hb_p_values", "hoeffding_p_values",
           "fwer_reject", "false_negative_rate", "false_discovery_rate", "token_miscoverage"]
