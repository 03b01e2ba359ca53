"""The trainer's plug-in for the optional joint uncertainty head (``joint_head``):
:class:`JointHead` trains a :class:`~torchcal.uncertainty.UncertaintyHead` on the model's
features beside the classifier; :class:`NoHead` is the same hooks doing nothing, so the training
loop calls them unconditionally."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..uncertainty import UncertaintyHead, ranking_loss
from .config import TrainConfig
from .distributed import epoch_seed

__all__ = ["NoHead", "JointHead", "FeaturesAndLogits"]


class NoHead:
    """The trainer's hooks when no joint uncertainty head is trained: every hook does nothing.

    :class:`JointHead` overrides them; the training loop calls the hooks unconditionally.
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


class JointHead(NoHead):
    """A :class:`~torchcal.uncertainty.UncertaintyHead` trained jointly on the model's features
    with the ranking loss against the per-sample cross-entropy (AdamW, its own learning rate)."""

    def __init__(self, model: nn.Module, config: TrainConfig, device: torch.device) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(epoch_seed(config.seed, 0, stream=7))
            self.head: nn.Module = UncertaintyHead(int(model.num_features)).to(device)
        self.opt = torch.optim.AdamW(self.head.parameters(), lr=config.joint_head.lr,
                                     weight_decay=config.joint_head.weight_decay)
        self.loss_sum = torch.zeros((), device=device)

    def wrap(self, model: nn.Module) -> nn.Module:
        return FeaturesAndLogits(model)

    def split(self, out: Any) -> tuple[torch.Tensor, Any]:
        return out

    def distribute(self, device_ids: list[int] | None) -> None:
        self.head = DistributedDataParallel(self.head, device_ids=device_ids)

    def start_epoch(self) -> None:
        self.head.train()
        self.loss_sum = torch.zeros((), device=self.loss_sum.device)

    def add_loss(self, total, logits, feats, y, index=None):
        m = (y.shape[0] // 2) * 2
        if m < 2:
            return total
        target = F.cross_entropy(logits.detach(), y, reduction="none")
        hl = ranking_loss(self.head(feats[:m].float()), target[:m])
        self.loss_sum = self.loss_sum + hl.detach()
        return total + hl

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)

    def step(self, scaler: torch.amp.GradScaler) -> None:
        scaler.step(self.opt)

    def state(self, full: bool) -> dict[str, Any]:
        h = getattr(self.head, "module", self.head)
        return {"head": h.state_dict(), "head_optimizer": self.opt.state_dict() if full else None}

    def load(self, state: dict[str, Any]) -> None:
        if not state.get("head"):
            raise KeyError("no uncertainty head state")
        self.head.load_state_dict(state["head"])
        self.opt.load_state_dict(state["head_optimizer"])

    def log(self, rec: dict[str, Any], n_batches: int) -> None:
        rec["head_ranking_loss"] = float(self.loss_sum) / max(1, n_batches)


class FeaturesAndLogits(nn.Module):
    """``forward(x) -> (logits, features)`` in one pass (features -> model.fc), for DDP."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.model.forward_features(x)
        return self.model.fc(f), f
