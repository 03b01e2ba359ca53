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

:class:`CalibrationLoss` also holds a loss' hyperparameters.  Each loss class declares them,
with their constraints, in ``_parameter_constraints`` (scikit-learn's convention): a dict from
name to a callable ``constraint(value, name) -> value`` (:class:`Interval`, :class:`Options`,
:class:`SequenceOf`, re-exported here from :mod:`torchcal._validation`, or a function).  A
subclass passes its hyperparameters to ``super().__init__`` by name; there each is checked by its declared constraint, a name the class
does not declare (or a declared one not passed) is refused with a ``TypeError``, and all are
stored as attributes, kept (:attr:`~CalibrationLoss.hyperparameters`) and shown by ``repr`` in
declaration order, whatever the order of the call.  A subclass adding a hyperparameter declares
``{**Parent._parameter_constraints, "epsilon": Interval(float, 0, None, closed="left")}``.
:data:`HYPERPARAMETER_CHECKS` holds the constraints of torchcal's vocabulary for declarations to
reuse; validation reads only the class's own declaration.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import torch
from torch import nn

from .._validation import Interval, Options, SequenceOf
from ..errors import MissingValidationWarning
from ..functional.blocks import REDUCTIONS

__all__ = ["CalibrationLoss", "MissingValidationWarning", "Interval", "Options", "SequenceOf",
           "HYPERPARAMETER_CHECKS", "NON_NEGATIVE", "POSITIVE",
           "POSITIVE_INT", "ANY_NUMBER", "NUMBERS",
           "NON_NEGATIVE_NUMBERS", "NON_NEGATIVE_INTS", "loss_set_epoch", "loss_on_validation",
           "loss_wants_validation", "loss_log_state", "published_reduction"]


#: A finite number >= 0 (γ, λ, ...).
NON_NEGATIVE = Interval(float, 0, None, closed="left")
#: A finite number > 0 (a norm order, a width, a temperature).
POSITIVE = Interval(float, 0, None, closed="neither")
#: An integer >= 1 (a number of bins or epochs).
POSITIVE_INT = Interval(int, 1, None)
#: Any finite number.
ANY_NUMBER = Interval(float, None, None)
#: Sequences (stored as tuples): of finite numbers (thresholds), of numbers >= 0 (a γ per
#: threshold or epoch range), of integers >= 0 (epoch milestones).
NUMBERS = SequenceOf(ANY_NUMBER)
NON_NEGATIVE_NUMBERS = SequenceOf(NON_NEGATIVE)
NON_NEGATIVE_INTS = SequenceOf(Interval(int, 0, None))

#: The constraints of torchcal's hyperparameter vocabulary, for a loss' ``_parameter_constraints``
#: to reuse (e.g. ``{"gamma": HYPERPARAMETER_CHECKS["gamma"]}``); validation reads only the
#: declaration of the loss' own class.
HYPERPARAMETER_CHECKS: Mapping[str, Callable[[Any, str], Any]] = MappingProxyType({
    "gamma": NON_NEGATIVE,
    "lam": NON_NEGATIVE,
    "alpha": Interval(float, 0, 1, closed="left"),  # label smoothing, in [0, 1)
    "beta": POSITIVE,  # a norm order
    "width": POSITIVE,  # a kernel width
    "bandwidth": POSITIVE,  # a kernel bandwidth
    "p": POSITIVE,  # a norm order
    "temperature": POSITIVE,
    "t_a": POSITIVE,  # soft-binning temperatures (DECE)
    "t_b": POSITIVE,
    "classwise_weight": NON_NEGATIVE,
    "n_bins": POSITIVE_INT,
    "total_epochs": POSITIVE_INT,
})


class CalibrationLoss(nn.Module):
    """Base class of torchcal's losses: holds ``reduction``, ``ignore_index``,
    ``validate_args`` and the loss' hyperparameters, builds ``repr``, and has no-op hooks.

    Args:
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: target value whose entries contribute 0 and are left out of the mean.
        validate_args: check the target range (and per-sample tensors) on every call, with a
            clear error; ``False`` skips these checks (hot loops; as torchmetrics).  Inside
            ``torch.compile`` the checks never read host values either way.
        **hyperparameters: the loss' own settings, each declared with its constraint in the
            class's ``_parameter_constraints`` (see the module docstring).

    Raises:
        TypeError: a hyperparameter the class does not declare, or a declared one missing.
        ValueError: a value its constraint refuses (``Expected `gamma` to be ...``).

    Example:
        >>> class Scaled(CalibrationLoss):
        ...     _parameter_constraints = {"gamma": NON_NEGATIVE}
        ...
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
    #: The loss' hyperparameters and their constraints (``constraint(value, name) -> value``),
    #: in the order ``repr`` shows them; every subclass with hyperparameters declares its own.
    _parameter_constraints: ClassVar[Mapping[str, Callable[[Any, str], Any]]] = {}
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
        declared = type(self)._parameter_constraints
        cls = type(self).__name__
        unknown = [name for name in hyperparameters if name not in declared]
        if unknown:
            raise TypeError(
                f"{cls} got undeclared hyperparameter(s) {unknown}; it declares "
                f"{list(declared)} (a loss declares each hyperparameter with its constraint in "
                f"{cls}._parameter_constraints)")
        missing = [name for name in declared if name not in hyperparameters]
        if missing:
            raise TypeError(f"{cls} declares hyperparameter(s) {missing} in "
                            "_parameter_constraints that were not passed to "
                            "CalibrationLoss.__init__")
        self._hyperparameters = tuple(declared)
        for name, check in declared.items():
            setattr(self, name, check(hyperparameters[name], name))

    @property
    def hyperparameters(self) -> dict[str, Any]:
        """The loss' hyperparameters by name, in the order its class declares them."""
        return {name: getattr(self, name) for name in self._hyperparameters}

    def log_state(self) -> dict[str, Any]:
        """Small inspectable training state for the run's log (JSON-able: numbers, strings and
        lists of them), e.g. AdaFocal's per-bin γ; empty for a stateless loss."""
        return {}

    def extra_repr(self) -> str:
        shown = [(name, getattr(self, name)) for name in self._hyperparameters]
        shown.append(("reduction", self.reduction))
        if self.ignore_index != -100:
            shown.append(("ignore_index", self.ignore_index))
        if not self.validate_args:
            shown.append(("validate_args", False))
        shown += [(name, getattr(self, name)) for name in self.repr_state]
        return ", ".join(f"{name}={value!r}" for name, value in shown)

    #: Attributes that hold per-run state which ``forward`` never reads (history kept for the
    #: log), allowed outside the buffers by :meth:`vmap_problem`.
    unread_state: ClassVar[tuple[str, ...]] = ()
    #: False for a loss whose vmapped call rounds differently from a single call (MMCE: its
    #: weighted kernel sum over the batch runs as a batched product): packed training then
    #: calls each lane's loss on its own rows, so that a packed run equals its separate run
    #: bit for bit on the CPU.
    vmap_rounds_alike: ClassVar[bool] = True

    def vmap_problem(self) -> str | None:
        """Why this loss cannot be evaluated for several packed runs in one vmapped call (None:
        it can).

        Packed training (:mod:`torchcal.train.packed`) evaluates the lanes that share a loss
        class and its hyperparameters with one ``torch.func.vmap`` call over
        ``functional_call(loss, stacked_buffers, ...)``: every piece of state in which lanes
        may differ must be a buffer (AdaFocal's γ, a temperature), and ``forward`` must be a
        pure function of its inputs, the hyperparameters and the buffers (state changes only
        in ``set_epoch`` / ``on_validation``, which every lane of a group receives at the
        same epoch).  Refused here: trainable parameters and tensors held outside the buffers.
        """
        if any(True for _ in self.parameters()):
            return f"{type(self).__name__} has trainable parameters"
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor) and name not in self.unread_state:
                return (f"{type(self).__name__} holds the tensor {name!r} outside its buffers "
                        "(a lane's state could not be stacked)")
        return None

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


def loss_log_state(loss: nn.Module) -> dict[str, Any]:
    """The loss' :meth:`~CalibrationLoss.log_state` (empty for a loss without one, e.g.
    ``nn.CrossEntropyLoss``)."""
    fn = getattr(loss, "log_state", None)
    return dict(fn()) if callable(fn) else {}


def published_reduction(loss: Any) -> str:
    return str(getattr(loss, "published_reduction", "sum"))
