"""Plain-function forms of torchcal's losses (the ``nn.Module`` losses call these).

Every loss follows ``F.cross_entropy``'s calling convention:
``loss(input, target, ..., *, reduction="mean", ignore_index=-100)`` with logits of shape
(N, C) or (N, C, d1, ...) and integer class-index targets; it computes in float32 (float64
for float64 input; also for bfloat16/half input and under autocast) and returns float32/float64.

The building blocks of a loss in log-space (reductions, argument checks, the target's
log-probabilities) are helpers, not losses: :mod:`torchcal.functional.blocks`.
"""

from .basic import brier_loss, cross_entropy, label_smoothing_loss
from .dual_focal import dual_focal_loss
from .ece_losses import (
    dece,
    dece_loss,
    ece_gap_loss,
    ece_gap_weight,
    ece_kde,
    ece_kde_loss,
    kde_bandwidth,
)
from .exp_weighted import (
    brier_exp_loss,
    ce_exp_loss,
    dual_focal_exp_loss,
    exp_weight,
    focal_exp_loss,
)
from .focal import (
    FLSD53,
    FLSD532,
    flsd53_loss,
    flsd532_loss,
    focal_gamma_star,
    focal_loss,
    inverse_focal_loss,
    sample_dependent_focal_loss,
    sample_dependent_gamma,
    signed_focal_loss,
)
from .gra_variants import (
    bsce_adaptive_gra_loss,
    consistency_loss,
    sample_dependent_focal_gra_loss,
    tlbs_loss,
)
from .gradient_weighted import (
    brier_uncertainty,
    bsce_gra_loss,
    bsce_loss,
    dual_focal_gra_loss,
    focal_gra_loss,
    gradient_weighted_loss,
)
from .mmce import mmce_loss, mmce_penalty
from .mmce_unweighted import mmce_gra_loss, mmce_unweighted_loss, mmce_unweighted_penalty
from .temperature import (
    temperature_bsce_gra_loss,
    temperature_bsce_loss,
    temperature_dual_focal_gra_loss,
    temperature_dual_focal_loss,
    temperature_focal_gra_loss,
    temperature_focal_loss,
)

__all__ = [
    "FLSD53",
    "FLSD532",
    "brier_loss",
    "brier_uncertainty",
    "bsce_gra_loss",
    "bsce_loss",
    "cross_entropy",
    "dual_focal_gra_loss",
    "dual_focal_loss",
    "flsd53_loss",
    "flsd532_loss",
    "focal_gamma_star",
    "focal_gra_loss",
    "focal_loss",
    "gradient_weighted_loss",
    "inverse_focal_loss",
    "label_smoothing_loss",
    "mmce_loss",
    "mmce_penalty",
    "sample_dependent_focal_loss",
    "sample_dependent_gamma",
    "signed_focal_loss",
    "brier_exp_loss",
    "bsce_adaptive_gra_loss",
    "ce_exp_loss",
    "consistency_loss",
    "dece",
    "dece_loss",
    "dual_focal_exp_loss",
    "ece_gap_loss",
    "ece_gap_weight",
    "ece_kde",
    "ece_kde_loss",
    "exp_weight",
    "focal_exp_loss",
    "kde_bandwidth",
    "mmce_gra_loss",
    "mmce_unweighted_loss",
    "mmce_unweighted_penalty",
    "sample_dependent_focal_gra_loss",
    "temperature_bsce_gra_loss",
    "temperature_bsce_loss",
    "temperature_dual_focal_gra_loss",
    "temperature_dual_focal_loss",
    "temperature_focal_gra_loss",
    "temperature_focal_loss",
    "tlbs_loss",
]
