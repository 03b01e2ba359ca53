"""Conformal prediction beyond classification sets, and conformal risk control.

* :mod:`~torchcal.conformal.core`: the finite-sample quantile ``ceil((n + 1)(1 - alpha)) / n``
  (and its weighted form) that every method here uses.
* :mod:`~torchcal.conformal.risk`: conformal risk control and Learn-then-Test on a loss matrix
  over a grid of ``lambda`` (multi-label sets, segmentation masks, token sets, selective
  classification), with the losses of :mod:`~torchcal.conformal.losses`.

Conformal prediction *sets* for classifiers (LAC, APS, RAPS) are a post-hoc calibrator:
:class:`torchcal.posthoc.ConformalClassifier`.
"""

from .core import (
    InfiniteIntervalWarning,
    conformal_quantile,
    conformal_rank,
    weighted_conformal_quantile,
)

# risk control
from .losses import false_discovery_rate, false_negative_rate, token_miscoverage
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
           # risk control
           "ConformalRiskControl", "LearnThenTest", "MultiLabelRiskControl",
           "SelectiveRiskControl", "crc_index", "ltt_valid", "hb_p_values", "hoeffding_p_values",
           "fwer_reject", "false_negative_rate", "false_discovery_rate", "token_miscoverage"]
