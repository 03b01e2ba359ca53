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

A loss that wants validation (AdaFocal, the temperature-aware losses, the ECE loss) without
its validation statistics silently becomes another loss (AdaFocal stays focal loss with its
initial γ).  So when ``set_epoch`` starts an epoch after the first one that this object has
seen start, and no validation statistics arrived in between (``on_validation`` or the loss'
own update call, :attr:`CalibrationLoss.validation_call`), the loss warns once
(:class:`MissingValidationWarning`), naming itself and the call it missed.  A loss freshly
loaded from a checkpoint does not warn at its first ``set_epoch``.

State such as AdaFocal's γ lives in buffers / ``get_extra_state`` so that ``state_dict()`` /
``load_state_dict()`` round-trip it through a ``weights_only=True`` checkpoint.

``published_reduction`` names how the papers' code reduces the loss over a batch
(REFERENCE.md §1: ``"sum"`` for most losses, ``"mean"`` for Brier; MMCE with ``"sum"`` gives
N·(CE_mean + λ·MMCE)).  A faithful recipe sets ``loss.reduction = loss.published_reduction``.

:class:`CalibrationLoss` also holds a loss' hyperparameters: a subclass passes them to
``super().__init__`` by name; the names of torchcal's vocabulary (``gamma``, ``lam``, ``alpha``,
``beta``, ``width``) are validated there (:data:`HYPERPARAMETER_CHECKS`), any other (a choice
such as ``spread``, a schedule) is validated by the subclass first, and all of them are stored
as attributes and shown by ``repr`` in the order given.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .._validation import check_scalar
from ..functional._common import check_alpha
from ..functional._loss_utils import REDUCTIONS

__all__ = ["CalibrationLoss", "HYPERPARAMETER_CHECKS", "MissingValidationWarning", "loss_set_epoch", "loss_on_validation",
           "loss_wants_validation", "published_reduction"]


def _non_negative(value: Any, name: str) -> float:
    return check_scalar(value, name, float, min_val=0.0)


def _positive(value: Any, name: str) -> float:
    return check_scalar(value, name, float, min_val=0.0, include_boundaries="neither")


def _positive_int(value: Any, name: str) -> int:
    return check_scalar(value, name, int, min_val=1)


#: How :class:`CalibrationLoss` validates each hyperparameter name of torchcal's vocabulary
#: (every check is :func:`torchcal._validation.check_scalar`).
HYPERPARAMETER_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "gamma": _non_negative,
    "lam": _non_negative,
    "alpha": check_alpha,  # label smoothing, in [0, 1)
    "beta": _positive,  # a norm order
    "width": _positive,  # a kernel width
    "bandwidth": _positive,  # a kernel bandwidth
    "p": _positive,  # a norm order
    "temperature": _positive,
    "t_a": _positive,  # soft-binning temperatures (DECE)
    "t_b": _positive,
    "classwise_weight": _non_negative,
    "n_bins": _positive_int,
    "total_epochs": _positive_int,
}


class MissingValidationWarning(UserWarning):
    """A loss that needs validation statistics started an epoch without them."""


class CalibrationLoss(nn.Module):
    """Base class of torchcal's losses: holds ``reduction``, ``ignore_index``,
    ``validate_args`` and the loss' hyperparameters, builds ``repr``, and has no-op hooks.

    Args:
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: target value whose entries contribute 0 and are left out of the mean.
        validate_args: check the target range (and per-sample tensors) on every call, with a
            clear error; ``False`` skips these checks (hot loops; as torchmetrics).  Inside
            ``torch.compile`` the checks never read host values either way.
        **hyperparameters: the loss' own settings, stored as attributes in this order (see the
            module docstring).

    Example:
        >>> class Scaled(CalibrationLoss):
        ...     def __init__(self, gamma=2.0, *, reduction="mean"):
        ...         super().__init__(gamma=gamma, reduction=reduction)
        >>> Scaled(3)
        Scaled(gamma=3.0, reduction='mean')
    """

    published_reduction: str = "sum"
    wants_validation: bool = False
    update_every: int | None = None
    #: Attributes of training state (not hyperparameters) that ``repr`` shows last, e.g. the
    #: epoch of a scheduled loss.
    repr_state: tuple[str, ...] = ()
    #: The method that feeds a loss with ``wants_validation`` its validation statistics,
    #: named by the :class:`MissingValidationWarning` (``on_validation`` works for every one).
    validation_call: str = "on_validation"
    #: What a loss becomes without validation statistics (said by the warning).
    missing_validation_effect: str = "its validation-driven state never changes"

    def __init__(self, *, reduction: str = "mean", ignore_index: int = -100,
                 validate_args: bool = True, **hyperparameters: Any) -> None:
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"Expected `reduction` to be one of {REDUCTIONS}, got {reduction!r}")
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
            raise TypeError(f"Expected `ignore_index` to be an integer, got {ignore_index!r}")
        if not isinstance(validate_args, bool):
            raise TypeError(f"Expected `validate_args` to be a bool, got {validate_args!r}")
        self.reduction = reduction
        self.ignore_index = int(ignore_index)
        self.validate_args = validate_args
        self._hyperparameters = tuple(hyperparameters)
        for name, value in hyperparameters.items():
            check = HYPERPARAMETER_CHECKS.get(name)
            setattr(self, name, value if check is None else check(value, name))

    def extra_repr(self) -> str:
        shown = [(name, getattr(self, name)) for name in self._hyperparameters]
        shown.append(("reduction", self.reduction))
        if self.ignore_index != -100:
            shown.append(("ignore_index", self.ignore_index))
        if not self.validate_args:
            shown.append(("validate_args", False))
        shown += [(name, getattr(self, name)) for name in self.repr_state]
        return ", ".join(f"{name}={value!r}" for name, value in shown)

    def set_epoch(self, epoch: int) -> None:
        """Called by the trainer at the start of each training epoch (0-based).

        A loss with ``wants_validation`` warns here (once) when a previous epoch started on it
        and no validation statistics arrived since (module docstring); a subclass that
        overrides ``set_epoch`` calls ``super().set_epoch(epoch)``.
        """
        if self.wants_validation:
            self._check_validation_received(epoch)

    def on_validation(self, *, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Called by the trainer after each validation pass when ``wants_validation``."""

    def _validation_received(self) -> None:
        """Record that validation statistics arrived (called by the loss' update method)."""
        self.__dict__["_validation_since_epoch"] = True

    def _check_validation_received(self, epoch: int) -> None:
        last = self.__dict__.get("_last_epoch_started")
        received = self.__dict__.get("_validation_since_epoch", False)
        self.__dict__["_last_epoch_started"] = epoch
        self.__dict__["_validation_since_epoch"] = False
        if (last is None or received or epoch == last
                or self.__dict__.get("_warned_missing_validation", False)):
            return
        self.__dict__["_warned_missing_validation"] = True
        call = f"`loss.{self.validation_call}(logits=..., labels=...)`"
        if self.validation_call != "on_validation":
            call += " (or `on_validation`)"
        warnings.warn(
            f"{type(self).__name__}: epoch {epoch} started without validation statistics since "
            f"epoch {last}: call {call} with the validation logits and labels after each "
            "validation pass, or use a trainer/callback that does; without them "
            f"{self.missing_validation_effect}",
            MissingValidationWarning, stacklevel=3,
        )



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
