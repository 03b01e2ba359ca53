"""Training losses (``nn.Module``) behind one registry: :func:`create_loss`, :func:`list_losses`."""

from ._registry import create_loss, list_losses, register_loss
from .adafocal import AdaFocalLoss
from .base import CalibrationLoss
from .brier import BrierLoss
from .cross_entropy import CrossEntropyLoss
from .dual_focal import DualFocalLoss
from .focal import FocalLoss, InverseFocalLoss, SampleDependentFocalLoss, ScheduledFocalLoss
from .gradient_weighted import (
    BSCEGRALoss,
    BSCELoss,
    DualFocalGRALoss,
    FocalGRALoss,
    GradientWeightedLoss,
)
from .label_smoothing import LabelSmoothingLoss
from .mmce import MMCELoss
from .multitask import UncertaintyWeighting

__all__ = [
    "create_loss",
    "list_losses",
    "register_loss",
    "CalibrationLoss",
    "AdaFocalLoss",
    "BrierLoss",
    "BSCEGRALoss",
    "BSCELoss",
    "CrossEntropyLoss",
    "DualFocalGRALoss",
    "DualFocalLoss",
    "FocalGRALoss",
    "FocalLoss",
    "GradientWeightedLoss",
    "InverseFocalLoss",
    "LabelSmoothingLoss",
    "MMCELoss",
    "SampleDependentFocalLoss",
    "ScheduledFocalLoss",
    "UncertaintyWeighting",
]
