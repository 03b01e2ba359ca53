"""The small protocol a training loop uses to drive any loss, stateful or not.

A trainer never special-cases a loss.  It calls, for every loss (plain ``nn.Module`` losses
such as ``nn.CrossEntropyLoss`` included, via the module-level helpers below):

* ``set_epoch(epoch)`` at the start of each training epoch (0-based) - scheduled focal
  picks its γ here;
* ``on_validation(logits=..., labels=...)`` after each validation pass, with the full
  validation logits and labels of this process (under DDP, each rank's share; the loss syncs
  across ranks itself) - AdaFocal moves its per-bin γ here.  ``wants_validation`` says whether
  the trainer needs to produce those outputs; ``update_every`` (None, or a number of batches)
  asks for extra validation passes every n training batches.

State such as AdaFocal's γ lives in buffers / ``get_extra_state`` so that ``state_dict()`` /
``load_state_dict()`` round-trip it through a ``weights_only=True`` checkpoint.

``published_reduction`` names how the papers' code reduces the loss over a batch
(REFERENCE.md §1: ``"sum"`` for most losses, ``"mean"`` for Brier; MMCE with ``"sum"`` gives
N·(CE_mean + λ·MMCE)).  A faithful recipe sets ``loss.reduction = loss.published_reduction``.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch import nn

__all__ = ["CalibrationLoss", "loss_set_epoch", "loss_on_validation", "loss_wants_validation",
           "published_reduction"]


class CalibrationLoss(nn.Module):
    """Base class of torchcal's losses: stores ``reduction``/``ignore_index`` and no-op hooks."""

    published_reduction: str = "sum"
    wants_validation: bool = False
    update_every: int | None = None

    def __init__(self, *, reduction: str = "mean", ignore_index: int = -100) -> None:
        super().__init__()
        from ..functional._loss_utils import REDUCTIONS

        if reduction not in REDUCTIONS:
            raise ValueError(f"Expected `reduction` to be one of {REDUCTIONS}, got {reduction!r}")
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
            raise TypeError(f"Expected `ignore_index` to be an integer, got {ignore_index!r}")
        self.reduction = reduction
        self.ignore_index = int(ignore_index)

    def set_epoch(self, epoch: int) -> None:
        """Called by the trainer at the start of each training epoch (0-based)."""

    def on_validation(self, *, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Called by the trainer after each validation pass when ``wants_validation``."""


def loss_set_epoch(loss: nn.Module, epoch: int) -> None:
    fn = getattr(loss, "set_epoch", None)
    if callable(fn):
        fn(epoch)


def loss_wants_validation(loss: nn.Module) -> bool:
    return bool(getattr(loss, "wants_validation", False))


def loss_on_validation(loss: nn.Module, *, logits: torch.Tensor, labels: torch.Tensor) -> None:
    fn = getattr(loss, "on_validation", None)
    if callable(fn) and loss_wants_validation(loss):
        fn(logits=logits, labels=labels)


def published_reduction(loss: Any) -> str:
    return str(getattr(loss, "published_reduction", "sum"))
