"""Pretrained uncertainty heads (Kirchhof et al. 2024).

:class:`UncertaintyHead` (an MLP reading a frozen backbone's embedding through a stop-gradient),
:func:`ranking_loss` (the pairwise hinge it is trained with).
"""

from .head import UncertaintyHead, per_sample_cross_entropy, ranking_loss

__all__ = ["UncertaintyHead", "ranking_loss", "per_sample_cross_entropy"]
