"""Focal-family losses: focal, inverse focal, sample-dependent (FLSD) and scheduled (FLSc) γ.

The Lambert-W γ policy of Proposition 2 is :func:`torchcal.functional.focal_gamma_star`;
a custom sample-dependent schedule is ``SampleDependentFocalLoss(thresholds, gammas)``.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import torch

from .._validation import check_scalar
from ..functional import focal_loss, inverse_focal_loss, sample_dependent_focal_loss
from ..functional.focal import FLSD53, FLSD532, _check_schedule
from ._registry import register_loss
from .base import CalibrationLoss

__all__ = [
    "FocalLoss",
    "InverseFocalLoss",
    "SampleDependentFocalLoss",
    "ScheduledFocalLoss",
    "flsd53",
    "flsd532",
    "flsc531",
    "flsc532",
]


@register_loss("focal", display="Focal", order=4,
               paper="Mukhoti et al., NeurIPS 2020", tags={"demo"})
class FocalLoss(CalibrationLoss):
    """Focal loss ``-(1-p_y)^γ log p_y`` (see :func:`torchcal.functional.focal_loss`).

    Args:
        gamma: γ >= 0 (default 3, the paper's best fixed value).

    Example:
        >>> FocalLoss(gamma=1.0)(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
        tensor(0.3466)
    """

    gamma: float

    def __init__(self, gamma: float = 3.0, *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        super().__init__(gamma=gamma, reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return focal_loss(input, target, self.gamma, reduction=self.reduction,
                          ignore_index=self.ignore_index, validate_args=self.validate_args)


@register_loss("inverse_focal", display="Inverse focal", order=5,
               paper="Wang et al., NeurIPS 2021", tags={"demo"})
class InverseFocalLoss(CalibrationLoss):
    """Inverse focal loss ``-(1+p_y)^γ log p_y`` (see :func:`torchcal.functional.inverse_focal_loss`).

    Example:
        >>> InverseFocalLoss(gamma=1.0)(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
        tensor(1.0397)
    """

    gamma: float

    def __init__(self, gamma: float = 3.0, *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        super().__init__(gamma=gamma, reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return inverse_focal_loss(input, target, self.gamma, reduction=self.reduction,
                                  ignore_index=self.ignore_index,
                                  validate_args=self.validate_args)


class SampleDependentFocalLoss(CalibrationLoss):
    """Focal loss with γ picked per sample from ``p_y`` by thresholds (FLSD).

    ``γ_i = gammas[k]`` with ``k = #{j : thresholds[j] <= p_{y_i}}`` (no gradient through the
    choice).  Defaults are FLSD-53; registered presets ``flsd53`` and ``flsd532``.

    Example:
        >>> loss = SampleDependentFocalLoss(thresholds=(0.2, 0.5), gammas=(5.0, 3.0, 2.0))
        >>> loss(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))  # p_y = 0.5 -> γ = 2
        tensor(0.1733)
    """

    thresholds: tuple[float, ...]
    gammas: tuple[float, ...]

    def __init__(self, thresholds: Sequence[float] = FLSD53[0],
                 gammas: Sequence[float] = FLSD53[1], *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        thr, gam = _check_schedule(thresholds, gammas)
        super().__init__(thresholds=thr, gammas=gam, reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return sample_dependent_focal_loss(input, target, self.thresholds, self.gammas,
                                           reduction=self.reduction,
                                           ignore_index=self.ignore_index,
                                           validate_args=self.validate_args)


@register_loss("flsd53", display="FLSD-53", order=6,
               paper="Mukhoti et al., NeurIPS 2020", tags={"demo"})
def flsd53(*, reduction: str = "mean", ignore_index: int = -100,
           validate_args: bool = True) -> SampleDependentFocalLoss:
    """FLSD-53: γ = 5 for p_y < 0.2, else 3."""
    return SampleDependentFocalLoss(*FLSD53, reduction=reduction, ignore_index=ignore_index,
                                    validate_args=validate_args)


@register_loss("flsd532", display="FLSD-532", order=7,
               paper="Mukhoti et al., NeurIPS 2020", tags={"demo"})
def flsd532(*, reduction: str = "mean", ignore_index: int = -100,
            validate_args: bool = True) -> SampleDependentFocalLoss:
    """FLSD-532: γ = 5 for p_y < 0.2, 3 for 0.2 <= p_y < 0.5, 2 for p_y >= 0.5."""
    return SampleDependentFocalLoss(*FLSD532, reduction=reduction, ignore_index=ignore_index,
                                    validate_args=validate_args)


class ScheduledFocalLoss(CalibrationLoss):
    """Focal loss whose γ depends on the epoch (FLSc), set by the trainer's ``set_epoch(epoch)``.

    ``γ = gammas[k]`` with ``k = #{j : milestones[j] <= epoch}``; the presets ``flsc531`` and
    ``flsc532`` use γ = 5 for epochs [0, 100), 3 for [100, 250), then 1 (or 2).  The current
    epoch is saved in ``state_dict()`` (extra state), so a resumed run keeps its γ.

    Example:
        >>> loss = ScheduledFocalLoss(milestones=(100, 250), gammas=(5.0, 3.0, 1.0))
        >>> loss.gamma, loss.set_epoch(100), loss.gamma, loss.set_epoch(250), loss.gamma
        (5.0, None, 3.0, None, 1.0)
    """

    milestones: tuple[int, ...]
    gammas: tuple[float, ...]

    repr_state = ("epoch",)

    def __init__(self, milestones: Sequence[int] = (100, 250),
                 gammas: Sequence[float] = (5.0, 3.0, 1.0), *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        try:
            ms = tuple(milestones)
        except TypeError as e:  # not iterable
            raise ValueError(
                f"Expected `milestones` to be a sequence of non-negative integers, got {milestones!r}"
            ) from e
        if any(isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 0 for m in ms):
            raise ValueError(
                f"Expected `milestones` to be non-negative integers, got {list(milestones)}"
            )
        _, gam = _check_schedule([float(m) for m in ms], gammas, ("milestones", "gammas"))
        super().__init__(milestones=tuple(int(m) for m in ms), gammas=gam, reduction=reduction,
                         ignore_index=ignore_index, validate_args=validate_args)
        self.epoch = 0
        # γ as tensor state for torch.compile (not saved: the epoch in the extra state is);
        # shape (1,): Dynamo would read a 0-d float buffer as a Python scalar and restart
        self.register_buffer("gamma_tensor", torch.full((1,), gam[0], dtype=torch.float64),
                             persistent=False)

    @property
    def gamma(self) -> float:
        k = sum(1 for m in self.milestones if m <= self.epoch)
        return self.gammas[k]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = check_scalar(epoch, "epoch", int, min_val=0)
        self.gamma_tensor.fill_(self.gamma)

    def get_extra_state(self) -> Any:
        return {"epoch": self.epoch}

    def set_extra_state(self, state: Any) -> None:
        self.set_epoch(int(state["epoch"]))

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # Eager: γ as a number (no host sync).  Compiled: γ as a tensor input of the graph, so
        # that a new epoch's γ does not recompile it.
        gamma = self.gamma_tensor[0] if torch.compiler.is_compiling() else self.gamma
        return focal_loss(input, target, gamma, reduction=self.reduction,
                          ignore_index=self.ignore_index, validate_args=self.validate_args)


@register_loss("flsc531", display="FLSc-531", order=8, tags={"cifar-schedule"})
def flsc531(*, reduction: str = "mean", ignore_index: int = -100,
            validate_args: bool = True) -> ScheduledFocalLoss:
    """FLSc-531: γ = 5 for epochs [0, 100), 3 for [100, 250), 1 afterwards."""
    return ScheduledFocalLoss((100, 250), (5.0, 3.0, 1.0), reduction=reduction,
                              ignore_index=ignore_index, validate_args=validate_args)


@register_loss("flsc532", display="FLSc-532", order=9, tags={"cifar-schedule"})
def flsc532(*, reduction: str = "mean", ignore_index: int = -100,
            validate_args: bool = True) -> ScheduledFocalLoss:
    """FLSc-532: γ = 5 for epochs [0, 100), 3 for [100, 250), 2 afterwards."""
    return ScheduledFocalLoss((100, 250), (5.0, 3.0, 2.0), reduction=reduction,
                              ignore_index=ignore_index, validate_args=validate_args)
