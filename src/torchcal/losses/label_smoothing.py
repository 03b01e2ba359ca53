"""Label smoothing as a :class:`CalibrationLoss` (both conventions, see the functional form)."""

from __future__ import annotations

import torch

from ..functional import label_smoothing_loss
from ..functional.basic import SPREADS
from ._registry import register_loss
from .base import CalibrationLoss

__all__ = ["LabelSmoothingLoss"]


@register_loss("ls", display="Label smoothing", order=1,
               paper="Szegedy et al., CVPR 2016", tags={"demo"})
class LabelSmoothingLoss(CalibrationLoss):
    """Cross-entropy against smoothed targets (see :func:`torchcal.functional.label_smoothing_loss`).

    Args:
        alpha: smoothing in [0, 1) (default 0.05).
        spread: ``"others"`` (default; ``q_c = α/(C-1)`` off the true class, as the
            focal-calibration code) or ``"uniform"`` (PyTorch's ``label_smoothing``).

    Example:
        >>> LabelSmoothingLoss(alpha=0.1)(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
        tensor(0.6931)
    """

    alpha: float
    spread: str

    def __init__(self, alpha: float = 0.05, spread: str = "others", *, reduction: str = "mean", ignore_index: int = -100,
                 validate_args: bool = True) -> None:
        if spread not in SPREADS:
            raise ValueError(f"Expected `spread` to be one of {SPREADS}, got {spread!r}")
        super().__init__(alpha=alpha, spread=spread, reduction=reduction, ignore_index=ignore_index, validate_args=validate_args)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return label_smoothing_loss(input, target, self.alpha, spread=self.spread,
                                    reduction=self.reduction, ignore_index=self.ignore_index,
                                    validate_args=self.validate_args)
