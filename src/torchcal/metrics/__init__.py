"""Calibration, scoring and ranking metrics (exact, vectorised, torch or NumPy input).

Every metric takes keyword arguments only: exactly one of ``logits=`` / ``probs=`` of shape
(N, C) plus ``labels=`` (N,), and returns 0-d tensors on the input's device.  Bin conventions
live in :mod:`torchcal.metrics.binning`.
"""

from __future__ import annotations

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
from .meter import CalibrationMeter
from .ranking import aupr, aurc, auroc, fpr_at_tpr, ood_auroc, ood_scores, r_auroc
from .scoring import brier, entropy, error, nll, s99, topk_error

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
    "aurc",
    "r_auroc",
    "ood_auroc",
    "ood_scores",
    "bootstrap_ci",
    "BootstrapResult",
    "CalibrationMeter",
    "bin_index",
    "equal_width_edges",
    "equal_width_bin_index",
    "equal_mass_edges",
    "equal_mass_bin_index",
    "warn_if_probabilities",
]
