"""The trainer's plug-in (:class:`~torchcal.train.plugin.RunPlugin`) for the optional joint
uncertainty head (``joint_head``): :class:`JointHead` trains a
:class:`~torchcal.uncertainty.UncertaintyHead` on the model's features beside the classifier."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..uncertainty import UncertaintyHead, ranking_loss
from .config import TrainConfig
from .distributed import epoch_seed
from .plugin import RunPlugin

__all__ = ["JointHead", "FeaturesAndLogits"]


class JointHead(RunPlugin):
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
