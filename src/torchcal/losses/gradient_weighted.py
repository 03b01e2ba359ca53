"""The gradient-weighted (GRA) family and BSCE as :class:`CalibrationLoss` modules."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from .._validation import Options
from ..functional import (
    bsce_gra_loss,
    bsce_loss,
    dual_focal_gra_loss,
    focal_gra_loss,
    gradient_weighted_loss,
)
from ..functional.gradient_weighted import DFL_GRA_DETACH
from ._registry import LIN_2025, LIN_2025_CODE, register_loss
from .base import NON_NEGATIVE, POSITIVE, CalibrationLoss

__all__ = ["GradientWeightedLoss", "BSCEGRALoss", "BSCELoss", "FocalGRALoss", "DualFocalGRALoss"]


class GradientWeightedLoss(CalibrationLoss):
    """Per-sample cross-entropy times a detached weight (the GRA combinator, and the base of the
    GRA presets).

    ``forward(input, target, weight=None)``: with ``weight`` given (one per sample, target's
    shape, or a number) that weight is used; otherwise the loss' own: ``weight_fn(logits,
    target)``, called under ``torch.no_grad()`` on detached logits, or a preset's rule
    (:class:`BSCEGRALoss`, :class:`FocalGRALoss`, :class:`DualFocalGRALoss`).  The batch
    gradient is ``Σ_i w_i ∇CE_i``.

    Example:
        >>> loss = GradientWeightedLoss(lambda x, y: torch.full(y.shape, 2.0), reduction="sum")
        >>> loss(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))  # 2 log 2
        tensor(1.3863)
    """

    def __init__(self, weight_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 *, reduction: str = "mean", ignore_index: int = -100,
                 validate_args: bool = True, **hyperparameters: Any) -> None:
        super().__init__(reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args, **hyperparameters)
        if weight_fn is not None and not callable(weight_fn):
            raise TypeError(f"Expected `weight_fn` to be callable, got {type(weight_fn).__name__}")
        self.weight_fn = weight_fn

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Each preset gets its own copy of ``forward``'s code: ``torch.compile`` (Dynamo) keeps
        # its compiled graphs and its recompile limit per code object, so presets sharing one
        # ``forward`` would use up the limit together (one entry per class, dtype, ...).
        super().__init_subclass__(**kwargs)
        if "forward" not in cls.__dict__:
            cls.forward = _own_copy(cls.forward)

    def forward(self, input: torch.Tensor, target: torch.Tensor,
                weight: torch.Tensor | float | None = None) -> torch.Tensor:
        if weight is None:
            return self.own_weight_loss(input, target)
        return self._weighted(input, target, weight)

    def own_weight_loss(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss with this module's own weight (``weight_fn``; a preset's rule)."""
        if self.weight_fn is None:
            raise ValueError("Expected `weight` (no `weight_fn` was given to the constructor)")
        with torch.no_grad():
            weight = self.weight_fn(input.detach(), target)
        return self._weighted(input, target, weight)

    def _weighted(self, input: torch.Tensor, target: torch.Tensor,
                  weight: torch.Tensor | float) -> torch.Tensor:
        return gradient_weighted_loss(input, target, weight, reduction=self.reduction,
                                      ignore_index=self.ignore_index,
                                      validate_args=self.validate_args)


def _own_copy(fn: Callable) -> Callable:
    """A new function with a new (equal) code object: ``fn``'s behaviour, its own Dynamo cache."""
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__, copy.__doc__ = fn.__kwdefaults__, fn.__doc__
    copy.__qualname__, copy.__annotations__ = fn.__qualname__, dict(fn.__annotations__)
    return copy


class _BrierWeight(CalibrationLoss):
    """The hyperparameters of the Brier-score weight ``‖onehot(y) - p‖_β^γ`` (BSCE, BSCE-GRA)."""

    beta: float
    gamma: float

    _parameter_constraints = {"beta": POSITIVE, "gamma": NON_NEGATIVE}

    def __init__(self, beta: float = 2.0, gamma: float = 2.0, *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        super().__init__(beta=beta, gamma=gamma, reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)


@register_loss("bsce_gra", display="BSCE-GRA", order=13,
               paper=LIN_2025, tags={"demo"})
class BSCEGRALoss(_BrierWeight, GradientWeightedLoss):
    """BSCE-GRA: ``‖onehot(y) - p‖_β^γ`` (detached) times ``-log p_y``
    (see :func:`torchcal.functional.bsce_gra_loss`).

    Args:
        beta: norm order > 0 (default 2).
        gamma: exponent >= 0 (default 2; β = γ = 2 is the Brier score).

    Example:
        >>> BSCEGRALoss()(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
        tensor(0.3466)
    """

    def own_weight_loss(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return bsce_gra_loss(input, target, beta=self.beta, gamma=self.gamma, reduction=self.reduction,
                             ignore_index=self.ignore_index, validate_args=self.validate_args)


@register_loss("bsce", display="BSCE", order=12,
               paper=LIN_2025, tags={"demo"})
class BSCELoss(_BrierWeight):
    """BSCE: ``‖onehot(y) - p‖_β^γ · (-log p_y)`` with the weight **not** detached
    (see :func:`torchcal.functional.bsce_loss`).

    Example:
        >>> BSCELoss()(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
        tensor(0.3466)
    """

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return bsce_loss(input, target, beta=self.beta, gamma=self.gamma, reduction=self.reduction,
                         ignore_index=self.ignore_index, validate_args=self.validate_args)


@register_loss("focal_gra", display="Focal-GRA", order=14,
               paper=LIN_2025_CODE, tags={"demo"})
class FocalGRALoss(GradientWeightedLoss):
    """FL-GRA: ``(1-p_y)^γ`` (detached) times ``-log p_y``; γ default 3.

    Example:
        >>> FocalGRALoss(gamma=1.0)(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
        tensor(0.3466)
    """

    gamma: float

    _parameter_constraints = {"gamma": NON_NEGATIVE}

    def __init__(self, gamma: float = 3.0, *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        super().__init__(gamma=gamma, reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)

    def own_weight_loss(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return focal_gra_loss(input, target, gamma=self.gamma, reduction=self.reduction,
                              ignore_index=self.ignore_index, validate_args=self.validate_args)


@register_loss("dual_focal_gra", display="Dual focal-GRA", order=15,
               paper=LIN_2025_CODE, tags={"demo"})
class DualFocalGRALoss(GradientWeightedLoss):
    """DFL-GRA: ``(1-p_y+p_j)^γ`` (all detached) times ``-log p_y``; γ default 5.

    Departure from the published code: its ``DualFocalLossGra`` detaches only ``p_j`` (the
    gradient also flows through ``1 - p_y``); the value is the same, the gradients differ
    (by half or more of their norm).  ``detach="weight"`` (default) is the GRA rule of the paper; ``detach="p_j"``
    reproduces the published training (see :func:`torchcal.functional.dual_focal_gra_loss`).

    Args:
        gamma: γ >= 0 (default 5).
        detach: ``"weight"`` (default) or ``"p_j"`` (the published code's gradient).

    Example:
        >>> x = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
        >>> DualFocalGRALoss(gamma=1.0)(x, torch.tensor([1]))
        tensor(1.0836)
    """

    gamma: float

    _parameter_constraints = {"gamma": NON_NEGATIVE, "detach": Options(DFL_GRA_DETACH)}

    def __init__(self, gamma: float = 5.0, *, detach: str = "weight", reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        super().__init__(gamma=gamma, detach=detach, reduction=reduction,
                         ignore_index=ignore_index, validate_args=validate_args)

    def own_weight_loss(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return dual_focal_gra_loss(input, target, gamma=self.gamma, detach=self.detach,
                                   reduction=self.reduction,
                                   ignore_index=self.ignore_index,
                                   validate_args=self.validate_args)
