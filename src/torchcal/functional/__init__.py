"""Plain-function forms of torchcal's losses (the ``nn.Module`` losses call these).

Every loss follows ``F.cross_entropy``'s calling convention:
``loss(input, target, ..., *, reduction="mean", ignore_index=-100)``.
"""

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

__all__ = [
    "FLSD53",
    "FLSD532",
    "flsd53_loss",
    "flsd532_loss",
    "focal_gamma_star",
    "focal_loss",
    "inverse_focal_loss",
    "sample_dependent_focal_loss",
    "sample_dependent_gamma",
    "signed_focal_loss",
]
