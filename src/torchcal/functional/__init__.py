"""Plain-function forms of torchcal's losses (the ``nn.Module`` losses call these).

Every loss follows ``F.cross_entropy``'s calling convention:
``loss(input, target, ..., *, reduction="mean", ignore_index=-100)`` with logits of shape
(N, C) or (N, C, d1, ...) and integer class-index targets; it computes in float32 (float64
for float64 input; also for bfloat16/half input and under autocast) and returns float32/float64.
"""

from .basic import brier_loss, cross_entropy, label_smoothing_loss
from .dual_focal import dual_focal_loss
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
from .gradient_weighted import (
    brier_uncertainty,
    bsce_gra_loss,
    bsce_loss,
    dual_focal_gra_loss,
    focal_gra_loss,
    gradient_weighted_loss,
)
from .mmce import mmce_loss, mmce_penalty

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
]
