"""``CalibrationLoss.vmap_problem`` says why a loss cannot join a vmapped group of packed runs
(``pack_problem``, in train/, says why a run cannot join a pack)."""

from __future__ import annotations

import torch
from torch import nn

from torchcal.losses import ConsistencyLoss, FocalLoss
from torchcal.losses.base import CalibrationLoss
from torchcal.posthoc import TemperatureScaling
from torchcal.train import loss_groups


class _Plain(CalibrationLoss):
    def forward(self, logits, labels):
        return logits.sum()


def test_vmap_problem_names_what_cannot_be_stacked():
    assert FocalLoss().vmap_problem() is None
    assert "calibrator" in ConsistencyLoss(calibrator=TemperatureScaling()).vmap_problem()
    held = _Plain()
    held.cache = torch.zeros(2)
    assert "holds the tensor 'cache' outside its buffers" in held.vmap_problem()
    held = _Plain()
    held.w = nn.Parameter(torch.zeros(1))
    assert "has trainable parameters" in held.vmap_problem()
    assert loss_groups.loss_vmap_problem(nn.CrossEntropyLoss()).startswith("CrossEntropyLoss")

