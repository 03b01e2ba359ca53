"""Training losses (``nn.Module``) behind one registry: :func:`create_loss`, :func:`list_losses`."""

from ..errors import MissingValidationWarning
from ._registry import LOSSES, create_loss, list_losses, loss_entrypoint, register_loss
from .adafocal import AdaFocalLoss
from .base import CalibrationLoss
from .brier import BrierLoss
from .cross_entropy import CrossEntropyLoss
from .dual_focal import DualFocalLoss
from .ece_losses import DECELoss, ECEGapLoss, ECEKDELoss
from .exp_weighted import (
    BrierExpLoss,
    CrossEntropyExpLoss,
    DualFocalExpLoss,
    ExpWeightedLoss,
    FocalExpLoss,
)
from .focal import FocalLoss, InverseFocalLoss, SampleDependentFocalLoss, ScheduledFocalLoss
from .gra_variants import BSCEAdaptiveGRALoss, SampleDependentFocalGRALoss, TLBSLoss
from .gradient_weighted import (
    BSCEGRALoss,
    BSCELoss,
    DualFocalGRALoss,
    FocalGRALoss,
    GradientWeightedLoss,
)
from .label_smoothing import LabelSmoothingLoss
from .mmce import MMCELoss
from .mmce_unweighted import MMCEGRALoss, MMCEUnweightedLoss
from .multitask import UncertaintyWeighting
from .temperature import (
    ConsistencyLoss,
    TemperatureBSCEGRALoss,
    TemperatureBSCELoss,
    TemperatureDualFocalGRALoss,
    TemperatureDualFocalLoss,
    TemperatureFocalGRALoss,
    TemperatureFocalLoss,
)

__all__ = [
    "create_loss",
    "list_losses",
    "loss_entrypoint",
    "LOSSES",
    "register_loss",
    "CalibrationLoss",
    "MissingValidationWarning",
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
    "BrierExpLoss",
    "BSCEAdaptiveGRALoss",
    "ConsistencyLoss",
    "CrossEntropyExpLoss",
    "DECELoss",
    "DualFocalExpLoss",
    "ECEGapLoss",
    "ECEKDELoss",
    "ExpWeightedLoss",
    "FocalExpLoss",
    "MMCEGRALoss",
    "MMCEUnweightedLoss",
    "SampleDependentFocalGRALoss",
    "TemperatureBSCEGRALoss",
    "TemperatureBSCELoss",
    "TemperatureDualFocalGRALoss",
    "TemperatureDualFocalLoss",
    "TemperatureFocalGRALoss",
    "TemperatureFocalLoss",
    "TLBSLoss",
]
