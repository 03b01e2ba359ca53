"""Brier's published reduction: the focal-calibration code's batch mean (default) or the BSCE-GRA
repository's batch sum, selectable and honoured by the trainer's ``reduction="published"``."""

from __future__ import annotations

import pytest
import torch

from torchcal.losses import BrierLoss, create_loss
from torchcal.losses.base import published_reduction
from torchcal.train.config import TrainConfig
from torchcal.train.run import build_loss


def _slow_brier(x, t):
    p = torch.softmax(x.double(), 1)
    return ((p - torch.nn.functional.one_hot(t, x.shape[1]).double()) ** 2).sum(1)


def test_default_is_the_focal_calibration_mean():
    assert published_reduction(create_loss("brier")) == "mean"
    assert BrierLoss.published_reduction == "mean"


def test_bsce_gra_sum_and_values():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 4, generator=g, dtype=torch.float64)
    t = torch.randint(0, 4, (9,), generator=g)
    ref = _slow_brier(x, t)
    for pub, want in (("mean", ref.mean()), ("sum", ref.sum())):
        loss = create_loss("brier", published_reduction=pub)
        assert published_reduction(loss) == pub
        loss.reduction = published_reduction(loss)  # what a faithful recipe does
        torch.testing.assert_close(loss(x, t), want)
    # the class attribute is untouched by an instance choosing "sum"
    assert BrierLoss.published_reduction == "mean" and create_loss("brier").published_reduction == "mean"


def test_trainer_resolves_the_chosen_convention():
    for pub in ("mean", "sum"):
        cfg = TrainConfig(loss="brier", loss_kwargs={"published_reduction": pub})
        assert build_loss(cfg).reduction == pub
    cfg = TrainConfig(loss="brier", loss_kwargs={"published_reduction": "sum"}, reduction="mean")
    assert build_loss(cfg).reduction == "mean"  # an explicit reduction wins


def test_bad_value():
    with pytest.raises(ValueError, match="`published_reduction` to be one of"):
        BrierLoss(published_reduction="none")
