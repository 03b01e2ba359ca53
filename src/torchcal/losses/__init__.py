"""Training losses (``nn.Module``) behind one registry: :func:`create_loss`, :func:`list_losses`."""

from ._registry import create_loss, list_losses, register_loss
from .adafocal import AdaFocalLoss
from .base import CalibrationLoss

__all__ = ["create_loss", "list_losses", "register_loss", "CalibrationLoss", "AdaFocalLoss"]
