"""Calibration, scoring and ranking metrics (exact, vectorised, torch or NumPy input).

Every metric takes keyword arguments only: exactly one of ``logits=`` / ``probs=`` of shape
(N, C) plus ``labels=`` (N,), and returns 0-d tensors on the input's device.  Bin conventions
live in :mod:`torchcal.metrics.binning`.

Dense layouts: every labelled metric (and :class:`CalibrationMeter`) also takes
(N, C, d1, ...) predictions with (N, d1, ...) labels (a segmenter's or a language model's
output, ``F.cross_entropy``'s layout) and ``ignore_index`` (default -100): the result is the
metric of the flattened rows whose label is not ``ignore_index`` (:func:`flatten_valid`).

Tasks: the calibration errors, the reliability curve, :class:`CalibrationMeter` and the
torchmetrics adapter take ``task="multiclass"`` (default), ``"binary"`` ((N,) class-1 scores
with 0/1 labels, torchmetrics' ``BinaryCalibrationError``) or ``"multilabel"`` ((N, L) with
0/1 labels, the mean over labels): :mod:`torchcal.metrics.tasks`.
"""

from __future__ import annotations

from ..errors import TwoColumnWarning
from ._common import warn_if_probabilities
from .binfree import SmoothReliabilityCurve, ks_error, smooth_ece, smooth_reliability_curve
from .binning import (
    bin_index,
    equal_mass_bin_index,
    equal_mass_edges,
    equal_width_bin_index,
    equal_width_edges,
)
from .bootstrap import BootstrapResult, bootstrap_ci
from .calibration import (
    ReliabilityCurve,
    ace,
    adaptive_ece,
    classwise_ece,
    confidence_gap,
    ece,
    ece_noise_floor,
    mce,
    reliability_curve,
    rmsce,
)
from .debiased import debiased_ece
from .layout import IGNORE_INDEX, flatten_valid
from .members import (
    check_member_logits,
    disagreement,
    expected_entropy,
    mutual_information,
    pooled_log_probs,
    predictive_entropy,
)
from .meter import METER_KEYS, CalibrationMeter
from .ranking import (
    AUGRC_RULES,
    E_AURC_OPTIMA,
    FPR_CONVENTIONS,
    OOD_SCORES,
    RiskCoverageCurve,
    augrc,
    aupr,
    aurc,
    auroc,
    e_aurc,
    fpr_at_tpr,
    ood_auroc,
    ood_scores,
    r_auroc,
    risk_at_coverage,
    risk_coverage_curve,
)
from .scoring import brier, entropy, error, nll, s99, topk_error
from .tasks import TASKS

__all__ = [
    "ece",
    "mce",
    "rmsce",
    "ace",
    "adaptive_ece",
    "classwise_ece",
    "confidence_gap",
    "ece_noise_floor",
    "smooth_ece",
    "debiased_ece",
    "ks_error",
    "reliability_curve",
    "ReliabilityCurve",
    "smooth_reliability_curve",
    "SmoothReliabilityCurve",
    "nll",
    "brier",
    "error",
    "topk_error",
    "s99",
    "entropy",
    "auroc",
    "aupr",
    "fpr_at_tpr",
    "FPR_CONVENTIONS",
    "E_AURC_OPTIMA",
    "AUGRC_RULES",
    "aurc",
    "e_aurc",
    "augrc",
    "risk_at_coverage",
    "risk_coverage_curve",
    "RiskCoverageCurve",
    "r_auroc",
    "ood_auroc",
    "ood_scores",
    "OOD_SCORES",
    "predictive_entropy",
    "expected_entropy",
    "mutual_information",
    "disagreement",
    "pooled_log_probs",
    "check_member_logits",
    "bootstrap_ci",
    "BootstrapResult",
    "CalibrationMeter",
    "METER_KEYS",
    "TASKS",
    "TwoColumnWarning",
    "flatten_valid",
    "IGNORE_INDEX",
    "bin_index",
    "equal_width_edges",
    "equal_width_bin_index",
    "equal_mass_edges",
    "equal_mass_bin_index",
    "warn_if_probabilities",
]
