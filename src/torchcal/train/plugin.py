"""The interface of a run's plug-in: :class:`RunPlugin`, the hooks through which the training
engine lets an optional strategy change what a run trains (the joint uncertainty head,
:class:`~torchcal.train.joint_head.JointHead`; the multi-task strategy,
:class:`~torchcal.train.multitask.TaskHead`).  A run without one gets a bare
:class:`RunPlugin`, whose hooks do nothing, so the loop has no special case.

A plug-in is not a network head: "head" names the uncertainty head
(:class:`~torchcal.uncertainty.UncertaintyHead`) and a multi-task regression head, which a
plug-in may train.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .config import TrainConfig

__all__ = ["RunPlugin"]


class RunPlugin:
    """The hooks a run's plug-in gives the engine, each doing nothing here: the plug-in of a run
    with neither a joint uncertainty head nor tasks.

    :class:`~torchcal.train.joint_head.JointHead` and
    :class:`~torchcal.train.multitask.TaskHead` override them; the training loop calls the hooks
    unconditionally.
    """

    #: Whether the schedule steps after every batch (:meth:`make_schedule`'s) or every epoch.
    per_step_schedule = False

    def make_optimizer(self, model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer | None:
        """The run's optimiser (None: the recipe's SGD over the model's parameters)."""
        return None

    def make_schedule(self, optimizer: torch.optim.Optimizer, steps: int) -> Any:
        """The run's learning-rate schedule over ``steps`` batches (None: the multistep
        schedule of the config's milestones)."""
        return None

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module the loop calls: ``forward(x)`` -> logits (or logits and features)."""
        return model

    def split(self, out: Any) -> tuple[torch.Tensor, Any]:
        """``(logits, features)`` of the wrapped module's output."""
        return out, None

    def distribute(self, device_ids: list[int] | None) -> None:
        """Wrap the head's modules in DistributedDataParallel."""

    def start_epoch(self) -> None:
        """Train mode and a fresh epoch sum of the head's loss."""

    def add_loss(self, total: torch.Tensor, logits: torch.Tensor, feats: Any,
                 y: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """``total`` plus the head's loss on this batch (``index``: its sample indices)."""
        return total

    def zero_grad(self) -> None:
        """Clear the head's gradients."""

    def step(self, scaler: torch.amp.GradScaler) -> None:
        """Step the head's optimiser (through the loop's scaler)."""

    def state(self, full: bool) -> dict[str, Any]:
        """The checkpoint entries of the head (``full``: with the optimiser's state)."""
        return {"head": None, "head_optimizer": None}

    def load(self, state: dict[str, Any]) -> None:
        """Restore the head from a checkpoint's entries."""

    def log(self, rec: dict[str, Any], n_batches: int) -> None:
        """Add the head's epoch numbers to a log record."""

    def results(self) -> dict[str, Any] | None:
        """What the head adds to the run's ``results.json`` (None: nothing)."""
        return None
